"""Merge the tuner's measurements into the tuning database.

A measurements file (``tune --measure``) or a run file (``--run-out``: several folders) is read
and checked (:data:`MEASUREMENTS_SCHEMA`); each report's fastest correct candidate becomes a
database entry (:func:`entry_from_measurements`) that :func:`merge` upserts into a
:class:`gemm_ladder.serve.tuning_db.TuningDB` (the database the serving policy reads).
"""

from __future__ import annotations

import warnings

from ..core import records
from ..core.config import ARCHS, DTYPES, ConfigError
from ..core.device import speed_problem, speed_rank
from ..core.records import SHAPE, List, Maybe, Obj, RecordError, Str
from ..core.spec import text_is_fp8
from ..rungs import RUNGS
from ..serve.tuning_db import TuningDB, _entry_problem, knobs_problem, shape_bucket
from .measuring import MEASUREMENTS_FORMAT, RUN_FORMAT

# what a merge reads of a measurements report (a candidate's own fields are checked one by one)
MEASUREMENTS_SCHEMA = Obj({"format": Str((MEASUREMENTS_FORMAT,)), "rung": Str(RUNGS), "shape": SHAPE,
                           "dtype": Str(DTYPES), "arch": Str(ARCHS), "tvm_version": Str(), "results": List(Obj())},
                          {"gpu": Maybe(Obj(optional={"name": Maybe(Str())})), "date": Maybe(Str()),
                           "commit": Maybe(Str()), "compiler": Maybe(Str()), "sources": Maybe(Str()),
                           "spec": Str()})
RUN_SCHEMA = Obj({"reports": List(MEASUREMENTS_SCHEMA)})


def entry_from_measurements(report: dict, source: str = "measurements") -> dict | None:
    """The database entry for the fastest correct candidate of a measurements report (checked
    by :data:`MEASUREMENTS_SCHEMA`); results whose speed or knobs cannot be real are left out
    with a warning."""
    ok = []
    try:
        fp8 = text_is_fp8(report.get("spec"))
    except ConfigError as err:
        warnings.warn(f"{source}: spec {report.get('spec')!r} does not parse ({err}); nothing merged", stacklevel=3)
        return None
    for r in report.get("results", []):
        if not isinstance(r, dict) or r.get("status") != "ok":
            continue
        problem = speed_problem(r.get("tflops"), report.get("arch", ""), fp8=fp8) or knobs_problem(r.get("knobs"))
        if problem:
            warnings.warn(f"{source}: candidate {r.get('id', '?')} ignored ({problem})", stacklevel=3)
            continue
        ok.append(r)
    if not ok:
        return None
    best = max(ok, key=speed_rank)
    gpu = report.get("gpu") or {}
    return {
        "rung": report["rung"], "shape": list(report["shape"]), "bucket": shape_bucket(report["shape"]),
        "dtype": report["dtype"], "arch": report["arch"], **({"spec": report["spec"]} if report.get("spec") else {}),
        "gpu": gpu.get("name") or "unknown",
        "tvm_version": report["tvm_version"], "knobs": best["knobs"],
        "tflops": best["tflops"], "cublas_tflops": best.get("cublas_tflops"),
        "ratio_to_cublas": best.get("ratio_to_cublas"), "ms": best.get("ms"),
        "confirmed": best.get("confirmed") is True,
        "date": report.get("date"), "commit": report.get("commit"), "compiler": report.get("compiler"),
        "sources": report.get("sources"), "sm_clock_mhz": gpu.get("sm_clock_mhz_now"),
        "candidates_measured": len(report.get("results", [])), "candidates_ok": len(ok),
    }


def read_reports(path) -> list[tuple[str, dict]]:
    """The measurements reports of a measurements file, or of a run file (several folders),
    checked (:data:`MEASUREMENTS_SCHEMA`); ``RecordError`` names the file, the field and the fix."""
    fix = "give a measurements file that tune --measure wrote (or its run file, --run-out)"
    data = records.read_json(path, "measurements file", fix)
    form = data.get("format") if isinstance(data, dict) else None
    if form == RUN_FORMAT:
        records.validate(data, RUN_SCHEMA, path, fix)
        return [(f"{path} [{i}]", r) for i, r in enumerate(data["reports"])]
    if form == MEASUREMENTS_FORMAT:
        return [(str(path), records.validate(data, MEASUREMENTS_SCHEMA, path, fix))]
    raise RecordError(f"{path} is not a gemm_ladder measurements or run file (format {records.show(form)}): {fix}",
                      path=path, field="format", fix=fix)


def merge(paths, db=None) -> list[dict]:
    """Merge measurements files (or run files, each report of them) into the database; returns
    what happened to each report. Every file is read and checked before anything is written."""
    tdb = db if isinstance(db, TuningDB) else TuningDB(db)
    done = []
    reports = [pr for p in (paths if isinstance(paths, (list, tuple)) else [paths]) for pr in read_reports(p)]
    for p, report in reports:
        entry = entry_from_measurements(report, str(p))
        problem = _entry_problem(entry) if entry is not None else None
        if entry is None or problem:
            warnings.warn(f"{p}: " + (f"its best entry is not trusted ({problem})" if problem
                                      else "no candidate was correct and timed") + "; nothing merged", stacklevel=2)
            done.append({"file": str(p), "action": "nothing"})
            continue
        done.append({"file": str(p), "action": tdb.upsert(entry), "entry": entry})
    tdb.save()
    return done
