"""Host time a call of each way to the same product (issue 31's host-bound prefill).

A 1x512 prefill of a small or shallow model is host-bound: its kernels take half its wall time,
so the host time of each linear layer's call decides it. This times, on one shape a pack serves,
``F.linear``, ``nn.Linear``, ``gemm_ladder.nn.Linear`` (its fast lane and without it), the front
door (``matmul``, with and without ``out``), ``ops.direct_mm`` and ``front.fast_mm``, and the parts
the layer adds (``traced``, ``autocast_dtype``, the fast path's key, ``new_empty``): each called
back to back under ``torch.inference_mode``, the host's time a call (the GPU keeps up: the queue
never fills at these shapes) and the wall time with the queue drained.

    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/host_calls.py build/e2e_fuse2 --shape 512x768x768 --out host_calls.json   # GPU box
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALLS, WARM = 3000, 50


def shape_of(text: str) -> tuple[int, int, int]:
    """``"MxNxK"`` -> (M, N, K), each positive."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape {text!r}: M x N x K as MxNxK, e.g. 512x768x768")
    return tuple(int(p) for p in parts)


def ways(M: int, N: int, K: int) -> dict:
    import torch
    import torch.nn.functional as F

    import gemm_ladder
    from gemm_ladder import nn as gnn
    from gemm_ladder.serve import front, ops

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    W, ours, d = lin.weight, gnn.Linear.from_linear(lin), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    gemm_ladder.matmul(x, W)  # first use: the route, the measured choice, the fast path's key
    return {"F.linear": lambda: F.linear(x, W), "nn.Linear": lambda: lin(x),
            "torch.mm(out=)": lambda: torch.mm(x, W.t(), out=d), "gnn.Linear": lambda: ours(x),
            "gnn.linear (the layer's checks)": lambda: gnn.linear(x, W), "matmul": lambda: gemm_ladder.matmul(x, W),
            "matmul(out=)": lambda: gemm_ladder.matmul(x, W, out=d), "ops.direct_mm": lambda: ops.direct_mm(x, W),
            "front.fast_mm": lambda: front.fast_mm(x, W), "part: nn.traced": lambda: gnn.traced(x, W, None),
            "part: nn.autocast_dtype": lambda: gnn.autocast_dtype(x),
            "part: fast path key": lambda: front._fast_key(x, W, None),  # pylint: disable=protected-access
            "part: new_empty": lambda: x.new_empty((M, N))}, front.route_of(M, N, K, "bfloat16")


def host_us(fn, calls: int = CALLS) -> tuple[float, float]:
    import torch

    for _ in range(WARM):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / calls * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pack", help="a kernel pack serving the shape (its folder)")
    p.add_argument("--shape", type=shape_of, default=(512, 768, 768), help="MxNxK (bf16), default 512x768x768")
    p.add_argument("--out", default="host_calls.json")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("host_calls: no GPU here; run it on the GPU box", file=sys.stderr)
        return 2
    import gemm_ladder
    from gemm_ladder.measure import harness

    gemm_ladder.use_pack(a.pack)
    M, N, K = a.shape
    with torch.inference_mode():
        fns, route = ways(M, N, K)
        rows = []
        for name, fn in fns.items():
            host, wall = host_us(fn)
            rows.append({"way": name, "host_us": host, "wall_us": wall})
            print(f"{name:28s} host {host:7.2f} us a call, wall {wall:7.2f}")
    doc = {"format": "gemm_ladder.host_calls", "gpu": harness.gpu_info(), **harness.run_info(), "shape": [M, N, K],
           "dtype": "bfloat16", "route": type(route.module).__name__, "calls": CALLS, "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
