"""The probes of fp8 block scales staged by TMA (knob ``stage_probe``, ``fp8.STAGE_PARTS``) and
``benchmarks/fp8_block_bisect.py``'s pure parts, on the CPU. Each probe keeps one part of
``stage_scales`` (A's 1-D copy and reads, B's, the copies without the reads, plain bulk copies in
place of the tensor maps) so that one GPU run says which part dies with "an illegal instruction"
(issue 32): the source must hold exactly that part, the barrier checker must pass its bytes, and
the bisect must check every probe at the M that tells the parts apart."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from gemm_ladder.compile import builder
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.sm90a import fp8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_block_bisect as bisect  # noqa: E402  (the GPU benchmark's pure parts)
import fp8_sweep  # noqa: E402

BLOCK = GemmSpec.fp8("bfloat16", "block")
_SREG_FROM = re.compile(r"Sreg_ptr\[\d+\] = (.*?)\[")
_TMA_1D = re.compile(r"cp_async_bulk_tensor_g2s_cluster_async_bulk_tensor_1d\w*\(tvm_builtin_cuda_cvta_generic_to_shared")
_BULK = re.compile(r"cp_async_bulk_g2s_cluster_async_bulk_shared__cluster\w*\(tvm_builtin_cuda_cvta_generic_to_shared")
SMEM, SCALE_A, SCALE_B = "((float*)pool_buf_ptr)", "scale_a_ptr", "scale_b_ptr"


def _cfg(probe, K=1280):
    return make_config("v9", 512, 512, K, spec=BLOCK, overlap=4, stage_scales=True, stage_probe=probe)


@pytest.mark.parametrize("probe, tma_1d, bulk, reads", [
    ("a", 1, 0, {SMEM, SCALE_B}),        # A staged and read; B's scale from global memory
    ("b", 1, 0, {SMEM, SCALE_A}),        # B staged and read; A's from global memory
    ("copies", 2, 0, {SCALE_A, SCALE_B}),  # both copied, neither read from shared memory
    ("bulk", 0, 2, {SMEM}),              # both staged by plain bulk copies, no tensor map
    ("aligned", 2, 0, {SMEM}),           # both staged in 16-byte aligned 1-D boxes
])
def test_each_probe_builds_only_its_part(probe, tma_1d, bulk, reads):
    src = builder.build(kernel_of(_cfg(probe))).cuda_source()
    assert len(_TMA_1D.findall(src)) == tma_1d and len(_BULK.findall(src)) == bulk
    assert set(_SREG_FROM.findall(src)) == reads


def test_the_bulk_probe_reads_b_s_scale_at_its_place_in_the_aligned_16_bytes():
    """K = 1280 has 10 K blocks a B row: block kb of B row nb is float nb * 10 + kb, copied in the
    16 bytes from its multiple of 4 down, so the consumer reads (nb * 10 + kb) % 4 past them
    (``& 3`` in the source; for the slice whose kb is a multiple of 4 it folds to ``(nb & 1) * 2``)."""
    src = builder.build(kernel_of(_cfg("bulk"))).cuda_source()
    copy_b = [line for line in src.splitlines() if _BULK.search(line) and "scale_b_ptr[" in line]
    rounded = re.search(r"scale_b_ptr\[\((.+) - \((.+) & 3\)\)\]", copy_b[0]) if len(copy_b) == 1 else None
    assert rounded and rounded.group(1) == rounded.group(2), copy_b  # x - (x & 3)
    b_reads = [line for line in src.splitlines() if re.search(r"Sreg_ptr\[[25]\] = \(\(float\*\)pool_buf_ptr\)", line)]
    assert b_reads and all("10) + " in line and "& 3)" in line or "& 1) * 2)" in line for line in b_reads), b_reads


@pytest.mark.parametrize("probe", ["a", "b", "copies", "aligned"])
def test_the_barrier_checker_passes_each_tensor_map_probe(probe):
    """The stage's bytes are what its copies bring: A's box alone, B's alone, both, both with A's
    box 4 floats longer."""
    assert check_config(_cfg(probe)).ok
    assert fp8.scale_stage_bytes(_cfg(probe)) == {"a": 4 * 128, "b": 16, "copies": 4 * 128 + 16,
                                                  "aligned": 4 * 132 + 16}[probe]


def test_the_aligned_probe_starts_every_box_on_16_bytes_and_reads_at_the_offsets():
    """A's box from kb * M + m_st rounded down to 4 floats (the tile's m_st is a multiple of 128:
    ``(k * M) & 3`` is what is left), B's from nb * K/128 + kb rounded down; the consumers read
    A's rows and B's scale that many floats on, and B's boxes land past A's longer one."""
    cfg = make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4, stage_scales=True, stage_probe="aligned",
                      dynamic_m=True)
    src = builder.build(kernel_of(cfg)).cuda_source()
    copies = [line for line in src.splitlines() if _TMA_1D.search(line)]
    assert len(copies) == 2 and "- ((k * M) & 3))" in copies[0], copies
    rounded = re.search(r"scale_b_flat_tensormap\)\)\)\), \((.+) - \((.+) & 3\)\)", copies[1])
    assert rounded and rounded.group(1) == rounded.group(2), copies[1]  # x - (x & 3)
    a_reads = [line for line in src.splitlines() if re.search(r"Sreg_ptr\[[0134]\] = \(\(float\*\)pool_buf_ptr\)", line)]
    assert any("* M) & 3)" in line for line in a_reads), a_reads
    assert fp8.b_scale_at(cfg) == 128 + fp8.SCALE_ALIGN and fp8.scale_row(cfg) == 128 + 2 * fp8.SCALE_ALIGN


def test_a_probe_is_refused_unless_it_names_one_and_stages():
    with pytest.raises(ConfigError, match="stage_probe='x': .* use stage_probe=''"):
        _cfg("x")
    with pytest.raises(ConfigError, match="stage_probe='a' with stage_scales=False: .*use stage_scales=True"):
        make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4, stage_probe="a")
    assert fp8.stage_parts(make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4)) == ("", "")


def test_the_bisect_checks_every_probe_at_the_m_that_tells_the_parts_apart():
    """Every module at its shape's M, unstaged first (a failing case costs a child); the staged
    ones also at an M off 16 bytes (A's boxes then start unaligned), but bulk, which needs M % 4 == 0."""
    with bisect.bisect_sweep():
        plan = {"modules": fp8_sweep.plan_modules("block")}
        got = bisect.cases(plan)
    names = {n.split("_", 2)[-1]: n for n in plan["modules"]}
    assert set(names) == set(bisect.CONFIGS)
    assert got[:2] == [(names["control"], 4096), (names["sm_control"], 128)]
    for probe in ("full", "a", "b", "copies", "aligned", "sm_full", "sm_aligned"):
        M = 128 if probe.startswith("sm_") else 4096
        assert (names[probe], M) in got and (names[probe], bisect.ODD_M) in got
    assert (names["bulk"], 4096) in got and (names["bulk"], bisect.ODD_M) not in got
    assert len(got) == len(set(got)) == len(bisect.CONFIGS) + 7
    assert bisect.ODD_M % 4
    assert fp8_sweep.SWEEPS["block"] is not bisect.BISECT  # restored: the block sweep's own again


def test_the_verdict_names_each_probe_s_outcome_at_each_m():
    checks = [{"name": "b_7168x16384_control", "M": 4096, "correct": True},
              {"name": "b_7168x16384_sm_full", "M": 128, "correct": False, "error": "its child ended (rc 1): illegal"},
              {"name": "b_7168x16384_a", "M": 333, "correct": False}]
    v = bisect.verdict(checks)
    assert v["control"] == {"4096": "pass"} and v["a"] == {"333": "FAIL (wrong)"}
    assert v["sm_full"]["128"].startswith("FAIL: its child ended") and "illegal" in v["sm_full"]["128"]
