"""``gemm_ladder.scaled_grouped_mm``: the grouped GEMM over experts in fp8 (e4m3) with rowwise scales.

    import gemm_ladder
    from gemm_ladder.serve.grouped_fp8 import quantize_experts
    Aq, sa = gemm_ladder.quantize_fp8(A, "row")           # A [M, K] bf16 -> e4m3 [M, K], scale [M, 1]
    Wq, sw = quantize_experts(W)                           # W [E, N, K] bf16 -> e4m3, scale [E, N]
    D = gemm_ladder.scaled_grouped_mm(Aq, Wq, sa.view(-1), sw, offs)   # D [M, N] bf16
    D = gemm_ladder.scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa.view(-1), sw, offs)  # torch's mat_b view
    import gemm_ladder.serve.grouped_ops        # torch.ops.gemm_ladder.scaled_grouped_mm (torch.compile)

    D[m, n] = round(scale_a[m] * scale_b[e, n] * sum_k A[m, k] W[e, n, k])   for m in [offs[e-1], offs[e])

Semantics: ``torch._scaled_grouped_mm(A, W.transpose(1, 2), scale_a, scale_b, offs=offs,
out_dtype=torch.bfloat16)`` for the case the two share (2-d A, 3-d weights, rowwise fp32 scales).
A ``[M, K]`` float8_e4m3fn row-major, tokens sorted by expert; W either ``[E, N, K]`` row-major
(each expert's ``nn.Linear.weight`` stacked, as :func:`gemm_ladder.grouped_mm` takes it) or torch's
``mat_b``, the ``[E, K, N]`` column-major view of that tensor (``W.transpose(1, 2)``: taken as it
lies, no copy; both are the same memory, the layout fp8 wgmma reads: K-major); ``scale_a`` ``[M]``
(or ``[M, 1]``) fp32, one a token; ``scale_b`` ``[E, N]`` fp32, one an expert's output column;
``offs`` ``[E]`` int32 on the GPU, the cumulative END row of each expert (``torch._grouped_mm``'s);
D ``[M, N]`` in bfloat16 (torch's only out_dtype here) or float16. Rows past ``offs[-1]`` are not
written. The kernel is v12 (``sm90a/grouped.py``) with the dense fp8 path's parts: e4m3 wgmma at
k32, the promotion of the tensor cores' sums into fp32 every 128 of K (``sm90a/fp8.py``), and the
token's and the column's scales multiplied into the fp32 sums before the rounding.

Refused, with the fix (:func:`check_call`): e5m2 operands (torch's grouped fp8 takes e4m3 only), a
contiguous ``[E, K, N]`` W (MN-major: fp8 wgmma reads K-major only; pass ``[E, N, K]``), per-tensor
or block scales (quantize rowwise: :func:`quantize_experts`), a bias, out_dtype float32, 3-d A (the
masked layout in fp8 is not built), K not a multiple of 16 or N of 8 (TMA's 16-byte rows),
non-contiguous scales, gradients, an ``out`` that overlaps an input, tensors on two devices.
The VALUES of ``offs`` are not read (a host sync; the kernel clamps them: see ``serve/grouped.py``).

Where the kernel comes from, first that serves: a module registered with
:func:`use_scaled_grouped_module` (v12 built with ``spec=`` :func:`spec_of`, e.g.
``gemm_ladder.build('v12', 4096, N, K, experts=E, spec=spec_of('bfloat16'))``); a kernel pack's
(``pack build --grouped E,N,K --dtypes float8_e4m3``: ``plan.grouped_choices`` at blk_k = 128, by the
token count); else ``torch._scaled_grouped_mm`` (or, where this torch or GPU refuses it, the
dequantized product per expert in fp32: a host sync) with a ``KernelFallbackWarning``;
``strict=True`` (or ``GEMM_LADDER_STRICT=1``) raises ``NoKernelError`` instead.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

from ..core.spec import GemmSpec
from .front import STRICT_ENV, KernelFallbackWarning, NoKernelError, _strict
from .grouped import arch_at, check_offsets, from_packs, pack_lines
from .kernel_pack import FP8_INPUT, Found, fp8_grouped_dtype
from .runtime import ModuleInputError, load
from .scaled import FP8_MAX, AMAX_FLOOR

RUNG = "v12"
BUILD_M = 4096  # the M a module is built at (its knobs are validated there; M is read at run time)
OUT_DTYPES = ("bfloat16", "float16")  # D's dtypes the kernel builds (torch's grouped fp8: bfloat16)
WHO = "gemm_ladder.scaled_grouped_mm"
_REGISTERED: dict = {}  # (E, N, K, out dtype, arch) -> ScaledGroupedModule
_FROM_PACKS: dict = {}  # a pack module's path -> ScaledGroupedModule
_ROUTES: dict = {}  # (E, N, K, out dtype, index, strict, the pack module found) -> Route


def spec_of(out_dtype: str = "bfloat16") -> GemmSpec:
    """The operand spec of the grouped fp8 GEMM with D in ``out_dtype``: e4m3 A and W, rowwise scales."""
    return GemmSpec(a=FP8_INPUT, b=FP8_INPUT, d=out_dtype, scales="row", grouped=True)


def pack_dtype(out_dtype: str) -> str:
    """The ``dtype`` a kernel pack files a grouped fp8 module under: ``float8_e4m3`` for bf16 D (the
    dense fp8 packs' word; ``pack build --grouped E,N,K --dtypes float8_e4m3``), ``float8_e4m3:float16``
    for fp16 D (``kernel_pack.grouped_dtype``)."""
    return fp8_grouped_dtype(out_dtype)


def quantize_experts(W, dtype=None):
    """``(W_fp8, scale [E, N])`` of experts' weights ``W [E, N, K]`` with the rounding of
    :func:`gemm_ladder.quantize_fp8`'s row recipe (each output column's ``amax / 448``): the
    weights and ``scale_b`` of :func:`scaled_grouped_mm`."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    dtype = dtype or torch.float8_e4m3fn
    if dtype != torch.float8_e4m3fn:
        raise ModuleInputError(f"quantize_experts: dtype {dtype}; the grouped fp8 GEMM takes torch.float8_e4m3fn")
    if not isinstance(W, torch.Tensor) or W.dim() != 3 or not W.is_floating_point():
        raise ModuleInputError("quantize_experts: W must be a floating-point torch.Tensor [E, N, K]")
    fmax = FP8_MAX["float8_e4m3fn"]
    Wf = W.float()
    scale = Wf.abs().amax(dim=2, keepdim=True).clamp(min=AMAX_FLOOR) / fmax
    q = (Wf / scale).clamp(-fmax, fmax).to(dtype)
    return q, scale.squeeze(2).contiguous()


