"""Many modules at once: build and export in parallel, verify and bench on a GPU.

The library behind ``python -m gemm_ladder export / main / verify / bench`` and the GPU test
tier (``tests/conftest.py``). It builds exactly the jobs it is given (a job's knobs are final:
choosing tuned knobs is the caller's policy, see ``gemm_ladder.serve.tuning_db.tuned_jobs``), and every
GPU job runs in a watched child process (``gemm_ladder.measure.isolate``).

A folder of exported modules has a ``manifest.json`` listing them; several exports may share a
folder, so it is merged under the folder's lock and written atomically (``gemm_ladder.core.files``).
A damaged folder manifest or module manifest is reported and the rest goes on: the per-module
manifests (``X.so.json``) are the source of truth the folder list is rebuilt from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core import files, records
from ..core.config import ConfigError
from ..core.manifest import ManifestError, read_manifest
from ..core.procs import map_in_processes, progress
from ..rungs import RUNGS, available, make_config
from .builder import build

FOLDER_MANIFEST = "manifest.json"
_FOLDER_SCHEMA = records.Obj({"modules": records.List()})
_LISTED = records.Obj({"file": records.FILE_NAME})  # a module of the folder: a plain name, nothing outside it


@dataclass(frozen=True)
class BuildJob:
    """One module to build: the rung, the shape and the knobs (final); ``extra`` goes into its
    manifest (``tuned_from``: where tuned knobs came from; ``tuning``: a cache key); ``name`` is
    the file's stem (default: the config's tag)."""

    rung: str
    shape: tuple
    knobs: dict
    extra: dict | None = None
    name: str | None = None


def as_job(job) -> BuildJob:
    """A :class:`BuildJob` from itself or from ``(rung, (M, N, K), knobs)``."""
    if isinstance(job, BuildJob):
        return job
    rung, shape, knobs = job
    return BuildJob(rung, tuple(shape), dict(knobs))


# -- building ---------------------------------------------------------------------------------
def build_one(job_and_dir) -> dict:
    """Build and export one module (the worker of every parallel build: export, main, the GPU
    test tier, the tuner's cache); a refused config is a result, any other failure raises."""
    job, out_dir = job_and_dir
    M, N, K = job.shape
    try:
        mod = build(job.rung, M, N, K, **job.knobs)
    except ConfigError as err:
        return {"rung": job.rung, "shape": list(job.shape), "knobs": job.knobs, "status": "refused",
                "detail": str(err)}
    mod.extra.update(job.extra or {})
    path = Path(out_dir) / f"{job.name or files.module_stem(mod.cfg.tag())}.so"
    mod.export(path)
    return {"file": path.name, "status": "built", **read_manifest(path)}


def build_many(jobs, out_dir, workers: int | None = None, desc: str = "build") -> list[dict]:
    """Build jobs in parallel processes (building is CPU-bound; each process imports TVM once).
    The cache and ``out_dir`` are checked first (:func:`files.open_build_folders`): an unusable
    one is a :class:`files.FolderError` before anything compiles."""
    out_dir = files.open_build_folders(out_dir)
    work = [(as_job(j), str(out_dir)) for j in jobs]
    bar = progress(len(work), desc)
    try:
        results = map_in_processes(build_one, work, workers,
                                   on_done=(lambda i, res: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    for res in results:
        if isinstance(res, Exception):
            raise res
    return results


def ladder_jobs(rungs, shapes, dtypes, arch: str, knobs: dict | None = None) -> list[BuildJob]:
    """Every rung (default: all that have a form for ``arch``) x shape x dtype."""
    rungs = rungs or [r for r in RUNGS if available(r, arch)]
    return [BuildJob(r, tuple(s), {**(knobs or {}), "dtype": d, "arch": arch})
            for r in rungs for s in shapes for d in dtypes]


def main_jobs(shapes, dtypes, archs) -> list[BuildJob]:
    """The ladder for the main job: every rung of every arch at the default shapes; a rung that
    cannot take a shape (v1 computes one tile, v2 one row of tiles) gets its own largest one."""
    jobs = []
    for arch in archs:
        for rung in (r for r in RUNGS if available(r, arch)):
            for dtype in dtypes:
                seen = set()
                for shape in shapes:
                    knobs = {"dtype": dtype, "arch": arch}
                    for candidate in _fallback_shapes(tuple(shape), knobs):
                        try:
                            make_config(rung, *candidate, **knobs)
                        except ConfigError:
                            continue
                        if candidate not in seen:
                            seen.add(candidate)
                            jobs.append(BuildJob(rung, candidate, knobs))
                        break
    return jobs


def _fallback_shapes(shape, knobs):
    yield shape
    try:
        d = make_config("v4", *shape, **knobs)  # the default tile of the ladder
    except ConfigError:
        return
    yield (d.blk_m, d.blk_n, shape[2])
    yield (d.blk_m, d.blk_n, d.blk_k)


# -- the folder manifest ----------------------------------------------------------------------
def _module_entry(folder: Path, name: str):
    """``{"file": name, "status": "built", **its manifest}``, or the reason it cannot be listed."""
    try:
        return {"file": name, "status": "built", **read_manifest(folder / name)}
    except (OSError, ManifestError) as err:
        return str(err)


def read_folder_manifest(folder) -> tuple[list[dict], list[str]]:
    """The modules a folder lists and the problems met reading it (never raises on bad content).

    An unreadable ``manifest.json`` (``records.read_json``: not JSON, nested too deep, no
    ``"modules"`` list) is replaced, in what this returns, by the list of the folder's ``.so``
    files whose own manifests read; an entry naming no file, a file outside the folder (a path,
    not a plain name) or a file that is gone, is reported and left out.
    """
    folder = Path(folder)
    path = folder / FOLDER_MANIFEST
    problems: list[str] = []
    if not path.exists():
        return [], []
    try:
        data = records.read_json(path, "folder manifest", "export into the folder again to rewrite it",
                                 _FOLDER_SCHEMA)
    except records.RecordError as err:
        problems.append(f"{path} is unreadable ({err}): listing the modules in {folder} from their own manifests")
        entries = []
        for so in sorted(folder.glob("*.so")):
            if so.name.startswith("."):
                continue
            entry = _module_entry(folder, so.name)
            if isinstance(entry, str):
                problems.append(entry)
            else:
                entries.append(entry)
        return entries, problems
    entries = []
    for m in data["modules"]:
        bad = records.problem(m, _LISTED)
        if bad:
            problems.append(f"{path}: entry {records.show(m, 120)} names no module file in {folder} ({bad}): left out")
        elif not (folder / m["file"]).is_file():
            problems.append(f"{path}: {m['file']} is listed but not in {folder}: left out")
        else:
            entries.append(m)
    return entries, problems


def write_folder_manifest(out_dir, results) -> tuple[Path, list[str]]:
    """Merge ``results`` into the folder's ``manifest.json`` (locked, atomic); modules exported
    into the folder earlier stay listed. Returns the path and the problems met on the way."""
    out_dir = Path(out_dir)
    path = out_dir / FOLDER_MANIFEST
    built = [r for r in results if r["status"] == "built"]
    refused = [r for r in results if r["status"] != "built"]
    names = {r["file"] for r in built}
    with files.folder_lock(out_dir, wait=True):
        old, problems = read_folder_manifest(out_dir)
        kept = [m for m in old if m["file"] not in names]
        files.write_json(path, {"modules": kept + built, "refused": refused})
    return path, problems


def modules_in(paths) -> tuple[list[Path], list[str]]:
    """Expand folders (their manifest, else every ``.so``) into module paths; also returns the
    problems met (a damaged folder manifest, a listed file that is gone)."""
    out: list[Path] = []
    problems: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            if (p / FOLDER_MANIFEST).exists():
                entries, bad = read_folder_manifest(p)
                problems += bad
                out += [p / m["file"] for m in entries]
            else:
                out += sorted(so for so in p.glob("*.so") if not so.name.startswith("."))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist")
    if not out:
        raise FileNotFoundError(f"no modules found in {', '.join(map(str, paths))}" + "".join(f"; {p}" for p in problems))
    return out, problems
