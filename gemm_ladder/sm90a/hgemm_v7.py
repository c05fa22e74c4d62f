"""hgemm_v7 (Hopper): warp specialization, a producer warpgroup and consumer warpgroups.

What changed from v6: in v6 thread 0 was both a loader and an MMA thread. Before each refill
it waited on ``mma2tma`` for every MMA warp to release the stage, and warpgroup 0 waited with
it; the TMA issue sat in the middle of the wgmma stream. v7 gives the loads a warpgroup of
their own. The **producer** warpgroup (warpgroup 0; one thread of it issues every TMA) walks
the CTA's (tile, K slice) stream on its own scheduler, waits for a stage to be released,
and refills it; the **consumer** warpgroups (``num_warpgroups`` of them, each owning its
rows of the tile as in v5/v6) only wait for a stage to fill, issue wgmmas, release the stage
and run the epilogue. The two sides meet only at the mbarriers, so loads run ahead of the
MMAs by up to ``pipe_depth`` slices, across tile borders and under the epilogue.

The producer needs a few registers, the consumers many: ``setmaxnreg`` moves them
(``WarpgroupRole(..., regs=...)``, TVM's own). With two consumer warpgroups the CTA has 384
threads; the kernel starts with 168 registers a thread (65536 / 384, as ptxas caps it), the
producer gives back down to 40 and the consumers grow to 232 (40 x 128 + 232 x 256 = 64512
of the 65536 registers). With one consumer warpgroup (256 threads) every thread may already
hold 255 registers and nothing moves (ptxas ignores setmaxnreg in a kernel whose entry count
is not capped below that).

    producer, one thread:  for (tile, k) of ts_load:                  it = 0, 1, 2, ...
                              wait mma2tma[it%S] (phase ((it/S)&1)^1: the first S pass)
                              TMA A,B slice k -> stage it%S, arrive.expect_tx tma2mma[it%S]
    consumers:             for tile of ts: for k:
                              wait tma2mma[it%S] (phase (it/S)&1); wgmma; commit; wait_group(1)
                              k>0: lane 0 of each warp arrives on mma2tma[(it-1)%S]
                           wait_group(0); release the last slice
                           consumer thread 0: bulk wait_group.read(0) (the last store left Dsmem)
                           named barrier; Dreg -> Dsmem (stmatrix); fence; named barrier;
                           consumer thread 0: TMA store Dsmem -> D, commit (no wait)

Roles and registers:

    ==========  ===========================  ==========  ======================================
    warpgroup   role                         registers   why
    ==========  ===========================  ==========  ======================================
    0           producer (one thread issues  40 (W=2)    a scheduler, a slice counter and TMA
                TMA, the rest idle)          255 (W=1)   coordinates; gives the rest away
    1..W        consumers: wgmma, epilogue   232 (W=2)   blk_m/W x blk_n / 128 fp32 accumulators
                                             255 (W=1)   (128 for 128x256 over 2), descriptors,
                                                         stmatrix staging
    ==========  ===========================  ==========  ======================================

Barriers (one mbarrier per stage, each with its own phase):

    ==========  ==========================================  =================================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  =================================
    tma2mma[s]  the producer thread (arrive.expect_tx, one   every consumer thread,
                arrival) + TMA's bytes (both boxes, edges    (it / S) & 1
                zero-filled but counted)
    mma2tma[s]  lane 0 of every consumer warp (4 x W         the producer thread before
                arrivals) after the wait_group that retired  refill number it,
                slice it's wgmmas                           ((it / S) & 1) ^ 1
    ==========  ==========================================  =================================

A fresh mbarrier is in phase 0; waiting on parity 1 (the phase "before" it) returns at once,
so the producer's first S waits pass without a release, and from then on its wait for refill
``it`` is the release of slice ``it - S``: the same stage one lap earlier. The consumers' own
count ``it`` (never reset, like v6's) and the producer's count walk the same (tile, slice)
sequence, because both schedulers start at the CTA index and stride by the grid.

The epilogue synchronises only the consumers: a named barrier (``bar.sync 1, 128*W``) instead
of ``__syncthreads``, since the producer is somewhere else in its loop and never reaches it.

Constraints:
  - those of v6 (sm_90a; float16/bfloat16; K and N multiples of 8; blk_k = 64; blk_m in
    {64, 128, 256} over 1 or 2 consumer warpgroups in 64-row wgmma atoms; blk_n in
    {64, 128, 192, 256}; pipe_depth from 2 up to what shared memory allows; tile_order and
    l2_group_size as v6);
  - registers: a consumer holds blk_m x blk_n / (128 W) accumulators, at most 128 with two
    consumers (their budget is 232) and 192 with one.

Run:  python -m gemm_ladder build v7 --shape 8192x8192x8192 --knob l2_group_size=16 --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

import schedulers
from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "warp specialization: a TMA producer warpgroup, wgmma consumer warpgroups"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 3,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    common.check_consumer_registers(cfg)
    common.check_schedule(cfg)


def launch(cfg: GemmConfig) -> dict:
    # one CTA per SM, passed at launch; a producer warpgroup beside the consumers
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True)
    return {**info, "threads": info["threads"] + common.THREADS_PER_WG}


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    M_TILES, N_TILES = cfg.grid_mn
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    W = cfg.num_warpgroups  # consumer warpgroups
    MMA_WARPS = 4 * W
    REGS = common.role_registers(W)
    A_layout, B_layout = plan.ab_layouts(S)
    D_layout = plan.d_layout()

    def scheduler(prefix, num_ctas):
        return schedulers.make_tirx_scheduler(
            cfg.tile_order, prefix, num_m_tiles=M_TILES, num_n_tiles=N_TILES,
            num_clusters=num_ctas, l2_group_size=cfg.l2_group_size,
        )

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype),
              num_ctas: T.int32):
        T.device_entry()
        cta = T.cta_id([num_ctas])
        wg_id = T.warpgroup_id([W + 1])
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

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=REGS.producer):
            if T.And(warp_id == 0, lane_id == 0):
                ts_load = scheduler("ts_load", num_ctas)
                ts_load.init(cta)
                load_it: T.int32 = 0
                while ts_load.valid():
                    for k in range(K_TILES):
                        # the stage's previous slice (one lap back) has been released
                        mma2tma.wait(load_it % S, ((load_it // S) & 1) ^ 1)
                        common.tma_load_k_tile(plan, A, B, Asmem, Bsmem, load_it % S,
                                               ts_load.m_idx * BLK_M, ts_load.n_idx * BLK_N, k, tma2mma)
                        load_it = load_it + 1
                    ts_load.next_tile()

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            ctid = T.meta_var((wg_id - 1) * 128 + warp_id * 32 + lane_id)
            wg_row0 = T.meta_var((wg_id - 1) * plan.rows_per_wg)
            Dreg = T.alloc_local((plan.acc_regs,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            it: T.int32 = 0  # (tile, slice) pairs consumed by this CTA: never reset
            ts = scheduler("ts", num_ctas)
            ts.init(cta)
            while ts.valid():
                for k in range(K_TILES):
                    tma2mma.wait(it % S, (it // S) & 1)
                    T.ptx.wgmma.fence.sync.aligned()
                    common.mma_k_tile(plan, Dreg, Asmem, Bsmem, it % S, wg_row0, k == 0, desc_a, desc_b)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(1)
                    if k > 0:
                        # slice it-1's wgmmas have retired in this warp
                        if lane_id == 0:
                            mma2tma.arrive((it - 1) % S)
                    it = it + 1
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if lane_id == 0:
                    mma2tma.arrive((it - 1) % S)
                common.consumer_store_tile(D, Dsmem, Dreg, ts.m_idx * BLK_M, ts.n_idx * BLK_N, plan,
                                           ctid, wg_row0, warp_id, lane_id, packed)
                ts.next_tile()
            if ctid == 0:
                # Dsmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
    # fmt: on

    return hgemm
