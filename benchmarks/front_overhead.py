"""Where the front door's host time goes, call by call (a benchmark for the GPU box).

For kernels of ~20 us (decode shapes, small squares) a caller's time is the host's: a burst of
``gemm_ladder.matmul`` calls runs no faster than the host issues them. This measures, for a few
shapes of a kernel pack, the host microseconds of one call at each layer, with the GPU kept busy
so the host never waits for it:

    torch.matmul(A, B.T, out=D)           cuBLAS through torch (the yardstick)
    gemm_ladder.matmul(A, B, out=D)       the front door: checks, route lookup, launch
    route.run(A, B, D)                    the route's bound launcher
    fn(A, B, D, *tail)                    TVM's packed function alone (tensor conversion, launch)

then profiles the front door (cProfile, the functions with the most own time).

    python3 benchmarks/front_overhead.py --pack build/suite_pack --out out/front_overhead.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = ((1, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048), (128, 4096, 4096))
CALLS = 2000


def _host_us(fn, args, calls: int = CALLS) -> float:
    import torch

    busy = torch.empty((8192, 8192), device="cuda", dtype=torch.float16)
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    torch.mm(busy, busy)  # keep the GPU busy while the host issues calls (~1 ms of work queued)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / (calls // 5) * 1e6)
        torch.cuda.synchronize()
        torch.mm(busy, busy)
    torch.cuda.synchronize()
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import torch

    import gemm_ladder
    from gemm_ladder.serve import front

    gemm_ladder.use_pack(a.pack)
    lines = []
    for M, N, K in SHAPES:
        A = torch.randn((M, K), device="cuda", dtype=torch.float16)
        B = torch.randn((N, K), device="cuda", dtype=torch.float16)
        D = torch.empty((M, N), device="cuda", dtype=torch.float16)
        gemm_ladder.matmul(A, B, out=D)
        route = front.route_of(M, N, K, "float16")
        mod = route.module
        fn = mod._function()  # pylint: disable=protected-access
        tail = [*mod.workspace_args(M, A.device), *mod.launch_args(A.device)]
        rows = {
            "torch.matmul (cuBLAS)": _host_us(lambda x, y, z: torch.matmul(x, y.T, out=z), (A, B, D)),
            "gemm_ladder.matmul": _host_us(lambda x, y, z: gemm_ladder.matmul(x, y, out=z), (A, B, D)),
            "route.run": _host_us(route.run, (A, B, D)),
            "packed function": _host_us(lambda x, y, z: fn(x, y, z, *tail), (A, B, D)),
            "module __call__ (checked)": _host_us(lambda x, y, z: mod(x, y, out=z), (A, B, D), calls=500),
            "empty python call": _host_us(lambda x, y, z: None, (A, B, D)),
        }
        lines.append(f"== {M}x{N}x{K} float16: {route.rung} {mod.path.name}")
        lines += [f"  {k:<28} {v:7.2f} us" for k, v in rows.items()]
        if (M, N, K) == SHAPES[0]:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                gemm_ladder.matmul(A, B, out=D)
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            prof_text = s.getvalue()
    text = "\n".join(lines) + "\n\n== cProfile of gemm_ladder.matmul, first shape\n" + prof_text
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
