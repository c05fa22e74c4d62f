"""The mbarrier classes every rung uses: TVM's own, recorded, and bounded when asked.

``MBarrier``, ``TMABar``, ``TCGen05Bar`` and ``Pipeline`` subclass TVM's classes of the same
name (``tvm.backend.cuda.lang.pipeline``) and change two things:

- every barrier a trace creates is recorded with its place in the shared-memory pool, so the
  protocol checker (:mod:`gemm_ladder.protocol.check`) and the watchdog can name it
  (``tma2mma[2]`` rather than "the uint64 at byte 24");
- with the ``watchdog`` knob set, ``wait`` is a *bounded* wait. TVM has no bounded mbarrier
  wait (``T.cuda.mbarrier_wait`` spins on ``mbarrier.try_wait.parity`` forever), so this one is
  ours: it spins on ``try_wait.parity`` and the ``%globaltimer``; after ``watchdog`` seconds the
  first waiter to give up writes (barrier, slot, phase parity, wait site, CTA, thread, time
  waited, the barrier's raw state) into a record the host passes as the kernel's last argument
  (an ``int64`` address of pinned host memory, readable while the kernel still runs), and every
  waiter that gives up, or sees that the record is taken, leaves the kernel (``exit``). No
  ``trap``: a trap kills the CUDA context, and the record with it.

Without the knob, ``wait`` is TVM's own, emitted through the same code path: the CUDA source and
the SASS are those of TVM's classes (``tests/test_barriers.py`` compares them), so the option is
free when off.

The knob reaches the classes through :func:`tracing`, which :func:`gemm_ladder.rungs.kernel_of`
opens around every trace; outside it the classes behave exactly like TVM's.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field

import tvm
from tvm.backend.cuda.lang import pipeline as _tvm
from tvm.script import tirx as T

from . import watchdog as _wd

WATCHDOG_ATTR = "gemm_ladder.watchdog"  # prim_func attr: the table that decodes a record
BARRIERS_ATTR = "gemm_ladder.barriers"  # prim_func attr: name, kind, pool offset, depth
RECORD_PARAM = "barrier_watchdog"  # the kernel's trailing int64: address of the record
# prim_func attr: the kernel's mbarrier protocol relies on its named barriers (bar.sync id, count),
# which the protocol checker then models (v9's residual epilogue)
NAMED_BARRIERS_ATTR = "gemm_ladder.named_barriers"
# prim_func attr: a branch of the kernel turns on a count that other CTAs' atomics decide (split-K's last
# unit of a tile, v10 with a residual C whose loads sit in that branch); the protocol checker, which runs
# one cluster, takes each such branch both ways, every other time a thread comes to it
COUNTED_BRANCHES_ATTR = "gemm_ladder.counted_branches"


@dataclass
class BarrierInfo:
    """One barrier array a trace created: ``depth`` mbarriers from ``offset`` (uint64 units)."""

    obj: object
    kind: str  # "mbarrier", "tma" or "tcgen05": how it is completed
    offset: int
    depth: int

    @property
    def name(self) -> str:
        # the TVMScript parser names a meta_class instance after the variable it is bound to
        return getattr(self.obj, "_tirx_meta_name", None) or f"mbar{self.offset}"


@dataclass
class Trace:
    """What one trace of a kernel recorded; ``watchdog`` is the bound in seconds, or None."""

    watchdog: float | None = None
    barriers: list[BarrierInfo] = field(default_factory=list)
    sites: list[dict] = field(default_factory=list)
    record: object = None

    def register(self, obj, kind: str) -> int:
        offset = obj.buf.elem_offset
        offset = int(offset) if offset is not None else 0
        self.barriers.append(BarrierInfo(obj, kind, offset, obj.depth))
        return len(self.barriers) - 1

    def barrier_id(self, obj) -> int:
        for i, b in enumerate(self.barriers):
            if b.obj is obj:
                return i
        return self.register(obj, _kind_of(obj))

    def table(self) -> dict:
        """The barrier names and wait sites, as the watchdog's decoder reads them."""
        return {
            "seconds": self.watchdog,
            "barriers": [{"name": b.name, "kind": b.kind, "offset": b.offset, "depth": b.depth}
                         for b in self.barriers],
            "sites": self.sites,
        }

    def finish(self, func):
        """The traced prim_func, with the record parameter and the decode table when bounded."""
        if self.watchdog is None:
            return func
        params = list(func.params) + [self.record]
        func = tvm.tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)
        from tvm import s_tir  # pylint: disable=import-outside-toplevel

        s_tir.analysis.verify_well_formed(tvm.IRModule.from_expr(func))
        tvm.tirx.analysis.verify_tirx_well_formed(func)
        return func.with_attr(WATCHDOG_ATTR, json.dumps(self.table(), sort_keys=True))


