"""Pack a runtime-only TVM (plus gemm-ladder) for a GPU box that has no TVM and no internet.

The GPU box needs to *load and run* exported modules, not to compile them: TVM's runtime
libraries and its Python package without ``libtvm_compiler.so`` (about 250 MB less), and
``tvm_ffi`` built for that box's Python. :func:`pack_runtime` writes such a ``site/`` folder:

    python -m gemm_ladder pack-runtime build/runtime --python 3.12
    # on the GPU box:
    PYTHONPATH=build/runtime/site TVM_USE_RUNTIME_LIB=1 python -m gemm_ladder verify build/

Every shared library in ``site/`` has its size and sha256 in ``site/RUNTIME_LIBS.json``;
``gemm_ladder.load`` checks them (:func:`check_runtime_libs`) before TVM is first imported from
the pack, so a copy cut short is named instead of killing the process with a bus error.

``tvm_ffi`` is a compiled extension: for another Python version its wheel is downloaded with
``pip download`` on the build box (which has the network the GPU box lacks). ``tornado`` (pure
Python; its one extension is abi3) comes along for the RPC tracker of ``tune --tracker``, and
``tqdm`` (pure Python) for the progress bars of the tuner and the suites.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..core import files

# What the dynamic loader maps from a pack: each library's size and sha256, checked before loading.
RUNTIME_LIBS = "RUNTIME_LIBS.json"
LIBS_FORMAT = "gemm_ladder.runtime_libs"
LIBS_VERSION = 1
_CHECKED: set = set()  # sites whose libraries this process has checked

# Parts of the TVM wheel that only the compiler needs.
_TVM_SKIP = ("libtvm_compiler.so", "3rdparty", "include", "src", "web", "__pycache__", "relax")
_FFI_SKIP = ("include", "3rdparty", "src", "cmake", "__pycache__", "stub")
_TORNADO_SKIP = ("test", "__pycache__")


def _copy_pruned(src: Path, dst: Path, skip) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip), dirs_exist_ok=True)


def _ffi_wheel(python: str, dest: Path) -> Path:
    version = importlib.metadata.version("apache-tvm-ffi")
    tag = python.replace(".", "")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--abi", f"cp{tag}",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux2014_x86_64", "-d", str(dest), f"apache-tvm-ffi=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("apache_tvm_ffi-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download apache-tvm-ffi=={version} for Python {python}: {proc.stderr.strip()[-400:]}"
        )
    return wheels[0]


def record_libraries(site: Path) -> dict:
    """The :data:`RUNTIME_LIBS` record of ``site``: size and sha256 of every shared library in it."""
    libs = sorted(p for p in site.rglob("*.so*") if p.is_file() and (p.suffix == ".so" or ".so." in p.name))
    return {"format": LIBS_FORMAT, "version": LIBS_VERSION,
            "files": {p.relative_to(site).as_posix(): files.file_record(p) for p in libs}}


def check_runtime_libs() -> None:
    """Where ``tvm`` comes from a runtime pack (a :data:`RUNTIME_LIBS` record beside it), check
    every library the pack recorded against its size and sha256, before the first one loads
    (once per process): a pack copied short would otherwise die in the dynamic loader with a
    bus error and no message. Raises :class:`gemm_ladder.core.files.DamagedFile`."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.origin:
        return
    site = Path(spec.origin).resolve().parent.parent
    record_path = site / RUNTIME_LIBS
    if site in _CHECKED or not record_path.exists():
        return
    again = f"run pack-runtime again and copy {site} whole"
    try:
        libs = json.loads(record_path.read_text())["files"]
        if not isinstance(libs, dict):
            raise TypeError("files is not an object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise files.DamagedFile(f"{record_path} is unreadable ({type(err).__name__}: {err}): {again}") from None
    for rel, recorded in libs.items():
        files.check_loadable(site / rel, recorded, again)
    _CHECKED.add(site)


def _clear_staging(dest: Path) -> None:
    for old in dest.glob(".site.*"):
        shutil.rmtree(old, ignore_errors=True)


def pack_runtime(dest, python: str | None = None, with_package: bool = True) -> Path:
    """Write ``dest/site`` with runtime-only ``tvm``, ``tvm_ffi`` for ``python``, gemm_ladder and
    ``schedulers`` (pure Python: the CLI imports it), and :data:`RUNTIME_LIBS`.

    ``dest`` is opened and locked first (:class:`gemm_ladder.core.files.FolderError` for a file, a
    folder that cannot be written or one another pack-runtime is writing into); the new ``site``
    is written beside the old one, its record last, and renamed into place: a run cut short
    leaves the old pack whole."""
    dest = Path(dest)
    with files.folder_lock(dest, wait=False, what="this pack-runtime", role="runtime pack folder"):
        import tvm  # pylint: disable=import-outside-toplevel
        import tvm_ffi  # pylint: disable=import-outside-toplevel

        _clear_staging(dest)  # what a run cut short left (we hold the folder's lock)
        staging = dest / f".site.tmp{os.getpid()}"
        _fill_site(staging, tvm, tvm_ffi, python or f"{sys.version_info.major}.{sys.version_info.minor}",
                   with_package)
        files.write_json(staging / RUNTIME_LIBS, record_libraries(staging))
        site = dest / "site"
        if site.exists() or site.is_symlink():
            os.replace(site, dest / f".site.old{os.getpid()}")
        os.replace(staging, site)
        _clear_staging(dest)
    return site


def _fill_site(site: Path, tvm, tvm_ffi, python: str, with_package: bool) -> None:
    site.mkdir(parents=True)
    _copy_pruned(Path(tvm.__file__).parent, site / "tvm", _TVM_SKIP)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python == here:
        _copy_pruned(Path(tvm_ffi.__file__).parent, site / "tvm_ffi", _FFI_SKIP)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = _ffi_wheel(python, Path(tmp))
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    top = name.split("/")[0]
                    parts = name.split("/")
                    if top != "tvm_ffi" or any(p in _FFI_SKIP for p in parts[1:-1]):
                        continue
                    zf.extract(name, site)
            for so in (site / "tvm_ffi").rglob("*.so*"):
                os.chmod(so, 0o755)
    tornado = importlib.util.find_spec("tornado")
    if tornado is not None:  # tvm.rpc.tracker's event loop (python -m gemm_ladder serve)
        _copy_pruned(Path(tornado.origin).parent, site / "tornado", _TORNADO_SKIP)
    bars = importlib.util.find_spec("tqdm")
    if bars is not None:  # the progress bars of the tuner and the suites (pure Python)
        _copy_pruned(Path(bars.origin).parent, site / "tqdm", ("__pycache__",))
    if with_package:
        pkg = Path(__file__).resolve().parents[1]  # gemm_ladder/, every layer (this file is serve/pack.py)
        _copy_pruned(pkg, site / pkg.name, ("__pycache__",))
        # the CLI's tuner imports the pure-Python tile-order models (no TVM, no numpy)
        schedulers = Path(importlib.util.find_spec("schedulers").origin).parent
        _copy_pruned(schedulers, site / "schedulers", ("__pycache__",))
    (site / "RUNTIME_ONLY.txt").write_text(
        f"runtime-only TVM {tvm.__version__} for Python {python}; no libtvm_compiler.so\n"
    )
