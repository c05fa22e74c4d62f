"""``benchmarks/subwave_check.py`` on the CPU: its shapes are sub-wave with alternatives in the pack
plan, each case finds its choice and alternatives among a pack's entries (or says why not), and the
arithmetic of a row and the summary on made-up timings. (Running it is a GPU benchmark.)"""


import pytest

from gemm_ladder.serve import kernel_pack, plan

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def swc():
    return benchmark_script("subwave_check")


@pytest.fixture(scope="module")
def entries(swc):
    """The pack.json entries prepare would write (plan_pack, nothing built)."""
    out = []
    for c in swc.case_list():
        items = kernel_pack.plan_pack([(c["M"], c["N"], c["K"])], [c["dtype"]], sms=swc.SMS)
        out += [e for i in items for e in kernel_pack.entries_of(i)]
    return out


def test_every_shape_is_sub_wave_and_mostly_held_out(swc):
    cases = swc.case_list()
    assert len(cases) >= 10 and sum(c["held_out"] for c in cases) >= len(cases) - 1
    assert any(c["dtype"] == "bfloat16" for c in cases)
    for c in cases:
        p = plan.Problem(c["M"], c["N"], c["K"], c["dtype"], "sm_90a", swc.SMS)
        choice = plan.choose(p)
        assert plan.sub_wave(p, choice) and c["K"] >= 2048, c
        assert plan.alternatives(p, choice), c


def test_each_case_finds_its_choice_and_alternatives(swc, entries):
    for c in swc.case_list():
        got = swc.with_modules(c, entries)
        # runtime-M modules: v10's splits and v9's small tiles (plan.alternatives)
        assert got["main"] not in got["alternatives"] and all(f.startswith(("v10_anyM", "v9_anyM"))
                                                               for f in got["alternatives"])
        assert got["main"] in {e["file"] for e in entries if not e.get("alternative")}
    first = swc.case_list()[0]
    with pytest.raises(ValueError, match="0 alternatives"):
        swc.with_modules(first, [e for e in entries if not e.get("alternative")])
    with pytest.raises(ValueError, match="is the shape sub-wave"):
        swc.with_modules({**first, "M": 4096}, entries)


def test_a_row_says_main_alternative_and_the_front_doors_pick(swc):
    case = {"family": "vit-h-14", "held_out": True, "layer": "fc2", "M": 333, "N": 1280, "K": 5120,
            "dtype": "float16", "main": "v9.so", "alternatives": ["s4.so", "s3.so"]}
    checks = {f: {"ok": True} for f in ("v9.so", "s4.so", "s3.so")}
    times = {"v9.so": {"kernel_ms": 0.034, "call_ms": 0.040}, "s4.so": {"kernel_ms": 0.014, "call_ms": 0.020},
             "s3.so": {"kernel_ms": 0.016, "call_ms": 0.022}, swc.CUBLAS: {"kernel_ms": 0.014, "call_ms": 0.018},
             swc.FRONT: {"kernel_ms": 0.0145, "call_ms": 0.021}, "linear": {"kernel_ms": None, "call_ms": 0.0215}}
    row = swc.make_row(case, checks, times, {"eager": "s4.so", "graphs": "s4.so", "candidates": []})
    assert row["correct"] and row["best_alt"] == "s4.so"
    assert row["main_ratio"] == pytest.approx(0.014 / 0.034) and row["best_alt_ratio"] == pytest.approx(1.0)
    assert row["alt_over_main"] == pytest.approx(0.034 / 0.014)
    assert row["kernel_ratio"] == pytest.approx(0.014 / 0.0145) and row["call_ratio"] == pytest.approx(0.0215 / 0.021)
    assert row["main_call_ratio"] == pytest.approx(0.0215 / 0.040) and row["picked_alternative"]
    wrong = swc.make_row(case, {**checks, "s3.so": {"ok": False}}, None, None)
    assert not wrong["correct"] and wrong["main_ratio"] is None and wrong["kernel_ratio"] is None
    s = swc.summary([row, wrong])
    assert s["all"]["rows"] == 2 and s["all"]["correct"] == 1 and s["all"]["alt_beats_main"] == 1
    assert s["all"]["geomean_best_of_both"] == pytest.approx(1.0) and s["all"]["alternative_picked"] == 1
    assert "vit-h-14" in swc.table([row])


