"""A split N's call (issue 30's call floor) on a GPU: GPT-2's LM head (50257 x 768, N not a multiple
of 8) at small M, where ``gemm_ladder.matmul(A, W, out=D)`` runs our kernel on the weight's first
50256 rows into a kept D, torch's matmul for the last row, and a ``torch.cat`` into D
(``front.PaddedLaunch._split``). At these M the call is bound by the host: its kernel takes ~28 us
and the every-model suite's calls took 45-134 us from one process to the next
(``benchmarks/results/2026-11-29_h200_every_model_copies_pick/``).

Per case, in one child process with a deadline (``isolate``), after the case's checked first call
(``suite.checked_case``: random inputs, D poisoned, a float64 reference), four ways to make the same
call take turns in rounds, bursts of three queued calls between CUDA events, cycling input sets that
spill L2 (as the every-model suite times calls):

- ``now``: the front door as it is: the kernel and torch's matmul replayed as one CUDA graph per
  weight on a kept copy of A, then a ``torch.cat`` into D (``PaddedLaunch._split``);
- ``no_graph``: the same launched one by one, the tail by :func:`front.split_tail` (the C++ table's
  where it is loaded);
- ``before``: no graph, and the tail as it was before, ``torch.cat((D_main, torch.mm(A, W[Nk:].t())),
  out=D)``;
- ``linear``: ``F.linear(A, W)``, what the call replaces.

Each row also has each way's host time per call (``host_us``: 30 calls queued, no synchronisation
between them, the GPU idle at the start), the CPU the child ran on, and each way's ratio to
``F.linear`` (``linear``'s time over that way's). Every trial is a fresh child; ``--trials`` of them.
The front door runs strict (``GEMM_LADDER_STRICT=1``): our kernel, not a first-use switch to torch.

    GEMM_LADDER_PACK=build/em_s4/bfloat16 python3 benchmarks/split_n_check.py --out split_n.json   # GPU box
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from gemm_ladder.core import files
from gemm_ladder.measure import harness, isolate, suite

WAYS = ("now", "no_graph", "before", "linear")
BURST = 3
ROUNDS = 8
PER_ROUND = 6
CASES = tuple(f"bfloat16-{M}x50257x768" for M in (1, 7, 16, 32, 48))  # suite.parse_id's form


def _cpu() -> int:
    """The CPU this process runs on now (``/proc/self/stat``'s 39th field)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _step_host_us(front, sets, Nk: int) -> dict:
    """Host us per call of each step of the split path (``harness.host_us``), from the remembered
    call's own launch (``front._FAST``) down to each torch call."""
    import torch  # pylint: disable=import-outside-toplevel

    a0, b0, o0 = sets[0]
    hit = front._FAST.get(front._fast_key(a0, b0, o0))  # pylint: disable=protected-access
    if hit is None:
        return {"remembered": 0.0}
    route, launch = hit[0], hit[1]
    kept = next(iter(launch.scratch.values()), None) if hasattr(launch, "scratch") else None
    if kept is None or len(kept) != 5:
        return {"remembered": 1.0}
    _, d_main, tail, a_in, graphs = kept
    graph = next(iter(graphs.values()))[2] if graphs else None
    steps = {
        "run_hit": lambda a, b, o: front._run_hit(hit, a, b, o, None),  # pylint: disable=protected-access
        "padded_launch": lambda a, b, o: launch(a, b, o),
        "copy_a": lambda a, b, o: a_in.copy_(a),
        "replay": (lambda a, b, o: graph.replay()) if graph is not None else None,
        "cat": lambda a, b, o: torch.cat((d_main, tail), dim=1, out=o),
        "kernel": lambda a, b, o: route.run(a, b[:Nk], d_main),
        "tail": lambda a, b, o: front.split_tail(a, b, d_main, tail, o),
        "mm": lambda a, b, o: torch.mm(a, b[Nk:].t(), out=tail),
        "slice": lambda a, b, o: b[:Nk],
    }
    steps = {k: v for k, v in steps.items() if v is not None}
    return {name: harness.host_us(fn, sets, 30) for name, fn in steps.items()}


def _profile(fn, sets, calls: int = 300) -> list:
    """cProfile's top functions (own time) over ``calls`` calls: where the host's time goes."""
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel

    import torch  # pylint: disable=import-outside-toplevel

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for j in range(calls):
        fn(*sets[j % len(sets)])
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:14]
    return [{"function": f"{k[0].rsplit('/', 1)[-1]}:{k[1]}({k[2]})", "calls": v[1],
             "own_us_per_call": v[2] / calls * 1e6, "total_us_per_call": v[3] / calls * 1e6} for k, v in rows]


