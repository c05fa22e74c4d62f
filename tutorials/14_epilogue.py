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
# # 14 · The fused epilogue: what runs between the accumulators and the TMA store (v9)
#
# A model's linear layer is rarely `x · Wᵀ` alone: it is `act(x · Wᵀ + b)`, often followed by a
# residual add, and the MLP of most current LLMs is SwiGLU, `silu(x · W_gateᵀ) * (x · W_upᵀ)`.
# Run as torch runs them, each step after the GEMM is a kernel of its own that reads D from HBM
# and writes it back. v9's epilogue (tutorial 10) already holds every output value in registers,
# in fp32, before it rounds it to 16 bits; a fused epilogue does the rest of the layer's math
# there, on the way out:
#
#     D = act(alpha · acc + bias) + beta · C          (acc: the fp32 accumulators of A · Bᵀ)
#
# | piece | where it runs | what it reads |
# | --- | --- | --- |
# | `alpha`, a runtime fp32 scalar | `ScaledOp`: on each accumulator, first | a kernel parameter |
# | `+ bias[n]` | `BiasOp`: widened to fp32, before the rounding | `bias [N]` in D's dtype |
# | `relu`, `gelu_tanh`, `gelu_erf`, `silu` | `ActivationOp`: fp32 formulas (`tanhf`, `erff`, `expf`) | nothing |
# | `+ beta · C` | `ResidualRead`: C's chunk loaded by TMA into the staging buffer, read back with `ldmatrix` | `C [M, N]` |
# | fp32 D | 32-bit stores into the staging buffer, 32-column TMA boxes | nothing |
# | SwiGLU | a gated B: gate and up columns of one output meet in one thread | `W_gu = cat([W_gate, W_up])` |
#
# Everything else is v9 as tutorial 10 left it: each consumer warpgroup stores its rows in
# 64-column chunks through two staging buffers, the TMA store of one chunk draining while the next
# is written.

# %%
import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.core.spec import spec_for
from gemm_ladder.measure import report
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import epilogue, producer
from gemm_ladder.teach import fusion

# %% [markdown]
# ## The hook: an `EpilogueOp`
#
# The epilogue calls one function on every accumulator where it rounds it: `op.apply(value, reg,
# lane_id, n0)` returns the fp32 expression the value becomes (`reg` and `lane_id` give its column
# through the m64nNk16 fragment's layout, `n0` the tile's first column), and `apply` is
# `at_column(value, column)`, the op at a column of D however the caller found it (swap AB finds it
# elsewhere, below). An op also says which tensors it reads (`operands`) and takes their buffers once
# the kernel's parameters exist (`bind`). The bias is the smallest example:

# %%
teach.show_source(epilogue.EpilogueOp)
teach.show_source(epilogue.BiasOp)

# %% [markdown]
# The operand spec (`gemm_ladder/core/spec.py`) says what a GEMM's epilogue is; `op_of` nests the
# ops it asks for, and the spec's `operands()` is the kernel's parameter list in order (the
# runtime passes them in this order, after the launch scalars):

# %%
spec = spec_for("bfloat16", "alpha_bias_gelu_tanh+residual")
print(spec.text())
print(epilogue.op_of(make_config("v9", 4096, 4096, 4096, spec=spec)))
for op in spec.operands():
    print(f"  {op.name:5} {op.dtype:9} {'x'.join(op.shape) or 'scalar':6} {op.role}")

# %% [markdown]
# Where the ops are applied: each 16x16 block of a chunk is four `cvt` roundings of accumulator
# pairs and one `stmatrix`. With a residual, C's block is first read (`ldmatrix`, the inverse of
# `stmatrix`, at the addresses the store will write) and `beta · C` added in fp32; with a gated B
# each value is `op(gate) * up`:

# %%
teach.show_source(epilogue.acc_chunk_to_smem_stmatrix)

# %% [markdown]
# ## SwiGLU's paired columns
#
# SwiGLU needs the gate and the up projection of the *same* output column in the same thread. The
# kernel multiplies x by `W_gu = cat([W_gate, W_up])` (`[2N, K]`) and loads each B tile as two
# halves: its first `blk_n / 2` rows are gate rows, the others the up rows of the same outputs. So
# accumulator column `c` and `c + blk_n / 2` are the same thread's registers `r` and
# `r + acc_stride / 2`, and D (`[M, N]`, half the kernel's columns) gets `silu(gate) * up`:
# half the output bytes, and no `[M, 2N]` intermediate at all.

