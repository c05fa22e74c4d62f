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
# # 16 · FP8: the same kernel with 1-byte operands, a promotion and scales
#
# Hopper's tensor cores multiply float8 at twice the 16-bit rate. v9 runs fp8 e4m3 with no new
# template: the operand spec (`GemmSpec.fp8`) changes four parts of it (`gemm_ladder/sm90a/fp8.py`):
# the wgmma, the ring's slice of K, a *promotion* of the sums into fp32, and the scales in the
# epilogue. The front door is `gemm_ladder.scaled_mm`, with `torch._scaled_mm`'s semantics:
#
#     D[m, n] = round(sum_k A8[m, k] B8[n, k] * scale_a * scale_b + bias[n])
#
# From bf16 weights to an fp8 call is two lines of quantizing (`quantize_fp8` rounds as torch's
# recipes do: the scale is `amax / 448`, the value `x / scale` clamped and rounded to nearest even):

# %%
import torch

import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, check_built
from gemm_ladder.serve import kernel_pack, plan, scaled
from gemm_ladder.sm90a import fp8, hgemm_v9, mainloop
from gemm_ladder.teach import fp8 as teach_fp8

x, W = torch.randn(64, 256), torch.randn(512, 256)
xq, sx = gemm_ladder.quantize_fp8(x, "row")   # e4m3 [64, 256], scale [64, 1]
wq, sw = gemm_ladder.quantize_fp8(W, "row")   # e4m3 [512, 256], scale [512, 1]
print(xq.dtype, tuple(sx.shape), tuple(sw.t().shape))
print("what scaled_mm checks (no GPU needed):", scaled.check_call(xq, wq.t(), sx, sw.t()))
# on a GPU: y = gemm_ladder.scaled_mm(xq, wq.t(), sx, sw.t(), out_dtype=torch.bfloat16)

# %% [markdown]
# ## k32: the same 32 bytes of K a wgmma step
#
# A wgmma step reads 32 bytes of each K-major row: 16 fp16 values (k16) or 32 fp8 values (k32).
# So the descriptor steps through shared memory exactly as for 16-bit data, and a 128-byte swizzle
# row now holds 128 values of K: v9's fp8 slice is `blk_k = 128`, and a stage of a 128x128 tile
# is 32 KiB as at 16 bits with `blk_k = 64`. The instruction each module issues (accumulator
# registers elided), fp8 first, then v9 in bf16:

# %%
built8 = gemm_ladder.build("v9", 256, 256, 512, spec=GemmSpec.fp8("bfloat16", "row"))
built16 = gemm_ladder.build("v9", 256, 256, 512, dtype="bfloat16")
teach.describe(built8)
print(teach_fp8.wgmma_instruction(built8))
print(teach_fp8.wgmma_instruction(built16))

# %% [markdown]
# ptxas turns it into `QGMMA ... E4M3.E4M3` (the 16-bit one is `HGMMA`):

# %%
teach.source_excerpt(built8, r"QGMMA", source="sass", context=0, max_matches=2)

# %% [markdown]
# ## K-major only
#
# Look at the operands after the two descriptors: the 16-bit wgmma ends with `1, 1, 0, 0`
# (scale-a, scale-b, then *transpose A* and *transpose B*), the fp8 one with `1, 1`. PTX has the
# transpose immediates for `.f16`/`.bf16` only: for every other type both tiles must be K-major
# in shared memory. So an fp8 B stored `[K, N]` row-major (MN-major) cannot be read as it lies,
# as v9 reads a 16-bit one; the spec and the front door refuse it with the fix (transpose once,
# where the weight is made), instead of copying it behind the caller's back on every call:

# %%
try:
    check_built(GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row", b_major="N"), "v9",
                hgemm_v9.EPILOGUES)
except ConfigError as err:
    print("ConfigError:", err)
try:
    scaled.check_call(xq, wq.t().contiguous(), sx, sw.t())  # a row-major [K, N] B
except Exception as err:  # ModuleInputError
    print(type(err).__name__ + ":", err)

# %% [markdown]
# ## The promotion, and why
#
# Inside a chain of fp8 wgmmas the tensor cores do not keep fp32's 24 bits in the running sum:
# DeepSeek-V3's report measured about 14 on an H800. Every cut rounds toward zero, so over a long
# K the errors add up in one direction instead of averaging out. The cure (DeepSeek's, CUTLASS's)
# is to *promote*: every few K slices, retire the wgmmas, add the tensor cores' sums into a second
# fp32 array with the CUDA cores' exact adds, and start the tensor cores over from zero. A numpy
# model of just that (`teach.fp8.model_dot`: each k32 step's products exact, the running sum cut
# to 14 bits; the output rounded to bf16), against the exact product of the same e4m3 inputs, and
# the committed H100 check at K = 16384 (`benchmarks/results/2026-11-26_h100_fp8/`):

