"""Kernel packs: a folder of exported modules and a ``pack.json`` that says which shapes each serves.

A pack is how the front door (``gemm_ladder.matmul``) gets kernels where TVM's compiler is
absent: it is built on a build box for a list of shapes, or for a model's weight shapes, and
loads with the TVM runtime alone::

    python -m gemm_ladder pack build --model llama-8b --dtypes float16,bfloat16 --out build/pack
    python -m gemm_ladder pack build --shapes 16x4096x4096,2048x6144x4096 --out build/pack
    python -m gemm_ladder pack show build/pack
    GEMM_LADDER_PACK=build/pack python my_model.py        # the front door looks there first

``pack.json``::

    {"format": "gemm_ladder.kernel_pack", "version": 1, "arch": "sm_90a", "tvm_version": "...",
     "created": "...", "commit": "...", "sms": 132, "request": {...},
     "modules": [{"file": "v9_anyM_x4096x4096_float16_sm_90a_....so", "rung": "v9",
                  "shape": [1, 4096, 4096], "dtype": "float16", "arch": "sm_90a",
                  "knobs": {...}, "dynamic_m": true, "m_range": [1, 64], "m_values": [1, 16, 64],
                  "so_bytes": 203848, "so_sha256": "...",
                  "choice": {"source": "rule", "rule": "weight-streaming", "why": "..."},
                  "spec": {"a": "float16", ..., "bias": "float16", "operands": [...]}}, ...]}

``spec`` is the module's operand spec (``gemm_ladder.core.spec``): a module serves a call of its spec
only (a bias call, a bias module: ``pack build --epilogue bias``); an entry written before the
field existed is a module of the default spec (its dtype in and out, no epilogue).

A module that takes M at run time (``dynamic_m``: one module for every M, N and K fixed) serves
any M; ``m_range`` is the range of M its knobs were chosen for and ``m_values`` the requested M
that chose them (where the ranges of two modules overlap, the one chosen at the nearer M wins).
A module of one M serves that M, and a smaller M through a zero-padded copy of A.
:meth:`KernelPack.find` ranks what a pack holds for a shape: the exact M, then a dynamic module
whose range holds M, then the nearest dynamic range, then a larger static M (padded).

Nothing in a pack is trusted blindly: ``pack.json`` that is missing, cut short, nested too deep
or of another format, an entry with a field missing, of the wrong type or out of range (every
field the front door reads is in :data:`PACK_SCHEMA`, checked by ``records`` when the pack is
read: ``pack check`` and the front door run the same code), a listed file that is gone, a file
whose size or sha256 is not the one ``pack.json`` recorded, or a module whose own manifest
describes another kernel, each raise :class:`PackError` naming the file, the field and the fix,
before the dynamic loader sees the ``.so``.

Reading a pack and loading its modules needs the TVM runtime only; :func:`build_pack` needs the
compiler (it builds through ``module_cache``, so a module built once is linked, not rebuilt).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..core import files
from ..core.config import ARCHS, DTYPES, RetiredKnobError, drop_retired_knobs
from ..core.manifest import ManifestError, check_file, read_manifest
from ..core.procs import map_in_processes
from ..core.provenance import git_commit, tvm_version, utc_now
from ..core.records import (FILE_NAME, KNOB_VALUE, SHAPE, Bool, Check, Int, List, Map, Maybe, Obj, RecordError, Str,
    parse_json, read_text, validate)
from ..core.spec import SPEC_SCHEMA, GemmSpec, spec_for, spec_of_manifest
from . import tma_layout
from .runtime import load

PACK_MANIFEST = "pack.json"
PACK_FORMAT = "gemm_ladder.kernel_pack"
PACK_VERSION = 1
PACK_ENV = "GEMM_LADDER_PACK"  # folders, separated by os.pathsep
# TVM 0.27 cannot describe a one-row tensor for TMA: a module of one M is built for M >= 2 and
# a one-row A is padded to two rows
MIN_STATIC_M = 2
# Weight shapes (N, K) of models, for ``pack build --model``: fused QKV, attention output,
# fused gate+up, down projection, LM head.
MODELS = {
    "llama-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                 "lm_head": (128256, 4096)},
}
FITS = ("exact", "tuned-range", "any-m", "pad-m")  # best first


def _range_problem(m_range) -> str | None:
    return f"is {m_range}: the first M is above the last" if m_range[0] > m_range[1] else None


# every field of pack.json that the front door (KernelPack.find, check_entry, front._from_pack) reads
ENTRY_SCHEMA = Obj(
    {"file": FILE_NAME, "rung": Str(pattern=r"v\d+", example="v9"), "shape": SHAPE, "dtype": Str(DTYPES),
     "arch": Str(ARCHS), "knobs": Map(KNOB_VALUE), "dynamic_m": Bool(),
     "m_range": Check(List(Int(lo=1), length=2, what="[least M, largest M]"), _range_problem),
     "so_bytes": Int(lo=0), "so_sha256": Str(pattern="[0-9a-f]{64}", example="64 hex digits")},
    {"m_values": Maybe(List(Int(lo=1))),
     "choice": Maybe(Obj(optional={"source": Maybe(Str()), "rule": Maybe(Str()), "why": Maybe(Str())})),
     "spec": SPEC_SCHEMA})
PACK_SCHEMA = Obj({"modules": List(ENTRY_SCHEMA)}, {"arch": Maybe(Str()), "sms": Maybe(Int(lo=1))})


class PackError(RecordError):
    """A kernel pack is unreadable, or does not hold what its ``pack.json`` says."""


@dataclass(frozen=True)
class Found:
    """A pack's module for a shape: the entry, how it fits (one of :data:`FITS`), the pack."""

    entry: dict
    fit: str
    pack: "KernelPack"

    @property
    def path(self) -> Path:
        return self.pack.folder / self.entry["file"]

    def describe(self) -> str:
        e = self.entry
        what = {"exact": f"built for M={e['shape'][0]}",
                "tuned-range": f"M at run time, knobs chosen for M in {e['m_range'][0]}..{e['m_range'][1]}",
                "any-m": f"M at run time, knobs chosen for M in {e['m_range'][0]}..{e['m_range'][1]} (outside it)",
                "pad-m": f"built for M={e['shape'][0]}: A is copied into {e['shape'][0]} zero-padded rows"}[self.fit]
        return f"kernel pack {self.pack.folder}: {e['file']} ({what})"


