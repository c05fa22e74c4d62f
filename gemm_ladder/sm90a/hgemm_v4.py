"""hgemm_v4 (Hopper): TMA loads and a TMA-store epilogue.

What changed from v3: the threads no longer copy A and B. One thread hands each K slice to
the Tensor Memory Accelerator (``Tx.copy_async(..., dispatch="tma_auto")``), which writes the
128B-swizzled tiles itself and counts the bytes it delivers on an mbarrier; every thread waits
on that barrier's phase, then the warpgroup issues its wgmmas. The output tile leaves through
shared memory and one TMA store. Still one stage: the load of slice k+1 starts only after the
MMAs of slice k are done, so TMA and the tensor cores take turns.

    thread 0:  TMA A,B -> tma2mma (expect_tx)     all: wait tma2mma, wgmma x4, wait_group 0
               ... K slices ...
    all:       Dreg -> Dsmem, fence.proxy.async, thread 0: TMA store Dsmem -> D

Barriers:   tma2mma[1]  arrived by thread 0 (expect_tx) and completed by TMA's byte count;
            its phase flips once per K slice.

Constraints:
  - arch sm_90a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M. Tiles past the edges are
    zero-filled on load and clipped on store by TMA.
  - blk_m in {64, 128, 256} split over num_warpgroups; blk_n a multiple of 16 up to 256.

Run:  python -m gemm_ladder build v4 --shape 4096x4096x4096 --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..sync.classes import TMABar
from ..core.budget import check_budget
from ..core.config import GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "TMA loads and TMA-store epilogue"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
STAGES = 1


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    check_budget(cfg, common.smem_bytes(cfg, STAGES))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, STAGES)


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
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
        wg_id = T.warpgroup_id([cfg.num_warpgroups])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, STAGES)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        # make the barrier init visible to the async proxy before TMA completes on it
        T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()

        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        wg_row0 = T.meta_var(wg_id * plan.rows_per_wg)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        phase: T.int32 = 0
        for k in range(cfg.k_tiles):
            if tid == 0:
                Tx.copy_async(Asmem[0, :, :], A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                              dispatch="tma_auto", mbar=tma2mma.ptr_to([0]))
                Tx.copy_async(Bsmem[0, :, :], B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                              dispatch="tma_auto", mbar=tma2mma.ptr_to([0]))
                # TMA counts the full box even where it zero-fills past the edge
                tma2mma.arrive(0, tx_count=plan.stage_bytes)
            tma2mma.wait(0, phase)
            phase = phase ^ 1
            T.ptx.wgmma.fence.sync.aligned()
            common.mma_k_tile(plan, Dreg, Asmem, Bsmem, 0, wg_row0, k == 0, desc_a, desc_b)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)
            # every warpgroup must be done reading the stage before TMA overwrites it
            T.cuda.cta_sync()
        common.acc_to_smem(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id)
        common.tma_store_tile(D, Dsmem, m_st, n_st, plan, tid)
    # fmt: on

    return hgemm
