"""The measured choice at first use: of the kernels that can serve a call, the one this GPU runs fastest.

A whole-range kernel pack holds the modules the policy chose at the edges of its M buckets; inside
a bucket the count of waves changes, and the module chosen at the edge ran at 0.76-0.89x of the
pack's best at five of 84 M tested (benchmarks/results/2026-11-26_h100_m_range/). So, as Triton's
and TileLang's autotuners do, the first call of a shape (M, weight, operand spec) on a GPU times
each candidate on the caller's own A and B, and the winner is remembered:

- the candidates: every module of the packs that serves this M and the call's operand spec (its
  epilogue: bias, activation, alpha, residual, a float32 D) as it is (a runtime-M module whose
  32-bit indices take M, a module built for this M: ``KernelPack.serving``), at most
  :data:`MAX_CANDIDATES`, the pack's choice first (``KernelPack.find``), then the alternatives a
  pack holds beside it (``plan.alternatives``: small-tile and split-K modules where the choice
  leaves most SMs idle, ``"alternative": true`` in ``pack.json``), then the rest nearest first to the M their
  knobs were chosen at; ``explain`` says when an alternative won; and, unless strict,
  torch's own matmul (cuBLAS; with an epilogue, torch's best unfused path: F.linear, then the
  activation, then + beta C, as its repeated call runs it): where it measures faster than every
  kernel of ours, torch computes the shape (the front door is never slower than the library it
  replaces) and ``explain`` says so;
- the timing, twice: as queued launches on the current stream as a caller makes them (host path
  included), and as kernels alone (a CUDA graph of the same launches, replayed: what a model served
  with CUDA graphs sees), into a scratch output, between CUDA events; :data:`ROUNDS` rounds whose
  order rotates, each sample a batch of launches of at least :data:`SAMPLE_US`; the least of the
  rounds (interference -- a clock that dropped while the host was the bottleneck, another thread --
  only adds time, and it came in bursts that the median did not reject: torch's queued calls timed
  1.5-4x their undisturbed time for a whole helper-thread measurement, ours 1.0x, and first use kept
  a kernel of ours 1.3x slower than torch's call: ``benchmarks/torch_route_probe.py``,
  ``benchmarks/results/2026-11-26_h100_every_model/6_three_seeds_copy_bw/``). Each candidate is
  warmed by :data:`WARM_MS` of its own calls first (an idle GPU's clocks, and its host path).
  Eager calls take the queued winner, calls inside CUDA-graph capture the kernel winner
  (``front.ByCapture`` where they differ: ours has the shorter host path, cuBLAS's kernel may be
  the faster). It costs each new shape some tens of milliseconds (an lm_head at M = 8192: ~0.3 s);
- nothing is measured inside CUDA-graph capture (the pack's own choice serves; a later eager call
  of the shape measures), nor with ``GEMM_LADDER_MEASURE=0``;
- remembered: in the process (the route), and in a small JSON file (``$GEMM_LADDER_CHOICES``,
  default ``<cache>/choices.json``; ``off``: the process only), keyed on the GPU's name, the
  candidates' sha256, M and the spec of an epilogue past a bias, both winners, so a new process
  skips the timing and a rebuilt pack is timed again.
  An unreadable file is warned about once and rewritten.

Written here, not taken from a library: Triton's autotuner times Triton kernels it compiles and
TileLang's its own; neither chooses among loaded modules and torch, nor keeps choices per pack.

This module imports torch on use (the caller's) and nothing of TVM.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path

from ..core import files

MEASURE_ENV = "GEMM_LADDER_MEASURE"  # "0": the pack's (policy's) choice, nothing timed
CHOICES_ENV = "GEMM_LADDER_CHOICES"  # the file of remembered choices; "off": the process only
CHOICES_FILE = "choices.json"
MAX_CANDIDATES = 4  # kernels of ours timed (plus torch): the choice and up to plan.ALT_MAX alternatives fit
ROUNDS = 5
# calls of each candidate before the timing: an idle GPU's clocks come up (they start at a few hundred MHz), and so does
# each candidate's host path. Warmed by the first candidate's calls alone, torch's call (cuBLAS's, F.linear(out=)) was
# timed at 19.0-27.5 us queued against the 15.9-16.3 it took in the same process afterwards (H200, 128x4096x4096 bf16,
# three fresh processes), and first use kept a module of ours whose call ran 0.91x F.linear
# (benchmarks/results/2026-11-28_h200_every_model_mid/: seed 4's 128x4096x4096)
WARM_MS = 10.0
SAMPLE_US = 200.0  # each timed sample: launches adding up to at least this (a one-launch sample is noise)
MAX_REPS = 100
MAX_SETS = 8  # input sets cycled through while timing (enough to spill L2 for all but tiny shapes)
# torch must beat our best by this much as queued calls to take a shape outright (within it, the
# kernels decide: QUEUED_CLEAR)
TORCH_MARGIN = 1.02
# a call that takes copies on the way (a padded N or K, a misaligned operand: front.launch_route)
# keeps ours only where it is this much faster than torch's: that path's host side (staging D, the
# weight's padded copy looked up, D copied out) cost 52-60 us a call against F.linear's 36 at GPT-2's
# LM head at M = 1, where first use had timed it level with torch (36.7 against 36.0 us) and kept it
# [benchmarks/results/2026-11-26_h100_every_model/9_checkout_code/: padded_probe_*.txt, and the run it cites]
COPIES_EDGE = 1.10
# ours this much faster as queued calls takes a plain call whatever the kernels measured (a host-bound
# shape: our launch is the shorter there); within it, a near tie, the kernels alone decide, since torch's
# repeated call now costs the host what F.linear(out=) does (front's C++ table), not more than ours.
# At 9a5a836-651be48 first use kept v9/v11 at 1-8% ahead as queued calls where cuBLAS's kernel was 2-9%
# faster in graphs, and those calls ran at 0.906-0.966x F.linear
# [benchmarks/results/2026-11-27_h100_every_model_native/2_padded_launch/: vit-h-14 1024x5120x1280,
# falcon-7b 1x18176x4544, llama-3.1-8b 512x4096x4096]
QUEUED_CLEAR = 1.10
# and between two kernels of ours: GPT-2's LM head at M = 7 (odd N: the copies' path) took v9's 128x256 tiles at 44.6
# against v11's 46.3 us as queued calls, a tie of host-bound launches, where v11's kernel ran 25.8 us in graphs to
# v9's 35.2; the call then ran 0.64x F.linear, against 1.04x in the run before where v11 had come out 4% ahead
# [benchmarks/results/2026-11-29_h200_every_model_swap64/: seed 1]
# a call with copies on the way (a padded or split N or K) runs every module of ours through the same copies and
# host path, so their queued times differ by the noise of a host-bound launch: GPT-2's LM head at M = 7 timed v9's
# 128x256 tiles 56.2 us, torch 62.2 and v11's 8-row tiles 65.4 as queued calls (v11 41.9-51.1 at M = 16 and 48), and
# v11 25.8, v9 42.6 and torch 54.8 as kernels; v9 was kept and the call ran 71.0 us against F.linear's 60.1
# (benchmarks/results/2026-11-29_h200_every_model_narrow_n/: seed 1). There the fastest kernel of ours is taken,
# and its call is taken to cost the least queued time of ours: the same head at M = 7 then went to torch, 0.993x
# (benchmarks/results/2026-11-29_h200_every_model_copies_pick/)
COPIES_SHARED = "benchmarks/results/2026-11-29_h200_every_model_narrow_n/README.md"
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


def key_of(gpu: str, M: int, N: int, K: int, candidates: dict, spec: str | None = None) -> str:
    """A choice's key: the GPU's name, the call's shape (N and K as given: a padded shape shares
    its modules with others), the operand spec's text where the call has an epilogue past a bias
    (``spec``: a gelu call and a plain one of a shape time different work, and torch's candidate
    is ``torch`` in both) and the candidates (name -> sha256 or ``torch``), sorted."""
    return "|".join([gpu, f"{M}x{N}x{K}", *([spec] if spec else []), *sorted(candidates.values())])


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


def input_sets(a, b, d, l2_bytes: int, same_b: bool = False) -> list[tuple]:
    """``(a, b, d)`` and copies of them, as many as spill ``l2_bytes`` twice over (at most
    :data:`MAX_SETS`): timed on the caller's tensors alone, a kernel whose inputs stay in L2 would
    look faster than it runs in a model (each layer's weight read once a pass). ``same_b``: one B
    for all (its padded copy is cached per tensor: copies of it would each leave one behind)."""
    size = a.nbytes + d.nbytes + (0 if same_b else b.nbytes)
    n = max(1, min(MAX_SETS, -(-2 * l2_bytes // max(size, 1))))
    return [(a, b, d)] + [(a.clone(), b if same_b else b.clone(), d.clone()) for _ in range(n - 1)]


def _rough(call, sets) -> float:
    """Microseconds of one call (after one as warm-up)."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call(*sets[0])
    start.record()
    call(*sets[-1])
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) * 1e3, 1.0)


