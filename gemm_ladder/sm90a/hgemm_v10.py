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

Stream-K (``stream_k=True`` with ``split_k=1``, off by default; ``sm90a/streamk.py`` draws it):
split-K cuts every tile evenly, stream-K only the tail. T cluster tiles on G clusters leave the
last wave ``G - T % G`` clusters idle; with ``stream_k`` the full waves run whole tiles as v9
does, and the K slices of the partial wave's tiles (with the wave before them when they are
fewer than half a wave) are dealt out evenly, a contiguous range to each cluster. A tile then
has two or three pieces on neighbouring clusters; they meet in the workspace as split-K units
do, except that a piece reads the counter first and skips publishing when the others are in,
and the last one sums the pieces in K order with its own registers at its place (the same bits
whatever arrives last). Each cluster runs its whole tiles, then the piece from slice 0, then
the one up to the end of its range, so the clusters read the same K slices at about the same
time (in the range's own order DRAM reads went up from 147 to 280 MB at 4096^3).

    consumer c, piece (tile j, slices [k0, k0 + nk)):  the K loop (as v9)
        whole tile:  the v9 epilogue
        else:        bar.sync; thread 0: seen = ld.acquire.gpu count[j, c]; bar.sync
                     seen < pieces - 1: st.global Dreg -> slot; bar.sync; thread 0: fence;
                                        old = atom.add count[j, c]; bar.sync
                     last (seen or old == pieces - 1): Dreg = p0 + p1 (+ p2), own at its place;
                                        count[j, c] = 0; the v9 epilogue

On an H100 (``benchmarks/results/2026-11-23_h100_stream_k/``) it pays where the tail is most of
a wave: 1792x2560x8192 (70 cluster tiles on 66 clusters) 0.95x cuBLAS against v9's 0.56x and
split-K's 0.64x, 2560x2560x8192 0.96x against 0.82x, 2304x4096x4096 0.92x against 0.73x (but v9
in 128x192 tiles, whose waves come out whole there, 0.99x); 6144^3 0.99-1.01x against
0.95-1.00x. The front door chooses it by makespan (``plan``'s rule ``stream-k``). It loses where the
partial wave is nearly full: 4096^3 (58 of 66) 0.95x against v9's 1.00x, 3072x8192x1536
0.93x against 1.01x: every cluster meets twice (publishes 128 KiB or reads it back, a fence,
the K loop drained and refilled), about 14k cycles an SM, more than the 8 slices it saves.

Constraints:
  - those of v9 (clusters, consumers, epi_n, registers, shared memory; ``dynamic_m``, ``stream_b``);
  - stream_k only with split_k=1; its workspace is two slots of every consumer's accumulators
    and a counter per CTA of the launch (the runtime sizes it for the GPU at hand);
  - split_k from 1 to the K slices (K / 64, rounded up) and at most 32. With 128 accumulators
    a consumer (128x256 over two) and split_k >= 3, ptxas spills one register around the last
    unit's sum (a store and a load once a tile, off the K loop).

Run:  python -m gemm_ladder build v10 --shape 978x2640x3336 --knob split_k=2 --out build/
      python -m gemm_ladder build v10 --shape 1792x2560x8192 --knob split_k=1 --knob stream_k=true --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common, epilogue, splitk, streamk
from .common import HopperPlan
from .epilogue import ChunkedEpilogue
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring
from .schedule import Schedule

TECHNIQUE = "split-K: a tile's K loop over several CTAs, the last one sums the fp32 partials"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER,
         "cluster_m": 2, "cluster_n": 1, "epi_n": 64, "dynamic_m": False, "split_k": 2, "stream_b": False,
         "stream_k": False}
CONSUMERS = (1, 2, 3)
# what the tuner tries beyond the defaults (gemm_ladder.tune.space)
TUNE_CHOICES = {"split_k": (1, 2, 3, 4, 6, 8), "stream_k": (False, True)}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg, CONSUMERS)
    epilogue.check_epilogue(cfg)
    common.check_pipe_depth(cfg)
    common.check_consumer_registers(cfg)
    splitk.check_grid(cfg)
    streamk.check(cfg)


cluster_grid = splitk.cluster_grid


def workspace(cfg: GemmConfig) -> dict:
    """Split-K's slots and counters per row of tiles, stream-K's per CTA of the launch."""
    return {**splitk.tile_workspace(cfg), **streamk.workspace(cfg, cfg.num_warpgroups)}


