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
# # 06 · Persistent CTAs and an L2-grouped tile order (rung v6)
#
# v5 launched one CTA per output tile. Each CTA filled its ring from empty (the prologue of the
# timeline in notebook 05) and ran its epilogue with the tensor cores idle; the tiles ran in
# `blockIdx` order, a row of tiles at a time. v6 changes three things:
#
# 1. **One CTA per SM**, looping over tiles. The SM count is read off the GPU at *launch* and
#    passed as the trailing `num_ctas` argument (the manifest says `launch["persistent"]`).
# 2. **A tile scheduler** hands CTA `c` the work items `c, c + num_ctas, ...`; the map from work
#    item to tile `(m, n)` is the *order* (`tile_order`, `l2_group_size`). Items that run at the
#    same time form a *wave*; the A row-panels and B column-panels a wave touches are what must
#    fit in L2 for them to be read from DRAM once.
# 3. **A ring that never drains.** A running counter `it` numbers every (tile, K slice) pair the
#    CTA consumes, so stage `it % S` and parity `(it / S) & 1` stay right across tiles, for any
#    K. Thread 0 drives a second scheduler, `ts_load`, up to `S` slices ahead of the MMAs, so the
#    next tile's first loads fly while this tile's epilogue runs. The TMA store is committed but
#    not waited for; only before rewriting `Dsmem` for the next tile does thread 0 wait for the
#    previous store to have *read* it (`cp.async.bulk.wait_group.read 0`), then `bar.sync`.
#
# Barriers are those of v5 (`tma2mma[s]`, `mma2tma[s]`), with phases that are never reset.

# %%
import gemm_ladder
import schedulers
from gemm_ladder import teach

# %% [markdown]
# ## What changed against v5

# %%
teach.rung_diff("v5", "v6")

# %% [markdown]
# ## The picture: tile order and waves
#
# A 12×16 tile grid on 24 CTAs. Left panels: the work index of each tile; right panels: its wave.
# In `row` order a wave spans 1-2 rows of tiles but *every* column: all 16 B panels are live at
# once. In `grouped` order (TVM's `ClusterPersistentScheduler2D`, `l2_group_size = 4`) a wave is a
# 4 × 6 block: 4 A panels and 6 B panels.

# %%
for order in ("row", "grouped"):
    teach.show(schedulers.plot_order(order, 12, 16, 24, l2_group_size=4))

# %% [markdown]
# The grouped order as text, 6×8 tiles in groups of 4 rows (the last group holds the 2 left-over
# rows): column-major inside a group, groups top to bottom.

# %%
print(schedulers.format_grid("grouped", 6, 8, 4))

# %% [markdown]
# ## DRAM traffic per group size
#
# The L2 model of `schedulers.traffic` plays the waves through an LRU cache of the L2's size.
# Small groups re-read B once per group; large groups make a wave so tall that A falls out of L2
# between waves. The floor is reading A and B once. (8192³, 128×256 tiles, 132 CTAs, 50 MiB L2: an
# H100 SXM; on a GPU the kernel asks the device.)

# %%
teach.show(schedulers.plot_traffic_vs_group(8192, 8192, 8192, blk_m=128, blk_n=256, num_ctas=132,
                                             l2_bytes=50 * 2**20))
for g, t in schedulers.rank_group_sizes(8192, 8192, 8192, 128, 256, 132, 50 * 2**20)[:4]:
    print(f"l2_group_size {g:>2}: {t.total_bytes / 2**30:5.2f} GiB from DRAM, {t.amplification:.2f}x the floor")

# %% [markdown]
# ## Waves and the tail
#
# At 4096³ with 128×256 tiles there are 512 tiles; a 209 KiB CTA leaves room for one per SM, so on
# 132 SMs v5 runs 3.9 waves of whole CTAs, each paying its prologue and epilogue. v6 runs the same
# tiles as 132 long streams.

# %%
waves = schedulers.waves("grouped", 32, 16, 132, 8)
print(f"{len(waves)} waves of up to 132 tiles; the last has {len(waves[-1])}")

# %% [markdown]
# ## Build it
#
# 512×1024×256: 4×4 = 16 tiles of 128×256, 4 K slices each.

# %%
built = gemm_ladder.build("v6", 512, 1024, 256)
teach.describe(built)

# %% [markdown]
# The tile loop in the generated CUDA: `while (1)` until the scheduler runs out of tiles (16
# here), and thread 0's wait for the previous tile's store to have read `Dsmem`:

# %%
teach.source_excerpt(built, r"while \(1\)|\{ break; \}|wait_group_read_0\(\);", context=0, max_matches=4)

# %%
teach.show_sass_counts(built)

# %% [markdown]
# ## Check and time (GPU only)

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    for g in (4, 8, 16):
        teach.check_and_time(gemm_ladder.build("v6", 8192, 8192, 8192, l2_group_size=g))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v6")