def _reps(us: float, n_sets: int) -> int:
    """Calls a sample makes: at least :data:`SAMPLE_US` of them and every input set once."""
    return max(n_sets, min(MAX_REPS, int(SAMPLE_US / us) + 1))


def _rounds(samplers: dict, rounds: int) -> dict:
    """Microseconds per call of each of ``samplers`` (name -> a function that runs one sample and
    returns its microseconds per call), the least of ``rounds`` rounds whose order rotates: each
    candidate's least disturbed sample (see the module docstring)."""
    names = list(samplers)
    samples: dict = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(r + i) % len(names)]
            samples[n].append(samplers[n]())
    return {n: min(s) for n, s in samples.items()}


def time_launches(calls: dict, sets: list, rounds: int = ROUNDS) -> dict:
    """Microseconds per call (:func:`_rounds`) of each of ``calls`` (name -> a function of (a, b, d) that
    queues one call) as a caller queues them, cycling through ``sets``, on the current stream, in
    bursts of one length for every candidate."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for call in calls.values():  # the warm-up: WARM_MS of each candidate's calls, looked at every 16
        start.record()
        for n in range(4096):
            call(*sets[n % len(sets)])
            if n % 16 == 15:
                end.record()
                end.synchronize()
                if start.elapsed_time(end) >= WARM_MS:
                    break

    def sampler(call, reps):
        def sample():
            start.record()
            for i in range(reps):
                call(*sets[i % len(sets)])
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / reps
        return sample
    # one burst length for all, the fastest's (see time_graphs: the first call's latency, spread over
    # fewer calls, made the slower candidate look slower still)
    reps = max(_reps(_rough(c, sets), len(sets)) for c in calls.values())
    return _rounds({n: sampler(c, reps) for n, c in calls.items()}, rounds)


def time_graphs(calls: dict, sets: list, queued_us: dict, rounds: int = ROUNDS) -> dict:
    """Microseconds per call (:func:`_rounds`) of each of ``calls`` as kernels alone: a CUDA graph of as many
    calls as make a sample of the fastest (``queued_us``: their queued times), the same number for
    every candidate, cycling through ``sets``, replayed in rounds whose order rotates. A candidate
    that cannot be captured is left out.

    One count for all: a replay's own launch cost is spread over the calls of its graph, and with
    each candidate's own count (fewer calls for the slower queued call, often torch's) it was spread
    thinner for the faster one. At 11-13 us kernels that favoured ours by 3-4%: first use timed v11
    12.9 us against torch's 13.3 at phi-3-mini's 2x3072x3072, where the suite's graphs of 256 calls
    then timed 11.8 against 11.2 [every_model_seed3.json of commit e134d31's
    benchmarks/results/2026-11-26_h100_every_model/9_short_calls/, a run since removed: its front door
    was the runtime pack's older copy, whose first use timed candidates the same way]."""
    import torch  # pylint: disable=import-outside-toplevel  (the caller's)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samplers = {}
    reps = max((_reps(queued_us.get(n, SAMPLE_US), len(sets)) for n in calls), default=len(sets))
    for n, call in calls.items():
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                for i in range(reps):
                    call(*sets[i % len(sets)])
        except RuntimeError:
            continue
        g.replay()  # warm-up

        def sample(g=g, reps=reps):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / reps
        samplers[n] = sample
    return _rounds(samplers, rounds)


def measured_note(gpu: str, times: dict, kernel_times: dict, eager: str, graphs: str) -> str:
    """The explain line of a first use's timing: each candidate's microseconds as queued calls and as
    kernels in a CUDA graph (fastest first), and the winners."""
    def said(ts):
        return "; ".join(f"{label} {us:.1f} us" for label, us in sorted(ts.items(), key=lambda lt: lt[1]))
    return (f"measured at first use on {gpu} (least of {ROUNDS} rounds, input sets spilling L2): as queued calls "
            f"{said(times)}; as kernels in a CUDA graph {said(kernel_times) or 'not timed'}; chose {eager}"
            + (f", and {graphs} under capture" if graphs != eager else ""))


def pick(times: dict, copies: bool = False, graphs: bool = False, kernels: dict | None = None) -> str:
    """The fastest of ``times`` (name -> us); torch where it beats our best by TORCH_MARGIN, or,
    for a call with ``copies`` on the way, where our best is not COPIES_EDGE times faster. Of
    kernels timed in ``graphs`` (replayed, no host path to favour ours), the fastest outright.
    ``kernels`` (the same candidates timed in graphs, for an eager pick): of our candidates within
    QUEUED_CLEAR of our fastest as queued calls, the fastest kernel (a host-bound call times its
    launches, not its kernel); and for a plain call, where that one is not QUEUED_CLEAR times
    faster than torch as queued calls, torch unless it is no slower as a kernel too. A call with ``copies``
    takes the fastest of our kernels outright, against torch at our least queued time (COPIES_SHARED)."""
    ours = {n: t for n, t in times.items() if n != TORCH}
    best = min(ours, key=ours.get) if ours else TORCH
    call = ours.get(best)  # what our call is taken to cost, against torch's
    if kernels and not graphs and copies and any(n in kernels for n in ours):
        # every one of ours takes the same copies, the same host path: the faster kernel, whatever its queued
        # sample, at the least of our queued samples (COPIES_SHARED)
        best = min((n for n in ours if n in kernels), key=lambda n: (kernels[n], ours[n]))
    elif kernels and not graphs and best in kernels:  # ours within QUEUED_CLEAR of each other: the faster kernel
        near = [n for n in ours if n in kernels and ours[n] <= ours[best] * QUEUED_CLEAR]
        best = min(near, key=lambda n: (kernels[n], ours[n]))
        call = ours[best]
    margin = 1.0 if graphs else 1.0 / COPIES_EDGE if copies else TORCH_MARGIN
    if TORCH in times and (not ours or times[TORCH] * margin < call):
        return TORCH
    if (kernels and not graphs and not copies and TORCH in times and ours[best] * QUEUED_CLEAR > times[TORCH]
            and TORCH in kernels and best in kernels and kernels[best] > kernels[TORCH]):
        return TORCH
    return best
