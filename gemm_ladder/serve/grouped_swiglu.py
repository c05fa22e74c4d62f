"""The grouped SwiGLU front door: every expert's gate and up projections and ``silu(gate) * up`` in
one launch (a mixture of experts' first MLP half).

    import gemm_ladder
    H = gemm_ladder.grouped_swiglu(A, W_gu, offs)   # A [M, K] tokens sorted by expert,
                                                    # W_gu [E, 2I, K] (each expert's cat([W_gate, W_up])),
                                                    # offs [E] int32 cumulative end rows -> H [M, I]
    H = gemm_ladder.grouped_swiglu_masked(A, W_gu, counts)   # decode: A [E, max_tokens, K], counts [E] int32
                                                             # -> H [E, max_tokens, I], each slot's first counts[e]
    import gemm_ladder.serve.grouped_ops            # torch.ops.gemm_ladder.grouped_swiglu(_masked) (torch.compile)

Semantics: for every expert e and its rows ``[offs[e-1], offs[e])`` of A and H,
``H[rows] = silu(A[rows] . Wg_e^T) * (A[rows] . Wu_e^T)`` with ``Wg_e = W_gu[e, :I]`` and
``Wu_e = W_gu[e, I:]``, both products in fp32, the activation and the product in fp32, rounded once.
torch's unfused path computes the same thing in three steps (``h = torch._grouped_mm(A,
W_gu.transpose(1, 2), offs=offs)`` [M, 2I], then ``F.silu(h[:, :I]) * h[:, I:]``), writing and
reading the [M, 2I] intermediate and rounding it: the fused kernel stores half the bytes and
never reads them back. Rows past ``offs[-1]`` are not written by the kernel (unspecified, as in
``grouped_mm``).

How a call finds its kernel: as ``gemm_ladder.grouped_mm`` does (``serve/grouped.py``), among the
modules of the gated spec only (``spec_for(dtype, 'swiglu')`` with ``grouped``: v12's gated
epilogue): one registered with ``use_grouped_module``, else a kernel pack's (``pack build --grouped
E,2I,K,swiglu``) by the rows of A, else torch's unfused path above with a ``KernelFallbackWarning``
(``strict=True`` or ``GEMM_LADDER_STRICT=1``: ``NoKernelError``). ``explain=True`` prints which.

Checked before a launch (no GPU sync): what ``grouped_mm`` checks of A, W_gu and offs (types,
dtypes, shapes, devices, contiguity, 16-byte alignment, gradients), W_gu's rows even (gate then
up), I a multiple of 8 for a kernel (H's rows are 16-byte strides), ``out`` [M, I] in A's dtype
sharing no memory with the inputs. The values of offs are the kernel's to clamp, as in grouped_mm
(``check_offsets_first=True`` checks them on the host: a sync).

The masked layout (``grouped_swiglu_masked``, decode under CUDA graphs) is the same kernel built with
``layout='masked'``, with ``grouped_mm_masked``'s semantics (``serve/grouped_masked.py``): only each
expert's first ``clamp(counts[e], 0, max_tokens)`` rows of its slot are computed and written; torch's
fallback is a bmm over every slot, silu(gate) * up, and the valid rows selected on the device.
"""

from __future__ import annotations

import sys
import warnings

from ..core.spec import GemmSpec
from . import grouped, grouped_masked
from .front import STRICT_ENV, KernelFallbackWarning, NoKernelError, _strict
from .runtime import ModuleInputError

EPILOGUE = "swiglu"  # the gated spec's epilogue name (GemmSpec.epilogue), the grouped registry's key part
WHO = "gemm_ladder.grouped_swiglu"


def spec_of_dtype(dtype: str) -> GemmSpec:
    """The operand spec of a grouped SwiGLU in ``dtype``: grouped, a gated B, silu of the gate."""
    return GemmSpec(a=dtype, b=dtype, d=dtype, act="silu", gated=True, grouped=True)


