"""Tune a rung's knobs for one shape: build candidates in parallel, time them on a GPU, remember the best.

    python -m gemm_ladder tune --rung v6 --shape 4096x4096x4096            # GPU box with TVM's compiler
    python -m gemm_ladder tune --rung v6 --shape 4096x4096x4096 --build-only --out build/tune/v6
    python -m gemm_ladder tune --measure build/tune/v6                      # GPU box, runtime-only TVM
    python -m gemm_ladder tune --merge build/tune/v6/measurements_nvidia-h100-80gb-hbm3.json
    python -m gemm_ladder tune --show                                       # the database as a table

    from gemm_ladder.tune import tune, best_knobs, load_best
    tune("v6", (4096, 4096, 4096), space={"pipe_depth": [3, 4, 5]})

How a run goes::

    space      every combination of the rung's knobs (only knobs the rung has: its KNOBS dict)
      | pruned by rungs.make_config (shared memory, registers, divisibility: each refusal kept
      | with its reason), by dropping l2_group_size where the order ignores it (row, column),
      | and by the L2-reuse model (schedulers.rank_group_sizes: the best few l2_group_size
      v values per tile shape and order)
    build      parallel processes; each binary lands in a cache keyed by all that changes it
      |        (a second identical run builds nothing)
      v        --build-only: a folder of .so + .so.json and candidates.json
    measure    isolate's "time" job in a watched child, a deadline per candidate: checked on
      |        randn inputs, then timed against cuBLAS in the same process, as ``bench`` does; a
      v        wrong, crashing or hanging candidate is recorded and the search goes on
    merge      the fastest correct candidate goes into the tuning database
    use        builder.build(rung, M, N, K) with no knobs takes the database's best (best_knobs);
               load_best(folder) loads the fastest measured module of a candidate folder

Cache key: sha256 of the JSON of {rung, knobs (all of the rung's knobs, defaults filled in),
shape, dtype, arch, TVM version, compiler (toolchain.choose_compiler().describe()), a hash of
the sources that reach the binary (gemm_ladder/, layouts/, schedulers/ less the host-only
modules in HOST_ONLY), cache format}.

Database (JSON, see TuningDB): ``{"format": "gemm_ladder.tuning_db", "version": 1, "entries":
[...]}``, one entry per (rung, shape, dtype, arch, gpu, tvm_version) holding knobs, tflops,
cublas_tflops, ratio_to_cublas, date, commit and the shape bucket (each dim rounded to the
nearest power of two) used to serve nearby shapes. Where it lives: ``--db`` >
``$GEMM_LADDER_TUNING_DB`` (``off`` disables the lookup) > ``benchmarks/tuning/tuning_db.json``
when run from inside the repo > the user cache.

Measuring needs only the TVM runtime: nothing on that path imports TVM's compiler, the rungs,
``layouts`` or ``schedulers``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .config import ARCHS, DTYPES, ConfigError

CACHE_FORMAT = 1
CANDIDATES = "candidates.json"
CANDIDATES_FORMAT = "gemm_ladder.tune.candidates"
MEASUREMENTS_FORMAT = "gemm_ladder.tune.measurements"
DB_FORMAT = "gemm_ladder.tuning_db"
DB_VERSION = 1
DB_ENV = "GEMM_LADDER_TUNING_DB"
COMMON_KNOBS = ("dtype", "arch")  # not tuned: part of the question, not of the answer

# Values tried for each knob a rung has; a knob not listed here keeps the rung's default.
DEFAULT_CHOICES = {
    "pipe_depth": (2, 3, 4, 5, 6, 7),
    "l2_group_size": (1, 2, 4, 8, 16, 32),
    "blk_m": (64, 128, 256),
    "blk_n": (64, 128, 192, 256),
    "num_warpgroups": (1, 2),
    "tile_order": ("grouped", "snake", "row", "column"),
}
# Orders that walk the grid without L2 groups: l2_group_size changes nothing there.
UNGROUPED_ORDERS = ("row", "column")
# The L2 model's machine when no GPU of the arch is here to ask (assumptions, recorded as such).
MODEL_MACHINE = {
    "sm_90a": {"num_sms": 132, "l2_bytes": 50 * 1024 * 1024, "assumed": "H100 SXM"},
    "sm_100a": {"num_sms": 148, "l2_bytes": 126 * 1024 * 1024, "assumed": "B200"},
}
# Modules whose edits cannot change a binary; every other .py of these packages is hashed.
SOURCE_PACKAGES = ("gemm_ladder", "layouts", "schedulers")
HOST_ONLY = ("tune.py", "cli.py", "harness.py", "isolate.py", "runtime.py", "pack.py", "sass.py",
             "__main__.py", "plots.py")


# -- the search space -----------------------------------------------------------------------
@dataclass
class Space:
    """What survives pruning (``candidates``: full knob dicts) and what did not, and why."""

    rung: str
    shape: tuple[int, int, int]
    dtype: str
    arch: str
    choices: dict
    candidates: list[dict] = field(default_factory=list)
    pruned: list[dict] = field(default_factory=list)
    points: int = 0
    l2_model: dict | None = None

    def counts(self) -> dict:
        out = {"points": self.points, "candidates": len(self.candidates)}
        for p in self.pruned:
            out[p["reason"]] = out.get(p["reason"], 0) + 1
        return out


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def parse_space(items) -> dict:
    """``["pipe_depth=3,4,5", "blk_n=128,256;tile_order=grouped"]`` -> ``{knob: [values]}``."""
    out: dict = {}
    for item in items or []:
        for part in filter(None, (p.strip() for p in re.split(r"[;\s]+", item))):
            if "=" not in part:
                raise ValueError(f"space item {part!r} is not knob=v1,v2,..., e.g. pipe_depth=3,4,5")
            name, values = part.split("=", 1)
            out[name.strip()] = [_value(v.strip()) for v in values.split(",") if v.strip()]
    return out


def rung_knobs(rung: str, arch: str) -> dict:
    """The rung's knobs and their defaults (imports the rung, hence TVM)."""
    from .rungs import rung_module  # pylint: disable=import-outside-toplevel

    return dict(rung_module(rung, arch).KNOBS)


