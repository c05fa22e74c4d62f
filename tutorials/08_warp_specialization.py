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
# # 08 · Warp specialization: a producer and consumers (rung v7)
#
# In v6 thread 0 was both a loader and an MMA thread. It refilled a stage in its own loop
# iteration, after issuing its wgmmas and after every MMA warp had released the stage, and its
# warpgroup could not issue the next wgmma until the TMA was issued: loads sat in the middle of
# the wgmma stream. v7 gives the loads a warpgroup of their own.
#
# | warpgroup | role | registers (2 consumers) | job |
# | --- | --- | --- | --- |
# | 0 | **producer**: one thread issues every TMA, the rest idle | 40 (`setmaxnreg.dec`) | walk the CTA's (tile, K slice) stream on its own scheduler; wait for a stage to be released, refill it |
# | 1..W | **consumers** | 232 (`setmaxnreg.inc`) | wait for a stage to fill, wgmma, release it; epilogue |
#
# **Barriers** (one pair per stage, phases never reset):
#
# | barrier | init count | arrived by | waited by | parity for slice `it` |
# | --- | --- | --- | --- | --- |
# | `tma2mma[s]` | 1 | the producer thread (`arrive.expect_tx`), completed by TMA's bytes | every consumer thread | `(it / S) & 1` |
# | `mma2tma[s]` | 4 × W | lane 0 of every consumer warp, after the `wait_group` that retired slice `it` | the producer thread, before refill `it` | `((it / S) & 1) ^ 1` |
#
# A fresh mbarrier sits in phase 0, and waiting on parity 1 (the phase "before" it) returns at
# once: the producer's first `S` waits pass without a release, and from then on its wait for refill
# `it` is the release of slice `it - S`, the same stage one lap earlier.
#
# **Registers.** 384 threads start with 168 registers each (65536 / 384, as ptxas caps it); the
# producer gives back down to 40 and the consumers grow to 232 (40 × 128 + 232 × 256 = 64512).
# The consumers meet only each other in the epilogue: a *named* barrier (`bar.sync 1, 256`), since
# the producer is elsewhere in its loop and would never reach a `__syncthreads`.

# %%
import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.sm90a import common

# %% [markdown]
# ## What changed against v6

# %%
teach.rung_diff("v6", "v7")

# %% [markdown]
# ## The picture: roles over time
#
# A model of one CTA's (tile, K slice) stream (`schedulers.roles.role_schedule`, in units of one K
# slice's wgmmas; a TMA load has a latency, then its bytes take the memory path). In v6 thread 0
# loads slice `j-1+S` only after its warpgroup issued slice `j`, and the warpgroup waits for that
# before slice `j+1`: gaps open in the wgmma row when a load arrives late. In v7 the producer
# refills a stage the moment it is released, and the consumers wait only for bytes.

# %%
teach.show(teach.plot_roles(("v6", "v7")))

# %% [markdown]
# The register budgets of the roles, for one, two and three consumer warpgroups (with one, 256
# threads already hold 255 registers each and nothing moves):

# %%
for consumers in (1, 2, 3):
    print(consumers, "consumer(s):", common.role_registers(consumers))

# %% [markdown]
# ## Build it
#
# 512×1024×256 (16 tiles of 128×256, 4 K slices each):

# %%
built = gemm_ladder.build("v7", 512, 1024, 256)
teach.describe(built)

# %% [markdown]
# The two roles in the generated CUDA: the register moves and the consumers' named barrier.

# %%
teach.source_excerpt(built, r"setmaxnreg_(dec|inc)_sync_aligned_u32_\d+\(\);|bar_sync_count_sync\(", context=0,
                     max_matches=4)

# %% [markdown]
# In SASS the register moves are `USETMAXREG` (`DEALLOC` for the producer, `TRY_ALLOC` for the
# consumers: a consumer warp spins until the producer has freed enough).

# %%
print("\n".join(line.strip() for line in teach.sass_text(built).splitlines() if "USETMAXREG" in line))
teach.show_sass_counts(built)

# %% [markdown]
# ## Blackwell (sm_100a, compiled only)
#
# On Blackwell one thread issues the MMA (`tcgen05.mma`), so v5/v6 already had a TMA warp, an MMA
# warp and an epilogue warpgroup. Its v7 turns them into roles with register budgets: the producer
# warpgroup (TMA warp, MMA warp) drops to 56, the epilogue warpgroup grows to 232 and pulls up to
# 128 accumulator columns from TMEM with one wait, freeing the accumulator for the next tile's MMAs
# earlier. No Blackwell GPU is available to this project: these builds are checked in SASS only.

# %%
bw = gemm_ladder.build("v7", 512, 1024, 256, arch="sm_100a")
teach.show_sass_counts(built, bw)

# %% [markdown]
# ## Check and time (GPU only)

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    teach.check_and_time(gemm_ladder.build("v7", 8192, 8192, 8192))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v7")