# %%
errors = teach_fp8.promotion_errors()
measured = teach_fp8.measured_promotion()
for K, none, promoted in zip(errors["K"], errors["none"], errors["promoted"]):
    print(f"K={K:6}  model: one chain {none:.4f}, promoted {promoted:.4f}")
print(f"H100 at K=16384: v9 promote=0 {measured['none']:.4f}, promote=1 {measured['promoted']:.4f}, "
      f"torch._scaled_mm {measured['torch']:.4f}")
teach.show(teach_fp8.plot_promotion(errors, measured))

# %% [markdown]
# With the promotion our error is torch's; without it, 3.3x torch's at K = 16384, which is what
# the model predicts. In v9 (`mainloop._run_promoted`) a group of `promote` slices runs into
# fresh accumulators, is retired (`wait_group(0)`), and is added to the total:

# %%
teach.show_source(mainloop._promote)

# %% [markdown]
# Its cost: a second array of fp32 sums in registers. A 128x256 tile over two consumers already
# holds 128 accumulators a thread; twice that does not fit, so the fp8 default is 128x128 (and the
# validator says so before anything compiles):

# %%
try:
    gemm_ladder.make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), blk_n=256)
except ConfigError as err:
    print("ConfigError:", err)
print(gemm_ladder.make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8()).knobs())

# %% [markdown]
# ## The scales, and where each is applied
#
# | recipe | scale_a | scale_b | where the kernel applies it |
# | --- | --- | --- | --- |
# | tensor | one value | one value | the epilogue: the sums times one scalar, before the bias and the rounding |
# | row | `[M, 1]` | `[1, N]` | the epilogue: each sum times its row's and its column's scale |
# | block (DeepSeek-V3: A 1x128, B 128x128) | `[M, K/128]`, M-major | `[K/128, N/128]`, the `.t()` of W's `[N/128, K/128]` | at each promotion: a K block's sums are scaled as they join the total |
#
# Per-tensor and per-row scales are constant along K, so they can wait for the end of the K loop;
# a block-wise scale changes every 128 of K and must be applied where the sums of one block are
# still apart: at the promotion, which is why the promotion is built first. The epilogue step
# (a step of its own, not an `EpilogueOp`, since an op sees a fragment's column only and the row
# recipe needs the row too):

# %%
teach.show_source(fp8.scale_sums)

# %% [markdown]
# ## Block-wise scales, at the promotion
#
# With block scales a thread's sum of one K block is multiplied by the scale of its row's 1x128
# group of A and of its column's 128x128 block of B before it joins the fp32 total, so the
# promotion's add becomes a multiply-add (one FFMA a sum every 128 of K, the slice that was just
# retired):
#
#     total[r] += acc[r] * (scale_a[kb, row(r)] * scale_b[col(r) / 128, kb])
#
# That ties the recipe to `blk_k = 128` and `promote = 1` (a promotion covers exactly one K block)
# and to slices landing in K order (no `k_zigzag`); the validator refuses anything else with the
# fix. Which scale register a sum takes follows the accumulator fragment: rows `lane/4` and
# `lane/4 + 8` of each 64-row atom (two A scales a thread an atom), and one B block per 128 columns
# (one for a 128-wide tile, two at 256). Those three floats are loaded from global memory (L2) one
# K block ahead, into the other of two register sets (the K loop runs two slices a turn: block
# g + 1's load before slice g's wgmmas are issued and are read a slice later, with no register move
# to wait on them), so the load's latency hides under a slice's wgmmas; DeepGEMM stages them through shared memory with the producer's TMA instead, which
# costs a TMA box and barrier bytes a stage for three floats a thread. The epilogue then scales
# nothing (a bias still is added). The layouts are those torch's `_scaled_mm` names BlockWise1x128
# and BlockWise128x128 (A's scales M-major, so a warp's rows are adjacent). Whether torch's own kernel
# runs them depends on its cuBLASLt: torch 2.11 with CUDA 13 does on an H200, so `scaled_mm` asks once per
# GPU, and where it does, times torch's block-wise kernel against ours at a shape's first call. Where it
# does not, the fallback is the dequantized product. On that H200, DeepGEMM's block-wise kernels, built
# from source, ran 1.08-1.47x faster than ours: 1281 TFLOPS at 4096x7168x16384 against our 1139
# (`benchmarks/results/2026-11-29_h200_fp8_block_deepgemm/`). What they do that ours do not is the
# open question of issue 32.

