"""The epilogues of the warp-specialized Hopper kernels (v9-v11): each consumer warpgroup's fp32
accumulators -> 16-bit values in shared memory (``stmatrix``) -> D by TMA stores, on its own.

Two parts, each a small frozen dataclass with named fields that a kernel builds once per
consumer and calls per tile:

- :class:`ChunkedEpilogue` (v9, v10): the consumer's rows of the tile leave in ``chunk_cols``-wide
  column chunks through ``buffers`` staging buffers of its own (two, or one when a chunk is the
  whole row): while chunk j's store drains, chunk j+1 is written into the other buffer. From the
  accumulators (``store_tile``) or from 16-bit pairs made earlier (``store_pairs``, v9's
  ``epi_under``), or chunk by chunk under the next tile (``store_chunk``, called by
  :meth:`gemm_ladder.sm90a.mainloop.Consumer.issue_under`).
- :class:`TransposedEpilogue` (v11, swap AB): the consumer's D^T accumulators go into its staging
  buffer as D (``stmatrix ... .trans``) and leave in 64-column stores.

A chunk's staging buffer takes the widest swizzle that divides its row (128, 64 or 32 bytes) and leaves in
TMA boxes one swizzle row wide (:func:`chunk_swizzle`): 64 columns of 16-bit D through the 128-byte swizzle,
32 or 16 through the narrower ones, so a chunk (and v9's blk_n) may be any whole 16 columns, as cuBLASLt's
96-, 112- and 144-wide tiles are.

Only the consumer's 128 threads meet, at its named barrier (``1 + consumer``); one thread (its
``thread`` 0) issues the stores, committed and not waited for: before it rewrites a buffer it
lets the store that read it finish (``cp.async.bulk.wait_group.read``).

A residual ``+ beta . C`` (the spec's ``residual``) is a :class:`ResidualRead`: C's chunk is loaded
by TMA into the staging buffer before the chunk is written there, and read back with ``ldmatrix``
(its docstring says why that is fast and why ``out=C`` is safe). A float32 D (the spec's ``d``)
stages ``epi_n / 2`` columns a chunk (the same bytes) with plain 32-bit stores and leaves in
32-column boxes (one 128-byte swizzle row).

What the epilogue does to each fp32 accumulator before it is rounded to D's type is an
:class:`EpilogueOp` (``ChunkedEpilogue.op``): nothing (:data:`NO_OP`), or, where the operand spec
(``gemm_ladder.core.spec``) has a per-column bias, :class:`BiasOp`: ``+ bias[n]`` in fp32 before the
rounding, and where it has an activation, :class:`ActivationOp` around it (:func:`op_of` picks
them). A fused epilogue is another class with the same members: the operands it reads, and
``apply``, called on every accumulator where it is rounded
(:func:`acc_chunk_to_smem_stmatrix`, :func:`acc_to_pairs`) with the tile's first column. The
spec's epilogue operands become kernel parameters through :func:`kernel_operands` (after
``num_ctas``, in the spec's order: the runtime's argument order), in every prim_func form alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.script.builder import ir as tirx_builder

import layouts
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from .common import CONSUMER_BARRIER, THREADS_PER_WG, WG_M, HopperPlan, pack_op

EPI_CHUNK = 64  # columns of one TMA store box: one 128-byte swizzle row of 16-bit data
EPI_STEP = 16  # the narrowest chunk: a 32-byte swizzle row of 16-bit data (blk_n in whole 16s: v9's BLK_N_CHOICES)
SWIZZLE_BYTES = (("128B", 128), ("64B", 64), ("32B", 32))  # a staging row's swizzles, widest first


def chunk_swizzle(cols: int, elem_bytes: int) -> tuple[str, int]:
    """The swizzle of a staging chunk ``cols`` wide and the columns of one TMA box through it: the
    widest swizzle row (128, 64 or 32 bytes) that divides the chunk's row, one box a swizzle row
    (TMA's box of a swizzled tensor is at most one swizzle row wide). A 96-column 16-bit chunk (192
    bytes) leaves in three 32-column boxes through a 64-byte swizzle, a 112-column one in seven of 16
    through a 32-byte swizzle; whole 64-column rows keep the 128-byte swizzle and 64-column boxes."""
    row = cols * elem_bytes
    for mode, width in SWIZZLE_BYTES:
        if row % width == 0:
            return mode, width // elem_bytes
    raise ConfigError(f"a staging chunk of {cols} columns ({row} bytes a row) is no whole 32-byte swizzle row; "
                      f"use epi_n (and blk_n) a multiple of {EPI_STEP}")


@dataclass(frozen=True)
class EpilogueOp:
    """The epilogue's work on the fp32 accumulators before they are rounded: none.

    ``operands(cfg, M)``: the tensors it reads (``gemm.Operand``s, after D in the kernel's
    parameters); ``bind(buffers)``: the op with those tensors' buffers (``buffers`` maps an
    operand's name to its matched buffer); ``apply(value, reg, lane_id, n0)``: the value
    accumulator ``reg`` (within its 64-row atom) of this thread's fragment (``lane_id``; its
    column: ``layouts.acc_fragment_coord``) of the tile whose columns start at ``n0`` becomes
    before rounding, a PrimExpr.
    """

    def operands(self, cfg: GemmConfig, M) -> list:
        return []

    def bind(self, buffers: dict) -> "EpilogueOp":
        return self

    @property
    def stash(self) -> "BiasStash | None":
        """The registers that hold the tile's bias (:class:`BiasStash`), where the op has a stashed bias."""
        return None

    def with_stash(self, stash: "BiasStash") -> "EpilogueOp":
        """The op reading its bias from ``stash`` (:meth:`BiasStash.load` fills it each tile); no bias: itself."""
        return self

    def apply(self, value, reg, lane_id, n0):
        stash = self.stash
        return self.at_column(value, n0 + layouts.acc_fragment_coord(reg, 0, lane_id)[1],
                              None if stash is None else stash.slot_of_acc(reg))

    def at_column(self, value, col, slot=None):
        """``value``, an accumulator of D's column ``col``, as this op makes it (``apply`` finds
        the column from the m64nNk16 fragment; swap AB's transposed epilogue, whose fragment rows
        are D's columns, gives it). ``slot``: where the column's bias waits in the stash, if the op
        has one (:class:`BiasStash`), else None."""
        return value


