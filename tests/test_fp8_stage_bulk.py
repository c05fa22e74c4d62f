"""fp8 block scales staged by plain bulk copies (issue 32, knob ``stage_bulk`` with ``stage_scales``).

The producer copies each K block's A and B scales into the ring stage with
``cp.async.bulk.shared::cluster.global`` (no tensor map; 4.4% faster than the 1-D tensor copies in the
H100 probe run, ``benchmarks/results/2026-11-26_h100_fp8_block_staged_fix/``). A bulk copy neither clamps
nor zero-fills, so each one is guarded by its exact bound and falls back to the tensor copy where the
box would run past the scale tensor (the last rows, the last B blocks). CPU only: the source and the
traced TIR (every bulk copy aligned and inside its tensor), the SASS (UBLKCP), the barrier checker
(the copies counted in the stage's bytes, both kinds at odd shapes) and the knob's refusals."""

from __future__ import annotations

import re

import pytest
import tvm
from tvm.sym import Analyzer

from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.sm90a import fp8

from .built import built

BLOCK = GemmSpec.fp8("bfloat16", "block")
SMALL_M = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2, "stream_b": True,
           "pipe_depth": 8}  # the block policy's small-M knobs (plan.FP8_BLOCK_SMALL_KNOBS, with overlap=2)
_BULK = "cp_async_bulk_g2s_cluster_async_bulk_shared__cluster"
_TMA_1D = "cp_async_bulk_tensor_g2s_cluster_async_bulk_tensor_1d"
_SREG_FROM = re.compile(r"Sreg_ptr\[\d+\] = (.*?)\[")


def _bulk(M, N, K, **knobs):
    return make_config("v9", M, N, K, spec=BLOCK, stage_scales=True, stage_bulk=True, **knobs)


def bulk_copies(cfg) -> list[tuple[object, list]]:
    """(call, enclosing if-conditions, innermost last) of every plain bulk copy in ``cfg``'s traced
    kernel (before lowering: the guards as written, not yet rewritten by CSE)."""
    found = []

    def walk(s, conds):
        kind = type(s).__name__
        if kind == "SeqStmt":
            for x in s.seq:
                walk(x, conds)
        elif kind == "IfThenElse":
            walk(s.then_case, conds + [s.condition])
            if s.else_case is not None:
                walk(s.else_case, conds + [tvm.tirx.Not(s.condition)])
        elif kind == "Evaluate":
            call = s.value
            if str(getattr(getattr(call, "op", None), "name", "")).startswith("tirx.ptx.cp_async_bulk_g2s"):
                found.append((call, conds))
        elif hasattr(s, "body"):
            walk(s.body, conds)

    walk(kernel_of(cfg).body, [])
    return found


def test_the_scales_come_by_bulk_copies_each_with_the_tensor_copy_as_its_fallback():
    """Two bulk copies a slice (A's rows, B's block), each in the then-branch of its guard with the
    1-D tensor copy of the same box in the else; the consumers read every scale from shared memory,
    at the same places as the tensor-staged kernel (same boxes, same offsets)."""
    src = built(_bulk(512, 512, 1280, overlap=4)).cuda_source()
    tensor = built(make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4, stage_scales=True)).cuda_source()
    lines = [line.strip() for line in src.splitlines()]
    bulk_at = [i for i, line in enumerate(lines) if line.startswith("tvm_builtin_ptx_" + _BULK)]
    assert len(bulk_at) == 2 and "scale_a_ptr[" in lines[bulk_at[0]] and "scale_b_ptr[" in lines[bulk_at[1]]
    for i in bulk_at:
        assert lines[i - 1].startswith("if (") and lines[i + 1] == "} else {" and _TMA_1D in lines[i + 2]
    assert set(_SREG_FROM.findall(src)) == {"((float*)pool_buf_ptr)"}
    assert [line for line in src.splitlines() if "Sreg_ptr[" in line] == \
        [line for line in tensor.splitlines() if "Sreg_ptr[" in line]
    assert _BULK not in tensor


