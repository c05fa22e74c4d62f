"""Where a large GEMM's time goes on a power-capped GPU: the clock it runs at, and its tail.

For every module of the folders given, in one process (runtime-only TVM and torch):

- inputs drawn with ``randn`` (the tensor cores' operands toggle: full power) and all zeros
  (almost no toggling: the same instructions at a fraction of the power);
- bursts of ``short`` and ``long`` back-to-back launches, each burst after an idle pause, so a
  short burst starts on a cool GPU and a long one runs into the power limit; the module and
  cuBLAS (``torch.matmul`` on the same inputs) alternate burst by burst;
- ``nvidia-smi`` samples the SM clock and the power every 20 ms meanwhile; each burst records
  the mean of the samples taken inside it.

Each row has the median time per launch over the bursts, TFLOPS, the ratio to cuBLAS and the
clocks. Two readings come out of it: whether a shape's speed follows its clock (power-bound: the
long bursts, and randn against zeros, say by how much), and what a partial last wave costs, by
comparing shapes whose tile counts fill the GPU exactly with ones that leave SMs idle.

    python3 benchmarks/power_probe.py build/probe --out out/power_probe.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from gemm_ladder.measure import harness
from gemm_ladder.serve.runtime import load
from gemm_ladder.core import files


class Sampler:
    """``nvidia-smi`` in the background: (time, SM MHz, watts) every 20 ms."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        exe = shutil.which("nvidia-smi")
        self.proc = None
        if exe:
            self.proc = subprocess.Popen(
                [exe, "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"],
                stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), mhz, watts))

    def between(self, t0: float, t1: float) -> dict:
        inside = [(m, w) for t, m, w in self.samples if t0 <= t <= t1]
        if not inside:
            return {"sm_mhz": None, "watts": None, "samples": 0}
        return {"sm_mhz": round(statistics.mean(m for m, _ in inside)),
                "watts": round(statistics.mean(w for _, w in inside)), "samples": len(inside)}

    def stop(self):
        if self.proc:
            self.proc.terminate()


def burst(fn, n: int) -> float:
    """ms per launch over ``n`` back-to-back launches."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def measure(mod, inputs: str, n: int, rounds: int, pause: float, sampler: Sampler) -> dict:
    dt = getattr(torch, mod.dtype)
    if inputs == "randn":
        A, B = harness.random_inputs(mod.M, mod.N, mod.K, mod.dtype)[:2]
    else:
        A = torch.zeros((mod.M, mod.K), device="cuda", dtype=dt)
        B = torch.zeros((mod.N, mod.K), device="cuda", dtype=dt)
    D = torch.empty((mod.M, mod.N), device="cuda", dtype=dt)
    ours = lambda: mod(A, B, out=D)  # noqa: E731
    theirs = lambda: torch.matmul(A, B.T, out=D)  # noqa: E731
    burst(ours, 3)
    burst(theirs, 3)
    side = {"ours": [], "cublas": []}
    clocks = {"ours": [], "cublas": []}
    for r in range(rounds):
        order = (("ours", ours), ("cublas", theirs)) if r % 2 == 0 else (("cublas", theirs), ("ours", ours))
        for name, fn in order:
            time.sleep(pause)
            t0 = time.time()
            side[name].append(burst(fn, n))
            clocks[name].append(sampler.between(t0, time.time()))
    ms, cublas_ms = statistics.median(side["ours"]), statistics.median(side["cublas"])
    flop = 2.0 * mod.M * mod.N * mod.K

    def mean_of(rows, key):
        vals = [c[key] for c in rows if c[key] is not None]
        return round(statistics.mean(vals)) if vals else None

    return {
        "inputs": inputs, "burst": n, "rounds": rounds, "pause_s": pause,
        "ms": ms, "cublas_ms": cublas_ms, "tflops": flop / ms / 1e9, "cublas_tflops": flop / cublas_ms / 1e9,
        "ratio_to_cublas": cublas_ms / ms,
        "sm_mhz": mean_of(clocks["ours"], "sm_mhz"), "watts": mean_of(clocks["ours"], "watts"),
        "cublas_sm_mhz": mean_of(clocks["cublas"], "sm_mhz"), "cublas_watts": mean_of(clocks["cublas"], "watts"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="folders of exported modules")
    ap.add_argument("--out", required=True, help="the JSON to write")
    ap.add_argument("--short", type=int, default=4, help="launches in a short burst")
    ap.add_argument("--long", type=int, default=300, help="launches in a long burst")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.3, help="idle seconds before each burst")
    args = ap.parse_args()
    paths = sorted(p for d in args.dirs for p in Path(d).glob("*.so"))
    if not paths:
        raise SystemExit(f"no modules (*.so) in {args.dirs}")
    sampler = Sampler()
    results = []
    try:
        for p in paths:
            mod = load(p)
            check = harness.check(mod)
            row = {"module": p.name, "rung": mod.rung, "shape": [mod.M, mod.N, mod.K], "dtype": mod.dtype,
                   "knobs": mod.knobs, "status": "ok" if check.ok else "wrong", "rel_err": check.rel_err,
                   "runs": []}
            if check.ok:
                for inputs in ("randn", "zeros"):
                    for n in (args.short, args.long):
                        run = measure(mod, inputs, n, args.rounds, args.pause, sampler)
                        row["runs"].append(run)
                        print(f"{p.name[:40]} {inputs:5} x{n:<4} {run['tflops']:6.1f} TFLOPS "
                              f"{run['ratio_to_cublas']:.3f}x cuBLAS ({run['cublas_tflops']:.1f}), "
                              f"{run['sm_mhz']} / {run['cublas_sm_mhz']} MHz, {run['watts']} / {run['cublas_watts']} W",
                              flush=True)
                # the headline: randn, long bursts (the sustained, power-limited case)
                row["ratio_to_cublas"] = row["runs"][1]["ratio_to_cublas"]
            results.append(row)
    finally:
        sampler.stop()
    out = {"gpu": harness.gpu_info(), **harness.run_info(), "method": __doc__, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    files.write_record(Path(args.out), out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
