"""Explain a GPU job that timed out: run the module's watchdog twin and say what it waits on.

``gemm_ladder.measure.isolate`` kills a child whose kernel does not finish and records ``timeout``.
That says *that* a kernel hangs, not *why*. Here, for each timed-out module, the same config
built with the ``watchdog`` knob (its *twin*) runs in a fresh child; its bounded waits turn the
hang into a :class:`~gemm_ladder.sync.watchdog.BarrierTimeoutError`, whose message is added
to the timed-out result (``detail`` and ``barrier``).

Where the twin comes from, in order:

1. a module in the same folder, or its ``watchdog/`` subfolder, whose manifest has the same
   config plus ``watchdog`` (``python -m gemm_ladder.barriers twins DIR`` builds them on a build
   box; ``benchmarks/prepare_gpu_session.sh`` does it for the GPU test tier);
2. built on the spot, where TVM's compiler is importable (a box with both a GPU and TVM).

On a runtime-only GPU box without twins the result stays an unexplained timeout.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

from ..core import files
from ..core.records import Map, Obj, RecordError, read_json

TWIN_SECONDS = 2  # the bound each wait of a twin gets
TWIN_FOLDER = "watchdog"
MANIFEST_CONFIG = Obj({"config": Map()})  # what a twin needs of a module's manifest


def _config(manifest: dict) -> dict:
    return dict(manifest.get("config") or {})


def _manifest(path: Path) -> dict:
    """A module's manifest, with the config a twin is built from (``RecordError`` names what is wrong)."""
    return read_json(path, "module manifest", "export the module again", MANIFEST_CONFIG)


def find_twin(path) -> Path | None:
    """A watchdog build of ``path``'s config next to it, if one was exported."""
    path = Path(path)
    man_path = Path(str(path) + ".json")
    if not man_path.exists():
        return None
    manifest = _manifest(man_path)
    if manifest.get("watchdog"):
        return None  # it is a watchdog build already
    want = _config(manifest)
    for folder in (path.parent / TWIN_FOLDER, path.parent):
        for cand in sorted(folder.glob("*.so.json")):
            try:
                other = _manifest(cand)
            except RecordError:
                continue
            cfg = _config(other)
            if other.get("watchdog") and cfg.pop("watchdog", None) and cfg == want:
                return Path(str(cand)[: -len(".json")])
    return None


def _compiler_here() -> bool:
    if os.environ.get("TVM_USE_RUNTIME_LIB"):
        return False
    spec = importlib.util.find_spec("tvm")
    return bool(spec and spec.origin and (Path(spec.origin).parent / "lib" / "libtvm_compiler.so").exists())


def build_twin(path, out_dir=None, seconds: float = TWIN_SECONDS) -> Path:
    """Build and export the watchdog twin of the module at ``path`` (needs TVM's compiler)."""
    # optional: the build layer (TVM's compiler), absent from a runtime-only GPU box
    from ..compile.builder import build  # pylint: disable=import-outside-toplevel

    knobs = dict(_manifest(Path(str(path) + ".json"))["config"])
    rung, M, N, K = knobs.pop("rung"), knobs.pop("M"), knobs.pop("N"), knobs.pop("K")
    seconds = int(seconds) if float(seconds).is_integer() else seconds  # watchdog2, not watchdog2.0
    mod = build(rung, M, N, K, **knobs, watchdog=seconds)  # explicit knobs: no tuning lookup
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="gemm_ladder_watchdog_"))
    return mod.export(out_dir / f"{files.module_stem(mod.cfg.tag())}.so")


def twins(folder, seconds: float = TWIN_SECONDS) -> list[Path]:
    """Build the watchdog twin of every module in ``folder`` into ``folder/watchdog/``."""
    folder = Path(folder)
    out = []
    for man in sorted(folder.glob("*.so.json")):
        so = Path(str(man)[: -len(".json")])
        if _manifest(man).get("watchdog") or find_twin(so):
            continue
        out.append(build_twin(so, folder / TWIN_FOLDER, seconds))
    return out


def explain_timeouts(job: str, paths, args, results, run_isolated, timeout: float = 60.0) -> None:
    """Add the watchdog's words to every ``timeout`` result (in place).

    ``run_isolated(job, path, *args, timeout=...)`` runs one module in a watched child; the caller
    (:mod:`gemm_ladder.measure.isolate`) passes its own, so this module does not import the layer above it.
    """

    for path, res in zip(paths, results):
        if not res or res.get("status") != "timeout":
            continue
        twin = find_twin(path)
        if twin is None and _compiler_here():
            try:
                twin = build_twin(path)
            except Exception as err:  # pylint: disable=broad-except
                res["watchdog"] = f"no watchdog twin: building one failed ({type(err).__name__}: {err})"
                continue
        if twin is None:
            res["watchdog"] = ("no watchdog twin next to the module and no TVM compiler here: "
                               "python -m gemm_ladder.barriers twins DIR on a build box")
            continue
        # a timing job's hang is its kernel's: the twin is checked once (a watchdog build cannot
        # be timed in a CUDA graph, and one launch is enough to name the barrier)
        twin_res = (run_isolated("check", twin, 0, timeout=timeout) if job == "time"
                    else run_isolated(job, twin, *args, timeout=timeout))
        res["watchdog_module"] = twin.name
        if twin_res.get("status") == "hang":
            res["barrier"] = twin_res.get("barrier")
            res["detail"] = f"{res.get('detail', '')}; watchdog: {twin_res.get('detail')}".lstrip("; ")
        else:
            res["watchdog"] = f"the watchdog twin ended with {twin_res.get('status')}: {twin_res.get('detail', '')}"
