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


@pytest.mark.parametrize("spec, knobs", [(TENSOR, {"split_k": 4}), (ROW, {"split_k": 2, "reduce": "atomic"})])
def test_the_split_fp8_kernel_does_not_spill(spec, knobs):
    mod = built(make_config("v10", 256, 6144, 4096, spec=spec, dynamic_m=True, **knobs))
    try:
        res = sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert res.local == 0 and res.stack == 0


@pytest.mark.parametrize("spec, K, knobs", [(TENSOR, 1536, {"split_k": 2}), (TENSOR, 1536, {"split_k": 4}),
                                            (ROW, 1536, {"split_k": 3}), (TENSOR, 1024, {"split_k": 8}),
                                            (TENSOR, 1536, {"split_k": 2, "reduce": "atomic"})])
def test_the_barrier_checker_passes_split_fp8(spec, K, knobs):
    """Two to eight units a tile (one slice each at eight), rowwise, and the atomic sum."""
    assert check_config(make_config("v10", 512, 512, K, spec=spec, **knobs)).ok


def test_a_split_that_divides_the_slices_gives_each_unit_a_fixed_count():
    assert splitk.k_slices(3, 4, 32) == (24, 8) and all(isinstance(x, int) for x in splitk.k_slices(3, 4, 32))
    assert splitk.k_slices(2, 3, 32) == (21, 11)  # an uneven split: counts differ by one (16-bit only)


@pytest.mark.parametrize("spec, knobs, words", [
    (GemmSpec.fp8("bfloat16", "block"), {"split_k": 2}, "v10 with block scales: .* use per-tensor or rowwise"),
    (TENSOR, {"split_k": 1, "stream_k": True}, "stream_k=True: stream-K's pieces sum .* stream_k=False"),
    (TENSOR, {"split_k": 3}, r"split_k=3 and K=4096: .* divide the 32 slices of 128; use split_k in \[1, 2, 4, 8\]"),
    (TENSOR, {"split_k": 2, "overlap": 4}, "rung v10 .* takes no knob overlap"),
    (GemmSpec.fp8("bfloat16", "tensor", "bfloat16"), {"split_k": 2}, "v10 fp8 with a bias: .* use v9"),
])
def test_what_split_fp8_does_not_build_is_refused_with_the_fix(spec, knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v10", 256, 6144, 4096, spec=spec, **knobs)


def test_the_policy_splits_only_where_128x128_fills_at_most_half_the_sms_over_a_long_k():
    """``plan.fp8_split``: the two measured wins (64 and 34 tiles), not the two losses (96 and 112 tiles),
    not a short K, a bias, block scales or the small-M tiles; the rule builds v10 with split_k=2."""
    assert plan.fp8_split(256, 4096, 14336) and plan.fp8_split(256, 2112, 7168, recipe="row")
    assert not plan.fp8_split(256, 6144, 4096) and not plan.fp8_split(256, 7168, 16384)
    assert not plan.fp8_split(256, 4096, 4096)  # K under FP8_SPLIT_MIN_K
    assert not plan.fp8_split(256, 4096, 14336, bias="bfloat16") and not plan.fp8_split(256, 4096, 14336, recipe="block")
    assert not plan.fp8_split(plan.FP8_SMALL_M, 4096, 14336)
    choice = plan.rule_choice(plan.Problem(256, 4096, 14336, dtype="bfloat16", spec=TENSOR, sms=132))
    assert choice.rule == "fp8-split-k" and choice.knobs["split_k"] == 2
    cfg = make_config(choice.rung, 256, 4096, 14336, **choice.knobs)
    assert cfg.rung == "v10" and dict(cfg.extra)["promote"] == 1
