"""Pictures of tile orders and of their modelled DRAM traffic (matplotlib, Agg).

``write_all(folder)`` writes the standard set that ``python -m gemm_ladder pictures``
publishes; each ``plot_*`` function returns its Figure and writes ``path`` if given.

Figures are built on matplotlib's Agg canvas directly, not through pyplot: no display
is needed, the caller's pyplot backend is left alone, and nothing has to be closed.
matplotlib is imported on the first call, so ``import schedulers`` stays light.
"""

from __future__ import annotations

import math
import os

from .orders import ORDERS, visit_grid
from .traffic import DEFAULT_GROUP_SIZES, dram_traffic

# H100 SXM: 132 SMs, 50 MB L2.  Only defaults for pictures; kernels ask the device.
_PICTURE_CTAS = 132
_PICTURE_L2 = 50 * 1024 * 1024


def _figure(**kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path):
    if path is not None:
        folder = os.path.dirname(os.fspath(path))
        if folder:
            os.makedirs(folder, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def plot_order(
    order: str,
    num_m: int,
    num_n: int,
    num_ctas: int,
    l2_group_size: int = 8,
    path=None,
):
    """The tile grid coloured by visit order (left) and by wave (right)."""
    grid = visit_grid(order, num_m, num_n, l2_group_size)
    wave = [[w // num_ctas for w in row] for row in grid]
    fig = _figure(figsize=(2 + 0.9 * num_n, 0.5 + 0.45 * num_m))
    axes = fig.subplots(1, 2)
    panels = (
        (axes[0], grid, "viridis", "visit order (work index)"),
        (axes[1], wave, "tab20", f"wave ({num_ctas} CTAs)"),
    )
    for ax, values, cmap, title in panels:
        ax.imshow(values, cmap=cmap, interpolation="nearest", aspect="equal")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("n tile")
        ax.set_ylabel("m tile")
        if num_m * num_n <= 24 * 24:  # numbers stay readable up to here
            for m in range(num_m):
                for n in range(num_n):
                    ax.text(n, m, str(values[m][n]), ha="center", va="center", fontsize=6,
                            color="white")
    fig.suptitle(f"{order} order, {num_m} x {num_n} tiles, l2_group_size={l2_group_size}",
                 fontsize=10)
    return _save(fig, path)


def plot_traffic_vs_group(
    M: int,
    N: int,
    K: int,
    blk_m: int = 128,
    blk_n: int = 128,
    num_ctas: int = _PICTURE_CTAS,
    l2_bytes: int = _PICTURE_L2,
    orders=("grouped", "snake", "serpentine"),
    group_sizes=DEFAULT_GROUP_SIZES,
    dtype_bytes: int = 2,
    path=None,
):
    """Modelled DRAM reads of A and B against ``l2_group_size``, one line per order.

    Row and column orders (no group size) and the compulsory traffic are drawn as
    horizontal lines.  Sizes where an order does not cover the grid are left blank.
    """
    fig = _figure(figsize=(7, 4))
    ax = fig.subplots()
    args = (M, N, K, blk_m, blk_n, num_ctas, l2_bytes)
    for order in orders:
        totals = []
        for g in group_sizes:
            try:
                t = dram_traffic(order, *args, l2_group_size=g, dtype_bytes=dtype_bytes)
                totals.append(t.total_bytes / 1e9)
            except ValueError:
                totals.append(math.nan)
        ax.plot(group_sizes, totals, marker="o", label=order)
    for order, style in (("row", ":"), ("column", "-.")):
        t = dram_traffic(order, *args, dtype_bytes=dtype_bytes)
        ax.axhline(t.total_bytes / 1e9, linestyle=style, color="gray", label=order)
    floor = (M + N) * K * dtype_bytes / 1e9
    ax.axhline(floor, color="black", linewidth=0.8, label="compulsory (A + B once)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(group_sizes), [str(g) for g in group_sizes])
    ax.set_xlabel("l2_group_size")
    ax.set_ylabel("DRAM reads of A and B (GB)")
    ax.set_title(
        f"{M}x{N}x{K}, {blk_m}x{blk_n} tiles, {num_ctas} CTAs, "
        f"L2 {l2_bytes / 2**20:.0f} MiB (model)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def write_all(folder) -> list[str]:
    """Write the standard pictures into ``folder``; returns the paths written."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for order in ORDERS:
        # 10 rows with groups of 4 leave a tail group of 2; 13 CTAs make waves that
        # cut across groups.  16 columns keep TVM's serpentine on a grid it covers.
        path = os.path.join(folder, f"order_{order}.png")
        plot_order(order, 10, 16, 13, 4, path=path)
        paths.append(path)
    for M, N, K in ((8192, 8192, 8192), (16384, 16384, 4096)):
        path = os.path.join(folder, f"traffic_vs_group_{M}x{N}x{K}.png")
        plot_traffic_vs_group(M, N, K, path=path)
        paths.append(path)
    return paths
