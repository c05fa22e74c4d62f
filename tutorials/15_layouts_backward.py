# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 15 · Operand layouts and the backward pass (v9 with MN-major operands)
#
# Every kernel so far computed `D = A · Bᵀ` with A `[M, K]` and B `[N, K]`, both row-major: the
# reduction dimension K is the contiguous one, **K-major**. That is the forward pass of a linear
# layer, `Y = X · Wᵀ` with `nn.Linear.weight` W `[out, in]`. Training also runs its two backward
# GEMMs, and they read the same tensors the other way round:
#
# - `dX = dY · W`: B is W, but now the reduction runs over W's *rows* (`out`): B is **N-major**;
# - `dW = dYᵀ · X`: the reduction runs over the tokens, the rows of both dY and X: A and B are
#   **M- and N-major**.
#
# Copying the transposes first (`W.t().contiguous()`) would cost a pass over each tensor per
# step. Instead v9 reads an operand as it lies: the operand spec's `a_major="M"` / `b_major="N"`
# (`gemm_ladder/core/spec.py`) changes the TMA boxes that load it, the shape of its shared tile and
# the wgmma descriptor that reads it; the ring, the roles and the epilogue stay as they are.

# %%
import torch

import gemm_ladder
import layouts
from gemm_ladder import teach
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import OPERAND_LAYOUTS, GemmSpec
from gemm_ladder.measure import report
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import front, ops
from gemm_ladder.sm90a import common, producer
from gemm_ladder.teach import operands

# %% [markdown]
# ## Which operand is K-major in which GEMM
#
# A `Linear(768, 3072)` over 8 x 512 tokens (the width of the end-to-end run's small model), as
# the op calls the front door. `spec layout` is the spec's name for the pair (`OPERAND_LAYOUTS`):
# the forward is `KK`; dX is `KN` (the backward's "NN" GEMM in BLAS words); dW is `MN` ("TN").

# %%
rows = operands.training_rows(tokens=8 * 512, d_in=768, d_out=3072)
print(report.table(rows, list(rows[0])))
print(OPERAND_LAYOUTS)

# %% [markdown]
# ## At the front door: a transposed view is an operand, not a copy
#
# `matmul(A, B)` computes `A · Bᵀ` for B `[N, K]`. Handed `W.t()` (a `[K, N]` weight's view) it
# sees a non-contiguous tensor whose transpose is contiguous: an N-major B, read where it lies.

# %%
W = torch.randn(3072, 768, dtype=torch.bfloat16)  # nn.Linear(768, 3072).weight: [out, in]
x, dY = torch.randn(4096, 768, dtype=torch.bfloat16), torch.randn(4096, 3072, dtype=torch.bfloat16)
for what, A, B in (("forward x . W^T", x, W), ("dX = dY . W", dY, W.t()), ("dW = dY^T . x", dY.t(), x.t())):
    print(f"{what:16} A {list(A.shape)} stride {list(A.stride())}, B {list(B.shape)} stride {list(B.stride())}: "
          f"majors {front.operand_majors(A, B)}, B shares W's or x's memory: "
          f"{B.data_ptr() in (W.data_ptr(), x.data_ptr())}")

# %% [markdown]
# ## Autograd through `torch.ops.gemm_ladder.mm`
#
# The op is a `torch.library.custom_op` with `register_autograd`. The forward saves A and B (and
# the bias only where there is an activation: backward recomputes the activation's input Z with
# one more forward GEMM rather than keeping Z, a tensor of D's size); the backward
# takes the gradient through the activation with torch's own backward ops, then `linear_grads`
# calls the op twice on transposed views (and sums dD's rows for the bias). `gemm_ladder.nn`'s
# eager `LinearFunction` shares `linear_grads` and calls the front door without the custom op's
# dispatch; under `torch.compile` the registered op is what gets traced.

# %%
teach.show_source(ops._setup_context)
teach.show_source(ops._backward)
teach.show_source(ops.linear_grads)

