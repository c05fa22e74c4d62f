"""The masked grouped front door: one GEMM per expert over a fixed slot of rows each (decode).

    import gemm_ladder
    D = gemm_ladder.grouped_mm_masked(A, W, counts)   # A [E, max_tokens, K], W [E, N, K],
                                                      # counts [E] int32 on the GPU -> D [E, max_tokens, N]
    gemm_ladder.grouped_mm_masked(A, W, counts, out=D)

Semantics (DeepGEMM's "masked" layout): ``D[e, :c] = A[e, :c] . W[e]^T`` in fp32, rounded once,
with ``c = min(max(counts[e], 0), max_tokens)``. Rows ``D[e, c:]`` are NOT written: with ``out``
they keep what they held; in a fresh D (``torch.empty``) they are unspecified. (The torch op,
:mod:`gemm_ladder.serve.grouped_ops`, returns zeros there: a functional op's output is a function of
its inputs.) This is what decode under CUDA graphs needs: the graph is captured once with
``max_tokens`` rows an expert and replayed with the counts of each step; the counts never cross
to the host, so nothing syncs and the captured launch stays valid.

How a call finds its kernel (once per (E, N, K, dtype, GPU) and pack module): a masked v12 module
registered with ``gemm_ladder.use_grouped_module`` (built with ``gemm_ladder.build('v12', 4096, N, K,
experts=E, layout='masked', spec='d_bfloat16.grouped_true')``); else a kernel pack's masked module
of the weight (``pack build --grouped E,N,K,masked``) whose token range holds A's max_tokens (the
slot: the counts stay on the GPU), else the nearest; else torch computes it: a batched GEMM over
every slot's max_tokens rows, then the valid rows selected into D on the device (no sync, CUDA-graph
capturable, the rows past the counts kept), with a ``KernelFallbackWarning`` once per shape;
``strict=True`` (or ``GEMM_LADDER_STRICT=1``) raises ``NoKernelError`` instead.

What is checked before a launch: types, dtypes (A and W fp16 or bf16 alike, counts int32), devices
(one GPU), shapes (A [E, max_tokens, K], W [E, N, K], counts [E], out [E, max_tokens, N]),
layouts (contiguous, 16-byte aligned), N and K multiples of 8 for a kernel (else torch), gradients,
and an ``out`` that overlaps an input. What is NOT checked: the VALUES of ``counts`` (they live on
the GPU; reading them would stall the host and break capture). The kernel clamps each into
[0, max_tokens], so a bad count never reads or writes another expert's rows, but a count past
max_tokens computes only max_tokens rows; ``check_counts_first=True`` checks them on the host first
(a sync), for debugging.
"""

from __future__ import annotations

import sys
import warnings

from ..core.config import DTYPES
from .front import STRICT_ENV, KernelFallbackWarning, NoKernelError, _strict  # the front door's reading of strict
from .grouped import (BUILD_M, RUNG, Route, arch_at, check_devices, fast_key, fast_run, pack_lines, pack_module,
                      registered, remember_fast, route_for, spec_of_dtype)
from .kernel_pack import Found
from .runtime import ModuleInputError

LAYOUT = "masked"
WHO = "gemm_ladder.grouped_mm_masked"