def launch(cfg: GemmConfig) -> dict:
    return {**splitk.launch(cfg), "workspace": workspace(cfg)}


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
    E_layout = epilogue.staging_layout(cfg, W * NBUF, ROWS, EPI_N)
    WS = workspace(cfg)
    SK = streamk.enabled(cfg)  # whole tiles for the full waves, the tail's K loops spread evenly

    def whole_tiles_left(ts, dp_tiles):
        # stream_k: the scheduler hands out the whole tiles only, the stream-K ones come after
        return T.And(ts.valid(), ts.linear_idx < dp_tiles) if SK else ts.valid()

    # fmt: off
    @T.prim_func
    def hgemm(a: T.handle, b: T.handle, d: T.handle, p: T.handle, cnt: T.handle, num_ctas: T.int32):
        A = T.match_buffer(a, (M, K), dtype)
        B = T.match_buffer(b, (N, K), dtype)
        D = T.match_buffer(d, (M, N), dtype)
        P = T.match_buffer(p, (splitk.workspace_elems(WS, M, "float32", num_ctas),), "float32")  # partial slots
        C = T.match_buffer(cnt, (splitk.workspace_elems(WS, M, "int32", num_ctas),), "int32")  # tile counters
        T.device_entry()
        cta = T.cta_id([num_ctas])  # whole clusters: the runtime rounds the SM count down
        rank = T.cta_id_in_cluster([CS])
        clu = T.meta_var(cta // CS)
        num_clusters = T.meta_var(num_ctas // CS)
        # stream_k: the partial wave's tiles (with the wave before them when they are fewer than
        # half a wave; none if the waves are whole) go by K slices, [sk_first, sk_end) to this cluster
        dp_tiles, sk_tiles = T.meta_var(streamk.split(M_TILES * N_TILES, num_clusters))
        sk_first, sk_end = T.meta_var(streamk.cluster_range(clu, sk_tiles, num_clusters, K_TILES))
        wg_id = T.warpgroup_id([W + 1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, S)
        mma2tma = MBarrier(pool, S)
        ring = Ring(tma2mma, mma2tma, cluster_size=CS)  # the stages, their barriers and phases
        flag = pool.alloc((W,), "int32")  # per consumer: units of the tile counted before this one
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Esmem = pool.alloc((W * NBUF, ROWS, EPI_N), dtype, layout=E_layout)
        pool.commit()
        ring.init(releases=RELEASES)
        # make the barrier inits visible to the async proxy and to the peers before any TMA
        # completes or any peer arrives on them
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        rank_m = T.meta_var(rank % CM)
        rank_n = T.meta_var(rank // CM)
        sched = T.meta_var(Schedule(cfg=cfg, m_tiles=M_TILES, n_tiles=N_TILES, cluster_m=CM, cluster_n=CN,
                                    rank_m=rank_m, rank_n=rank_n, units_per_tile=SPLIT))
        loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring, cluster_m=CM,
                                    cluster_n=CN, rank_m=rank_m, rank_n=rank_n))

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=REGS.producer):
            if T.And(warp_id == 0, lane_id == 0):
                ts_load = sched.tiles("ts_load", num_clusters)
                ts_load.init(clu)
                load_it: T.int32 = 0
                # stream_k: computed once (as expressions, their selects and divisions by the
                # runtime cluster count would swamp the compiler wherever they are used)
                dp_load: T.int32 = dp_tiles
                first_load: T.int32 = sk_first
                end_load: T.int32 = sk_end
                while whole_tiles_left(ts_load, dp_load):
                    # column n * SPLIT + s of the scheduler's grid: split s of tile column n, K
                    # slices [k0, k0 + nk)
                    n_col, split = T.meta_var(splitk.unit(ts_load.n_idx, SPLIT))
                    k0, nk = T.meta_var(splitk.k_slices(split, SPLIT, K_TILES))
                    loads.load_tile(load_it, sched.m_start(ts_load.m_idx), sched.n_start(n_col),
                                    first_slice=k0, num_slices=nk)
                    load_it = load_it + nk
                    ts_load.next_tile()
                if SK:
                    for p in range(streamk.pieces(first_load, end_load, K_TILES)):
                        j, k0, nk = T.meta_var(streamk.piece(p, first_load, end_load, K_TILES))
                        ts_load.init(dp_load + j)  # the scheduler's place of stream-K tile j
                        loads.load_tile(load_it, sched.m_start(ts_load.m_idx),
                                        sched.n_start(ts_load.n_idx),
                                        first_slice=k0, num_slices=nk)
                        load_it = load_it + nk

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            c = T.meta_var(wg_id - 1)  # this consumer
            wtid = T.meta_var(warp_id * 32 + lane_id)
            wg_row0 = T.meta_var(c * ROWS)
            Dreg = T.alloc_local((ACC,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            mma = T.meta_var(Consumer(plan=plan, ring=ring, a_smem=Asmem, b_smem=Bsmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=wg_row0, lane_id=lane_id))
            epi = T.meta_var(ChunkedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid, warp_id=warp_id,
                                             lane_id=lane_id, packed=packed, chunk_cols=EPI_N, buffers=NBUF))
            parts = T.meta_var(splitk.Partials(slots=P, counters=C, acc=Dreg, acc_regs=ACC, thread=wtid, flag=flag,
                                               consumer=c))
            it: T.int32 = 0  # (unit, slice) pairs consumed by this CTA: never reset
            epi_it: T.int32 = 0  # output chunks this consumer stored: never reset
            ts = sched.tiles("ts", num_clusters)
            ts.init(clu)
            dp_mine: T.int32 = dp_tiles
            first_mine: T.int32 = sk_first
            end_mine: T.int32 = sk_end
            pc = T.alloc_local((3,), "int32")  # the piece: stream-K tile, first slice, count
            mt = T.alloc_local((2,), "int32")  # a split tile's: cluster of its slice 0, pieces
            sb = T.alloc_local((3,), "int32")  # and where its pieces' slots start (this thread's part)
            while whole_tiles_left(ts, dp_mine):
                n_col, split = T.meta_var(splitk.unit(ts.n_idx, SPLIT))
                _, nk = T.meta_var(splitk.k_slices(split, SPLIT, K_TILES))
                mma.run(it, nk)
                it = it + nk
                m_cta = T.meta_var(sched.cta_m(ts.m_idx))
                n_cta = T.meta_var(sched.cta_n(n_col))
                if SPLIT > 1:
                    counter = T.meta_var(splitk.counter_index(m_cta, n_cta, c, N_CTA_TILES, W))
                    parts.publish_unit(counter, split, SPLIT)
                    if parts.counted_before() == SPLIT - 1:  # the last unit of the tile: sum and store
                        parts.sum_units(counter, SPLIT)
                        epi.store_tile(Dreg, m_cta * BLK_M, n_cta * BLK_N, epi_it)
                        epi_it = epi_it + epi.chunks_per_tile
                else:
                    epi.store_tile(Dreg, m_cta * BLK_M, n_cta * BLK_N, epi_it)
                    epi_it = epi_it + epi.chunks_per_tile
                ts.next_tile()
            if SK:
                for p in range(streamk.pieces(first_mine, end_mine, K_TILES)):
                    j, k0, nk = T.meta_var(streamk.piece(p, first_mine, end_mine, K_TILES))
                    pc[0] = j
                    pc[1] = k0
                    pc[2] = nk
                    ts.init(dp_mine + pc[0])
                    mma.run(it, pc[2])
                    it = it + pc[2]
                    m_sk = T.meta_var(sched.cta_m(ts.m_idx))
                    n_sk = T.meta_var(sched.cta_n(ts.n_idx))
                    if pc[2] == K_TILES:  # a whole tile in this cluster's range
                        epi.store_tile(Dreg, m_sk * BLK_M, n_sk * BLK_N, epi_it)
                        epi_it = epi_it + epi.chunks_per_tile
                    else:
                        # the tile's 2 or 3 pieces are clusters g_h, g_h + 1, ... in K order; the
                        # counter is g_h's; a piece's slot is 1 if its range began before the tile
                        tile0 = T.meta_var(pc[0] * K_TILES)
                        sk_tiles_now = T.meta_var(M_TILES * N_TILES - dp_mine)
                        mt[0] = streamk.cluster_of(tile0, sk_tiles_now, num_clusters, K_TILES)  # g_h
                        mt[1] = streamk.cluster_of(tile0 + K_TILES - 1, sk_tiles_now, num_clusters,
                                                   K_TILES) - mt[0] + 1  # pieces
                        g_h = T.meta_var(mt[0])
                        head_first = T.meta_var(streamk.cluster_range(g_h, sk_tiles_now, num_clusters, K_TILES)[0])
                        cnt_i = T.meta_var(streamk.counter(g_h, rank, c, CS, W))
                        mine = T.meta_var(streamk.slot(clu, rank, c, T.Select(first_mine < tile0, 1, 0), CS, W))
                        streamk.meet_pieces(parts, cnt_i, mine, mt[1] - 1)
                        if parts.counted_before() == mt[1] - 1:  # the other pieces counted first: sum and store
                            sb[0] = streamk.slot_offset(streamk.slot(g_h, rank, c, T.Select(head_first < tile0, 1, 0),
                                                                     CS, W), 0, wtid, ACC)
                            sb[1] = streamk.slot_offset(streamk.slot(g_h + 1, rank, c, 0, CS, W), 0, wtid, ACC)
                            sb[2] = streamk.slot_offset(streamk.slot(g_h + 2, rank, c, 0, CS, W), 0, wtid, ACC)
                            streamk.sum_tile_pieces(parts, cnt_i, mt[1], clu - g_h, sb)
                            epi.store_tile(Dreg, m_sk * BLK_M, n_sk * BLK_N, epi_it)
                            epi_it = epi_it + epi.chunks_per_tile
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()
    # fmt: on

    return hgemm
