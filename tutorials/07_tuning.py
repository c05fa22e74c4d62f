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
# # 07 · Tuning `pipe_depth` and `l2_group_size`
#
# Two knobs of the last rungs are not "right" in general:
#
# * **`pipe_depth`** (v5, v6): deeper rings hide more TMA latency (notebook 05), but each stage
#   costs `(blk_m + blk_n) · 64 · 2` bytes of shared memory next to the output tile, and the block
#   limit (227 KiB on H100/H200) caps the depth. The config validator computes the cap
#   (`gemm_ladder.core.budget`, one formula for both archs), reading the limit off the GPU when there is
#   one, and refuses anything deeper before compiling.
# * **`l2_group_size`** (v6): how many rows of tiles one L2 group spans. The traffic model ranks
#   the sizes; only a measurement decides between the near-ties.
#
# The search prunes with the same validator that `build` uses, so every candidate that survives
# compiles; the L2 model keeps the best few group sizes; only those are built and timed.

# %%
import math
from pathlib import Path

import gemm_ladder
import schedulers
from gemm_ladder.core import budget
from gemm_ladder import teach
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import run
from gemm_ladder.tune import report as tune_report

# %% [markdown]
# ## `pipe_depth`: what fits in shared memory

# %%
limit = budget.limits_for("sm_90a").smem_per_block
print(f"shared memory a block may use on sm_90a here: {limit} B ({limit / 1024:.0f} KiB)")
for blk_m, blk_n, wgs in ((128, 128, 1), (128, 256, 2), (256, 128, 2)):
    cfg = gemm_ladder.make_config("v5", 4096, 4096, 4096, blk_m=blk_m, blk_n=blk_n, num_warpgroups=wgs, pipe_depth=2)
    deepest = budget.max_pipe_depth(cfg, limit)
    stage_kib = budget.stage_bytes(cfg) // 1024
    print(f"  {blk_m}x{blk_n} tile: {stage_kib} KiB per stage -> pipe_depth <= {deepest}")

# %%
cfg = gemm_ladder.make_config("v5", 4096, 4096, 4096)
teach.show(teach.plot_smem_budget(cfg, range(1, 7)))

# %% [markdown]
# What survives the validator for v6 at 8192³ over `pipe_depth` 2..7 and `l2_group_size`
# 1..32 (other knobs at the rung's defaults); the tuner's L2 model (`gemm_ladder.tune.space`) also
# drops all but the best few group sizes.

# %%
space = teach.tuning_space("v6", (8192, 8192, 8192),
                           {"pipe_depth": [2, 3, 4, 5, 6, 7], "l2_group_size": [1, 2, 4, 8, 16, 32]})
print(space["source"])
print(f"{len(space['candidates'])} candidates, {len(space['pruned'])} pruned")
for knobs in space["candidates"]:
    print("  keep:", {k: knobs[k] for k in ("pipe_depth", "l2_group_size")})
reasons = {}
for knobs, why in space["pruned"]:
    reasons.setdefault(why.split(";")[0].split(" (")[0], []).append(knobs.get("pipe_depth"))
for why, depths in reasons.items():
    print(f"  pruned x{len(depths)}: {why}")

# %% [markdown]
# ## `l2_group_size`: the L2 model
#
# Modelled DRAM reads of A and B per group size for a few shapes (128×256 tiles, 132 CTAs, 50 MiB
# L2). The best size moves with the shape: the footprint of a wave grows with K, and the grid's
# proportions decide how many groups there are. At 4096³, A and B (64 MiB together) are read once
# whatever the order: the model then cannot tell the sizes apart, and neither can DRAM.

# %%
for M, N, K in ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 4096), (4096, 16384, 8192)):
    ranked = schedulers.rank_group_sizes(M, N, K, 128, 256, 132, 50 * 2**20, group_sizes=(1, 2, 4, 8, 16, 32))
    best = ", ".join(f"{g} ({t.total_bytes / 2**30:.2f} GiB)" for g, t in ranked[:3])
    print(f"{M}x{N}x{K}: best group sizes {best}")

# %%
teach.show(schedulers.plot_traffic_vs_group(16384, 16384, 4096, blk_m=128, blk_n=256, num_ctas=132,
                                             l2_bytes=50 * 2**20))

# %% [markdown]
# ## What has been measured
#
# The tuning database (`gemm_ladder.serve.tuning_db`) and the committed benchmark runs for the
# pipelined rungs.

# %%
tuned = db.TuningDB()  # the packaged database under the user's overlay, wherever this runs
print(tuned.describe().replace(str(teach.REPO) + "/", "").replace(str(Path.home()), "~"))
for e in tuned.entries:
    print(f"  {e['rung']} {'x'.join(map(str, e['shape']))} {e['dtype']} on {e['gpu']}: {e['knobs']} "
          f"{e['tflops']:.1f} TFLOPS ({(e.get('ratio_to_cublas') or math.nan):.3f}x cuBLAS)")

# %%
print(repr(teach.committed_results("v5")))
teach.committed_results("v6")

# %% [markdown]
# ## Tune on a GPU
#
# With an H100/H200 this cell runs a small search for v6 at 4096³: the 128×256 two-warpgroup
# tile in snake order, `pipe_depth` × `l2_group_size` (six candidates). The tuner checks and times
# each candidate in a child process and writes its database to a temporary folder here; `jobs=1`
# builds in this process (a notebook, or this file run as a script, needs no worker pool for six
# builds; `python -m gemm_ladder tune` builds in parallel).

# %%
import tempfile

if teach.gpu_here("sm_90a"):
    work = Path(tempfile.mkdtemp(prefix="tune_"))
    space = {"blk_m": [128], "blk_n": [256], "num_warpgroups": [2], "tile_order": ["snake"],
             "pipe_depth": [2, 3], "l2_group_size": [4, 8, 16]}
    report = run.tune("v6", (4096, 4096, 4096), space=space, l2_keep=0, jobs=1,
                      out=work / "v6", db=work / "tuning_db.json", plot=False)
    print(tune_report.format_table(report))
else:
    print(teach.no_gpu_message("sm_90a", committed=False))
