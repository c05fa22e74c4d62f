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
# # 13 · Grouped GEMM for mixture of experts: a scheduler that reads the routing on the GPU
#
# A mixture-of-experts layer sends each token to a few of many experts; its MLP is one GEMM per
# expert with a number of tokens the router decides on the GPU at run time. Sorted by expert, the
# tokens are one matrix A `[M, K]`, the weights W `[E, N, K]`, and `offs[e]` (int32, on the GPU)
# is the end row of expert e, `torch._grouped_mm`'s layout:
#
#     D[offs[e-1]:offs[e]] = A[offs[e-1]:offs[e]] . W[e]^T        (offs[-1] = 0)
#
# A loop of GEMMs needs the counts on the host (a sync that stalls the GPU and breaks CUDA
# graphs) and pays one launch per expert. v12 is one persistent launch: every CTA reads `offs`
# into shared memory, makes two small tables, and finds each of its work units there. Nothing
# goes back to the host, so a CUDA graph captured once serves every later routing.

# %%
import inspect
import json

import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.protocol import check
from gemm_ladder.protocol.kernel_ir import load as kernel_ir
from gemm_ladder.serve import plan
from gemm_ladder.sm90a import grouped

# %% [markdown]
# ## The tables and the walk
#
# A routing of 6 experts over 700 tokens, with 128x256 tiles and N = 600 (3 n-tiles, the last
# one partial). The prologue clamps each end row into [0, M] (a running max: a bad `offs` can give
# a wrong answer but never a write outside D) and counts each expert's tiles; an expert with no
# tokens owns no tiles and costs nothing.

# %%
counts = [0, 300, 1, 0, 257, 142]
offs = [sum(counts[: e + 1]) for e in range(len(counts))]
M, blk_m, n_tiles = offs[-1], 128, 3
ends, tile_end = grouped.tables(offs, M, blk_m, n_tiles)
print(f"offs     {offs}\nends     {ends}\ntile_end {tile_end}   (work units through each expert)")

# %% [markdown]
# CTA `c` of `C` runs units `c, c + C, c + 2C, ...`. For unit `t` it binary-searches `tile_end`
# for its expert (`log2(E)` shared loads), then places the unit inside the expert: bands of
# `l2_group_size` m-tiles, and inside a band the m-tiles of one n-tile side by side, so the CTAs
# running together share each weight tile across a band of tokens. The search, in the kernel's
# own steps:

# %%
print(inspect.getsource(grouped.locate))
walk = grouped.walk(offs, M, blk_m, n_tiles, group=2, num_ctas=4)
for cta, units in enumerate(walk):
    cells = [f"e{u.expert} rows {u.row0}-{min(u.row0 + blk_m, u.row_end) - 1} n{u.n_tile}"
             + (" *" if u.row0 + blk_m > u.row_end else "") for u in units]
    print(f"CTA {cta}: " + " | ".join(cells))
print("* an expert's last m-tile: its rows past the expert's end belong to the next expert")
teach.show(teach.plot_grouped_walk(walk, offs, blk_m, n_tiles))

# %% [markdown]
# ## The last m-tile of an expert
#
# A tile's A rows start at the expert's first row; its last m-tile reads rows of the next expert
# too (harmless: those accumulators are thrown away), but must not *write* them: a TMA store clips
# only at D's end, so it would overwrite rows that another CTA stores. v12 stores whole tiles with
# v9's chunked TMA epilogue and the boundary tile straight from the registers, each 4-byte pair
# guarded by the expert's end row (the alternative, tensor maps rewritten on the device per expert,
# needs a map per CTA in global memory and a fence per rewrite):

# %%
teach.show_source(grouped.rows_to_global)

# %% [markdown]
# ## The producer and the consumers agree
#
# The producer thread and every consumer thread compute the walk alike from the same tables, so
# the ring carries the data and nothing else is exchanged. The barrier checker runs every thread of
# the kernel with the routing of `grouped.checker_params` (an empty expert, a boundary tile, the
# rest on the last expert): the tables in shared memory, the search and the TMA loads it decides.
# The CPU tests also hold the producer's loads, as the checker runs them, against `grouped.walk`.

