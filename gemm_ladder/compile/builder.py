"""Build a rung into a device binary, and export it as a module that loads with the TVM runtime alone.

    f = gemm_ladder.hgemm_v4(4096, 4096, 4096)         # a T.prim_func (nothing compiled yet)
    mod = builder.build(f)                              # or build("v4", 4096, 4096, 4096, ...)
    mod.export("v4.so")                                  # v4.so + v4.so.json (the manifest)
    D = gemm_ladder.load("v4.so")(A, B)                  # on the GPU box, runtime-only TVM

:func:`build` is pure: the same rung, shape and knobs give the same binary, whoever calls it and
from wherever (a knob it is not given takes the rung's default). Choosing knobs from the tuning
database is policy, one level up: ``gemm_ladder.build("v6", M, N, K)`` with no knobs.

A built module knows its rung, knobs, shape, dtype, arch, TVM version and compiler; the
manifest beside the ``.so`` carries the same, plus the size and sha256 of the ``.so`` itself,
so the loader can refuse a damaged file, a wrong input or a wrong GPU before launching anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import files
from ..core.config import GemmConfig
from ..core.manifest import MANIFEST_VERSION, manifest_path
from ..core.provenance import git_commit
from ..rungs import config_of_prim_func, kernel_of, make_config, rung_module
from . import toolchain
from .sass import has_device_binary
from ..core.spec import spec_of


@dataclass
class BuiltModule:
    """A compiled rung: the TVM executable, its device binary and everything that made it."""

    cfg: GemmConfig
    executable: object
    binary: bytes
    source: str
    compiler: toolchain.Compiler
    tvm_version: str
    build_seconds: float
    extra: dict = field(default_factory=dict)

    def manifest(self) -> dict:
        """What built this module; :meth:`export` adds the exported file's size and sha256."""
        return {
            "format": MANIFEST_VERSION,
            "config": self.cfg.to_dict(),
            "rung": self.cfg.rung,
            "shape": list(self.cfg.shape),
            "dtype": self.cfg.dtype,
            "arch": self.cfg.arch,
            "knobs": self.cfg.knobs(),
            "spec": spec_of(self.cfg).to_dict(),  # the operands, in the kernel's order (gemm_ladder.core.spec)
            "tvm_version": self.tvm_version,
            "compiler": self.compiler.describe(),
            "binary_sha256": hashlib.sha256(self.binary).hexdigest(),
            "binary_bytes": len(self.binary),
            "build_seconds": round(self.build_seconds, 3),
            "commit": git_commit(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **self.extra,
        }

    def export(self, path) -> Path:
        """Write ``path`` (a shared library with the device binary inside) and its manifest.

        Both land atomically (written beside, then renamed), the ``.so`` first: a reader sees
        the old pair, or a new ``.so`` that the old manifest's sha256 does not match (which
        ``load`` reports), never half a file.
        """
        path = Path(path)
        with files.replacing(path) as tmp:
            self.executable.export_library(str(tmp))
            blob = tmp.read_bytes()
            if not has_device_binary(blob) or b"__global__" in blob:
                raise toolchain.ToolchainError(
                    f"{path} holds CUDA source instead of a device binary; this build would compile "
                    "at load time. Check that the device compiler works (python -m gemm_ladder info)"
                )
        files.write_json(manifest_path(path), {**self.manifest(), "so_bytes": len(blob),
                                                "so_sha256": hashlib.sha256(blob).hexdigest()})
        return path

    def cuda_source(self) -> str:
        return self.source

    def __repr__(self) -> str:
        c = self.cfg
        return f"<BuiltModule {c.rung} {c.M}x{c.N}x{c.K} {c.dtype} {c.arch} ({self.compiler.describe()})>"


@contextlib.contextmanager
def _descriptor_bases_kept():
    """Keep every buffer TVM's TMA lowering keys a TensorMap by alive until the build ends.

    TVM 0.27 (``copy_async/tma.py``) shares one TensorMap among copies whose key matches, and the
    key starts with ``hash(buffer.data)``: an address. A view's data var freed mid-lowering lets the
    next one allocated at the same address hit the cache, so whether two equal boxes share a
    descriptor (and so the kernel's parameters, source and SASS) depended on the heap: ``build``
    was not pure. Holding each keyed buffer until the build ends makes every address unique, so
    the same config always gives the same binary. TVM has no switch for this, hence the wrapper.
    """
    from tvm.backend.cuda.tile_primitive.copy_async import tma  # pylint: disable=import-outside-toplevel

    original, kept = tma._buffer_base, []  # pylint: disable=protected-access

    def keeping(buffer, **kw):
        kept.append(buffer)
        return original(buffer, **kw)

    tma._buffer_base = keeping  # pylint: disable=protected-access
    try:
        yield
    finally:
        tma._buffer_base = original  # pylint: disable=protected-access


def build(rung_or_func, M: int | None = None, N: int | None = None, K: int | None = None, **knobs) -> BuiltModule:
    """Compile a rung to a device binary through TVM's CUDA codegen.

    ``build("v4", M, N, K, **knobs)`` validates the knobs first (no compile on a bad config);
    knobs not given take the rung's defaults. ``build(hgemm_v4(M, N, K))`` builds a prim_func a
    rung returned.
    """
    if isinstance(rung_or_func, str):
        if None in (M, N, K):
            raise TypeError(f"build({rung_or_func!r}, M, N, K, ...) needs the shape")
        cfg = make_config(rung_or_func, M, N, K, **knobs)
        func = None
    else:
        if M is not None or knobs:
            raise TypeError("build(prim_func) takes no shape or knobs: they are in the prim_func")
        func = rung_or_func
        cfg = config_of_prim_func(func)
    compiler = toolchain.prepare()
    import tvm  # pylint: disable=import-outside-toplevel  (TVM's compiler: only when building)

    if func is None:
        func = kernel_of(cfg)
    target = tvm.target.Target({"kind": "cuda", "arch": cfg.arch})
    toolchain.RECORD.binary = toolchain.RECORD.source = None
    t0 = time.perf_counter()
    with target, _descriptor_bases_kept():
        ex = tvm.compile(func, target=target, tir_pipeline="tirx")
    seconds = time.perf_counter() - t0
    if toolchain.RECORD.binary is None:
        raise toolchain.ToolchainError(
            "TVM kept CUDA source instead of compiling it (its CUDA runtime library did not load); "
            "see gemm_ladder/compile/toolchain.py"
        )
    # optional: TVM's compiler (the checker's model imports it at import; this module must not, for
    # the runtime-only GPU box that imports the build layer's light modules)
    from ..protocol.check import watchdog_table  # pylint: disable=import-outside-toplevel

    watchdog = watchdog_table(func)  # a watchdog build: what decodes its timeout record
    launch = rung_module(cfg.rung, cfg.arch).launch(cfg)
    extra = {"launch": launch, **({"watchdog": watchdog} if watchdog else {})}
    if launch.get("dynamic_m"):
        # a module for every M: its knobs were chosen at cfg.M (a pack that tuned them over a
        # range of M says so through BuildJob.extra, which replaces this)
        extra["dynamic_m"] = {"min_m": 1, "tuned_for_m": [cfg.M, cfg.M]}
    return BuiltModule(
        cfg=cfg,
        executable=ex,
        binary=toolchain.RECORD.binary,
        source=toolchain.RECORD.source,
        compiler=compiler,
        tvm_version=tvm.__version__,
        build_seconds=seconds,
        extra=extra,
    )
