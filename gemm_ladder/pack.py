"""Pack a runtime-only TVM (plus gemm-ladder) for a GPU box that has no TVM and no internet.

The GPU box needs to *load and run* exported modules, not to compile them: TVM's runtime
libraries and its Python package without ``libtvm_compiler.so`` (about 250 MB less), and
``tvm_ffi`` built for that box's Python. :func:`pack_runtime` writes such a ``site/`` folder:

    python -m gemm_ladder pack-runtime build/runtime --python 3.12
    # on the GPU box:
    PYTHONPATH=build/runtime/site TVM_USE_RUNTIME_LIB=1 python -m gemm_ladder verify build/

``tvm_ffi`` is a compiled extension: for another Python version its wheel is downloaded with
``pip download`` on the build box (which has the network the GPU box lacks). ``tornado`` (pure
Python; its one extension is abi3) comes along for the RPC tracker of ``tune --tracker``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

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


def pack_runtime(dest, python: str | None = None, with_package: bool = True) -> Path:
    """Write ``dest/site`` with runtime-only ``tvm``, ``tvm_ffi`` for ``python``, gemm_ladder and
    ``schedulers`` (pure Python: the CLI imports it)."""
    import tvm  # pylint: disable=import-outside-toplevel
    import tvm_ffi  # pylint: disable=import-outside-toplevel

    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    site = Path(dest) / "site"
    if site.exists():
        shutil.rmtree(site)
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
    if with_package:
        pkg = Path(__file__).parent
        _copy_pruned(pkg, site / pkg.name, ("__pycache__",))
        # the CLI's tuner imports the pure-Python tile-order models (no TVM, no numpy)
        schedulers = Path(importlib.util.find_spec("schedulers").origin).parent
        _copy_pruned(schedulers, site / "schedulers", ("__pycache__",))
    (site / "RUNTIME_ONLY.txt").write_text(
        f"runtime-only TVM {tvm.__version__} for Python {python}; no libtvm_compiler.so\n"
    )
    return site