# %%
teach.show_source(fp8.BlockScales)
cfg = gemm_ladder.make_config("v9", 4096, 7168, 16384, spec=GemmSpec.fp8(scales="block"))
print({k: cfg.knobs()[k] for k in ("blk_k", "blk_n", "promote")})
try:
    gemm_ladder.make_config("v9", 4096, 7168, 16384, spec=GemmSpec.fp8(scales="block"), promote=2)
except ConfigError as err:
    print("ConfigError:", err)
x = torch.randn(4, 256)
xq, sx = gemm_ladder.quantize_fp8(x, "block")  # an activation's 1x128 groups
wq, sw = gemm_ladder.quantize_fp8(torch.randn(256, 256), "block", block=(128, 128))  # a weight's blocks
print("scale_a", tuple(sx.shape), sx.stride(), "scale_b", tuple(sw.t().shape), sw.t().stride())

# %% [markdown]
# ## Packs and `explain`
#
# The policy gives an fp8 problem v9's e4m3 kernel at the knobs the fp8 sweep measured
# (`plan.FP8_RULES`, `plan.fp8_knobs`): one set for small M (one row of tiles), one for the rest, v9's
# fp8 defaults with block scales; the tuning database only where it holds an entry of the problem's own
# spec (fp8 entries are timed against `torch._scaled_mm`: "Tuning fp8" below). A kernel pack
# for a weight is then a runtime-M module for each of the two ranges of M, the modules `scaled_mm`
# would build itself (`pack build --dtypes float8_e4m3 --fp8-scales row --fp8-out bfloat16`); with
# `explain=True`, `scaled_mm` says which module served a call and from where, and where none
# does, `torch._scaled_mm` computes it with a warning naming the `pack build` that would.

# %%
items = kernel_pack.plan_pack([], ["float8_e4m3"], sms=132, weights=[(4096, 7168)], fp8_scales=("row",))
for item in items:
    print(item["file"][:60] + "...", "serves M", [run["m_range"] for run in item["served"]])
print(plan.choose(plan.Problem(1, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "row"))).text())

# %% [markdown]
# ## Measured
#
# `benchmarks/fp8_check.py` on an H100 (700 W), kernels in CUDA graphs cycling input sets past L2,
# the same process and alternating rounds. All 14 real checks within 2x of `torch._scaled_mm`'s own
# error (the one `False` is the deliberate promote=0 at K = 16384 above). Speed, honestly:
# **0.63-0.86x `torch._scaled_mm`** at M >= 2048 with the promotion, though 1.20-1.29x our own bf16
# v9. As far as the runs tell: the promotion's `wait_group(0)` drains the tensor cores every 128 of
# K while the adds run (promoting every 256 instead, `every2`: 0.86x), and the second array of sums
# caps the tile at 128x128; a 128x256 tile without the promotion runs 1294 TFLOPS, 1.08x torch, at
# 1.9x torch's error at K = 4096 (128x128 without it: 3.3x at K = 16384). Next: overlap the adds
# with the next group's wgmmas, and a 128x256 tile over three consumer warpgroups. Small M (64, 128)
# is 0.42-0.68x as kernels: the fp8 rule has no small-M tiles yet.

# %%
teach_fp8.show_measured()

# %% [markdown]
# ## 192-row tiles over three consumers
#
# The promotion keeps two arrays of sums a thread: the tensor cores' and the promoted fp32 total. That
# is what capped the tile at 128x128 over two consumers: a 128x256 tile would need 256 registers a
# thread for sums alone.
#
# Three consumers of 64 rows each (192x128) need only 64 + 64, within the 152 registers each may hold.
# ptxas fits them without spills (`tests/test_fp8_overlap.py`). Each slice then reads 40 KB of
# operands for 24576 products, against 32 KB for 16384 at 128x128: a fifth less operand traffic a
# product, and the three consumers' drains interleave.
#
# On an H100 (`benchmarks/results/2026-11-26_h100_fp8_wide/`), in 1x2 clusters:
# - 8192^3: 1243-1326 TFLOPS against 128x128's 1144-1180; through a kernel pack, 1.073x
#   `torch._scaled_mm`.
# - 4096^3: 4% slower. Its 704 tiles fill 5.3 waves of 132 SMs, and the sixth wave runs a third full.
#
# Row scales, applied in the epilogue as the tensor's are, gain the same: 1.02-1.03x torch's rowwise
# `_scaled_mm` against 0.94x.
#
# ## 128x256 tiles, promoted in halves
#
# The registers allow a 128x256 tile after all, if the promotion does not keep a whole second array.
# Issue each promotion group's wgmmas as two 128-column groups (`m64n128k32`, the second half's B
# descriptor 128 rows further) into one 64-register set, and add each half into its half of the total
# before issuing the other (knob `halves`): 128 sums and 64 accumulators a thread. A fragment's
# register `r` holds column `8 (r // 4) + ...`, so half `h`'s accumulator `r` is the total's register
# `h * 64 + r`, nothing to shuffle. Each half drains the consumer's tensor-core queue before its adds;
# the other consumer's wgmmas fill that gap.
#
# On two H100s (`benchmarks/results/2026-11-27_h100_fp8_halves/`), promoted every 2 slices (256 of K,
# at torch's error to K = 16384): **1.03-1.05x `torch._scaled_mm` at 4096^3**, where 128x128 with
# `overlap=4` ran 0.93-0.995x; 1.02x at 4096x7168x16384; level with the wide tiles at 8192^3. Every
# slice drains twice as often (3-4% slower); every 4 slices holds all four ring stages through both
# halves, and the producer waits (0.70x).
#
# So the policy weighs the three tiles' waves by their measured rates (`plan.fp8_tile`):

