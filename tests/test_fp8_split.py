"""fp8 on v10 (issue 32, the fp8 suite's sub-wave shapes): a tile's K over ``split_k`` CTAs, each
unit's promoted fp32 sums its partials, the last unit adding them up and applying the scales once
before the epilogue (``fp8.check_split``; ``gemm.kernel``'s split-K path). CPU only: the CUDA source
(partials written from the promoted sums, the scales read after the sum), ptxas's report (no spills),
the barrier checker, and the refusals with their fixes; the GPU checks and timings are
``benchmarks/fp8_sweep.py``'s (its ``sk`` configs)."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan
from gemm_ladder.sm90a import splitk

from .built import built

TENSOR = GemmSpec.fp8("bfloat16", "tensor")
ROW = GemmSpec.fp8("bfloat16", "row")
_PARTIAL_STORE = re.compile(r"st_vec_global_v4_f32\(\(&\(P_ptr\[.*\]\)\), (\w+)_ptr\[\d+\]")


def _source(cfg) -> str:
    return built(cfg).cuda_source()


def test_the_partials_are_the_promoted_sums_and_the_scales_follow_the_sum():
    """fp8: every partial slot is written from the fp32 total (Freg), the scale read comes after the
    last unit's sum; a 16-bit v10 still writes its accumulators (Dreg) and reads no scale."""
    src = _source(make_config("v10", 256, 6144, 4096, spec=TENSOR, dynamic_m=True, split_k=2))
    assert set(_PARTIAL_STORE.findall(src)) == {"Freg"}
    consumer = src[src.index("P_ptr["):]
    assert "scale_a" in consumer and "scale_b" in consumer  # the scales after the partials, in the epilogue
    plain = _source(make_config("v10", 256, 6144, 4096, dynamic_m=True, split_k=2))
    assert set(_PARTIAL_STORE.findall(plain)) == {"Dreg"} and "scale_a" not in plain


def test_stream_k_pieces_and_an_uneven_split_promote_every_slice_over_a_count_known_at_run_time():
    """Stream-K's pieces (and a split that does not divide the slices) run the promotion every slice in a
    loop over a run-time count; their partials are the promoted sums too, and the scales follow the sum.
    A fixed split of the same shape unrolls its fixed count instead (no such loop)."""
    runtime_loop = re.compile(r"for \(int \w+ = 0; \w+ < pc_ptr\[2\]; ")  # the piece's slice count
    stream = _source(make_config("v10", 256, 6144, 4096, spec=TENSOR, dynamic_m=True, split_k=1, stream_k=True))
    assert set(_PARTIAL_STORE.findall(stream)) == {"Freg"}
    assert runtime_loop.search(stream), "the stream-K piece's promoted loop over its run-time count"
    assert "scale_a" in stream[stream.index("P_ptr["):]
    uneven = _source(make_config("v10", 256, 6144, 4096, spec=ROW, dynamic_m=True, split_k=3))
    assert set(_PARTIAL_STORE.findall(uneven)) == {"Freg"} and "scale_b" in uneven[uneven.index("P_ptr["):]


@pytest.mark.parametrize("spec, knobs", [(TENSOR, {"split_k": 4}), (ROW, {"split_k": 2, "reduce": "atomic"}),
                                         (TENSOR, {"split_k": 1, "stream_k": True}), (ROW, {"split_k": 3})])
def test_the_split_fp8_kernel_does_not_spill(spec, knobs):
    mod = built(make_config("v10", 256, 6144, 4096, spec=spec, dynamic_m=True, **knobs))
    try:
        res = sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert res.local == 0 and res.stack == 0


@pytest.mark.parametrize("spec, K, knobs", [(TENSOR, 1536, {"split_k": 2}), (TENSOR, 1536, {"split_k": 4}),
                                            (ROW, 1536, {"split_k": 3}), (TENSOR, 1024, {"split_k": 8}),
                                            (TENSOR, 1536, {"split_k": 2, "reduce": "atomic"}),
                                            (TENSOR, 1536, {"split_k": 5}), (ROW, 1536, {"split_k": 5, "reduce": "atomic"})])
def test_the_barrier_checker_passes_split_fp8(spec, K, knobs):
    """Two to eight units a tile (one slice each at eight), rowwise, the atomic sum, and a split that does
    not divide the 12 slices (units of 2 and 3, counted at run time)."""
    assert check_config(make_config("v10", 512, 512, K, spec=spec, **knobs)).ok


