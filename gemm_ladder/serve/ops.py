"""``torch.ops.gemm_ladder.mm``: the front door as a torch custom op.

    import gemm_ladder.serve.ops                        # registers the op (imports torch)
    D = torch.ops.gemm_ladder.mm(A, B)            # A [..., K], B [N, K] -> D [..., N] = A . B^T
    D = torch.ops.gemm_ladder.mm(A, B, bias)      # + bias [N] (nn.Linear's), in the kernel's epilogue
    D = torch.ops.gemm_ladder.mm(A, B, bias, "gelu_tanh")  # then an activation, in the epilogue too
    D = torch.ops.gemm_ladder.mm_epilogue(A, B, bias, "relu", 0.5, C, 1.0)  # relu(0.5 A.B^T + bias) + C
    Y = torch.ops.gemm_ladder.swiglu(x, W_gu)     # silu(x . Wg^T) * (x . Wu^T), W_gu = cat([Wg, Wu])

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
``*_backward`` ops. dB comes out in B's dtype, as torch's own linear gives it: under autocast
over fp32 master weights autograd's cast node takes it to fp32 (see :func:`linear_grads`, which
``gemm_ladder.nn`` shares for its eager path). The real implementation is
:func:`gemm_ladder.matmul` on torch's current stream (under the op's autograd, with grad mode
off); A and B pass as they are when contiguous or a transposed view of a contiguous tensor, and
are made contiguous otherwise, as torch's own matmul takes any strides. B is always the [N, K]
of D = A . B^T (``mm(x, W.t())`` computes ``x . W``). Tensors off the GPU, or of another dtype,
get the front door's errors.

Warm a shape up once before capturing it in a CUDA graph: its first call loads the module.
"""

from __future__ import annotations

import torch

from .front import B_LAYOUT, check_activation, check_bias, fast_mm, is_transposed, matmul, swiglu
from .runtime import ModuleInputError

_DTYPES = (torch.float16, torch.bfloat16)

