"""Several modules of one shape and cuBLAS taking turns in the same rounds, at the power limit.

``harness.time_module`` times one module against cuBLAS. On a GPU held at its power limit the
clock drifts by several percent from one module's turn to the next, and a short pass on a cool
GPU reads far faster than the same kernel at its steady clock (v9 at 4096^3: 8-10% ahead of
cuBLAS in short bursts, about 2% ahead at the limit; ``benchmarks/results/2026-11-23_h100_4096_energy/``).
Two modules timed one after the other are thus compared through two different cuBLAS medians.
Here every module of a group and cuBLAS take turns in the same rounds:

- ``randn`` inputs, enough input sets to spill L2 three times (a scaled fp8 group: fp8 inputs with
  their scales, and ``torch._scaled_mm`` in cuBLAS's place: ``harness.fp8_workload``);
- a warm-up of ``warm`` seconds of back-to-back launches of all of them, so the GPU is at its
  power limit before the first timed round;
- ``rounds`` rounds, each one a burst of ``per_round`` CUDA-event-timed launches of every kernel,
  the order rotating from round to round (each kernel in each position, both ways).

Per module: the median time over all launches, TFLOPS, the ratio to cuBLAS and to the group's
first module, and the quartiles of the per-round ratios (each taken between launches a few
milliseconds apart).

Used by the tuner's second pass (``tune --measure``, :func:`gemm_ladder.tune.measuring.confirm`:
the best candidates of the first pass, timed again together) through :func:`group_job`, the
``rounds`` job of :mod:`gemm_ladder.measure.isolate`, and by ``benchmarks/ab_rounds.py``.
"""

from __future__ import annotations

import statistics
import time

from ..serve.runtime import load
from . import harness

ROUNDS, PER_ROUND, WARM_S = 40, 10, 2.0  # the tuner's second pass: about 2 s of warm-up, 400 launches each


