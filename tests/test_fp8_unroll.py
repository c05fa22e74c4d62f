"""v9's ``unroll_k`` (fp8's overlapped promotion unrolled over the whole tile) and fp8's 32-bit
descriptor adds (``common.desc_plus``): what is refused, what the CUDA and SASS hold, the barrier
checker, and the policy that sets the knob (``plan.fp8_unrolled``)."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.compile import sass
from gemm_ladder.compile.builder import build
from gemm_ladder.core import budget
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan

# the fp8 fill tiles (plan.FP8_FILL_KNOBS) with a shallower ring
FILL = dict(spec=GemmSpec.fp8(), blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=2, cluster_n=1, stream_b=True,
            pipe_depth=6, overlap=4, promote=1)
W112 = dict(spec=GemmSpec.fp8(scales="row"), promote=1, overlap=4, blk_n=112, epi_n=16, pipe_depth=4)


@pytest.mark.parametrize("knobs, shape, words", [
    (dict(FILL, overlap=0), (256, 2112, 7168), "overlapped promotion"),
    (dict(unroll_k=True), (256, 2112, 7168), "overlapped promotion"),  # a 16-bit spec
    (dict(FILL, spec=GemmSpec.fp8(scales="block"), stage_scales=True), (256, 2112, 7168), "block scales"),
    (dict(FILL, stagger=True, blk_m=128, num_warpgroups=2), (256, 2112, 7168), "stagger"),
    (dict(FILL, blk_n=128, pipe_depth=4), (256, 4096, 4096), "blk_n in \\[64, 112\\]"),
    (dict(W112, blk_n=96, epi_n=32, pipe_depth=7), (256, 6144, 4096), "128x96 spilled"),  # run 26
    (FILL, (256, 2112, 14336), "8960 instructions"),
    (dict(W112, spec=GemmSpec.fp8(), promote=2, overlap=2, pipe_depth=7), (256, 6144, 4096),
     "and promote=2: .* 168 registers .* over the 96"),  # spilled 448 bytes a thread (run 24)
])
def test_knobs_it_does_not_build_are_refused_with_the_fix(knobs, shape, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", *shape, **{**knobs, "unroll_k": True})


SPLIT = dict(FILL, cluster_m=1, cluster_n=2, pipe_depth=8)


def test_v10_unrolls_a_split_only_where_it_divides_the_slices():
    cfg = make_config("v10", 64, 4096, 14336, split_k=2, unroll_k=True, **SPLIT)  # 56 slices a unit
    assert dict(cfg.extra)["unroll_k"] is True
    with pytest.raises(ConfigError, match=r"split_k=3: a unit's count of slices is known only at run time.*"
                                          r"use split_k in \[1, 2, 4, 7, 8\]"):
        make_config("v10", 64, 2112, 7168, split_k=3, unroll_k=True, **SPLIT)
    with pytest.raises(ConfigError, match="stream_k"):
        make_config("v10", 64, 2112, 7168, stream_k=True, unroll_k=True, **SPLIT)
    # the estimate counts a unit's slices: 112 slices of 64x64 do not fit whole, two units of 56 do
    with pytest.raises(ConfigError, match="8960 instructions"):
        make_config("v10", 64, 4096, 14336, split_k=1, unroll_k=True, **SPLIT)
    with pytest.raises(ConfigError, match="takes no knob unroll_k"):
        make_config("v11", 512, 1024, 1024, unroll_k=True)


def test_the_split_units_unrolled_run_the_units_fixed_count():
    src = build("v10", 64, 1024, 2048, split_k=2, unroll_k=True, **SPLIT).source  # 8 slices a unit: 2 runs of 4
    assert re.search(r"#pragma unroll\n\s*for \(int r = 0; r < 2; \+\+r\)", src)
    report = check_config(make_config("v10", 64, 640, 2048, split_k=2, unroll_k=True, **SPLIT))
    assert report.ok, report.findings[:3]


def test_the_cost_model_matches_what_was_measured():
    # runs that paid: 56 and 80 slices of 64x64, 32 and 56 of 128x112 over two consumers; that did not: 112 slices
    # of 64x64, 128 of 128x112, 64x128 over one consumer (spilled)
    for tile, K in [((64, 64, 1), 7168), ((64, 64, 1), 10240), ((128, 112, 2), 4096), ((128, 112, 2), 7168)]:
        assert budget.fp8_unroll_fits(*tile, K)
    for tile, K in [((64, 64, 1), 14336), ((128, 112, 2), 16384), ((64, 128, 1), 4096), ((128, 96, 2), 4096)]:
        assert not budget.fp8_unroll_fits(*tile, K)
    # promoting every 2 slices: 64x64 over one consumer ran unspilled, 128x112 over two spilled (run 24)
    assert budget.fp8_unroll_fits(64, 64, 1, 7168, promote=2)
    assert not budget.fp8_unroll_fits(128, 112, 2, 4096, promote=2)


def test_the_loop_over_runs_is_unrolled_and_nothing_else_changes():
    plain = build("v9", 256, 640, 1024, **FILL).source
    unrolled = build("v9", 256, 640, 1024, **FILL, unroll_k=True).source
    assert "#pragma unroll\n" not in plain
    loop = re.search(r"#pragma unroll\n\s*for \(int r = 0; r < (\d+); \+\+r\)", unrolled)
    assert loop and int(loop.group(1)) == 1024 // 128 // 4  # two runs of four one-slice groups
    # the same CUDA but for that pragma (and the knob in the config the module records)
    assert re.sub(r"#pragma unroll\n\s*", "", unrolled).replace("unroll_k", "") == plain.replace("unroll_k", "")


def test_the_unrolled_fill_tile_keeps_its_descriptors_in_uniform_registers_and_does_not_spill():
    # the point of the knob: the rolled loop moves every wgmma's descriptors from vector registers (R2UR)
    knobs = dict(FILL, pipe_depth=12)
    rolled = build("v9", 256, 2112, 7168, dynamic_m=True, **knobs)
    unrolled = build("v9", 256, 2112, 7168, dynamic_m=True, **knobs, unroll_k=True)
    counts = {name: sass.instruction_counts(sass.disassemble(m.binary), ("QGMMA", "R2UR", "UIADD3"))
              for name, m in (("rolled", rolled), ("unrolled", unrolled))}
    assert counts["unrolled"]["QGMMA"] > counts["rolled"]["QGMMA"]  # the whole tile's wgmmas, unrolled
    per_wgmma = {n: c["R2UR"] / c["QGMMA"] for n, c in counts.items()}
    assert per_wgmma["unrolled"] < per_wgmma["rolled"] / 2
    assert counts["unrolled"]["UIADD3"] > counts["rolled"]["UIADD3"]
    assert sass.resource_usage(unrolled.binary).stack == 0


@pytest.mark.parametrize("knobs, M", [(FILL, 256), (FILL, 200), (W112, 256), (dict(FILL, promote=2, overlap=2), 256)],
                         ids=["fill", "fill-odd-m", "row-112", "fill-pairs"])
def test_the_barrier_checker_passes_the_unrolled_kernels(knobs, M):
    report = check_config(make_config("v9", M, 448 if knobs is W112 else 640, 1024, **knobs, unroll_k=True))
    assert report.ok, report.findings[:3]


def test_fp8_moves_its_descriptors_by_32_bit_adds_and_16_bit_kernels_by_64_bit_sums():
    fp8_src = build("v9", 256, 640, 1024, **FILL).source
    bf16_src = build("v9", 512, 1024, 1024, blk_n=128).source
    narrow = ">> (uint64_t)32ULL) << (uint64_t)32ULL)"
    assert narrow in fp8_src and narrow not in bf16_src
    assert re.search(r"desc_a_ptr\[0\] \+ \(\(uint64_t\)", bf16_src)


@pytest.mark.parametrize("M, N, K, recipe, unrolled", [
    (256, 2112, 7168, "tensor", True),  # the fill tile, 56 slices
    (256, 2112, 14336, "row", False),  # the fill tile past the estimate: rolled, every slice
    (256, 6144, 4096, "row", True),  # 128x112
    (64, 6144, 4096, "tensor", True),  # the small-M tiles
    (256, 7168, 16384, "tensor", False),  # 128x112 over 128 slices: too long
    (256, 4096, 14336, "tensor", False),  # 64x128 over one consumer: too many registers
    (4096, 4096, 4096, "tensor", False),  # 128x256 in halves: not overlapped
    (1024, 4096, 4096, "block", False),  # block scales
    (64, 4096, 14336, "tensor", False),  # v10's split, two ways: level unrolled (run 23), not set
])
def test_the_policy_unrolls_where_the_tile_fits(M, N, K, recipe, unrolled):
    rung, knobs = plan.fp8_module(M, N, K, recipe)
    assert knobs.get("unroll_k", False) is unrolled
    # the 64x64 fill tile promotes every 2 slices where it is unrolled (runs 24-25), every slice where not
    if plan.fp8_fill_n(M, N, 132, recipe) == 64:
        assert knobs.get("promote", 1) == (2 if unrolled else 1)
    make_config(rung, M, N, K, spec=GemmSpec.fp8(scales=recipe), **knobs)  # what the policy picks validates