def _as_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the front door takes it without a copy: contiguous, or the transposed view of a
    contiguous tensor (an MN-major operand); anything else made contiguous."""
    return t if t.is_contiguous() or is_transposed(t) else t.contiguous()


def direct_mm(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None,
              activation: str | None = None) -> torch.Tensor:
    """What the op's implementation computes (act(A . B^T (+ bias))), called directly: for eager
    callers that do their own autograd (``gemm_ladder.nn``'s), without the custom op's dispatch
    (~150 us of host time a call in torch's Python machinery, measured on an H100). A plain call
    like one already checked goes straight to the front door's fast path (``front.fast_mm``)."""
    if bias is None and activation is None:
        done = fast_mm(A, B)
        if done is not None:
            return done
    return matmul(_as_operand(A), _as_operand(B), bias=None if bias is None else bias.contiguous(),
                  activation=activation)


def direct_swiglu(x: torch.Tensor, W_gu: torch.Tensor) -> torch.Tensor:
    """What ``torch.ops.gemm_ladder.swiglu`` computes, called directly (as :func:`direct_mm`)."""
    return swiglu(x.contiguous(), W_gu.contiguous())


def swiglu_grads(grad: torch.Tensor, x: torch.Tensor, W_gu: torch.Tensor, needs, gemm=None,
                 eager: bool = False, h: torch.Tensor | None = None, silu: torch.Tensor | None = None) -> tuple:
    """(dx, dW_gu) of ``Y = silu(x . Wg^T) * (x . Wu^T)``, ``W_gu = cat([Wg, Wu])``, from ``grad`` =
    dL/dY, each None where ``needs`` (two bools) says no; ``gemm`` as in :func:`linear_grads`.
    The pre-activations ``h = x . W_gu^T`` [..., 2N] are recomputed by one GEMM (the fused forward
    writes only Y), or taken from ``h`` where the forward kept them (and ``silu(gate)`` from
    ``silu``, eager only); then dh = [d_gate, d_up] and
    :func:`linear_grads`' two GEMMs over it: dx = dh . W_gu and dW_gu = dh^T . x, on our kernels
    where ``gemm`` is.

    dh, differentiable (the op's backward, one that builds a graph): in fp32, rounded once to x's
    dtype. ``eager`` (an eager backward that builds no graph: ``gemm_ladder.nn``'s):
    :func:`swiglu_dh`, torch's own autograd of the unfused ``silu(gate) * up`` in h's dtype, four
    passes over [..., N] tensors of that dtype where the fp32 formula makes some fifteen of fp32
    ones -- 3-4 ms a layer at 16384 x 2 x 5632 on an H100, which made the fused MLP's training step
    0.82x torch's (benchmarks/results/2026-11-26_h100_e2e_train_350/)."""
    gemm = gemm or mm
    if eager:
        dh = swiglu_dh(grad, gemm(x, W_gu) if h is None else h, silu)
    else:
        gate, up = gemm(x, W_gu).float().chunk(2, dim=-1)
        g, sig = grad.float(), torch.sigmoid(gate)
        # silu'(gate) = sig (1 + gate (1 - sig)) written out: aten's silu_backward has no derivative of
        # its own, and a backward that builds a graph (create_graph=True) differentiates this one
        dh = torch.cat([g * up * sig * (1 + gate * (1 - sig)), g * gate * sig], dim=-1).to(x.dtype)
    dx, dW, _ = linear_grads(dh, x, W_gu, (needs[0], needs[1], False), gemm)
    return dx, dW


def swiglu_dh(grad: torch.Tensor, h: torch.Tensor, silu: torch.Tensor | None = None) -> torch.Tensor:
    """dL/dh [..., 2N] of ``Y = silu(gate) * up``, ``h = [gate, up]``, from ``grad`` = dL/dY: what
    torch's autograd of the unfused formula gives, bit for bit (d_gate = silu_backward(grad . up,
    gate), d_up = grad . silu(gate), each op in fp32 inside and rounded to h's dtype), each half
    written in place into its slice of dh. ``silu``: the forward's ``silu(gate)``, kept as torch's
    autograd keeps it (one pass of [..., N] fewer). Not differentiable (``out=``)."""
    n = h.shape[-1] // 2
    gate, up, grad = h[..., :n], h[..., n:], grad.to(h.dtype)  # silu_backward takes one dtype
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=dh[..., :n])
    torch.mul(grad, torch.nn.functional.silu(gate) if silu is None else silu, out=dh[..., n:])
    return dh


def linear_grads(grad: torch.Tensor, A: torch.Tensor, B: torch.Tensor, needs, gemm=None) -> tuple:
    """(dA, dB, dbias) of ``D = A . B^T (+ bias)`` from ``grad`` = dL/dD, each None where ``needs``
    (three bools, autograd's ``needs_input_grad``) says no; ``gemm(x, y)``: x . y^T (default the
    op itself, which differentiates again). The GEMMs take transposed views, no copies: MN-major
    operands of our kernels. dA and dB come out in A's and B's dtype: for fp32 master weights
    under autocast, B is the weight's bf16 cast and autograd's cast node takes dB to fp32, as it
    does for torch's own ``F.linear`` (no rounding of ours on the way)."""
    gemm = gemm or mm
    dA = dB = dbias = None
    if needs[0]:
        dA = gemm(grad, B.t())  # [..., N] . ([K, N])^T: B's memory [N, K] is an MN-major B
    if needs[1]:
        g2, a2 = grad.reshape(-1, B.shape[0]).contiguous(), A.reshape(-1, A.shape[-1]).contiguous()
        dB = gemm(g2.t(), a2.t())  # [N, M] . ([K, M])^T: dD and A as they lie, an MN-major A and B
    if needs[2]:  # D[m, n] = ... + bias[n]: every row's dD[m, n] adds to it
        dbias = grad.reshape(-1, B.shape[0]).sum(0, dtype=torch.float32).to(grad.dtype)
    return dA, dB, dbias


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
    needs = ctx.needs_input_grad
    dA, dB, dbias = linear_grads(grad, A, B, (needs[0], needs[1], len(needs) > 2 and needs[2]))
    return (dA, dB, dbias, None)[:len(ctx.needs_input_grad)]


mm.register_autograd(_backward, setup_context=_setup_context)


# -- the fused epilogue with a scale and a residual (issue 31) ---------------------------------------
def _check_epilogue_meta(A, B, bias, activation, C, alpha, beta) -> None:
    """:func:`_check_meta`, and a residual of D's shape and dtype, finite float scales."""
    _check_meta(A, B, bias, activation)
    for name, value in (("alpha", alpha), ("beta", beta)):
        torch._check(value == value and abs(value) != float("inf"),
                     lambda name=name, value=value: f"gemm_ladder.mm_epilogue: {name}={value} is not finite")
    if C is not None:
        shape = (*A.shape[:-1], B.shape[0])
        torch._check(tuple(C.shape) == shape and C.dtype == A.dtype,
                     lambda: f"gemm_ladder.mm_epilogue: C is {tuple(C.shape)} {C.dtype}; it is added to D, "
                     f"{shape} {A.dtype}")


@torch.library.custom_op("gemm_ladder::mm_epilogue", mutates_args=())
def mm_epilogue(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
                alpha: float = 1.0, C: torch.Tensor | None = None, beta: float = 1.0) -> torch.Tensor:
    """D = act(alpha . A . B^T (+ bias)) (+ beta . C) through ``gemm_ladder.matmul`` (one kernel
    where a module serves; a new D: the in-place form is ``matmul(..., residual=C, out=C)``)."""
    _check_epilogue_meta(A, B, bias, activation, C, alpha, beta)
    return matmul(A.contiguous(), B.contiguous(), bias=None if bias is None else bias.contiguous(),
                  activation=activation, alpha=alpha, residual=None if C is None else C.contiguous(), beta=beta)


@mm_epilogue.register_fake
def _mm_epilogue_fake(A, B, bias=None, activation=None, alpha=1.0, C=None, beta=1.0):
    _check_epilogue_meta(A, B, bias, activation, C, alpha, beta)
    return A.new_empty((*A.shape[:-1], B.shape[0]))


def _epilogue_setup(ctx, inputs, output):  # pylint: disable=unused-argument
    A, B, bias, activation, alpha, C, beta = inputs
    ctx.activation = check_activation(activation, "gemm_ladder.mm_epilogue")
    ctx.alpha, ctx.beta, ctx.has_bias, ctx.has_c = alpha, beta, bias is not None, C is not None
    ctx.save_for_backward(A, B, *((bias,) if bias is not None else ()))


def _epilogue_backward(ctx, grad):
    """Recomputed in torch: Z = alpha A.B^T + bias (the activation's input), dZ through the
    activation, then dA = alpha dZ . B, dB = alpha dZ^T . A, dbias = sum of dZ, dC = beta dD."""
    A, B, *rest = ctx.saved_tensors
    g = grad
    if ctx.activation != "none":
        z = torch.matmul(A, B.t()) * ctx.alpha
        if ctx.has_bias:
            z = z + rest[0]
        g = activation_backward(grad, z, ctx.activation)
    g2 = g.reshape(-1, B.shape[0])
    dA = dB = dbias = dC = None
    if ctx.needs_input_grad[0]:
        dA = (torch.matmul(g, B) * ctx.alpha).to(A.dtype)
    if ctx.needs_input_grad[1]:
        dB = (torch.matmul(g2.t(), A.reshape(-1, A.shape[-1])) * ctx.alpha).to(B.dtype)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        dbias = g2.sum(0, dtype=torch.float32).to(g.dtype)
    if ctx.has_c and ctx.needs_input_grad[5]:
        dC = grad * ctx.beta
    return dA, dB, dbias, None, None, dC, None


mm_epilogue.register_autograd(_epilogue_backward, setup_context=_epilogue_setup)


# -- SwiGLU from a fused gate/up weight (issue 31) -------------------------------------------------------
def _check_swiglu_meta(x, W_gu) -> None:
    _check_meta(x, W_gu)
    torch._check(W_gu.shape[0] % 2 == 0, lambda: f"gemm_ladder.swiglu: W_gu has {W_gu.shape[0]} rows; it is "
                 "cat([W_gate, W_up]) [2N, K]")


@torch.library.custom_op("gemm_ladder::swiglu", mutates_args=())
def swiglu_op(x: torch.Tensor, W_gu: torch.Tensor) -> torch.Tensor:
    """silu(x . Wg^T) * (x . Wu^T) with W_gu = cat([Wg, Wu]) through ``gemm_ladder.swiglu`` (one
    kernel where a module serves)."""
    _check_swiglu_meta(x, W_gu)
    return swiglu(x.contiguous(), W_gu.contiguous())


@swiglu_op.register_fake
def _swiglu_fake(x, W_gu):
    _check_swiglu_meta(x, W_gu)
    return x.new_empty((*x.shape[:-1], W_gu.shape[0] // 2))


def _swiglu_setup(ctx, inputs, output):  # pylint: disable=unused-argument
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad):
    """:func:`swiglu_grads` with the op :func:`mm` as its GEMM, as :func:`_backward`'s: h = x . W_gu^T
    recomputed, dh = [dg, du] in fp32 by torch (dg = dY . u . silu'(g), du = dY . silu(g)) rounded
    once to x's dtype, then dx = dh . W_gu (W_gu's memory read as an MN-major B) and dW_gu = dh^T . x
    (both MN-major), fp32 accumulation: on our kernels where a module serves, torch's matmul where
    none does (the front door's fallback, the eager ``SwiGLUFunction``'s rule). The op's GEMMs
    differentiate again (a backward that builds a graph)."""
    x, W_gu = ctx.saved_tensors
    return swiglu_grads(grad, x, W_gu, ctx.needs_input_grad, mm)


swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)