def time_case(case_id: str, args) -> dict:
    """The child's job: check the case, then time the four ways in rounds (module docstring)."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    from gemm_ladder.serve import front  # pylint: disable=import-outside-toplevel

    M, N, K, dtype, base, sets = suite.checked_case(case_id)
    if sets is None:
        return {"status": "wrong", **base}
    Nk = N - N % 8
    now_tail, now_graph = front.split_tail, front.PaddedLaunch._split_graph  # pylint: disable=protected-access

    def before_tail(a, b, d_main, tail, d):  # the tail before split_tail: a new tensor and a cat
        torch.cat((d_main, torch.mm(a, b[Nk:].t())), dim=1, out=d)

    def without_graph(tail_fn):
        def call(a, b, o):
            front.split_tail, front.PaddedLaunch._split_graph = tail_fn, lambda *_: None
            try:
                front.matmul(a, b, out=o)
            finally:
                front.split_tail, front.PaddedLaunch._split_graph = now_tail, now_graph
        return call

    ways = {"now": lambda a, b, o: front.matmul(a, b, out=o), "no_graph": without_graph(now_tail),
            "before": without_graph(before_tail), "linear": lambda a, b, o: F.linear(a, b)}
    for name, fn in ways.items():  # each way once, checked: D poisoned, against a float64 reference
        a, b, o = sets[0]
        if name != "linear":
            o.fill_(float("nan"))
            fn(a, b, o)
            torch.cuda.synchronize()
            check = suite.check_case(a, b, o, dtype)
            if not check["ok"]:
                return {"status": "wrong", **base, "way": name, "way_check": check}
        suite.burst_samples(fn, sets, 1, 5, 0)
    samples = {name: [] for name in ways}
    order = list(ways)
    for r in range(ROUNDS):
        turn = order[r % len(order):] + order[:r % len(order)]
        if r % 2:
            turn.reverse()
        for name in turn:
            samples[name] += suite.burst_samples(ways[name], sets, BURST, PER_ROUND, r)
    ms = {name: statistics.median(v) for name, v in samples.items()}
    host = {name: harness.host_us(fn, sets, 30) for name, fn in ways.items()}
    steps = _step_host_us(front, sets, Nk)
    native_loaded = getattr(front._NATIVE["module"], "split_tail", None) is not None  # pylint: disable=protected-access
    return {"status": "ok", **base, "M": M, "N": N, "K": K, "dtype": dtype, "cpu": _cpu(),
            "native_tail": native_loaded, "call_ms": ms, "host_us": host, "step_host_us": steps,
            "profile": _profile(ways["now"], sets),
            "ratio_to_linear": {name: ms["linear"] / v for name, v in ms.items() if name != "linear"},
            "input_sets": len(sets), "burst": BURST, "samples": ROUNDS * PER_ROUND}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the result file (JSON)")
    p.add_argument("--trials", type=int, default=3, help="fresh child processes, each timing every case")
    a = p.parse_args(argv)
    if not os.environ.get("GEMM_LADDER_PACK"):
        print("set GEMM_LADDER_PACK to a pack holding a 50256x768 bfloat16 module (every_model pack --seed 4)",
              file=sys.stderr)
        return 2
    os.environ["GEMM_LADDER_STRICT"] = "1"
    rows = []
    for trial in range(a.trials):
        for row, case in zip(isolate.run_batch("benchmarks.split_n_check:time_case", CASES, timeout=240), CASES):
            row.update(case=case, trial=trial)
            rows.append(row)
            if row.get("status") == "ok":
                r = row["ratio_to_linear"]
                print(f"trial {trial} {case:24s} cpu {row['cpu']:3d} native {row['native_tail']!s:5s} "
                      + " ".join(f"{k} {row['call_ms'][k] * 1e3:6.1f} us ({r.get(k, 1.0):.3f}, host "
                                 f"{row['host_us'][k]:5.1f})" for k in WAYS), flush=True)
                print("    host us by step: " + " ".join(f"{k} {v:.1f}" for k, v in row["step_host_us"].items()))
                print("    profile: " + "; ".join(f"{p['function']} {p['own_us_per_call']:.1f}/{p['total_us_per_call']:.1f}"
                                            for p in row["profile"][:10]))
            else:
                print(f"trial {trial} {case}: {row.get('status')} {row.get('way', '')} {row.get('error', '')}",
                      flush=True)
    files.write_record(a.out, {"format": "gemm_ladder.split_n_check", "gpu": harness.gpu_info(0),
                               **harness.run_info(), "ways": list(WAYS), "rows": rows})
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
