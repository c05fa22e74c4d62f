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
# # 05 · A ring of `pipe_depth` stages (rung v5)
#
# In v4 a K slice's load could start only after the previous slice's wgmmas were done: the
# tensor cores waited for a full TMA round trip every slice. v5 keeps `S = pipe_depth` slices in
# a ring of shared-memory stages and keeps one wgmma group in flight while it hands stages back.
#
# **Barriers: one pair per stage, each with its own phase.**
#
# | barrier | init count | arrived by | waited by | parity for slice `j` |
# | --- | --- | --- | --- | --- |
# | `tma2mma[s]` | 1 | thread 0 (`arrive.expect_tx`), completed by TMA's bytes | every MMA thread, before its wgmmas | `(j / S) & 1` |
# | `mma2tma[s]` | 4 × warpgroups | lane 0 of each MMA warp, after its `wait_group(1)` | thread 0, before refilling stage `s` | `(j / S) & 1` |
#
# **The loop**, for slice `k` in stage `k % S`:
#
# 1. wait `tma2mma[k % S]`, issue the wgmmas of slice `k`, `commit_group`;
# 2. `wgmma.wait_group(1)`: everything but the newest group has retired, i.e. slice `k-1`'s
#    wgmmas *of this warpgroup* are done; slice `k`'s keep running;
# 3. lane 0 of each warp arrives on `mma2tma[(k-1) % S]`; thread 0 waits for that barrier (all
#    `4 × num_warpgroups` arrivals: one warpgroup's `wait_group` says nothing about the other's)
#    and refills the stage with slice `k-1+S`.
#
# Why it is safe: a stage is overwritten only after every warp has retired the wgmmas that read
# it; the group left in flight reads another stage. Why parity is enough: slice `j+S` is loaded
# only after slice `j` was released, and released only after every warp waited for it, so no
# waiter is ever more than one phase behind. The epilogue now writes the accumulators with
# `stmatrix` (8 fp16 per thread per instruction) and the tile leaves by TMA store.
#
# **How deep.** Each stage holds `(blk_m + blk_n) · 64 · 2` bytes (48 KiB for 128×256 tiles); with
# the 64 KiB output tile and 1 KiB of barriers, 3 stages fit in 227 KiB. The validator reads the
# limit off the GPU when one is present and says which depth would fit.

# %%
import gemm_ladder
from gemm_ladder import teach

# %% [markdown]
# ## What changed against v4

# %%
teach.rung_diff("v4", "v5")

# %% [markdown]
# ## The picture: stages over time
#
# A model of one tile's K loop (see `teach.pipeline_schedule`): a TMA load has a latency, then
# moves its bytes; the wgmmas of a slice take one time unit. With one stage (v4) the tensor cores
# wait for every round trip. With two, a stage is released only when the *next* slice has landed
# (that is when the warps reach `wait_group(1)`), so a round trip still shows. From three on, the
# loads run far enough ahead that the wgmmas follow each other back to back after the prologue.

# %%
teach.show(teach.plot_pipeline_timeline(pipe_depths=(1, 2, 3, 4), k_tiles=8))
for S in (1, 2, 3, 4):
    s = teach.pipeline_schedule(S, k_tiles=64)
    print(f"pipe_depth {S}: tensor cores busy {s['busy']:.0%} over a 64-slice K loop (model)")

# %% [markdown]
# ## Build it, and what the validator says about depth

# %%
built = gemm_ladder.build("v5", 256, 512, 512, pipe_depth=3)
teach.describe(built)

# %%
try:
    gemm_ladder.make_config("v5", 4096, 4096, 4096, pipe_depth=5)
except gemm_ladder.ConfigError as err:
    print(f"ConfigError: {err}")

# %% [markdown]
# ## Generated code
#
# The consumer side: parity waits on `tma2mma[k % 3]`, `wait_group 1`, the `mma2tma` arrive and
# thread 0's wait before the refill.

# %%
teach.source_excerpt(built, r"mbarrier_arrive_arrive_shared|wait_group_sync_aligned_1\(\)|mbarrier_wait\(",
                     context=0, max_matches=6)

# %% [markdown]
# SASS against v4 (128×128 tiles, one warpgroup): more `SYNCS` (two barriers per stage, parity
# waits in a loop) and `STSM` (stmatrix) in place of the scalar `STS` epilogue. `HGMMA` counts are
# static instructions, so they depend on how far the compiler unrolled each loop; v5's are
# 64×256 (one per k16 step per warpgroup), v4's 64×128:

# %%
v4 = gemm_ladder.build("v4", 256, 512, 512)
teach.show_sass_counts(v4, built)
teach.source_excerpt(v4, r"HGMMA", source="sass", context=0, max_matches=1)
teach.source_excerpt(built, r"HGMMA", source="sass", context=0, max_matches=1)

# %% [markdown]
# ## Check and time (GPU only)

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    for depth in (2, 3):
        teach.check_and_time(gemm_ladder.build("v5", 4096, 4096, 4096, pipe_depth=depth))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v5")
