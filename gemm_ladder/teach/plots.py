"""Pictures of the rungs for the tutorials, drawn on matplotlib's Agg canvas (no display needed)
and handed to the notebook as PNG by :func:`show`. matplotlib is imported on the first picture.
"""

from __future__ import annotations

import io
import math

from schedulers.pipeline import pipeline_schedule

from ..core import budget
from .built import config_of


def _figure(**kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def show(fig, dpi: int = 90) -> None:
    """Put ``fig`` into the notebook as a PNG (works whatever matplotlib backend is active), then
    close it if pyplot holds it, so it is not drawn twice."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    try:
        from IPython.display import Image, display  # pylint: disable=import-outside-toplevel

        display(Image(data=buf.getvalue(), format="png"))
    except ImportError:
        print(f"<figure: {len(buf.getvalue())} bytes of PNG; run in Jupyter to see it>")
    try:
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

        plt.close(fig)
    except Exception:  # pylint: disable=broad-except
        pass


def _rect(ax, x, y, w, h, **kw):
    from matplotlib.patches import Rectangle  # pylint: disable=import-outside-toplevel

    ax.add_patch(Rectangle((x, y), w, h, **kw))


def plot_k_loop(cfg) -> object:
    """v2's K loop: the A and B panels of one output tile cut into ``blk_k`` slices (left), and one
    CTA's time line (right): every slice is copied by all threads, then multiplied, with a CTA
    barrier after each step, so copies and wgmmas take turns."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    c = config_of(cfg)
    kt = c.k_tiles
    colors = matplotlib.colormaps["viridis"]
    fig = _figure(figsize=(13, 4.2))
    ax_a, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    for name, rows, y0 in (("A", c.blk_m, 0), ("B", c.blk_n, c.blk_m + 40)):
        for k in range(kt):
            w = min(c.blk_k, c.K - k * c.blk_k)
            _rect(ax_a, k * c.blk_k, y0, w, rows, facecolor=colors(k / max(1, kt - 1)), edgecolor="black", lw=0.6)
            ax_a.text(k * c.blk_k + w / 2, y0 + rows / 2, f"{name}[:, {k}]", ha="center", va="center",
                      fontsize=7, color="white", rotation=90)
        ax_a.text(-8, y0 + rows / 2, f"{name}\n{rows} rows", ha="right", va="center", fontsize=9)
    ax_a.set_xlim(-60, c.K + 5)
    ax_a.set_ylim(-5, c.blk_m + c.blk_n + 45)
    ax_a.invert_yaxis()
    ax_a.set_xlabel("K")
    ax_a.set_yticks([])
    ax_a.set_title(f"Dreg = sum over k of A[:, k] . B[:, k]^T  ({kt} slices of {c.blk_k})", fontsize=9)
    # time line: copy (all threads) | barrier | wgmma | barrier
    t = 0.0
    copy, mma = 1.0, 0.8
    for k in range(kt):
        col = colors(k / max(1, kt - 1))
        _rect(ax_t, t, 1, copy, 0.8, facecolor=col, alpha=0.5, edgecolor="black", lw=0.5)
        ax_t.text(t + copy / 2, 1.4, f"copy {k}", ha="center", va="center", fontsize=7)
        t += copy
        ax_t.axvline(t, color="red", lw=0.8, ls=":")
        _rect(ax_t, t, 0, mma, 0.8, facecolor=col, edgecolor="black", lw=0.5)
        ax_t.text(t + mma / 2, 0.4, "=" if k == 0 else "+=", ha="center", va="center", fontsize=8, color="white")
        t += mma
        ax_t.axvline(t, color="red", lw=0.8, ls=":")
    ax_t.set_yticks([0.4, 1.4], ["wgmma", "copy"])
    ax_t.set_xlim(0, t)
    ax_t.set_ylim(-0.2, 2.0)
    ax_t.set_xlabel("time (illustrative units); red: CTA barrier (bar.sync)")
    ax_t.set_title("one CTA: all threads copy (ld.global, st.shared), then the warpgroup's wgmmas;\n"
                   "slice 0 writes the accumulators (=, scale-d 0), the others add (+=)", fontsize=9)
    return fig


def plot_cta_grid(cfg) -> object:
    """v3's grid: D cut into ``blk_m x blk_n`` tiles, one CTA each (left); the parts of edge tiles
    past M or N (hatched) are computed on zeros and not stored. Right: the K slices of one A
    panel; the part of the last slice past K is zero-filled in shared memory."""
    c = config_of(cfg)
    gm, gn = c.grid_mn
    fig = _figure(figsize=(12, 4.6))
    ax_d, ax_k = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    for bx in range(gm):
        for by in range(gn):
            x, y = by * c.blk_n, bx * c.blk_m
            _rect(ax_d, x, y, c.blk_n, c.blk_m, facecolor="none", edgecolor="black", lw=1)
            inside_w, inside_h = min(c.blk_n, c.N - x), min(c.blk_m, c.M - y)
            _rect(ax_d, x, y, inside_w, inside_h, facecolor="tab:blue", alpha=0.25 + 0.5 * ((bx + by) % 2), lw=0)
            if inside_w < c.blk_n:
                _rect(ax_d, x + inside_w, y, c.blk_n - inside_w, c.blk_m, facecolor="none", hatch="//",
                      edgecolor="gray", lw=0)
            if inside_h < c.blk_m:
                _rect(ax_d, x, y + inside_h, c.blk_n, c.blk_m - inside_h, facecolor="none", hatch="//",
                      edgecolor="gray", lw=0)
            ax_d.text(x + c.blk_n / 2, y + c.blk_m / 2, f"CTA ({bx},{by})", ha="center", va="center", fontsize=8)
    _rect(ax_d, 0, 0, c.N, c.M, facecolor="none", edgecolor="red", lw=2)
    ax_d.set_xlim(-5, gn * c.blk_n + 5)
    ax_d.set_ylim(gm * c.blk_m + 5, -5)
    ax_d.set_xlabel(f"N = {c.N} (red: D's edge)")
    ax_d.set_ylabel(f"M = {c.M}")
    ax_d.set_title(f"grid {gm} x {gn} CTAs, tiles {c.blk_m}x{c.blk_n}; hatched: past the edge, not stored", fontsize=9)
    for k in range(c.k_tiles):
        x = k * c.blk_k
        inside = min(c.blk_k, c.K - x)
        _rect(ax_k, x, 0, inside, c.blk_m, facecolor="tab:green", alpha=0.3 + 0.4 * (k % 2), edgecolor="black", lw=0.6)
        if inside < c.blk_k:
            _rect(ax_k, x + inside, 0, c.blk_k - inside, c.blk_m, facecolor="none", hatch="xx",
                  edgecolor="gray", lw=0.6)
            ax_k.text(x + inside + (c.blk_k - inside) / 2, c.blk_m / 2, f"{c.blk_k - inside} cols\nzeros", ha="center",
                      va="center", fontsize=7)
        ax_k.text(x + inside / 2, -6, f"k={k}", ha="center", fontsize=7)
    ax_k.axvline(c.K, color="red", lw=2)
    ax_k.set_xlim(-5, c.k_tiles * c.blk_k + 5)
    ax_k.set_ylim(c.blk_m + 5, -15)
    ax_k.set_xlabel(f"K = {c.K} (red)")
    ax_k.set_yticks([])
    ax_k.set_title(f"A panel of one CTA: {c.k_tiles} K slices; past K: zeros in Asmem (add nothing)", fontsize=9)
    return fig


def plot_tma_box(cfg, tile=None, k: int = 0) -> object:
    """v4: the two TMA boxes of one K slice (A: ``blk_m x blk_k``, B: ``blk_n x blk_k``) in global
    memory, and the ``tma2mma`` mbarrier's phase for that slice: thread 0's
    ``arrive.expect_tx(bytes)`` and TMA's ``complete_tx`` of each box; the phase completes when
    the pending arrivals and the transaction count are both zero. The part of a box past the
    matrix edge is zero-filled by TMA and still counted."""
    c = config_of(cfg)
    gm, gn = c.grid_mn
    bx, by = tile if tile is not None else (gm - 1, gn - 1)
    eb = c.elem_bytes
    a_bytes, b_bytes = c.blk_m * c.blk_k * eb, c.blk_n * c.blk_k * eb
    fig = _figure(figsize=(15, 4.4))
    ax_a, ax_b, ax_t, ax_pad = fig.subplots(1, 4, gridspec_kw={"width_ratios": [1, 1, 1.4, 0.9]})
    ax_pad.axis("off")
    panels = ((ax_a, "A", c.M, c.blk_m, bx, a_bytes), (ax_b, "B", c.N, c.blk_n, by, b_bytes))
    for ax, name, rows, blk, idx, nbytes in panels:
        n_boxes = math.ceil(rows / blk)
        for i in range(n_boxes):
            for kk in range(c.k_tiles):
                _rect(ax, kk * c.blk_k, i * blk, c.blk_k, blk, facecolor="none", edgecolor="lightgray", lw=0.5)
        y = idx * blk
        inside = min(blk, rows - y)
        _rect(ax, k * c.blk_k, y, c.blk_k, inside, facecolor="tab:orange", edgecolor="black", lw=1)
        if inside < blk:
            _rect(ax, k * c.blk_k, y + inside, c.blk_k, blk - inside, facecolor="none", hatch="xx",
                  edgecolor="tab:orange", lw=1)
            ax.text(k * c.blk_k + c.blk_k + 4, y + inside + (blk - inside) / 2,
                    f"{blk - inside} rows past the edge:\nzero-filled, still counted", fontsize=7, va="center")
        _rect(ax, 0, 0, c.K, rows, facecolor="none", edgecolor="red", lw=1.5)
        ax.text(k * c.blk_k + c.blk_k / 2, y + min(inside, blk) / 2, f"box\n{blk}x{c.blk_k}\n{nbytes} B",
                ha="center", va="center", fontsize=7)
        ax.set_xlim(-5, max(c.K, c.k_tiles * c.blk_k) + c.blk_k * 2.5)
        ax.set_ylim(max(rows, n_boxes * blk) + 5, -5)
        ax.set_xlabel("K")
        ax.set_ylabel(f"{name} rows ({rows})")
        ax.set_title(f"{name}: the box of CTA ({bx},{by}), K slice {k}", fontsize=9)
    # the mbarrier of this slice, one phase
    total = a_bytes + b_bytes
    ts = [0, 1, 2, 3, 4, 5]
    tx = [0, -a_bytes, total - a_bytes, 0, 0, 0]
    arrivals = [1, 1, 0, 0, 0, 0]
    ax_t.step(ts, tx, where="post", color="tab:orange", lw=2, label="transaction count (bytes still due)")
    ax_t.step(ts, [a * total / 2 for a in arrivals], where="post", color="tab:blue", lw=2, ls="--",
              label=f"pending arrivals (1 at init; drawn x {total // 2})")
    events = [
        (0.5, "1", "thread 0 issues the TMA loads of A and B, both naming tma2mma"),
        (1.0, "2", f"A's {a_bytes} B land: complete_tx; the count may go below 0"),
        (2.0, "3", f"thread 0: arrive.expect_tx({total}): arrivals 1 -> 0"),
        (3.0, "4", f"B's {b_bytes} B land: count 0 -> the phase completes"),
    ]
    for x, tag, _ in events:
        ax_t.annotate(tag, (x, total * 1.15), ha="center", fontsize=9, color="black",
                      bbox={"boxstyle": "circle", "fc": "white", "ec": "gray"})
    ax_t.axvline(3.0, color="green", lw=2)
    ax_t.text(3.08, -a_bytes * 1.25, "parity flips:\nwait(phase)\nreturns; next\nslice waits on\nphase ^ 1",
              fontsize=7, color="green", va="bottom")
    ax_t.text(1.02, 0.98, "\n".join(f"({tag}) {text}" for _, tag, text in events)
              + "\nA phase completes when BOTH the pending arrivals\nand the transaction count are 0.",
              transform=ax_t.transAxes, fontsize=7.5, va="top", ha="left")
    ax_t.set_ylim(-a_bytes * 1.35, total * 1.6)
    ax_t.set_xlim(0, 5)
    ax_t.set_xticks([])
    ax_t.set_xlabel("time, one K slice")
    ax_t.set_ylabel("bytes")
    ax_t.set_title(f"tma2mma, one phase ({total} B = A box + B box)", fontsize=9)
    ax_t.legend(fontsize=7, loc="upper right")
    return fig


def plot_pipeline_timeline(pipe_depths=(1, 2, 3, 4), k_tiles: int = 8, mma: float = 1.0, latency: float = 1.5,
                           transfer: float = 0.5) -> object:
    """Stages over time for each pipe depth (see :func:`pipeline_schedule` for the model):
    per stage, the TMA load (light: latency, dark: transfer) and how long the slice occupies the
    stage; on the last row, the wgmmas. Title: how busy the tensor cores are."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    cmap = matplotlib.colormaps["tab10"]
    scheds = {S: pipeline_schedule(S, k_tiles, mma, latency, transfer) for S in pipe_depths}
    t_max = max(s["time"] for s in scheds.values())
    fig = _figure(figsize=(13, 1.0 + sum(1.0 + 0.42 * (S + 1) for S in pipe_depths)))
    axes = fig.subplots(len(pipe_depths), 1, sharex=True,
                        gridspec_kw={"height_ratios": [S + 1 for S in pipe_depths]})
    axes = [axes] if len(pipe_depths) == 1 else list(axes)
    for ax, S in zip(axes, pipe_depths):
        s = scheds[S]
        for j, ((issue, arrive), (m0, m1)) in enumerate(zip(s["loads"], s["mmas"])):
            row = S - (j % S)  # stage 0 on top
            col = cmap(j % 10)
            _rect(ax, issue, row - 0.4, arrive - transfer - issue, 0.8, facecolor=col, alpha=0.25,
                  edgecolor=col, lw=0.5)
            _rect(ax, arrive - transfer, row - 0.4, transfer, 0.8, facecolor=col, alpha=0.8, lw=0)
            rel = s["release"][j]
            _rect(ax, arrive, row - 0.12, rel - arrive, 0.24, facecolor=col, alpha=0.35, lw=0)
            ax.text(issue + 0.05, row, f"TMA {j}", fontsize=7, va="center")
            _rect(ax, m0, -0.4, m1 - m0, 0.8, facecolor=col, edgecolor="black", lw=0.5)
            ax.text((m0 + m1) / 2, 0, f"mma {j}", fontsize=7, ha="center", va="center", color="white")
        ax.set_yticks(range(S + 1), ["wgmma"] + [f"stage {S - 1 - i}" for i in range(S)])
        ax.set_ylim(-0.6, S + 0.6)
        name = "v4: one stage" if S == 1 else f"v5, pipe_depth={S}"
        ax.set_title(f"{name}: tensor cores busy {s['busy']:.0%} ({k_tiles} K slices in {s['time']:.1f} units)",
                     fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(0, t_max * 1.02)
    axes[-1].set_xlabel(f"time, in units of one K slice's wgmmas (model: TMA latency {latency}, transfer {transfer}); "
                        "light: load in flight, dark: bytes arriving, thin bar: slice held in its stage until released")
    return fig


def plot_smem_budget(cfg, pipe_depths=range(1, 9), smem_limit: int | None = None) -> object:
    """Shared memory of a pipelined rung per ``pipe_depth`` (stacked: barriers and alignment,
    operand ring, output tile; the parts of ``gemm_ladder.core.budget.smem_bytes``) against the
    per-block limit."""
    c = config_of(cfg)
    limit = smem_limit or budget.limits_for(c.arch).smem_per_block
    base, stage, out = budget.BARRIER_BYTES, budget.stage_bytes(c), budget.out_bytes(c)
    depths = list(pipe_depths)
    fig = _figure(figsize=(8, 3.8))
    ax = fig.subplots()
    ax.bar(depths, [base] * len(depths), color="gray", label="barriers + 1 KiB alignment")
    ax.bar(depths, [d * stage for d in depths], bottom=[base] * len(depths), color="tab:blue",
           label=f"ring: pipe_depth x {stage // 1024} KiB (A {c.blk_m}x{c.blk_k} + B {c.blk_n}x{c.blk_k})")
    epi_n = c.knobs().get("epi_n", c.blk_n)
    what = (f"output tile Dsmem {c.blk_m}x{c.blk_n}" if epi_n >= c.blk_n
            else f"output staging: 2 chunks of {c.blk_m}x{epi_n}")
    ax.bar(depths, [out] * len(depths), bottom=[base + d * stage for d in depths], color="tab:orange",
           label=f"{what} ({out // 1024} KiB)")
    ax.axhline(limit, color="red", lw=1.5, label=f"limit per block: {limit // 1024} KiB")
    ax.set_xticks(depths)
    ax.set_xlabel("pipe_depth")
    ax.set_ylabel("bytes of shared memory")
    ax.set_title(f"{c.blk_m}x{c.blk_n} tile, {c.dtype}: deepest ring that fits = "
                 f"{budget.max_pipe_depth(c, limit)}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_grouped_walk(walk, offs, blk_m: int, n_tiles: int) -> object:
    """Grouped GEMM's work units (``sm90a.grouped.walk``: per CTA, units with ``expert``,
    ``row0``, ``row_end`` and ``n_tile``) drawn over D: token rows down, n-tiles across, each unit
    in its CTA's colour, named by CTA and turn, over the rows it stores (an expert's last m-tile
    stops at the expert's end), the experts' end rows as lines; experts with no tokens own nothing."""
    M = offs[-1] if offs else 0
    fig = _figure(figsize=(2.4 + 1.4 * n_tiles, 1.5 + M / 90))
    ax = fig.add_subplot(1, 1, 1)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for cta, units in enumerate(walk):
        for turn, u in enumerate(units):
            stored = min(blk_m, u.row_end - u.row0)
            _rect(ax, u.n_tile, u.row0, 1, stored, facecolor=colors[cta % len(colors)], alpha=0.55, edgecolor="black")
            ax.text(u.n_tile + 0.5, u.row0 + stored / 2, f"CTA {cta}.{turn}", ha="center", va="center", fontsize=7)
    start, empty = 0, []
    for e, end in enumerate(offs):
        if end == start:
            empty.append(str(e))
            continue
        ax.axhline(end, color="black", linewidth=1.2)
        ax.text(n_tiles + 0.05, (start + end) / 2, f"expert {e}: {end - start} tokens", va="center", fontsize=8)
        start = end
    ax.set_xlim(0, n_tiles + 1.3)
    ax.set_ylim(M, 0)
    ax.set_xticks([i + 0.5 for i in range(n_tiles)], [f"n-tile {i}" for i in range(n_tiles)])
    ax.set_ylabel("token row of A and D")
    ax.set_title(f"{len(walk)} CTAs walk the (expert, m-tile, n-tile) units"
                 + (f"; experts {', '.join(empty)}: no tokens, no units" if empty else ""), fontsize=9)
    return fig
