"""The front door: ``D = A . B^T`` for any shape, on the kernel the policy chooses for it.

    import gemm_ladder
    D = gemm_ladder.matmul(A, B)              # A [..., K] (batch dims flattened into M), B [N, K]
    gemm_ladder.matmul(A, B, out=D)           # D [..., N]
    gemm_ladder.matmul(A, B, bias=b)          # D = A . B^T + b, b [N] (fp32 sum, then rounded)
    gemm_ladder.matmul(A, B, bias=b, activation="gelu_tanh")  # D = gelu(A . B^T + b), in fp32, then rounded
    gemm_ladder.matmul(A, B, alpha=0.5, residual=C, out=C)  # C = 0.5 A . B^T + C, in place, one kernel
    gemm_ladder.matmul(A, B, out_dtype=torch.float32)        # D in float32 (A, B 16-bit)
    gemm_ladder.swiglu(x, W_gu)               # silu(x . Wg^T) * (x . Wu^T), W_gu = cat([Wg, Wu]): one kernel
    gemm_ladder.matmul(A, B, explain=True)    # also prints which kernel, from where, and why

How a call finds its kernel (once per shape, dtype and GPU arch; then from memory)::

    1. kernel packs ($GEMM_LADDER_PACK, gemm_ladder.use_pack): a module built for this M, or one
       that takes M at run time with knobs chosen for a range that holds M   (kernel_pack)
    2. where TVM's compiler is here: the policy's choice (the tuning database by shape bucket,
       else the heuristic's rules: gemm_ladder.serve.plan), from the module cache or built into it
       now, shared safely by concurrent processes                              (module_cache)
    3. a pack module that serves the shape less well: M outside the range its knobs were chosen
       for, or a larger M with A copied into zero-padded rows; but not one made for an M far from
       this one (more than 4x outside its range, or more than twice the rows: ``_far``)
    0. a problem so small that cuBLAS's kernel measured faster (under TINY_FLOPS and TINY_BYTES):
       torch's matmul inside CUDA-graph capture, ours for eager calls (whose host path is the
       shorter), and explain says so (strict mode: ours always)
    4. else (or where M is past what a kernel of ours indexes in 32 bits: config.max_m_of)
       torch's own matmul (cuBLAS), with a warning once per shape (KernelFallbackWarning)
       that says how to build a pack for it: a model with one layer no pack serves still runs,
       as fast as torch. ``strict=True`` or ``GEMM_LADDER_STRICT=1`` makes this a NoKernelError
       (and lets a far module serve, with the warning)

Measured at first use (``first_use``): where a pack holds several modules that serve this M as
they are (1.) or the policy's module was built (2.), the first eager call of the shape times them
and torch's own matmul on its own A and B, as queued calls and as kernels in a CUDA graph; eager
calls keep the fastest call, calls inside graph capture the fastest kernel (torch only where it
beats every kernel of ours by 2%: never slower than cuBLAS), remembered per GPU, M and candidates
in ``$GEMM_LADDER_CHOICES`` (default ``<cache>/choices.json``); ``explain`` prints the times.
Inside capture a weight that needs a padded copy for TMA goes to torch's matmul (the copy would
be made on every replay) unless the first call timed ours faster with the copy in the graph;
strict mode keeps ours. A wide N that is not a multiple of 8 with K that is (an LM head of 50257
rows) needs no copy of the weight: the kernel reads its first rows where they lie, torch's matmul
the last few (``tma_layout``'s split-n), in graphs too.
``GEMM_LADDER_MEASURE=0`` keeps the pack's or the policy's choice; strict mode times ours only.

Loaded modules stay loaded for the life of the process. A call whose shapes, strides, dtypes and
GPUs are those of an earlier call that took the plain path (no copies; A and B contiguous or
transposed views read as they lie, as a training step's dX and dW calls pass them; a bias at
most) skips the checks and the lookup: the strides fix every layout, so it checks only that its
tensors are 16-byte aligned, want no grad and that ``out`` shares no memory with A, B or the
bias, and launches as that call did (a ~20 us kernel would otherwise wait on the host;
``benchmarks/launch_cost.py`` and ``benchmarks/host_check.py`` measure it). Where torch's
matmul computes the shape (measured faster at first use, or the fallback), such a call without
``out`` is ``F.linear`` on the caller's own tensors: the key lookup over calling torch directly.
``explain=True`` prints the choice to stderr; ``logging.getLogger("gemm_ladder.matmul")`` at INFO
logs every new choice.

Inputs: fp16 or bf16, contiguous, row-major, on one CUDA GPU; what TMA cannot describe (N or K
not a multiple of 8, a view that does not start on a 16-byte boundary) takes a correct, slower
path through padded copies (``tma_layout.LAYOUT_RULES``) and says so. A 2-d A or B may also be
the transposed view of a contiguous tensor (``X.t()`` of an X [K, M], ``W.t()`` of a W [K, N]):
an MN-major operand (the spec's ``a_major="M"`` / ``b_major="N"``), read as it lies, without a
copy, by modules built for it (v9; the backward GEMMs of ``torch.ops.gemm_ladder.mm`` pass such
views); where M, N or K is not a multiple of 8 it is copied K-major first. B is always the
[N, K] of D = A . B^T: ``matmul(x, W.t())`` computes ``x . W``. Other dtypes, devices and
layouts raise ``ModuleInputError`` with the fix, and so do what would silently mislead: an
``out`` that overlaps A or B (the kernel would overwrite what it reads), and a tensor that
requires grad while grad mode is on (there is no backward here: ``torch.ops.gemm_ladder.mm`` has
one). Empty shapes give empty (or zero) results without a launch, as cuBLAS does.

A bias (``bias=``: 1-d, N values, A's dtype and GPU, contiguous) is the operand spec's per-column
bias (``gemm_ladder.core.spec``): the kernel adds it to the fp32 accumulators before rounding. Its
modules are separate (a pack serves it from ``pack build --epilogue bias``; the policy picks a
rung that builds it: v9); where none serves, torch's ``addmm`` computes it, as for a missing shape.
An activation (``activation=``: ``relu``, ``gelu_tanh``, ``gelu_erf``, ``silu``, or None) is the
spec's ``act``: the kernel applies it after the bias, in fp32, before rounding (modules from
``pack build --epilogue bias_gelu_tanh``, or ``gelu_tanh`` without a bias); where none serves,
torch computes ``F.linear`` and then the activation (``spec.torch_activation``), with the warning.
A scale ``alpha`` (a Python float; the spec's ``alpha``, a runtime parameter of one module for
every value other than 1) multiplies the product before the bias; a residual (``residual=``: C of
D's shape and dtype, contiguous, apart from A, B and the bias, or ``out`` itself) is added times
``beta`` after the activation, all in fp32 before rounding: ``D = act(alpha A.B^T + bias) + beta C``
(v9 reads C's chunk by TMA into the staging buffer it then stores D from, which makes ``out=C``
safe: ``sm90a.epilogue.ResidualRead``). ``out_dtype=torch.float32`` makes D float32 (the spec's
``d``; a bias and a residual then go to the kernel in float32). Where no module serves, torch
computes the same formula (``TorchMatmul``), with the warning. Repeated calls with these take the
fast path below too (``_fast_epilogue``): the key adds the activation, whether alpha is 1, the
residual's layout and D's dtype (alpha's and beta's values pass through to the module); the
address checks are made again on every call (C may be ``out`` itself, or apart from it, never
partly over it; neither touches A, B or the bias). Their first use times torch's unfused path for
the same epilogue against our modules for its spec. ``swiglu`` remembers its calls the same way.

Runtime-only: with packs, this module needs the TVM runtime and torch, nothing of the compiler.
It launches on torch's current stream, so CUDA-graph capture works once a shape has run once
(the first call of a shape loads its module: run it before capturing).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..core import device
from ..core.config import DTYPES, IndexRangeError, max_m_of
from ..core.spec import ACTIVATIONS, GemmSpec, spec_for, torch_activation
from . import first_use, native
from .kernel_pack import MIN_STATIC_M, KernelPack, packs_from_env
from .runtime import ModuleInputError, load, outside_graph_pools, scalar_arg
from .tma_layout import Fixes, Layout, layout_fixes

logger = logging.getLogger("gemm_ladder.matmul")


class NoKernelError(RuntimeError):
    """No pack serves the shape and nothing can be built here; the message says how to get one."""


@dataclass
class Route:
    """How one (M, N, K, dtype, arch) is computed: the module, the M it was built for (None: any
    M), where it came from, and the lines ``explain`` prints."""

    module: object
    module_M: int | None
    source: str
    rung: str
    knobs: dict
    lines: list = field(default_factory=list)
    calls: int = 0
    launchers: dict = field(default_factory=dict)  # GPU index -> the module's unchecked launch
    # the kernels to time at the first call of the shape (first_use): label -> (identity, make its
    # Route); emptied once measured or remembered
    candidates: dict = field(default_factory=dict)

    def run(self, a, b, d, operands: dict | None = None) -> None:
        """Launch on tensors of the kernel's shape that the front door checked (``operands``: the
        spec's epilogue operands by name, in its order): the module checks them once per GPU
        (``GemmModule.launcher``), then launches with no further checks."""
        idx = a.device.index
        operands = operands or {}
        launch = self.launchers.get(idx)
        if launch is None:
            launch = self.launchers[idx] = launcher_of(self.module, a, b, d, **operands)
        launch(a, b, d, *operands.values())

    def adopt(self, eager: "Route", graphs: "Route", note: str) -> None:
        """Become the measured winners, ``eager`` for eager calls and ``graphs`` inside CUDA-graph
        capture (:class:`ByCapture` where they differ), keeping this object (the one the route
        table and explain hold); their rung, knobs and lines are the eager one's. ``graphs`` may be
        this object itself (its own module won in graphs, another one eagerly): what it holds is
        read before it is overwritten."""
        graphs_module, graphs_kernel = graphs.module, graphs.lines[0].removeprefix('kernel: ')
        self.module, self.module_M, self.source = eager.module, eager.module_M, eager.source
        self.rung, self.knobs, self.lines = eager.rung, eager.knobs, list(eager.lines)
        self.launchers = dict(eager.launchers)
        if graphs is not eager:
            self.module, self.launchers = ByCapture(eager.module, graphs_module), {}
            self.lines.append(f"{CAPTURE_LINE} {graphs_kernel} (faster as a kernel alone, measured at first use)")
        self.candidates = {}
        self.lines.append(note)

    def plain(self) -> "Route":
        """This route with its eager module alone (a tiny problem's, not torch's under capture)."""
        if not isinstance(self.module, ByCapture):
            return self
        lines = [line for line in self.lines if not line.startswith(CAPTURE_LINE)]
        return Route(self.module.eager, self.module_M, self.source, self.rung, self.knobs, lines)

    def as_dict(self) -> dict:
        return {"rung": self.rung, "knobs": self.knobs, "source": self.source, "module_M": self.module_M,
                "module": str(getattr(self.module, "path", "")), "explain": list(self.lines)}


_LOCK = threading.RLock()
_ROUTES: dict = {}
# calls already checked once, by everything a later call must share for the same answer: the
# shapes, dtypes and GPUs of A, B and out. A hit needs only contiguity and alignment checked again
# (see _fast): for kernels of ~20 us the host's checks would otherwise cost more than the kernel.
_FAST: dict = {}
_LOADED: dict = {}
_ARCH: dict = {}
_STATE: dict = {"packs": None, "extra": [], "why_no_build": ...}


def use_pack(folder) -> KernelPack:
    """Look in the kernel pack ``folder`` first from now on (before ``$GEMM_LADDER_PACK``'s)."""
    pack = KernelPack(folder)
    with _LOCK:
        _STATE["extra"].insert(0, pack)
        _ROUTES.clear()
        _FAST.clear()
        _forget_native()
    return pack


def reset() -> None:
    """Forget every choice, loaded module and pack (the next call looks again)."""
    with _LOCK:
        _ROUTES.clear()
        _FAST.clear()
        _forget_native(detach=True)
        _LOADED.clear()
        _B_COPIES.clear()
        _STATE.update(packs=None, extra=[], why_no_build=...)


def _packs() -> list[KernelPack]:
    if _STATE["packs"] is None:
        _STATE["packs"] = [KernelPack(p) for p in packs_from_env()]
    return _STATE["extra"] + _STATE["packs"]


def packs() -> list[KernelPack]:
    """The kernel packs the front doors look in, in order: :func:`use_pack`'s (newest first), then
    ``$GEMM_LADDER_PACK``'s (read once, until :func:`reset`)."""
    return _packs()


def why_no_build() -> str | None:
    """Why nothing can be built here (no TVM compiler, ``GEMM_LADDER_BUILD=0``, ...), or None."""
    return _why_no_build()


def cached_module(job) -> tuple[Path, str]:
    """The module of ``job`` (a ``BuildJob``, or ``(rung, (M, N, K), knobs)``) from the module
    cache (``"cache"``), or built into it now (``"built"``): TVM's compiler must be here."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from ..compile import module_cache  # pylint: disable=import-outside-toplevel

    return module_cache.get_or_build(job)


def _why_no_build() -> str | None:
    if _STATE["why_no_build"] is ...:
        # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
        from ..compile.module_cache import why_cannot_build  # pylint: disable=import-outside-toplevel

        _STATE["why_no_build"] = why_cannot_build()
    return _STATE["why_no_build"]


def _load(path):
    key = str(Path(path).resolve())
    if key not in _LOADED:
        _LOADED[key] = load(path)
    return _LOADED[key]


# -- checks ---------------------------------------------------------------------------------------
def check_shapes(A, B, out, bias=None, d_dtype=None):
    """(M, N, K, D's shape) of a call whose arguments fit (``bias``: None, or N values in A's
    dtype; ``d_dtype``: D's dtype, default A's), all but their device, batch dims of A flattened
    into M; else ModuleInputError with the fix. These are :func:`matmul`'s checks that need no GPU
    (the op's tests run them on the CPU)."""
    import torch  # pylint: disable=import-outside-toplevel

    for name, t, what in (("A", A, "[..., K]"), ("B", B, "[N, K]"), ("out", out, "[..., N] or None")):
        if not isinstance(t, torch.Tensor) and (t is not None or name != "out"):
            raise ModuleInputError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if A.dtype != B.dtype:
        raise ModuleInputError(f"A is {A.dtype} and B is {B.dtype}: pass both in one dtype (B.to({A.dtype}))")
    if _dtype_name(A.dtype) not in DTYPES:
        raise ModuleInputError(f"A has dtype {A.dtype}; gemm_ladder.matmul takes torch.float16 or torch.bfloat16 "
                               "(use A.to(torch.float16) and B.to(torch.float16))")
    if B.dim() != 2 or A.dim() < 1:
        raise ModuleInputError(f"B must be [N, K] and A [..., K]; got A {tuple(A.shape)} and B {tuple(B.shape)}")
    N, K = B.shape
    if A.shape[-1] != K:
        hint = ""
        if A.shape[-1] == N:
            hint = f"; B looks like [K, N], but {B_LAYOUT} (for a [K, N] matrix W, pass W.t(): no copy)"
        raise ModuleInputError(f"A is {tuple(A.shape)} and B {tuple(B.shape)}: A's last dim must be B's K={K} "
                               f"(D = A . B^T){hint}")
    shape = (*A.shape[:-1], N)
    if out is not None:
        if out.dtype != (d_dtype or A.dtype):
            raise ModuleInputError(f"out has dtype {out.dtype}; it must be D's {d_dtype or A.dtype}"
                                   + ("" if d_dtype else " (out_dtype=torch.float32 for a float32 D)"))
        if tuple(out.shape) != shape:
            raise ModuleInputError(f"out has shape {tuple(out.shape)}; D = A . B^T is {shape}")
    if bias is not None:
        check_bias(bias, A.dtype, N)
    for name, t in (("A", A), ("B", B), ("out", out), ("bias", bias)):
        # A and B may also be the transposed view of a contiguous tensor: an MN-major operand
        if t is not None and not t.is_contiguous() and not (name in "AB" and is_transposed(t)):
            nor = " nor the transposed view of a contiguous tensor" if name in "AB" else ""
            raise ModuleInputError(f"{name} is not contiguous (row-major){nor}; pass {name}.contiguous()")
    _refuse_grad_and_overlap(A, B, out, bias)
    M = int(torch.Size(A.shape[:-1]).numel())
    return M, N, K, shape


def check_activation(activation, who: str = "gemm_ladder.matmul") -> str:
    """The spec's ``act`` of an ``activation=`` argument (None: ``none``); else ModuleInputError
    naming the activations there are."""
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        hint = " (F.gelu's default is gelu_erf; approximate='tanh' is gelu_tanh)" if activation == "gelu" else ""
        raise ModuleInputError(f"{who}: activation={activation!r}; use one of {', '.join(ACTIVATIONS)}, or None{hint}")
    return activation


def check_bias(bias, dtype, N: int, who: str = "gemm_ladder.matmul") -> None:
    """A per-column bias: a tensor of N values in A's dtype (the op's checks and the front door's)."""
    import torch  # pylint: disable=import-outside-toplevel

    if not isinstance(bias, torch.Tensor):
        raise ModuleInputError(f"{who}: bias must be a torch.Tensor of N={N} values or None, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != N:
        raise ModuleInputError(f"{who}: bias has shape {tuple(bias.shape)}; it is one value per column of D: ({N},) "
                               "(a bias of another shape: add it after the call)")
    if bias.dtype != dtype:
        raise ModuleInputError(f"{who}: bias has dtype {bias.dtype}; it must be A's {dtype} (bias.to({dtype}))")


# what B is, for a caller whose B has the wrong shape (thinking of x @ W where lin(x) was meant)
B_LAYOUT = ("B is read as [N, K] (D = A . B^T), like nn.Linear.weight: for lin(x) pass lin.weight itself, "
            "not lin.weight.t()")


def is_transposed(B) -> bool:
    """Whether the 2-d ``B`` (or A) is laid out as ``T.t()`` of a contiguous ``T`` (and is not
    itself contiguous): an MN-major operand, whose memory ``T`` the kernel reads as it is."""
    return B.dim() == 2 and not B.is_contiguous() and B.t().is_contiguous()


def operand_majors(A, B) -> tuple[str, str]:
    """The spec's ``a_major`` and ``b_major`` of a call's A [M, K] and B [N, K]: "K" for a
    contiguous tensor, "M" (or "N") for the transposed view of a contiguous [K, M] (or [K, N])
    one: ``x.t()``, ``W.t()`` of a [K, N] weight, what a backward pass hands over (dX = dY . W
    reads W [N, K] as an MN-major B; dW = dY^T . X reads dY and X as MN-major A and B)."""
    return ("M" if A.dim() == 2 and is_transposed(A) else "K"), ("N" if is_transposed(B) else "K")


def _overlaps(t, u) -> bool:
    """Whether contiguous ``t`` and ``u`` share a byte: their elements fill [data_ptr, data_ptr +
    nbytes), so the byte ranges are exact (stricter than torch's same-storage test, which misses
    two storages over one allocation). Meta tensors have no bytes."""
    if t.device != u.device or t.device.type == "meta":
        return False
    t0, u0 = t.data_ptr(), u.data_ptr()
    return t0 < u0 + u.nbytes and u0 < t0 + t.nbytes


def _refuse_grad_and_overlap(A, B, out, bias=None) -> None:
    """What would silently mislead in tensors that fit otherwise (contiguous: the byte ranges are
    exact): gradients that would stop here, and an ``out`` the kernel would write while it still
    reads A or B."""
    import torch  # pylint: disable=import-outside-toplevel

    wants_grad = [name for name, t in (("A", A), ("B", B), ("out", out), ("bias", bias))
                  if t is not None and t.requires_grad]
    if wants_grad and torch.is_grad_enabled():
        raise ModuleInputError(
            f"{' and '.join(wants_grad)} require{'s' if len(wants_grad) == 1 else ''} grad: gemm_ladder.matmul "
            "has no backward (its result would silently stop the gradient). Call it under torch.no_grad() or "
            "torch.inference_mode(), pass .detach()ed tensors, or use torch.ops.gemm_ladder.mm "
            "(import gemm_ladder.serve.ops), which has one")
    for name, t in (("A", A), ("B", B), ("bias", bias)):
        if out is not None and t is not None and _overlaps(out, t):
            raise ModuleInputError(f"out overlaps {name} in memory: the kernel would overwrite {name} while it "
                                   f"reads it. Pass an out that shares no memory with A or B (nor the bias), or no out")


def check_out_dtype(out_dtype, A):
    """D's dtype for ``out_dtype``: None for A's (None or A's dtype), torch.float32; else ModuleInputError."""
    import torch  # pylint: disable=import-outside-toplevel

    if out_dtype is None or out_dtype == getattr(A, "dtype", None):
        return None
    if out_dtype != torch.float32:
        raise ModuleInputError(f"gemm_ladder.matmul: out_dtype={out_dtype}; use None (A's dtype) or torch.float32")
    return torch.float32


def check_residual(residual, shape, dtype, A, B, out, bias=None, who: str = "gemm_ladder.matmul") -> None:
    """A residual C: a contiguous tensor of D's ``shape`` and ``dtype``, on A's device, sharing no
    memory with A, B or the bias; it may be ``out`` itself (the same tensor memory: an in-place
    residual add, which the kernel makes safe) but not overlap ``out`` otherwise."""
    import torch  # pylint: disable=import-outside-toplevel

    if not isinstance(residual, torch.Tensor):
        raise ModuleInputError(f"{who}: residual must be a torch.Tensor of D's shape {shape} or None, "
                               f"got {type(residual).__name__}")
    if tuple(residual.shape) != tuple(shape):
        raise ModuleInputError(f"{who}: residual has shape {tuple(residual.shape)}; it is added to D, of shape "
                               f"{tuple(shape)} (broadcast it first: residual.expand({tuple(shape)}).contiguous())")
    if residual.dtype != dtype:
        raise ModuleInputError(f"{who}: residual has dtype {residual.dtype}; it must be D's {dtype} "
                               f"(residual.to({dtype}))")
    if not residual.is_contiguous():
        raise ModuleInputError(f"{who}: residual is not contiguous (row-major); pass residual.contiguous()")
    if residual.requires_grad and torch.is_grad_enabled():
        raise ModuleInputError(f"{who}: residual requires grad, and gemm_ladder.matmul has no backward: call it under "
                               "torch.no_grad(), or use torch.ops.gemm_ladder.mm_epilogue (import gemm_ladder.serve.ops)")
    for name, t in (("A", A), ("B", B), ("bias", bias)):
        if t is not None and _overlaps(residual, t):
            raise ModuleInputError(f"{who}: residual overlaps {name} in memory: D would be written where {name} is "
                                   f"still read. Pass a residual apart from A, B and the bias")
    if out is not None and _overlaps(residual, out) and not (residual.data_ptr() == out.data_ptr()
                                                              and residual.shape == out.shape):
        raise ModuleInputError(f"{who}: residual partly overlaps out: pass out=residual itself (in place) or an out "
                               "apart from it")


def _check_out(out, shape, dtype, A, B, bias, residual) -> None:
    """An ``out`` for a D of another dtype than A's (fp32 output): shape, dtype, layout, no overlap."""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ModuleInputError(f"gemm_ladder.matmul: out is {tuple(out.shape)} {out.dtype}; D is {tuple(shape)} "
                               f"{dtype}, contiguous")
    for name, t in (("A", A), ("B", B), ("bias", bias)):
        if t is not None and _overlaps(out, t):
            raise ModuleInputError(f"gemm_ladder.matmul: out overlaps {name} in memory; pass an out apart from it")
    if residual is not None and _overlaps(out, residual) and out.data_ptr() != residual.data_ptr():
        raise ModuleInputError("gemm_ladder.matmul: residual partly overlaps out: pass out=residual or apart")


def _check(A, B, out, bias=None, residual=None, d_dtype=None):
    """(M, N, K, A as [M, K], out as [M, N] or None, D's shape); raises ModuleInputError."""
    M, N, K, shape = check_shapes(A, B, out, bias, d_dtype)
    if residual is not None:
        check_residual(residual, shape, d_dtype or A.dtype, A, B, out, bias)
    for name, t in (("A", A), ("B", B), ("out", out), ("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ModuleInputError(f"{name} is on {t.device}; move it to the GPU ({name}.cuda())")
        if t.device != A.device:
            raise ModuleInputError(f"{name} is on {t.device} and A on {A.device}; put all on one GPU")
    return M, N, K, A.reshape(M, K), (out.view(M, N) if out is not None else None), shape


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _arch(index: int) -> str:
    if index not in _ARCH:
        _ARCH[index] = device.arch_of(index)
    return _ARCH[index]


# -- choosing -------------------------------------------------------------------------------------
def _route(M: int, N: int, K: int, dtype: str, index: int, strict: bool = False,
           spec: GemmSpec | None = None) -> tuple[Route, bool]:
    """The route of a shape and operand spec (default: ``dtype`` in and out, no epilogue), and
    whether it was known already; ``strict``: no torch fallback."""
    arch = _arch(index)
    spec = spec or GemmSpec.default(dtype)
    key = (M, N, K, dtype, arch, strict, spec)
    route = _ROUTES.get(key)
    if route is not None:
        return route, True
    with _LOCK:
        route = _ROUTES.get(key)
        if route is None:
            route = _resolve(M, N, K, dtype, arch, index, strict, spec)
            _ROUTES[key] = route
            logger.info("gemm_ladder.matmul %dx%dx%d %s %s (%s):\n%s", M, N, K, dtype, spec.epilogue, arch,
                        "\n".join(route.lines))
    return route, False


def _from_pack(found, note: str | None = None) -> Route:
    mod = _load(found.pack.check_entry(found.entry))
    e = found.entry
    choice = e.get("choice") or {}
    by = {"rule": f"rule {choice.get('rule')!r}", "db": "the tuning database"}.get(choice.get("source"), "not recorded")
    lines = [f"kernel: {e['rung']} ({_knob_text(e['knobs'])})",
             f"chosen by: {by}, when the pack was built: {choice.get('why', 'not recorded')}",
             f"source: {found.describe()}"]
    if choice.get("database"):
        lines.append(f"when the pack was built, {choice['database']}")
    if note:
        lines.append(note)
    return Route(mod, None if e["dynamic_m"] else e["shape"][0], "kernel pack", e["rung"], dict(e["knobs"]), lines)


def _knob_text(knobs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()) if k not in ("dtype", "arch")) or "its defaults"


def plan_job(p, rules=None):
    """The policy's choice for problem ``p`` (``plan.choose``, with ``rules`` if given) and the
    build job the front door makes of it: a runtime M where the rung takes one."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    # pylint: disable=import-outside-toplevel
    from ..compile.batch import BuildJob
    from ..rungs import rung_module
    from . import plan

    choice = plan.choose(p, rules=rules)  # its knobs carry p.spec (a rung that does not build it is passed over)
    knobs = dict(choice.knobs)
    if "dynamic_m" in rung_module(choice.rung, p.arch).KNOBS and \
            plan._validate(choice.rung, p, {**knobs, "dynamic_m": True}) is None:  # pylint: disable=protected-access
        knobs["dynamic_m"] = True
    shape = (p.M if knobs.get("dynamic_m") else max(p.M, MIN_STATIC_M), p.N, p.K)
    return choice, BuildJob(choice.rung, shape, knobs)


def _build_route(M: int, N: int, K: int, dtype: str, arch: str, index: int, spec: GemmSpec) -> Route:
    """The policy's choice, from the module cache or built into it (TVM's compiler is here)."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from . import plan  # pylint: disable=import-outside-toplevel

    choice, job = plan_job(plan.Problem(M, N, K, dtype, arch, device.sm_count(index), spec))
    dynamic, knobs = "dynamic_m" in job.knobs, job.knobs
    path, how = cached_module(job)
    source = {"cache": "module cache", "built": "fresh build"}[how]
    lines = choice.text().splitlines()
    lines[0] = f"kernel: {lines[0]}" + (" [M at run time]" if dynamic else "")
    lines = [lines[0]] + [line.strip() for line in lines[1:]]
    lines.append(f"source: {source} {path}" + (" (built now, on first use)" if how == "built" else ""))
    route = Route(_load(path), None if dynamic else job.shape[0], source, choice.rung, knobs, lines)
    route.candidates = {choice.rung: (Path(path).name, lambda: route)}  # torch's joins (_offer_torch)
    return route


def _far(e: dict, fit: str, M: int) -> str | None:
    """Why a pack's module would serve this M far from what it was made for (None: it would not):
    a runtime-M module at an M more than :data:`FAR_FACTOR` times outside the range its knobs were
    chosen for (a split-K module chosen for M = 2 ran M = 4096 at 0.04x cuBLAS), or a module of
    one M that more than doubles the rows it computes."""
    if fit == "any-m":
        lo, hi = e["m_range"]
        if M > FAR_FACTOR * hi or M * FAR_FACTOR < lo:
            return f"M={M} is far outside M {lo}..{hi}, the range its knobs were chosen for"
    if fit == "pad-m" and e["shape"][0] > 2 * M:
        return f"it is built for M={e['shape'][0]}: A would be copied into {e['shape'][0]} rows for M={M}"
    return None


def _resolve(M: int, N: int, K: int, dtype: str, arch: str, index: int, strict: bool, spec: GemmSpec) -> Route:
    route = _resolve_ours(M, N, K, dtype, arch, index, strict, spec)
    if not strict and is_tiny(M, N, K) and not isinstance(route.module, TorchMatmul):
        return _captured_by_torch(route, M, N, K, spec.act)
    return route


def _resolve_ours(M: int, N: int, K: int, dtype: str, arch: str, index: int, strict: bool, spec: GemmSpec) -> Route:
    found, beyond = None, ""
    for pack in _packs():
        f = pack.find(M, N, K, dtype, arch, spec)
        if f is not None and f.entry["dynamic_m"] and M > (most := max_m_of(N, K, f.entry["knobs"])):
            beyond = f"; {f.entry['file']} reads M as a 32-bit index and serves M <= {most}"
            continue
        if f is not None and (found is None or FIT_RANK[f.fit] < FIT_RANK[found.fit]):
            found = f
    if found is not None and found.fit in ("exact", "tuned-range"):
        return _with_candidates(_from_pack(found), found, M, N, K, dtype, arch, strict, spec)
    why = _why_no_build()
    if why is None:
        try:
            return _offer_torch(_build_route(M, N, K, dtype, arch, index, spec), M, N, K, strict, spec.act)
        except IndexRangeError as err:  # past what any kernel of ours indexes: torch's 64-bit indices take it
            if strict:
                raise
            return _torch_route(M, N, K, dtype, str(err), "split the call into parts that fit", spec.act)
    epilogue = "" if spec.epilogue == "none" else f" --epilogue {spec.epilogue}"
    # --weights: the weight's whole M range (a server's prefill and decode), not only this M
    how = (f"on a box with TVM's compiler: python -m gemm_ladder pack build --weights {N}x{K} --dtypes {dtype}"
           f"{epilogue} --out PACK, then carry PACK here and set GEMM_LADDER_PACK=PACK")
    what = f"{dtype}" + ("" if spec.epilogue == "none" else f" with a {spec.epilogue}") + \
        (f" (A {spec.a_major}-major, B {spec.b_major}-major)" if _mn_major(spec) else "")
    if found is not None:
        far = _far(found.entry, found.fit, M)
        note = f"note: the pack has nothing closer and nothing can be built here ({why})"
        if far is None or strict:
            route = _from_pack(found, note)
            if found.fit != "pad-m":
                _with_candidates(route, found, M, N, K, dtype, arch, strict, spec)
            if far is not None:
                _warn(f"gemm_ladder.matmul M={M} N={N} K={K} {what}: {found.entry['file']} serves it although {far} "
                      f"(strict mode); for a kernel made for this M, {how}")
            return route
        return _torch_route(M, N, K, what, f"the nearest kernel pack module, {found.entry['file']}, would serve it "
                                               f"badly: {far}; and nothing can be built here ({why})", how, spec.act)
    where = ", ".join(str(p.folder) for p in _packs()) or "none ($GEMM_LADDER_PACK is not set)"
    missing = f"no kernel pack serves it (packs: {where}{beyond}) and nothing can be built here ({why})"
    if strict:
        raise NoKernelError(f"no kernel for M={M}, N={N}, K={K}, {what} on {arch}: {missing}. {how[0].upper()}{how[1:]}")
    return _torch_route(M, N, K, what, missing, how, spec.act)


def _with_candidates(route: Route, found, M: int, N: int, K: int, dtype: str, arch: str, strict: bool,
                     spec: GemmSpec) -> Route:
    """The route of pack module ``found``, with the packs' other modules that serve this M as they
    are (``KernelPack.serving``, nearest first, at most first_use.MAX_CANDIDATES in all) and
    torch's (not strict) as its candidates for the first call's timing."""
    serving = [f for pack in _packs() for f in pack.serving(M, N, K, dtype, arch, spec)]
    others = {f.entry["so_sha256"]: f for f in serving if f.entry["so_sha256"] != found.entry["so_sha256"]}
    route.candidates = {found.entry["file"]: (found.entry["so_sha256"], lambda: route)}
    for sha, f in list(others.items())[:first_use.MAX_CANDIDATES - 1]:
        route.candidates[f.entry["file"]] = (sha, lambda f=f: _from_pack(f))
    return _offer_torch(route, M, N, K, strict, spec.act)


def _offer_torch(route: Route, M: int, N: int, K: int, strict: bool, act: str) -> Route:
    """Add torch's own matmul to the route's candidates (not in strict mode): where it measures
    faster at first use than every kernel of ours, it computes the shape (first_use)."""
    if not strict:
        lines = ["kernel: torch.matmul (cuBLAS)", f"why: at first use on this GPU it ran {M}x{N}x{K} faster than "
                 "every kernel of ours that serves it (gemm_ladder is never slower than the library it replaces)",
                 f"source: torch ({STRICT_ENV}=1 or strict=True keeps ours)"]
        route.candidates[first_use.TORCH] = (first_use.TORCH,
                                             lambda: Route(TorchMatmul(act), None, "torch, measured faster", "torch", {}, lines))
    return route


def _settle(route: Route, a, b, M: int, N: int, K: int, fixes: Fixes, bias, index: int,
            epilogue: "Epilogue | None" = None, spec: GemmSpec | None = None) -> None:
    """Time the route's candidates on the call's A and B and copies of them (first_use.input_sets),
    into scratch outputs, as queued calls and as kernels replayed from CUDA graphs, each the whole
    way a call takes (the padded path's copies included: :func:`launch_route`), and make the
    route the winners (``Route.adopt``), or take the winners remembered for this GPU, shape,
    operand spec and candidates (first_use). ``epilogue``: the call's operands past the bias
    (alpha, C, beta, a float32 D): every candidate computes the whole epilogue, torch's as its
    repeated call runs it (:class:`TorchMatmul`: cuBLASLt's fused bias+ReLU/GELU where it applies, else
    F.linear, then the activation, then + beta C), and
    each input set has its own copy of C (a residual that stayed in L2 would flatter the kernels)."""
    import torch  # pylint: disable=import-outside-toplevel

    epilogue = epilogue or Epilogue()
    alpha, C2, beta, d_dtype = epilogue
    plain = alpha is None and C2 is None and d_dtype is None
    act = spec.act if spec is not None else "none"
    with _LOCK:
        cands = route.candidates
        if not cands or not first_use.can_measure(a):
            return
        if len(cands) == 1:
            route.candidates = {}
            return
        ids = {label: ident for label, (ident, _) in cands.items()}
        gpu = device.name_of(index)
        key = first_use.key_of(gpu, M, N, K, ids, None if fast_spec(spec) else spec.text())
        known = first_use.remembered(key, ids)
        made = {label: cands[label][1]() for label in (set(known) if known else cands)}
        mine = next((label for label, r in made.items() if r is route), None)  # the route's own module
        routes = {label: (r.plain() if r is route else r) for label, r in made.items()}
        if known is not None:
            route.adopt(routes[known[0]], routes[known[1]], f"chosen at an earlier first use on {gpu}, among "
                                                            f"{len(cands)} candidates (remembered in {first_use.choices_path()})")
            return

        def measure():  # on a helper thread: its scratch tensors and graphs stay out of any CUDA graph's pool
            d = torch.empty((M, N), dtype=d_dtype or a.dtype, device=a.device)
            sets = first_use.input_sets(a, b, d, _l2_bytes(index), same_b=fixes.copies_weight)
            # a residual of each set's own (the caller's C is only read: D goes to the scratch d)
            c_of = {} if C2 is None else {s[2].data_ptr(): (C2 if i == 0 else C2.clone()) for i, s in enumerate(sets)}
            whole = bool(fixes.names) or (bias is not None and bias.data_ptr() % 16 != 0) or \
                (C2 is not None and C2.data_ptr() % 16 != 0)  # copies on the way

            def extras_of(z):  # the spec's operands past D, in its order: bias, alpha, C, beta
                head = (() if bias is None else (bias,)) + (() if alpha is None else (alpha,))
                return head if C2 is None else head + (c_of[z.data_ptr()], beta)

            def call_of(r):
                if isinstance(r.module, TorchMatmul) and r.module.act == "none" and plain:
                    # torch's route as its repeated call runs it (the fast path's torch_linear, no
                    # checks or copies): timed through launch_route, its host side made torch look
                    # 2-3x slower as queued calls than it is, and first use kept a slower kernel of ours
                    extras = () if bias is None else (bias,)
                    call = lambda x, y, z: torch_linear(x, y, z, *extras)  # noqa: E731
                elif isinstance(r.module, TorchMatmul):
                    # torch's path for the epilogue, as the fast path's repeated call runs it (TorchMatmul
                    # itself: cuBLASLt's fused bias+activation, or F.linear / addmm, the activation, + beta C)
                    tm = r.module
                    call = lambda x, y, z: tm(x, y, z, bias, 1.0 if alpha is None else alpha,  # noqa: E731
                                              c_of.get(z.data_ptr()), beta)
                elif whole:  # the whole way a call takes
                    call = lambda x, y, z: launch_route(r, x, y, z, M, N, K, fixes, bias, alpha,  # noqa: E731
                                                        c_of.get(z.data_ptr()), beta, d_dtype, act)
                else:
                    # checked once per GPU; an MN-major module takes the memory under the views
                    names = [n for n, v in (("bias", bias), ("alpha", alpha), ("C", C2)) if v is not None]
                    operands = dict(zip(names, extras_of(sets[0][2])))
                    if C2 is not None:
                        operands["beta"] = beta
                    r.run(*stored_operands(r.module, a, b), sets[0][2], operands)
                    fn = r.launchers[a.device.index]
                    ta, tb = takes_stored(r.module)
                    if ta or tb:
                        call = lambda x, y, z: fn(x.t() if ta else x, y.t() if tb else y,  # noqa: E731
                                                  z, *extras_of(z))
                    else:
                        call = lambda x, y, z: fn(x, y, z, *extras_of(z))  # noqa: E731
                call(*sets[0])
                return call

            calls = {}
            for label, r in routes.items():
                try:
                    calls[label] = call_of(r)
                except (ValueError, RuntimeError):  # a module that refuses this M is no candidate
                    if label == mine:
                        raise
            queued = dict(calls)
            if plain and bias is None and fixes.names and set(fixes.names) <= PADDED_FAST:
                # as queued calls, a repeated call's own launch (the fast path's PaddedLaunch: scratch
                # and the weight's copy kept), whose host side is a fraction of launch_route's; in
                # graphs the checked path's (a padded weight copied on every replay)
                for label, r in routes.items():
                    if label in calls and not isinstance(r.module, TorchMatmul):
                        queued[label] = padded_launch(r, M, N, K, fixes)
                        queued[label](*sets[0])
            times = first_use.time_launches(queued, sets)
            return times, first_use.time_graphs(calls, sets, times), whole

        times, kernel_times, copies = outside_graph_pools(measure, index) if a.is_cuda else measure()
        # the eager call pays the copies' host side, which the timing undercounted (first_use.COPIES_EDGE)
        eager = first_use.pick(times, copies, kernels=kernel_times)  # a near tie as calls: the kernels decide
        graphs = first_use.pick(kernel_times or times, graphs=bool(kernel_times))
        first_use.remember(key, ids[eager], ids[graphs])
        route.adopt(routes[eager], routes[graphs], first_use.measured_note(gpu, times, kernel_times, eager, graphs))


def _l2_bytes(index: int) -> int:
    if index not in _L2:
        import torch  # pylint: disable=import-outside-toplevel

        _L2[index] = torch.cuda.get_device_properties(index).L2_cache_size
    return _L2[index]


_L2: dict = {}


class KernelFallbackWarning(UserWarning):
    """The front door computes a shape with torch's own matmul, or with a kernel made for another M."""


# the activations cuBLASLt fuses after a bias (torch._addmm_activation on a GPU: ReLU, and GELU by tanh's formula)
LT_ACTIVATIONS = ("relu", "gelu_tanh")


class TorchMatmul:
    """torch's own ``D = A . B^T`` (+ ``bias``: ``addmm``; cuBLAS), then the activation ``act``
    (``spec.torch_activation``: torch's best unfused path, F.linear and then the activation; on a GPU
    a bias with ReLU or tanh-GELU and no residual goes through cuBLASLt's fused epilogue,
    ``torch._addmm_activation``) in a module's place: the front door's fallback where no kernel of
    ours serves a shape (or its epilogue), so a model with one such layer still runs, as fast as
    torch, and the candidate first use times ours against."""

    path = "torch.matmul (cuBLAS)"

    def __init__(self, act: str = "none"):
        self.act = act

    def __call__(self, a, b, out, bias=None, alpha=1.0, C=None, beta=1.0):
        import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's, imported on use)

        if out.dtype != a.dtype:  # a float32 D: the product and the epilogue in float32
            a, b = a.float(), b.float()
            bias = bias.float() if bias is not None else None
        if C is None and bias is not None and self.act in LT_ACTIVATIONS and a.is_cuda and out.dtype == a.dtype:
            # cuBLASLt's own fused epilogue (bias, then ReLU or GELU by tanh's formula): one kernel, the
            # library a fused call of ours replaces (torch falls back to addmm and the activation where
            # cuBLASLt cannot take the operands)
            torch._addmm_activation(bias, a, b.t(), alpha=alpha, use_gelu=self.act == "gelu_tanh",  # pylint: disable=protected-access
                                    out=out)
            return
        if C is None and alpha == 1.0:  # the plain path writes out directly
            if bias is None:  # mm, not matmul: the shortest way to cuBLAS for 2-d operands (a is [M, K] here)
                torch.mm(a, b.t(), out=out)
            else:
                torch.addmm(bias, a, b.t(), out=out)
            if self.act != "none":
                out.copy_(torch_activation(out, self.act))
            return
        # act(alpha A.B^T + bias) + beta C: C may be out, so z is made apart and added elementwise
        z = torch.addmm(bias, a, b.t(), alpha=alpha) if bias is not None else torch.mm(a, b.t()).mul_(alpha)
        z = torch_activation(z, self.act)
        if C is None:
            out.copy_(z)
        else:
            torch.add(z, C, alpha=beta, out=out)

    def launcher(self, a, b, out, **operands):
        """The call for tensors like these; with no bias and no activation, torch's ``mm`` itself
        (nothing of ours between a repeated call and cuBLAS but the front door's fast path)."""
        import torch  # pylint: disable=import-outside-toplevel

        # the extras by name (the spec's order skips those it lacks); a float32 D: its own product
        if operands or self.act != "none" or out.dtype != a.dtype:
            names = list(operands)
            return lambda x, y, z, *extras: self(x, y, z, **dict(zip(names, extras)))
        mm = torch.mm
        return lambda x, y, z: mm(x, y.t(), out=z)


def _warn(text: str) -> None:
    warnings.warn(text, KernelFallbackWarning, stacklevel=4)


def _torch_route(M: int, N: int, K: int, dtype: str, why: str, how: str, act: str = "none") -> Route:
    """The fallback (see :class:`TorchMatmul`; ``act``: the activation after it), said once per
    shape and epilogue: a warning, and ``explain``."""
    _warn(f"gemm_ladder.matmul M={M} N={N} K={K} {dtype}: torch's own matmul computes it: {why}. For a kernel "
          f"of ours, {how}. {STRICT_ENV}=1 (or strict=True) makes this an error")
    lines = ["kernel: torch.matmul (cuBLAS), the fallback", f"why: {why}", f"for a kernel of ours: {how}",
             f"source: torch ({STRICT_ENV}=1 or matmul(..., strict=True) raises NoKernelError instead)"]
    return Route(TorchMatmul(act), None, "torch fallback", "torch", {}, lines)


STRICT_ENV = "GEMM_LADDER_STRICT"
CAPTURE_LINE = "under CUDA-graph capture:"  # explain's line for what runs in graphs, where it differs
FAR_FACTOR = 4
# A problem this small takes a few microseconds whoever computes it, and there our kernels lost to
# cuBLAS as kernels (CUDA graphs, L2 spilled): 0.34x at 128x1024x1024, 0.55-0.76x at GPT-2's 768-wide
# layers, while 16x4096x4096 (33 MB) was level and 2x1280x5120 0.98x
# [benchmarks/results/2026-11-25_h100_every_model/every_model_seed0.json]. Below both bounds the
# front door calls torch's matmul inside CUDA-graph capture (ByCapture; strict mode keeps ours).
TINY_FLOPS = 2e9
TINY_BYTES = 8 << 20


def is_tiny(M: int, N: int, K: int) -> bool:
    """Whether ``M x N x K`` is under both bounds above (TINY_FLOPS and TINY_BYTES moved): where
    cuBLAS's kernel measured faster than ours, so graph capture takes torch's (ByCapture; measured at first use where the shape is timed)."""
    return 2.0 * M * N * K < TINY_FLOPS and 2 * (M * K + N * K + M * N) < TINY_BYTES


def launcher_of(module, a, b, out, **operands):
    """``module``'s launch for tensors like these (``module.launcher``, checked once), or a call of
    the module itself (torch's matmul, a stand-in)."""
    maker = getattr(module, "launcher", None)
    if maker is not None:
        return maker(a, b, out, **operands)
    return lambda x, y, z, *extras: module(x, y, out=z, **dict(zip(operands, extras)))


class ByCapture:
    """Two modules of one shape: ``eager`` for an eager call, ``graphs`` inside CUDA-graph capture.

    Eager, a short kernel costs its host path as much as its own time, and ours is the shorter
    (a tiny problem's call ratio 1.2-1.5x against F.linear); replayed from a graph, only the kernel
    counts, and there another may be faster (cuBLAS's at tiny problems: ours 0.34-0.76x). The first
    call of a shape times both ways (``first_use``); for a tiny problem not timed, ``graphs`` is
    torch's. One ``torch.cuda.is_current_stream_capturing()`` a call picks each where it wins."""

    def __init__(self, eager, graphs):
        self.eager, self.graphs = eager, graphs
        self.path = getattr(eager, "path", "")

    def __call__(self, a, b, out, **operands):
        operands = {k: v for k, v in operands.items() if v is not None}
        self.launcher(a, b, out, **operands)(a, b, out, *operands.values())

    def __getattr__(self, name):  # the rest is the eager module's (its manifest, M at run time, ...)
        if name in ("eager", "graphs"):
            raise AttributeError(name)
        return getattr(self.eager, name)

    def launcher(self, a, b, out, **operands):
        import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's, imported on use)

        eager, graphs = self._views(self.eager, a, b, out, operands), self._views(self.graphs, a, b, out, operands)
        capturing = torch.cuda.is_current_stream_capturing
        return lambda x, y, z, *extras: graphs(x, y, z, *extras) if capturing() else eager(x, y, z, *extras)

    @staticmethod
    def _views(module, a, b, out, operands):
        """``module``'s launch on A and B as views: each module of ours of an MN-major spec gets the
        memory under them (:func:`stored_operands`), torch's matmul the views themselves."""
        ta, tb = takes_stored(module)
        fn = launcher_of(module, *stored_operands(module, a, b), out, **operands)
        if not (ta or tb):
            return fn
        return lambda x, y, z, *extras: fn(x.t() if ta else x, y.t() if tb else y, z, *extras)


def _captured_by_torch(route: Route, M: int, N: int, K: int, act: str = "none") -> Route:
    route.module = ByCapture(route.module, TorchMatmul(act))
    route.lines.append(f"{CAPTURE_LINE} torch.matmul (cuBLAS), since {M}x{N}x{K} is under "
                       f"{TINY_FLOPS / 1e9:.0f} GFLOP and {TINY_BYTES >> 20} MiB moved, where cuBLAS's kernel measured "
                       "faster than ours (0.34-0.76x ours) [benchmarks/results/2026-11-25_h100_every_model/"
                       "every_model_seed0.json]; eager calls keep ours, whose host path is the shorter (strict mode: "
                       "ours always)")
    return route


def _mn_major(spec: GemmSpec | None) -> bool:
    """Whether ``spec`` has an MN-major operand."""
    return spec is not None and (spec.a_major != "K" or spec.b_major != "K")


def takes_stored(module) -> tuple[bool, bool]:
    """Whether ``module`` takes A, and B, as the memory under a transposed view (ours, of an
    MN-major spec: the kernel's stored [K, M] / [K, N]) rather than the view itself (torch's
    matmul takes any view; :class:`ByCapture` hands each of its modules its own)."""
    spec = None if isinstance(module, ByCapture) else getattr(module, "spec", None)
    return (spec is not None and spec.a_major != "K"), (spec is not None and spec.b_major != "K")


def stored_operands(module, a, b) -> tuple:
    """``a`` and ``b`` (A [M, K] and B [N, K], MN-major ones as transposed views) as ``module``
    takes them (:func:`takes_stored`)."""
    ta, tb = takes_stored(module)
    return (a.t() if ta else a), (b.t() if tb else b)


def _strict(strict: bool | None) -> bool:
    if strict is not None:
        return bool(strict)
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


FIT_RANK = {"exact": 0, "tuned-range": 1, "any-m": 2, "pad-m": 3}


# -- running --------------------------------------------------------------------------------------
# B is a weight: the same tensor call after call. Its zero-padded (or realigned) copy is kept, keyed
# on B's memory, shape and dtype, and used while B's version counter says nothing wrote B since
# (copying a 50257x768 LM head on every call cost GPT-2's 7-row decode 0.43x cuBLAS:
# benchmarks/results/2026-11-25_h100_every_model/every_model_seed1.json). Inside CUDA-graph capture
# the copy is made in the graph, so a replay sees an in-place update of B.
_B_COPIES: dict = {}
B_COPIES_KEPT = 64


def tensor_version(t):
    """``t``'s version counter (every in-place write bumps it), what a cache of a copy of ``t``
    compares; None for an inference tensor (made under ``torch.inference_mode``), which has none:
    it is written in place only inside inference mode, where nothing can tell (after such a write
    into a weight, drop the caches that hold its copies)."""
    return None if t.is_inference() else t._version  # pylint: disable=protected-access


def _weight_copy(B, Nk: int, Kk: int):
    """``B`` [N, K] in a zero-padded, 16-byte aligned [Nk, Kk] tensor, from the cache while B is unchanged."""
    import torch  # pylint: disable=import-outside-toplevel

    capturing = B.is_cuda and torch.cuda.is_current_stream_capturing()
    key = (B.data_ptr(), tuple(B.shape), B.dtype, B.device, Nk, Kk)
    hit = None if capturing else _B_COPIES.get(key)
    # the same tensor object (a weak reference: a new tensor at B's old address never matches), unwritten
    if hit is not None and hit[0]() is B and hit[1] == tensor_version(B):
        return hit[2]
    if capturing:
        b = B.new_zeros((Nk, Kk))
    else:  # kept across calls: from the default pool, not a CUDA graph's (runtime.outside_graph_pools)
        b = outside_graph_pools(lambda: B.new_zeros((Nk, Kk)), B.device.index) if B.is_cuda else B.new_zeros((Nk, Kk))
    b[: B.shape[0], : B.shape[1]] = B
    if not capturing:
        if key not in _B_COPIES and len(_B_COPIES) >= B_COPIES_KEPT:
            _B_COPIES.pop(next(iter(_B_COPIES)))  # the oldest
        _B_COPIES[key] = (weakref.ref(B), tensor_version(B), b)
    return b


def launch_route(route: Route, A2, B, out2, M: int, N: int, K: int, fixes: Fixes, bias=None, alpha=None, C2=None,
                 beta: float = 1.0, d_dtype=None, act: str = "none"):
    """Run the route's module on ``A2`` [M, K], ``B`` [N, K] (and ``out2`` [M, N] or None; + ``bias``
    [N], zero-padded like N; ``alpha`` where the spec has it; a residual ``C2`` [M, N] and ``beta``),
    with the copies ``fixes`` asks for and A copied into the rows of a module built for a larger M:
    what :func:`matmul` does once it has checked its tensors and found the route; returns D [M, N]
    (in ``d_dtype``, default A's). A split N's last columns are torch's (:class:`TorchMatmul`, with
    the epilogue: ``act``, the spec's activation, and the rest)."""
    import torch  # pylint: disable=import-outside-toplevel

    Mk = route.module_M if route.module_M is not None else M
    Nk, Kk = fixes.N, fixes.K
    Nc = min(N, Nk)  # D's columns the kernel computes (all but a split N's last few)
    a, b = A2, B
    # ours takes an MN-major operand (the spec's; A2 or B a transposed view) as the memory under the
    # view; torch's fallback, which has no spec, takes any view
    mn_a, mn_b = takes_stored(route.module)
    operands = {}  # in the spec's order (GemmSpec.epilogue_operands): bias, alpha, C, beta
    if bias is not None:  # the kernel's N values (zero-padded, or the first of a split N); on a 16-byte boundary
        if Nk < N and bias.data_ptr() % 16 == 0:
            operands["bias"] = bias[:Nk]
        else:
            operands["bias"] = bias if Nk == N and bias.data_ptr() % 16 == 0 else \
                torch.nn.functional.pad(bias[:Nc], (0, Nk - Nc))
    if alpha is not None:
        operands["alpha"] = alpha
    if C2 is not None:  # C in the kernel's rows and columns (a copy where padded, split or misaligned)
        if Mk == M and Nk == N and C2.data_ptr() % 16 == 0:
            operands["C"] = C2
        else:
            operands["C"] = C2.new_zeros((Mk, Nk))
            operands["C"][:M, :Nc] = C2[:, :Nc]
        operands["beta"] = beta
    if Mk != M or Kk != K:
        a = A2.new_zeros((Kk, Mk)).t() if mn_a else A2.new_zeros((Mk, Kk))  # in A's own layout
        a[:M, :K] = A2
    elif fixes.copies("copy-a"):
        a = A2.clone()
    if fixes.copies_weight:
        b = _weight_copy(B, max(Nk, N), Kk)
    if Nk < N:  # split: the kernel reads B's first Nk rows where they lie
        b = b[:Nk]
    a, b = (a.t() if mn_a else a), (b.t() if mn_b else b)
    if Mk == M and Nk == N and not fixes.copies("stage-out"):
        d = out2 if out2 is not None else torch.empty((M, N), dtype=d_dtype or A2.dtype, device=A2.device)
        route.run(a, b, d, operands)
        return d
    d = torch.empty((Mk, Nk), dtype=d_dtype or A2.dtype, device=A2.device)
    route.run(a, b, d, operands)
    result = out2 if out2 is not None else torch.empty((M, N), dtype=d_dtype or A2.dtype, device=A2.device)
    if Nk >= N:
        result.copy_(d[:M, :N])
        return result
    # split: D's last N - Nk columns by torch (the same epilogue), then both parts into D at once
    tail = torch.empty((M, N - Nk), dtype=result.dtype, device=A2.device)
    TorchMatmul(act)(A2, B[Nk:], tail, None if bias is None else bias[Nk:], 1.0 if alpha is None else alpha,
                     None if C2 is None else C2[:, Nk:], beta)
    torch.cat((d[:M], tail), dim=1, out=result)
    return result


def _trivial(A, out, shape, M: int, N: int, K: int, bias=None, act: str = "none", beta: float = 1.0, residual=None,
             d_dtype=None):
    """Empty shapes: nothing to launch (K = 0 gives zeros, or the bias, as cuBLAS does; then the
    activation of that, then beta times the residual)."""
    import torch  # pylint: disable=import-outside-toplevel

    D = out if out is not None else torch.empty(shape, dtype=d_dtype or A.dtype, device=A.device)
    if K == 0 and M and N:
        z = torch.zeros(shape, dtype=D.dtype, device=A.device)
        if bias is not None:
            z += bias
        z = torch_activation(z, act)
        if residual is not None:  # residual may be D: z is apart, the add elementwise
            torch.add(z, residual, alpha=beta, out=D)
        else:
            D.copy_(z)
    return D


def route_of(M: int, N: int, K: int, dtype: str = "float16", index: int = 0, strict: bool | None = None,
             spec: GemmSpec | None = None) -> Route:
    """The route ``matmul`` takes for this shape on GPU ``index`` (resolved now if it was not, and
    then remembered: the same object again); ``strict`` as :func:`matmul`'s; ``spec``: the
    operands (``GemmSpec.with_bias(dtype)`` for a call with a bias; default none)."""
    fixes = layout_fixes(Layout(M, N, K, dtype))
    return _route(M, fixes.N, fixes.K, dtype, index, _strict(strict), spec)[0]


def explain_text(M, N, K, dtype, arch, route: Route, fixes: Fixes, known: bool, batch=None) -> str:
    head = f"gemm_ladder.matmul: M={M} N={N} K={K} {dtype} on {arch}"
    if batch is not None:
        head += f" (A {batch} flattened into M={M})"
    lines = [head] + [f"  {line}" for line in route.lines]
    if route.module_M is not None and route.module_M > M:
        lines.append(f"  layout: copy A into {route.module_M} zero-padded rows (the module is built for "
                     f"M={route.module_M}): correct, slower")
    lines += [f"  layout: {line}" for line in fixes.lines()]
    if known:
        lines.append("  (this shape's kernel was already loaded in this process)")
    return "\n".join(lines)


def _fast_key(A, B, out, bias=None, epilogue=None):
    """What a call shares with an earlier, fully checked one that took the plain path: the shapes
    and strides (which fix each operand's layout: contiguous, or the transposed view of a
    contiguous tensor, an MN-major A or B), dtypes and GPUs of A, B, ``out`` and the bias, and
    ``epilogue`` (:func:`epilogue_key`) where the call has one past the bias; None when the
    arguments are not tensors (the checked path says what they should be)."""
    try:
        key = (A.shape, A.stride(), B.shape, B.stride(), A.dtype, B.dtype, A.device, B.device)
        if out is not None:
            key += (out.shape, out.stride(), out.dtype, out.device)
        if bias is not None:
            key += ("bias", bias.shape, bias.stride(), bias.dtype, bias.device)
        return key if epilogue is None else key + epilogue
    except (AttributeError, TypeError):
        return None


def _fast(A, B, out, bias=None):
    """The launch of a call like one already checked (same shapes, strides, dtypes, GPUs: the
    same layouts; 16-byte aligned, no grad wanted and ``out`` apart from A, B and the bias, checked
    again here), or None: then the checked path runs (and says what is wrong, if anything). The
    C++ table (:mod:`.native`), where it is loaded, answers first; what it passes over (tensor
    subclasses, a torch function or dispatch mode, a call remembered before it loaded) comes here."""
    lookup = _NATIVE["lookup"]
    if lookup is not None:
        done = lookup(A, B, out, bias)
        if done is not None:
            return done
    key = _fast_key(A, B, out, bias)
    hit = _FAST.get(key) if key is not None else None
    if hit is None:
        return None
    if lookup is not None and key not in _NATIVE_KEYS:
        _to_native(key, hit, A, B, out, bias)
    if not _passes(hit, A, B, out, bias):
        return None
    return _run_hit(hit, A, B, out, bias)


def _passes(hit, A, B, out, bias) -> bool:
    """:func:`_fast`'s checks of what the key does not fix: no grad wanted, 16-byte aligned
    pointers, ``out`` apart from A, B and the bias (``fastpath.cpp`` makes the same checks)."""
    a_bytes, b_bytes, d_bytes = hit[6]
    if (A.requires_grad or B.requires_grad or (out is not None and out.requires_grad)
            or (bias is not None and bias.requires_grad)) and _grad_enabled():
        return False
    # the strides matched: each operand is laid out as in the checked call, so each fills exactly
    # [ptr, ptr + its bytes) (a transposed view of a contiguous tensor too)
    pa, pb = A.data_ptr(), B.data_ptr()
    pc = 0
    if bias is not None:
        pc = bias.data_ptr()
        if pc & 15:  # the checked path copies it onto a 16-byte boundary
            return False
    if out is None:
        return not (pa | pb) & 15
    pd = out.data_ptr()
    if (pa | pb | pd) & 15:
        return False
    d_end = pd + d_bytes
    if (pd < pa + a_bytes and pa < d_end) or (pd < pb + b_bytes and pb < d_end):
        return False
    return bias is None or not (pd < pc + bias.nbytes and pc < d_end)


def _run_hit(hit, A, B, out, bias):
    """A remembered call's launch, its checks passed (:func:`_passes`); None where a padded
    weight is met inside CUDA-graph capture (the checked path sends it to torch)."""
    route, launch, M, N, K, shape, _, padded = hit
    if padded and _capturing(A):  # in a graph a padded weight goes to torch (_weight_as_it_is)
        return None
    if launch is torch_linear and (out is None or len(shape) == 2):  # torch's route: F.linear, batch dims and all
        route.calls += 1
        return _linear(A, B, bias, out)
    return _launch_fast(route, launch, A, B, out, shape, M, N, K, () if bias is None else (bias,))


# the C++ table (native.table()), once loaded: its lookup, and the keys of _FAST it holds
_NATIVE: dict = {"lookup": None, "module": None, "waiting": False}
_NATIVE_KEYS: set = set()


def _native_loaded(module) -> None:
    """``native.on_load``'s callback: the C++ table answers :func:`_fast` from now on."""
    _NATIVE.update(module=module, lookup=module.lookup)


def _attach_native() -> None:
    """At a remembered call: the C++ table if it is loaded, or built now (``$GEMM_LADDER_NATIVE=build``),
    else once a helper thread has built it (``native.table``); off, or failed to build: never."""
    if _NATIVE["module"] is not None or _NATIVE["waiting"]:
        return
    _NATIVE["waiting"] = True
    native.table()
    native.on_load(_native_loaded)


def _to_native(key, hit, A, B, out, bias) -> None:
    """Put a remembered call (``_FAST[key]``, made with these tensors) in the C++ table: torch's
    route as ``aten::linear`` there (kind 0), a kernel's launch as :func:`_run_hit` (kind 1)."""
    module = _NATIVE["module"]
    if module is None:
        return
    kind = 0 if hit[1] is torch_linear else 1
    with _LOCK:
        if module.remember(A, B, out, bias, kind, hit[0], functools.partial(_run_hit, hit), *hit[6]):
            _NATIVE_KEYS.add(key)


def use_native(on: bool) -> None:
    """Whether repeated calls may take the C++ table from now on (``$GEMM_LADDER_NATIVE`` says
    whether it is built and loaded; off here, the Python lookup alone serves, as with
    ``GEMM_LADDER_NATIVE=0``): for measuring one against the other in one process."""
    with _LOCK:
        _forget_native(detach=True)
        _NATIVE["waiting"] = not on  # off: no attach at the next remembered call
        if on:
            _attach_native()


def _forget_native(detach: bool = False) -> None:
    """Empty the C++ tables with ``_FAST`` (its entries are ``_FAST``'s), and the other front doors'
    repeated calls (:func:`on_forget`); ``detach``: and stop using the C++ table until a call is
    remembered again (:func:`reset`)."""
    _NATIVE_KEYS.clear()
    if _NATIVE["module"] is not None:
        _NATIVE["module"].clear()
    for forget in _ON_FORGET:
        forget()
    if detach:
        _NATIVE.update(lookup=None, module=None, waiting=False)


_ON_FORGET: list = []  # the other front doors' forgetting of their repeated calls (scaled's)


def on_forget(forget) -> None:
    """Call ``forget()`` wherever the front door forgets its repeated calls (:func:`use_pack`,
    :func:`reset`, :func:`use_native`): a front door whose routes come from the same packs and whose
    repeated calls share the C++ table (``scaled``) forgets its own with them."""
    if forget not in _ON_FORGET:
        _ON_FORGET.append(forget)


def native_table():
    """The C++ table's module (``fastpath.cpp``) once loaded, else None (being built, off, or failed
    to build), asked for on the way (:func:`_attach_native`): for another front door's repeated
    calls (``scaled.scaled_mm``'s ``scaled_lookup``)."""
    _attach_native()
    return _NATIVE["module"]


def fast_mm(A, B, bias=None):
    """``matmul(A, B)`` (D = A . B^T, no bias, epilogue or ``out``) when the fast path serves it
    (:func:`_fast`: a call with these shapes, strides, dtypes and GPUs was checked before, and the
    rest is checked again here), else None: then the caller calls :func:`matmul`, which checks and
    says what is wrong. For a caller that repeats the same plain calls (``ops.direct_mm``: the
    forward, dX and dW of every linear layer of an eager training step) and would otherwise prepare
    each operand (``ops._as_operand``) and pass through matmul's argument handling on every call;
    the strides in the key already say each operand is laid out as in the checked call. With
    ``bias``: ``matmul(A, B, bias=bias)``'s."""
    return _fast(A, B, None, bias)


def fast_swiglu(x, W_gu):
    """``swiglu(x, W_gu)`` when the gated kernel's fast path serves it (a call with these shapes,
    strides, dtypes and GPUs ran the kernel before: :func:`_fast_swiglu`), else None: then the
    caller calls :func:`swiglu`, which checks."""
    key = _swiglu_key(x, W_gu, None)
    return _fast_swiglu(key, x, W_gu, None) if key is not None else None


def _launch_fast(route, launch, A, B, out, shape, M: int, N: int, K: int, extras: tuple, d_dtype=None):
    """The fast path's launch: A (any batch dims) as [M, K] into ``out`` (its view as [M, N]), or
    into a new D in ``d_dtype`` (default A's) shaped like the call; counts the route's calls."""
    a = A if len(shape) == 2 else A.view(M, K)
    if out is None:
        # torch.empty on A's device, no import a call; the sizes as separate ints parse faster than
        # a tuple (about 1 us less a call on the GPU box's host)
        d = A.new_empty(M, N) if d_dtype is None else A.new_empty(M, N, dtype=d_dtype)
        launch(a, B, d, *extras)
        route.calls += 1
        return d if len(shape) == 2 else d.view(shape)
    launch(a, B, out if len(shape) == 2 else out.view(M, N), *extras)
    route.calls += 1
    return out


class Epilogue(NamedTuple):
    """A call's epilogue operands past the bias, as :func:`launch_route` takes them: ``alpha``
    (None: 1, not in the spec), the residual ``C`` [M, N] or None, ``beta``, D's dtype (None: A's)."""

    alpha: float | None = None
    C: object = None
    beta: float = 1.0
    d_dtype: object = None


NOT_FAST = ("not fast",)  # an epilogue a repeated call cannot be looked up by (alpha or beta no finite number)


def _finite(x) -> bool:
    """A Python int or float, finite (inf - inf and nan - nan are nan): a scalar the fast path
    passes through as it is; anything else (a tensor, a NumPy number) takes the checked path."""
    return (type(x) is float or type(x) is int) and x - x == 0  # pylint: disable=unidiomatic-typecheck


def epilogue_key(activation, alpha, residual, beta, out_dtype):
    """What an epilogue call adds to its fast-path key (:func:`_fast_epilogue`): the activation,
    whether alpha is in the spec (any value but 1: its value is the module's runtime scalar and
    passes through, as beta's does), the residual's shape, strides, dtype and GPU, D's dtype;
    :data:`NOT_FAST` where alpha or beta is no finite Python number (the checked path converts or
    refuses it)."""
    if not (_finite(alpha) and _finite(beta)):
        return NOT_FAST
    if residual is None:
        return ("epilogue", activation, alpha != 1.0, out_dtype)
    try:
        return ("epilogue", activation, alpha != 1.0, out_dtype, residual.shape, residual.stride(),
                residual.dtype, residual.device)
    except (AttributeError, TypeError):
        return NOT_FAST


def _remember_epilogue(A, B, out, bias, epi, route: Route, M: int, N: int, K: int, shape, d_dtype) -> None:
    """After a checked epilogue call that took the plain path (no copies: A, B, the bias and C
    16-byte aligned, N and K multiples of 8, the module built for any M or this one): later calls
    like it go through :func:`_fast_epilogue`. ``bias``: the caller's (a float32 D's copy of it
    is made again on each call, as the checked path makes it)."""
    launch = stored_launch(route, A.device.index, plain=False)
    key = _fast_key(A, B, out, bias, epi)
    if launch is not None and key is not None:
        d_size = 4 if d_dtype is not None else A.element_size()
        with _LOCK:
            _FAST[key] = (route, launch, M, N, K, tuple(shape), (A.nbytes, B.nbytes, M * N * d_size), d_dtype)


def _apart(p: int, size: int, spans) -> bool:
    """Whether bytes [p, p + size) share none with any of ``spans`` ((start, size) pairs)."""
    return all(p >= q + n or q >= p + size for q, n in spans)


def _fast_epilogue(A, B, out, bias, epi, alpha, residual, beta):
    """:func:`_fast` for a call with an epilogue past the bias (an activation, alpha, a residual, a
    float32 D): the launch of a call like one already checked (its key: :func:`epilogue_key`), with
    that call's checks that depend on the tensors' addresses made again: 16-byte alignment, no grad
    wanted, ``out`` apart from A, B and the bias, and the residual apart from them and either
    ``out`` itself (in place) or apart from it; else None (the checked path runs, and refuses what
    it must)."""
    key = _fast_key(A, B, out, bias, epi)
    try:
        hit = _FAST.get(key) if key is not None else None
    except TypeError:  # an unhashable activation: the checked path says what to pass
        return None
    if hit is None:
        return None
    route, launch, M, N, K, shape, (a_bytes, b_bytes, d_bytes), d_dtype = hit
    if (A.requires_grad or B.requires_grad or (out is not None and out.requires_grad)
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad)) and _grad_enabled():
        return None
    pa, pb = A.data_ptr(), B.data_ptr()
    if (pa | pb) & 15:
        return None
    read = [(pa, a_bytes), (pb, b_bytes)]  # what D must not overwrite while the kernel reads it
    extras = ()
    if bias is not None:
        pc = bias.data_ptr()
        if d_dtype is None and pc & 15:  # the checked path copies it onto a 16-byte boundary
            return None
        read.append((pc, bias.nbytes))
        extras = (bias if d_dtype is None else bias.float(),)  # a float32 D's bias in float32
    if alpha != 1.0:
        extras += (float(alpha),)
    if out is not None:
        pd = out.data_ptr()
        if pd & 15 or not _apart(pd, d_bytes, read):
            return None
    if residual is not None:
        pr = residual.data_ptr()
        if pr & 15 or not _apart(pr, d_bytes, read):
            return None
        if out is not None and pr != pd and not _apart(pr, d_bytes, [(pd, d_bytes)]):  # in place is out=C itself
            return None
        extras += (residual if len(shape) == 2 else residual.view(M, N), float(beta))
    return _launch_fast(route, launch, A, B, out, shape, M, N, K, extras, d_dtype)


def _capturing(A) -> bool:
    import torch  # pylint: disable=import-outside-toplevel

    return A.is_cuda and torch.cuda.is_current_stream_capturing()


_IN_GRAPHS: dict = {}


def _weight_as_it_is(act: str, spec: GemmSpec | None = None) -> Route:
    """Inside CUDA-graph capture, a weight TMA cannot read (N or K not a multiple of 8, off a
    16-byte boundary) would be copied into its padded form on every replay (so a replay sees an
    in-place update of it): a 77 MB LM head made GPT-2's 7-row decode 0.43x cuBLAS as a kernel
    [benchmarks/results/2026-11-25_h100_every_model/every_model_seed1.json], while at 512 rows and
    more ours, copy included, ran 1.7-3.6x cuBLAS's unaligned path. torch's matmul reads the weight
    as it is where the first call's timing (copies in the graph) found its kernel faster, or nothing
    was timed yet; strict mode keeps ours."""
    # one route per spec: its launcher, bound once per GPU, takes that spec's epilogue operands
    route = _IN_GRAPHS.get((act, spec))
    if route is None:
        lines = ["kernel: torch.matmul (cuBLAS), inside CUDA-graph capture",
                 "why: the weight needs a padded copy for TMA, which a graph would make on every replay",
                 f"source: torch ({STRICT_ENV}=1 or strict=True keeps ours)"]
        route = _IN_GRAPHS[(act, spec)] = Route(TorchMatmul(act), None, "torch, in graphs", "torch", {}, lines)
    return route


def _grad_enabled() -> bool:
    """``torch.is_grad_enabled()``, asked only when a tensor wants grad."""
    import torch  # pylint: disable=import-outside-toplevel

    return torch.is_grad_enabled()


# the layout fixes a repeated call's fast launch takes (PaddedLaunch): they depend on the shapes alone
PADDED_FAST = frozenset({"pad-n", "pad-k", "split-n"})


def padded_launch(route: Route, M: int, N: int, K: int, fixes: Fixes):
    """The fast path's launch of a call whose only copies are a padded N or K (the same for every
    call of these shapes; the weight's padded copy is kept while the weight is unchanged)."""
    return PaddedLaunch(route, M, N, K, fixes)


class PaddedLaunch:
    """:func:`launch_route` for a repeated call whose only copies are a padded N or K, with the host
    side cut to what must run each call: the weight's padded copy found by identity (the tensor
    object and its version counter; else :func:`_weight_copy`), and the kernel's padded A and D
    kept per GPU and stream with the views the copies use, made once (a zeroed A and an empty D, a
    slice of each: four torch calls a call, 3-13 us of host each on the H100 box, where GPT-2's LM
    head at M = 7 ran 30 us of kernels under ~95 us of host:
    ``benchmarks/results/2026-11-27_h100_every_model_native/``). Their padding stays zero: each call
    writes A's [M, K] corner only. A lock keeps one thread's copy, kernel and copy back together on
    a stream. Outside CUDA-graph capture only (the fast path leaves a padded call under capture to
    the checked path); what it does not cover (a module built for another M, an MN-major module,
    torch's kernel, a scratch over :attr:`KEEP_BYTES`) goes through :func:`launch_route`."""

    KEEP_BYTES = 64 << 20  # the most scratch (padded A and D) kept per GPU and stream

    def __init__(self, route: Route, M: int, N: int, K: int, fixes: Fixes):
        self.route, self.M, self.N, self.K, self.fixes = route, M, N, K, fixes
        self.weight = (None, -1, None)  # weak references to B and its padded copy, and B's version
        self.scratch: dict = {}  # (GPU index, stream) -> (dtype, padded A, its [M, K] view, padded D, its [M, N] view)
        self.lock = threading.Lock()

    def __call__(self, a, b, d):
        route, M, N, K = self.route, self.M, self.N, self.K
        Nk, Kk = self.fixes.N, self.fixes.K
        eager = route.module.eager if isinstance(route.module, ByCapture) else route.module
        if isinstance(eager, TorchMatmul) and eager.act == "none":  # torch's kernel eagerly: the tensors as they are
            torch_linear(a, b, d)
            return d
        too_big = (M * Kk + M * Nk) * a.element_size() > self.KEEP_BYTES
        if (route.module_M not in (None, M) or isinstance(route.module, TorchMatmul) or any(takes_stored(route.module))
                or too_big):
            return launch_route(route, a, b, d, M, N, K, self.fixes)
        import torch  # pylint: disable=import-outside-toplevel

        idx = a.device.index
        where = (idx, torch._C._cuda_getCurrentRawStream(idx) if a.is_cuda else 0)  # pylint: disable=protected-access
        if self.fixes.split_n:
            return self._split(a, b, d, where)
        with self.lock:
            kept = self.scratch.get(where)
            if kept is None or kept[0] != a.dtype:
                a_pad = a.new_zeros((M, Kk)) if Kk != K else None
                d_pad = a.new_empty((M, Nk)) if Nk != N else None
                kept = self.scratch[where] = (a.dtype, a_pad, a_pad[:, :K] if a_pad is not None else None,
                                              d_pad, d_pad[:, :N] if d_pad is not None else None)
            _, a_pad, a_view, d_pad, d_view = kept
            ref, version, kept_copy = self.weight
            same = ref is not None and ref() is b and version == tensor_version(b)
            padded = kept_copy() if same else None
            if padded is None:  # (the copy itself is _weight_copy's to keep or drop: a weak reference here)
                padded = _weight_copy(b, Nk, Kk)
                self.weight = (weakref.ref(b), tensor_version(b), weakref.ref(padded))
            if a_pad is not None:
                a_view.copy_(a)
                a = a_pad
            if d_pad is None:
                route.run(a, padded, d)
                return d
            route.run(a, padded, d_pad)
            d.copy_(d_view)
            return d

    def _split(self, a, b, d, where):
        """A split N (K aligned, the weight read as it lies): the kernel's first ``Nk`` columns into
        a kept [M, Nk] D, torch's last few into a kept [M, N - Nk] tail, and both into ``d`` by
        one ``torch.cat``. The kernel and torch's matmul run as one CUDA graph per weight
        (:meth:`_split_graph`, on a kept copy of A): launched one by one they cost the GPU box's host
        39-70 us a call over a 28 us kernel at GPT-2's LM head, the graph 23-38
        (``benchmarks/results/2026-11-29_h200_split_n/``)."""
        import torch  # pylint: disable=import-outside-toplevel

        Nk = self.fixes.N
        with self.lock:
            kept = self.scratch.get(where)
            if kept is None or kept[0] != a.dtype:
                kept = self.scratch[where] = (a.dtype, a.new_empty((self.M, Nk)), a.new_empty((self.M, self.N - Nk)),
                                              a.new_empty((self.M, self.K)), {})
            _, d_main, tail, a_in, _ = kept
            graph = self._split_graph(kept, b)
            if graph is None:
                self.route.run(a, b[:Nk], d_main)
                split_tail(a, b, d_main, tail, d)
                return d
            a_in.copy_(a)
            graph.replay()
            torch.cat((d_main, tail), dim=1, out=d)
            return d

    def _split_graph(self, kept, b):
        """The CUDA graph of a split call's kernel and torch's matmul on weight ``b`` (from the kept
        A copy into the kept D and tail), captured at its first call (None: no graph, the launches
        one by one). Kept per weight, found by identity and address: a replay reads the weight's
        memory as it is then, so an in-place update is seen; a weight moved elsewhere
        (``param.data = ...``) gets a new graph. At most :data:`SPLIT_GRAPHS` weights a scratch."""
        graphs = kept[4]
        hit = graphs.get(id(b))
        if hit is not None and hit[0]() is b and hit[1] == b.data_ptr():
            return hit[2]
        for key in [k for k, v in graphs.items() if v[0]() is None or k == id(b)]:
            del graphs[key]  # weights gone, and this one's graph of its old address
        if len(graphs) >= SPLIT_GRAPHS:
            return None
        graph = _capture_split(self.route, kept[3], b, kept[1], kept[2])
        graphs[id(b)] = (weakref.ref(b), b.data_ptr(), graph)
        return graph


# the weights a split N's kept scratch holds CUDA graphs for (PaddedLaunch._split_graph): a graph
# replay with a copy of A costs GPT-2's LM head ~25 us of host less a call than the kernel and
# torch's matmul launched one by one (benchmarks/results/2026-11-29_h200_split_n/); past this many
# weights a call launches them one by one (no capture per call)
SPLIT_GRAPHS = 4


def _capture_split(route: Route, a_in, b, d_main, tail):
    """A CUDA graph of ``d_main = a_in . b[:Nk]^T`` (the route's kernel) and ``tail = a_in .
    b[Nk:]^T`` (torch), captured on a side stream (thread-local capture: other threads' CUDA work
    goes on) after one run of both there, so that nothing is set up inside the capture (cuBLAS's
    handle for that stream); None where capture fails (the call then launches them one by one).
    Not ``torch.cuda.graph``: it synchronises the GPU, collects garbage and empties torch's cache
    of free GPU memory at each capture."""
    import torch  # pylint: disable=import-outside-toplevel

    if not b.is_cuda:
        return None
    Nk = d_main.shape[1]
    here = torch.cuda.current_stream()
    side = _CAPTURE_STREAMS.get(a_in.device.index)
    if side is None:  # one per GPU: torch keeps a cuBLAS workspace for each stream that ran its matmul
        side = _CAPTURE_STREAMS[a_in.device.index] = torch.cuda.Stream(device=a_in.device)
    side.wait_stream(here)
    graph = torch.cuda.CUDAGraph()
    try:
        # one capture at a time (each PaddedLaunch has its own lock): a launch into the side stream
        # while another thread captures on it would land in that thread's graph
        with _CAPTURE_LOCK, torch.cuda.stream(side):
            route.run(a_in, b[:Nk], d_main)  # warm-up on the capture stream (cuBLAS's handle for it)
            torch.mm(a_in, b[Nk:].t(), out=tail)
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                route.run(a_in, b[:Nk], d_main)
                torch.mm(a_in, b[Nk:].t(), out=tail)
            finally:
                graph.capture_end()
    except Exception:  # pylint: disable=broad-except  (the direct launches then run, and raise what is wrong)
        graph = None
    here.wait_stream(side)
    return graph


_CAPTURE_STREAMS: dict = {}  # GPU index -> the side stream _capture_split captures on
_CAPTURE_LOCK = threading.Lock()


def split_tail(a, b, d_main, tail, d) -> None:
    """The rest of a split N's call after our kernel wrote D's first ``Nk`` columns into ``d_main``:
    ``tail = a . b[Nk:]^T`` by torch, then ``d = [d_main | tail]``, where no graph is kept
    (:meth:`PaddedLaunch._split_graph`). The C++ table's twin (``fastpath.cpp``'s ``split_tail``)
    where it is loaded: it skips the two calls' Python argument parsing, 2-8 us of the GPU box's
    host a call (``benchmarks/results/2026-11-29_h200_split_n/``, ``split_n_no_graph``); cuBLAS's own
    host time for the one column, ~27 us there, stays."""
    native_tail = getattr(_NATIVE["module"], "split_tail", None)
    if native_tail is not None:
        native_tail(a, b, d_main, tail, d)
        return
    import torch  # pylint: disable=import-outside-toplevel

    torch.mm(a, b[d_main.shape[1]:].t(), out=tail)
    torch.cat((d_main, tail), dim=1, out=d)


def torch_linear(a, b, d, *extras) -> None:
    """The fast path's launch of torch's route (:class:`TorchMatmul` without an activation, the
    front door's measured choice or its fallback): ``d = a . b^T (+ bias)`` by cuBLAS into ``d``;
    a call without ``out`` skips this and calls ``F.linear`` itself, which allocates D (a
    repeated call then costs the key lookup over calling F.linear directly). ``aten::linear.out``
    runs torch.mm / torch.addmm on ``b``'s transposed view as F.linear does, and costs less host
    time than making that view in Python (0.7-0.9 us a call on the build box: at the 10-30 us calls
    where cuBLAS's kernel wins, this host time is the gap in the call ratio)."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.nn.functional.linear(a, b, extras[0] if extras else None, out=d)


def _linear(A, B, bias, out=None):
    """torch's route of a repeated call (:func:`_fast`): ``F.linear`` into ``out`` (A and ``out``
    2-D there) or into the D it allocates (any batch dims), straight from the fast path."""
    import torch  # pylint: disable=import-outside-toplevel

    if out is None:
        return torch.nn.functional.linear(A, B, bias)
    return torch.nn.functional.linear(A, B, bias, out=out)


def stored_launch(route: Route, index: int, plain: bool = True):
    """The fast path's launch of a call on GPU ``index``: :func:`torch_linear` for torch's route of
    a ``plain`` call (A . B^T in A's dtype, a bias at most), else the route's bound launcher (the
    epilogue's operands after D, in the spec's order), handed the memory under a transposed view
    where its module reads an MN-major operand as it is stored (:func:`takes_stored`); None before
    the route has launched on that GPU."""
    if plain and isinstance(route.module, TorchMatmul) and route.module.act == "none":
        return torch_linear
    launch = route.launchers.get(index)
    ta, tb = takes_stored(route.module)
    if launch is None or not (ta or tb):
        return launch
    if ta and tb:
        return lambda a, b, d, *extras: launch(a.t(), b.t(), d, *extras)
    if ta:
        return lambda a, b, d, *extras: launch(a.t(), b, d, *extras)
    return lambda a, b, d, *extras: launch(a, b.t(), d, *extras)


def _by_capture_launch(route: Route, A, B, out, M: int, N: int, K: int, index, bias=None):
    """The launch a repeated call of a :class:`ByCapture` route takes (torch's kernel eagerly, ours
    under capture, or the other way round), made once from this checked call's tensors. Where torch
    won eagerly the checked path runs torch on a route of its own (:func:`launch_route` on the tensors
    as they are), so the route itself held no launch and nothing was remembered: every eager call ran
    the checked path, ~100 us of host a call on the GPU box (0.78x F.linear at 16x128256x2048 in the
    every-model run of 2026-11-28)."""
    import torch  # pylint: disable=import-outside-toplevel

    a = A if A.dim() == 2 else A.reshape(M, K)
    d = out.view(M, N) if out is not None else torch.empty((M, N), dtype=A.dtype, device=A.device)
    operands = {"bias": bias} if bias is not None else {}
    launch = route.launchers[index] = launcher_of(route.module, a, B, d, **operands)
    return launch


def fast_spec(spec: GemmSpec | None) -> bool:
    """Whether a call of operand spec ``spec`` (None: the default) may be remembered for the fast
    path: D = A . B^T in A's dtype, A and B of either layout, a bias in A's dtype at most."""
    if spec is None:
        return True
    plain = dataclasses.replace(spec, a_major="K", b_major="K", bias=None)
    return plain.is_default() and spec.bias in (None, spec.a)


def _remember(A, B, out, route: Route, M: int, N: int, K: int, shape, fixes: Fixes, bias=None) -> None:
    """After a checked call that took the plain path (no copies, the module built for any M or
    this one; A and B contiguous or read as they lie as MN-major operands; a bias where nothing
    was padded), or only padded N or K (copies that depend on the shapes alone, the weight's kept:
    :func:`launch_route`): later calls like it go through :func:`_fast`."""
    if bias is not None and fixes.names:  # the padded launch takes no bias: the checked path pads it
        return
    index = A.device.index
    launch = padded_launch(route, M, N, K, fixes) if fixes.names else stored_launch(route, index)
    if launch is None and not fixes.names and isinstance(route.module, ByCapture):
        launch = _by_capture_launch(route, A, B, out, M, N, K, index, bias)
    key = _fast_key(A, B, out, bias)
    if launch is not None and key is not None:
        with _LOCK:
            spans = (A.nbytes, B.nbytes, M * N * A.element_size())  # the bytes of A, B and D
            _FAST[key] = (route, launch, M, N, K, tuple(shape), spans, bool(fixes.names))
            hit = _FAST[key]
        _attach_native()
        _to_native(key, hit, A, B, out, bias)


def matmul(A, B, out=None, explain: bool = False, strict: bool | None = None, bias=None, activation=None,
           alpha: float = 1.0, residual=None, beta: float = 1.0, out_dtype=None):
    """D = act(alpha . A . B^T (+ ``bias``, one value per column: N values in A's dtype, added to the
    fp32 sums)) (+ ``beta . residual``), ``activation`` one of ``relu``, ``gelu_tanh``, ``gelu_erf``,
    ``silu`` or None, all in fp32 before rounding, on the GPU, for any shape (see the module
    docstring); returns D (or ``out``). ``alpha``, ``beta``: Python floats (runtime values of one
    module); ``residual``: C of D's shape and dtype, which may be ``out`` itself (in place);
    ``out_dtype``: None (A's dtype) or torch.float32 (v9 builds it; a residual then in float32 too).

    ``strict``: where no kernel of ours serves the shape, raise :class:`NoKernelError` instead of
    computing it with torch's own matmul (default: ``$GEMM_LADDER_STRICT``, read when a shape is
    first resolved)."""
    plain_epilogue = alpha == 1.0 and residual is None and beta == 1.0 and out_dtype is None
    lookup = _NATIVE["lookup"]
    if lookup is not None and plain_epilogue and activation is None and not explain and strict is None:
        done = lookup(A, B, out, bias)  # the C++ table first, without _fast's call (a repeated call's whole cost)
        if done is not None:
            return done
    epi = None if activation is None and plain_epilogue else epilogue_key(activation, alpha, residual, beta, out_dtype)
    if not explain and strict is None:
        if epi is None:
            done = _fast(A, B, out, bias)
        elif epi is not NOT_FAST:
            done = _fast_epilogue(A, B, out, bias, epi, alpha, residual, beta)
        else:
            done = None
        if done is not None:
            return done
    act = check_activation(activation)
    d_dtype = None  # A's
    if not plain_epilogue:
        alpha, beta = scalar_arg("alpha", alpha, "gemm_ladder.matmul"), scalar_arg("beta", beta, "gemm_ladder.matmul")
        d_dtype = check_out_dtype(out_dtype, A)
    extra = () if residual is None and d_dtype is None else (residual, d_dtype)  # the new epilogues' checks
    M, N, K, A2, out2, shape = _check(A, B, out, bias, *extra)
    C2 = residual.view(M, N) if residual is not None else None
    dtype = _dtype_name(A.dtype)
    if M == 0 or N == 0 or K == 0:
        if explain:
            print(f"gemm_ladder.matmul: M={M} N={N} K={K} {dtype}: empty, nothing launched", file=sys.stderr)
        return _trivial(A, out, shape, M, N, K, bias, act, beta, residual, d_dtype)
    aligned = (A2.data_ptr() % 16 == 0, B.data_ptr() % 16 == 0, out2 is None or out2.data_ptr() % 16 == 0)
    a_major, b_major = operand_majors(A2, B)
    layout_notes = []
    if (a_major, b_major) != ("K", "K") and (K % 8 or N % 8 or (a_major == "M" and M % 8) or not all(aligned)):
        # a transposed view TMA cannot read as it is (a row stride not a multiple of 16 bytes, or
        # a misaligned start): K-major copies, then the usual fixes
        layout_notes.append("copy the transposed view(s) into K-major tensors (TMA cannot read them as they are: "
                            "M, N and K must be multiples of 8 and the data 16-byte aligned): correct, slower")
        A2, B, a_major, b_major = A2.contiguous(), B.contiguous(), "K", "K"
        aligned = (A2.data_ptr() % 16 == 0, B.data_ptr() % 16 == 0, aligned[2])
    if K % 8 or N % 8 or not all(aligned):
        fixes = layout_fixes(Layout(M, N, K, dtype, *aligned, out_given=out2 is not None))
    else:
        fixes = Fixes((), N, K)
    index = A.device.index if A.device.index is not None else 0
    # alpha in the spec only where it is not 1 (one module serves every other value)
    spec = dataclasses.replace(GemmSpec.with_epilogue(dtype, bias is not None, act, alpha != 1.0, residual is not None),
                               a_major=a_major, b_major=b_major)
    given_bias = bias  # the caller's (the fast path's key), before a float32 D's copy
    if d_dtype is not None:  # a float32 D: its bias and residual in float32 too
        spec = dataclasses.replace(spec, d="float32", bias="float32" if bias is not None else None,
                                   residual="float32" if residual is not None else None)
        bias = bias.float() if bias is not None else None
    spec = None if spec.is_default() else spec  # the default spec: the plain path, remembered for the fast one
    route, known = _route(M, fixes.N, fixes.K, dtype, index, _strict(strict), spec)
    route.calls += 1
    # the epilogue's operands past the bias, in the spec's order (GemmSpec.epilogue_operands)
    epilogue = Epilogue(alpha if alpha != 1.0 else None, C2, beta, d_dtype)
    if route.candidates and route.module_M in (None, M) and first_use.enabled():
        _settle(route, A2, B, M, N, K, fixes, bias, index, epilogue, spec)
    if fixes.copies_weight and not _strict(strict) and _capturing(A):
        in_graphs = route.module.graphs if isinstance(route.module, ByCapture) else route.module
        if route.candidates or isinstance(in_graphs, TorchMatmul):  # not measured, or torch's kernel won
            route = _weight_as_it_is(act, spec)
    if isinstance(route.module, TorchMatmul):  # torch takes any layout: no copies for TMA
        fixes = Fixes((), N, K)
    run = route
    if isinstance(route.module, ByCapture):  # the module this call runs, by capture
        in_use = route.module.graphs if _capturing(A) else route.module.eager
        if isinstance(in_use, TorchMatmul):  # torch's kernel this time: on the tensors as they are, no split
            run = Route(in_use, None, route.source, "torch", {})
    D = launch_route(run, A2, B, out2, M, N, K, Fixes((), N, K) if run is not route else fixes,
                     bias, *epilogue, act=act)
    if not layout_notes and (route.module_M is None or route.module_M == M) and not _capturing(A) \
            and (bias is None or bias.data_ptr() % 16 == 0):
        if epi is None and fast_spec(spec) and set(fixes.names) <= PADDED_FAST:
            _remember(A, B, out, route, M, N, K, shape, fixes, bias)
        elif epi is not None and epi is not NOT_FAST and not fixes.names and (C2 is None or C2.data_ptr() % 16 == 0):
            _remember_epilogue(A, B, out, given_bias, epi, route, M, N, K, shape, d_dtype)
    if explain:
        batch = tuple(A.shape) if A.dim() != 2 else None
        text = explain_text(M, N, K, dtype, _arch(index), route, fixes, known, batch)
        text += "".join(f"\n  layout: {note}" for note in layout_notes)
        if _mn_major(spec):
            text += f"\n  operands: A {a_major}-major, B {b_major}-major (a transposed view is read as it lies)"
        steps = [what for what, on in (("x alpha", alpha != 1.0), ("+ bias[n]", bias is not None), (act, act != "none"),
                                       ("+ beta C", residual is not None)) if on]
        print(text + (f"\n  epilogue: {', then '.join(steps)}, on the fp32 sums before rounding" if steps else ""),
              file=sys.stderr)
    return out if out is not None else D.view(shape)


def glu_halves(h, out=None):
    """``silu(h[..., :N]) * h[..., N:]`` of a gate/up product ``h`` [..., 2N] (``x . W_gu^T``), in
    fp32, rounded once into ``out`` (or a new tensor of h's dtype): SwiGLU's elementwise half."""
    import torch  # pylint: disable=import-outside-toplevel

    gate, up = h.float().chunk(2, dim=-1)
    y = torch.nn.functional.silu(gate).mul_(up)
    if out is None:
        return y.to(h.dtype)
    out.copy_(y)
    return out


def swiglu(x, W_gu, out=None, strict: bool | None = None):
    """``silu(x . Wg^T) * (x . Wu^T)`` from the fused gate/up weight ``W_gu = cat([Wg, Wu])`` [2N, K]
    (the layout of HF LLaMA-style fused MLPs): D [..., N] in x's dtype (``out``: [..., N], apart
    from x and W_gu).

    One kernel where a module serves (the spec's ``gated``, ``spec_for(dtype, "swiglu")``: v9 loads
    each tile's gate rows and the matching up rows into one B tile, so a thread holds a gate and its
    up value, and stores silu(gate) * up: half the output bytes of the two products). Else, or where
    the layout needs copies (N or K not a multiple of 8, a view off a 16-byte boundary), the product
    ``x . W_gu^T`` [..., 2N] goes through :func:`matmul` and :func:`glu_halves` in torch."""
    import torch  # pylint: disable=import-outside-toplevel

    key = _swiglu_key(x, W_gu, out) if strict is None else None
    if key is not None:
        done = _fast_swiglu(key, x, W_gu, out)
        if done is not None:
            return done
    if not isinstance(W_gu, torch.Tensor) or W_gu.dim() != 2 or W_gu.shape[0] % 2:
        shape = tuple(W_gu.shape) if isinstance(W_gu, torch.Tensor) else type(W_gu).__name__
        raise ModuleInputError(f"gemm_ladder.swiglu: W_gu is {shape}; it is cat([W_gate, W_up]) of shape [2N, K] "
                               "(an even number of rows: gate rows first, then up rows)")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ModuleInputError(f"gemm_ladder.swiglu: x must be a torch.Tensor [..., K], got {type(x).__name__}")
    N = W_gu.shape[0] // 2
    shape = (*x.shape[:-1], N)
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != x.dtype \
                or not out.is_contiguous():
            raise ModuleInputError(f"gemm_ladder.swiglu: out must be a contiguous {shape} {x.dtype} (half of W_gu's "
                                   f"rows), got {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        for name, t in (("x", x), ("W_gu", W_gu)):
            if _overlaps(out, t):
                raise ModuleInputError(f"gemm_ladder.swiglu: out overlaps {name} in memory; pass an out apart from it")
    # the gated kernel reads K-major x and W_gu: a transposed view is copied first
    as_given = x.is_contiguous() and W_gu.is_contiguous()
    x, W_gu = (t if t.is_contiguous() else t.contiguous() for t in (x, W_gu))
    M, N2, K, x2, _, _ = _check(x, W_gu, None)
    aligned = x2.data_ptr() % 16 == 0 and W_gu.data_ptr() % 16 == 0 and (out is None or out.data_ptr() % 16 == 0)
    if M and K and N and K % 8 == 0 and N % 8 == 0 and aligned:
        index = x.device.index if x.device.index is not None else 0
        dtype = _dtype_name(x.dtype)
        route, _ = _route(M, N2, K, dtype, index, _strict(strict), spec_for(dtype, "swiglu"))
        module = route.module
        if isinstance(module, ByCapture):  # ours, whichever way it runs (torch's stand-in is no gated GEMM)
            module = module.eager if not isinstance(module.eager, TorchMatmul) else module.graphs
        if not isinstance(module, TorchMatmul) and route.module_M in (None, M):  # ours: one kernel
            route.calls += 1
            d = out.view(M, N) if out is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
            if module is route.module:
                route.run(x2, W_gu, d)
                launch = route.launchers.get(x2.device.index)
            else:  # a tiny problem's: ours under capture too (torch's fallback is no gated GEMM)
                launch = launcher_of(module, x2, W_gu, d)
                launch(x2, W_gu, d)
            if key is not None and as_given and launch is not None and not _capturing(x):
                with _LOCK:
                    _FAST[key] = (route, launch, M, N, shape, (x.nbytes, W_gu.nbytes, d.nbytes))
            return out if out is not None else d.view(shape)
    return glu_halves(matmul(x, W_gu, strict=strict), out)


def _swiglu_key(x, W_gu, out):
    """What a :func:`swiglu` call shares with an earlier, checked one that ran our gated kernel
    on x and W_gu as given (contiguous, aligned): shapes, strides, dtypes and GPUs of x, W_gu and
    ``out``; None when they are not tensors."""
    try:
        key = ("swiglu", x.shape, x.stride(), W_gu.shape, W_gu.stride(), x.dtype, W_gu.dtype, x.device, W_gu.device)
        if out is not None:
            key += (out.shape, out.stride(), out.dtype, out.device)
        return key
    except (AttributeError, TypeError):
        return None


def _fast_swiglu(key, x, W_gu, out):
    """The gated kernel's launch for a call like one already checked (:func:`_swiglu_key`), with
    that call's address checks made again (16-byte alignment, no grad wanted, ``out`` apart from
    x and W_gu); else None: the checked path runs."""
    hit = _FAST.get(key)
    if hit is None:
        return None
    route, launch, M, N, shape, (x_bytes, w_bytes, d_bytes) = hit
    if (x.requires_grad or W_gu.requires_grad or (out is not None and out.requires_grad)) and _grad_enabled():
        return None
    px, pw = x.data_ptr(), W_gu.data_ptr()
    if (px | pw) & 15:
        return None
    x2 = x if len(shape) == 2 else x.view(M, x.shape[-1])
    if out is None:
        d = x.new_empty(M, N)  # torch.empty in x's dtype on its device (sizes as ints: see _launch_fast)
        launch(x2, W_gu, d)
        route.calls += 1
        return d if len(shape) == 2 else d.view(shape)
    pd = out.data_ptr()
    if pd & 15 or not _apart(pd, d_bytes, [(px, x_bytes), (pw, w_bytes)]):
        return None
    launch(x2, W_gu, out if len(shape) == 2 else out.view(M, N))
    route.calls += 1
    return out
