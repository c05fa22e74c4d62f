"""hgemm_v11 (Hopper): swap AB, the weights fill the MMA's rows when M is small.

What changed from v10: wgmma's A operand is always 64 rows, so a tile of D holds at least 64 rows
of M. When M is small (decoding: M from 1 to 64 tokens, B a weight matrix of many rows N) most
of those rows are padding: TMA zero-fills them at no DRAM cost, but the tensor cores multiply
them and the accumulators hold them (at M = 8, seven eighths of both), and the wgmma's N (the
tile's width in N) is capped at 256 per instruction. v11 computes the transposed tile instead,
D^T = B_tile . A_tile^T:

    v10: wgmma.m64n{blk_n}k16  A = A_tile (64-row atoms of M),  B = B_tile (blk_n rows of N)
    v11: wgmma.m64n{blk_m}k16  A = B_tile (64-row atoms of N),  B = A_tile (blk_m rows of M)

so N, large, fills the 64-row slot and M becomes wgmma's N, which may be as small as 8: blk_m is
a multiple of 8 from 8 to 256 (one module at blk_m=8 serves M = 1..8 with no padding beyond 8
rows). The loads (and their ``stream_b`` hints), the ring, the producer, the scheduler, the
clusters and split-K are v10's: only the operands swap in ``mma_k_tile(plan, Dreg, Bsmem, Asmem, ...)`` (``common.SwapPlan``)
and consumer ``c`` now owns ``blk_n / W`` rows of N (columns of D) and all ``blk_m`` rows of M.
The accumulators hold D^T, so the epilogue stores them transposed: ``stmatrix ... .trans``
writes each 8x8 block of the fragment as D's rows into the consumer's staging buffer
(``epilogue.acc_to_smem_stmatrix_trans``), which leaves by 64-column TMA stores.

    consumer c, unit (tile, s):  for k: wait tma2mma; wgmma(B rows of c, A); commit; ...  (v10)
                                 [split_k > 1: partials, count, the last one sums]       (v10)
                                 thread 0 of c: bulk wait_group.read(0)  (its buffer is free)
                                 bar.sync 1+c; stmatrix.trans D^T -> Esmem[c] (blk_m x blk_n/W)
                                 fence; bar.sync 1+c; thread 0 of c: TMA stores, commit

Roles and registers: v10's (a producer warpgroup, W = 1 or 2 consumers); a consumer holds
blk_m x blk_n / (128 W) accumulators (32 at blk_m = 64, blk_n = 128, W = 2).
Barriers: v10's. Workspace: v10's, slots of blk_m x blk_n fp32 partials.

When it pays: small M (up to about 64; up to 256 where N is large) with a large N: the kernel
is bound by reading B once, at the HBM's bandwidth, and split-K (v10) fills the SMs when
N / blk_n tiles are too few: at M <= 64, N = K = 4096 and blk_n = 128 there are 32 tiles for 132
SMs, so split_k = 4 gives 128 units (``schedulers.wave_model`` chooses). Deep rings (pipe_depth 6-8)
keep enough bytes in flight per SM; clusters buy little here (A, the shared operand, is small).

Constraints:
  - sm_90a; float16/bfloat16; K and N multiples of 8; blk_k = 64;
  - blk_m a multiple of 8 from 8 to 256 (wgmma's N); blk_n in {64, 128, 192, 256}, a multiple of
    64 x num_warpgroups (1 or 2 consumers, whole 64-row atoms of N each);
  - pipe_depth from 2 up to what shared memory allows beside the blk_m x blk_n staging;
  - clusters as v8 (a shared A tile splits into whole 8-row parts: blk_m a multiple of 8 x
    cluster_n); split_k, tile orders and dynamic_m as v10.

Run:  python -m gemm_ladder build v11 --shape 16x4096x4096 --knob blk_m=16 --knob split_k=4 --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common, epilogue, splitk
from .common import SwapPlan
from .epilogue import TransposedEpilogue
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring
from .schedule import Schedule

TECHNIQUE = "swap AB: N in the MMA's 64-row slot, small M as its N, the tile stored transposed"
KNOBS = {"blk_m": 64, "blk_n": 128, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 6,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER,
         "cluster_m": 1, "cluster_n": 1, "dynamic_m": False, "split_k": 4, "stream_b": False}
BLK_M_CHOICES = common.SWAP_BLK_M  # M is wgmma's N
CONSUMERS = (1, 2)
# what the tuner tries beyond the defaults (gemm_ladder.tune.space)
TUNE_CHOICES = {"blk_m": (8, 16, 32, 64), "blk_n": (64, 128, 256), "pipe_depth": (4, 6, 8),
                "split_k": (1, 2, 3, 4, 6, 8), "cluster_m": (1,), "cluster_n": (1,)}


def check(cfg: GemmConfig) -> None:
    common.check_swap_tile(cfg, CONSUMERS)
    common.check_pipe_depth(cfg)
    common.check_consumer_registers(cfg, SwapPlan(cfg))
    splitk.check_grid(cfg)


cluster_grid = splitk.cluster_grid
workspace = splitk.tile_workspace
launch = splitk.launch


def kernel(cfg: GemmConfig):
    plan = SwapPlan(cfg)
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
    ROWS = plan.rows_per_wg  # rows of N per consumer: its columns of D
    ACC = plan.acc_regs
    A_layout, B_layout = plan.ab_layouts(S)
    E_layout = epilogue.staging_layout(cfg, W, BLK_M, ROWS)
    WS = workspace(cfg)
    P_ELEMS = splitk.workspace_elems(WS, M, "float32")
    C_ELEMS = splitk.workspace_elems(WS, M, "int32")

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
        ring = Ring(tma2mma, mma2tma, cluster_size=CS)  # the stages, their barriers and phases
        flag = pool.alloc((W,), "int32")  # per consumer: units of the tile counted before this one
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Esmem = pool.alloc((W, BLK_M, ROWS), dtype, layout=E_layout)  # one D band per consumer
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
                while ts_load.valid():
                    # column n * SPLIT + s of the scheduler's grid: split s of tile column n, K
                    # slices [k0, k0 + nk)
                    n_col, split = T.meta_var(splitk.unit(ts_load.n_idx, SPLIT))
                    k0, nk = T.meta_var(splitk.k_slices(split, SPLIT, K_TILES))
                    loads.load_tile(load_it, sched.m_start(ts_load.m_idx), sched.n_start(n_col),
                                    first_slice=k0, num_slices=nk)
                    load_it = load_it + nk
                    ts_load.next_tile()

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            c = T.meta_var(wg_id - 1)  # this consumer
            wtid = T.meta_var(warp_id * 32 + lane_id)
            n_row0 = T.meta_var(c * ROWS)  # its rows of the B tile
            Dreg = T.alloc_local((ACC,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            # swapped: B's rows are wgmma's 64-row operand, A's rows its N
            mma = T.meta_var(Consumer(plan=plan, ring=ring, a_smem=Bsmem, b_smem=Asmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=n_row0, lane_id=lane_id))
            epi = T.meta_var(TransposedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid,
                                                warp_id=warp_id, lane_id=lane_id, packed=packed))
            parts = T.meta_var(splitk.Partials(slots=P, counters=C, acc=Dreg, acc_regs=ACC, thread=wtid, flag=flag,
                                               consumer=c))
            it: T.int32 = 0  # (unit, slice) pairs consumed by this CTA: never reset
            ts = sched.tiles("ts", num_clusters)
            ts.init(clu)
            while ts.valid():
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
                        epi.store_tile(Dreg, m_cta * BLK_M, n_cta * BLK_N)
                else:
                    epi.store_tile(Dreg, m_cta * BLK_M, n_cta * BLK_N)
                ts.next_tile()
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()
    # fmt: on

    return hgemm
