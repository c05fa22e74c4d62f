"""The fused epilogue on split-K (v10) and swap AB (v11), issue 31, on the CPU: what each builds and
refuses, where each value's column of D comes from in the transposed epilogue, the protocol checker
on v10 with a residual (whose C loads sit in the branch of a tile's last unit), and the policy that
now serves an epilogue call with them."""

import json
import math
import sys
from pathlib import Path

import pytest

from gemm_ladder.compile import builder
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, spec_for
from gemm_ladder.protocol import check as check_mod
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.serve import plan
from gemm_ladder.sm90a import hgemm_v10, hgemm_v11
from gemm_ladder.sync.classes import COUNTED_BRANCHES_ATTR
from layouts.fragments import acc_fragment_coord, stmatrix_trans_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import epilogue_check  # noqa: E402  (benchmarks/ is not a package)

FP32_RESIDUAL = GemmSpec(a="bfloat16", b="bfloat16", d="float32", bias="float32", act="relu", alpha=True,
                         residual="float32")


# -- what each rung builds ------------------------------------------------------------------------------
@pytest.mark.parametrize("epilogue", ["bias", "bias_gelu_erf", "alpha_bias_silu", "residual",
                                      "alpha_bias_gelu_tanh+residual"])
def test_v10_takes_every_epilogue_and_its_operands_follow_the_workspace(epilogue):
    spec = spec_for("bfloat16", epilogue)
    cfg = make_config("v10", 333, 1288, 2056, spec=spec, dtype="bfloat16", split_k=3)
    names = [str(p.name) for p in kernel_of(cfg).params]
    assert names[:6] == ["A", "B", "D", "P", "C", "num_ctas"]  # the workspace's slots and counters, then the count
    assert names[6:] == [o.name for o in spec.epilogue_operands()]


def test_v10_takes_a_float32_d_with_a_float32_residual():
    cfg = make_config("v10", 256, 512, 2048, spec=FP32_RESIDUAL, dtype="bfloat16", split_k=2)
    src = builder.build(kernel_of(cfg)).cuda_source()
    assert "float* __restrict__ bias_ptr" in src and "C_tensormap" in src
    assert "cvt_bf16x2" not in src.split("__global__")[-1]  # a float32 D is not rounded


