"""The measured choice at first use: of the kernels that can serve a call, the one this GPU runs fastest.

A whole-range kernel pack holds the modules the policy chose at the edges of its M buckets; inside
a bucket the count of waves changes, and the module chosen at the edge ran at 0.76-0.89x of the
pack's best at five of 84 M tested (benchmarks/results/2026-11-26_h100_m_range/). So, as Triton's
and TileLang's autotuners do, the first call of a shape (M, weight, operand spec) on a GPU times
each candidate on the caller's own A and B, and the winner is remembered:

- the candidates: every module of the packs that serves this M as it is (a runtime-M module whose
  32-bit indices take M, a module built for this M: ``KernelPack.serving``), at most
  :data:`MAX_CANDIDATES`, nearest first to the M their knobs were chosen at; and, unless strict,
  torch's own matmul (cuBLAS): where it measures faster than every kernel of ours, torch computes
  the shape (the front door is never slower than the library it replaces) and ``explain`` says so;
- the timing, twice: as queued launches on the current stream as a caller makes them (host path
  included), and as kernels alone (a CUDA graph of the same launches, replayed: what a model served
  with CUDA graphs sees), into a scratch output, between CUDA events; :data:`ROUNDS` rounds whose
  order rotates, each sample a batch of launches of at least :data:`SAMPLE_US`; the median. A
  first launch of each is its warm-up. Eager calls take the queued winner, calls inside CUDA-graph
  capture the kernel winner (``front.ByCapture`` where they differ: ours has the shorter host path,
  cuBLAS's kernel may be the faster). It costs each new shape a few milliseconds (an lm_head at
  M = 8192: ~0.3 s);
- nothing is measured inside CUDA-graph capture (the pack's own choice serves; a later eager call
  of the shape measures), nor with ``GEMM_LADDER_MEASURE=0``;
- remembered: in the process (the route), and in a small JSON file (``$GEMM_LADDER_CHOICES``,
  default ``<cache>/choices.json``; ``off``: the process only), keyed on the GPU's name, the
  candidates' sha256 and M, both winners, so a new process skips the timing and a rebuilt pack is timed again.
  An unreadable file is warned about once and rewritten.

Written here, not taken from a library: Triton's autotuner times Triton kernels it compiles and
TileLang's its own; neither chooses among loaded modules and torch, nor keeps choices per pack.

This module imports torch on use (the caller's) and nothing of TVM.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import warnings
from pathlib import Path

from ..core import files

MEASURE_ENV = "GEMM_LADDER_MEASURE"  # "0": the pack's (policy's) choice, nothing timed
CHOICES_ENV = "GEMM_LADDER_CHOICES"  # the file of remembered choices; "off": the process only
CHOICES_FILE = "choices.json"
MAX_CANDIDATES = 4  # kernels of ours timed (plus torch)
ROUNDS = 3
SAMPLE_US = 200.0  # each timed sample: launches adding up to at least this (a one-launch sample is noise)
MAX_REPS = 100
# torch must beat our best by this much to take a shape: our host path is the shorter, and a tie
# within timing noise keeps ours (the faster call)
TORCH_MARGIN = 1.02
TORCH = "torch"
_LOCK = threading.Lock()
_STATE: dict = {"file": None, "doc": None, "warned": False}


def enabled() -> bool:
    return os.environ.get(MEASURE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def choices_path() -> Path | None:
    """The file of remembered choices (None: ``off``, or no usable cache folder)."""
    env = os.environ.get(CHOICES_ENV, "").strip()
    if env.lower() in ("off", "0", "none"):
        return None
    if env:
        return Path(env)
    try:
        return files.cache_dir() / CHOICES_FILE
    except files.FolderError:
        return None


def _doc(path: Path) -> dict:
    """The file's choices ({key: name}), read once per process and path."""
    if _STATE["file"] == path and _STATE["doc"] is not None:
        return _STATE["doc"]
    doc = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if not (isinstance(data, dict) and isinstance(data.get("choices"), dict)):
                raise ValueError("no 'choices' object")
            doc = {k: v for k, v in data["choices"].items() if isinstance(k, str) and isinstance(v, str)}
        except (OSError, ValueError) as err:
            if not _STATE["warned"]:
                warnings.warn(f"gemm_ladder: the remembered kernel choices in {path} cannot be read ({err}); "
                              f"they are measured again and the file rewritten (set {CHOICES_ENV}=off to keep "
                              "choices in the process only)", RuntimeWarning, stacklevel=3)
                _STATE["warned"] = True
    _STATE.update(file=path, doc=doc)
    return doc


