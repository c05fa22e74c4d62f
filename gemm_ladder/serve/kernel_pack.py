"""Kernel packs: a folder of exported modules and a ``pack.json`` that says which shapes each serves.

A pack is how the front door (``gemm_ladder.matmul``) gets kernels where TVM's compiler is
absent: it is built on a build box for a list of shapes, or for a model's weight shapes, and
loads with the TVM runtime alone::

    python -m gemm_ladder pack build --model llama-8b --dtypes float16,bfloat16 --out build/pack
    python -m gemm_ladder pack build --weights 4096x4096,6144x4096 --out build/pack   # every M, 1..16384
    python -m gemm_ladder pack build --shapes 16x4096x4096,2048x6144x4096 --out build/pack   # these M only
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

fp8 modules (``scaled_mm``'s, issue 32) are asked for with the input dtype ``float8_e4m3`` among
the dtypes, each recipe of ``--fp8-scales`` (``tensor``, ``row``) and each D of ``--fp8-out``
(``bfloat16``, ``float16``), with the epilogue ``none`` or ``bias`` (a bias in D's dtype)::

    python -m gemm_ladder pack build --weights 4096x4096 --dtypes float8_e4m3 --fp8-scales row --out build/pack

Their entries have D's dtype as ``dtype`` and say e4m3 and the recipe in ``spec``; the policy
gives an fp8 problem one kernel for small M and one for the rest (``plan.FP8_RULES``), so a weight's
whole M range is two runtime-M modules (one with block scales).

**Alternatives** (issue 30). Where the policy's choice leaves most SMs idle (``plan.sub_wave``: the
row-tile rule's 64 tiles of 64x128 at 128x4096x4096 on 132 SMs), a pack also holds the modules
``plan.alternatives`` offers (v9 in small tiles without a split, v10's split-K), serving the same M, their entries marked
``"alternative": true``: :meth:`KernelPack.find` (the no-measurement default,
``GEMM_LADDER_MEASURE=0``) never prefers one over a module of the policy's choice, while :meth:`KernelPack.serving` lists them right after it, so the measurement at
first use (``serve.first_use``) times them and keeps whichever runs fastest on the GPU at hand.
``pack build --no-alternatives`` leaves them out (a smaller pack; an entry without the field is
the policy's choice, as every entry of an older pack).

**Grouped weights** (issue 33: ``grouped_mm``, ``grouped_mm_masked``). ``pack build --grouped
E,N,K[,layout]`` (``build_pack(grouped=[(E, N, K, layout or None)])``, both layouts where none is
named) plans v12 modules by ``plan.grouped_choices``: a decode module and prefill modules (swapped
tiles, then the 128x256 defaults), each serving a range of token counts. Their entries add ``experts``,
``layout`` and ``tokens`` (``[least, largest]`` of the count the grouped front door knows without a
sync: rows of A for the contiguous layout, max_tokens for the masked one; ``m_range`` is the rows of
A, ``E x`` that for the masked layout). :meth:`KernelPack.find_grouped` serves them; :meth:`find`
and :meth:`serving` never do. An entry without ``experts`` (every entry of an older pack) is not
grouped; the format's version is unchanged.

``spec`` is the module's operand spec (``gemm_ladder.core.spec``): a module serves a call of its spec
only (a bias call, a bias module: ``pack build --epilogue bias``); an entry written before the
field existed is a module of the default spec (its dtype in and out, no epilogue).

A module that takes M at run time (``dynamic_m``: one module for every M, N and K fixed) serves
any M; ``m_range`` is the range of M its knobs were chosen for and ``m_values`` the requested M
that chose them (where the ranges of two modules overlap, the one chosen at the nearer M wins).
A module of one M serves that M, and a smaller M through a zero-padded copy of A.
:meth:`KernelPack.find` ranks what a pack holds for a shape: the exact M, then a dynamic module
whose range holds M, then the nearest dynamic range, then a larger static M (padded).

**A weight's whole M range.** A weight named without M (``pack build --weights NxK``, ``--model``
without ``--m``) is planned at every bucket of :data:`M_BUCKETS`, each bucket standing for the M
from just above the previous bucket up to itself (:func:`bucket_cells`: 1, 2..8, 9..16, ...,
12289..16384). Buckets whose choice is one module share it, and the module gets one entry per
contiguous run of buckets it won, with that run's cells as ``m_range`` (a module can win 2048 and
8192 but not 4096: two entries of one file). The entries of a weight tile 1..16384 (or 1..the
most rows its 32-bit indices take: :func:`weight_buckets`), so any M in it is a ``tuned-range`` fit of the module chosen at its bucket; past 16384 the top bucket's module is
an ``any-m`` fit, which the front door passes over (``front._far``) past ``front.FAR_FACTOR``
times 16384.

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

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..core import files
from ..core.config import (ARCHS, DTYPES, LARGEST_TILE, ConfigError, RetiredKnobError, check_extents,
    drop_retired_knobs, largest_m, max_m_of)
from ..core.manifest import ManifestError, check_file, read_manifest
from ..core.procs import map_in_processes
from ..core.provenance import git_commit, tvm_version, utc_now
from ..core.records import (FILE_NAME, KNOB_VALUE, SHAPE, Bool, Check, Int, List, Map, Maybe, Obj, RecordError, Str,
    parse_json, read_text, validate)
from ..core.spec import FP8_SCALES, MN_MAJOR_FP8_FIX, SPEC_SCHEMA, GemmSpec, spec_for, spec_of_manifest
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
# The M a weight is planned at when no M is given (pack build --weights, --model without --m): each
# bucket serves the M above the previous one up to itself (bucket_cells). Powers of two because the
# policy's rules switch there (plan.swap_blk_m's tile heights serve 1-8, 9-16, 17-32, 33-64;
# swap-ab holds to M = 64, row-tiles for 32 < M <= 128), so the choice at a bucket's top is made
# for tiles that cover every M of its cell; 1 apart, for decode's single row (the tuning database
# buckets it on its own); 2..4 not, as swap_blk_m is 8 for them all; 16384, the largest M of the
# every-model suite (measure/every_model.M_CHOICES): past it the top bucket's module serves. Above
# 128 the waves decide, not the tile heights, and they change between powers of two: with buckets at
# powers of two only, M = 1536 ran the module chosen at 2048 at 0.77-0.80x the best module the pack
# held (benchmarks/results/2026-11-26_h100_m_range/), so from 128 on the ladder has a point half way
# (x1.5) too. A weight too wide for 16384 rows in 32-bit indices stops at the most it takes
# (weight_buckets).
M_BUCKETS = (1, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
             16384)
# fp8 weights take three more (plan_pack): between 256 and 768 scaled_mm's rules switch where M crosses a row of
# 128-row tiles (plan.fp8_tile_cluster) and where tiles of swapped operands divide M (plan.fp8_swap_knobs), so a
# module chosen at 384 ran 0.59x torch._scaled_mm at M = 320 where the one chosen at 320 ran 0.87x, and the one
# chosen at 768 0.82-0.87x at M = 640 where 640's ran 0.99-1.00x (benchmarks/results/2026-11-29_h200_fp8_mid/)
FP8_MID_BUCKETS = (320, 448, 640)


GROUPED_LAYOUTS = ("contiguous", "masked")  # v12's (sm90a.grouped.LAYOUTS; no TVM import here)


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
     "spec": SPEC_SCHEMA, "alternative": Maybe(Bool()),
     # a grouped module (v12): the weight's experts, its layout and the token counts it serves
     "experts": Maybe(Int(lo=1)), "layout": Maybe(Str(GROUPED_LAYOUTS)),
     "tokens": Maybe(Check(List(Int(lo=1), length=2, what="[least tokens, most tokens]"), _range_problem))})
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
        if is_grouped(e):
            lo, hi = e["tokens"]
            count = "rows of A" if e["layout"] == "contiguous" else "max_tokens"
            out = ", outside it" if self.fit == "any-m" else ""
            return (f"kernel pack {self.pack.folder}: {e['file']} ({e['rung']} {e['layout']}, E={e['experts']}, knobs "
                    f"chosen for {count} in {lo}..{hi}{out}; rule {(e.get('choice') or {}).get('rule', '?')})")
        lo, hi = e["m_range"]
        at = f" (at M={','.join(map(str, e['m_values']))})" if e.get("m_values") else ""
        what = {"exact": f"built for M={e['shape'][0]}",
                "tuned-range": f"M at run time, knobs chosen for M in {lo}..{hi}{at}",
                "any-m": f"M at run time, knobs chosen for M in {lo}..{hi}{at}, outside it",
                "pad-m": f"built for M={e['shape'][0]}: A is copied into {e['shape'][0]} zero-padded rows"}[self.fit]
        alt = "; an alternative to the policy's choice, offered for the timing at first use" if is_alternative(e) else ""
        return f"kernel pack {self.pack.folder}: {e['file']} ({what}{alt})"


class KernelPack:
    """A pack folder, its ``pack.json`` read and checked (see the module docstring)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.manifest = read_pack_manifest(self.folder)
        self.modules = self.manifest["modules"]
        self._by_nk: dict = {}
        # (layout, E, N, K, dtype, arch, epilogue) -> grouped entries (find_grouped; epilogue "swiglu": a
        # gated W_gu, which only grouped_swiglu serves)
        self._grouped: dict = {}
        for e in self.modules:
            if is_grouped(e):
                key = (e["layout"], e["experts"], e["shape"][1], e["shape"][2], grouped_dtype(e), e["arch"],
                       spec_of_manifest(e).epilogue)
                self._grouped.setdefault(key, []).append(e)
                continue
            key = (e["shape"][1], e["shape"][2], e["dtype"], e["arch"], spec_of_manifest(e))
            self._by_nk.setdefault(key, []).append(e)

    def __repr__(self) -> str:
        return f"<KernelPack {self.folder} ({len(self.modules)} modules, {self.manifest.get('arch')})>"

    def find(self, M: int, N: int, K: int, dtype: str, arch: str, spec: GemmSpec | None = None) -> Found | None:
        """The module of ``spec`` (default: ``dtype`` in and out, no epilogue) that serves this
        shape best, or None (see :data:`FITS`); an alternative only where no module of the
        policy's choice serves it at all (without the measurement the policy's choice serves)."""
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
            r = (is_alternative(e), FITS.index(fit), dist)
            if rank is None or r < rank:
                best, rank = e, r
        return Found(best, FITS[rank[1]], self) if best is not None else None

    def serving(self, M: int, N: int, K: int, dtype: str, arch: str, spec: GemmSpec | None = None) -> list[Found]:
        """Every module of ``spec`` that serves M rows of this weight as it is (no copies): a
        runtime-M one whose 32-bit indices take M (``config.max_m_of``), a module built for this M;
        nearest first to the M its knobs were chosen at (``exact``, then ``tuned-range``, then
        ``any-m``), an alternative right after the module of the policy's choice beside it. The
        measured choice at first use (``first_use``) times these."""
        out = []
        for e in self._by_nk.get((N, K, dtype, arch, spec or GemmSpec.default(dtype)), ()):
            lo, hi = e["m_range"]
            if e["dynamic_m"] and M <= max_m_of(N, K, e["knobs"]):
                dist = min(abs(math.log2(M / v)) for v in (e.get("m_values") or (lo, hi)))
                out.append(((1 if lo <= M <= hi else 2, dist, is_alternative(e)),
                            Found(e, "tuned-range" if lo <= M <= hi else "any-m", self)))
            elif not e["dynamic_m"] and e["shape"][0] == M:
                out.append(((0, 0.0, is_alternative(e)), Found(e, "exact", self)))
        out.sort(key=lambda rf: rf[0])
        return [f for _, f in out]

    def find_grouped(self, layout: str, E: int, N: int, K: int, dtype: str, arch: str, tokens: int,
                     epilogue: str = "none") -> Found | None:
        """The grouped module of this weight (``[E, N, K]``, ``layout``, ``epilogue``) whose token range holds
        ``tokens`` (contiguous: rows of A; masked: max_tokens), ``tuned-range``; else the one whose
        range is nearest (``any-m``: its knobs were chosen for other counts); None where the pack
        holds none of this weight."""
        best, rank = None, None
        for e in self._grouped.get((layout, E, N, K, dtype, arch, epilogue), ()):
            lo, hi = e["tokens"]
            inside = lo <= tokens <= hi
            r = (0 if inside else 1, 0.0 if inside else min(abs(math.log2(max(tokens, 1) / v)) for v in (lo, hi)))
            if rank is None or r < rank:
                best, rank = e, r
        return Found(best, "tuned-range" if rank[0] == 0 else "any-m", self) if best is not None else None

    def grouped_entries(self, layout: str, E: int, N: int, K: int, dtype: str, arch: str,
                        epilogue: str = "none") -> list[dict]:
        """Every grouped entry of this weight, layout and epilogue, by token range."""
        return sorted(self._grouped.get((layout, E, N, K, dtype, arch, epilogue), ()), key=lambda e: e["tokens"][0])

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
        launch = man.get("launch", {})
        if is_grouped(entry) and (launch.get("experts"), launch.get("layout", "contiguous")) != (entry["experts"],
                                                                                               entry["layout"]):
            raise PackError(f"{path} is a grouped module of {launch.get('experts')} experts, layout "
                            f"{launch.get('layout', 'contiguous')}, but {PACK_MANIFEST} lists {entry['experts']} "
                            f"experts, layout {entry['layout']}: {again}")
        return path

    def load(self, entry: dict):
        """Check the entry (:meth:`check_entry`) and load its module (``runtime.load``)."""
        return load(self.check_entry(entry))


