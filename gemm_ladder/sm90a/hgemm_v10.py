"""hgemm_v10 (Hopper): split-K, several CTAs share the K loop of one output tile.

What changed from v9: v9 gives every output tile to one CTA, so a shape with fewer tiles than
SMs (or a little more than a whole number of waves of them) leaves SMs idle for the whole
kernel: 978x2640x3336 in 128x256 tiles is 88 tiles on 132 SMs, two thirds of the GPU. v10 cuts
each tile's K loop into ``split_k`` work units (unit ``s`` runs K slices
``[s * k_tiles / split_k, (s+1) * k_tiles / split_k)``): ``split_k`` times as many units, each
``split_k`` times shorter, so the waves fill. Each unit ends with fp32 accumulators that are
only part of the sum; the units of a tile meet in a workspace in global memory and the last one
to finish adds them up and stores the tile (``sm90a/splitk.py`` draws the protocol):

    consumer c, unit (tile, s):  K slices of split s: wait tma2mma; wgmma; ...  (as v9)
                                 st.global Dreg -> workspace slot (tile, c, s)
                                 bar.sync 1+c; thread 0: fence; old = atom.add count[tile, c]
                                 bar.sync 1+c
                                 old == split_k - 1 (the last):
                                   Dreg = slot 0 + ... + slot split_k-1  (split order)
                                   count[tile, c] = 0; the v9 epilogue (chunks, TMA store)
                                 -> next unit

The scheduler walks a grid whose columns are (N tile, split) pairs (column ``n * split_k + s``
of the cluster grid), so the units of a tile are neighbours in every tile order: they run in the
same wave, their partials are still in L2 when the last one reads them, and no unit ever waits
for another (no deadlock whatever runs when). The sum is taken in split order whoever comes
last: the same bits on every run.

Roles and registers: v9's (warpgroup 0 produces, consumers 1..W own their rows and epilogues).
Barriers: v9's, and a counter in global memory per tile and consumer:

    ============  ============================================  ================================
    barrier       arrived by                                    waited by (phase)
    ============  ============================================  ================================
    tma2mma[s]    as v9 (the producer's expect_tx + the bytes)  every consumer thread, as v9
    mma2tma[s]    as v9 (lane 0 of every consumer warp of the   the producer before a refill
                  cluster, after the wait_group)
    bar 1+c       consumer c's 128 threads: twice per unit      (named barrier, no phase)
                  around the count, twice per stored chunk
    count[t, c]   thread 0 of consumer c in each of tile t's    nobody: the unit whose add
    (global)      split_k units (fence; atom.acq_rel.gpu.add)   returns split_k - 1 sums
    ============  ============================================  ================================

The partials: ``split_k`` fp32 slots per tile and consumer, in fragment order
(``launch["workspace"]``; the runtime allocates them and zeroes the counters once, the last unit
of each tile puts its counter back to zero).

When it pays: fewer tile units than about two waves (a few big tiles over many SMs: small or
middling M and N with a long K). It costs the partials' traffic, ``split_k`` x blk_m x blk_n x
4 bytes per tile written and read back through L2, and shorter K loops (the ring fills once per
unit); ``schedulers.wave_model`` models both and picks ``split_k``. ``split_k=1`` is v9 (with an
unused workspace).

Constraints:
  - those of v9 (clusters, consumers, epi_n, registers, shared memory; ``dynamic_m``, ``stream_b``);
  - split_k from 1 to the K slices (K / 64, rounded up) and at most 32. With 128 accumulators
    a consumer (128x256 over two) and split_k >= 3, ptxas spills one register around the last
    unit's sum (a store and a load once a tile, off the K loop).

Run:  python -m gemm_ladder build v10 --shape 978x2640x3336 --knob split_k=2 --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

import schedulers
from ..barriers import MBarrier, TMABar
from ..config import GemmConfig
from . import common, splitk
from .common import HopperPlan

TECHNIQUE = "split-K: a tile's K loop over several CTAs, the last one sums the fp32 partials"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER,
         "cluster_m": 2, "cluster_n": 1, "epi_n": 64, "dynamic_m": False, "split_k": 2, "stream_b": False}
CONSUMERS = (1, 2, 3)
# what the tuner tries beyond the defaults (gemm_ladder.tune.space)
TUNE_CHOICES = {"split_k": (1, 2, 3, 4, 6, 8)}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg, CONSUMERS)
    common.check_epilogue(cfg)
    common.check_pipe_depth(cfg)
    common.check_consumer_registers(cfg)
    splitk.check_grid(cfg)


cluster_grid = splitk.cluster_grid
workspace = splitk.tile_workspace
launch = splitk.launch


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = common.m_extent(cfg), cfg.N, cfg.K, cfg.dtype  # M: an int or runtime
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    CM, CN = common.cluster_shape(cfg)
    CS = CM * CN
    M_TILES, N_TILES = cluster_grid(cfg, M)  # in cluster tiles
    N_CTA_TILES = N_TILES * CN  # tile columns of the workspace
    SPLIT = splitk.split_k(cfg)
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    W = cfg.num_warpgroups  # consumer warpgroups
    MMA_WARPS = 4 * W
    RELEASES = MMA_WARPS * CS  # every consumer warp of every CTA of the cluster
    REGS = common.role_registers(W)
    EPI_N = dict(cfg.extra)["epi_n"]
    NBUF = 2 if EPI_N < BLK_N else 1  # staging buffers per consumer
    ROWS = plan.rows_per_wg
    ACC = plan.acc_regs
    A_layout, B_layout = plan.ab_layouts(S)
    E_layout = common.staging_layout(cfg, W * NBUF, ROWS, EPI_N)
    WS = workspace(cfg)
    P_ELEMS = splitk.workspace_elems(WS, M, "float32")
    C_ELEMS = splitk.workspace_elems(WS, M, "int32")

    def scheduler(prefix, num_clusters):
        return schedulers.make_tirx_scheduler(
            cfg.tile_order, prefix, num_m_tiles=M_TILES, num_n_tiles=N_TILES * SPLIT,
            num_clusters=num_clusters, l2_group_size=cfg.l2_group_size,
        )

    # fmt: off
    @T.prim_func
    def hgemm(a: T.handle, b: T.handle, d: T.handle, p: T.handle, cnt: T.handle, num_ctas: T.int32):
        A = T.match_buffer(a, (M, K), dtype)
        B = T.match_buffer(b, (N, K), dtype)
        D = T.match_buffer(d, (M, N), dtype)
        P = T.match_buffer(p, (P_ELEMS,), "float32")  # partial slots
        C = T.match_buffer(cnt, (C_ELEMS,), "int32")  # units counted per tile and consumer
        T.device_entry()
        cta = T.cta_id([num_ctas])  # whole clusters: the runtime rounds the SM count down
        rank = T.cta_id_in_cluster([CS])
        clu = T.meta_var(cta // CS)
        num_clusters = T.meta_var(num_ctas // CS)
        wg_id = T.warpgroup_id([W + 1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, S)
        mma2tma = MBarrier(pool, S)
        flag = pool.alloc((W,), "int32")  # per consumer: units of the tile counted before this one
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Esmem = pool.alloc((W * NBUF, ROWS, EPI_N), dtype, layout=E_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(RELEASES)
        # make the barrier inits visible to the async proxy and to the peers before any TMA
        # completes or any peer arrives on them
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        rank_m = T.meta_var(rank % CM)
        rank_n = T.meta_var(rank // CM)

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=REGS.producer):
            if T.And(warp_id == 0, lane_id == 0):
                ts_load = scheduler("ts_load", num_clusters)
                ts_load.init(clu)
                load_it: T.int32 = 0
                while ts_load.valid():
                    # column n * SPLIT + s of the scheduler's grid: split s of tile column n, K
                    # slices [k0, k0 + nk)
                    n_col, split = T.meta_var(splitk.unit(ts_load.n_idx, SPLIT))
                    k0, nk = T.meta_var(splitk.k_slices(split, SPLIT, K_TILES))
                    for k in range(nk):
                        # the stage's previous slice (one lap back) has been released
                        mma2tma.wait(load_it % S, ((load_it // S) & 1) ^ 1)
                        common.tma_load_k_tile_cluster(
                            plan, A, B, Asmem, Bsmem, load_it % S, (ts_load.m_idx * CM + rank_m) * BLK_M,
                            (n_col * CN + rank_n) * BLK_N, k0 + k, tma2mma, CM, CN,
                            rank_m, rank_n)
                        load_it = load_it + 1
                    ts_load.next_tile()

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            c = T.meta_var(wg_id - 1)  # this consumer
            wtid = T.meta_var(warp_id * 32 + lane_id)
            wg_row0 = T.meta_var(c * ROWS)
            Dreg = T.alloc_local((ACC,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            it: T.int32 = 0  # (unit, slice) pairs consumed by this CTA: never reset
            epi_it: T.int32 = 0  # output chunks this consumer stored: never reset
            ts = scheduler("ts", num_clusters)
            ts.init(clu)
            while ts.valid():
                n_col, split = T.meta_var(splitk.unit(ts.n_idx, SPLIT))
                _, nk = T.meta_var(splitk.k_slices(split, SPLIT, K_TILES))
                for k in range(nk):
                    tma2mma.wait(it % S, (it // S) & 1)
                    T.ptx.wgmma.fence.sync.aligned()
                    common.mma_k_tile(plan, Dreg, Asmem, Bsmem, it % S, wg_row0, k == 0, desc_a, desc_b)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(1)
                    if k > 0:
                        # slice it-1's wgmmas have retired in this warp
                        if lane_id == 0:
                            common.release_to_cluster(mma2tma, (it - 1) % S, CS)
                    it = it + 1
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if lane_id == 0:
                    common.release_to_cluster(mma2tma, (it - 1) % S, CS)
                m_cta = T.meta_var(ts.m_idx * CM + rank_m)
                n_cta = T.meta_var(n_col * CN + rank_n)
                if SPLIT > 1:
                    counter = T.meta_var(splitk.counter_index(m_cta, n_cta, c, N_CTA_TILES, W))
                    splitk.publish_and_count(P, C, Dreg, ACC, counter, split, wtid, flag, c, SPLIT)
                    if flag[c] == SPLIT - 1:  # the last unit of the tile: sum and store
                        splitk.sum_partials(P, C, Dreg, ACC, counter, wtid, SPLIT)
                        common.consumer_store_chunks(D, Esmem, Dreg, m_cta * BLK_M, n_cta * BLK_N, plan, c,
                                                     wtid, warp_id, lane_id, packed, epi_it, EPI_N, NBUF)
                        epi_it = epi_it + BLK_N // EPI_N
                else:
                    common.consumer_store_chunks(D, Esmem, Dreg, m_cta * BLK_M, n_cta * BLK_N, plan, c,
                                                 wtid, warp_id, lane_id, packed, epi_it, EPI_N, NBUF)
                    epi_it = epi_it + BLK_N // EPI_N
                ts.next_tile()
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()
    # fmt: on

    return hgemm
