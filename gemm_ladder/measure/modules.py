"""Verify and time exported modules on a GPU, each in a watched child process.

What ``python -m gemm_ladder verify`` and ``bench`` run over a folder of modules (found by
``compile.batch.modules_in``): :func:`verify` checks each against torch on fresh random inputs,
:func:`bench` times each against cuBLAS (``harness.time_module``) into one JSON report.
"""

from __future__ import annotations

from pathlib import Path

from ..core.manifest import ManifestError, read_manifest
from ..core.procs import progress
from . import harness, isolate


def _batch(job: str, paths, args, timeout: float, desc: str) -> list[dict]:
    bar = progress(len(paths), desc) if len(paths) > 1 else None
    try:
        return isolate.run_batch(job, paths, args, timeout=timeout,
                                 on_result=(lambda res: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()


def _rung_of(path) -> str:
    try:
        return read_manifest(path)["rung"]
    except (OSError, ManifestError):
        return "?"


def verify(paths, seeds=(0, 1), timeout: float = 180.0) -> list[dict]:
    """Check every module on fresh random inputs, each in a child process with a deadline."""
    rows = []
    for p, res in zip(paths, _batch("check", paths, seeds, timeout, "verify")):
        rows.append({"module": Path(p).name, "rung": _rung_of(p), "status": res["status"],
                     "rel_err": res.get("rel_err"), "cublas_rel_err": res.get("torch_rel_err"),
                     "detail": res.get("detail", "")})
    return rows


def bench(paths, reps: int = 50, timeout: float = 300.0, timer: str = "queued") -> dict:
    """Time every module against cuBLAS (same process, same method, ``harness.time_module``'s
    ``timer``); one JSON report."""
    if timer not in harness.TIMERS:
        raise ValueError(f"timer={timer!r}: use one of {', '.join(harness.TIMERS)}")
    results = []
    for p, res in zip(paths, _batch("time", paths, [reps, timer], timeout, "bench")):
        try:
            man = read_manifest(p)
        except (OSError, ManifestError) as err:
            results.append({"module": Path(p).name, **res, "status": res.get("status", "error"),
                            "detail": res.get("detail") or str(err)})
            continue
        results.append({"module": Path(p).name, "rung": man["rung"], "shape": man["shape"],
                        "built_from_commit": man.get("commit"),
                        "dtype": man["dtype"], "arch": man["arch"], "knobs": man["knobs"],
                        "tvm_version": man["tvm_version"], "compiler": man.get("compiler"), **res})
    commits = {r.get("built_from_commit") for r in results} - {None}
    commit = commits.pop() if len(commits) == 1 else None
    return {"gpu": harness.gpu_info(), **harness.run_info(commit), "method": harness.__doc__.strip(),
            "results": results}