def _choices(rung: str, arch: str, space: dict | None) -> dict:
    defaults = rung_knobs(rung, arch)
    space = dict(space or {})
    unknown = sorted(set(space) - set(defaults))
    if unknown:
        raise ConfigError(
            f"rung {rung} ({arch}) has no knob {', '.join(unknown)} to tune; its knobs are {sorted(defaults)}"
        )
    out = {}
    for name, default in defaults.items():
        values = space.get(name, DEFAULT_CHOICES.get(name, (default,)))
        if isinstance(values, (str, int)):
            values = [values]
        out[name] = list(dict.fromkeys(values))
        if not out[name]:
            raise ConfigError(f"space for {name} is empty; give at least one value, e.g. {name}={default}")
    return out


def _refusal_reason(msg: str) -> str:
    low = msg.lower()
    if "shared memory" in low:
        return "shared-memory"
    if "register" in low:
        return "registers"
    if any(w in low for w in ("multiple", "divis", "split", "whole")):
        return "divisibility"
    return "refused"


def model_machine(arch: str, num_sms: int | None = None, l2_bytes: int | None = None) -> dict:
    """SM count and L2 size for the L2 model: given, else the GPU here (if of ``arch``), else assumed."""
    machine = dict(MODEL_MACHINE.get(arch, MODEL_MACHINE["sm_90a"]))
    gpu = _local_gpu(arch)
    if gpu:
        machine.update(num_sms=gpu["sm_count"], l2_bytes=gpu["l2_bytes"], assumed=None, gpu=gpu["name"])
    if num_sms:
        machine.update(num_sms=int(num_sms), assumed=None)
    if l2_bytes:
        machine.update(l2_bytes=int(l2_bytes), assumed=None)
    return machine


def _rank_groups(M, N, K, blk_m, blk_n, order, sizes, dtype_bytes, machine) -> list[tuple[int, object]]:
    """Group sizes by modelled DRAM traffic; ties go to the size nearest the model's optimum."""
    from schedulers import rank_group_sizes  # pylint: disable=import-outside-toplevel

    tiles = math.ceil(M / blk_m) * math.ceil(N / blk_n)
    ctas = max(1, min(machine["num_sms"], tiles))
    ranked = rank_group_sizes(M, N, K, blk_m, blk_n, ctas, machine["l2_bytes"], order=order,
                              group_sizes=tuple(sizes), dtype_bytes=dtype_bytes)
    # a wave's footprint (g*blk_m + P/g*blk_n) is smallest near g = sqrt(P * blk_n / blk_m)
    best_g = math.sqrt(ctas * blk_n / blk_m)
    ranked.sort(key=lambda gt: (gt[1].total_bytes, abs(math.log2(gt[0] / best_g)), gt[0]))
    return ranked


def search_space(rung: str, shape, dtype: str = "float16", arch: str = "sm_90a", space: dict | None = None,
                 l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None) -> Space:
    """Enumerate the rung's knob space for ``shape`` and prune it before anything is built.

    ``space`` narrows or widens the values per knob (``{"pipe_depth": [3, 4]}``); knobs it does
    not name take DEFAULT_CHOICES, or the rung's default for knobs outside that table.
    ``l2_keep``: keep the best ``l2_keep`` l2_group_size values per (blk_m, blk_n, tile_order) by
    the L2-reuse model; ``None`` or 0 keeps them all.
    """
    from .rungs import make_config  # pylint: disable=import-outside-toplevel

    M, N, K = (int(x) for x in shape)
    choices = _choices(rung, arch, space)
    default_order = choices.get("tile_order", ["grouped"])[0]
    sp = Space(rung, (M, N, K), dtype, arch, choices)
    names = list(choices)
    valid = []
    for values in itertools.product(*(choices[n] for n in names)):
        knobs = dict(zip(names, values))
        sp.points += 1
        try:
            make_config(rung, M, N, K, dtype=dtype, arch=arch, **knobs)
        except ConfigError as err:
            sp.pruned.append({"knobs": knobs, "reason": _refusal_reason(str(err)), "detail": str(err)})
            continue
        valid.append(knobs)

    # row and column orders ignore l2_group_size: one group size stands for all of them
    # (the rung's default size stands for them when it is in the space and valid there)
    if "l2_group_size" in choices and "tile_order" in choices:
        default_g = rung_knobs(rung, arch)["l2_group_size"]
        stand_in = {}
        for knobs in valid:
            if knobs["tile_order"] in UNGROUPED_ORDERS:
                sig = tuple((k, v) for k, v in knobs.items() if k != "l2_group_size")
                if sig not in stand_in or knobs["l2_group_size"] == default_g:
                    stand_in[sig] = knobs["l2_group_size"]
        kept = []
        for knobs in valid:
            if knobs["tile_order"] in UNGROUPED_ORDERS:
                g = stand_in[tuple((k, v) for k, v in knobs.items() if k != "l2_group_size")]
                if knobs["l2_group_size"] != g:
                    sp.pruned.append({"knobs": knobs, "reason": "redundant",
                                      "detail": f"tile_order={knobs['tile_order']} ignores l2_group_size; "
                                                f"same kernel as l2_group_size={g}"})
                    continue
            kept.append(knobs)
        valid = kept

    if l2_keep and "l2_group_size" in choices and len(choices["l2_group_size"]) > l2_keep:
        machine = model_machine(arch, num_sms, l2_bytes)
        sp.l2_model = {"keep": l2_keep, **machine}
        dtype_bytes = 2
        groups: dict = {}
        for knobs in valid:
            order = knobs.get("tile_order", default_order)
            if order in UNGROUPED_ORDERS:
                continue
            key = (knobs.get("blk_m", 128), knobs.get("blk_n", 128), order)
            groups.setdefault(key, set()).add(knobs["l2_group_size"])
        keep: dict = {}
        for (blk_m, blk_n, order), sizes in groups.items():
            ranked = _rank_groups(M, N, K, blk_m, blk_n, order, sorted(sizes), dtype_bytes, machine)
            keep[(blk_m, blk_n, order)] = {
                "kept": [g for g, _ in ranked[:l2_keep]],
                "traffic": {g: t.total_bytes for g, t in ranked},
            }
        kept = []
        for knobs in valid:
            order = knobs.get("tile_order", default_order)
            key = (knobs.get("blk_m", 128), knobs.get("blk_n", 128), order)
            if key in keep and knobs["l2_group_size"] not in keep[key]["kept"]:
                info = keep[key]
                g = knobs["l2_group_size"]
                best = info["kept"][0]
                mine = info["traffic"].get(g)
                detail = (f"L2 model: {order} {key[0]}x{key[1]} tiles keep l2_group_size "
                          f"{info['kept']}; {g} reads "
                          + (f"{mine / 2**20:.0f} MiB vs {info['traffic'][best] / 2**20:.0f} MiB at {best}"
                             if mine is not None else "an order that does not cover the grid"))
                sp.pruned.append({"knobs": knobs, "reason": "l2-model", "detail": detail})
                continue
            kept.append(knobs)
        valid = kept
    sp.candidates = valid
    return sp


