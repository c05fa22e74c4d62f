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
# # 02 · The K loop (rung v2)
#
# v1 multiplied one 64-wide K slice. v2 walks `K` (any multiple of 64) in `blk_k = 64` slices
# through the **same single shared stage**, accumulating into the same registers:
#
# ```
# for k in range(K / 64):
#     all threads: A[:, k], B[:, k] -> Asmem, Bsmem     (16-byte loads/stores, swizzled)
#     fence.proxy.async; bar.sync                       "slice k is in shared memory"
#     warpgroup:   wgmma x 4 per 64 rows; commit; wait_group 0
#     bar.sync                                          "nobody reads the stage any more"
# Dreg -> D
# ```
#
# * **Two barriers per slice.** The first orders *copy → MMA* (after every thread's proxy fence).
#   The second orders *MMA → next copy*: with one stage, a fast thread must not overwrite
#   `Asmem` while a warpgroup's `wgmma`s may still read it. `wait_group 0` only says *this*
#   warpgroup is done; the barrier makes it true for all of them.
# * **No zeroing of the accumulators.** `wgmma`'s `scale-d` operand is 0 for the first k16 step of
#   the first slice (`D = A·B`) and 1 afterwards (`D += A·B`); `mma_k_tile` gets `first = (k == 0)`.
# * Nothing overlaps yet: while the threads copy, the tensor cores idle, and vice versa. That is
#   what v4 (TMA) and v5 (a ring of stages) go after.

# %%
import gemm_ladder
from gemm_ladder import teach

# %% [markdown]
# ## What changed against v1
#
# The diff of the two rung files (module docstrings left out): the K loop, `first = (k == 0)`,
# the second barrier, and the check that K is a multiple of 64.

# %%
teach.rung_diff("v1", "v2")

# %% [markdown]
# ## The picture: K-loop accumulation
#
# Left: the A and B panels of the one output tile, cut into K slices; `Dreg` is the sum of
# `A[:, k] · B[:, k]ᵀ` over them. Right: one CTA over time. Red lines are CTA barriers.

# %%
built = gemm_ladder.build("v2", 128, 128, 512)
teach.describe(built)
teach.show(teach.plot_k_loop(built.cfg))

# %% [markdown]
# ## Generated code
#
# The K loop in the CUDA TVM generated, with the scale-d operand `(0 < k)` on the first wgmma of
# each slice, and the two barriers:

# %%
teach.source_excerpt(built, r"for \(int k|cta_sync|\(0 < k\)\);", context=0, max_matches=6)

# %% [markdown]
# SASS: the counts are *static* instructions. At K = 512 the loop is not unrolled, so the body
# holds v1's eight `HGMMA`s (executed once per slice) and two `BAR`s where v1 had one.

# %%
teach.show_sass_counts(built)

# %% [markdown]
# ## Check and time (GPU only)
#
# v2 is still a single CTA: on the GPU it is checked at 128×128×4096 (and timed, for the record;
# one CTA uses one of 132 SMs).

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(gemm_ladder.build("v2", 128, 128, 4096))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v2")
