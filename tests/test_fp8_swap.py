"""fp8 with swapped operands (issue 32, mid M): v11's e4m3 kernel with per-tensor and rowwise scales (its wgmma, the
promotion, the scales on the transposed fragment, ``split_m``'s two consumers on halves of M, the barriers, what it
refuses) and the policy's ``fp8-swap`` rule (``plan.fp8_swap_knobs``), which takes it where tiles whose rows divide M
fill the waves better than v9's. CPU only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan
from gemm_ladder.sm90a.common import SwapPlan

from .built import built

TENSOR = GemmSpec.fp8("bfloat16", "tensor")
ROW = GemmSpec.fp8("bfloat16", "row")


def _choice(M, N, K, spec=TENSOR):
    return plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))


def test_v11_fp8_swaps_the_operands_types_into_its_e4m3_wgmma_and_promotes_without_spilling():
    """M is wgmma's N (80 here, no 64-row step): ``wgmma.m64n80k32`` with B's type first, QGMMA in the SASS, the
    promotion's fp32 adds, no local memory; an e5m2 B is wgmma's A under the swap."""
    cfg = make_config("v11", 320, 4096, 14336, spec=TENSOR, blk_m=80, overlap=4, dynamic_m=True)
    assert (cfg.blk_k, cfg.knobs()["split_k"], cfg.knobs()["promote"]) == (128, 1, 1)
    src = built(cfg).cuda_source()
    assert "wgmma.mma_async.sync.aligned.m64n80k32.f32.e4m3.e4m3" in src and "scale_a_ptr" in src
    try:
        text, usage = sass.disassemble(built(cfg).binary), sass.resource_usage(built(cfg).binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert "QGMMA.64x80x32.F32.E4M3.E4M3" in text
    assert len(re.findall(r"\bFADD\b", text)) >= 40 and usage.local == 0
    e5m2 = make_config("v11", 320, 512, 512, spec=GemmSpec.fp8("bfloat16", "tensor", b="float8_e5m2"), blk_m=80)
    assert ".f32.e5m2.e4m3" in built(e5m2).cuda_source()


SPLIT_M = {"blk_n": 64, "num_warpgroups": 2, "split_m": True, "overlap": 4}


@pytest.mark.parametrize("knobs", [{"blk_m": 80, "overlap": 4}, {"blk_m": 160, "pipe_depth": 5},
                                   {"blk_m": 80, "blk_n": 64, "num_warpgroups": 1, "overlap": 4},
                                   {**SPLIT_M, "blk_m": 160, "pipe_depth": 7},
                                   {**SPLIT_M, "blk_m": 192, "pipe_depth": 6}])
def test_the_barrier_checker_passes_v11s_fp8_tiles(knobs):
    assert check_config(make_config("v11", 320, 512, 1280, spec=TENSOR, **knobs)).ok


def test_split_m_gives_each_consumer_half_the_rows_of_m_on_the_same_rows_of_n():
    """160x64 in split_m: two consumers, each ``wgmma.m64n80k32`` (80 rows of M) on the one 64-row atom of N, its
    overlapped promotion within the registers (no local memory); each stages its own 80 rows of D and stores them
    in 80-row boxes, and its B descriptor starts at its own rows of A's tile (consumer 1's 80 rows on)."""
    cfg = make_config("v11", 640, 2112, 7168, spec=TENSOR, blk_m=160, pipe_depth=7, dynamic_m=True, **SPLIT_M)
    plan_ = SwapPlan(cfg)
    assert (plan_.m_cols, plan_.rows_per_wg, plan_.acc_regs) == (80, 64, 40)
    assert [plan_.m_first(c) for c in (0, 1)] == [0, 80] and [plan_.n_first(c) for c in (0, 1)] == [0, 0]
    whole = SwapPlan(make_config("v11", 640, 2112, 7168, spec=TENSOR, blk_m=160, blk_n=128, pipe_depth=5))
    assert (whole.m_cols, whole.rows_per_wg, whole.n_first(1), whole.m_first(1)) == (160, 64, 64, 0)
    src = built(cfg).cuda_source()
    assert "wgmma.mma_async.sync.aligned.m64n80k32.f32.e4m3.e4m3" in src and "m64n160k32" not in src
    found = check_config(make_config("v11", 320, 512, 1280, spec=TENSOR, blk_m=160, pipe_depth=7, **SPLIT_M))
    assert found.ok and found.kir.tensormaps["D_tensormap"].box == (64, 80)
    assert [b.shape for b in found.kir.buffers if b.name == "Esmem"] == [(2, 80, 64)]
    try:
        text, usage = sass.disassemble(built(cfg).binary), sass.resource_usage(built(cfg).binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert "QGMMA.64x80x32.F32.E4M3.E4M3" in text and usage.local == 0


@pytest.mark.parametrize("knobs", [{"blk_m": 80, "blk_n": 64, "num_warpgroups": 1, "overlap": 4, "pipe_depth": 8},
                                   {**SPLIT_M, "blk_m": 160, "pipe_depth": 7}])
def test_v11_rowwise_scales_go_with_the_transposed_fragment(knobs):
    """Swapped, the sums' fragment rows are N and its columns M: each thread keeps B's scales of its two rows of N in
    registers and multiplies each sum by A's scale of its column (v9 keeps A's by row); the barrier checker passes."""
    src = built(make_config("v11", 320, 512, 1280, spec=ROW, **knobs)).cuda_source()
    assert re.search(r"Sreg_ptr\[\d+\] = scale_b_ptr\[", src) and not re.search(r"Sreg_ptr\[\d+\] = scale_a_ptr\[", src)
    assert re.search(r"\* Sreg_ptr\[\d+\]\) \* scale_a_ptr\[min\(", src)
    v9 = built(make_config("v9", 320, 512, 1280, spec=ROW, overlap=4)).cuda_source()
    assert re.search(r"Sreg_ptr\[\d+\] = scale_a_ptr\[", v9) and re.search(r"\) \* scale_b_ptr\[min\(", v9)
    assert check_config(make_config("v11", 320, 512, 1280, spec=ROW, **knobs)).ok


def test_split_m_refuses_rows_of_m_that_do_not_halve_into_wgmmas_n():
    with pytest.raises(ConfigError, match="split_m=True with blk_m=88, blk_n=64: .*blk_m a multiple of 16"):
        make_config("v11", 320, 4096, 4096, spec=TENSOR, blk_m=88, **SPLIT_M)
    with pytest.raises(ConfigError, match="takes no knob split_m"):
        make_config("v9", 320, 4096, 4096, spec=TENSOR, split_m=True)


def test_v11_fp8_refuses_what_the_swap_does_not_build():
    """Block scales are applied by K block at each promotion, indexed by the tile's rows, which the swap transposes; a
    bias is not on the split's epilogue; two accumulator sets and the promoted sums at 160 rows pass the registers."""
    with pytest.raises(ConfigError, match="v11 fp8 with block scales: .*per-tensor and rowwise scales only"):
        make_config("v11", 320, 4096, 4096, spec=GemmSpec.fp8("bfloat16", "block"), blk_m=80)
    with pytest.raises(ConfigError, match="with a bias"):
        make_config("v11", 320, 4096, 4096, spec=GemmSpec.fp8("bfloat16", "tensor", "bfloat16"), blk_m=80)
    with pytest.raises(ConfigError, match="overlap=4 holds 160 tensor-core accumulators .*over the 232"):
        make_config("v11", 320, 4096, 4096, spec=TENSOR, blk_m=160, overlap=4, pipe_depth=4)
    # two overlapped sets of 64 accumulators over two consumers spill (0.34x at 64x256); 48 do not
    with pytest.raises(ConfigError, match=r"overlap=4 over two consumers of 64 accumulators each .*use overlap=0"):
        make_config("v11", 320, 6144, 4096, spec=TENSOR, blk_m=64, blk_n=256, overlap=4, pipe_depth=4)
    make_config("v11", 320, 6144, 4096, spec=TENSOR, blk_m=64, blk_n=256, pipe_depth=4)  # drained: 1.07x the rules
    make_config("v11", 320, 6144, 4096, spec=TENSOR, blk_m=48, blk_n=256, overlap=4, pipe_depth=4)
    # the rule's most rows with the overlapped promotion, over two consumers and over one
    make_config("v11", 320, 4096, 4096, spec=TENSOR, blk_m=plan.FP8_SWAP_OVERLAP_MAX_M[128], overlap=4)
    make_config("v11", 320, 4096, 4096, spec=TENSOR, blk_m=plan.FP8_SWAP_OVERLAP_MAX_M[64], blk_n=64, num_warpgroups=1,
                overlap=4, pipe_depth=8)


