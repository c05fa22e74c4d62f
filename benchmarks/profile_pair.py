"""Run one exported module and cuBLAS on the same random inputs a few times, for a profiler.

    ncu --clock-control none --kernel-name regex:"hgemm|gemm|nvjet|xmma|sm90" --launch-skip 2 \
        --launch-count 2 --section SpeedOfLight python3 benchmarks/profile_pair.py MODULE.so [TIMES] [M]

Nothing else launches a GEMM here (the inputs are drawn with randn, the output is not
checked): the profiled kernels are ours (``hgemm_kernel``) and the one cuBLAS picks for
``torch.matmul`` on the same shape and dtype; for an fp8 module (its spec's operands e4m3), inputs
quantized as ``scaled_mm`` takes them and ``torch._scaled_mm`` with the module's scale recipe
(``fp8_check``'s inputs and calls). ``M``: the rows a runtime-M module runs at (default: its own M).
Runtime-only TVM is enough.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_check  # noqa: E402  (a sibling script: fp8 inputs and calls)

from gemm_ladder.serve.runtime import load  # noqa: E402


def main(path: str, times: int = 3, M: int | None = None) -> None:
    mod = load(path)
    M = M or mod.M
    if mod.spec.is_fp8:
        recipe = mod.spec.scales
        aq, wq, sa, sb, _ = fp8_check.inputs(M, mod.N, mod.K, recipe, None, seed=0)
        out = torch.empty((M, mod.N), device="cuda", dtype=getattr(torch, mod.spec.d))
        for _ in range(times):
            fp8_check.ours(mod, aq, wq, sa, sb, None, out, recipe)
            fp8_check.torch_scaled(aq, wq, sa, sb, None, recipe)
    else:
        A = torch.randn((M, mod.K), device="cuda").to(getattr(torch, mod.dtype))
        B = torch.randn((mod.N, mod.K), device="cuda").to(getattr(torch, mod.dtype))
        out = torch.empty((M, mod.N), device="cuda", dtype=A.dtype)
        for _ in range(times):
            mod(A, B, out=out)
            torch.matmul(A, B.T, out=out)
    torch.cuda.synchronize()
    print(f"ran {mod!r} at M = {M} and cuBLAS {times} times each")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3, int(sys.argv[3]) if len(sys.argv) > 3 else None)
