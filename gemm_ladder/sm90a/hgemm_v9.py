"""hgemm_v9 (Hopper): consumers that own their rows, epilogues that overlap the next tile.

What changed from v8: in v8 the consumer warpgroups finished a tile together. Both waited at
one named barrier for the previous store to leave the output tile, wrote their rows into it,
met again, and one thread stored the whole tile: a consumer that was done first idled until the
other caught up, and the next tile's first wgmma waited for the slowest warpgroup's epilogue.
v9 makes each consumer warpgroup a worker of its own. Consumer ``c`` owns rows
``[c * blk_m/W, (c+1) * blk_m/W)`` of every tile, and runs its epilogue alone:

  - its own named barrier (``bar.sync 1+c, 128``), so no warpgroup waits for another;
  - its rows leave in ``epi_n``-wide column chunks through two shared buffers of its own: while
    the TMA store of chunk j drains, the warpgroup already writes chunk j+1 into the other buffer
    (``stmatrix``), and only before a buffer is reused does its storing thread wait for the
    store that read it (``cp.async.bulk.wait_group.read(1)``);
  - when the last chunk is handed to TMA, the warpgroup goes straight to the next tile's first
    K slice, which the producer has long loaded: the store drains under the next mainloop.

Smaller staging also gives the ring room: a 128x256 tile with ``epi_n = 64`` stages 2 x 2 x
64 x 64 halves (32 KiB) where v8 staged the whole 64 KiB tile, so four stages fit beside it.
Up to three consumer warpgroups (``num_warpgroups``; 192-row tiles) where their registers allow.

    consumer c, tile t:   for k: wait tma2mma; wgmma; commit; wait_group(1); release (cluster)
                          wait_group(0); release the last slice
                          for each chunk j of epi_n columns (buffer b = chunk count % 2):
                            thread 0 of c: bulk wait_group.read(1)   (buffer b's old store left)
                            bar.sync 1+c; stmatrix rows of c, columns j -> Esmem[c, b]; fence
                            bar.sync 1+c; thread 0 of c: TMA store Esmem[c, b] -> D, commit
                          -> tile t+1, while the stores drain

Roles and registers:

    ==========  ===========================  ==========  ======================================
    warpgroup   role                         registers   why
    ==========  ===========================  ==========  ======================================
    0           producer (one thread issues  40 (W>1)    a scheduler, a slice counter, TMA
                the cluster's TMA parts)                 coordinates and multicast masks
    1..W        consumer c = warpgroup - 1:  232 (W=2)   blk_m/W x blk_n / 128 accumulators
                wgmma, its own epilogue      152 (W=3)   (128 at 128x256 / 2, 96 at 192x192 / 3),
                                             255 (W=1)   descriptors, stmatrix staging; with
                                                         epi_under, half as many again for the
                                                         last tile's 16-bit pairs (192 of 232)
    ==========  ===========================  ==========  ======================================

Barriers (one mbarrier per stage and CTA, as in v8; named barriers 1..W, one per consumer):

    ==========  ==========================================  =================================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  =================================
    tma2mma[s]  this CTA's producer (arrive.expect_tx of     every consumer thread of this
                the whole stage) + the bytes of this CTA's   CTA, (it / S) & 1
                parts and of its peers' multicast parts
    mma2tma[s]  lane 0 of every consumer warp of every CTA   this CTA's producer before
                of the cluster (4 x W x cluster size)        refill it, ((it / S) & 1) ^ 1
    bar 1+c     the 128 threads of consumer c, twice per     (named barrier, no phase)
                chunk
    mma2mma[c]  pingpong only: lane 0 of each warp of        every thread of consumer c before
                consumer c - 1 (mod W), its mainloop issued  its next tile, ((t - 1) / W) & 1
    ==========  ==========================================  =================================

(With ``pingpong`` mma2tma[s] counts the 4 warps of the tile's owner in each CTA of the cluster.)

The consumers stay in step through the ring alone: a stage is refilled only when every
consumer warp of the cluster released it, so a consumer that runs ahead into the next tile
can be at most ``pipe_depth`` slices ahead of the slowest.

One module for every M (``dynamic_m=True``): M becomes a runtime value of the kernel (a
symbolic ``M`` bound from A's shape by the host code; the TMA descriptors, encoded on the host
at every call, take it as their extent, so loads zero-fill and stores clip at the real M), and
the scheduler's number of M tiles is computed from it at run time. N and K stay fixed (they
are the weights). The knobs are validated and tuned at the shape's M; the manifest says
``launch["dynamic_m"]`` and the M range they were chosen for (``dynamic_m["tuned_for_m"]``).
Tile orders: grouped or snake (``schedulers.tirx_orders.RUNTIME_M_ORDERS``).

Ping-pong (``pingpong=True``, off by default): the consumers stop sharing tiles. Consumer ``c``
owns every W-th tile of its CTA whole (64x256 or 128x128: 128 accumulators a thread), and they
take turns: consumer ``c`` starts a tile's mainloop only when the consumer before it has issued
the last wgmma of its own (``mma2mma[c]``), so while one stages its epilogue the other keeps the
tensor cores busy. The ring is shared and in order; a consumer skips the slices of the others'
tiles (``it += K_TILES``) and releases only its own (``mma2tma`` counts 4 warps per CTA). The turn
is what keeps the parity waits honest: a consumer that ran ahead into its next tile would wait
on ring slots whose earlier phases it never saw.

It does not pay on an H100 (``benchmarks/results/2026-11-22_h100_v9_pingpong/``): in 2-CTA
clusters 0.79-0.91x cuBLAS at 4096^3, 0.91-0.99x at 8192^3 and 0.88-0.93x at 3072x8192x1536
(0.54-0.61x without a cluster), where the cooperative default measured 1.00, 1.02-1.03 and 1.01
in the same process. A whole tile per consumer halves the tile (64x256 or 128x128: what a
warpgroup's registers hold), and a half-size tile loads 1.5x the operand bytes per FLOP; 2x2
clusters, which would share them back, ran at 0.46-0.63x. (That was a launch of 33 clusters of
4 where an H100 runs 30 at once; on the 30 that fit, a 2x2 cluster of 128x256 tiles runs at
0.80-0.91x, as fast as 2x1 clusters on the same 120 SMs: ``2026-11-23_h100_cluster_grid``.) The
knob stays for study (tutorial 10); the tuner does not try it.

    consumer c, tile t (t % W == c):  [t > 0] wait mma2mma[c] (phase (t - 1) / W)
                                      for k: wait tma2mma; wgmma; commit; wait_group(1); release
                                      lane 0 of each warp: arrive mma2mma[(c + 1) % W]
                                      wait_group(0); release the last slice; epilogue (as above)
    consumer c, tile t (t % W != c):  it += K_TILES

Streaming B (``stream_b=True``, off by default): when few rows of A meet a large B (M up to
128: the weights stream past a handful of tokens), B is read once and A again by every CTA. The
loads then say so: B's TMA copies carry an L2 evict-first policy and A's evict-last, and both
tensor maps fetch 256 bytes per L2 miss (``producer.load_hints``). On an H100 it paid 1.6-6.3% at
18 of 20 shapes with M <= 128 and lost 1% at M = 512 (and 4% where two CTAs read one B tile
without multicast), so the front door's small-M rules set it and the others do not.

A narrow last wave (``tail_n``, 0 = off; ``sm90a/narrowtail.py`` draws the cut): the rows of
tiles the partial wave would run are cut again into ``tail_n``-wide tiles, enough of them that
every cluster runs one (``m64n{tail_n}k16``, the columns after the last ``epi_n`` chunk stored
from the registers), so the busiest cluster runs (waves - 1) x blk_n + tail_n columns instead of
waves x blk_n: 1000 against 1024 at 4096^3 (``tail_n=232``). The cut is computed at launch from
the cluster count, and none is made where it would not fit. On an H100 it paid at 8192^3 fp16
(1.5-5%) but not at 4096^3 (5% slower in 1x1 clusters, level in 2x1): a narrow tile took 1.1x a
whole one's time for 0.91 of its wgmma cycles (``benchmarks/results/2026-11-23_h100_narrow_tail/``).

The epilogue under the next tile (``epi_under=True``, off by default; the tuning database
turns it on at every benchmark shape, the front door's ``large`` rule wherever 128x256 tiles
outnumber the SMs: with one tile a CTA there is nothing to hide the stores under, and it
measured 1-4% slower). Above, a consumer's tensor cores idle from its last
slice's retirement until its last chunk's store is issued: about 3k of a 67k-cycle tile at
4096^3 on an H100. With ``epi_under`` the consumer only rounds the accumulators into 16-bit
pairs there (``epilogue.acc_to_pairs``: 64 registers a thread at 128x256 / 2, kept beside the
next tile's accumulators) and goes straight to the next tile; chunk j of the old tile leaves
from the pairs once the new tile's slice j is issued and slice j - 1 has retired, while slice j
runs (``mainloop.Consumer.issue_under``). The last tile stores after its loop as before. Same
barriers, same named-barrier use per chunk; only where the chunks sit moves:

    consumer c, tile t:   for k < chunks: wait tma2mma; wgmma; commit; wait_group(1); release
                                          [t > 0] chunk k of tile t-1 from the pairs (as above)
                          for the other k: as above
                          wait_group(0); release the last slice; accumulators -> pairs
    after the last tile:  its chunks from the pairs

On an H100 (``benchmarks/results/2026-11-23_h100_epi_under/``, modules and cuBLAS taking turns
in the same rounds) it is 1.7-2.1% faster at 4096^3 (1.019-1.027x cuBLAS), 1.1-2.2% at 8192^3,
1.2-1.4% at 6144^3 fp16 and 3.8-5.8% at 3072x8192x1536; ncu counts 4-5k fewer cycles on the
busiest SM at 4096^3. What it leaves: the wgmma pipe still drains and refills at every boundary
(ptxas serialises all wgmmas when a loop that reads accumulators carries pending wgmma groups
over its back edge, so the next tile's first slice cannot be issued under the last one's), and
192 of the 232 registers are taken.

Reading K backwards on every second tile of a CTA (``k_zigzag=True``, off by default): the
producer loads that tile's slices from the last to the first, so it starts on the K panels of A
and B the tile before ended with, still in L2 (the consumers add the slices in the order they
land). At 4096^3 on an H100 it cut DRAM reads by 12-33%
(``benchmarks/results/2026-11-23_h100_tile_boundary/``) and the time by 0-0.2%.

Constraints:
  - those of v8, with num_warpgroups (consumers) 1, 2 or 3 (blk_m a multiple of 64 x W; with
    pingpong, 2 or 3 consumers and blk_m a multiple of 64, a whole tile's accumulators in each);
  - epi_n a multiple of 64 that divides blk_n (epi_n = blk_n: one buffer per consumer, the
    whole row band at once);
  - pipe_depth up to what shared memory allows beside the staging buffers;
  - tail_n a multiple of 8 below blk_n, with a fixed M, the cooperative consumers and a grouped
    or snake tile order;
  - epi_under with the cooperative consumers, tail_n = 0 and room for the pairs (accumulators
    x 1.5 + 40 registers within the consumer's budget: not three consumers).

Run:  python -m gemm_ladder build v9 --shape 8192x8192x8192 --knob pipe_depth=4 --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common, epilogue, narrowtail
from .common import HopperPlan
from .epilogue import ChunkedEpilogue
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring
from .schedule import Schedule

TECHNIQUE = "consumers with their own rows and epilogues, stores draining under the next tile"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER,
         "cluster_m": 2, "cluster_n": 1, "epi_n": 64, "dynamic_m": False, "stream_b": False, "pingpong": False,
         "tail_n": 0, "epi_under": False, "k_zigzag": False}
CONSUMERS = (1, 2, 3)
TUNE_CHOICES = {"cluster_m": (1, 2), "cluster_n": (1, 2), "epi_n": (64, 128, 256), "epi_under": (False, True),
                "k_zigzag": (False, True),
                "num_warpgroups": CONSUMERS, "blk_m": (64, 128, 192, 256)}  # not pingpong: it measured slower


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg, CONSUMERS)
    epilogue.check_epilogue(cfg)
    common.check_epi_under(cfg)
    common.check_consumer_registers(cfg)
    common.check_pipe_depth(cfg)
    common.check_cluster(cfg)
    common.check_schedule(cfg, grid=cluster_grid(cfg))
    common.check_dynamic_m(cfg)
    narrowtail.check(cfg)


def cluster_grid(cfg: GemmConfig, M=None) -> tuple:
    """The grid of cluster tiles the scheduler walks (for ``M``, default cfg.M; a runtime M
    gives a runtime number of rows)."""
    cm, cn = common.cluster_shape(cfg)
    M = cfg.M if M is None else M
    return common.tiles_over(M, cfg.blk_m * cm), -(-cfg.grid_mn[1] // cn)


def launch(cfg: GemmConfig) -> dict:
    # as many whole clusters as the SMs hold (the runtime rounds num_ctas), a producer beside
    # the consumers
    cm, cn = common.cluster_shape(cfg)
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True, cluster=cm * cn)
    info = {**info, "threads": info["threads"] + common.THREADS_PER_WG, "cluster_shape": [cm, cn]}
    return common.dynamic_launch(cfg, info)


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = common.m_extent(cfg), cfg.N, cfg.K, cfg.dtype  # M: an int or runtime
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    CM, CN = common.cluster_shape(cfg)
    cluster_size = CM * CN
    M_TILES, N_TILES = cluster_grid(cfg, M)  # in cluster tiles
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    W = cfg.num_warpgroups  # consumer warpgroups
    pingpong = plan.pingpong  # consumers take whole tiles in turn instead of sharing each tile
    MMA_WARPS = 4 if pingpong else 4 * W  # the warps that read a stage: its tile's owner(s)
    RELEASES = MMA_WARPS * cluster_size  # those warps in every CTA of the cluster
    REGS = common.role_registers(W)
    EPI_N = dict(cfg.extra)["epi_n"]
    NBUF = 2 if EPI_N < BLK_N else 1  # staging buffers per consumer
    ROWS = plan.rows_per_wg
    A_layout, B_layout = plan.ab_layouts(S)
    E_layout = epilogue.staging_layout(cfg, W * NBUF, ROWS, EPI_N)
    tail_n = narrowtail.tail_n(cfg)  # the partial wave's tiles cut tail_n columns wide (0: not)
    NARROW_ON = tail_n > 0
    narrow_per_row = narrowtail.per_row(N, CN, tail_n) if tail_n else 0  # narrow cluster tiles a row
    NARROW = narrowtail.NarrowPlan(cfg, width=tail_n) if tail_n else None
    narrow_chunks, narrow_rest = divmod(tail_n, EPI_N)  # a narrow tile's staged chunks, the columns after
    UNDER = common.epi_under(cfg)  # a tile's chunks staged under the next tile's wgmmas
    ZIGZAG = bool(dict(cfg.extra)["k_zigzag"])  # every second tile of a CTA loads its K slices backwards

    def backwards(load_it):
        # k_zigzag: this CTA's odd tiles start on the K panels its even tiles ended on
        return (load_it // K_TILES) % 2 == 1 if ZIGZAG else False

    def cut_rows(num_clusters):
        return narrowtail.rows(M_TILES, N_TILES, narrow_per_row, num_clusters) if tail_n else 0

    # fmt: off
    @T.prim_func
    def hgemm(a: T.handle, b: T.handle, d: T.handle, num_ctas: T.int32):
        A = T.match_buffer(a, (M, K), dtype)
        B = T.match_buffer(b, (N, K), dtype)
        D = T.match_buffer(d, (M, N), dtype)
        T.device_entry()
        cta = T.cta_id([num_ctas])  # whole clusters: the runtime rounds the SM count down
        rank = T.cta_id_in_cluster([cluster_size])
        clu = T.meta_var(cta // cluster_size)
        num_clusters = T.meta_var(num_ctas // cluster_size)
        # tail_n: how many of the last rows of tiles are cut narrow, for this launch's clusters
        narrow_rows = T.meta_var(cut_rows(num_clusters))
        wg_id = T.warpgroup_id([W + 1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, S)
        mma2tma = MBarrier(pool, S)
        ring = Ring(tma2mma, mma2tma, cluster_size=cluster_size)  # the stages, their barriers and phases
        # pingpong: slot c is consumer c's turn, given by the consumer before it (none without)
        mma2mma = T.meta_var(MBarrier(pool, W) if pingpong else None)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Esmem = pool.alloc((W * NBUF, ROWS, EPI_N), dtype, layout=E_layout)
        pool.commit()
        ring.init(releases=RELEASES)
        if pingpong:
            mma2mma.init(4)  # lane 0 of each warp of the consumer before
        # make the barrier inits visible to the async proxy and to the peers before any TMA
        # completes or any peer arrives on them
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        rank_m = T.meta_var(rank % CM)
        rank_n = T.meta_var(rank // CM)
        sched = T.meta_var(Schedule(cfg=cfg, m_tiles=M_TILES, n_tiles=N_TILES, cluster_m=CM, cluster_n=CN,
                                    rank_m=rank_m, rank_n=rank_n))
        loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring, cluster_m=CM,
                                    cluster_n=CN, rank_m=rank_m, rank_n=rank_n))

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=REGS.producer):
            if T.And(warp_id == 0, lane_id == 0):
                cut_load: T.int32 = narrow_rows
                # tail_n: the whole tiles are those of the rows above the narrow ones
                ts_load = sched.tiles("ts_load", num_clusters, cut_load if NARROW_ON else 0)
                ts_load.init(clu)
                load_it: T.int32 = 0
                while ts_load.valid():
                    # each stage refilled once its previous slice (one lap back) was released
                    loads.load_tile(load_it, sched.m_start(ts_load.m_idx), sched.n_start(ts_load.n_idx),
                                    backwards=backwards(load_it))
                    load_it = load_it + K_TILES
                    ts_load.next_tile()
                if NARROW_ON:
                    # the narrow tiles this cluster's stride reaches past the whole ones: the same
                    # boxes (B's rows past the narrow tile are read and not used)
                    q_load: T.int32 = ts_load.linear_idx - (M_TILES - cut_load) * N_TILES
                    while q_load < cut_load * narrow_per_row:
                        nm, nn = T.meta_var(narrowtail.narrow_tile(q_load, M_TILES - cut_load, narrow_per_row))
                        loads.load_tile(load_it, sched.m_start(nm), sched.n_start(nn, tail_n))
                        load_it = load_it + K_TILES
                        q_load = q_load + num_clusters

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            c = T.meta_var(wg_id - 1)  # this consumer
            wtid = T.meta_var(warp_id * 32 + lane_id)
            wg_row0 = T.meta_var(0 if pingpong else c * ROWS)
            Dreg = T.alloc_local((plan.acc_regs,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            # epi_under: the last tile's output as 16-bit pairs, stored under the next tile
            Preg = T.alloc_local((plan.acc_regs // 2 if UNDER else 1,), "uint32")
            mma = T.meta_var(Consumer(plan=plan, ring=ring, a_smem=Asmem, b_smem=Bsmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=wg_row0, lane_id=lane_id))
            epi = T.meta_var(ChunkedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid, warp_id=warp_id,
                                             lane_id=lane_id, packed=packed, chunk_cols=EPI_N, buffers=NBUF))
            m_prev: T.int32 = 0
            n_prev: T.int32 = 0
            it: T.int32 = 0  # (tile, slice) pairs consumed by this CTA: never reset
            epi_it: T.int32 = 0  # output chunks this consumer stored: never reset
            turn: T.int32 = 0  # tiles of this CTA so far (pingpong: consumer turn % W takes the tile)
            cut: T.int32 = narrow_rows
            ts = sched.tiles("ts", num_clusters, cut if NARROW_ON else 0)
            ts.init(clu)
            while ts.valid():
                mine = T.meta_var(turn % W == c if pingpong else True)  # pingpong: every W-th tile is ours
                if mine:
                    if pingpong:
                        if turn > 0:
                            # the consumer before has seen every slice before ours land: our
                            # parity waits then name one phase (it cannot lap us, nor we it)
                            mma2mma.wait(c, ((turn - 1) // W) & 1)
                    if UNDER:
                        # the previous tile's chunks, one under each of this tile's first slices
                        mma.issue_under(it, K_TILES, epi, Preg, m_prev, n_prev, turn > 0, epi_it)
                        if turn > 0:
                            epi_it = epi_it + epi.chunks_per_tile
                        mma.retire(it, K_TILES)
                        epilogue.acc_to_pairs(plan, Dreg, Preg)  # the accumulators are free for the next tile
                        m_prev = sched.m_start(ts.m_idx)
                        n_prev = sched.n_start(ts.n_idx)
                    else:
                        mma.issue(it, K_TILES)
                        if pingpong:
                            if lane_id == 0:
                                mma2mma.arrive((c + 1) % W)  # our wgmmas are issued: the next consumer's turn
                        mma.retire(it, K_TILES)
                        epi.store_tile(Dreg, sched.m_start(ts.m_idx), sched.n_start(ts.n_idx), epi_it)
                        epi_it = epi_it + epi.chunks_per_tile
                    it = it + K_TILES
                else:
                    it = it + K_TILES  # another consumer's tile: its slices pass us by
                turn = turn + 1
                ts.next_tile()
            if NARROW_ON:
                q: T.int32 = ts.linear_idx - (M_TILES - cut) * N_TILES
                while q < cut * narrow_per_row:
                    nm, nn = T.meta_var(narrowtail.narrow_tile(q, M_TILES - cut, narrow_per_row))
                    # m64n{tail_n}k16 into the first tail_n / 2 accumulators of each atom
                    mma.with_plan(NARROW).issue(it, K_TILES)
                    mma.retire(it, K_TILES)
                    it = it + K_TILES
                    if narrow_chunks > 0:
                        epi.with_plan(NARROW).store_tile(Dreg, sched.m_start(nm), sched.n_start(nn, tail_n),
                                                         epi_it)
                        epi_it = epi_it + narrow_chunks
                    if narrow_rest > 0:
                        # the columns after the last whole chunk: from the registers, guarded
                        narrowtail.cols_to_global(NARROW, Dreg, D, sched.m_start(nm),
                                                  sched.n_start(nn, tail_n), wg_row0, narrow_chunks * EPI_N,
                                                  narrow_rest, warp_id, lane_id)
                    q = q + num_clusters
            if UNDER:
                if turn > 0:
                    epi.store_pairs(Preg, m_prev, n_prev, epi_it)
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()
    # fmt: on

    return hgemm
