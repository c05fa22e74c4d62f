"""Run CPU-bound jobs (kernel builds) in spawned worker processes.

Building is the slow part on a CPU box, and TVM's compiler holds the GIL: the CLI's export and
the tuner both fan their builds out to processes, each of which imports TVM once. ``spawn``
(not ``fork``) keeps each worker free of the parent's CUDA and TVM state. A worker that dies
(a crash in codegen) is reported as that job's exception; the other jobs still finish.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys


def map_in_processes(fn, jobs, workers: int | None = None, on_done=None) -> list:
    """``fn(job)`` for every job; results (or the exception a job raised) in job order.

    ``on_done(index, result)`` is called as each job finishes (for progress bars). One worker,
    or one job, runs in this process.
    """
    jobs = list(jobs)
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    results: list = [None] * len(jobs)

    def finish(i, res):
        results[i] = res
        if on_done:
            on_done(i, res)

    if workers <= 1:
        for i, job in enumerate(jobs):
            try:
                finish(i, fn(job))
            except Exception as err:  # pylint: disable=broad-except
                finish(i, err)
        return results
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for fut in cf.as_completed(futures):
            try:
                finish(futures[fut], fut.result())
            except Exception as err:  # pylint: disable=broad-except
                finish(futures[fut], err)
    return results


def progress(total: int, desc: str):
    """A tqdm bar on stderr (``update``, ``set_postfix``, ``close``), or None without tqdm."""
    try:
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel  (optional)
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
