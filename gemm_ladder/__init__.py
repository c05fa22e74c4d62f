"""gemm-ladder: fast half-precision GEMM kernels in TVM TIRx, one technique per rung.

    import gemm_ladder
    D = gemm_ladder.matmul(A, B)                         # the front door: any shape, D = A . B^T
    D = gemm_ladder.grouped_mm(A, W, offs)               # one GEMM per expert (MoE), one launch
    D = gemm_ladder.grouped_mm_masked(A, W, counts)      # the same over [E, max_tokens, K] slots (decode)
    H = gemm_ladder.grouped_swiglu(A, W_gu, offs)        # silu(gate) * up of every expert, one launch
    gemm_ladder.matmul(A, B, explain=True)               # ... and which kernel, from where, why
    import gemm_ladder.serve.ops                         # torch.ops.gemm_ladder.mm (torch.compile)
    xq, sx = gemm_ladder.quantize_fp8(x, "row")          # fp8 (issue 32), torch._scaled_mm's rules:
    D = gemm_ladder.scaled_mm(xq, wq.t(), sx, sw.t())    # ... with wq, sw = quantize_fp8(W, "row")
    D = gemm_ladder.scaled_grouped_mm(xq, Wq, sx.view(-1), sw, offs)  # grouped fp8 (serve/grouped_fp8.py)

The rungs underneath, one at a time::

    f = gemm_ladder.hgemm_v4(4096, 4096, 4096)          # TVMScript T.prim_func, sm_90a
    mod = gemm_ladder.build(f)                           # device binary through TVM's CUDA codegen
    mod.export("v4.so")                                   # .so + .so.json manifest
    D = gemm_ladder.load("v4.so")(A, B)                   # runtime-only TVM, torch tensors

``gemm_ladder.build("v6", M, N, K)`` with no rung knobs takes the tuning database's best knobs
for the shape and says so (``gemm_ladder.serve.tuning_db``); ``gemm_ladder.compile.builder.build``
is the pure primitive underneath (the rung's defaults, whatever the database holds).

Importing this package compiles nothing and imports neither TVM nor torch, nor any of the build
layer: ``build``, ``hgemm_vN`` and ``make_config`` import it on first use (the one optional
dependency the host's function-level imports wait for: TVM's compiler and the build layer over
it), so a GPU box with TVM's runtime alone can ``load`` modules and serve packs.

The host in layers, from the bottom up: a module imports its own layer and those below it, never
one above (``tests/test_architecture.py`` checks every import; ``gemm_ladder/README.md`` has the
table)::

    core/       config, spec, device, budget, launch, records, files, manifest, provenance, procs, cli_types
    sync/       the barrier classes the rungs build with; the watchdog's bounded wait and record
    sm90a/, sm100a/, rungs    the rungs (one file each); their registry and the one validator, make_config
    protocol/   the barrier protocol checker's model (a watchdog build names its waits with it)
    compile/    builder, toolchain, sass, batch, identity, module_cache: the build layer
    barriers/   the checker's tools over the builder (python -m gemm_ladder.barriers, explain)
    serve/      runtime, pack, tma_layout, kernel_pack, tuning_db, plan, front, ops: run for a caller
    measure/    harness, rounds, isolate, modules, report, suite, every_model: check and time on a GPU
    tune/       the tuner (space, cache, measuring, merge, report, jobs, run; rpc + serve: many GPUs)
    this file   the entry points: matmul, build (with the tuned-knobs policy), load, use_pack, hgemm_vN
    nn          Linear (nn.Linear on torch.ops.gemm_ladder.mm) and patch(model): import gemm_ladder.nn
    teach/, cli, cli_front, __main__    the tutorials' helpers and the command line; nothing imports them
"""

from __future__ import annotations

import os

from .core.config import ConfigError, GemmConfig
# the front doors themselves, not wrappers: a wrapper's frame and keyword copy cost a repeated
# call ~1 us of host time on the GPU box, a few percent of a 20 us call
from .serve.front import matmul, swiglu, use_pack as _use
from .serve.grouped import grouped_mm, use_grouped_module
from .serve.grouped_fp8 import scaled_grouped_mm, use_scaled_grouped_module
from .serve.grouped_masked import grouped_mm_masked
from .serve.grouped_swiglu import grouped_swiglu, grouped_swiglu_masked
from .serve.scaled import quantize_fp8 as _quantize_fp8, scaled_mm as _scaled_mm
from .serve.runtime import load as _load

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "GemmConfig", "build", "grouped_mm", "load", "make_config", "matmul", "quantize_fp8", "scaled_mm",
    "swiglu",
    "grouped_mm_masked", "grouped_swiglu", "grouped_swiglu_masked", "use_grouped_module", "use_pack",
    "scaled_grouped_mm", "use_scaled_grouped_module",
    "hgemm_v1", "hgemm_v2", "hgemm_v3", "hgemm_v4", "hgemm_v5", "hgemm_v6",
    "hgemm_v7", "hgemm_v8", "hgemm_v9", "hgemm_v10", "hgemm_v11", "hgemm_v12",
]


