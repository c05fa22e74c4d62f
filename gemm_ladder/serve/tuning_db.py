"""The tuning database, and the policy that uses it: tuned knobs for a build given none.

A JSON file of best configs, one entry per (rung, shape, dtype, arch, gpu, TVM version, spec)::

    {"format": "gemm_ladder.tuning_db", "version": 1, "entries": [
        {"rung": "v6", "shape": [4096, 4096, 4096], "bucket": [4096, 4096, 4096],
         "dtype": "float16", "arch": "sm_90a", "gpu": "NVIDIA H100 80GB HBM3",
         "tvm_version": "0.27.0.post1", "knobs": {"pipe_depth": 4, ...},
         "tflops": 612.0, "cublas_tflops": 680.0, "ratio_to_cublas": 0.9, "ms": 0.22,
         "date": "...", "commit": "...", "compiler": "nvrtc 13.0", "sources": "<sha256>",
         "sm_clock_mhz": "1980 MHz", "candidates_measured": 48}, ...]}

An entry whose kernel has operands other than the dtype's default (an fp8 ``scaled_mm`` kernel) says
so in ``spec``, the operand spec's text (``core.spec.GemmSpec.text``: e.g.
``d_bfloat16.a_float8_e4m3.b_float8_e4m3.scales_tensor``); its ``dtype`` is D's, as a build's is, its
``ratio_to_cublas`` is over torch's path for that spec (``torch._scaled_mm``: ``measure.harness``),
and its speed may reach twice the 16-bit peak (``device.peak_tflops``). An entry without ``spec`` is
a 16-bit kernel's, and serves only builds whose spec is the default (``plan.db_choice`` lends its
knobs to the same dtype's epilogues); one with ``spec`` serves only that spec.

Where it lives, wherever the process runs (:func:`db_files`; ``describe()`` says which files,
and ``explain``, ``pack build`` and ``tune --show`` print it):

1. ``--db PATH`` (the CLI) or ``TuningDB(PATH)``: that file alone, read and written;
2. else ``$GEMM_LADDER_TUNING_DB``: that file alone (``off`` disables the database);
3. else the user overlay ``<user cache>/tuning_db.json`` (``$GEMM_LADDER_CACHE``, else
   ``~/.cache/gemm_ladder``), which ``tune --merge`` writes, over the packaged database
   :data:`PACKAGED_DB` (``gemm_ladder/serve/tuning_db.json``, shipped with the package and read
   only): an overlay entry hides a packaged one of the same key. The project's measured entries
   go into the packaged file with ``tune --merge FILE --db gemm_ladder/serve/tuning_db.json``.

Nothing in it is trusted blindly. Each file is read by ``records.read_json``; a file that does
not parse (or nests too deep) is ignored with a warning (and moved aside on the next save), or
refused with ``records.RecordError`` when the caller asks for it strictly (``tune --show``); an
entry that :data:`ENTRY_SCHEMA` refuses (malformed, of an unknown rung, with knobs that are not
ints, bools or names, or with a speed that no GPU of its arch can reach: negative, NaN,
infinite, above the arch's peak, ``device.peak_tflops``) is ignored with a warning, on reading and
on merging; an entry of another TVM version, or with knobs the validator refuses today, is not
used for a build. ``tune --merge`` refuses (``RecordError``, before writing anything) a file
that is missing, not JSON, or not a measurements or run file (:data:`MEASUREMENTS_SCHEMA`), and
says which database it could not write.

The policy: :func:`tuned_knobs` gives a build with no rung knobs the best entry's knobs and
prints which entry, from which file, it used; ``gemm_ladder.build`` and the CLI's
``build``/``export``/``main`` call it. ``gemm_ladder.compile.builder.build`` never does.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import warnings
from pathlib import Path

from ..compile import toolchain
from ..compile.batch import BuildJob, as_job
from ..core import device, files, records
from ..core.config import ARCHS, COMMON_KNOBS, DTYPES, KNOB_NAME, ConfigError
from ..core.device import speed_problem, speed_rank
from ..core.provenance import tvm_version
from ..core.records import ANY, SHAPE, Check, List, Maybe, Num, Obj, RecordError, Str
from ..core.spec import SPEC_KNOB, as_spec, text_is_fp8
from ..rungs import RUNGS, make_config

DB_FORMAT = "gemm_ladder.tuning_db"
DB_VERSION = 1
DB_ENV = "GEMM_LADDER_TUNING_DB"
PACKAGED_DB = Path(__file__).with_name("tuning_db.json")  # package data (pyproject.toml)
ENTRY_KEY = ("rung", "shape", "dtype", "arch", "gpu", "tvm_version", "spec")  # spec: absent for 16-bit
_OFF = ("", "off", "none", "0")


def shape_bucket(shape) -> list[int]:
    """Each dim rounded to the nearest power of two (1.5x a power and above rounds up): shapes in
    one bucket share tuned knobs."""
    out = []
    for x in map(int, shape):
        lo = 1 << (max(x, 1).bit_length() - 1)
        out.append(lo if 2 * x < 3 * lo else 2 * lo)
    return out


def user_db_path() -> Path:
    """The user overlay: what ``tune --merge`` writes when given no ``--db``."""
    return toolchain.cache_dir() / "tuning_db.json"


def db_files(path=None) -> tuple[Path | None, list[Path]]:
    """``(the file written, the files read, first wins)`` for ``path`` (``--db``), else
    ``$GEMM_LADDER_TUNING_DB`` (``off``: ``(None, [])``), else the user overlay over the packaged
    database. Where the process runs plays no part."""
    if path:
        return Path(path), [Path(path)]
    env = os.environ.get(DB_ENV)
    if env is not None:
        return (None, []) if env.strip().lower() in _OFF else (Path(env), [Path(env)])
    user = user_db_path()
    return user, [user, PACKAGED_DB]


def default_db_path() -> Path | None:
    """The file a merge writes by default: ``$GEMM_LADDER_TUNING_DB`` (``off``: none), else the
    user overlay (see :func:`db_files` for what is read)."""
    return db_files()[0]


def knobs_problem(knobs) -> str | None:
    """Why ``knobs`` cannot be a rung's knobs (every knob is an int, a switch such as
    ``stream_k`` or a name), or None."""
    if not isinstance(knobs, dict):
        return "knobs are not an object"
    for k, v in knobs.items():
        if not KNOB_NAME.fullmatch(k) or k in ("rung", "M", "N", "K"):
            return f"knob name {records.show(k)} is not a knob's name"
        if k == SPEC_KNOB:
            return "the operand spec is among the knobs: an entry holds it in its own field, spec"
        if not isinstance(v, (int, str)):  # bool is an int
            return f"knob {k}={v!r} is {type(v).__name__}, not an int, a bool or a name"
    return None


def spec_text(spec, dtype: str) -> str | None:
    """What an entry's ``spec`` holds for a build of ``spec`` (a GemmSpec, its text, or None) in
    ``dtype``: None for the dtype's default, else the spec's text."""
    spec = as_spec(spec, dtype)
    return None if spec.is_default() else spec.text()


def _speeds_problem(e: dict) -> str | None:
    text = e.get("spec")
    try:
        fp8 = text_is_fp8(text)
        if text is not None and spec_text(text, e["dtype"]) != text:
            return f"spec {text!r} is not written as GemmSpec.text() writes it for D in {e['dtype']}"
    except ConfigError as err:
        return f"spec {text!r} does not parse ({err})"
    return speed_problem(e["tflops"], e["arch"], fp8=fp8) or knobs_problem(e["knobs"])


_SPEED = Maybe(Num(positive=True))
# an entry as the database keeps it (and as a merge makes it); the speed is checked against the arch's peak
ENTRY_SCHEMA = Check(Obj({"rung": Str(RUNGS), "shape": SHAPE, "dtype": Str(DTYPES), "arch": Str(ARCHS), "gpu": Str(),
                          "tvm_version": Str(), "knobs": ANY, "tflops": ANY},
                         {"cublas_tflops": _SPEED, "ratio_to_cublas": _SPEED, "date": Maybe(Str()),
                          "sources": Maybe(Str()), "spec": Str()}), _speeds_problem)
DB_SCHEMA = Obj({"entries": List()})


def _entry_problem(e) -> str | None:
    return records.problem(e, ENTRY_SCHEMA)


def _key(e: dict) -> tuple:
    return tuple(json.dumps(e.get(k)) for k in ENTRY_KEY)


class TuningDB:
    """The tuning database (see the module docstring): ``entries`` holds the trusted ones of
    every file read (the overlay's first), ``path`` the file :meth:`save` writes.

    ``strict``: a file that cannot be read or parsed raises ``RecordError`` instead of being
    ignored with a warning (for a caller that shows the file, where empty would mislead)."""

    def __init__(self, path=None, strict: bool = False):
        self.path, self.files = db_files(path)
        self.setting = "--db" if path else (f"${DB_ENV}" if os.environ.get(DB_ENV) is not None else "default")
        self.entries: list[dict] = []
        self.counts: dict = {}  # file -> entries trusted, None when the file is absent
        self.corrupt = False
        self._own: list[dict] = []  # the entries of self.path: what save() writes
        self._origin: dict = {}  # id(entry) -> the file it came from
        for f in self.files:
            self._read(f, strict)

    def _read(self, path: Path, strict: bool) -> None:
        if not path.exists():
            if strict and self.setting == "--db":  # a typo must not read as an empty database
                raise RecordError(f"tuning database {path} does not exist: check the path, or leave --db out for "
                                  f"the default ({' over '.join(map(str, db_files()[1])) or 'off'})", path=path)
            self.counts[path] = None
            return
        fix = (f"fix or remove it, or pass --db PATH / set ${DB_ENV} to another database" if path != PACKAGED_DB
               else "reinstall gemm-ladder")
        try:
            if not path.is_file():
                raise RecordError(f"tuning database {path} is not a file: {fix}", path=path, fix=fix)
            data = records.read_json(path, "tuning database", fix)
            if not isinstance(data, dict) or data.get("format") != DB_FORMAT:
                raise RecordError(f"{path} is not a {DB_FORMAT} file: {fix}", path=path, field="format", fix=fix)
            if data.get("version") != DB_VERSION:
                raise RecordError(f"{path} has version {records.show(data.get('version'))}; this gemm_ladder reads "
                                  f"version {DB_VERSION}: {fix}", path=path, field="version", fix=fix)
            records.validate(data, DB_SCHEMA, path, fix)
        except RecordError as err:
            if strict or not path.is_file():
                raise
            warnings.warn(f"tuning database {path} is unreadable ({err}): ignored, not trusted", stacklevel=3)
            self.corrupt = self.corrupt or path == self.path
            self.counts[path] = 0
            return
        seen = {_key(e) for e in self.entries}
        mine = path == self.path
        trusted = 0
        for e in data["entries"]:
            problem = _entry_problem(e)
            if problem:
                warnings.warn(f"tuning database {path}: entry ignored ({problem}): {str(e)[:200]}", stacklevel=3)
                continue
            trusted += 1
            if mine:
                self._own.append(e)
            if _key(e) not in seen:  # the overlay hides a packaged entry of the same key
                self.entries.append(e)
                self._origin[id(e)] = path
        self.counts[path] = trusted

    def origin(self, entry: dict) -> Path | None:
        """The file an entry of :attr:`entries` came from (the written file for a new one)."""
        return self._origin.get(id(entry), self.path)

    def describe(self) -> str:
        """Which files this database is, one line: ``tuning database: X (12 entries) over Y ...``."""
        if not self.files:
            return f"tuning database: off (${DB_ENV}={os.environ.get(DB_ENV, '')})"
        parts = []
        for f in self.files:
            n = self.counts.get(f)
            role = "packaged" if f == PACKAGED_DB and len(self.files) > 1 else (
                "user overlay" if len(self.files) > 1 else self.setting)
            parts.append(f"{f} ({role}: " + ("absent" if n is None else f"{n} entries") + ")")
        return "tuning database: " + " over ".join(parts)

    def save(self) -> Path:
        """Write the entries of :attr:`path` (atomically); ``RecordError`` when it cannot."""
        if self.path is None:
            raise RecordError(f"no tuning database to write (${DB_ENV} is off): pass --db PATH")
        fix = f"pass --db PATH (or set ${DB_ENV}) to a file you can write"
        try:
            if self.corrupt and self.path.exists():
                aside = self.path.with_name(f"{self.path.name}.corrupt-{_dt.datetime.now():%Y%m%d%H%M%S}")
                os.replace(self.path, aside)
                warnings.warn(f"the unreadable tuning database was moved to {aside}", stacklevel=2)
                self.corrupt = False
            entries = sorted(self._own, key=lambda e: tuple(str(e.get(k) or "") for k in ENTRY_KEY))
            files.write_json(self.path, {"format": DB_FORMAT, "version": DB_VERSION, "entries": entries})
        except OSError as err:
            raise RecordError(f"cannot write the tuning database {self.path} ({err.strerror or err}): {fix}",
                              path=self.path, fix=fix) from None
        return self.path

    def upsert(self, entry: dict) -> str:
        """Add ``entry`` (to the file :meth:`save` writes); an entry of the same key, in any file
        read, is replaced when slower (``device.speed_rank``), or older and from other sources."""
        key = _key(entry)
        for i, old in enumerate(self.entries):
            if _key(old) != key:
                continue
            newer_code = old.get("sources") != entry.get("sources") and \
                str(entry.get("date") or "") >= str(old.get("date") or "")
            if not (speed_rank(entry) > speed_rank(old) or newer_code):
                return "kept"
            self.entries[i] = entry
            self._own = [e for e in self._own if _key(e) != key] + [entry]
            return "replaced"
        self.entries.append(entry)
        self._own.append(entry)
        return "added"


def _usable(e: dict, rung: str, M: int, N: int, K: int, dtype: str, arch: str, tvm: str) -> bool:
    """Whether an entry may be trusted for this build (of the entry's spec); warns when it may not."""
    where = (f"tuning entry {e['rung']} {'x'.join(map(str, e['shape']))} {e['dtype']}"
             f"{' ' + e['spec'] if e.get('spec') else ''} {e['arch']} on {e['gpu']}")
    if e["tvm_version"] != tvm:
        warnings.warn(f"{where} was measured with TVM {e['tvm_version']}, not {tvm}: ignored", stacklevel=4)
        return False
    if set(e["knobs"]) & set(COMMON_KNOBS):
        warnings.warn(f"{where} has dtype/arch among its knobs: ignored", stacklevel=4)
        return False
    try:
        make_config(rung, M, N, K, dtype=dtype, arch=arch, **e["knobs"],
                    **({SPEC_KNOB: e["spec"]} if e.get("spec") else {}))
    except ConfigError as err:
        warnings.warn(f"{where}: knobs {e['knobs']} are refused now ({err}): ignored", stacklevel=4)
        return False
    return True


def best_knobs(rung: str, M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
               db=None, gpu: str | None = "auto", spec=None) -> tuple[dict, dict] | None:
    """The best known knobs for this rung, shape bucket, dtype, arch and operand spec (``spec``: a
    GemmSpec or its text; None, the dtype's default): ``(knobs, entry)`` or None. Only entries of that
    very spec count (:func:`spec_text`): an fp8 kernel's knobs are not a 16-bit kernel's.

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
    bucket, text = shape_bucket((M, N, K)), spec_text(spec, dtype)
    near = [e for e in tdb.entries if e["rung"] == rung and e["dtype"] == dtype and e["arch"] == arch
            and e.get("spec") == text and shape_bucket(e["shape"]) == bucket]
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
        # this GPU's entries first, then the shape's own, then the fastest by device.speed_rank
        return (here is not None and e["gpu"] == here, list(e["shape"]) == [M, N, K], speed_rank(e))

    best = max(usable, key=rank)
    return dict(best["knobs"]), {**best, "db": str(tdb.origin(best))}


def tuned_knobs(rung: str, M: int, N: int, K: int, knobs: dict) -> tuple[dict, dict | None]:
    """The policy: with no rung knobs given (the dtype, arch and operand spec are the question, not
    knobs), the database's best for that spec; explicit knobs always win.

    Returns ``(knobs to build with, tuned_from record or None)`` and prints which entry it used.
    """
    if set(knobs) - set(COMMON_KNOBS) - {SPEC_KNOB}:
        return knobs, None
    dtype, arch = knobs.get("dtype", COMMON_KNOBS["dtype"]), knobs.get("arch", COMMON_KNOBS["arch"])
    try:
        found = best_knobs(rung, M, N, K, dtype, arch, spec=knobs.get(SPEC_KNOB))
    except ConfigError:  # a spec that does not parse: the build refuses it with its own message
        return knobs, None
    if found is None:
        return knobs, None
    tuned, entry = found
    tuned_from = {k: entry.get(k) for k in ("db", "gpu", "shape", "tflops", "cublas_tflops", "ratio_to_cublas",
                                            "date", "commit", "tvm_version")}
    spec = f" {entry['spec']}" if entry.get("spec") else ""
    print(f"gemm_ladder: {rung} {M}x{N}x{K} {dtype}{spec}: tuned knobs {tuned} "
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
