"""hgemm_v8 (Hopper): thread-block clusters, operand tiles multicast by TMA.

What changed from v7: neighbouring output tiles read the same operand panels. Two CTAs on
tiles (m, n) and (m+1, n) both load B's tile n; in v7 each loaded it on its own, so every
B byte crossed from L2 to the SMs twice. v8 launches CTAs in clusters of ``cluster_m x
cluster_n`` (1x2, 2x1 or 2x2) that compute neighbouring tiles together. An operand tile
shared by the cluster is loaded in parts: each CTA's producer loads one part and multicasts
it (``Tx.copy_async(..., cta_mask=...)``) into the same stage of every CTA that needs it, so
L2 delivers each shared byte once per cluster. The scheduler hands out cluster tiles
(``schedulers.make_tirx_scheduler`` over the grid of clusters); CTA ``rank`` of a cluster
computes tile ``(m * cluster_m + rank_m, n * cluster_n + rank_n)``. A cluster hanging over
the edge of the grid still loads its parts: TMA zero-fills the rows past M or N and clips the
stores, so its peers get their data.

    2x1 cluster, stage s (B shared, A private):

      CTA 0:  A[m0] ------------------------------> Asmem[s] of CTA 0
              B[n] rows   0..127  --multicast-+---> Bsmem[s] rows   0..127 of CTA 0 and CTA 1
      CTA 1:  A[m0+1] ----------------------------> Asmem[s] of CTA 1
              B[n] rows 128..255  --multicast-+---> Bsmem[s] rows 128..255 of CTA 0 and CTA 1

What a stage's release now means: CTA 1's producer writes into CTA 0's copy of stage s, so
it may refill s only when the consumers of BOTH CTAs are done with it. Every consumer warp
therefore arrives on ``mma2tma[s]`` of every CTA of the cluster (``mbarrier.arrive`` on the
peer's barrier through ``mapa``), and ``mma2tma`` counts 4 x W x cluster-size arrivals a
phase. ``tma2mma[s]`` is unchanged: each CTA's producer expects the full stage's bytes, since
its own parts and its peers' all land in its shared memory and signal its barrier.

Two cluster-wide barriers (``barrier.cluster.arrive.release`` / ``wait.acquire``) fence the
kernel: after the mbarrier inits (a peer must not multicast onto, or arrive on, a barrier
that is not initialised yet) and before exit (a CTA's shared memory must outlive its peers'
last arrivals on it).

Roles and registers: as v7 (producer 40, consumers 232 with two consumer warpgroups).

Barriers (one mbarrier per stage and CTA, each with its own phase):

    ==========  ==========================================  =================================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  =================================
    tma2mma[s]  this CTA's producer (arrive.expect_tx of     every consumer thread of this
                the whole stage) + the bytes of this CTA's   CTA, (it / S) & 1
                parts and of its peers' multicast parts
    mma2tma[s]  lane 0 of every consumer warp of EVERY CTA   this CTA's producer before
                of the cluster (4 x W x cluster_m x          refill number it,
                cluster_n arrivals), after the wait_group    ((it / S) & 1) ^ 1
                that retired slice it
    ==========  ==========================================  =================================

The producers of a cluster walk the same (tile, slice) sequence (one scheduler, one cluster
index), so refill ``it`` of every CTA is the same K slice of the same cluster tile, and
the multicast parts a CTA waits for are the ones its peers load for the same ``it``.

Constraints:
  - those of v7;
  - cluster_m, cluster_n in {1, 2}; blk_m a multiple of 8 x cluster_n and blk_n of
    8 x cluster_m (a multicast part is whole 8-row swizzle atoms);
  - the grid is launch-time: ``num_ctas`` = the SM count rounded down to whole clusters, and no
    more clusters than the GPU runs at once, passed by the runtime (``runtime.persistent_grid``;
    ``launch["cluster"]`` in the manifest is the cluster size). An H100 SXM runs all 66 clusters
    of 2 but only 30 of 4: a 2x2 launch gets 120 CTAs, as the driver answers.

Run:  python -m gemm_ladder build v8 --shape 8192x8192x8192 --knob cluster_m=2 --out build/
"""

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

import schedulers
from ..sync.classes import MBarrier, TMABar
from ..core.config import GemmConfig
from . import common
from .common import HopperPlan
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring

