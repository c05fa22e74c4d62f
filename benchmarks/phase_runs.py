"""The ``run`` command that ``benchmarks/e2e_check.py`` and ``benchmarks/host_check.py`` share: one
plan (``e2e_check prepare``'s folder: its pack and ``e2e.json``), phases that each run in a child
process with a deadline (``measure.isolate``) while the SM clock and power are sampled, and a
results file of the same shape. The scripts keep their own CLIs and phases; this is the scaffolding
around them, in one place so a fix to it (a check before any GPU work, the clocks of a row) reaches
both::

    r = phase_runs.add_run_parser(sub, help=..., folder_help=..., out="e2e_check.json",
                                  front_modes=FRONT_MODES, front_help=...)
    doc = phase_runs.checked_plan("e2e_check", folder, read, missing)   # None: it said why
    results, rows = phase_runs.run_phases(job, phases, args, deadline, line, Sampler())
    phase_runs.write_results(out, FORMAT, gpu, start, method, front_door, summary, results, rows, table)

A sibling script, imported as ``phase_runs`` (the benchmarks folder on ``sys.path``, as the
scripts put it there for ``power_probe``).
"""

from __future__ import annotations

import sys
import time

from gemm_ladder.core import cli_types, device, files
from gemm_ladder.measure import harness, isolate


def add_run_parser(sub, *, help: str, folder_help: str, out: str, front_modes, front_help: str):  # noqa: A002
    """The ``run`` subcommand with what both scripts take: the prepared folder, ``--out`` and
    ``--front`` (a mode of ``front_modes``, strict by default); the caller adds its own options."""
    r = sub.add_parser("run", help=help)
    r.add_argument("folder", help=folder_help)
    r.add_argument("--out", type=cli_types.out_file, default=out)
    r.add_argument("--front", choices=list(front_modes), default="strict", help=front_help)
    return r


def job_of(module_name: str, script: str) -> str:
    """The isolated job of a script's ``phase_job`` (``package.module:function``): the module as the
    child imports it, ``benchmarks.<script>`` where the script runs as ``__main__``."""
    return f"{module_name if module_name != '__main__' else 'benchmarks.' + script}:phase_job"


def checked_plan(who: str, folder, read, missing) -> dict | None:
    """The plan of ``folder`` where everything ``run`` needs is here, else None after one line on
    stderr saying what is not and how to fix it: a GPU; the plan, ``read(fix)`` (raising
    ValueError -- RecordError, PackError -- for a bad one); a pack that serves every GEMM of it on
    this GPU, ``missing(doc)`` (the GEMMs it does not, named)."""
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"{who} run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return None
    fix = f"run benchmarks/e2e_check.py prepare {folder} on the build box and carry the folder here"
    try:
        doc = read(fix)
        left = missing(doc)
    except ValueError as err:
        print(f"{who} run: {err}", file=sys.stderr)
        return None
    if left:
        print(f"{who} run: the pack in {folder} does not serve {len(left)} GEMM(s) of the plan on this GPU "
              f"({left[0]}{', ...' if len(left) > 1 else ''}): {fix}", file=sys.stderr)
        return None
    return doc


def run_phases(job: str, phases, args: list[str], deadline, line, sampler) -> tuple[dict, list[dict]]:
    """Each phase in a child of its own (``isolate.run_batch``: a hang or a crash is that phase's
    result, not the end of the run) within ``deadline(phase)`` seconds, a progress ``line(phase,
    result)`` on stderr after each; returns the results by phase (each with the clocks ``sampler``
    saw while it ran) and every row of them, each row's ``t0``/``t1`` replaced by the clocks while
    it was timed. Stops ``sampler``."""
    start, results = time.time(), {}
    for phase in phases:
        t0 = time.time()
        results[phase] = isolate.run_batch(job, [phase], args, timeout=deadline(phase), explain=False)[0]
        results[phase]["clocks"] = sampler.between(t0, time.time())
        print(f"{line(phase, results[phase])} ({time.time() - start:.0f} s)", file=sys.stderr)
    rows = [r for res in results.values() for r in res.get("rows", [])]
    for r in rows:  # the SM clock and power while the row was timed
        r["clocks"] = sampler.between(r.pop("t0"), r.pop("t1"))
    sampler.stop()
    return results, rows


def write_results(out, fmt: str, gpu: dict, start: float, method: str, front_door: dict, summary: dict,
                  results: dict, rows: list[dict], table, **extra) -> dict:
    """The results file (format ``fmt``, version 1): the GPU before (``gpu``) and after, the run's
    provenance, the method, the front door's mode, ``extra`` fields, the summary, each phase's
    result without its rows, and the rows; then the rows' ``table(rows)`` and where it went."""
    result = {"format": fmt, "version": 1, "gpu": gpu, "gpu_after": harness.gpu_info(), **harness.run_info(),
              "seconds": round(time.time() - start, 1), "method": method, "front_door": front_door, **extra,
              "summary": summary,
              "phases": {p: {k: v for k, v in r.items() if k != "rows"} for p, r in results.items()},
              "rows": rows}
    files.write_record(out, result)
    print(table(rows))
    print(f"{result['seconds']:.0f} s; wrote {out}")
    return result