def check_masked(A, W, counts, out=None, who: str = WHO) -> tuple[int, int, int, int]:
    """(E, max_tokens, N, K) of a call whose arguments fit, all but their devices and the values of
    counts (see the module docstring); else ModuleInputError with the fix. No GPU needed."""
    import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's)

    for name, t, what in (("A", A, "[E, max_tokens, K]"), ("W", W, "[E, N, K]"), ("counts", counts, "[E] int32")):
        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{who}: {name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if out is not None and not isinstance(out, torch.Tensor):
        raise ModuleInputError(f"{who}: out must be a torch.Tensor [E, max_tokens, N] or None, got "
                               f"{type(out).__name__}")
    if A.dim() != 3 or W.dim() != 3:
        hint = (" (for tokens sorted by expert in one [M, K], use gemm_ladder.grouped_mm with offs)" if A.dim() == 2
                else "")
        raise ModuleInputError(f"{who}: A must be [E, max_tokens, K] (a slot of rows an expert) and W [E, N, K] (one "
                               f"nn.Linear weight an expert); got A {tuple(A.shape)} and W {tuple(W.shape)}{hint}")
    if A.dtype != W.dtype:
        raise ModuleInputError(f"{who}: A is {A.dtype} and W is {W.dtype}; pass one dtype (W.to({A.dtype}))")
    if str(A.dtype).removeprefix("torch.") not in DTYPES:
        raise ModuleInputError(f"{who}: A has dtype {A.dtype}; use torch.float16 or torch.bfloat16")
    E, T, K = A.shape
    Ew, N, Kw = W.shape
    if Ew != E:
        raise ModuleInputError(f"{who}: A has {E} expert slots and W {Ew} experts; A is [E, max_tokens, K] with W's "
                               f"E={Ew} (one slot of rows an expert)")
    if Kw != K:
        hint = (" W looks like [E, K, N]; pass W as [E, N, K] (each expert's nn.Linear.weight)" if W.shape[1] == K
                else "")
        raise ModuleInputError(f"{who}: A is {tuple(A.shape)} and W {tuple(W.shape)}: W's last dim must be A's "
                               f"K={K} (D[e] = A[e] . W[e]^T).{hint}")
    if counts.dim() != 1 or counts.shape[0] != E:
        raise ModuleInputError(f"{who}: counts has shape {tuple(counts.shape)}; it is one int32 per expert, ({E},): "
                               "the number of valid rows in each expert's slot (not cumulative)")
    if counts.dtype != torch.int32:
        raise ModuleInputError(f"{who}: counts has dtype {counts.dtype}; pass counts.to(torch.int32)")
    if out is not None:
        if out.dtype != A.dtype:
            raise ModuleInputError(f"{who}: out has dtype {out.dtype}; it must be A's {A.dtype}")
        if tuple(out.shape) != (E, T, N):
            raise ModuleInputError(f"{who}: out has shape {tuple(out.shape)}; D is ({E}, {T}, {N})")
    if not W.is_contiguous() and W.transpose(1, 2).is_contiguous():
        raise ModuleInputError(f"{who}: W {tuple(W.shape)} is the transposed view of a contiguous [E, {K}, {N}] "
                               "tensor; W is read as [E, N, K] like stacked nn.Linear weights: pass the [E, N, K] "
                               "tensor itself, or W.contiguous() if you mean these values")
    for name, t in (("A", A), ("W", W), ("counts", counts), ("out", out)):
        if t is not None and not t.is_contiguous():
            raise ModuleInputError(f"{who}: {name} is not contiguous; pass {name}.contiguous()")
    wants_grad = [name for name, t in (("A", A), ("W", W), ("out", out)) if t is not None and t.requires_grad]
    if wants_grad and torch.is_grad_enabled():
        raise ModuleInputError(f"{who}: {' and '.join(wants_grad)} require grad, and the grouped GEMM has no backward "
                               "yet; call it under torch.no_grad(), or pass .detach()ed tensors")
    return E, T, N, K


def check_counts(counts, max_tokens: int, who: str = WHO) -> None:
    """The values of ``counts`` on the host (a sync): each in 0..max_tokens."""
    for e, c in enumerate(counts.tolist()):
        if not 0 <= c <= max_tokens:
            raise ModuleInputError(f"{who}: counts[{e}] = {c}: each count is the valid rows of its expert's slot, in "
                                   f"0..{max_tokens} (A's max_tokens); the kernel would clamp it")


def torch_masked_mm(A, W, counts, out) -> None:
    """torch's own, on the device without a sync (CUDA-graph capturable): a batched GEMM over every
    slot's rows, then each expert's first ``clamp(counts[e], 0, max_tokens)`` rows into ``out``
    (the others keep what they held). Costs what a decode graph without masking costs: every row."""
    import torch  # pylint: disable=import-outside-toplevel

    product = torch.bmm(A, W.transpose(1, 2))
    valid = torch.arange(A.shape[1], device=A.device)[None, :] < counts.clamp(0, A.shape[1])[:, None]
    out.copy_(torch.where(valid[..., None], product, out))


def _route(E: int, N: int, K: int, dtype: str, index: int, strict: bool, found: Found | None = None) -> Route:
    arch = arch_at(index)
    module = registered(LAYOUT, E, N, K, dtype, arch) or (pack_module(found) if found is not None else None)
    if module is not None:
        def run(A, W, counts, D):  # the kernel sees A and D as [E * max_tokens, ...] (M = E * max_tokens)
            module.launch(A.view(-1, K), W, counts, D.view(-1, N))
        if found is not None and registered(LAYOUT, E, N, K, dtype, arch) is None:
            return Route(run, "kernel pack", pack_lines(found))
        return Route(run, "registered", [f"kernel: {RUNG} layout=masked {module.path.name}",
                                         "source: use_grouped_module"])
    why = ("N or K is not a multiple of 8 (TMA's 16-byte strides)" if N % 8 or K % 8
           else f"no masked {RUNG} module was registered for it, and no kernel pack holds one")
    how = (f"build a pack on a box with TVM's compiler (python -m gemm_ladder pack build --grouped {E},{N},{K},masked "
           f"--dtypes {dtype}) and pass it to gemm_ladder.use_pack (or $GEMM_LADDER_PACK), or build one module "
           f"(gemm_ladder.build('{RUNG}', {BUILD_M}, {N}, {K}, experts={E}, layout='masked', "
           f"spec='{spec_of_dtype(dtype).text()}')) and pass it to gemm_ladder.use_grouped_module")
    if strict:
        raise NoKernelError(f"{WHO} E={E} N={N} K={K} {dtype} on {arch}: {why} (strict mode); {how}")
    warnings.warn(f"{WHO} E={E} N={N} K={K} {dtype}: torch computes it ({why}): a batched GEMM over every slot's "
                  f"rows, then the valid rows. For a kernel of ours, {how}. {STRICT_ENV}=1 (or strict=True) makes "
                  "this an error", KernelFallbackWarning, stacklevel=7)
    return Route(torch_masked_mm, "torch fallback", ["kernel: torch.bmm over max_tokens rows an expert, then the "
                                                     "valid rows selected (the fallback)", f"why: {why}"])


def route_of(E: int, N: int, K: int, dtype: str, index: int, strict: bool = False, max_tokens: int = 1) -> Route:
    """The route of a masked call whose slots hold ``max_tokens`` rows (the pack's module for it)."""
    return route_for(LAYOUT, E, N, K, dtype, index, max_tokens, strict,
                     lambda found: _route(E, N, K, dtype, index, strict, found))


def grouped_mm_masked(A, W, counts, *, out=None, explain: bool = False, strict: bool | None = None,
                      check_counts_first: bool = False):
    """``D[e, :c] = A[e, :c] . W[e]^T`` with ``c = clamp(counts[e], 0, max_tokens)`` for every
    expert (see the module docstring); ``out``: D [E, max_tokens, N] to write into, its rows past
    the counts kept (else a new tensor, those rows unspecified); ``explain``: print which kernel;
    ``strict``: no torch fallback (default ``$GEMM_LADDER_STRICT``); ``check_counts_first``: check
    the counts on the host first (a sync)."""
    import torch  # pylint: disable=import-outside-toplevel

    strict = _strict(strict)
    key = None if explain or check_counts_first else fast_key("grouped_mm_masked", strict, A, W, counts, out)
    if (done := fast_run(key, A, W, counts, out)) is not None:
        return done
    E, T, N, K = check_masked(A, W, counts, out)
    check_devices(A, W, counts, out, who=WHO, table="counts")
    if check_counts_first:
        check_counts(counts, T)
    if out is None:
        out = torch.empty((E, T, N), dtype=A.dtype, device=A.device)
    if E == 0 or T == 0 or N == 0:
        return out
    if K == 0:  # every sum is empty: zeros in the valid rows, on the device
        torch_masked_mm(A, W, counts, out)
        return out
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    route = route_of(E, N, K, str(A.dtype).removeprefix("torch."), index, strict, T)
    if explain:
        print("\n".join(route.lines + [f"tokens: max_tokens {T} an expert"]), file=sys.stderr)
    route.run(A, W, counts, out)
    remember_fast(key, route, (E, T, N))
    return out
