"""The bias stash (``epilogue.BiasStash``, issue 31) on the CPU: which kernels load a tile's bias into
registers before its K loop, that each accumulator finds its own column's value there (both fragment
layouts), and in the built kernels that the loads come before the first wgmma and the epilogue reads no
bias from global memory, with ``bias_stash=False`` as the kernels were before."""

from __future__ import annotations

import re

import pytest

import layouts
from gemm_ladder.compile import sass
from gemm_ladder.core.spec import GemmSpec, spec_for, spec_of
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config, rung_module
from gemm_ladder.sm90a import epilogue, gemm
from gemm_ladder.sm90a.common import WG_M, HopperPlan, SwapPlan

from .built import built, built_sass

GELU = spec_for("bfloat16", "bias_gelu_tanh")
TILE64 = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "epi_n": 64, "pipe_depth": 8,
          "stream_b": True}


def _regs(rung, M, N, K, **knobs):
    cfg = make_config(rung, M, N, K, dtype="bfloat16", **knobs)
    return gemm.bias_stash_regs(cfg, rung_module(rung).PRESET)


@pytest.mark.parametrize("blk_n", [32, 48, 64, 128, 192])
def test_each_accumulator_finds_its_columns_bias(blk_n):
    """Slot ``slot_of_acc(reg)`` holds the bias of the column ``acc_fragment_coord`` gives accumulator reg of
    every lane, a quarter of the tile's columns a thread, every slot used."""
    cfg = make_config("v9", 128, 4096, 4096, dtype="bfloat16", spec=GELU, blk_m=128, blk_n=blk_n, epi_n=16,
                      num_warpgroups=2, cluster_m=1)
    plan = HopperPlan(cfg)
    count = epilogue.bias_stash_regs(cfg, plan, False, False)
    assert count == blk_n // 4
    for lane in range(32):
        stash = epilogue.BiasStash(regs=None, count=count, transposed=False, warp_id=0, lane_id=lane)
        slots = {stash.slot_of_acc(reg) for reg in range(plan.n_regs)}
        assert slots == set(range(count))
        for reg in range(plan.n_regs):
            for warp in range(4):  # the column does not depend on the warp
                assert stash.column(stash.slot_of_acc(reg), 1000) == \
                    1000 + layouts.acc_fragment_coord(reg, warp, lane)[1]


@pytest.mark.parametrize("blk_n, consumers", [(64, 1), (128, 1), (128, 2), (256, 2)])
def test_under_swap_ab_each_fragment_row_finds_its_columns_bias(blk_n, consumers):
    """Swap AB: the D^T fragment's rows are D's columns; slot ``slot_of_row(atom, reg)`` holds the bias of
    row ``64 atom + acc_fragment_coord(reg)[0]`` of the consumer's rows, two a thread an atom."""
    cfg = make_config("v11", 16, 4096, 4096, dtype="bfloat16", spec=GELU, blk_m=16, blk_n=blk_n,
                      num_warpgroups=consumers, split_k=1)
    plan = SwapPlan(cfg)
    count = epilogue.bias_stash_regs(cfg, plan, True, False)
    assert count == 2 * plan.m_atoms == 2 * blk_n // consumers // WG_M
    for warp in range(4):
        for lane in range(32):
            stash = epilogue.BiasStash(regs=None, count=count, transposed=True, warp_id=warp, lane_id=lane)
            seen = set()
            for atom in range(plan.m_atoms):
                for reg in range(plan.n_regs):
                    slot = stash.slot_of_row(atom, reg)
                    seen.add(slot)
                    assert stash.column(slot, 500) == \
                        500 + atom * WG_M + layouts.acc_fragment_coord(reg, warp, lane)[0]
            assert seen == set(range(count))


