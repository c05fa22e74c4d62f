"""Tutorial 15 (layouts and the backward pass): which operand of which GEMM of a training step is
K-major, and what an MN-major operand changes in a built kernel: the TMA boxes (read from the
lowered host code by the barrier checker's :mod:`gemm_ladder.protocol.kernel_ir`) and the wgmma
descriptor fields (the plan's, :class:`gemm_ladder.sm90a.common.HopperPlan`).

Imports TVM (through the plan and the lowering): ``from gemm_ladder.teach import operands``.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import layouts

from ..core.config import GemmConfig
from ..core.spec import OPERAND_LAYOUTS, spec_of
from ..protocol import kernel_ir
from ..serve import ops
from ..serve.front import operand_majors
from ..sm90a.common import HopperPlan
from .plots import _figure, _rect

# the GEMMs of one nn.Linear (Y = X . W^T, X [T, in], W [out, in]) in a training step, as the op
# calls the front door (gemm_ladder.serve.ops): (name, formula, A as passed, B as passed, layout)
TRAINING_GEMMS = (
    ("forward", "Y = X . W^T", "X [T, in]", "W [out, in]", "KK"),
    ("dX", "dX = dY . W", "dY [T, out]", "W.t(): [in, out] view of W", "KN"),
    ("dW", "dW = dY^T . X", "dY.t(): [out, T] view of dY", "X.t(): [in, T] view of X", "MN"),
)


def training_rows(tokens: int, d_in: int, d_out: int) -> list[dict]:
    """One row per GEMM of an ``nn.Linear(d_in, d_out)`` over ``tokens`` rows: its M, N, K (D is
    [M, N], the reduction K deep), the operands as passed, and how each lies in memory: K-major
    (the reduction dimension contiguous) or M/N-major (:data:`gemm_ladder.core.spec.OPERAND_LAYOUTS`)."""
    mnk = {"forward": (tokens, d_out, d_in), "dX": (tokens, d_in, d_out), "dW": (d_out, d_in, tokens)}
    rows = []
    for name, formula, a, b, layout in TRAINING_GEMMS:
        a_major, b_major = OPERAND_LAYOUTS[layout]
        M, N, K = mnk[name]
        rows.append({"GEMM": name, "formula": formula, "M x N x K": f"{M}x{N}x{K}", "A": a, "B": b,
                     "A major": a_major, "B major": b_major, "spec layout": layout})
    return rows


def operand_rows(cfg: GemmConfig) -> list[dict]:
    """Per operand of ``cfg`` (A, B): how it lies in global memory, the TMA box that loads it (from
    the lowered kernel: innermost dimension last here, as a row-major shape reads), the shared
    tile (one ring stage), and the wgmma descriptor fields in 16-byte units (LBO, SBO, the add per
    16-deep K step, per further 64 rows of M or N) and the transpose immediate."""
    plan = HopperPlan(cfg)
    maps = kernel_ir.load(cfg).tensormaps
    spec = spec_of(cfg)
    rows = []
    for name, major, desc, shape, rows_of in (("A", spec.a_major, plan.desc_a, plan.a_shape(1)[1:], "M"),
                                              ("B", spec.b_major, plan.desc_b, plan.b_shape(1)[1:], "N")):
        tmap = maps[f"{name}_tensormap"]  # dims and box innermost first, as cuTensorMapEncodeTiled takes them
        stored = f"[{rows_of}, K]" if major == "K" else f"[K, {rows_of}]"
        box = tuple(reversed(tmap.box))
        rows.append({"operand": name, "major": major, "in global": f"{stored} = {list(reversed(tmap.dims))}",
                     "TMA box": "x".join(map(str, box)), "smem tile": "x".join(map(str, shape)),
                     "LBO": desc.ldo, "SBO": desc.sdo, "K step +": desc.k_step, "64 rows +": desc.row_block_step,
                     "trans": desc.trans})
    return rows


class _OpCalls(TorchDispatchMode):
    """Records every call of ``torch.ops.gemm_ladder.mm`` under it: its A and B as passed."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.gemm_ladder.mm.default:
            self.calls.append(args[:2])
        return func(*args, **(kwargs or {}))


def _view(t: torch.Tensor) -> str:
    return f"{list(t.shape)} stride {list(t.stride())}"