class KernelPack:
    """A pack folder, its ``pack.json`` read and checked (see the module docstring)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.manifest = read_pack_manifest(self.folder)
        self.modules = self.manifest["modules"]
        self._by_nk: dict = {}
        for e in self.modules:
            key = (e["shape"][1], e["shape"][2], e["dtype"], e["arch"], spec_of_manifest(e))
            self._by_nk.setdefault(key, []).append(e)

    def __repr__(self) -> str:
        return f"<KernelPack {self.folder} ({len(self.modules)} modules, {self.manifest.get('arch')})>"

    def find(self, M: int, N: int, K: int, dtype: str, arch: str, spec: GemmSpec | None = None) -> Found | None:
        """The module of ``spec`` (default: ``dtype`` in and out, no epilogue) that serves this
        shape best, or None (see :data:`FITS`)."""
        best, rank = None, None
        for e in self._by_nk.get((N, K, dtype, arch, spec or GemmSpec.default(dtype)), ()):
            lo, hi = e["m_range"]
            if e["dynamic_m"]:
                # ranges of different rules may overlap (a rule can hold at M = 128 and 2048 but not
                # at 512): the module chosen at the M nearest this one wins
                dist = min(abs(math.log2(M / v)) for v in (e.get("m_values") or (lo, hi)))
                fit = "tuned-range" if lo <= M <= hi else "any-m"
            elif e["shape"][0] == M:
                fit, dist = "exact", 0.0
            elif e["shape"][0] > M:
                fit, dist = "pad-m", float(e["shape"][0] - M)
            else:
                continue
            r = (FITS.index(fit), dist)
            if rank is None or r < rank:
                best, rank = e, r
        return Found(best, FITS[rank[0]], self) if best is not None else None

    def check_entry(self, entry: dict) -> Path:
        """The entry's ``.so`` is there, whole, and is the module ``pack.json`` and its own
        manifest both describe; returns its path."""
        path = self.folder / entry["file"]
        again = f"copy the whole pack folder {self.folder} again, or rebuild it with python -m gemm_ladder pack build"
        if not path.exists():
            raise PackError(f"{self.folder / PACK_MANIFEST} lists {entry['file']}, which is not in {self.folder}: {again}")
        size = path.stat().st_size
        if size != entry["so_bytes"]:
            cut = " (cut short: an unfinished copy?)" if size < entry["so_bytes"] else ""
            raise PackError(f"{path} is {size} bytes but {PACK_MANIFEST} says {entry['so_bytes']}{cut}: {again}")
        try:
            man = read_manifest(path)
            check_file(path, man)
        except (OSError, ManifestError) as err:
            raise PackError(f"{path}: {err}") from None
        if man["so_sha256"] != entry["so_sha256"]:
            raise PackError(f"{path} is not the module {PACK_MANIFEST} lists (sha256 differs): {again}")
        mine = {k: man.get(k) for k in ("rung", "dtype", "arch")}
        theirs = {k: entry[k] for k in ("rung", "dtype", "arch")}
        if mine != theirs or man["shape"][1:] != entry["shape"][1:] or bool(man.get("launch", {}).get("dynamic_m")) != entry["dynamic_m"] \
                or spec_of_manifest(man) != spec_of_manifest(entry):
            raise PackError(f"{path} holds {man['rung']} {man['shape']} {man['dtype']} {man['arch']} but "
                            f"{PACK_MANIFEST} lists {entry['rung']} {entry['shape']} {entry['dtype']} {entry['arch']}: {again}")
        return path

    def load(self, entry: dict):
        """Check the entry (:meth:`check_entry`) and load its module (``runtime.load``)."""
        return load(self.check_entry(entry))


def read_pack_manifest(folder) -> dict:
    """``folder/pack.json``, checked to be a pack manifest whose entries have every field."""
    folder = Path(folder)
    path = folder / PACK_MANIFEST
    fix = f"rebuild it with python -m gemm_ladder pack build --out {folder}, or copy it again"
    if not folder.is_dir():
        raise PackError(f"kernel pack {folder} is not a folder: {fix}")
    if not path.exists():
        raise PackError(f"{path} is missing: {folder} is not a kernel pack; {fix}", path=path, fix=fix)
    data = parse_json(read_text(path, "kernel pack manifest", fix, PackError), path, "kernel pack manifest", fix,
                      error=PackError)
    if not isinstance(data, dict) or data.get("format") != PACK_FORMAT:
        raise PackError(f"{path} is not a {PACK_FORMAT} manifest: {fix}", path=path, field="format", fix=fix)
    if data.get("version") != PACK_VERSION:
        raise PackError(f"{path} has version {data.get('version')!r}; this gemm_ladder reads version {PACK_VERSION}: "
                        f"{fix}", path=path, field="version", fix=fix)
    data = validate(data, PACK_SCHEMA, path, fix, PackError)
    modules = []
    for i, entry in enumerate(data["modules"]):
        try:
            modules.append({**entry, "knobs": drop_retired_knobs(entry["rung"], entry["knobs"])})
        except RetiredKnobError as err:
            again = f"rebuild this pack: python -m gemm_ladder pack build --out {folder}"
            raise PackError(f"{path}: modules[{i}] ({entry['file']}): {err}: {again}", path=path,
                            field=f"modules[{i}].knobs", fix=again) from None
    return {**data, "modules": modules}


def packs_from_env() -> list[Path]:
    """The pack folders ``$GEMM_LADDER_PACK`` names (``os.pathsep``-separated), in order."""
    return [Path(p) for p in os.environ.get(PACK_ENV, "").split(os.pathsep) if p.strip()]


# -- building a pack (TVM's compiler) ---------------------------------------------------------
def _name(job, dynamic: bool) -> str:
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from ..rungs import make_config  # pylint: disable=import-outside-toplevel

    tag = make_config(job.rung, *job.shape, **job.knobs).tag()
    return tag.replace(f"_{job.shape[0]}x", "_anyMx", 1) if dynamic else tag


def plan_pack(shapes, dtypes, arch: str = "sm_90a", sms: int | None = None, dynamic: bool = True,
              epilogues=("none",)) -> list[dict]:
    """The modules a pack needs for ``shapes`` (``(M, N, K)``) in ``dtypes`` with each of
    ``epilogues`` (``none``, ``bias``: the operand spec, ``spec.spec_for``): one per choice of
    the front door's policy (``plan.choose``, at the N and K it pads to), one for all the M of a
    (rung, knobs, N, K) where the rung takes M at run time, else one per M."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    # pylint: disable=import-outside-toplevel
    from ..compile.batch import BuildJob
    from ..rungs import rung_module
    from . import plan

    sms = sms or plan.default_sms(arch)
    groups: dict = {}
    for dtype, epilogue in ((d, e) for d in dtypes for e in epilogues):
        spec = spec_for(dtype, epilogue)
        for M, N, K in shapes:
            fixes = tma_layout.layout_fixes(tma_layout.Layout(M, N, K, dtype))
            choice = plan.choose(plan.Problem(M, fixes.N, fixes.K, dtype, arch, sms, spec))
            knobs = dict(choice.knobs)
            dyn = dynamic and "dynamic_m" in rung_module(choice.rung, arch).KNOBS
            if dyn:
                knobs["dynamic_m"] = True
                dyn = plan._validate(choice.rung, plan.Problem(M, fixes.N, fixes.K, dtype, arch, sms, spec), knobs) is None
                knobs = knobs if dyn else dict(choice.knobs)
            key = (choice.rung, json.dumps(knobs, sort_keys=True), fixes.N, fixes.K, None if dyn else max(M, MIN_STATIC_M))
            g = groups.setdefault(key, {"rung": choice.rung, "knobs": knobs, "N": fixes.N, "K": fixes.K,
                                        "dynamic_m": dyn, "ms": [], "choice": choice.as_dict()})
            g["ms"].append(M)
    out = []
    for g in groups.values():
        lo, hi = min(g["ms"]), max(g["ms"])
        M = lo if g["dynamic_m"] else max(hi, MIN_STATIC_M)
        extra = {"dynamic_m": {"min_m": 1, "tuned_for_m": [lo, hi]}} if g["dynamic_m"] else None
        job = BuildJob(g["rung"], (M, g["N"], g["K"]), g["knobs"], extra)
        out.append({"job": job, "m_range": [lo, hi] if g["dynamic_m"] else [M, M], "dynamic_m": g["dynamic_m"],
                    "m_values": sorted(set(g["ms"])), "choice": g["choice"], "file": _name(job, g["dynamic_m"]) + ".so"})
    return out


