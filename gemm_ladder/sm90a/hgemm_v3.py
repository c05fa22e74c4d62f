"""hgemm_v3 (Hopper): the output tiled across CTAs, any M and N, K a multiple of 8.

What changed from v2: a grid of ceil(M/blk_m) x ceil(N/blk_n) CTAs, CTA (bx, by) computing
the tile D[bx*blk_m:, by*blk_n:]. The matrices no longer have to be whole tiles, so every
access past an edge is guarded:

  - loads: a 16-byte chunk of A or B that lies past the last row (M or N) or past K is
    stored into shared memory as zeros instead of being loaded (K is a multiple of 8, so a
    chunk is never half inside). Zeros add nothing to the dot products, which is how the
    last, partial K slice (K not a multiple of 64) is handled;
  - stores: a thread skips the column pairs of its fragment that lie past row M or column N.

Guards are only emitted where the shape needs them (e.g. none on a 4096^3 problem).

    CTA (bx, by), for k in ceil(K/64):
        all: A[bx rows, k], B[by rows, k] -> Asmem, Bsmem (zero past the edges)
             fence.proxy.async, barrier
        wg:  wgmma x 4 per 64 rows, commit, wait_group 0
        all: barrier
    all:  Dreg -> D (pairs past the edges skipped)

Barriers:   as in v2: one CTA barrier, twice per K slice.

Constraints:
  - arch sm_90a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - any M; N and K multiples of 8 (16-byte rows, so each 16-byte chunk is wholly inside or
    outside and the 4-byte output stores stay aligned).
  - A, B and D (padded to whole tiles) below 2^31 elements each: the threads compute 32-bit
    element offsets (v4's TMA does not need this).
  - blk_m in {64, 128, 256} split over num_warpgroups in whole 64-row wgmma atoms; blk_n a
    multiple of 64 up to 256; the accumulators must fit the register file.

Run:  python -m gemm_ladder build v3 --shape 4096x4096x4096 --out build/
"""

from tvm.script import tirx as T

from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "grid of output tiles, zero-filled edge loads, guarded stores"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
STAGES = 1


INDEX_LIMIT = 2**31  # the threads address A, B and D with 32-bit element offsets


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    grid_m, grid_n = cfg.grid_mn
    # offsets are computed for whole tiles, also past the edge (where the guard then skips them)
    m_pad, n_pad, k_pad = grid_m * cfg.blk_m, grid_n * cfg.blk_n, cfg.k_tiles * cfg.blk_k
    for name, elems in (("A", m_pad * k_pad), ("B", n_pad * k_pad), ("D", m_pad * n_pad)):
        if elems >= INDEX_LIMIT:
            raise ConfigError(
                f"v3 addresses {name} with 32-bit element offsets, and {cfg.M}x{cfg.N}x{cfg.K} "
                f"(padded to whole tiles) needs {elems}, over 2^31; use v4 (TMA addresses the "
                f"matrices itself) or split the problem"
            )
    check_budget(cfg, HopperPlan(cfg).stage_bytes)


def launch(cfg: GemmConfig) -> dict:
    return common.sync_launch_info(cfg)


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    GRID_M, GRID_N = cfg.grid_mn
    A_layout, B_layout = plan.ab_layouts(STAGES)
    # guard only the edges this shape has
    GUARD_M, GUARD_N, GUARD_K = M % BLK_M != 0, N % BLK_N != 0, K % BLK_K != 0

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([GRID_M, GRID_N])
        wg_id = T.warpgroup_id([cfg.num_warpgroups])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        # no barriers in shared memory: the tiles start at the (1 KiB aligned) base, as the
        # 128B swizzle needs
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()

        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        wg_row0 = T.meta_var(wg_id * plan.rows_per_wg)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        for k in range(cfg.k_tiles):
            common.load_tile_guarded(plan, Asmem, 0, A, m_st, k * BLK_K, BLK_M, tid, GUARD_M, GUARD_K)
            common.load_tile_guarded(plan, Bsmem, 0, B, n_st, k * BLK_K, BLK_N, tid, GUARD_N, GUARD_K)
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
        common.acc_to_global(plan, Dreg, D, m_st, n_st, wg_row0, warp_id, lane_id, GUARD_M, GUARD_N)
    # fmt: on

    return hgemm