_STATE = threading.local()


def current() -> Trace | None:
    return getattr(_STATE, "trace", None)


@contextlib.contextmanager
def tracing(watchdog: float | None = None):
    """Record the barriers of the kernel traced inside; bound their waits if ``watchdog``."""
    trace = Trace(watchdog=watchdog)
    prev = current()
    _STATE.trace = trace
    try:
        if watchdog is None:
            yield trace
        else:
            trace.record = tvm.tirx.Var(RECORD_PARAM, "int64")
            with _record_param_pending():
                yield trace
    finally:
        _STATE.trace = prev


@contextlib.contextmanager
def _record_param_pending():
    """While a watchdog build is traced, its waits use the record parameter that
    :meth:`Trace.finish` adds only after the parse; the parser's well-formedness check would
    stop at that one variable. Inside this block that error alone is let through; ``finish``
    runs the full check on the finished function."""
    from tvm import s_tir  # pylint: disable=import-outside-toplevel

    checks = [(s_tir.analysis, "verify_well_formed"), (tvm.tirx.analysis, "verify_tirx_well_formed")]
    saved = [getattr(mod, name) for mod, name in checks]

    def lenient(check):
        def run(*args, **kwargs):
            try:
                return check(*args, **kwargs)
            except Exception as err:  # pylint: disable=broad-except
                if f"undefined variable {RECORD_PARAM}" in str(err):
                    return True
                raise
        return run

    for (mod, name), check in zip(checks, saved):
        setattr(mod, name, lenient(check))
    try:
        yield
    finally:
        for (mod, name), check in zip(checks, saved):
            setattr(mod, name, check)


def _kind_of(obj) -> str:
    if isinstance(obj, _tvm.TMABar):
        return "tma"
    if isinstance(obj, _tvm.TCGen05Bar):
        return "tcgen05"
    return "mbarrier"


class _Recorded:
    """Mixin: record the barrier when created, bound its wait when the trace asks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        trace = current()
        if trace is not None:
            trace.register(self, _kind_of(self))

    def _wait(self, stage, phase):
        trace = current()
        if trace is None or trace.watchdog is None:
            return super()._wait(stage, phase)  # TVM's own: identical code when off
        site = len(trace.sites)
        bar_id = trace.barrier_id(self)
        trace.sites.append({"barrier": bar_id, "site": site})
        T.evaluate(T.cuda.func_call(
            _wd.WAIT_FN, self.buf.ptr_to([stage]), phase ^ self.phase_offset, trace.record,
            bar_id, stage, site, T.int64(int(trace.watchdog * 1e9)),
            source_code=_wd.WAIT_SOURCE,
        ))
        return None


class MBarrier(_Recorded, _tvm.MBarrier):
    """TVM's ``MBarrier`` (plain ``mbarrier.arrive``), recorded; bounded wait with the watchdog."""


class TMABar(_Recorded, _tvm.TMABar):
    """TVM's ``TMABar`` (``arrive.expect_tx`` + TMA bytes), recorded; bounded wait with the watchdog."""


class TCGen05Bar(_Recorded, _tvm.TCGen05Bar):
    """TVM's ``TCGen05Bar`` (``tcgen05.commit``), recorded; bounded wait with the watchdog."""


_BAR_KINDS = {"tma": TMABar, "tcgen05": TCGen05Bar, "mbar": MBarrier}


class Pipeline(_tvm.Pipeline):
    """TVM's full/empty ``Pipeline``, built from the classes above."""

    def __init__(self, pool, stages, *, full, empty, init_full=1, init_empty=1,
                 empty_phase_offset=0, leader=None):  # pylint: disable=super-init-not-called
        # TVM's constructor picks its own classes; this one is the same body with ours
        self.stages = stages
        self.full = _BAR_KINDS[full](pool, stages, leader=leader)
        self.full.init(init_full)
        self.empty = _BAR_KINDS[empty](pool, stages, phase_offset=empty_phase_offset, leader=leader)
        self.empty.init(init_empty)


def watchdog_of(cfg) -> float | None:
    """The ``watchdog`` knob of a config: seconds a wait may take, or None (off)."""
    value = dict(cfg.extra).get("watchdog")
    return float(value) if value else None


def traced(cfg, kernel):
    """``kernel(cfg)`` traced inside :func:`tracing`: the prim_func with its barrier table."""
    with tracing(watchdog_of(cfg)) as trace:
        func = kernel(cfg)
    func = trace.finish(func)
    names = [{"name": b.name, "kind": b.kind, "offset": b.offset, "depth": b.depth} for b in trace.barriers]
    return func.with_attr(BARRIERS_ATTR, json.dumps(names, sort_keys=True))
