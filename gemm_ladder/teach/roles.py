"""Pictures of the upper rungs (v7-v9) for tutorials 08-10: roles over time, the epilogue of one
tile under the next, and who loads which part of a cluster's tiles. The models are in
``schedulers.roles``.
"""

from __future__ import annotations

from schedulers.roles import epilogue_schedule, multicast_plan, role_schedule

from .plots import _figure as figure
from .plots import _rect as rect


def plot_roles(rungs=("v6", "v7", "v9"), **model) -> object:
    """Roles over time (see :func:`role_schedule`): per rung, the TMA loads (who issues them),
    the wgmmas and the epilogue, and how busy the tensor cores are."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    cmap = matplotlib.colormaps["tab10"]
    scheds = [role_schedule(r, **model) for r in rungs]
    t_max = max(s["time"] for s in scheds)
    fig = figure(figsize=(13, 1.2 + 1.5 * len(rungs)))
    axes = fig.subplots(len(rungs), 1, sharex=True)
    axes = [axes] if len(rungs) == 1 else list(axes)
    names = {"v6": ("thread 0 (also MMA)", "all warpgroups"), "v7": ("producer warpgroup", "consumers"),
             "v8": ("producer warpgroup", "consumers"), "v9": ("producer warpgroup", "consumers")}
    for ax, s in zip(axes, scheds):
        load_row, mma_row = names[s["rung"]]
        for (a, b, lab) in s["loads"]:
            t = int(lab.split(".")[0])
            rect(ax, a, 2 - 0.35, b - a, 0.7, facecolor=cmap(t % 10), alpha=0.35, edgecolor=cmap(t % 10), lw=0.5)
        for (a, b, lab) in s["mmas"]:
            t = int(lab.split(".")[0])
            rect(ax, a, 1 - 0.35, b - a, 0.7, facecolor=cmap(t % 10), edgecolor="black", lw=0.5)
            ax.text((a + b) / 2, 1, lab, fontsize=6, ha="center", va="center", color="white")
        for (a, b, lab) in s["epilogues"]:
            rect(ax, a, 1 - 0.35, b - a, 0.7, facecolor="gray", edgecolor="black", lw=0.5, hatch="//")
        for (a, b, lab) in s["stores"]:
            rect(ax, a, 0 - 0.25, b - a, 0.5, facecolor="tab:green", alpha=0.5, lw=0)
        ax.set_yticks([0, 1, 2], ["TMA stores\ndraining", f"wgmma + epilogue\n({mma_row})", f"TMA loads\n({load_row})"],
                      fontsize=7)
        ax.set_ylim(-0.6, 2.6)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{s['rung']}: tensor cores busy {s['busy']:.0%}", fontsize=9, loc="left")
    axes[-1].set_xlim(0, t_max * 1.02)
    axes[-1].set_xlabel("time, in units of one K slice's wgmmas (a model; colours: tiles; grey: epilogue; "
                        "labels: tile.slice)")
    return fig


def plot_epilogue_overlap(**model) -> object:
    """v8 against v9: two consumer warpgroups, their wgmmas, epilogue writes (hatched), waits at
    the CTA-wide named barrier (red) and TMA stores draining (green)."""
    scheds = [epilogue_schedule(r, **model) for r in ("v8", "v9")]
    t_max = max(s["time"] for s in scheds)
    fig = figure(figsize=(12, 4.2))
    axes = fig.subplots(2, 1, sharex=True)
    for ax, s in zip(axes, scheds):
        for c, row in s["rows"].items():
            y = 1 - c
            for a, b, lab in row["mma"]:
                rect(ax, a, y + 0.05, b - a, 0.5, facecolor="tab:blue", edgecolor="black", lw=0.5)
                ax.text((a + b) / 2, y + 0.3, f"{lab}: wgmma", fontsize=7, ha="center", va="center", color="white")
            for a, b, _ in row["wait"]:
                rect(ax, a, y + 0.05, b - a, 0.5, facecolor="tab:red", alpha=0.6, lw=0)
            for a, b, _ in row["write"]:
                rect(ax, a, y + 0.05, b - a, 0.5, facecolor="gray", edgecolor="black", lw=0.5, hatch="//")
            for a, b, _ in row["store"]:
                rect(ax, a, y - 0.15, b - a, 0.15, facecolor="tab:green", alpha=0.6, lw=0)
        ax.set_yticks([0.3, 1.3], ["consumer 1", "consumer 0"], fontsize=8)
        ax.set_ylim(-0.3, 1.7)
        ax.grid(axis="x", alpha=0.3)
        what = ("one epilogue for the CTA: barrier, write, barrier, one store" if s["rung"] == "v8"
                else "each consumer alone: chunk written -> chunk stored, next tile at once")
        ax.set_title(f"{s['rung']}: {what}; {s['time']:.1f} units for the tiles", fontsize=9, loc="left")
    axes[-1].set_xlim(0, t_max * 1.02)
    axes[-1].set_xlabel("time, in units of one K slice of both consumers (a model; red: waiting for the other "
                        "consumer, hatched: registers -> shared, green: TMA store draining)")
    return fig


def plot_cluster_multicast(cluster_m: int = 2, cluster_n: int = 1, blk_m: int = 128, blk_n: int = 256) -> object:
    """The operand parts of one K slice in a ``cluster_m x cluster_n`` cluster: each CTA's tile of
    D, the rows of A and B it loads (its colour) and the CTAs they are multicast to."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    cmap = matplotlib.colormaps["tab10"]
    plan = multicast_plan(cluster_m, cluster_n, blk_m, blk_n)
    fig = figure(figsize=(11, 4.6))
    ax = fig.subplots()
    ax.set_aspect("equal")
    ax.axis("off")
    s = 1.0 / 64  # drawing units per element
    gap = 12 * 64 * s / 64
    bx = blk_n * s
    mx = blk_m * s
    # B panels on top (one per cluster column), A panels on the left (one per cluster row)
    for p in plan:
        rm, rn = p["tile"]
        x0 = 3.0 + rn * (bx + 0.5)
        y0 = -(rm * (mx + 0.5))
        col = cmap(p["rank"])
        rect(ax, x0, y0 - mx, bx, mx, facecolor=col, alpha=0.15, edgecolor=col)
        ax.text(x0 + bx / 2, y0 - mx / 2, f"CTA {p['rank']}\ntile ({rm},{rn})", ha="center", va="center", fontsize=9)
        # its part of B, drawn in the B panel above its cluster column
        b0, b1 = p["B rows"]
        rect(ax, x0 + b0 * s, 1.0, (b1 - b0) * s, 0.8, facecolor=col, alpha=0.8, lw=0)
        # its part of A, drawn in the A panel left of its cluster row
        a0, a1 = p["A rows"]
        rect(ax, 1.4, y0 - a1 * s, 0.8, (a1 - a0) * s, facecolor=col, alpha=0.8, lw=0)
        to_b = ", ".join(map(str, p["B to"]))
        to_a = ", ".join(map(str, p["A to"]))
        ax.annotate(f"B rows {b0}-{b1 - 1} -> CTA {to_b}", (x0 + (b0 + b1) / 2 * s, 1.0), (x0 + (b0 + b1) / 2 * s, 2.3 + 0.35 * p["rank"]),
                    fontsize=7, ha="center", arrowprops=dict(arrowstyle="-", color=col))
        ax.annotate(f"A rows {a0}-{a1 - 1}\n-> CTA {to_a}", (1.4, y0 - (a0 + a1) / 2 * s), (-1.2, y0 - (a0 + a1) / 2 * s),
                    fontsize=7, va="center", arrowprops=dict(arrowstyle="-", color=col))
    ax.text(3.0, 3.8 + 0.35 * len(plan), f"{cluster_m}x{cluster_n} cluster of {blk_m}x{blk_n} tiles: each CTA loads the "
            "parts in its colour and multicasts them", fontsize=9)
    ax.set_xlim(-2.6, 3.2 + cluster_n * (bx + 0.5))
    ax.set_ylim(-cluster_m * (mx + 0.5) - 0.2, 4.2 + 0.35 * len(plan))
    return fig