def _rung_entry(rung: str):
    def hgemm(M: int, N: int, K: int, **knobs):
        # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
        from .rungs import prim_func  # pylint: disable=import-outside-toplevel

        return prim_func(rung, M, N, K, **knobs)

    hgemm.__name__ = hgemm.__qualname__ = f"hgemm_{rung}"
    hgemm.__doc__ = (
        f"The {rung} rung as a TVMScript ``T.prim_func`` for D[M,N] = A[M,K] . B[N,K]^T.\n\n"
        "Knobs: ``dtype`` ('float16' or 'bfloat16'), ``arch`` ('sm_90a' or 'sm_100a') and the rung's "
        "own (see ``gemm_ladder/<arch>/hgemm_" + rung + ".py``). Bad knobs raise ConfigError before "
        "anything is traced or compiled."
    )
    return hgemm


hgemm_v1 = _rung_entry("v1")
hgemm_v2 = _rung_entry("v2")
hgemm_v3 = _rung_entry("v3")
hgemm_v4 = _rung_entry("v4")
hgemm_v5 = _rung_entry("v5")
hgemm_v6 = _rung_entry("v6")
hgemm_v7 = _rung_entry("v7")
hgemm_v8 = _rung_entry("v8")
hgemm_v9 = _rung_entry("v9")
hgemm_v10 = _rung_entry("v10")
hgemm_v11 = _rung_entry("v11")
hgemm_v12 = _rung_entry("v12")


def build(rung_or_func, M: int | None = None, N: int | None = None, K: int | None = None, **knobs):
    """Compile a rung (see :func:`gemm_ladder.compile.builder.build`), with tuned knobs when given none.

    ``build("v6", M, N, K)`` (``dtype``/``arch`` aside, no knobs) looks up the tuning database's
    best knobs for the shape; when it finds some it prints which entry it used and records it as
    ``mod.extra["tuned_from"]`` (and in the manifest). Explicit knobs, or a prim_func, build
    exactly what they say.
    """
    if not isinstance(rung_or_func, str) and not hasattr(rung_or_func, "attrs"):
        # a prim_func has attrs (a rung's config among them: rungs.config_of_prim_func checks that)
        raise TypeError(f"gemm_ladder.build takes a rung name ('v4', with M, N, K) or a rung's prim_func "
                        f"(gemm_ladder.hgemm_v4(M, N, K)) first; got {type(rung_or_func).__name__} "
                        f"{rung_or_func!r:.60}")
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    # pylint: disable=import-outside-toplevel
    from .compile import builder as _builder
    from .serve import tuning_db as _tuning_db

    if not isinstance(rung_or_func, str) or None in (M, N, K):
        return _builder.build(rung_or_func, M, N, K, **knobs)
    knobs, tuned_from = _tuning_db.tuned_knobs(rung_or_func, M, N, K, knobs)
    mod = _builder.build(rung_or_func, M, N, K, **knobs)
    if tuned_from:
        mod.extra["tuned_from"] = tuned_from
    return mod


def load(path):
    """See :func:`gemm_ladder.serve.runtime.load` (runtime-only TVM is enough)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"gemm_ladder.load takes the path of an exported module (a str or pathlib.Path to its .so); "
                        f"got {type(path).__name__} {path!r:.60}")
    return _load(path)


def scaled_mm(A, B, scale_a, scale_b, *, bias=None, out_dtype=None, out=None, explain: bool = False,
              strict: bool | None = None):
    """fp8 D = A @ B * scale_a * scale_b (+ bias) with torch._scaled_mm's semantics (A [M, K] e4m3
    row-major, B [K, N] column-major: W.t() of a row-major [N, K] W): see :mod:`gemm_ladder.serve.scaled`."""
    return _scaled_mm(A, B, scale_a, scale_b, bias=bias, out_dtype=out_dtype, out=out, explain=explain, strict=strict)


def quantize_fp8(x, recipe: str = "tensor", dtype=None, block=(1, 128)):
    """``(x_fp8, scale)`` for :func:`scaled_mm`, with the rounding torch's recipes use; ``recipe``
    ``tensor``, ``row`` or ``block`` (``block=(1, 128)`` an activation's groups, ``(128, 128)`` a
    weight's): see :func:`gemm_ladder.serve.scaled.quantize_fp8`."""
    return _quantize_fp8(x, recipe, dtype, block)


def use_pack(folder):
    """Look in the kernel pack ``folder`` first (see :mod:`gemm_ladder.serve.kernel_pack`)."""
    return _use(folder)


def make_config(rung: str, M: int, N: int, K: int, **knobs) -> GemmConfig:
    """Validate a rung's knobs for a shape without tracing or compiling anything."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from .rungs import make_config as _make  # pylint: disable=import-outside-toplevel

    return _make(rung, M, N, K, **knobs)
