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
# # 11 · Every shape a user has: waves, weight streaming, swap-AB, split-K and the front door
#
# The rungs so far were tuned on big squares. A model multiplies activations of a varying token
# count M by fixed weights (N x K), and on those shapes v6 at its defaults fell far behind cuBLAS
# (H100, same process; issue 12):
#
# | M x N x K | v6 / cuBLAS |
# |---|---|
# | 32 x 1408 x 3584 | 0.30x |
# | 135 x 3688 x 6200 | 0.33x |
# | 978 x 2640 x 3336 | 0.64x |
# | 64 x 64 x 8192 | 0.12x |
#
# This notebook shows why with the models (tiles and waves, bytes against FLOPs), what the last
# rungs do about it (swap AB, split K), and how the front door, `gemm_ladder.matmul`, picks a
# kernel for any shape and says why.

# %%
import json

import schedulers
from gemm_ladder.serve import kernel_pack, plan, tma_layout
from gemm_ladder.measure import report, suite
from gemm_ladder import rungs, teach
from gemm_ladder.teach import shapes as pictures
from schedulers import wave_model

ISSUE = [(32, 1408, 3584), (135, 3688, 6200), (292, 5136, 3152), (978, 2640, 3336), (4162, 2760, 1128),
         (8192, 128, 4096), (64, 64, 8192)]
LLAMA = [(M, N, K) for N, K in kernel_pack.MODELS["llama-8b"].values() for M in (16, 512, 8192)]

# %% [markdown]
# ## Tiles and waves
#
# A persistent kernel runs one CTA per SM (132 on an H100); each walks its share of the output
# tiles. `ceil(tiles / SMs)` *waves*: the kernel lasts as long as its busiest CTA. When a shape
# has fewer tiles than SMs, or a few more than a whole number of waves, SMs sit idle for a large
# part of the run. The share of SM slots with work, for three tile shapes:

# %%
print(report.table(pictures.wave_rows(ISSUE + LLAMA[:6]), ["shape", "128x256", "128x128", "64x128"]))

# %%
teach.show(pictures.plot_fill(ISSUE + LLAMA))

# %% [markdown]
# 978 x 2640 in 128 x 256 tiles is 8 x 11 = 88 tiles: one wave that leaves 44 of the 132 SMs idle
# for the whole kernel. The tile order (notebook 06) draws it; every tile is in wave 0:

# %%
teach.show(schedulers.plot_order("snake", 8, 11, 132, l2_group_size=8))

# %% [markdown]
# ## Small M streams the weights
#
# With M tokens, A is M x K and B is N x K: for M much smaller than N, B is nearly all the bytes,
# and the arithmetic per byte (about M FLOPs per byte of B) is far below what the tensor cores
# need to be the limit. The least time a kernel can take is then the time to read B once from
# HBM: the decode shapes are a bandwidth problem, and the shape suite reports them in GB/s
# against the HBM peak. Left: the two lower bounds (the copy bandwidth and the tensor cores'
# rate of `schedulers.wave_model.H100`); right: the share of the bytes that are B.

# %%
teach.show(pictures.plot_weight_streaming(4096, 4096))

# %% [markdown]
# ## Swap AB: the weights fill the MMA's 64 rows
#
# wgmma's A operand is always 64 rows. With the output tile's rows taken from M, a tile at M = 16
# is three quarters zero padding, and each tile streams a panel of B for 64 rows of which 16 are
# real. v11 computes the transposed tile, D^T = B_tile . A_tile^T: N fills the 64-row slot, and
# M becomes wgmma's N, which may be as small as 8.

# %%
teach.show(pictures.plot_swap_ab(M=16, N_tile=128))
if rungs.available("v11", "sm_90a"):
    print(rungs.rung_module("v11").__doc__.split("\n\n")[1])

# %% [markdown]
# ## Split K: more units than tiles
#
# Swap AB fixes the padding, not the count of tiles: 16 x 4096 x 4096 in 16 x 128 tiles is 32
# tiles, 32 SMs each reading a 1 MiB panel of B at the rate one SM's ring allows, 100 SMs idle.
# Split K cuts each tile's K loop into `split_k` units (v10, and v11 on top of it); the last unit
# of a tile to finish adds the fp32 partials up (in split order: the same bits every run). The
# wave model (`schedulers.wave_model`) ranks the choices; the colour is the K range of a tile:

# %%
best = wave_model.best_split_k(16, 4096, 4096, 16, 128)
print(best.why())
teach.show(pictures.plot_split_k(16, 4096, 4096, 16, 128, best.split_k))