# %%
cfg = gemm_ladder.make_config("v12", 360, 320, 384, experts=8)
print(grouped.checker_params(cfg))
print(check.check_config(cfg, policies=("forward",)).summary())

# %% [markdown]
# ## The masked layout: decode under CUDA graphs
#
# In decode a model captures one CUDA graph per batch size and replays it every step, while the
# router's counts change every step. Sorting the tokens by expert (the contiguous layout) moves
# them; the masked layout (DeepGEMM's) gives each expert a fixed slot of `max_tokens` rows instead:
# A `[E, max_tokens, K]`, `counts[e]` (int32, on the GPU) the valid rows of slot e, and
#
#     D[e, :counts[e]] = A[e, :counts[e]] . W[e]^T        (the rows past counts[e] are not written)
#
# `gemm_ladder.grouped_mm_masked(A, W, counts, out=D)` keeps what `out` holds past each count (a
# fresh D holds garbage there; the torch op returns zeros). The kernel is v12 with
# `layout="masked"`: A viewed `[E * max_tokens, K]`, an expert's first row `e * max_tokens`, and
# the prologue's end rows `e * max_tokens + clamp(counts[e], 0, max_tokens)`. The host cannot
# refuse a count past `max_tokens` without reading it (a sync the graph forbids), so the device
# cuts it: never a row of the next slot. Everything after the tables (the search, the order, the
# guarded last m-tile) is the contiguous walk's.

# %%
slot_counts = [0, 130, 1, 999, 0, 64]  # 999: past max_tokens, clamped to 200
max_tokens = 200
M_masked = len(slot_counts) * max_tokens
ends, tile_end = grouped.masked_tables(slot_counts, M_masked, blk_m, n_tiles)
print(f"counts   {slot_counts}\nends     {ends}\ntile_end {tile_end}")
for cta, units in enumerate(grouped.walk(slot_counts, M_masked, blk_m, n_tiles, 2, 4, layout="masked")):
    print(f"CTA {cta}: " + " | ".join(f"e{u.expert} rows {u.row0}-{min(u.row0 + blk_m, u.row_end) - 1} n{u.n_tile}"
                                      for u in units))

# %% [markdown]
# Empty slots own no tiles, so an expert no token chose costs nothing (a bmm over every slot, what
# a decode graph without masking runs, reads every expert's weight and computes every row). The
# barrier checker runs the masked preset with an empty slot, a boundary tile, a clamped count and
# a full slot:

# %%
cfg_masked = gemm_ladder.make_config("v12", 8 * 300, 320, 384, experts=8, layout="masked")
print(grouped.checker_params(cfg_masked))
print(check.check_config(cfg_masked, policies=("forward",)).summary())

# %% [markdown]
# ## Decode: swap A and B when an expert has a few tokens
#
# In decode an expert gets a handful of tokens (DeepSeek-like routing, top-8 of 256 experts: one to
# eight a step), yet wgmma's A operand is 64 rows: a v12 tile of one token multiplies 63 rows of
# padding and loads them, while the cost that counts is streaming the expert's weight from memory.
# v11 met the same problem for a dense small M by computing D^T = W . A^T; v12's `swap_ab` knob does
# it per expert: W's `blk_n` rows (64 per consumer) fill wgmma's 64-row slot and the expert's
# `blk_m` tokens (a multiple of 8: 8, 16, 32, ...) its N, so a tile streams `blk_n x K` of W once at
# full width and the tokens ride along. The walk is the same (`blk_m` tokens a tile); only the
# roles and the epilogue change: a whole token tile leaves transposed through shared memory
# (`stmatrix.trans`, TMA stores), the expert's last one by stores guarded by its end row:

# %%
teach.show_source(grouped.rows_to_global_swapped)
cfg_swap = gemm_ladder.make_config("v12", 4096, 2048, 7168, experts=256, swap_ab=True, blk_m=16, blk_n=128,
                                   pipe_depth=8, warp_scan=True)
