"""Committed measurements (``benchmarks/results/*.json``) as a table for a notebook."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..core import records
from ..core.records import List, Obj, Str
from .sources import REPO

RESULTS_DIR = REPO / "benchmarks" / "results"


class ResultTable(list):
    """Rows of committed measurements; shows as a table (or says plainly that there are none)."""

    def __init__(self, rows, what: str, searched: Path):
        super().__init__(rows)
        self.what, self.searched = what, searched

    def __repr__(self) -> str:
        if not self.searched.is_dir():
            return f"No committed measurements: {self.searched} does not exist (run from a checkout of the repository)."
        if not self:
            where = self.searched.relative_to(REPO) if REPO in self.searched.parents else self.searched
            return (f"No committed measurement of {self.what} yet in {where}: "
                    "run `python -m gemm_ladder bench` on an H100/H200 and commit the JSON.")
        varying = sorted(k for k in {k for r in self for k in r["knobs"]} - {"dtype", "arch"}
                         if len({json.dumps(r["knobs"].get(k)) for r in self}) > 1)
        cols = ["file", "gpu", "clocks", "date", "shape", "dtype", "knobs", "tflops", "cublas_tflops",
                "ratio_to_cublas"]
        cells = [[(" ".join(f"{k}={r['knobs'].get(k)}" for k in varying) or "defaults") if c == "knobs"
                  else str(r.get(c, "")) for c in cols] for r in self]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        out.append("  ".join("-" * w for w in widths))
        out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(out)

    def _repr_pretty_(self, p, cycle):  # IPython: the table, not the list
        p.text(repr(self))


def committed_results(rung: str | None = None, arch: str = "sm_90a", results_dir=None,
                      dtype: str | None = None) -> ResultTable:
    """Rows of ``benchmarks/results/*.json`` for ``rung`` (all rungs when None) on ``arch``."""
    folder = Path(results_dir) if results_dir else RESULTS_DIR
    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            report = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        gpu = report.get("gpu", {})
        for r in report.get("results", []):
            if rung is not None and r.get("rung") != rung:
                continue
            if r.get("arch", "sm_90a") != arch or (dtype and r.get("dtype") != dtype):
                continue
            if "tflops" not in r:
                continue
            rows.append({
                "file": path.name, "gpu": gpu.get("name", "?"),
                "clocks": f"{gpu.get('sm_clock_mhz_now', '?')}/{gpu.get('sm_clock_mhz_max', '?')}"
                          .replace(" MHz", "") + " MHz",
                "date": str(report.get("date", ""))[:10], "commit": report.get("commit", ""),
                "rung": r.get("rung"), "module": r.get("module"), "shape": "x".join(map(str, r.get("shape", []))),
                "dtype": r.get("dtype"), "knobs": r.get("knobs", {}), "status": r.get("status"),
                "tflops": round(r["tflops"], 1), "cublas_tflops": round(r.get("cublas_tflops", float("nan")), 1),
                "ratio_to_cublas": round(r.get("ratio_to_cublas", float("nan")), 3),
            })
    what = f"rung {rung} ({arch})" if rung else f"any rung ({arch})"
    return ResultTable(rows, what, folder)


# one run of a check script (``benchmarks/*_check.py run``): the GPU it ran on, when, at which commit,
# and its rows; the date and commit at the top (layouts, e2e) or under "run" (epilogue)
_RUN_SCHEMA = Obj({"gpu": Obj({"name": Str()}, {"sm_clock_mhz_now": Str(), "sm_clock_mhz_max": Str(),
                                                 "power_limit": Str(), "driver": Str(), "torch": Str()})},
                  {"rows": List(Obj()), "results": List(Obj()), "date": Str(), "commit": Str(),
                   "run": Obj({"date": Str(), "commit": Str()})})
_RUN_FIX = "restore it with git checkout, or rerun the check script that wrote it on an H100"


@dataclass(frozen=True)
class CommittedRun:
    """One committed run of a check script: where it ran (``gpu``: name, clocks, power limit,
    driver), when, at which commit, and its ``rows`` (the per-case results). The clocks sampled
    beside it: :func:`sampled_clocks`."""

    path: Path
    gpu: dict
    date: str
    commit: str
    rows: list

    def describe(self) -> str:
        """One line a reader quotes: the GPU and its clocks, the date and the commit."""
        g = self.gpu
        where = self.path.relative_to(REPO) if REPO in self.path.parents else self.path
        return (f"{g['name']} ({g.get('power_limit', '? W')}, driver {g.get('driver', '?')}, SM clock max "
                f"{g.get('sm_clock_mhz_max', '?')}), {self.date[:10]}, commit {self.commit[:7]}: {where}")


def committed_run(folder: str, name: str, results_dir=None) -> CommittedRun:
    """The run ``benchmarks/results/<folder>/<name>`` (a check script's JSON), read through the
    project's one reader: a missing or damaged file is a ``RecordError`` naming it and the field."""
    path = Path(results_dir or RESULTS_DIR) / folder / name
    data = records.read_json(path, "committed run", fix=_RUN_FIX, schema=_RUN_SCHEMA)
    stamp = data.get("run", data)
    if "date" not in stamp or "commit" not in stamp:
        raise records.RecordError(f"{path}: field 'commit' or 'date' is missing (at the top or under 'run'); "
                                  f"{_RUN_FIX}")
    rows = data.get("rows", data.get("results"))
    if rows is None:
        raise records.RecordError(f"{path}: field 'rows' is missing (nor 'results'); {_RUN_FIX}")
    return CommittedRun(path, data["gpu"], stamp["date"], stamp["commit"], rows)


def geomean(values) -> float:
    """The geometric mean: how a suite of speed ratios is summed up (one slow shape and one fast
    one of the same factor cancel)."""
    values = list(values)
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"a geometric mean takes positive numbers, at least one; got {values}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ratio_summary(rows, by: str = "op", value: str = "kernel_ratio") -> list[dict]:
    """Per value of ``by`` (in the rows' order): how many rows, the geomean and the lowest of
    ``value`` (rows without it are left out)."""
    groups: dict = {}
    for r in rows:
        if r.get(value) is not None:
            groups.setdefault(r[by], []).append(r[value])
    return [{by: k, "rows": len(v), "geomean": round(geomean(v), 3), "lowest": round(min(v), 3)}
            for k, v in groups.items()]


_CLOCK_FIX = ("restore it with git checkout, or sample again beside the run: nvidia-smi --format=csv -lms 1000 "
              "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu")


def sampled_clocks(folder: str, name: str = "clocks.csv", results_dir=None) -> str:
    """One line on the clocks sampled beside a committed run (``nvidia-smi --format=csv``, one
    sample a second): over the busy samples (power above twice the idle draw, the lowest in the
    file) the SM clock's median and lowest, the highest power and temperature. A power-capped
    H100 lowers its SM clock under load, so a run's numbers hold for the clocks it ran at."""
    path = Path(results_dir or RESULTS_DIR) / folder / name
    lines = records.read_text(path, "clock samples", fix=_CLOCK_FIX).strip().splitlines()
    header = [h.strip() for h in lines[0].split(",")] if lines else []
    want = ("clocks.current.sm [MHz]", "power.draw [W]", "temperature.gpu")
    if any(w not in header for w in want):
        raise records.RecordError(f"{path}: the header has no {' / '.join(w for w in want if w not in header)} column; "
                                  f"{_CLOCK_FIX}")
    cols = [header.index(w) for w in want]
    samples = []
    for n, line in enumerate(lines[1:], start=2):
        cells = [c.strip() for c in line.split(",")]
        try:
            samples.append(tuple(float(cells[i].split()[0]) for i in cols))
        except (IndexError, ValueError):
            raise records.RecordError(f"{path}: line {n} ({line[:60]!r}) is not a sample of {', '.join(want)}; "
                                      f"{_CLOCK_FIX}") from None
    if not samples:
        raise records.RecordError(f"{path}: no samples; {_CLOCK_FIX}")
    idle = min(s[1] for s in samples)
    busy = [s for s in samples if s[1] > 2 * idle] or samples
    sm = sorted(s[0] for s in busy)
    return (f"{len(busy)} busy sample(s) of {len(samples)}: SM clock median {sm[len(sm) // 2]:.0f} MHz (lowest "
            f"{sm[0]:.0f}), up to {max(s[1] for s in busy):.0f} W and {max(s[2] for s in busy):.0f} C")