def _pack_worker(args) -> dict:
    """Build (or find in the module cache) one module and place it in the pack (a worker process)."""
    item, out, root = args
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from ..compile.module_cache import get_or_build  # pylint: disable=import-outside-toplevel

    try:
        src, how = get_or_build(item["job"], root)
    except Exception as err:  # pylint: disable=broad-except  (a refused module is reported, the rest go on)
        return {"file": item["file"], "status": "failed", "detail": f"{type(err).__name__}: {err}"}
    dst = Path(out) / item["file"]
    for s, d in ((src, dst), (Path(str(src) + ".json"), Path(str(dst) + ".json"))):
        with files.replacing(d) as tmp:
            try:
                os.link(s, tmp)
            except OSError:
                shutil.copy2(s, tmp)
    return {"file": item["file"], "status": how}


def build_pack(out, shapes, dtypes, arch: str = "sm_90a", sms: int | None = None, dynamic: bool = True,
               workers: int | None = None, cache_root=None, request: dict | None = None, epilogues=("none",)) -> dict:
    """Build the modules :func:`plan_pack` lists into ``out`` and write ``out/pack.json`` (merged
    with what the folder held: entries of other files stay). Returns the manifest, with
    ``"results"`` (built / cache / failed per module)."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from . import plan  # pylint: disable=import-outside-toplevel

    files.open_build_folders(out)  # the cache and out, before anything compiles (files.FolderError)
    sms = sms or plan.default_sms(arch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = plan_pack(shapes, dtypes, arch, sms, dynamic, epilogues)
    results = map_in_processes(_pack_worker, [(i, str(out), cache_root) for i in items], workers)
    results = [r if isinstance(r, dict) else {"file": i["file"], "status": "failed", "detail": repr(r)}
               for i, r in zip(items, results)]
    entries = []
    for item, res in zip(items, results):
        if res["status"] == "failed":
            continue
        man = read_manifest(out / item["file"])
        job = item["job"]
        entries.append({"file": item["file"], "rung": job.rung, "shape": list(job.shape), "dtype": man["dtype"],
                        "arch": man["arch"], "knobs": man["knobs"], "dynamic_m": item["dynamic_m"],
                        "m_range": item["m_range"], "m_values": item["m_values"], "so_bytes": man["so_bytes"],
                        "so_sha256": man["so_sha256"],
                        "choice": item["choice"], "spec": spec_of_manifest(man).to_dict()})
    with files.folder_lock(out, wait=True, what="this pack build"):
        try:
            old = read_pack_manifest(out)["modules"]
        except PackError:
            old = []
        names = {e["file"] for e in entries}
        manifest = {"format": PACK_FORMAT, "version": PACK_VERSION, "arch": arch, "tvm_version": tvm_version(),
                    "created": utc_now(), "commit": git_commit(), "sms": sms, "request": request or {},
                    "modules": [e for e in old if e["file"] not in names and (out / e["file"]).exists()] + entries}
        files.write_json(out / PACK_MANIFEST, manifest)
    return {**manifest, "results": results}


def pack_bytes(folder) -> int:
    """Bytes of the modules and manifests in a pack folder."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))
