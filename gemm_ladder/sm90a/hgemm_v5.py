"""hgemm_v5 (Hopper): a ``pipe_depth``-stage shared-memory ring, wgmma kept in flight.

What changed from v4: v4 had one stage, so TMA and the tensor cores took turns. v5 keeps
``pipe_depth`` K slices in a ring of shared-memory stages. Thread 0 first fills every stage;
then, for each K slice k, all warpgroups wait for stage k % S, issue its wgmmas and commit them
as one group; ``wgmma.wait_group(1)`` lets that group run on while it retires the group of
slice k-1, whose stage is then released and refilled with slice k-1+S. The loads run S-1
slices ahead of the MMAs. The output tile leaves through ``stmatrix`` (8 elements per store,
where v4 stored 2 bytes at a time) and one TMA store.

    thread 0:  TMA slices 0..S-1 -> stages 0..S-1 (tma2mma[s], expect_tx)
    all:       for k: wait tma2mma[k%S] (phase (k/S)&1); wgmma x (BK/16) per 64 rows; commit
                      wait_group(1)                 -> the group of slice k-1 has retired
                      lane 0 of each warp: arrive mma2tma[(k-1)%S]
                      thread 0: wait mma2tma[(k-1)%S] (phase ((k-1)/S)&1), TMA slice k-1+S
               wait_group(0); Dreg -> Dsmem (stmatrix); thread 0: TMA store Dsmem -> D

Barriers (one mbarrier per stage, each with its own phase):

    ==========  ==========================================  ===============================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  ===============================
    tma2mma[s]  thread 0 (arrive.expect_tx) + TMA's bytes    every MMA thread, (k / S) & 1
    mma2tma[s]  lane 0 of every MMA warp (4 x warpgroups)    thread 0 before a refill,
                after its wait_group(1)                     (j / S) & 1 for released slice j
    ==========  ==========================================  ===============================

Why wait_group(1) is safe: TMA may overwrite stage s only when no wgmma of ANY warpgroup
still reads it. wait_group(1) retires only the calling warpgroup's older groups, so a
warpgroup's word is not enough for the others: each warp arrives on ``mma2tma[s]`` after its
own wait_group, and thread 0 refills s only once all 4 x ``num_warpgroups`` arrivals (that
phase of the barrier) are in. The group left in flight reads stage k % S, never the stage
being refilled, and the accumulator chain between groups is ordered by the hardware. A phase
cannot be skipped: slice j+S is loaded only after slice j was released, and released only
after every warp waited for it, so each waiter is at most one phase behind.

Constraints:
  - arch sm_90a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M. Edge tiles are zero-filled on
    load and clipped on store by TMA; K may be shorter than the ring (fewer slices than stages).
  - blk_m in {64, 128, 256} split over num_warpgroups (1 or 2) in 64-row wgmma atoms; blk_n in
    {64, 128, 192, 256}; blk_k = 64.
  - 2 <= pipe_depth <= (shared memory per block - output tile - 1 KiB) / stage bytes
    (``budget.max_pipe_depth``), with the shared memory read off the GPU when one is present
    (``budget.limits_for``).

Run:  python -m gemm_ladder build v5 --shape 4096x4096x4096 --knob pipe_depth=3 --out build/
"""

from tvm.script import tirx as T

from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "multi-stage TMA ring with wgmma kept in flight"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 3}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, cfg.pipe_depth)


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    GRID_M, GRID_N = cfg.grid_mn
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    PREFETCH = min(S, K_TILES)  # K may hold fewer slices than the ring has stages
    MMA_WARPS = 4 * cfg.num_warpgroups
    A_layout, B_layout = plan.ab_layouts(S)
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
        tma2mma = TMABar(pool, S)
        mma2tma = MBarrier(pool, S)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(MMA_WARPS)
        # make the barrier inits visible to the async proxy before TMA completes on them
        T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()

        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        wg_row0 = T.meta_var(wg_id * plan.rows_per_wg)
        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((4,), "uint32")

        if tid == 0:
            for s in T.unroll(PREFETCH):
                common.tma_load_k_tile(plan, A, B, Asmem, Bsmem, s, m_st, n_st, s, tma2mma)
        for k in range(K_TILES):
            tma2mma.wait(k % S, (k // S) & 1)
            T.ptx.wgmma.fence.sync.aligned()
            common.mma_k_tile(plan, Dreg, Asmem, Bsmem, k % S, wg_row0, k == 0, desc_a, desc_b)
            T.ptx.wgmma.commit_group.sync.aligned()
            # slice k's group runs on; slice k-1's group of THIS warpgroup has retired
            T.ptx.wgmma.wait_group.sync.aligned(1)
            if k > 0:
                if lane_id == 0:
                    mma2tma.arrive((k - 1) % S)
                if tid == 0:
                    if k - 1 + S < K_TILES:
                        # every warp of every warpgroup is done reading the stage
                        mma2tma.wait((k - 1) % S, ((k - 1) // S) & 1)
                        common.tma_load_k_tile(plan, A, B, Asmem, Bsmem, (k - 1) % S, m_st, n_st,
                                               k - 1 + S, tma2mma)
        T.ptx.wgmma.wait_group.sync.aligned(0)
        common.acc_to_smem_stmatrix(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id, packed)
        common.tma_store_issue(D, Dsmem, m_st, n_st, plan, tid)
        if tid == 0:
            # Dsmem must outlive the copy: the CTA's shared memory goes when it exits
            T.ptx.cp.async_.bulk.wait_group.read(0)
    # fmt: on

    return hgemm
