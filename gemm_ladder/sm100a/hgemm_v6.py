"""hgemm_v6 (Blackwell): persistent CTAs, a tile scheduler and a double-buffered accumulator.

What changed from v5: the grid is one CTA per SM (``num_ctas``, read off the GPU at launch
and passed as the kernel's last argument), and each CTA walks the output tiles a scheduler
hands it (``schedulers.make_tirx_scheduler``: ``tile_order`` and ``l2_group_size`` pick the
order, so CTAs that run together share A and B panels in L2). The TMA warp and the MMA warp
run ahead across tile boundaries; TMEM holds two accumulators (2 x blk_n <= 512 columns),
so the MMAs of tile i+1 run while a separate epilogue warpgroup drains tile i. The
epilogue warpgroup syncs on its own named barrier, since the other warps never reach it.

    warpgroup 1, warp 0 (TMA):  per tile, per k: wait mma2tma[s] (phase^1); TMA -> s;
                                arrive.expect_tx(tma2mma[s])
    warpgroup 1, warp 1 (MMA):  per tile: wait epi2mma[a] (phase^1)      # acc a drained
                                  per k: wait tma2mma[s]; tcgen05.mma -> tmem[a];
                                         tcgen05.commit -> mma2tma[s]
                                  tcgen05.commit -> mma2epi[a]
    warpgroup 0 (epilogue):     per tile: wait mma2epi[a]; tmem[a] -> Dreg -> Dsmem;
                                  arrive epi2mma[a] (128 threads); thread 0: TMA store

Barriers:   tma2mma[S]  full:  expect_tx by the TMA lane, completed by TMA's byte count.
            mma2tma[S]  empty: tcgen05.commit after the slot's MMAs; TMA waits phase^1.
            mma2epi[2]  acc full:  tcgen05.commit after a tile's last MMA; epilogue waits.
            epi2mma[2]  acc empty: all 128 epilogue threads arrive (count 128) after their
                        tcgen05.ld of that accumulator completed; MMA waits phase^1.
            named barrier 1: the epilogue warpgroup around the TMA store of Dsmem.

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M (TMA zero-fills and clips).
  - blk_m 128; blk_n 64..256, a multiple of 64; 2 <= pipe_depth within shared memory
    (as v5); tile_order in ``config.TILE_ORDERS`` (grouped, snake, row, column) with an
    l2_group_size that covers the tile grid (``launch.check_schedule``).
  - launched with ``num_ctas`` = the SM count (runtime.GemmModule does this; the manifest
    says ``launch.persistent``).

Run:  python -m gemm_ladder build v6 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang.pipeline import PipelineState

from schedulers import make_tirx_scheduler

from ..sync.classes import MBarrier, TCGen05Bar, TMABar
from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import EPI_COLS, MMA_M, THREADS_PER_WG, TMEM_COLS, BlackwellPlan

TECHNIQUE = "persistent CTAs with a tile scheduler, double-buffered TMEM, epilogue warpgroup"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER}
ACC_STAGES = 2  # accumulators in TMEM: the MMAs of one tile overlap the epilogue of the last
EPI_BAR = 1  # named barrier of the epilogue warpgroup (0 is __syncthreads)


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    if ACC_STAGES * cfg.blk_n > TMEM_COLS:
        raise ConfigError(f"blk_n={cfg.blk_n}: {ACC_STAGES} accumulators need "
                          f"{ACC_STAGES * cfg.blk_n} TMEM columns, over {TMEM_COLS}; use blk_n<=256")
    common.check_schedule(cfg)
    check_budget(cfg, common.smem_bytes(cfg, cfg.pipe_depth))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, cfg.pipe_depth, threads=2 * THREADS_PER_WG, persistent=True)


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
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype),
              num_ctas: T.int32):
        T.device_entry()
        bx = T.cta_id([num_ctas])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, STAGES)
        mma2tma = TCGen05Bar(pool, STAGES)
        mma2epi = TCGen05Bar(pool, ACC_STAGES)
        epi2mma = MBarrier(pool, ACC_STAGES)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=1)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(1)
        mma2epi.init(1)
        epi2mma.init(THREADS_PER_WG)
        common.alloc_tmem_and_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, ACC_STAGES * BLK_N), "float32")

        tid = T.meta_var(warp_id * 32 + lane_id)  # thread index inside its warpgroup
        ts = make_tirx_scheduler(cfg.tile_order, "ts", num_m_tiles=GRID_M, num_n_tiles=GRID_N,
                                 num_clusters=num_ctas, l2_group_size=cfg.l2_group_size)
        ts.init(bx)
        if wg_id == 1:
            if warp_id == 0:
                if T.cuda.elect_sync():
                    tma_ps = PipelineState(STAGES, phase=0)
                    while ts.valid():
                        m_st = T.meta_var(ts.m_idx * BLK_M)
                        n_st = T.meta_var(ts.n_idx * BLK_N)
                        for k in range(cfg.k_tiles):
                            # the slot is free once the MMAs that read it last lap completed
                            mma2tma.wait(tma_ps.stage, tma_ps.phase ^ 1)
                            Tx.copy_async(Asmem[tma_ps.stage, :, :],
                                          A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                                          dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                            Tx.copy_async(Bsmem[tma_ps.stage, :, :],
                                          B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                                          dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                            tma2mma.arrive(tma_ps.stage, tx_count=plan.stage_bytes)
                            tma_ps.advance()
                        ts.next_tile()
            elif warp_id == 1:
                if T.cuda.elect_sync():
                    mma_ps = PipelineState(STAGES, phase=0)
                    acc_ps = PipelineState(ACC_STAGES, phase=0)
                    while ts.valid():
                        # the epilogue must have drained this accumulator (first lap: free)
                        epi2mma.wait(acc_ps.stage, acc_ps.phase ^ 1)
                        T.ptx["tcgen05.fence::after_thread_sync"]()
                        for k in range(cfg.k_tiles):
                            tma2mma.wait(mma_ps.stage, mma_ps.phase)
                            T.ptx["tcgen05.fence::after_thread_sync"]()
                            Tx.gemm_async(tmem[:, acc_ps.stage * BLK_N:acc_ps.stage * BLK_N + BLK_N],
                                          Asmem[mma_ps.stage, :, :], Bsmem[mma_ps.stage, :, :],
                                          accum=(k != 0), dispatch="tcgen05", cta_group=1)
                            mma2tma.arrive(mma_ps.stage)  # tcgen05.commit: frees the slot
                            mma_ps.advance()
                        mma2epi.arrive(acc_ps.stage)  # the accumulator is final
                        acc_ps.advance()
                        ts.next_tile()
        else:
            epi_ps = PipelineState(ACC_STAGES, phase=0)
            Dreg = T.alloc_local((EPI_COLS,), "float32")
            while ts.valid():
                mma2epi.wait(epi_ps.stage, epi_ps.phase)
                T.ptx["tcgen05.fence::after_thread_sync"]()
                common.tmem_to_smem(plan, tmem[:, epi_ps.stage * BLK_N:epi_ps.stage * BLK_N + BLK_N],
                                    Dreg, Dsmem, tid)
                # this thread's TMEM reads are complete (wait::ld): the MMA may reuse them
                T.ptx["tcgen05.fence::before_thread_sync"]()
                epi2mma.arrive(epi_ps.stage)
                common.tma_store_tile(plan, D, Dsmem, ts.m_idx * BLK_M, ts.n_idx * BLK_N, tid, EPI_BAR)
                epi_ps.advance()
                ts.next_tile()
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