def quartiles(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return [round(v, 4) for v in q]


def check_group(mods) -> None:
    """One shape, dtype and operand spec for the whole group, or a ValueError that names the odd one."""
    first = mods[0]
    for m in mods[1:]:
        if (m.M, m.N, m.K, m.dtype, getattr(m, "spec", None)) != (first.M, first.N, first.K, first.dtype,
                                                                  getattr(first, "spec", None)):
            raise ValueError(f"module {m.M}x{m.N}x{m.K} {m.dtype} ({getattr(m, 'spec', None)}) differs from the "
                             f"group's first ({first.M}x{first.N}x{first.K} {first.dtype}, "
                             f"{getattr(first, 'spec', None)}): time one shape, dtype and spec per group")


def time_rounds(mods, rounds: int = ROUNDS, per_round: int = PER_ROUND, warm: float = WARM_S,
                timer: str = "queued") -> dict:
    """Time ``mods`` (loaded, checked modules of one shape and dtype) and cuBLAS in the same rounds.
    ``timer="graph"``: each burst is a CUDA-graph replay of the modules' bound launches (``launcher``), as
    ``harness.time_module``'s graph timer: the kernels alone, no host path between them (a watchdog build
    cannot be captured: ``ValueError``).

    Returns ``cublas_ms``, ``cublas_tflops``, ``input_sets``, the wall-clock span of the timed
    rounds (``t0``, ``t1``: for a clock sampler) and ``rows``, one per module in order: ``ms``,
    ``tflops``, ``ratio_to_cublas``, ``round_ratio_to_cublas_quartiles`` and, past the first,
    ``ratio_to_first`` with its ``round_ratio_to_first_quartiles``.
    """
    import torch  # pylint: disable=import-outside-toplevel

    if not mods:
        raise ValueError("time_rounds needs at least one module")
    if timer not in harness.TIMERS:
        raise ValueError(f"timer={timer!r}: use one of {', '.join(harness.TIMERS)}")
    if timer == "graph" and any(m.manifest.get("watchdog") for m in mods):
        raise ValueError("a watchdog build cannot be timed in a CUDA graph: use timer='queued'")
    if rounds < 1 or per_round < 1 or warm < 0:
        raise ValueError(f"rounds={rounds}, per_round={per_round}, warm={warm}: rounds and per_round must be "
                         "at least 1, warm at least 0")
    check_group(mods)
    first = mods[0]
    operands = {}
    if harness.is_scaled(getattr(first, "spec", None)):  # fp8: torch._scaled_mm in cuBLAS's place
        sets, operands, cublas, _ = harness.fp8_workload(first, seed=2000)
    else:
        sets = harness.input_sets(first.M, first.N, first.K, first.dtype, seed=2000)

        def cublas(a, b, o):
            torch.matmul(a, b.T, out=o)
    n_sets = len(sets)

    def ours(m):
        if timer == "graph":  # the checked call once, then the bound launch the graph replays
            m(*sets[0][:2], out=sets[0][2], **operands)
            launch = m.launcher(*sets[0], **operands)
            return lambda a, b, o: launch(a, b, o, *operands.values())
        return lambda a, b, o: m(a, b, out=o, **operands)

    def burst(fn, n, start=0):
        return harness.graph_times(fn, sets, n) if timer == "graph" else harness.event_times(fn, sets, n, start=start)

    kernels = [cublas] + [ours(m) for m in mods]  # index 0: cuBLAS, i + 1: mods[i]
    t_end = time.time() + warm
    while time.time() < t_end:
        for fn in kernels:
            burst(fn, per_round)
    times: list[list[float]] = [[] for _ in kernels]
    round_ms: list[list[float]] = [[] for _ in kernels]
    # every kernel in every position, forwards and backwards (not every permutation: 9 kernels
    # have 362880)
    n = len(kernels)
    orders = [[(r + i) % n for i in range(n)] for r in range(n)]
    orders += [o[::-1] for o in orders]
    t0 = time.time()
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            ts = burst(kernels[i], per_round, start=r * per_round)
            times[i] += ts
            round_ms[i].append(statistics.median(ts))
    t1 = time.time()
    flops = 2.0 * first.M * first.N * first.K
    cub = statistics.median(times[0])
    rows = []
    for i in range(1, n):
        ms = statistics.median(times[i])
        row = {"ms": ms, "tflops": flops / ms / 1e9, "cublas_tflops": flops / cub / 1e9, "ratio_to_cublas": cub / ms,
               "round_ratio_to_cublas_quartiles": quartiles([a / b for a, b in zip(round_ms[0], round_ms[i])])}
        if i > 1:
            row["ratio_to_first"] = statistics.median(times[1]) / ms
            row["round_ratio_to_first_quartiles"] = quartiles([a / b for a, b in zip(round_ms[1], round_ms[i])])
        rows.append(row)
    return {"rounds": rounds, "per_round": per_round, "warm_s": warm, "timer": timer, "input_sets": n_sets,
            "cublas_ms": cub,
            "cublas_tflops": flops / cub / 1e9, "t0": t0, "t1": t1, "rows": rows}


def group_job(paths, args) -> list[dict]:
    """The ``rounds`` job of :mod:`gemm_ladder.measure.isolate`: load the modules, check each (output
    poisoned, randn inputs), time the correct ones together (:func:`time_rounds`; ``args``:
    rounds, per round, warm-up seconds, and optionally the timer). One result per path, in order: ``ok``
    with the timing, or ``wrong`` with the check."""

    if args and len(args) not in (3, 4):
        raise ValueError(f"the rounds job takes rounds, per round and warm-up seconds, and optionally the timer "
                         f"(e.g. --args {ROUNDS},{PER_ROUND},{WARM_S},graph), or none for those; got "
                         f"{','.join(map(str, args))}")
    rounds, per_round, warm = (int(args[0]), int(args[1]), float(args[2])) if args else (ROUNDS, PER_ROUND, WARM_S)
    timer = str(args[3]) if len(args) == 4 else "queued"
    mods = [load(p) for p in paths]
    check_group(mods)
    checks = [harness.check(m, seed=7) for m in mods]
    good = [i for i, c in enumerate(checks) if c.ok]
    out = [{"status": "wrong", **c.as_dict()} for c in checks]
    if good:
        timed = time_rounds([mods[i] for i in good], rounds, per_round, warm, timer)
        meta = {k: timed[k] for k in ("rounds", "per_round", "warm_s", "timer", "cublas_ms")}
        for i, row in zip(good, timed["rows"]):
            out[i] = {"status": "ok", **row, "rel_err": checks[i].rel_err, "rounds_method": meta}
    return out
