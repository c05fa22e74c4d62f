"""Run GPU jobs in a child process with a deadline, so a kernel that deadlocks cannot hang us.

A wrong mbarrier phase or byte count makes a kernel spin forever. Every GPU check and timing
in gemm-ladder (CLI, tests, tuner) goes through this module: a child process loads the modules
and runs the job on each, printing one JSON line per module as it finishes; the parent gives
each module its own deadline, and when one passes it kills the child, records
``status: "timeout"`` for that module and starts a fresh child for the rest. A crash is recorded
as ``"crash"`` with the child's last words. Loading torch and TVM once per child, not once per
module, keeps a long list fast.

    python -m gemm_ladder.measure.isolate check MODULE.so [MODULE.so ...] [--args 0,1]
    python -m gemm_ladder.measure.isolate time  MODULE.so [MODULE.so ...] [--args 50]
    python -m gemm_ladder.measure.isolate rounds MODULE.so MODULE.so [...] [--args 40,10,2.0]
    python -m gemm_ladder.measure.isolate gemm_ladder.measure.suite:time_case CASE [CASE ...] [--args 50]

The ``rounds`` job times its modules together, taking turns with cuBLAS in the same rounds
(:mod:`gemm_ladder.measure.rounds`); its first result comes when the whole group is timed, so its
deadline is the group's.

A job named ``package.module:function`` runs ``function(item, args)`` on each item (a case name
instead of a module path) and returns its result dict: the front door's checks and the shape
suite run this way.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time

from ..barriers.explain import explain_timeouts
from ..serve.runtime import load
from ..sync import watchdog
from . import harness
from .rounds import group_job

RESULT_PREFIX = "GEMM_LADDER_RESULT "
STARTUP_SECONDS = 60.0  # importing torch and TVM in a fresh child


def run_isolated(job: str, path, *args, timeout: float = 120.0) -> dict:
    """One module, one job: the result dict (``status`` is ok, wrong, error, hang (a watchdog
    build named the barrier it waits on), timeout or crash)."""
    return run_batch(job, [path], args, timeout=timeout)[0]


def run_batch(job: str, paths, args=(), timeout: float = 120.0, on_result=None, explain: bool = True) -> list[dict]:
    """Run ``job`` on every module, each with ``timeout`` seconds; results in the order of ``paths``.

    ``explain``: a module that timed out is run again as its watchdog build (see
    :mod:`gemm_ladder.barriers.explain`), which names the barrier the kernel waits on.
    """
    paths = [str(p) for p in paths]
    results: list[dict | None] = [None] * len(paths)
    start = 0
    while start < len(paths):
        done = _run_child(job, paths[start:], args, timeout, results, start, on_result)
        start += max(done, 1)
    if explain and job != "selftest" and any(r and r.get("status") == "timeout" for r in results):
        explain_timeouts(job, paths, args, results, run_isolated, timeout=min(timeout, 60.0))
    return results  # type: ignore[return-value]


ARG_SEP = ","  # a job's arguments on the child's command line, joined


def join_args(args) -> str:
    """A job's arguments as the child's ``--args`` value (:func:`split_args` reads it back); an
    argument holding the separator or empty would come back split or dropped: ValueError."""
    args = [str(a) for a in args]
    bad = [a for a in args if ARG_SEP in a or not a]
    if bad:
        raise ValueError(f"isolate: job arguments {bad} hold {ARG_SEP!r} or are empty; they would not reach "
                         f"the job whole: join their parts with another character")
    return ARG_SEP.join(args)


def split_args(text: str) -> list[str]:
    """The job's arguments from the child's ``--args`` value (:func:`join_args`'s)."""
    return [a for a in text.split(ARG_SEP) if a]


def _run_child(job, paths, args, timeout, results, offset, on_result) -> int:
    cmd = [sys.executable, "-m", "gemm_ladder.measure.isolate", job, *paths, "--args", join_args(args)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    err_tail: list[str] = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: [err_tail.append(l) for l in proc.stderr], daemon=True).start()
    done = 0
    deadline = time.monotonic() + timeout + STARTUP_SECONDS
    while done < len(paths):
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            proc.wait()
            _record(results, offset + done, {"status": "timeout",
                    "detail": f"no result after {timeout:.0f} s (a deadlock?)"}, paths[done], on_result)
            return done + 1
        if line is None:  # the child died
            proc.wait()
            tail = "".join(err_tail)[-2000:]
            _record(results, offset + done, {"status": "crash", "returncode": proc.returncode,
                                             "detail": tail.strip()}, paths[done], on_result)
            return done + 1
        if line.startswith(RESULT_PREFIX):
            res = json.loads(line[len(RESULT_PREFIX):])
            _record(results, offset + done, res, paths[done], on_result)
            done += 1
            deadline = time.monotonic() + timeout
            if res.pop("exit_child", False):  # its CUDA context is stuck: a fresh child goes on
                proc.kill()
                proc.wait()
                return done
    proc.wait()
    return done


def _record(results, i, res, path, on_result):
    res.setdefault("module", os.path.basename(path))
    results[i] = res
    if on_result:
        on_result(res)


def _job(job: str, path: str, args: list[str]) -> dict:
    if job == "selftest":  # exercises the deadline without a GPU: PATH is ok, hang, crash or barrier
        if path == "hang":
            time.sleep(3600)
        if path == "crash":
            os._exit(3)  # pylint: disable=protected-access
        if path == "barrier":  # what a watchdog build raises when its kernel did not stop
            rec = {"barrier": "tma2mma", "slot": 1, "parity": 0, "role": "consumer", "unit": "warpgroup",
                   "cta": 3, "cluster_rank": 0, "thread": 0, "waited_s": 2.0, "state_word": 0, "site": 0}
            raise watchdog.BarrierTimeoutError(watchdog.message("selftest", rec), rec, kernel_stopped=False)
        return {"status": "ok"}
    if ":" in job:
        module, _, name = job.partition(":")
        return getattr(importlib.import_module(module), name)(path, args)
    mod = load(path)
    if job == "check":
        seeds = [int(s) for s in args] or [0]
        ms = harness.check_ms(mod)  # a runtime-M module: every M of harness.DYNAMIC_M_CHECKS
        results = [(m, harness.check(mod, seed=s, M=m)) for m in ms for s in seeds]
        worst_m, worst = max(results, key=lambda mr: (not mr[1].ok, mr[1].rel_err))
        out = {"status": "ok" if all(r.ok for _, r in results) else "wrong", **worst.as_dict(), "seeds": seeds}
        if len(ms) > 1:
            out.update(m_checked=list(ms), worst_m=worst_m,
                       wrong_m=sorted({m for m, r in results if not r.ok}))
        return out
    if job == "time":
        reps = int(args[0]) if args else 50
        timer = args[1] if len(args) > 1 else "queued"
        first = harness.check(mod, seed=7)
        if not first.ok:
            return {"status": "wrong", **first.as_dict()}
        return {"status": "ok", **harness.time_module(mod, reps=reps, timer=timer), "rel_err": first.rel_err}
    raise ValueError(f"unknown job {job!r}: use check or time")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args: list[str] = []
    if "--args" in argv:
        i = argv.index("--args")
        args = split_args(argv[i + 1]) if i + 1 < len(argv) else []
        argv = argv[:i]
    job, paths = argv[0], argv[1:]
    if job == "rounds":  # one group, timed together: one result line per module, in order
        try:
            results = group_job(paths, args)
        except Exception as err:  # pylint: disable=broad-except
            results = [{"status": "error", "detail": f"{type(err).__name__}: {err}"} for _ in paths]
        for result in results:
            print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    for path in paths:
        try:
            result = _job(job, path, args)
        except Exception as err:  # pylint: disable=broad-except
            result = {"status": "error", "detail": f"{type(err).__name__}: {err}"}
            if type(err).__name__ == "BarrierTimeoutError":  # a watchdog build gave up waiting
                result.update(status="hang", barrier=err.record)
            # a stopped kernel (the watchdog's trap) or a device fault leaves this process's CUDA
            # context unusable: every later launch here would fail with the same error
            if result["status"] == "hang" or "CUDA error" in result["detail"]:
                result["exit_child"] = True
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        if result.get("exit_child"):
            os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