@pytest.mark.parametrize("M, N, K, knobs", [
    (4096, 7168, 16384, {"overlap": 4, "dynamic_m": True}),   # issue 32's shape, any M
    (333, 384, 1152, {"overlap": 4, "dynamic_m": True}),      # K/128 = 9, N/128 = 3: both last boxes run past
    (77, 3008, 1152, dict(SMALL_M, overlap=2, dynamic_m=True)),
])
def test_every_bulk_copy_is_16_byte_aligned_and_guarded_by_its_exact_bound(M, N, K, knobs):
    """PTX's bulk copy needs its global source, shared destination and size multiples of 16 bytes
    and has no bounds: TVM's analyzer proves both addresses aligned for every value of the loop and
    shape variables, and each copy's guard is exactly ``start + floats <= the flat tensor's length``
    (so none reads past the scale tensor; the else is the clamping tensor copy)."""
    cfg = _bulk(M, N, K, **knobs)
    copies = bulk_copies(cfg)
    assert sorted(c.args[1].args[0].source.name for c, _ in copies) == ["scale_a_flat", "scale_b_flat"]
    analyzer = Analyzer()
    for call, conds in copies:
        dst, src, size = call.args[0].args[0].args[0], call.args[1].args[0], call.args[2].value
        assert size % 16 == 0 and size == 4 * (fp8.a_box(cfg) if src.source.name == "scale_a_flat" else 4)
        first = src.indices[0]
        assert analyzer.can_prove(tvm.tirx.floormod(first * 4, 16) == 0), first
        row, col = dst.indices
        assert analyzer.can_prove(tvm.tirx.floormod((row * dst.source.shape[1] + col) * 4, 16) == 0), dst
        tvm.ir.assert_structural_equal(conds[-1], first + size // 4 <= src.source.shape[0])


def test_the_bound_is_what_keeps_the_last_boxes_inside():
    """Without the guard the last boxes would run past the tensor at the odd shape (A: the last K
    block's last tile, 3 rows past M = 333 and the rounding; B: float 24 + 4 of 27), and inside it at
    M = 4096, N = 7168, K = 16384 the last ones end exactly at the end: the guard decides both."""
    def a_end(M, K, blk_m=128):
        kb, m_st = K // 128 - 1, (M - 1) // blk_m * blk_m
        return fp8.aligned_start(kb * M + m_st) + blk_m + 4, K // 128 * M

    def b_end(N, K):
        return fp8.aligned_start(N // 128 * K // 128 - 1) + 4, N // 128 * K // 128

    assert a_end(333, 1152)[0] > a_end(333, 1152)[1] and b_end(384, 1152)[0] > b_end(384, 1152)[1]
    assert a_end(4096, 16384)[0] > a_end(4096, 16384)[1]  # A's box is 4 floats longer: the last still falls back
    assert b_end(7168, 16384)[0] == b_end(7168, 16384)[1]


def test_the_sass_has_plain_bulk_copies_for_the_scales():
    """UBLKCP (the plain bulk copy) for A's and B's scales, one of each a slice as the guarded
    tensor copies (UTMALDG.1D, the fallback) beside them; none in the tensor-staged kernel; no
    global scale load and no spill."""
    def text(**knobs):
        mod = built(make_config("v9", 4096, 4096, 4096, spec=BLOCK, dynamic_m=True, overlap=4,
                                stage_scales=True, **knobs))
        try:
            return sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
        except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
            pytest.skip(f"no SASS here: {err}")

    (bulk, res), (tensor, _) = text(stage_bulk=True), text()
    assert bulk.count("UBLKCP") == bulk.count("UTMALDG.1D") == bulk.count("UTMALDG.2D") > 0
    assert "UBLKCP" not in tensor
    assert not re.search(r"\bLDG\b", bulk)
    assert res.local == 0 and res.stack == 0


@pytest.mark.parametrize("M, N, K, knobs", [
    (512, 512, 1280, {"overlap": 4}),
    (333, 384, 1152, {"overlap": 4}),
    (77, 384, 1152, dict(SMALL_M, overlap=2)),
])
def test_the_barrier_checker_passes_bulk_staged_scales(M, N, K, knobs):
    """Each stage's bytes add up with bulk copies (and, at the odd shapes, their tensor-copy
    fallbacks on the last boxes): the checker models plain bulk copies as it does tensor copies."""
    report = check_config(_bulk(M, N, K, **knobs))
    assert report.ok, report.findings
    kinds = {c.tmap for sim in report.sims for c in sim.copies}
    assert "bulk copy" in kinds
    # A's last box (the last tile's, the last K block's) always falls back: it is 4 floats longer
    # than the tile; B's last only where N/128 * K/128 is no multiple of 4 (N = 384, K = 1152: 27)
    assert "scale_a_flat_tensormap" in kinds
    assert ("scale_b_flat_tensormap" in kinds) == (N == 384)


def test_the_barrier_checker_counts_the_bulk_copies_bytes(monkeypatch):
    """A producer that forgot the scale copies' bytes in its expect_tx is caught with bulk copies too."""
    monkeypatch.setattr(fp8.StagedScales, "nbytes", property(lambda self: 0))
    report = check_config(_bulk(512, 512, 896, overlap=4))
    assert not report.ok
    assert any("bytes do not add up" in f for f in report.findings)


def test_the_split_probe_copies_a_s_box_as_512_and_16_bytes_and_its_bytes_add_up():
    """``stage_bulk_split`` (a probe: were run 3's 528-byte bulk copies slow for their size?): A's
    box in two guarded bulk copies, its first ``blk_m`` floats and the 4 after, into the same place;
    the stage's bytes unchanged (the checker passes where the last boxes fall back, too)."""
    cfg = _bulk(333, 384, 1152, overlap=4, stage_bulk_split=True)
    sizes = sorted(call.args[2].value for call, _ in bulk_copies(cfg))
    assert sizes == [16, 16, 4 * cfg.blk_m] and fp8.scale_stage_bytes(cfg) == 4 * fp8.a_box(cfg) + 16
    assert check_config(cfg).ok


@pytest.mark.parametrize("spec, knobs, words", [
    (BLOCK, {"overlap": 4, "stage_bulk": True}, "stage_bulk=True without stage_scales=True: .*add stage_scales=True"),
    (None, {"stage_bulk": True}, "stage_bulk=True with a 16-bit spec: .*drop stage_bulk"),
    (BLOCK, {"overlap": 4, "stage_scales": True, "stage_bulk": 1}, "stage_bulk=1 is an int, not a bool"),
    (BLOCK, {"overlap": 4, "stage_scales": True, "stage_bulk_split": True},
     "stage_bulk_split=True without stage_bulk=True: .*add stage_bulk=True"),
])
def test_bulk_staging_what_is_not_built_is_refused_with_the_fix(spec, knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 4096, 4096, 4096, **({"spec": spec} if spec else {}), **knobs)


def test_the_knob_is_off_by_default_and_leaves_other_modules_tags_alone():
    cfg = make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4, stage_scales=True)
    assert not fp8.stage_bulk(cfg) and "stage_bulk" not in dict(cfg.extra)
    assert fp8.stage_bulk(_bulk(4096, 4096, 4096, overlap=4))
