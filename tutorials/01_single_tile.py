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
# # 01 · One tile: swizzled shared memory and `wgmma` (rung v1)
#
# The first rung computes `D = A · Bᵀ` for exactly one output tile (`M = blk_m`, `N = blk_n`,
# `K = 64`) with one CTA of one warpgroup (128 threads). Three things happen, in order:
#
# 1. **Copy.** Every thread moves 16-byte chunks of `A` and `B` from global memory into shared
#    memory (`ld.global.v4` then `st.shared.v4`, emitted by `Tx.cta.copy`). The destination is
#    **128B-swizzled**: chunk `c` of row `r` lands in chunk `c ^ (r % 8)`.
# 2. **Fence + barrier.** The copies went through the *generic proxy*; `wgmma` reads shared memory
#    through the *async proxy*. Each thread executes `fence.proxy.async.shared::cta` to order its
#    own generic stores before later async-proxy reads, and the CTA barrier (`bar.sync`) then
#    tells everyone that *every* thread has fenced. Without the fence the tensor cores may read
#    stale bytes even after the barrier.
# 3. **MMA.** The warpgroup issues `wgmma.mma_async.m64n128k16` once per 64 rows and per 16 of K
#    (here 2 × 4 = 8), reading both operands from shared memory through *matrix descriptors*
#    (start address, stride between 8-row core-matrix groups, swizzle mode). `commit_group` +
#    `wait_group 0` wait for them; the fp32 accumulators live in registers (`Dreg`, 64 per
#    thread per 64 rows) and each thread stores its own pairs straight to global memory.
#
# Why the swizzle: `wgmma` (like `ldmatrix`) reads 8×16-byte *core matrices*: 8 rows at the same
# 16-byte column. With plain 128-byte rows those 8 chunks sit in the same 4 banks (an 8-way
# conflict); the XOR spreads them over all 32 banks, and the descriptor's swizzle code (3 = 128B)
# tells the tensor cores how to undo it.

# %%
import gemm_ladder
import layouts
from gemm_ladder import teach
from gemm_ladder.sm90a import common

# %% [markdown]
# ## The code
#
# This is the first rung, so there is no diff yet: here is its whole kernel. Everything it
# calls (`load_tile_sync`, `mma_k_tile`, `acc_to_global`) lives in `gemm_ladder/sm90a/common.py`,
# shared by all rungs.

# %%
teach.show_source("v1", "kernel")

# %%
teach.show_source(common.mma_k_tile)

# %% [markdown]
# ## Swizzle and banks
#
# One swizzle atom is 8 rows of 128 bytes; each cell is the physical 16-byte chunk a logical chunk
# goes to. Then the whole 128×64 fp16 tile coloured by the group of 4 banks that holds each
# element: row-major gives vertical stripes (a core-matrix read hits one bank group 8 times), the
# 128B swizzle cycles every 8-row band through all 8 groups.

# %%
teach.show(layouts.plot_swizzle_atom("128B"))

# %%
for mode in ("rowmajor", "128B"):
    teach.show(layouts.plot_swizzle("float16", (128, 64), mode))
    rep = layouts.conflict_report("float16", (128, 64), mode, "ldmatrix")
    print(f"{mode:>8}: core-matrix reads take {rep.wavefronts} wavefronts (ideal {rep.ideal}), {rep.ways:.0f}-way")

# %% [markdown]
# The descriptor fields follow from the layout: leading offset unused (1) for a K-major swizzled
# tile, 1024 B between 8-row groups (`sdo = 64` in 16-byte units), swizzle code 3; each k16 step
# adds 32 B (2 units) to the start address.

# %%
layouts.wgmma_desc_fields("float16", (64, 64), "128B")

# %% [markdown]
# ## The accumulator fragment
#
# Register `r` of thread (warp `w`, lane `l`) holds row `16w + l/4 + 8·((r%4)/2)`, column
# `8·(r/4) + 2·(l%4) + r%2`. Pairs of registers hold adjacent columns, so the epilogue stores
# 4 bytes at a time. (Picture for a 64×16 accumulator; the 64×128 one repeats it 8 times.)

# %%
teach.show(layouts.plot_acc_fragment(16))

# %% [markdown]
# ## Build it
#
# v1 takes exactly one tile. The build needs no GPU: TVM emits CUDA, NVRTC compiles it to a cubin.

# %%
built = gemm_ladder.build("v1", 128, 128, 64)
teach.describe(built)

# %% [markdown]
# In the generated CUDA, each PTX instruction is an inline-asm helper; the kernel body shows the
# fence, the barrier and the eight `wgmma`s with their descriptors:

# %%
teach.source_excerpt(built, r"fence_proxy|cta_sync|wgmma_(fence|commit|wait)", context=0, max_matches=8)

# %% [markdown]
# And in SASS: 8 `HGMMA`, the thread copies (`LDG`/`STS`) and the register-to-global stores (`STG`).

# %%
teach.show_sass_counts(built)

# %% [markdown]
# ## Check and time (GPU only)
#
# With an H100/H200 the module is checked against a float64 reference on random inputs and
# timed against cuBLAS, each in a child process with a timeout. One 128×128×64 tile is far too
# small to say anything about speed: this cell is a correctness check.

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v1")
