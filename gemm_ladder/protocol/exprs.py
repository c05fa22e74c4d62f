"""The expression half of the compiled kernel: TIR expressions as closures over a thread.

Every expression becomes ``f(th) -> value``, evaluated in the thread's environment (a list of
slots, one per variable or local buffer). Values are those of :mod:`.values`; an operation on an
:data:`UNKNOWN` gives :data:`UNKNOWN`, so a value the checker does not model (a float, a global
load) can flow through code that does not decide anything.
"""

from __future__ import annotations

from .values import (UNKNOWN, LocalRef, SimError, Smem, TMap, any_unknown, call_operands, dtype_bytes, func_call_name,
    handle_of, op_name, trunc_div, wrap_int)


class ExprCompiler:
    """Slots and expressions; :class:`gemm_ladder.protocol.interp.Program` adds the statements."""

    def _slot(self, var) -> int:
        key = handle_of(var)
        if key not in self.slots:
            self.slots[key] = len(self.slot_names)
            self.slot_names.append(getattr(var, "name", "?"))
        return self.slots[key]

    def _buf_slot(self, buf) -> int:
        """The slot of a local buffer's storage (a DeclBuffer may alias another's data)."""
        key = self._root(handle_of(buf))
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
            if type(data).__name__ == "Var":  # a buffer over a pointer the kernel computed
                self.buffer_ptr[handle_of(s.buffer)] = data
            elif type(data).__name__ == "Call" and op_name(data) == "tirx.buffer_data":
                src = data.args[0]
                if handle_of(src) != handle_of(s.buffer):
                    self.alias[handle_of(s.buffer)] = handle_of(src)
        for f in ("body", "then_case", "else_case"):
            v = getattr(s, f, None)
            if v is not None:
                self._find_aliases(v)

    # -- expressions ------------------------------------------------------------------------
    def _lvalue(self, e):
        """``address_of(buf[i])`` or ``buf[i]`` of a local buffer -> (slot, index)."""
        if type(e).__name__ == "Call" and op_name(e) == "tirx.address_of":
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
        """A shared buffer element's address: from the pool base, or, for a buffer declared
        over a pointer the kernel computed (a barrier mapped into a peer CTA), from that."""
        idx = self._flat_index(buf, indices)
        elem = dtype_bytes(buf.dtype)
        off = buf.elem_offset
        base = int(off) if off is not None and hasattr(off, "value") else 0
        ptr = self.buffer_ptr.get(handle_of(buf))
        data = self._expr(ptr) if ptr is not None else _const(UNKNOWN)

        def f(th):
            i = idx(th)
            if isinstance(i, tuple):  # a vector index (Ramp): its first lane
                i = i[0]
            if i is UNKNOWN:
                return UNKNOWN
            p = data(th)
            if isinstance(p, Smem):
                return Smem(p.off + (base + i) * elem, p.rank, elem)
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
        if is_table(buf, self.operand_buffers):
            # an int a thread of this CTA stored (a schedule's table: v12's tile counts per expert)
            addr = self._shared_address(buf, e.indices)

            def table(th):
                a = addr(th)
                return UNKNOWN if a is UNKNOWN else th.cta.tables.get(a.off, UNKNOWN)
            return table
        if scope == "global" and "int" in str(buf.dtype):
            # an int operand the check is given values for (its parameter, NAME_ptr, bound to a list:
            # v12's offsets)
            name, idx = buf.name, self._flat_index(buf, e.indices)

            def operand(th):
                arr, i = th.sim.params.get(f"{name}_ptr", th.sim.params.get(name)), idx(th)
                if not isinstance(arr, list) or i is UNKNOWN or not 0 <= i < len(arr):
                    return UNKNOWN
                return arr[i]
            return operand
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
            return wrap_int(x, dtype)
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
            if any_unknown(b, s):
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
        op = op_name(e)
        h = _ECALLS.get(op)
        if h is not None:
            return h(self, e)
        if op == "tirx.cuda.func_call" and func_call_name(e) == "tvm_builtin_pointer_offset":
            ops = call_operands(e)
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
        return self._expr(call_operands(e)[-1])

    def _ec_reinterpret(self, e):
        v = self._expr(call_operands(e)[-1])
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
        return self._expr(call_operands(e)[1])

    def _ec_mov_sreg(self, e):
        name = next((a.value for a in e.args if type(a).__name__ == "StringImm"), "")
        return lambda th: th.sreg(name)

    def _ec_if_then_else(self, e):
        c, a, b = (self._expr(x) for x in call_operands(e)[:3])

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