def reference(A, W, scale_a, scale_b, offs, out_dtype=None):
    """The dequantized product per expert in fp64 (``float64`` D, or rounded to ``out_dtype``), on
    any device: what the kernel computes (the GPU check's yardstick and the CPU tests' model). W
    is ``[E, N, K]``; rows past ``offs[-1]`` are zero."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    M, N = A.shape[0], W.shape[1]
    D = torch.zeros(M, N, dtype=torch.float64, device=A.device)
    sa = scale_a.reshape(-1).double()
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(int(end), start), M)
        if end > start:
            a = A[start:end].float().double() * sa[start:end, None]  # fp8 -> fp32 is exact
            w = W[e].float().double() * scale_b[e].double()[:, None]
            D[start:end] = a @ w.T
        start = end
    return D if out_dtype is None else D.to(out_dtype)


# -- checks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """A call's shape and D's dtype, after the checks; ``torch_layout``: W came as torch's mat_b."""

    M: int
    E: int
    N: int
    K: int
    out_dtype: str
    torch_layout: bool


def weight_nk(W, K: int):
    """W as ``[E, N, K]`` row-major: itself, or the memory under torch's ``[E, K, N]`` column-major
    ``mat_b`` view (``W.transpose(1, 2)``, no copy); None where W is neither."""
    if W.dim() != 3:
        return None
    if W.shape[2] == K and W.is_contiguous():
        return W
    if W.shape[1] == K and W.transpose(1, 2).is_contiguous():
        return W.transpose(1, 2)
    return None


