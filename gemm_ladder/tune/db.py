"""The tuning database, and the policy that uses it: tuned knobs for a build given none.

A JSON file of best configs, one entry per (rung, shape, dtype, arch, gpu, TVM version)::

    {"format": "gemm_ladder.tuning_db", "version": 1, "entries": [
        {"rung": "v6", "shape": [4096, 4096, 4096], "bucket": [4096, 4096, 4096],
         "dtype": "float16", "arch": "sm_90a", "gpu": "NVIDIA H100 80GB HBM3",
         "tvm_version": "0.27.0.post1", "knobs": {"pipe_depth": 4, ...},
         "tflops": 612.0, "cublas_tflops": 680.0, "ratio_to_cublas": 0.9, "ms": 0.22,
         "date": "...", "commit": "...", "compiler": "nvrtc 13.0", "sources": "<sha256>",
         "sm_clock_mhz": "1980 MHz", "candidates_measured": 48}, ...]}

Where it lives: ``--db`` > ``$GEMM_LADDER_TUNING_DB`` (``off`` disables the lookup) >
``benchmarks/tuning/tuning_db.json`` when run from inside the repo > the user cache.

Nothing in it is trusted blindly. A file that does not parse is ignored (and moved aside on the
next save); an entry that is malformed, of an unknown rung, with knobs that are not ints or
names, or with a speed that no GPU of its arch can reach (negative, NaN, infinite, above the
arch's peak: :data:`PEAK_TFLOPS`) is ignored with a warning, on reading and on merging; an
entry of another TVM version, or with knobs the validator refuses today, is not used for a build.

The policy: :func:`tuned_knobs` gives a build with no rung knobs the best entry's knobs and
prints which entry it used; ``gemm_ladder.build`` and the CLI's ``build``/``export``/``main``
call it. ``gemm_ladder.builder.build`` never does.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import warnings
from pathlib import Path

from .. import device, files, toolchain
from ..batch import BuildJob, as_job
from ..config import ARCHS, COMMON_KNOBS, DTYPES, ConfigError
from ..rungs import RUNGS, make_config
from .cache import tvm_version
from .report import speed_rank
from .measuring import MEASUREMENTS_FORMAT, PEAK_TFLOPS, RUN_FORMAT, speed_problem  # noqa: F401  (db.PEAK_TFLOPS)

DB_FORMAT = "gemm_ladder.tuning_db"
DB_VERSION = 1
DB_ENV = "GEMM_LADDER_TUNING_DB"
ENTRY_KEY = ("rung", "shape", "dtype", "arch", "gpu", "tvm_version")
_ENTRY_TYPES = {"rung": str, "shape": list, "dtype": str, "arch": str, "gpu": str, "tvm_version": str,
                "knobs": dict, "tflops": (int, float)}


def shape_bucket(shape) -> list[int]:
    """Each dim rounded to the nearest power of two (1.5x a power and above rounds up): shapes in
    one bucket share tuned knobs."""
    out = []
    for x in map(int, shape):
        lo = 1 << (max(x, 1).bit_length() - 1)
        out.append(lo if 2 * x < 3 * lo else 2 * lo)
    return out


def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").exists():
        return None
    try:
        Path.cwd().resolve().relative_to(root)
    except ValueError:
        return None
    return root


def default_db_path() -> Path | None:
    """``$GEMM_LADDER_TUNING_DB`` (``off``: none), the repo's benchmarks/tuning, else the user cache."""
    env = os.environ.get(DB_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "none", "0") else Path(env)
    root = _repo_root()
    if root is not None:
        return root / "benchmarks" / "tuning" / "tuning_db.json"
    return toolchain.cache_dir() / "tuning_db.json"


def knobs_problem(knobs) -> str | None:
    """Why ``knobs`` cannot be a rung's knobs (every knob is an int, a switch such as
    ``stream_k`` or a name), or None."""
    if not isinstance(knobs, dict):
        return "knobs are not an object"
    for k, v in knobs.items():
        if not isinstance(v, (int, str)):  # bool is an int
            return f"knob {k}={v!r} is {type(v).__name__}, not an int, a bool or a name"
    return None


def _entry_problem(e) -> str | None:
    if not isinstance(e, dict):
        return "not an object"
    for k, t in _ENTRY_TYPES.items():
        if not isinstance(e.get(k), t):
            return f"field {k!r} missing or of the wrong type"
    if len(e["shape"]) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                       for x in e["shape"]):
        return f"shape {e['shape']!r} is not [M, N, K]"
    if e["rung"] not in RUNGS:
        return f"unknown rung {e['rung']!r}"
    if e["arch"] not in ARCHS:
        return f"unknown arch {e['arch']!r}"
    problem = speed_problem(e["tflops"], e["arch"]) or knobs_problem(e["knobs"])
    for name in ("cublas_tflops", "ratio_to_cublas"):
        if problem is None and e.get(name) is not None:
            v = e[name]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            problem = None if ok else f"{name} {v!r} is not a positive finite number"
    return problem


