"""Two or more modules of one shape against each other and cuBLAS, in many short rounds.

``python -m gemm_ladder bench`` times one module against cuBLAS; on a GPU held at its power
limit the clock drifts by several percent from one module's turn to the next, so two modules
timed in one bench call are compared through two different cuBLAS medians. Here every module
of a group and cuBLAS take turns in the same rounds:

- one process, runtime-only TVM and torch; ``randn`` inputs, enough input sets to spill L2;
- a warm-up of ``--warm`` seconds of back-to-back launches of all of them, so the GPU is at its
  power limit before the first timed round;
- ``--rounds`` rounds, each one a burst of ``--per-round`` CUDA-event-timed launches of every
  kernel, the order rotating from round to round (each kernel in each position, both ways);
- ``nvidia-smi`` samples the SM clock and the power every 20 ms (``power_probe.Sampler``).

Per kernel: the median time over all launches, TFLOPS and the ratio to cuBLAS; per module also
the ratio to the group's first module, and the quartiles of the per-round ratios (each taken
between launches a few milliseconds apart). Every module is checked first (``harness.check``,
output poisoned) and a failing one is not timed.

    python3 benchmarks/ab_rounds.py build/ab/v9_4096*_float16_*.so --out out/ab_4096_fp16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)

from gemm_ladder import device, harness  # noqa: E402
from gemm_ladder.runtime import load  # noqa: E402


def quartiles(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return [round(v, 4) for v in q]


def run_group(paths: list[Path], rounds: int, per_round: int, warm: float, sampler: Sampler) -> dict:
    mods = [load(p) for p in paths]
    first = mods[0]
    shape = (first.M, first.N, first.K)
    for p, m in zip(paths, mods):
        if (m.M, m.N, m.K, m.dtype) != (*shape, first.dtype):
            raise SystemExit(f"{p.name}: shape {m.M}x{m.N}x{m.K} {m.dtype} differs from the group's first "
                             f"module ({'x'.join(map(str, shape))} {first.dtype}); give one shape and dtype per call")
    checks = [harness.check(m) for m in mods]
    per_set = (first.M * first.K + first.N * first.K + first.M * first.N) * 2
    n_sets = max(1, min(8, -(-3 * device.probe(0).l2_bytes // per_set)))
    sets = []
    for i in range(n_sets):
        A, B = harness.random_inputs(first.M, first.N, first.K, first.dtype, seed=2000 + i)
        sets.append((A, B, torch.empty((first.M, first.N), dtype=A.dtype, device=A.device)))

    def ours(m):
        return lambda a, b, o: m(a, b, out=o)

    def cublas(a, b, o):
        torch.matmul(a, b.T, out=o)

    kernels = [("cublas", cublas)] + [(str(p), ours(m)) for p, m, c in zip(paths, mods, checks) if c.ok]
    t_end = time.time() + warm
    while time.time() < t_end:
        for _, fn in kernels:
            harness._event_times(fn, sets, per_round)  # pylint: disable=protected-access
    times = {name: [] for name, _ in kernels}
    round_ms = {name: [] for name, _ in kernels}
    # every kernel in every position, forwards and backwards (not every permutation: 9 kernels
    # have 362880)
    n = len(kernels)
    orders = [[(r + i) % n for i in range(n)] for r in range(n)]
    orders += [o[::-1] for o in orders]
    t0 = time.time()
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            name, fn = kernels[i]
            ts = harness._event_times(fn, sets, per_round, start=r * per_round)  # pylint: disable=protected-access
            times[name] += ts
            round_ms[name].append(statistics.median(ts))
    t1 = time.time()
    flops = 2.0 * first.M * first.N * first.K
    cub = statistics.median(times["cublas"])
    base = str(paths[0])
    rows = []
    for p, m, c in zip(paths, mods, checks):
        row = {"module": p.name, "path": str(p), "rung": m.rung, "shape": list(shape), "dtype": m.dtype,
               "knobs": m.knobs, "build_commit": m.manifest.get("commit"), "check": c.as_dict()}
        if c.ok:
            ms = statistics.median(times[str(p)])
            row.update({
                "status": "ok", "ms": ms, "tflops": flops / ms / 1e9, "ratio_to_cublas": cub / ms,
                "round_ratio_to_cublas_quartiles": quartiles(
                    [a / b for a, b in zip(round_ms["cublas"], round_ms[str(p)])]),
            })
            if str(p) != base and base in times:
                row["ratio_to_first"] = statistics.median(times[base]) / ms
                row["round_ratio_to_first_quartiles"] = quartiles(
                    [a / b for a, b in zip(round_ms[base], round_ms[str(p)])])
        else:
            row["status"] = "wrong"
        rows.append(row)
    return {"shape": list(shape), "dtype": first.dtype, "rounds": rounds, "per_round": per_round,
            "warm_s": warm, "input_sets": n_sets, "cublas_ms": cub, "cublas_tflops": flops / cub / 1e9,
            "clocks": sampler.between(t0, t1), "modules": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="modules of one shape and dtype; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--per-round", type=int, default=30)
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of warm-up launches")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.rounds < 1 or args.per_round < 1 or args.warm < 0:
        ap.error("--rounds and --per-round must be at least 1, --warm at least 0")
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        ap.error(f"no such module: {', '.join(missing)}")
    sampler = Sampler()
    try:
        group = run_group(args.paths, args.rounds, args.per_round, args.warm, sampler)
    finally:
        sampler.stop()
    report = {**harness.run_info(), "gpu": harness.gpu_info(), "method": __doc__.split("\n\n")[1], **group}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for row in group["modules"]:
        extra = (f"  x first {row['ratio_to_first']:.3f} (rounds {row['round_ratio_to_first_quartiles']})"
                 if "ratio_to_first" in row else "")
        label = f"{Path(row['path']).parent.name}/{row['module']}"
        print(f"{label[:120]:120s} {row['status']:5s} {row.get('tflops', 0):7.1f} TFLOPS "
              f"x cuBLAS {row.get('ratio_to_cublas', 0):.3f}{extra}")
    print(f"cuBLAS {group['cublas_tflops']:.1f} TFLOPS; clocks {group['clocks']}")


if __name__ == "__main__":
    main()