# %%
for p in wave_model.rank(978, 2640, 3336, [(128, 256), (128, 128)])[:5]:
    print(p.why())

# %% [markdown]
# For a big square the same model says no: 8192^3 in 128 x 256 tiles is 2048 tiles, 15.5 waves,
# and splitting K only adds partial tiles to write and read back.

# %%
for p in wave_model.rank(8192, 8192, 8192, [(128, 256)], split_ks=(1, 2, 4))[:3]:
    print(p.why())

# %% [markdown]
# ## Stream-K: split only the tail
#
# Between the two sits a shape with whole waves and a ragged last one: 1792 x 2560 x 8192 is 70
# cluster tiles (256 x 256, two CTAs each) on an H100's 66 clusters, one full wave and 4 tiles
# that keep 4 clusters busy for a second wave while 62 wait. v10's `stream_k` runs the full waves
# as v9 does and deals the K slices of the last wave's tiles out evenly, one contiguous range to
# each cluster (`sm90a/streamk.py`). A tile then has two or three pieces on neighbouring
# clusters; they meet in a workspace, and the last one sums them in K order. Each cluster runs
# its whole tiles, then the piece that starts at slice 0 of a tile, then the piece that ends its
# range, so the clusters stay at about the same K slice (and find A and B in L2). Tiles of eight
# slices on four clusters, each letter a tile and each column a slice of time (capitals: whole
# tiles; 11 tiles leave a partial wave of 3, dealt out alone; 9 leave 1, dealt out with the wave
# before it):

# %%
if rungs.available("v10", "sm_90a"):
    from gemm_ladder.sm90a import streamk

    for tiles in (11, 9):
        dp_tiles, sk_tiles = streamk.split(tiles, 4)
        print(f"{tiles} tiles on 4 clusters: {dp_tiles} whole, {sk_tiles} by slices")
        for g in range(4):
            first, end = streamk.cluster_range(g, sk_tiles, 4, 8)
            whole = "".join("ABCDEFGHIJK"[t] * 8 for t in range(g, dp_tiles, 4))
            pieces = [streamk.piece(p, first, end, 8) for p in range(streamk.pieces(first, end, 8))]
            print(f"  cluster {g}: {whole}|" + " ".join(
                ("ABCDEFGHIJK" if nk == 8 else "abcdefghijk")[dp_tiles + j] * nk for j, _, nk in pieces))

# %% [markdown]
# Measured on an H100 against the front door's own choice at each shape (same process; the
# split costs every cluster two meetings, about 14k cycles an SM, so it loses where the last
# wave is nearly full: 4096^3, 58 of 66, 0.95x against v9's 1.00x):

# %%
sk_run = teach.RESULTS_DIR / "2026-11-23_h100_stream_k" / "6_final" / "skfd_bench_1.json"
if sk_run.exists():
    by_shape: dict = {}
    for r in json.loads(sk_run.read_text())["results"]:
        which = "stream_k" if r["knobs"].get("stream_k") else f"{r['rung']} (front door)"
        by_shape.setdefault("x".join(map(str, r["shape"])), {})[which] = r["ratio_to_cublas"]
    print(report.table([{"M x N x K": shape, "front door's choice": next(f"{k.split()[0]}: {v:.3f}"
                                                                          for k, v in got.items() if k != "stream_k"),
                         "stream_k": f"{got['stream_k']:.3f}"} for shape, got in by_shape.items() if len(got) == 2],
                       ["M x N x K", "front door's choice", "stream_k"]))

# %% [markdown]
# ## Tell L2 that B streams past
#
# At small M every CTA reads its slice of B once and the few rows of A again. The TMA loads can
# say so: the `stream_b` knob of v9-v11 puts an L2 evict-first policy on B's loads and evict-last
# on A's, and asks both tensor maps for 256-byte L2 fills (a 64-wide K slice reads 128 bytes of
# each row of B; the next slice's half is then already in L2). TVM's TMA copy takes both options;
# the rung only chooses them:

# %%
if rungs.available("v9", "sm_90a"):
    from gemm_ladder.sm90a import producer as sm90a_producer

    print("A:", sm90a_producer.STREAM_A, "\nB:", sm90a_producer.STREAM_B)

# %% [markdown]
# The front door's small-M rules set it. Measured on an H100 as kernels alone (CUDA graphs), the
# same kernel with and without the hints, at the suite's cases with M <= 128:

# %%
stream_run = teach.RESULTS_DIR / "2026-11-22_h100_stream_b" / "suite_small_m" / "sweep.json"
if stream_run.exists():
    pairs: dict = {}
    for r in json.loads(stream_run.read_text())["results"]:
        same = tuple(sorted((k, v) for k, v in r["knobs"].items() if k != "stream_b"))
        pairs.setdefault((tuple(r["shape"]), r["rung"], same), {})[r["knobs"]["stream_b"]] = r["ratio_to_cublas"]
    print(report.table([{"M x N x K": "x".join(map(str, shape)), "rung": rung, "cluster": dict(knobs)["cluster_m"],
                         "without": f"{got[False]:.3f}", "stream_b": f"{got[True]:.3f}",
                         "gain": f"{got[True] / got[False] - 1:+.1%}"}
                        for (shape, rung, knobs), got in pairs.items() if len(got) == 2],
                       ["M x N x K", "rung", "cluster", "without", "stream_b", "gain"]))

# %% [markdown]
# Two cases lose. At 128x6144x4096 in 64-row tiles without a cluster two CTAs read each B tile,
# and evict-first sends the second read back to HBM: the row-tiles rule therefore pairs the two
# row tiles of M > 64 in a 2x1 cluster that multicasts B (one read from L2), 0.95x there. At
# 128x128256x4096 (B read once) the hints cost 1.8%; the rule keeps them for the 18 cases that
# gain 1.6-6.3%.

# %% [markdown]
# ## Launch under the previous kernel's tail
#
# A kernel of a few microseconds spends a real share of them before its first load: the launch,
# shared memory and barriers set up, the cluster's meeting. With *programmatic dependent launch*
# (the `pdl` knob of v9-v11) the driver may start our CTAs while the kernel before them on the
# stream is still finishing: each does its set-up, then every thread waits
# (`griddepcontrol.wait`) until that kernel has finished and its writes are visible, and only then
# loads or stores anything, so it is safe whatever ran before. Each CTA then lets the next
# kernel launch the same way (`griddepcontrol.launch_dependents`). TVM 0.27 has both halves: the
# two PTX instructions and a launch tag its CUDA runtime turns into the launch attribute.
#
# Measured as kernels in CUDA graphs (one GEMM after another), the policy's module with and
# without it at the epilogue suite's weights (`benchmarks/epilogue_check.py --set pdl`):

# %%
pdl_run = teach.RESULTS_DIR / "2026-11-29_h200_pdl" / "epilogue_pdl.json"
if pdl_run.exists():
    pdl_pairs: dict = {}
    for r in json.loads(pdl_run.read_text())["rows"]:
        key = (r["M"], r["N"], r["K"], r["op"].removesuffix("_pdl"))
        pdl_pairs.setdefault(key, {"held_out": r["held_out"]})[r["rule"]] = r["kernel_ms"][r["rule"]]
    pdl_rows = []
    for (M, N, K, op), got in sorted(pdl_pairs.items()):
        if op == "none" and M <= 512:
            on = plan.choose(plan.Problem(M, N, K, "bfloat16"), use_db=False).knobs.get("pdl", False)
            pdl_rows.append({"M x N x K": f"{M}x{N}x{K}", "held out": "yes" if got["held_out"] else "",
                             "without (us)": f"{got['now'] * 1e3:.1f}", "pdl": f"{got['now'] / got['pdl']:.3f}x",
                             "policy": "pdl" if on else "off"})
    print(report.table(pdl_rows, ["M x N x K", "held out", "without (us)", "pdl", "policy"]))

# %% [markdown]
# The short kernels gain 10-20%. At M <= 128 on grids of more units than SMs (swap AB over a
# 28672-row weight) it lost up to 8%, with the trigger early or late, so `plan.pdl_pays` leaves it
# off there. In a model the kernel before a GEMM is often torch's, which never triggers; the
# end-to-end decode runs (`benchmarks/results/2026-11-29_h200_e2e_pdl/`) still gained 3-9%.

# %% [markdown]
# ## The front door's policy
#
# `gemm_ladder.matmul(A, B)` picks a kernel per shape: the tuning database's best entry in the
# shape's bucket (every dim rounded to a power of two) where one exists at or above the rule's
# rung, else the first rule of `gemm_ladder.serve.plan.RULES` that applies and validates. A new rung is
# one more entry in that table, with its own test in `tests/test_plan.py`.

# %%
print(report.table([{"rule": r.name, "arch": r.arch, "rung": r.rung, "why": r.why[:110], "evidence": r.evidence[:60]}
                    for r in plan.RULES], ["rule", "arch", "rung", "why", "evidence"]))

# %%
print(report.table(pictures.policy_rows(ISSUE[:4] + LLAMA[:6]), ["shape", "rung", "rule", "knobs", "intensity"]))

# %% [markdown]
# What `explain` prints for one shape (the front door adds where the module came from: a kernel
# pack, the module cache, or a build on first use):