class TuningDB:
    """The tuning database file (see the module docstring); ``entries`` holds the trusted ones."""

    def __init__(self, path=None):
        self.path = Path(path) if path else default_db_path()
        self.entries: list[dict] = []
        self.corrupt = False
        if self.path is not None and self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("format") != DB_FORMAT or not isinstance(data.get("entries"), list):
                raise ValueError(f"not a {DB_FORMAT} file")
            if data.get("version") != DB_VERSION:
                raise ValueError(f"version {data.get('version')!r}, this gemm_ladder reads version {DB_VERSION}")
        except (OSError, ValueError) as err:
            warnings.warn(f"tuning database {self.path} is unreadable ({err}): ignored, not trusted", stacklevel=3)
            self.corrupt = True
            return
        for e in data["entries"]:
            problem = _entry_problem(e)
            if problem:
                warnings.warn(f"tuning database {self.path}: entry ignored ({problem}): {str(e)[:200]}", stacklevel=3)
                continue
            self.entries.append(e)

    def save(self) -> Path:
        if self.path is None:
            raise ValueError(f"no tuning database path (${DB_ENV} is off): pass --db PATH")
        if self.corrupt and self.path.exists():
            aside = self.path.with_name(f"{self.path.name}.corrupt-{_dt.datetime.now():%Y%m%d%H%M%S}")
            os.replace(self.path, aside)
            warnings.warn(f"the unreadable tuning database was moved to {aside}", stacklevel=2)
            self.corrupt = False
        entries = sorted(self.entries, key=lambda e: tuple(str(e[k]) for k in ENTRY_KEY))
        files.write_json(self.path, {"format": DB_FORMAT, "version": DB_VERSION, "entries": entries})
        return self.path

    def upsert(self, entry: dict) -> str:
        """Add ``entry``; an entry of the same key is replaced when slower (``report.speed_rank``), or older
        and from other sources."""
        key = tuple(json.dumps(entry[k]) for k in ENTRY_KEY)
        for i, old in enumerate(self.entries):
            if tuple(json.dumps(old[k]) for k in ENTRY_KEY) != key:
                continue
            newer_code = old.get("sources") != entry.get("sources") and entry.get("date", "") >= old.get("date", "")
            if speed_rank(entry) > speed_rank(old) or newer_code:
                self.entries[i] = entry
                return "replaced"
            return "kept"
        self.entries.append(entry)
        return "added"


def entry_from_measurements(report: dict, source: str = "measurements") -> dict | None:
    """The database entry for the fastest correct candidate of a measurements report; results
    whose speed or knobs cannot be real are left out with a warning."""
    ok = []
    for r in report.get("results", []):
        if r.get("status") != "ok":
            continue
        problem = speed_problem(r.get("tflops"), report.get("arch", "")) or knobs_problem(r.get("knobs"))
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
        "dtype": report["dtype"], "arch": report["arch"], "gpu": gpu.get("name", "unknown"),
        "tvm_version": report["tvm_version"], "knobs": best["knobs"],
        "tflops": best["tflops"], "cublas_tflops": best.get("cublas_tflops"),
        "ratio_to_cublas": best.get("ratio_to_cublas"), "ms": best.get("ms"),
        "confirmed": best.get("confirmed") is True,
        "date": report.get("date"), "commit": report.get("commit"), "compiler": report.get("compiler"),
        "sources": report.get("sources"), "sm_clock_mhz": gpu.get("sm_clock_mhz_now"),
        "candidates_measured": len(report.get("results", [])), "candidates_ok": len(ok),
    }