@pytest.mark.parametrize("M, N, K, tile", [
    (320, 4096, 14336, (80, 128)),  # +27% over v9's 128x112 (3 rows of 128 for 320)
    (320, 4096, 4096, (80, 128)),  # +27%
    (320, 7168, 16384, (160, 128)),  # +9% over 192x128
    (640, 4096, 14336, (160, 128)),  # +9%
    (320, 2112, 7168, (80, 64)),  # +68% over 128x128 in 34 clusters of 2x1 (half the SMs)
    (384, 2112, 7168, (96, 64)),  # +19% over 64x128 (2026-11-30_h200_fp8_narrow: 33 x 4 tiles, one wave)
    (512, 2112, 7168, (128, 64)),  # +24% over v9's 128x112 (76 tiles), one consumer overlapped
    (640, 2112, 7168, (160, 64)),  # +19% over v9's 128x128, split_m (two consumers of 80 rows)
    (768, 2112, 7168, (192, 64)),  # +10%, split_m
    (320, 6144, 4096, None),  # 80x128 ran 0.88x v9's 128x144 (two waves)
    (384, 4096, 14336, None),  # 96x128 ran 0.98x v9's 128x112 (3 whole rows)
])
def test_the_swap_rule_takes_v11_where_it_ran_faster_and_not_where_it_ran_slower(M, N, K, tile):
    choice = _choice(M, N, K)
    if tile is None:
        assert choice.rung == "v9" and choice.rule != "fp8-swap"
        return
    assert choice.rule == "fp8-swap" and choice.rung == "v11"
    assert (choice.knobs["blk_m"], choice.knobs["blk_n"]) == tile and choice.knobs["split_k"] == 1
    split = tile[1] == 64 and tile[0] > plan.FP8_SWAP_OVERLAP_MAX_M[64]
    assert choice.knobs["num_warpgroups"] == (2 if split else tile[1] // 64)
    assert choice.knobs.get("split_m", False) == split
    assert ("overlap" in choice.knobs) == (split or tile[0] <= plan.FP8_SWAP_OVERLAP_MAX_M[tile[1]])
    make_config("v11", M, N, K, **choice.knobs)  # the knobs (the spec among them) validate
    assert plan.FP8_SWAP_RESULTS in choice.text()
    assert (Path(__file__).resolve().parents[1] / plan.FP8_SWAP_RESULTS).is_file()


def test_the_swap_rule_keeps_to_per_tensor_and_rowwise_scales_no_bias_and_its_range_of_m():
    for spec in (GemmSpec.fp8("bfloat16", "block"), GemmSpec.fp8("bfloat16", "tensor", "bfloat16")):
        assert _choice(320, 4096, 14336, spec).rung != "v11"
    row, tensor = _choice(640, 2112, 7168, ROW), _choice(640, 2112, 7168)
    assert row.rung == "v11" and {**row.knobs, "spec": None} == {**tensor.knobs, "spec": None}  # the same tile
    for M in (plan.FP8_SWAP_MIN_M, 200, 64, plan.FP8_SWAP_MAX_M + 1, 4096):
        assert _choice(M, 4096, 14336).rule != "fp8-swap", M
    assert plan.fp8_swap_knobs(plan.FP8_SWAP_MIN_M + 64, 4096, 14336, "tensor") is not None


def test_the_swap_rules_knobs_validate_at_every_m_and_weight_it_takes():
    """Wherever the rule fires (odd N and K too), v11 builds its knobs: the ring as deep as shared memory holds."""
    fired = 0
    for M in range(plan.FP8_SWAP_MIN_M + 1, plan.FP8_SWAP_MAX_M + 1, 37):
        for N, K in ((4096, 14336), (2112, 7168), (3008, 1008), (24576, 1536), (5120, 5120), (48, 32)):
            rung, knobs = plan.fp8_module(M, N, K, "tensor")
            if rung == "v11":
                fired += 1
                cfg = make_config("v11", M, N, K, spec=TENSOR, **knobs)
                assert cfg.blk_m % 16 == 0 and 64 <= cfg.blk_m <= 256 and cfg.knobs()["pipe_depth"] >= 2
    assert fired >= 10


def test_an_fp8_packs_weight_takes_the_mid_buckets_and_the_swap_module_serves_its_cell():
    """``kernel_pack.FP8_MID_BUCKETS``: an fp8 weight is planned at 320, 448 and 640 too, so M = 257-320 gets the
    module chosen at 320 (v11's 80-row tiles at 4096x14336) and 321-384 the one chosen at 384 (v9's 128x112); a
    16-bit weight keeps the buckets it had."""
    from gemm_ladder.serve import kernel_pack

    items = kernel_pack.plan_pack([], [kernel_pack.FP8_INPUT], weights=[(4096, 14336)], fp8_scales=("tensor",),
                                  alternatives=False)
    cells = {tuple(run["m_range"]): item["job"] for item in items for run in item["served"]}
    swap = [job for rng, job in cells.items() if rng[0] <= 300 <= rng[1]]
    assert len(swap) == 1 and swap[0].rung == "v11" and swap[0].knobs["blk_m"] == 80
    assert [rng for rng in cells if rng[0] <= 300 <= rng[1]] == [(257, 320)]
    above = [job for rng, job in cells.items() if rng[0] <= 384 <= rng[1]]
    assert len(above) == 1 and above[0].rung == "v9"
    assert set(kernel_pack.FP8_MID_BUCKETS) <= set(kernel_pack.weight_buckets(4096, 14336, kernel_pack.FP8_MID_BUCKETS))
    assert not set(kernel_pack.FP8_MID_BUCKETS) & set(kernel_pack.weight_buckets(4096, 14336))