def check_call(A, W, scale_a, scale_b, offs, out_dtype=None, out=None) -> Call:
    """Every check that needs no data (the real call's and the fake op's): types, dtypes, shapes,
    layouts, the scales', gradients; a :class:`ModuleInputError` naming the problem and the fix."""
    import torch  # pylint: disable=import-outside-toplevel  (optional: torch, the caller's)

    for name, t, what in (("A", A, "[M, K] float8_e4m3fn"), ("W", W, "[E, N, K] float8_e4m3fn"),
                          ("scale_a", scale_a, "[M] float32"), ("scale_b", scale_b, "[E, N] float32"),
                          ("offs", offs, "[E] int32")):
        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{WHO}: {name} must be a torch.Tensor {what}, got {type(t).__name__}")
    for name, t in (("A", A), ("W", W)):
        if t.dtype != torch.float8_e4m3fn:
            raise ModuleInputError(f"{WHO}: {name} is {t.dtype}; the grouped fp8 GEMM takes torch.float8_e4m3fn (as "
                                   "torch._scaled_grouped_mm): quantize with gemm_ladder.quantize_fp8(A, 'row') and "
                                   "gemm_ladder.serve.grouped_fp8.quantize_experts(W)")
    if A.dim() != 2:
        raise ModuleInputError(f"{WHO}: A has shape {tuple(A.shape)}; it is [M, K], the tokens sorted by expert (the "
                               "masked [E, max_tokens, K] layout is not built in fp8: use gemm_ladder.grouped_mm_masked "
                               "in bf16)")
    M, K = A.shape
    if W.dim() != 3:
        raise ModuleInputError(f"{WHO}: W has shape {tuple(W.shape)}; pass the experts' weights [E, N, K] (or torch's "
                               "mat_b, their [E, K, N] view W.transpose(1, 2))")
    Wnk = weight_nk(W, K)
    if Wnk is None:
        if W.shape[1] == K and W.is_contiguous():
            raise ModuleInputError(f"{WHO}: W {tuple(W.shape)} is a contiguous [E, K, N] (MN-major): fp8 wgmma reads "
                                   "K-major only; pass the [E, N, K] weights (W.transpose(1, 2).contiguous()) or their "
                                   ".transpose(1, 2) view, torch._scaled_grouped_mm's column-major mat_b")
        raise ModuleInputError(f"{WHO}: W {tuple(W.shape)} with strides {W.stride()} is neither [E, N, K] row-major "
                               f"with K={K} (A's) nor torch's column-major [E, K, N] view of one; pass "
                               "W.contiguous() of [E, N, K]")
    E, N = Wnk.shape[0], Wnk.shape[1]
    if K == 0 or K % 16 or N % 8:
        raise ModuleInputError(f"{WHO}: K={K} must be a positive multiple of 16 and N={N} a multiple of 8 (TMA's "
                               "16-byte rows of fp8 A, W and 16-bit D); pad them with zeros")
    if A.stride() != (K, 1) and M > 1:
        raise ModuleInputError(f"{WHO}: A must be row-major [M, K] (strides ({K}, 1), got {A.stride()}); pass "
                               "A.contiguous()")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise ModuleInputError(f"{WHO}: {name} is {t.dtype}; scales are torch.float32 ({name}.float())")
        if not t.is_contiguous():
            raise ModuleInputError(f"{WHO}: {name} is not contiguous; pass {name}.contiguous()")
    if tuple(scale_a.shape) not in ((M,), (M, 1)):
        raise ModuleInputError(f"{WHO}: scale_a has shape {tuple(scale_a.shape)}; the rowwise recipe takes one scale a "
                               f"token, [{M}] (per-tensor and block scales are not built for the grouped GEMM: quantize "
                               "with gemm_ladder.quantize_fp8(A, 'row') and pass scale.view(-1))")
    if tuple(scale_b.shape) != (E, N):
        raise ModuleInputError(f"{WHO}: scale_b has shape {tuple(scale_b.shape)}; the rowwise recipe takes one scale an "
                               f"expert's output column, [{E}, {N}] (quantize_experts(W) makes it)")
    if offs.dim() != 1 or offs.shape[0] != E or offs.dtype != torch.int32:
        raise ModuleInputError(f"{WHO}: offs is {offs.dtype} {tuple(offs.shape)}; it is one int32 an expert, ({E},): "
                               "the cumulative END row of each (counts.cumsum(0).to(torch.int32))")
    out_dtype = out_dtype or torch.bfloat16
    od = str(out_dtype).removeprefix("torch.")
    if od not in OUT_DTYPES:
        raise ModuleInputError(f"{WHO}: out_dtype {out_dtype}; the grouped fp8 GEMM writes torch.bfloat16 (torch's) "
                               "or torch.float16")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != out_dtype:
            raise ModuleInputError(f"{WHO}: out must be a [{M}, {N}] {out_dtype} tensor")
        if not out.is_contiguous():
            raise ModuleInputError(f"{WHO}: out is not contiguous; pass a contiguous out (or none)")
    wants_grad = [n for n, t in (("A", A), ("W", W), ("scale_a", scale_a), ("scale_b", scale_b), ("out", out))
                  if t is not None and t.requires_grad]
    if wants_grad and torch.is_grad_enabled():
        raise ModuleInputError(f"{WHO}: {' and '.join(wants_grad)} require grad, and the grouped fp8 GEMM has no "
                               "backward; call it under torch.no_grad(), or pass .detach()ed tensors")
    devices = {t.device for t in (A, W, scale_a, scale_b, offs, out) if t is not None}
    if len(devices) > 1:
        raise ModuleInputError(f"{WHO}: the tensors are on {sorted(map(str, devices))}; put all on one GPU")
    return Call(M, E, N, K, od, Wnk is not W)