# %% [markdown]
# The calls it makes, recorded on the `meta` device (shapes and strides, no data, no GPU) for a
# layer with a bias and a `gelu_tanh`, and the layouts the front door reads them in:

# %%
calls = operands.autograd_calls(tokens=8 * 512, d_in=768, d_out=3072, activation="gelu_tanh")
print(report.table(calls, list(calls[0])))

# %% [markdown]
# ## What an MN-major operand changes in the kernel
#
# **The TMA box.** A K-major tile's K slice is one box, `rows x 64` (64 fp16 = one 128-byte line of
# the swizzle atom). An MN-major operand lies `[K, M]`: its box is turned, `64 x 64` (64 rows of K,
# 64 of M contiguous), one per 128-byte atom column of the tile (`producer._tma_whole_mn`: one box
# as wide as the tile would make TMA fold M into 64-wide groups, which needs M a multiple of 64).
#
# **The descriptor.** wgmma reads shared memory in 8-row x 16-byte core matrices through a 64-bit
# descriptor: start address, LBO and SBO (in 16-byte units) and the swizzle mode. K-major with the
# 128-byte swizzle: SBO is the next 8 rows of M (1024 B = 64), LBO is unused, a 16-deep K step is
# 32 bytes further (+2). MN-major: SBO is the next 8 rows of *K*, LBO the next 64 elements of M
# (one atom column further: 64 K rows x 128 B = 512), a K step is 16 rows of K (+128), and the
# wgmma instruction's transpose immediate for that operand is 1.
#
# In the code: the producer picks the load per operand's layout at trace time, and the consumer
# encodes slot 0's descriptors from the plan's fields (`HopperPlan.desc_a` / `desc_b`, from
# `layouts.operand_desc_fields`); an MN-major A's warpgroup starts at a *column* of its tile:

# %%
teach.show_source(producer._tma_whole_mn)
teach.show_source(common.encode_slot0)

# %% [markdown]
# Both configs' fields, with the boxes read from the lowered kernel
# (`gemm_ladder.protocol.kernel_ir`, the barrier checker's view):

# %%
for layout in ("KK", "MN"):
    a_major, b_major = OPERAND_LAYOUTS[layout]
    cfg = make_config("v9", 512, 1024, 256, spec=GemmSpec(a_major=a_major, b_major=b_major))
    rows = operands.operand_rows(cfg)
    print(f"{layout}:\n{report.table(rows, list(rows[0]))}\n")
teach.show(operands.plot_operand_tiles(rows=128, blk_k=64))

# %% [markdown]
# (B's K-major box is half its tile: in v9's default 2x1 cluster each CTA loads half of B and
# multicasts it to both; an MN-major part is two 64-wide boxes.)
#
# The generated code of the MN-major build: slot 0's two descriptors, encoded once per tile with
# LBO 512 and SBO 64, and a wgmma whose helper's name ends in its four immediates, scale-a,
# scale-b, **trans-a = 1, trans-b = 1**:

# %%
built = gemm_ladder.build("v9", 512, 1024, 256, spec=GemmSpec(a_major="M", b_major="N"))
teach.describe(built)
teach.source_excerpt(built, r"encode_matrix_descriptor|mma_async_sync_aligned_m64n256k16_f32_f16_f16_1_1_1_1\(Dreg",
                     context=0, max_matches=3)

# %% [markdown]
# ## Why fp8 is K-major only
#
# wgmma's transpose immediates exist for 16-bit operands only: the fp8 form (`...f32.e4m3.e4m3`)
# takes scale-a and scale-b and no transposes, so an fp8 operand must lie K-major in shared memory,
# and TMA cannot transpose on the way in. The descriptor model and the spec refuse it, each with
# the fix (store the operand K-major: `.t().contiguous()`, once per weight rather than per call):

# %%
try:
    layouts.wgmma_desc_fields_mn("float8_e4m3", (64, 128), "128B")
except ValueError as err:
    print("layouts:", err)
