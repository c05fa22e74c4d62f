"""``gemm_ladder.scaled_mm``: the fp8 front door, with ``torch._scaled_mm``'s semantics and shape rules.

    xq, sx = gemm_ladder.quantize_fp8(x, "row")                 # bf16 [M, K] -> e4m3 + scale [M, 1]
    wq, sw = gemm_ladder.quantize_fp8(W, "row")                 # bf16 [N, K] (nn.Linear.weight)
    y = gemm_ladder.scaled_mm(xq, wq.t(), sx, sw.t(), out_dtype=torch.bfloat16)   # ~ x @ W.T
    xq, sx = gemm_ladder.quantize_fp8(x, "block")               # 1x128 groups: [M, K/128] M-major
    wq, sw = gemm_ladder.quantize_fp8(W, "block", block=(128, 128))   # [N/128, K/128]
    y = gemm_ladder.scaled_mm(xq, wq.t(), sx, sw.t())           # the block recipe, by the scales' shapes

    D[m, n] = round(sum_k A[m, k] B[k, n] * scale_a * scale_b (+ bias[n]))

As ``torch._scaled_mm``: A ``[M, K]`` float8_e4m3fn row-major; B ``[K, N]`` column-major, i.e. the
``.t()`` view of a row-major ``[N, K]`` weight (taken as it is, with no copy: our kernel reads B as
``[N, K]`` K-major, which is that view's memory); fp32 scales, one recipe for both:

    ==========  ==============================  ==================================
    recipe      scale_a                         scale_b
    ==========  ==============================  ==================================
    tensor      one value ([], [1], [1,1])      one value
    row         [M, 1] (or [M])                 [1, N] (or [N])
    block       [M, ceil(K/128)], M-major       [ceil(K/128), ceil(N/128)], the .t()
                (strides (1, M)): 1x128 groups  of a row-major [N/128, K/128]: 128x128
    ==========  ==============================  ==================================

The block recipe is DeepSeek-V3's (A's activations in groups of 128 of K a row, B's weights in
128x128 blocks), with the layouts torch's ``_scaled_mm`` checks for its BlockWise1x128 and
BlockWise128x128 scalings (``is_blockwise_1x128_scaling``: scale_a ``[M, K/128]`` with strides
``(1, M)``; scale_b the ``.t()`` of a row-major ``[N/128, K/128]``) and DeepGEMM's (its A scales
are M-major too: a warp's rows are adjacent). Whether this torch's ``_scaled_mm`` runs them is asked
once per GPU (:func:`torch_runs_block`: torch 2.11 with CUDA 13 does on the H200 box; an earlier
cuBLASLt refused them on sm_90). Where it does, torch's kernel is the fallback of a block call
without a bias and the first use's other candidate; elsewhere, or with a bias, the fallback is the
product of the dequantized inputs in fp32 (:class:`TorchScaledMM`). The scales are applied as each
128 of K is promoted into the fp32 sums (``sm90a/fp8.py``).

``bias`` ``[N]`` in ``out_dtype`` or fp32; ``out_dtype`` bfloat16 (default) or float16 on our
kernels (float32: torch's); K and N multiples of 16 (torch's rule, and TMA's 16-byte strides).
Any other layout is refused with the fix: fp8 wgmma reads both operands K-major, so a row-major
``[K, N]`` B is not transposed behind the caller's back.

Where the kernel comes from (``explain=True`` returns the lines with D), first that serves:

    1. a module registered with :func:`use_module` (its N, K and spec; any M for a runtime-M module)
    2. a kernel pack's fp8 module (``gemm_ladder.use_pack``, ``$GEMM_LADDER_PACK``; built with
       ``pack build --dtypes float8_e4m3 --fp8-scales ... --fp8-out ...``): the call's spec, N
       and K, any M its runtime M takes (a runtime-M module serves a range of M of an fp8 weight:
       ``plan.FP8_RULES``, small M and the rest), or the M it was built for
    3. where TVM's compiler is here, the policy's fp8 kernel (``plan.FP8_RULES``: the same
       module a pack holds) from the module cache or built into it now (``sm90a/fp8.py``)
    4. else ``torch._scaled_mm``, with a :class:`front.KernelFallbackWarning` once per shape that
       says how to build a pack for it; ``strict=True``: :class:`front.NoKernelError` instead.

A call like one already checked (the same shapes, strides, dtypes and devices, out_dtype and strict)
repeats its launch without the checks its layout settles (:func:`_repeat`; the C++ table's
``scaled_lookup`` where ``gemm_ladder.serve.native`` built it). A call that wants grad returns D with
a backward that refuses, as ``torch._scaled_mm``'s does; ``out`` must not overlap what the kernel reads.

The kernel of 2 or 3 is timed at the first call of a shape (M, weight, spec) on a GPU against
``torch._scaled_mm`` for per-tensor and rowwise scales (torch has its own kernels for those), and for
block scales without a bias where this torch runs them on the GPU (:func:`torch_runs_block`), as
``front.matmul`` times its candidates (``first_use``: queued launches and kernels in CUDA graphs on
input sets that spill L2, the winners remembered per GPU in ``choices.json``): under CUDA-graph capture
the faster kernel serves; eager calls go to torch where its whole calls were TORCH_EAGER_EDGE (1.10)
times faster (its host path is the longer); ``explain`` says which ran and why, so ``scaled_mm`` is never
slower than the library it replaces. Not with ``strict=True`` (or
``GEMM_LADDER_STRICT=1``), nor with ``GEMM_LADDER_MEASURE=0``, nor for block scales where torch has no
block-wise kernel on the GPU or the call has a bias (the stand-in then is a float32 product).

The module built here comes from ``plan.fp8_policy``: the tuning database's entry for the call's spec and
shape bucket (``tune --dtype float8_e4m3``: candidates timed against ``torch._scaled_mm``), else the
rules' knobs (``plan.fp8_module``, from the fp8 sweeps); ``explain`` says which.

:func:`quantize_fp8` makes the inputs with the rounding torch's recipes use: ``amax / fp8_max``
as the scale (the dequantization multiplier), ``x / scale`` clamped to the fp8 range, then
``.to(float8)`` (round to nearest even).

This module imports torch only where it is called (``gemm_ladder`` imports no torch).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import NamedTuple

from ..core import device
from ..core.config import max_m_of
from ..core.spec import FP8_SCALES, MN_MAJOR_FP8_FIX, GemmSpec
from ..core.files import sha256_of
from . import first_use
from .front import (KernelFallbackWarning, NoKernelError, Route, _apart, _grad_enabled, _l2_bytes, _strict,
                    cached_module, native_table, on_forget, packs, why_no_build)  # the front door's own helpers
from .kernel_pack import FP8_INPUT
from .runtime import ModuleInputError, load, outside_graph_pools

RECIPES = FP8_SCALES  # "tensor", "row", "block"
BLOCK = 128  # the block recipe's groups: 1 x 128 of K (A), 128 x 128 (B)
BLOCK_SHAPES = ((1, BLOCK), (BLOCK, BLOCK))  # quantize_fp8's block shapes: an activation's, a weight's
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
AMAX_FLOOR = 1e-12  # an all-zero row or tensor gets this amax (its scale stays finite and positive)

_LOCK = threading.RLock()
_ROUTES: dict = {}
_MODULES: list = []  # use_module's, newest first
_WARNED: set = set()
_LOADED: dict = {}  # pack modules by path: loaded once for every M they serve


# -- quantizing --------------------------------------------------------------------------------------
def quantize_fp8(x, recipe: str = "tensor", dtype=None, block=(1, BLOCK)):
    """``(x_fp8, scale)`` with ``x ~ x_fp8 * scale``: ``scale = amax / fp8_max`` in fp32 over the whole
    tensor (``tensor``: a 0-dim scale), over each row (``row``: ``[rows, 1]``), or over each block
    (``block``: ``block=(1, 128)``, an activation's groups of 128 columns a row, gives ``[rows,
    ceil(cols/128)]`` M-major, strides ``(1, rows)``: scaled_mm's scale_a as it is;
    ``block=(128, 128)``, a weight's, gives a row-major ``[ceil(rows/128), ceil(cols/128)]``); ``x /
    scale`` clamped to +-fp8_max and rounded to ``dtype`` (default float8_e4m3fn). Pass a weight's
    row or block scale to :func:`scaled_mm` as ``scale.t()``."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    dtype = dtype or torch.float8_e4m3fn
    name = str(dtype).removeprefix("torch.")
    if name not in FP8_MAX:
        raise ModuleInputError(f"quantize_fp8: dtype {dtype}; use torch.float8_e4m3fn or torch.float8_e5m2")
    if recipe not in RECIPES:
        raise ModuleInputError(f"quantize_fp8: recipe {recipe!r}; use one of {RECIPES}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ModuleInputError("quantize_fp8: x must be a floating-point torch.Tensor")
    if recipe in ("row", "block") and x.dim() != 2:
        raise ModuleInputError(f"quantize_fp8: the {recipe} recipe takes a 2-D x, got shape {tuple(x.shape)}")
    if recipe == "block":
        if tuple(block) not in BLOCK_SHAPES:
            raise ModuleInputError(f"quantize_fp8: block={block!r}; use (1, {BLOCK}) for an activation (A) or "
                                   f"({BLOCK}, {BLOCK}) for a weight (B)")
        return _quantize_blocks(x, tuple(block), dtype, FP8_MAX[name])
    xf = x.float()
    amax = xf.abs().amax() if recipe == "tensor" else xf.abs().amax(dim=1, keepdim=True)
    scale = amax.clamp(min=AMAX_FLOOR) / FP8_MAX[name]
    q = (xf / scale).clamp(-FP8_MAX[name], FP8_MAX[name]).to(dtype)
    return q, scale.to(torch.float32)


def _quantize_blocks(x, block, dtype, fp8_max):
    """:func:`quantize_fp8`'s block recipe: each ``block`` of x (the last ones cut short) by its amax."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    rows, cols = x.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    # zeros pad the cut blocks: they change no amax
    xp = torch.zeros(nr * br, nc * bc, dtype=torch.float32, device=x.device)
    xp[:rows, :cols] = x.float()
    amax = xp.abs().reshape(nr, br, nc, bc).amax(dim=(1, 3))  # [nr, nc]
    scale = amax.clamp(min=AMAX_FLOOR) / fp8_max
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    q = (x.float() / full).clamp(-fp8_max, fp8_max).to(dtype)
    if br == 1:  # an activation's: M-major, as scaled_mm (and torch's BlockWise1x128) take scale_a
        return q, scale.t().contiguous().t()
    return q, scale.contiguous()


def dequantize(q, scale, block=(1, BLOCK)):
    """``q * scale`` in fp32 with each scale over its block of :func:`quantize_fp8`'s block recipe."""
    br, bc = block
    rows, cols = q.shape
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return q.float() * full


# -- checks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """What the checks found of a call: the shape, the recipe and the operand spec it needs."""

    M: int
    N: int
    K: int
    recipe: str
    spec: GemmSpec | None  # None: no kernel of ours computes it (fp32 out): torch's


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _recipe(scale_a, scale_b, M: int, N: int, K: int) -> str:
    """The recipe the scales' shapes name (as torch tells them apart), tensor first, then row."""
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    kb, nb = -(-K // BLOCK), -(-N // BLOCK)
    if scale_a.numel() == 1 and scale_b.numel() == 1 and len(sa) <= 2 and len(sb) <= 2:
        return "tensor"
    if sa in ((M, 1), (M,)) and sb in ((1, N), (N,)):
        return "row"
    if sa == (M, kb) and sb == (kb, nb):
        return "block"
    raise ModuleInputError(
        f"gemm_ladder.scaled_mm: scale_a {sa} and scale_b {sb} are no recipe for M={M}, N={N}, K={K}: pass one value "
        f"each (tensor), scale_a [{M}, 1] and scale_b [1, {N}] (row), or scale_a [{M}, {kb}] and scale_b [{kb}, {nb}] "
        "(block: gemm_ladder.quantize_fp8(x, 'block') and quantize_fp8(W, 'block', block=(128, 128)) then .t())")


def _check_scale_layouts(scale_a, scale_b, recipe: str, who: str) -> None:
    """Contiguous scales (tensor, row); block: torch's layouts, scale_a M-major and scale_b the .t()
    of a row-major [N/128, K/128] (the kernel reads both as they lie)."""
    if recipe != "block":
        for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
            if not t.is_contiguous():
                raise ModuleInputError(f"{who}: {name} is not contiguous; pass {name}.contiguous()")
        return
    if not scale_a.t().is_contiguous():
        raise ModuleInputError(f"{who}: block scale_a {tuple(scale_a.shape)} must be M-major (strides (1, M), got "
                               f"{scale_a.stride()}), as torch's BlockWise1x128 and quantize_fp8(x, 'block') make it: "
                               "pass scale_a.t().contiguous().t()")
    if not scale_b.t().is_contiguous():
        raise ModuleInputError(f"{who}: block scale_b {tuple(scale_b.shape)} must be the .t() of a row-major "
                               f"[N/128, K/128] (strides (1, K/128), got {scale_b.stride()}): pass "
                               "quantize_fp8(W, 'block', block=(128, 128))[1].t()")


def check_call(A, B, scale_a, scale_b, bias=None, out_dtype=None, out=None) -> Call:
    """Every check that needs no data (the real call's and the fake op's): dtypes, shapes, layouts,
    the scales' recipe; a :class:`ModuleInputError` naming the problem and the fix."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    who = "gemm_ladder.scaled_mm"
    for name, t in (("A", A), ("B", B), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if A.dtype != torch.float8_e4m3fn:
        raise ModuleInputError(f"{who}: A is {A.dtype}; pass torch.float8_e4m3fn (gemm_ladder.quantize_fp8(A))")
    if B.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ModuleInputError(f"{who}: B is {B.dtype}; pass torch.float8_e4m3fn or torch.float8_e5m2 "
                               "(gemm_ladder.quantize_fp8(W) of a row-major [N, K] W, then .t())")
    if A.dim() != 2 or B.dim() != 2:
        raise ModuleInputError(f"{who}: A must be [M, K] and B [K, N]; got {tuple(A.shape)} and {tuple(B.shape)}")
    (M, K), N = A.shape, B.shape[1]
    if B.shape[0] != K:
        raise ModuleInputError(f"{who}: A is [M={M}, K={K}] but B is {tuple(B.shape)}, not [K={K}, N]"
                               + (" (B looks like [N, K]: pass B.t())" if B.shape[1] == K else ""))
    if K == 0:
        raise ModuleInputError(f"{who}: K=0: A and B hold nothing to multiply; pass K > 0 (a multiple of 16)")
    if K % 16 or N % 16:
        raise ModuleInputError(f"{who}: K={K} and N={N} must be multiples of 16 (torch._scaled_mm's rule and TMA's "
                               "16-byte rows); pad them with zeros")
    if M > 1 and A.stride() != (K, 1):
        raise ModuleInputError(f"{who}: A must be row-major [M, K] (strides ({K}, 1), got {A.stride()}): "
                               "pass A.contiguous()")
    if N > 1 and B.stride() != (1, K):
        raise ModuleInputError(f"{who}: B must be [K, N] column-major, the .t() of a row-major [N, K] W (strides "
                               f"(1, {K}), got {B.stride()}): {MN_MAJOR_FP8_FIX}, then pass its .t()")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise ModuleInputError(f"{who}: {name} is {t.dtype}; scales are torch.float32 ({name}.float())")
    recipe = _recipe(scale_a, scale_b, M, N, K)
    _check_scale_layouts(scale_a, scale_b, recipe, who)
    out_dtype = out_dtype or torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ModuleInputError(f"{who}: out_dtype {out_dtype}; use torch.bfloat16, torch.float16 or torch.float32")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (N,):
            raise ModuleInputError(f"{who}: bias must be a torch.Tensor of shape [{N}] (one value per column)")
        if bias.dtype not in (out_dtype, torch.float32):
            raise ModuleInputError(f"{who}: bias is {bias.dtype}; pass it in out_dtype ({out_dtype}) or torch.float32")
        if not bias.is_contiguous():
            raise ModuleInputError(f"{who}: bias is not contiguous; pass bias.contiguous()")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != out_dtype:
            raise ModuleInputError(f"{who}: out must be a [{M}, {N}] {out_dtype} tensor")
        if not out.is_contiguous():
            raise ModuleInputError(f"{who}: out is not contiguous; pass a contiguous out (or none)")
    devices = {t.device for t in (A, B, scale_a, scale_b, bias, out) if t is not None}
    if len(devices) > 1:
        raise ModuleInputError(f"{who}: the tensors are on {sorted(map(str, devices))}; put all on one GPU")
    spec = None
    if out_dtype != torch.float32:
        spec = GemmSpec.fp8(_name(out_dtype), recipe, None if bias is None else _name(bias.dtype),
                            b="float8_e5m2" if B.dtype == torch.float8_e5m2 else "float8_e4m3")
    return Call(M, N, K, recipe, spec)


_CHECKED: dict = {}  # a call's layout (checked_call's signature) -> its Call, for layouts that passed check_call
CHECKED_MAX = 4096  # layouts remembered before the table starts over (a server sees a few per weight)


def _layout(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def checked_call(A, B, scale_a, scale_b, bias=None, out_dtype=None, out=None) -> Call:
    """:func:`check_call`, remembered by what it reads: each tensor's shape, strides, dtype and
    device, and ``out_dtype`` (it reads no data and no address). A layout that passed once takes a
    dictionary lookup instead of the checks (half of a small call's host time, profiled on an H100:
    ``benchmarks/results/2026-11-27_h100_fp8_block_staged_halves/``); a layout that fails is never
    remembered, and anything without a tensor's attributes goes through the checks (and their error).
    Hand-written rather than ``functools.lru_cache``: tensors are not hashable by their layout."""
    try:
        key = (_layout(A), _layout(B), _layout(scale_a), _layout(scale_b), _layout(bias), _layout(out), out_dtype)
    except (AttributeError, TypeError):  # not a tensor: check_call says which
        return check_call(A, B, scale_a, scale_b, bias, out_dtype, out)
    call = _CHECKED.get(key)
    if call is None:
        call = check_call(A, B, scale_a, scale_b, bias, out_dtype, out)
        if len(_CHECKED) >= CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = call
    return call


# -- where the kernel comes from ----------------------------------------------------------------------
def use_module(path_or_module):
    """Serve the fp8 calls ``path_or_module`` (an exported module or a loaded one) fits, before
    anything else; returns the loaded module."""
    mod = load(path_or_module) if not hasattr(path_or_module, "spec") else path_or_module
    if not mod.spec.is_fp8:
        raise ModuleInputError(f"{getattr(mod, 'path', mod)} is no fp8 module (its spec: {mod.spec.text()})")
    with _LOCK:
        _MODULES.insert(0, mod)
        _ROUTES.clear()
        _forget_repeats()
    return mod


def reset() -> None:
    """Forget every registered module, choice, repeated call and warning."""
    with _LOCK:
        _MODULES.clear()
        _ROUTES.clear()
        _WARNED.clear()
        _LOADED.clear()
        _forget_repeats()


class TorchScaledMM:
    """``torch._scaled_mm`` in a module's place (A [M, K], B as [N, K] rows, the spec's operands):
    the fallback where no kernel of ours serves a call. An fp32 bias is added in fp32 before the
    rounding, as our kernel does (torch takes a bias in out_dtype). Block scales come as the kernel
    takes them (scale_a [K/128, M], scale_b [N/128, K/128]): with ``torch_block`` (this torch runs them
    on the GPU, :func:`torch_runs_block`) and no bias, torch's block-wise kernel on their transposes
    (its own layouts); else the dequantized inputs' product in fp32."""

    def __init__(self, recipe: str, out_dtype, torch_block: bool = False):
        self.recipe, self.out_dtype, self.torch_block = recipe, out_dtype, torch_block

    def __call__(self, a, b_nk, out=None, scale_a=None, scale_b=None, bias=None):
        import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

        M, N = a.shape[0], b_nk.shape[0]
        if self.recipe == "block" and self.torch_block and bias is None:
            if out is None:
                return torch._scaled_mm(a, b_nk.t(), scale_a.t(), scale_b.t(), out_dtype=self.out_dtype)
            return torch._scaled_mm(a, b_nk.t(), scale_a.t(), scale_b.t(), out_dtype=self.out_dtype, out=out)
        if self.recipe == "block":
            d = dequantize(a, scale_a.t()) @ dequantize(b_nk, scale_b, (BLOCK, BLOCK)).t()
            d = (d if bias is None else d + bias.float()).to(self.out_dtype)
            return d if out is None else out.copy_(d)
        sa, sb = (scale_a.reshape(M, 1), scale_b.reshape(1, N)) if self.recipe == "row" else (scale_a, scale_b)
        if bias is not None and bias.dtype == torch.float32 and self.out_dtype != torch.float32:
            d = (torch._scaled_mm(a, b_nk.t(), sa, sb, out_dtype=torch.float32) + bias).to(self.out_dtype)
            return d if out is None else out.copy_(d)
        if out is None:
            return torch._scaled_mm(a, b_nk.t(), sa, sb, bias=bias, out_dtype=self.out_dtype)
        # straight into out (_scaled_mm.out): a copy after it would cost torch's candidate a second kernel at first use
        return torch._scaled_mm(a, b_nk.t(), sa, sb, bias=bias, out_dtype=self.out_dtype, out=out)


def _fits(mod, call: Call) -> bool:
    return (mod.spec == call.spec and mod.N == call.N and mod.K == call.K
            and (mod.dynamic_m or mod.M == call.M))


def build_job(call: Call, arch: str) -> tuple[str, dict, dict]:
    """The module :func:`scaled_mm` builds for ``call``: the policy's fp8 kernel (``plan.fp8_policy``: the
    tuning database's entry for the spec and bucket, else ``plan.FP8_RULES``' v9, or v10 where it splits
    K) with M at run time, as ``pack build`` plans it, so a pack's module and a build here are one entry
    of the module cache. (rung, the policy's knobs, the build's knobs.)"""
    return _job(call, arch)[:3]


def _job(call: Call, arch: str) -> tuple[str, dict, dict, str]:
    """:func:`build_job`'s, and what chose the knobs (for explain)."""
    rung, chosen, by = _policy(call)
    return rung, chosen, {**chosen, "spec": call.spec.text(), "dtype": call.spec.d, "arch": arch,
                          "dynamic_m": True}, by


def pack_command(call: Call) -> str:
    """How to get a module for ``call``'s weight (every M) where nothing can be built: the ``pack
    build`` that makes one, or what to change first where no pack request builds its spec (an fp32
    bias, an e5m2 B)."""
    if call.spec.bias not in (None, call.spec.d) or call.spec.b != FP8_INPUT:
        return (f"kernel packs hold fp8 modules with A and B in {FP8_INPUT} and a bias in out_dtype only: pass B "
                f"in e4m3 and the bias as bias.to(torch.{call.spec.d}) for a pack to serve this call")
    bias = " --epilogue bias" if call.spec.bias else ""
    return (f"on a box with TVM's compiler: python -m gemm_ladder pack build --weights {call.N}x{call.K} --dtypes "
            f"{FP8_INPUT} --fp8-scales {call.recipe} --fp8-out {call.spec.d}{bias} --out PACK, then carry PACK here "
            "and set GEMM_LADDER_PACK=PACK")


def _from_packs(call: Call, arch: str, strict: bool, out_dtype, torch_block: bool = False
                ) -> tuple[Route | None, list[str]]:
    """The first kernel pack module of the call's spec, N and K that computes its M as it is (a
    runtime-M module whose 32-bit indices take M, or one built for this M: A is not padded here),
    with torch beside it for the first call's timing (:func:`_offer_torch`), and notes on the modules
    passed over."""
    notes = []
    for pack in packs():
        found = pack.find(call.M, call.N, call.K, call.spec.d, arch, call.spec)
        if found is None:
            continue
        e = found.entry
        if found.fit == "pad-m":
            notes.append(f"{e['file']} is built for M={e['shape'][0]}, not {call.M} (scaled_mm pads no A)")
            continue
        if e["dynamic_m"] and call.M > (most := max_m_of(call.N, call.K, e["knobs"])):
            notes.append(f"{e['file']} reads M as a 32-bit index and serves M <= {most}")
            continue
        path = found.pack.check_entry(e)
        key = str(path.resolve())
        if key not in _LOADED:
            _LOADED[key] = load(path)
        choice = e.get("choice") or {}
        by = f"rule {choice['rule']!r}" if choice.get("rule") else "not recorded"
        lines = [f"kernel: {e['rung']} fp8 ({call.spec.text()})" + (" [M at run time]" if e["dynamic_m"] else ""),
                 f"chosen by: {by}, when the pack was built: {choice.get('why', 'not recorded')}",
                 f"source: {found.describe()}"]
        route = Route(_LOADED[key], None if e["dynamic_m"] else e["shape"][0], "kernel pack", e["rung"],
                      dict(e["knobs"]), lines)
        return _offer_torch(route, e["so_sha256"], call, strict, out_dtype, torch_block), notes
    return None, notes


def _policy(call: Call) -> tuple[str, dict, str]:
    """The policy's fp8 rung and knobs for ``call``, and what chose them (``plan.fp8_policy``): asked only
    where a module is built (``plan`` imports the rungs, which a runtime-only box does not have)."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from . import plan  # pylint: disable=import-outside-toplevel

    return plan.fp8_policy(call.M, call.N, call.K, call.recipe, call.spec.bias)


def _build(call: Call, arch: str, strict: bool, out_dtype, torch_block: bool = False) -> Route:
    """The policy's module for ``call`` from the module cache, or built into it now, with torch beside it
    for the first call's timing (:func:`_offer_torch`)."""
    rung, _, knobs, by = _job(call, arch)
    path, how = cached_module((rung, (call.M, call.N, call.K), knobs))
    source = {"cache": "module cache", "built": "fresh build"}[how]
    route = Route(load(path), None, source, rung, knobs,
                  [f"kernel: {rung} fp8 ({call.spec.text()}) [M at run time]",
                   f"chosen by: {by}",
                   f"source: {source} {path}"])
    return _offer_torch(route, sha256_of(path), call, strict, out_dtype, torch_block)


def _resolve(call: Call, index: int, strict: bool, out_dtype) -> Route:
    arch = device.arch_of(index)
    torch_block = call.recipe == "block" and torch_runs_block(index)
    why = "out_dtype float32 is not built (bfloat16 or float16 are)" if call.spec is None else None
    if why is None:
        for mod in _MODULES:
            if _fits(mod, call):
                return Route(mod, None if mod.dynamic_m else mod.M, "use_module", mod.rung, {},
                             [f"kernel: {mod.rung} fp8 ({call.spec.text()})", f"source: use_module {mod.path}"])
        route, notes = _from_packs(call, arch, strict, out_dtype, torch_block)
        if route is not None:
            return route
        why = why_no_build()
        if why is None:
            return _build(call, arch, strict, out_dtype, torch_block)
        where = ", ".join(str(p.folder) for p in packs()) or "none ($GEMM_LADDER_PACK is not set)"
        passed = f"; passed over: {'; '.join(notes)}" if notes else ""
        why = (f"no module given to use_module and no kernel pack (packs: {where}) serves it{passed}, and nothing "
               f"can be built here ({why})")
    what = f"M={call.M} N={call.N} K={call.K} fp8 {call.recipe}"
    how = "" if call.spec is None else f"; {pack_command(call)}"
    if strict:
        raise NoKernelError(f"gemm_ladder.scaled_mm {what}: {why}{how}")
    if (call.M, call.N, call.K, call.recipe) not in _WARNED:
        _WARNED.add((call.M, call.N, call.K, call.recipe))
        warnings.warn(f"gemm_ladder.scaled_mm {what}: torch._scaled_mm computes it: {why}{how}",
                      KernelFallbackWarning, stacklevel=3)
    return Route(TorchScaledMM(call.recipe, out_dtype, torch_block), None, "torch", "torch._scaled_mm", {},
                 ["kernel: torch._scaled_mm", f"why: {why}"] + ([f"how: {how[2:]}"] if how else []))


# -- the measured choice at first use -----------------------------------------------------------------
TORCH_RECIPES = ("tensor", "row")  # torch._scaled_mm's own kernels (cuBLASLt; rowwise CUTLASS) on sm_90
_TORCH_BLOCK: dict = {}  # GPU index -> whether this torch's _scaled_mm runs block scales there (torch_runs_block)


def torch_runs_block(index: int) -> bool:
    """Whether this torch's ``_scaled_mm`` runs block-wise scales (A's 1x128 groups, B's 128x128
    blocks) on GPU ``index``: one 128x128x256 call (K of two groups: no scale shape a rowwise call
    would also have), asked once per GPU, never inside a CUDA-graph capture: the probe would join the
    caller's graph, so there it answers False without remembering (a shape first resolved there is
    not offered torch's kernel; the next shape resolved eagerly asks).
    Torch 2.11 with CUDA 13 runs them on the H200 box (cuBLASLt's block scaling: 0.75-1.43x our kernels,
    ``benchmarks/results/2026-11-29_h200_fp8_block_deepgemm/``); where it raises, or there is no GPU,
    False."""
    if index not in _TORCH_BLOCK:
        import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

        try:
            if torch.cuda.is_current_stream_capturing():
                return False
        except Exception:  # pylint: disable=broad-except  (no CUDA here: no GPU to ask)
            _TORCH_BLOCK[index] = False
            return False

        def probe():
            import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

            dev = torch.device("cuda", index)
            a = torch.zeros(BLOCK, 2 * BLOCK, device=dev).to(torch.float8_e4m3fn)  # A and W: [128, 256]
            scale_a = torch.ones(2, BLOCK, device=dev).t()  # [M, K/128], M-major
            scale_b = torch.ones(1, 2, device=dev).t()  # the .t() of a row-major [N/128, K/128]
            torch._scaled_mm(a, a.t(), scale_a, scale_b, out_dtype=torch.bfloat16)
            torch.cuda.synchronize(dev)
            return True

        try:
            _TORCH_BLOCK[index] = bool(outside_graph_pools(probe, index))
        except Exception:  # pylint: disable=broad-except  (refused by this torch or cuBLASLt, or no GPU: not offered)
            _TORCH_BLOCK[index] = False
    return _TORCH_BLOCK[index]


def _offer_torch(route: Route, sha256: str, call: Call, strict: bool, out_dtype, torch_block: bool = False) -> Route:
    """``route`` (a pack's module or one built here, whose file has ``sha256``) with torch._scaled_mm
    beside it as the candidates of the first call's timing (``first_use``), where torch has a kernel of
    its own for the recipe (block scales: where ``torch_block`` says this torch runs them on the GPU,
    :func:`torch_runs_block`, and the call has no bias, whose stand-in would be a float32 product) and
    the call is not strict."""
    block_ok = call.recipe == "block" and torch_block and call.spec is not None and call.spec.bias is None
    if strict or (call.recipe not in TORCH_RECIPES and not block_ok):
        return route
    lines = ["kernel: torch._scaled_mm", f"why: at first use on this GPU it ran {call.M}x{call.N}x{call.K} "
             f"({call.recipe} scales) faster than our kernel (gemm_ladder is never slower than the library it replaces)",
             "source: torch (strict=True or GEMM_LADDER_STRICT=1 keeps ours)"]
    route.candidates = {
        route.rung: (sha256, lambda: route),
        first_use.TORCH: (first_use.TORCH, lambda: Route(TorchScaledMM(call.recipe, out_dtype, block_ok), None,
                                                         "torch, measured faster", "torch._scaled_mm", {}, lines))}
    return route


# Eager calls take torch._scaled_mm only where its whole calls timed this much faster than ours: its host path
# is 35-48 us a call on an H100 (cuBLASLt's heuristics asked every call; benchmarks/results/2026-11-28_h100_fp8_fill/
# torch_host.txt), which the front door's own path adds to. At 4954eac, first use took torch on a near tie as calls
# (42.8 against 40.6 us at 1024x2112x7168, 114.5 against 113.3 at 4096x2112x7168) decided by its faster kernel, and
# the suite's calls then ran 0.68x and 0.76x torch's own against ours at 0.86x and 0.96x (the suite's README).
TORCH_EAGER_EDGE = 1.10


def _eager_pick(times: dict) -> str:
    """The eager calls' winner of the whole calls' ``times`` (label -> us): torch where it was
    TORCH_EAGER_EDGE times faster than our kernel, else ours (under capture the kernels decide alone)."""
    ours = min((label for label in times if label != first_use.TORCH), key=times.get)
    torch_us = times.get(first_use.TORCH)
    return first_use.TORCH if torch_us is not None and torch_us * TORCH_EAGER_EDGE < times[ours] else ours


def _settle(route: Route, call: Call, A, B, scale_a, scale_b, bias, index: int, out_dtype) -> None:
    """Time our kernel against torch._scaled_mm (:func:`_offer_torch`) on the call's A and B (``B`` as the
    caller passes it, [K, N] column-major) and copies of them that spill L2 (``first_use.input_sets``; the
    scales and bias as given), into scratch outputs, as queued calls and as kernels replayed from CUDA
    graphs, and make the route the winners (``Route.adopt``: eagerly torch where its calls were
    TORCH_EAGER_EDGE times faster, :func:`_eager_pick`; under capture the faster kernel), or take the
    winners remembered for this GPU, shape, spec and module (``first_use.remembered``). Each candidate is
    timed the whole way a call takes it (``checked_call``, then :func:`_launch`): torch's _scaled_mm costs
    the host more than our module's launch, and timed as launches alone it won first use at shapes where,
    through the front door, its calls then ran 1.2-1.5x slower than ours (the fp8 suite at f821a15,
    ``benchmarks/results/2026-11-28_h100_fp8_suite/``). Nothing is timed inside CUDA-graph
    capture or with GEMM_LADDER_MEASURE=0 (the kernel serves, the candidates kept for a later eager call)."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    with _LOCK:
        cands = route.candidates
        if not cands or not first_use.enabled() or not first_use.can_measure(A):
            return
        ids = {label: ident for label, (ident, _) in cands.items()}
        gpu = device.name_of(index)
        key = first_use.key_of(gpu, call.M, call.N, call.K, ids, call.spec.text())
        known = first_use.remembered(key, ids)
        routes = {label: make() for label, (_, make) in cands.items()}
        if known is not None:
            route.adopt(routes[known[0]], routes[known[1]], f"chosen at an earlier first use on {gpu} (remembered in "
                                                            f"{first_use.choices_path()})")
            return

        def whole_call(r):
            def run(x, y_nk, z):  # the input sets hold B as [N, K] rows: the caller's B is its transpose
                checked_call(x, y_nk.t(), scale_a, scale_b, bias, out_dtype, z)
                _launch(r, call, x, y_nk.t(), scale_a, scale_b, bias, z)
            return run

        def measure():  # on a helper thread: its scratch tensors and graphs stay out of any CUDA graph's pool
            d = torch.empty((call.M, call.N), dtype=out_dtype, device=A.device)
            sets = first_use.input_sets(A, B.t(), d, _l2_bytes(index))
            calls = {label: whole_call(r) for label, r in routes.items()}
            for fn in calls.values():
                fn(*sets[0])
            times = first_use.time_launches(calls, sets)
            return times, first_use.time_graphs(calls, sets, times)

        times, kernel_times = outside_graph_pools(measure, index)
        eager = _eager_pick(times)
        graphs = first_use.pick(kernel_times or times, graphs=bool(kernel_times))
        first_use.remember(key, ids[eager], ids[graphs])
        route.adopt(routes[eager], routes[graphs], first_use.measured_note(gpu, times, kernel_times, eager, graphs))


def route_of(call: Call, index: int, strict: bool, out_dtype) -> Route:
    """The route of ``call`` on GPU ``index`` (:func:`_resolve`), remembered per call and per the
    packs looked in: a pack added since (``use_pack``) is looked in."""
    key = (call, index, strict, out_dtype, tuple(packs()))  # the packs themselves (by identity)
    route = _ROUTES.get(key)
    if route is None:
        with _LOCK:
            route = _ROUTES.setdefault(key, _resolve(call, index, strict, out_dtype))
    return route


def scaled_mm(A, B, scale_a, scale_b, *, bias=None, out_dtype=None, out=None, explain: bool = False,
              strict: bool | None = None):
    """``D = A @ B * scale_a * scale_b (+ bias)`` as ``torch._scaled_mm`` (see the module docstring);
    ``explain=True`` returns ``(D, lines)`` saying which kernel ran, from where and why. A call like
    one already checked takes :func:`_repeat` (its layout's checks are not made again)."""
    if not explain:
        done = _repeat(A, B, scale_a, scale_b, bias, out, out_dtype, strict)
        if done is not None:
            return done
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    given = (out_dtype, strict)  # the repeated call's key takes them as passed
    out_dtype = out_dtype or torch.bfloat16
    call = checked_call(A, B, scale_a, scale_b, bias, out_dtype, out)
    _require_gpu(A)
    grad = _grad_wanted(A, B, scale_a, scale_b, bias, out)
    _check_apart(A, B, scale_a, scale_b, bias, out)
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    strict = _strict(strict)
    route = route_of(call, index, strict, out_dtype)
    D = out if out is not None else torch.empty((call.M, call.N), dtype=out_dtype, device=A.device)
    if call.M == 0 or call.N == 0:  # nothing to compute (no kernel takes an empty launch)
        return (D, ["kernel: none (an empty D)"]) if explain else D
    if route.candidates:
        _settle(route, call, A, B, scale_a, scale_b, bias, index, out_dtype)
    if grad:
        with torch.no_grad():
            moved = _launch(route, call, A, B, scale_a, scale_b, bias, D)
        D = _no_backward(D, A, B, scale_a, scale_b, bias)
    else:
        moved = _launch(route, call, A, B, scale_a, scale_b, bias, D)
        if not moved:  # the scales were used as they lie: a call like this one repeats the launch
            _remember(route, call, A, B, scale_a, scale_b, bias, out, given, D)
    return (D, list(route.lines) + moved) if explain else D


def _require_gpu(A) -> None:
    if A.device.type != "cuda":
        raise ModuleInputError(f"gemm_ladder.scaled_mm: A is on {A.device}; move the tensors to the GPU (.cuda())")


def _grad_wanted(A, B, scale_a, scale_b, bias, out) -> bool:
    """Whether autograd records this call (an input wants grad, grad mode on): then D is returned
    with a backward that refuses (:func:`_no_backward`), as ``torch._scaled_mm``'s does (it has no
    derivative), rather than detached, which would drop the gradient silently; ``out`` is refused,
    as torch refuses ``out=`` under autograd."""
    wants = any(t is not None and t.requires_grad for t in (A, B, scale_a, scale_b, bias, out))
    if not (wants and _grad_enabled()):
        return False
    if out is not None:
        raise ModuleInputError("gemm_ladder.scaled_mm: out= does not take autograd (an input or out requires grad): "
                               "call it under torch.no_grad(), or pass out=None")
    return True


_NO_BACKWARD: dict = {}  # the autograd.Function, made at the first call that wants grad (torch imported then)


def _no_backward(D, *inputs):
    """``D`` on autograd's tape with a backward that raises: ``scaled_mm`` has no derivative (fp8
    training's gradient recipes, e5m2 and the transposed operands, are not built), as
    ``torch._scaled_mm`` has none; a backward that reaches it says so instead of a gradient that
    silently stops here."""
    fn = _NO_BACKWARD.get("fn")
    if fn is None:
        import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

        class NoBackward(torch.autograd.Function):  # pylint: disable=abstract-method
            @staticmethod
            def forward(ctx, d, *_):  # pylint: disable=arguments-differ
                return d

            @staticmethod
            def backward(ctx, *_):  # pylint: disable=arguments-differ
                raise RuntimeError("gemm_ladder.scaled_mm has no backward (as torch._scaled_mm has none): compute "
                                   "the gradients in bf16 (gemm_ladder.matmul), or call scaled_mm under "
                                   "torch.no_grad() on detached inputs")

        fn = _NO_BACKWARD["fn"] = NoBackward.apply
    return fn(D, *[t for t in inputs if t is not None])


def _check_apart(A, B, scale_a, scale_b, bias, out) -> None:
    """``out`` must share no byte with what the kernel reads (A, B, the scales, the bias): it
    writes D while it still reads them."""
    if out is None:
        return
    read = [(t.data_ptr(), t.nbytes) for t in (A, B, scale_a, scale_b, bias) if t is not None]
    if not _apart(out.data_ptr(), out.nbytes, read):
        raise ModuleInputError("gemm_ladder.scaled_mm: out overlaps A, B, a scale or the bias, which the kernel reads "
                               "while it writes out: pass a separate out (or none)")


# -- the repeated call --------------------------------------------------------------------------------
# A call whose layout was checked once (everything :func:`check_call` reads, and out_dtype and strict as
# passed) and whose route needs nothing more (settled, the scales used as they lie) is remembered with
# its launch: a later call like it makes the key and the checks that depend on addresses and grad again,
# and launches. On the H200 box a per-tensor call's host time was 34-40 us through the checked path, 18-26 us
# through this lookup, 12-15 us through the C++ table's, against 17-24 us for torch._scaled_mm
# (benchmarks/results/2026-11-29_h200_fp8_host/).
_FAST: dict = {}
_IN_NATIVE: set = set()  # _FAST's keys the C++ table (fastpath.cpp's scaled_lookup) holds too
_NATIVE: dict = {"module": None}


def _fast_key(A, B, scale_a, scale_b, bias, out, out_dtype, strict):
    """A call's layout for :data:`_FAST` (None where an argument is no tensor: the checked path says
    what it must be); ``fastpath.cpp``'s ``make_scaled_key`` makes its own from the tensors' C++ fields."""
    try:
        key = (A.shape, A.stride(), A.dtype, A.device, B.shape, B.stride(), B.dtype, B.device,
               scale_a.shape, scale_a.stride(), scale_a.dtype, scale_a.device,
               scale_b.shape, scale_b.stride(), scale_b.dtype, scale_b.device, out_dtype, strict)
        if bias is not None:
            key += (bias.shape, bias.stride(), bias.dtype, bias.device)
        if out is not None:
            key += ("out", out.shape, out.stride(), out.dtype, out.device)
        return key
    except (AttributeError, TypeError):
        return None


class Repeat(NamedTuple):
    """What a repeated call needs of its checked one: the route's bound launch, D's shape and dtype,
    whether the scales are block's (passed transposed, as they lie) and the bytes of A, B and D."""

    launch: object
    M: int
    N: int
    d_dtype: object
    block: bool
    a_bytes: int
    b_bytes: int
    d_bytes: int


def _remember(route: Route, call: Call, A, B, scale_a, scale_b, bias, out, given, D) -> None:
    """After a checked call (into ``D``): later calls like it take :func:`_repeat`, where the route is
    settled (no first-use timing left) and launched on A's GPU (``Route.run``'s launcher); the C++
    table holds it too once it is loaded."""
    launch = route.launchers.get(A.device.index)
    key = _fast_key(A, B, scale_a, scale_b, bias, out, *given)
    if route.candidates or launch is None or key is None:
        return
    hit = Repeat(launch, call.M, call.N, D.dtype, call.recipe == "block", A.nbytes, B.nbytes, D.nbytes)
    table = native_table()  # outside the lock: with GEMM_LADDER_NATIVE=build it may compile first
    with _LOCK:
        _FAST[key] = hit
        _NATIVE["module"] = table
    _to_native(key, hit, A, B, scale_a, scale_b, bias, out, given)


def _to_native(key, hit: Repeat, A, B, scale_a, scale_b, bias, out, given) -> None:
    """Put a remembered call in the C++ table (made with these tensors: the key is made there)."""
    module = _NATIVE["module"]
    if module is None:
        return
    with _LOCK:
        if module.scaled_remember(A, B, scale_a, scale_b, bias, out, *given, hit.launch, hit.M, hit.N, hit.d_dtype,
                                  hit.block, hit.a_bytes, hit.b_bytes, hit.d_bytes):
            _IN_NATIVE.add(key)


def _repeat(A, B, scale_a, scale_b, bias, out, out_dtype, strict):
    """D of a call like one remembered (:func:`_remember`), or None: then the checked path runs (and
    says what is wrong, if anything). The C++ table answers first where it is loaded; what it passes
    over (tensor subclasses, a torch function or dispatch mode, a call remembered before it loaded)
    comes here."""
    module = _NATIVE["module"]
    if module is not None:
        done = module.scaled_lookup(A, B, scale_a, scale_b, bias, out, out_dtype, strict)
        if done is not None:
            return done
    key = _fast_key(A, B, scale_a, scale_b, bias, out, out_dtype, strict)
    hit = _FAST.get(key) if key is not None else None
    if hit is None:
        return None
    if module is None:  # the C++ table may have loaded since (built on a helper thread)
        module = _NATIVE["module"] = native_table()
    if module is not None and key not in _IN_NATIVE:
        _to_native(key, hit, A, B, scale_a, scale_b, bias, out, (out_dtype, strict))
    return _run_repeat(hit, A, B, scale_a, scale_b, bias, out)


def _run_repeat(hit: Repeat, A, B, scale_a, scale_b, bias, out):
    """A remembered call's launch after the checks its key does not settle (``fastpath.cpp``'s
    ``scaled_passes`` makes the same): no grad wanted, block scales 16-byte aligned (the checked
    path copies them), ``out`` apart from what the kernel reads; else None."""
    if any(t is not None and t.requires_grad for t in (A, B, scale_a, scale_b, bias, out)) and _grad_enabled():
        return None
    if hit.block:  # as they lie: scale_a [K/128, M], scale_b [N/128, K/128]
        scale_a, scale_b = scale_a.t(), scale_b.t()
        if (scale_a.data_ptr() | scale_b.data_ptr()) & 15:
            return None
    else:  # the kernel takes vectors: [] and [1, 1] as [1], [M, 1] as [M], [1, N] as [N]
        scale_a = scale_a if scale_a.dim() == 1 else scale_a.reshape(-1)
        scale_b = scale_b if scale_b.dim() == 1 else scale_b.reshape(-1)
    extras = (scale_a, scale_b) if bias is None else (bias, scale_a, scale_b)
    if out is None:
        d = A.new_empty(hit.M, hit.N, dtype=hit.d_dtype)
    else:
        read = [(A.data_ptr(), hit.a_bytes), (B.data_ptr(), hit.b_bytes), (scale_a.data_ptr(), scale_a.nbytes),
                (scale_b.data_ptr(), scale_b.nbytes)] + ([] if bias is None else [(bias.data_ptr(), bias.nbytes)])
        if not _apart(out.data_ptr(), hit.d_bytes, read):
            return None
        d = out
    hit.launch(A, B.t(), d, *extras)
    return d


def _forget_repeats() -> None:
    """Forget the remembered calls, in both tables (the front door's packs or C++ table changed)."""
    with _LOCK:
        _FAST.clear()
        _IN_NATIVE.clear()
        if _NATIVE["module"] is not None:
            _NATIVE["module"].scaled_clear()
        _NATIVE["module"] = None


on_forget(_forget_repeats)


def _launch(route: Route, call: Call, A, B, scale_a, scale_b, bias, D) -> list[str]:
    """``route``'s module on the checked call's tensors into D, its operands in the spec's order (bias,
    scale_a, scale_b); the explain lines of the scales copied on the way."""
    operands = {}
    if bias is not None:
        operands["bias"] = bias
    moved = []
    if call.recipe == "block":  # as they lie: scale_a [K/128, M], scale_b [N/128, K/128] (spec.epilogue_operands)
        (operands["scale_a"], operands["scale_b"]), moved = aligned_scales(scale_a.t(), scale_b.t())
    else:
        operands["scale_a"], operands["scale_b"] = scale_a.reshape(-1), scale_b.reshape(-1)
    route.run(A, B.t(), D, operands)
    return moved


SCALE_ALIGN_BYTES = 16  # TMA's and cp.async.bulk's global address alignment (a block module's staged scales)


def aligned_scales(*scales) -> tuple[list, list[str]]:
    """Block scales as the kernel takes them, each copied where its first float is not 16-byte
    aligned (a view into a larger tensor): a module with ``stage_scales`` reads them with TMA, whose
    tensor maps need a 16-byte aligned start (any M works: the maps are one-dimensional, no row
    stride to pad), or with ``stage_bulk`` by plain bulk copies, whose source must be 16-byte aligned. Scales are a few floats a row, the copy small. Returns the tensors and the
    explain lines of the copies."""
    out, lines = [], []
    for name, t in zip(("scale_a", "scale_b"), scales):
        if t.data_ptr() % SCALE_ALIGN_BYTES:
            lines.append(f"copied: {name} starts {t.data_ptr() % SCALE_ALIGN_BYTES} bytes past a "
                         f"{SCALE_ALIGN_BYTES}-byte boundary (a view into a larger tensor); TMA reads scales from an "
                         "aligned start")
            t = t.clone()
        out.append(t)
    return out, lines