TECHNIQUE = "thread-block clusters: operand tiles multicast by TMA to the CTAs that share them"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 3,
         "l2_group_size": 8, "tile_order": common.DEFAULT_TILE_ORDER,
         "cluster_m": 2, "cluster_n": 1}
TUNE_CHOICES = {"cluster_m": (1, 2), "cluster_n": (1, 2)}  # what the tuner tries for the new knobs


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    common.check_consumer_registers(cfg)
    common.check_cluster(cfg)
    common.check_schedule(cfg, grid=cluster_grid(cfg))


def cluster_grid(cfg: GemmConfig) -> tuple[int, int]:
    """The grid of cluster tiles the scheduler walks."""
    cm, cn = common.cluster_shape(cfg)
    m_tiles, n_tiles = cfg.grid_mn
    return -(-m_tiles // cm), -(-n_tiles // cn)


def launch(cfg: GemmConfig) -> dict:
    # as many whole clusters as the SMs hold (the runtime rounds num_ctas), a producer beside
    # the consumers
    cm, cn = common.cluster_shape(cfg)
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True, cluster=cm * cn)
    return {**info, "threads": info["threads"] + common.THREADS_PER_WG, "cluster_shape": [cm, cn]}


def kernel(cfg: GemmConfig):
    plan = HopperPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    CM, CN = common.cluster_shape(cfg)
    CS = CM * CN
    M_TILES, N_TILES = cluster_grid(cfg)  # in cluster tiles
    S = cfg.pipe_depth
    K_TILES = cfg.k_tiles
    W = cfg.num_warpgroups  # consumer warpgroups
    MMA_WARPS = 4 * W
    RELEASES = MMA_WARPS * CS  # every consumer warp of every CTA of the cluster
    REGS = common.role_registers(W)
    A_layout, B_layout = plan.ab_layouts(S)
    D_layout = plan.d_layout()

    def scheduler(prefix, num_clusters):
        return schedulers.make_tirx_scheduler(
            cfg.tile_order, prefix, num_m_tiles=M_TILES, num_n_tiles=N_TILES,
            num_clusters=num_clusters, l2_group_size=cfg.l2_group_size,
        )

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype),
              num_ctas: T.int32):
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
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((S, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((S, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        ring.init(releases=RELEASES)
        # make the barrier inits visible to the async proxy and to the peers before any TMA
        # completes or any peer arrives on them
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        rank_m = T.meta_var(rank % CM)
        rank_n = T.meta_var(rank // CM)
        loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring, cluster_m=CM,
                                    cluster_n=CN, rank_m=rank_m, rank_n=rank_n))

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=REGS.producer):
            if T.And(warp_id == 0, lane_id == 0):
                ts_load = scheduler("ts_load", num_clusters)
                ts_load.init(clu)
                load_it: T.int32 = 0
                while ts_load.valid():
                    # each stage refilled once its previous slice (one lap back) was released
                    loads.load_tile(load_it, (ts_load.m_idx * CM + rank_m) * BLK_M,
                                    (ts_load.n_idx * CN + rank_n) * BLK_N)
                    load_it = load_it + K_TILES
                    ts_load.next_tile()

        with common.ConsumerRole(wg_id, W, REGS.consumer):
            ctid = T.meta_var((wg_id - 1) * 128 + warp_id * 32 + lane_id)
            wg_row0 = T.meta_var((wg_id - 1) * plan.rows_per_wg)
            Dreg = T.alloc_local((plan.acc_regs,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            mma = T.meta_var(Consumer(plan=plan, ring=ring, a_smem=Asmem, b_smem=Bsmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=wg_row0, lane_id=lane_id))
            it: T.int32 = 0  # (tile, slice) pairs consumed by this CTA: never reset
            ts = scheduler("ts", num_clusters)
            ts.init(clu)
            while ts.valid():
                # the K loop, each slot released to the producer of every CTA of the cluster
                mma.run(it, K_TILES)
                it = it + K_TILES
                common.consumer_store_tile(D, Dsmem, Dreg, (ts.m_idx * CM + rank_m) * BLK_M,
                                           (ts.n_idx * CN + rank_n) * BLK_N, plan,
                                           ctid, wg_row0, warp_id, lane_id, packed)
                ts.next_tile()
            if ctid == 0:
                # Dsmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()
    # fmt: on

    return hgemm
