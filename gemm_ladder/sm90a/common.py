"""What every Hopper rung shares: the tile plan, the wgmma issue, the teaching rungs' loads and
epilogues, the roles and their registers, clusters, a runtime M and swap AB's plan.

The parts of the warp-specialized kernels (v8-v11) live beside it, one job each: ``ring`` (the
stages, their full/empty barriers and phases), ``producer`` (TMA loads, multicast, L2 hints),
``mainloop`` (the consumers' wgmma K loop) and ``epilogue`` (accumulators -> shared -> TMA
stores, chunked or transposed); ``gemm`` is the production kernel built from them, of which v9,
v10 and v11 are presets.

A rung file keeps only its own technique; the parts below are the same on every rung:

    registers     Dreg[acc_regs]    fp32 accumulators, the m64nNk16 fragment layout
    shared        Asmem[S, BM, 64]  128B-swizzled K-major tiles, one per pipeline stage
                  Bsmem[S, BN, 64]
                  Dsmem[BM, BN]     the output tile on its way to a TMA store

Warpgroup ``g`` of ``num_warpgroups`` owns rows ``[g*BM/W, (g+1)*BM/W)`` of the output tile
and issues one ``wgmma.m64nBNk16`` per 64 of those rows and per 16 of K.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

import layouts
from schedulers.tirx_orders import RUNTIME_M_ORDERS
from ..core import budget, launch
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of, torch_name

# what both archs share, under the names the rungs call it by (common.smem_bytes, ...)
from ..core.budget import MIN_PIPE_DEPTH, check_budget, check_pipe_depth, max_pipe_depth, smem_bytes  # noqa: F401
from ..core.config import DEFAULT_TILE_ORDER  # noqa: F401
from ..core.launch import check_schedule  # noqa: F401

WG_M = 64  # rows of one wgmma
MMA_K = 16  # K of one wgmma for 16-bit inputs
FP8_PTX = {"float8_e4m3": "e4m3", "float8_e5m2": "e5m2"}  # wgmma's names of the fp8 operand types
THREADS_PER_WG = 128


@dataclass(frozen=True)
class HopperPlan:
    """Python-side constants of a Hopper kernel, derived once from the config."""

    cfg: GemmConfig

    @property
    def rows_per_wg(self) -> int:
        return self.cfg.blk_m // self.cfg.num_warpgroups

    @property
    def m_atoms(self) -> int:  # wgmma rows per warpgroup
        return self.rows_per_wg // WG_M

    @property
    def n_regs(self) -> int:  # accumulator registers of one m64nN wgmma
        return self.cfg.blk_n // 2

    @property
    def acc_stride(self) -> int:  # registers between two 64-row atoms' accumulators
        return self.n_regs

    @property
    def n_cols(self) -> int:  # columns of the tile the wgmmas cover
        return self.cfg.blk_n

    @property
    def acc_regs(self) -> int:
        return self.m_atoms * self.n_regs

    @property
    def threads(self) -> int:
        return THREADS_PER_WG * self.cfg.num_warpgroups

    @property
    def stage_bytes(self) -> int:
        return budget.stage_bytes(self.cfg)

    @property
    def narrow_desc(self) -> bool:
        """Whether the K loop moves its wgmma descriptors by 32-bit adds on their low words
        (:func:`desc_plus`) rather than 64-bit sums: fp8's. Where nvcc keeps the descriptors in
        vector registers (the 64-row fp8 tiles) a 64-bit sum carries into and copies the high word for
        every wgmma; 1-3% faster there (``benchmarks/results/2026-11-28_h200_fp8_unroll/``). A 16-bit
        K loop keeps the 64-bit sums: its descriptors sit in uniform registers, where one 64-bit add
        does it, and the 32-bit form measured 1.5% slower at 512x4096x4096 bf16."""
        return spec_of(self.cfg).is_fp8

    @property
    def a_dtype(self) -> str:
        """A's element type as TVM names it: D's for a 16-bit GEMM, ``float8_e4m3fn`` for fp8."""
        return torch_name(spec_of(self.cfg).a) if spec_of(self.cfg).is_fp8 else self.cfg.dtype

    @property
    def b_dtype(self) -> str:
        return torch_name(spec_of(self.cfg).b) if spec_of(self.cfg).is_fp8 else self.cfg.dtype

    @property
    def mma_k(self) -> int:
        """K of one wgmma: 32 bytes of K, k16 for 16-bit operands, k32 for fp8."""
        return 32 // layouts.dtype_bytes(self.a_dtype)

    @property
    def mma_op(self) -> str:
        if spec_of(self.cfg).is_fp8:
            ta, tb = (FP8_PTX[spec_of(self.cfg).a], FP8_PTX[spec_of(self.cfg).b])
        else:
            ta = tb = {"float16": "f16", "bfloat16": "bf16"}[self.cfg.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.n_cols}k{self.mma_k}.f32.{ta}.{tb}"

    @property
    def mma_imms(self) -> tuple:
        """wgmma's immediates after scale-d: scale-a, scale-b and, for 16-bit operands, the
        transposes (1: MN-major); fp8 wgmma has no transpose, it reads K-major only."""
        return (1, 1) if spec_of(self.cfg).is_fp8 else (1, 1, self.desc_a.trans, self.desc_b.trans)

    @property
    def desc(self) -> layouts.WgmmaDesc:
        return layouts.wgmma_desc_fields(self.a_dtype, (WG_M, self.cfg.blk_k), "128B")

    @property
    def a_major(self) -> str:
        """How A's shared tile is stored: "K" (``[rows, blk_k]``, from A ``[M, K]``) or "MN"
        (``[blk_k, rows]``, from A ``[K, M]``: the operand spec's ``a_major="M"``)."""
        return "K" if spec_of(self.cfg).a_major == "K" else "MN"

    @property
    def b_major(self) -> str:
        """How B's shared tile is stored: "K" (from B ``[N, K]``) or "MN" (from B ``[K, N]``)."""
        return "K" if spec_of(self.cfg).b_major == "K" else "MN"

    def tile_shape(self, rows: int, major: str, stages: int | None = None) -> tuple:
        """A shared operand tile of ``rows`` M or N rows and one K slice: ``[rows, blk_k]``
        K-major, ``[blk_k, rows]`` MN-major (the orientation of the TMA box from global)."""
        two_d = (rows, self.cfg.blk_k) if major == "K" else (self.cfg.blk_k, rows)
        return two_d if stages is None else (stages, *two_d)

    def a_shape(self, stages: int) -> tuple:
        return self.tile_shape(self.cfg.blk_m, self.a_major, stages)

    def b_shape(self, stages: int) -> tuple:
        return self.tile_shape(self.cfg.blk_n, self.b_major, stages)

    @property
    def desc_a(self) -> layouts.WgmmaDesc:
        """The descriptor fields of wgmma's A (a 64-row atom of this plan's A tile)."""
        if self.a_major == "K":
            return self.desc
        return layouts.wgmma_desc_fields_mn(self.cfg.dtype, self.tile_shape(self.cfg.blk_m, "MN"), "128B")

    @property
    def desc_b(self) -> layouts.WgmmaDesc:
        """The descriptor fields of wgmma's B (the whole tile's N from one descriptor)."""
        if self.b_major == "K":
            return self.desc
        return layouts.wgmma_desc_fields_mn(self.cfg.dtype, self.tile_shape(self.cfg.blk_n, "MN"), "128B")

    def ab_layouts(self, stages: int):
        return (
            layouts.shared_layout(self.a_dtype, self.a_shape(stages), "128B"),
            layouts.shared_layout(self.b_dtype, self.b_shape(stages), "128B"),
        )

    def d_layout(self):
        c = self.cfg
        return layouts.shared_layout(c.dtype, (c.blk_m, c.blk_n), "128B")


def launch_info(cfg: GemmConfig, stages: int, grid=None, persistent: bool = False, cluster: int = 1) -> dict:
    """Grid, threads and shared memory of a launch, for manifests and the info table."""
    return launch.launch_info(cfg, HopperPlan(cfg).threads, smem_bytes(cfg, stages), grid, persistent, cluster)


def check_tile(cfg: GemmConfig, warpgroups=(1, 2)) -> None:
    """Rules of the Hopper tile: whole wgmma rows per (MMA) warpgroup."""
    if cfg.num_warpgroups not in warpgroups:
        choices = " or ".join(map(str, warpgroups))
        raise ConfigError(f"num_warpgroups={cfg.num_warpgroups!r} is not supported; use {choices}")
    if cfg.blk_m % (WG_M * cfg.num_warpgroups):
        raise ConfigError(
            f"blk_m={cfg.blk_m} does not split into {cfg.num_warpgroups} warpgroup(s) of whole "
            f"64-row wgmma atoms; use blk_m={WG_M * cfg.num_warpgroups} or a multiple of it"
        )


def desc_plus(desc, off16):
    """``desc`` moved ``off16`` 16-byte units by a 32-bit add on its low word alone: the address
    field (bits 0-13) cannot carry into the high word, shared memory ending below 256 KiB, so the
    sum is the descriptor an encode at that address would give. fp8's K loop takes it
    (:attr:`HopperPlan.narrow_desc`)."""
    if isinstance(off16, int) and off16 == 0:
        return desc
    high = T.shift_left(T.shift_right(desc, T.uint64(32)), T.uint64(32))
    return T.bitwise_or(high, T.Cast("uint64", T.Cast("uint32", desc) + T.Cast("uint32", off16)))


def _step_desc(desc, off16, k16):
    """A wgmma's descriptor ``k16`` 16-byte units (its K step) past ``desc``: a 64-bit sum where
    ``off16`` is None (the slice's offset already in ``desc``), else one 32-bit add of ``off16 + k16``
    (:func:`desc_plus`)."""
    if off16 is None:
        return desc + T.Cast("uint64", k16)
    return desc_plus(desc, off16 + k16)


@T.inline
def wgmma_k_steps(plan, Dreg, mi, first, da, db, off_a=None, off_b=None):
    """The k16 wgmmas of one BLK_K slice into 64-row atom ``mi``'s accumulators, from the
    descriptors ``da`` and ``db`` of the slice's K step 0 (moved by ``off_a`` and ``off_b``, 16-byte
    units, where given: :func:`desc_plus`), each K step 32 bytes further."""
    fa = T.meta_var(plan.desc_a)
    fb = T.meta_var(plan.desc_b)
    for kk in T.unroll(plan.cfg.blk_k // plan.mma_k):
        # an MN-major operand steps 16 rows of K (2 KiB) and sets wgmma's transpose bit (16-bit only)
        T.ptx[plan.mma_op](
            *[Dreg[mi * plan.acc_stride + r] for r in range(plan.n_regs)],
            _step_desc(da, off_a, kk * fa.k_step), _step_desc(db, off_b, kk * fb.k_step),
            T.Not(T.And(first, kk == 0)), *plan.mma_imms,
        )


@T.inline
def mma_k_tile(plan, Dreg, Asmem, Bsmem, stage, wg_row0, first, desc_a, desc_b):
    """Issue the wgmmas of one BLK_K slice: for each 64-row atom and each k16 step.

    ``first`` is true on the first K slice of a tile: the first k16 step then writes the
    accumulators instead of adding to them (scale-d = 0), so they need no zeroing.

    Each operand's descriptor is encoded once per slice (and 64-row atom), at K step 0; the K
    steps add ``desc.offset16(k)`` to it (32 bytes of K: every tile starts on the first row of a
    128-byte swizzle atom, where the step is a plain offset), the descriptor an encode at that
    address would give. An encode costs the warp some ten uniform instructions; the add one.
    """
    d = T.meta_var(plan.desc)
    T.cuda.wgmma.encode_matrix_descriptor(
        T.address_of(desc_b[0]), Bsmem.ptr_to([stage, 0, 0]), d.ldo, d.sdo, d.swizzle_code
    )
    for mi in T.unroll(plan.m_atoms):
        T.cuda.wgmma.encode_matrix_descriptor(
            T.address_of(desc_a[0]), Asmem.ptr_to([stage, wg_row0 + mi * WG_M, 0]), d.ldo, d.sdo, d.swizzle_code
        )
        wgmma_k_steps(plan, Dreg, mi, first, desc_a[0], desc_b[0])


def slot_step16(buf) -> int:
    """16-byte units between two ring slots of a ``(stages, rows, cols)`` shared tile: what a
    descriptor's address field moves from one slot to the next (``layouts``' ``stage_step``;
    one slot's bytes, K-major or MN-major alike)."""
    shape = tuple(int(x) for x in buf.shape)
    cols = 128 // layouts.dtype_bytes(str(buf.dtype))  # one 128-byte swizzle row: 64 16-bit values, 128 fp8
    return layouts.wgmma_desc_fields(str(buf.dtype), (*shape[:-2], shape[-1] * shape[-2] // cols, cols),
                                     "128B").stage_step


def k_loop_unroll(nk):
    """How :func:`issue_slices` lets nvcc unroll its K loop: freely over a whole tile's fixed
    slice count (it then unrolls over the ring's slots with constant descriptor offsets), not at
    all over a run-time count (a split-K or stream-K piece), where unrolled copies and their
    remainders only raise the consumers' register pressure around the pieces (spills)."""
    return None if isinstance(nk, int) else False


@T.inline
def encode_slot0(plan, Asmem, Bsmem, wg_row0, desc_a, desc_b, col0=0):
    """The descriptors of ring slot 0 (A at this warpgroup's first row, B at its first column ``col0``: not 0 only
    under swap AB's ``split_m``), once per tile: the K loop of v8-v11 (:func:`mma_k_slot`) reaches every slot, atom
    and K step from them by adds."""
    fa = T.meta_var(plan.desc_a)
    fb = T.meta_var(plan.desc_b)
    T.cuda.wgmma.encode_matrix_descriptor(
        T.address_of(desc_b[0]), Bsmem.ptr_to([0, col0, 0] if fb.major == "K" else [0, 0, col0]), fb.ldo, fb.sdo,
        fb.swizzle_code
    )
    # this warpgroup's first row of A: a row of a K-major tile, a column of an MN-major one
    T.cuda.wgmma.encode_matrix_descriptor(
        T.address_of(desc_a[0]), Asmem.ptr_to([0, wg_row0, 0] if fa.major == "K" else [0, 0, wg_row0]), fa.ldo,
        fa.sdo, fa.swizzle_code
    )


@T.inline
def mma_k_slot(plan, Dreg, stage, first, desc_a, desc_b, step_a, step_b):
    """:func:`mma_k_tile` without an encode: the wgmmas of ring slot ``stage`` from slot 0's
    descriptors (:func:`encode_slot0`) plus ``stage * step`` (:func:`slot_step16`), the 64-row atom
    and the K step. A ring slot starts 1 KiB aligned, as does every atom, so the sum is the
    descriptor an encode at that address would give (the 14-bit address field cannot carry:
    shared memory ends below 256 KiB). It costs the warp two adds a slice where an encode costs
    some twenty uniform instructions; fp8's, one 32-bit add a wgmma operand (:attr:`HopperPlan.narrow_desc`)."""
    fa = T.meta_var(plan.desc_a)
    if plan.narrow_desc:
        for mi in T.unroll(plan.m_atoms):
            wgmma_k_steps(plan, Dreg, mi, first, desc_a[0], desc_b[0], stage * step_a + mi * fa.row_block_step,
                          stage * step_b)
    else:
        a0 = T.meta_var(desc_a[0] + T.Cast("uint64", stage * step_a))
        b0 = T.meta_var(desc_b[0] + T.Cast("uint64", stage * step_b))
        for mi in T.unroll(plan.m_atoms):
            wgmma_k_steps(plan, Dreg, mi, first, a0 + T.Cast("uint64", mi * fa.row_block_step), b0)


@T.inline
def acc_to_smem(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id):
    """Registers -> shared: each thread writes the elements its fragment holds, cast to dtype."""
    for mi in T.unroll(plan.m_atoms):
        for r in T.unroll(plan.n_regs):
            row, col = T.meta_var(layouts.acc_fragment_coord(r, warp_id, lane_id))
            Dsmem[wg_row0 + mi * WG_M + row, col] = T.cast(Dreg[mi * plan.n_regs + r], plan.cfg.dtype)


# -- multi-stage pipelines (v5, v6): pipe_depth is checked by budget.check_pipe_depth ----------


@T.inline
def tma_load_k_tile(plan, A, B, Asmem, Bsmem, stage, m_st, n_st, k, tma2mma):
    """One thread: TMA the K slice ``k`` of the A and B panels into ``stage`` of the ring.

    The expect_tx arrive names the full box: TMA counts the zero-filled bytes past the edges too.
    """
    BLK_M = T.meta_var(plan.cfg.blk_m)
    BLK_N = T.meta_var(plan.cfg.blk_n)
    BLK_K = T.meta_var(plan.cfg.blk_k)
    Tx.copy_async(Asmem[stage, :, :], A[m_st:m_st + BLK_M, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=tma2mma.ptr_to([stage]))
    Tx.copy_async(Bsmem[stage, :, :], B[n_st:n_st + BLK_N, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=tma2mma.ptr_to([stage]))
    tma2mma.arrive(stage, tx_count=plan.stage_bytes)


def pack_op(cfg: GemmConfig) -> str:
    """The PTX that rounds two fp32 accumulators into one 32-bit pair of the output dtype."""
    return {"float16": "cvt.rn.f16x2.f32", "bfloat16": "cvt.rn.bf16x2.f32"}[cfg.dtype]


@T.inline
def acc_to_smem_stmatrix(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id, packed):
    """Registers -> shared with ``stmatrix.m8n8.x4``: 8 output elements per thread per store.

    The m64nNk16 fragment of one warp is, per 8 columns, two 8x8 matrices (rows 0-7 and 8-15
    of the warp's 16) in exactly the layout ``stmatrix`` takes: lane l holds row l/4, columns
    2(l%4) and 2(l%4)+1. So registers (4i, 4i+1) and (4i+2, 4i+3) pack (cvt.rn.f16x2.f32) into
    the two matrices of column block i, and one x4 store covers column blocks 2p and 2p+1.
    Lane t gives the address of row t%8 of matrix t/8: a 16-byte chunk, which the 128B swizzle
    keeps whole, so the swizzled address of its first element is the row's address. The eight
    rows of a matrix land in eight different 16-byte bank groups: no bank conflicts.
    """
    NR = T.meta_var(plan.n_regs)
    q = T.meta_var(lane_id // 8)
    row = T.meta_var(warp_id * 16 + lane_id % 8 + (q % 2) * 8)
    for mi in T.unroll(plan.m_atoms):
        for p in T.unroll(plan.cfg.blk_n // 16):
            for h in T.unroll(4):
                # h: matrix h of the x4 store = column block 2p + h//2, row half h%2
                r = T.meta_var(mi * NR + (2 * p + h // 2) * 4 + (h % 2) * 2)
                # cvt puts its first source in the upper half: the higher column
                T.ptx[pack_op(plan.cfg)](packed[h], Dreg[r + 1], Dreg[r])
            T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
                Dsmem.ptr_to([wg_row0 + mi * WG_M + row, (2 * p + q // 2) * 8]),
                packed[0], packed[1], packed[2], packed[3],
            )


@T.inline
def tma_store_copies(D, Dsmem, m_st, n_st, plan):
    """One thread: the TMA stores of the output tile (64-column, 128-byte-wide boxes), committed
    as one bulk group."""
    for h in T.unroll(plan.cfg.blk_n // 64):
        Tx.copy_async(
            D[m_st:m_st + plan.cfg.blk_m, n_st + h * 64:n_st + h * 64 + 64],
            Dsmem[:, h * 64:h * 64 + 64], dispatch="tma_auto",
        )
    T.ptx.cp.async_.bulk.commit_group()


@T.inline
def tma_store_issue(D, Dsmem, m_st, n_st, plan, tid):
    """Shared -> global by one thread's TMA store, committed but NOT waited for.

    Each writer fences its generic-proxy stores for the async proxy, the CTA barrier makes them
    all land before thread 0 issues the copy. Whoever rewrites Dsmem next must first let the
    bulk group finish reading it (``cp.async.bulk.wait_group.read``).
    """
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.cta_sync()
    if tid == 0:
        tma_store_copies(D, Dsmem, m_st, n_st, plan)


@T.inline
def tma_store_tile(D, Dsmem, m_st, n_st, plan, tid):
    """Shared -> global by one thread's TMA store, waited for before Dsmem can be reused.

    The one-tile rungs (v4, v5) store once per CTA, so they simply wait for the bulk group;
    v6 overlaps it with the next tile (``tma_store_issue`` alone).
    """
    tma_store_issue(D, Dsmem, m_st, n_st, plan, tid)
    if tid == 0:
        T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.cta_sync()


# --- The first rungs (v1-v3): every thread copies, the output leaves from registers ----------
#
# Before TMA (v4) the threads themselves move A and B into the same 128B-swizzled tiles that
# wgmma reads, with 16-byte loads and stores, and each thread writes the accumulators it holds
# straight to global memory. One stage, no barriers other than the CTA barrier, no output tile.


def check_one_tile(cfg: GemmConfig) -> None:
    """v1 and v2 run one CTA: the output must be exactly one blk_m x blk_n tile."""
    for dim, size, knob, tiles in (
        ("M", cfg.M, "blk_m", (64, 128, 256)),
        ("N", cfg.N, "blk_n", (64, 128, 192, 256)),
    ):
        tile = getattr(cfg, knob)
        if size != tile:
            fix = f"pass {knob}={size}, or use v3" if size in tiles else "use v3"
            raise ConfigError(
                f"{cfg.rung} computes one output tile: {dim}={size} must equal {knob}={tile}; "
                f"{fix} (it tiles any M and N over a grid of CTAs)"
            )


def sync_launch_info(cfg: GemmConfig, grid=None) -> dict:
    """Grid, threads and shared memory of a rung that copies by threads (one A+B stage only)."""
    plan = HopperPlan(cfg)
    return launch.launch_info(cfg, plan.threads, plan.stage_bytes, grid)


@T.inline
def load_tile_sync(Xsmem, stage, X, row0, k0, rows):
    """Global -> shared by every thread of the CTA: ``X[row0:row0+rows, k0:k0+64]``.

    ``Tx.cta.copy`` gives each thread 16-byte pieces (8 halves, one swizzle chunk): 8 threads
    cover one 128-byte row, so a warp reads 4 whole rows. The destination index goes through
    the buffer's 128B-swizzle layout, chunk c of row r lands in chunk ``c ^ (r % 8)``: the
    same bytes TMA would write, so the wgmma descriptors are those of v4. No bounds checks:
    the whole slice must lie inside X (v1, v2).
    """
    Tx.cta.copy(Xsmem[stage, :, :], X[row0:row0 + rows, k0:k0 + 64])


@T.inline
def load_tile_guarded(plan, Xsmem, stage, X, row0, k0, rows, tid, guard_rows, guard_k):
    """Like :func:`load_tile_sync`, but rows past X's last row and columns past K read zeros.

    Thread ``tid`` moves 16-byte chunks ``tid, tid + threads, ...`` of the (rows x 64) slice:
    chunk c is row ``c // 8``, columns ``8 * (c % 8) ..+8``. K is a multiple of 8 (16-byte
    rows), so a chunk is wholly inside or wholly outside; an outside chunk is stored as zeros,
    which add nothing to the dot products (the zero-filling TMA does in v4).
    ``guard_rows`` / ``guard_k`` are Python bools: False when the shape needs no check there.
    """
    n_rows = T.meta_var(X.shape[0])
    n_k = T.meta_var(X.shape[1])
    chunk = T.alloc_local((4,), "uint32")
    for it in T.unroll(rows * 8 // plan.threads):
        c = T.meta_var(it * plan.threads + tid)
        r = T.meta_var(c // 8)
        col = T.meta_var(c % 8 * 8)
        row_ok = T.meta_var(T.Or(not guard_rows, row0 + r < n_rows))
        if T.And(row_ok, T.Or(not guard_k, k0 + col < n_k)):
            T.ptx["ld.global.v4.u32"](
                chunk[0], chunk[1], chunk[2], chunk[3], X.ptr_to([row0 + r, k0 + col])
            )
        else:
            for i in T.unroll(4):
                chunk[i] = T.uint32(0)
        # the layout maps (r, col) to the swizzled chunk: a 16-byte chunk stays contiguous
        T.ptx["st.shared.v4.u32"](
            Xsmem.ptr_to([stage, r, col]), chunk[0], chunk[1], chunk[2], chunk[3]
        )


@T.inline
def acc_to_global(plan, Dreg, D, m0, n0, wg_row0, warp_id, lane_id, guard_rows, guard_cols):
    """Registers -> global, no shared staging: each thread stores the pairs its fragment holds.

    Registers 2p and 2p+1 hold adjacent columns of one row (``layouts.acc_fragment_coord``),
    so each pair leaves as one 4-byte store. N is a multiple of 8, so a pair is wholly inside
    or outside D; ``guard_rows`` / ``guard_cols`` (Python bools) skip the pairs past the edge.
    """
    n_m = T.meta_var(D.shape[0])
    n_n = T.meta_var(D.shape[1])
    for mi in T.unroll(plan.m_atoms):
        for p in T.unroll(plan.n_regs // 2):
            row, col = T.meta_var(layouts.acc_fragment_coord(2 * p, warp_id, lane_id))
            gr = T.meta_var(m0 + wg_row0 + mi * WG_M + row)
            gc = T.meta_var(n0 + col)
            if T.And(T.Or(not guard_rows, gr < n_m), T.Or(not guard_cols, gc < n_n)):
                for v in T.vectorized(2):
                    D[gr, gc + v] = T.cast(Dreg[mi * plan.n_regs + 2 * p + v], plan.cfg.dtype)


# -- warp specialization (v7+): a producer warpgroup and consumer warpgroups ------------------
PRODUCER_WG = 0  # warpgroup 0 loads; warpgroups 1..W compute
REGISTER_FILE = 65536  # 32-bit registers of one SM (and of one CTA, at one CTA per SM)
PRODUCER_REGS = 40  # a scheduler, a slice counter, TMA coordinates
CONSUMER_BARRIER = 1  # named barrier of the consumer warpgroups (0 is __syncthreads)


@dataclass(frozen=True)
class RoleRegisters:
    """``setmaxnreg`` budgets of a warp-specialized CTA (None: leave the role as it starts)."""

    entry: int  # what ptxas gives every thread at launch: the file over the threads
    producer: int | None
    consumer: int | None


def role_registers(consumers: int) -> RoleRegisters:
    """Budgets for one producer and ``consumers`` consumer warpgroups.

    A thread starts with the register file over the CTA's threads (rounded down to 8, at most
    255). The producer gives back down to ``PRODUCER_REGS``; the consumers share the rest,
    rounded down to a multiple of 8 (setmaxnreg's unit). Where that is no more than they
    start with (one consumer), nothing moves: both roles keep what they start with.
    """
    threads = THREADS_PER_WG * (consumers + 1)
    entry = min(255, REGISTER_FILE // threads // 8 * 8)
    share = (REGISTER_FILE - PRODUCER_REGS * THREADS_PER_WG) // (THREADS_PER_WG * consumers) // 8 * 8
    if min(share, 240) <= entry:
        # (one consumer: 256 threads start with 255 registers each, and ptxas ignores setmaxnreg
        # in a kernel whose entry count is not capped below that)
        return RoleRegisters(entry, None, None)
    return RoleRegisters(entry, PRODUCER_REGS, min(share, 240))


def consumer_warpgroups(cfg: GemmConfig) -> int:
    """Consumer warpgroups of the CTA: ``num_warpgroups`` owners of rows, each with its lanes of K
    slices (v9's ``k_consumers``, ``kconsumers.py``; 1 elsewhere)."""
    return cfg.num_warpgroups * dict(cfg.extra).get("k_consumers", 1)


def check_consumer_registers(cfg: GemmConfig, plan: HopperPlan | None = None) -> None:
    """The accumulators must fit a consumer's budget with room for addresses and loop state."""
    regs = role_registers(consumer_warpgroups(cfg))
    budget = regs.consumer or regs.entry
    plan = plan or HopperPlan(cfg)
    acc = plan.acc_regs
    if epi_under(cfg) and acc + acc // 2 + 40 > budget:
        raise ConfigError(
            f"epi_under=True keeps a tile's output as 16-bit pairs ({acc // 2} registers a thread) beside the "
            f"next tile's {acc} fp32 accumulators, and a consumer of a {cfg.blk_m}x{cfg.blk_n} tile over "
            f"{cfg.num_warpgroups} warpgroup(s) may hold {budget} (40 go to addresses and loop state); use "
            "epi_under=False, or a tile with fewer accumulators a consumer (e.g. blk_m=128, blk_n=256 over 2)"
        )
    if acc + 40 > budget:
        raise ConfigError(
            f"a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer warpgroup(s) needs "
            f"{acc} fp32 accumulator registers per thread, and a consumer may hold {budget} with "
            f"{cfg.num_warpgroups + 1} warpgroups in the CTA (40 go to addresses and loop state); "
            "use a smaller tile or more consumer warpgroups (num_warpgroups)"
        )


def epi_under(cfg: GemmConfig) -> bool:
    """v9's knob: each tile's epilogue runs under the next tile's first K slices."""
    return bool(dict(cfg.extra).get("epi_under", False))


def check_epi_under(cfg: GemmConfig) -> None:
    """``epi_under`` needs the consumers to share tiles and every tile to leave in whole chunks
    (its registers are checked by :func:`check_consumer_registers`)."""
    if not epi_under(cfg):
        return
    if dict(cfg.extra).get("tail_n", 0):
        raise ConfigError("epi_under=True keeps the last whole tile's output for the next tile to store, and "
                          "tail_n cuts the narrow tiles that follow it with an epilogue of their own; use "
                          "tail_n=0 with epi_under=True, or epi_under=False")


class ConsumerRole(WarpgroupRole):
    """Warpgroups 1..W: TVM's ``WarpgroupRole`` over a range, its register budget optional.

    (``WarpgroupRole((start, stop))`` spells its guard with Python's ``and``, which a TIR
    expression cannot take; this spells it with ``T.And``.)
    """

    def __init__(self, wg_id, consumers: int, regs: int | None):
        super().__init__(wg_id, (1, consumers + 1), regs=regs, increase=True)

    def __enter__(self):
        self._if_frame = T.If(T.And(self.wg_id_var >= 1, self.wg_id_var < self.wg_id_val[1]))
        self._if_frame.__enter__()
        self._then_frame = T.Then()
        self._then_frame.__enter__()
        if self.regs is not None:
            T.evaluate(T.ptx[f"setmaxnreg.inc.sync.aligned.u32"](self.regs))
        return self


@T.inline
def consumer_sync(plan):
    """A barrier of the consumer warpgroups alone (the producer never reaches it)."""
    T.ptx.bar.sync(CONSUMER_BARRIER, plan.threads)


@T.inline
def consumer_store_tile(D, Dsmem, Dreg, m_st, n_st, plan, ctid, wg_row0, warp_id, lane_id, packed):
    """The consumers' epilogue: registers -> Dsmem (stmatrix) -> one TMA store, not waited for.

    Consumer thread 0 first lets the previous tile's store finish reading Dsmem; the named
    barrier holds the other consumers until it has. Each writer fences its stmatrix stores for
    the async proxy before the second barrier, after which thread 0 issues the copy.
    """
    if ctid == 0:
        T.ptx.cp.async_.bulk.wait_group.read(0)
    consumer_sync(plan)
    acc_to_smem_stmatrix(plan, Dreg, Dsmem, wg_row0, warp_id, lane_id, packed)
    T.ptx.fence.proxy.async_.shared__cta()
    consumer_sync(plan)
    if ctid == 0:
        tma_store_copies(D, Dsmem, m_st, n_st, plan)


# -- thread-block clusters (v8+): operand tiles multicast to the CTAs that share them -----------
CLUSTER_DIMS = (1, 2)  # CTAs of a cluster along M and along N
# v9 also takes four CTAs along M (four row tiles sharing B's tile: the 4x1 clusters cuBLASLt's fp8 kernels run at
# M = 1024); an H100 runs 32 such clusters at once (serve.runtime.persistent_grid), not 33
CLUSTER_M_WIDE = (1, 2, 4)


def cluster_shape(cfg: GemmConfig) -> tuple[int, int]:
    """(cluster_m, cluster_n) of a clustered rung: CTAs of one cluster along M and along N."""
    extra = dict(cfg.extra)
    return extra.get("cluster_m", 1), extra.get("cluster_n", 1)


def check_cluster(cfg: GemmConfig, dims_m: tuple = CLUSTER_DIMS) -> None:
    """A cluster of cluster_m x cluster_n CTAs (cluster_m one of ``dims_m``) splits each shared tile
    into whole swizzle atoms."""
    cm, cn = cluster_shape(cfg)
    for name, v, dims in (("cluster_m", cm, dims_m), ("cluster_n", cn, CLUSTER_DIMS)):
        if not isinstance(v, int) or isinstance(v, bool) or v not in dims:
            raise ConfigError(f"{name}={v!r} is not supported on {cfg.rung}; use {name}="
                              + " or ".join(map(str, dims)))
    # the A tile is shared by the cluster_n CTAs of one cluster row: each loads a 1/cluster_n part
    # of its rows; B likewise over cluster_m. A part must be whole 8-row (1 KiB) swizzle atoms.
    for tile, parts, knob in ((cfg.blk_m, cn, "blk_m"), (cfg.blk_n, cm, "blk_n")):
        if tile % (8 * parts):
            raise ConfigError(
                f"{knob}={tile} does not split into {parts} parts of whole 8-row swizzle atoms for the "
                f"cluster's multicast; use a {knob} that is a multiple of {8 * parts}"
            )


@T.inline
def cluster_sync():
    """Every thread of every CTA of the cluster (barrier.cluster, release/acquire)."""
    T.ptx.barrier.cluster.arrive.release()
    T.ptx.barrier.cluster.wait.acquire()


# -- programmatic dependent launch (the ``pdl`` knob of the production presets) ----------------------
# With it the driver may start a kernel's CTAs while the kernel before it on the stream is still running
# (its CTAs leaving, its writes not yet flushed): each SM a CTA of the previous grid leaves takes one of ours,
# which sets up its barriers and shared memory and then waits (``griddepcontrol.wait``) until the previous
# grid has finished and its memory is visible. Nothing before that wait touches global memory (the operands
# may be the previous kernel's output, and D or the split-K workspace its input), so it is safe whatever ran
# before. Each CTA then lets the next kernel's CTAs launch (``griddepcontrol.launch_dependents``): they take
# SMs as ours leave. A kernel launched without the attribute (or after a kernel that never triggers) runs as
# before: the wait returns at once. TVM 0.27 has both halves: the launch tag below (its CUDA runtime adds the
# launch attribute beside the cluster's) and the two PTX instructions. Where the trigger sits was measured
# (benchmarks/results/2026-11-29_h200_pdl/): right after the wait, or at the CTA's end, ran the same; after the
# producer's last load ran up to 19% slower at 1x4096x14336 and 1x6144x4096. Where it pays is plan's call
# (``plan.pdl_pays``).
PDL_LAUNCH_TAG = "tirx.use_programtic_dependent_launch"  # TVM's spelling


def pdl(cfg: GemmConfig) -> bool:
    return bool(dict(cfg.extra).get("pdl", False))


def l2_warm(cfg: GemmConfig) -> bool:
    """The optional ``l2_warm`` knob (v9-v11, with ``pdl`` only): B's first K slices of a CTA's first unit
    asked of L2 before the wait (``producer.warm_l2``)."""
    return bool(dict(cfg.extra).get("l2_warm", False))


def can_warm(cfg: GemmConfig) -> str | None:
    """Why ``cfg``'s kernel cannot warm L2 with its weight (None: it can): B K-major and not SwiGLU's gated
    weight (a CTA's rows of B are then whole rows in memory, one bulk prefetch each), a row a multiple of
    16 bytes (the prefetch's unit), and B's offsets within 32 bits."""
    spec = spec_of(cfg)
    row_bytes = cfg.K * (1 if spec.b.startswith("float8") else 2)
    if spec.b_major != "K":
        return "B is MN-major (a row of the weight is then one K of every column, not a run of K)"
    if spec.gated:
        return "B is SwiGLU's gated weight (a tile's rows come from its two halves)"
    if row_bytes % 16:
        return f"a row of B is {row_bytes} bytes, not a multiple of 16 (the bulk prefetch's unit)"
    if cfg.N * cfg.K >= 2**31:
        return f"B has {cfg.N * cfg.K} elements: its offsets do not fit in 32 bits"
    return None


def check_l2_warm(cfg: GemmConfig) -> None:
    if not l2_warm(cfg):
        return
    if not pdl(cfg):
        raise ConfigError("l2_warm=True needs pdl=True: it warms L2 while the previous kernel finishes, which only a "
                          "programmatic dependent launch overlaps; pass pdl=True or drop l2_warm")
    if (why := can_warm(cfg)) is not None:
        raise ConfigError(f"l2_warm=True on {cfg.rung}: {why}; use l2_warm=False")


def with_pdl(cfg: GemmConfig, func):
    """``func`` launched with programmatic dependent launch where ``cfg`` asks for it (:func:`pdl`): TVM
    computes the thread tags itself and adds this one (``tirx.kernel_launch_params``)."""
    return func.with_attr("tirx.kernel_launch_params", [PDL_LAUNCH_TAG]) if pdl(cfg) else func


@T.inline
def wait_for_previous_grid():
    """Every thread: wait until the grid before this one on the stream has finished and flushed its writes
    (at once without programmatic dependent launch)."""
    T.ptx.griddepcontrol.wait()


@T.inline
def launch_next_grid():
    """Let the next grid's CTAs launch (once every CTA of this grid has said so or left)."""
    T.ptx.griddepcontrol.launch_dependents()


# -- a runtime M (the dynamic_m knob of the persistent rungs): one module for every M -----------
def dynamic_m(cfg: GemmConfig) -> bool:
    return bool(dict(cfg.extra).get("dynamic_m", False))


def m_extent(cfg: GemmConfig):
    """M as the kernel is written for it: ``cfg.M``, or, with ``dynamic_m``, a runtime int32
    ``M`` that the host code reads off A's shape at every call (``T.match_buffer`` binds it and
    checks that D has as many rows). The TMA descriptors are encoded on the host at every
    launch with that extent, so the loads zero-fill and the stores clip at the real M.

    M = 1 is written as a runtime M too (the host code still checks that A has one row): with a
    constant extent of 1, ``tma_auto`` drops A's row stride and refuses the descriptor."""
    return tirx.Var("M", "int32") if dynamic_m(cfg) or cfg.M == 1 else cfg.M


def tiles_over(extent, tile: int):
    """``ceil(extent / tile)`` for a Python int or a runtime expression (a symbolic M)."""
    return -(-extent // tile) if isinstance(extent, int) else T.truncdiv(extent + (tile - 1), tile)


def check_majors(cfg: GemmConfig) -> None:
    """An MN-major operand (the spec's ``a_major="M"`` / ``b_major="N"``) is loaded in boxes of
    64 M (or N) elements, one 128-byte swizzle atom row each: every multicast part of its tile
    must be whole boxes, and v9's narrow tail tiles are not built for an MN-major B."""
    plan = HopperPlan(cfg)
    cm, cn = cluster_shape(cfg)
    for name, major, rows, parts, knob in (("A", plan.a_major, cfg.blk_m, cn, "cluster_n"),
                                           ("B", plan.b_major, cfg.blk_n, cm, "cluster_m")):
        if major == "MN" and (rows // parts) % WG_M:
            raise ConfigError(f"an MN-major {name} is loaded in parts of 64 columns: its tile's {rows} rows in "
                              f"{knob}={parts} part(s) are {rows // parts}; use {knob}=1 or a tile of "
                              f"{WG_M * parts} x k rows")
    if plan.a_major == "MN" and dynamic_m(cfg):
        raise ConfigError("dynamic_m with an MN-major A is not built (A [K, M]'s row stride, M x 2 bytes, must be "
                          "known to be a multiple of 16 for TMA); use dynamic_m=False (one module per M)")
    if plan.b_major == "MN" and dict(cfg.extra).get("tail_n"):
        raise ConfigError("tail_n with an MN-major B is not built (the narrow tiles read B K-major); use tail_n=0")


def check_dynamic_m(cfg: GemmConfig) -> None:
    """A runtime M takes only the tile orders that visit every tile of any grid once. The
    knobs are validated (shared memory, registers, the schedule) at ``cfg.M``: the M they were
    chosen for, which the manifest records."""
    if dynamic_m(cfg) and cfg.tile_order not in RUNTIME_M_ORDERS:
        raise ConfigError(
            f"tile_order={cfg.tile_order!r} cannot take a runtime M (the order's shape depends on the "
            f"number of M tiles); with dynamic_m=True use tile_order in {RUNTIME_M_ORDERS}"
        )


def dynamic_launch(cfg: GemmConfig, info: dict) -> dict:
    """A launch record that says M is read at run time (``runtime.GemmModule`` then takes any
    M >= 1 with the module's N and K)."""
    return {**info, "dynamic_m": True} if dynamic_m(cfg) else info


# -- swap AB (v11): the weights' rows in wgmma's 64-row slot, the (few) rows of M as its N --------
SWAP_BLK_M = tuple(range(8, 257, 8))  # wgmma's N: a multiple of 8 up to 256


@dataclass(frozen=True)
class SwapPlan(HopperPlan):
    """A swap-AB kernel computes the tile's transpose, D^T = B_tile . A_tile^T: B's ``blk_n``
    rows fill wgmma's 64-row slot (consumer ``c`` owns rows ``[c * blk_n/W, (c+1) * blk_n/W)``
    of N) and A's ``blk_m`` rows are its N. ``mma_k_tile(plan, Dreg, Bsmem, Asmem, ...)`` then
    issues ``wgmma.m64n{blk_m}k16`` with the operands' roles swapped; the accumulator of atom
    ``a`` holds D^T rows (N) ``64a + ...`` by columns (M) in the usual fragment layout."""

    @property
    def split_m(self) -> bool:
        """The knob ``split_m``: consumer ``c`` owns all ``blk_n`` rows of N and columns ``[c * blk_m/W, (c+1) *
        blk_m/W)`` of M (both read the same B rows, each its own rows of A), instead of its rows of N."""
        return bool(dict(self.cfg.extra).get("split_m", False))

    @property
    def rows_per_wg(self) -> int:  # rows of N per consumer
        return self.cfg.blk_n if self.split_m else self.cfg.blk_n // self.cfg.num_warpgroups

    @property
    def m_cols(self) -> int:  # rows of M per consumer: wgmma's N
        return self.cfg.blk_m // self.cfg.num_warpgroups if self.split_m else self.cfg.blk_m

    def n_first(self, c):
        """Consumer ``c``'s first row of N in the tile (a column of D)."""
        return 0 if self.split_m else c * self.rows_per_wg

    def m_first(self, c):
        """Consumer ``c``'s first row of M in the tile (a row of A's tile, wgmma's B)."""
        return c * self.m_cols if self.split_m else 0

    @property
    def n_regs(self) -> int:  # accumulator registers of one m64n{m_cols} wgmma
        return self.m_cols // 2

    @property
    def mma_op(self) -> str:
        spec = spec_of(self.cfg)
        if spec.is_fp8:  # the operands' roles swapped: B's type is wgmma's A, A's its B
            ta, tb = FP8_PTX[spec.b], FP8_PTX[spec.a]
            return f"wgmma.mma_async.sync.aligned.m64n{self.m_cols}k{self.mma_k}.f32.{ta}.{tb}"
        t = {"float16": "f16", "bfloat16": "bf16"}[self.cfg.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.m_cols}k{MMA_K}.f32.{t}.{t}"


def check_swap_tile(cfg: GemmConfig, consumers=(1, 2)) -> None:
    """Rules of a swap-AB tile: blk_m (wgmma's N) a multiple of 8 (``config.check_common`` with
    :data:`SWAP_BLK_M`), blk_n whole 64-row atoms per consumer."""
    if cfg.num_warpgroups not in consumers:
        choices = " or ".join(map(str, consumers))
        raise ConfigError(f"num_warpgroups={cfg.num_warpgroups!r} is not supported; use {choices}")
    if SwapPlan(cfg).split_m:
        if cfg.blk_n % WG_M or cfg.blk_m % (8 * cfg.num_warpgroups):
            raise ConfigError(
                f"split_m=True with blk_m={cfg.blk_m}, blk_n={cfg.blk_n}: each of the {cfg.num_warpgroups} "
                f"consumer(s) takes all of blk_n (whole 64-row wgmma atoms) and blk_m / {cfg.num_warpgroups} rows of "
                f"M (wgmma's N, a multiple of 8); use blk_n a multiple of {WG_M} and blk_m a multiple of "
                f"{8 * cfg.num_warpgroups}"
            )
        return
    if cfg.blk_n % (WG_M * cfg.num_warpgroups):
        raise ConfigError(
            f"blk_n={cfg.blk_n} does not split into {cfg.num_warpgroups} consumer(s) of whole 64-row "
            f"wgmma atoms (swap AB puts N in wgmma's rows); use blk_n={WG_M * cfg.num_warpgroups} or a "
            "multiple of it"
        )