# %%
for M, N in ((4096, 4096), (8192, 8192), (4096, 7168)):
    problem = plan.Problem(M, N, 8192, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "tensor"))
    print(f"{M}x{N}:", plan.fp8_tile(M, N), plan.rule_choice(problem).rule, plan.fp8_knobs(M, N, 8192, "tensor"))

# %% [markdown]
# ## The epilogue under the next tile
#
# With the promotion, the last thing a tile does before its epilogue is drain the tensor cores and add;
# then both consumers scale, round and store 128x256 values while the tensor cores idle. At 4096^3 an fp8
# tile's K loop is half a 16-bit one's, so that gap weighs twice as much.
#
# The 16-bit kernels hide it with `epi_under`: the tile's sums become 16-bit pairs, and its chunks leave
# under the next tile's first slices. fp8 keeps that shape and moves the stores to the first
# *promotion group* (`mainloop.Consumer.run_under`):
#
# - once the last group is added, the total is scaled and rounded into pairs (64 registers a thread), and
#   starts over at 0;
# - the next tile's first group issues half 0's wgmmas; while they run, half 0's columns of the old tile
#   leave (stmatrix, TMA store); then the drain and the adds, as in any group; the same for half 1.
#
# Two ways that did not work, both visible in ptxas's report before anything runs on a GPU:
#
# - making the first group's sums *be* the total (a copy instead of adding into zeros): ptxas ran out of
#   registers for the wgmma pipeline and serialised every wgmma;
# - storing straight from the total, with no pairs: the whole total, the accumulators in flight and the
#   stores' addresses do not fit 232 registers, and the spills cost 40% (0.6x).
#
# Measured (`benchmarks/results/2026-11-27_h100_fp8_under/`, four runs, same rounds): halves at 4096^3
# +1.0-1.6%, 1.047-1.089x `torch._scaled_mm` (1.027-1.038x on a third H100); the wide tiles -0.3 to +2.3% at 8192^3 (1.008-1.035x), where
# the tile boundary is a smaller share of 21 waves. Block scales in halves (each half promoted with its own
# B block's scale) peel their first slice the same way. With their scales staged in the ring by the
# producer's TMA (`stage_scales`: each slice's scales read from its slot under half 0's wgmmas, nothing
# loaded from global memory on the consumers' path; three stages, as four do not fit beside the staging):
# 1118-1219 TFLOPS, 1.006-1.050x `torch._scaled_mm` block-wise, +5.4-10.6% over 128x128 with staged scales
# (`benchmarks/results/2026-11-27_h100_fp8_block_staged_halves/`), so block scales take them where their
# waves fill best (`fp8-block-halves`).
# The policy turns it on for all three:

# %%
print(plan.fp8_knobs(4096, 4096, 4096, "tensor"))
print(plan.fp8_knobs(4096, 7168, 16384, "block"))

