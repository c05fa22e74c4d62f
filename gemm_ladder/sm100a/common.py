"""What every Blackwell rung shares: the tile plan, TMEM, and the epilogues.

A rung file keeps only its own technique; the parts below are the same on every rung:

    tensor memory tmem[128, BN] fp32   the accumulator: row r of the tile is TMEM lane r,
                                       column c is TMEM column c (datapath "D", M=128)
    shared        Asmem[S, BM, 64]     128B-swizzled K-major tiles, one per pipeline stage
                  Bsmem[S, BN, 64]     (BN/2 rows from v8 on: a CTA pair shares one MMA)
                  Dsmem[BM, BN]        the output tile on its way to a TMA store (v4 on)

One thread issues ``Tx.gemm_async(..., dispatch="tcgen05")``: TVM lowers it to one
``tcgen05.mma.cta_group::1.kind::f16`` (SASS ``UTCHMMA``) per 16 of K, M=128, N=BN. The MMA
is asynchronous (from v8 on the pair's leader issues ``cta_group::2``, M=256 over two CTAs,
SASS ``UTCHMMA.2CTA``); ``tcgen05.commit`` (SASS ``UTCBAR``) arrives on an mbarrier once every MMA
that thread issued before it has finished, which is how the other threads learn that
``tmem`` (or a shared stage) is ready. The epilogue is a full warpgroup: warp ``w`` may only
read TMEM lanes ``32w .. 32w+31`` (``tcgen05.ld.32x32b``, SASS ``LDTM``), so thread ``t`` of
the warpgroup owns row ``t`` of the tile.

TMEM: TVM's ``T.TMEMPool`` addresses its buffers from column 0 (``allocated_addr`` is the
column offset, not the address ``tcgen05.alloc`` returned), which is right only when this
CTA holds all 512 columns. So every rung allocates all 512: a second CTA on the same SM
waits in ``tcgen05.alloc`` until the first deallocates.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import tcgen05_atom_layout

import layouts
from ..core import budget, launch
from ..core.config import ConfigError, GemmConfig

# what both archs share, under the names the rungs call it by (common.smem_bytes, ...)
from ..core.budget import MIN_PIPE_DEPTH, check_budget, check_pipe_depth, max_pipe_depth, smem_bytes  # noqa: F401
from ..core.config import DEFAULT_TILE_ORDER  # noqa: F401
from ..core.launch import check_schedule  # noqa: F401

MMA_M = 128  # rows of one tcgen05.mma with cta_group::1 (the full TMEM datapath)
MMA_K = 16  # K of one tcgen05.mma for 16-bit inputs
THREADS_PER_WG = 128
TMEM_COLS = 512  # see the module docstring: TVM's TMEMPool needs the whole TMEM
EPI_COLS = 32  # accumulator columns one tcgen05.ld.32x32b.x32 brings to registers


@dataclass(frozen=True)
class BlackwellPlan:
    """Python-side constants of a Blackwell kernel, derived once from the config."""

    cfg: GemmConfig
    cta_group: int = 1  # 2 from v8 on: each CTA of a pair holds half of the B tile

    @property
    def threads(self) -> int:
        return THREADS_PER_WG

    @property
    def b_rows(self) -> int:
        """Rows of B one CTA loads per stage: blk_n, or blk_n/2 when a CTA pair shares the MMA."""
        return self.cfg.blk_n // self.cta_group

    @property
    def stage_bytes(self) -> int:
        """Bytes TMA lands in one CTA's shared memory per ring stage (A tile + its share of B)."""
        return budget.stage_bytes(self.cfg, self.cta_group)

    @property
    def epi_chunks(self) -> int:
        return self.cfg.blk_n // EPI_COLS

    def ab_layouts(self, stages: int | None = None):
        """128B-swizzled K-major layouts of A and B; ``stages=None`` gives 2-D tiles."""
        c = self.cfg
        lead = () if stages is None else (stages,)
        return (
            layouts.shared_layout(c.dtype, (*lead, c.blk_m, c.blk_k), "128B"),
            layouts.shared_layout(c.dtype, (*lead, self.b_rows, c.blk_k), "128B"),
        )

    def d_layout(self):
        c = self.cfg
        return layouts.shared_layout(c.dtype, (c.blk_m, c.blk_n), "128B")

    def frag_layout(self):
        """Register image of one ``tcgen05.ld.32x32b.x32``: thread t holds row t, 32 columns."""
        return tcgen05_atom_layout("32x32b", (MMA_M, EPI_COLS), "float32")


