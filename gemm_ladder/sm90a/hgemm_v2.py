"""hgemm_v2 (Hopper): a K loop over one output tile.

What changed from v1: K may be any multiple of 64. The CTA walks K in 64-wide slices through
the one shared stage: copy slice k, fence, barrier, wgmma, wait, and a second barrier so no
thread overwrites the stage while a warpgroup's wgmmas may still be reading it. The first
slice's first wgmma writes the accumulators (scale-d = 0), the others add to them.

    for k in K/64:  all: A[:, k], B[:, k] -> Asmem, Bsmem    fence.proxy.async, barrier
                    wg:  wgmma x 4 per 64 rows, commit, wait_group 0
                    all: barrier                            (the stage is free again)
    all:  Dreg -> D

Barriers:   one CTA barrier (bar.sync 0), twice per slice: "slice k is in shared memory" and
            "every wgmma of slice k is done, the stage may be overwritten". Copies and MMAs
            take turns: nothing overlaps yet.

Constraints:
  - arch sm_90a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - M == blk_m (64, 128 or 256), N == blk_n (64..256, a multiple of 64): one tile, use v3
    for larger M, N; K a multiple of 64 (use v3 for any K).
  - blk_m split over num_warpgroups in whole 64-row wgmma atoms; the accumulators
    (blk_m*blk_n/128/num_warpgroups fp32 per thread) must fit the register file.

Run:  python -m gemm_ladder build v2 --shape 128x128x4096 --out build/
"""

from tvm.script import tirx as T

from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "K loop: copy a slice, barrier, wgmma, barrier"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
STAGES = 1


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    if cfg.K % cfg.blk_k:
        raise ConfigError(
            f"v2 walks K in whole slices: K={cfg.K} must be a multiple of {cfg.blk_k}; "
            f"use v3 for any K (it zero-fills the last slice)"
        )
    common.check_one_tile(cfg)
    check_budget(cfg, HopperPlan(cfg).stage_bytes)


def launch(cfg: GemmConfig) -> dict:
    return common.sync_launch_info(cfg)


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    A_layout, B_layout = plan.ab_layouts(STAGES)

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([1, 1])
        wg_id = T.warpgroup_id([cfg.num_warpgroups])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        # no barriers in shared memory: the tiles start at the (1 KiB aligned) base, as the
        # 128B swizzle needs
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()

        wg_row0 = T.meta_var(wg_id * plan.rows_per_wg)
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        for k in range(cfg.k_tiles):
            common.load_tile_sync(Asmem, 0, A, 0, k * BLK_K, BLK_M)
            common.load_tile_sync(Bsmem, 0, B, 0, k * BLK_K, BLK_N)
            # generic-proxy stores -> async-proxy (wgmma) reads: fence our own stores, then the
            # barrier makes every thread's fenced stores visible before any warpgroup issues
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            T.ptx.wgmma.fence.sync.aligned()
            common.mma_k_tile(plan, Dreg, Asmem, Bsmem, 0, wg_row0, k == 0, desc_a, desc_b)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)
            # every warpgroup must be done reading the stage before anyone overwrites it
            T.cuda.cta_sync()
        common.acc_to_global(plan, Dreg, D, 0, 0, wg_row0, warp_id, lane_id, False, False)
    # fmt: on

    return hgemm
