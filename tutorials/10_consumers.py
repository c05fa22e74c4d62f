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
# # 10 · Consumers with their own rows and an overlapped epilogue (rung v9)
#
# In v8 the consumer warpgroups finished a tile together: both waited at one named barrier for
# the previous store to leave the output tile, wrote their rows into it, met again, and one thread
# stored the whole tile. A consumer done first idled until the other caught up. v9 makes each
# consumer warpgroup a worker of its own. Consumer `c` owns rows `[c·blk_m/W, (c+1)·blk_m/W)` of
# every tile and runs its epilogue alone:
#
# - its own named barrier (`bar.sync 1+c, 128`): no warpgroup waits for another;
# - its rows leave in `epi_n`-wide column chunks through two shared buffers of its own: while the
#   TMA store of chunk `j` drains, the warpgroup writes chunk `j+1` into the other buffer
#   (`stmatrix`); only before a buffer is reused does its storing thread wait for the store that
#   read it (`cp.async.bulk.wait_group.read 1`: all but the newest group);
# - once its last chunk is handed to TMA, it goes straight to the next tile's first K slice, which
#   the producer loaded long ago: the stores drain under the next mainloop.
#
# Smaller staging also gives the ring room: a 128×256 tile with `epi_n = 64` stages 2 × 2 × 64 × 64
# halves (32 KiB) where v8 staged the whole 64 KiB tile, so **four** stages fit beside it instead of
# three. Up to three consumers (`num_warpgroups`, 192-row tiles) where registers allow.
#
# | barrier | arrived by | waited by |
# | --- | --- | --- |
# | `tma2mma[s]`, `mma2tma[s]` | as in v8 | as in v8 |
# | named barrier `1+c` | the 128 threads of consumer `c`, twice per chunk | (no phase) |
#
# The consumers stay in step through the ring alone: a stage is refilled only when every consumer
# warp of the cluster released it, so a consumer that runs ahead into the next tile can be at most
# `pipe_depth` slices ahead of the slowest.

# %%
import json

import gemm_ladder
from gemm_ladder.measure import report
from gemm_ladder import teach
from gemm_ladder.sm90a import gemm, hgemm_v9

# %% [markdown]
# ## Where the code lives: a preset of the production kernel
#
# v8 is the last rung with a kernel body of its own. v9 (and v10, v11 after it) is a *preset* of
# the production kernel, `gemm_ladder/sm90a/gemm.py`: the template owns the roles, the ring, the
# loop over tiles and the barriers, and takes its parts (producer, consumers' K loop, chunked
# epilogue, schedule) from their modules; a preset names the combination, and its file declares
# its knobs as one frozen dataclass.

# %%
print(hgemm_v9.PRESET, gemm.V10, gemm.V11, sep="\n")
teach.show_source(hgemm_v9.V9Knobs)

# %% [markdown]
# The consumer's loop over its tiles, as the template writes it (the `under` branch is the
# `epi_under` knob; split-K units and the narrow tail are other presets' and knobs' branches):

# %%
teach.show_source(gemm.kernel)

# %% [markdown]
# ## The pictures: the epilogue, and the ring it makes room for
#
# Two consumers over two tiles (`schedulers.roles.epilogue_schedule`, a model). The consumers share
# the tensor cores, so one finishes a tile a little after the other: in v8 the first waits for it
# (red), then both write and one store leaves; in v9 each writes its chunks and hands each to TMA
# at once, and starts the next tile on its own.

# %%
teach.show(teach.plot_epilogue_overlap())

# %% [markdown]
# Shared memory per `pipe_depth`: v8 stages the whole output tile, v9 two 64-column chunks per
# consumer.

# %%
teach.show(teach.plot_smem_budget(gemm_ladder.make_config("v8", 4096, 4096, 4096)))
teach.show(teach.plot_smem_budget(gemm_ladder.make_config("v9", 4096, 4096, 4096)))

# %% [markdown]
# ## Build it

# %%
built = gemm_ladder.build("v9", 512, 1024, 256)
teach.describe(built)

# %% [markdown]
# Each consumer's chunk loop: its named barrier (id = its warpgroup index), the wait for the store
# before last, its own TMA stores:

# %%
teach.source_excerpt(built, r"bar_sync_count_sync\(\(\(uint\)|wait_group_read_1\(\);|commit_group\(\);", context=0,
                     max_matches=6)
teach.show_sass_counts(built)

# %% [markdown]
# ## A measured dead end: ping-pong consumers
#
# v9's consumers still finish each tile together, so while both stage its epilogue the tensor
# cores wait. The other design gives each consumer whole tiles in turn: one stages its epilogue
# while the other runs its mainloop, the turn passed by an mbarrier per consumer (consumer `c`
# starts a tile only once the consumer before it has issued its last wgmma, which also keeps the
# ring's parity waits honest). The price is the tile: a warpgroup's registers hold 64x256 or
# 128x128, half of v9's 128x256, and a half-size tile loads 1.5x the operand bytes per FLOP. It
# was built and measured on an H100 against cuBLAS in one process, lost to the cooperative
# consumers on every shape, and was removed from the kernel (a pack built with it asks to be
# rebuilt). The measurements:

# %%
pp_run = teach.RESULTS_DIR / "2026-11-22_h100_v9_pingpong" / "bench_pingpong.json"
if pp_run.exists():
    rows = []
    for r in json.loads(pp_run.read_text())["results"]:
        k = r["knobs"]
        rows.append({"shape": "x".join(map(str, r["shape"])), "dtype": r["dtype"],
                     "consumers": "ping-pong" if k.get("pingpong") else "cooperative",
                     "tile": f"{k['blk_m']}x{k['blk_n']}", "cluster": f"{k['cluster_m']}x{k['cluster_n']}",
                     "TFLOPS": f"{r['tflops']:.0f}", "x cuBLAS": f"{r['ratio_to_cublas']:.3f}"})
    print(report.table(rows, ["shape", "dtype", "consumers", "tile", "cluster", "TFLOPS", "x cuBLAS"]))

# %% [markdown]
# ## Blackwell (sm_100a, compiled only)
#
# Blackwell's accumulators live in TMEM, two of them: the epilogue of tile `i` already runs under
# the MMAs of tile `i+1` from v6 on. Its v9 splits the epilogue over `epi_consumers` warpgroups,
# each draining its share of the accumulator's columns with its own named barrier and TMA store.

# %%
bw = gemm_ladder.build("v9", 1024, 2048, 256, arch="sm_100a")
teach.show_sass_counts(built, bw)

# %% [markdown]
# ## Check and time (GPU only)
#
# The measurements behind v9's defaults (cluster shape, `epi_n` and ring depth, tile order and
# group size) are in `benchmarks/results/2026-11-22_h100_v6_v9_sweep.json`; the ladder's
# numbers against cuBLAS in `gemm_ladder/README.md`.

# %%
if teach.gpu_here("sm_90a"):
    teach.check_and_time(built)
    for shape in ((4096, 4096, 4096), (8192, 8192, 8192)):
        teach.check_and_time(gemm_ladder.build("v9", *shape))
else:
    print(teach.no_gpu_message("sm_90a"))
teach.committed_results("v9")
