"""The summary of benchmarks/rpc_session.sh: candidates per minute of each run, whether the best
configs of the all-GPU run agree with the 1-GPU run's, and what the killed-server run lost.

    python benchmarks/rpc_compare.py run_1gpu.json run_all.json [run_kill.json] > summary.json
"""

import json
import sys
from pathlib import Path

from gemm_ladder.tune.report import compare_runs


def statuses(run: dict) -> dict:
    out: dict = {}
    for rep in run["reports"]:
        for r in rep["results"]:
            out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def main(argv) -> None:
    runs = {Path(p).stem: json.loads(Path(p).read_text()) for p in argv if Path(p).exists()}
    one, *others = runs
    summary = {"runs": {name: {k: run.get(k) for k in ("date", "wall_s", "candidates", "measured", "ok",
                                                        "candidates_per_minute", "batch", "workers")}
                        | {"servers": {s: v["candidates"] for s, v in run["servers"].items()},
                           "gpu": next(iter(run["servers"].values()), {}).get("gpu", {}).get("name"),
                           "statuses": statuses(run)}
                        for name, run in runs.items()},
               "against_1gpu": {name: compare_runs(runs[one], runs[name]) for name in others}}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
