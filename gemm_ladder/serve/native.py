"""The repeated call's lookup in C++ (``fastpath.cpp``): built once per torch and Python, loaded
by the front door (``front._fast``).

Why: a repeated call that torch computes (the shapes where cuBLAS measured faster at first use)
costs the caller what ``F.linear`` costs plus the front door's Python. Its key alone (shapes,
strides, dtypes and devices of A, B, ``out`` and the bias) took 1.4-2.3 us a call on the H100 box's
host (``benchmarks/results/2026-11-26_h100_every_model/9_checkout_code/route_host.json``), and the
whole lookup 4-7 us: at 15-30 us calls that put torch's route 7-13% behind ``F.linear``. The C++
table makes the same key from the tensors' fields and calls ``aten::linear.out`` directly.

How it is built: the C++ compiler (``$CXX``, else ``c++``) with torch's and Python's headers,
linked against torch's libraries, into ``<cache>/native/fastpath-<hash>.so`` (``files.cache_dir``;
the hash covers the source, torch's version and ABI, Python's version and the compiler), written
beside and renamed into place so concurrent builds never see half a file. Not
``torch.utils.cpp_extension.load``: that needs ninja, which a runtime-only GPU box may lack, and
its build folder is per-process by default; this is one source file and one compiler call.

When (``$GEMM_LADDER_NATIVE``):

- ``auto`` (default): :func:`table` loads a built library at once; where none is built, it starts
  one build on a helper thread (19 s on the H100 box, 30 s on a 2-core build box) and the Python
  lookup serves until it is loaded, so no call waits for the compiler. A failed build warns once,
  with the compiler's last lines, and the Python lookup stays.
- ``build``: :func:`table` builds on the calling thread where nothing is built (a deployment's
  first call, a benchmark that must time the C++ path from its first call).
- ``0`` / ``off``: never (the Python lookup only).

``python -m gemm_ladder native`` builds it ahead (and says where it is, or why it failed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path

from ..core import files

SOURCE = Path(__file__).with_name("fastpath.cpp")
MODULE = "gemm_ladder_fastpath"
ENV = "GEMM_LADDER_NATIVE"
MODES = ("auto", "build", "0", "off")
BUILD_TIMEOUT_S = 600


class NativeBuildError(RuntimeError):
    """The C++ lookup could not be built: the compiler's message and what to do."""


class NativeWarning(UserWarning):
    """The C++ lookup is not in use (its build failed): calls take the Python lookup."""


_STATE: dict = {"module": None, "tried": False, "thread": None, "error": None}
_LOCK = threading.Lock()
_ON_LOAD: list = []  # callbacks run once the library is loaded (front registers its remembered calls)


