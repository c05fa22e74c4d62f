"""hgemm_v5 (Blackwell): a pipe_depth-stage ring of shared tiles, a TMA warp and an MMA warp.

What changed from v4: shared memory holds ``pipe_depth`` K slices instead of one, and the
two jobs of v4's single thread are split over two warps so that neither waits for the other
more than the ring forces it to. An elected lane of warp 0 keeps TMA ``pipe_depth`` slices
ahead; an elected lane of warp 1 issues the MMAs of each slice as soon as it lands and
commits them to the slice's ``mma2tma`` barrier, which frees the slot for TMA again when
the tensor core has read it. A :class:`PipelineState` per role tracks (stage, phase): the
phase flips each time the ring wraps.

    warp 0 (TMA):  for k: wait mma2tma[s] (phase^1); TMA A,B -> stage s;
                          arrive.expect_tx(tma2mma[s]); advance
    warp 1 (MMA):  for k: wait tma2mma[s]; tcgen05.mma x 4 -> tmem;
                          tcgen05.commit -> mma2tma[s]; advance
                   tcgen05.commit -> mma2epi
    all:           wait mma2epi; tmem -> Dreg -> Dsmem; thread 0: TMA store

Barriers:   tma2mma[S]  full:  arrived by the TMA lane (expect_tx = stage bytes), completed
                        by TMA's byte count; waited by the MMA lane.
            mma2tma[S]  empty: arrived by tcgen05.commit when the slot's MMAs are done;
                        waited by the TMA lane with the phase inverted, so the first lap
                        passes at once (a fresh barrier counts as "previous phase done").
            mma2epi[1]  arrived by tcgen05.commit after the last slice; all wait phase 0.

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M (TMA zero-fills and clips).
  - blk_m 128; blk_n 64..256, a multiple of 64; 2 <= pipe_depth <= ``budget.max_pipe_depth``
    (the ring, the output tile and the barriers in the shared memory a block may use: 227 KiB on
    B200, pipe_depth <= 6 at blk_n=128, 4 at blk_n=192...).
  - all 512 TMEM columns (see common.py).

Run:  python -m gemm_ladder build v5 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang.pipeline import PipelineState

from ..sync.classes import TCGen05Bar, TMABar
from ..core.budget import check_budget
from ..core.config import GemmConfig
from . import common
from .common import EPI_COLS, MMA_M, TMEM_COLS, BlackwellPlan

TECHNIQUE = "pipe_depth-stage smem ring: a TMA warp and an MMA warp with full/empty barriers"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "pipe_depth": 4}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    check_budget(cfg, common.smem_bytes(cfg, cfg.pipe_depth))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, cfg.pipe_depth)


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    STAGES = cfg.pipe_depth
    GRID_M, GRID_N = cfg.grid_mn
    A_layout, B_layout = plan.ab_layouts(STAGES)
    D_layout = plan.d_layout()

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([GRID_M, GRID_N])
        wg_id = T.warpgroup_id([1])  # noqa: F841  (TMEMPool's warp guard needs the full id chain)
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, STAGES)
        mma2tma = TCGen05Bar(pool, STAGES)
        mma2epi = TCGen05Bar(pool, 1)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=1)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(1)
        mma2epi.init(1)
        common.alloc_tmem_and_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, BLK_N), "float32")

        tid = T.meta_var(warp_id * 32 + lane_id)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        if warp_id == 0:
            if T.cuda.elect_sync():
                tma_ps = PipelineState(STAGES, phase=0)
                for k in range(cfg.k_tiles):
                    # the slot is free once the MMAs that read it last lap have completed
                    mma2tma.wait(tma_ps.stage, tma_ps.phase ^ 1)
                    Tx.copy_async(Asmem[tma_ps.stage, :, :],
                                  A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                                  dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                    Tx.copy_async(Bsmem[tma_ps.stage, :, :],
                                  B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                                  dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                    tma2mma.arrive(tma_ps.stage, tx_count=plan.stage_bytes)
                    tma_ps.advance()
        elif warp_id == 1:
            if T.cuda.elect_sync():
                mma_ps = PipelineState(STAGES, phase=0)
                for k in range(cfg.k_tiles):
                    tma2mma.wait(mma_ps.stage, mma_ps.phase)
                    T.ptx["tcgen05.fence::after_thread_sync"]()
                    Tx.gemm_async(tmem[:, 0:BLK_N], Asmem[mma_ps.stage, :, :], Bsmem[mma_ps.stage, :, :],
                                  accum=(k != 0), dispatch="tcgen05", cta_group=1)
                    mma2tma.arrive(mma_ps.stage)  # tcgen05.commit: frees the slot when done
                    mma_ps.advance()
                mma2epi.arrive(0)
        mma2epi.wait(0, 0)
        T.ptx["tcgen05.fence::after_thread_sync"]()
        Dreg = T.alloc_local((EPI_COLS,), "float32")
        common.tmem_to_smem(plan, tmem, Dreg, Dsmem, tid)
        common.tma_store_tile(plan, D, Dsmem, m_st, n_st, tid, 0)
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