def check_swiglu(A, W_gu, offs, out=None, who: str = WHO) -> tuple[int, int, int, int]:
    """(M, E, I, K) of a call whose arguments fit, all but their devices and the values of offs;
    else ModuleInputError with the fix. No GPU needed."""
    M, E, N2, K = grouped.check_grouped(A, W_gu, offs, None, who)
    if N2 % 2:
        raise ModuleInputError(f"{who}: W_gu is {tuple(W_gu.shape)}: its rows are each expert's cat([W_gate, W_up]) "
                               f"[2I, K], an even number ({N2} is odd); stack torch.cat([W_gate[e], W_up[e]]) per expert")
    I = N2 // 2
    _check_out(who, out, A, (M, I), "[M, I]")
    return M, E, I, K


def _check_out(who: str, out, A, shape: tuple, named: str) -> None:
    """``out`` (None, or H's tensor: ``shape`` in A's dtype, contiguous, no grad wanted), for both
    front doors (``named``: H's shape in words)."""
    import torch  # pylint: disable=import-outside-toplevel

    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise ModuleInputError(f"{who}: out must be a torch.Tensor {named} or None, got {type(out).__name__}")
    if out.dtype != A.dtype or tuple(out.shape) != shape:
        raise ModuleInputError(f"{who}: out is {tuple(out.shape)} {out.dtype}; H is {shape} {A.dtype} (half of "
                               "W_gu's rows)")
    if not out.is_contiguous():
        raise ModuleInputError(f"{who}: out is not contiguous; pass a contiguous {shape} tensor")
    if out.requires_grad and torch.is_grad_enabled():
        raise ModuleInputError(f"{who}: out requires grad, and the grouped SwiGLU has no backward yet; call it "
                               "under torch.no_grad(), or pass .detach()ed tensors")


