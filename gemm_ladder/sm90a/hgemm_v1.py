"""hgemm_v1 (Hopper): one output tile, one K slice, one wgmma pass.

The first rung: the smallest kernel that puts Hopper's tensor cores to work. One CTA computes
the whole D = A.B^T, so the shape is exactly one tile: M = blk_m, N = blk_n, K = 64.

    all:  A -> Asmem, B -> Bsmem      16-byte loads and stores, 128B-swizzled destination
    all:  fence.proxy.async, CTA barrier
    wg:   wgmma x (K/16) per 64 rows, commit, wait_group 0
    all:  Dreg -> D                    each thread stores the pairs its fragment holds

Why the fence: the threads write the tiles through the generic proxy (``st.shared``), but
wgmma reads shared memory through the async proxy. Without ``fence.proxy.async`` the tensor
cores may see stale bytes even after the barrier. Each thread fences its own stores, then the
barrier tells everyone that every thread has fenced.

Why the swizzle: wgmma reads 8-row x 16-byte core matrices; with 128-byte rows stored plainly
all 8 rows of a core matrix sit in the same 4 banks. The 128B swizzle (chunk c of row r goes
to chunk c ^ r%8) spreads them, and the wgmma descriptor says so (swizzle code 3).

Constraints:
  - arch sm_90a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - M == blk_m (64, 128 or 256; use v3 for larger M), N == blk_n (64..256, a multiple of
    64; use v3 for larger N), K == 64 (use v2 for K a multiple of 64, v3 for any K).
  - blk_m split over num_warpgroups in whole 64-row wgmma atoms; the accumulators
    (blk_m*blk_n/128/num_warpgroups fp32 per thread) must fit the register file.

Run:  python -m gemm_ladder build v1 --shape 128x128x64 --out build/
"""

from tvm.script import tirx as T

from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "one tile: thread copies to swizzled smem, wgmma, registers to global"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
STAGES = 1


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    if cfg.K != cfg.blk_k:
        raise ConfigError(
            f"v1 multiplies one K slice: K={cfg.K} must be {cfg.blk_k}; "
            f"use v2 for K a multiple of {cfg.blk_k} (v3 for any K)"
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

        common.load_tile_sync(Asmem, 0, A, 0, 0, BLK_M)
        common.load_tile_sync(Bsmem, 0, B, 0, 0, BLK_N)
        # generic-proxy stores -> async-proxy (wgmma) reads: fence our own stores, then the
        # barrier makes every thread's fenced stores visible before any warpgroup issues
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        T.ptx.wgmma.fence.sync.aligned()
        common.mma_k_tile(plan, Dreg, Asmem, Bsmem, 0, wg_row0, True, desc_a, desc_b)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(0)
        common.acc_to_global(plan, Dreg, D, 0, 0, wg_row0, warp_id, lane_id, False, False)
    # fmt: on

    return hgemm
