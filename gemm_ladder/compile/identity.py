"""What identifies a build: the TVM version, the device compiler and the sources that reach a
binary; the key of the module cache and of the tuner's build cache.

A module built from the same rung, knobs, shape, dtype and arch by the same toolchain from the
same sources is the same binary: :func:`cache_key` hashes exactly that (:func:`cache_key_fields`),
and :func:`toolchain_identity` is the build box's part of it. Host-only sources (:data:`HOST_ONLY`:
the CLI, measuring, the tuner, the policy that picks a shape's rung and knobs, which are key fields
themselves...) are left out of the hash, so editing them keeps every cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from ..core.config import ARCHS, COMMON_KNOBS
from ..core.provenance import tvm_version
from . import toolchain

CACHE_FORMAT = 2  # 2: module manifests record the .so's size and sha256
SOURCE_PACKAGES = ("gemm_ladder", "layouts", "schedulers")
# Sources whose edits cannot change a binary (paths inside their package; a trailing / is a folder).
HOST_ONLY = {
    "gemm_ladder": ("__main__.py", "cli.py", "cli_front.py", "compile/batch.py", "compile/identity.py",
                    "compile/sass.py", "core/device.py", "core/files.py", "core/manifest.py", "core/procs.py",
                    "core/provenance.py", "measure/", "serve/pack.py", "serve/plan.py", "serve/runtime.py",
                    "serve/tuning_db.py", "teach/", "tune/"),
    "layouts": ("plots.py",),
    "schedulers": ("plots.py", "pipeline.py"),
}


def _package_dirs(name: str) -> list[Path]:
    if name == "gemm_ladder":
        return [Path(__file__).resolve().parent.parent]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _host_only(pkg: str, rel: str) -> bool:
    return any(rel == h or (h.endswith("/") and rel.startswith(h)) for h in HOST_ONLY.get(pkg, ()))


def hashed_sources(arch: str | None = None) -> list[tuple[str, Path]]:
    """``(package/relative/path, file)`` of every source that can reach a binary of ``arch``:
    the host-only modules and the rung folders of the other archs are left out."""
    other_archs = {a.replace("_", "") for a in ARCHS if arch is not None and a != arch}
    out = []
    for pkg in SOURCE_PACKAGES:
        for root in _package_dirs(pkg):
            for path in sorted(root.rglob("*.py")):
                rel = path.relative_to(root)
                if "__pycache__" in rel.parts or _host_only(pkg, rel.as_posix()):
                    continue
                if pkg == "gemm_ladder" and rel.parts[0] in other_archs:
                    continue
                out.append((f"{pkg}/{rel.as_posix()}", path))
    return out


def sources_hash(arch: str | None = None) -> str:
    """sha256 over :func:`hashed_sources`: an edited rung, layout or scheduler changes it."""
    h = hashlib.sha256()
    for name, path in hashed_sources(arch):
        h.update(f"{name}\0".encode())
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def toolchain_identity(arch: str | None = None) -> dict:
    """TVM version, device compiler and source hash: the build box's part of every cache key."""
    return {"tvm_version": tvm_version(), "compiler": toolchain.choose_compiler().describe(),
            "sources": sources_hash(arch)}


def cache_key_fields(rung: str, knobs: dict, shape, dtype: str, arch: str, tvm_version: str,
                     compiler: str, sources: str) -> dict:
    knobs = {k: v for k, v in knobs.items() if k not in COMMON_KNOBS}
    return {"cache_format": CACHE_FORMAT, "rung": rung, "knobs": dict(sorted(knobs.items())),
            "shape": [int(x) for x in shape], "dtype": dtype, "arch": arch,
            "tvm_version": tvm_version, "compiler": compiler, "sources": sources}


def cache_key(rung: str, knobs: dict, shape, dtype: str, arch: str, tvm_version: str, compiler: str,
              sources: str) -> str:
    """sha256 of everything that changes the binary (see the module docstring)."""
    fields = cache_key_fields(rung, knobs, shape, dtype, arch, tvm_version, compiler, sources)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