def _reports_in(path) -> list[tuple[str, dict]]:
    """The measurements reports of a measurements file, or of a run file (several folders)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and data.get("format") == RUN_FORMAT and isinstance(data.get("reports"), list):
        return [(f"{path} [{i}]", r) for i, r in enumerate(data["reports"])]
    return [(str(path), data)]


def merge(paths, db=None) -> list[dict]:
    """Merge measurements files (or run files, each report of them) into the database; returns
    what happened to each report."""
    tdb = db if isinstance(db, TuningDB) else TuningDB(db)
    done = []
    reports = [pr for p in (paths if isinstance(paths, (list, tuple)) else [paths]) for pr in _reports_in(p)]
    for p, report in reports:
        if not isinstance(report, dict) or report.get("format") != MEASUREMENTS_FORMAT:
            raise ValueError(f"{p} is not a gemm_ladder measurements file")
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


def _usable(e: dict, rung: str, M: int, N: int, K: int, dtype: str, arch: str, tvm: str) -> bool:
    """Whether an entry may be trusted for this build; warns when it may not."""
    where = f"tuning entry {e['rung']} {'x'.join(map(str, e['shape']))} {e['dtype']} {e['arch']} on {e['gpu']}"
    if e["tvm_version"] != tvm:
        warnings.warn(f"{where} was measured with TVM {e['tvm_version']}, not {tvm}: ignored", stacklevel=4)
        return False
    if set(e["knobs"]) & set(COMMON_KNOBS):
        warnings.warn(f"{where} has dtype/arch among its knobs: ignored", stacklevel=4)
        return False
    try:
        make_config(rung, M, N, K, dtype=dtype, arch=arch, **e["knobs"])
    except ConfigError as err:
        warnings.warn(f"{where}: knobs {e['knobs']} are refused now ({err}): ignored", stacklevel=4)
        return False
    return True


def best_knobs(rung: str, M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
               db=None, gpu: str | None = "auto") -> tuple[dict, dict] | None:
    """The best known knobs for this rung, shape bucket, dtype and arch: ``(knobs, entry)`` or None.

    Preference: the GPU here (by name; ``gpu="auto"`` asks the device, ``None`` means any GPU of
    the arch), then the exact shape, then the fastest (TFLOPS for the exact shape, the ratio to
    cuBLAS across the bucket). Entries of another TVM version, with unknown knobs or knobs the
    validator now refuses for this shape are ignored with a warning.
    """
    if rung not in RUNGS or arch not in ARCHS or dtype not in DTYPES:
        return None
    tdb = db if isinstance(db, TuningDB) else TuningDB(db)
    if tdb.path is None and not tdb.entries:
        return None
    bucket = shape_bucket((M, N, K))
    near = [e for e in tdb.entries if e["rung"] == rung and e["dtype"] == dtype and e["arch"] == arch
            and shape_bucket(e["shape"]) == bucket]
    if not near:
        return None
    tvm = tvm_version()
    usable = [e for e in near if _usable(e, rung, M, N, K, dtype, arch, tvm)]
    if not usable:
        return None
    if gpu == "auto":
        found = device.probe(0, arch=arch)
        here = found.name if found is not None else None
    else:
        here = gpu

    def rank(e):
        # this GPU's entries first, then the shape's own, then the fastest by report.speed_rank
        return (here is not None and e["gpu"] == here, list(e["shape"]) == [M, N, K], speed_rank(e))

    best = max(usable, key=rank)
    return dict(best["knobs"]), {**best, "db": str(tdb.path)}


def tuned_knobs(rung: str, M: int, N: int, K: int, knobs: dict) -> tuple[dict, dict | None]:
    """The policy: with no rung knobs given, the database's best; explicit knobs always win.

    Returns ``(knobs to build with, tuned_from record or None)`` and prints which entry it used.
    """
    if set(knobs) - set(COMMON_KNOBS):
        return knobs, None
    dtype, arch = knobs.get("dtype", COMMON_KNOBS["dtype"]), knobs.get("arch", COMMON_KNOBS["arch"])
    found = best_knobs(rung, M, N, K, dtype, arch)
    if found is None:
        return knobs, None
    tuned, entry = found
    tuned_from = {k: entry.get(k) for k in ("db", "gpu", "shape", "tflops", "cublas_tflops", "ratio_to_cublas",
                                            "date", "commit", "tvm_version")}
    print(f"gemm_ladder: {rung} {M}x{N}x{K} {dtype}: tuned knobs {tuned} "
          f"from {entry['gpu']} {'x'.join(map(str, entry['shape']))} ({entry['tflops']:.1f} TFLOPS, "
          f"{entry.get('ratio_to_cublas') or 0:.2f}x cuBLAS, {entry.get('date')}; {entry['db']})", file=sys.stderr)
    return {**knobs, **tuned}, tuned_from


def tuned_jobs(jobs) -> list[BuildJob]:
    """:func:`tuned_knobs` for every build job that names no rung knobs (the CLI's policy)."""
    out = []
    for job in map(as_job, jobs):
        knobs, tuned_from = tuned_knobs(job.rung, *job.shape, job.knobs)
        extra = {**(job.extra or {}), **({"tuned_from": tuned_from} if tuned_from else {})}
        out.append(BuildJob(job.rung, job.shape, knobs, extra or None, job.name))
    return out