# -- the build cache ------------------------------------------------------------------------
def _package_dirs(name: str) -> list[Path]:
    if name == "gemm_ladder":
        return [Path(__file__).resolve().parent]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def sources_hash(arch: str | None = None) -> str:
    """sha256 over every kernel-side source: an edited rung, layout or scheduler changes it.

    With ``arch``, the rung folders of the other archs (``gemm_ladder/sm100a`` for sm_90a) are
    left out: they cannot reach this arch's binaries.
    """
    other_archs = {a.replace("_", "") for a in ARCHS if arch is not None and a != arch}
    h = hashlib.sha256()
    for pkg in SOURCE_PACKAGES:
        for root in _package_dirs(pkg):
            for path in sorted(root.rglob("*.py")):
                rel = path.relative_to(root).parts
                if path.name in HOST_ONLY or "__pycache__" in rel or (pkg == "gemm_ladder" and rel[0] in other_archs):
                    continue
                h.update(f"{pkg}/{path.relative_to(root).as_posix()}\0".encode())
                h.update(path.read_bytes())
                h.update(b"\0")
    return h.hexdigest()


def tvm_version() -> str:
    """The installed TVM's version, read without importing TVM."""
    for dist in ("apache-tvm", "tvm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import tvm  # pylint: disable=import-outside-toplevel

    return tvm.__version__


def toolchain_identity(arch: str | None = None) -> dict:
    """TVM version, device compiler and source hash: the build box's part of every cache key."""
    from . import toolchain  # pylint: disable=import-outside-toplevel

    return {"tvm_version": tvm_version(), "compiler": toolchain.choose_compiler().describe(),
            "sources": sources_hash(arch)}


def cache_key_fields(rung: str, knobs: dict, shape, dtype: str, arch: str, tvm_version: str,
                     compiler: str, sources: str) -> dict:
    knobs = {k: v for k, v in knobs.items() if k not in COMMON_KNOBS}
    return {"cache_format": CACHE_FORMAT, "rung": rung, "knobs": dict(sorted(knobs.items())),
            "shape": [int(x) for x in shape], "dtype": dtype, "arch": arch,
            "tvm_version": tvm_version, "compiler": compiler, "sources": sources}


def cache_key(rung: str, knobs: dict, shape, dtype: str, arch: str, tvm_version: str, compiler: str,
              sources: str) -> str:
    """sha256 of everything that changes the binary (see the module docstring)."""
    fields = cache_key_fields(rung, knobs, shape, dtype, arch, tvm_version, compiler, sources)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def default_cache_dir() -> Path:
    from .toolchain import cache_dir  # pylint: disable=import-outside-toplevel

    return cache_dir() / "tune"


def _cached(cache: Path, key: str) -> Path | None:
    so = cache / f"{key}.so"
    man = Path(str(so) + ".json")
    if so.exists() and man.exists():
        try:
            if json.loads(man.read_text()).get("tuning", {}).get("cache_key") == key:
                return so
        except (OSError, ValueError):
            pass
    return None


def _build_worker(job) -> dict:
    """Build one candidate into the cache (runs in a worker process)."""
    rung, shape, knobs, dtype, arch, key, fields, cache = job
    import traceback  # pylint: disable=import-outside-toplevel

    cache = Path(cache)
    try:
        from .builder import build  # pylint: disable=import-outside-toplevel

        mod = build(rung, *shape, dtype=dtype, arch=arch, **knobs)
        have = (mod.tvm_version, mod.compiler.describe())
        if have != (fields["tvm_version"], fields["compiler"]):
            raise RuntimeError(f"built with TVM {have[0]} / {have[1]} but keyed for "
                               f"TVM {fields['tvm_version']} / {fields['compiler']}")
        mod.extra["tuning"] = {"cache_key": key, "cache_key_fields": fields}
        tmp = cache / f".tmp-{key}-{os.getpid()}"
        mod.export(tmp / "module.so")
        # the manifest lands last: a cache entry without it is unfinished and gets rebuilt
        os.replace(tmp / "module.so", cache / f"{key}.so")
        os.replace(tmp / "module.so.json", cache / f"{key}.so.json")
        shutil.rmtree(tmp, ignore_errors=True)
        return {"key": key, "status": "built", "build_seconds": round(mod.build_seconds, 3)}
    except ConfigError as err:
        return {"key": key, "status": "refused", "detail": str(err)}
    except Exception as err:  # pylint: disable=broad-except
        tail = traceback.format_exc()[-1500:]
        return {"key": key, "status": "build-failed", "detail": f"{type(err).__name__}: {err}\n{tail}"}


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel

        return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        return None


def _run_builds(jobs, workers: int | None, on_done) -> None:
    from .procs import map_in_processes  # pylint: disable=import-outside-toplevel

    def done(i, res):
        if isinstance(res, Exception):
            # a worker that died (e.g. a segfault in codegen) is recorded; the search goes on
            res = {"key": jobs[i][5], "status": "build-failed", "detail": f"{type(res).__name__}: {res}"}
        on_done(jobs[i], res)

    if jobs:
        map_in_processes(_build_worker, jobs, workers, on_done=done)


def _place(src: Path, dst: Path) -> None:
    """Hard-link (or copy) a cached file into the candidate folder."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _drop_stale(out: Path, keep: set) -> None:
    """Remove candidates of an earlier run from ``out`` (only modules the tuner placed there)."""
    for so in out.glob("*.so"):
        man = Path(str(so) + ".json")
        if so.name in keep or not man.exists():
            continue
        try:
            ours = "tuning" in json.loads(man.read_text())
        except (OSError, ValueError):
            ours = False
        if ours:
            so.unlink()
            man.unlink()


def build_candidates(sp: Space, out, cache_dir=None, jobs: int | None = None, progress: bool = True,
                     identity: dict | None = None) -> dict:
    """Build ``sp``'s candidates (cache first), place them in ``out`` with ``candidates.json``."""
    from .harness import git_commit  # pylint: disable=import-outside-toplevel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    ident = identity or toolchain_identity(sp.arch)
    M, N, K = sp.shape
    todo, entries = [], []
    for knobs in sp.candidates:
        fields = cache_key_fields(sp.rung, knobs, sp.shape, sp.dtype, sp.arch, ident["tvm_version"],
                                  ident["compiler"], ident["sources"])
        key = cache_key(sp.rung, knobs, sp.shape, sp.dtype, sp.arch, ident["tvm_version"],
                        ident["compiler"], ident["sources"])
        entry = {"knobs": knobs, "cache_key": key}
        entries.append(entry)
        if _cached(cache, key):
            entry["status"] = "cached"
        else:
            todo.append((sp.rung, sp.shape, knobs, sp.dtype, sp.arch, key, fields, str(cache)))
    counts = {"built": 0, "cached": len(entries) - len(todo), "failed": 0}
    bar = _progress(len(todo), f"build {sp.rung}") if progress and todo else None
    if todo:
        print(f"tune: {len(entries)} candidates, {counts['cached']} in the cache ({cache}), "
              f"building {len(todo)}", file=sys.stderr)
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

    _run_builds(todo, jobs, done)
    if bar is not None:
        bar.close()
    candidates, failed = [], []
    for i, e in enumerate(entries):
        if e["status"] not in ("built", "cached"):
            failed.append(e)
            continue
        name = f"{sp.rung}_{M}x{N}x{K}_{sp.dtype}_{e['cache_key'][:12]}.so"
        src = cache / f"{e['cache_key']}.so"
        _place(src, out / name)
        _place(Path(str(src) + ".json"), out / (name + ".json"))
        candidates.append({"id": f"c{i:03d}", "file": name, **e})
    _drop_stale(out, {c["file"] for c in candidates})
    manifest = {
        "format": CANDIDATES_FORMAT, "version": 1,
        "rung": sp.rung, "shape": list(sp.shape), "dtype": sp.dtype, "arch": sp.arch,
        "tvm_version": ident["tvm_version"], "compiler": ident["compiler"], "sources": ident["sources"],
        "commit": git_commit(), "created": _now(),
        "space": sp.choices, "l2_model": sp.l2_model,
        "counts": {**sp.counts(), **counts},
        "candidates": candidates, "failed": failed, "pruned": sp.pruned,
    }
    _write_json(out / CANDIDATES, manifest)
    return manifest


# -- measuring (runtime-only: no TVM compiler, no rungs, no layouts/schedulers) ----------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "gpu"


def _local_gpu(arch: str | None = None) -> dict | None:
    """Name, SM count and L2 size of GPU 0 when torch sees one (of ``arch``, if given)."""
    try:
        import torch  # pylint: disable=import-outside-toplevel

        if not torch.cuda.is_available():
            return None
        from .config import arch_of_capability  # pylint: disable=import-outside-toplevel

        props = torch.cuda.get_device_properties(0)
        if arch is not None and arch_of_capability(props.major, props.minor) != arch:
            return None
        return {"name": torch.cuda.get_device_name(0), "sm_count": props.multi_processor_count,
                "l2_bytes": props.L2_cache_size}
    except Exception:  # pylint: disable=broad-except
        return None


def read_candidates(folder) -> dict:
    path = Path(folder) / CANDIDATES
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: make the folder with tune --build-only --out {folder}")
    man = json.loads(path.read_text())
    if man.get("format") != CANDIDATES_FORMAT:
        raise ValueError(f"{path} is not a gemm_ladder candidates manifest (format {man.get('format')!r})")
    return man


def _knob_label(knobs: dict, varying=None) -> str:
    short = {"pipe_depth": "d", "l2_group_size": "g", "num_warpgroups": "w", "tile_order": ""}
    parts = []
    if "blk_m" in knobs and (varying is None or {"blk_m", "blk_n"} & set(varying)):
        parts.append(f"{knobs['blk_m']}x{knobs.get('blk_n', '')}")
    for k, v in knobs.items():
        if k in ("blk_m", "blk_n", "blk_k") or (varying is not None and k not in varying):
            continue
        parts.append(f"{short.get(k, k + '=')}{v}")
    return " ".join(parts) or "default"


def measure(folder, reps: int = 50, timeout: float = 300.0, out=None, gpu: dict | None = None,
            progress: bool = True, plot=True) -> dict:
    """Check and time every candidate of ``folder`` against cuBLAS; write the measurements JSON.

    The ``time`` job of :mod:`gemm_ladder.isolate` (a randn check, then ``harness.time_module``:
    the candidate and cuBLAS timed in the same process, as ``bench`` does) runs on all candidates
    in one watched child, each with its own ``timeout``. ``wrong``, ``crash``, ``error`` and
    ``timeout`` are recorded and do not stop the search; a candidate that erred is measured again
    alone in a fresh child (``run_isolated``), since a kernel that faults breaks the CUDA context
    for every module after it in the same child. Returns the measurements dict (``"path"`` says
    where it was written).
    """
    from . import harness, isolate  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    man = read_candidates(folder)
    gpu = gpu or harness.gpu_info()
    cands = man["candidates"]
    present = [i for i, c in enumerate(cands) if (folder / c["file"]).exists()]
    state = {"best": None}
    bar = _progress(len(present), f"measure {man['rung']}") if progress else None

    def seen(res):
        best = state["best"]
        if res.get("status") == "ok" and (best is None or res["tflops"] > best["tflops"]):
            state["best"] = best = res
        if bar is not None:
            bar.update(1)
            if best is not None:
                bar.set_postfix_str(f"best {best['tflops']:.1f} TFLOPS ({best['ratio_to_cublas']:.2f}x cuBLAS) "
                                    f"{best.get('module', '')}")

    timed = isolate.run_batch("time", [folder / cands[i]["file"] for i in present], (reps,),
                              timeout=timeout, on_result=seen) if present else []
    if bar is not None:
        bar.close()
    by_index = dict(zip(present, timed))
    for i, res in by_index.items():
        if res.get("status") == "error":
            again = isolate.run_isolated("time", folder / cands[i]["file"], reps, timeout=timeout)
            by_index[i] = {**again, "first_try": res.get("detail", "")}
    results = []
    for i, cand in enumerate(cands):
        res = by_index.get(i, {"status": "missing", "detail": f"{folder / cand['file']} is not there"})
        res = {k: v for k, v in res.items() if k != "module"}
        results.append({"id": cand["id"], "file": cand["file"], "knobs": cand["knobs"],
                        "cache_key": cand["cache_key"], **res})
    ok = [r for r in results if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["tflops"]) if ok else None
    report = {
        "format": MEASUREMENTS_FORMAT, "version": 1,
        "rung": man["rung"], "shape": man["shape"], "dtype": man["dtype"], "arch": man["arch"],
        "tvm_version": man["tvm_version"], "compiler": man["compiler"], "sources": man.get("sources"),
        "commit": man.get("commit"), "gpu": gpu, "date": _now(), "reps": reps, "timeout_s": timeout,
        "method": harness.__doc__.strip(), "candidates": str(folder.resolve()),
        "results": results, "best": best,
    }
    path = Path(out) if out else folder / f"measurements_{_slug(gpu.get('name', 'gpu'))}.json"
    _write_json(path, report)
    report["path"] = str(path)
    if plot:
        png = Path(plot) if isinstance(plot, (str, os.PathLike)) else path.with_suffix(".png")
        report["plot"] = str(png) if plot_measurements(report, png) else None
    return report


# -- the tuning database --------------------------------------------------------------------
def shape_bucket(shape) -> list[int]:
    """Each dim rounded to the nearest power of two (1.5x a power and above rounds up): shapes in
    one bucket share tuned knobs."""
    out = []
    for x in map(int, shape):
        lo = 1 << (max(x, 1).bit_length() - 1)
        out.append(lo if 2 * x < 3 * lo else 2 * lo)
    return out


def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parent.parent
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
    from .toolchain import cache_dir  # pylint: disable=import-outside-toplevel

    return cache_dir() / "tuning_db.json"


ENTRY_KEY = ("rung", "shape", "dtype", "arch", "gpu", "tvm_version")
_ENTRY_TYPES = {"rung": str, "shape": list, "dtype": str, "arch": str, "gpu": str, "tvm_version": str,
                "knobs": dict, "tflops": (int, float)}


def _entry_problem(e) -> str | None:
    if not isinstance(e, dict):
        return "not an object"
    for k, t in _ENTRY_TYPES.items():
        if not isinstance(e.get(k), t):
            return f"field {k!r} missing or of the wrong type"
    if len(e["shape"]) != 3 or not all(isinstance(x, int) and x > 0 for x in e["shape"]):
        return f"shape {e['shape']!r} is not [M, N, K]"
    from .rungs import RUNGS  # pylint: disable=import-outside-toplevel

    if e["rung"] not in RUNGS:
        return f"unknown rung {e['rung']!r}"
    return None


class TuningDB:
    """The tuning database: a JSON file of best configs, one per (rung, shape, dtype, arch, gpu, TVM).

    ``{"format": "gemm_ladder.tuning_db", "version": 1, "entries": [entry, ...]}``; an entry::

        {"rung": "v6", "shape": [4096, 4096, 4096], "bucket": [4096, 4096, 4096],
         "dtype": "float16", "arch": "sm_90a", "gpu": "NVIDIA H100 80GB HBM3",
         "tvm_version": "0.27.0.post1", "knobs": {"pipe_depth": 4, ...},
         "tflops": 612.0, "cublas_tflops": 680.0, "ratio_to_cublas": 0.9, "ms": 0.22,
         "date": "...", "commit": "...", "compiler": "nvrtc 13.0", "sources": "<sha256>",
         "sm_clock_mhz": "1980 MHz", "candidates_measured": 48}

    A file that does not parse is ignored with a warning (and moved aside on the next save);
    malformed entries or entries of unknown rungs are ignored with a warning.
    """

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
        _write_json(self.path, {"format": DB_FORMAT, "version": DB_VERSION, "entries": entries})
        return self.path

    def upsert(self, entry: dict) -> str:
        """Add ``entry``; an entry of the same key is replaced when slower, or older and from other sources."""
        key = tuple(json.dumps(entry[k]) for k in ENTRY_KEY)
        for i, old in enumerate(self.entries):
            if tuple(json.dumps(old[k]) for k in ENTRY_KEY) != key:
                continue
            newer_code = old.get("sources") != entry.get("sources") and entry.get("date", "") >= old.get("date", "")
            if entry["tflops"] > old["tflops"] or newer_code:
                self.entries[i] = entry
                return "replaced"
            return "kept"
        self.entries.append(entry)
        return "added"


def entry_from_measurements(report: dict) -> dict | None:
    """The database entry for the fastest correct candidate of a measurements report."""
    ok = [r for r in report.get("results", []) if r.get("status") == "ok" and isinstance(r.get("tflops"), (int, float))]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["tflops"])
    gpu = report.get("gpu") or {}
    return {
        "rung": report["rung"], "shape": list(report["shape"]), "bucket": shape_bucket(report["shape"]),
        "dtype": report["dtype"], "arch": report["arch"], "gpu": gpu.get("name", "unknown"),
        "tvm_version": report["tvm_version"], "knobs": best["knobs"],
        "tflops": best["tflops"], "cublas_tflops": best.get("cublas_tflops"),
        "ratio_to_cublas": best.get("ratio_to_cublas"), "ms": best.get("ms"),
        "date": report.get("date"), "commit": report.get("commit"), "compiler": report.get("compiler"),
        "sources": report.get("sources"), "sm_clock_mhz": gpu.get("sm_clock_mhz_now"),
        "candidates_measured": len(report.get("results", [])), "candidates_ok": len(ok),
    }


