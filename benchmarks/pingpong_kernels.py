"""Build v9 with ping-pong consumers beside v9's cooperative consumers, at the big shapes of issue 11.

    PYTHONPATH=. .venv/bin/python benchmarks/pingpong_kernels.py build/pingpong           # build box
    python3 -m gemm_ladder bench build/pingpong --out out/bench_pingpong.json             # GPU box
    (``--clusters build/pingpong2``: the second round, 2x2 clusters, fp16 at 4096^3 and 8192^3)

Cooperative (v9's default): both consumer warpgroups share each 128x256 tile, 64 rows each, and
finish it together: while they stage its epilogue the tensor cores wait. Ping-pong
(``pingpong=True``): each consumer owns whole tiles (64x256 or 128x128), in turn, so one's
epilogue runs under the other's mainloop. The list, fp16 and bf16 at 4096^3 and 8192^3 (fp16
also at 6144^3 and 3072x8192x1536): v9 at its defaults; ping-pong 64x256 with and without the
2x1 cluster; ping-pong 128x128 with a 5-deep ring, in a 2x1 and a 1x2 cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gemm_ladder.compile.batch import BuildJob, build_many, write_folder_manifest

SHAPES = {(4096, 4096, 4096): ("float16", "bfloat16"), (8192, 8192, 8192): ("float16", "bfloat16"),
          (6144, 6144, 6144): ("float16",), (3072, 8192, 1536): ("float16",)}
CANDIDATES = [
    {},  # v9's defaults: cooperative 128x256, 2x1 cluster
    {"pingpong": True, "blk_m": 64, "blk_n": 256},
    {"pingpong": True, "blk_m": 64, "blk_n": 256, "cluster_m": 1},
    {"pingpong": True, "blk_m": 128, "blk_n": 128, "pipe_depth": 5},
    {"pingpong": True, "blk_m": 128, "blk_n": 128, "pipe_depth": 5, "cluster_m": 1, "cluster_n": 2},
]
# a second round: 2x2 clusters, where each CTA loads half of its A tile and half of its B tile
# (A shared along N, B along M): ping-pong's half-size tiles then read no more from L2 per FLOP than
# the cooperative 128x256 tile in a 2x1 cluster
CLUSTER_2X2 = [
    {"cluster_m": 2, "cluster_n": 2},
    {"pingpong": True, "blk_m": 128, "blk_n": 128, "pipe_depth": 5, "cluster_m": 2, "cluster_n": 2},
    {"pingpong": True, "blk_m": 64, "blk_n": 256, "cluster_m": 2, "cluster_n": 2},
]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print(__doc__)
        return 2
    if len(argv) == 2 and argv[0] == "--clusters":
        out_dir = Path(argv[1])
        jobs = [BuildJob("v9", shape, {"dtype": "float16", **knobs})
                for shape in ((4096, 4096, 4096), (8192, 8192, 8192)) for knobs in CANDIDATES[:1] + CLUSTER_2X2]
    else:
        out_dir = Path(argv[0])
        jobs = [BuildJob("v9", shape, {"dtype": dtype, **knobs})
                for shape, dtypes in SHAPES.items() for dtype in dtypes for knobs in CANDIDATES]
    results = build_many(jobs, out_dir, desc="ping-pong kernels")
    path, problems = write_folder_manifest(out_dir, results)
    print(f"{len(results) - len(problems)} built into {out_dir} ({path.name}); failed: {len(problems)}")
    for p in problems:
        print("  ", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