def launch_info(cfg: GemmConfig, stages: int, grid=None, threads=THREADS_PER_WG,
                epilogue_tile: bool = True, persistent: bool = False, cluster: int = 1) -> dict:
    """Grid, threads and shared memory of a launch, for manifests and the info table.

    ``cluster`` (v8 on) is the number of CTAs per cluster: its CTA pairs share one MMA (half of
    B per CTA), and the runtime rounds the persistent grid down to a multiple of it.
    """
    smem = smem_bytes(cfg, stages, epilogue_tile, cta_group=2 if cluster > 1 else 1)
    return launch.launch_info(cfg, threads, smem, grid, persistent, cluster)


def check_tile(cfg: GemmConfig) -> None:
    """Rules of the Blackwell tile: one cta_group::1 tcgen05.mma of M=128 per 16 of K."""
    if cfg.arch != "sm_100a":
        raise ConfigError(f"gemm_ladder/sm100a rungs build for arch='sm_100a', not {cfg.arch!r}")
    if cfg.blk_m != MMA_M:
        raise ConfigError(
            f"blk_m={cfg.blk_m} is not supported on sm_100a: a cta_group::1 tcgen05.mma is "
            f"M=128 and its accumulator fills all 128 TMEM lanes; use blk_m=128"
        )
    if cfg.num_warpgroups != 1:
        raise ConfigError(
            f"num_warpgroups={cfg.num_warpgroups} means nothing on sm_100a (one thread issues the "
            "MMA, the accumulator lives in TMEM); leave it at 1"
        )
    if cfg.blk_n % 64 or not 64 <= cfg.blk_n <= 256:
        raise ConfigError(f"blk_n={cfg.blk_n} is not supported on sm_100a; use 64, 128, 192 or 256")


def check_exact_tile(cfg: GemmConfig, k_loop: bool) -> None:
    """v1/v2 compute one output tile with one CTA: the shape must be that tile."""
    want_k = "a multiple of 64" if k_loop else "64"
    ok_k = cfg.K % cfg.blk_k == 0 if k_loop else cfg.K == cfg.blk_k
    if cfg.M != cfg.blk_m or cfg.N != cfg.blk_n or not ok_k:
        raise ConfigError(
            f"{cfg.rung} computes a single {cfg.blk_m}x{cfg.blk_n} output tile with one CTA; "
            f"got M={cfg.M}, N={cfg.N}, K={cfg.K}. Use M={cfg.blk_m}, N={cfg.blk_n} (blk_n) and K "
            f"{want_k}, or v3 and later for other shapes"
        )


@T.inline
def alloc_tmem_and_sync(tmem_pool):
    """Allocate TMEM (warp 0), then make the barrier inits and the TMEM address visible.

    ``fence.mbarrier_init`` orders the inits before any async-proxy arrive (TMA, commit);
    the tcgen05 fence pair around the CTA barrier orders warp 0's ``tcgen05.alloc`` (it wrote
    the TMEM address to shared) before every later tcgen05 op of the other warps.
    """
    tmem_pool.commit()
    T.ptx.fence.mbarrier_init.release.cluster()
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cta_sync()
    T.ptx["tcgen05.fence::after_thread_sync"]()


@T.inline
def free_tmem(tmem_pool):
    """Every warp's TMEM reads must be done (fence + barrier) before warp 0 deallocates."""
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cta_sync()
    tmem_pool.dealloc()


