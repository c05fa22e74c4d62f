"""The GPU side of a tuning run: check and time every candidate of a folder; load the best.

Runtime-only: nothing here imports TVM's compiler, the rungs, ``layouts`` or ``schedulers``, so a
GPU box with the runtime pack (``python -m gemm_ladder pack-runtime``) measures what a build box
prepared (``tune --build-only``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from pathlib import Path

from ..core import device, files, records
from ..core.device import speed_rank
from ..core.procs import progress as progress_bar
from ..core.provenance import utc_now
from ..core.records import FILE_NAME, SHAPE, List, Map, Obj, Str
from ..core.spec import text_is_fp8
from ..measure import harness, isolate, rounds
from ..serve import runtime
from .report import knob_label, plot_measurements

CANDIDATES = "candidates.json"  # a candidate folder's list, written by tune.cache.build_candidates
CANDIDATES_FORMAT = "gemm_ladder.tune.candidates"
# what measuring reads of a candidate list (tune.cache.build_candidates writes it)
CANDIDATES_SCHEMA = Obj({"format": Str((CANDIDATES_FORMAT,)), "rung": Str(), "shape": SHAPE, "dtype": Str(),
                         "arch": Str(), "tvm_version": Str(), "compiler": Str(),
                         "candidates": List(Obj({"id": Str(), "file": FILE_NAME, "knobs": Map(), "cache_key": Str()}))},
                        {"spec": Str()})  # spec: the operand spec's text, where not the dtype's default (fp8)
MEASUREMENTS_FORMAT = "gemm_ladder.tune.measurements"
RUN_FORMAT = "gemm_ladder.tune.run"  # several folders measured in one run: their reports and the run's figures
# Dense fp16/bf16 tensor-core peak of the fastest GPU of each arch (H100/H200 SXM; GB200), in
# TFLOPS: a measurement above it is a broken timer or a broken file, not a fast kernel.
CONFIRM_TOP = 4  # candidates timed again together in the second pass (tune --confirm)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "gpu"


def read_candidates(folder) -> dict:
    """``folder``'s candidate list (what ``tune --build-only`` wrote), checked: ``RecordError``
    (a ``ValueError``) naming the file, the field and the fix."""
    path = Path(folder) / CANDIDATES
    return records.read_json(path, "candidate list", f"make the folder with tune --build-only --out {folder}",
                             CANDIDATES_SCHEMA)


def time_paths(paths, reps: int = 50, timeout: float = 300.0, on_result=None, timer: str = "queued") -> list[dict]:
    """Check and time modules against cuBLAS, each with its own ``timeout``: the method of
    :func:`measure` (and of a tuning RPC server, ``tune.serve``), results in the order of ``paths``.

    The ``time`` job of :mod:`gemm_ladder.measure.isolate` (a randn check, then ``harness.time_module``:
    the module and cuBLAS timed in the same process, as ``bench`` does) runs on all of them in
    one watched child. A module that erred is measured again alone in a fresh child
    (``run_isolated``), since a kernel that faults breaks the CUDA context for every module
    after it in the same child; its first error is kept as ``first_try``.
    """
    paths = [Path(p) for p in paths]
    args = (reps,) if timer == "queued" else (reps, timer)
    timed = isolate.run_batch("time", paths, args, timeout=timeout, on_result=on_result) if paths else []
    for i, res in enumerate(timed):
        if res.get("status") == "error":
            again = isolate.run_isolated("time", paths[i], *args, timeout=timeout)
            timed[i] = {**again, "first_try": res.get("detail", "")}
    return timed


def default_timer(man: dict) -> str:
    """How a folder's candidates are timed unless told: an fp8 folder's kernels in CUDA graphs (its
    short kernels, 10-60 us at the shapes the fp8 suite holds, would time the Python host path of a
    queued call: the best of the same candidates at 256x2112x7168 read 125.6 TFLOPS queued and 619.7 in
    graphs on an H200, ``benchmarks/results/2026-11-29_h200_fp8_tune/``); a 16-bit folder's queued, as every
    entry of the database was measured (the ratios of one database compare like with like)."""
    return "graph" if text_is_fp8(man.get("spec")) else "queued"


def measure(folder, reps: int = 50, timeout: float = 300.0, out=None, gpu: dict | None = None,
            progress: bool = True, plot=True, bar=None, confirm_top: int = CONFIRM_TOP,
            timer: str | None = None) -> dict:
    """Check and time every candidate of ``folder`` against cuBLAS; write the measurements JSON.

    :func:`time_paths` on every candidate of the folder: ``wrong``, ``crash``, ``error`` and
    ``timeout`` are recorded and do not stop the search. Then :func:`confirm` times the
    ``confirm_top`` best again, together (0 or 1: no second pass). ``bar``: a progress bar to
    advance (one bar over several folders); else one is made when ``progress``. ``timer``: ``queued`` or
    ``graph`` (``harness.time_module``'s), both passes; default :func:`default_timer`. Returns the
    measurements dict (``"path"`` says where it was written).
    """
    folder = Path(folder)
    man = read_candidates(folder)
    timer = timer or default_timer(man)
    gpu = gpu or harness.gpu_info()
    cands = man["candidates"]
    present = [i for i, c in enumerate(cands) if (folder / c["file"]).exists()]
    state = {"best": None}
    own_bar = bar is None and progress
    if own_bar:
        bar = progress_bar(len(present), f"measure {man['rung']}")

    def seen(res):
        best = state["best"]
        if res.get("status") == "ok" and (best is None or speed_rank(res) > speed_rank(best)):
            state["best"] = best = res
        if bar is not None:
            bar.update(1)
            if best is not None:
                bar.set_postfix_str(f"best {best['tflops']:.1f} TFLOPS ({best['ratio_to_cublas']:.2f}x cuBLAS) "
                                    f"{best.get('module', '')}")

    try:
        timed = time_paths([folder / cands[i]["file"] for i in present], reps, timeout, on_result=seen,
                           timer=timer)
    finally:
        if own_bar and bar is not None:
            bar.close()
    paths = [folder / cands[i]["file"] for i in present]
    timed, second = confirm(paths, timed, confirm_top, timeout, timer=timer)
    report = make_report(folder, man, dict(zip(present, timed)), gpu, reps, timeout, confirm=second, timer=timer)
    return write_report(report, Path(out) if out else None, plot)


def confirm_count(text: str) -> int:
    """``tune --confirm N``: a whole number of candidates, 0 or more (an argparse type)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give how many candidates to time "
                                         f"again, e.g. --confirm {CONFIRM_TOP}, or 0 for the first pass only") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative: give 0 (the first pass only) or more")
    return n