# %%
teach.show_source(producer.gated_row)

# %% [markdown]
# ## Why fusing pays: the round trips it saves
#
# Count each tensor once per kernel that touches it. `F.linear` then an activation writes D, then
# reads it and writes it again: two more passes over D than the fused kernel. A residual add after
# `F.linear` reads D and C and writes the sum; `.float()` after a 16-bit GEMM reads D and writes
# twice its bytes; Hugging Face's SwiGLU runs two GEMMs (x read twice), `silu`, and the product
# (seven passes over an `[M, N]` tensor where the fused kernel makes one). The extra kernels do no
# math: they take bytes / bandwidth. At Llama-3-8B's shapes (hidden 4096, MLP 14336), with the
# wave model's H100 (3.0 TB/s, 700 TFLOPS):

# %%
llama = [(128, 4096, 4096), (2048, 4096, 4096), (8192, 4096, 4096), (2048, 14336, 4096)]
rows = fusion.model_rows(llama, ops=("bias_act", "residual", "fp32_out"))
rows += fusion.model_rows([(128, 14336, 4096), (2048, 14336, 4096), (8192, 14336, 4096)], ops=("swiglu",))
print(report.table(rows, list(rows[0])))

# %% [markdown]
# At M = 128 the GEMM itself is bound by reading W, and D is small: fusing saves little. From a
# few thousand tokens on, the GEMM is compute-bound and every pass over D is time added after it:
# about 11% for an activation, 17% for a residual add. The picture, for one MLP-sized shape: bytes
# per path (left) and the modelled time per kernel (right).

# %%
teach.show(fusion.plot_epilogue_bytes(2048, 14336, 4096))

# %% [markdown]
# ## The generated code
#
# One config, bias + `gelu_tanh` in fp16: the lines of TVM's CUDA where the first accumulator
# pair of a chunk gets its bias (`pre_act`: the `Let` of `ActivationOp`, bound once because the
# formula reads it five times), the activation and the rounding (`cvt` to a half pair), then the
# `stmatrix` into the staging buffer, the proxy fence, the consumer's barrier and the TMA store.
# A tile past N reads N's last bias value (`min(col, N - 1)`): the store clips those columns.

# %%
built = gemm_ladder.build("v9", 512, 1024, 256, spec=spec_for("float16", "bias_gelu_tanh"))
teach.describe(built)
fusion.show_epilogue(built)

# %% [markdown]
# SwiGLU's rounding, from a second small build: `silu(gate)` (`x / (1 + exp(-x))`) times the up
# value, which is the same thread's register `acc_stride / 2` further (the B tile's second half):

