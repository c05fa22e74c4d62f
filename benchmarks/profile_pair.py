"""Run one exported module and cuBLAS on the same random inputs a few times, for a profiler.

    ncu --clock-control none --kernel-name regex:"hgemm|gemm|nvjet|xmma" --launch-skip 2 \
        --launch-count 2 --section SpeedOfLight python3 benchmarks/profile_pair.py MODULE.so

Nothing else launches a GEMM here (the inputs are drawn with randn, the output is not
checked): the profiled kernels are ours (``hgemm_kernel``) and the one cuBLAS picks for
``torch.matmul`` on the same shape and dtype. Runtime-only TVM is enough.
"""

import sys

import torch

from gemm_ladder.serve.runtime import load


def main(path: str, times: int = 3) -> None:
    mod = load(path)
    A = torch.randn((mod.M, mod.K), device="cuda").to(getattr(torch, mod.dtype))
    B = torch.randn((mod.N, mod.K), device="cuda").to(getattr(torch, mod.dtype))
    out = torch.empty((mod.M, mod.N), device="cuda", dtype=A.dtype)
    for _ in range(times):
        mod(A, B, out=out)
        torch.matmul(A, B.T, out=out)
    torch.cuda.synchronize()
    print(f"ran {mod!r} and cuBLAS {times} times each")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