def confirm_pick(results: list[dict], top: int) -> list[int]:
    """The indices of the ``top`` best correct results of a first pass (``device.speed_rank``),
    best first; none when fewer than two are correct or ``top`` < 2 (nothing to compare)."""
    ok = sorted((i for i, r in enumerate(results) if r.get("status") == "ok"),
                key=lambda i: speed_rank(results[i]), reverse=True)
    return ok[:top] if top >= 2 and len(ok) >= 2 else []


def apply_confirmed(results: list[dict], picked: list[int], second: list[dict]) -> list[dict]:
    """The first pass's results with the second pass's numbers on the ``picked`` ones.

    A confirmed result takes the second pass's ``ms``, ``tflops``, ``cublas_tflops`` and
    ``ratio_to_cublas`` (the first pass's go to ``first_pass``) and ``confirmed: True``, which
    ranks it before every unconfirmed one (``device.speed_rank``). A candidate that failed its
    second check (``wrong``, ``timeout``, ``crash``) takes that status; one whose second pass
    erred otherwise keeps its first pass, unconfirmed, with the reason in ``confirm_error``.
    """
    out = [dict(r) for r in results]
    for i, res in zip(picked, second):
        if res.get("status") == "ok":
            first = {k: out[i].get(k) for k in ("ms", "tflops", "cublas_tflops", "ratio_to_cublas")}
            out[i].update({k: res[k] for k in ("ms", "tflops", "cublas_tflops", "ratio_to_cublas",
                                               "round_ratio_to_cublas_quartiles") if k in res},
                          first_pass=first, confirmed=True)
        elif res.get("status") in ("wrong", "timeout", "crash", "hang"):
            out[i] = {**out[i], **{k: v for k, v in res.items() if k != "module"}, "confirm_failed": True}
        else:
            out[i]["confirm_error"] = res.get("detail", res.get("status"))
    return out


def confirm(paths, results: list[dict], top: int = CONFIRM_TOP, timeout: float = 300.0,
            rounds_args=(rounds.ROUNDS, rounds.PER_ROUND, rounds.WARM_S), timer: str = "queued"
            ) -> tuple[list[dict], dict | None]:
    """The tuner's second pass: the ``top`` best candidates of the first (``results``, in the order
    of ``paths``) timed again together, taking turns with cuBLAS in the same rounds after a
    warm-up at the power limit (:mod:`gemm_ladder.measure.rounds`, in a watched child).

    The first pass times each candidate for a fraction of a second beside cuBLAS. On a GPU that
    reaches its power limit only after a few hundred milliseconds, that reads the early clock, and
    the candidates' ratios spread by several percent from turn to turn: at 6144^3 bf16 on an H100
    the first pass put a candidate 4% ahead of one that the same rounds put 2% behind
    (``benchmarks/results/2026-11-23_h100_front_door_epi_under/``). Returns the results with
    :func:`apply_confirmed` and the second pass's record (``None`` when there was none).
    """
    picked = confirm_pick(results, top)
    if not picked:
        return results, None
    n_rounds, per_round, warm = rounds_args
    group = [str(paths[i]) for i in picked]
    # the first result comes once the whole group is timed: the deadline is the group's
    deadline = timeout * len(group) + warm
    args = (n_rounds, per_round, warm) + (() if timer == "queued" else (timer,))
    second = isolate.run_batch("rounds", group, args, timeout=deadline, explain=False)
    record = {"method": rounds.__doc__.split("\n\n")[0], "top": top, "rounds": n_rounds, "per_round": per_round,
              "warm_s": warm, "timer": timer, "candidates": [Path(g).name for g in group],
              "statuses": [r.get("status") for r in second]}
    return apply_confirmed(results, picked, second), record


