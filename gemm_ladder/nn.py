"""``gemm_ladder.nn``: a drop-in ``nn.Linear`` on our kernels, and ``patch(model)`` to swap them in.

    import gemm_ladder.nn
    lin = gemm_ladder.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
    swapped = gemm_ladder.nn.patch(model)      # every nn.Linear of model, in place; prints and returns the names

:class:`Linear` is ``nn.Linear`` (its parameters, initialisation and state dict are nn.Linear's:
a checkpoint loads either way) whose forward is ``torch.ops.gemm_ladder.mm(x, weight, bias)``: the
front door's kernels for the forward, and through the op's autograd for the backward (dX and dW
read their operands as transposed views: MN-major operands, no copies). Where the op does not
apply -- a tensor off the GPU, a dtype other than fp16/bf16, x and the weight in different dtypes
-- it is ``F.linear``, as nn.Linear computes it. Under ``torch.autocast`` it casts x, the weight
and the bias to the autocast dtype first, as autocast does for ``F.linear`` (the op itself has no
autocast rule).

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

from .serve import ops  # noqa: F401  (registers torch.ops.gemm_ladder.mm)

_DTYPES = (torch.float16, torch.bfloat16)


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
        return torch.ops.gemm_ladder.mm(x, weight, bias)

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
