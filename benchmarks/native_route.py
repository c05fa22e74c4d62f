"""The C++ call lookup against the Python one on torch's route (issue 30's call floor), GPU box.

Where torch's kernel is the front door's choice (measured faster at first use, or the fallback
where no pack serves a shape), a repeated ``gemm_ladder.matmul(A, W, out=D)`` costs ``F.linear``
plus the front door's lookup. This times, per shape, in alternating rounds in one process:
``F.linear(a, b)`` (what a model calls), ``F.linear(a, b, out=d)``, and the front door's call with
``out`` and without it, once through the Python lookup (``front.use_native(False)``) and once
through the C++ table (``serve.native``, built first), each as bursts of queued calls over input
sets that spill L2 (``suite.burst_samples``, the every-model suite's call timing), and each call's
host time alone. No pack is loaded: every shape takes torch's route (the runtime-only fallback).

    python3 benchmarks/native_route.py --out native_route.json      # GPU box, after `python -m gemm_ladder native`
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_ladder.measure import harness, suite  # noqa: E402
from gemm_ladder.serve import first_use, front, native  # noqa: E402
from gemm_ladder.core import files  # noqa: E402

# the held-out calls below 0.97 in 2026-11-26_h100_every_model/9_checkout_code/ (torch's route, host-bound),
# a tuned one, and two not in that sample
SHAPES = ((1024, 3072, 1024, "float16"), (333, 1280, 5120, "float16"), (1024, 5120, 1280, "float16"),
          (16, 4544, 4544, "float16"), (333, 4096, 4096, "bfloat16"), (64, 2048, 2048, "bfloat16"),
          (1, 18176, 4544, "float16"), (4, 896, 896, "bfloat16"))
ROUNDS = 8


def host_us(fn, sets, calls: int = 200) -> float:
    """Host time of one call (no sync inside the loop), the least of 3 runs."""
    import torch

    best = math.inf
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(calls):
            fn(*sets[j % len(sets)])
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def case(M: int, N: int, K: int, dtype: str) -> dict:
    import torch
    import torch.nn.functional as F

    dt = getattr(torch, dtype)
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
    d = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
    sets = first_use.input_sets(a, b, d, torch.cuda.get_device_properties(0).L2_cache_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        front.matmul(a, b, out=d)  # checked once: torch's route remembered
    torch.cuda.synchronize()
    ok = bool(torch.equal(d, F.linear(a, b)))

    def ours(x, y, z):
        front.matmul(x, y, out=z)

    def ours_new(x, y, z):
        front.matmul(x, y)

    ways = {"linear": lambda x, y, z: F.linear(x, y), "linear_out": lambda x, y, z: F.linear(x, y, None, out=z),
            "python_out": ours, "cpp_out": ours, "python": ours_new, "cpp": ours_new}

    def select(name):
        front.use_native(name.startswith("cpp"))
        fn = ways[name]
        fn(*sets[0])  # registers the call in the table it now goes through
        return fn

    for name in ways:
        select(name)
        suite.burst_samples(ways[name], sets, 1, 3, 0)
    rough = statistics.median(suite.burst_samples(ways["linear"], sets, 1, 5, 0)) * 1e3
    burst = max(1, min(64, math.ceil(suite.BURST_US / max(rough, 1e-3))))
    times = {n: [] for n in ways}
    host = {n: [] for n in ways}
    for r in range(ROUNDS):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            fn = select(name)
            times[name] += suite.burst_samples(fn, sets, burst, 3, r)
            host[name].append(host_us(fn, sets))
    front.use_native(True)
    us = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    hus = {n: statistics.median(v) for n, v in host.items()}
    with torch.no_grad():
        front.matmul(a, b, out=d)
    torch.cuda.synchronize()
    ok = ok and bool(torch.equal(d, F.linear(a, b)))
    return {"M": M, "N": N, "K": K, "dtype": dtype, "correct": ok, "burst": burst, "call_us": us, "host_us": hus,
            "call_ratio_python": us["linear"] / us["python_out"], "call_ratio_cpp": us["linear"] / us["cpp_out"],
            "call_ratio_python_no_out": us["linear"] / us["python"], "call_ratio_cpp_no_out": us["linear"] / us["cpp"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    path = native.build()
    front.use_native(True)
    if native.table() is None:
        print(f"the C++ table did not load: {native.error()}", file=sys.stderr)
        return 1
    rows = []
    for M, N, K, dtype in SHAPES:
        row = case(M, N, K, dtype)
        rows.append(row)
        c, h = row["call_us"], row["host_us"]
        print(f"{M}x{N}x{K} {dtype}: correct={row['correct']} call us " + " ".join(f"{n} {v:.1f}" for n, v in c.items())
              + " | host us " + " ".join(f"{n} {v:.1f}" for n, v in h.items())
              + f" | ratio to F.linear: python {row['call_ratio_python']:.3f} cpp {row['call_ratio_cpp']:.3f}",
              flush=True)
    doc = {"gpu": harness.gpu_info(), **harness.run_info(), "library": str(path), "rounds": ROUNDS,
           "method": __doc__, "rows": rows,
           "summary": {k: math.exp(statistics.fmean(math.log(r[k]) for r in rows))
                       for k in ("call_ratio_python", "call_ratio_cpp", "call_ratio_python_no_out",
                                 "call_ratio_cpp_no_out")} | {
               "least_cpp": min(r["call_ratio_cpp"] for r in rows),
               "least_python": min(r["call_ratio_python"] for r in rows)}}
    files.write_record(Path(args.out), doc)
    print(json.dumps(doc["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