def is_alternative(entry: dict) -> bool:
    """Whether a pack entry is an alternative (``plan.alternatives``) rather than the policy's
    choice; an entry without the field (every entry of an older pack) is the choice."""
    return bool(entry.get("alternative"))


def grouped_dtype(entry: dict) -> str:
    """The dtype a grouped entry is found under (``find_grouped``): its 16-bit dtype, or
    :data:`FP8_INPUT` for a grouped fp8 module with D in bfloat16 (``FP8_INPUT:float16`` with D in
    float16: ``serve.grouped_fp8.pack_dtype``), which the 16-bit front doors never ask for."""
    spec = spec_of_manifest(entry)
    return fp8_grouped_dtype(spec.d) if spec.is_fp8 else entry["dtype"]


def fp8_grouped_dtype(d: str) -> str:
    """The dtype word of a grouped fp8 module with D in ``d`` (:func:`grouped_dtype`)."""
    return FP8_INPUT if d == "bfloat16" else f"{FP8_INPUT}:{d}"


def is_grouped(entry: dict) -> bool:
    """Whether a pack entry is a grouped module (v12: ``experts``, ``layout``, ``tokens``), which
    only the grouped front door serves; an entry without the fields (an older pack) is not."""
    return entry.get("experts") is not None


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
        missing = [k for k in ("layout", "tokens") if is_grouped(entry) and entry.get(k) is None]
        if missing:
            again = f"rebuild this pack: python -m gemm_ladder pack build --grouped ... --out {folder}"
            raise PackError(f"{path}: modules[{i}] ({entry['file']}) is a grouped module (experts) without "
                            f"{' and '.join(missing)}: {again}", path=path, field=f"modules[{i}].{missing[0]}",
                            fix=again)
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
    return files.module_stem(tag.replace(f"_{job.shape[0]}x", "_anyMx", 1) if dynamic else tag)