def merge(paths, db=None) -> list[dict]:
    """Merge measurements files into the database; returns what happened to each."""
    tdb = db if isinstance(db, TuningDB) else TuningDB(db)
    done = []
    for p in paths if isinstance(paths, (list, tuple)) else [paths]:
        report = json.loads(Path(p).read_text())
        if report.get("format") != MEASUREMENTS_FORMAT:
            raise ValueError(f"{p} is not a gemm_ladder measurements file (format {report.get('format')!r})")
        entry = entry_from_measurements(report)
        if entry is None:
            warnings.warn(f"{p}: no candidate was correct and timed; nothing merged", stacklevel=2)
            done.append({"file": str(p), "action": "nothing"})
            continue
        done.append({"file": str(p), "action": tdb.upsert(entry), "entry": entry})
    tdb.save()
    return done


def _usable(e: dict, rung: str, M: int, N: int, K: int, dtype: str, arch: str, tvm: str) -> bool:
    """Whether an entry may be trusted for this build; warns when it may not."""
    from .rungs import make_config  # pylint: disable=import-outside-toplevel

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

    Preference: the GPU here (by name; ``gpu="auto"`` asks torch, ``None`` means any GPU of the
    arch), then the exact shape, then the fastest (TFLOPS for the exact shape, the ratio to
    cuBLAS across the bucket). Entries of another TVM version, with unknown knobs or knobs the
    validator now refuses for this shape are ignored with a warning.
    """
    if rung not in _rungs() or arch not in ARCHS or dtype not in DTYPES:
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
    here = (_local_gpu(arch) or {}).get("name") if gpu == "auto" else gpu

    def rank(e):
        exact = list(e["shape"]) == [M, N, K]
        speed = e["tflops"] if exact else (e.get("ratio_to_cublas") or 0.0)
        return (here is not None and e["gpu"] == here, exact, speed)

    best = max(usable, key=rank)
    return dict(best["knobs"]), {**best, "db": str(tdb.path)}


def _rungs():
    from .rungs import RUNGS  # pylint: disable=import-outside-toplevel

    return RUNGS


def tuned_knobs(rung: str, M: int, N: int, K: int, knobs: dict) -> tuple[dict, dict | None]:
    """The builder's hook: with no rung knobs given, the database's best; explicit knobs always win.

    Returns ``(knobs to build with, tuned_from record or None)`` and prints which entry it used.
    """
    if set(knobs) - set(COMMON_KNOBS):
        return knobs, None
    found = best_knobs(rung, M, N, K, knobs.get("dtype", "float16"), knobs.get("arch", "sm_90a"))
    if found is None:
        return knobs, None
    tuned, entry = found
    tuned_from = {k: entry.get(k) for k in ("db", "gpu", "shape", "tflops", "cublas_tflops", "ratio_to_cublas",
                                            "date", "commit", "tvm_version")}
    print(f"gemm_ladder: {rung} {M}x{N}x{K} {knobs.get('dtype', 'float16')}: tuned knobs {tuned} "
          f"from {entry['gpu']} {'x'.join(map(str, entry['shape']))} ({entry['tflops']:.1f} TFLOPS, "
          f"{entry.get('ratio_to_cublas') or 0:.2f}x cuBLAS, {entry.get('date')}; {entry['db']})", file=sys.stderr)
    return {**knobs, **tuned}, tuned_from


def load_best(folder, M: int | None = None, N: int | None = None, K: int | None = None,
              dtype: str | None = None):
    """Load the fastest correct module that ``measure`` found in a candidate folder (runtime-only).

    Reads ``folder/measurements*.json``, preferring the file measured on this GPU. The module
    gets a ``tuned_from`` attribute (file, knobs, TFLOPS, GPU).
    """
    from .runtime import load  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    reports = []
    for p in sorted(folder.glob("measurements*.json")):
        try:
            r = json.loads(p.read_text())
        except ValueError:
            warnings.warn(f"{p} does not parse: ignored", stacklevel=2)
            continue
        if r.get("format") == MEASUREMENTS_FORMAT:
            reports.append((p, r))
    if not reports:
        raise FileNotFoundError(f"no measurements in {folder}: run tune --measure {folder} on a GPU first")
    here = (_local_gpu() or {}).get("name")
    rows = []
    for p, r in reports:
        if M is not None and list(r["shape"]) != [M, N, K]:
            continue
        if dtype is not None and r["dtype"] != dtype:
            continue
        for row in r["results"]:
            if row.get("status") == "ok" and (folder / row["file"]).exists():
                rows.append(((r["gpu"].get("name") == here, row["tflops"]), row, r, p))
    if not rows:
        want = f" for {M}x{N}x{K}" if M is not None else ""
        raise FileNotFoundError(f"no correct measured module{want}{' ' + dtype if dtype else ''} in {folder}")
    _, row, r, p = max(rows, key=lambda t: t[0])
    mod = load(folder / row["file"])
    mod.tuned_from = {"measurements": str(p), "file": row["file"], "knobs": row["knobs"],
                      "tflops": row["tflops"], "ratio_to_cublas": row.get("ratio_to_cublas"),
                      "gpu": r["gpu"].get("name")}
    print(f"gemm_ladder: loaded {row['file']} ({_knob_label(row['knobs'])}: {row['tflops']:.1f} TFLOPS on "
          f"{r['gpu'].get('name')}, from {p.name})", file=sys.stderr)
    return mod


# -- reporting ------------------------------------------------------------------------------
def _varying(results) -> list[str]:
    keys = list(dict.fromkeys(k for r in results for k in r["knobs"]))
    return [k for k in keys if len({json.dumps(r["knobs"].get(k)) for r in results}) > 1]


def result_rows(report: dict, top: int | None = 20) -> tuple[list[dict], list[str]]:
    results = report["results"]
    varying = _varying(results) or [k for k in (results[0]["knobs"] if results else {}) if k != "blk_k"]
    ok = sorted((r for r in results if r["status"] == "ok"), key=lambda r: -r["tflops"])
    bad = [r for r in results if r["status"] != "ok"]
    rows = []
    for i, r in enumerate(ok[:top] if top else ok):
        rows.append({"rank": i + 1, "id": r["id"], "status": "ok", "tflops": f"{r['tflops']:.1f}",
                     "cublas": f"{r['cublas_tflops']:.1f}", "ratio": f"{r['ratio_to_cublas']:.3f}",
                     "ms": f"{r['ms']:.3f}", **{k: r["knobs"].get(k) for k in varying}, "detail": ""})
    for r in bad:
        rows.append({"rank": "-", "id": r["id"], "status": r["status"], **{k: r["knobs"].get(k) for k in varying},
                     "detail": " ".join(str(r.get("detail", "")).split())[:80]})
    return rows, ["rank", "id", "status", "tflops", "cublas", "ratio", "ms", *varying, "detail"]


def format_table(report: dict, top: int | None = 20) -> str:
    from .cli import table  # pylint: disable=import-outside-toplevel

    rows, cols = result_rows(report, top)
    if not rows:
        return "no candidates"
    head = (f"{report['rung']} {'x'.join(map(str, report['shape']))} {report['dtype']} on "
            f"{report['gpu'].get('name')}: {sum(r['status'] == 'ok' for r in report['results'])} of "
            f"{len(report['results'])} candidates correct")
    return head + "\n" + table(rows, cols)


def plot_measurements(report: dict, path) -> bool:
    """A heat map of TFLOPS over pipe_depth x l2_group_size (best over the other knobs) and a bar
    per correct candidate against cuBLAS, as one PNG. False when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
        from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
    except ImportError:
        warnings.warn("matplotlib is not installed: no tuning plot", stacklevel=2)
        return False
    ok = sorted((r for r in report["results"] if r["status"] == "ok"), key=lambda r: -r["tflops"])
    failed = len(report["results"]) - len(ok)
    fig = Figure(figsize=(13, 4.8))
    FigureCanvasAgg(fig)
    ax_heat, ax_bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})

    def axis_values(knob):
        vals = sorted({r["knobs"].get(knob) for r in ok if knob in r["knobs"]}, key=lambda v: (str(type(v)), v))
        return vals or [None]

    depths, groups = axis_values("pipe_depth"), axis_values("l2_group_size")
    grid = [[float("nan")] * len(groups) for _ in depths]
    for r in ok:
        i = depths.index(r["knobs"].get("pipe_depth")) if r["knobs"].get("pipe_depth") in depths else 0
        j = groups.index(r["knobs"].get("l2_group_size")) if r["knobs"].get("l2_group_size") in groups else 0
        if math.isnan(grid[i][j]) or r["tflops"] > grid[i][j]:
            grid[i][j] = r["tflops"]
    im = ax_heat.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax_heat.set_xticks(range(len(groups)), [str(g) if g is not None else "-" for g in groups])
    ax_heat.set_yticks(range(len(depths)), [str(d) if d is not None else "-" for d in depths])
    ax_heat.set_xlabel("l2_group_size")
    ax_heat.set_ylabel("pipe_depth")
    ax_heat.set_title("best TFLOPS per cell")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax_heat.text(j, i, f"{v:.0f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(im, ax=ax_heat, shrink=0.8)

    varying = _varying(report["results"])
    xs = range(len(ok))
    ax_bar.bar(xs, [r["tflops"] for r in ok], color="tab:blue", label="candidate")
    if ok:
        cublas = sorted(r["cublas_tflops"] for r in ok)[len(ok) // 2]
        ax_bar.axhline(cublas, color="tab:red", linestyle="--", label=f"cuBLAS {cublas:.0f}")
        ax_bar.legend(loc="upper right")
    if len(ok) <= 60:
        ax_bar.set_xticks(list(xs), [_knob_label(r["knobs"], varying) for r in ok], rotation=90, fontsize=7)
    ax_bar.set_ylabel("TFLOPS")
    ax_bar.set_title(f"{len(ok)} correct candidates, best first ({failed} failed)")
    fig.suptitle(f"{report['rung']} {'x'.join(map(str, report['shape']))} {report['dtype']} "
                 f"on {report['gpu'].get('name')} ({report.get('date', '')[:10]})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return True


# -- the whole run --------------------------------------------------------------------------
def tune(rung: str, shape, dtype: str = "float16", arch: str = "sm_90a", space: dict | None = None, *,
         l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None,
         jobs: int | None = None, cache_dir=None, out=None, build_only: bool = False,
         reps: int = 50, timeout: float = 300.0, db=None, plot=True, progress: bool = True,
         identity: dict | None = None) -> dict:
    """Prune, build (cached, in parallel), and unless ``build_only`` measure and merge into ``db``.

    Returns the candidates manifest (``build_only``) or the measurements report (with
    ``"merged"``: what happened in the database).
    """
    M, N, K = (int(x) for x in shape)
    out = Path(out) if out else Path("build") / "tune" / f"{rung}_{M}x{N}x{K}_{dtype}_{arch}"
    sp = search_space(rung, (M, N, K), dtype, arch, space, l2_keep, num_sms, l2_bytes)
    man = build_candidates(sp, out, cache_dir, jobs, progress, identity)
    if build_only:
        return man
    report = measure(out, reps=reps, timeout=timeout, progress=progress, plot=plot)
    report["merged"] = merge([report["path"]], db)
    return report


# -- command line ---------------------------------------------------------------------------
def _parse_shape(text: str):
    from .cli import parse_shape  # pylint: disable=import-outside-toplevel

    return parse_shape(text)


def add_tune_parser(subparsers) -> argparse.ArgumentParser:
    """The ``tune`` subcommand (called once from ``gemm_ladder.cli.make_parser``)."""
    t = subparsers.add_parser(
        "tune", help="search a rung's knobs for a shape: build in parallel, time on the GPU, remember the best",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="modes: (default) build + measure + merge on a GPU box with TVM's compiler; --build-only "
               "--out DIR on a build box; --measure DIR on a GPU box (runtime-only TVM is enough); "
               "--merge FILE...; --show",
    )
    t.add_argument("--rung", help="the rung to tune, e.g. v6")
    t.add_argument("--shape", type=_parse_shape, help="MxNxK, e.g. 4096x4096x4096")
    t.add_argument("--dtype", default="float16", choices=DTYPES)
    t.add_argument("--arch", default="sm_90a", choices=sorted(ARCHS))
    t.add_argument("--space", action="append", metavar="KNOB=V1,V2",
                   help="values to try for a knob, e.g. pipe_depth=3,4,5 (repeatable; ';' separates knobs)")
    t.add_argument("--l2-keep", type=int, default=3,
                   help="keep the best N l2_group_size values per tile shape by the L2 model (0: all)")
    t.add_argument("--sms", type=int, default=None, help="SM count for the L2 model (default: the GPU, or H100/B200)")
    t.add_argument("--l2-mb", type=float, default=None, help="L2 size in MiB for the L2 model")
    t.add_argument("--jobs", type=int, default=None, help="parallel build processes (default: cores)")
    t.add_argument("--cache", default=None, help="build cache folder (default: user cache /tune)")
    t.add_argument("--out", default=None, help="candidate folder (default: build/tune/<rung>_<shape>_...)")
    t.add_argument("--build-only", action="store_true", help="build and export the candidates, measure nothing")
    t.add_argument("--measure", metavar="DIR", help="measure a candidate folder made by --build-only")
    t.add_argument("--merge", nargs="+", metavar="FILE", help="merge measurements files into the database")
    t.add_argument("--show", action="store_true", help="print the tuning database")
    t.add_argument("--dry-run", action="store_true", help="print the pruned space, build nothing")
    t.add_argument("--db", default=None, help=f"tuning database (default: ${DB_ENV}, the repo's "
                                              "benchmarks/tuning/tuning_db.json, else the user cache)")
    t.add_argument("--reps", type=int, default=50)
    t.add_argument("--timeout", type=float, default=300.0, help="seconds per candidate before it counts as hung")
    t.add_argument("--measurements-out", default=None, help="measurements JSON path (default: in the folder)")
    t.add_argument("--plot", default=None, help="PNG path (default: beside the measurements)")
    t.add_argument("--top", type=int, default=20, help="rows of the final table")
    t.set_defaults(fn=cmd_tune)
    return t


def _db_arg(a):
    if a.db:
        return a.db
    path = default_db_path()
    if path is None:
        raise SystemExit(f"error: ${DB_ENV} is off; pass --db PATH")
    return path


def _print_merged(merged) -> None:
    for m in merged:
        e = m.get("entry")
        if e:
            print(f"{m['action']}: {e['rung']} {'x'.join(map(str, e['shape']))} {e['dtype']} on {e['gpu']}: "
                  f"{e['knobs']} {e['tflops']:.1f} TFLOPS ({(e.get('ratio_to_cublas') or 0):.3f}x cuBLAS)")
        else:
            print(f"{m['action']}: {m['file']}")


def cmd_tune(a) -> int:
    from .cli import gpu_present, table  # pylint: disable=import-outside-toplevel

    if a.show:
        tdb = TuningDB(_db_arg(a))
        rows = [{"rung": e["rung"], "shape": "x".join(map(str, e["shape"])), "dtype": e["dtype"],
                 "arch": e["arch"], "gpu": e["gpu"], "tvm": e["tvm_version"], "tflops": f"{e['tflops']:.1f}",
                 "ratio": f"{(e.get('ratio_to_cublas') or 0):.3f}", "knobs": _knob_label(e["knobs"]),
                 "date": str(e.get("date", ""))[:10]} for e in tdb.entries]
        print(f"{tdb.path}: {len(rows)} entries")
        if rows:
            print(table(rows, list(rows[0])))
        return 0
    if a.merge:
        _print_merged(merge(a.merge, _db_arg(a)))
        return 0
    if a.measure:
        if not gpu_present():
            print("error: --measure needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        report = measure(a.measure, reps=a.reps, timeout=a.timeout, out=a.measurements_out,
                         plot=a.plot or True)
        print(format_table(report, a.top))
        print(f"measurements: {report['path']}" + (f"\nplot: {report['plot']}" if report.get("plot") else ""))
        print(f"next: python -m gemm_ladder tune --merge {report['path']}")
        return 0 if report["best"] else 1
    if not a.rung or not a.shape:
        print("error: tune needs --rung and --shape (or --measure DIR, --merge FILE, --show)", file=sys.stderr)
        return 2
    space = parse_space(a.space)
    l2_bytes = int(a.l2_mb * 2**20) if a.l2_mb else None
    sp = search_space(a.rung, a.shape, a.dtype, a.arch, space, a.l2_keep, a.sms, l2_bytes)
    print(f"space: {sp.counts()}", file=sys.stderr)
    if a.dry_run:
        for p in sp.pruned:
            print(f"pruned ({p['reason']}): {_knob_label(p['knobs'])}: {p['detail']}")
        for c in sp.candidates:
            print(f"candidate: {_knob_label(c)}")
        return 0
    if not a.build_only and not gpu_present():
        print("error: no GPU here: use --build-only --out DIR, then tune --measure DIR on a GPU box",
              file=sys.stderr)
        return 2
    M, N, K = a.shape
    out = Path(a.out) if a.out else Path("build") / "tune" / f"{a.rung}_{M}x{N}x{K}_{a.dtype}_{a.arch}"
    man = build_candidates(sp, out, a.cache, a.jobs)
    c = man["counts"]
    print(f"{len(man['candidates'])} candidates in {out} ({c['built']} built, {c['cached']} from the cache, "
          f"{c['failed']} failed to build; {len(man['pruned'])} pruned)")
    for f in man["failed"]:
        print(f"build failed: {_knob_label(f['knobs'])}: {f.get('detail', '').splitlines()[0] if f.get('detail') else ''}",
              file=sys.stderr)
    if a.build_only:
        print(f"next, on a GPU box: python -m gemm_ladder tune --measure {out}")
        return 0 if man["candidates"] else 1
    report = measure(out, reps=a.reps, timeout=a.timeout, out=a.measurements_out, plot=a.plot or True)
    print(format_table(report, a.top))
    _print_merged(merge([report["path"]], _db_arg(a)))
    if report.get("plot"):
        print(f"plot: {report['plot']}")
    return 0 if report["best"] else 1