# %% [markdown]
# ## Too few tiles: a split K
#
# At M = 64 or 256 a DeepSeek-V3 or Llama weight gives few tiles: 2112x7168 at M = 64 is 33 tiles of 64x64 (17
# clusters of two) on 132 SMs, each running the whole K. The 16-bit ladder's answer is v10's split K: a tile's K
# over several CTAs, the last one adding up their fp32 partials. fp8 takes it with one change: each unit's
# partials are its *promoted* sums (the fp32 total), and the scales are applied once, by the last unit, after
# the sum (per-tensor and rowwise; block scales apply at each promotion, by K block, so they stay on v9).
#
# A split that does not divide the slices gives a unit a count known only at run time (56 slices in three:
# units of 18 and 19). The promotion every slice needs no count at trace time: a loop of one-slice groups
# (`mainloop._run_promoted_each`), or with `overlap`, whole runs of groups and then the rest drained a slice at a
# time (`_run_overlapped_each`). Stream-K's pieces take the same loop.
#
# How many ways: the units' waves, `ceil(cluster tiles * ways / clusters) / ways` of a whole K loop, least for up
# to three ways, and only where that is at most half the unsplit time (`plan.fp8_split_ways`). Measured
# (`benchmarks/results/2026-11-27_h100_fp8_subwave/`): 64x2112x7168 0.60x -> 0.83x `torch._scaled_mm` (three ways,
# the small-M tiles with `overlap=4`), 64x4096x14336 0.87x -> 0.95x, 256x2112x7168 0.60x -> 0.64x (three ways
# instead of two), and 128x128 tiles under one wave (split or not) wait on their loads more than on the
# tensor cores, so they take a 6-stage ring (`plan.FP8_SUBWAVE_DEPTH`: 256x7168x16384 0.78x -> 0.88x,
# 256x4096x14336 split 0.83x -> 0.91x). Stream-K was slower than the tiles it would replace at every sub-wave shape tried (0.56-0.77x
# against 0.69-0.86x): at these K a piece's meeting (a fence, 64 KiB published or read back, a drained loop)
# costs more than the idle SMs it fills.
#
# ## Or tiles that fill one wave
#
# A split is not the only way to use idle SMs: a smaller tile whose count comes to one whole wave does it
# without partial sums. cuBLASLt does this (ncu: 64x64 tiles, 132 CTAs, at 256x2112x7168; 128x96 at
# 256x6144x4096). Of our tile widths, 64-row tiles over one consumer fit: at M = 256, 4 rows of 64x64 over
# 2112 columns are 4 x 33 = 132 tiles, and of 64x128 over 4096 columns 128. Paired in 2x1 clusters, the two
# row tiles of a cluster share B's tile (the larger operand; 1x2 clusters, sharing A, ran 0.77x against
# 0.995x). `plan.fp8_fill_n` takes them where 128x128 would fill at most half the SMs and these come to 95-100%
# of a wave (`fp8-fill`, before the split): measured (`benchmarks/results/2026-11-28_h100_fp8_fill/`),
# 256x2112x7168 0.67x -> 0.82x `torch._scaled_mm` (64x64, a 12-stage ring), 256x4096x14336 0.91x -> 0.99x,
# and on a weight it was not chosen on, 256x4096x4096, 0.72x -> 0.90x. cuBLASLt's 64x64 kernel is still
# faster: it runs two consumers on one tile (384 threads a CTA against our 256), which this ladder does not
# build yet.

# %%
for M, N, K in ((64, 2112, 7168), (64, 4096, 14336), (64, 6144, 4096), (256, 2112, 7168), (256, 4096, 4096),
                (256, 6144, 4096)):
    rung, knobs = plan.fp8_module(M, N, K, "tensor")
    how = f"fill {plan.fp8_fill_n(M, N)} wide" if plan.fp8_fill_n(M, N) else f"{plan.fp8_split_ways(M, N, K)} way(s)"
    print(f"{M}x{N}x{K}: {how} -> {rung}",
          {k: knobs[k] for k in ("blk_m", "blk_n", "cluster_m", "split_k", "overlap", "pipe_depth") if k in knobs})

# %% [markdown]
# ## Or cuBLASLt's widths
#
# Past M = 256 the tile counts that fill a wave are rarely 64 or 128 columns wide. cuBLASLt's kernels at our
# weakest shapes (torch's profiler, ncu) were 128x144 at 1024x2112x7168 (8 x 15 = 120 tiles), 128x96 at
# 256x6144x4096 and 128x112 at 256x7168x16384 (128 each). The wgmma takes any N in whole 8s; what held our
# widths to whole 64s was the epilogue: a chunk left in 64-column TMA boxes, one 128-byte swizzle row of 16-bit
# D. A TMA box of a swizzled tensor is at most one swizzle row wide, and the swizzle can be narrower: 64 or 32
# bytes. So a staging chunk takes the widest swizzle that divides its row, and its boxes one swizzle row each
# (`epilogue.chunk_swizzle`):

# %%
from gemm_ladder.sm90a import epilogue  # noqa: E402

for cols in (64, 96, 112, 144, 48, 16):
    mode, box = epilogue.chunk_swizzle(cols, 2)
    print(f"a {cols}-column bf16 chunk: {mode} swizzle, {cols // box} box(es) of {box} columns")

