"""Test support: v5 (Hopper) with 2-CTA clusters and a TMA-multicast B tile.

Not a rung of the ladder: a kernel with the cluster protocol the cluster rungs use, so the
barrier checker's cluster paths (multicast TMA, remote ``mbarrier.arrive.shared::cluster``,
cluster barriers) are tested before such a rung exists, and so that the broken variant "a
multicast mask that misses a CTA" has a real kernel to break.

The two CTAs of a cluster compute M tiles 2c and 2c+1 of the same N tile, so they read the same
B panel: CTA rank r loads rows ``[r*BN/2, (r+1)*BN/2)`` of each B slice once and multicasts them
into both CTAs (``cta_mask``). A stage of CTA r is therefore written by both producers, so:

    ==========  =========================================  ==================================
    barrier     arrived by                                 waited by (phase)
    ==========  =========================================  ==================================
    tma2mma[s]  own thread 0 (expect_tx: A box + whole B);  own MMA threads, (k / S) & 1
                bytes from both CTAs' copies
    mma2tma[s]  lane 0 of every MMA warp of BOTH CTAs       own thread 0 before a refill
                (remote arrive on the peer), 2 x warps       ((k-1) / S) & 1
    ==========  =========================================  ==================================

Init is followed by a cluster barrier (the peer arrives and multicasts into this CTA), and so is
the end (no CTA leaves while its peer may still arrive on its barriers).
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from gemm_ladder.sync.classes import MBarrier, TMABar
from gemm_ladder.sm90a import common
from gemm_ladder.sm90a.common import HopperPlan

CLUSTER = 2
FULL_MASK = (1 << CLUSTER) - 1


def kernel(cfg, b_mask=lambda rank: FULL_MASK):
    """The cluster kernel for a v5 config; ``b_mask(rank)`` is the multicast mask of rank's B half."""
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    HALF_N = BLK_N // CLUSTER
    GRID_M, GRID_N = cfg.grid_mn
    assert GRID_M % CLUSTER == 0, "M must hold an even number of tiles"
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    PREFETCH = min(S, K_TILES)
    MMA_WARPS = 4 * cfg.num_warpgroups
    A_layout, B_layout = plan.ab_layouts(S)
    D_layout = plan.d_layout()
    masks = [b_mask(r) for r in range(CLUSTER)]

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        # a 1-D cluster id: TVM launches a 1-D grid, on which %clusterid.y would always be 0
        clu = T.cluster_id([GRID_M // CLUSTER * GRID_N])
        rank = T.cta_id_in_cluster([CLUSTER])
        wg_id = T.warpgroup_id([cfg.num_warpgroups])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, S)
        mma2tma = MBarrier(pool, S)
        pool.move_base_to(1024)
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(CLUSTER * MMA_WARPS)
        T.ptx.fence.mbarrier_init.release.cluster()
        # the peer arrives on our barriers and multicasts into our stages: it must see the inits
        T.cuda.cluster_sync()

        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        wg_row0 = T.meta_var(wg_id * plan.rows_per_wg)
        m_st = T.meta_var((clu % (GRID_M // CLUSTER) * CLUSTER + rank) * BLK_M)
        n_st = T.meta_var(clu // (GRID_M // CLUSTER) * BLK_N)
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((4,), "uint32")

        @T.inline
        def load(stage, k):
            Tx.copy_async(Asmem[stage, :, :], A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                          dispatch="tma_auto", mbar=tma2mma.ptr_to([stage]))
            # this CTA's half of the shared B slice, into the same rows of both CTAs
            Tx.copy_async(Bsmem[stage, rank * HALF_N:rank * HALF_N + HALF_N, :],
                          B[n_st + rank * HALF_N:n_st + rank * HALF_N + HALF_N, k * BLK_K:k * BLK_K + BLK_K],
                          dispatch="tma_auto", mbar=tma2mma.ptr_to([stage]),
                          cta_mask=T.Select(rank == 0, masks[0], masks[1]))
            tma2mma.arrive(stage, tx_count=plan.stage_bytes)

        if tid == 0:
            for s in T.unroll(PREFETCH):
                load(s, s)
        for k in range(K_TILES):
            tma2mma.wait(k % S, (k // S) & 1)
            T.ptx.wgmma.fence.sync.aligned()
            common.mma_k_tile(plan, Dreg, Asmem, Bsmem, k % S, wg_row0, k == 0, desc_a, desc_b)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(1)
            if k > 0:
                if lane_id == 0:
                    # both producers write this stage: release it to both
                    for r in T.unroll(CLUSTER):
                        mma2tma.arrive((k - 1) % S, remote=r)
                if tid == 0:
                    if k - 1 + S < K_TILES:
                        mma2tma.wait((k - 1) % S, ((k - 1) // S) & 1)
                        load((k - 1) % S, k - 1 + S)
        T.ptx.wgmma.wait_group.sync.aligned(0)
        common.acc_to_smem_stmatrix(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id, packed)
        common.tma_store_issue(D, Dsmem, m_st, n_st, plan, tid)
        if tid == 0:
            T.ptx.cp.async_.bulk.wait_group.read(0)
        # the peer may still arrive on our barriers: leave together
        T.cuda.cluster_sync()
    # fmt: on

    return hgemm