def test_a_split_that_divides_the_slices_gives_each_unit_a_fixed_count():
    assert splitk.k_slices(3, 4, 32) == (24, 8) and all(isinstance(x, int) for x in splitk.k_slices(3, 4, 32))
    assert splitk.k_slices(2, 3, 32) == (21, 11)  # an uneven split: counts differ by one (16-bit only)


@pytest.mark.parametrize("spec, knobs, words", [
    (GemmSpec.fp8("bfloat16", "block"), {"split_k": 2}, "v10 with block scales: .* use per-tensor or rowwise"),
    (GemmSpec.fp8("bfloat16", "block"), {"split_k": 1, "stream_k": True}, "v10 with block scales: .* stream-K's"),
    (TENSOR, {"split_k": 1, "stream_k": True, "promote": 2}, "stream_k=True and promote=2: .* use promote=1"),
    (TENSOR, {"split_k": 3, "promote": 2},
     r"split_k=3, K=4096 and promote=2: .* use promote=1, or split_k in \[1, 2, 4, 8\]"),
    (TENSOR, {"split_k": 2, "stagger": True}, "rung v10 .* takes no knob stagger"),
    (GemmSpec.fp8("bfloat16", "tensor", "bfloat16"), {"split_k": 2}, "v10 fp8 with a bias: .* use v9"),
])
def test_what_split_fp8_does_not_build_is_refused_with_the_fix(spec, knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v10", 256, 6144, 4096, spec=spec, **knobs)


def test_the_policy_splits_only_where_the_tiles_fill_at_most_half_the_sms_over_a_long_k():
    """``plan.fp8_split_ways``: the measured wins (64 and 34 tiles of 128x128, the small-M tiles' 33 and 64),
    in the fewest units' waves (three ways at 34 tiles), not the losses (96 and 112 tiles), not a short K, a
    bias or block scales; the rule builds v10 with that split, and the small-M tiles' with overlap."""
    ways = plan.fp8_split_ways
    assert ways(256, 4096, 14336) == 2 and ways(256, 2112, 7168, recipe="row") == 3  # 32 and 17 cluster tiles
    assert ways(256, 6144, 4096) == 1 and ways(256, 7168, 16384) == 1  # 48 and 56: two ways would take two waves
    assert ways(256, 4096, 4096) == 1  # K under FP8_SPLIT_MIN_K
    assert ways(256, 4096, 14336, bias="bfloat16") == 1 and ways(256, 4096, 14336, recipe="block") == 1
    # the small-M tiles (1x2 clusters of 64x64): 17 and 32 cluster tiles at M = 64, 64 at M = 128
    assert ways(64, 2112, 7168) == 3 and ways(64, 4096, 14336) == 2 and ways(plan.FP8_SMALL_M, 4096, 14336) == 1
    assert ways(64, 6144, 4096) == 1 and ways(64, 24576, 1536) == 1
    # where 64-row tiles come to one wave the fill rule comes first (64x128 at 256x4096: 128 tiles)
    assert plan.rule_choice(plan.Problem(256, 4096, 14336, dtype="bfloat16", spec=TENSOR, sms=132)).rule == "fp8-fill"
    choice = plan.rule_choice(plan.Problem(256, 3072, 14336, dtype="bfloat16", spec=TENSOR, sms=132))  # 96 of 64x128
    assert choice.rule == "fp8-split-k" and choice.knobs["split_k"] == plan.fp8_split_ways(256, 3072, 14336) == 2
    assert choice.knobs["pipe_depth"] == plan.FP8_SUBWAVE_DEPTH  # one wave of units: the deeper ring
    cfg = make_config(choice.rung, 256, 3072, 14336, **choice.knobs)
    assert cfg.rung == "v10" and dict(cfg.extra)["promote"] == 1
    small = plan.rule_choice(plan.Problem(64, 2112, 7168, dtype="bfloat16", spec=ROW, sms=132))
    cfg = make_config(small.rung, 64, 2112, 7168, dynamic_m=True, **small.knobs)
    assert small.rule == "fp8-split-k" and cfg.rung == "v10" and (cfg.blk_m, cfg.blk_n) == (64, 64)
    assert dict(cfg.extra)["split_k"] == 3 and dict(cfg.extra)["overlap"] == plan.FP8_SMALL_KNOBS["overlap"] == 4
