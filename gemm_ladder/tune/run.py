"""A whole tuning run in one call: prune, build (cached, in parallel), measure, merge.

    from gemm_ladder.tune.run import tune, tune_many
    report = tune("v6", (4096, 4096, 4096), space={"pipe_depth": [3, 4, 5]})
    run = tune_many(jobs.read_plan("model.plan"), tracker=("127.0.0.1", 9190), key="h200")

``tune_many`` runs a list of jobs (``jobs``: rungs x shapes x dtypes, from a plan file): every job's candidates are
built first, then all are measured as one run, on this GPU or on the RPC servers of a tracker
(``rpc``), with one progress bar, and every job's best goes into the database.

``python -m gemm_ladder tune`` runs the same steps (see ``gemm_ladder.cli``), or one of them at
a time for a build box and a GPU box (``--build-only``, ``--measure``, ``--merge``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..core import files
from ..core.procs import progress as progress_bar
from ..core.provenance import utc_now
from ..measure import harness
from .cache import build_candidates
from .jobs import Job
from .measuring import CONFIRM_TOP, RUN_FORMAT, measure, read_candidates
from .merge import merge
from .rpc import measure_folders
from .space import search_space


def default_out(rung: str, shape, dtype: str, arch: str, spec: str | None = None) -> Path:
    """Where a run puts its candidates when not told: ``build/tune/<rung>_<MxNxK>_<dtype>_<arch>`` (the
    spec's tag for the dtype where there is one: ``jobs.Job.name``)."""
    return Path("build") / "tune" / Job(rung, tuple(shape), dtype, spec=spec).name(arch)


def tune(rung: str, shape, dtype: str = "float16", arch: str = "sm_90a", space: dict | None = None, *,
         l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None,
         jobs: int | None = None, cache_dir=None, out=None, build_only: bool = False,
         reps: int = 50, timeout: float = 300.0, db=None, plot=True, progress: bool = True,
         identity: dict | None = None, spec: str | None = None) -> dict:
    """Prune, build (cached, in parallel), and unless ``build_only`` measure and merge into ``db``.
    ``spec``: an operand spec's text built into every candidate (``jobs.fp8_spec``: scaled_mm's fp8 kernel,
    timed against ``torch._scaled_mm``; ``dtype`` is then D's).

    Returns the candidates manifest (``build_only``) or the measurements report (with
    ``"merged"``: what happened in the database).
    """
    M, N, K = (int(x) for x in shape)
    out = Path(out) if out else default_out(rung, (M, N, K), dtype, arch, spec)
    sp = search_space(rung, (M, N, K), dtype, arch, space, l2_keep, num_sms, l2_bytes, spec=spec)
    man = build_candidates(sp, out, cache_dir, jobs, progress, identity)
    if build_only:
        return man
    report = measure(out, reps=reps, timeout=timeout, progress=progress, plot=plot)
    report["merged"] = merge([report["path"]], db)
    return report


def job_folders(jobs: list[Job], arch: str, out=None) -> list[Path]:
    """Where each job's candidates go: ``out`` itself for one job (default
    ``build/tune/<job name>``); for several, ``out/<job name>`` (default ``build/tune``)."""
    if out and len(jobs) == 1:
        return [Path(out)]
    root = Path(out) if out else Path("build") / "tune"
    return [root / job.name(arch) for job in jobs]


def measure_local(folders, reps: int = 50, timeout: float = 300.0, *, out=None, progress: bool = True, plot=True,
                  measurements_out=None, confirm_top: int | None = None, timer: str | None = None) -> dict:
    """Measure candidate folders on this GPU, one after the other, under one progress bar;
    returns the run (the shape of ``rpc.measure_folders``'s). ``measurements_out``: where the
    one folder's measurements go (default: in the folder). ``confirm_top``: candidates of each
    folder timed again together (``measuring.confirm``; default ``measuring.CONFIRM_TOP``). ``timer``:
    ``queued`` or ``graph`` for every folder (default: each folder's ``measuring.default_timer``)."""

    confirm_top = CONFIRM_TOP if confirm_top is None else confirm_top

    folders = [Path(f) for f in folders]
    total = sum(sum((f / c["file"]).exists() for c in read_candidates(f)["candidates"]) for f in folders)
    gpu = harness.gpu_info()
    bar = progress_bar(total, "measure") if progress and total else None
    start = time.monotonic()
    try:
        reports = [measure(f, reps=reps, timeout=timeout, gpu=gpu, progress=False, plot=plot, bar=bar,
                           out=measurements_out if len(folders) == 1 else None, confirm_top=confirm_top,
                           timer=timer)
                   for f in folders]
    finally:
        if bar is not None:
            bar.close()
    wall = time.monotonic() - start
    measured = sum(len(r["results"]) for r in reports)
    run = {"format": RUN_FORMAT, "version": 1, "date": utc_now(), "reps": reps, "timeout_s": timeout,
           "servers": {"local": {"gpu": gpu, "candidates": measured}}, "wall_s": round(wall, 2),
           "candidates": measured, "measured": measured,
           "ok": sum(r["status"] == "ok" for rep in reports for r in rep["results"]),
           "candidates_per_minute": round(measured / wall * 60, 2) if wall > 0 else None, "reports": reports}
    if out:
        files.write_json(Path(out), run)
        run["path"] = str(out)
    return run


def tune_many(jobs: list[Job], arch: str = "sm_90a", space: dict | None = None, *, out=None,
              l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None,
              build_jobs: int | None = None, cache_dir=None, build_only: bool = False,
              tracker: tuple[str, int] | None = None, key: str | None = None, batch: int = 4,
              reps: int = 50, timeout: float = 300.0, db=None, plot=True, progress: bool = True,
              run_out=None, measurements_out=None, identity: dict | None = None,
              confirm_top: int | None = None, timer: str | None = None) -> dict:
    """Build every job's candidates (into :func:`job_folders`), then unless ``build_only``
    measure them all in one run (on the ``key`` servers of ``tracker`` when given, else on this
    GPU) and merge each job's best into ``db``.

    ``space`` applies to every job (a job's own space wins for the knobs it names). Returns
    ``{"folders", "manifests"}`` and, when measured, the run (``rpc.measure_folders``) with
    ``"merged"``.
    """
    folders, manifests = job_folders(jobs, arch, out), []
    for n, (job, folder) in enumerate(zip(jobs, folders), 1):
        sp = search_space(job.rung, job.shape, job.dtype, arch, {**(space or {}), **job.space}, l2_keep,
                          num_sms, l2_bytes, spec=job.spec)
        if progress:
            print(f"tune: {n}/{len(jobs)} {job.name(arch)}: {sp.counts()}", file=sys.stderr)
        manifests.append(build_candidates(sp, folder, cache_dir, build_jobs, progress, identity))
    result = {"folders": [str(f) for f in folders], "manifests": manifests}
    if build_only:
        return result
    if tracker is not None:
        run = measure_folders(folders, tracker, key, reps=reps, timeout=timeout, batch=batch, out=run_out,
                              progress=progress, plot=plot)
    else:
        run = measure_local(folders, reps=reps, timeout=timeout, out=run_out, progress=progress, plot=plot,
                            measurements_out=measurements_out, confirm_top=confirm_top, timer=timer)
    run["merged"] = merge([r["path"] for r in run["reports"]], db)
    return {**result, **run}
