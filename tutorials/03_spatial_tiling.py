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
# # 03 · Tiling across CTAs (rung v3)
#
# v2 was one CTA computing one tile. v3 launches a grid of `ceil(M/blk_m) × ceil(N/blk_n)` CTAs;
# CTA `(bx, by)` computes `D[bx·blk_m :, by·blk_n :]` with exactly v2's K loop. Since `M`, `N`, `K`
# no longer have to be multiples of the tile, every access past an edge is **guarded**:
#
# * **Loads.** A 16-byte chunk of A or B past the last row, or past `K`, is not loaded: the thread
#   stores 16 zero bytes into the swizzled tile instead. `K` is a multiple of 8 (16-byte rows), so
#   a chunk is wholly inside or outside. Zeros add nothing to the dot products: this is how the
#   last, partial K slice is handled, with the same `wgmma`s.
# * **Stores.** A thread skips the column pairs of its fragment that lie past row `M` or column `N`.
# * The guards are Python booleans when the kernel is traced (`GUARD_M = M % blk_m != 0`, ...):
#   a 4096³ problem gets no compare instructions at all.
#
# Synchronisation is unchanged: one CTA barrier twice per K slice. CTAs do not talk to each
# other; each reads its own A row-panel and B column-panel, so A is read `N/blk_n` times and B
# `M/blk_m` times in all (L2 absorbs most of it; v6 orders the tiles to help it).

# %%
import gemm_ladder
from gemm_ladder import teach

# %% [markdown]
# ## What changed against v2

# %%
teach.rung_diff("v2", "v3")

# %% [markdown]
# The guarded copy that replaces `load_tile_sync`, from `gemm_ladder/sm90a/common.py`:

# %%
from gemm_ladder.sm90a import common

teach.show_source(common.load_tile_guarded)

# %% [markdown]
# ## The picture: the CTA grid and its edges
#
# A shape with edges in all three dimensions: 300×200×200 with 128×128 tiles is a 3×2 grid; the
# hatched parts of the edge tiles are computed on zeros and never stored, and the last K slice
# holds 8 real columns and 56 columns of zeros.

# %%
built = gemm_ladder.build("v3", 300, 200, 200)
teach.describe(built)
teach.show(teach.plot_cta_grid(built.cfg))

# %% [markdown]
# ## Generated code
#
# The guards are compares against constants. TVM's simplifier divides both sides, so they read
# in coarser units: in the A copy, thread `t` of warp `w` moves chunk `c = it·128 + 32w + t` of
# the 128×64 slice, i.e. row `c / 8` (a warp covers 4 rows) and columns `8·(c % 8)`; so
# `row < 300` becomes "4-row group `< 75`" (then 71, 67, ...: each copy iteration is 16 rows
# further down) and `k·64 + col < 200` becomes "8-column chunk `k·8 + t%8 < 25`". The
# epilogue's guards follow the accumulator fragment.

# %%
teach.source_excerpt(built, r"^\s+if \(", context=0, max_matches=3)

# %% [markdown]
# The same kernel on a shape without edges has no such compares. SASS of both:

# %%
even = gemm_ladder.build("v3", 256, 256, 256)
teach.show_sass_counts(built, even)

# %% [markdown]
# ## Check and time (GPU only)
#
# Checked at the edge shape and at 4096³ (timed there against cuBLAS).

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    teach.check_and_time(gemm_ladder.build("v3", 4096, 4096, 4096))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v3")