# %%
swiglu = gemm_ladder.build("v9", 512, 2048, 256, spec=spec_for("float16", "swiglu"))
print(swiglu.cfg.blk_n, "columns a tile:", swiglu.cfg.blk_n // 2, "gates and their", swiglu.cfg.blk_n // 2, "ups")
fusion.show_epilogue(swiglu, "gated")

# %% [markdown]
# ## The same epilogue in a split tile and in swap AB (v10, v11)
#
# v9 is not the only kernel that serves a layer. Where tiles are few (a short prompt, a decode step)
# the policy takes split K (v10: several CTAs share a tile's K loop and the last one to finish sums
# their fp32 partials) or swap AB (v11: the weight's rows fill wgmma's 64-row slot, M becomes its N).
# Both end in an epilogue, so the op goes where the tile is stored:
#
# - **v10**: the last unit of a tile runs v9's chunked epilogue on the sum of the partials, the op and
#   the residual as v9 applies them. C is loaded at each chunk: v9's `c_prefetch` loads it before the
#   K loop, and a unit does not know then whether it will be the last. Which unit is last depends on
#   other CTAs' atomics; the barrier checker (tutorial 12) runs one cluster, so the kernel marks that
#   branch (`COUNTED_BRANCHES_ATTR`) and the checker takes it both ways, every other time.
# - **v11**: the accumulators hold Dᵀ, and `stmatrix .trans` writes them to the staging buffer as D.
#   A value's column of D is its *row* of the Dᵀ fragment, `16·warp + 8·half + lane / 4` within its
#   64-row atom; both registers of a pair share it. So the bias is read per fragment row and
#   `at_column` gets that column. The residual and a float32 D are not built for v11 (C would have
#   to be read back with `ldmatrix .trans`; `stmatrix` stores 16-bit values).

# %%
teach.show_source(epilogue.acc_to_smem_stmatrix_trans)

# %% [markdown]
# The two lines of v11's CUDA where one pair is packed for `stmatrix .trans`: the bias index is
# the tile's first column of N plus the fragment row (`warp · 16 + lane / 4`, and `+ 8` for the
# second half), the same for both registers of the pair.

# %%
swapped = gemm_ladder.build("v11", 16, 4096, 1024, spec=spec_for("bfloat16", "bias"), blk_m=16, split_k=2)
teach.describe(swapped)
body = swapped.cuda_source().split("__global__")[-1]
packs = [line.strip()[:220] for line in body.splitlines() if "cvt_bf16x2" in line and "bias_ptr" in line]
print("\n".join(packs[:2]))

# %% [markdown]
# ## Check and time (GPU only)
#
# On an H100 or H200 this checks the module built above (random inputs and bias, output poisoned,
# against a float64 reference with torch's own error as the yardstick) and times it against
# torch's unfused path, `addmm` then `gelu_tanh`, in a child process (a hang is reported, not
# waited on).

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
else:
    print(teach.no_gpu_message("sm_90a"))

# %% [markdown]
# ## Measured
#
# Two committed runs on one H100. First, bias + activation (`python -m gemm_ladder bench`, fp16,
# queued calls in 6 alternating rounds: call level; this epilogue alone has no kernel-level run
# yet) against torch's unfused path, `addmm` then the activation, beside the model's ratio. `relu` and `gelu_tanh` land on the model; `silu` gains
# more than it says (torch's separate `silu` pass costs more than the one read and one write the
# model gives it; not profiled).

# %%
acts = teach.committed_run("2026-11-26_h100_fused_activations", "act_bench.json")
print(acts.describe())
print(teach.sampled_clocks("2026-11-26_h100_fused_activations", "clocks_bench.csv"))
rows = fusion.activation_rows(acts.rows)
print(report.table(rows, list(rows[0])))

# %% [markdown]
# Second, `benchmarks/epilogue_check.py` (bf16, every case checked first against a float64
# reference with the output poisoned; then kernels in CUDA graphs cycling input sets that spill
# L2, and queued calls), at Llama-3-8B's weights and M = 128, 2048, 8192, against torch's
# *best* path for the same result: for a residual that is `addmm(C, x, Wᵀ)` (cuBLAS adds C in its
# own epilogue), for fp32 D `mm(out_dtype=float32)`, for SwiGLU the faster of two linears and one
# linear over `W_gu`. The H100 is power-capped at 700 W: under these shapes its SM clock falls well
# below its 1980 MHz maximum (the samples in the run's `clocks.csv`, summed up below), and every
# ratio compares ours and torch's at the same clocks, taking turns in rounds.

# %%
epi = teach.committed_run("2026-11-26_h100_epilogue", "epilogue_check.json")
print(epi.describe())
print(teach.sampled_clocks("2026-11-26_h100_epilogue"))
kernel, call = teach.ratio_summary(epi.rows), teach.ratio_summary(epi.rows, value="call_ratio")
for k, c in zip(kernel, call):
    k["call geomean"], k["call lowest"] = c["geomean"], c["lowest"]
print(report.table(kernel, ["op", "rows", "geomean", "lowest", "call geomean", "call lowest"]))

# %% [markdown]
# Issue 31's target is ≥ 1.10x torch's unfused path and ≥ 1.03x cuBLASLt's fused epilogue
# (geomean, kernel level). **SwiGLU meets it (1.118x).** The residual (0.986x) and fp32 output
# (0.997x) do not: against a peer that fuses too there is no round trip left to save, and we are at
# parity with cuBLAS's own epilogue, not above it. cuBLASLt's fused bias + GELU
# (`torch._addmm_activation`) was timed with a residual add after it: 0.983x, below target too. The
# per-shape rows say where the residual loses: at M = 128 (0.65-0.91x) C's TMA load waits in front
# of every chunk with nothing to hide it (the next step: load chunk j+1's C while chunk j is
# computed, and chunk 0 during the main loop); from M = 2048 on it is 0.99-1.09x. Calls at M = 128
# are slower still (0.51-0.78x): a call with a residual took the front door's checked path every
# time.
#
# Both have been worked on since this run. C is now loaded ahead: chunk 0 during the main loop, and
# chunk j+1 while chunk j is computed (knob `c_prefetch`, on by default). Epilogue calls now repeat
# on the front door's fast path. A later run with C loaded ahead
# (`benchmarks/results/2026-11-26_h100_epilogue_c_prefetch/`, commit 06d1fe7):
#
# | op | before | after |
# |---|---|---|
# | residual | 0.975x | 0.993x |
# | bias + GELU + residual | 0.984x | 1.010x |
# | fp32 D + residual (new) | | 1.101x |
#
# M = 128 is still 0.63-0.74x at K = 14336. The tiles are too few for 132 SMs rather than C's load:
# 64x64 tiles lift it to 0.90-1.00x.
#
# Against the *unfused* path, the model and the measurement agree for SwiGLU (within 3%). For the
# residual the measurement is under the model at every shape (by 1-26%, most at M = 128): the model
# lets the fused kernel read C under its math for free, and the kernel does not yet (the same
# waiting load as above). fp32 D beats the
# model: torch's `.float()` pass is slower than the one read and one write the model gives it.

# %%
rows = fusion.measured_vs_model(epi.rows)
print(report.table(rows, list(rows[0])))

# %% [markdown]
# ### Split K and swap AB with the epilogue (H200, 2026-11-28)
#
# Before v10 and v11 built the epilogue, an epilogue call at a small M fell to v9 tiles that left
# most SMs idle. `epilogue_check.py --set split` timed the policy's module now against the one it
# chose then, in the same rounds: bias+GELU at M = 1 and 16 went from 0.69x to 0.95x torch's best
# path (geomean of 12 shapes, each 1.07-1.97x faster), and split K with the epilogue at
# 256x4096x14336 from 0.59x to 0.86x. Per variant (`now` at every shape; `before` and
# `no_small_rule` only where they chose another module, so each geomean is over its own shapes):

# %%
split = teach.committed_run("2026-11-28_h200_epilogue_split", "epilogue_split.json")
print(split.describe())
by_variant = teach.ratio_summary([{**r, "op_variant": f"{r['op']} {r['rule']}"} for r in split.rows
                                  if r.get("kernel_ratio") is not None], by="op_variant")
print(report.table(by_variant, ["op_variant", "rows", "geomean", "lowest"]))

# %% [markdown]
# Then the target itself, on the shape suite's weights at M = 1 to 8192, against cuBLASLt's own fused
# bias+GELU and bias+ReLU (`torch._addmm_activation`) and against the unfused path, kernel level
# (`--set suite`, 053c7fc; the H200 power-capped at 700 W, its SM clock's median under load below):

# %%
def suite_table(folder: str) -> None:
    """A suite run's kernel geomeans against cuBLASLt's fused epilogue and the unfused path, per op and set."""
    run = teach.committed_run(folder, "epilogue_suite.json")
    print(run.describe())
    print(teach.sampled_clocks(folder))
    rows = [{**r, "set": f"{r['op']} {'held out' if r.get('held_out') else 'suite'}"} for r in run.rows]
    lt = teach.ratio_summary(rows, by="set", value="kernel_ratio_addmm_activation")
    unfused = teach.ratio_summary(rows, by="set", value="kernel_ratio_unfused")
    for a, b in zip(lt, unfused):
        a["x cuBLASLt"], a["x unfused"] = a.pop("geomean"), b["geomean"]
        a["lowest x cuBLASLt"] = a.pop("lowest")
    print(report.table(lt, ["set", "rows", "x cuBLASLt", "lowest x cuBLASLt", "x unfused"]))


suite_table("2026-11-28_h200_epilogue_suite")

# %% [markdown]
# **Not met** (>= 1.03x cuBLASLt's fused epilogue and >= 1.10x the unfused path): on the suite's
# weights 0.98-0.99x and 1.05x. Against a peer that fuses too there is no round trip left to save, so
# the ratio is our GEMM against cuBLAS's at each shape (0.88-1.08 here); the H200's bandwidth makes
# the unfused path's extra pass over D cheaper than on an H100. The held-out small weights at
# M = 64-512 (GPT-2's 768x3072: 12-24 tiles of 128x128 for 132 SMs) are the weakest, 0.45-0.94x.
#
# The weakest shapes then took two new rules, each timed first against candidate tiles and splits
# (`--set few_tiles`, `--set swap_widths`) and then on the suite's and the every-model samples' shapes it
# moves (`--set narrow_moved`, `--set small_split_moved`): at M <= 32 swap AB with 64 rows of N over one
# consumer (twice the CTAs streaming the weight; split K only where the slices stay long), and at
# 32 < M <= 128 the small-M epilogue's 64x64 tiles split in two along K where they fill at most half the
# SMs. The same suite again with both:

# %%
suite_table("2026-11-28_h200_epilogue_suite_narrow")

# %% [markdown]
# Still **not met**: 1.00x and 1.07x for bias+GELU on the suite's weights (held out 0.90x and 1.12x).
# From M = 512 up every module is a plain GEMM within 2-5% of cuBLAS with the epilogue fused on both
# sides; M = 64 on the 4096-wide weights (0.87-0.91x) and 512x768x3072 (0.46x; 64x64 tiles ran 0.76x
# in the few-tiles run, not yet a rule) are what is left below.

# %% [markdown]
# ### The bias loaded ahead (H200, 2026-11-29)
#
# Each bias value used to be read from global memory where it was added: after the tile's last wgmma,
# behind the consumer's barrier. Every `stmatrix` is a memory clobber, so the compiler could not issue the
# next chunk's loads before it: one global load's latency every 16 columns, at the end of a kernel whose
# tensor cores are then idle. A kernel of one tile a CTA (M <= 512 here) pays it once, in a 4-40 us kernel.
# Now `epilogue.BiasStash` loads a thread's values into registers before the tile's K loop: a quarter of
# the tile's columns (two of each eight, where the m64nN fragment puts its accumulators), or under swap AB
# two rows of N per 64-row atom. A 64x64 tile, one consumer: 16 loads before the first wgmma, and the
# rounding reads registers.

# %%
small = gemm_ladder.build("v9", 128, 4096, 512, spec=spec_for("bfloat16", "bias_gelu_tanh"), blk_m=64, blk_n=64,
                          num_warpgroups=1, epi_n=64)
src = small.cuda_source()
body = src[src.index("__global__"):]
loads = [line.strip() for line in body.splitlines() if "Breg_ptr[" in line and "= ((float)bias_ptr" in line]
first_mma = body.index("mma_async_sync_aligned")
print(len(loads), "bias loads, all before the first wgmma:", all(body.index(x) < first_mma for x in loads))
print(loads[0][:110])
print(next(line.strip() for line in body.splitlines() if "pre_act = " in line))

# %% [markdown]
# The same module with `bias_stash=False` against it, at every suite case whose kernel has a stash
# (`--set bias_stash`; `epi_under`'s tiles issue their loads together already and have none; the 256-wide
# tiles were level, so the stash stops at 48 registers). The gain is largest where the kernel is shortest:

# %%
stash = teach.committed_run("2026-11-29_h200_bias_stash", "epilogue_stash.json")
print(stash.describe())
print(teach.sampled_clocks("2026-11-29_h200_bias_stash"))
held_out = {(3072, 768), (768, 3072), (4096, 1024)}
rows = []
for op in ("bias_gelu_tanh", "bias_relu"):
    for weights, held in (("suite", False), ("held out", True)):
        gains = [r["kernel_ms"]["read"] / r["kernel_ms"]["now"] for r in stash.rows
                 if r["op"] == op and "read" in r["kernel_ms"] and ((r["N"], r["K"]) in held_out) == held
                 and r["knobs"].get("blk_n") is not None]  # the 256-wide tiles (v10's defaults) keep the reads
        rows.append({"op": op, "weights": weights, "cases": len(gains), "stash x reads": f"{teach.geomean(gains):.3f}",
                     "lowest": f"{min(gains):.3f}", "highest": f"{max(gains):.3f}"})
print(report.table(rows, list(rows[0])))

# %% [markdown]
# On the suite's weights that took bias+GELU to 1.023x cuBLASLt's fused epilogue and 1.088x the unfused
# path (bias+ReLU 1.020x and 1.084x): closer, and still **not met**. What is left below is kernel cases, with
# or without an epilogue (512x28672x4096, 128x128256x4096; `benchmarks/results/2026-11-29_h200_wide_mid/`).
#
# To measure it again on an H100: `python benchmarks/epilogue_check.py prepare build/epi` here,
# then `python benchmarks/epilogue_check.py run build/epi --out epilogue_check.json` on the GPU box
# (runtime-only TVM and torch).