def test_which_kernels_stash_their_bias():
    """16-bit kernels with a bias whose epilogue follows the tile's K loop, up to 48 registers; not under
    epi_under (its pairs are made right after the K loop, their loads issued together), not without a
    bias, not gated, not fp8, not with bias_stash=False."""
    assert _regs("v9", 128, 4096, 4096, spec=GELU, **TILE64) == 16
    assert _regs("v9", 512, 6144, 4096, spec=GELU, blk_m=128, blk_n=192, pipe_depth=4) == 48
    assert _regs("v9", 2048, 4096, 4096, spec=GELU, epi_under=False) == 0  # 256 wide: 64 registers, past the cap
    assert _regs("v9", 2048, 4096, 4096, spec=GELU, epi_under=False, blk_n=192) == 48
    assert _regs("v9", 2048, 4096, 4096, spec=GELU, epi_under=True, blk_n=192) == 0
    assert _regs("v9", 128, 4096, 4096, **TILE64) == 0
    assert _regs("v9", 128, 4096, 4096, spec=GELU, bias_stash=False, **TILE64) == 0
    assert _regs("v9", 128, 2 * 4096, 4096, spec=spec_for("bfloat16", "swiglu")) == 0
    assert _regs("v10", 512, 28672, 4096, spec=GELU, split_k=1, stream_k=True) == 0
    assert _regs("v10", 512, 28672, 4096, spec=GELU, blk_n=128) == 32
    assert _regs("v11", 64, 4096, 4096, spec=GELU, blk_m=64, blk_n=64, num_warpgroups=1, split_k=2) == 2
    fp8 = make_config("v9", 256, 4096, 4096, spec=GemmSpec.fp8(bias="bfloat16"))
    assert spec_of(fp8).bias and gemm.bias_stash_regs(fp8, gemm.V9) == 0


def _epilogue_lines(src: str) -> list[str]:
    return [line for line in src.splitlines() if "cvt" in line and "Dreg" in line]


@pytest.mark.parametrize("rung, knobs", [("v9", TILE64),
                                         ("v11", {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "split_k": 2,
                                                  "pipe_depth": 8, "stream_b": True})])
def test_the_kernel_loads_the_stash_before_its_k_loop(rung, knobs):
    """In the CUDA source the stash is filled before the first wgmma and the rounding reads it, not the bias;
    with bias_stash=False the rounding reads the bias as before. In the SASS the bias's 16-bit loads (LDG.U16;
    split K's partials are 32-bit) come before the first HGMMA, and nothing spills."""
    M = 128 if rung == "v9" else 64
    cfg = make_config(rung, M, 4096, 4096, dtype="bfloat16", spec=GELU, pdl=True, dynamic_m=True, **knobs)
    src = built(cfg).cuda_source()
    body = src[src.index("__global__"):]
    first_mma = re.search(r"\n\s*tvm_builtin_ptx_wgmma_\w*mma_async\w*\(", body).start()
    assert body.index("Breg_ptr[0] = ((float)bias_ptr[") < first_mma, "the stash is filled before the first wgmma"
    pre_acts = [line for line in src.splitlines() if "pre_act" in line and "Dreg_ptr" in line]
    assert pre_acts and all("Breg_ptr[" in line and "bias_ptr" not in line for line in pre_acts)
    read = make_config(rung, M, 4096, 4096, dtype="bfloat16", spec=GELU, pdl=True, dynamic_m=True,
                       bias_stash=False, **knobs)
    read_src = built(read).cuda_source()
    assert "Breg" not in read_src
    assert any("bias_ptr" in line for line in read_src.splitlines() if "pre_act" in line and "Dreg_ptr" in line)
    text, res = built_sass(cfg)
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)", text)]
    first_mma = next(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
    loads = [i for i, op in enumerate(ops) if op.startswith("LDG") and ".U16" in op]  # 16-bit: the bias's
    assert loads and max(loads) < first_mma, "every bias load is issued before the first wgmma"
    counts = sass.instruction_counts(text)
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.local == 0, (counts, res)


def test_the_barrier_checker_passes_the_stashed_kernels():
    """The stash adds register loads before the K loop and nothing to the barriers."""
    assert check_config(make_config("v9", 128, 4096, 4096, dtype="bfloat16", spec=GELU, **TILE64)).ok
    assert check_config(make_config("v11", 64, 4096, 4096, dtype="bfloat16", spec=GELU, blk_m=64, blk_n=64,
                                    num_warpgroups=1, split_k=2)).ok