# %% [markdown]
# With that, v9 takes any blk_n in whole 16s from 64 to 256, and the policy weighs those widths' waves by
# their measured rates, as it weighs 192x128 and 128x256 (`plan.fp8_width`, rule `fp8-width`; narrower than
# 128 only up to M = 512, where it was measured). The narrow tiles move more operand bytes a product, so
# their rates are lower; 128x224 is promoted in halves, two 112-wide groups. Measured
# (`benchmarks/results/2026-11-28_h100_fp8_widths/`): 1024x2112x7168 0.72x -> 0.84x `torch._scaled_mm`
# (128x144), 256x7168x16384 0.85x -> 0.93x (128x112), 1024x7168x16384 0.89x -> 0.98x (128x224), and at 18
# shapes it was not chosen on, faster at each (+9% geomean). 128x144 holds no second accumulator set, so its
# promotion drains the tensor cores; every 2 slices instead of every one it gained 9-13% at K = 7168 (0.92x at
# 1024x2112x7168), while the overlapped tiles were level. A width that divides N also fills waves: at
# 4096x2112x7168 192x128 tiles leave a 17th column of tiles half empty, 128x176 (12 x 176 = 2112) do not,
# 1.076x against 0.991x. At cuBLASLt's own tiling ours still trail it (0.84x at 256x6144x4096): the tiles are
# the same now, the gap is inside them (a second consumer on a 64-row tile, as cuBLASLt's 64x64 kernel runs,
# measured slower: `benchmarks/results/2026-11-28_h100_fp8_kconsumers/`).

# %%
for M, N, K in ((1024, 2112, 7168), (256, 6144, 4096), (256, 7168, 16384), (1024, 6144, 4096), (1024, 7168, 16384),
                (4096, 2112, 7168)):
    rung, knobs = plan.fp8_module(M, N, K, "tensor")
    print(f"{M}x{N}x{K}: {plan.fp8_tile(M, N)} -> {rung}",
          {k: knobs[k] for k in ("blk_n", "epi_n", "overlap", "halves", "pipe_depth") if k in knobs})

# %% [markdown]
# ## Inside the tile: the loop unrolled
#
# What was left at those shapes was inside the tile, and ncu's warp-stall sampling over the SASS said where
# (256x2112x7168, our 64x64 fill tile beside cuBLASLt's 64x64, `benchmarks/results/2026-11-28_h200_fp8_unroll/`):
# not waiting for data but issuing. A consumer warp ran some 95 instructions a slice of K, of which 32 FADDs
# (the promotion, the same as cuBLASLt's) and 4 wgmmas; most of the rest moved the ring's slot and the wgmma
# descriptors. nvcc had kept that arithmetic in vector registers and copied it to uniform ones (`R2UR`) for every
# wgmma, which takes its descriptors from uniform registers only; cuBLASLt's loop does it in uniform registers
# (`UIADD3`). With the loop over runs unrolled over the whole tile, nvcc keeps it uniform too: v9's `unroll_k`.
# Unrolled code is long, and two accumulator sets plus the total take registers, so the knob is held to where
# it was measured to pay: 64 rows a consumer, 64 or 112 wide (64x128 over one consumer and 128x96 spilled), at
# most 168 registers of sums a thread and about 6400 instructions of unrolled loop (112 slices of 64x64 ran 26%
# slower: the instruction cache).
# fp8's descriptors also move by a 32-bit add on their low word now (`common.desc_plus`: the address field
# cannot carry), where a 64-bit sum made nvcc carry into the high word for every wgmma.

# %%
from gemm_ladder.core import budget  # noqa: E402

for tile, K in (((64, 64, 1), 7168), ((64, 64, 1), 14336), ((128, 112, 2), 4096), ((64, 128, 1), 14336)):
    regs, loop = budget.fp8_unroll_cost(*tile, K)
    print(f"{tile[0]}x{tile[1]} over {tile[2]} consumer(s), K = {K}: {regs} registers of sums, ~{loop} "
          f"instructions unrolled -> {'unroll_k' if budget.fp8_unroll_fits(*tile, K) else 'rolled'}")
for M, N, K in ((256, 2112, 7168), (64, 6144, 4096), (256, 6144, 4096), (256, 4096, 14336)):
    rung, knobs = plan.fp8_module(M, N, K, "tensor")
    print(f"{M}x{N}x{K}: {rung}, unroll_k={knobs.get('unroll_k', False)}, promote={knobs.get('promote', 1)}")

# %% [markdown]
# Measured against the same tiles rolled (run 22): 256x2112x7168 0.823x -> 0.859x `torch._scaled_mm`,
# 64x6144x4096 0.951x -> 0.983x, 256x6144x4096 0.844x -> 0.867x, and at the four shapes it was not chosen on
# faster or level. Unrolled, the 64x64 fill tile has registers to spare, and promoting every 2 slices halves its
# adds: 256x2112x7168 0.87x -> 0.90x, faster or level at five shapes held out (`plan.FP8_FILL_PAIRS`; 128x112 so
# promoted spilled, and `unroll_k` refuses it). The suite on one H200, before and after: 0.993x -> 1.010x
# per-tensor, the lowest case 0.82x -> 0.87x (`benchmarks/results/2026-11-28_h200_fp8_suite/`). cuBLASLt still
# leads at 256x6144x4096 (128x112 against its 128x96, 0.87x) and by 10% at 256x2112x7168.

