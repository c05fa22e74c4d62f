"""Modules built on first use, in a cache folder that any number of processes share.

Where TVM's compiler is present, the front door (``gemm_ladder.matmul``) and ``pack build`` get
each module through :func:`get_or_build`::

    <cache>/modules/<key>/module.so + module.so.json

``<cache>`` is ``$GEMM_LADDER_CACHE``, else ``$XDG_CACHE_HOME/gemm_ladder``, else
``~/.cache/gemm_ladder`` (``toolchain.cache_dir``). ``<key>`` is the tuner's cache key
(``tune.cache.cache_key``: rung, all knobs, shape, dtype, arch, TVM version, device compiler
and a hash of the sources that reach the binary), with M left out for a module that takes M at
run time (``dynamic_m``): its binary is the same whatever M its knobs were chosen at.

Two processes that want one module at once: each takes the key folder's lock
(``files.folder_lock``, an ``flock`` the kernel drops if the holder dies), the first builds and
exports (atomically: ``.so`` first, then the manifest), the second finds it valid when the lock
is its own and builds nothing. A module is valid when its manifest reads, names this key, and
the ``.so`` matches its recorded size and sha256 (``manifest.check_file``); a damaged entry is
rebuilt.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..core import files
from ..core.config import ConfigError
from ..core.manifest import ManifestError, check_file, read_manifest
from ..rungs import make_config
from . import toolchain
from .batch import BuildJob, as_job, build_one
from .identity import cache_key, toolchain_identity

MODULE_NAME = "module"
BUILD_ENV = "GEMM_LADDER_BUILD"  # 0/off: never build, use packs and the cache only
_IDENTITY: dict = {}


def cache_root() -> Path:
    return toolchain.cache_dir() / "modules"


def why_cannot_build() -> str | None:
    """None when this process can build modules, else why not (in words)."""
    if os.environ.get(BUILD_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return f"building is switched off (${BUILD_ENV}={os.environ[BUILD_ENV]})"
    if os.environ.get("TVM_USE_RUNTIME_LIB"):
        return "TVM runs runtime-only here (TVM_USE_RUNTIME_LIB is set)"
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        return "TVM is not installed"
    if not any((Path(p) / "lib" / "libtvm_compiler.so").exists() for p in spec.submodule_search_locations):
        return "this TVM has no compiler library (a runtime-only pack)"
    try:
        toolchain.choose_compiler()
    except toolchain.ToolchainError as err:
        return str(err)
    return None


def identity(arch: str) -> dict:
    """TVM version, device compiler and source hash (``identity.toolchain_identity``), once per process."""
    if arch not in _IDENTITY:
        _IDENTITY[arch] = toolchain_identity(arch)
    return _IDENTITY[arch]


def is_dynamic(knobs: dict) -> bool:
    return bool(knobs.get("dynamic_m"))


def module_key(job: BuildJob, ident: dict | None = None) -> str:
    """The cache key of a build job (M left out when the module takes M at run time); the knobs
    are validated, and the rung's defaults filled in, first."""


    cfg = make_config(job.rung, *job.shape, **job.knobs)  # every knob, defaults filled in
    ident = ident or identity(cfg.arch)
    shape = (0 if is_dynamic(job.knobs) else cfg.M, cfg.N, cfg.K)
    return cache_key(cfg.rung, cfg.knobs(), shape, cfg.dtype, cfg.arch, ident["tvm_version"], ident["compiler"],
                     ident["sources"])


def valid(path: Path, key: str) -> bool:
    """Whether ``path`` is a finished, undamaged module of this key."""
    try:
        man = read_manifest(path)
        check_file(path, man)
    except (OSError, ManifestError):
        return False
    return man.get("module_cache_key") == key


def _build(job: BuildJob, folder: Path) -> Path:
    res = build_one((job, folder))
    if res["status"] != "built":
        raise ConfigError(res["detail"])
    return folder / res["file"]


def get_or_build(job: BuildJob, root=None, build=None, ident: dict | None = None) -> tuple[Path, str]:
    """The module of ``job`` from the cache (``"cache"``), or built into it now (``"built"``).

    ``build(job, folder) -> path`` builds and exports (default: ``batch.build_one``); the job's
    manifest gets ``module_cache_key``. Raises ``ConfigError`` for knobs the validator refuses.
    """
    job = as_job(job)  # or (rung, (M, N, K), knobs)
    key = module_key(job, ident)
    folder = Path(root or cache_root()) / key
    path = folder / f"{MODULE_NAME}.so"
    if valid(path, key):
        return path, "cache"
    with files.folder_lock(folder, wait=True, what="this build"):
        if valid(path, key):  # built by another process while we waited for the lock
            return path, "cache"
        extra = {**(job.extra or {}), "module_cache_key": key}
        built = (build or _build)(BuildJob(job.rung, tuple(job.shape), dict(job.knobs), extra, MODULE_NAME), folder)
        if Path(built) != path or not valid(path, key):
            raise RuntimeError(f"building {job.rung} {job.shape} into {folder} left no valid {path.name}")
    return path, "built"
