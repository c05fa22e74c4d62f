"""What every Hopper rung shares: the tile plan, the wgmma issue and the epilogues.

A rung file keeps only its own technique; the parts below are the same on every rung:

    registers     Dreg[acc_regs]    fp32 accumulators, the m64nNk16 fragment layout
    shared        Asmem[S, BM, 64]  128B-swizzled K-major tiles, one per pipeline stage
                  Bsmem[S, BN, 64]
                  Dsmem[BM, BN]     the output tile on its way to a TMA store

Warpgroup ``g`` of ``num_warpgroups`` owns rows ``[g*BM/W, (g+1)*BM/W)`` of the output tile
and issues one ``wgmma.m64nBNk16`` per 64 of those rows and per 16 of K.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

import layouts
from ..config import GemmConfig

WG_M = 64  # rows of one wgmma
MMA_K = 16  # K of one wgmma for 16-bit inputs
THREADS_PER_WG = 128


@dataclass(frozen=True)
class HopperPlan:
    """Python-side constants of a Hopper kernel, derived once from the config."""

    cfg: GemmConfig

    @property
    def rows_per_wg(self) -> int:
        return self.cfg.blk_m // self.cfg.num_warpgroups

    @property
    def m_atoms(self) -> int:  # wgmma rows per warpgroup
        return self.rows_per_wg // WG_M

    @property
    def n_regs(self) -> int:  # accumulator registers of one m64nN wgmma
        return self.cfg.blk_n // 2

    @property
    def acc_regs(self) -> int:
        return self.m_atoms * self.n_regs

    @property
    def threads(self) -> int:
        return THREADS_PER_WG * self.cfg.num_warpgroups

    @property
    def stage_bytes(self) -> int:
        c = self.cfg
        return (c.blk_m + c.blk_n) * c.blk_k * c.elem_bytes

    @property
    def mma_op(self) -> str:
        t = {"float16": "f16", "bfloat16": "bf16"}[self.cfg.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.cfg.blk_n}k{MMA_K}.f32.{t}.{t}"

    @property
    def desc(self) -> layouts.WgmmaDesc:
        return layouts.wgmma_desc_fields(self.cfg.dtype, (WG_M, self.cfg.blk_k), "128B")

    def ab_layouts(self, stages: int):
        c = self.cfg
        return (
            layouts.shared_layout(c.dtype, (stages, c.blk_m, c.blk_k), "128B"),
            layouts.shared_layout(c.dtype, (stages, c.blk_n, c.blk_k), "128B"),
        )

    def d_layout(self):
        c = self.cfg
        return layouts.shared_layout(c.dtype, (c.blk_m, c.blk_n), "128B")


def smem_bytes(cfg: GemmConfig, stages: int, epilogue_tile: bool = True) -> int:
    """Shared memory of a Hopper rung: barriers padded to the 1 KiB swizzle alignment, the
    operand ring and the output tile."""
    plan = HopperPlan(cfg)
    out = cfg.blk_m * cfg.blk_n * cfg.elem_bytes if epilogue_tile else 0
    return 1024 + stages * plan.stage_bytes + out


def launch_info(cfg: GemmConfig, stages: int, grid=None) -> dict:
    """Grid, threads and shared memory of a launch, for manifests and the info table."""
    return {
        "grid": list(grid or cfg.grid_mn),
        "threads": HopperPlan(cfg).threads,
        "smem_bytes": smem_bytes(cfg, stages),
    }


def check_tile(cfg: GemmConfig) -> None:
    """Rules of the Hopper tile: whole wgmma rows per warpgroup."""
    from ..config import ConfigError  # pylint: disable=import-outside-toplevel

    if cfg.num_warpgroups not in (1, 2):
        raise ConfigError(f"num_warpgroups={cfg.num_warpgroups} is not supported; use 1 or 2")
    if cfg.blk_m % (WG_M * cfg.num_warpgroups):
        raise ConfigError(
            f"blk_m={cfg.blk_m} does not split into {cfg.num_warpgroups} warpgroup(s) of whole "
            f"64-row wgmma atoms; use blk_m={WG_M * cfg.num_warpgroups} or a multiple of it"
        )


@T.inline
def mma_k_tile(plan, Dreg, Asmem, Bsmem, stage, wg_row0, first, desc_a, desc_b):
    """Issue the wgmmas of one BLK_K slice: for each 64-row atom and each k16 step.

    ``first`` is true on the first K slice of a tile: the first k16 step then writes the
    accumulators instead of adding to them (scale-d = 0), so they need no zeroing.
    """
    d = T.meta_var(plan.desc)
    for mi in T.unroll(plan.m_atoms):
        for kk in T.unroll(plan.cfg.blk_k // MMA_K):
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc_a[0]),
                Asmem.ptr_to([stage, wg_row0 + mi * WG_M, kk * MMA_K]),
                d.ldo, d.sdo, d.swizzle_code,
            )
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc_b[0]), Bsmem.ptr_to([stage, 0, kk * MMA_K]), d.ldo, d.sdo, d.swizzle_code
            )
            T.ptx[plan.mma_op](
                *[Dreg[mi * plan.n_regs + r] for r in range(plan.n_regs)],
                desc_a[0], desc_b[0], T.Not(T.And(first, kk == 0)), 1, 1, 0, 0,
            )


@T.inline
def acc_to_smem(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id):
    """Registers -> shared: each thread writes the elements its fragment holds, cast to dtype."""
    for mi in T.unroll(plan.m_atoms):
        for r in T.unroll(plan.n_regs):
            row, col = T.meta_var(layouts.acc_fragment_coord(r, warp_id, lane_id))
            Dsmem[wg_row0 + mi * WG_M + row, col] = T.cast(Dreg[mi * plan.n_regs + r], plan.cfg.dtype)


@T.inline
def tma_store_tile(D, Dsmem, m_st, n_st, plan, tid):
    """Shared -> global by one thread's TMA store; TMA clips the rows and columns past D's edge.

    The proxy fence makes the generic-proxy stores above visible to the async proxy (TMA) and
    the barrier makes every thread's stores land before the one thread issues the copy; the
    wait keeps Dsmem alive until TMA has read it.
    """
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.cta_sync()
    if tid == 0:
        # one TMA box per 64 columns (one 128-byte swizzle atom wide): the global tensor is then
        # plain (M, N) and N need not be a multiple of the tile
        for h in T.unroll(plan.cfg.blk_n // 64):
            Tx.copy_async(
                D[m_st:m_st + plan.cfg.blk_m, n_st + h * 64:n_st + h * 64 + 64],
                Dsmem[:, h * 64:h * 64 + 64], dispatch="tma_auto",
            )
        T.ptx.cp.async_.bulk.commit_group()
        T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.cta_sync()


def dtype_of(cfg: GemmConfig):
    return tvm.DataType(cfg.dtype)