def key_of(gpu: str, M: int, candidates: dict) -> str:
    """A choice's key: the GPU's name, M and the candidates (name -> sha256 or ``torch``), sorted."""
    return "|".join([gpu, f"M={M}", *sorted(candidates.values())])


def remembered(key: str, candidates: dict) -> tuple[str, str] | None:
    """The remembered winners' names among ``candidates`` (name -> sha256): (for eager calls,
    under CUDA-graph capture), or None."""
    path = choices_path()
    if path is None:
        return None
    with _LOCK:
        value = _doc(path).get(key, "")
    shas = value.split(",")
    names = [next((name for name, s in candidates.items() if s == sha), None) for sha in shas]
    if len(names) != 2 or None in names:
        return None
    return names[0], names[1]


def remember(key: str, eager: str, graphs: str) -> None:
    """Keep ``key`` -> the winners' sha256 (eager, under capture) in the file (best effort: a file
    that cannot be written leaves the choice in the process)."""
    path = choices_path()
    if path is None:
        return
    with _LOCK:
        doc = dict(_doc(path))
        doc[key] = f"{eager},{graphs}"
        try:
            files.write_json(path, {"format": "gemm_ladder.choices", "version": 1, "choices": doc})
        except OSError:
            return
        _STATE.update(file=path, doc=doc)


def can_measure(a) -> bool:
    """Whether a call on ``a`` can be timed now: on a GPU, outside CUDA-graph capture."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    return a.is_cuda and not torch.cuda.is_current_stream_capturing()


def time_launches(launches: dict, rounds: int = ROUNDS) -> dict:
    """Median microseconds per launch of each of ``launches`` (name -> a function of no arguments
    that queues one call), in rounds whose order rotates, on the current stream."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    names = list(launches)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rough = {}
    for n in names:  # the warm-up, then one timed launch: how many make a sample
        launches[n]()
        start.record()
        launches[n]()
        end.record()
        end.synchronize()
        rough[n] = max(start.elapsed_time(end) * 1e3, 1.0)
    reps = {n: max(1, min(MAX_REPS, int(SAMPLE_US / rough[n]) + 1)) for n in names}
    samples: dict = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(r + i) % len(names)]
            start.record()
            for _ in range(reps[n]):
                launches[n]()
            end.record()
            end.synchronize()
            samples[n].append(start.elapsed_time(end) * 1e3 / reps[n])
    return {n: statistics.median(s) for n, s in samples.items()}


def time_graphs(launches: dict, queued_us: dict, rounds: int = ROUNDS) -> dict:
    """Median microseconds per launch of each of ``launches`` as a kernel alone: a CUDA graph of
    as many launches as make a sample (``queued_us``: their queued times), replayed in rounds whose
    order rotates. A candidate that cannot be captured is left out (an empty dict: none could)."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    graphs, reps = {}, {}
    for n, fn in launches.items():
        reps[n] = max(1, min(MAX_REPS, int(SAMPLE_US / max(queued_us.get(n, SAMPLE_US), 1.0)) + 1))
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                for _ in range(reps[n]):
                    fn()
        except RuntimeError:
            continue
        graphs[n] = g
    names = list(graphs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples: dict = {n: [] for n in names}
    for n in names:
        graphs[n].replay()  # warm-up
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(r + i) % len(names)]
            start.record()
            graphs[n].replay()
            end.record()
            end.synchronize()
            samples[n].append(start.elapsed_time(end) * 1e3 / reps[n])
    return {n: statistics.median(s) for n, s in samples.items()}


def pick(times: dict) -> str:
    """The fastest of ``times`` (name -> us); torch only where it beats our best by TORCH_MARGIN."""
    ours = {n: t for n, t in times.items() if n != TORCH}
    best = min(ours, key=ours.get) if ours else TORCH
    if TORCH in times and (not ours or times[TORCH] * TORCH_MARGIN < ours[best]):
        return TORCH
    return best
