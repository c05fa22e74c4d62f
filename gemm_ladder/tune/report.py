"""A tuning run for people: the table of candidates, the knob labels, and the plot.

Runtime-only (matplotlib on first plot).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from ..core.device import speed_rank
from ..measure.report import table


def knob_label(knobs: dict, varying=None) -> str:
    """A short name for a knob set: ``128x256 d3 g8 snake`` (only the ``varying`` knobs, if given)."""
    short = {"pipe_depth": "d", "l2_group_size": "g", "num_warpgroups": "w", "tile_order": ""}
    parts = []
    if "blk_m" in knobs and (varying is None or {"blk_m", "blk_n"} & set(varying)):
        parts.append(f"{knobs['blk_m']}x{knobs.get('blk_n', '')}")
    for k, v in knobs.items():
        if k in ("blk_m", "blk_n", "blk_k") or (varying is not None and k not in varying):
            continue
        parts.append(f"{short.get(k, k + '=')}{v}")
    return " ".join(parts) or "default"


def _varying(results) -> list[str]:
    keys = list(dict.fromkeys(k for r in results for k in r["knobs"]))
    return [k for k in keys if len({json.dumps(r["knobs"].get(k)) for r in results}) > 1]


def result_rows(report: dict, top: int | None = 20) -> tuple[list[dict], list[str]]:
    results = report["results"]
    varying = _varying(results) or [k for k in (results[0]["knobs"] if results else {}) if k != "blk_k"]
    ok = sorted((r for r in results if r["status"] == "ok"), key=speed_rank, reverse=True)
    bad = [r for r in results if r["status"] != "ok"]
    rows = []
    for i, r in enumerate(ok[:top] if top else ok):
        rows.append({"rank": i + 1, "id": r["id"], "status": "ok", "tflops": f"{r['tflops']:.1f}",
                     "cublas": f"{r['cublas_tflops']:.1f}", "ratio": f"{r['ratio_to_cublas']:.3f}",
                     "ms": f"{r['ms']:.3f}", **{k: r["knobs"].get(k) for k in varying}, "detail": ""})
    for r in bad:
        rows.append({"rank": "-", "id": r["id"], "status": r["status"], **{k: r["knobs"].get(k) for k in varying},
                     "detail": " ".join(str(r.get("detail", "")).split())[:80]})
    return rows, ["rank", "id", "status", "tflops", "cublas", "ratio", "ms", *varying, "detail"]


def format_table(report: dict, top: int | None = 20) -> str:
    rows, cols = result_rows(report, top)
    if not rows:
        return "no candidates"
    head = (f"{report['rung']} {'x'.join(map(str, report['shape']))} {report['dtype']} on "
            f"{report['gpu'].get('name')}: {sum(r['status'] == 'ok' for r in report['results'])} of "
            f"{len(report['results'])} candidates correct")
    return head + "\n" + table(rows, cols)


RUN_COLS = ["rung", "shape", "dtype", "gpu", "ok", "failed", "tflops", "cublas", "ratio", "best"]


def run_rows(run: dict) -> list[dict]:
    """One row per measured folder of a run: its best candidate against cuBLAS."""
    rows = []
    for rep in run["reports"]:
        ok = [r for r in rep["results"] if r["status"] == "ok"]
        best = rep.get("best")
        failed: dict = {}
        for r in rep["results"]:
            if r["status"] != "ok":
                failed[r["status"]] = failed.get(r["status"], 0) + 1
        rows.append({"rung": rep["rung"], "shape": "x".join(map(str, rep["shape"])), "dtype": rep["dtype"],
                     "gpu": (rep.get("gpu") or {}).get("name", "?"), "ok": f"{len(ok)}/{len(rep['results'])}",
                     "failed": " ".join(f"{k}:{v}" for k, v in sorted(failed.items())),
                     "tflops": f"{best['tflops']:.1f}" if best else "-",
                     "cublas": f"{best['cublas_tflops']:.1f}" if best else "-",
                     "ratio": f"{best['ratio_to_cublas']:.3f}" if best else "-",
                     "best": knob_label(best["knobs"]) if best else "none correct"})
    return rows


def format_run(run: dict) -> str:
    """The final table of a run over several folders, and its throughput."""
    servers = run.get("servers") or {}
    head = (f"{len(run['reports'])} shapes, {run['measured']} of {run['candidates']} candidates measured "
            f"({run['ok']} correct) in {run['wall_s']:.0f} s on {len(servers)} GPU(s): "
            f"{run.get('candidates_per_minute') or 0:.1f} candidates/min")
    per = "; ".join(f"{name}: {s['candidates']}" for name, s in sorted(servers.items()))
    return "\n".join([head] + ([f"per server: {per}"] if per else []) + [table(run_rows(run), RUN_COLS)])


def compare_runs(base: dict, other: dict, tolerance: float = 0.02) -> dict:
    """Whether two runs over the same candidates found the same best configs.

    Per shape: the best knobs of each run, and in ``base``'s own measurements how fast
    ``other``'s best was against ``base``'s best (``other_best_in_base``). A shape agrees when the
    knobs are the same, or when that ratio is within ``tolerance`` (a tie within the noise).
    Also the candidates per minute of each run and their ratio.
    """
    def key(rep):
        return (rep["rung"], tuple(rep["shape"]), rep["dtype"])

    theirs = {key(r): r for r in other["reports"]}
    shapes = []
    for rep in base["reports"]:
        mine, their_rep = rep.get("best"), theirs.get(key(rep))
        their = their_rep.get("best") if their_rep else None
        row = {"rung": rep["rung"], "shape": list(rep["shape"]), "dtype": rep["dtype"],
               "base_best": mine and mine["knobs"], "other_best": their and their["knobs"]}
        if mine and their:
            same = mine["knobs"] == their["knobs"]
            in_base = next((r for r in rep["results"] if r["knobs"] == their["knobs"] and r["status"] == "ok"), None)
            ratio = in_base["tflops"] / mine["tflops"] if in_base else None
            row.update(same_knobs=same, other_best_in_base=round(ratio, 4) if ratio else None,
                       agree=same or (ratio is not None and ratio >= 1 - tolerance),
                       base_tflops=round(mine["tflops"], 1), other_tflops=round(their["tflops"], 1))
        else:
            row.update(same_knobs=False, other_best_in_base=None, agree=False)
        shapes.append(row)
    rate = (base.get("candidates_per_minute"), other.get("candidates_per_minute"))
    return {"tolerance": tolerance, "agree": all(r["agree"] for r in shapes), "shapes": shapes,
            "candidates_per_minute": {"base": rate[0], "other": rate[1],
                                      "speedup": round(rate[1] / rate[0], 2) if all(rate) else None},
            "gpus": {"base": len(base.get("servers") or {}), "other": len(other.get("servers") or {})}}


def plot_measurements(report: dict, path) -> bool:
    """A heat map of TFLOPS over pipe_depth x l2_group_size (best over the other knobs) and a bar
    per correct candidate against cuBLAS, as one PNG. False when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
        from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
    except ImportError:
        warnings.warn("matplotlib is not installed: no tuning plot", stacklevel=2)
        return False
    ok = sorted((r for r in report["results"] if r["status"] == "ok"), key=speed_rank, reverse=True)
    failed = len(report["results"]) - len(ok)
    fig = Figure(figsize=(13, 4.8))
    FigureCanvasAgg(fig)
    ax_heat, ax_bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})

    def axis_values(knob):
        vals = sorted({r["knobs"].get(knob) for r in ok if knob in r["knobs"]}, key=lambda v: (str(type(v)), v))
        return vals or [None]

    depths, groups = axis_values("pipe_depth"), axis_values("l2_group_size")
    grid = [[float("nan")] * len(groups) for _ in depths]
    for r in ok:
        i = depths.index(r["knobs"].get("pipe_depth")) if r["knobs"].get("pipe_depth") in depths else 0
        j = groups.index(r["knobs"].get("l2_group_size")) if r["knobs"].get("l2_group_size") in groups else 0
        if math.isnan(grid[i][j]) or r["tflops"] > grid[i][j]:
            grid[i][j] = r["tflops"]
    im = ax_heat.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax_heat.set_xticks(range(len(groups)), [str(g) if g is not None else "-" for g in groups])
    ax_heat.set_yticks(range(len(depths)), [str(d) if d is not None else "-" for d in depths])
    ax_heat.set_xlabel("l2_group_size")
    ax_heat.set_ylabel("pipe_depth")
    ax_heat.set_title("best TFLOPS per cell")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax_heat.text(j, i, f"{v:.0f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(im, ax=ax_heat, shrink=0.8)

    varying = _varying(report["results"])
    xs = range(len(ok))
    ax_bar.bar(xs, [r["tflops"] for r in ok], color="tab:blue", label="candidate")
    if ok:
        cublas = sorted(r["cublas_tflops"] for r in ok)[len(ok) // 2]
        ax_bar.axhline(cublas, color="tab:red", linestyle="--", label=f"cuBLAS {cublas:.0f}")
        ax_bar.legend(loc="upper right")
    if len(ok) <= 60:
        ax_bar.set_xticks(list(xs), [knob_label(r["knobs"], varying) for r in ok], rotation=90, fontsize=7)
    ax_bar.set_ylabel("TFLOPS")
    ax_bar.set_title(f"{len(ok)} correct candidates, best first ({failed} failed)")
    fig.suptitle(f"{report['rung']} {'x'.join(map(str, report['shape']))} {report['dtype']} "
                 f"on {report['gpu'].get('name')} ({report.get('date', '')[:10]})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return True
