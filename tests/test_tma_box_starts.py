"""Every TMA copy's box starts 16-byte aligned in its innermost dimension, proven on the CPU.

Hopper refuses a tensor copy whose innermost start coordinate is not a multiple of 16 bytes with
"an illegal instruction" at run time; the tensor map's encode (host) and the compile take it, so
neither the SASS nor the barrier checker sees it. That is what killed fp8 ``stage_scales`` on the
H100 (A's and B's 1-D scale boxes started at any float: issue 32,
``benchmarks/results/2026-11-26_h100_fp8_block_staged/``). This test records each copy TVM's
``tma_auto`` lowers (its TensorMap spec: coordinates, element bytes) while a module builds, and
asks TVM's arithmetic analyzer to prove ``innermost start * element bytes % 16 == 0`` for every
value of the loop and shape variables."""

from __future__ import annotations

import pytest
import tvm
from tvm.sym import Analyzer

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import fp8
from tests.lowered import tma_specs

BLOCK = GemmSpec.fp8("bfloat16", "block")
SMALL_M = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2, "stream_b": True,
           "pipe_depth": 8}  # the block policy's small-M knobs (plan.FP8_BLOCK_SMALL_KNOBS, with overlap=2)


def tma_box_starts(cfg) -> list[tuple[str, object, int]]:
    """(tensor, innermost start coordinate, element bytes) of every TMA copy of ``cfg``'s kernel."""
    specs, _ = tma_specs(cfg)
    return [(spec.descriptor_name, spec.coordinates[0], spec.effective_bytes) for spec in specs]


def unaligned(starts) -> list[str]:
    """The copies whose start the analyzer cannot prove a multiple of 16 bytes."""
    analyzer = Analyzer()
    bad = []
    for name, first, nbytes in starts:
        if not analyzer.can_prove(tvm.tirx.floormod(first * nbytes, 16) == 0):
            bad.append(f"{name}: starts at {first} ({nbytes}-byte elements)")
    return bad


@pytest.mark.parametrize("K, knobs", [
    (16384, {"overlap": 4, "stage_scales": True, "dynamic_m": True}),  # issue 32's shape, any M
    (1280, {"overlap": 4, "stage_scales": True}),                       # K/128 = 10: B rows off 16 bytes
    (16384, dict(SMALL_M, overlap=2, stage_scales=True, dynamic_m=True)),
    (16384, {"overlap": 4, "dynamic_m": True}),                         # the unstaged policy
    (1152, {"overlap": 4, "stage_scales": True, "stage_bulk": True, "dynamic_m": True}),  # bulk: the fallbacks
])
def test_every_fp8_block_copy_starts_16_byte_aligned(K, knobs):
    starts = tma_box_starts(make_config("v9", 4096, 7168, K, spec=BLOCK, **knobs))
    names = {name for name, _, _ in starts}
    assert {"A", "B", "D"} <= names
    assert ({"scale_a_flat", "scale_b_flat"} <= names) == knobs.get("stage_scales", False)
    assert unaligned(starts) == []
    # stage_bulk's plain bulk copies have no tensor map: test_fp8_stage_bulk proves their starts aligned


def test_the_check_catches_the_starts_that_died_on_the_h100():
    """The first stage_scales' starts (A's box at kb * M + m_st, B's at nb * K/128 + kb: any float)
    fail it; the same rounded down (``fp8.aligned_start``) and an fp8 tile's ``k * 128`` pass."""
    kb, M, tile, nb = (tvm.tirx.Var(n, "int32") for n in ("kb", "M", "tile", "nb"))
    first_a, first_b = kb * M + tile * 128, nb * 128 + kb
    assert len(unaligned([("scale_a_flat", first_a, 4), ("scale_b_flat", first_b, 4)])) == 2
    assert unaligned([("scale_a_flat", fp8.aligned_start(first_a), 4), ("scale_b_flat", fp8.aligned_start(first_b), 4),
                      ("A", kb * 128, 1)]) == []
