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
# # 04 · TMA loads, an mbarrier, and a TMA-store epilogue (rung v4)
#
# In v3 all 128 threads spent their time moving bytes (and computing addresses and guards).
# v4 hands the copies to the **Tensor Memory Accelerator**: one thread issues, per K slice, one
# `cp.async.bulk.tensor.2d` for the A box (`blk_m × 64`) and one for the B box (`blk_n × 64`).
# TMA reads the tensor's shape and strides from a `CUtensorMap` (TVM encodes it on the host at
# every call and passes it as a `__grid_constant__` kernel parameter), writes the 128B-swizzled
# tile itself, **zero-fills** whatever lies past the tensor's edge, and reports to an
# **mbarrier**:
#
# | barrier | init count | arrived by | completed by | waited by (parity) |
# | --- | --- | --- | --- | --- |
# | `tma2mma` | 1 | thread 0: `mbarrier.arrive.expect_tx(stage_bytes)` | TMA's `complete_tx` of the box bytes | all 128 threads, `phase` = k & 1 |
#
# * A phase of an mbarrier completes when the **pending arrival count** (1) *and* the
#   **transaction count** both reach zero. `expect_tx` adds the bytes to wait for; each box's bytes
#   subtract as they land. The count may dip below zero when TMA is faster than the arrive:
#   nothing completes while the arrival is pending. The boxes always count in full, zero-filled
#   rows included.
# * Waiters test the phase **parity** (`try_wait.parity`), so each thread keeps a `phase` bit and
#   flips it after each slice.
# * `fence.mbarrier_init.release.cluster` after `mbarrier.init`: the init is a generic-proxy
#   write; TMA's `complete_tx` arrives through the async proxy and must see an initialised barrier.
# * Still one stage: after the wgmmas, `wait_group 0` + `bar.sync` make sure nobody reads the
#   stage before thread 0 lets TMA overwrite it. TMA and the tensor cores take turns.
# * Epilogue: registers → `Dsmem` (generic stores), `fence.proxy.async` (TMA reads through the
#   async proxy), `bar.sync`, then thread 0 issues a TMA **store** per 64 columns; TMA clips what
#   lies past D's edge. `cp.async.bulk.commit_group` / `wait_group 0` keep `Dsmem` alive until
#   the store has read it.

# %%
import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.sm90a import common

# %% [markdown]
# ## What changed against v3
#
# The guarded thread copies and their fence disappear; TMA copies, the barrier and its phase
# appear; the epilogue goes through shared memory.

# %%
teach.rung_diff("v3", "v4")

# %% [markdown]
# The new epilogue, from `common.py`:

# %%
teach.show_source(common.tma_store_tile)

# %% [markdown]
# ## The picture: TMA boxes and the barrier's transaction bytes
#
# 200×256×256 with 128×128 tiles: CTA (1, 1) loads the A box of rows 128-255, of which 56 lie
# past M = 200. TMA fills them with zeros and still counts them, so `expect_tx` is always the full
# `(blk_m + blk_n) · 64 · 2` bytes.

# %%
built = gemm_ladder.build("v4", 200, 256, 256)
teach.describe(built)
teach.show(teach.plot_tma_box(built.cfg, tile=(1, 1), k=0))

# %% [markdown]
# ## Generated code
#
# The tensor maps arrive as `__grid_constant__` parameters; in the K loop, thread 0 issues the
# two bulk tensor copies and the `expect_tx` arrive, then everyone waits on the parity:

# %%
teach.source_excerpt(built, r"__global__ void", context=0, max_matches=1)
teach.source_excerpt(built, r"bulk_tensor_g2s|expect_tx|mbarrier_wait\(|phase_ptr\[0\] =", context=0)

# %% [markdown]
# SASS against v3 on the same shape: the thread copies (`LDG`/`STS` of the operands) are gone;
# `UTMALDG` (TMA load), `UTMASTG` (TMA store) and `SYNCS` (mbarrier operations) appear. The
# remaining `STS` are the accumulators going to `Dsmem`.

# %%
v3 = gemm_ladder.build("v3", 200, 256, 256)
teach.show_sass_counts(v3, built)

# %% [markdown]
# ## Check and time (GPU only)
#
# Checked at the edge shape, checked and timed at 4096³ against cuBLAS.

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    teach.check_and_time(gemm_ladder.build("v4", 4096, 4096, 4096))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v4")
