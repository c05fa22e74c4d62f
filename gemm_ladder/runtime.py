"""Load an exported module and run it with nothing but the TVM runtime.

This module (and everything it imports) must work where TVM's compiler library is absent:
a GPU box that got the exported ``.so`` files and a runtime-only TVM (see ``gemm_ladder.pack``).
It never compiles anything: the ``.so`` holds the device binary.

    mod = gemm_ladder.load("build/v4_4096x4096x4096_float16_sm_90a.so")
    D = mod(A, B)            # A [M, K], B [N, K] on the GPU, D = A @ B.T
    mod(A, B, out=D)         # writes into D

Every input is checked before launch: dtype, device, shape, layout (contiguous, 16-byte
aligned) and that the GPU is the arch the module was built for.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

from .config import arch_of_capability

MANIFEST_SUFFIX = ".json"


class ModuleInputError(ValueError):
    """A tensor passed to a loaded module does not fit it; the message says what would."""


class ArchMismatchError(RuntimeError):
    """The module was built for another GPU arch than the one it is asked to run on."""


def _load_cuda_runtime_libs() -> None:
    """TVM's CUDA part needs libcudart.so.13; torch's wheels (or the toolkit) carry one."""
    from tvm.base import _LOADED_LIBS  # pylint: disable=import-outside-toplevel

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    try:
        ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        for base in sys.path:
            cand = Path(base) / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
            if cand.exists():
                ctypes.CDLL(str(cand), mode=ctypes.RTLD_GLOBAL)
                break
    lib = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise RuntimeError(
            f"TVM's CUDA runtime ({lib}) did not load: {err}. It needs the NVIDIA driver "
            "(libcuda.so.1) and libcudart.so.13 (pip install 'nvidia-cuda-runtime==13.0.*')"
        ) from None


def read_manifest(path) -> dict:
    path = Path(path)
    man = Path(str(path) + MANIFEST_SUFFIX)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not man.exists():
        raise FileNotFoundError(
            f"{man} is missing: gemm_ladder.load needs the manifest that export() writes beside the .so"
        )
    return json.loads(man.read_text())


class GemmModule:
    """A loaded rung: ``D = mod(A, B)`` or ``mod(A, B, out=D)`` on torch CUDA tensors."""

    def __init__(self, path, manifest: dict, rt_module):
        self.path = Path(path)
        self.manifest = manifest
        self.rung = manifest["rung"]
        self.M, self.N, self.K = manifest["shape"]
        self.dtype = manifest["dtype"]
        self.arch = manifest["arch"]
        self.knobs = manifest["knobs"]
        self.tvm_version = manifest["tvm_version"]
        self._rt = rt_module
        self._fn = None
        self._checked_devices: set = set()

    def __repr__(self) -> str:
        return f"<GemmModule {self.rung} {self.M}x{self.N}x{self.K} {self.dtype} {self.arch} from {self.path.name}>"

    # -- checks -------------------------------------------------------------------------------
    def _check_tensor(self, name, t, shape):
        import torch  # pylint: disable=import-outside-toplevel

        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want = getattr(torch, self.dtype)
        if t.dtype != want:
            raise ModuleInputError(f"{name} has dtype {t.dtype}; this module was built for {want} (use {name}.to({want}))")
        if tuple(t.shape) != tuple(shape):
            raise ModuleInputError(
                f"{name} has shape {tuple(t.shape)}; this module was built for {tuple(shape)} "
                f"(M={self.M}, N={self.N}, K={self.K}): build one for your shape"
            )
        if not t.is_contiguous():
            raise ModuleInputError(f"{name} is not contiguous (row-major); pass {name}.contiguous()")
        if t.data_ptr() % 16:
            raise ModuleInputError(f"{name} does not start on a 16-byte boundary, which TMA needs; pass {name}.clone()")

    @staticmethod
    def _check_on_gpu(name, t):
        if t.device.type != "cuda":
            raise ModuleInputError(f"{name} is on {t.device}; move it to the GPU ({name}.cuda())")

    def check_device(self, device) -> None:
        import torch  # pylint: disable=import-outside-toplevel

        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx in self._checked_devices:
            return
        major, minor = torch.cuda.get_device_capability(idx)
        have = arch_of_capability(major, minor)
        if have != self.arch:
            raise ArchMismatchError(
                f"{self.path.name} was built for {self.arch} but GPU {idx} "
                f"({torch.cuda.get_device_name(idx)}) is {have}: rebuild with arch={have!r}"
            )
        self._checked_devices.add(idx)

    def _function(self):
        if self._fn is None:
            self._fn = self._rt["main"] if "main" in _function_names(self._rt) else self._rt
        return self._fn

    def __call__(self, A, B, out=None):
        import torch  # pylint: disable=import-outside-toplevel

        self._check_tensor("A", A, (self.M, self.K))
        self._check_tensor("B", B, (self.N, self.K))
        if out is not None:
            self._check_tensor("out", out, (self.M, self.N))
        for name, t in (("A", A), ("B", B), ("out", out)):
            if t is not None:
                self._check_on_gpu(name, t)
        if A.device != B.device:
            raise ModuleInputError(f"A is on {A.device} and B on {B.device}; put both on one GPU")
        self.check_device(A.device)
        if out is None:
            out = torch.empty((self.M, self.N), dtype=A.dtype, device=A.device)
        elif out.device != A.device:
            raise ModuleInputError(f"out is on {out.device} but A on {A.device}; put all on one GPU")
        with torch.cuda.device(A.device):
            args = (A, B, out, *self._launch_args(A.device))
            if self.manifest.get("watchdog"):  # bounded waits: a hang raises BarrierTimeoutError
                from .barriers import watchdog  # pylint: disable=import-outside-toplevel

                watchdog.launch(self._function(), args, self.manifest["watchdog"], self.rung)
            else:
                self._function()(*args)
        return out

    def _launch_args(self, device) -> list:
        """Persistent rungs take their grid size at launch: one CTA per SM of *this* GPU."""
        if not self.manifest.get("launch", {}).get("persistent"):
            return []
        import torch  # pylint: disable=import-outside-toplevel

        return [torch.cuda.get_device_properties(device).multi_processor_count]


def _function_names(rt) -> set:
    try:
        return {"main"} if rt.implements_function("main") else set()
    except Exception:  # pylint: disable=broad-except
        return set()


def load(path) -> GemmModule:
    """Load an exported rung (``.so`` plus its ``.json`` manifest) with the TVM runtime only."""
    manifest = read_manifest(path)
    import tvm  # pylint: disable=import-outside-toplevel

    _load_cuda_runtime_libs()
    if manifest.get("tvm_version") and manifest["tvm_version"] != tvm.__version__:
        raise RuntimeError(
            f"{path} was built with TVM {manifest['tvm_version']} but this runtime is TVM "
            f"{tvm.__version__}: rebuild it, or use a matching runtime"
        )
    rt = tvm.runtime.load_module(str(path))
    return GemmModule(path, manifest, rt)