def torch_swiglu(A, W_gu, offs, out) -> None:
    """torch's unfused path: the grouped product ``h`` [M, 2I] (``torch._grouped_mm``, else a loop of
    cuBLAS GEMMs), then ``silu(h[:, :I]) * h[:, I:]`` into ``out``."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    I = out.shape[1]
    h = torch.empty((A.shape[0], 2 * I), dtype=A.dtype, device=A.device)
    grouped.torch_grouped_mm(A, W_gu, offs, h)
    torch.mul(F.silu(h[:, :I]), h[:, I:], out=out)


def _route(E: int, N2: int, K: int, dtype: str, index: int, strict: bool, found) -> grouped.Route:
    arch = grouped.arch_at(index)
    reg = grouped.registered("contiguous", E, N2, K, dtype, arch, EPILOGUE)
    if reg is not None:
        return grouped.Route(reg.launch, "registered", [f"kernel: {grouped.RUNG} swiglu {reg.path.name}",
                                                        "source: use_grouped_module"])
    if found is not None:
        return grouped.Route(grouped.pack_module(found).launch, "kernel pack", grouped.pack_lines(found))
    why = ("I (half of W_gu's rows) or K is not a multiple of 8 (TMA's 16-byte strides)" if N2 % 16 or K % 8
           else f"no {grouped.RUNG} swiglu module was registered for it, and no kernel pack holds one")
    how = (f"build a pack on a box with TVM's compiler (python -m gemm_ladder pack build --grouped {E},{N2},{K},swiglu "
           f"--dtypes {dtype}) and pass it to gemm_ladder.use_pack, or build one module (gemm_ladder.build("
           f"'{grouped.RUNG}', {grouped.BUILD_M}, {N2}, {K}, experts={E}, spec='{spec_of_dtype(dtype).text()}')) and "
           "pass it to gemm_ladder.use_grouped_module")
    if strict:
        raise NoKernelError(f"{WHO} E={E} 2I={N2} K={K} {dtype} on {arch}: {why} (strict mode); {how}")
    warnings.warn(f"{WHO} E={E} 2I={N2} K={K} {dtype}: torch computes it unfused ({why}). For a kernel of ours, "
                  f"{how}. {STRICT_ENV}=1 (or strict=True) makes this an error", KernelFallbackWarning, stacklevel=7)
    return grouped.Route(torch_swiglu, "torch fallback", ["kernel: torch._grouped_mm then silu(gate) * up, the "
                                                          "fallback", f"why: {why}"])


def route_of(E: int, N2: int, K: int, dtype: str, index: int, tokens: int = 1, strict: bool = False) -> grouped.Route:
    """The route of a call with ``tokens`` rows of A and a W_gu of ``N2`` = 2I rows an expert."""
    return grouped.route_for("contiguous", E, N2, K, dtype, index, tokens, strict,
                             lambda found: _route(E, N2, K, dtype, index, strict, found), EPILOGUE)


def grouped_swiglu(A, W_gu, offs, *, out=None, explain: bool = False, strict: bool | None = None,
                   check_offsets_first: bool = False):
    """``H[rows of e] = silu(A[rows] . W_gu[e, :I]^T) * (A[rows] . W_gu[e, I:]^T)`` for every expert e
    (see the module docstring); ``out``: H [M, I] to write into (else a new tensor); ``explain``:
    print which kernel and why; ``strict``: no torch fallback, NoKernelError instead (default
    ``$GEMM_LADDER_STRICT``); ``check_offsets_first``: check the values of offs on the host (a sync)."""
    import torch  # pylint: disable=import-outside-toplevel

    strict = _strict(strict)
    key = None if explain or check_offsets_first else grouped.fast_key("grouped_swiglu", strict, A, W_gu, offs, out)
    if (done := grouped.fast_run(key, A, W_gu, offs, out)) is not None:
        return done
    M, E, I, K = check_swiglu(A, W_gu, offs, out)
    grouped.check_devices(A, W_gu, offs, out, WHO)
    if check_offsets_first:
        grouped.check_offsets(offs, M, WHO)
    if out is None:
        out = torch.empty((M, I), dtype=A.dtype, device=A.device)
    if M == 0 or I == 0 or E == 0:
        return out
    if K == 0:  # every product is empty: silu(0) * 0
        return out.zero_()
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    route = route_of(E, 2 * I, K, str(A.dtype).removeprefix("torch."), index, M, strict)
    if explain:
        print("\n".join(route.lines + [f"tokens: {M} rows of A"]), file=sys.stderr)
    route.run(A, W_gu, offs, out)
    grouped.remember_fast(key, route, (M, I))
    return out


# -- the masked layout (decode) ---------------------------------------------------------------------------
WHO_MASKED = "gemm_ladder.grouped_swiglu_masked"


def check_swiglu_masked(A, W_gu, counts, out=None, who: str = WHO_MASKED) -> tuple[int, int, int, int]:
    """(E, max_tokens, I, K) of a masked call whose arguments fit, all but their devices and the
    values of counts; else ModuleInputError with the fix. No GPU needed."""
    E, T, N2, K = grouped_masked.check_masked(A, W_gu, counts, None, who)
    if N2 % 2:
        raise ModuleInputError(f"{who}: W_gu is {tuple(W_gu.shape)}: its rows are each expert's cat([W_gate, W_up]) "
                               f"[2I, K], an even number ({N2} is odd); stack torch.cat([W_gate[e], W_up[e]]) per expert")
    I = N2 // 2
    _check_out(who, out, A, (E, T, I), "[E, max_tokens, I]")
    return E, T, I, K


def torch_swiglu_masked(A, W_gu, counts, out) -> None:
    """torch's own, on the device without a sync (CUDA-graph capturable): a bmm over every slot's rows,
    silu(gate) * up, then each expert's first ``clamp(counts[e], 0, max_tokens)`` rows into ``out``
    (the others keep what they held)."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    I = out.shape[2]
    h = torch.bmm(A, W_gu.transpose(1, 2))
    valid = torch.arange(A.shape[1], device=A.device)[None, :] < counts.clamp(0, A.shape[1])[:, None]
    out.copy_(torch.where(valid[..., None], F.silu(h[..., :I]) * h[..., I:], out))