decode_counts = [1, 0, 3, 8] + [0] * 252  # a decode step (masked, 16-row slots): 12 tokens on 3 of 256 experts
units = grouped.walk(decode_counts, 256 * 16, cfg_swap.blk_m, 2048 // cfg_swap.blk_n, 8, 132, layout="masked")
print(f"{sum(map(len, units))} work units (3 experts x 16 n-tiles of 128 W rows), each 16 token rows for the "
      f"experts' 1, 3 and 8 tokens; v12's 128x256 tiles would compute 128 token rows per W row")

# %% [markdown]
# The routing's tables were thread 0's job: E dependent steps (a shared load, a max, a
# multiply-add), about 4 us at E = 256 before the first load. `warp_scan` gives them to the 32 lanes
# of a warp, each over a chunk of `ceil(E / 32)` experts, their partial results meeting in shared
# memory at CTA barriers (which the barrier checker follows, as it follows the tables).
# `grouped.warp_scan_tables` is the model, pass by pass; it makes thread 0's tables:

# %%
print(grouped.warp_scan_tables(offs, M, blk_m, n_tiles) == grouped.tables(offs, M, blk_m, n_tiles))
print(check.check_config(gemm_ladder.make_config("v12", 8 * 40, 1000, 520, experts=8, layout="masked", swap_ab=True,
                                                 blk_m=16, blk_n=128, pipe_depth=4, warp_scan=True),
                         policies=("forward",)).summary())

# %% [markdown]
# Measured (`benchmarks/results/2026-11-26_h100_grouped_decode/`): at 8-256 tokens under CUDA graphs
# the swap-AB module with 16 tokens a tile and the warp scan ran 1.14-1.15x `torch._grouped_mm` and
# 1.10-1.11x the best peer (a bmm over every slot, the expert loop) in both layouts; the kernel
# packs plan it for decode (rule `grouped-decode-swap`).

# %% [markdown]
# ## Measured
#
# `benchmarks/grouped_check.py` on an H100 (`benchmarks/results/2026-11-26_h100_grouped/`): every
# routing case right in all 12 modules (fp16 and bf16; balanced, Zipf, all tokens on one expert,
# empty experts, counts off the tile), a CUDA graph replayed after `offs` changed on the device
# right too. As kernels in CUDA graphs, bf16, v12 runs at 1.02x `torch._grouped_mm` (geometric
# mean, 0.96-1.17x on the Mixtral-, Qwen-MoE- and DeepSeek-V3-like layers), 2.4-2.7x a loop of
# cuBLAS GEMMs over 64 small experts and 1.3-1.5x over 256: one launch instead of one per
# expert, and no host sync.

# %%
run = json.loads((teach.RESULTS_DIR / "2026-11-26_h100_grouped" / "grouped_check.json").read_text())
print(run["gpu"]["name"], run["date"], "commit", run["commit"])
for r in run["rows"]:
    if r.get("ratio_to_grouped_mm") and r.get("variant") == "default":
        print(f"{r['shape']:12} E={r['experts']:3} N={r['N']:5} K={r['K']:5} {r['tokens']:5} tokens {r['routing']:8} "
              f"x torch._grouped_mm {r['ratio_to_grouped_mm']:.3f}  x cuBLAS loop {r['peer_ratios']['cublas_loop_graph']:.3f}")

# %% [markdown]
# ## Prefill: a module per range of token counts
#
# How many rows an expert holds decides the tile, and the front door knows M and E (not the
# routing) without a sync. With a few rows an expert a 128-row tile computes rows the expert lacks
# and few experts leave most SMs without a work unit; the swap-AB tile streams W at full width with
# the tokens as wgmma's N. `benchmarks/grouped_prefill_check.py` timed nine variants of v12's knobs
# side by side (`benchmarks/results/2026-11-26_h100_grouped_prefill/`); the kernel packs plan the
# tiers it chose: swapped tiles of 16 (more than 16 experts), 32 and 64 tokens up to 1, 32 and 128
# rows an expert on average, the 128x256 defaults past. Through a pack and the front door they ran
# at 1.086x `torch._grouped_mm` where the defaults alone ran at 1.022x; what is left is routing (a
# Zipf-hot expert wants the large tile) and the HBM ceiling (the weight-streaming cases move 2.8-3.0 TB/s).

# %%
for E, N, K in ((8, 14336, 4096), (64, 1408, 2048), (256, 2048, 7168)):
    for g in plan.grouped_choices(E, N, K, "bfloat16"):
        lo, hi = g.tokens
        print(f"E={E:3} {N}x{K}: {lo:6}..{hi:<7} rows of A  {g.choice.rule:24} blk_m={g.choice.knobs.get('blk_m', 128)}")
pack = json.loads((teach.RESULTS_DIR / "2026-11-26_h100_grouped_prefill" / "grouped_prefill_pack.json").read_text())
print(pack["gpu"]["name"], "commit", pack["commit"], pack["summary"])

# %% [markdown]
# ## Clusters: two m-tiles of an expert sharing W's tile
#
# One weight missed the suite's floor: 5 experts of 1000x520 at 32768 tokens ran 0.90-0.94x
# `torch._grouped_mm`. At K = 520 a 128x256 tile's K loop is 9 slices, and each tile streams
# 128x520 of A and 256x520 of W from L2 for them: ~4.4 TB/s of L2-to-SM traffic at 42% of the MMA
# peak. Neither the tile nor the epilogue moved it; torch's kernel (CUTLASS's) runs 2x1 clusters.
# With `cluster_m=2` a cluster walks units of an m-PAIR and one n-tile: the CTA of rank r takes
# m-tile `2 * pair + r`, each CTA loads half of W's tile and multicasts it to both (v9's producer
# and ring, unchanged), a third less traffic a tile. An expert with an odd count of m-tiles leaves a
# phantom: the second CTA of its last pair still loads its half and runs its K loop (its partner
# needs them), and its stores, guarded by the expert's end row, write nothing. The walk's model:

# %%
units = grouped.walk([300, 0, 130], 430, 128, 4, 8, 4, cluster_m=2)  # 4 CTAs: 2 clusters of 2
for cta, us in enumerate(units):
    print(f"CTA {cta}: " + ", ".join((f"e{u.expert} phantom (row {u.row0} past its {u.row_end})" if u.row0 >= u.row_end
                                       else f"e{u.expert} rows {u.row0}..{min(u.row0 + 128, u.row_end)}") + f" n{u.n_tile}"
                                      for u in us[:4]) + (" ..." if len(us) > 4 else ""))

# %% [markdown]
# Measured (`benchmarks/results/2026-11-26_h100_grouped_clusters/`, two runs): at 32768 tokens the odd
# weight runs 1.21-1.26x `torch._grouped_mm` in 2x1 clusters (1.32-1.40x the defaults). Where K is long
# (2048-7168) or experts hold 13 m-tiles, the phantoms and the coarser units cost more than the
# traffic saved (0.90-1.0x the defaults), so the policy takes 2x1 clusters only at K <= 1024 past 4096
# rows an expert (rule `grouped-prefill-c2x1`):

# %%
for g in plan.grouped_choices(5, 1000, 520, "bfloat16"):
    lo, hi = g.tokens
    print(f"E=5 1000x520: {lo:6}..{hi:<7} rows of A  {g.choice.rule:24} cluster_m={g.choice.knobs.get('cluster_m', 1)}")
runs = json.loads((teach.RESULTS_DIR / "2026-11-26_h100_grouped_clusters" / "grouped_clusters.json").read_text())
for r in runs["rows"]:
    if r.get("shape") == "odd" and r.get("tokens") == 32768 and r.get("variant") in ("default", "c2x1"):
        print(f"odd {r['tokens']} tokens {r['routing']:8} {r['variant']:8} x torch._grouped_mm {r['ratio_to_grouped_mm']:.3f}")

# %% [markdown]
# ## 256-byte L2 fills: the weight's rows in longer runs
#
# After the clusters the suite's least case was DeepSeek-V3-like (256 experts of 2048x7168) at 32768
# tokens balanced: 0.95-0.97x `torch._grouped_mm`, streaming 7.5 GB of weights. Under ncu (clocks
# locked, one launch) ours and torch's kernel read the same 8.2-8.4 GB from DRAM at the same 86% of its
# peak; at the clocks users run, torch took 2.86 ms and ours 2.96-3.0. One difference was left: torch's
# tile is 128 wide in K, so it reads 256 bytes of each W row a stage, where v12's 16-bit tile reads 128.
# A tensor map can ask L2 to fetch more than the request on a miss (`CU_TENSOR_MAP_L2_PROMOTION_L2_256B`):
# then each miss brings the row's next slice too, and DRAM sees 256-byte runs. v12's `l2_promo` knob asks
# both loads' maps for it (TVM's TMA copy takes the option; `producer.load_hints` chooses it):

# %%
for promo in (False, True):
    cfg = gemm_ladder.make_config("v12", 4096, 2048, 7168, experts=256, spec="d_bfloat16.a_bfloat16.b_bfloat16.grouped_true",
                                  dtype="bfloat16", swap_ab=True, blk_m=64, blk_n=128, pipe_depth=8, l2_promo=promo)
    fills = {n: (0, 64, 128, 256)[t.l2_promotion] for n, t in kernel_ir(cfg).tensormaps.items()}  # CUtensorMapL2promotion
    print(f"l2_promo={promo!s:5}: bytes an L2 miss fetches {fills}")

# %% [markdown]
# Each tier of the policy beside its twin with the fills, at the suite's token counts it serves
# (`benchmarks/grouped_prefill_check.py prepare --promo`, `benchmarks/results/2026-11-26_h100_grouped_l2_promo/`):
# the swapped tiers (which stream W) gain 2-3% everywhere but at K = 520 (level), DeepSeek-V3-like at 32768
# balanced going from 0.97x to 1.03x torch; the 128x256 tile loses past 1024 rows an expert (its W tile is
# read again by many m-tiles: extra fills only crowd L2) and the 2x1 clusters lose 11% at K = 520. So the
# kernel packs take the fills on the contiguous swapped tiers only:

# %%
promo_run = json.loads((teach.RESULTS_DIR / "2026-11-26_h100_grouped_l2_promo" / "grouped_l2_promo.json").read_text())
for tier, v in promo_run["summary"]["variants"].items():
    if tier.endswith("+promo"):
        print(f"{tier:32} {v['cases']:2} cases: x the tier without {v['to_baseline']:.3f}, x torch._grouped_mm {v['to_grouped_mm']:.3f}")

# %% [markdown]
# ## The suite
#
# `benchmarks/grouped_suite.py` serves 70 cases (five MoE weights x 64-32768 tokens x balanced and Zipf)
# through a kernel pack and `gemm_ladder.grouped_mm`, each checked with D poisoned, beside
# `torch._grouped_mm`, a loop of cuBLAS GEMMs and a Triton grouped GEMM in the same rounds
# (`benchmarks/results/2026-11-26_h100_grouped_suite_l2_promo/`, five runs), both as kernels in CUDA graphs and
# as a stream of calls through the front door, the host's launch path included (a call like one already
# checked skips the checks and the pack lookup: 16 us of host time against torch's 20):

# %%
suite = json.loads((teach.RESULTS_DIR / "2026-11-26_h100_grouped_suite_l2_promo" / "grouped_suite_stream1.json").read_text())
s = suite["summary"]
print(suite["gpu"]["name"], "commit", suite["commit"], f"{s['correct']}/{s['cases']} correct")
print(f"x torch._grouped_mm (kernels in CUDA graphs): geomean {s['to_grouped_mm']['geomean']:.3f}, least {s['to_grouped_mm']['min']:.3f}")
print(f"x torch._grouped_mm (a stream of calls): geomean {s['to_grouped_mm_stream']['geomean']:.3f}, "
      f"least {s['to_grouped_mm_stream']['min']:.3f}")
print(f"decode (<= 256 tokens) x the best peer: {s['to_best_peer_decode']['geomean']:.3f};"
      f" many small experts x the cuBLAS loop: {s['to_cublas_loop_many_small']['geomean']:.2f}")
