"""``benchmarks/subwave_sweep.py`` on the CPU: the shapes and the grid of configs it builds for them
(each valid, within its wave cap, the atomic reduction beside the slots it is compared with), and
the arithmetic of a row and the summary on made-up timings. (Running it is a GPU benchmark.)"""

import math

import pytest

from gemm_ladder.rungs import make_config

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def sweep():
    return benchmark_script("subwave_sweep")


def test_the_cases_are_the_subwave_shapes_and_the_dw_gemms(sweep):
    cases = sweep.cases()
    shapes = {(c["M"], c["N"], c["K"], c["dtype"]) for c in cases}
    assert len(shapes) == len(cases) == 14
    assert (333, 1280, 5120, "float16") in shapes  # the every-model run's worst kernel
    assert {(768, 768, 4096, "bfloat16"), (768, 3072, 4096, "bfloat16"), (3072, 768, 4096, "bfloat16")} <= shapes
    assert all(c["K"] >= 2048 for c in cases)


def test_the_grid_is_valid_capped_and_pairs_every_atomic_config_with_its_slots(sweep):
    for case in sweep.cases():
        M, N, K = case["M"], case["N"], case["K"]
        grid = sweep.grid(case)
        labels = [label for label, _, _ in grid]
        assert len(labels) == len(set(labels)), labels
        for label, rung, knobs in grid:
            cfg = make_config(rung, M, N, K, **knobs)  # raises where a config is invalid
            split = dict(cfg.extra).get("split_k", 1)
            assert sweep.units_of(M, N, cfg.blk_m, cfg.blk_n, split) <= sweep.MAX_WAVES * sweep.SMS, label
            assert (dict(cfg.extra).get("reduce") == "atomic") == label.endswith("atomic"), label
            cm, cn = knobs["cluster_m"], knobs["cluster_n"]  # clusters pair whole tiles: no unit of nothing
            assert math.ceil(M / cfg.blk_m) % cm == 0 and math.ceil(N / cfg.blk_n) % cn == 0, (label, cm, cn)
            if label.endswith("atomic"):
                assert label.removesuffix(" atomic") in labels  # measured beside the old path
        assert any(label.startswith("streamk") for label in labels)
        assert any(label.startswith("v11") for label in labels) == (M <= 256)
    # the worst shape gets every split of the default tiles, both reductions
    worst = sweep.grid(sweep.cases()[0])
    assert {f"v10 s{s} 128x128{a}" for s in sweep.SPLITS for a in ("", " atomic")} <= {lb for lb, _, _ in worst}


def _case(sweep):
    return {**sweep.cases()[0], "configs": [
        {"label": "policy", "file": "m000.so", "rung": "v9", "knobs": {}, "units": 30},
        {"label": "v10 s4 128x128", "file": "m001.so", "rung": "v10", "knobs": {}, "units": 120},
        {"label": "v10 s4 128x128 atomic", "file": "m002.so", "rung": "v10", "knobs": {}, "units": 120},
        {"label": "v10 s2 128x128", "file": "m003.so", "rung": "v10", "knobs": {}, "units": 60}]}


def test_a_row_scores_each_config_against_cublas_and_leaves_out_the_wrong(sweep):
    case = _case(sweep)
    checks = {"m000.so": {"ok": True}, "m001.so": {"ok": True}, "m002.so": {"ok": True}, "m003.so": {"ok": False}}
    times = {"cublas": 0.010, "policy": 0.020, "v10 s4 128x128": 0.0125, "v10 s4 128x128 atomic": 0.008}
    row = sweep.make_row(case, checks, times)
    assert not row["correct"]  # one config was wrong
    assert row["best"] == "v10 s4 128x128 atomic" and row["best_ratio"] == pytest.approx(1.25)
    assert row["policy_ratio"] == pytest.approx(0.5) and row["cublas_us"] == pytest.approx(10.0)
    by = {c["label"]: c for c in row["configs"]}
    assert by["v10 s2 128x128"]["ratio"] is None and not by["v10 s2 128x128"]["correct"]
    assert by["v10 s4 128x128"]["us"] == pytest.approx(12.5)


