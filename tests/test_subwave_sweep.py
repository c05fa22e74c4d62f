"""``benchmarks/subwave_sweep.py`` on the CPU: the shapes and the grid of configs it builds for them
(each valid, within its wave cap, the atomic reduction beside the slots it is compared with), and
the arithmetic of a row and the summary on made-up timings. (Running it is a GPU benchmark.)"""

import math

import pytest

from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan

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


# -- ``--grid small``: v9 without split-K in small tiles, deep rings and clusters (issues 30/31) --------
def test_the_small_campaign_adds_the_training_dw_gemms_in_their_mn_major_layout(sweep):
    assert all(c["layout"] == "KK" for c in sweep.cases())
    extra = [c for c in sweep.cases(train_dw=True) if c not in sweep.cases()]
    assert {(c["M"], c["N"], c["K"], c["dtype"], c["layout"]) for c in extra} == {
        (512, 2048, 16384, "bfloat16", "MN"), (2048, 2048, 16384, "bfloat16", "MN")}
    assert sweep.spec_knobs_of(extra[0]) == {"spec": "d_bfloat16.a_major_M.b_major_N"}
    assert sweep.spec_knobs_of(sweep.cases()[0]) == {}


def test_the_small_grid_is_v9_without_split_valid_for_each_layout_and_as_deep_as_shared_memory_allows(sweep):
    from gemm_ladder.core.budget import max_pipe_depth
    from gemm_ladder.core.spec import spec_of

    for case in sweep.cases(train_dw=True):
        M, N, K = case["M"], case["N"], case["K"]
        grid = sweep.grid_small(case)
        labels = [label for label, _, _ in grid]
        assert len(labels) == len(set(labels)) and labels, labels
        for label, rung, knobs in grid:
            cfg = make_config(rung, M, N, K, **knobs)  # raises where a config is invalid
            assert rung == "v9" and dict(cfg.extra).get("split_k", 1) == 1, label
            assert cfg.pipe_depth <= max_pipe_depth(cfg), label
            assert (spec_of(cfg).a_major, spec_of(cfg).b_major) == sweep.OPERAND_LAYOUTS[case["layout"]], label
            cm, cn = knobs["cluster_m"], knobs["cluster_n"]
            assert math.ceil(M / cfg.blk_m) % cm == 0 and math.ceil(N / cfg.blk_n) % cn == 0, (label, cm, cn)
            assert label == f"v9 {cfg.blk_m}x{cfg.blk_n} w{cfg.num_warpgroups} p{cfg.pipe_depth} {cm}x{cn}"
        assert any(label.startswith("v9 256x128") for label in labels) == (case["layout"] == "MN")
    # cuBLAS's nvjet 64x64 at 13 stages in 2x1 clusters at 256x2048x8192: ours at 12 in every cluster
    labels = {label for label, _, _ in sweep.grid_small({**sweep.cases()[0], "M": 256, "N": 2048, "K": 8192})}
    assert {f"v9 64x64 w1 p{d} 2x1" for d in (8, 10, 12)} | {f"v9 64x64 w1 p12 {c}" for c in ("1x1", "1x2", "2x2")} \
        <= labels
    # an MN-major 64-row operand cannot be multicast in halves: its 64x64 tiles run without clusters
    mn = [c for c in sweep.cases(train_dw=True) if c["layout"] == "MN"][0]
    assert {label for label, _, _ in sweep.grid_small(mn) if label.startswith("v9 64x64")} == {
        "v9 64x64 w1 p8 1x1", "v9 64x64 w1 p10 1x1", "v9 64x64 w1 p12 1x1"}


def _sub_wave_case(sweep):
    """The first case whose policy grid still leaves most SMs idle (phi-3-mini's down at M = 128, the row-tile rule's
    grid: the mid-tiles rules and swap-ab-mid fill the wave at the others of 2026-11-26)."""
    for case in sweep.cases():
        p = plan.Problem(case["M"], case["N"], case["K"], case["dtype"], sweep.ARCH, sweep.SMS)
        if plan.sub_wave(p, plan.choose(p)):
            return case, p
    raise AssertionError("no sub-wave case")


def test_the_small_campaign_times_the_policy_and_its_split_k_alternatives_beside_the_grid(sweep):
    (worst, p), mn = _sub_wave_case(sweep), [c for c in sweep.cases(train_dw=True) if c["layout"] == "MN"][0]
    (case, cfgs), (mcase, mcfgs) = sweep.jobs([worst, mn], which="small")
    labels = [label for label, _ in cfgs]
    assert labels[0] == "policy" and any(label.startswith("alt v10 s") for label in labels)
    assert {label for label, _, _ in sweep.grid_small(worst)} <= set(labels)
    alts = [(job.rung, job.knobs.get("split_k", 1)) for label, job in cfgs if label.startswith("alt")]
    assert alts == [(a.rung, a.knobs.get("split_k", 1)) for a in plan.alternatives(p, plan.choose(p))]
    # the MN-major case: every module, the policy's included, is built for its layout
    assert mcase["layout"] == "MN" and all(job.knobs.get("spec") == "d_bfloat16.a_major_M.b_major_N"
                                           for _, job in mcfgs)


