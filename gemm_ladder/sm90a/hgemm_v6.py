"""hgemm_v6 (Hopper): persistent CTAs, a tile scheduler, and a ring that never drains.

What changed from v5: v5 launched one CTA per output tile, so every tile paid for filling the
ring and for its epilogue with the tensor cores idle. v6 launches one CTA per SM (the count is
read off the GPU at LAUNCH time and passed as the trailing ``num_ctas`` argument; the manifest
says ``launch["persistent"]``) and each CTA walks its tiles in the order of a tile scheduler
(``schedulers.make_tirx_scheduler``: ``tile_order`` grouped / snake / row / column, with
``l2_group_size`` rows per L2 group). The ring of v5 now runs over the CTA's whole stream of
(tile, K slice) pairs: a running counter ``it`` numbers them, so stage = it % S and
phase = (it / S) & 1 stay right across tiles for every K, and the loads of the next tile's
first slices (thread 0 keeps a second scheduler, ``ts_load``, that runs ahead) fly while the
current tile's epilogue runs. The epilogue's TMA store is no longer waited for: only before
Dsmem is rewritten by the next tile does thread 0 wait until the store has READ Dsmem.

    thread 0:  TMA the first S (tile, slice) pairs of ts_load -> stages 0..S-1
    all:       while ts.valid():
                 for k: wait tma2mma[it%S] (phase (it/S)&1); wgmma; commit; wait_group(1)
                        k>0: release slice it-1 (mma2tma), thread 0 refills it with it-1+S
                        it += 1
                 wait_group(0); release slice it-1, thread 0 refills it with it-1+S
                 thread 0: bulk wait_group.read(0)  (the previous tile's store left Dsmem)
                 Dreg -> Dsmem (stmatrix); thread 0: TMA store, commit (no wait)
                 ts.next_tile()

Barriers (one mbarrier per stage, each with its own phase):

    ==========  ==========================================  ===============================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  ===============================
    tma2mma[s]  thread 0 (arrive.expect_tx) + TMA's bytes    every MMA thread, (it / S) & 1
    mma2tma[s]  lane 0 of every MMA warp (4 x warpgroups)    thread 0 before a refill,
                after its wait_group                        (j / S) & 1 for released slice j
    ==========  ==========================================  ===============================

wait_group(1) is safe for the reason given in v5: a stage is refilled only after every warp of
every warpgroup has retired the wgmma group that read it (the mma2tma arrivals); the group
left in flight reads another stage. At a tile's end wait_group(0) retires everything before
Dreg is read by the epilogue, and the next tile's first wgmma (scale-d = 0) comes after it in
program order. Phases are never reset: ``it`` keeps counting across tiles, so a K with fewer
slices than stages, or a count that is not a multiple of S, carries the phase over correctly.

One module for every M (``dynamic_m=True``): M becomes a runtime value (a symbolic ``M``
bound from A's shape; TMA descriptors take it as their extent), the scheduler's number of M
tiles is computed from it at run time, N and K stay fixed. Knobs are validated at the shape's M,
which the manifest records as the M they were chosen for. Tile orders: grouped or snake.

Constraints:
  - those of v5 (sm_90a; float16/bfloat16; K and N multiples of 8; blk_k = 64; blk_m in
    {64, 128, 256} over 1 or 2 warpgroups; blk_n in {64, 128, 192, 256}; pipe_depth from 2 up
    to what shared memory allows);
  - tile_order in grouped / snake / row / column (``config.TILE_ORDERS``); l2_group_size >= 1;
    the order must cover the tile grid exactly once (``launch.check_schedule``).

Run:  python -m gemm_ladder build v6 --shape 8192x8192x8192 --knob l2_group_size=8 --out build/
"""

from tvm.script import tirx as T

import schedulers
from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common
from .common import HopperPlan

TECHNIQUE = "persistent CTAs with an L2-grouped tile scheduler"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 3,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER, "dynamic_m": False}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    common.check_schedule(cfg)
    common.check_dynamic_m(cfg)


def launch(cfg: GemmConfig) -> dict:
    # the grid is one CTA per SM of the GPU it runs on: the runtime passes that count
    return common.dynamic_launch(cfg, common.launch_info(cfg, cfg.pipe_depth, persistent=True))


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = common.m_extent(cfg), cfg.N, cfg.K, cfg.dtype  # M: an int or runtime
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    M_TILES, N_TILES = common.tiles_over(M, BLK_M), cfg.grid_mn[1]
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    MMA_WARPS = 4 * cfg.num_warpgroups
    A_layout, B_layout = plan.ab_layouts(S)
    D_layout = plan.d_layout()

    def scheduler(prefix, num_ctas):
        return schedulers.make_tirx_scheduler(
            cfg.tile_order, prefix, num_m_tiles=M_TILES, num_n_tiles=N_TILES,
            num_clusters=num_ctas, l2_group_size=cfg.l2_group_size,
        )

    # fmt: off
    @T.prim_func
    def hgemm(a: T.handle, b: T.handle, d: T.handle, num_ctas: T.int32):
        A = T.match_buffer(a, (M, K), dtype)
        B = T.match_buffer(b, (N, K), dtype)
        D = T.match_buffer(d, (M, N), dtype)
        T.device_entry()
        cta = T.cta_id([num_ctas])
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
        Dreg = T.alloc_local((plan.acc_regs,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((4,), "uint32")

        # thread 0's load stream runs up to S slices ahead of the MMAs, across tile borders
        ts_load = scheduler("ts_load", num_ctas)
        ts_load.init(cta)
        load_k: T.int32 = 0

        @T.inline
        def load_next(stage):
            if ts_load.valid():
                common.tma_load_k_tile(plan, A, B, Asmem, Bsmem, stage, ts_load.m_idx * BLK_M,
                                       ts_load.n_idx * BLK_N, load_k, tma2mma)
                load_k = load_k + 1
                if load_k == K_TILES:
                    load_k = 0
                    ts_load.next_tile()

        @T.inline
        def release(j):
            # slice j's wgmmas have retired in this warp; once every MMA warp says so, thread 0
            # puts slice j + S into its stage
            if lane_id == 0:
                mma2tma.arrive(j % S)
            if tid == 0:
                if ts_load.valid():
                    mma2tma.wait(j % S, (j // S) & 1)
                    load_next(j % S)

        if tid == 0:
            for s in T.unroll(S):
                load_next(s)

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
                    release(it - 1)
                it = it + 1
            T.ptx.wgmma.wait_group.sync.aligned(0)
            release(it - 1)
            if tid == 0:
                # the previous tile's TMA store must have read Dsmem before it is rewritten
                T.ptx.cp.async_.bulk.wait_group.read(0)
            T.cuda.cta_sync()
            common.acc_to_smem_stmatrix(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id, packed)
            common.tma_store_issue(D, Dsmem, ts.m_idx * BLK_M, ts.n_idx * BLK_N, plan, tid)
            ts.next_tile()
        if tid == 0:
            T.ptx.cp.async_.bulk.wait_group.read(0)
    # fmt: on

    return hgemm