# %%
print(plan.choose(plan.Problem(16, 6144, 4096)).text())

# %% [markdown]
# ## What TMA cannot describe
#
# TMA needs every row stride to be a multiple of 16 bytes and every tensor to start on a 16-byte
# boundary. cuBLAS takes any shape, and so does the front door: where a tensor does not fit, it
# copies it into a zero-padded (or aligned) buffer first, a correct and slower path, and says so.

# %%
for layout in (tma_layout.Layout(33, 1001, 100), tma_layout.Layout(64, 4096, 4096, a_aligned=False),
               tma_layout.Layout(64, 4096, 4096, out_given=True, out_aligned=False)):
    f = tma_layout.layout_fixes(layout)
    print(f"M={layout.M} N={layout.N} K={layout.K}: kernel sees N={f.N}, K={f.K}")
    for line in f.lines():
        print("   ", line)

# %% [markdown]
# One of those fixes splits instead of copying. GPT-2's LM head has N = 50257: D's rows are no
# multiple of 16 bytes, but the weight's rows are (K = 768). The kernel reads the weight's first
# 50256 rows where they lie, torch's matmul computes the last column, and a `torch.cat` puts both
# into D. No 77 MB copy of the weight is needed, and a CUDA graph replays it as it is.
#
# Called eagerly, though, that path was bound by the host, not the GPU. Timed on the GPU box, a
# single cuBLAS call for one column cost 14-31 us of host time, about what the 28 us kernel takes
# on the GPU. So the front door captures the kernel and torch's matmul once per weight as one CUDA
# graph, and each call replays it on a kept copy of A. The committed run, us per call (host us in
# brackets):

# %%
print(tma_layout.layout_fixes(tma_layout.Layout(16, 50257, 768)).lines()[0])
split_run = teach.RESULTS_DIR / "2026-11-29_h200_split_n" / "split_n.json"
if split_run.is_file():
    rows = [r for r in json.loads(split_run.read_text())["rows"] if r.get("status") == "ok" and r["trial"] == 1]
    print(report.table([{"M": r["M"], **{w: f"{r['call_ms'][w] * 1e3:.0f} ({r['host_us'][w]:.0f})"
                                         for w in ("now", "no_graph", "before", "linear")}} for r in rows],
                       ["M", "now", "no_graph", "before", "linear"]))
    print("now: one graph a call; no_graph: the kernel and torch's matmul launched one by one;\n"
          "before: the same with a fresh tail tensor; linear: F.linear on the whole weight")
else:
    print("The split-N run is not committed here: benchmarks/split_n_check.py on a GPU box.")

# %% [markdown]
# ## Kernel packs: one module per choice, every M
#
# A GPU box without TVM's compiler gets its kernels from a pack built elsewhere
# (`python -m gemm_ladder pack build --model llama-8b`). A rung that takes M at run time
# (`dynamic_m`) needs one module per (N, K, dtype) and policy choice, whatever M the model runs
# at: the pack for the Llama-8B weights at the suite's M values holds this many modules:

# %%
items = kernel_pack.plan_pack([(M, N, K) for N, K in kernel_pack.MODELS["llama-8b"].values() for M in suite.SUITE_M],
                              ["float16"], sms=132)
print(report.table([{"N x K": f"{i['job'].shape[1]}x{i['job'].shape[2]}", "rung": i["job"].rung,
                     "M chosen for": ",".join(str(m) for run in i["served"] for m in run["m_values"]), "runtime M": i["dynamic_m"],
                     "rule": i["choice"]["rule"]} for i in items], ["N x K", "rung", "M chosen for", "runtime M", "rule"]))

# %% [markdown]
# ## On the GPU: the front door and the shape suite
#
# On an H100 with a pack, `matmul(A, B, explain=True)` runs the kernel and prints the choice; the
# shape suite (`python -m gemm_ladder suite run`) times it against cuBLAS over the squares and the
# Llama-8B shapes. The committed results, where a run exists:

# %%
if teach.gpu_here():
    print(pictures.explain_on_gpu(16, 6144, 4096))
else:
    print(teach.no_gpu_message())
runs = sorted(teach.RESULTS_DIR.glob("*shape_suite*/**/shape_suite.json"))
if runs:
    doc = json.loads(runs[-1].read_text())
    print(runs[-1].relative_to(teach.RESULTS_DIR), json.dumps(doc["summary"], indent=1)[:800])
    teach.show(suite.figure(doc))
else:
    print("No shape-suite run is committed yet: benchmarks/prepare_front_door.sh here, then "
          "benchmarks/gpu_session.sh suite on an H100.")