def mode() -> str:
    """``$GEMM_LADDER_NATIVE``, checked: one of :data:`MODES`."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"${ENV}={os.environ[ENV]!r}: use auto (build on a helper thread at first use), build "
                         "(build at first use, on the calling thread) or 0 (off: the Python lookup)")
    return value


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``c++`` (or ``g++``) on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    raise NativeBuildError("no C++ compiler (c++, g++ or clang++) on PATH and $CXX unset: install one, or set "
                           f"${ENV}=0 to keep the Python lookup")


def _torch_flags() -> tuple[list[str], list[str]]:
    import torch  # pylint: disable=import-outside-toplevel  (optional: the GPU side's torch)

    root = Path(torch.__file__).parent
    inc = [root / "include", root / "include" / "torch" / "csrc" / "api" / "include"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)  # pylint: disable=protected-access
    cflags = [f"-I{p}" for p in inc] + [f"-I{sysconfig.get_paths()['include']}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    lib = root / "lib"
    ldflags = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return cflags, ldflags


def library_path() -> Path:
    """Where the library for this torch, Python and compiler lives (built or not)."""
    import torch  # pylint: disable=import-outside-toplevel

    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI), sys.version,  # pylint: disable=protected-access
                 sysconfig.get_config_var("EXT_SUFFIX") or "", os.environ.get("CXX", "")):
        h.update(part.encode() + b"\0")
    return files.cache_dir() / "native" / f"fastpath-{h.hexdigest()[:16]}.so"


def build(force: bool = False) -> Path:
    """Compile ``fastpath.cpp`` into :func:`library_path` (kept where it is built, unless ``force``);
    :class:`NativeBuildError` with the compiler's last lines where it fails."""
    out = library_path()
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cflags, ldflags = _torch_flags()
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.{threading.get_ident()}.tmp.so")
    cmd = [compiler(), "-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
           *cflags, str(SOURCE), "-o", str(tmp), *ldflags]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        tmp.unlink(missing_ok=True)
        raise NativeBuildError(f"compiling {SOURCE.name} failed to run ({err}): check the compiler ({cmd[0]}), or "
                               f"set ${ENV}=0") from err
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise NativeBuildError(f"compiling {SOURCE.name} with {cmd[0]} failed (exit {done.returncode}):\n{tail}\n"
                               f"fix the toolchain (torch's headers for torch {_torch_version()}), or set {ENV}=0")
    os.replace(tmp, out)
    return out


def _torch_version() -> str:
    import torch  # pylint: disable=import-outside-toplevel

    return torch.__version__


def load(path: Path):
    """The extension module in ``path`` (imported under :data:`MODULE`)."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise NativeBuildError(f"{path} is not a loadable extension: delete it and build again")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as err:
        raise NativeBuildError(f"{path} does not load ({err}): delete it (python -m gemm_ladder native --force)") from err
    return module


def on_load(callback) -> None:
    """Run ``callback(module)`` once the library is loaded (now, if it is)."""
    with _LOCK:
        module = _STATE["module"]
        if module is None:
            _ON_LOAD.append(callback)
            return
    callback(module)


def _loaded(module) -> None:
    with _LOCK:
        _STATE["module"] = module
        callbacks = list(_ON_LOAD)
        _ON_LOAD.clear()
    for callback in callbacks:
        callback(module)


def _build_and_load() -> None:
    try:
        _loaded(load(build()))
    except (NativeBuildError, files.FolderError, OSError) as err:  # an unusable cache folder too
        _STATE["error"] = str(err)
        warnings.warn(f"gemm_ladder: the C++ call lookup is not in use, repeated calls take the Python one: {err}",
                      NativeWarning, stacklevel=2)


def table():
    """The loaded extension, or None (off, still building, or its build failed: ``error()`` says)."""
    module = _STATE["module"]
    if module is not None or _STATE["tried"]:
        return module
    with _LOCK:
        if _STATE["tried"]:
            return _STATE["module"]
        _STATE["tried"] = True
    how = mode()
    if how in ("0", "off"):
        return None
    try:
        built = library_path().is_file()
    except (files.FolderError, OSError):  # the cache folder: _build_and_load says what is wrong with it
        built = False
    if built or how == "build":
        _build_and_load()
        return _STATE["module"]
    thread = threading.Thread(target=_build_and_load, name="gemm_ladder-native-build", daemon=True)
    _STATE["thread"] = thread
    thread.start()
    return None


def wait(timeout: float | None = None):
    """Wait for a helper thread's build (if one runs); the loaded module or None."""
    thread = _STATE["thread"]
    if thread is not None:
        thread.join(timeout)
    return _STATE["module"]


def error() -> str | None:
    """Why the last build failed, or None."""
    return _STATE["error"]


def reset() -> None:
    """Forget the loaded module's entries and whether it was tried (tests; a new ``$GEMM_LADDER_NATIVE``)."""
    with _LOCK:
        module = _STATE["module"]
        _STATE.update(module=None, tried=False, thread=None, error=None)
        _ON_LOAD.clear()
    if module is not None:
        module.clear()
