"""The front door's stream-k rule against what it chose before, at the shapes the rule was fitted
on and at shapes it was not.

    PYTHONPATH=. .venv/bin/python benchmarks/stream_k_rule.py build/skrule             # build box
    python3 -m gemm_ladder bench build/skrule --out out/skrule_bench.json              # GPU box

For each shape, two modules, built as the front door builds them (``front.plan_job``: the tuning
database, then the rules; a runtime M where the rung takes one) for an H100's 132 SMs: ``new``
with today's rules, ``old`` without the ``stream-k`` rule. The file name ends in which.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the rule's evidence (measured before it existed) and shapes it was not fitted on
FITTED = [(1792, 2560, 8192), (2560, 2560, 8192), (8192, 8192, 8192), (6144, 6144, 6144)]
HELD_OUT = [(5120, 5120, 5120), (4096, 11008, 4096), (8192, 4096, 8192), (4096, 14336, 4096),
            (512, 128256, 4096)]
BF16 = [(8192, 8192, 8192), (5120, 5120, 5120)]
SMS = 132


def jobs():
    # pylint: disable=import-outside-toplevel
    from gemm_ladder import plan
    from gemm_ladder.batch import BuildJob
    from gemm_ladder.front import plan_job

    without = [r for r in plan.RULES if r.name != "stream-k"]
    out = []
    cases = [(s, "float16") for s in FITTED + HELD_OUT] + [(s, "bfloat16") for s in BF16]
    for (M, N, K), dtype in cases:
        p = plan.Problem(M, N, K, dtype, "sm_90a", SMS)
        for which, rules in (("new", None), ("old", without)):
            choice, job = plan_job(p, rules)
            name = f"{job.rung}_{M}x{N}x{K}_{dtype}_{which}"
            out.append(BuildJob(job.rung, job.shape, job.knobs, extra={"rule": choice.rule}, name=name))
            print(f"{name}: {choice.rule} {job.knobs}")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    from gemm_ladder.batch import build_many, write_folder_manifest  # pylint: disable=import-outside-toplevel

    out_dir = Path(argv[0])
    results = build_many(jobs(), out_dir, desc="stream-k rule")
    _, problems = write_folder_manifest(out_dir, results)
    bad = [r for r in results if r["status"] != "built"]
    print(f"{len(results) - len(bad)} built into {out_dir}; failed: {len(bad) + len(problems)}")
    for r in bad:
        print("  ", r)
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