def test_the_summary_takes_each_family_s_best_member_per_shape(sweep):
    case = _case(sweep)
    ok = {f"m00{i}.so": {"ok": True} for i in range(4)}
    rows = [sweep.make_row(case, ok, {"cublas": 0.01, "policy": 0.02, "v10 s4 128x128": 0.0125,
                                      "v10 s2 128x128": 0.0100, "v10 s4 128x128 atomic": 0.008}),
            sweep.make_row(case, ok, {"cublas": 0.01, "policy": 0.04, "v10 s4 128x128": 0.0200,
                                      "v10 s2 128x128": 0.0250, "v10 s4 128x128 atomic": 0.016})]
    s = sweep.summary(rows)
    assert s["shapes"] == 2 and s["correct"] == 2 and s["best_over_cublas"] == 1
    assert s["geomean_policy_ratio"] == pytest.approx(math.sqrt(0.5 * 0.25))
    fam = s["by_family"]
    assert set(fam) == {"policy", "v10 128x128", "v10 128x128 atomic"}
    assert fam["v10 128x128"]["geomean_ratio"] == pytest.approx(math.sqrt(1.0 * 0.5))  # s2 there, s4 here
    assert fam["v10 128x128 atomic"]["geomean_ratio"] == pytest.approx(math.sqrt(1.25 * 0.625))


def test_unpack_takes_plain_module_files_only(sweep, tmp_path):
    import io
    import tarfile

    archive = tmp_path / "modules.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for name, data in (("m000.so", b"elf"), ("m000.so.json", b"{}"), ("../evil.so", b"x"), ("sub/m1.so", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "mods"
    out.mkdir()
    assert sorted(sweep.unpack(archive, out)) == ["m000.so", "m000.so.json"]
    assert (out / "m000.so").read_bytes() == b"elf" and not (tmp_path / "evil.so").exists()
    assert sorted(p.name for p in out.iterdir()) == ["m000.so", "m000.so.json"]


def test_winners_lists_the_configs_near_the_best_with_what_a_rule_reads(sweep):
    case = _case(sweep)
    for c, kn in zip(case["configs"], ({}, {"split_k": 4, "blk_m": 128, "blk_n": 128},
                                       {"split_k": 4, "blk_m": 128, "blk_n": 128, "reduce": "atomic"},
                                       {"split_k": 2, "blk_m": 128, "blk_n": 128})):
        c["knobs"] = kn
    ok = {f"m00{i}.so": {"ok": True} for i in range(4)}
    row = sweep.make_row(case, ok, {"cublas": 0.01, "policy": 0.02, "v10 s4 128x128": 0.0102,
                                    "v10 s2 128x128": 0.0150, "v10 s4 128x128 atomic": 0.0100})
    (w,) = sweep.winners([row])
    assert w["best"] == "v10 s4 128x128 atomic" and w["tiles_128x128_per_sm"] == pytest.approx(30 / 132)
    assert [n["label"] for n in w["near"]] == ["v10 s4 128x128 atomic", "v10 s4 128x128"]  # s2: 0.67, far
    assert w["near"][0]["reduce"] == "atomic" and w["near"][1]["units_per_sm"] == pytest.approx(120 / 132, abs=0.01)


def test_the_depth_grid_takes_one_wave_splits_of_the_winning_tiles_at_two_depths(sweep):
    for case in sweep.cases():
        M, N, K = case["M"], case["N"], case["K"]
        for label, rung, knobs in sweep.grid_depth(case):
            cfg = make_config(rung, M, N, K, **knobs)
            assert label.endswith(f"p{cfg.pipe_depth}") and (cfg.blk_m, cfg.blk_n) in ((128, 128), (64, 128))
            assert sweep.units_of(M, N, cfg.blk_m, cfg.blk_n, knobs["split_k"]) <= sweep.SMS, label
    labels = {label for label, _, _ in sweep.grid_depth(sweep.cases()[0])}
    assert {"v10 s4 128x128 p4", "v10 s4 128x128 p6", "v10 s2 64x128 p6", "v10 s2 64x128 p8"} <= labels
    assert not sweep.grid_depth({**sweep.cases()[0], "M": 3072, "N": 768})  # 144 tiles: no split fits a wave
