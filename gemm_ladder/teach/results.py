"""Committed measurements (``benchmarks/results/*.json``) as a table for a notebook."""

from __future__ import annotations

import json
from pathlib import Path

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