@T.inline
def load_tile_sync(Ssmem, G, row0, k0, rows, tid, zeros):
    """All 128 threads copy G[row0:row0+rows, k0:k0+64] into a swizzled shared tile.

    16 bytes per thread per step; rows past the edge of G and K past its end read as zero
    (K is a multiple of 8, so a 16-byte chunk is either all inside or all outside).
    ``zeros`` is a local buffer of 8 zeros: a vector copy of it is one 16-byte store.
    """
    R = T.meta_var(G.shape[0])
    KK = T.meta_var(G.shape[1])
    for it in T.unroll(rows * 8 // THREADS_PER_WG):
        r = T.meta_var((it * THREADS_PER_WG + tid) // 8)
        ch = T.meta_var((it * THREADS_PER_WG + tid) % 8)
        if T.And(row0 + r < R, k0 + ch * 8 < KK):
            Tx.thread.copy(Ssmem[r, ch * 8:ch * 8 + 8], G[row0 + r, k0 + ch * 8:k0 + ch * 8 + 8])
        else:
            Tx.thread.copy(Ssmem[r, ch * 8:ch * 8 + 8], zeros[0:8])


@T.inline
def tmem_to_global(plan, tmem, Dreg, Dhalf, D, m_st, n_st, tid, guard):
    """TMEM -> registers -> global, 32 columns at a time; thread t writes row t.

    ``tcgen05.ld`` is asynchronous: ``tcgen05.wait::ld`` must come before the registers are
    read. Each thread then stores its 32 values as four 16-byte vectors. ``guard`` (v3 on)
    drops rows past D's edge and vectors past its last column (N is a multiple of 8, so a
    vector is all inside or all outside).
    """
    Dfrag = Dreg.view(MMA_M, EPI_COLS, layout=plan.frag_layout())
    for c in T.unroll(plan.epi_chunks):
        Tx.wg.copy_async(Dfrag[:, :], tmem[:, c * EPI_COLS:c * EPI_COLS + EPI_COLS])
        T.ptx["tcgen05.wait::ld.sync.aligned"]()
        for j in T.unroll(EPI_COLS):
            Dhalf[j] = T.cast(Dreg[j], D.dtype)
        for q in T.unroll(EPI_COLS // 8):
            col = T.meta_var(n_st + c * EPI_COLS + q * 8)
            if guard:
                if T.And(m_st + tid < D.shape[0], col < D.shape[1]):
                    Tx.thread.copy(D[m_st + tid, col:col + 8], Dhalf[q * 8:q * 8 + 8])
            else:
                Tx.thread.copy(D[m_st + tid, col:col + 8], Dhalf[q * 8:q * 8 + 8])


@T.inline
def tmem_to_smem(plan, tmem, Dreg, Dsmem, tid):
    """TMEM -> registers -> the swizzled output tile in shared memory; thread t fills row t."""
    Dfrag = Dreg.view(MMA_M, EPI_COLS, layout=plan.frag_layout())
    for c in T.unroll(plan.epi_chunks):
        Tx.wg.copy_async(Dfrag[:, :], tmem[:, c * EPI_COLS:c * EPI_COLS + EPI_COLS])
        T.ptx["tcgen05.wait::ld.sync.aligned"]()
        for j in T.unroll(EPI_COLS):
            Dsmem[tid, c * EPI_COLS + j] = T.cast(Dreg[j], Dsmem.dtype)


@T.inline
def tma_store_columns(plan, D, Dsmem, m_st, n_st, col0, ncols, tid, epi_bar):
    """Columns ``col0 .. col0+ncols`` of Dsmem -> D by one thread's TMA store (``ncols`` a
    multiple of 64); :func:`tma_store_tile` stores them all, a v9 epilogue consumer its share.

    The proxy fence makes the threads' generic-proxy stores to Dsmem visible to the async
    proxy (TMA); the barrier makes every thread's stores land before thread 0 issues the copy;
    ``wait_group 0`` keeps Dsmem alive until TMA has read it, and the second barrier holds
    every thread until then. ``epi_bar`` 0 syncs the CTA; otherwise it is the named barrier
    of the epilogue warpgroup (v6 on, where the other warps never reach the epilogue).
    """
    T.ptx.fence.proxy.async_.shared__cta()
    if epi_bar == 0:
        T.cuda.cta_sync()
    else:
        T.cuda.warpgroup_sync(epi_bar)
    if tid == 0:
        # one box per 64 columns (one 128-byte swizzle atom wide): D stays a plain (M, N)
        # tensor and N need not be a multiple of the tile
        for h in T.unroll(ncols // 64):
            c0 = T.meta_var(col0 + h * 64)
            Tx.copy_async(
                D[m_st:m_st + plan.cfg.blk_m, n_st + c0:n_st + c0 + 64],
                Dsmem[:, c0:c0 + 64], dispatch="tma_auto",
            )
        T.ptx.cp.async_.bulk.commit_group()
        T.ptx.cp.async_.bulk.wait_group(0)
    if epi_bar == 0:
        T.cuda.cta_sync()
    else:
        T.cuda.warpgroup_sync(epi_bar)


@T.inline
def tma_store_tile(plan, D, Dsmem, m_st, n_st, tid, epi_bar):
    """Shared -> global by one thread's TMA store; TMA clips rows and columns past D's edge."""
    tma_store_columns(plan, D, Dsmem, m_st, n_st, 0, plan.cfg.blk_n, tid, epi_bar)


# -- v7 on: warp roles with register budgets ------------------------------------------------
REG_FILE = 64 * 1024  # 32-bit registers of one SM; one CTA per SM from v6 on
PRODUCER_REGS = 56  # TMA and MMA warps: addresses, their own scheduler, PipelineStates (ptxas
# fits them in 40 when no state is live across the setmaxnreg boundary, see hgemm_v7)
EPILOGUE_REGS_MAX = 232  # leaves room under the 255-register limit of a thread
EPI_REG_COLS = 128  # accumulator columns an epilogue thread holds at once (128 fp32 registers)


def entry_registers(warpgroups: int) -> int:
    """Registers per thread at launch when ``warpgroups`` warpgroups share the file (one CTA
    per SM, ``__launch_bounds__(threads, 1)``): what the producer gives back and the epilogue
    takes is moved inside this pool (``setmaxnreg`` draws on the CTA's own pool)."""
    return min(EPILOGUE_REGS_MAX, REG_FILE // (warpgroups * THREADS_PER_WG) // 8 * 8)


def role_registers(epilogue_warpgroups: int) -> tuple[int, int]:
    """``(producer, epilogue)`` setmaxnreg budgets of one producer warpgroup and
    ``epilogue_warpgroups`` epilogue warpgroups: the producer keeps PRODUCER_REGS, the epilogue
    warpgroups share what is left of the pool (a multiple of 8, at most EPILOGUE_REGS_MAX).

    ``setmaxnreg.inc`` waits until the pool holds the registers it asks for, so budgets whose
    sum exceeds the pool would hang the kernel: this is the one place they are computed.
    """
    wgs = 1 + epilogue_warpgroups
    pool = entry_registers(wgs) * wgs
    epilogue = min(EPILOGUE_REGS_MAX, (pool - PRODUCER_REGS) // epilogue_warpgroups // 8 * 8)
    return PRODUCER_REGS, epilogue


def reg_pass_cols(ncols: int) -> int:
    """Columns per TMEM -> register pass: the largest power of two <= EPI_REG_COLS that divides
    ``ncols`` (tcgen05.ld.32x32b takes .x1 .. .x128, powers of two)."""
    w = EPI_REG_COLS
    while ncols % w:
        w //= 2
    return w


@T.inline
def tmem_to_regs(tmem, Dreg, ncols):
    """tcgen05.ld ``ncols`` accumulator columns of thread t's row (TMEM lane t) into Dreg,
    all issued before one ``tcgen05.wait::ld``: the loads overlap instead of taking turns."""
    Dfrag = Dreg.view(MMA_M, ncols, layout=tcgen05_atom_layout("32x32b", (MMA_M, ncols), "float32"))
    Tx.wg.copy_async(Dfrag[:, :], tmem[:, 0:ncols])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()


@T.inline
def regs_to_smem(Dreg, Dsmem, tid, col0, ncols):
    """fp32 registers -> the swizzled output tile: thread t writes row t, columns col0.."""
    for j in T.unroll(ncols):
        Dsmem[tid, col0 + j] = T.cast(Dreg[j], Dsmem.dtype)


# -- v8 on: a CTA pair (cluster) shares one tcgen05.mma -------------------------------------
CTA_PAIR = 2  # CTAs of one cta_group::2 MMA


@T.inline
def alloc_tmem_and_cluster_sync(tmem_pool):
    """:func:`alloc_tmem_and_sync` for a cluster: the barrier is cluster-wide, because the other
    CTAs' TMA, multicast commits and remote arrives land on this CTA's barriers and must not
    come before their init."""
    tmem_pool.commit()
    T.ptx.fence.mbarrier_init.release.cluster()
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cluster_sync()
    T.ptx["tcgen05.fence::after_thread_sync"]()


@T.inline
def free_tmem_cluster(tmem_pool):
    """The pair deallocates together (cta_group::2), and no CTA leaves while another may still
    signal its barriers or read its shared memory: a cluster barrier first."""
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cluster_sync()
    tmem_pool.dealloc()