NO_OP = EpilogueOp()


@dataclass(frozen=True)
class BiasOp(EpilogueOp):
    """``+ bias[n]``: the spec's per-column bias (N values in D's dtype), widened to fp32 and
    added to each accumulator of column n before it is rounded. Its operand is the spec's, made a
    kernel parameter by :func:`kernel_operands`; ``bind`` takes its buffer."""

    bias: object = None  # bias[N] in global memory (after bind)
    stashed: "BiasStash | None" = None  # the tile's values in registers (with_stash), or read at each column

    def bind(self, buffers: dict) -> "BiasOp":
        if "bias" not in buffers:
            raise ConfigError(f"the kernel's parameters ({', '.join(buffers)}) have no bias: its prim_func form "
                              "must declare the spec's operands (epilogue.kernel_operands)")
        return dataclasses.replace(self, bias=buffers["bias"])

    @property
    def stash(self) -> "BiasStash | None":
        return self.stashed

    def with_stash(self, stash: "BiasStash") -> "BiasOp":
        return dataclasses.replace(self, stashed=stash)

    def at_column(self, value, col, slot=None):
        if slot is not None and self.stashed is not None:
            return value + self.stashed.regs[slot]
        # a tile past N reads N's last value (the store clips those columns)
        return value + T.Cast("float32", self.bias[T.min(col, self.bias.shape[0] - 1)])


def _relu(x):  # F.relu: NaN stays NaN (fmaxf would make it 0)
    return T.Select(x < T.float32(0), T.float32(0), x)


def _gelu_tanh(x):  # F.gelu(x, approximate="tanh")
    inner = T.float32(0.7978845608028654) * (x + T.float32(0.044715) * x * x * x)  # sqrt(2/pi) (x + 0.044715 x^3)
    return T.float32(0.5) * x * (T.float32(1) + T.tanh(inner))


def _gelu_erf(x):  # F.gelu(x)
    return T.float32(0.5) * x * (T.float32(1) + T.erf(x * T.float32(0.7071067811865476)))


def _silu(x):  # F.silu(x) = x * sigmoid(x)
    return x / (T.float32(1) + T.exp(-x))