try:
    make_config("v9", 512, 1024, 256, spec=GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="tensor",
                                                    b_major="N"))
except ConfigError as err:
    print("spec:   ", err)

# %% [markdown]
# ## Measured: the backward GEMMs
#
# `benchmarks/layouts_check.py` on an H100: the four layouts in fp16 and bf16 at odd shapes
# checked first (40 of 40, output poisoned, cuBLAS's error as the yardstick; the op's dX, dW and
# dbias against float64), then dX (`KN`) and dW (`MN`) at Llama-3-8B's weights x 2048-8192 tokens,
# bf16, against `torch.matmul` on the same views: kernels in CUDA graphs cycling input sets that
# spill L2, and queued calls.

# %%
lay = teach.committed_run("2026-11-26_h100_layouts", "layouts_check.json")
print(lay.describe())
print(teach.sampled_clocks("2026-11-26_h100_layouts"))
rows = [{k: r[k] for k in ("op", "weight", "tokens", "M", "N", "K")}
        | {"kernel x cuBLAS": f"{r['kernel_ratio']:.3f}", "call x cuBLAS": f"{r['call_ratio']:.3f}"} for r in lay.rows]
print(report.table(rows, list(rows[0])))
print(report.table(teach.ratio_summary(lay.rows), ["op", "rows", "geomean", "lowest"]))

# %% [markdown]
# dX at **1.009x** cuBLAS (lowest 0.995) and dW at **1.023x** (lowest 1.004): issue 31's backward
# target (≥ 1.0x geomean, no shape below 0.9x) is met at these shapes, with dW in the input dtype.
# An fp32-output dW (for fp32 master weights without a rounding: the spec's `d="float32"` with
# both operands MN-major) is accepted by the spec, but these runs neither checked it on a GPU nor
# timed it.
#
# ## Measured: end to end
#
# `benchmarks/e2e_check.py`: Llama-style models in plain torch with random weights, every
# `nn.Linear` swapped by `gemm_ladder.nn.patch`, against the same model on torch's matmul, bf16,
# same process. Training: a 125M-parameter model (12 layers of width 768), AdamW, bf16 autocast
# with fp32 master weights, 150 steps of 8 x 512 tokens from the same weights and batches.

# %%
e2e = teach.committed_run("2026-11-26_h100_e2e", "e2e_check.json")
print(e2e.describe())
print(teach.sampled_clocks("2026-11-26_h100_e2e"))
rows = [{"phase": r["phase"], "model": r["model"], "batch": r["batch"], "tokens": r["tokens"],
         "torch ms": f"{r.get('torch_ms', r.get('torch_step_ms')):.2f}",
         "ours ms": f"{r.get('ours_ms', r.get('ours_step_ms')):.2f}", "x torch": f"{r['ratio_to_torch']:.3f}",
         "loss ok": r.get("loss_ok", "")} for r in e2e.rows]
print(report.table(rows, list(rows[0])))

# %% [markdown]
# Inference is at parity or just above at large batches (prefill 1.00-1.01x, decode under CUDA
# graphs 1.01-1.06x on the 8B-wide layers) and below it where each GEMM is a few microseconds
# (prefill 1x512: 0.56-0.71x; decode on the 768-wide model: 0.82-0.95x): issue 31's end-to-end
# targets (prefill ≥ 1.05x, decode ≥ 1.02x, training ≥ 1.03x) are not met.
#
# The loss tracks torch's (final 4.20 against 4.17, inside the run's 2% band), so the backward
# GEMMs are right end to end. The training step, **measured at commit 2feb607, ran at 0.52x**
# torch's (63 ms against 32 ms; 0.54x at 2cad59f with the front door's measured choice). Why, as
# measured: a profile of the same step on the H100 (torch.profiler over 3 steps; not among the
# committed results) put the GPU time per step at about the same for both (ours 21.1 ms, torch's
# 20.1 ms): the kernels are not the gap. The step is host-bound: about 255 GEMM calls a step go
# through the op's Python path (the custom op's dispatch, the front door's checks), and at that
# commit the backward's transposed-view calls did not take the front door's cached fast path, so
# each ran every check again (a dX call about 56-68 us queued, against 20 us for torch's
# `dY @ W`). That host path has been reworked since (transposed views on the front door's fast
# path, the eager `LinearFunction` above; `benchmarks/host_check.py` times it). The same pack run
# again after that rework, at commit 389c264:

# %%
after = teach.committed_run("2026-11-26_h100_e2e_host_path", "e2e_check.json")
print(after.describe())
print(teach.sampled_clocks("2026-11-26_h100_e2e_host_path"))
rows = [{"phase": r["phase"], "model": r["model"], "torch ms": f"{r['torch_step_ms']:.2f}",
         "ours ms": f"{r['ours_step_ms']:.2f}", "x torch": f"{r['ratio_to_torch']:.3f}", "loss ok": r["loss_ok"]}
        for r in after.rows if r["phase"] == "train"]
print(report.table(rows, list(rows[0])))

# %% [markdown]
# The step went from 0.52x to 0.855x with the kernels unchanged: the host path was most of the gap.
# What is left is in the kernels at this small model's shapes. Its dW GEMMs reduce over the 4096
# tokens into weights of 256x768 and 768x768. Those are six and nine 128x256 tiles on 132 SMs, and
# there is no split-K module for them, so they run at 0.55-0.58x cuBLAS (`host_check.json` in the
# same folder). The target of 1.03x is still not met.

# %% [markdown]
# ## One GEMM for q, k and v
#
# An attention's three projections read the same x. Run alone, k's and v's are narrow: at Llama-3-8B's
# 8 KV heads each is a quarter of q's width, and in a training step their dW GEMMs (512 x 2048 x 16384 in
# the 350M model below) make only 64 tiles of 128 x 128 for 132 SMs. `gemm_ladder.nn.patch(model,
# fuse=True)` makes the three one `SharedInput`: the first projection called computes
# `x . cat([Wq, Wk, Wv])^T` and hands its siblings their column slices while their input is the same,
# unwritten tensor. In the backward the layouts of the sections above do the rest: the three gradients
# are the columns of one dY, so dX is one KN GEMM with K = Nq + Nk + Nv (instead of three GEMMs and two
# sums of [tokens, hidden]), and dW is one MN GEMM with Nq + Nk + Nv rows, its tiles enough to fill the
# GPU. Nothing in the attention's forward is read or rewritten; a call that does not fit (another input,
# a tracer, an input off the GPU) is the projection's own.
#
# `benchmarks/e2e_check.py run ... --phase train` on an H200 (one run a configuration; the file's own
# clocks): llama-350m, 16 x 1024 tokens a step, AdamW under bf16 autocast with fp32 master weights.

# %%
for name in ("e2e_train_350_plain_32aa6c8.json", "e2e_train_350_qkv_32aa6c8.json",
             "e2e_train_350_fused_522336d.json"):
    run = teach.committed_run("2026-11-28_h200_e2e_train_350", name)
    r = run.rows[0]
    print(run.describe())
    print(f"  fusions {', '.join(r['fusions']) or 'none':18s} torch {r['torch_step_ms']:.2f} ms  "
          f"ours {r['ours_step_ms']:.2f} ms  x torch {r['ratio_to_torch']:.3f}  loss ok {r['loss_ok']}")

# %% [markdown]
# The groups alone take the step from 1.003x to 1.028x torch's (2.4 ms: two casts of x a layer, two sums
# of dX and k's and v's starved dW GEMMs); with the SwiGLU MLPs too (`fuse=True`, the MLP training its own
# formula on our linears with x cast once) 1.036x, issue 31's 1.03x training target, measured once on an
# H200. In inference the groups add 2-7% to decode under CUDA graphs
# (`benchmarks/results/2026-11-28_h200_e2e_qkv/`).