def test_a_case_checks_every_module_the_front_door_may_time(swc, entries):
    case = swc.with_modules(swc.case_list()[0], entries)
    pool = swc.pool_of(case, ["other.so", case["alternatives"][0], case["main"]])
    assert pool == [case["main"], *case["alternatives"], "other.so"]


def test_run_writes_a_row_per_case_and_times_no_case_with_a_wrong_module(swc, entries, tmp_path, monkeypatch):
    """run's plumbing with the GPU's parts stood in: the checks cover each case's pool, a case
    whose pool holds a wrong module is not timed (nor measured by the front door), the rest are,
    and the JSON has the issue's fields."""
    import json

    from gemm_ladder.core import files
    from gemm_ladder.measure import harness
    from gemm_ladder.serve import front

    folder = tmp_path / "subwave"
    (folder / swc.PACK).mkdir(parents=True)
    cases = [swc.with_modules(c, entries) for c in swc.case_list()[:3]]
    files.write_json(folder / swc.PLAN_FILE, {"format": swc.FORMAT, "cases": cases})
    wrong = f"{cases[1]['alternatives'][0]}@{cases[1]['M']}"

    class Pack:
        modules = entries

        def __init__(self, path):
            pass

        def serving(self, M, N, K, dtype, arch):
            return []

        def load(self, entry):
            return entry["file"]

    asked = []
    monkeypatch.setattr(swc.device, "why_no_gpu", lambda index=0: None)
    monkeypatch.setattr(swc.device, "arch_of", lambda index=0: "sm_90a")
    monkeypatch.setattr("gemm_ladder.serve.kernel_pack.KernelPack", Pack)
    monkeypatch.setattr(front, "use_pack", lambda folder: None)
    monkeypatch.setattr(swc, "check_all", lambda folder, pools: asked.append(pools) or {
        f"{f}@{M}": {"ok": f"{f}@{M}" != wrong} for M, pool in pools for f in pool})
    monkeypatch.setattr(swc, "first_use_pick", lambda case, folder: {"candidates": [], "eager": case["main"],
                                                                      "graphs": case["alternatives"][0]})
    ms = {swc.CUBLAS: 0.02, swc.FRONT: 0.019, "linear": 0.021}
    monkeypatch.setattr(swc, "time_case", lambda case, loaded: {"t0": 0.0, "t1": 1.0, "times": {
        n: {"kernel_ms": ms.get(n, 0.03), "call_ms": ms.get(n, 0.03)} for n in [*loaded, *ms]}})
    monkeypatch.setattr(harness, "gpu_info", lambda index=0: {"name": "stand-in"})
    assert swc.run(folder, tmp_path / "out.json") == 1  # one case wrong
    assert [len(pool) for _, pool in asked[0]] == [1 + len(c["alternatives"]) for c in cases]
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["gpu"] == {"name": "stand-in"} and "commit" in doc and "date" in doc
    rows = doc["rows"]
    assert [r["correct"] for r in rows] == [True, False, True]
    assert rows[1]["kernel_ratio"] is None and rows[1]["first_use"] is None
    for r in (rows[0], rows[2]):
        assert {"family", "held_out", "M", "N", "K", "dtype", "kernel_ratio", "call_ratio"} <= set(r)
        assert r["kernel_ratio"] == pytest.approx(0.02 / 0.019) and r["main_ratio"] == pytest.approx(0.02 / 0.03)
        assert r["picked_alternative"]
    assert doc["summary"]["all"]["correct"] == 2