# the spec's activations (gemm_ladder.core.spec.ACTIVATIONS) as fp32 expressions: TIRx's T.Select,
# T.tanh, T.erf and T.exp (CUDA's ?:, tanhf, erff and expf)
ACTIVATION_EXPRS = {"relu": _relu, "gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf, "silu": _silu}


@dataclass(frozen=True)
class ActivationOp(EpilogueOp):
    """``act(inner(acc))``: the spec's activation (``relu``, ``gelu_tanh``, ``gelu_erf``, ``silu``)
    in fp32 on what ``inner`` (the bias, or nothing) made of each accumulator, before it is
    rounded. ``inner``'s value is bound once (a ``Let``), as the formulas read it several times."""

    act: str = "relu"
    inner: EpilogueOp = NO_OP

    def operands(self, cfg: GemmConfig, M) -> list:
        return self.inner.operands(cfg, M)

    def bind(self, buffers: dict) -> "ActivationOp":
        return dataclasses.replace(self, inner=self.inner.bind(buffers))

    @property
    def stash(self) -> "BiasStash | None":
        return self.inner.stash

    def with_stash(self, stash: "BiasStash") -> "ActivationOp":
        return dataclasses.replace(self, inner=self.inner.with_stash(stash))

    def at_column(self, value, col, slot=None):
        x = tvm.tirx.Var("pre_act", "float32")
        return tvm.tirx.Let(x, self.inner.at_column(value, col, slot), ACTIVATION_EXPRS[self.act](x))


@dataclass(frozen=True)
class ScaledOp(EpilogueOp):
    """``op(alpha . acc)``: the spec's runtime scale of the product (``alpha``, an fp32 kernel
    parameter: one module serves every value), applied to each accumulator before the rest of the
    epilogue (the bias, the activation) sees it."""

    op: EpilogueOp = NO_OP
    alpha: object = None  # the fp32 scalar parameter (after bind)

    def operands(self, cfg: GemmConfig, M) -> list:
        return self.op.operands(cfg, M)

    def bind(self, buffers: dict) -> "ScaledOp":
        if "alpha" not in buffers:
            raise ConfigError(f"the kernel's parameters ({', '.join(buffers)}) have no alpha: its prim_func form "
                              "must declare the spec's operands (epilogue.kernel_operands)")
        return dataclasses.replace(self, op=self.op.bind(buffers), alpha=buffers["alpha"])

    @property
    def stash(self) -> "BiasStash | None":
        return self.op.stash

    def with_stash(self, stash: "BiasStash") -> "ScaledOp":
        return dataclasses.replace(self, op=self.op.with_stash(stash))

    def at_column(self, value, col, slot=None):
        return self.op.at_column(value * self.alpha, col, slot)


def op_of(cfg: GemmConfig, default: EpilogueOp = NO_OP) -> EpilogueOp:
    """The epilogue op ``cfg``'s operand spec asks for: :class:`BiasOp` with a bias, else ``default``,
    inside an :class:`ActivationOp` where the spec has an activation, inside a :class:`ScaledOp`
    where it has ``alpha`` (the residual is not an op: :class:`ResidualRead`)."""
    spec = spec_of(cfg)
    op = BiasOp() if spec.bias else default
    op = op if spec.act == "none" else ActivationOp(spec.act, op)
    return ScaledOp(op) if spec.alpha else op


def _bias_of(op: EpilogueOp):
    """The bias buffer inside ``op`` (a bound :class:`BiasOp`, alone or wrapped), or None."""
    while op is not None and not isinstance(op, BiasOp):
        op = getattr(op, "inner", None) or getattr(op, "op", None)
    return None if op is None else op.bias


# the most registers a thread gives to the stash (a quarter of the tile's columns): blk_n <= 192. On the 256-wide tiles
# (v10's stream-K, 64 registers) it measured 0.971-1.016x the reads, 0.999 in geomean over 10 cases; 1.005-1.045 on
# the narrower ones (benchmarks/results/2026-11-29_h200_bias_stash/)
BIAS_STASH_REGS = 48


def bias_stash_regs(cfg: GemmConfig, plan: HopperPlan, transposed: bool, under: bool) -> int:
    """Registers of a thread's :class:`BiasStash` for this kernel, 0 for none: a 16-bit kernel with a
    bias whose epilogue runs after the tile's last wgmma (not ``epi_under``, whose conversion to pairs
    issues its loads together), not gated, not fp8, and at most :data:`BIAS_STASH_REGS` of them. A thread
    holds a quarter of the tile's columns (two per eight), or under swap AB two rows of N per 64-row atom."""
    spec = spec_of(cfg)
    if not dict(cfg.extra).get("bias_stash", True):  # the optional knob, off: read where added (to measure it)
        return 0
    if not spec.bias or spec.gated or under or spec.is_fp8:  # fp8's promoted sums hold registers enough
        return 0
    regs = 2 * plan.m_atoms if transposed else plan.n_regs // 2
    return regs if regs <= BIAS_STASH_REGS else 0


@dataclass(frozen=True)
class BiasStash:
    """The bias of the columns a thread's accumulators hold, loaded into registers before the tile's K
    loop (:meth:`load`), so that the epilogue adds it with no trip to memory after the last wgmma: read
    where it is added (:meth:`BiasOp.at_column` without a stash), each value waits a global load's
    latency after the consumer's barrier, once per 16 columns, since each ``stmatrix`` (a memory clobber)
    holds the next loads back. TVM has no register-resident broadcast operand, hence this small class.

    ``slot_of_acc(reg)``: the slot of accumulator ``reg`` of the m64nN fragment (its column
    ``8 (reg // 4) + 2 (lane % 4) + reg % 2``: two columns of each eight). Under swap AB
    (``transposed``), the fragment's rows are D's columns: ``slot_of_row(atom, reg)``, two rows of N
    per 64-row atom (``16 warp + lane // 4`` and 8 past it)."""

    regs: object  # float32[count] local
    count: int
    transposed: bool
    warp_id: object
    lane_id: object

    def slot_of_acc(self, reg) -> int:
        return (reg // 4) * 2 + reg % 2

    def slot_of_row(self, atom: int, reg) -> int:
        return atom * 2 + (reg % 4) // 2

    def column(self, slot: int, n0):
        """D's column of ``slot`` in the tile (or under swap AB, the consumer's rows) from ``n0``."""
        if self.transposed:
            return n0 + WG_M * (slot // 2) + 16 * self.warp_id + self.lane_id // 4 + 8 * (slot % 2)
        return n0 + 8 * (slot // 2) + 2 * (self.lane_id % 4) + slot % 2

    def load(self, op: EpilogueOp, n0) -> None:
        """The tile's values from ``op``'s bias, its columns from ``n0`` (past N: N's last value)."""
        _load_stash(self, _bias_of(op), n0)


@T.inline
def _load_stash(stash, bias, n0):
    for s in T.unroll(stash.count):
        col = T.meta_var(stash.column(s, n0))
        stash.regs[s] = T.Cast("float32", bias[T.min(col, bias.shape[0] - 1)])


@dataclass(frozen=True)
class ResidualRead:
    """``+ beta . C`` after the rest of the epilogue, in fp32 before rounding: the spec's residual C
    [M, N] (D's dtype) and its runtime scale ``beta``.

    How C is read: each output chunk's C box (the consumer's rows x ``chunk_cols``) is loaded by
    TMA into the very staging buffer the chunk is about to be written to, by the thread that stores
    it, once the buffer's last store has left it; each staging buffer has its own mbarrier
    (``c_ready[buffer]``, phase = the parity of the loads into that buffer so far: chunk count //
    buffers), the consumer waits on it, reads C back with ``ldmatrix`` at the addresses its
    ``stmatrix`` will write (``ldmatrix`` is ``stmatrix``'s inverse, so each thread gets C's values
    of exactly its accumulators' (row, column) pairs, and each warp reads its own 16-row blocks
    before it overwrites them: no barrier between; a float32 D: each thread reads the 32-bit word it
    writes), adds ``beta . C`` and writes D over it. So C costs no shared memory of its own (the
    ring keeps its stages) and arrives in 128-byte-swizzled whole lines.

    When (``prefetch``, v9's ``c_prefetch`` knob, on by default): without it each chunk's load is
    issued at the chunk and waited for at once, so its latency is exposed once a chunk (at M = 128,
    one tile a CTA, it is pure added time: 0.65-0.91x torch, benchmarks/results/
    2026-11-26_h100_epilogue/). With it the tile's first chunk is loaded before the tile's K loop
    (:meth:`ChunkedEpilogue.prefetch_c`: its buffer is free once all but the newest store left,
    ``wait_group.read(buffers - 1)``) and lands under the wgmmas, and chunk j + 1's load is issued
    at chunk j, before chunk j is computed (its buffer freed by chunk j - 1's store:
    ``wait_group.read(0)``), one chunk ahead.

    In place (C is D, ``out=C``): safe, because every element of C is read (the load has completed
    at the mbarrier) before the same CTA's consumer issues the store of the same chunk, and no other
    consumer or CTA reads or writes that chunk: v9's tiles are whole (no split-K), each consumer owns
    its rows, and a chunk is stored once. A prefetched chunk is one of the same tile's, loaded
    before any of its D is stored (the previous tile's stores are of other chunks)."""

    c: object  # C [M, N] in global memory
    beta: object  # the fp32 scalar parameter
    ready: object  # TMABar(pool, consumers x buffers): one C load in flight per staging buffer
    pairs: object  # uint32[4] local: one ldmatrix's four 16-bit pairs of C
    prefetch: bool = False  # the first chunk under the K loop, each next one a chunk ahead

    @staticmethod
    def of(cfg: GemmConfig, buffers: dict, ready, pairs) -> "ResidualRead | None":
        """The residual of ``cfg``'s spec with the kernel's tensors (``buffers``), or None."""
        if not spec_of(cfg).residual:
            return None
        return ResidualRead(c=buffers["C"], beta=buffers["beta"], ready=ready, pairs=pairs, prefetch=c_prefetch(cfg))

    @staticmethod
    def phase(chunk, buffers: int):
        """The parity ``c_ready`` of the buffer of a consumer's ``chunk``-th chunk (its running
        count) completes when that chunk's C has landed: one load into each buffer every
        ``buffers`` chunks."""
        return (chunk // buffers) % 2


def c_prefetch(cfg: GemmConfig) -> bool:
    """Whether ``cfg`` loads a residual's C ahead (:class:`ResidualRead`; v9's knob ``c_prefetch``,
    present on residual specs only)."""
    return bool(spec_of(cfg).residual) and bool(dict(cfg.extra).get("c_prefetch", False))


def _unpack(pair, high: bool, dtype: str):
    """One 16-bit value of a packed pair (the low half: the lower column) as fp32."""
    if dtype == "bfloat16":  # bf16 is fp32's top half: shift it there
        bits = pair & T.uint32(0xFFFF0000) if high else pair << T.uint32(16)
        return T.reinterpret("float32", bits)
    half = T.Cast("uint16", (pair >> T.uint32(16)) if high else (pair & T.uint32(0xFFFF)))
    return T.Cast("float32", T.reinterpret("float16", half))


def kernel_operands(cfg: GemmConfig, M, N, K, buffers: dict | None = None) -> dict:
    """``buffers`` (the form's matched tensors by name) and the epilogue's operands of ``cfg``'s
    spec (``GemmSpec.epilogue_operands``, in order) made parameters of the kernel being traced,
    after those its prim_func declares (so after ``num_ctas``: the runtime passes them last):
    name -> buffer. Call it beside the form's ``T.match_buffer`` lines, before
    ``T.device_entry``, through ``T.meta_var``."""
    out = dict(buffers or {})
    for op in spec_of(cfg).epilogue_operands():
        if op.role == "scalar":  # alpha, beta: fp32 values
            out[op.name] = tirx_builder.arg(op.name, tvm.tirx.Var(op.name, op.dtype))
            continue
        # an extent of M, N and K (N/2, K/128, ...: the spec's), or a number (a per-tensor scale's 1)
        buf = tvm.tirx.decl_buffer(op.extent(M, N, K), op.dtype, name=op.name)
        out[op.name] = tirx_builder.arg(op.name, buf)
    return out


def check_epilogue(cfg: GemmConfig) -> None:
    """``epi_n``: the columns one epilogue chunk moves, a multiple of 16 that divides blk_n (its boxes:
    :func:`chunk_swizzle`)."""
    epi_n = dict(cfg.extra).get("epi_n", cfg.blk_n)
    if not isinstance(epi_n, int) or isinstance(epi_n, bool) or epi_n <= 0 or epi_n % EPI_STEP or cfg.blk_n % epi_n:
        ok = [n for n in range(EPI_STEP, cfg.blk_n + 1, EPI_STEP) if cfg.blk_n % n == 0]
        raise ConfigError(f"epi_n={epi_n!r} must be a multiple of {EPI_STEP} that divides blk_n={cfg.blk_n}; "
                          f"use one of {ok}")
    tail_n, epilogue = dict(cfg.extra).get("tail_n"), spec_of(cfg).epilogue
    if epilogue != "none" and tail_n:
        raise ConfigError(f"{cfg.rung}: epilogue {epilogue} with tail_n={tail_n} is not built yet (the narrow tiles' "
                          "last columns leave from the registers without it); use tail_n=0")
    if spec_of(cfg).d == "float32" and (tail_n or dict(cfg.extra).get("epi_under")):
        raise ConfigError(f"{cfg.rung}: a float32 D with tail_n={tail_n}, epi_under="
                          f"{dict(cfg.extra).get('epi_under')} is not built (both keep 16-bit values in registers); use "
                          "tail_n=0, epi_under=False")
    if spec_of(cfg).gated:
        half = cfg.blk_n // 2
        if dict(cfg.extra).get("epi_under") or half % epi_n or cfg.N % 16:
            raise ConfigError(f"{cfg.rung}: a gated B (SwiGLU) needs epi_n dividing blk_n / 2 = {half} (epi_n={epi_n}), "
                              f"epi_under=False (epi_under={dict(cfg.extra).get('epi_under')}) and N (both halves) a "
                              f"multiple of 16 (N={cfg.N}: D has N / 2 columns, 16-byte rows); use epi_n=64, "
                              "epi_under=False")
    if spec_of(cfg).residual and dict(cfg.extra).get("epi_under"):
        raise ConfigError(f"{cfg.rung}: a residual C with epi_under=True is not built (the tile is rounded to 16-bit "
                          "pairs before its chunks' C is loaded, and C must be added in fp32 first); use "
                          "epi_under=False")


@T.inline
def _acc_chunk_to_smem_f32(plan, Dreg, Esmem, buf, col0, ncols, warp_id, lane_id, op, n0, residual=None):
    """A float32 D's chunk: every accumulator of columns ``col0 .. col0+ncols`` through ``op`` into
    ``Esmem[buf]`` at its (row, column) of the m64nNk16 fragment (``layouts.acc_fragment_coord``),
    the 128B swizzle applied by the buffer's layout. With a ``residual``, ``Esmem[buf]`` holds C's
    chunk: each thread reads the word it is about to write and adds ``beta . C`` (no other thread
    touches that word)."""
    NR = T.meta_var(plan.acc_stride)
    for mi in T.unroll(plan.m_atoms):
        for i in T.unroll(ncols // 8):
            for jj in T.unroll(4):
                r = T.meta_var(mi * NR + (col0 // 8 + i) * 4 + jj)
                row, col = T.meta_var(layouts.acc_fragment_coord((col0 // 8 + i) * 4 + jj, warp_id, lane_id))
                if residual is not None:
                    Esmem[buf, mi * WG_M + row, col - col0] = (
                        op.apply(Dreg[r], r % NR, lane_id, n0)
                        + residual.beta * Esmem[buf, mi * WG_M + row, col - col0])
                else:
                    Esmem[buf, mi * WG_M + row, col - col0] = op.apply(Dreg[r], r % NR, lane_id, n0)


@T.inline
def acc_chunk_to_smem_stmatrix(plan, Dreg, Esmem, buf, col0, ncols, warp_id, lane_id, packed, op, n0,
                               residual=None, up=0):
    """Columns ``col0 .. col0+ncols`` of one warpgroup's accumulators -> ``Esmem[buf]`` (its
    rows only, ``ncols`` wide), with ``stmatrix`` as in :func:`acc_to_smem_stmatrix`, each
    accumulator through ``op`` (an :class:`EpilogueOp`; the tile's columns start at ``n0``)
    before it is rounded. With ``packed=None``, ``Dreg`` holds the pairs already
    (:func:`acc_to_pairs`, which applied the op). With a ``residual`` (:class:`ResidualRead`),
    ``Esmem[buf]`` holds C's chunk: each 16x16 block is read (``ldmatrix``, the same addresses)
    and ``beta . C`` added before the block is written over. With ``up`` (a gated B: the registers
    between a gate column and its up column, ``acc_stride / 2``), each value is ``op(gate) * up``."""
    NR = T.meta_var(plan.acc_stride)
    q = T.meta_var(lane_id // 8)
    row = T.meta_var(warp_id * 16 + lane_id % 8 + (q % 2) * 8)
    if Esmem.dtype == "float32":  # no stmatrix for 32-bit values: each accumulator stored as it is
        _acc_chunk_to_smem_f32(plan, Dreg, Esmem, buf, col0, ncols, warp_id, lane_id, op, n0, residual)
    for mi in T.unroll(plan.m_atoms if Esmem.dtype != "float32" else 0):
        for pp in T.unroll(ncols // 16):
            r0 = T.meta_var(mi * NR + 2 * (col0 // 16 + pp) * 4)  # the first of the 8 accumulators stored
            if residual is not None:
                cp = T.meta_var(residual.pairs)
                T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(
                    cp[0], cp[1], cp[2], cp[3], Esmem.ptr_to([buf, mi * WG_M + row, (2 * pp + q // 2) * 8]),
                )
                for h in T.unroll(4):
                    T.ptx[pack_op(plan.cfg)](
                        packed[h],
                        op.apply(Dreg[r0 + 2 * h + 1], (r0 + 2 * h + 1) % NR, lane_id, n0)
                        + residual.beta * _unpack(cp[h], True, plan.cfg.dtype),
                        op.apply(Dreg[r0 + 2 * h], (r0 + 2 * h) % NR, lane_id, n0)
                        + residual.beta * _unpack(cp[h], False, plan.cfg.dtype))
            elif packed is not None and up > 0:
                for h in T.unroll(4):
                    T.ptx[pack_op(plan.cfg)](
                        packed[h],
                        op.apply(Dreg[r0 + 2 * h + 1], (r0 + 2 * h + 1) % NR, lane_id, n0) * Dreg[r0 + 2 * h + 1 + up],
                        op.apply(Dreg[r0 + 2 * h], (r0 + 2 * h) % NR, lane_id, n0) * Dreg[r0 + 2 * h + up])
            elif packed is not None:
                for h in T.unroll(4):
                    T.ptx[pack_op(plan.cfg)](packed[h],
                                             op.apply(Dreg[r0 + 2 * h + 1], (r0 + 2 * h + 1) % NR, lane_id, n0),
                                             op.apply(Dreg[r0 + 2 * h], (r0 + 2 * h) % NR, lane_id, n0))
            src = T.meta_var([packed[h] for h in range(4)] if packed is not None
                             else [Dreg[r0 // 2 + h] for h in range(4)])
            T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
                Esmem.ptr_to([buf, mi * WG_M + row, (2 * pp + q // 2) * 8]), *src,
            )


def _buffer(epi, chunk):
    """The staging buffer of this consumer's ``chunk``-th chunk (its running count)."""
    # one consumer: its buffers are the first, said as constants (TVM cannot prove that
    # warpgroup - 1 is 0, and a single buffer's layout has no stride to scale it by)
    first = epi.consumer * epi.buffers if epi.plan.cfg.num_warpgroups > 1 else 0
    return first + chunk % epi.buffers


@T.inline
def _load_c(epi, m_st, n_st, epi_it, j):
    """The storing thread: C's box of chunk ``j`` of the tile at (``m_st``, ``n_st``) by TMA into
    the chunk's staging buffer, completing on that buffer's ``c_ready`` (the buffer must be free)."""
    res = T.meta_var(epi.residual)
    Esmem = T.meta_var(epi.staging)
    ROWS = T.meta_var(epi.plan.rows_per_wg)
    row0 = T.meta_var(epi.consumer * ROWS)
    epi_n = T.meta_var(epi.chunk_cols)
    box = T.meta_var(epi.box_cols)
    buf = T.meta_var(_buffer(epi, epi_it + j))
    res.ready.arrive(buf, tx_count=ROWS * epi_n * (4 if Esmem.dtype == "float32" else 2))  # C is in D's dtype
    for h in T.unroll(epi_n // box):
        Tx.copy_async(
            Esmem[buf, :, h * box:h * box + box],
            res.c[m_st + row0:m_st + row0 + ROWS, n_st + j * epi_n + h * box:n_st + j * epi_n + h * box + box],
            dispatch="tma_auto", mbar=res.ready.ptr_to([buf]),
        )


@T.inline
def _prefetch_c(epi, m_st, n_st, epi_it):
    if epi.thread == 0:
        # the first chunk's buffer: free once all but the newest store (the other buffer's) left it
        T.ptx.cp.async_.bulk.wait_group.read(epi.buffers - 1)
        _load_c(epi, m_st, n_st, epi_it, 0)


@T.inline
def _store_chunk(epi, Dreg, m_st, n_st, packed, epi_it, j):
    """Chunk ``j`` of :meth:`ChunkedEpilogue.store_tile` (``packed=None``: from pairs, as
    :func:`acc_chunk_to_smem_stmatrix` says)."""
    plan = T.meta_var(epi.plan)
    D = T.meta_var(epi.d)
    Esmem = T.meta_var(epi.staging)
    c = T.meta_var(epi.consumer)
    wtid = T.meta_var(epi.thread)
    epi_n = T.meta_var(epi.chunk_cols)
    nbuf = T.meta_var(epi.buffers)
    ROWS = T.meta_var(plan.rows_per_wg)
    row0 = T.meta_var(c * ROWS)  # its band of the tile
    buf = T.meta_var(_buffer(epi, epi_it + j))
    res = T.meta_var(epi.residual)
    ahead = T.meta_var(res is not None and res.prefetch)  # C one chunk ahead (ResidualRead)
    if wtid == 0:
        if ahead:
            if j + 1 < epi.chunks_per_tile:
                # chunk j + 1's buffer: free once chunk j - 1's store (the newest) left it
                T.ptx.cp.async_.bulk.wait_group.read(0)
                _load_c(epi, m_st, n_st, epi_it, j + 1)
        else:
            T.ptx.cp.async_.bulk.wait_group.read(nbuf - 1)
            if res is not None:
                # C's chunk into the buffer its store has just left (ResidualRead says why here)
                _load_c(epi, m_st, n_st, epi_it, j)
    T.ptx.bar.sync(T.Cast("uint32", CONSUMER_BARRIER + c), THREADS_PER_WG)
    if res is not None:
        res.ready.wait(buf, res.phase(epi_it + j, nbuf))
    acc_chunk_to_smem_stmatrix(plan, Dreg, Esmem, buf, j * epi_n, epi_n, epi.warp_id, epi.lane_id, packed, epi.op,
                               n_st, res, plan.acc_stride // 2 if epi.gated else 0)
    n_d = T.meta_var(n_st // 2 if epi.gated else n_st)  # D's columns: half the kernel's with a gated B
    T.ptx.fence.proxy.async_.shared__cta()
    T.ptx.bar.sync(T.Cast("uint32", CONSUMER_BARRIER + c), THREADS_PER_WG)
    box = T.meta_var(epi.box_cols)
    if wtid == 0:
        for h in T.unroll(epi_n // box):
            Tx.copy_async(
                D[m_st + row0:m_st + row0 + ROWS,
                  n_d + j * epi_n + h * box:n_d + j * epi_n + h * box + box],
                Esmem[buf, :, h * box:h * box + box], dispatch="tma_auto",
            )
        T.ptx.cp.async_.bulk.commit_group()


@T.inline
def _store_chunks(epi, Dreg, m_st, n_st, packed, epi_it):
    for j in T.unroll(epi.chunks_per_tile):
        _store_chunk(epi, Dreg, m_st, n_st, packed, epi_it, j)


@dataclass(frozen=True)
class ChunkedEpilogue:
    """One consumer warpgroup's epilogue, on its own (v9, v10): its rows of the tile leave in
    ``chunk_cols``-wide column chunks through ``buffers`` shared buffers (two, or one when a chunk
    is the whole row).

    Chunk ``chunk_it + j`` (``chunk_it`` counts this warpgroup's chunks across tiles; the caller
    adds ``chunks_per_tile`` after a tile) goes to buffer ``(chunk_it + j) % buffers`` of this
    consumer. Before rewriting a buffer, the consumer's storing thread lets all but the newest
    ``buffers - 1`` bulk groups finish reading it (``wait_group.read``): with two buffers the store
    of the chunk before last, which used this buffer, has then left it while the last chunk's
    store still drains. Only this warpgroup's 128 threads meet at its named barrier
    (``1 + consumer``): the other consumers and the producer run on.
    """

    plan: HopperPlan
    d: object  # D in global memory
    staging: object  # Esmem[consumers x buffers, rows_per_wg, chunk_cols], 128B-swizzled
    consumer: object  # this consumer warpgroup, 0-based (a run-time value)
    thread: object  # this thread in its warpgroup (0 issues the stores)
    warp_id: object
    lane_id: object
    packed: object  # uint32[4] local: one stmatrix's four 16-bit pairs
    chunk_cols: int  # epi_n
    buffers: int  # staging buffers per consumer
    op: EpilogueOp = NO_OP  # applied to each accumulator before it is rounded
    residual: ResidualRead | None = None  # + beta . C, read into the staging buffer (store_tile only)
    # a gated B (SwiGLU): accumulator columns c < n_cols / 2 are gates, c + n_cols / 2 their up
    # projections (the same thread's registers r, r + acc_stride / 2); D gets op(gate) * up, half the columns
    gated: bool = False

    @property
    def chunks_per_tile(self) -> int:
        return self.plan.n_cols // (2 if self.gated else 1) // self.chunk_cols

    @property
    def box_cols(self) -> int:
        """Columns of one TMA store box: one swizzle row of the staging chunk (:func:`chunk_swizzle`:
        64 of 16-bit D and 32 of float32 through a 128-byte swizzle, fewer in narrower chunks)."""
        return chunk_swizzle(self.chunk_cols, 4 if self.staging.dtype == "float32" else 2)[1]

    def store_tile(self, acc, m_st, n_st, chunk_it) -> None:
        """The tile at (``m_st``, ``n_st``) of D from the fp32 accumulators ``acc``."""
        _store_chunks(self, acc, m_st, n_st, self.packed, chunk_it)

    def store_pairs(self, pairs, m_st, n_st, chunk_it) -> None:
        """The tile from its 16-bit pairs (:func:`acc_to_pairs`; not with a residual, which is added
        in fp32: ``check_epilogue`` refuses epi_under with one)."""
        if self.residual is not None:
            raise ConfigError("a residual C is added to the fp32 accumulators, not to 16-bit pairs: use epi_under=False")
        _store_chunks(self, pairs, m_st, n_st, None, chunk_it)

    def prefetch_c(self, m_st, n_st, chunk_it) -> None:
        """A residual's C, ahead (``ResidualRead.prefetch``): the first chunk of the tile at
        (``m_st``, ``n_st``) into its staging buffer, by the storing thread, before the tile's K
        loop; :meth:`store_tile` waits for it (and loads the others a chunk ahead)."""
        _prefetch_c(self, m_st, n_st, chunk_it)

    def store_chunk(self, pairs, m_st, n_st, chunk_it, j) -> None:
        """Chunk ``j`` of a tile from its 16-bit pairs (v9's ``epi_under``, under the next tile)."""
        _store_chunk(self, pairs, m_st, n_st, None, chunk_it, j)

    def with_plan(self, plan: HopperPlan) -> "ChunkedEpilogue":
        """The same epilogue for tiles of another width (v9's narrow ``tail_n`` tiles)."""
        return dataclasses.replace(self, plan=plan)


@dataclass(frozen=True)
class PairsUnder:
    """A tile's 16-bit pairs (:func:`acc_to_pairs`), stored in ``parts`` under the next tile's first
    fp8 promotion group (v9's ``epi_under`` with fp8: ``mainloop.Consumer.run_under``): part p's
    chunks (the tile's p-th share of columns) while the group's (or with ``halves``, half p's)
    wgmmas run. ``has_prev`` (a run-time condition): whether there is such a tile; ``m0``, ``n0``:
    where it goes in D; ``chunk_it``: the epilogue's chunk count."""

    epi: ChunkedEpilogue
    pairs: object  # uint32[acc_regs / 2] local
    has_prev: object
    m0: object
    n0: object
    chunk_it: object
    parts: int = 1

    def store(self, part: int) -> None:
        """Part ``part``'s chunks."""
        chunks = self.epi.chunks_per_tile // self.parts
        for j in range(part * chunks, (part + 1) * chunks):
            self.epi.store_chunk(self.pairs, self.m0, self.n0, self.chunk_it, j)


@T.inline
def acc_to_pairs(plan, Dreg, Preg, op, lane_id, n0):
    """Round every accumulator of a tile into 16-bit pairs, ``Preg[i] = (Dreg[2i], Dreg[2i+1])``
    (each through ``op`` first; the tile's columns start at ``n0``): the pairs
    :func:`acc_chunk_to_smem_stmatrix` makes chunk by chunk, made at once so that the
    accumulators are free for the next tile while the pairs wait for their stores."""
    NR = T.meta_var(plan.acc_stride)
    for i in T.unroll(plan.acc_regs // 2):
        T.ptx[pack_op(plan.cfg)](Preg[i], op.apply(Dreg[2 * i + 1], (2 * i + 1) % NR, lane_id, n0),
                                 op.apply(Dreg[2 * i], (2 * i) % NR, lane_id, n0))


def staging_layout(cfg: GemmConfig, buffers: int, rows: int, cols: int, dtype: str | None = None):
    """Swizzled staging buffers for output chunks (of ``dtype``, default the config's), 128-byte
    swizzled where a chunk's row is whole 128 bytes, else 64 or 32 (:func:`chunk_swizzle`):
    ``stmatrix`` writes 16-byte rows that the swizzle spreads over the banks, and the TMA store
    reads them back unswizzled."""
    dtype = dtype or cfg.dtype
    mode, _ = chunk_swizzle(cols, 4 if dtype == "float32" else 2)
    return layouts.shared_layout(dtype, (buffers, rows, cols), mode)


def d_bytes(cfg: GemmConfig) -> int:
    """Bytes of one element of D: 2, or 4 where the spec has D in float32."""
    return 4 if spec_of(cfg).d == "float32" else 2



@T.inline
def acc_to_smem_stmatrix_trans(plan, Dreg, Esmem, buf, warp_id, lane_id, packed, op=NO_OP, n_first=0):
    """Swap AB: one consumer's D^T accumulators -> ``Esmem[buf]`` as D, rows M by the
    consumer's ``rows_per_wg`` columns of N, with ``stmatrix ... .trans``; each value through
    ``op`` first (the spec's bias, activation, alpha: :meth:`EpilogueOp.at_column`), at its column
    of D: ``n_first`` (the consumer's first) plus its fragment row, as both registers of a pair
    share one row.

    Per atom ``a`` and 8-column block ``i`` of the fragment (8 rows of M), warp ``w`` holds two
    8x8 matrices (its N rows ``64a + 16w + 8h .. +8``, h = 0, 1) in the layout ``stmatrix``
    takes (registers ``4i + 2h``, ``4i + 2h + 1``, packed by ``cvt``); ``.trans`` stores each
    transposed, so row ``q`` of the stored matrix is D row ``8i + q``, N columns
    ``64a + 16w + 8h .. +8``: one 16-byte chunk, whole under the 128B swizzle. x4 stores take
    two 8-row blocks at once; an odd last block goes as x2.
    """
    NR = T.meta_var(plan.n_regs)
    MB = T.meta_var(plan.m_cols // 8)  # 8-row blocks of M (the consumer's: split_m)
    q = T.meta_var(lane_id % 8)
    mat = T.meta_var(lane_id // 8)
    for a in T.unroll(plan.m_atoms):
        for ip in T.unroll(MB // 2):
            for h4 in T.unroll(4):
                # matrix h4 of the x4 store: block 2ip + h4//2, N half h4%2
                r = T.meta_var(a * NR + (2 * ip + h4 // 2) * 4 + (h4 % 2) * 2)
                n = T.meta_var(n_first + a * WG_M + layouts.acc_fragment_coord(r % NR, warp_id, lane_id)[0])
                slot = T.meta_var(None if op.stash is None else op.stash.slot_of_row(a, r % NR))
                T.ptx[pack_op(plan.cfg)](packed[h4], op.at_column(Dreg[r + 1], n, slot), op.at_column(Dreg[r], n, slot))
            # lane 8*mat + q: row q of matrix mat (block 2ip + mat//2, half mat%2)
            row, col = T.meta_var(layouts.stmatrix_trans_row(2 * ip + mat // 2, mat % 2, warp_id, q))
            T.ptx.stmatrix.sync.aligned.m8n8.x4.trans.shared.b16(
                Esmem.ptr_to([buf, row, a * WG_M + col]), packed[0], packed[1], packed[2], packed[3],
            )
        if MB % 2 == 1:
            for h in T.unroll(2):
                r = T.meta_var(a * NR + (MB - 1) * 4 + h * 2)
                n = T.meta_var(n_first + a * WG_M + layouts.acc_fragment_coord(r % NR, warp_id, lane_id)[0])
                slot = T.meta_var(None if op.stash is None else op.stash.slot_of_row(a, r % NR))
                T.ptx[pack_op(plan.cfg)](packed[h], op.at_column(Dreg[r + 1], n, slot), op.at_column(Dreg[r], n, slot))
            # x2: lanes 0-15 give the rows of the two matrices (the others' addresses unused)
            row1, col1 = T.meta_var(layouts.stmatrix_trans_row(MB - 1, mat % 2, warp_id, q))
            T.ptx.stmatrix.sync.aligned.m8n8.x2.trans.shared.b16(
                Esmem.ptr_to([buf, row1, a * WG_M + col1]), packed[0], packed[1],
            )


@T.inline
def _store_transposed(epi, Dreg, m_st, n_st):
    plan = T.meta_var(epi.plan)
    D = T.meta_var(epi.d)
    Esmem = T.meta_var(epi.staging)
    c = T.meta_var(epi.consumer)
    wtid = T.meta_var(epi.thread)
    COLS = T.meta_var(plan.rows_per_wg)
    # one consumer: its buffer is 0, said as a constant (TVM cannot prove that warpgroup - 1 is,
    # and the staging layout of a single buffer has no stride to scale it by)
    buf = T.meta_var(c if plan.cfg.num_warpgroups > 1 else 0)
    if wtid == 0:
        T.ptx.cp.async_.bulk.wait_group.read(0)
    T.ptx.bar.sync(T.Cast("uint32", CONSUMER_BARRIER + c), THREADS_PER_WG)
    n0 = T.meta_var(n_st + plan.n_first(c))  # the consumer's first column of D
    m0 = T.meta_var(m_st + plan.m_first(c))  # and row (split_m)
    ROWS = T.meta_var(plan.m_cols)
    acc_to_smem_stmatrix_trans(plan, Dreg, Esmem, buf, epi.warp_id, epi.lane_id, epi.packed, epi.op, n0)
    T.ptx.fence.proxy.async_.shared__cta()
    T.ptx.bar.sync(T.Cast("uint32", CONSUMER_BARRIER + c), THREADS_PER_WG)
    if wtid == 0:
        for h in T.unroll(COLS // EPI_CHUNK):
            Tx.copy_async(
                D[m0:m0 + ROWS, n0 + h * EPI_CHUNK:n0 + h * EPI_CHUNK + EPI_CHUNK],
                Esmem[buf, :, h * EPI_CHUNK:h * EPI_CHUNK + EPI_CHUNK], dispatch="tma_auto",
            )
        T.ptx.cp.async_.bulk.commit_group()


@dataclass(frozen=True)
class TransposedEpilogue:
    """Swap AB (v11), one consumer's epilogue on its own: its D^T accumulators go into its
    staging buffer ``staging[consumer]`` as D (``blk_m`` rows, its ``rows_per_wg`` columns of N),
    which leaves in 64-column TMA stores, committed and not waited for. Before rewriting the
    buffer its storing thread lets the previous tile's stores finish reading it; the consumer's
    named barrier (``1 + consumer``) holds the others until then, and again until every thread's
    stmatrix stores are fenced for the async proxy. The spec's op (a bias per column of D, an
    activation, alpha) runs on each value on its way to the staging buffer, at its column of D: a
    row of the D^T fragment (:func:`acc_to_smem_stmatrix_trans`)."""

    plan: HopperPlan  # a SwapPlan
    d: object
    staging: object  # Esmem[consumers, blk_m, rows_per_wg], 128B-swizzled
    consumer: object
    thread: object
    warp_id: object
    lane_id: object
    packed: object
    op: EpilogueOp = NO_OP  # the spec's (op_of), bound to its tensors

    def store_tile(self, acc, m_st, n_st, chunk_it=None) -> None:
        """The tile at (``m_st``, ``n_st``) of D from the D^T accumulators ``acc`` (one buffer a
        consumer: no chunk count to keep, ``chunk_it`` is not used)."""
        _store_transposed(self, acc, m_st, n_st)