def check_memory(A, Wnk, scale_a, scale_b, offs, out) -> None:
    """On the GPU: 16-byte aligned TMA operands, and an ``out`` that shares no memory with an input."""
    if A.device.type != "cuda":
        raise ModuleInputError(f"{WHO}: the tensors are on {A.device}; move them to the GPU (.cuda())")
    for name, t in (("A", A), ("W", Wnk), ("out", out)):
        if t is not None and t.numel() and t.data_ptr() % 16:
            raise ModuleInputError(f"{WHO}: {name} does not start on a 16-byte boundary, which TMA needs; pass "
                                   f"{name}.clone()")
    if out is not None and out.numel():
        for name, t in (("A", A), ("W", Wnk), ("scale_a", scale_a), ("scale_b", scale_b), ("offs", offs)):
            if t.numel() and out.data_ptr() < t.data_ptr() + t.nbytes and t.data_ptr() < out.data_ptr() + out.nbytes:
                raise ModuleInputError(f"{WHO}: out overlaps {name} in memory: the kernel would overwrite it while it "
                                       "reads it; pass an out that shares no memory with the inputs")


# -- modules ----------------------------------------------------------------------------------------
class ScaledGroupedModule:
    """A loaded v12 fp8 module: ``launch(A, W [E, N, K], scale_a, scale_b, offs, D)`` with the checks
    done by the caller; the kernel's arguments ``(A, W as [E * N, K], D, num_ctas, scale_a [M],
    scale_b [E, N], offs)`` (the spec's operand order)."""

    def __init__(self, module):
        launch = module.manifest.get("launch", {})
        if module.rung != RUNG or module.spec != spec_of(module.spec.d) or "experts" not in launch:
            raise ModuleInputError(f"{module.path.name} is a {module.rung} module of spec {module.spec.text()}, not a "
                                   f"grouped fp8 GEMM ({RUNG}, spec {spec_of().text()}): build one with "
                                   f"gemm_ladder.build('{RUNG}', {BUILD_M}, N, K, experts=E, spec='{spec_of().text()}')")
        if str(launch.get("layout", "contiguous")) != "contiguous":
            raise ModuleInputError(f"{module.path.name}: a masked fp8 module is not served (not built)")
        self.module = module
        self.experts, self.N, self.K = int(launch["experts"]), module.N, module.K
        self.out_dtype, self.arch, self.path = module.spec.d, module.arch, module.path

    @property
    def key(self) -> tuple:
        return (self.experts, self.N, self.K, self.out_dtype, self.arch)

    def launch(self, A, W, scale_a, scale_b, offs, D) -> None:
        import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's)

        self.module.check_device(A.device)
        with torch.cuda.device(A.device):
            self.module.entry()(A, W.view(self.experts * self.N, self.K), D, *self.module.launch_args(A.device),
                                scale_a.reshape(-1), scale_b, offs)


def use_scaled_grouped_module(path) -> ScaledGroupedModule:
    """Serve :func:`scaled_grouped_mm` calls of this module's (E, N, K, out dtype, arch) with it from now on."""
    mod = ScaledGroupedModule(load(path))
    _REGISTERED[mod.key] = mod
    _ROUTES.clear()
    return mod


def reset() -> None:
    """Forget every registered module and route."""
    _REGISTERED.clear()
    _FROM_PACKS.clear()
    _ROUTES.clear()


# -- routes -----------------------------------------------------------------------------------------
@dataclass
class Route:
    """How one (E, N, K, out dtype, GPU) is computed, and the lines ``explain`` prints."""

    run: object  # run(A, W [E, N, K], scale_a, scale_b, offs, D)
    source: str
    lines: list


def torch_scaled_grouped_mm(A, W, scale_a, scale_b, offs, out) -> None:
    """torch's own: ``torch._scaled_grouped_mm`` (bf16 out, where this torch and GPU run it), else the
    dequantized product per expert in fp32 (``offs`` read on the host: a sync)."""
    import torch  # pylint: disable=import-outside-toplevel

    if out.dtype == torch.bfloat16:
        try:
            out.copy_(torch._scaled_grouped_mm(A, W.transpose(1, 2), scale_a.reshape(-1), scale_b, offs=offs,  # pylint: disable=protected-access
                                               out_dtype=torch.bfloat16))
            return
        except (RuntimeError, ValueError, TypeError, AttributeError, NotImplementedError):  # torch wants N % 16
            pass
    sa = scale_a.reshape(-1)
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(end, start), A.shape[0])
        if end > start:
            out[start:end] = ((A[start:end].float() * sa[start:end, None]) @ (W[e].float() * scale_b[e][:, None]).T
                              ).to(out.dtype)
        start = end


