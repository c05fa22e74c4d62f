"""gemm-ladder: fast half-precision GEMM kernels in TVM TIRx, one technique per rung.

    import gemm_ladder
    f = gemm_ladder.hgemm_v4(4096, 4096, 4096)          # TVMScript T.prim_func, sm_90a
    mod = gemm_ladder.build(f)                           # device binary through TVM's CUDA codegen
    mod.export("v4.so")                                   # .so + .so.json manifest
    D = gemm_ladder.load("v4.so")(A, B)                   # runtime-only TVM, torch tensors

Importing this package compiles nothing and imports no TVM: the rungs and the builder load
TVM's compiler on first use, and :func:`load` needs only TVM's runtime.
"""

from __future__ import annotations

from .config import ConfigError, GemmConfig

__version__ = "0.1.0"
TVM_VERSION = "0.27.0.post1"

__all__ = [
    "ConfigError", "GemmConfig", "build", "load", "make_config",
    "hgemm_v1", "hgemm_v2", "hgemm_v3", "hgemm_v4", "hgemm_v5", "hgemm_v6",
    "hgemm_v7", "hgemm_v8", "hgemm_v9",
]


def _rung_entry(rung: str):
    def hgemm(M: int, N: int, K: int, **knobs):
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


def build(*args, **kwargs):
    """See :func:`gemm_ladder.builder.build`."""
    from .builder import build as _build  # pylint: disable=import-outside-toplevel

    return _build(*args, **kwargs)


def load(path):
    """See :func:`gemm_ladder.runtime.load` (runtime-only TVM is enough)."""
    from .runtime import load as _load  # pylint: disable=import-outside-toplevel

    return _load(path)


def make_config(rung: str, M: int, N: int, K: int, **knobs) -> GemmConfig:
    """Validate a rung's knobs for a shape without tracing or compiling anything."""
    from .rungs import make_config as _make  # pylint: disable=import-outside-toplevel

    return _make(rung, M, N, K, **knobs)