def make_report(folder, man: dict, by_index: dict, gpu: dict, reps: int, timeout: float, **extra) -> dict:
    """The measurements report of a candidate folder from its results (``{candidate index:
    result}``); a candidate with no result is ``missing``. ``extra`` fields are added."""
    folder = Path(folder)
    results = []
    for i, cand in enumerate(man["candidates"]):
        res = by_index.get(i, {"status": "missing", "detail": f"{folder / cand['file']} is not there"})
        res = {k: v for k, v in res.items() if k != "module"}
        results.append({"id": cand["id"], "file": cand["file"], "knobs": cand["knobs"],
                        "cache_key": cand["cache_key"], **res})
    ok = [r for r in results if r["status"] == "ok"]
    best = max(ok, key=speed_rank) if ok else None
    return {
        "format": MEASUREMENTS_FORMAT, "version": 1,
        "rung": man["rung"], "shape": man["shape"], "dtype": man["dtype"], "arch": man["arch"],
        **({"spec": man["spec"]} if man.get("spec") else {}),
        "tvm_version": man["tvm_version"], "compiler": man["compiler"], "sources": man.get("sources"),
        "commit": man.get("commit"), "gpu": gpu, "date": utc_now(), "reps": reps, "timeout_s": timeout,
        "method": harness.__doc__.strip(), "candidates": str(folder.resolve()),
        **extra, "results": results, "best": best,
    }


def write_report(report: dict, path=None, plot=True) -> dict:
    """Write a measurements report (default: ``measurements_<gpu>.json`` in its candidate
    folder) and its plot; returns it with ``"path"`` (and ``"plot"``)."""
    gpu = report.get("gpu") or {}
    path = Path(path) if path else Path(report["candidates"]) / f"measurements_{_slug(gpu.get('name', 'gpu'))}.json"
    files.write_json(path, report)
    report["path"] = str(path)
    if plot:
        png = Path(plot) if isinstance(plot, (str, os.PathLike)) else path.with_suffix(".png")
        report["plot"] = str(png) if plot_measurements(report, png) else None
    return report


def _reports(folder: Path) -> list[tuple[Path, dict]]:
    reports = []
    for p in sorted(folder.glob("measurements*.json")):
        try:
            r = records.read_json(p, "measurements", "measure the folder again with tune --measure")
        except records.RecordError as err:
            warnings.warn(f"{err}: ignored", stacklevel=3)
            continue
        if isinstance(r, dict) and r.get("format") == MEASUREMENTS_FORMAT:
            reports.append((p, r))
    return reports


def load_best(folder, M: int | None = None, N: int | None = None, K: int | None = None,
              dtype: str | None = None):
    """Load the fastest correct module that ``measure`` found in a candidate folder (runtime-only).

    Reads ``folder/measurements*.json``, preferring the file measured on this GPU. The module
    gets a ``tuned_from`` attribute (file, knobs, TFLOPS, GPU).
    """
    folder = Path(folder)
    reports = _reports(folder)
    if not reports:
        raise FileNotFoundError(f"no measurements in {folder}: run tune --measure {folder} on a GPU first")
    gpu = device.probe()
    here = gpu.name if gpu is not None else None
    rows = []
    for p, r in reports:
        if M is not None and list(r["shape"]) != [M, N, K]:
            continue
        if dtype is not None and r["dtype"] != dtype:
            continue
        for row in r["results"]:
            if row.get("status") == "ok" and (folder / row["file"]).exists():
                rows.append(((r["gpu"].get("name") == here, speed_rank(row)), row, r, p))
    if not rows:
        want = f" for {M}x{N}x{K}" if M is not None else ""
        raise FileNotFoundError(f"no correct measured module{want}{' ' + dtype if dtype else ''} in {folder}")
    _, row, r, p = max(rows, key=lambda t: t[0])
    mod = runtime.load(folder / row["file"])
    mod.tuned_from = {"measurements": str(p), "file": row["file"], "knobs": row["knobs"],
                      "tflops": row["tflops"], "ratio_to_cublas": row.get("ratio_to_cublas"),
                      "gpu": r["gpu"].get("name")}
    print(f"gemm_ladder: loaded {row['file']} ({knob_label(row['knobs'])}: {row['tflops']:.1f} TFLOPS on "
          f"{r['gpu'].get('name')}, from {p.name})", file=sys.stderr)
    return mod
