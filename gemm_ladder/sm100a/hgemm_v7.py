"""hgemm_v7 (Blackwell): warp specialization, each role with its own register budget.

What changed from v6: v5 and v6 already gave TMA, the MMA and the epilogue their own warps
(on Blackwell one thread issues the MMA, so the split comes early); v7 makes them roles in
the full sense. Each role is a TVM ``WarpRole`` / ``WarpgroupRole`` with a register budget:
the producer warpgroup gives registers back (``setmaxnreg.dec``, SASS ``USETMAXREG.DEALLOC``)
and the epilogue warpgroup takes them (``setmaxnreg.inc``, ``USETMAXREG.TRY_ALLOC``). The
epilogue spends them: it pulls up to 128 accumulator columns of its row into registers with
back-to-back ``tcgen05.ld`` and a single ``wait::ld``, and hands the accumulator back to the
MMA warp as soon as the last columns are in registers, before converting and storing them
(v6 handed it back only after the whole tile was in shared memory). Loads and MMAs overlap
fully: TMA runs up to ``pipe_depth`` slices ahead, the MMA warp waits only for data and for a
drained accumulator, and the epilogue of tile i runs under the MMAs of tile i+1.

    role         warps             registers          job
    TMA          wg 1, warp 0      PRODUCER (dec)     per tile, per k: wait mma2tma[s] (phase^1);
                                                      TMA A,B -> stage s; expect_tx(tma2mma[s])
    MMA          wg 1, warp 1      PRODUCER (dec)     per tile: wait epi2mma[a] (phase^1);
                                                      per k: wait tma2mma[s]; tcgen05.mma x4;
                                                      commit -> mma2tma[s]; then commit -> mma2epi[a]
    (idle)       wg 1, warps 2-3   PRODUCER (dec)     setmaxnreg is warpgroup-wide: they give theirs
    epilogue     wg 0, warps 0-3   EPILOGUE (inc)     per tile: wait mma2epi[a]; tcgen05.ld -> Dreg;
                                                      arrive epi2mma[a]; Dreg -> Dsmem; TMA store

Barriers (as v6; who arrives / who waits / phase):
            tma2mma[S]  TMA lane arrives with expect_tx = stage bytes, TMA's bytes complete it;
                        the MMA lane waits phase p (p flips each lap of the ring).
            mma2tma[S]  tcgen05.commit after the slot's MMAs; the TMA lane waits phase p^1
                        (a fresh barrier counts as "previous phase done": the first lap passes).
            mma2epi[2]  tcgen05.commit after a tile's last MMA; the epilogue waits phase q.
            epi2mma[2]  128 epilogue threads arrive after their last tcgen05.ld of accumulator a
                        completed; the MMA lane waits phase q^1.
            named barrier 1: the epilogue warpgroup around the TMA store of Dsmem.

TMEM:      2 accumulators x blk_n columns (<= 512); all 512 columns are allocated (common.py).
Registers: ``__launch_bounds__(256, 1)`` gives ptxas the count at entry (min(232, 65536 / 256));
           the producer warpgroup drops to PRODUCER_REGS (56) and the epilogue rises to
           EPILOGUE_REGS (232), where it holds min(blk_n, 128) fp32 columns at once.
           ``common.role_registers`` keeps the two within the CTA's pool: a
           ``setmaxnreg.inc`` the pool cannot serve waits forever. Each role builds its own
           tile scheduler, so nothing is live across the budget boundary: ptxas spills what
           is (with one shared scheduler, as in v6, it spilled the scheduler state).
           With two warpgroups the pool would give every thread 232 anyway, so here the
           budgets mostly document the roles; they start to matter in v9, whose three
           warpgroups share the file (168 each at entry).

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - K and N multiples of 8 (16-byte TMA row strides); any M (TMA zero-fills and clips).
  - blk_m 128; blk_n 64..256, a multiple of 64; 2 <= pipe_depth within shared memory
    (1 KiB + pipe_depth * (128 + blk_n) * 128 B + 128 * blk_n * 2 B <= 227 KiB on B200);
    tile_order in schedulers.ORDERS with an l2_group_size the order accepts.
  - launched with ``num_ctas`` = the SM count (``launch.persistent``); one CTA per SM.

Run:  python -m gemm_ladder build v7 --shape 4096x4096x4096 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang.pipeline import PipelineState
from tvm.backend.cuda.lang.warp_role import WarpgroupRole, WarpRole

from schedulers import make_tirx_scheduler

from ..sync.classes import MBarrier, TCGen05Bar, TMABar
from ..core.budget import check_budget
from ..core.config import ConfigError, GemmConfig
from . import common
from .common import MMA_M, THREADS_PER_WG, TMEM_COLS, BlackwellPlan

TECHNIQUE = "warp specialization: TMA, MMA and epilogue roles with register budgets (setmaxnreg)"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "pipe_depth": 4,
         "l2_group_size": 8, "tile_order": "grouped"}
ACC_STAGES = 2  # accumulators in TMEM: the MMAs of one tile overlap the epilogue of the last
EPI_BAR = 1  # named barrier of the epilogue warpgroup (0 is __syncthreads)
EPI_WARPGROUPS = 1
PRODUCER_REGS, EPILOGUE_REGS = common.role_registers(EPI_WARPGROUPS)


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_pipe_depth(cfg)
    if ACC_STAGES * cfg.blk_n > TMEM_COLS:
        raise ConfigError(f"blk_n={cfg.blk_n}: {ACC_STAGES} accumulators need "
                          f"{ACC_STAGES * cfg.blk_n} TMEM columns, over {TMEM_COLS}; use blk_n<=256")
    common.check_schedule(cfg)
    check_budget(cfg, common.smem_bytes(cfg, cfg.pipe_depth))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, cfg.pipe_depth, grid=["num_ctas"],
                              threads=(1 + EPI_WARPGROUPS) * THREADS_PER_WG, persistent=True)


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    STAGES = cfg.pipe_depth
    GRID_M, GRID_N = cfg.grid_mn
    A_layout, B_layout = plan.ab_layouts(STAGES)
    D_layout = plan.d_layout()
    PASS = common.reg_pass_cols(BLK_N)  # accumulator columns per TMEM -> register pass
    PASSES = BLK_N // PASS

    def tile_scheduler(num_ctas):
        """Each role walks the tiles with a scheduler of its own: no state is live across the
        register-budget boundary (ptxas spills what is)."""
        return make_tirx_scheduler(cfg.tile_order, "ts", num_m_tiles=GRID_M, num_n_tiles=GRID_N,
                                   num_clusters=num_ctas, l2_group_size=cfg.l2_group_size)

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype),
              num_ctas: T.int32):
        T.device_entry()
        # (threads, 1): ptxas needs the register count at entry to honour setmaxnreg
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx = T.cta_id([num_ctas])
        wg_id = T.warpgroup_id([1 + EPI_WARPGROUPS])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, STAGES)
        mma2tma = TCGen05Bar(pool, STAGES)
        mma2epi = TCGen05Bar(pool, ACC_STAGES)
        epi2mma = MBarrier(pool, ACC_STAGES)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=1)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((STAGES, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((STAGES, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        tma2mma.init(1)
        mma2tma.init(1)
        mma2epi.init(1)
        epi2mma.init(THREADS_PER_WG)
        common.alloc_tmem_and_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, ACC_STAGES * BLK_N), "float32")

        tid = T.meta_var(warp_id * 32 + lane_id)  # thread index inside its warpgroup
        # setmaxnreg is warpgroup-wide (.sync.aligned): the budget goes on the warpgroup,
        # the jobs on its warps
        with WarpgroupRole(wg_id, EPI_WARPGROUPS, regs=PRODUCER_REGS):
            with WarpRole(warp_id, 0):  # TMA
                if T.cuda.elect_sync():
                    ts = tile_scheduler(num_ctas)
                    ts.init(bx)
                    tma_ps = PipelineState(STAGES, phase=0)
                    while ts.valid():
                        m_st = T.meta_var(ts.m_idx * BLK_M)
                        n_st = T.meta_var(ts.n_idx * BLK_N)
                        for k in range(cfg.k_tiles):
                            # the slot is free once the MMAs that read it last lap completed
                            mma2tma.wait(tma_ps.stage, tma_ps.phase ^ 1)
                            Tx.copy_async(Asmem[tma_ps.stage, :, :],
                                          A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                                          dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                            Tx.copy_async(Bsmem[tma_ps.stage, :, :],
                                          B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                                          dispatch="tma_auto", mbar=tma2mma.ptr_to([tma_ps.stage]))
                            tma2mma.arrive(tma_ps.stage, tx_count=plan.stage_bytes)
                            tma_ps.advance()
                        ts.next_tile()
            with WarpRole(warp_id, 1):  # MMA
                if T.cuda.elect_sync():
                    ts = tile_scheduler(num_ctas)
                    ts.init(bx)
                    mma_ps = PipelineState(STAGES, phase=0)
                    acc_ps = PipelineState(ACC_STAGES, phase=0)
                    while ts.valid():
                        # the epilogue must have drained this accumulator (first lap: free)
                        epi2mma.wait(acc_ps.stage, acc_ps.phase ^ 1)
                        T.ptx["tcgen05.fence::after_thread_sync"]()
                        for k in range(cfg.k_tiles):
                            tma2mma.wait(mma_ps.stage, mma_ps.phase)
                            T.ptx["tcgen05.fence::after_thread_sync"]()
                            Tx.gemm_async(tmem[:, acc_ps.stage * BLK_N:acc_ps.stage * BLK_N + BLK_N],
                                          Asmem[mma_ps.stage, :, :], Bsmem[mma_ps.stage, :, :],
                                          accum=(k != 0), dispatch="tcgen05", cta_group=1)
                            mma2tma.arrive(mma_ps.stage)  # tcgen05.commit: frees the slot
                            mma_ps.advance()
                        mma2epi.arrive(acc_ps.stage)  # the accumulator is final
                        acc_ps.advance()
                        ts.next_tile()
        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            ts = tile_scheduler(num_ctas)
            ts.init(bx)
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
                # the whole row is read (wait::ld): the MMA may refill this accumulator while
                # the registers go to shared memory
                T.ptx["tcgen05.fence::before_thread_sync"]()
                epi2mma.arrive(epi_ps.stage)
                common.regs_to_smem(Dreg, Dsmem, tid, last, PASS)
                common.tma_store_tile(plan, D, Dsmem, ts.m_idx * BLK_M, ts.n_idx * BLK_N, tid, EPI_BAR)
                epi_ps.advance()
                ts.next_tile()
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
