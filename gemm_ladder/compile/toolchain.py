"""The device compiler behind a build, and how a box with no GPU driver still gets a binary.

TVM's CUDA codegen always emits CUDA source. It turns that source into a device binary at
build time only when its CUDA runtime library (``libtvm_runtime_cuda.so``) is loaded, and that
library needs ``libcuda.so.1`` (the driver) and ``libcudart.so.13``. On a box without a driver
TVM swallows the failure and keeps the *source*: the exported module would then compile at
load time, on the GPU box, with whatever compiler is there. gemm-ladder never ships that.

:func:`prepare` makes the build-time path work everywhere:

1. the CUDA runtime comes from the ``nvidia-cuda-runtime`` wheel when the system has none;
2. where no driver can be loaded, a do-nothing ``libcuda.so.1`` (built once with the C
   compiler into the user cache, its size and sha256 recorded beside it; a copy that no longer
   matches is rebuilt, since loading a truncated library is a bus error) stands in for it:
   nothing is launched at build time, it only lets TVM's CUDA library load;
3. the device compiler is NVRTC from the ``nvidia-cuda-nvrtc`` wheel (headers from the
   ``nvidia-cuda-runtime`` and ``nvidia-cuda-cccl`` wheels), or ``nvcc`` from the PATH when
   those wheels are missing, or when ``GEMM_LADDER_COMPILER=nvcc`` asks for it;
4. our compile callback replaces TVM's so the build records the binary, the compiler and its
   version next to the kernel.

Every build checks that the module it exports holds a binary (see ``sass.has_device_binary``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..core import files

_STUB_SOURCE = r"""
/* Build-time stand-in for the CUDA driver: every call reports CUDA_ERROR_NO_DEVICE (100).
   It exists so that TVM's CUDA runtime library loads on a box without a GPU driver. */
int cuInit(unsigned flags) { (void)flags; return 100; }
int cuDriverGetVersion(int *v) { if (v) *v = 0; return 100; }
int cuDeviceGetName(void) { return 100; }
int cuFuncSetAttribute(void) { return 100; }
int cuLaunchKernelEx(void) { return 100; }
int cuModuleGetFunction(void) { return 100; }
int cuModuleLoadData(void) { return 100; }
int cuModuleUnload(void) { return 100; }
int cuTensorMapEncodeTiled(void) { return 100; }
int cuGetErrorName(int e, const char **s) { (void)e; if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; if (s) *s = "no CUDA driver on this machine (gemm-ladder build stub)"; return 0; }
"""


class ToolchainError(RuntimeError):
    """The build cannot produce a device binary; the message says what to install."""


@dataclass(frozen=True)
class Compiler:
    name: str  # "nvrtc" or "nvcc"
    version: str
    cuda_path: str

    def describe(self) -> str:
        return f"{self.name} {self.version}"


def _site_cuda_home() -> Path | None:
    """``site-packages/nvidia/cu13`` of the nvidia-* wheels, if they are installed."""
    for base in sys.path:
        home = Path(base) / "nvidia" / "cu13"
        if (home / "lib").is_dir():
            return home
    return None


def cache_dir() -> Path:
    """The user cache folder, checked (:func:`gemm_ladder.core.files.cache_dir`)."""
    return files.cache_dir()


def _try_load(name: str) -> bool:
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def load_cudart() -> None:
    """Make ``libcudart.so.13`` loadable for TVM's CUDA library (system first, then the wheel)."""
    if _try_load("libcudart.so.13"):
        return
    candidates = []
    home = _site_cuda_home()
    if home:
        candidates.append(home / "lib" / "libcudart.so.13")
    candidates += [Path("/usr/local/cuda/lib64/libcudart.so.13")]
    for c in candidates:
        if c.exists() and _try_load(str(c)):
            return
    raise ToolchainError(
        "libcudart.so.13 was not found: install the CUDA runtime wheel "
        "(pip install 'nvidia-cuda-runtime==13.0.*') or a CUDA 13 toolkit"
    )


def driver_present() -> bool:
    return _try_load("libcuda.so.1")


