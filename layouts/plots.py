"""Pictures of the layouts (matplotlib, Agg backend; imported only when a picture is drawn).

- :func:`plot_swizzle`: a tile, each element coloured by the group of 4 banks holding it. A
  row-major tile shows vertical stripes (a column sits in one bank group: reading down it
  conflicts); a 128B-swizzled tile shows every 8-row band cycling through all 8 groups.
- :func:`plot_swizzle_atom`: the 8 x (W/16) chunk permutation of one atom (the XOR table).
- :func:`plot_acc_fragment`: the wgmma 64xN f32 accumulator, coloured by warp, shaded by lane.
- :func:`write_all`: the standard set, for ``python -m gemm_ladder pictures``.
"""

from __future__ import annotations

from pathlib import Path

from .banks import conflict_report
from .fragments import acc_fragment_owner, check_n
from .swizzle import (
    BANK_BYTES,
    CHUNK_BYTES,
    LAYOUT_NAMES,
    NUM_BANKS,
    SWIZZLE_MODES,
    atom_table,
    dtype_bytes,
    dtype_name,
    tile_offsets,
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on build boxes and CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def plot_swizzle(dtype, shape, mode: str, path=None):
    """Tile (rows, cols) coloured by shared-memory bank under ``mode``; returns the Figure."""
    plt = _pyplot()
    shape = tuple(shape)[-2:]
    rows, cols = shape
    from matplotlib.colors import ListedColormap

    # a 16-byte chunk covers 4 banks; colour by that group so each chunk is one colour
    groups = NUM_BANKS * BANK_BYTES // CHUNK_BYTES
    group = (tile_offsets(dtype, shape, mode) // CHUNK_BYTES) % groups
    fig, ax = plt.subplots(figsize=(min(14, 2.5 + cols * 0.1), min(10, 1.5 + rows * 0.07)))
    cmap = ListedColormap(plt.get_cmap("tab10").colors[:groups])
    image = ax.imshow(group, cmap=cmap, vmin=-0.5, vmax=groups - 0.5, interpolation="nearest",
                      aspect="auto")
    per_chunk = CHUNK_BYTES // dtype_bytes(dtype)
    for c in range(0, cols + 1, per_chunk):  # 16-byte chunk boundaries
        ax.axvline(c - 0.5, color="black", lw=0.3)
    for r in range(0, rows + 1, 8):  # 8-row atom boundaries
        ax.axhline(r - 0.5, color="black", lw=0.6)
    rep = conflict_report(dtype, shape, mode, "ldmatrix")
    ax.set_title(f"{dtype_name(dtype)} {rows}x{cols}, {mode}: bank group per element\n"
                 f"ldmatrix reads: {rep.wavefronts} wavefronts, ideal {rep.ideal} "
                 f"({rep.ways:.0f}-way)")
    ax.set_xlabel("column (contiguous, K)")
    ax.set_ylabel("row")
    bar = fig.colorbar(image, ax=ax, ticks=range(groups))
    bar.ax.set_yticklabels([f"banks {4 * g}-{4 * g + 3}" for g in range(groups)])
    return _save(fig, path)


def plot_swizzle_atom(mode: str, path=None):
    """The 8-row chunk permutation of one ``mode`` atom: cell (r, c) = physical chunk."""
    plt = _pyplot()
    table = atom_table(mode)
    chunks = len(table[0])
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * chunks, 5))
    ax.imshow(table, cmap="tab10", vmin=0, vmax=10, interpolation="nearest")
    for r, line in enumerate(table):
        for c, phys in enumerate(line):
            ax.text(c, r, str(phys), ha="center", va="center", fontsize=11)
    ax.set_xticks(range(chunks))
    ax.set_yticks(range(len(table)))
    ax.set_xlabel("logical 16-byte chunk")
    ax.set_ylabel("row in atom")
    shift = {8: "row", 4: "row // 2", 2: "row // 4", 1: "no XOR"}[chunks]
    rule = shift if chunks == 1 else f"chunk ^ {shift}" if chunks == 8 else f"chunk ^ ({shift})"
    ax.set_title(f"{mode} atom: physical chunk\n({rule}, {chunks * CHUNK_BYTES} B rows)")
    return _save(fig, path)


def plot_acc_fragment(n: int, path=None):
    """The 64 x n accumulator: colour = warp, shade = lane, text = lane:reg (warp 0, n <= 32)."""
    import numpy as np

    plt = _pyplot()
    check_n(n)
    owner = acc_fragment_owner(n)
    thread, reg = owner[..., 0], owner[..., 1]
    warp, lane = thread // 32, thread % 32
    # one base colour per warp, lighter for higher lane
    base = np.array(plt.get_cmap("tab10").colors)[[0, 1, 2, 3]]
    shade = 0.35 + 0.65 * (lane[..., None] % 4 + 1) / 4
    rgb = 1 - (1 - base[warp]) * shade
    fig, ax = plt.subplots(figsize=(min(16, 2 + n * 0.5), 12))
    ax.imshow(rgb, interpolation="nearest", aspect="auto")
    if n <= 32:  # warp 0 spelled out; warps 1-3 repeat it 16 rows lower
        for row in range(16):
            for col in range(n):
                ax.text(col, row, f"{lane[row, col]}:{reg[row, col]}", ha="center",
                        va="center", fontsize=6)
    for w in range(1, 4):
        ax.text((n - 1) / 2, 16 * w + 7.5, f"warp {w}: same as warp 0", ha="center",
                va="center", fontsize=12)
    ax.set_xlabel("column (N)")
    ax.set_ylabel("row (M)")
    ax.set_title(f"wgmma m64n{n}k16 f32 accumulator: colour = warp (shade = lane % 4),\n"
                 "text = lane:register of warp 0")
    return _save(fig, path)


def write_all(folder) -> list[Path]:
    """Write the standard pictures into ``folder``; returns the paths written."""
    plt = _pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in SWIZZLE_MODES[1:]:
        path = folder / f"swizzle_atom_{mode}.png"
        plt.close(plot_swizzle_atom(mode, path))
        written.append(path)
    for mode in LAYOUT_NAMES:
        path = folder / f"banks_float16_128x64_{mode}.png"
        plt.close(plot_swizzle("float16", (128, 64), mode, path))
        written.append(path)
    for n in (16, 128):
        path = folder / f"acc_fragment_n{n}.png"
        plt.close(plot_acc_fragment(n, path))
        written.append(path)
    return written
