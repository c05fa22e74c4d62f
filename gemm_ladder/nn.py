"""``gemm_ladder.nn``: a drop-in ``nn.Linear`` on our kernels, and ``patch(model)`` to swap them in.

    import gemm_ladder.nn
    lin = gemm_ladder.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
    swapped = gemm_ladder.nn.patch(model)      # every nn.Linear of model, in place; prints and returns the names

:class:`Linear` is ``nn.Linear`` (its parameters, initialisation and state dict are nn.Linear's:
a checkpoint loads either way) whose forward is the front door's kernels, and whose backward is
``torch.ops.gemm_ladder.mm``'s (dX and dW read their operands as transposed views: MN-major
operands, no copies; ``serve.ops.linear_grads``). Traced (``torch.compile``, ``torch.export``,
fake tensors, functorch) it calls the registered op, which the tracer sees; eager it skips the
custom op's dispatch, ~150 us of torch's Python machinery per call that made a training step
host-bound (0.52x torch), and calls the same implementation through an
``autograd.Function`` (with grad) or directly (without): the same kernels, the same gradients.
Where the op does not apply -- a tensor off the GPU, a dtype other than fp16/bf16, x and the
weight in different dtypes -- it is ``F.linear``, as nn.Linear computes it. Under
``torch.autocast`` it casts x, the weight and the bias to the autocast dtype first, as autocast
does for ``F.linear`` (the op itself has no autocast rule): one cast of the weight per call,
whose backward takes the bf16 dW to the fp32 master weight's dtype, as torch's does (torch also
reuses a weight's cast within one autocast region; a layer called once per step, as here, casts
once either way).

:func:`patch` swaps every module whose type is exactly ``nn.Linear`` (subclasses keep their own
forward) for a :class:`Linear` that shares its parameters (the same ``Parameter`` objects: an
optimizer built before the patch, tied weights and hooks on them stay valid). It does not fuse a
Linear with the activation after it yet (the op takes ``activation=``; recognising the pairs in
a model's forward is the next step).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from .serve import ops  # registers torch.ops.gemm_ladder.mm

_DTYPES = (torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, nn.Parameter)


def traced(*tensors) -> bool:
    """Whether a call must go through the registered op for a tracer to see it: under
    ``torch.compile``/``torch.export``, a dispatch mode (fake tensors, make_fx), a functorch
    transform, or with a tensor subclass."""
    # pylint: disable=protected-access
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active()
            or any(t is not None and type(t) not in _PLAIN for t in tensors))


class LinearFunction(torch.autograd.Function):
    """``x . W^T (+ bias)`` eager: the op's forward and backward (``ops.direct_mm``,
    ``ops.linear_grads``) without the custom op's dispatch. Saves x and W as the op does (the
    tensors themselves, no copies); a backward that builds a graph (``create_graph=True``) calls
    the op, which differentiates again."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # pylint: disable=arguments-differ
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return ops.direct_mm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):  # pylint: disable=arguments-differ
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        gemm = torch.ops.gemm_ladder.mm if torch.is_grad_enabled() else ops.direct_mm
        return ops.linear_grads(grad, x, weight, (needs[0], needs[1], ctx.has_bias and needs[2]), gemm)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the front door's kernels, for tensors :func:`uses_kernel`
    takes (in one dtype: cast them first under autocast): the registered op where traced, else
    its implementation directly, through :class:`LinearFunction` where a gradient is wanted."""
    if traced(x, weight, bias):
        return torch.ops.gemm_ladder.mm(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return LinearFunction.apply(x, weight, bias)
    return ops.direct_mm(x, weight, bias)


def uses_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :class:`Linear` runs ``x`` through the op (else ``F.linear``)."""
    return x.is_cuda and weight.is_cuda and x.dtype == weight.dtype and x.dtype in _DTYPES


class Linear(nn.Linear):
    """``nn.Linear`` whose forward is ``torch.ops.gemm_ladder.mm`` (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pylint: disable=arguments-renamed
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled(x.device.type):
            cast = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(cast), weight.to(cast)
            bias = bias.to(cast) if bias is not None else None
        if not uses_kernel(x, weight):
            return F.linear(x, weight, bias)
        return linear(x, weight, bias)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Linear":
        """A :class:`Linear` over ``lin``'s own parameters (shared, not copied)."""
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"Linear.from_linear takes an nn.Linear, got {type(lin).__name__}")
        new = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta",
                  dtype=lin.weight.dtype)
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new


def patch(model: nn.Module, verbose: bool = True) -> list[str]:
    """Swap every ``nn.Linear`` of ``model`` (type exactly nn.Linear) for a :class:`Linear` over the
    same parameters, in place; the swapped modules' names (``""`` for ``model`` itself, which
    cannot be swapped in place: it is refused), printed to stderr when ``verbose``."""
    if type(model) is nn.Linear:  # pylint: disable=unidiomatic-typecheck
        raise TypeError("patch(model) swaps the nn.Linear layers inside model; for one layer use "
                        "gemm_ladder.nn.Linear.from_linear(layer)")
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:  # pylint: disable=unidiomatic-typecheck
                setattr(module, child_name, Linear.from_linear(child))
                swapped.append(f"{name}.{child_name}" if name else child_name)
    if verbose:
        print(f"gemm_ladder.nn.patch: {len(swapped)} nn.Linear layer(s) now run on gemm_ladder's kernels"
              + "".join(f"\n  {s}" for s in swapped), file=sys.stderr)
    return swapped