def _pack_module(found: Found) -> ScaledGroupedModule:
    if found.path not in _FROM_PACKS:
        _FROM_PACKS[found.path] = ScaledGroupedModule(found.pack.load(found.entry))
    return _FROM_PACKS[found.path]


def _route(call: Call, index: int, strict: bool, found: Found | None) -> Route:
    arch = arch_at(index)
    reg = _REGISTERED.get((call.E, call.N, call.K, call.out_dtype, arch))
    if reg is not None:
        return Route(reg.launch, "registered", [f"kernel: {RUNG} fp8 {reg.path.name}",
                                                "source: use_scaled_grouped_module"])
    if found is not None:
        return Route(_pack_module(found).launch, "kernel pack", pack_lines(found))
    why = f"no {RUNG} fp8 module was registered for it, and no kernel pack holds one"
    how = (f"build a pack on a box with TVM's compiler (python -m gemm_ladder pack build --grouped {call.E},{call.N},"
           f"{call.K},contiguous --dtypes {pack_dtype(call.out_dtype)}) and pass it to gemm_ladder.use_pack, or build "
           f"one module (gemm_ladder.build('{RUNG}', {BUILD_M}, {call.N}, {call.K}, experts={call.E}, "
           f"spec='{spec_of(call.out_dtype).text()}')) and pass it to use_scaled_grouped_module")
    what = f"{WHO} E={call.E} N={call.N} K={call.K} fp8 -> {call.out_dtype} on {arch}"
    if strict:
        raise NoKernelError(f"{what}: {why} (strict mode); {how}")
    warnings.warn(f"{what}: torch computes it ({why}). For a kernel of ours, {how}. {STRICT_ENV}=1 (or strict=True) "
                  "makes this an error", KernelFallbackWarning, stacklevel=4)
    return Route(torch_scaled_grouped_mm, "torch fallback",
                 ["kernel: torch._scaled_grouped_mm (or the dequantized product per expert), the fallback",
                  f"why: {why}"])


def route_of(call: Call, index: int, strict: bool = False) -> Route:
    """The route of ``call`` (the pack's module for its token count), made once per weight, GPU,
    strictness and pack module found (a module registered since forgets them)."""
    arch = arch_at(index)
    found = None
    if (call.E, call.N, call.K, call.out_dtype, arch) not in _REGISTERED:
        found = from_packs("contiguous", call.E, call.N, call.K, pack_dtype(call.out_dtype), arch, call.M)
    key = (call.E, call.N, call.K, call.out_dtype, index, strict,
           (str(found.path), found.fit) if found is not None else None)
    if key not in _ROUTES:
        _ROUTES[key] = _route(call, index, strict, found)
    return _ROUTES[key]


def scaled_grouped_mm(A, W, scale_a, scale_b, offs, *, out_dtype=None, out=None, explain: bool = False,
                      strict: bool | None = None, check_offsets_first: bool = False):
    """``D[offs[e-1]:offs[e]] = scale_a . (A . W[e]^T) . scale_b[e]`` for every expert e, in fp8 (see the
    module docstring); ``out``: D [M, N] to write into; ``explain``: print which kernel and why;
    ``strict``: NoKernelError instead of torch's (default ``$GEMM_LADDER_STRICT``);
    ``check_offsets_first``: check the values of offs on the host first (a sync)."""
    import torch  # pylint: disable=import-outside-toplevel

    call = check_call(A, W, scale_a, scale_b, offs, out_dtype, out)
    Wnk = W.transpose(1, 2) if call.torch_layout else W
    check_memory(A, Wnk, scale_a, scale_b, offs, out)
    if check_offsets_first:
        check_offsets(offs, call.M, WHO)
    if out is None:
        out = torch.empty((call.M, call.N), dtype=getattr(torch, call.out_dtype), device=A.device)
    if call.M == 0 or call.N == 0 or call.E == 0:
        return out
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    route = route_of(call, index, _strict(strict))
    if explain:
        print("\n".join(route.lines + [f"tokens: {call.M} rows of A"]), file=sys.stderr)
    route.run(A, Wnk, scale_a, scale_b, offs, out)
    return out
