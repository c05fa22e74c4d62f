"""hgemm_v3 (Blackwell): spatial tiling: one CTA per 128 x blk_n output tile.

What changed from v2: the grid covers D with ceil(M/128) x ceil(N/blk_n) CTAs, and CTA
(bx, by) computes the tile at rows 128*bx, columns blk_n*by. Shapes need not be multiples of
the tile: the copies zero-fill rows of A and B past the matrix edge and K past its end (the
zeros add nothing to the sum), and the stores drop rows and columns past D's edge.

    for each K slice:
      all:      A[m_st:, k:], B[n_st:, k:] -> Asmem, Bsmem (guarded, zero-filled)
                fence.proxy.async; CTA barrier
      thread 0: tcgen05.mma x 4 -> tmem, tcgen05.commit -> mma2ld
      all:      wait mma2ld (phase ^= 1)
    all:        tcgen05.ld tmem -> Dreg -> D (guarded)

Barriers:   mma2ld[1]  as in v2: arrived by tcgen05.commit, waited by all, one phase per slice.

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - any M; N and K multiples of 8 (16-byte rows: the copies move 16-byte vectors).
  - blk_m 128; blk_n 64..256, a multiple of 64; all 512 TMEM columns (see common.py).

Run:  python -m gemm_ladder build v3 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..sync.classes import TCGen05Bar
from ..core.budget import check_budget
from ..core.config import GemmConfig
from . import common
from .common import EPI_COLS, MMA_M, TMEM_COLS, BlackwellPlan

TECHNIQUE = "spatial tiling across CTAs, guarded copies and stores"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    check_budget(cfg, common.smem_bytes(cfg, 1, epilogue_tile=False))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, 1, epilogue_tile=False)


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    GRID_M, GRID_N = cfg.grid_mn
    A_layout, B_layout = plan.ab_layouts()

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([GRID_M, GRID_N])
        wg_id = T.warpgroup_id([1])  # noqa: F841  (TMEMPool's warp guard needs the full id chain)
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        mma2ld = TCGen05Bar(pool, 1)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=1)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        mma2ld.init(1)
        common.alloc_tmem_and_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, BLK_N), "float32")
        tid = T.meta_var(warp_id * 32 + lane_id)
        zeros = T.alloc_local((8,), dtype)
        for j in T.unroll(8):
            zeros[j] = T.cast(0, dtype)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)

        phase: T.int32 = 0
        for k in range(cfg.k_tiles):
            common.load_tile_sync(Asmem, A, m_st, k * BLK_K, BLK_M, tid, zeros)
            common.load_tile_sync(Bsmem, B, n_st, k * BLK_K, BLK_N, tid, zeros)
            # generic-proxy stores -> async-proxy (tensor core) reads
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            if warp_id == 0:
                # one lane issues: the MMA is a CTA-wide operation, not a per-thread one
                if T.cuda.elect_sync():
                    T.ptx["tcgen05.fence::after_thread_sync"]()
                    Tx.gemm_async(tmem[:, 0:BLK_N], Asmem[:, :], Bsmem[:, :],
                                  accum=(k != 0), dispatch="tcgen05", cta_group=1)
                    mma2ld.arrive(0)  # tcgen05.commit: arrives when the MMAs above are done
            # nobody may overwrite Asmem/Bsmem until the tensor core has read them
            mma2ld.wait(0, phase)
            phase = phase ^ 1
        T.ptx["tcgen05.fence::after_thread_sync"]()
        Dreg = T.alloc_local((EPI_COLS,), "float32")
        Dhalf = T.alloc_local((EPI_COLS,), dtype)
        common.tmem_to_global(plan, tmem, Dreg, Dhalf, D, m_st, n_st, tid, True)
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
