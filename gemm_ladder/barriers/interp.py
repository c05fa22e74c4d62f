"""Compile a lowered device kernel (TIR) into a program one simulated thread can run.

The protocol checker runs every thread of a CTA (or a cluster) through the kernel's control
flow, so it must evaluate exactly what decides which barrier a thread touches, with which phase
and how many bytes: loop bounds, ``if`` conditions on thread and CTA indices, the local scalars
of pipeline states and tile schedulers, shared-memory addresses and MMA descriptors. Everything
else (the math, register traffic, global loads) is dropped before the run by a dependency
analysis: a statement is kept when it is a *root* (an mbarrier, TMA, MMA, CTA/warp barrier
operation, or a generic store into an MMA operand buffer) or defines a value a kept statement
uses.

The result is a tree of Python closures; each statement is a generator that yields only where
the thread blocks (an mbarrier wait, a named barrier, a warp-collective instruction) or, at
loop back-edges, to let the scheduler interleave threads. The operations themselves are the
simulator's (:class:`gemm_ladder.barriers.sim.Sim`); this module only decides *which* and with
*what* arguments.

Values: Python ints; :class:`Smem` for a shared-memory byte address (``rank`` set when
mapped into another CTA of the cluster); :class:`TMap` for a tensor map; tuples for vector
values (``uint32x2`` descriptors); :data:`UNKNOWN` for anything not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
SYNC_OPS = {"tirx.cuda.cta_sync", "tirx.cuda.warpgroup_sync", "tirx.cuda.cluster_sync"}
WGMMA_SYNC = {"tirx.ptx.wgmma_commit_group", "tirx.ptx.wgmma_wait_group"}
WGMMA_OTHER = {"tirx.ptx.wgmma_fence"}  # ordering for the tensor core only: nothing to model
TCGEN05_MMA_PREFIX = "tirx.ptx.tcgen05_mma"
WGMMA_MMA_PREFIX = "tirx.ptx.wgmma_"
ENCODE_OPS = {"tirx.cuda.wgmma_encode_matrix_descriptor", "tirx.cuda.tcgen05_encode_matrix_descriptor"}


def _bytes(dtype) -> int:
    s = str(dtype)
    base = s.split("x")[0] if "x" in s and not s.startswith("float8") else s
    return DTYPE_BYTES.get(base, 4)


def _h(obj) -> int:
    return obj.__chandle__()


def _strings(call) -> list[str]:
    return [a.value for a in call.args if type(a).__name__ == "StringImm"]


def _predicated(call) -> bool:
    """Raw PTX calls end in a flag string; "pred" there means the last operand predicates it."""
    op = _op(call)
    if not op.startswith("tirx.ptx."):
        return False
    strings = _strings(call)
    return bool(strings) and "pred" in strings[-1].split(",")


def _operands(call) -> list:
    ops = [a for a in call.args if type(a).__name__ != "StringImm"]
    return ops[:-1] if _predicated(call) else ops


def _op(call) -> str:
    """The op name, with the PTX dialect's variants folded (``mbarrier_arrive_nocount``,
    ``mapa_u32``... are the same operation to the simulator)."""
    name = call.op.name if isinstance(call.op, ir.Op) else str(call.op)
    for family in _FAMILIES:
        if name.startswith(family):
            return family
    return name


# longest first: mbarrier_arrive_expect_tx before mbarrier_arrive
_FAMILIES = ("tirx.ptx.mbarrier_arrive_expect_tx", "tirx.ptx.mbarrier_arrive", "tirx.ptx.mbarrier_init",
             "tirx.ptx.mbarrier_expect_tx", "tirx.ptx.mapa", "tirx.ptx.cp_async_bulk_tensor_g2s",
             "tirx.ptx.tcgen05_commit", "tirx.ptx.tcgen05_mma", "tirx.ptx.st_vec")


def _func_name(call) -> str:
    return call.args[0].value if call.args and type(call.args[0]).__name__ == "StringImm" else ""


def _tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(value, dtype: str):
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


def _is_unknown(*vals) -> bool:
    return any(v is UNKNOWN for v in vals)


@dataclass
class Site:
    """One barrier-relevant call in the kernel, in program order."""

    id: int
    kind: str  # init, arrive, expect_tx, wait, tma, mma, commit, wait_group, store, sync
    text: str
    phase_text: str = ""
    extra: dict = field(default_factory=dict)


class Program:
    """The compiled kernel: ``run(th)`` is a generator; ``sites`` name its barrier operations."""

    def __init__(self, func, operand_buffers: set[str]):
        self.func = func
        self.operand_buffers = operand_buffers
        self.slots: dict[int, int] = {}
        self.slot_names: list[str] = []
        self.sites: list[Site] = []
        self.params: dict[str, int] = {}
        self.thread_tags: dict[str, int] = {}  # "threadIdx.x" -> slot
        self.launch_extents: dict[str, object] = {}
        self._kept: set[int] = set()
        self._lane0_only: set[int] = set()
        self.alias: dict[int, int] = {}
        self._find_aliases(func.body)
        self._analyse(func.body)
        self.run = self._stmt(func.body) or _nothing
        for p in func.params:
            self.params[p.name] = self._slot(p)

    # -- slots ---------------------------------------------------------------------------------
    def _slot(self, var) -> int:
        key = _h(var)
        if key not in self.slots:
            self.slots[key] = len(self.slot_names)
            self.slot_names.append(getattr(var, "name", "?"))
        return self.slots[key]

    def _buf_slot(self, buf) -> int:
        """The slot of a local buffer's storage (a DeclBuffer may alias another's data)."""
        key = self._root(_h(buf))
        if key not in self.slots:
            self.slots[key] = len(self.slot_names)
            self.slot_names.append(buf.name)
        return self.slots[key]

    def _root(self, h: int) -> int:
        while h in self.alias:
            h = self.alias[h]
        return h

    def _find_aliases(self, s) -> None:
        t = type(s).__name__
        if t == "SeqStmt":
            for x in s.seq:
                self._find_aliases(x)
            return
        if t == "DeclBuffer":
            data = s.data
            if type(data).__name__ == "Call" and _op(data) == "tirx.buffer_data":
                src = data.args[0]
                if _h(src) != _h(s.buffer):
                    self.alias[_h(s.buffer)] = _h(src)
        for f in ("body", "then_case", "else_case"):
            v = getattr(s, f, None)
            if v is not None:
                self._find_aliases(v)

    def new_env(self) -> list:
        return [UNKNOWN] * len(self.slot_names)

    # -- dependency analysis: which statements matter --------------------------------------------
    def _analyse(self, body) -> None:
        leaves: list[tuple[object, set, set, bool]] = []  # (stmt, defs, uses, root)
        parents: dict[int, list[tuple[object, set]]] = {}  # leaf handle -> enclosing (stmt, uses)

        def walk(s, stack):
            t = type(s).__name__
            if t == "SeqStmt":
                for x in s.seq:
                    walk(x, stack)
            elif t == "AttrStmt":
                uses = _uses(s.value) if s.attr_key == "thread_extent" else set()
                walk(s.body, stack + [(s, uses)])
            elif t == "For":
                uses = _uses(s.min) | _uses(s.extent)
                walk(s.body, stack + [(s, uses | {_h(s.loop_var)})])
            elif t == "While":
                walk(s.body, stack + [(s, _uses(s.condition))])
            elif t == "IfThenElse":
                inner = stack + [(s, _uses(s.condition))]
                walk(s.then_case, inner)
                if s.else_case is not None:
                    walk(s.else_case, inner)
            else:
                defs, uses, root = self._leaf_info(s)
                leaves.append((s, {self._root(d) for d in defs}, {self._root(u) for u in uses}, root))
                parents[_h(s)] = [(p, {self._root(u) for u in pu}) for p, pu in stack]

        walk(body, [])

        def closure(roots_ok) -> set[int]:
            needed: set[int] = set()
            kept: set[int] = set()
            changed = True
            while changed:
                changed = False
                for s, defs, uses, root in leaves:
                    key = _h(s)
                    if key in kept:
                        continue
                    if (root and roots_ok(s)) or (defs & needed):
                        kept.add(key)
                        needed |= uses
                        for parent, puses in parents[key]:
                            kept.add(_h(parent))
                            needed |= puses
                        changed = True
            return kept

        self._kept = closure(lambda s: True)
        # leaves kept only for wgmma descriptors: wgmma is warp-collective and its descriptors
        # warp-uniform, so lane 0 alone computes them (a 32x smaller run)
        other = closure(lambda s: not _is_wgmma_mma(s))
        self._lane0_only = {_h(s) for s, _, _, root in leaves
                            if not root and _h(s) in self._kept and _h(s) not in other}

    def _leaf_info(self, s) -> tuple[set, set, bool]:
        t = type(s).__name__
        if t == "Bind":
            return {_h(s.var)}, _uses(s.value), False
        if t == "BufferStore":
            buf = s.buffer
            scope = buf.scope()
            if scope == "local":
                return {self._root(_h(buf))}, _uses(s.value) | set().union(*[_uses(i) for i in s.indices]), False
            if scope.startswith("shared") and buf.name in self.operand_buffers:
                return set(), set().union(*[_uses(i) for i in s.indices]), True
            return set(), set(), False
        if t == "Evaluate" and type(s.value).__name__ == "Call":
            call = s.value
            op = _op(call)
            if op in MBAR_OPS or op in SYNC_OPS or op in WGMMA_SYNC:
                return set(), _uses(call), True
            if op.startswith("tirx.ptx.cp_async_bulk_tensor_g2s") or op == "tirx.ptx.tcgen05_commit":
                return set(), _uses(call), True
            if op.startswith(TCGEN05_MMA_PREFIX):
                ops = _operands(call)
                return set(), _uses(ops[1]) | _uses(ops[2]), True
            if op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_SYNC and op not in WGMMA_OTHER:
                ops = _operands(call)
                return set(), _uses(ops[-7]) | _uses(ops[-6]), True
            if op in ENCODE_OPS:
                ops = _operands(call)
                return _lvalue_defs(ops[0]), set().union(*[_uses(a) for a in ops[1:]]), False
            if op == "tirx.ptx.mapa":
                ops = _operands(call)
                return _lvalue_defs(ops[0]), set().union(*[_uses(a) for a in ops[1:]]), False
            if op == "tirx.cuda.func_call" and _func_name(call) == _WATCHDOG_FN:
                return set(), _uses(call), True
            if op == "tirx.ptx.st_vec" and "shared" in _strings(call):
                # the simulator keeps only the stores that land in an MMA operand tile
                return set(), _uses(_operands(call)[0]), True
            return set(), set(), False
        return set(), set(), False

    # -- statements -------------------------------------------------------------------------
    def _stmt(self, s):
        """A generator function for ``s``, or None when nothing in it matters."""
        t = type(s).__name__
        if t != "SeqStmt" and _h(s) not in self._kept:
            return None
        run = getattr(self, "_s_" + t)(s)
        if run is not None and _h(s) in self._lane0_only:
            inner = run

            def run(th):
                if th.lane == 0:
                    yield from inner(th)
        return run

    def _s_SeqStmt(self, s):
        parts = [p for p in (self._stmt(x) for x in s.seq) if p is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]

        def run(th):
            for p in parts:
                yield from p(th)
        return run

    def _s_AttrStmt(self, s):
        body = self._stmt(s.body) or _nothing
        if s.attr_key == "thread_extent":
            iv = s.node
            tag = iv.thread_tag
            slot = self._slot(iv.var)
            self.thread_tags[tag] = slot
            self.launch_extents[tag] = s.value
            return body  # the simulator fills the slot from the thread's coordinates
        return body

    def _s_For(self, s):
        body = self._stmt(s.body) or _nothing
        slot = self._slot(s.loop_var)
        lo, ext = self._expr(s.min), self._expr(s.extent)

        def run(th):
            start, n = lo(th), ext(th)
            if _is_unknown(start, n):
                raise SimError(f"loop bound of {s.loop_var.name} is not known")
            env = th.env
            for i in range(start, start + n):
                env[slot] = i
                yield from body(th)
                yield TICK
        return run

    def _s_While(self, s):
        body = self._stmt(s.body) or _nothing
        cond = self._expr(s.condition)

        def run(th):
            while True:
                c = cond(th)
                if c is UNKNOWN:
                    raise SimError(f"while condition {s.condition} is not known")
                if not c:
                    return
                yield from body(th)
                yield TICK
        return run

    def _s_IfThenElse(self, s):
        then = self._stmt(s.then_case) or _nothing
        other = (self._stmt(s.else_case) if s.else_case is not None else None) or _nothing
        cond = self._expr(s.condition)
        text = str(s.condition)

        def run(th):
            c = cond(th)
            if c is UNKNOWN:
                raise SimError(f"branch condition {text} is not known")
            if c:
                yield from then(th)
            else:
                yield from other(th)
        return run

    def _s_Bind(self, s):
        slot = self._slot(s.var)
        value = self._expr(s.value)

        def run(th):
            th.env[slot] = value(th)
            return
            yield  # pylint: disable=unreachable
        return run

    def _s_BufferStore(self, s):
        buf = s.buffer
        if buf.scope() == "local":
            slot = self._buf_slot(buf)
            idx = self._flat_index(buf, s.indices)
            value = self._expr(s.value)
            size = _buffer_size(buf)

            def run(th):
                arr = th.env[slot]
                if not isinstance(arr, list):
                    arr = th.env[slot] = [UNKNOWN] * size
                i = idx(th)
                if i is UNKNOWN:
                    raise SimError(f"index of {buf.name} is not known")
                arr[i] = value(th)
                return
                yield  # pylint: disable=unreachable
            return run
        # a generic store into an MMA operand tile
        addr = self._shared_address(buf, s.indices)
        site = self._site("store", s, extra={"buffer": buf.name})

        def run(th):
            th.sim.smem_store(th, addr(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _s_Evaluate(self, s):
        call = s.value
        op = _op(call)
        handler = _CALLS.get(op)
        if handler is None:
            if op.startswith("tirx.ptx.cp_async_bulk_tensor_g2s"):
                handler = Program._c_tma_load
            elif op.startswith(TCGEN05_MMA_PREFIX):
                handler = Program._c_tcgen05_mma
            elif op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_OTHER:
                handler = Program._c_wgmma_mma
            elif op == "tirx.cuda.func_call" and _func_name(call) == _WATCHDOG_FN:
                handler = Program._c_watchdog_wait
            else:
                return None
        return handler(self, call)

    def _s_DeclBuffer(self, s):
        return None

    def _s_AllocBuffer(self, s):
        buf = s.buffer
        if buf.scope() != "local":
            return None
        slot = self._buf_slot(buf)
        size = _buffer_size(buf)

        def run(th):
            th.env[slot] = [UNKNOWN] * size
            return
            yield  # pylint: disable=unreachable
        return run

    # -- calls ---------------------------------------------------------------------------------
    def _site(self, kind, node, phase_text="", extra=None) -> Site:
        site = Site(len(self.sites), kind, _short(str(node)), phase_text, extra or {})
        self.sites.append(site)
        return site

    def _c_mbarrier_init(self, call):
        ops = _operands(call)
        addr, count = self._expr(ops[0]), self._expr(ops[1])
        site = self._site("init", call)

        def run(th):
            th.sim.mbar_init(th, addr(th), count(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_mbarrier_arrive(self, call):
        ops = _operands(call)
        addr = self._expr(ops[0])
        count = self._expr(ops[1]) if len(ops) > 1 else (lambda th: 1)
        pred = self._pred(call)
        site = self._site("arrive", call)

        def run(th):
            if pred is None or pred(th):
                th.sim.mbar_arrive(th, addr(th), count(th), None, site)
            else:
                th.sim.mbar_skip(th, addr(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_mbarrier_arrive_expect_tx(self, call):
        ops = _operands(call)
        addr, tx = self._expr(ops[0]), self._expr(ops[1])
        pred = self._pred(call)
        site = self._site("arrive", call, extra={"expect_tx": True})

        def run(th):
            if pred is None or pred(th):
                th.sim.mbar_arrive(th, addr(th), 1, tx(th), site)
            else:
                th.sim.mbar_skip(th, addr(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_mbarrier_expect_tx(self, call):
        ops = _operands(call)
        addr, tx = self._expr(ops[0]), self._expr(ops[1])
        site = self._site("expect_tx", call)

        def run(th):
            th.sim.mbar_expect_tx(th, addr(th), tx(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _wait(self, call, addr_e, phase_e, site_extra=None):
        addr, phase = self._expr(addr_e), self._expr(phase_e)
        site = self._site("wait", call, phase_text=_simplified(phase_e), extra=site_extra or {})

        def run(th):
            a, p = addr(th), phase(th)
            while True:
                tok = th.sim.mbar_wait(th, a, p, site)
                if tok is None:
                    return
                yield tok
        return run

    def _c_mbarrier_wait(self, call):
        ops = _operands(call)
        return self._wait(call, ops[0], ops[1])

    _c_mbarrier_wait_cluster = _c_mbarrier_wait

    def _c_watchdog_wait(self, call):
        # gemm_ladder_bounded_wait(bar, phase, record, bar_id, stage, site, limit_ns)
        ops = _operands(call)
        return self._wait(call, ops[0], ops[1], {"watchdog_site": int(ops[5].value)})

    def _c_tma_load(self, call):
        ops = _operands(call)
        strings = _strings(call)
        multicast = any("multicast" in x for x in strings)
        dst, tmap = self._expr(ops[0]), self._expr(ops[1])
        # dst, tensor map, coords..., mbar[, cta_mask][, cache hint]
        rest = ops[2:]
        n_extra = 1 if multicast else 0
        if any("L2::cache_hint" in x for x in strings):
            n_extra += 1
        coords_e = rest[: len(rest) - 1 - n_extra]
        coords = [self._expr(c) for c in coords_e]
        mbar = self._expr(rest[len(coords_e)])
        mask = self._expr(rest[len(coords_e) + 1]) if multicast else None
        site = self._site("tma", call, extra={"multicast": multicast})

        def run(th):
            th.sim.tma_load(th, dst(th), tmap(th), [c(th) for c in coords], mbar(th),
                         mask(th) if mask is not None else None, site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_tcgen05_mma(self, call):
        ops = _operands(call)
        descs = [self._expr(ops[1]), self._expr(ops[2])]
        site = self._site("mma", call, extra={"engine": "tcgen05"})

        def run(th):
            th.sim.mma_issue(th, "tcgen05", [d(th) for d in descs], site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_tcgen05_commit(self, call):
        ops = _operands(call)
        strings = _strings(call)
        addr = self._expr(ops[0])
        mask = self._expr(ops[1]) if any("multicast" in x for x in strings) and len(ops) > 1 else None
        pred = self._pred(call)
        site = self._site("commit", call)

        def run(th):
            if pred is None or pred(th):
                th.sim.tcgen05_commit(th, addr(th), mask(th) if mask is not None else None, site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_wgmma_mma(self, call):
        ops = _operands(call)
        strings = _strings(call)
        n_desc = 1 if "_rs" in _op(call) else 2
        descs = [self._expr(ops[-7]), self._expr(ops[-6])][2 - n_desc:]
        site = self._site("mma", call, extra={"engine": "wgmma", "shape": next(
            (x for x in strings if x.startswith("m64")), "")})

        def run(th):
            while True:
                tok = th.sim.warp_collective(th, site)
                if tok is None:
                    break
                yield tok
            # one issue per warp: the descriptors are warp-uniform, lane 0 computed them
            # (see _lane0_only); the reads belong to lane 0, checked with every lane's clock
            th.sim.warp_uniform(th, site, lambda: th.sim.wgmma_issue(th, [d(th.cta.threads[th.warp * 32])
                                                                          for d in descs], site))
        return run

    def _c_wgmma_commit(self, call):
        site = self._site("commit", call, extra={"engine": "wgmma"})

        def run(th):
            th.sim.wgmma_commit(th, site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_wgmma_wait(self, call):
        n = self._expr(_operands(call)[0])
        site = self._site("wait_group", call)

        def run(th):
            k = n(th)
            while True:
                tok = th.sim.warp_collective(th, site, wait_group=k)
                if tok is None:
                    return
                yield tok
        return run

    def _c_cta_sync(self, call):
        site = self._site("sync", call)

        def run(th):
            while True:
                tok = th.sim.bar_sync(th, 0, None, site)
                if tok is None:
                    return
                yield tok
        return run

    def _c_warpgroup_sync(self, call):
        bar = self._expr(_operands(call)[0])
        site = self._site("sync", call)

        def run(th):
            b = bar(th)
            while True:
                tok = th.sim.bar_sync(th, b, 128, site)
                if tok is None:
                    return
                yield tok
        return run

    def _c_cluster_sync(self, call):
        site = self._site("sync", call)

        def run(th):
            while True:
                tok = th.sim.cluster_sync(th, site)
                if tok is None:
                    return
                yield tok
        return run

    def _c_encode(self, call):
        ops = _operands(call)
        dst = self._lvalue(ops[0])
        addr = self._expr(ops[1])
        rest = [self._expr(a) for a in ops[2:]]

        def run(th):
            slot, i = dst(th)
            a = addr(th)
            value = UNKNOWN
            if isinstance(a, Smem):
                lo = (a.off >> 4) & 0x3FFF
                fields = [r(th) for r in rest]
                value = lo
                if fields and isinstance(fields[0], int):
                    value |= (fields[0] & 0x3FFF) << 16
                if len(fields) > 1 and isinstance(fields[1], int):
                    value |= (fields[1] & 0x3FFF) << 32
            arr = th.env[slot]
            if not isinstance(arr, list):
                arr = th.env[slot] = [UNKNOWN] * (i + 1)
            arr[i] = value
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_mapa(self, call):
        ops = _operands(call)
        dst = self._lvalue(ops[0])
        addr, rank = self._expr(ops[1]), self._expr(ops[2])

        def run(th):
            slot, i = dst(th)
            a, r = addr(th), rank(th)
            arr = th.env[slot]
            if not isinstance(arr, list):
                arr = th.env[slot] = [UNKNOWN] * (i + 1)
            arr[i] = Smem(a.off, r) if isinstance(a, Smem) and isinstance(r, int) else UNKNOWN
            return
            yield  # pylint: disable=unreachable
        return run

    def _c_st_vec(self, call):
        ops = _operands(call)
        addr = self._expr(ops[0])
        site = self._site("store", call)

        def run(th):
            th.sim.smem_store(th, addr(th), site)
            return
            yield  # pylint: disable=unreachable
        return run

    def _pred(self, call):
        """The predicate of a ``@p`` raw PTX call (``pred=``), if the call has one."""
        if not _predicated(call):
            return None
        return self._expr([a for a in call.args if type(a).__name__ != "StringImm"][-1])

    # -- expressions ------------------------------------------------------------------------
    def _lvalue(self, e):
        """``address_of(buf[i])`` or ``buf[i]`` of a local buffer -> (slot, index)."""
        if type(e).__name__ == "Call" and _op(e) == "tirx.address_of":
            e = e.args[0]
        if type(e).__name__ != "TensorLoad":
            raise SimError(f"cannot write through {e}")
        buf = e.source
        slot = self._buf_slot(buf)
        idx = self._flat_index(buf, e.indices)

        def f(th):
            i = idx(th)
            if i is UNKNOWN:
                raise SimError(f"index of {buf.name} is not known")
            return slot, i
        return f

    def _flat_index(self, buf, indices):
        idx = [self._expr(i) for i in indices]
        shape = [int(x) if hasattr(x, "value") or isinstance(x, int) else None for x in buf.shape]
        if len(idx) == 1:
            return idx[0]
        strides = []
        acc = 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d if d is not None else 1
        strides.reverse()

        def f(th):
            total = 0
            for e, st in zip(idx, strides):
                v = e(th)
                if v is UNKNOWN:
                    return UNKNOWN
                total += v * st
            return total
        return f

    def _shared_address(self, buf, indices):
        idx = self._flat_index(buf, indices)
        elem = _bytes(buf.dtype)
        off = buf.elem_offset
        base = int(off) if off is not None and hasattr(off, "value") else 0

        def f(th):
            i = idx(th)
            if isinstance(i, tuple):  # a vector index (Ramp): its first lane
                i = i[0]
            if i is UNKNOWN:
                return UNKNOWN
            return Smem((base + i) * elem, None, elem)
        return f

    def _expr(self, e):
        t = type(e).__name__
        handler = _EXPR.get(t)
        if handler is None:
            return _const(UNKNOWN)
        return handler(self, e)

    def _e_IntImm(self, e):
        return _const(int(e.value))

    def _e_FloatImm(self, e):
        return _const(float(e.value))

    def _e_StringImm(self, e):
        return _const(e.value)

    def _e_Var(self, e):
        if "TensorMap" in str(getattr(e, "ty", "")):
            return _const(TMap(e.name))
        slot = self._slot(e)
        return lambda th: th.env[slot]

    def _e_TensorLoad(self, e):
        buf = e.source
        scope = buf.scope()
        if scope == "local":
            slot = self._buf_slot(buf)
            idx = self._flat_index(buf, e.indices)

            def f(th):
                arr = th.env[slot]
                i = idx(th)
                if not isinstance(arr, list) or i is UNKNOWN or not 0 <= i < len(arr):
                    return UNKNOWN
                return arr[i]
            return f
        return _const(UNKNOWN)

    def _e_Cast(self, e):
        v = self._expr(e.value)
        dtype = str(e.ty)

        def f(th):
            x = v(th)
            if x is UNKNOWN:
                return x
            if dtype.startswith("float"):
                return x
            if isinstance(x, float):
                x = int(x)
            return _wrap(x, dtype)
        return f

    def _e_Let(self, e):
        slot = self._slot(e.var)
        value, body = self._expr(e.value), self._expr(e.body)

        def f(th):
            th.env[slot] = value(th)
            return body(th)
        return f

    def _e_Select(self, e):
        c, a, b = self._expr(e.condition), self._expr(e.true_value), self._expr(e.false_value)

        def f(th):
            x = c(th)
            if x is UNKNOWN:
                return x
            return a(th) if x else b(th)
        return f

    def _e_Ramp(self, e):
        base, stride, lanes = self._expr(e.base), self._expr(e.stride), int(e.lanes)

        def f(th):
            b, s = base(th), stride(th)
            if _is_unknown(b, s):
                return UNKNOWN
            return tuple(b + s * i for i in range(lanes))
        return f

    def _e_Broadcast(self, e):
        v, lanes = self._expr(e.value), int(e.lanes)
        return lambda th: tuple([v(th)] * lanes)

    def _e_Shuffle(self, e):
        vecs = [self._expr(v) for v in e.vectors]
        idx = [int(i) for i in e.indices]

        def f(th):
            flat = []
            for v in vecs:
                x = v(th)
                if x is UNKNOWN:
                    return x
                flat.extend(x if isinstance(x, tuple) else (x,))
            out = tuple(flat[i] for i in idx)
            return out[0] if len(out) == 1 else out
        return f

    def _e_Not(self, e):
        a = self._expr(e.a)

        def f(th):
            x = a(th)
            return x if x is UNKNOWN else int(not x)
        return f

    def _e_Call(self, e):
        op = _op(e)
        h = _ECALLS.get(op)
        if h is not None:
            return h(self, e)
        if op == "tirx.cuda.func_call" and _func_name(e) == "tvm_builtin_pointer_offset":
            ops = _operands(e)
            ptr, off = self._expr(ops[0]), self._expr(ops[1])

            def f(th):
                p, o = ptr(th), off(th)
                if isinstance(p, Smem) and isinstance(o, int):
                    return Smem(p.off + o * p.elem, p.rank, p.elem)
                return UNKNOWN
            return f
        return _const(UNKNOWN)

    def _ec_address_of(self, e):
        arg = e.args[0]
        if type(arg).__name__ == "Var":
            return _const(TMap(arg.name)) if "TensorMap" in str(getattr(arg, "ty", "")) else _const(UNKNOWN)
        if type(arg).__name__ != "TensorLoad":
            return _const(UNKNOWN)
        buf = arg.source
        scope = buf.scope()
        if scope.startswith("shared"):
            return self._shared_address(buf, arg.indices)
        if scope == "local":
            lv = self._lvalue(arg)

            def f(th):
                slot, i = lv(th)
                return LocalRef(slot, i)
            return f
        return _const(UNKNOWN)

    def _ec_passthrough(self, e):
        return self._expr(_operands(e)[-1])

    def _ec_reinterpret(self, e):
        v = self._expr(_operands(e)[-1])
        dtype = str(e.ty)

        def f(th):
            x = v(th)
            if x is UNKNOWN or isinstance(x, (Smem, TMap)):
                return x
            if dtype == "uint32x2" and isinstance(x, int):
                return (x & 0xFFFFFFFF, (x >> 32) & 0xFFFFFFFF)
            if dtype in ("uint64", "int64") and isinstance(x, tuple) and len(x) == 2:
                return (x[0] & 0xFFFFFFFF) | ((x[1] & 0xFFFFFFFF) << 32)
            return x
        return f

    def _ec_thread_rank(self, e):
        return lambda th: th.tid

    def _ec_elect_sync(self, e):
        return lambda th: int(th.lane == th.sim_leader_lane())

    def _ec_warp_shuffle(self, e):
        return self._expr(_operands(e)[1])

    def _ec_mov_sreg(self, e):
        name = next((a.value for a in e.args if type(a).__name__ == "StringImm"), "")
        return lambda th: th.sreg(name)

    def _ec_if_then_else(self, e):
        c, a, b = (self._expr(x) for x in _operands(e)[:3])

        def f(th):
            x = c(th)
            if x is UNKNOWN:
                return x
            return a(th) if x else b(th)
        return f


def _binary(fn):
    def handler(self, e):
        a, b = self._expr(e.a), self._expr(e.b)

        def f(th):
            x, y = a(th), b(th)
            if x is UNKNOWN or y is UNKNOWN:
                return UNKNOWN
            if isinstance(x, tuple) or isinstance(y, tuple):
                xs = x if isinstance(x, tuple) else (x,) * len(y)
                ys = y if isinstance(y, tuple) else (y,) * len(x)
                return tuple(fn(p, q) for p, q in zip(xs, ys))
            try:
                return fn(x, y)
            except (TypeError, ZeroDivisionError):
                return UNKNOWN
        return f
    return handler


def _logic(is_and):
    def handler(self, e):
        a, b = self._expr(e.a), self._expr(e.b)

        def f(th):
            x = a(th)
            if x is not UNKNOWN and bool(x) != is_and:
                return int(not is_and)  # short circuit: and(False, .) / or(True, .)
            y = b(th)
            if x is UNKNOWN or y is UNKNOWN:
                if y is not UNKNOWN and bool(y) != is_and:
                    return int(not is_and)
                return UNKNOWN
            return int(bool(y))
        return f
    return handler


def _const(v):
    return lambda th: v


def _nothing(th):
    return
    yield  # pylint: disable=unreachable


def _simplified(e) -> str:
    """A phase expression as the table prints it: constants folded, ``^ 0`` gone."""
    try:
        from tvm import arith  # pylint: disable=import-outside-toplevel

        e = arith.Analyzer().simplify(e)
    except Exception:  # pylint: disable=broad-except
        pass
    return str(e)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _uses(e) -> set[int]:
    """Handles of the variables and local buffers an expression reads."""
    out: set[int] = set()

    def walk(x):
        t = type(x).__name__
        if t == "Var":
            out.add(_h(x))
        elif t == "TensorLoad":
            out.add(_h(x.source))
            for i in x.indices:
                walk(i)
        elif t == "Call":
            for a in x.args:
                walk(a)
        elif t in ("IntImm", "FloatImm", "StringImm"):
            return
        elif t == "Let":
            walk(x.value)
            walk(x.body)
        elif t == "Shuffle":
            for v in x.vectors:
                walk(v)
        else:
            for name in ("a", "b", "value", "condition", "true_value", "false_value", "base", "stride"):
                v = getattr(x, name, None)
                if v is not None and not isinstance(v, (int, float, str)):
                    walk(v)
    if e is not None:
        walk(e)
    return out


def _lvalue_defs(e) -> set[int]:
    if type(e).__name__ == "Call" and _op(e) == "tirx.address_of":
        e = e.args[0]
    if type(e).__name__ == "TensorLoad":
        return {_h(e.source)}
    return set()


def _is_wgmma_mma(s) -> bool:
    if type(s).__name__ != "Evaluate" or type(s.value).__name__ != "Call":
        return False
    op = _op(s.value)
    return op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_SYNC and op not in WGMMA_OTHER


def _buffer_size(buf) -> int:
    n = 1
    for d in buf.shape:
        n *= int(d)
    return max(n, 1)


_WATCHDOG_FN = "gemm_ladder_bounded_wait"

_CALLS = {
    "tirx.ptx.mbarrier_init": Program._c_mbarrier_init,
    "tirx.ptx.mbarrier_arrive": Program._c_mbarrier_arrive,
    "tirx.ptx.mbarrier_arrive_expect_tx": Program._c_mbarrier_arrive_expect_tx,
    "tirx.ptx.mbarrier_expect_tx": Program._c_mbarrier_expect_tx,
    "tirx.cuda.mbarrier_wait": Program._c_mbarrier_wait,
    "tirx.cuda.mbarrier_wait_acquire_cluster": Program._c_mbarrier_wait_cluster,
    "tirx.ptx.tcgen05_commit": Program._c_tcgen05_commit,
    "tirx.ptx.wgmma_commit_group": Program._c_wgmma_commit,
    "tirx.ptx.wgmma_wait_group": Program._c_wgmma_wait,
    "tirx.cuda.cta_sync": Program._c_cta_sync,
    "tirx.cuda.warpgroup_sync": Program._c_warpgroup_sync,
    "tirx.cuda.cluster_sync": Program._c_cluster_sync,
    "tirx.cuda.wgmma_encode_matrix_descriptor": Program._c_encode,
    "tirx.cuda.tcgen05_encode_matrix_descriptor": Program._c_encode,
    "tirx.ptx.mapa": Program._c_mapa,
    "tirx.ptx.st_vec": Program._c_st_vec,
}

_EXPR = {
    "IntImm": Program._e_IntImm, "FloatImm": Program._e_FloatImm, "StringImm": Program._e_StringImm,
    "Var": Program._e_Var, "TensorLoad": Program._e_TensorLoad, "Cast": Program._e_Cast,
    "Let": Program._e_Let, "Select": Program._e_Select, "Ramp": Program._e_Ramp,
    "Broadcast": Program._e_Broadcast, "Shuffle": Program._e_Shuffle, "Not": Program._e_Not,
    "Call": Program._e_Call,
    "Add": _binary(lambda x, y: x + y if not isinstance(x, Smem) else Smem(x.off + y * x.elem, x.rank, x.elem)),
    "Sub": _binary(lambda x, y: x - y),
    "Mul": _binary(lambda x, y: x * y),
    "FloorDiv": _binary(lambda x, y: x // y),
    "FloorMod": _binary(lambda x, y: x % y),
    "Div": _binary(lambda x, y: _tdiv(x, y) if isinstance(x, int) and isinstance(y, int) else x / y),
    "Mod": _binary(lambda x, y: x - _tdiv(x, y) * y),
    "Min": _binary(min), "Max": _binary(max),
    "EQ": _binary(lambda x, y: int(x == y)), "NE": _binary(lambda x, y: int(x != y)),
    "LT": _binary(lambda x, y: int(x < y)), "LE": _binary(lambda x, y: int(x <= y)),
    "GT": _binary(lambda x, y: int(x > y)), "GE": _binary(lambda x, y: int(x >= y)),
    "BitwiseAnd": _binary(lambda x, y: x & y), "BitwiseOr": _binary(lambda x, y: x | y),
    "BitwiseXor": _binary(lambda x, y: x ^ y),
    "LShift": _binary(lambda x, y: x << y), "RShift": _binary(lambda x, y: x >> y),
    "And": _logic(True), "Or": _logic(False),
}

_ECALLS = {
    "tirx.address_of": Program._ec_address_of,
    "tirx.cuda.cvta_generic_to_shared": Program._ec_passthrough,
    "tirx.reinterpret": Program._ec_reinterpret,
    "tirx.cuda.thread_rank": Program._ec_thread_rank,
    "tirx.cuda.elect_sync": Program._ec_elect_sync,
    "tirx.tvm_warp_shuffle": Program._ec_warp_shuffle,
    "tirx.cuda.mov_sreg": Program._ec_mov_sreg,
    "tirx.if_then_else": Program._ec_if_then_else,
}

__all__ = ["Program", "Smem", "TMap", "UNKNOWN", "SimError", "Site", "TICK"]
