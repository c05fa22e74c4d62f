"""The manifest of an exported module: the JSON beside every ``.so`` that says what it is.

``gemm_ladder.compile.builder`` writes it at export (format :data:`MANIFEST_VERSION`); the
runtime, the module cache, kernel packs, the tuner's cache and ``info`` read it through
:func:`read_manifest` (checked against :data:`MANIFEST_SCHEMA`) and check the ``.so`` against it
with :func:`check_file` (its size and sha256) before anything maps it. It lives in the core
because both sides of it, the build and the runtime, stand on it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .config import ARCHS, DTYPES, RetiredKnobError, drop_retired_knobs
from .records import (KNOB_VALUE, SHAPE, Bool, Either, Int, List, Map, Maybe, Num, Obj, RecordError, Str, parse_json,
    read_text, validate)
from .spec import SPEC_SCHEMA

MANIFEST_SUFFIX = ".json"
MANIFEST_VERSION = 2  # what gemm_ladder.compile.builder writes
# every field the loader, the front door, ``info`` and packs read, with its type and range
_WORKSPACE = Obj({"m_step": Int(lo=1), "float32_per_m_step": Int(lo=0), "int32_per_m_step": Int(lo=0)},
                 {"float32_per_cta": Int(lo=0), "int32_per_cta": Int(lo=0), "zeroed": Bool()})
_LAUNCH = Obj(optional={"grid": List(Either(Int(lo=1), Str(), what="a CTA count or a name")),
                        "threads": Int(lo=1), "smem_bytes": Int(lo=0), "persistent": Bool(),
                        "cluster": Int(lo=1), "dynamic_m": Bool(), "workspace": Maybe(_WORKSPACE)})
MANIFEST_SCHEMA = Obj(
    {"rung": Str(pattern=r"v\d+", example="v9"), "shape": SHAPE, "dtype": Str(DTYPES), "arch": Str(ARCHS),
     "knobs": Map(KNOB_VALUE),
     "tvm_version": Str(), "so_bytes": Int(lo=0), "so_sha256": Str(pattern="[0-9a-f]{64}", example="64 hex digits")},
    {"launch": _LAUNCH, "watchdog": Maybe(Obj(optional={"seconds": Maybe(Num(positive=True))})),
     "commit": Maybe(Str()), "compiler": Maybe(Str()), "spec": SPEC_SCHEMA})


class ManifestError(RecordError):
    """A module's manifest is unreadable, or does not describe the ``.so`` beside it."""


def manifest_path(path) -> Path:
    """The manifest beside an exported module: ``X.so`` -> ``X.so.json``."""
    return Path(str(path) + MANIFEST_SUFFIX)


def read_manifest(path) -> dict:
    """The manifest of the module at ``path`` (``path + ".json"``), checked to be one: a JSON
    object of this format with the fields the loader reads. The ``.so`` is not opened."""
    path = Path(path)
    man = manifest_path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not man.exists():
        raise FileNotFoundError(
            f"{man} is missing: gemm_ladder.load needs the manifest that export() writes beside the .so"
        )
    again = f"copy {man.name} again from where {path.name} was exported, or re-export the module"
    data = parse_json(read_text(man, "module manifest", again, ManifestError), man, "module manifest", again,
                      error=ManifestError)
    if not isinstance(data, dict):
        raise ManifestError(f"{man} holds a JSON {type(data).__name__}, not the object export() writes: {again}",
                            path=man, fix=again)
    if data.get("format") != MANIFEST_VERSION:
        raise ManifestError(
            f"{man} has manifest format {data.get('format')!r}; this gemm_ladder reads format "
            f"{MANIFEST_VERSION} (which records the .so's size and sha256): re-export the module",
            path=man, field="format", fix="re-export the module")
    data = validate(data, MANIFEST_SCHEMA, man, again, ManifestError)
    try:
        return {**data, "knobs": drop_retired_knobs(data["rung"], data["knobs"])}
    except RetiredKnobError as err:
        fix = "rebuild this module (python -m gemm_ladder build) or the pack it came from (python -m gemm_ladder pack build)"
        raise ManifestError(f"{man}: {err}: {fix}", path=man, field="knobs", fix=fix) from None


def check_file(path, manifest: dict) -> None:
    """The ``.so`` at ``path`` is the one ``manifest`` was written for: same size, same sha256.

    Run before anything maps the file: the dynamic loader dies (a bus error, no message) on a
    truncated shared library.
    """
    path = Path(path)
    have = path.stat().st_size
    if have != manifest["so_bytes"]:
        cut = " (cut short: an unfinished copy?)" if have < manifest["so_bytes"] else ""
        raise ManifestError(
            f"{path} is {have} bytes but its manifest {path.name}{MANIFEST_SUFFIX} says "
            f"{manifest['so_bytes']}{cut}: copy the .so again, or re-export it"
        )
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != manifest["so_sha256"]:
        raise ManifestError(
            f"{path} does not match its manifest {path.name}{MANIFEST_SUFFIX} (sha256 differs): the "
            "manifest belongs to another module, or the .so was changed; copy both files again "
            "from where they were exported together, or re-export"
        )
