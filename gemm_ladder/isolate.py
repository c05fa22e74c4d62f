"""Run one GPU job in a child process with a timeout, so a kernel that deadlocks cannot hang us.

A wrong mbarrier phase or byte count makes a kernel spin forever. Every GPU check and timing
in gemm-ladder (CLI, tests, tuner) goes through :func:`run_isolated`: the child loads one
module, runs the job and prints one JSON line; the parent kills it at the deadline and records
``status: "timeout"`` (or ``"crash"`` with the child's last words) instead of waiting.

    python -m gemm_ladder.isolate check path/to/module.so [seed]
    python -m gemm_ladder.isolate time  path/to/module.so [reps]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RESULT_PREFIX = "GEMM_LADDER_RESULT "


def run_isolated(job: str, path, *args, timeout: float = 120.0) -> dict:
    cmd = [sys.executable, "-m", "gemm_ladder.isolate", job, str(path), *[str(a) for a in args]]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"status": "timeout", "detail": f"no result after {timeout:.0f} s (deadlock?) {tail}".strip()}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"status": "crash", "returncode": proc.returncode, "detail": (proc.stderr or proc.stdout)[-2000:]}


def _child(job: str, path: str, *args: str) -> dict:
    from . import harness  # pylint: disable=import-outside-toplevel
    from .runtime import load  # pylint: disable=import-outside-toplevel

    mod = load(path)
    if job == "check":
        seeds = [int(s) for s in args] or [0]
        results = [harness.check(mod, seed=s) for s in seeds]
        worst = max(results, key=lambda r: (not r.ok, r.rel_err))
        return {"status": "ok" if all(r.ok for r in results) else "wrong", **worst.as_dict(), "seeds": seeds}
    if job == "time":
        reps = int(args[0]) if args else 50
        first = harness.check(mod, seed=7)
        if not first.ok:
            return {"status": "wrong", **first.as_dict()}
        return {"status": "ok", **harness.time_module(mod, reps=reps), "rel_err": first.rel_err}
    raise SystemExit(f"unknown job {job!r}")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        result = _child(*argv)
    except Exception as err:  # pylint: disable=broad-except
        result = {"status": "error", "detail": f"{type(err).__name__}: {err}"}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
