"""hgemm_v4 (Blackwell): TMA loads and a TMA-store epilogue.

What changed from v3: the threads no longer copy A and B. The thread that issues the MMAs
also hands each K slice to the Tensor Memory Accelerator (``Tx.copy_async(...,
dispatch="tma_auto")``), which writes the 128B-swizzled tiles itself and counts the bytes it
delivers on the ``tma2mma`` mbarrier (``expect_tx``). The output tile leaves through
shared memory and TMA stores. Still one stage: the load of slice k+1 starts only after the
MMAs of slice k have read the tiles, so TMA and the tensor core take turns.

    thread 0:  for each K slice:
                 TMA A,B -> Asmem,Bsmem; arrive.expect_tx(tma2mma)
                 wait tma2mma; tcgen05.mma x 4 -> tmem; tcgen05.commit -> mma2tma
                 wait mma2tma                   # the tiles are free for the next slice
               tcgen05.commit -> mma2epi
    all:       wait mma2epi; tcgen05.ld tmem -> Dreg -> Dsmem; fence.proxy.async;
               thread 0: TMA store Dsmem -> D

Barriers:   tma2mma[1]  arrived by thread 0 (expect_tx = stage bytes), completed by TMA's
                        byte count; waited by thread 0; one phase per K slice.
            mma2tma[1]  arrived by tcgen05.commit after each slice's MMAs; waited by
                        thread 0 before the next TMA overwrites the tiles.
            mma2epi[1]  arrived by tcgen05.commit after the last slice; all threads wait
                        on phase 0 before reading TMEM.

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M. Tiles past the edges are
    zero-filled on load and clipped on store by TMA.
  - blk_m 128; blk_n 64..256, a multiple of 64; all 512 TMEM columns (see common.py).

Run:  python -m gemm_ladder build v4 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..sync.classes import TCGen05Bar, TMABar
from ..core.budget import check_budget
from ..core.config import GemmConfig
from . import common
from .common import EPI_COLS, MMA_M, TMEM_COLS, BlackwellPlan

TECHNIQUE = "TMA loads and TMA-store epilogue"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64}
STAGES = 1


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    check_budget(cfg, common.smem_bytes(cfg, STAGES))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, STAGES)


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
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
        phase: T.int32 = 0
        if warp_id == 0:
            if T.cuda.elect_sync():
                for k in range(cfg.k_tiles):
                    Tx.copy_async(Asmem[0, :, :], A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                                  dispatch="tma_auto", mbar=tma2mma.ptr_to([0]))
                    Tx.copy_async(Bsmem[0, :, :], B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                                  dispatch="tma_auto", mbar=tma2mma.ptr_to([0]))
                    # TMA counts the full box even where it zero-fills past the edge
                    tma2mma.arrive(0, tx_count=plan.stage_bytes)
                    tma2mma.wait(0, phase)
                    T.ptx["tcgen05.fence::after_thread_sync"]()
                    Tx.gemm_async(tmem[:, 0:BLK_N], Asmem[0, :, :], Bsmem[0, :, :],
                                  accum=(k != 0), dispatch="tcgen05", cta_group=1)
                    mma2tma.arrive(0)  # tcgen05.commit: the tiles are read once this completes
                    mma2tma.wait(0, phase)
                    phase = phase ^ 1
                mma2epi.arrive(0)
        mma2epi.wait(0, 0)
        T.ptx["tcgen05.fence::after_thread_sync"]()
        Dreg = T.alloc_local((EPI_COLS,), "float32")
        common.tmem_to_smem(plan, tmem, Dreg, Dsmem, tid)
        common.tma_store_tile(plan, D, Dsmem, m_st, n_st, tid, 0)
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
