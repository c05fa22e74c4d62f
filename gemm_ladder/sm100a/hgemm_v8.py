"""hgemm_v8 (Blackwell): CTA pairs in clusters, one 2-CTA tcgen05.mma, A tiles multicast.

What changed from v7: two CTAs on neighbouring SMs (a CTA pair, cluster ranks 2p and 2p+1)
compute one 256 x blk_n tile with one ``tcgen05.mma.cta_group::2`` (M=256): each CTA holds
its 128 rows of A and half of the tile's B rows in its own shared memory, the tensor cores
of both SMs read both halves, and each CTA's TMEM receives its own 128 x blk_n accumulator.
Only the pair's leader (even rank) issues MMAs and commits; its commits arrive on barriers
of both CTAs (``cta_mask``). Per CTA a stage now holds 128 + blk_n/2 rows instead of
128 + blk_n: the same work moves a quarter less data into each SM at blk_n=256.

``cluster_n`` pairs (a cluster of 2 * cluster_n CTAs) take neighbouring N tiles of the same
256 rows: they need the same A rows, so CTA (pair p, rank-in-pair c) loads only part p of
its 128 A rows and TMA multicasts it (``cta_mask``) into CTA (q, c) of every pair q. Each A
row leaves L2 once per cluster instead of once per pair. The scheduler hands out cluster
tiles (256 x cluster_n*blk_n); all CTAs of a cluster walk the same list.

    cluster rank r = 2p + c; leader = 2p (c = 0); every CTA runs every role but the MMA

    role         warps            registers         job
    TMA          wg 1, warp 0     PRODUCER (dec)    per tile, per k: wait mma2tma[s] (phase^1);
                                                    A part p -> stage s of CTAs (q, c) for all q
                                                    (multicast), B half c -> own stage s; both
                                                    complete on the LEADER's tma2mma[s];
                                                    leader only: expect_tx(2 * stage bytes)
    MMA          wg 1, warp 1     PRODUCER (dec)    leader only: per tile wait epi2mma[a]
                                                    (phase^1); per k: wait tma2mma[s];
                                                    tcgen05.mma.cta_group::2 x4; commit ->
                                                    mma2tma[s] of every CTA of the cluster;
                                                    then commit -> mma2epi[a] of both CTAs
    epilogue     wg 0             EPILOGUE (inc)    as v7, own TMEM rows; arrives on the
                                                    LEADER's epi2mma[a] (remote arrive)

Barriers (who arrives / who waits / phase); S = pipe_depth, n = cluster_n:
            tma2mma[S]  count 1, leader's copy only: the leader arrives with expect_tx =
                        2 * stage bytes (both CTAs' A rows and B halves land on it: a
                        cta_group::2 TMA signals the barrier of the even CTA of each
                        destination's pair); the leader's MMA lane waits phase p.
            mma2tma[S]  count n, in every CTA: each pair leader's commit (multicast to the
                        whole cluster) arrives once, since every pair's TMA may write this
                        CTA's slot (A multicast); the TMA lane waits phase p^1.
            mma2epi[2]  count 1, in both CTAs of a pair: the leader's commit after a tile's
                        last MMA (multicast to the pair); each epilogue waits phase q.
            epi2mma[2]  count 2*128, leader's copy: all epilogue threads of both CTAs arrive
                        (remote arrive on the leader) after their last tcgen05.ld; the
                        leader's MMA lane waits phase q^1.
            named barrier 1: the epilogue warpgroup around the TMA store (per CTA).
            cluster barrier: after the barrier inits (remote signals must not come first)
                        and before TMEM is freed (no CTA leaves while others may signal it;
                        the TMA lane first waits for the last commits into its slots).

TMEM:      per CTA 2 accumulators x blk_n columns (<= 512); all 512 columns allocated with
           ``cta_group::2`` by warp 0 of each CTA of the pair.
Registers: as v7 (two warpgroups: producer 56, epilogue 232).

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M (TMA zero-fills and clips).
  - blk_m 128 per CTA (256 per pair); blk_n 64..256, a multiple of 64 (B half per CTA:
    blk_n/2 rows); cluster_n in 1, 2, 4 (a cluster of at most 8 CTAs, 128/cluster_n A rows
    per multicast); 2 <= pipe_depth with
    1 KiB + pipe_depth * (128 + blk_n/2) * 128 B + 128 * blk_n * 2 B <= 227 KiB;
    tile_order / l2_group_size valid on the grid of cluster tiles.
  - launched with ``num_ctas`` = the SM count rounded down to a multiple of the cluster
    (``launch.cluster``); one CTA per SM.

Run:  python -m gemm_ladder build v8 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

import math

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang.pipeline import PipelineState
from tvm.backend.cuda.lang.warp_role import WarpgroupRole, WarpRole

from schedulers import make_tirx_scheduler

from ..sync.classes import MBarrier, TCGen05Bar, TMABar
from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import CTA_PAIR, MMA_M, THREADS_PER_WG, TMEM_COLS, BlackwellPlan

TECHNIQUE = "CTA-pair clusters: one 2-CTA tcgen05.mma (cta_group=2), A tiles multicast across pairs"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": "grouped", "cluster_n": 2}
CLUSTER_N = (1, 2, 4)  # pairs per cluster: a cluster holds at most 8 CTAs portably
ACC_STAGES = 2  # accumulators in TMEM: the MMAs of one tile overlap the epilogue of the last
EPI_BAR = 1  # named barrier of the epilogue warpgroup (0 is __syncthreads)
EPI_WARPGROUPS = 1
PRODUCER_REGS, EPILOGUE_REGS = common.role_registers(EPI_WARPGROUPS)


def cluster_tiles(cfg: GemmConfig) -> tuple[int, int]:
    """The scheduler's grid: tiles of 256 rows (a pair) by cluster_n * blk_n columns."""
    n = cfg.knobs()["cluster_n"]
    return math.ceil(cfg.M / (CTA_PAIR * cfg.blk_m)), math.ceil(cfg.grid_mn[1] / n)


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    n = cfg.knobs()["cluster_n"]
    if n not in CLUSTER_N:
        raise ConfigError(f"cluster_n={n!r}: a cluster holds {CTA_PAIR} * cluster_n CTAs, at most 8; "
                          f"use cluster_n in {CLUSTER_N}")
    common.check_pipe_depth(cfg, cta_group=CTA_PAIR)
    if ACC_STAGES * cfg.blk_n > TMEM_COLS:
        raise ConfigError(f"blk_n={cfg.blk_n}: {ACC_STAGES} accumulators need "
                          f"{ACC_STAGES * cfg.blk_n} TMEM columns, over {TMEM_COLS}; use blk_n<=256")
    common.check_schedule(cfg, grid=cluster_tiles(cfg))
    check_budget(cfg, common.smem_bytes(cfg, cfg.pipe_depth, cta_group=CTA_PAIR))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, cfg.pipe_depth, grid=["num_ctas"],
                              threads=(1 + EPI_WARPGROUPS) * THREADS_PER_WG, persistent=True,
                              cluster=CTA_PAIR * cfg.knobs()["cluster_n"])


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg, cta_group=CTA_PAIR)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    B_ROWS = plan.b_rows  # rows of B per CTA: half the tile
    STAGES = cfg.pipe_depth
    PAIRS = cfg.knobs()["cluster_n"]
    CLUSTER = CTA_PAIR * PAIRS
    A_ROWS = BLK_M // PAIRS  # rows of A each CTA loads and multicasts
    GRID_M, GRID_N = cluster_tiles(cfg)
    A_layout, B_layout = plan.ab_layouts(STAGES)
    D_layout = plan.d_layout()
    PASS = common.reg_pass_cols(BLK_N)  # accumulator columns per TMEM -> register pass
    PASSES = BLK_N // PASS
    ALL_CTAS = (1 << CLUSTER) - 1  # cta_mask of every CTA of the cluster
    A_PEERS = sum(1 << (CTA_PAIR * q) for q in range(PAIRS))  # rank c of every pair, shifted by c

    def tile_scheduler(num_ctas):
        """Each role walks the cluster tiles with a scheduler of its own: no state is live
        across the register-budget boundary (ptxas spills what is)."""
        return make_tirx_scheduler(cfg.tile_order, "ts", num_m_tiles=GRID_M, num_n_tiles=GRID_N,
                                   num_clusters=num_ctas // CLUSTER, l2_group_size=cfg.l2_group_size)

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype),
              num_ctas: T.int32):
        T.device_entry()
        # (threads, 1): ptxas needs the register count at entry to honour setmaxnreg
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx = T.cta_id([num_ctas])
        rank = T.cta_id_in_cluster([CLUSTER])
        wg_id = T.warpgroup_id([1 + EPI_WARPGROUPS])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, STAGES)
        mma2tma = TCGen05Bar(pool, STAGES)
        mma2epi = TCGen05Bar(pool, ACC_STAGES)
        epi2mma = MBarrier(pool, ACC_STAGES)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=CTA_PAIR)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, B_ROWS, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(PAIRS)
        mma2epi.init(1)
        epi2mma.init(CTA_PAIR * THREADS_PER_WG)
        common.alloc_tmem_and_cluster_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, ACC_STAGES * BLK_N), "float32")

        tid = T.meta_var(warp_id * 32 + lane_id)  # thread index inside its warpgroup
        pair = T.meta_var(rank // CTA_PAIR)  # p: which N tile of the cluster tile
        half = T.meta_var(rank % CTA_PAIR)  # c: which 128 rows of the pair's 256
        leader = T.meta_var(pair * CTA_PAIR)  # the pair's even CTA: it issues the MMAs
        # setmaxnreg is warpgroup-wide (.sync.aligned): the budget goes on the warpgroup,
        # the jobs on its warps
        with WarpgroupRole(wg_id, EPI_WARPGROUPS, regs=PRODUCER_REGS):
            with WarpRole(warp_id, 0):  # TMA
                if T.cuda.elect_sync():
                    # the leader's barrier as this CTA addresses it (mapa into its shared memory)
                    tma2mma_leader = tma2mma.remote_view(leader)
                    ts = tile_scheduler(num_ctas)
                    ts.init(bx // CLUSTER)
                    tma_ps = PipelineState(STAGES, phase=0)
                    while ts.valid():
                        m_st = T.meta_var(ts.m_idx * (CTA_PAIR * BLK_M) + half * BLK_M)  # our rows
                        n_st = T.meta_var((ts.n_idx * PAIRS + pair) * BLK_N)  # the pair's columns
                        for k in range(cfg.k_tiles):
                            # free once every pair's MMAs read the slot (its A rows came from all)
                            mma2tma.wait(tma_ps.stage, tma_ps.phase ^ 1)
                            a_row = T.meta_var(pair * A_ROWS)
                            if PAIRS == 1:
                                Tx.copy_async(Asmem[tma_ps.stage, :, :],
                                              A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                                              dispatch="tma_auto", cta_group=CTA_PAIR,
                                              mbar=tma2mma_leader.ptr_to([tma_ps.stage]))
                            else:
                                # rows a_row.. of A, into the same rows of CTA (q, half) of every pair
                                Tx.copy_async(Asmem[tma_ps.stage, a_row:a_row + A_ROWS, :],
                                              A[m_st + a_row:m_st + a_row + A_ROWS,
                                                k * BLK_K:k * BLK_K + BLK_K],
                                              dispatch="tma_auto", cta_group=CTA_PAIR,
                                              cta_mask=A_PEERS << half,
                                              mbar=tma2mma_leader.ptr_to([tma_ps.stage]))
                            Tx.copy_async(Bsmem[tma_ps.stage, :, :],
                                          B[n_st + half * B_ROWS:n_st + half * B_ROWS + B_ROWS,
                                            k * BLK_K:k * BLK_K + BLK_K],
                                          dispatch="tma_auto", cta_group=CTA_PAIR,
                                          mbar=tma2mma_leader.ptr_to([tma_ps.stage]))
                            if half == 0:
                                # the pair's bytes: both CTAs' A rows and B halves
                                tma2mma.arrive(tma_ps.stage, tx_count=CTA_PAIR * plan.stage_bytes)
                            tma_ps.advance()
                        ts.next_tile()
                    # producer tail: every leader's last commits to this CTA's slots have
                    # arrived before the CTA may leave (the wait a next load would do)
                    for _s in T.unroll(STAGES):
                        mma2tma.wait(tma_ps.stage, tma_ps.phase ^ 1)
                        tma_ps.advance()
            with WarpRole(warp_id, 1):  # MMA: the leader issues for the pair
                if half == 0:
                    if T.cuda.elect_sync():
                        ts = tile_scheduler(num_ctas)
                        ts.init(bx // CLUSTER)
                        mma_ps = PipelineState(STAGES, phase=0)
                        acc_ps = PipelineState(ACC_STAGES, phase=0)
                        while ts.valid():
                            # both CTAs' epilogues must have drained this accumulator
                            epi2mma.wait(acc_ps.stage, acc_ps.phase ^ 1)
                            T.ptx["tcgen05.fence::after_thread_sync"]()
                            for k in range(cfg.k_tiles):
                                tma2mma.wait(mma_ps.stage, mma_ps.phase)
                                T.ptx["tcgen05.fence::after_thread_sync"]()
                                Tx.gemm_async(tmem[:, acc_ps.stage * BLK_N:acc_ps.stage * BLK_N + BLK_N],
                                              Asmem[mma_ps.stage, :, :], Bsmem[mma_ps.stage, :, :],
                                              accum=(k != 0), dispatch="tcgen05", cta_group=CTA_PAIR)
                                # frees the slot in every CTA whose TMA wrote into this pair
                                mma2tma.arrive(mma_ps.stage, cta_group=CTA_PAIR, cta_mask=ALL_CTAS)
                                mma_ps.advance()
                            # both CTAs' accumulators are final
                            mma2epi.arrive(acc_ps.stage, cta_group=CTA_PAIR, cta_mask=3 << leader)
                            acc_ps.advance()
                            ts.next_tile()
        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            ts = tile_scheduler(num_ctas)
            ts.init(bx // CLUSTER)
            epi_ps = PipelineState(ACC_STAGES, phase=0)
            Dreg = T.alloc_local((PASS,), "float32")
            while ts.valid():
                acc = T.meta_var(epi_ps.stage * BLK_N)
                mma2epi.wait(epi_ps.stage, epi_ps.phase)
                T.ptx["tcgen05.fence::after_thread_sync"]()
                for h in T.unroll(PASSES - 1):
                    common.tmem_to_regs(tmem[:, acc + h * PASS:acc + h * PASS + PASS], Dreg, PASS)
                    common.regs_to_smem(Dreg, Dsmem, tid, h * PASS, PASS)
                last = T.meta_var(BLK_N - PASS)
                common.tmem_to_regs(tmem[:, acc + last:acc + BLK_N], Dreg, PASS)
                # the whole row is read (wait::ld): the leader may refill this accumulator
                T.ptx["tcgen05.fence::before_thread_sync"]()
                epi2mma.arrive(epi_ps.stage, remote=leader)
                common.regs_to_smem(Dreg, Dsmem, tid, last, PASS)
                common.tma_store_tile(plan, D, Dsmem, ts.m_idx * (CTA_PAIR * BLK_M) + half * BLK_M,
                                      (ts.n_idx * PAIRS + pair) * BLK_N, tid, EPI_BAR)
                epi_ps.advance()
                ts.next_tile()
        common.free_tmem_cluster(tmem_pool)
    # fmt: on

    return hgemm
