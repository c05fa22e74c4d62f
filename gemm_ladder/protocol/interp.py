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
simulator's (:class:`gemm_ladder.protocol.sim.Sim`); this module only decides *which* and with
*what* arguments.

The values are those of :mod:`.values`; expressions compile in :mod:`.exprs`, calls in
:mod:`.calls`.
"""

from __future__ import annotations

from .calls import WATCHDOG_FN, CallCompiler, Site
from .exprs import ExprCompiler, is_table, lvalue_defs, uses_of
from .values import (BULK_G2S, ENCODE_OPS, MBAR_OPS, NAMED_SYNC_OPS, SYNC_OPS, TCGEN05_MMA_PREFIX, TICK, UNKNOWN, WGMMA_MMA_PREFIX, WGMMA_OTHER,
    WGMMA_SYNC, SimError, any_unknown, at_once, buffer_size, call_operands, call_strings, func_call_name, handle_of,
    op_name, wgmma_descs)

__all__ = ["Program", "Site"]


class Program(CallCompiler, ExprCompiler):
    """The compiled kernel: ``run(th)`` is a generator; ``sites`` name its barrier operations."""

    def __init__(self, func, operand_buffers: set[str], named_barriers: bool = False,
                 counted_branches: bool = False):
        self.func = func
        self.named_barriers = named_barriers  # model bar.sync id, count (NAMED_SYNC_OPS)
        # a branch whose condition is not known (a count other CTAs' atomics decide) goes both ways,
        # every other visit of a thread (COUNTED_BRANCHES_ATTR): not taken first, then taken, ...
        self.counted_branches = counted_branches
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
        self.buffer_ptr: dict[int, object] = {}  # buffer handle -> the pointer Var it is declared over
        self._find_aliases(func.body)
        self._analyse(func.body)
        self.run = self._stmt(func.body) or _nothing
        for p in func.params:
            self.params[p.name] = self._slot(p)

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
                uses = uses_of(s.value) if s.attr_key == "thread_extent" else set()
                walk(s.body, stack + [(s, uses)])
            elif t == "For":
                uses = uses_of(s.min) | uses_of(s.extent)
                walk(s.body, stack + [(s, uses | {handle_of(s.loop_var)})])
            elif t == "While":
                walk(s.body, stack + [(s, uses_of(s.condition))])
            elif t == "IfThenElse":
                inner = stack + [(s, uses_of(s.condition))]
                walk(s.then_case, inner)
                if s.else_case is not None:
                    walk(s.else_case, inner)
            else:
                defs, uses, root = self._leaf_info(s)
                leaves.append((s, {self._root(d) for d in defs}, {self._root(u) for u in uses}, root))
                parents[handle_of(s)] = [(p, {self._root(u) for u in pu}) for p, pu in stack]

        walk(body, [])

        def closure(roots_ok) -> set[int]:
            needed: set[int] = set()
            kept: set[int] = set()
            changed = True
            while changed:
                changed = False
                for s, defs, uses, root in leaves:
                    key = handle_of(s)
                    if key in kept:
                        continue
                    if (root and roots_ok(s)) or (defs & needed):
                        kept.add(key)
                        needed |= uses
                        for parent, puses in parents[key]:
                            kept.add(handle_of(parent))
                            needed |= puses
                        changed = True
            return kept

        self._kept = closure(lambda s: True)
        # leaves kept only for wgmma descriptors: wgmma is warp-collective and its descriptors
        # warp-uniform, so lane 0 alone computes them (a 32x smaller run)
        other = closure(lambda s: not _is_wgmma_mma(s))
        self._lane0_only = {handle_of(s) for s, _, _, root in leaves
                            if not root and handle_of(s) in self._kept and handle_of(s) not in other}

    def _leaf_info(self, s) -> tuple[set, set, bool]:
        t = type(s).__name__
        if t == "DeclBuffer" and handle_of(s.buffer) in self.buffer_ptr:
            return {handle_of(s.buffer)}, {handle_of(s.data)}, False
        if t == "Bind":
            return {handle_of(s.var)}, uses_of(s.value), False
        if t == "BufferStore":
            buf = s.buffer
            scope = buf.scope()
            if scope == "local":
                return {self._root(handle_of(buf))}, uses_of(s.value) | set().union(*[uses_of(i) for i in s.indices]), False
            if scope.startswith("shared") and buf.name in self.operand_buffers:
                return set(), set().union(*[uses_of(i) for i in s.indices]), True
            if is_table(buf, self.operand_buffers):
                return {handle_of(buf)}, uses_of(s.value) | set().union(*[uses_of(i) for i in s.indices]), False
            return set(), set(), False
        if t == "Evaluate" and type(s.value).__name__ == "Call":
            call = s.value
            op = op_name(call)
            if op in MBAR_OPS or op in SYNC_OPS or op in WGMMA_SYNC or (self.named_barriers and op in NAMED_SYNC_OPS):
                return set(), uses_of(call), True
            if (op.startswith("tirx.ptx.cp_async_bulk_tensor_g2s") or op.startswith(BULK_G2S)
                    or op == "tirx.ptx.tcgen05_commit"):
                return set(), uses_of(call), True
            if op.startswith(TCGEN05_MMA_PREFIX):
                ops = call_operands(call)
                return set(), uses_of(ops[1]) | uses_of(ops[2]), True
            if op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_SYNC and op not in WGMMA_OTHER:
                return set(), set().union(*[uses_of(d) for d in wgmma_descs(call)]), True
            if op in ENCODE_OPS:
                ops = call_operands(call)
                return lvalue_defs(ops[0]), set().union(*[uses_of(a) for a in ops[1:]]), False
            if op == "tirx.ptx.mapa":
                ops = call_operands(call)
                return lvalue_defs(ops[0]), set().union(*[uses_of(a) for a in ops[1:]]), False
            if op == "tirx.cuda.func_call" and func_call_name(call) == WATCHDOG_FN:
                return set(), uses_of(call), True
            if op == "tirx.ptx.st_vec" and "shared" in call_strings(call):
                # the simulator keeps only the stores that land in an MMA operand tile
                return set(), uses_of(call_operands(call)[0]), True
            return set(), set(), False
        return set(), set(), False

    # -- statements -------------------------------------------------------------------------
    def _stmt(self, s):
        """A generator function for ``s``, or None when nothing in it matters."""
        t = type(s).__name__
        if t != "SeqStmt" and handle_of(s) not in self._kept:
            return None
        run = getattr(self, "_s_" + t)(s)
        if run is not None and handle_of(s) in self._lane0_only:
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
            if any_unknown(start, n):
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
        key = handle_of(s)

        def run(th):
            c = cond(th)
            if c is UNKNOWN and self.counted_branches:
                # every thread of a warpgroup comes here as often as the others: they decide alike
                visits = th.branch_visits.get(key, 0)
                th.branch_visits[key] = visits + 1
                c = visits % 2 == 1
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

        def bind(th):
            th.env[slot] = value(th)
        return at_once(bind)

    def _s_BufferStore(self, s):
        buf = s.buffer
        if buf.scope() == "local":
            slot = self._buf_slot(buf)
            idx = self._flat_index(buf, s.indices)
            value = self._expr(s.value)
            size = buffer_size(buf)

            def store(th):
                arr = th.env[slot]
                if not isinstance(arr, list):
                    arr = th.env[slot] = [UNKNOWN] * size
                i = idx(th)
                if i is UNKNOWN:
                    raise SimError(f"index of {buf.name} is not known")
                arr[i] = value(th)
            return at_once(store)
        if is_table(buf, self.operand_buffers):
            # an int into a schedule's table: its value, for the loads after the CTA's barrier
            where, value = self._shared_address(buf, s.indices), self._expr(s.value)

            def put(th):
                a = where(th)
                if a is UNKNOWN:
                    raise SimError(f"index of {buf.name} is not known")
                th.cta.tables[a.off] = value(th)
            return at_once(put)
        # a generic store into an MMA operand tile
        addr = self._shared_address(buf, s.indices)
        site = self._site("store", s, extra={"buffer": buf.name})
        return at_once(lambda th: th.sim.smem_store(th, addr(th), site))

    def _s_Evaluate(self, s):
        return self.call_handler(s.value)

    def _s_DeclBuffer(self, s):
        return None

    def _s_AllocBuffer(self, s):
        buf = s.buffer
        if buf.scope() != "local":
            return None
        slot = self._buf_slot(buf)
        size = buffer_size(buf)

        def alloc(th):
            th.env[slot] = [UNKNOWN] * size
        return at_once(alloc)


_nothing = at_once(lambda th: None)


def _is_wgmma_mma(s) -> bool:
    if type(s).__name__ != "Evaluate" or type(s.value).__name__ != "Call":
        return False
    op = op_name(s.value)
    return op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_SYNC and op not in WGMMA_OTHER