def _route_masked(E: int, N2: int, K: int, dtype: str, index: int, strict: bool, found) -> grouped.Route:
    arch = grouped.arch_at(index)
    reg = grouped.registered("masked", E, N2, K, dtype, arch, EPILOGUE)
    module = reg or (grouped.pack_module(found) if found is not None else None)
    if module is not None:
        def run(A, W_gu, counts, H):  # the kernel sees A and H as [E * max_tokens, ...] (M = E * max_tokens)
            module.launch(A.view(-1, K), W_gu, counts, H.view(-1, N2 // 2))
        if reg is None:
            return grouped.Route(run, "kernel pack", grouped.pack_lines(found))
        return grouped.Route(run, "registered", [f"kernel: {grouped.RUNG} swiglu layout=masked {module.path.name}",
                                                 "source: use_grouped_module"])
    why = ("I (half of W_gu's rows) or K is not a multiple of 8 (TMA's 16-byte strides)" if N2 % 16 or K % 8
           else f"no masked {grouped.RUNG} swiglu module was registered for it, and no kernel pack holds one")
    how = (f"build a pack on a box with TVM's compiler (python -m gemm_ladder pack build --grouped {E},{N2},{K},masked,"
           f"swiglu --dtypes {dtype}) and pass it to gemm_ladder.use_pack, or build one module (gemm_ladder.build("
           f"'{grouped.RUNG}', {grouped.BUILD_M}, {N2}, {K}, experts={E}, layout='masked', "
           f"spec='{spec_of_dtype(dtype).text()}')) and pass it to gemm_ladder.use_grouped_module")
    if strict:
        raise NoKernelError(f"{WHO_MASKED} E={E} 2I={N2} K={K} {dtype} on {arch}: {why} (strict mode); {how}")
    warnings.warn(f"{WHO_MASKED} E={E} 2I={N2} K={K} {dtype}: torch computes it unfused ({why}): a bmm over every "
                  f"slot's rows, then silu(gate) * up of the valid rows. For a kernel of ours, {how}. {STRICT_ENV}=1 "
                  "(or strict=True) makes this an error", KernelFallbackWarning, stacklevel=7)
    return grouped.Route(torch_swiglu_masked, "torch fallback", ["kernel: torch.bmm over max_tokens rows an expert, "
                                                                 "silu(gate) * up, the valid rows (the fallback)",
                                                                 f"why: {why}"])


def route_of_masked(E: int, N2: int, K: int, dtype: str, index: int, max_tokens: int = 1,
                    strict: bool = False) -> grouped.Route:
    """The route of a masked call whose slots hold ``max_tokens`` rows (the pack's module for it)."""
    return grouped.route_for("masked", E, N2, K, dtype, index, max_tokens, strict,
                             lambda found: _route_masked(E, N2, K, dtype, index, strict, found), EPILOGUE)


def grouped_swiglu_masked(A, W_gu, counts, *, out=None, explain: bool = False, strict: bool | None = None,
                          check_counts_first: bool = False):
    """``H[e, :c] = silu(A[e, :c] . W_gu[e, :I]^T) * (A[e, :c] . W_gu[e, I:]^T)`` with ``c =
    clamp(counts[e], 0, max_tokens)`` for every expert; ``out``: H [E, max_tokens, I] to write into, its
    rows past the counts kept (else a new tensor, those rows unspecified); ``explain``, ``strict``,
    ``check_counts_first`` as in ``grouped_mm_masked``."""
    import torch  # pylint: disable=import-outside-toplevel

    strict = _strict(strict)
    key = None if explain or check_counts_first else grouped.fast_key("grouped_swiglu_masked", strict, A, W_gu, counts,
                                                                        out)
    if (done := grouped.fast_run(key, A, W_gu, counts, out)) is not None:
        return done
    E, T, I, K = check_swiglu_masked(A, W_gu, counts, out)
    grouped.check_devices(A, W_gu, counts, out, who=WHO_MASKED, table="counts")
    if check_counts_first:
        grouped_masked.check_counts(counts, T, WHO_MASKED)
    if out is None:
        out = torch.empty((E, T, I), dtype=A.dtype, device=A.device)
    if E == 0 or T == 0 or I == 0:
        return out
    if K == 0:  # every product is empty: zeros in the valid rows, on the device
        torch_swiglu_masked(A, W_gu, counts, out)
        return out
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    route = route_of_masked(E, 2 * I, K, str(A.dtype).removeprefix("torch."), index, T, strict)
    if explain:
        print("\n".join(route.lines + [f"tokens: max_tokens {T} an expert"]), file=sys.stderr)
    route.run(A, W_gu, counts, out)
    grouped.remember_fast(key, route, (E, T, I))
    return out
