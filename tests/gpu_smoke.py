"""What the GPU smoke tier (``tests/test_gpu_smoke.py``) runs: one tiny shape per GPU-only entry.

Every command and library entry that only runs on a GPU is run once here, as a user runs it, on
the smallest inputs that reach its whole host path: ``verify``, ``bench``, ``suite run``, the
every-model suite's job, ``tune --measure`` (16-bit, and fp8 per-tensor and block-wise against
``torch._scaled_mm``, then merged into a database the front door's fp8 policy reads), the ``rounds`` job of
``gemm_ladder.measure.isolate``,
``gemm_ladder.matmul`` and the torch op, also with a bias and with a bias and an activation (the
operand spec's epilogue), a fused SwiGLU MLP's gradients (``nn.patch(fuse=True)``, eager and
compiled) and its inference forward (the layers' fast lane), and the grouped front doors
(``grouped_mm``, ``grouped_mm_masked``, ``grouped_swiglu``, ``grouped_swiglu_masked``) under every
routing of issue 33, in CUDA graphs too. A refactor of host code once broke ``suite run`` for every case while every CPU test passed;
this tier is what catches that, so it runs on the device after any change to host code.

The modules are built where TVM's compiler is (a build box) and carried::

    .venv/bin/python -m tests.gpu_smoke build/smoke            # build box: the artifacts below
    GEMM_LADDER_SMOKE=build/smoke python3 -m pytest -q -m gpu tests/test_gpu_smoke.py   # GPU box

On a box with both a GPU and TVM's compiler the tests build the folder themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INDEX = "smoke.json"
# one module of the production rung at a shape of partial tiles, and one of the teaching ladder
LADDER = [("v9", (200, 264, 320)), ("v4", (256, 256, 512))]
TUNE = ("v5", (256, 256, 512), "blk_m=128;blk_n=128;num_warpgroups=2;pipe_depth=2,3")
# scaled_mm's fp8 kernel tuned (tune --dtype float8_e4m3): two candidates of each recipe's, around the policy's knobs
TUNE_FP8 = ("v9", (256, 512, 512), "pipe_depth=3,4;l2_group_size=8;tile_order=snake;cluster_m=2;cluster_n=1",
            ("tensor", "block"))
# one case of the shape suite (fp16 only: ``--only`` matches case ids by substring) and the
# weight the front door's tests call through its pack
SUITE_CASE = "float16-16x4096x4096"
FRONT_SHAPES = ("16x4096x4096", "37x4096x4096")
# matmul(A, W, bias=b) through the pack's bias modules (pack build --epilogue bias): swap AB at small
# (odd) M (v11: 16 and 37 rows), the small-M split at M = 100 (v10: 64x64 tiles, K in two), 128x128
# tiles in a 1x2 cluster with a partial last column tile (N = 3000), and 128x256 tiles at two or more
# a CTA with epi_under (odd M = 2001)
BIAS_SHAPES = ("16x4096x4096", "37x4096x4096", "100x2048x4096", "333x3000x520", "517x3000x520", "2001x4096x512",
               "37x1001x520")
# a wide N that is not a multiple of 8 (K is): split, the pack's module on the weight's first 1000
# rows as they lie, torch's matmul on the last (tma_layout's split-n), eager, again and in a CUDA
# graph; the bias shape 37x1001x520 above splits its bias the same way
SPLIT_SHAPES = ("16x1001x512", "333x1001x512")
# matmul(A, W, bias=b, activation=a) through the pack's v9 modules of every activation in both
# dtypes (pack build --epilogue bias_relu,...): 128x128 tiles in a 1x2 cluster with a partial
# column tile (5 row tiles: at M = 333 swap-ab-mid's v11 serves, which the bias shape 333x3000x520 takes), and
# 128x256 tiles with epi_under (its pairs take the activation too); two of the bias shapes, so the op's backward
# recomputes the activation's input on their bias modules
ACT_SHAPES = ("517x3000x520", "2001x4096x512")
ACT_EPILOGUES = ("bias_relu", "bias_gelu_tanh", "bias_gelu_erf", "bias_silu")
ACT_ALONE = ("silu", "float16", "517x3000x520")  # and one activation without a bias
# a LLaMA-style MLP (hidden 512, intermediate 768) over 128 tokens, bf16, fused by patch(fuse=True):
# its gradients against torch's, eager and compiled, every GEMM on a module of the pack (strict): the
# gated forward and the down projection (KK), the backward's recompute of x . W_gu^T (KK), dX = dY . W
# (KN: W read as it lies) and dW = dY^T . X (MN), for W_gu [1536, 512] and down_proj's [512, 768]
SWIGLU_MLP = {"rows": 128, "hidden": 512, "intermediate": 768}
SWIGLU_PACK = {"swiglu": ["128x1536x512"], "KK": ["128x1536x512", "128x512x768"],
               "KN": ["128x512x1536", "128x768x512"], "MN": ["1536x512x128", "512x768x128"]}


# grouped GEMM (v12) through the grouped front doors, strict, every routing issue 33 names: an
# 8-expert weight of partial tiles (N = 264, K = 520) in both dtypes and both layouts, 256 small
# experts (contiguous, bf16), and a gated 8-expert W_gu (2I = 528) for grouped_swiglu, both layouts
GROUPED = ("8,264,520", "256,128,256,contiguous", "8,528,520,swiglu")
GROUPED_DTYPES = {"8,264,520": "float16,bfloat16", "256,128,256,contiguous": "bfloat16",
                  "8,528,520,swiglu": "bfloat16"}


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gemm_ladder", *args], check=True, cwd=REPO)


def prepare(out) -> Path:
    """Build every artifact of the tier into ``out`` and index them in ``out/smoke.json``."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for rung, (M, N, K) in LADDER:
        _cli("export", "--rungs", rung, "--shapes", f"{M}x{N}x{K}", "--dtypes", "float16", "--out", str(out / "ladder"))
    rung, (M, N, K), space = TUNE
    _cli("tune", "--rung", rung, "--shape", f"{M}x{N}x{K}", "--space", space, "--build-only", "--out", str(out / "tune"))
    rung, (M, N, K), space, recipes = TUNE_FP8
    for recipe in recipes:
        _cli("tune", "--rung", rung, "--shape", f"{M}x{N}x{K}", "--dtype", "float8_e4m3", "--fp8-scales", recipe,
             "--space", space, "--build-only", "--out", str(out / f"tune_fp8_{recipe}"))
    shapes = sorted({SUITE_CASE.partition("-")[2], *FRONT_SHAPES, *SPLIT_SHAPES})
    _cli("pack", "build", "--shapes", ",".join(shapes), "--dtypes", "float16", "--out", str(out / "pack"))
    _cli("pack", "build", "--shapes", ",".join(BIAS_SHAPES), "--dtypes", "float16", "--epilogue", "bias",
         "--out", str(out / "pack"))  # added to the same pack
    _cli("pack", "build", "--shapes", ",".join(ACT_SHAPES), "--dtypes", "float16,bfloat16", "--epilogue",
         ",".join(ACT_EPILOGUES), "--out", str(out / "pack"))
    act, dtype, shape = ACT_ALONE
    _cli("pack", "build", "--shapes", shape, "--dtypes", dtype, "--epilogue", act, "--out", str(out / "pack"))
    for what, shapes in SWIGLU_PACK.items():
        how = ("--epilogue", "swiglu") if what == "swiglu" else ("--layouts", what)
        _cli("pack", "build", "--shapes", ",".join(shapes), "--dtypes", "bfloat16", *how, "--out", str(out / "pack"))
    for weight in GROUPED:
        _cli("pack", "build", "--grouped", weight, "--dtypes", GROUPED_DTYPES[weight], "--out", str(out / "pack"))
    index = {"ladder": "ladder", "tune": "tune", "tune_fp8": {r: f"tune_fp8_{r}" for r in TUNE_FP8[3]},
             "pack": "pack", "suite_case": SUITE_CASE,
             "front_shapes": list(FRONT_SHAPES), "split_shapes": list(SPLIT_SHAPES), "bias_shapes": list(BIAS_SHAPES), "act_shapes": list(ACT_SHAPES),
             "act_epilogues": list(ACT_EPILOGUES), "act_alone": list(ACT_ALONE), "swiglu_mlp": SWIGLU_MLP,
             "grouped": [[w, GROUPED_DTYPES[w]] for w in GROUPED]}
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.gpu_smoke OUT_DIR")
    print(prepare(sys.argv[1]))