def simplified(e) -> str:
    """A phase expression as the table prints it: constants folded, ``^ 0`` gone."""
    try:
        from tvm import arith  # pylint: disable=import-outside-toplevel

        e = arith.Analyzer().simplify(e)
    except Exception:  # pylint: disable=broad-except
        pass
    return str(e)


def is_table(buf, operand_buffers) -> bool:
    """A shared int buffer that is no MMA operand: a table of the schedule's (v12's per-expert
    rows and tile counts) whose values the check follows from the stores to the loads."""
    return buf.scope().startswith("shared") and buf.name not in operand_buffers and str(buf.dtype) in ("int32",
                                                                                                       "uint32")


def uses_of(e) -> set[int]:
    """Handles of the variables and local buffers an expression reads."""
    out: set[int] = set()

    def walk(x):
        t = type(x).__name__
        if t == "Var":
            out.add(handle_of(x))
        elif t == "TensorLoad":
            out.add(handle_of(x.source))
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


def lvalue_defs(e) -> set[int]:
    if type(e).__name__ == "Call" and op_name(e) == "tirx.address_of":
        e = e.args[0]
    if type(e).__name__ == "TensorLoad":
        return {handle_of(e.source)}
    return set()


_EXPR = {
    "IntImm": ExprCompiler._e_IntImm, "FloatImm": ExprCompiler._e_FloatImm, "StringImm": ExprCompiler._e_StringImm,
    "Var": ExprCompiler._e_Var, "TensorLoad": ExprCompiler._e_TensorLoad, "Cast": ExprCompiler._e_Cast,
    "Let": ExprCompiler._e_Let, "Select": ExprCompiler._e_Select, "Ramp": ExprCompiler._e_Ramp,
    "Broadcast": ExprCompiler._e_Broadcast, "Shuffle": ExprCompiler._e_Shuffle, "Not": ExprCompiler._e_Not,
    "Call": ExprCompiler._e_Call,
    "Add": _binary(lambda x, y: x + y if not isinstance(x, Smem) else Smem(x.off + y * x.elem, x.rank, x.elem)),
    "Sub": _binary(lambda x, y: x - y),
    "Mul": _binary(lambda x, y: x * y),
    "FloorDiv": _binary(lambda x, y: x // y),
    "FloorMod": _binary(lambda x, y: x % y),
    "Div": _binary(lambda x, y: trunc_div(x, y) if isinstance(x, int) and isinstance(y, int) else x / y),
    "Mod": _binary(lambda x, y: x - trunc_div(x, y) * y),
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
    "tirx.address_of": ExprCompiler._ec_address_of,
    "tirx.cuda.cvta_generic_to_shared": ExprCompiler._ec_passthrough,
    "tirx.reinterpret": ExprCompiler._ec_reinterpret,
    "tirx.cuda.thread_rank": ExprCompiler._ec_thread_rank,
    "tirx.cuda.elect_sync": ExprCompiler._ec_elect_sync,
    "tirx.tvm_warp_shuffle": ExprCompiler._ec_warp_shuffle,
    "tirx.cuda.mov_sreg": ExprCompiler._ec_mov_sreg,
    "tirx.if_then_else": ExprCompiler._ec_if_then_else,
}
