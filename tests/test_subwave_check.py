"""``benchmarks/subwave_check.py`` on the CPU: its shapes are sub-wave with alternatives in the pack
plan, each case finds its choice and alternatives among a pack's entries (or says why not), and the
arithmetic of a row and the summary on made-up timings. (Running it is a GPU benchmark.)"""

import importlib.util
import sys
from pathlib import Path

import pytest

from gemm_ladder.serve import kernel_pack, plan

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "subwave_check.py"


@pytest.fixture(scope="module")
def swc():
    spec = importlib.util.spec_from_file_location("subwave_check", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["subwave_check"] = mod
    spec.loader.exec_module(mod)
    return mod


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
        assert got["main"] != got["alternatives"][0] and all("v10_anyM" in f for f in got["alternatives"])
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
