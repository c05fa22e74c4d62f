"""The front door's stream-k rule against what it chose before, at the shapes the rule was fitted
on and at shapes it was not.

    PYTHONPATH=. .venv/bin/python benchmarks/stream_k_rule.py build/skrule             # build box
    python3 -m gemm_ladder bench build/skrule --out out/skrule_bench.json              # GPU box
    PYTHONPATH=. .venv/bin/python benchmarks/stream_k_rule.py --round2 build/skrule2    # then these

For each shape, two modules, built as the front door builds them (``front.plan_job``: the tuning
database, then the rules; a runtime M where the rung takes one) for an H100's 132 SMs: ``new``
with today's rules, ``old`` without the ``stream-k`` rule. The file name ends in which.

``--round2``: shapes near the rule's edges, after the first round: where the rule now takes
stream-K from a tile-shape choice (512x28672x4096), where it wins by only 1.1% (16384x16384x4096),
and where it loses by 0.8% to a 128x192 tile and is not taken (3000x5000x4000: the second module
is then the v10 ``stream_k`` one it passed over, ``_sk``).
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


ROUND2 = [(512, 28672, 4096), (16384, 16384, 4096), (3000, 5000, 4000)]


def jobs(cases):
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import plan
    from gemm_ladder.compile.batch import BuildJob
    from gemm_ladder.serve.front import plan_job

    without = [r for r in plan.RULES if r.name != "stream-k"]
    out = []
    for (M, N, K), dtype in cases:
        p = plan.Problem(M, N, K, dtype, "sm_90a", SMS)
        new, job = plan_job(p)
        pairs = [("new", new.rule, job)]
        if new.rule == "stream-k":
            old, other = plan_job(p, without)
            pairs.append(("old", old.rule, other))
        else:
            knobs = {"split_k": 1, "stream_k": True, "dtype": dtype, "arch": "sm_90a", "dynamic_m": True}
            pairs.append(("sk", "passed over", BuildJob("v10", job.shape, knobs)))
        for which, rule, j in pairs:
            name = f"{j.rung}_{M}x{N}x{K}_{dtype}_{which}"
            out.append(BuildJob(j.rung, j.shape, j.knobs, extra={"rule": rule}, name=name))
            print(f"{name}: {rule} {j.knobs}")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    round2 = argv[:1] == ["--round2"]
    argv = argv[1:] if round2 else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    from gemm_ladder.compile.batch import build_many, write_folder_manifest  # pylint: disable=import-outside-toplevel

    cases = ([(s, "float16") for s in ROUND2] if round2 else
             [(s, "float16") for s in FITTED + HELD_OUT] + [(s, "bfloat16") for s in BF16])
    out_dir = Path(argv[0])
    results = build_many(jobs(cases), out_dir, desc="stream-k rule")
    _, problems = write_folder_manifest(out_dir, results)
    bad = [r for r in results if r["status"] != "built"]
    print(f"{len(results) - len(bad)} built into {out_dir}; failed: {len(bad) + len(problems)}")
    for r in bad:
        print("  ", r)
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