def autograd_calls(tokens: int, d_in: int, d_out: int, activation: str | None = None, bias: bool = True,
                   dtype=torch.bfloat16) -> list[dict]:
    """The GEMMs one forward and backward of ``torch.ops.gemm_ladder.mm`` (a Linear layer: X
    [tokens, d_in], W [d_out, d_in]) runs, recorded on the ``meta`` device (shapes and strides, no
    data, no GPU): each call's A and B as passed and the layout the front door reads them in
    (:func:`gemm_ladder.serve.front.operand_majors`: a transposed view is an MN-major operand)."""
    meta = {"device": "meta", "dtype": dtype, "requires_grad": True}
    X, W = torch.empty(tokens, d_in, **meta), torch.empty(d_out, d_in, **meta)
    b = torch.empty(d_out, **meta) if bias else None
    with _OpCalls() as log:
        Y = ops.mm(X, W, b, activation)
        Y.backward(torch.empty_like(Y))  # dY as a loss would give it: [tokens, d_out], contiguous
    steps = ["forward"] + (["backward: Z again"] if activation else []) + ["backward: dX", "backward: dW"]
    if len(steps) != len(log.calls):
        raise RuntimeError(f"the op made {len(log.calls)} GEMM calls, not the {len(steps)} this table names: "
                           "gemm_ladder.serve.ops._backward changed; update autograd_calls")
    rows = []
    for step, (A, B) in zip(steps, log.calls):
        a_major, b_major = operand_majors(A, B)
        rows.append({"call": step, "A": _view(A), "B": _view(B), "A major": a_major, "B major": b_major,
                     "D": f"{A.shape[0]}x{B.shape[0]}"})
    return rows


def plot_operand_tiles(rows: int = 128, blk_k: int = 64, dtype: str = "float16"):
    """One ring stage of an operand tile (``rows`` of M or N by ``blk_k`` of K) in shared memory,
    K-major (left: from A [M, K]) and MN-major (right: from A [K, M]), drawn in 128-byte swizzle
    atoms (8 lines of 128 bytes), with the TMA boxes that fill it and the descriptor steps wgmma
    walks (:func:`layouts.operand_desc_fields`, in 16-byte units)."""
    fig = _figure(figsize=(12, 5.2))
    ax_k, ax_mn = fig.subplots(1, 2)
    line = 128 // layouts.dtype_bytes(dtype)  # elements in one 128-byte line of an atom
    for ax, major in ((ax_k, "K"), (ax_mn, "MN")):
        shape = (rows, blk_k) if major == "K" else (blk_k, rows)
        d = layouts.operand_desc_fields(dtype, shape, major)
        lines, width = shape  # smem lines (rows of the tile) and elements per line of the tile
        blocks = width // line  # atom columns: each holds all the tile's lines, one after the other
        for b in range(blocks):
            for a in range(lines // 8):
                _rect(ax, b * line, a * 8, line, 8, facecolor="tab:blue" if (a + b) % 2 else "tab:cyan", alpha=0.35,
                      edgecolor="black", lw=0.4)
        box_w = width if major == "K" else 64  # TMA boxes: the whole K-major slice, 64-wide MN-major columns
        for x in range(0, width, box_w):
            _rect(ax, x, 0, box_w, lines, fill=False, edgecolor="tab:red", lw=2, ls="--")
        ax.text(width / 2, -6 if major == "K" else -4, f"TMA box {lines}x{box_w}" + ("" if box_w == width
                else f", {width // box_w} per slice"), ha="center", color="tab:red", fontsize=8)
        arrow = dict(arrowstyle="->", lw=1.5)
        if major == "K":
            ax.annotate("", (16, 4), (0, 4), arrowprops={**arrow, "color": "tab:green"})
            ax.text(17, 4.5, f"K step (16 of K = 32 B): +{d.k_step}", fontsize=8, color="tab:green", va="center")
            ax.annotate("", (8, 20), (8, 12), arrowprops={**arrow, "color": "tab:purple"})
            ax.text(9, 17, f"SBO: next 8 rows of M = +{d.sdo}", fontsize=8, color="tab:purple")
            ax.text(2, 68, f"64 rows of M further (next wgmma atom): +{d.row_block_step}", fontsize=8)
            ax.set_xlabel(f"K ({blk_k} per slice): contiguous")
            ax.set_ylabel(f"M rows ({rows})")
            ax.set_title(f"K-major: A [M, K] -> tile [{rows}, {blk_k}]; LBO {d.ldo} (unused), trans 0", fontsize=9)
        else:
            ax.annotate("", (8, 16), (8, 0), arrowprops={**arrow, "color": "tab:green"})
            ax.text(9, 13, f"K step (16 rows of K): +{d.k_step}", fontsize=8, color="tab:green")
            ax.annotate("", (line / 2, 12), (line / 2, 4), arrowprops={**arrow, "color": "tab:purple"})
            ax.text(line / 2 + 1, 9, f"SBO: next 8 rows of K = +{d.sdo}", fontsize=8, color="tab:purple")
            if blocks > 1:
                ax.annotate("", (line + 8, 30), (8, 30), arrowprops={**arrow, "color": "tab:orange"})
                ax.text(10, 28, f"LBO: next {line} of M = +{d.ldo}", fontsize=8, color="tab:orange")
            ax.set_xlabel(f"M ({rows}): contiguous")
            ax.set_ylabel(f"K rows ({blk_k} per slice)")
            ax.set_title(f"MN-major: A [K, M] -> tile [{blk_k}, {rows}]; trans 1 (16-bit types only)", fontsize=9)
        ax.set_xlim(-2, max(width, 64) + 2)
        ax.set_ylim(lines + 2, -10)
        ax.set_aspect("auto")
    return fig
