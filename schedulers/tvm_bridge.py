"""Run a TIRx tile scheduler's index arithmetic on the CPU (no GPU needed).

The schedulers are ``@T.meta_class`` objects that emit TIR, so the most faithful way
to learn which tile they hand out is to let them emit it and run the result.
``trace_scheduler`` wraps a scheduler in a persistent loop written for the host::

    for c in range(num_ctas):          # every CTA, one after the other
        ts.init(c)
        while ts.valid():
            out[ts.linear_idx] = (ts.m_idx, ts.n_idx, c)
            ts.next_tile()

compiles it with ``tvm.compile(..., target="llvm", tir_pipeline="tirx")`` and runs it
on numpy.  Tests compare the result, work item by work item, with the pure-Python
models in ``schedulers.orders``.  ``cuda_trace_source`` builds the same loop as a real
sm_90a kernel (one CTA per ``blockIdx.x``) and returns the CUDA source: TVM keeps the
source when no driver is present, so that also works on a CPU-only box.

Cost on a 2-core box: about 0.5 s per call, almost all of it TVMScript parsing.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D
from tvm.script import tirx as T

from .orders import _ceil_div
from .tirx_orders import make_tirx_scheduler

_UNWRITTEN = -1


def _work_count(num_m, num_n, cluster_m, cluster_n):
    # TVM rounds the grid up to whole clusters; size the buffer for every work item
    return _ceil_div(num_m, cluster_m) * _ceil_div(num_n, cluster_n) * cluster_m * cluster_n


def trace_scheduler(make, num_m, num_n, num_ctas, cluster_m=1, cluster_n=1):
    """Run scheduler ``make(prefix)`` for every CTA on the CPU.

    Returns an int32 array ``(work_items, 3)``: row ``w`` is ``(m, n, cta)`` of work item
    ``w``, or ``-1`` where no CTA reached it.
    """
    total = _work_count(num_m, num_n, cluster_m, cluster_n)

    @T.prim_func
    def trace(out: T.Buffer((total, 3), "int32")):
        for c in T.serial(num_ctas):
            ts = make("ts")
            ts.init(c)
            while ts.valid():
                out[ts.linear_idx, 0] = ts.m_idx
                out[ts.linear_idx, 1] = ts.n_idx
                out[ts.linear_idx, 2] = c
                ts.next_tile()

    ex = tvm.compile(trace, target="llvm", tir_pipeline="tirx")
    out = tvm.runtime.tensor(np.full((total, 3), _UNWRITTEN, dtype="int32"))
    ex["trace"](out)
    return out.numpy()


def runtime_m_trace(order, num_m_values, num_n, num_ctas, l2_group_size=8):
    """One host function for every ``num_m`` (the scheduler's M tile count a runtime
    argument, as in a kernel with a symbolic M), run for each of ``num_m_values``.

    Returns ``{num_m: trace}`` with ``trace`` as :func:`trace_scheduler` gives it.
    """
    total = max(num_m_values) * num_n

    @T.prim_func
    def trace(out: T.Buffer((total, 3), "int32"), num_m: T.int32):
        for c in T.serial(num_ctas):
            ts = make_tirx_scheduler(order, "ts", num_m_tiles=num_m, num_n_tiles=num_n,
                                     num_clusters=num_ctas, l2_group_size=l2_group_size)
            ts.init(c)
            while ts.valid():
                out[ts.linear_idx, 0] = ts.m_idx
                out[ts.linear_idx, 1] = ts.n_idx
                out[ts.linear_idx, 2] = c
                ts.next_tile()

    ex = tvm.compile(trace, target="llvm", tir_pipeline="tirx")
    traces = {}
    for num_m in num_m_values:
        out = tvm.runtime.tensor(np.full((total, 3), _UNWRITTEN, dtype="int32"))
        ex["trace"](out, num_m)
        traces[num_m] = out.numpy()[: num_m * num_n]
    return traces


def tvm_trace(num_m, num_n, num_ctas, l2_group_size=8, cluster_m=1, cluster_n=1,
              serpentine=False):
    """``trace_scheduler`` of TVM's own ``ClusterPersistentScheduler2D``, unchecked."""

    def make(prefix):
        return ClusterPersistentScheduler2D(
            prefix, num_m_tiles=num_m, num_n_tiles=num_n, num_clusters=num_ctas,
            l2_group_size=l2_group_size, cluster_m=cluster_m, cluster_n=cluster_n,
            serpentine=serpentine,
        )

    return trace_scheduler(make, num_m, num_n, num_ctas, cluster_m, cluster_n)


def factory_trace(order, num_m, num_n, num_ctas, l2_group_size=8, cluster_m=1, cluster_n=1):
    """``trace_scheduler`` of whatever ``make_tirx_scheduler(order, ...)`` returns."""

    def make(prefix):
        return make_tirx_scheduler(
            order, prefix, num_m_tiles=num_m, num_n_tiles=num_n, num_clusters=num_ctas,
            l2_group_size=l2_group_size, cluster_m=cluster_m, cluster_n=cluster_n,
        )

    return trace_scheduler(make, num_m, num_n, num_ctas, cluster_m, cluster_n)


def cuda_trace_source(order, num_m, num_n, num_ctas, l2_group_size=8, arch="sm_90a"):
    """Build the trace loop as a CUDA kernel (``num_ctas`` CTAs of one thread each,
    each writing the (m, n) of its tiles) and return its CUDA source."""
    total = num_m * num_n

    @T.prim_func
    def trace_kernel(out: T.Buffer((total, 2), "int32")):
        T.device_entry()
        bx = T.cta_id([num_ctas])
        tx = T.thread_id([1])  # noqa: F841  LowerTIRx needs a thread scope; one thread
        ts = make_tirx_scheduler(
            order, "ts", num_m_tiles=num_m, num_n_tiles=num_n, num_clusters=num_ctas,
            l2_group_size=l2_group_size,
        )
        ts.init(bx)
        while ts.valid():
            out[ts.linear_idx, 0] = ts.m_idx
            out[ts.linear_idx, 1] = ts.n_idx
            ts.next_tile()

    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:  # a device compile (if one is set up) reads the arch from the current target
        ex = tvm.compile(trace_kernel, target=target, tir_pipeline="tirx")
    return ex.mod.imports[0].inspect_source("cuda")
