"""Which cuBLAS kernels ``torch.matmul`` runs at the shapes where ours lose (issue 30's sub-wave
shapes, issue 31's training dW), with their grids and times: what our split-K alternatives are
measured against, read off torch's profiler (kernel name, grid, block, microseconds).

    python3 benchmarks/cublas_kernels.py --out out/cublas_kernels.json    # GPU box, torch only
    python3 benchmarks/cublas_kernels.py --set small --out out/cublas_small.json   # M = 64, 128; bias+GELU too
    python3 benchmarks/cublas_kernels.py --set mid --out out/cublas_mid.json       # M = 333 and 512
    python3 benchmarks/cublas_kernels.py --set fp8_mid --out out/cublas_fp8_mid.json   # fp8, M = 320-896

Each shape ``M x N x K`` (:data:`SHAPES`: D = A . B^T, A [M, K] and B [N, K] as our front door
takes them, or, for a training dW, ``dY^T . X`` on the transposed views the backward passes; ``fp8``:
``torch._scaled_mm`` on e4m3 A and B with per-tensor scales, bf16 out, as ``scaled_mm`` is timed against) runs
a few times under ``torch.profiler``; every CUDA kernel of the last call is listed. Seconds on an H100.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

# (label, M, N, K, layout): "KK" A and B K-major (a forward), "MN" both MN-major (a dW: dY^T . X)
SHAPES = (
    ("vit-h fc2 M=333", 333, 1280, 5120, "KK"),
    ("llama-3.2-1b M=256", 256, 2048, 8192, "KK"),
    ("phi-3-mini M=128", 128, 3072, 8192, "KK"),
    ("falcon-7b M=16", 16, 4544, 4544, "KK"),
    ("llama-8b M=128", 128, 4096, 4096, "KK"),
    ("350M k/v dW", 512, 2048, 16384, "MN"),
    ("350M q dW", 2048, 2048, 16384, "MN"),
)
# ``--set small``: issue 31's weakest epilogue shapes (M = 64 and 128 on Llama-8B's 4096-wide weights), plain and
# with "KK+gelu": cuBLASLt's fused bias+GELU (torch._addmm_activation), the peer of our fused epilogue
SMALL_SHAPES = tuple((f"llama-8b {N}x{K} M={M}{' +gelu' if gelu else ''}", M, N, K, "KK+gelu" if gelu else "KK")
                     for N, K in ((4096, 4096), (4096, 14336)) for M in (64, 128) for gelu in (False, True))
# ``--set mid``: M = 333, where torch ran faster than every module of ours at first use on these every-model weights
# (results/2026-11-29_h200_every_model_swap192_m64/), and issue 31's M = 512 with cuBLASLt's fused bias+GELU
MID_SHAPES = (tuple((f"M=333 {N}x{K}", 333, N, K, "KK") for N, K in ((4096, 14336), (4096, 4096), (6144, 4096),
                                                                     (7168, 5120), (16384, 2048)))
              + tuple((f"llama-8b {N}x{K} M=512 +gelu", 512, N, K, "KK+gelu")
                      for N, K in ((4096, 4096), (4096, 14336), (28672, 4096), (6144, 4096))))
# ``--set fp8_mid``: issue 32's per-tensor fp8 at M = 320-896 (three, five and seven rows of 128-row tiles), where the
# fp8 rules' 2x1 clusters rounded an odd row of tiles up by a wave (plan.fp8_tile_cluster): which tiles, clusters
# and splits cuBLASLt runs there
FP8_MID_SHAPES = tuple((f"fp8 M={M} {N}x{K}", M, N, K, "fp8") for M in (320, 384, 640, 896)
                       for N, K in ((4096, 14336), (6144, 4096), (7168, 16384), (2112, 7168), (24576, 1536)))
SETS = {"sub_wave": SHAPES, "small": SMALL_SHAPES, "mid": MID_SHAPES, "fp8_mid": FP8_MID_SHAPES}
CALLS = 5


def operands(M: int, N: int, K: int, layout: str):
    g = torch.Generator(device="cuda").manual_seed(30)
    if layout == "fp8":  # e4m3 A [M, K] and B [N, K], both K-major as fp8 wgmma reads them
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g).to(torch.float8_e4m3fn)
    elif layout.startswith("KK"):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g)
    else:  # dW = dY^T . X with dY [K, M] and X [K, N] (K = tokens): A = dY^T, B^T = X
        a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=g).t()
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g).t()
    return a, b


def kernels_of(M: int, N: int, K: int, layout: str) -> list[dict]:
    a, b = operands(M, N, K, layout)
    d = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)

    one = torch.ones((), device="cuda", dtype=torch.float32)

    def call():
        if layout == "fp8":
            torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16)  # pylint: disable=protected-access
        elif layout.endswith("+gelu"):
            torch._addmm_activation(bias, a, b.t(), use_gelu=True)  # pylint: disable=protected-access
        else:
            torch.matmul(a, b.t(), out=d)

    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    names: dict = {}
    for e in events:  # per kernel: calls, mean microseconds, grid and block
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        r = names.setdefault(e["name"], {"name": e["name"], "calls": 0, "us": 0.0, "grid": args.get("grid"),
                                         "block": args.get("block"),
                                         "registers": args.get("registers per thread"),
                                         "shared_bytes": args.get("shared memory")})
        r["calls"] += 1
        r["us"] += float(e.get("dur", 0.0))
    for r in names.values():
        r["us"] = round(r["us"] / r["calls"], 2)
    return list(names.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("cublas_kernels.json"))
    ap.add_argument("--set", choices=sorted(SETS), default="sub_wave", dest="which",
                    help="sub_wave: issue 30's sub-wave shapes and the 350M dW (default); small: M = 64 and 128 on "
                         "Llama-8B's 4096-wide weights, plain and with cuBLASLt's fused bias+GELU; mid: M = 333 and "
                         "512; fp8_mid: torch._scaled_mm per-tensor at M = 320-896")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("no CUDA GPU here: run it on the GPU box")
    rows = []
    for label, M, N, K, layout in SETS[a.which]:
        ks = kernels_of(M, N, K, layout)
        rows.append({"label": label, "M": M, "N": N, "K": K, "layout": layout,
                     "dtype": "float8_e4m3" if layout == "fp8" else "bfloat16", "kernels": ks})
        print(f"{label:20s} {M}x{N}x{K} {layout}: " + "; ".join(
            f"{k['name'][:100]} grid {k['grid']} block {k['block']} x{k['calls']} {k['us']} us" for k in ks))
    doc = {"format": "gemm_ladder.cublas_kernels", "version": 1, "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
