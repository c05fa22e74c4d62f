"""fp8 block scales staged in shared memory (issue 32, knob ``stage_scales``): the producer's TMA
copies each K block's A and B scales with the ring stage's A and B tiles, on the stage's full
barrier, and the consumers read them from shared memory after the wait they already do. CPU only:
the CUDA source and SASS (the scale TMA in the producer, shared-memory reads and no global scale
loads on the consumers' path), the barrier checker (the copies counted in the stage's bytes), the
knob's refusals, the launch's shared memory and the front door's alignment copy."""

from __future__ import annotations

import re

import pytest
import torch

from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan as serve_plan
from gemm_ladder.serve.scaled import aligned_scales
from gemm_ladder.sm90a import fp8
from gemm_ladder.sm90a.gemm import launch
from gemm_ladder.sm90a.hgemm_v9 import PRESET

from .built import built

BLOCK = GemmSpec.fp8("bfloat16", "block")
SMALL_M = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2, "stream_b": True,
           "pipe_depth": 8}  # the block policy's small-M knobs (plan.FP8_BLOCK_SMALL_KNOBS, with overlap=2)
HALVES = {"blk_n": 256, "halves": True, "epi_under": True, "pipe_depth": 3}  # plan.FP8_BLOCK_HALVES_KNOBS's tile
CONSUMER_REGS = 232  # setmaxnreg's budget of a consumer warpgroup at two consumers (common.role_registers)

_SREG_FROM = re.compile(r"Sreg_ptr\[\d+\] = (.*?)\[")
_TMA_1D = "cp_async_bulk_tensor_g2s_cluster_async_bulk_tensor_1d"


def _source(cfg) -> str:
    return built(cfg).cuda_source()


def test_the_producer_copies_the_scales_and_the_consumers_read_them_from_shared_memory():
    """Staged: per loaded slice two one-dimensional TMA copies (A's rows, B's block) beside A's and
    B's tiles, and every scale register is set from the shared pool, none from the scale tensors;
    without the knob the consumers load them from global memory and no 1-D copy exists."""
    staged = _source(make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4, stage_scales=True))
    plain = _source(make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4))
    calls = re.findall(_TMA_1D + r"\w*\(tvm_builtin_cuda_cvta_generic_to_shared", staged)
    assert len(calls) == 2 and _TMA_1D not in plain
    staged_from = set(_SREG_FROM.findall(staged))
    assert staged_from == {"((float*)pool_buf_ptr)"}, staged_from
    assert set(_SREG_FROM.findall(plain)) == {"scale_a_ptr", "scale_b_ptr"}


def test_a_slot_s_scales_are_read_after_its_full_barrier_wait():
    """Each scale read names the ring slot of the last full-barrier wait before it (the slot whose
    scales landed), never a slot not yet waited for."""
    src = _source(make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4, stage_scales=True))
    consumer = src[src.index("Freg_ptr"):]
    last_wait, reads = None, 0
    for line in consumer.splitlines():
        if m := re.search(r"mbarrier_wait\(\(&\(\(\(uint64_t\*\)pool_buf_ptr\)\[\((\(?it_ptr\[0\][^&]*)& 3\)\]", line):
            last_wait = m.group(1).strip().strip("(").strip()
        elif (m := re.search(r"Sreg_ptr\[\d+\] = \(\(float\*\)pool_buf_ptr\)\[\(*(\(*it_ptr\[0\][^&]*)& 3\)", line)):
            assert last_wait is not None and m.group(1).strip().strip("(").strip() == last_wait, (line, last_wait)
            reads += 1
    assert reads == 3 * (4 + 2)  # three scales a slice: a run of four (the loop body), the tail of two


