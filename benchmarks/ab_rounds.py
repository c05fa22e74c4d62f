"""Two or more modules of one shape against each other and cuBLAS, in many short rounds.

The method is :mod:`gemm_ladder.measure.rounds` (every module of the group and cuBLAS take turns in the
same rounds, after a warm-up at the power limit; the per-round ratios give quartiles), the one
the tuner's second pass uses. This script adds:

- a check of every module first (``harness.check``, output poisoned); a failing one is not timed;
- ``nvidia-smi`` sampling the SM clock and the power every 20 ms (``power_probe.Sampler``);
- a JSON with each module's rung, shape, dtype, knobs, build commit, status and ratio to cuBLAS.

    python3 benchmarks/ab_rounds.py build/ab/v9_4096*_float16_*.so --out out/ab_4096_fp16.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.measure import harness, rounds  # noqa: E402
from gemm_ladder.serve.runtime import load  # noqa: E402
from gemm_ladder.core import files  # noqa: E402


def run_group(paths: list[Path], n_rounds: int, per_round: int, warm: float, sampler: Sampler,
              timer: str = "queued") -> dict:
    mods = [load(p) for p in paths]
    try:
        rounds.check_group(mods)
    except ValueError as err:
        raise SystemExit(f"{err}; give one shape and dtype per call") from None
    first = mods[0]
    checks = [harness.check(m) for m in mods]
    good = [i for i, c in enumerate(checks) if c.ok]
    if not good:
        raise SystemExit("no module of the group passed its check: nothing to time")
    timed = rounds.time_rounds([mods[i] for i in good], n_rounds, per_round, warm, timer)
    timed_rows = dict(zip(good, timed["rows"]))
    rows = []
    for i, (p, m, c) in enumerate(zip(paths, mods, checks)):
        row = {"module": p.name, "path": str(p), "rung": m.rung, "shape": [m.M, m.N, m.K], "dtype": m.dtype,
               "knobs": m.knobs, "build_commit": m.manifest.get("commit"), "check": c.as_dict()}
        row.update({"status": "ok", **timed_rows[i]} if i in timed_rows else {"status": "wrong"})
        rows.append(row)
    return {"shape": [first.M, first.N, first.K], "dtype": first.dtype, "rounds": n_rounds, "per_round": per_round,
            "warm_s": warm, "timer": timer, "input_sets": timed["input_sets"], "cublas_ms": timed["cublas_ms"],
            "cublas_tflops": timed["cublas_tflops"], "clocks": sampler.between(timed["t0"], timed["t1"]),
            "modules": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="modules of one shape and dtype; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--per-round", type=int, default=30)
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of warm-up launches")
    ap.add_argument("--timer", choices=harness.TIMERS, default="queued",
                    help="queued launches, or the kernels replayed in CUDA graphs (rounds.time_rounds)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.rounds < 1 or args.per_round < 1 or args.warm < 0:
        ap.error("--rounds and --per-round must be at least 1, --warm at least 0")
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        ap.error(f"no such module: {', '.join(missing)}")
    sampler = Sampler()
    try:
        group = run_group(args.paths, args.rounds, args.per_round, args.warm, sampler, args.timer)
    finally:
        sampler.stop()
    report = {**harness.run_info(), "gpu": harness.gpu_info(), "method": rounds.__doc__.strip(), **group}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    files.write_record(args.out, report)
    for row in group["modules"]:
        extra = (f"  x first {row['ratio_to_first']:.3f} (rounds {row['round_ratio_to_first_quartiles']})"
                 if "ratio_to_first" in row else "")
        label = f"{Path(row['path']).parent.name}/{row['module']}"
        print(f"{label[:120]:120s} {row['status']:5s} {row.get('tflops', 0):7.1f} TFLOPS "
              f"x cuBLAS {row.get('ratio_to_cublas', 0):.3f}{extra}")
    print(f"cuBLAS {group['cublas_tflops']:.1f} TFLOPS; clocks {group['clocks']}")


if __name__ == "__main__":
    main()
