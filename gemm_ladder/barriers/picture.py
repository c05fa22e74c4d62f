"""The picture of a protocol check: when each mbarrier slot completed its phases.

One row per barrier slot of CTA 0, one tick per completed phase, along the steps of the
lockstep schedule (every thread one step per round: the closest of the checker's schedules to a
GPU). A healthy ring shows the full and empty barriers of each stage taking turns; a broken one
shows where the ticks stop and, in red, the phase no thread can complete.
"""

from __future__ import annotations

KIND_COLOURS = {"tma": "tab:blue", "tcgen05": "tab:green", "mbarrier": "tab:orange"}


def plot_phases(report, title: str | None = None, ax=None):
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    sim = next((s for s in report.sims if s.policy == "lockstep"), report.sims[0])
    rows = [(arr, i) for arr in report.kir.barriers for i in range(arr.depth)]
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    else:
        fig = ax.figure
    stuck = {id(b) for b in sim.stuck}
    for y, (arr, slot) in enumerate(rows):
        bar = sim.ctas[0].bars.get((arr.offset + slot) * 8)
        steps = [h.step for h in bar.history] if bar is not None else []
        ax.scatter(steps, [y] * len(steps), marker="|", s=260, color=KIND_COLOURS.get(arr.kind, "k"))
        if bar is not None and id(bar) in stuck:
            ax.scatter([sim.steps], [y], marker="X", s=120, color="tab:red", zorder=3)
            ax.annotate(f"phase {bar.n} never completes", (sim.steps, y), xytext=(-8, 6),
                        textcoords="offset points", ha="right", fontsize=8, color="tab:red")
    ax.set_yticks(range(len(rows)), [arr.label(slot) for arr, slot in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel(f"simulation step ({sim.policy} schedule, CTA {sim.ctas[0].block[0]}): one tick per completed phase")
    ax.set_title(title or report.title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Line2D([], [], marker="|", ls="", ms=12, color=c, label=f"{k} barrier")
               for k, c in KIND_COLOURS.items() if any(a.kind == k for a in report.kir.barriers)]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig
