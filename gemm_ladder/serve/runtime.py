"""Load an exported module and run it with nothing but the TVM runtime.

This module (and everything it imports) must work where TVM's compiler library is absent:
a GPU box that got the exported ``.so`` files and a runtime-only TVM (see ``gemm_ladder.serve.pack``).
It never compiles anything: the ``.so`` holds the device binary.

    mod = gemm_ladder.load("build/v4_4096x4096x4096_float16_sm_90a.so")
    D = mod(A, B)            # A [M, K], B [N, K] on the GPU, D = A @ B.T
    mod(A, B, out=D)         # writes into D
    mod(A, B, bias=b)        # a module whose operand spec has a bias: D = A @ B.T + b
    mod(A, B, alpha=0.5, C=c, beta=1.0)   # a spec with alpha and a residual: D = 0.5 A @ B.T + c

Before the dynamic loader sees the ``.so``, its manifest is read and checked (a JSON object of
this format, with the fields the loader needs) and the file is checked against it: its size and
sha256, recorded at export. A truncated copy or a manifest of another module is refused with a
:class:`ManifestError` that names the file and the fix (loading a truncated ``.so`` would crash
the process). Every input is checked before launch: dtype, device, shape, layout (contiguous,
16-byte aligned) and that the GPU is the arch the module was built for.

A module built with a runtime M (``launch["dynamic_m"]`` in its manifest: v6/v9 with
``dynamic_m=True``) takes any M >= 1 with its N and K: ``mod(A, B)`` reads M off ``A``.
``mod.M`` is then the M its knobs were chosen for (what ``check`` and ``time`` use by default).

The manifest's ``spec`` (``gemm_ladder.core.spec``; a manifest written before it existed reads as the
default: the dtype in and out, no epilogue) says which operands the kernel takes after D: they are
passed by name (``bias=``, ``C=``; the fp32 scalars ``alpha=``, ``beta=`` as Python floats, 1.0
when left out), checked like A and B, and go to the kernel after the launch scalars, in the
spec's order (:meth:`GemmModule.operand_args`). ``C`` may be ``out`` itself (an in-place
residual add: ``epilogue.ResidualRead`` in the kernel says why that is safe).

A split-K module (``launch["workspace"]``: v10, v11) takes an fp32 buffer of partial tiles and
int32 counters after ``D``; the module allocates them (zeroed once: the kernel puts every
counter back to zero) on first use per GPU, sized for the call's M (and, with v10's
``stream_k``, for the GPU's CTA count), and grows them for a larger M. Launch one such module
from one stream at a time (two launches at once would share them).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import warnings
from pathlib import Path

from ..core import device
from ..core.manifest import ManifestError, check_file, read_manifest
from ..core.spec import GemmSpec, spec_of_manifest, torch_name
from ..sync import watchdog
from . import pack


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


def scalar_arg(name: str, value, who: str = "the module") -> float:
    """An epilogue's fp32 scalar (``alpha``, ``beta``) as the kernel takes it: a real, finite Python
    or NumPy number (a tensor would need a device sync to read: pass ``float(t)``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__") \
            or hasattr(value, "shape"):
        raise ModuleInputError(f"{who}: {name} must be a Python float, got {type(value).__name__} "
                               f"(a tensor's value: pass float({name}), which reads it on the host)")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ModuleInputError(f"{who}: {name}={value} is not finite; pass a finite float")
    return value


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
        self.spec: GemmSpec = spec_of_manifest(manifest)  # its operands (old manifests: the default)
        # M read off A at every call (any M >= 1); self.M is then the M the knobs were chosen for
        self.dynamic_m = bool(manifest.get("launch", {}).get("dynamic_m"))
        self._rt = rt_module
        self._fn = None
        self._checked_devices: set = set()
        self._workspaces: dict = {}  # GPU index -> (fp32 partials, int32 counters)
        self._grids: dict = {}  # GPU index -> CTAs of a persistent launch

    def __repr__(self) -> str:
        m = "(any M)" if self.dynamic_m else self.M
        return f"<GemmModule {self.rung} {m}x{self.N}x{self.K} {self.dtype} {self.arch} from {self.path.name}>"

    # -- checks -------------------------------------------------------------------------------
    def _check_tensor(self, name, t, shape, dtype=None):
        import torch  # pylint: disable=import-outside-toplevel

        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want = getattr(torch, torch_name(dtype or self.dtype))  # float8_e4m3 is torch's float8_e4m3fn
        if t.dtype != want:
            raise ModuleInputError(f"{name} has dtype {t.dtype}; this module was built for {want} (use {name}.to({want}))")
        if tuple(t.shape) != tuple(shape):
            built = (f"any M >= 1 with N={self.N}, K={self.K}" if self.dynamic_m
                     else f"M={self.M}, N={self.N}, K={self.K}")
            raise ModuleInputError(
                f"{name} has shape {tuple(t.shape)}; this module wants {tuple(shape)} "
                f"(it was built for {built}): build one for your shape"
            )
        if not t.is_contiguous():
            raise ModuleInputError(f"{name} is not contiguous (row-major); pass {name}.contiguous()")
        if t.data_ptr() % 16:
            raise ModuleInputError(f"{name} does not start on a 16-byte boundary, which TMA needs; pass {name}.clone()")

    @staticmethod
    def _check_on_gpu(name, t):
        if t.device.type != "cuda":
            raise ModuleInputError(f"{name} is on {t.device}; move it to the GPU ({name}.cuda())")

    def check_device(self, where) -> None:
        import torch  # pylint: disable=import-outside-toplevel

        idx = where.index if where.index is not None else torch.cuda.current_device()
        if idx in self._checked_devices:
            return
        have = device.arch_of(idx)
        if have != self.arch:
            raise ArchMismatchError(
                f"{self.path.name} was built for {self.arch} but GPU {idx} "
                f"({device.name_of(idx)}) is {have}: rebuild with arch={have!r}"
            )
        self._checked_devices.add(idx)

    def _function(self):
        if self._fn is None:
            self._fn = self._rt["main"] if "main" in _function_names(self._rt) else self._rt
        return self._fn

    def entry(self):
        """The loaded kernel function itself, unchecked: for a caller that checks its own operands
        and passes them in the kernel's order (``serve.grouped``: W viewed as [E * N, K], offs)."""
        return self._function()

    def rows_of(self, A) -> int:
        """The M of a call: A's rows (its columns where A is stored MN-major, [K, M]) for a module
        with a runtime M (at least 1), else the module's M."""
        if not self.dynamic_m:
            return self.M
        shape = tuple(getattr(A, "shape", ()))
        m_dim = 0 if self.spec.a_major == "K" else 1
        if len(shape) != 2 or shape[m_dim] < 1:
            want = f"(M, {self.K})" if m_dim == 0 else f"({self.K}, M)"
            raise ModuleInputError(f"A has shape {shape}; this module takes A of shape {want} with any M >= 1")
        return int(shape[m_dim])

    def stored_shape(self, name: str, M: int) -> tuple:
        """The shape the kernel takes operand ``name`` ("A", "B", "D") in for ``M`` rows: as the
        spec stores it (A [M, K] or, MN-major, [K, M]; B [N, K] or [K, N]), row-major. The front
        door passes an MN-major operand as the contiguous tensor under its transposed view."""
        op = next(o for o in self.spec.operands() if o.name == name)
        return op.extent(M, self.N, self.K)

    def operand_args(self, M: int, operands: dict, where) -> list:
        """The spec's epilogue operands (``bias``, ...) of a call with ``M`` rows, checked like A and
        B and in the kernel's order; a missing or unexpected one is refused with what to pass."""
        ops = self.spec.epilogue_operands()
        names = [op.name for op in ops]
        extra = sorted(k for k, v in operands.items() if v is not None and k not in names)
        if extra:
            has = f"takes {', '.join(names)}" if names else "has no epilogue operands"
            raise ModuleInputError(f"{self.path.name} {has} (its spec: {self.spec.text()}), not {', '.join(extra)}: "
                                   f"use a module built with them (pack build --epilogue bias), or leave them out")
        args = []
        for op in ops:
            t = operands.get(op.name)
            if op.role == "scalar":  # alpha, beta: fp32 values, 1.0 when not given
                args.append(scalar_arg(op.name, 1.0 if t is None else t, self.path.name))
                continue
            if t is None:
                raise ModuleInputError(f"{self.path.name} adds {op.name} ({op.dtype}, shape {op.shape}) in its "
                                       f"epilogue (its spec: {self.spec.text()}): pass {op.name}=")
            self._check_tensor(op.name, t, op.extent(M, self.N, self.K), op.dtype)
            self._check_on_gpu(op.name, t)
            if t.device != where:
                raise ModuleInputError(f"{op.name} is on {t.device} but A on {where}; put all on one GPU")
            args.append(t)
        return args

    def __call__(self, A, B, out=None, **operands):
        import torch  # pylint: disable=import-outside-toplevel

        if not isinstance(A, torch.Tensor):
            raise ModuleInputError(f"A must be a torch.Tensor, got {type(A).__name__}")
        M = self.rows_of(A)
        self._check_tensor("A", A, self.stored_shape("A", M), self.spec.a)
        self._check_tensor("B", B, self.stored_shape("B", M), self.spec.b)
        if out is not None:
            self._check_tensor("out", out, self.d_shape(M), self.spec.d)
        for name, t in (("A", A), ("B", B), ("out", out)):
            if t is not None:
                self._check_on_gpu(name, t)
        if A.device != B.device:
            raise ModuleInputError(f"A is on {A.device} and B on {B.device}; put both on one GPU")
        extras = self.operand_args(M, operands, A.device)
        self.check_device(A.device)
        if out is None:
            out = torch.empty(self.d_shape(M), dtype=getattr(torch, torch_name(self.spec.d)), device=A.device)
        elif out.device != A.device:
            raise ModuleInputError(f"out is on {out.device} but A on {A.device}; put all on one GPU")
        with torch.cuda.device(A.device):
            args = (A, B, out, *self.workspace_args(M, A.device), *self.launch_args(A.device), *extras)
            if self.manifest.get("watchdog"):  # bounded waits: a hang raises BarrierTimeoutError
                watchdog.launch(self._function(), args, self.manifest["watchdog"], self.rung)
            else:
                self._function()(*args)
        return out

    def d_shape(self, M: int) -> tuple:
        """D's shape for M rows: (M, N), or (M, N / 2) where the spec's B is gated (SwiGLU)."""
        return self.spec.operands()[2].extent(M, self.N, self.K)

    def launcher(self, A, B, out, **operands):
        """A function ``launch(A, B, out, *epilogue_operands)`` that launches this module on
        tensors like these (same shapes, dtype and GPU; the spec's epilogue operands, e.g. the bias,
        in its order) without checking them again: the checks of a call run once here, and the grid
        and split-K workspace are bound for this M. For callers that check their own inputs and
        launch one shape many times (the front door), where the checks of every call would cost
        more host time than a small kernel takes."""
        import torch  # pylint: disable=import-outside-toplevel

        M = self.rows_of(A)
        for name, t, shape, dtype in (("A", A, self.stored_shape("A", M), self.spec.a),
                                      ("B", B, self.stored_shape("B", M), self.spec.b),
                                      ("out", out, self.d_shape(M), self.spec.d)):
            self._check_tensor(name, t, shape, dtype)
            self._check_on_gpu(name, t)
        if A.device != B.device or out.device != A.device:
            raise ModuleInputError(f"A is on {A.device}, B on {B.device}, out on {out.device}; put all on one GPU")
        self.operand_args(M, operands, A.device)
        self.check_device(A.device)
        fn, idx = self._function(), A.device.index
        tail = [*self.workspace_args(M, A.device), *self.launch_args(A.device)]
        if self.manifest.get("watchdog"):  # a watchdog build: every launch bounded, as in __call__
            def bounded(a, b, d, *extras):
                with torch.cuda.device(idx):
                    watchdog.launch(fn, (a, b, d, *tail, *extras), self.manifest["watchdog"], self.rung)

            return bounded

        # torch.cuda.current_device() re-runs torch's lazy-init checks on every call; the launcher
        # exists only once CUDA is up, so the plain query serves (a microsecond per call saved)
        current = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)  # pylint: disable=protected-access

        def launch(a, b, d, *extras):
            if current() == idx:
                fn(a, b, d, *tail, *extras)
            else:
                with torch.cuda.device(idx):
                    fn(a, b, d, *tail, *extras)

        return launch

    def workspace_elems(self, M: int, num_ctas: int | None = None) -> dict:
        """Elements of each workspace buffer a launch with ``M`` rows on ``num_ctas`` CTAs takes
        (``{}``: none): ``ceil(M / m_step)`` times the per-step counts of ``launch["workspace"]``
        plus ``num_ctas`` times its per-CTA counts (stream-K), at least one."""
        ws = self.manifest.get("launch", {}).get("workspace")
        if not ws:
            return {}
        steps = -(-M // int(ws["m_step"]))
        need = {}
        for kind in ("float32", "int32"):
            per_cta = int(ws.get(f"{kind}_per_cta", 0))
            if per_cta and num_ctas is None:
                raise ValueError(f"{self!r}: its workspace grows with the launch's CTAs; pass num_ctas")
            need[kind] = max(1, steps * int(ws[f"{kind}_per_m_step"]) + (num_ctas or 0) * per_cta)
        return need

    def workspace_args(self, M: int, where) -> list:
        """The workspace arguments a launch of ``M`` rows on GPU ``where`` passes after D (``[]``
        without split-K): this GPU's zeroed buffers, as views of exactly the size the kernel
        checks; ModuleInputError where they would pass the kernel's 32-bit indices."""
        ws = self.manifest.get("launch", {}).get("workspace") or {}
        per_cta = ws.get("float32_per_cta") or ws.get("int32_per_cta")  # stream-K: sized by the CTAs
        need = self.workspace_elems(M, self.launch_args(where)[0] if per_cta else None)
        if not need:
            return []
        if max(need.values()) >= 2**31:  # the kernel indexes its workspace with 32-bit ints
            raise ModuleInputError(
                f"M={M} needs a split-K workspace of {need['float32']} fp32 partials, more than this "
                f"module's 32-bit indices reach; split the call into parts of fewer rows, or use a "
                f"module with split_k=1 for this M"
            )
        import torch  # pylint: disable=import-outside-toplevel

        idx = where.index if where.index is not None else torch.cuda.current_device()
        have = self._workspaces.get(idx)
        if have is None or have[0].numel() < need["float32"] or have[1].numel() < need["int32"]:
            dev = torch.device("cuda", idx)
            old = have or (torch.empty(0), torch.empty(0))
            # zeroed once: every launch leaves its counters at zero again
            have = outside_graph_pools(lambda: (
                torch.zeros(max(need["float32"], old[0].numel()), dtype=torch.float32, device=dev),
                torch.zeros(max(need["int32"], old[1].numel()), dtype=torch.int32, device=dev)), idx)
            self._workspaces[idx] = have
        return [have[0][: need["float32"]], have[1][: need["int32"]]]

    def launch_args(self, where) -> list:
        """The launch arguments after the workspace: ``[]``, or for a persistent rung its grid size,
        :func:`persistent_grid` for *this* GPU (asked once per GPU)."""
        launch = self.manifest.get("launch", {})
        if not launch.get("persistent"):
            return []
        import torch  # pylint: disable=import-outside-toplevel

        idx = where.index if where.index is not None else torch.cuda.current_device()
        if idx not in self._grids:
            self._grids[idx] = persistent_grid(idx, launch, self.path.name)
        return [self._grids[idx]]


def persistent_grid(index: int, launch: dict, name: str = "the module") -> int:
    """The CTAs of a persistent launch on GPU ``index``: one per SM, in whole clusters where the
    rung launches clusters (``launch["cluster"]``), and no more clusters than the GPU runs at once
    (:func:`device.max_active_clusters`). An H100 SXM's 132 SMs hold 33 clusters of 2 CTAs but only
    32 of 4: a 33rd would start when another finished and run its tiles in a second pass."""
    cluster = int(launch.get("cluster", 1))
    ctas = device.sm_count(index) // cluster * cluster
    if cluster == 1:
        return ctas
    if not all(isinstance(launch.get(k), int) for k in ("threads", "smem_bytes")):
        raise ManifestError(f"{name}: its manifest's launch records no threads or smem_bytes, which a clustered "
                            "launch needs to size its grid; re-export the module")
    try:
        fit = device.max_active_clusters(index, cluster, launch["threads"], launch["smem_bytes"])
    except RuntimeError as err:
        warnings.warn(f"{name}: the driver could not say how many clusters of {cluster} CTAs GPU {index} "
                      f"runs at once ({err}); launching {ctas} CTAs, which may run the last clusters late",
                      RuntimeWarning, stacklevel=3)
        return ctas
    if fit < 1:
        raise ModuleInputError(
            f"GPU {index} cannot run a cluster of {cluster} CTAs with {launch['smem_bytes']} bytes of shared "
            f"memory each, which {name} launches; rebuild it with cluster_m=1, cluster_n=1")
    return min(ctas, fit * cluster)


def _function_names(rt) -> set:
    try:
        return {"main"} if rt.implements_function("main") else set()
    except Exception:  # pylint: disable=broad-except
        return set()


def outside_graph_pools(make, index: int):
    """``make()`` run on a helper thread (its error raised here), outside CUDA-graph capture; inside
    capture, here (a capture's allocations are the graph's own, as they must be).

    torch's CUDA-graph trees (``torch.compile(mode="reduce-overhead")``) send every allocation of the
    thread that warms a graph up into that graph's memory pool, and then refuse any live tensor in
    the pool that is not an output of the graph ("tensor(s) in the cudagraph pool not tracked as
    outputs"). A buffer kept across calls -- a split-K workspace, a weight's padded copy -- or made
    by the first call's timing must come from the default pool: another thread's allocations do.
    The helper waits for its stream before it returns, so any stream may use what it made. It runs
    with gradients off: a new thread's grad mode is on whatever the caller's, and a backward pass
    (grad mode off, saved inputs that require grad) then had the first use's torch candidate
    (``torch.mm(..., out=)``) refused by autograd and silently dropped from the timing."""
    import torch  # pylint: disable=import-outside-toplevel

    if torch.cuda.is_current_stream_capturing():
        return make()
    got: dict = {}

    def run():
        try:
            with torch.cuda.device(index), torch.no_grad():
                got["value"] = make()
                torch.cuda.current_stream().synchronize()
        except BaseException as err:  # pylint: disable=broad-except  (re-raised in the caller's thread)
            got["error"] = err

    worker = threading.Thread(target=run, name="gemm_ladder-alloc")
    worker.start()
    worker.join()
    if "error" in got:
        raise got["error"]
    return got["value"]


def load(path) -> GemmModule:
    """Load an exported rung (``.so`` plus its ``.json`` manifest) with the TVM runtime only.

    The manifest and the file are checked first (:func:`read_manifest`, :func:`check_file`)."""
    manifest = read_manifest(path)
    check_file(path, manifest)
    pack.check_runtime_libs()  # a runtime pack's libraries, before TVM loads them
    import tvm  # pylint: disable=import-outside-toplevel

    _load_cuda_runtime_libs()
    if manifest.get("tvm_version") and manifest["tvm_version"] != tvm.__version__:
        raise RuntimeError(
            f"{path} was built with TVM {manifest['tvm_version']} but this runtime is TVM "
            f"{tvm.__version__}: rebuild it, or use a matching runtime"
        )
    rt = tvm.runtime.load_module(str(path))
    return GemmModule(path, manifest, rt)
