"""The build side of a tuning run: a cache of built candidates, and the candidate folder.

Cache key: sha256 of the JSON of {rung, knobs (all of the rung's knobs, defaults filled in),
shape, dtype, arch, TVM version, compiler (``toolchain.choose_compiler().describe()``), a hash of
the sources that reach the binary (``compile.identity.hashed_sources``: ``gemm_ladder/``, ``layouts/``,
``schedulers/`` less the host-only modules in ``compile.identity.HOST_ONLY`` and the other archs' rung
folders), cache format}. A cache entry is ``<key>.so`` + ``<key>.so.json``, the manifest landing
last: an entry without it, or whose ``.so`` no longer has the size and sha256 the manifest
records, is rebuilt.

:func:`build_candidates` builds what the cache lacks in parallel processes and places every
candidate (hard-linked) in a folder with ``candidates.json``, holding the folder's lock: a
second run into the same folder is refused with a message instead of mixing the two.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from pathlib import Path

from ..compile import toolchain
from ..compile.batch import BuildJob, build_one
from ..compile.identity import cache_key, cache_key_fields, toolchain_identity
from ..core import files, records
from ..core.manifest import ManifestError, check_file, manifest_path, read_manifest
from ..core.procs import map_in_processes, progress
from ..core.provenance import git_commit, utc_now
from .measuring import CANDIDATES, CANDIDATES_FORMAT
from .space import Space

def default_cache_dir() -> Path:
    return files.open_folder(toolchain.cache_dir() / "tune", "tuning cache")


def _cached(cache: Path, key: str) -> Path | None:
    """The cache's module of ``key``, if it is finished and undamaged (its manifest reads, names
    the key, and the ``.so`` has the size and sha256 it records); else None: build it again."""
    so = cache / f"{key}.so"
    try:
        man = read_manifest(so)
        check_file(so, man)
    except (OSError, ManifestError):
        return None
    return so if man.get("tuning", {}).get("cache_key") == key else None


def build_worker(job) -> dict:
    """Build one candidate into the cache as ``<key>.so`` (runs in a worker process): the build
    and export of :func:`gemm_ladder.compile.batch.build_one`, with the cache key in the manifest. Every
    failure is a result: the search goes on."""
    rung, shape, knobs, dtype, arch, key, fields, cache = job
    try:
        res = build_one((BuildJob(rung, tuple(shape), {**knobs, "dtype": dtype, "arch": arch},
                                  extra={"tuning": {"cache_key": key, "cache_key_fields": fields}}, name=key),
                         cache))
    except Exception as err:  # pylint: disable=broad-except  (a failed candidate is a result)
        tail = traceback.format_exc()[-1500:]
        return {"key": key, "status": "build-failed", "detail": f"{type(err).__name__}: {err}\n{tail}"}
    if res["status"] != "built":
        return {"key": key, "status": "refused", "detail": res["detail"]}
    have = (res["tvm_version"], res["compiler"])
    if have != (fields["tvm_version"], fields["compiler"]):
        so = Path(cache) / res["file"]
        manifest_path(so).unlink(missing_ok=True)  # the manifest first: no half entry looks finished
        so.unlink(missing_ok=True)
        return {"key": key, "status": "build-failed",
                "detail": f"built with TVM {have[0]} / {have[1]} but keyed for TVM {fields['tvm_version']} / "
                          f"{fields['compiler']}"}
    return {"key": key, "status": "built", "build_seconds": res["build_seconds"]}


def _run_builds(jobs, workers: int | None, on_done) -> None:
    def done(i, res):
        if isinstance(res, Exception):
            # a worker that died (e.g. a segfault in codegen) is recorded; the search goes on
            res = {"key": jobs[i][5], "status": "build-failed", "detail": f"{type(res).__name__}: {res}"}
        on_done(jobs[i], res)

    if jobs:
        map_in_processes(build_worker, jobs, workers, on_done=done)


def _place(src: Path, dst: Path) -> None:
    """Hard-link (or copy) a cached file into the candidate folder, atomically."""
    with files.replacing(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)


def _drop_stale(out: Path, keep: set) -> None:
    """Remove candidates of an earlier run from ``out`` (only modules the tuner placed there)."""
    for so in out.glob("*.so"):
        man = manifest_path(so)
        if so.name in keep or so.name.startswith(".") or not man.exists():
            continue
        try:
            ours = "tuning" in records.read_json(man, "module manifest", "remove it", records.Obj())
        except records.RecordError:
            ours = False
        if ours:
            so.unlink()
            man.unlink()


def _todo(sp: Space, cache: Path, ident: dict) -> tuple[list[dict], list[tuple]]:
    """One entry per candidate (knobs, cache key, ``cached``?) and the build jobs the cache lacks."""
    todo, entries = [], []
    for knobs in sp.candidates:
        built = {**knobs, **sp.spec_knobs()}  # the operand spec is built into every candidate, and keys it
        args = (sp.rung, built, sp.shape, sp.dtype, sp.arch, ident["tvm_version"], ident["compiler"],
                ident["sources"])
        fields, key = cache_key_fields(*args), cache_key(*args)
        entry = {"knobs": knobs, "cache_key": key}
        entries.append(entry)
        if _cached(cache, key):
            entry["status"] = "cached"
        else:
            todo.append((sp.rung, sp.shape, built, sp.dtype, sp.arch, key, fields, str(cache)))
    return entries, todo


def build_candidates(sp: Space, out, cache_dir=None, jobs: int | None = None, show_progress: bool = True,
                     identity: dict | None = None) -> dict:
    """Build ``sp``'s candidates (cache first), place them in ``out`` with ``candidates.json``.

    Holds ``out``'s lock throughout: raises :class:`gemm_ladder.core.files.FolderInUse` when another
    run is using the folder."""
    out = Path(out)
    with files.folder_lock(out, wait=False, what="this tuning run (--out)"):
        cache = files.open_folder(cache_dir, "tuning cache") if cache_dir else default_cache_dir()
        ident = identity or toolchain_identity(sp.arch)
        entries, todo = _todo(sp, cache, ident)
        counts = {"built": 0, "cached": len(entries) - len(todo), "failed": 0}
        if todo:
            print(f"tune: {len(entries)} candidates, {counts['cached']} in the cache ({cache}), "
                  f"building {len(todo)}", file=sys.stderr)
        bar = progress(len(todo), f"build {sp.rung}") if show_progress and todo else None
        by_key = {e["cache_key"]: e for e in entries}

        def done(job, res):
            e = by_key[job[5]]
            e["status"] = res["status"]
            if res["status"] == "built":
                counts["built"] += 1
                e["build_seconds"] = res["build_seconds"]
            else:
                counts["failed"] += 1
                e["detail"] = res.get("detail", "")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(built=counts["built"], failed=counts["failed"])

        try:
            _run_builds(todo, jobs, done)
        finally:
            if bar is not None:
                bar.close()
        manifest = _place_all(sp, out, cache, entries, ident)
        manifest["counts"] = {**sp.counts(), **counts}
        files.write_json(out / CANDIDATES, manifest)
    return manifest


def _place_all(sp: Space, out: Path, cache: Path, entries: list[dict], ident: dict) -> dict:
    M, N, K = sp.shape
    candidates, failed = [], []
    for i, e in enumerate(entries):
        if e["status"] not in ("built", "cached"):
            failed.append(e)
            continue
        name = f"{sp.rung}_{M}x{N}x{K}_{sp.dtype}_{e['cache_key'][:12]}.so"
        src = cache / f"{e['cache_key']}.so"
        _place(src, out / name)
        _place(manifest_path(src), manifest_path(out / name))
        candidates.append({"id": f"c{i:03d}", "file": name, **e})
    _drop_stale(out, {c["file"] for c in candidates})
    return {
        "format": CANDIDATES_FORMAT, "version": 1,
        "rung": sp.rung, "shape": list(sp.shape), "dtype": sp.dtype, "arch": sp.arch,
        **({"spec": sp.spec} if sp.spec else {}),
        "tvm_version": ident["tvm_version"], "compiler": ident["compiler"], "sources": ident["sources"],
        "commit": git_commit(), "created": utc_now(),
        "space": sp.choices, "l2_model": sp.l2_model,
        "candidates": candidates, "failed": failed, "pruned": sp.pruned,
    }
