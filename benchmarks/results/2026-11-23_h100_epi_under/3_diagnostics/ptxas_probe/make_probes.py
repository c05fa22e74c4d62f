"""When does ptxas keep wgmmas asynchronous around reads of accumulators? Three small kernels.

Each kernel holds two 64-register accumulator halves, ``a`` and ``b`` (the two column halves of a
m64n256 tile). Each issues a ``m64n128k16`` wgmma on each half, a commit group per half. It waits
until one group is left (``wait_group 1``), rounds half ``a`` into 16-bit pairs, and issues ``a``'s
next wgmma while ``b``'s still runs; then the same for ``b``. That is the tile boundary the
``epi_under`` study wanted to hide.

- ``straight_line``: the boundary once, no loop.
- ``loop_carried``: the boundary in a loop whose back edge carries the two pending groups.
- ``loop_drained``: the same loop, with a whole slice before the boundary and a ``wait_group 0``
  at the end of every iteration, so that nothing is pending at the back edge.

    python3 make_probes.py OUT_DIR      # writes OUT_DIR/<name>.cu, compiles each for sm_90a

It prints ptxas's lines for each kernel. With ptxas 13.0, ``loop_carried`` gets C7514 ("wgmma
serialized due to non wgmma instructions reading accumulator registers"); the other two do not
(``ptxas.txt``).
"""

import subprocess
import sys
from pathlib import Path


def mma(half: str, accumulate: bool) -> str:
    outs = ",".join(f"%{i}" for i in range(64))
    regs = ", ".join(f'"+f"({half}[{i}])' for i in range(64))
    return (f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %66, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{{outs}}}, %64, %65, p, 1, 1, 0, 0;\\n}}\\n"'
            f' : {regs} : "l"(da), "l"(db), "r"({int(accumulate)}));\n')


FENCE = '  asm volatile("wgmma.fence.sync.aligned;");\n'
COMMIT = '  asm volatile("wgmma.commit_group.sync.aligned;");\n'


def wait(n: int) -> str:
    return f'  asm volatile("wgmma.wait_group.sync.aligned {n};");\n'


def pairs(half: str, first: int) -> str:
    return (f'  for (int i = 0; i < 32; ++i) asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p[{first} + i])'
            f' : "f"({half}[2 * i + 1]), "f"({half}[2 * i]));\n')


def boundary() -> str:
    """Half a retires and is rounded while b runs, a's next wgmma goes out; then b likewise."""
    return (wait(1) + pairs("a", 0) + FENCE + mma("a", False) + COMMIT
            + wait(1) + pairs("b", 32) + FENCE + mma("b", False) + COMMIT)


def kernel(body: str) -> str:
    return f"""#include <cuda_fp16.h>
__global__ void __launch_bounds__(128) k(unsigned long long da, unsigned long long db, unsigned *out, int n) {{
  float a[64], b[64];
  unsigned p[64];
  for (int i = 0; i < 64; ++i) {{ a[i] = 0.f; b[i] = 0.f; }}
{FENCE}{mma("a", False)}{COMMIT}{FENCE}{mma("b", False)}{COMMIT}{body}
  asm volatile("wgmma.wait_group.sync.aligned 0;");
  for (int i = 0; i < 64; ++i) out[i * 128 + threadIdx.x] += __float_as_uint(a[i]) + __float_as_uint(b[i]) + p[i];
}}
"""


def store_pairs(indent: str = "  ") -> str:
    return f"{indent}for (int i = 0; i < 64; ++i) out[(t * 64 + i) * 128 + threadIdx.x] = p[i];\n"


PROBES = {
    "straight_line": kernel("  { int t = 0;\n" + boundary() + store_pairs() + "  }\n"),
    "loop_carried": kernel("  for (int t = 0; t < n; ++t) {\n" + boundary() + store_pairs() + "  }\n"),
    "loop_drained": kernel(
        "  for (int t = 0; t < n; ++t) {\n"
        + FENCE + mma("a", True) + mma("b", True) + COMMIT + wait(0)  # a whole slice, drained
        + FENCE + mma("a", True) + COMMIT + FENCE + mma("b", True) + COMMIT  # the last slice, in halves
        + boundary() + wait(0) + store_pairs() + "  }\n"),
}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, src in PROBES.items():
        cu = out / f"{name}.cu"
        cu.write_text(src)
        res = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(cu.with_suffix(".cubin")), str(cu),
                              "-Xptxas", "-v"], capture_output=True, text=True, check=False)
        lines = [ln for ln in (res.stdout + res.stderr).splitlines()
                 if "C75" in ln or "Used" in ln or "error" in ln]
        print(f"== {name}.cu")
        print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 make_probes.py OUT_DIR")
    main(sys.argv[1])
