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
# # 09 · Thread-block clusters and TMA multicast (rung v8)
#
# Neighbouring output tiles read the same operand panels: tiles `(m, n)` and `(m+1, n)` both need
# B's tile `n`. In v7 each CTA loaded it on its own, so every B byte crossed from L2 to the SMs
# twice. v8 launches CTAs in **clusters** of `cluster_m × cluster_n` (1×2, 2×1 or 2×2) that compute
# neighbouring tiles together. A tile the cluster shares is loaded in parts: each CTA's producer
# loads one part and **multicasts** it (`Tx.copy_async(..., cta_mask=...)`, SASS
# `UTMALDG.2D.MULTICAST`) into the same stage of every CTA that needs it, so L2 hands out each
# shared byte once per cluster. With 128×256 tiles in a 2×1 cluster a CTA asks L2 for 32 KiB per K
# slice instead of 48 KiB.
#
# **What a release now means.** CTA 1's producer writes into CTA 0's copy of stage `s`, so it may
# refill `s` only when the consumers of *both* CTAs are done with it: every consumer warp arrives
# on `mma2tma[s]` of every CTA of the cluster (on the peer's barrier through `mapa`), and
# `mma2tma` counts `4 × W × cluster size` arrivals a phase. `tma2mma[s]` is unchanged: each CTA's
# producer expects the whole stage's bytes, since its own parts and its peers' all land in its
# shared memory and signal its barrier.
#
# | barrier | init count | arrived by | waited by | parity |
# | --- | --- | --- | --- | --- |
# | `tma2mma[s]` | 1 | this CTA's producer (`expect_tx` of the whole stage) + the bytes of its own and its peers' parts | this CTA's consumers | `(it / S) & 1` |
# | `mma2tma[s]` | 4 × W × cluster | lane 0 of every consumer warp of *every* CTA of the cluster | this CTA's producer | `((it / S) & 1) ^ 1` |
#
# Two cluster-wide barriers (`barrier.cluster.arrive.release` / `wait.acquire`) fence the kernel:
# after the mbarrier inits (a peer must not multicast onto a barrier that is not initialised yet)
# and before exit (a CTA's shared memory must outlive its peers' last arrivals on it). The
# scheduler hands out *cluster* tiles; the persistent grid is the SM count rounded down to whole
# clusters (the manifest's `launch["cluster"]`).

# %%
import gemm_ladder
from gemm_ladder import teach

# %% [markdown]
# ## What changed against v7

# %%
teach.rung_diff("v7", "v8")

# %% [markdown]
# ## The picture: who loads which part
#
# One K slice of a 2×1 cluster (B shared, each CTA loads half of its rows) and of a 2×2 cluster (A
# and B shared: each CTA loads half of an A tile and half of a B tile). Colours: which CTA loads a
# part; labels: which CTAs it is multicast to (the `cta_mask` bits).

# %%
teach.show(teach.plot_cluster_multicast(2, 1))
teach.show(teach.plot_cluster_multicast(2, 2))

# %% [markdown]
# ## Build it

# %%
built = gemm_ladder.build("v8", 512, 1024, 256)
teach.describe(built)

# %% [markdown]
# The multicast load (its `cta_mask` is the last operand), the remote release through `mapa`,
# and the cluster barriers:

# %%
teach.source_excerpt(built, r"multicast__cluster\(|mapa_shared__cluster|barrier_cluster_(arrive|wait)", context=0,
                     max_matches=5)
teach.show_sass_counts(built)

# %% [markdown]
# ## Blackwell (sm_100a, compiled only)
#
# On Blackwell a cluster does more: the two CTAs of a pair issue **one** MMA together
# (`tcgen05.mma.cta_group::2`, M = 256), each holding its own 128 A rows and half of B; the pair's
# even CTA issues it and its commits reach both CTAs. v8 multicasts A across the pairs of a
# cluster (`cluster_n`). SASS shows `UTCHMMA.2CTA` and `UTMALDG.2D.MULTICAST`; none of it has run on
# a Blackwell GPU.

# %%
bw = gemm_ladder.build("v8", 1024, 2048, 256, arch="sm_100a", cluster_n=2)
teach.show_sass_counts(built, bw)

# %% [markdown]
# ## Check and time (GPU only)

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    for cm, cn in ((2, 1), (1, 2)):
        teach.check_and_time(gemm_ladder.build("v8", 8192, 8192, 8192, cluster_m=cm, cluster_n=cn))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v8")