# %% [markdown]
# ## The call, not only the kernel
#
# At small M a call's time is the host's, not the kernel's: a 9 us kernel behind a 30 us launch path runs at
# the launch path's pace. Through its checked path `scaled_mm` spent 23-40 us of host a call on the H200 box,
# where `torch._scaled_mm` spends 15-24, so at M = 64 our per-tensor calls ran 0.79-1.06x torch's while our
# kernels ran 0.95-1.04x its. A call like one already checked (the same shapes, strides, dtypes and devices of its six
# tensors, and `out_dtype` and `strict` as passed) now skips the checks its layout settles. It is looked up in
# C++ (`fastpath.cpp`'s `scaled_lookup`), which makes the views the launch takes and D itself before calling
# the bound launch: 11-16 us of host (`benchmarks/results/2026-11-29_h200_fp8_host/`). What depends on
# addresses is checked again on every call: grad wanted, block scales 16-byte aligned, `out` apart from what
# the kernel reads.
#
# ## Tuning fp8
#
# The policy's fp8 knobs come from sweeps, and the tuner can search around them:
# `python -m gemm_ladder tune --rung v9 --shape 4096x2112x7168 --dtype float8_e4m3 --fp8-scales block`.
# - The tile, the consumers and the promotion stay the policy's. Its ring depth, tile order, L2 group and
#   clusters vary (`tune.space.FP8_CHOICES`), the policy's own value among them.
# - Each candidate is checked against the float64 product of the dequantized inputs and timed against
#   `torch._scaled_mm` on the same fp8 inputs.
# - The kernels are timed in CUDA graphs. Queued calls would time the module's Python call: 125.6 TFLOPS
#   against 619.7 for the same candidates at 256x2112x7168.
# - The best goes into the database as an entry of its operand spec. `scaled_mm`'s builds and `pack build`
#   then take it for every shape of its bucket.
#
# The first run on an H200 (`benchmarks/results/2026-11-29_h200_fp8_tune/`) covered 144 candidates at seven
# shapes, all correct. Its bests beat the policy's own kernel at five of them, by 2-15% in the same rounds.
# The front door builds a module that reads M at run time, and only one entry kept its win in that form.
# Block scales at 4096x2112x7168 in 1x1 clusters ran +8.4% there, and +8.6% at 4096x2560x6144, a shape of the
# bucket not tuned on. That entry is the packaged database's. The small-M entries lost at shapes of their
# buckets: 16% at 200x4096x12288. So they were not kept.

# %%
from gemm_ladder.tune import jobs, space as tune_space  # noqa: E402

sp = tune_space.search_space("v9", (4096, 2112, 7168), "bfloat16", spec=jobs.fp8_spec("block"), progress=False,
                             space={"cluster_n": [1], "l2_group_size": [8, 16]})
print(sp.counts(), "varied:", {k: v for k, v in sp.choices.items() if len(v) > 1})
print(plan.fp8_policy(4096, 2112, 7168, "block")[2].rsplit(";", 1)[0] + ")")

