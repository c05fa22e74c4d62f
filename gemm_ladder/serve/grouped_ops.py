"""``torch.ops.gemm_ladder.grouped_mm``: the grouped front door as a torch custom op.

    import gemm_ladder.serve.grouped_ops                      # registers the op (imports torch)
    D = torch.ops.gemm_ladder.grouped_mm(A, W, offs)          # A [M, K], W [E, N, K], offs [E] int32
    D = torch.ops.gemm_ladder.grouped_mm_masked(A, W, counts) # A [E, T, K], counts [E] -> D [E, T, N]
    H = torch.ops.gemm_ladder.grouped_swiglu(A, W_gu, offs)   # W_gu [E, 2I, K] -> H [M, I] = silu(gate) * up
    H = torch.ops.gemm_ladder.grouped_swiglu_masked(A, W_gu, counts)  # A [E, T, K] -> H [E, T, I], zeros after
    D = torch.ops.gemm_ladder.scaled_grouped_mm(A, W, scale_a, scale_b, offs)  # fp8 e4m3, rowwise scales

Registered with ``torch.library.custom_op`` with a fake implementation (shapes and dtypes only:
D is ``[M, N]`` for any M, so a traced model's token count may be dynamic), so
``torch.compile(fullgraph=True)`` traces a MoE layer that calls it without a graph break. The real
implementation is :func:`gemm_ladder.serve.grouped.grouped_mm` on torch's current stream; inputs
are made contiguous first (free when they are). No backward yet (the grouped GEMM's dA and dW are
grouped GEMMs of other layouts): a call that needs one raises the front door's error.

The masked op returns zeros in each expert's rows past its count (the front door's fresh output
leaves them unspecified): a functional op's output must be a function of its inputs, or a compiled
graph that reads those rows would differ from eager. The zeroing is one memset of D.
"""

from __future__ import annotations

import torch

from .grouped import check_grouped, grouped_mm as _grouped_mm
from .grouped_fp8 import check_call as check_scaled_grouped, scaled_grouped_mm as _scaled_grouped_mm
from .grouped_masked import check_masked, grouped_mm_masked as _grouped_mm_masked
from .grouped_swiglu import check_swiglu, check_swiglu_masked, grouped_swiglu as _grouped_swiglu
from .grouped_swiglu import grouped_swiglu_masked as _grouped_swiglu_masked


@torch.library.custom_op("gemm_ladder::grouped_mm", mutates_args=())
def grouped_mm(A: torch.Tensor, W: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """D [M, N]: expert e's rows ``[offs[e-1], offs[e])`` of A times ``W[e]^T``."""
    check_grouped(A, W, offs, who="gemm_ladder.grouped_mm op")
    return _grouped_mm(A.contiguous(), W.contiguous(), offs.contiguous())


@grouped_mm.register_fake
def _grouped_mm_fake(A: torch.Tensor, W: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    check_grouped(A, W, offs, who="gemm_ladder.grouped_mm op")
    return A.new_empty((A.shape[0], W.shape[1]))


@torch.library.custom_op("gemm_ladder::grouped_mm_masked", mutates_args=())
def grouped_mm_masked(A: torch.Tensor, W: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """D [E, max_tokens, N]: ``D[e, :c] = A[e, :c] . W[e]^T`` (c = counts[e] clamped), zeros after."""
    check_masked(A, W, counts, who="gemm_ladder.grouped_mm_masked op")
    out = A.new_zeros((A.shape[0], A.shape[1], W.shape[1]))
    return _grouped_mm_masked(A.contiguous(), W.contiguous(), counts.contiguous(), out=out)


@grouped_mm_masked.register_fake
def _grouped_mm_masked_fake(A: torch.Tensor, W: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    check_masked(A, W, counts, who="gemm_ladder.grouped_mm_masked op")
    return A.new_empty((A.shape[0], A.shape[1], W.shape[1]))


@torch.library.custom_op("gemm_ladder::grouped_swiglu", mutates_args=())
def grouped_swiglu(A: torch.Tensor, W_gu: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """H [M, I]: expert e's rows of ``silu(A . W_gu[e, :I]^T) * (A . W_gu[e, I:]^T)``."""
    check_swiglu(A, W_gu, offs, who="gemm_ladder.grouped_swiglu op")
    return _grouped_swiglu(A.contiguous(), W_gu.contiguous(), offs.contiguous())


@grouped_swiglu.register_fake
def _grouped_swiglu_fake(A: torch.Tensor, W_gu: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # [M, I] for any M: a traced MoE layer's token count stays dynamic
    check_swiglu(A, W_gu, offs, who="gemm_ladder.grouped_swiglu op")
    return A.new_empty((A.shape[0], W_gu.shape[1] // 2))


@torch.library.custom_op("gemm_ladder::grouped_swiglu_masked", mutates_args=())
def grouped_swiglu_masked(A: torch.Tensor, W_gu: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """H [E, max_tokens, I]: each slot's first counts[e] rows of silu(gate) * up, zeros after (as
    grouped_mm_masked's op: a functional op's output is a function of its inputs)."""
    check_swiglu_masked(A, W_gu, counts, who="gemm_ladder.grouped_swiglu_masked op")
    out = A.new_zeros((A.shape[0], A.shape[1], W_gu.shape[1] // 2))
    return _grouped_swiglu_masked(A.contiguous(), W_gu.contiguous(), counts.contiguous(), out=out)


@grouped_swiglu_masked.register_fake
def _grouped_swiglu_masked_fake(A: torch.Tensor, W_gu: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    check_swiglu_masked(A, W_gu, counts, who="gemm_ladder.grouped_swiglu_masked op")
    return A.new_empty((A.shape[0], A.shape[1], W_gu.shape[1] // 2))
@torch.library.custom_op("gemm_ladder::scaled_grouped_mm", mutates_args=())
def scaled_grouped_mm(A: torch.Tensor, W: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offs: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """D [M, N]: expert e's rows of A times ``W[e]^T``, scaled by each token's and each expert column's
    scale (``gemm_ladder.scaled_grouped_mm``: e4m3 A [M, K], W [E, N, K] or torch's [E, K, N] view)."""
    return _scaled_grouped_mm(A, W, scale_a, scale_b, offs, out_dtype=out_dtype)


@scaled_grouped_mm.register_fake
def _scaled_grouped_mm_fake(A, W, scale_a, scale_b, offs, out_dtype=None):
    call = check_scaled_grouped(A, W, scale_a, scale_b, offs, out_dtype)
    return A.new_empty((call.M, call.N), dtype=getattr(torch, call.out_dtype))