def weight_buckets(N: int, K: int, extra: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The buckets of :data:`M_BUCKETS` (and ``extra``: an fp8 weight's :data:`FP8_MID_BUCKETS`) a weight takes:
    those up to the largest M the policy's kernels index in 32 bits at this N and K (``config.largest_m`` at the
    largest tile, as ``plan.rule_choice`` checks), and that M as the last bucket where it falls short of the top
    (an lm_head of 152k rows takes M <= 14080). ``IndexRangeError`` where N and K alone are too large."""
    most = largest_m(N, K, *LARGEST_TILE)
    if most < 1:
        check_extents("gemm_ladder", 1, N, K, *LARGEST_TILE)
    kept = tuple(sorted({b for b in M_BUCKETS + tuple(extra) if b <= most}))
    return kept if kept[-1] == M_BUCKETS[-1] or kept[-1] == most else kept + (most,)


def bucket_cells(buckets=M_BUCKETS) -> list[tuple[int, int, int]]:
    """``(bucket, least M, largest M)`` of each bucket of a weight's M range: a bucket serves the M
    above the bucket before it, up to itself (see :data:`M_BUCKETS`)."""
    return [(b, (buckets[i - 1] + 1) if i else 1, b) for i, b in enumerate(buckets)]


def _runs(asks) -> list[dict]:
    """The ``m_range`` and ``m_values`` entries of a runtime-M module from the M it was chosen at
    (``(M, least, largest, bucket)``): requested M alone give one range from the least to the
    largest (``--shapes``: those M); a bucket's cell joins whatever it touches, one entry a run."""
    if not any(bucket for *_, bucket in asks):
        ms = sorted({M for M, *_ in asks})
        return [{"m_range": [ms[0], ms[-1]], "m_values": ms}]
    runs: list[dict] = []
    for M, lo, hi, _ in sorted(asks, key=lambda a: (a[1], a[2])):
        if runs and lo <= runs[-1]["m_range"][1] + 1:
            run = runs[-1]
            run["m_range"][1] = max(run["m_range"][1], hi)
            run["m_values"] = sorted({*run["m_values"], M})
        else:
            runs.append({"m_range": [lo, hi], "m_values": [M]})
    return runs


FP8_INPUT = "float8_e4m3"  # the dtype a pack request names for scaled_mm's modules (A and B e4m3)
FP8_EPILOGUES = ("none", "bias")  # what an fp8 module's epilogue builds (spec._fp8_not_built)
# the recipes a pack request builds unless it names them (--fp8-scales): block scales quantize a
# weight differently (128x128 blocks), so a pack builds them only where asked (--fp8-scales block)
FP8_DEFAULT_SCALES = ("tensor", "row")
PACK_DTYPES = DTYPES + (FP8_INPUT,)


def pack_specs(dtypes, epilogues=("none",), layouts=(("K", "K"),), fp8_scales=FP8_DEFAULT_SCALES,
               fp8_out=("bfloat16",)) -> list[GemmSpec]:
    """The operand specs a pack request asks for: each 16-bit dtype with each epilogue and layout
    (``spec.spec_for``), and for :data:`FP8_INPUT` an fp8 spec for each recipe of ``fp8_scales``,
    each D of ``fp8_out`` and each epilogue (``none``; ``bias``: in D's dtype). What fp8 does not
    build is refused by name (ConfigError), before anything is planned."""
    specs = []
    for dtype in dtypes:
        if dtype not in PACK_DTYPES:
            raise ConfigError(f"dtype {dtype!r}: a pack builds {', '.join(PACK_DTYPES)}")
        if dtype != FP8_INPUT:
            specs += [dataclasses.replace(spec_for(dtype, e), a_major=am, b_major=bm)
                      for e in epilogues for am, bm in layouts]
            continue
        if any(tuple(lay) != ("K", "K") for lay in layouts):
            raise ConfigError(f"{FP8_INPUT} with layouts {list(layouts)}: {MN_MAJOR_FP8_FIX}; build it with "
                              "--layouts KK (16-bit dtypes beside it take the other layouts in another request)")
        if not fp8_scales or not fp8_out:
            raise ConfigError(f"{FP8_INPUT} needs a recipe and a D dtype: --fp8-scales {','.join(FP8_SCALES)} "
                              "--fp8-out bfloat16")
        for e in epilogues:
            if e not in FP8_EPILOGUES:
                raise ConfigError(f"epilogue {e!r} with {FP8_INPUT}: an fp8 module is built with the epilogue "
                                  f"{' or '.join(FP8_EPILOGUES)} (a bias in D's dtype)")
        for recipe in fp8_scales:
            if recipe not in FP8_SCALES:
                raise ConfigError(f"fp8 scales {recipe!r}: use {' or '.join(FP8_SCALES)}")
            for d in fp8_out:
                if d not in DTYPES:
                    raise ConfigError(f"fp8 D dtype {d!r}: a pack's fp8 modules write {' or '.join(DTYPES)}")
                specs += [GemmSpec.fp8(d, recipe, d if e == "bias" else None) for e in epilogues]
    return list(dict.fromkeys(specs))


def _check_fp8_extents(N: int, K: int) -> None:
    """fp8 modules are not fed padded copies (scaled_mm refuses what TMA cannot read as it is)."""
    if N % 16 or K % 16:
        raise ConfigError(f"{FP8_INPUT} at N={N}, K={K}: N and K must be multiples of 16 (torch._scaled_mm's "
                          "rule, and TMA's 16-byte rows of 1-byte elements); leave this weight out of the fp8 "
                          "request, or pad it")


def plan_pack(shapes, dtypes, arch: str = "sm_90a", sms: int | None = None, dynamic: bool = True,
              epilogues=("none",), weights=(), layouts=(("K", "K"),), fp8_scales=FP8_DEFAULT_SCALES,
              fp8_out=("bfloat16",), alternatives: bool = True, grouped=(), grouped_dtypes=None) -> list[dict]:
    """The modules a pack needs for ``shapes`` (``(M, N, K)``: those M) and ``weights``
    (``(N, K)``: every bucket of :func:`weight_buckets`) in ``dtypes`` with each of ``epilogues``
    (``none``, ``bias``, ``bias_gelu_tanh``, ...: the operand spec, ``spec.spec_for``) and each of
    ``layouts`` (the spec's ``(a_major, b_major)``: ``("K", "N")`` for a B stored [K, N]): one per
    choice of the front door's policy (``plan.choose``, at the N and K it pads to), one for all the
    M of a (rung, knobs, N, K)
    where the rung takes M at run time, else one per M. Each item: the build ``job``, its
    ``file``, ``dynamic_m``, the ``choice`` and ``served``, the ``m_range``/``m_values`` of each
    pack.json entry it gets (:func:`_runs`; each run says whether it is an ``alternative``).
    ``float8_e4m3`` among ``dtypes``: fp8 modules of each recipe of ``fp8_scales`` and D of
    ``fp8_out`` (:func:`pack_specs`). ``alternatives``: also the modules ``plan.alternatives``
    offers beside a choice that leaves most SMs idle, serving the same M (see the module docstring).
    ``grouped``: grouped weights ``(E, N, K, layout or None)`` in ``grouped_dtypes`` (default
    ``dtypes``), as :func:`plan_grouped`."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    # pylint: disable=import-outside-toplevel
    from ..compile.batch import BuildJob
    from ..rungs import rung_module
    from . import plan

    grouped_items = _grouped_items(grouped, dtypes if grouped_dtypes is None else grouped_dtypes, arch, plan, BuildJob)
    specs = pack_specs(dtypes, epilogues, layouts, fp8_scales, fp8_out)
    sms = sms or plan.default_sms(arch)
    groups: dict = {}
    for spec in specs:
        dtype = spec.d if spec.is_fp8 else spec.a  # the config's dtype: an fp8 kernel's is D's
        if spec.is_fp8:
            for N, K in [s[1:] for s in shapes] + list(weights):
                _check_fp8_extents(N, K)
        asks = [(M, N, K, M, M, False) for M, N, K in shapes]
        for N, K in weights:
            padded = tma_layout.layout_fixes(tma_layout.Layout(1, N, K, dtype))  # what the kernels index
            buckets = weight_buckets(padded.N, padded.K, FP8_MID_BUCKETS if spec.is_fp8 else ())
            asks += [(b, N, K, lo, hi, True) for b, lo, hi in bucket_cells(buckets)]
        for M, N, K, lo, hi, bucket in asks:
            fixes = tma_layout.layout_fixes(tma_layout.Layout(M, N, K, dtype))
            problem = plan.Problem(M, fixes.N, fixes.K, dtype, arch, sms, spec)
            choice = plan.choose(problem)
            offered = plan.alternatives(problem, choice) if alternatives else []
            for c, alt in [(choice, False)] + [(a, True) for a in offered]:
                knobs = dict(c.knobs)
                dyn = dynamic and "dynamic_m" in rung_module(c.rung, arch).KNOBS
                if dyn:
                    knobs["dynamic_m"] = True
                    dyn = plan._validate(c.rung, problem, knobs) is None
                    knobs = knobs if dyn else dict(c.knobs)
                # the file names the binary (config.tag: every knob, anyM for a runtime M), so one
                # group per file: two choices that fill in to the same kernel share it (a module may
                # be the choice at one M and an alternative at another: its runs say which)
                file = _name(BuildJob(c.rung, (M if dyn else max(M, MIN_STATIC_M), fixes.N, fixes.K), knobs),
                             dyn) + ".so"
                g = groups.setdefault(file, {"rung": c.rung, "knobs": knobs, "N": fixes.N, "K": fixes.K,
                                             "dynamic_m": dyn, "asks": {}, "choice": {}})
                g["asks"].setdefault(alt, []).append((M, lo, hi, bucket))
                g["choice"].setdefault(alt, c.as_dict())
    out = []
    for file, g in groups.items():
        ms = [a[0] for asks in g["asks"].values() for a in asks]
        lo, hi = min(ms), max(ms)
        M = lo if g["dynamic_m"] else max(hi, MIN_STATIC_M)
        extra = {"dynamic_m": {"min_m": 1, "tuned_for_m": [lo, hi]}} if g["dynamic_m"] else None
        job = BuildJob(g["rung"], (M, g["N"], g["K"]), g["knobs"], extra)
        served = []
        for alt in sorted(g["asks"]):  # the policy's choice first
            asks = g["asks"][alt]
            runs = _runs(asks) if g["dynamic_m"] else [{"m_range": [M, M], "m_values": sorted({a[0] for a in asks})}]
            served += [{**run, "alternative": True} if alt else run for run in runs]
        out.append({"job": job, "file": file, "dynamic_m": g["dynamic_m"], "choice": g["choice"].get(False,
                    g["choice"].get(True)), "alt_choice": g["choice"].get(True), "served": served})
    return out + grouped_items


GROUPED_BUILD_M = 4096  # the M a grouped module is built at (serve.grouped.BUILD_M: M is read at run time)


def plan_grouped(grouped, dtypes, arch: str = "sm_90a") -> list[dict]:
    """The modules a pack needs for grouped weights: ``grouped`` lists ``(E, N, K, layout)``
    (``layout`` None: both), each planned in each 16-bit dtype of ``dtypes`` by
    ``plan.grouped_choices`` (decode and prefill modules, each with the token range it serves).
    Items as :func:`plan_pack`'s, with ``grouped`` (the entry's ``experts``, ``layout``)."""
    return plan_pack([], [], arch, grouped=grouped, grouped_dtypes=dtypes)


def _grouped_items(grouped, dtypes, arch: str, plan, BuildJob) -> list[dict]:  # pylint: disable=invalid-name
    """:func:`plan_grouped`'s items; ``plan`` and ``BuildJob`` are :func:`plan_pack`'s imports
    of the build layer."""
    out: dict = {}
    for E, N, K, layout, *gated in grouped:  # (E, N, K, layout or None[, "swiglu"]: cli_types.grouped_weight)
        epilogue = gated[0] if gated else "none"
        for dtype in dtypes:
            if dtype not in PACK_DTYPES:
                raise ConfigError(f"grouped E={E} N={N} K={K} in {dtype}: the grouped GEMM builds "
                                  f"{', '.join(PACK_DTYPES)}; leave it out of --dtypes or of --grouped")
            if dtype == FP8_INPUT and layout not in (None, "contiguous"):
                raise ConfigError(f"grouped E={E} N={N} K={K} in {FP8_INPUT}, layout {layout}: the grouped fp8 GEMM "
                                  "(scaled_grouped_mm) is built for the contiguous layout only; name it contiguous")
            if dtype == FP8_INPUT and epilogue != "none":
                raise ConfigError(f"grouped E={E} N={N} K={K},{epilogue} in {FP8_INPUT}: the grouped fp8 GEMM has no "
                                  f"{epilogue} epilogue yet; build the gated weight in bfloat16 or float16")
            # fp8 (scaled_grouped_mm, rowwise scales, D bf16): the contiguous layout only
            layouts = (layout,) if layout else ("contiguous",) if dtype == FP8_INPUT else GROUPED_LAYOUTS
            for lay in layouts:
                for g in plan.grouped_choices(E, N, K, dtype, lay, arch, epilogue):
                    job = BuildJob(plan.GROUPED_RUNG, (max(GROUPED_BUILD_M, E), N, K), dict(g.choice.knobs))
                    file = _name(job, True) + ".so"
                    lo, hi = g.tokens
                    rows = [lo, hi] if lay == "contiguous" else [E * lo, E * hi]  # A viewed [E * max_tokens, K]
                    item = out.setdefault(file, {"job": job, "file": file, "dynamic_m": True,
                                                 "choice": g.choice.as_dict(), "served": [],
                                                 "grouped": {"experts": E, "layout": lay}})
                    item["served"].append({"m_range": rows, "tokens": [lo, hi]})
    return list(out.values())


def entries_of(item: dict, man: dict | None = None) -> list[dict]:
    """The ``pack.json`` entries of a module :func:`plan_pack` planned, one a range of M it serves;
    with its manifest ``man`` once built (its size, sha256 and spec), without it for a dry run."""
    job = item["job"]
    entry = {"file": item["file"], "rung": job.rung, "shape": list(job.shape), "dtype": job.knobs["dtype"],
             "arch": job.knobs["arch"], "knobs": job.knobs, "dynamic_m": item["dynamic_m"], "choice": item["choice"]}
    if man is not None:
        entry.update(dtype=man["dtype"], arch=man["arch"], knobs=man["knobs"], so_bytes=man["so_bytes"],
                     so_sha256=man["so_sha256"], spec=spec_of_manifest(man).to_dict())
    if "grouped" in item:  # a grouped module: one entry a token range
        return [{**entry, **item["grouped"], **run} for run in item["served"]]
    # an alternative's run: marked, with the alternative's own choice (why it is offered)
    return [{**entry, "m_range": run["m_range"], "m_values": run["m_values"]}
            | ({"alternative": True, "choice": item.get("alt_choice") or item["choice"]} if run.get("alternative") else {})
            for run in item["served"]]


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
               workers: int | None = None, cache_root=None, request: dict | None = None, epilogues=("none",),
               weights=(), layouts=(("K", "K"),), fp8_scales=FP8_DEFAULT_SCALES, fp8_out=("bfloat16",),
               alternatives: bool = True, grouped=()) -> dict:
    """Build the modules :func:`plan_pack` lists into ``out`` and write ``out/pack.json`` (merged
    with what the folder held: entries of other files stay). Returns the manifest, with
    ``"results"`` (built / cache / failed per module). ``alternatives``: as :func:`plan_pack`;
    ``grouped``: grouped weights ``(E, N, K, layout or None)``, as :func:`plan_grouped`."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from . import plan  # pylint: disable=import-outside-toplevel

    files.open_build_folders(out)  # the cache and out, before anything compiles (files.FolderError)
    sms = sms or plan.default_sms(arch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = plan_pack(shapes, dtypes, arch, sms, dynamic, epilogues, weights, layouts, fp8_scales, fp8_out,
                      alternatives, grouped)
    results = map_in_processes(_pack_worker, [(i, str(out), cache_root) for i in items], workers)
    results = [r if isinstance(r, dict) else {"file": i["file"], "status": "failed", "detail": repr(r)}
               for i, r in zip(items, results)]
    entries = [e for item, res in zip(items, results) if res["status"] != "failed"
               for e in entries_of(item, read_manifest(out / item["file"]))]
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