# %% [markdown]
# ## Mid M: a wave lost to clusters, and swapped operands
#
# Between M = 256 and 768 the rules once ran at 0.36x `torch._scaled_mm` (320x4096x14336). The cause was the
# grid. A persistent kernel walks a grid of *cluster* tiles. 128x112 tiles at M = 320 make three rows of 37, 111
# tiles: one wave of 132 SMs. In 2x1 clusters the three rows round up to four, and 2 x 37 = 74 clusters pass
# the 66 a wave holds. So the kernel took two waves for one wave's tiles. Now `fp8_tile` weighs each tile in the
# cluster it would run in (`plan.fp8_tile_cluster`), and an odd row of tiles runs unclustered where the pair
# would add a wave. On an H200 that made 22 of 22 shapes faster, 1.16-2.08x
# (`benchmarks/results/2026-11-29_h200_fp8_mid/`).
#
# What was left is the tile's height. v9's tiles come in 64-row steps, because M is wgmma's 64-row slot, so at
# M = 320 three rows of 128 cover 384. cuBLASLt's kernels there swap the operands. B's rows fill the 64-row
# slot, and M becomes wgmma's N, which takes any multiple of 8. Its tiles are 80 rows of M at 320 and 160 at
# 640: they divide M. v11 (swap AB) builds per-tensor fp8 the same way now: `wgmma.m64n80k32.f32.e4m3.e4m3` with
# B's type first. The rule `fp8-swap` takes it where v9's tile pads M by 12% or more (or fills at most half the
# SMs) and the swapped tile fills its waves better. Its rates were fitted to 24 A/Bs. At 11 shapes it was not
# fitted on, 10 ran faster, 1.13-1.88x, and one level (0.99x).
#
# A narrow weight needs narrower tiles. DeepSeek-V3's 2112x7168 has 33 columns of 64-row tiles of N, so M over
# four rows of tiles makes 132: one full wave, at any M. cuBLASLt runs exactly that (64x160 at M = 640). With 64
# columns a tile has one 64-row wgmma atom, and who issues it matters:
# - One consumer holds the sums, the tensor cores' accumulators and a second set to overlap the promotion with
#   the next wgmmas: three sets of `blk_m / 2` registers. Up to 128 rows of M they fit, and 128x64 ran 1.24x the
#   rules' v9 tile at 512x2112x7168.
# - Past 128 rows there is no room for the second set, and a drained consumer is slow (160x64 0.96x the rules).
#   `split_m` gives each of two consumers half of the rows of M instead: both read the same 64 rows of B, each its
#   own rows of A (its wgmma's B descriptor starts at its first row), each stages and stores its own rows of D.
#   Each is `m64n80` at 160 rows and overlaps its promotion: 1.19x the rules at 640x2112x7168, 1.02x torch.
#
# Rowwise scales take the swapped operands too. The sums are D^T's fragment, its rows N and its columns M, so
# each thread keeps B's scales of its rows in registers and multiplies by A's scale of each column
# (`fp8.SumScales`' `swapped`). Block scales stay on v9: they are applied by K block at each promotion, indexed
# by the tile's rows. Held out (`benchmarks/results/2026-11-30_h200_fp8_narrow/`), against the rules before:
# per-tensor 14 of 14 faster or level, 1.005-1.30x; rowwise 12 of 12 faster, 1.11-1.93x.

# %%
for M, N, K in ((320, 4096, 14336), (320, 2112, 7168), (640, 2112, 7168), (640, 4096, 14336), (384, 4096, 14336)):
    rung, knobs = plan.fp8_module(M, N, K, "tensor")
    print(f"{M}x{N}x{K}: {rung}", {k: knobs[k] for k in ("blk_m", "blk_n", "split_m", "cluster_m", "overlap")
                                   if k in knobs})

# %% [markdown]
# ## Where fp8 stands (one H200, 2026-11-29 and 30)
#
# | | measured | against |
# | --- | --- | --- |
# | per-tensor suite (DeepSeek-V3's and Llama-3-8B's weights, M = 64, 256, 1024, 4096), kernels | 1.010-1.018x, lowest 0.92-0.94 | `torch._scaled_mm` |
# | the same with M = 320-768 too (packs), kernels | 0.986x, lowest 0.75 (6 of 45 under 0.9) | `torch._scaled_mm` |
# | rowwise, the same 45 rows, kernels | 1.241x, lowest 0.94 | `torch._scaled_mm` |
# | the same, calls | 1.22-1.23x, lowest 0.97-1.01 (0.945x before the repeated call) | `torch._scaled_mm` |
# | rowwise suite, kernels / calls | 1.27x / 1.29x, lowest 1.02 / 1.04 | `torch._scaled_mm` |
# | 4096^3 and 8192^3, per-tensor and rowwise | 1.054-1.082x, 1254-1354 TFLOPS | `torch._scaled_mm` |
# | 8192^3, fp8 over bf16 | 1.87-1.95x | our own bf16 kernel |
# | block suite, the front door (first use takes torch's where faster) | 1.089x, lowest 0.93 | torch's block-wise `_scaled_mm` |
# | block, 4096x7168x16384 | 1139-1185 TFLOPS, 0.889x | DeepGEMM (1281 TFLOPS) |
#
# Why block scales trail: their sums must be scaled as each 128 of K joins the total, twice as often as
# the per-tensor tile promotes. That is one FFMA an accumulator every 128 of K, issued by the warps that also
# issue the wgmmas: 60% more instructions than per-tensor, and the tensor pipe busy 80% of the time instead of
# 94% (Nsight Compute, `benchmarks/results/2026-11-29_h200_fp8_block_ncu/`). Within one consumer the adds cannot
# run under its own wgmmas, because a 128x256 tile's two halves share one accumulator set. A second set would
# not fit: the total, two half sets and the stored output pairs come to 320 registers a thread. Without the
# epilogue under they come to 256. A thread can address 255 at all, and `setmaxnreg` already gives each consumer
# 232. What is left is where the adds issue: interleaved with the QGMMAs in the SASS, as DeepGEMM does.