@pytest.mark.parametrize("layout", ["KK", "KN", "MK", "MN"])
def test_the_operands_lie_as_the_layout_keeps_them_and_the_cublas_peer_reads_them_so(sweep, layout):
    import torch

    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(5, 7, generator=g), torch.randn(3, 7, generator=g)
    a, b = sweep.stored(A, B, layout)
    a_major, b_major = sweep.OPERAND_LAYOUTS[layout]
    assert a.is_contiguous() and b.is_contiguous()
    assert a.shape == ((7, 5) if a_major == "M" else (5, 7)) and b.shape == ((7, 3) if b_major == "N" else (3, 7))
    d = torch.full((5, 3), float("nan"))
    sweep.cublas_peer(layout)(a, b, d)
    torch.testing.assert_close(d, A @ B.T)


def test_a_check_item_carries_the_layout_and_old_items_read_as_the_forward(sweep):
    assert sweep.parse_item(sweep.item_of("m007.so", 512, "MN")) == ("m007.so", 512, "MN")
    assert sweep.parse_item("m001.so@333") == ("m001.so", 333, "KK")


# the policy the sweep's cases were drawn under: since swap-ab-mid (2026-11-29) takes llama-3.2-1b's down at M = 256,
# no case of the sweep has a split-k choice left, the one the small-tile alternative is offered beside
BEFORE_SWAP_MID = [r for r in plan.RULES if r.name != "swap-ab-mid"]


def test_the_dynm_grid_times_the_small_tile_alternative_at_a_fixed_and_a_runtime_m(sweep):
    """The alternative plan.alternatives offers (beside the split-k rule's choice at llama-3.2-1b's down at M = 256,
    under the policy the sweep ran with), fixed and runtime M in both runtime-M tile orders."""
    case = next(c for c in sweep.cases() if (c["M"], c["N"], c["K"]) == (256, 2048, 8192))
    p = plan.Problem(case["M"], case["N"], case["K"], case["dtype"], sweep.ARCH, sweep.SMS)
    small = next(a for a in plan.alternatives(p, plan.choose(p, rules=BEFORE_SWAP_MID)) if a.rule == plan.ALT_SMALL_RULE)
    grid = {label: knobs for label, _, knobs in sweep.grid_dynm(case)}
    assert set(grid) == {f"v9 64x128 p8 2x1 {o} {m}" for o in sweep.DYNM_ORDERS for m in ("fixed", "anyM")}
    pairs = {(k["tile_order"], k["dynamic_m"]) for k in grid.values()}
    assert pairs == {(o, d) for o in sweep.DYNM_ORDERS for d in (False, True)}
    # what a pack builds, but for how it is launched (the sweep times tiles; pdl: plan.pdl_pays)
    offered = make_config("v9", p.M, p.N, p.K, **{**small.knobs, "dynamic_m": True, "pdl": False}).knobs()
    assert small.knobs["pdl"] is True
    assert offered in [make_config("v9", p.M, p.N, p.K, **k).knobs() for k in grid.values()]
    mn = [c for c in sweep.cases(train_dw=True) if c["layout"] == "MN"][0]
    assert all(not k["dynamic_m"] for _, _, k in sweep.grid_dynm(mn))  # no runtime M with an MN-major A


def test_a_runtime_m_module_wrong_at_one_of_its_ms_is_wrong(sweep, monkeypatch, tmp_path):
    """A module serving two cases (a runtime M) is checked at both M; one wrong M makes it wrong, in
    whichever order the checks come back."""
    import os

    from gemm_ladder.measure import isolate

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # check_all prepends to it: restored after
    cases = [{"M": M, "layout": "KK", "configs": [{"file": "m000.so"}, {"file": "m001.so"}]} for M in (333, 768)]
    for bad in ("m000.so@333@KK", "m000.so@768@KK"):
        seen = []

        def fake(job, items, args, timeout, explain, bad=bad):
            seen.extend(items)
            return [{"status": "ok", "ok": it != bad, "rel_err": 1.0 if it == bad else 1e-3} for it in items]
        monkeypatch.setattr(isolate, "run_batch", fake)
        out = sweep.check_all(tmp_path, cases)
        assert sorted(seen) == ["m000.so@333@KK", "m000.so@768@KK", "m001.so@333@KK", "m001.so@768@KK"]
        assert not out["m000.so"]["ok"] and out["m000.so"]["rel_err"] == 1.0, bad
        assert out["m001.so"]["ok"]
