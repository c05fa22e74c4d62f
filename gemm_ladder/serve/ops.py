"""``torch.ops.gemm_ladder.mm``: the front door as a torch custom op.

    import gemm_ladder.serve.ops                        # registers the op (imports torch)
    D = torch.ops.gemm_ladder.mm(A, B)            # A [..., K], B [N, K] -> D [..., N] = A . B^T
    D = torch.ops.gemm_ladder.mm(A, B, bias)      # + bias [N] (nn.Linear's), in the kernel's epilogue
    D = torch.ops.gemm_ladder.mm(A, B, bias, "gelu_tanh")  # then an activation, in the epilogue too

The op is registered with ``torch.library.custom_op`` and has a fake implementation (shapes and
dtypes only), so ``torch.compile(fullgraph=True)`` traces a model that calls it without a graph
break and ``torch.export`` exports it; and an autograd formula in terms of the op itself, so it
trains. The backward's GEMMs take their operands as transposed views, read as they lie by
MN-major modules (no copies)::

    dA = mm(dD, B.t())         B [N, K]: the view B.t() is [K, N] over B's memory, an MN-major B
    dB = mm(dD.t(), A.t())     the flattened dD [M, N] and A [M, K]: an MN-major A and B
    dbias = dD.sum(0)          (D[m, n] = ... + bias[n]: every row's dD[m, n] adds to it)

where a module of ours serves them (v9; the front door's route), torch's matmul otherwise. With
an activation, ``dD`` is first taken through it at the pre-activation ``Z = mm(A, B, bias)``,
recomputed in the backward (one more GEMM; the forward writes only D), by torch's own
``*_backward`` ops. dB comes out in B's dtype (an fp32 D, for fp32 master weights, is where an
fp32 weight gradient would come from: see ``_backward``). The real implementation is
:func:`gemm_ladder.matmul` on torch's current stream (under the op's autograd, with grad mode
off); A and B pass as they are when contiguous or a transposed view of a contiguous tensor, and
are made contiguous otherwise, as torch's own matmul takes any strides. B is always the [N, K]
of D = A . B^T (``mm(x, W.t())`` computes ``x . W``). Tensors off the GPU, or of another dtype,
get the front door's errors.

Warm a shape up once before capturing it in a CUDA graph: its first call loads the module.
"""

from __future__ import annotations

import torch

from .front import B_LAYOUT, check_activation, check_bias, is_transposed, matmul
from .runtime import ModuleInputError

_DTYPES = (torch.float16, torch.bfloat16)

def _as_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the front door takes it without a copy: contiguous, or the transposed view of a
    contiguous tensor (an MN-major operand); anything else made contiguous."""
    return t if t.is_contiguous() or is_transposed(t) else t.contiguous()


def _check_meta(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None,
                activation: str | None = None) -> None:
    """The checks that need no data: the same as the real op's, for fake and meta tensors."""
    for name, t, what in (("A", A, "[..., K]"), ("B", B, "[N, K]")):
        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"gemm_ladder.mm: {name} must be a torch.Tensor {what}, got {type(t).__name__}")
    torch._check(A.dtype == B.dtype, lambda: f"gemm_ladder.mm: A is {A.dtype} and B is {B.dtype}; pass one dtype")
    torch._check(A.dtype in _DTYPES, lambda: f"gemm_ladder.mm: dtype {A.dtype}; use torch.float16 or torch.bfloat16")
    torch._check(B.dim() == 2 and A.dim() >= 1,
                 lambda: f"gemm_ladder.mm: B must be [N, K] and A [..., K]; got {tuple(A.shape)} and {tuple(B.shape)}")
    torch._check(A.shape[-1] == B.shape[1],
                 lambda: f"gemm_ladder.mm: A's last dim {A.shape[-1]} is not B's K={B.shape[1]} (D = A . B^T)"
                 + (f"; B looks like [K, N], but {B_LAYOUT}" if A.shape[-1] == B.shape[0] else ""))
    if bias is not None:
        check_bias(bias, A.dtype, B.shape[0], "gemm_ladder.mm")
    check_activation(activation, "gemm_ladder.mm")


@torch.library.custom_op("gemm_ladder::mm", mutates_args=())
def mm(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None,
       activation: str | None = None) -> torch.Tensor:
    """D = act(A . B^T (+ bias [N])) through ``gemm_ladder.matmul`` (A [..., K], B [N, K];
    ``activation``: relu, gelu_tanh, gelu_erf, silu or None)."""
    _check_meta(A, B, bias, activation)
    return matmul(_as_operand(A), _as_operand(B), bias=None if bias is None else bias.contiguous(),
                  activation=activation)


@mm.register_fake
def _mm_fake(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None,
             activation: str | None = None) -> torch.Tensor:
    _check_meta(A, B, bias, activation)
    return A.new_empty((*A.shape[:-1], B.shape[0]))


def _setup_context(ctx, inputs, output):  # pylint: disable=unused-argument
    A, B = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    ctx.activation = check_activation(inputs[3] if len(inputs) > 3 else None, "gemm_ladder.mm")
    # the bias's grad is the sum of dD over rows: it is kept only to recompute an activation's input
    ctx.has_bias = bias is not None and ctx.activation != "none"
    ctx.save_for_backward(A, B, *((bias,) if ctx.has_bias else ()))


def activation_backward(grad: torch.Tensor, z: torch.Tensor, act: str) -> torch.Tensor:
    """dL/dZ of ``D = act(Z)`` from ``grad`` = dL/dD (torch's own backward ops, in fp32)."""
    g, zf = grad.float(), z.float()
    if act == "relu":
        out = torch.ops.aten.threshold_backward(g, zf, 0)
    elif act == "silu":
        out = torch.ops.aten.silu_backward(g, zf)
    else:
        out = torch.ops.aten.gelu_backward(g, zf, approximate="tanh" if act == "gelu_tanh" else "none")
    return out.to(grad.dtype)


def _backward(ctx, grad):
    A, B, *rest = ctx.saved_tensors
    if ctx.activation != "none":  # through the activation at its input, recomputed: Z = A . B^T (+ bias)
        grad = activation_backward(grad, mm(A, B, rest[0] if ctx.has_bias else None), ctx.activation)
    dA = dB = dbias = None
    # the operands are transposed views, no copies: MN-major operands of our kernels
    if ctx.needs_input_grad[0]:
        dA = mm(grad, B.t())  # [..., N] . ([K, N])^T: B's memory [N, K] is an MN-major B
    if ctx.needs_input_grad[1]:
        g2, a2 = grad.reshape(-1, B.shape[0]).contiguous(), A.reshape(-1, A.shape[-1]).contiguous()
        # in B's dtype, as autograd wants it back; the hook for fp32 master weights is here: an fp32 D
        # (the spec's d) would give an fp32 dB for an optimizer that keeps one, without a rounding
        dB = mm(g2.t(), a2.t())  # [N, M] . ([K, M])^T: dD and A as they lie, an MN-major A and B
    if len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2]:  # D[m, n] = ... + bias[n]: every row's
        dbias = grad.reshape(-1, B.shape[0]).sum(0, dtype=torch.float32).to(grad.dtype)  # dD[m, n] adds to it
    return (dA, dB, dbias, None)[:len(ctx.needs_input_grad)]


mm.register_autograd(_backward, setup_context=_setup_context)
