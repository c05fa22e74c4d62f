"""hgemm_v9 (Blackwell): several epilogue consumers drain each accumulator in parallel.

What changed from v8: the epilogue is ``epi_consumers`` warpgroups instead of one. TMEM
still holds two accumulators, so the epilogue of tile i runs under the MMAs of tile i+1;
what v9 changes is how long it takes. Consumer c reads columns c*blk_n/e .. (c+1)*blk_n/e of
the accumulator (all 128 lanes: a warpgroup's warp w reads lanes 32w..32w+31, whichever
warpgroup it is), converts them and stores them with its own TMA store, synchronised on its
own named barrier; the consumers of both CTAs of the pair arrive on the leader's epi2mma
before the accumulator is refilled. At blk_n=256 one consumer's 128 columns fit in
registers in one pass (v8's single epilogue needed two), and the TMEM reads, conversions,
shared-memory writes and TMA stores of the two halves overlap, so an accumulator is
returned to the MMA in about half the time, and short-K tiles (where the epilogue is as
long as the mainloop) no longer wait for it.

    warpgroups: 0 .. e-1 epilogue consumers, e producer (TMA warp 0, MMA warp 1); e = epi_consumers

    role          warps              registers            job
    TMA           wg e, warp 0       PRODUCER (dec)       as v8
    MMA           wg e, warp 1       PRODUCER (dec)       as v8 (leader only)
    consumer c    wg c, warps 0-3    EPILOGUE (inc)       per tile: wait mma2epi[a]; tcgen05.ld
                                                          its columns -> Dreg; arrive epi2mma[a]
                                                          (leader's copy); Dreg -> its columns
                                                          of Dsmem; named barrier 1+c; TMA store

Barriers (who arrives / who waits / phase); S = pipe_depth, n = cluster_n, e = epi_consumers:
            tma2mma[S]  count 1, leader's copy: expect_tx = 2 * stage bytes (as v8).
            mma2tma[S]  count n: one multicast commit per pair leader (as v8).
            mma2epi[2]  count 1: the leader's commit, multicast to the pair; every consumer of
                        both CTAs waits phase q.
            epi2mma[2]  count 2*e*128, leader's copy: every thread of every consumer of both
                        CTAs arrives once per tile; the leader's MMA lane waits phase q^1.
            named barriers 1..e: consumer c around its TMA store.
            cluster barrier: after the inits and before TMEM is freed (as v8).

TMEM:      per CTA 2 accumulators x blk_n columns (<= 512), cta_group::2, all 512 allocated.
Registers: 1 + e warpgroups share the file: ptxas starts every thread at
           min(232, 65536 / (128 * (1 + e))) (168 for e = 2); the producer drops to 56 and the
           consumers share the rest: 224 each for e = 2 (``common.role_registers``), enough
           for a 128-column pass (v9 at blk_n=256 holds one consumer's 128 columns at once).

Constraints:
  - as v8 (arch sm_100a, fp16/bf16, K and N multiples of 8, blk_m 128 per CTA, blk_n 64..256,
    cluster_n in 1, 2, 4, pipe_depth within 227 KiB with the same shared-memory formula:
    the consumers share one output tile).
  - epi_consumers 1 or 2, and blk_n a multiple of 64 * epi_consumers (each consumer stores
    whole 64-column TMA boxes).
  - launched with ``num_ctas`` = the SM count rounded down to whole clusters.

Run:  python -m gemm_ladder build v9 --shape 4096x4096x4096 --arch sm_100a --out build/
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

TECHNIQUE = "several epilogue consumers: warpgroups that drain an accumulator's columns in parallel"
KNOBS = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": "grouped", "cluster_n": 2, "epi_consumers": 2}
CLUSTER_N = (1, 2, 4)  # pairs per cluster: a cluster holds at most 8 CTAs portably
ACC_STAGES = 2  # accumulators in TMEM: the MMAs of one tile overlap the epilogue of the last
EPI_BAR = 1  # named barrier of epilogue consumer 0; consumer c syncs on EPI_BAR + c
EPI_CONSUMERS = (1, 2)  # epilogue warpgroups; a third would leave each 150 registers


def cluster_tiles(cfg: GemmConfig) -> tuple[int, int]:
    """The scheduler's grid: tiles of 256 rows (a pair) by cluster_n * blk_n columns."""
    n = cfg.knobs()["cluster_n"]
    return math.ceil(cfg.M / (CTA_PAIR * cfg.blk_m)), math.ceil(cfg.grid_mn[1] / n)


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    e = cfg.knobs()["epi_consumers"]
    if e not in EPI_CONSUMERS:
        raise ConfigError(f"epi_consumers={e!r}: use {' or '.join(map(str, EPI_CONSUMERS))} epilogue "
                          f"warpgroups (each needs ~200 registers for its columns)")
    if cfg.blk_n % (64 * e):
        raise ConfigError(f"blk_n={cfg.blk_n} with epi_consumers={e}: each consumer stores whole "
                          f"64-column TMA boxes, so blk_n must be a multiple of {64 * e}; use "
                          f"epi_consumers=1 or blk_n={max(64 * e, cfg.blk_n // (64 * e) * 64 * e)}")
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
                              threads=(1 + cfg.knobs()["epi_consumers"]) * THREADS_PER_WG, persistent=True,
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
    CONSUMERS = cfg.knobs()["epi_consumers"]
    COLS = BLK_N // CONSUMERS  # accumulator columns of one consumer
    PASS = common.reg_pass_cols(COLS)  # accumulator columns per TMEM -> register pass
    PASSES = COLS // PASS
    PRODUCER_REGS, EPILOGUE_REGS = common.role_registers(CONSUMERS)
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
        wg_id = T.warpgroup_id([1 + CONSUMERS])
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
        epi2mma.init(CTA_PAIR * CONSUMERS * THREADS_PER_WG)
        common.alloc_tmem_and_cluster_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, ACC_STAGES * BLK_N), "float32")

        tid = T.meta_var(warp_id * 32 + lane_id)  # thread index inside its warpgroup
        pair = T.meta_var(rank // CTA_PAIR)  # p: which N tile of the cluster tile
        half = T.meta_var(rank % CTA_PAIR)  # c: which 128 rows of the pair's 256
        leader = T.meta_var(pair * CTA_PAIR)  # the pair's even CTA: it issues the MMAs
        # setmaxnreg is warpgroup-wide (.sync.aligned): the budget goes on the warpgroup,
        # the jobs on its warps
        with WarpgroupRole(wg_id, CONSUMERS, regs=PRODUCER_REGS):
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
        for c in T.unroll(CONSUMERS):  # consumer c: warpgroup c, columns c*COLS..(c+1)*COLS
            with WarpgroupRole(wg_id, c, regs=EPILOGUE_REGS, increase=True):
                ts = tile_scheduler(num_ctas)
                ts.init(bx // CLUSTER)
                epi_ps = PipelineState(ACC_STAGES, phase=0)
                Dreg = T.alloc_local((PASS,), "float32")
                while ts.valid():
                    acc = T.meta_var(epi_ps.stage * BLK_N + c * COLS)
                    mma2epi.wait(epi_ps.stage, epi_ps.phase)
                    T.ptx["tcgen05.fence::after_thread_sync"]()
                    for h in T.unroll(PASSES - 1):
                        common.tmem_to_regs(tmem[:, acc + h * PASS:acc + h * PASS + PASS], Dreg, PASS)
                        common.regs_to_smem(Dreg, Dsmem, tid, c * COLS + h * PASS, PASS)
                    last = T.meta_var(COLS - PASS)
                    common.tmem_to_regs(tmem[:, acc + last:acc + COLS], Dreg, PASS)
                    # this consumer's columns are read (wait::ld): the leader may refill the
                    # accumulator once every consumer of both CTAs has arrived
                    T.ptx["tcgen05.fence::before_thread_sync"]()
                    epi2mma.arrive(epi_ps.stage, remote=leader)
                    common.regs_to_smem(Dreg, Dsmem, tid, c * COLS + last, PASS)
                    common.tma_store_columns(plan, D, Dsmem, ts.m_idx * (CTA_PAIR * BLK_M) + half * BLK_M,
                                             (ts.n_idx * PAIRS + pair) * BLK_N, c * COLS, COLS, tid,
                                             EPI_BAR + c)
                    epi_ps.advance()
                    ts.next_tile()
        common.free_tmem_cluster(tmem_pool)
    # fmt: on

    return hgemm
