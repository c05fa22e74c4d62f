"""The values a simulated thread computes with, and how the checker reads TIR calls.

Python ints; :class:`Smem` for a shared-memory byte address (``rank`` set when mapped into
another CTA of the cluster); :class:`TMap` for a tensor map; :class:`LocalRef` for the address of
a local buffer element; tuples for vector values (``uint32x2`` halves of a descriptor);
:data:`UNKNOWN` for anything not modelled (a branch on it is a :class:`SimError`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir


class SimError(RuntimeError):
    """The kernel does something the simulator cannot follow (a branch on an unknown value)."""


class _Unknown:
    __slots__ = ()

    def __repr__(self):
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Smem:
    off: int
    rank: int | None = None  # None: this CTA's shared memory
    elem: int = 1  # element size, for pointer arithmetic


@dataclass(frozen=True)
class TMap:
    name: str


@dataclass(frozen=True)
class LocalRef:
    slot: int
    index: int


@dataclass(frozen=True)
class Tick:
    """Yielded at loop back-edges: the thread could run on, the scheduler may switch."""


TICK = Tick()

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
               "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1,
               "float8_e4m3fn": 1, "float8_e5m2": 1}

# operations the simulator models (lowered op names)
MBAR_OPS = {"tirx.ptx.mbarrier_init", "tirx.ptx.mbarrier_arrive", "tirx.ptx.mbarrier_arrive_expect_tx",
            "tirx.ptx.mbarrier_expect_tx", "tirx.cuda.mbarrier_wait", "tirx.cuda.mbarrier_wait_acquire_cluster"}
SYNC_OPS = {"tirx.cuda.cta_sync", "tirx.cuda.warpgroup_sync", "tirx.cuda.cluster_sync",
            "tirx.ptx.barrier_cluster_arrive", "tirx.ptx.barrier_cluster_wait"}
# bar.sync id, count (T.ptx.bar.sync): a consumer's named barrier, modelled in the kernels that say
# their mbarrier protocol relies on it (NAMED_BARRIERS_ATTR: v9's residual epilogue); elsewhere it
# sits in branches on values the simulator does not model (split-K's last unit), and orders no mbarrier
NAMED_SYNC_OPS = {"tirx.ptx.bar_sync_count"}
WGMMA_SYNC = {"tirx.ptx.wgmma_commit_group", "tirx.ptx.wgmma_wait_group"}
WGMMA_OTHER = {"tirx.ptx.wgmma_fence"}  # ordering for the tensor core only: nothing to model
TCGEN05_MMA_PREFIX = "tirx.ptx.tcgen05_mma"
WGMMA_MMA_PREFIX = "tirx.ptx.wgmma_"
ENCODE_OPS = {"tirx.cuda.wgmma_encode_matrix_descriptor", "tirx.cuda.tcgen05_encode_matrix_descriptor"}


def dtype_bytes(dtype) -> int:
    s = str(dtype)
    base = s.split("x")[0] if "x" in s and not s.startswith("float8") else s
    return DTYPE_BYTES.get(base, 4)


def handle_of(obj) -> int:
    return obj.__chandle__()


def call_strings(call) -> list[str]:
    return [a.value for a in call.args if type(a).__name__ == "StringImm"]


def is_predicated(call) -> bool:
    """Raw PTX calls end in a flag string; "pred" there means the last operand predicates it."""
    op = op_name(call)
    if not op.startswith("tirx.ptx."):
        return False
    strings = call_strings(call)
    return bool(strings) and "pred" in strings[-1].split(",")


def call_operands(call) -> list:
    ops = [a for a in call.args if type(a).__name__ != "StringImm"]
    return ops[:-1] if is_predicated(call) else ops


def wgmma_descs(call) -> list:
    """A wgmma's shared-memory descriptor operands (B's; and A's first, unless A is in registers:
    the ``rs`` form). After them come scale-d, scale-a, scale-b, and for 16-bit operands the two
    transposes: fp8 and tf32 wgmmas read K-major only and have none."""
    ops = call_operands(call)
    tail = 5 if any(t in call_strings(call) for t in ("e4m3", "e5m2", "tf32")) else 7
    descs = [ops[-tail], ops[-tail + 1]]
    return descs[1:] if "_rs" in op_name(call) else descs


def op_name(call) -> str:
    """The op name, with the PTX dialect's variants folded (``mbarrier_arrive_nocount``,
    ``mapa_u32``... are the same operation to the simulator)."""
    name = call.op.name if isinstance(call.op, ir.Op) else str(call.op)
    for family in _FAMILIES:
        if name.startswith(family):
            return family
    return name


BULK_G2S = "tirx.ptx.cp_async_bulk_g2s"  # plain (non-tensor) bulk copies global -> shared: no tensor map

# longest first: mbarrier_arrive_expect_tx before mbarrier_arrive
_FAMILIES = ("tirx.ptx.mbarrier_arrive_expect_tx", "tirx.ptx.mbarrier_arrive", "tirx.ptx.mbarrier_init",
             "tirx.ptx.mbarrier_expect_tx", "tirx.ptx.mapa", "tirx.ptx.cp_async_bulk_tensor_g2s",
             BULK_G2S,
             "tirx.ptx.tcgen05_commit", "tirx.ptx.tcgen05_mma", "tirx.ptx.st_vec")


def func_call_name(call) -> str:
    return call.args[0].value if call.args and type(call.args[0]).__name__ == "StringImm" else ""


def trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def wrap_int(value, dtype: str):
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    if dtype in ("uint32", "int32", "uint16", "int16", "uint8", "int8", "uint64", "int64"):
        bits = int("".join(c for c in dtype if c.isdigit()))
        value &= (1 << bits) - 1
        if dtype.startswith("int") and value >= 1 << (bits - 1):
            value -= 1 << bits
    if dtype == "bool":
        return int(bool(value))
    return value


def any_unknown(*vals) -> bool:
    return any(v is UNKNOWN for v in vals)


def buffer_size(buf) -> int:
    n = 1
    for d in buf.shape:
        n *= int(d)
    return max(n, 1)


# -- steps: what a compiled statement or call runs per thread. Every step is a generator function
# of the thread; one that must wait yields the token it waits on (the engine resumes it later).
def at_once(action):
    """A step that never waits: ``action(th)`` runs when the thread reaches it."""

    def run(th):
        action(th)
        return
        yield  # pylint: disable=unreachable
    return run


def until_done(poll):
    """A step that waits: ``poll(th)`` gives the token to wait on, or None once the thread may go on."""

    def run(th):
        while (tok := poll(th)) is not None:
            yield tok
    return run