@pytest.mark.parametrize("spec, words", [
    (spec_for("bfloat16", "residual"), "no residual"),
    (GemmSpec(a="bfloat16", b="bfloat16", d="float32"), "no fp32_out"),
    (spec_for("bfloat16", "swiglu"), "no gated"),
])
def test_v11_refuses_what_its_transposed_epilogue_does_not_build(spec, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v11", 16, 4096, 4096, spec=spec, dtype="bfloat16", blk_m=16)


def test_v10_refuses_swiglu_with_the_rungs_that_build_it():
    with pytest.raises(ConfigError, match="no gated.*built for v9"):
        make_config("v10", 512, 1024, 1024, spec=spec_for("bfloat16", "swiglu"), dtype="bfloat16", split_k=2)


# -- v11: each value's column of D -----------------------------------------------------------------------
@pytest.mark.parametrize("warp", range(4))
def test_the_transposed_epilogues_column_is_where_stmatrix_trans_puts_the_value(warp):
    """A thread's register pair (4*block + 2*half, +1) holds two elements of one fragment row; stmatrix
    .trans stores the 8x8 matrix (block, half) transposed, its fragment rows becoming the staging
    columns 16*warp + 8*half .. +8 with lane L's elements in column L // 4. The op's column (the
    fragment row of the pair's first register) must be that column for both registers."""
    for lane in range(32):
        for block in range(8):
            for half in range(2):
                r = 4 * block + 2 * half
                col_base = stmatrix_trans_row(block, half, warp, 0)[1]
                stored = col_base + lane // 4  # the staging column lane's elements land in
                assert acc_fragment_coord(r, warp, lane)[0] == stored
                assert acc_fragment_coord(r + 1, warp, lane)[0] == stored


@pytest.mark.parametrize("stash", [False, True])
def test_v11_reads_the_bias_at_a_row_of_its_d_transposed_fragment(stash):
    """Every value packed for stmatrix .trans goes through the op (two bias values a pack, and alpha), none
    without it: read from global memory where it is added (``bias_stash=False``), or from the registers the
    tile's bias was loaded into before its K loop (``epilogue.BiasStash``, tests/test_bias_stash.py)."""
    cfg = make_config("v11", 16, 4096, 4096, spec=spec_for("bfloat16", "alpha_bias"), dtype="bfloat16",
                      blk_m=16, split_k=4, bias_stash=stash)
    assert [str(p.name) for p in kernel_of(cfg).params][-3:] == ["num_ctas", "bias", "alpha"]
    body = builder.build(kernel_of(cfg)).cuda_source().split("__global__")[-1]
    read = "Breg_ptr[" if stash else "bias_ptr["
    packs = [line for line in body.splitlines() if "cvt_bf16x2_f32" in line and read in line]
    assert packs and all(line.count(read) == 2 and "alpha" in line for line in packs)
    assert not [line for line in body.splitlines() if "cvt_bf16x2_f32" in line and read not in line]


def test_the_plain_kernels_are_as_they_were():
    """The epilogue op's column moved into at_column: v9, v10 and v11 without an epilogue read no bias."""
    for rung, knobs in (("v9", {}), ("v10", {"split_k": 2}), ("v11", {"blk_m": 16})):
        src = builder.build(kernel_of(make_config(rung, 256, 1024, 1024, dtype="bfloat16", **knobs))).cuda_source()
        assert "bias" not in src.split("__global__")[-1]


# -- the protocol checker on v10 with a residual ------------------------------------------------------------
@pytest.mark.parametrize("epilogue, knobs", [
    ("residual", {"split_k": 2}),
    ("alpha_bias_gelu_tanh+residual", {"split_k": 3, "reduce": "atomic"}),
    ("residual", {"split_k": 1, "stream_k": True}),
])
def test_the_checker_takes_the_last_units_branch_both_ways_and_passes(epilogue, knobs):
    report = check_config(make_config("v10", 512, 512, 2048, spec=spec_for("float16", epilogue), **knobs))
    assert report.ok, report.findings
    line = next(t for t in report.table().splitlines() if t.strip().startswith("c_ready"))
    completed = [int(x) for x in line.split("per slot")[1].split(":")[0].split()]
    if not knobs.get("stream_k"):  # split-K: some units were the last of their tile and loaded C
        assert sum(completed) > 0, line


def test_the_checker_passes_v10_with_a_float32_residual():
    assert check_config(make_config("v10", 512, 512, 2048, spec=FP32_RESIDUAL, dtype="bfloat16", split_k=2)).ok


def test_without_the_attribute_the_checker_cannot_decide_the_last_unit(monkeypatch):
    """The split tile's last unit turns on other CTAs' atomics: the kernel says so
    (COUNTED_BRANCHES_ATTR), else the checker stops there rather than guess."""
    monkeypatch.setattr(check_mod, "COUNTED_BRANCHES_ATTR", "gemm_ladder.not_an_attr")
    report = check_config(make_config("v10", 512, 512, 2048, spec=spec_for("float16", "residual"), split_k=2))
    assert not report.ok and "branch condition" in " ".join(report.findings)


def test_only_split_kernels_with_a_residual_carry_the_attribute():
    def attrs(rung, spec, **knobs):
        func = kernel_of(make_config(rung, 512, 512, 2048, spec=spec, **knobs))
        return dict(func.attrs) if func.attrs is not None else {}
    assert COUNTED_BRANCHES_ATTR in attrs("v10", spec_for("float16", "residual"), split_k=2)
    assert COUNTED_BRANCHES_ATTR not in attrs("v10", spec_for("float16", "bias"), split_k=2)
    assert COUNTED_BRANCHES_ATTR not in attrs("v9", spec_for("float16", "residual"))


# -- the policy --------------------------------------------------------------------------------------------
def _choice(M, N, K, epilogue, **kw):
    return plan.choose(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", epilogue)), **kw)


def test_an_epilogue_call_now_takes_split_k_and_swap_ab_where_the_plain_call_does():
    for M, N, K in ((1, 4096, 4096), (16, 14336, 4096), (256, 4096, 14336)):
        plain = _choice(M, N, K, "none", use_db=False)
        fused = _choice(M, N, K, "bias_gelu_tanh", use_db=False)
        assert plain.rung in ("v10", "v11") and (fused.rule, fused.rung) == (plain.rule, plain.rung)
        assert fused.knobs["spec"] == spec_for("bfloat16", "bias_gelu_tanh").text()


def test_a_residual_at_small_m_still_leaves_swap_ab_which_builds_none():
    c = _choice(16, 4096, 4096, "residual", use_db=False)
    assert c.rung == "v9" and any("swap-ab" in s and "no residual" in s for s in c.skipped)


def test_before_puts_the_rungs_back_as_they_were_and_restores_them():
    saved = hgemm_v10.EPILOGUES, hgemm_v11.EPILOGUES
    p = plan.Problem(16, 4096, 4096, "bfloat16", "sm_90a", 132, spec_for("bfloat16", "bias_gelu_tanh"))
    before = epilogue_check.split_choice(p, "before")
    assert before.rung == "v9" and epilogue_check.split_choice(p, "now").rung == "v11"
    assert (hgemm_v10.EPILOGUES, hgemm_v11.EPILOGUES) == saved


def test_the_split_set_times_each_distinct_choice_once_and_holds_out_three_weights():
    """The split set: every shape's policy module, and the policy before v10 and v11 built the epilogue and
    without the small-M rule only where they choose another module; its checks name rungs the validator
    takes; the probe set: ``no_split`` beside the policy past M = 256; the suite set: the policy's module at
    the suite's weights and M and the held-out ones."""
    cases = epilogue_check.cases_of("split")
    times = [c for c in cases if c["purpose"] == "time"]
    keys = [(c["epilogue"], tuple(c["shape"]), c["variant"]) for c in times]
    assert len(keys) == len(set(keys)) and {c["variant"] for c in times} == {"now", "before", "no_small_rule"}
    assert {tuple(c["shape"][1:]) for c in times if c["held_out"]} == set(epilogue_check.HELD_OUT_BIAS_WEIGHTS)
    # every shape has the policy's module; the others only where they differ from it
    assert {(c["epilogue"], tuple(c["shape"])) for c in times} == {
        (c["epilogue"], tuple(c["shape"])) for c in times if c["variant"] == "now"}
    checks = [c for c in cases if c["purpose"] == "check"]
    assert {c["rung"] for c in checks} == {"v10", "v11"} and all(c["knobs"]["dynamic_m"] for c in checks)
    for c in checks:  # each check's module is one the validator takes
        spec = epilogue_check.spec_of_case(c)
        make_config(c["rung"], *c["shape"], spec=spec, dtype=c["dtype"], **c["knobs"])


def test_the_swap_k_threshold_agrees_with_the_split_run():
    """plan.SPLIT_EPILOGUE (bias+GELU, M = 64 and 128): where the small-M rule now leaves a call to swap AB
    (no residual, K past the threshold) swap AB ran faster than the rule's tiles in the same rounds;
    where it keeps the call, the rule's tiles ran faster or within a run's spread (2%)."""
    rows = json.loads((Path(__file__).resolve().parents[1] / plan.SPLIT_EPILOGUE).read_text())["rows"]
    pairs = {}
    for r in rows:
        if r["op"] == "bias_gelu_tanh" and r["rule"] in ("now", "no_small_rule") and r["M"] in (64, 128):
            pairs.setdefault((r["M"], r["N"], r["K"]), {})[r["rule"]] = r["kernel_ratio"]
    pairs = {k: v for k, v in pairs.items() if len(v) == 2}
    assert len(pairs) == 10
    for (M, N, K), v in pairs.items():
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", "bias_gelu_tanh"))
        if plan.rule_applies(epilogue_check.RULE_NAME, p):
            assert v["now"] > 0.98 * v["no_small_rule"], (M, N, K, v)
        else:
            assert K > plan.SMALL_M_EPILOGUE_SWAP_K and v["no_small_rule"] > v["now"], (M, N, K, v)
    probe = [c for c in epilogue_check.cases_of("split_probe") if c["variant"] == "no_split"]
    assert probe and all(c["shape"][0] >= 256 for c in probe)
    for c in probe:  # no_split differs from the policy's choice: the policy split there
        p = plan.Problem(*c["shape"], "bfloat16", "sm_90a", 132, spec_for("bfloat16", c["epilogue"]))
        assert epilogue_check.split_choice(p, "now").rule in epilogue_check.SPLIT_RULES
    suite = epilogue_check.cases_of("suite")
    assert len(suite) == 2 * 8 * 7 and {c["variant"] for c in suite} == {"now"}
    assert sum(c["held_out"] for c in suite) == 2 * 3 * 7


def test_the_split_fill_set_pairs_each_moved_shape_with_the_rule_before_the_threshold():
    """``--set split_fill``: every plain shape whose choice the threshold moved, the policy's module and the
    split-k rule's without the threshold; the rule is put back as it is."""
    saved = plan.SPLIT_K_MAX_FILL
    cases = epilogue_check.cases_of("split_fill")
    assert plan.SPLIT_K_MAX_FILL == saved and cases and len(cases) % 2 == 0
    shapes = {tuple(c["shape"]) for c in cases}
    assert len(shapes) * 2 == len(cases) and (512, 4096, 14336) in shapes
    for M, N, K in shapes:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", "none"))
        assert epilogue_check.split_choice(p, "fill_before").rule == "split-k"
        assert epilogue_check.split_choice(p, "now").rule != "split-k"
        assert p.tiles(128, 128) > plan.SPLIT_K_MAX_FILL * p.sms


def test_the_fill_threshold_run_backs_the_threshold_on_the_shapes_it_moved():
    """``epilogue_split_fill.json``: on the shapes the threshold moved, the policy's module ran faster than
    the split it replaced in geomean and at most of them (one loss, 333x3584x14336, recorded)."""
    path = Path(plan.SPLIT_PROBE).with_name("epilogue_split_fill.json")
    rows = json.loads((Path(__file__).resolve().parents[1] / path).read_text())["rows"]
    by: dict = {}
    for r in rows:
        by.setdefault((r["M"], r["N"], r["K"]), {})[r["rule"]] = r
    gains = [v["now"]["kernel_ms"]["fill_before"] / v["now"]["kernel_ms"]["now"] for v in by.values()]
    assert len(gains) == 17 and all(v["fill_before"]["chosen_by"] == "split-k" for v in by.values())
    assert math.exp(sum(map(math.log, gains)) / len(gains)) > 1.05 and sum(g < 0.99 for g in gains) <= 1


def test_the_few_tiles_set_times_valid_candidates_beside_the_policys_module():
    """``--set few_tiles``: at each shape the policy's module first, then each candidate the rung's validator
    takes and that differs from it; swap AB's widths only at M <= 16, the tiles and splits elsewhere."""
    cases = epilogue_check.cases_of("few_tiles")
    by: dict = {}
    for c in cases:
        by.setdefault(tuple(c["shape"]), []).append(c)
    assert set(by) == set(epilogue_check.FEW_TILE_CASES) | set(epilogue_check.FEW_TILE_SWAP_CASES)
    for (M, N, K), group in by.items():
        assert group[0]["variant"] == "now" and "rung" not in group[0]
        names = [c["variant"] for c in group[1:]]
        assert len(set(names)) == len(names) and names
        pool = epilogue_check.FEW_TILE_SWAP_CANDIDATES if M <= 16 else epilogue_check.FEW_TILE_CANDIDATES
        assert set(names) <= set(pool)
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", "bias_gelu_tanh"))
        for c in group[1:]:
            assert c["rung"] == pool[c["variant"]][0] and plan._validate(c["rung"], p, c["knobs"]) is None
            assert c["knobs"].get("split_k", 1) == 1 or K // c["knobs"]["split_k"] >= 256


def test_the_deep_rings_set_times_each_candidate_at_eight_stages_and_at_the_deepest_it_fits():
    """``--set deep_rings``: at each shape and epilogue the policy's module first; each candidate at plan's cap of
    8 stages and, named ``_deep``, at a deeper ring that still validates; ``now_deep`` is the policy's own knobs
    with a deeper ring."""
    cases = epilogue_check.cases_of("deep_rings")
    by: dict = {}
    for c in cases:
        by.setdefault((c["epilogue"], tuple(c["shape"])), []).append(c)
    assert set(by) == ({(e, s) for e in epilogue_check.DEEP_RING_EPILOGUES for s in epilogue_check.DEEP_RING_CASES}
                       | {("none", s) for s in epilogue_check.DEEP_RING_SWAP_CASES})
    for (epilogue, (M, N, K)), group in by.items():
        assert group[0]["variant"] == "now" and "knobs" not in group[0]
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", epilogue))
        named = {c["variant"]: c for c in group[1:]}
        assert len(named) == len(group) - 1
        for name, c in named.items():
            if name == "now_deep":
                assert c["knobs"]["pipe_depth"] > plan.choose(p).knobs["pipe_depth"]
                continue
            base = name.removesuffix("_deep")
            pool = (epilogue_check.DEEP_RING_SWAP_CANDIDATES if (M, N, K) in epilogue_check.DEEP_RING_SWAP_CASES
                    else epilogue_check.DEEP_RING_CANDIDATES)
            rung, _ = pool[base]
            assert c["rung"] == rung and plan._validate(rung, p, c["knobs"]) is None
            if name != base:  # deeper than the same candidate at the cap, and past the cap
                assert c["knobs"]["pipe_depth"] > max(plan.MAX_SMALL_M_DEPTH,
                                                      named.get(base, {"knobs": {"pipe_depth": 0}})["knobs"]["pipe_depth"])
            else:
                assert c["knobs"]["pipe_depth"] <= plan.MAX_SMALL_M_DEPTH
        # the 64x64 tiles take cuBLAS's 13 stages of 64 (16 KiB each) at these shapes; swap AB's 64 rows more
        deepest = named["v11_64_s1_deep" if M <= 16 else "v9_64x64_deep"]["knobs"]["pipe_depth"]
        assert deepest == 13 if M > 16 else deepest > 13


def test_the_row64_set_pairs_the_policy_with_the_candidate_rule():
    """``--set row64_moved``: every shape whose plain choice plan's ROW_TILES_64 (not in RULES) would change, the
    policy's module (``now``: row-tiles) and the policy's with the candidate (``with_row64``: 64x64 tiles). The run
    of it (plan.ROW64_MOVED) timed twelve; narrow-n, since 2026-11-29, takes eight of them first (M = 128 on
    weights 3072-4096 wide with K <= 4096), and the candidate comes after it."""
    cases = epilogue_check.cases_of("row64_moved")
    shapes = {tuple(c["shape"]) for c in cases}
    assert len(shapes) == 4 and len(cases) == 8 and {c["variant"] for c in cases} == {"now", "with_row64"}
    for M, N, K in shapes:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", "none"))
        assert epilogue_check.split_choice(p, "now").rule == "row-tiles"
        assert epilogue_check.split_choice(p, "with_row64").rule == "row-tiles-64"


@pytest.mark.parametrize("which, rule, without", [("narrow_moved", "swap-ab-narrow", "no_narrow"),
                                                  ("small_split_moved", "small-m-split", "no_small_split")])
def test_the_moved_sets_pair_each_shape_with_the_policy_without_its_rule(which, rule, without):
    """``--set narrow_moved`` / ``small_split_moved``: every shape whose choice the rule changes, its module
    (``now``) and the policy's without the rule."""
    cases = epilogue_check.cases_of(which)
    shapes = {(c["epilogue"], tuple(c["shape"])) for c in cases}
    assert cases and len(shapes) * 2 == len(cases)
    assert {c["variant"] for c in cases} == {"now", without}
    for epilogue, (M, N, K) in shapes:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", epilogue))
        assert epilogue_check.split_choice(p, "now").rule == rule
        assert epilogue_check.split_choice(p, without).rule != rule
