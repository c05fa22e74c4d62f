"""``torch.ops.gemm_ladder.scaled_mm``: the fp8 front door (``serve.scaled``) as a torch custom op.

    import gemm_ladder.serve.scaled_ops                  # registers the op (imports torch)
    D = torch.ops.gemm_ladder.scaled_mm(A, B, scale_a, scale_b, bias, torch.bfloat16)

Registered with ``torch.library.custom_op``, with a fake implementation that runs the same
checks (``scaled.check_call``: dtypes, shapes, layouts, the scales' recipe: tensor, row or block,
with block's M-major scale_a) and makes an empty
``[M, N]`` of ``out_dtype``, so ``torch.compile(fullgraph=True)`` traces a model that calls it and
``torch.export`` exports it. No autograd formula yet (fp8 training needs the e5m2 gradients'
recipes: issue 32's next slice).
"""

from __future__ import annotations

import torch

from .scaled import check_call, scaled_mm as _scaled_mm


@torch.library.custom_op("gemm_ladder::scaled_mm", mutates_args=())
def scaled_mm(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``gemm_ladder.scaled_mm`` (A [M, K] e4m3 row-major, B [K, N] column-major, fp32 scales), with
    grad mode off inside: the op registers no autograd formula, so torch itself refuses a backward
    through it, and the front door's own refusing backward (``scaled._no_backward``) is not added."""
    with torch.no_grad():
        return _scaled_mm(A, B, scale_a, scale_b, bias=bias, out_dtype=out_dtype)


@scaled_mm.register_fake
def _(A, B, scale_a, scale_b, bias=None, out_dtype=None):
    call = check_call(A, B, scale_a, scale_b, bias, out_dtype or torch.bfloat16)
    return A.new_empty((call.M, call.N), dtype=out_dtype or torch.bfloat16)