def _build_stub(out: Path) -> None:
    """Compile the stand-in into ``out`` atomically (beside it, then renamed) and record its size
    and sha256 beside it, last."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise ToolchainError(
            "no GPU driver here and no C compiler to build the driver stand-in: install gcc, "
            "or build on a machine with the NVIDIA driver"
        )
    with tempfile.TemporaryDirectory() as tmp, files.replacing(out) as tmp_out:
        src = Path(tmp) / "stub.c"
        src.write_text(_STUB_SOURCE)
        proc = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_out), str(src)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToolchainError(f"{cc} could not build the driver stand-in {out}: "
                                 f"{' '.join(proc.stderr.split())[-300:]}")
    files.write_json(_record_path(out), files.file_record(out))


def _record_path(stub: Path) -> Path:
    return stub.with_name(stub.name + ".json")


def _read_record(stub: Path) -> dict | None:
    try:
        return json.loads(_record_path(stub).read_text())
    except (OSError, ValueError):
        return None


def stub_driver() -> Path:
    """The do-nothing ``libcuda.so.1`` in the cache, built on first use and checked against its
    recorded size and sha256 on every later one: a damaged copy is rebuilt, with a warning."""
    folder = cache_dir() / "stub-driver"
    out = folder / "libcuda.so.1"
    with files.folder_lock(folder, wait=True, what="this build", role="driver stand-in folder"):
        damage = None
        if out.exists() or out.is_symlink():
            try:
                files.check_loadable(out, _read_record(out))
                return out
            except files.DamagedFile as err:
                damage = str(err)
        try:
            _build_stub(out)
        except ToolchainError as err:
            if damage:
                raise ToolchainError(f"{damage}, and it cannot be rebuilt: {err}") from None
            raise
    if damage:
        print(f"warning: {damage}: rebuilt it", file=sys.stderr)
    return out


def load_stub_driver() -> None:
    """Load the stand-in (:func:`stub_driver`) in place of a missing driver."""
    path = stub_driver()
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise ToolchainError(f"the driver stand-in {path} does not load ({err}): delete it to rebuild it") from None


def choose_compiler() -> Compiler:
    """NVRTC from the wheels when they are complete, else nvcc from the PATH."""
    want = os.environ.get("GEMM_LADDER_COMPILER", "").lower()
    home = _site_cuda_home()
    nvrtc_ok = bool(
        home
        and list((home / "lib").glob("libnvrtc.so.13*"))
        and (home / "include" / "cuda_runtime.h").exists()
        and (home / "include" / "cccl" / "cuda" / "std" / "limits").exists()
    )
    nvcc = shutil.which("nvcc")
    if want not in ("", "nvrtc", "nvcc"):
        raise ToolchainError(f"GEMM_LADDER_COMPILER={want!r}: use 'nvrtc' or 'nvcc'")
    if want != "nvcc" and nvrtc_ok:
        from cuda.bindings import nvrtc  # pylint: disable=import-outside-toplevel

        _, major, minor = nvrtc.nvrtcVersion()
        return Compiler("nvrtc", f"{major}.{minor}", str(home))
    if nvcc and want != "nvrtc":
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
        version = out.strip().splitlines()[-1] if out.strip() else "unknown"
        cuda_path = str(Path(os.path.realpath(nvcc)).parent.parent)
        if not (Path(cuda_path) / "include" / "cuda_runtime.h").exists():
            cuda_path = "/usr/local/cuda"
        return Compiler("nvcc", version, cuda_path)
    raise ToolchainError(
        "no CUDA device compiler: install the NVRTC wheels (pip install 'nvidia-cuda-nvrtc==13.0.*' "
        "'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' cuda-bindings) or put nvcc on the PATH"
    )


class _Recorder:
    """Holds what the last device compile produced."""

    binary: bytes | None = None
    source: str | None = None


RECORD = _Recorder()
_PREPARED: Compiler | None = None


def prepare() -> Compiler:
    """Set up the build-time compile path (idempotent) and return the compiler in use."""
    global _PREPARED  # pylint: disable=global-statement
    if _PREPARED is not None:
        return _PREPARED
    compiler = choose_compiler()
    os.environ["CUDA_PATH"] = compiler.cuda_path
    if compiler.name == "nvrtc":
        # TVM looks for the libcu++ headers under targets/<arch>/include; the wheel keeps them
        # under include/cccl.
        cccl = f"-I{Path(compiler.cuda_path) / 'include' / 'cccl'}"
        extra = os.environ.get("TVM_CUDA_NVRTC_EXTRA_OPTS", "")
        if cccl not in extra:
            os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"] = f"{extra} {cccl}".strip()
    load_cudart()
    if not driver_present():
        load_stub_driver()

    import tvm  # pylint: disable=import-outside-toplevel
    import tvm_ffi  # pylint: disable=import-outside-toplevel
    from tvm.base import _LOADED_LIBS  # pylint: disable=import-outside-toplevel

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        # tvm was imported before the libraries above could be found: load its CUDA part now.
        lib = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
        _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)

    def compile_callback(code):
        from tvm.support import nvcc as tvm_nvcc  # pylint: disable=import-outside-toplevel

        binary = tvm_nvcc.compile_cuda(code, target_format="cubin", compiler=compiler.name)
        RECORD.binary, RECORD.source = bytes(binary), code
        return binary

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_callback, override=True)
    del tvm
    _PREPARED = compiler
    return compiler