@pytest.mark.parametrize("knobs", [{"overlap": 4}, dict(SMALL_M, overlap=2), HALVES])
def test_no_global_scale_load_is_left_in_the_sass(knobs):
    """The SASS of the policy's three configs, staged: the only global loads are TMA copies (1-D ones
    for the scales: A's box and one a B block, beside the two tiles of a slice), the scales come by
    LDS (each slice's, or with overlap each run's, unrolled), and nothing spills."""
    cfg = make_config("v9", 4096, 4096, 4096, spec=BLOCK, dynamic_m=True, stage_scales=True, **knobs)
    mod = built(cfg)
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert not re.search(r"\bLDG\b", text)
    boxes = 1 + max(1, cfg.blk_n // fp8.BLOCK)  # a slice's scale copies: A's box, one a B block
    assert 2 * text.count("UTMALDG.1D") == boxes * text.count("UTMALDG.2D") > 0
    assert len(re.findall(r"\bLDS\b", text)) >= (1 + boxes) * knobs.get("overlap", 1)  # two rows, the B blocks
    assert res.local == 0 and res.stack == 0 and not re.search(r"\b(?:STL|LDL)\b", text)
    assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < CONSUMER_REGS


@pytest.mark.parametrize("K, knobs", [(1280, {"overlap": 4}), (1152, {"overlap": 2}), (384, {"overlap": 8}),
                                      (1008, {"overlap": 4}), (1280, dict(SMALL_M, overlap=2)),
                                      (1280, HALVES), (1008, HALVES), (128, HALVES),
                                      (1280, {**HALVES, "epi_under": False})])
def test_the_barrier_checker_passes_staged_scales(K, knobs):
    """Runs with a tail, an odd tail, a tile shorter than a run, a cut last K block, the small-M
    knobs (one consumer, a 1x2 cluster), the halves (two B blocks a stage; with the epilogue under
    the next tile, a one-slice tile too): the scale copies' bytes are what each stage expects."""
    assert check_config(make_config("v9", 512, 512, K, spec=BLOCK, stage_scales=True, **knobs)).ok


def test_the_barrier_checker_sees_the_scale_copies_in_the_stage_bytes(monkeypatch):
    """A producer that forgot the scale copies' bytes in its expect_tx is caught (the copies are
    counted as delivered: the stage's bytes do not add up)."""
    monkeypatch.setattr(fp8.StagedScales, "nbytes", property(lambda self: 0))
    report = check_config(make_config("v9", 512, 512, 896, spec=BLOCK, overlap=4, stage_scales=True))
    assert not report.ok
    assert any("bytes do not add up" in f for f in report.findings)


def test_the_scales_take_a_row_a_stage_beside_the_ring():
    cfg = make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4, stage_scales=True)
    plain = make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4)
    # A's box: 128 rows from the first rounded down to 16 bytes, 4 floats more; B's box on the next 128 bytes
    assert fp8.scale_row(cfg) == 128 + 32 + 32
    assert fp8.scale_stage_bytes(cfg) == 4 * (128 + 4) + 16
    assert launch(cfg, PRESET)["smem_bytes"] - launch(plain, PRESET)["smem_bytes"] == 4 * 4 * 192
    assert fp8.scale_smem_bytes(plain) == 0


@pytest.mark.parametrize("spec, knobs, words", [
    (GemmSpec.fp8("bfloat16", "tensor"), {"overlap": 4}, "stage_scales=True with tensor scales: .*use stage_scales=False"),
    (BLOCK, {"overlap": 0}, "stage_scales=True with overlap=0 and halves=False: .*use overlap=4"),
    (BLOCK, {"overlap": 4, "pipe_depth": 6}, "pipe_depth=6: .* 235008 bytes .* over the 232448 .* smaller pipe_depth"),
    (BLOCK, {**HALVES, "pipe_depth": 4}, "pipe_depth=4: .* 233984 bytes .* over the 232448 .* smaller pipe_depth"),
])
def test_staging_what_is_not_built_is_refused_with_the_fix(spec, knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 4096, 4096, 4096, spec=spec, stage_scales=True, **knobs)


def test_the_block_policy_stages_the_halves_scales_in_a_three_stage_ring():
    """The policy's 128x256 block tile is the one these tests build, staged (four stages do not fit)."""
    assert serve_plan.FP8_BLOCK_HALVES_KNOBS == {"promote": 1, **HALVES, "stage_scales": True}
    assert make_config("v9", 4096, 4096, 4096, spec=BLOCK, stage_scales=True, **HALVES).pipe_depth == 3


def test_the_knob_is_fp8_only_and_off_by_default():
    with pytest.raises(ConfigError, match="stage_scales: fp8 specs only"):
        make_config("v9", 4096, 4096, 4096, stage_scales=True)
    assert make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4).knobs()["stage_scales"] is False


def test_the_front_door_copies_scales_that_do_not_start_16_byte_aligned():
    """A view one float into a larger tensor is copied (TMA's tensor maps need an aligned start),
    with an explain line; an aligned tensor passes as it is, with none."""
    base = torch.arange(64, dtype=torch.float32)
    (a, b), lines = aligned_scales(base[:32], base[4:36])
    assert a.data_ptr() == base.data_ptr() and b.data_ptr() == base.data_ptr() + 16 and lines == []
    (a, b), lines = aligned_scales(base[1:33], base[:32])
    assert a.data_ptr() % 16 == 0 and a.data_ptr() != base.data_ptr() + 4 and torch.equal(a, base[1:33])
    assert len(lines) == 1 and lines[0].startswith("copied: scale_a starts 4 bytes past a 16-byte boundary")
