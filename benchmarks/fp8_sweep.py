"""fp8 speed (issue 32): v9's e4m3 kernel over its knobs, against torch._scaled_mm, on an H100.

    PYTHONPATH=. .venv/bin/python benchmarks/fp8_sweep.py prepare build/fp8_sweep        # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/fp8_sweep.py run build/fp8_sweep --out out/fp8_sweep.json     # GPU box

``prepare --recipe block`` sweeps the block-wise recipe instead (:data:`BLOCK`: DeepSeek-V3's A 1x128
and B 128x128 scales, applied at each promotion), where the in-place promotion and ``overlap`` came
after the first block run (0.76x ``torch._scaled_mm`` block-wise,
``benchmarks/results/2026-11-26_h100_fp8_block/``); ``run`` sweeps what ``prepare`` built. A block
shape's peers, in the same rounds: ``torch._scaled_mm`` block-wise (``torch_scaled_mm``; its fast
accumulation is left out where torch refuses it, with torch's message), our per-tensor fp8 at the
per-tensor policy's knobs (``ours_fp8_tensor``) and ``torch._scaled_mm`` per-tensor on tensor-scaled
inputs of the shape, and cuBLAS bf16 (``torch_bf16_mm``) on bf16 inputs (``fp8_check._block_peers``).

Why: with the promotion every 128 of K, v9's fp8 runs 0.64-0.86x ``torch._scaled_mm``
(``benchmarks/results/2026-11-26_h100_fp8/``); without it a 128x256 tile ran 1.08x but is less
accurate at long K. Which of the knobs that exist (cluster shape, ring depth, tile width, promotion
interval, tile order) buys what, per shape, is what the fp8 policy (``serve.plan.FP8_RULES``) is
chosen from; this measures it, with the accuracy of each promotion interval beside its speed, and
the overlapped promotion (``overlap``: two accumulator sets, a group's adds under the next group's
wgmmas) and staggered consumers (``stagger``: their drains take turns) beside the promotion after a
drain.

- the modules (:data:`SHAPES` x :data:`CONFIGS`): one runtime-M module per (N, K, config), the
  per-tensor recipe, e4m3 A and B, bf16 out, built through the module cache (the exported .so
  holds the compiled fatbin); knobs a config does not name are v9's fp8 defaults (128x128 tiles
  over two consumers, blk_k 128, four stages, a 2x1 cluster, promotion every slice);
- correctness first, each module at its shape's M in children with a deadline a case
  (``fp8_check.check_all``: random inputs quantized as ``quantize_fp8`` does, the output
  poisoned with NaN, the error against a float64 product of the dequantized inputs with
  ``torch._scaled_mm``'s own error on the same inputs as the yardstick, pass within 2x; the
  front door on the same module must give the same bits);
- then per shape every module whose checks came near the answer (``fp8_check.runs``: a module
  without the promotion is less accurate, not broken: its row's ``correct`` says whether it met
  the 2x) and ``torch._scaled_mm`` (with and without fast accumulation) in the same rounds, the
  order rotating and reversing, as kernels (one replay of a CUDA graph of calls cycling input sets
  that spill L2: ``harness.graph_times``) and as queued calls; clocks and power sampled.

Rows (the issue's results format): recipe, M, N, K, config, knobs, correct, rel_err and
torch_rel_err (largest error over largest |value|), mean errors, tflops (kernel timing),
ratio_to_scaled_mm (torch's time over ours), peer_ratios; ``best`` names each shape's fastest
correct config. Sized for about two minutes on an H100 (an estimate until its first run).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_check  # noqa: E402  (a sibling script: its inputs, checks and children)
from power_probe import Sampler  # noqa: E402
import check_cli  # noqa: E402  (a sibling script, not a package)
from gemm_ladder.serve import plan as serve_plan  # noqa: E402  (the policy the block shapes' per-tensor peers follow)

from gemm_ladder.core import device, files  # noqa: E402

FORMAT = "gemm_ladder.fp8_sweep"
PLAN_FILE = fp8_check.PLAN_FILE  # the same plan form: fp8_check's children check these modules
RECIPE = "tensor"
# (label, M, N, K): the squares and DeepGEMM's long-K and small-M cases
SHAPES = (("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192),
          ("4096x7168x16384", 4096, 7168, 16384), ("128x4096x7168", 128, 4096, 7168),
          # the fp8 suite's sub-wave row (benchmarks/results/2026-11-27_h100_fp8_suite/): M = 256
          ("256x6144x4096", 256, 6144, 4096), ("256x4096x14336", 256, 4096, 14336),
          ("256x2112x7168", 256, 2112, 7168), ("256x7168x16384", 256, 7168, 16384),
          # and its other sub-wave cases: M = 64, 24576x1536 at M = 256, 2112x7168 at M = 1024 (68 cluster tiles)
          ("64x2112x7168", 64, 2112, 7168), ("64x4096x14336", 64, 4096, 14336), ("64x6144x4096", 64, 6144, 4096),
          ("64x7168x16384", 64, 7168, 16384), ("256x24576x1536", 256, 24576, 1536),
          ("1024x2112x7168", 1024, 2112, 7168), ("64x24576x1536", 64, 24576, 1536),
          ("128x2112x7168", 128, 2112, 7168), ("64x1024x7168", 64, 1024, 7168),
          # weights and M the fill rule (plan.fp8_fill_n) was not chosen on: Llama-3-8B's o_proj at M = 256, an odd M
          ("256x4096x4096", 256, 4096, 4096), ("200x2048x8192", 200, 2048, 8192),
          # the widths' run 7: the suite's 1024x6144x4096; held out: Mistral-7B's and Qwen2.5-7B's up projections at
          # M = 256, 2112x7168 at M = 2048
          ("1024x6144x4096", 1024, 6144, 4096), ("256x14336x4096", 256, 14336, 4096),
          ("256x18944x3584", 256, 18944, 3584), ("2048x2112x7168", 2048, 2112, 7168),
          # run 8, where the width rule (plan.fp8_width) changed the policy's module and run 7 did not time it:
          # Llama-3-70B's up projection at M = 512, DeepSeek-V3's dense up projection at M = 256, and other M of the suite's weights
          ("512x28672x8192", 512, 28672, 8192), ("256x18432x7168", 256, 18432, 7168),
          ("512x6144x4096", 512, 6144, 4096), ("768x6144x4096", 768, 6144, 4096),
          ("1024x14336x4096", 1024, 14336, 4096),
          ("512x2112x7168", 512, 2112, 7168), ("1536x1024x8192", 1536, 1024, 8192),
          ("1536x2112x7168", 1536, 2112, 7168), ("256x7168x2048", 256, 7168, 2048),
          # run 9: M = 1024 of DeepSeek-V3's o_proj-sized weight, Mistral-7B's up projection at M = 512; two
          # shapes again under a second label (the clusters' configs)
          ("1024x7168x16384", 1024, 7168, 16384), ("512x14336x4096", 512, 14336, 4096),
          ("256x6144x4096_c", 256, 6144, 4096), ("1024x2112x7168_c", 1024, 2112, 7168),
          # run 10, held out: Llama-3-70B's up projection at M = 256, DeepSeek-V3's dense up projection at M = 768,
          # Mistral-7B's down projection at M = 4096, and M = 512 and 2048 of a 7168x2048 weight
          ("256x28672x8192", 256, 28672, 8192), ("768x18432x7168", 768, 18432, 7168),
          ("2048x7168x2048", 2048, 7168, 2048), ("4096x3584x18944", 4096, 3584, 18944),
          ("512x7168x2048", 512, 7168, 2048),
          # run 11: the same shapes as run 7's under labels of their own (promote=2 configs)
          ("256x6144x4096_p2", 256, 6144, 4096), ("1024x2112x7168_p2", 1024, 2112, 7168),
          ("256x2112x7168_p2", 256, 2112, 7168), ("64x2112x7168_p2", 64, 2112, 7168),
          ("256x7168x16384_p2", 256, 7168, 16384),
          # run 12
          ("256x18944x3584_p2", 256, 18944, 3584), ("2048x2112x7168_p2", 2048, 2112, 7168),
          ("1024x6144x4096_p2", 1024, 6144, 4096), ("512x6144x4096_p2", 512, 6144, 4096),
          ("1536x2112x7168_p2", 1536, 2112, 7168), ("256x24576x1536_p2", 256, 24576, 1536),
          # run 13
          ("256x2112x7168_kc", 256, 2112, 7168), ("256x4096x14336_kc", 256, 4096, 14336),
          ("256x4096x4096_kc", 256, 4096, 4096), ("64x6144x4096_kc", 64, 6144, 4096),
          ("64x7168x16384_kc", 64, 7168, 16384), ("64x24576x1536_kc", 64, 24576, 1536),
          ("128x2112x7168_kc", 128, 2112, 7168),
          # run 14
          ("256x2112x7168_sb", 256, 2112, 7168), ("256x4096x14336_sb", 256, 4096, 14336),
          ("64x2112x7168_sb", 64, 2112, 7168), ("64x6144x4096_sb", 64, 6144, 4096),
          ("128x2112x7168_sb", 128, 2112, 7168),
          # run 15
          ("256x2112x7168_kh", 256, 2112, 7168), ("64x6144x4096_kh", 64, 6144, 4096),
          ("128x2112x7168_kh", 128, 2112, 7168), ("256x6144x4096_kh", 256, 6144, 4096),
          # run 16
          ("256x6144x4096_sk", 256, 6144, 4096), ("256x2112x7168_sk", 256, 2112, 7168),
          ("64x2112x7168_sk", 64, 2112, 7168), ("4096x2112x7168_w", 4096, 2112, 7168),
          # run 17
          ("4096x2112x7168_r", 4096, 2112, 7168), ("8192x2112x7168_r", 8192, 2112, 7168),
          ("768x7168x16384_r", 768, 7168, 16384), ("2048x7168x16384_r", 2048, 7168, 16384),
          ("1024x14336x4096_r", 1024, 14336, 4096), ("512x28672x8192_r", 512, 28672, 8192),
          ("4096x14336x4096_r", 4096, 14336, 4096), ("1024x11008x4096_r", 1024, 11008, 4096),
          ("512x5120x5120_r", 512, 5120, 5120), ("1536x8960x1536_r", 1536, 8960, 1536),
          # run 18
          ("768x7168x2048_r", 768, 7168, 2048), ("1536x3584x18944_r", 1536, 3584, 18944),
          ("256x11008x4096_r", 256, 11008, 4096), ("2048x11008x4096_r", 2048, 11008, 4096),
          ("1024x5120x5120_r", 1024, 5120, 5120),
          # run 19
          ("1024x4096x14336_c4", 1024, 4096, 14336), ("1024x2112x7168_c4", 1024, 2112, 7168),
          ("1024x6144x4096_c4", 1024, 6144, 4096), ("1024x7168x16384_c4", 1024, 7168, 16384),
          ("1024x24576x1536_c4", 1024, 24576, 1536), ("4096^3_c4", 4096, 4096, 4096), ("8192^3_c4", 8192, 8192, 8192),
          ("256x6144x4096_c4", 256, 6144, 4096), ("4096x2112x7168_c4", 4096, 2112, 7168),
          # run 20
          ("128x2112x7168_s2", 128, 2112, 7168), ("96x2112x7168_s2", 96, 2112, 7168),
          ("128x1024x7168_s2", 128, 1024, 7168), ("128x2048x8192_s2", 128, 2048, 8192),
          # run 21
          ("128x1536x8960_p", 128, 1536, 8960), ("128x1024x8192_p", 128, 1024, 8192),
          ("112x2112x7168_p", 112, 2112, 7168), ("128x1024x7168_p", 128, 1024, 7168),
          # run 22
          ("256x2112x7168_u", 256, 2112, 7168), ("64x6144x4096_u", 64, 6144, 4096),
          ("256x6144x4096_u", 256, 6144, 4096), ("64x24576x1536_u", 64, 24576, 1536),
          ("200x2048x8192_u", 200, 2048, 8192), ("96x4096x4096_u", 96, 4096, 4096),
          ("64x11008x4096_u", 64, 11008, 4096), ("256x5120x5120_u", 256, 5120, 5120),
          ("256x2112x14336_u", 256, 2112, 14336),
          # run 23
          ("64x4096x14336_u", 64, 4096, 14336), ("128x2112x7168_u", 128, 2112, 7168),
          ("64x2112x7168_u", 64, 2112, 7168), ("128x1536x8960_u", 128, 1536, 8960),
          ("96x2048x8192_u", 96, 2048, 8192), ("256x2112x7168_u2", 256, 2112, 7168),
          # run 24
          ("256x2112x7168_u3", 256, 2112, 7168), ("256x6144x4096_u3", 256, 6144, 4096),
          ("200x2048x8192_u3", 200, 2048, 8192), ("256x5120x5120_u3", 256, 5120, 5120),
          # run 25
          ("256x2112x7168_u4", 256, 2112, 7168), ("256x2048x4096_u4", 256, 2048, 4096),
          ("192x2112x7168_u4", 192, 2112, 7168), ("256x2112x3584_u4", 256, 2112, 3584),
          ("256x2048x8192_u4", 256, 2048, 8192),
          # run 26
          ("256x6144x4096_u5", 256, 6144, 4096), ("256x5120x5120_u5", 256, 5120, 5120),
          # run 27
          ("256x6144x4096_pdl", 256, 6144, 4096), ("64x6144x4096_pdl", 64, 6144, 4096),
          ("4096^3_pdl", 4096, 4096, 4096), ("8192^3_pdl", 8192, 8192, 8192),
          ("256x2112x7168_pdl", 256, 2112, 7168), ("128x4096x7168_pdl", 128, 4096, 7168),
          ("1024x2112x7168_pdl", 1024, 2112, 7168))
# config -> knobs over v9's fp8 defaults (promote: K slices of 128 between promotions, 0: none)
# the per-tensor small-M tiles as first measured (plan.FP8_SMALL_KNOBS has overlap=4 since the sub-wave runs)
SMALL_M_KNOBS = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2, "stream_b": True,
                 "pipe_depth": 8}
CONFIGS = {
    "base": {},
    "c1x1": {"cluster_m": 1},
    "c1x2": {"cluster_m": 1, "cluster_n": 2},
    "every2": {"promote": 2},
    "every4": {"promote": 4},
    "every8": {"promote": 8},
    "every4_c1x2": {"promote": 4, "cluster_m": 1, "cluster_n": 2},
    "p0": {"promote": 0},
    "n192": {"blk_n": 192},  # 96 accumulators + 96 promoted sums + 40: the 232 a consumer holds
    "n192_every2": {"blk_n": 192, "promote": 2},
    "n192_every4": {"blk_n": 192, "promote": 4},
    "n192_every4_c1x2": {"blk_n": 192, "promote": 4, "cluster_m": 1, "cluster_n": 2},
    "n256_p0": {"blk_n": 256, "promote": 0},  # 128x256 fits only without the promoted sums
    "n256_p0_c1x2": {"blk_n": 256, "promote": 0, "cluster_m": 1, "cluster_n": 2},
    "g16": {"l2_group_size": 16},
    "snake": {"tile_order": "snake"},
    # small M: one row of tiles, so a 2x1 cluster pairs it with an empty one; more, narrower tiles
    "n64_c1x1": {"blk_n": 64, "cluster_m": 1},
    "n64_c1x2": {"blk_n": 64, "cluster_m": 1, "cluster_n": 2},
    "n64_c1x2_sb": {"blk_n": 64, "cluster_m": 1, "cluster_n": 2, "stream_b": True},
    "n64_c1x2_sb_every4": {"blk_n": 64, "cluster_m": 1, "cluster_n": 2, "stream_b": True, "promote": 4},
    "n64_c1x2_sb_ov4": {"blk_n": 64, "cluster_m": 1, "cluster_n": 2, "stream_b": True, "overlap": 4},
    "m64_c1x1": {"blk_m": 64, "num_warpgroups": 1, "cluster_m": 1},
    "m64n64_c1x2_sb": {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2,
                       "stream_b": True},
    "m64n64_c1x2_sb_d8": {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2,
                          "stream_b": True, "pipe_depth": 8},
    # the overlapped promotion (fp8.py's overlap): groups in two accumulator sets, a drain every run
    "ov2": {"overlap": 2},
    "ov4": {"overlap": 4},
    "ov8": {"overlap": 8},
    "ov2_every2": {"overlap": 2, "promote": 2},
    "ov4_c1x2": {"overlap": 4, "cluster_m": 1, "cluster_n": 2},
    # staggered consumers (fp8.py's stagger): the odd consumer's groups half a group (or run) later
    "every4_st": {"promote": 4, "stagger": True},
    "every4_c1x2_st": {"promote": 4, "cluster_m": 1, "cluster_n": 2, "stagger": True},
    "n192_every4_c1x2_st": {"blk_n": 192, "promote": 4, "cluster_m": 1, "cluster_n": 2, "stagger": True},
    "ov4_st": {"overlap": 4, "stagger": True},
    # 192x128 tiles over three consumers (64 rows each, the promotion every slice, drained): a fifth less
    # operand traffic a product than 128x128, and three consumers' promotions interleave
    "m192": {"blk_m": 192, "num_warpgroups": 3},
    "m192_c1x2": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2},
    "m192_c1x1": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1},
    "m192_c1x2_p2": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "promote": 2},
    "m192_c1x2_p2_st": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "promote": 2,
                        "stagger": True},
    "m192_p2": {"blk_m": 192, "num_warpgroups": 3, "promote": 2},
    "ov4_c1x2_st": {"overlap": 4, "cluster_m": 1, "cluster_n": 2, "stagger": True},
    # 128x256 tiles with the promotion in halves (fp8.py's halves): each group's wgmmas as two 128-wide
    # groups into one 64-register set, each half added into its half of the total before the other is issued
    "n256_h": {"blk_n": 256, "halves": True},
    "n256_h_c1x2": {"blk_n": 256, "halves": True, "cluster_m": 1, "cluster_n": 2},
    "n256_h_c1x1": {"blk_n": 256, "halves": True, "cluster_m": 1},
    "n256_h_p2": {"blk_n": 256, "halves": True, "promote": 2},
    "n256_h_p2_c1x2": {"blk_n": 256, "halves": True, "promote": 2, "cluster_m": 1, "cluster_n": 2},
    "n256_h_p2_st": {"blk_n": 256, "halves": True, "promote": 2, "stagger": True},
    "n256_h_p4": {"blk_n": 256, "halves": True, "promote": 4},
    "n256_h_p4_st": {"blk_n": 256, "halves": True, "promote": 4, "stagger": True},
    "n256_h_p2_c1x2_st": {"blk_n": 256, "halves": True, "promote": 2, "cluster_m": 1, "cluster_n": 2,
                          "stagger": True},
    # cuBLAS's kernel at 4096^3 (ncu: nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_coopA) is 128x128 over a 6-deep
    # ring in 1x2 clusters: ov4 at its depth
    "ov4_d5": {"overlap": 4, "pipe_depth": 5},
    "ov4_d6": {"overlap": 4, "pipe_depth": 6},
    "ov4_d6_c1x2": {"overlap": 4, "pipe_depth": 6, "cluster_m": 1, "cluster_n": 2},
    "n256_h_p2_kz": {"blk_n": 256, "halves": True, "promote": 2, "k_zigzag": True},
    "n256_h_p2_g4": {"blk_n": 256, "halves": True, "promote": 2, "l2_group_size": 4},
    "n256_h_p2_g16": {"blk_n": 256, "halves": True, "promote": 2, "l2_group_size": 16},
    "n256_h_p2_c1x1": {"blk_n": 256, "halves": True, "promote": 2, "cluster_m": 1},
    "n256_h_p2_c1x1_st": {"blk_n": 256, "halves": True, "promote": 2, "cluster_m": 1, "stagger": True},
    # the previous tile's epilogue under the next tile's first promotion group (epi_under with fp8: each
    # half's columns stored from 16-bit pairs while that half's wgmmas run; mainloop.Consumer.run_under)
    "n256_h_p2_u": {"blk_n": 256, "halves": True, "promote": 2, "epi_under": True},
    "n256_h_p2_u_c1x2": {"blk_n": 256, "halves": True, "promote": 2, "epi_under": True, "cluster_m": 1,
                         "cluster_n": 2},
    "m192_c1x2_u": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "epi_under": True},
    # with the epilogue under: L2 groups, K read backwards every second tile, wider chunks, the other cluster
    "m192_c1x2_u_g16": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "epi_under": True,
                        "l2_group_size": 16},
    "m192_c1x2_u_kz": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "epi_under": True,
                       "k_zigzag": True},
    "m192_c1x2_u_e128": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "epi_under": True,
                         "epi_n": 128},
    "m192_u": {"blk_m": 192, "num_warpgroups": 3, "epi_under": True},
    "n256_h_p2_u_g16": {"blk_n": 256, "halves": True, "promote": 2, "epi_under": True, "l2_group_size": 16},
    "n256_h_p2_u_kz": {"blk_n": 256, "halves": True, "promote": 2, "epi_under": True, "k_zigzag": True},
    # v10's split K (a config's "rung"): a tile's K over split_k CTAs, each unit's promoted sums the partials,
    # scaled once by the last (fp8.check_split)
    "sk2": {"rung": "v10", "split_k": 2},
    "sk4": {"rung": "v10", "split_k": 4},
    "sk8": {"rung": "v10", "split_k": 8},
    # a split that does not divide the slices, and stream-K (every cluster the same share of the tiles' K
    # slices; under one wave too): a unit's count at run time, the promotion every slice (mainloop._run_promoted_each)
    "sk3": {"rung": "v10", "split_k": 3},
    "stream": {"rung": "v10", "split_k": 1, "stream_k": True},
    # the small-M tiles (plan.FP8_SMALL_KNOBS) split, and over stream-K
    "m64_sk2": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2},
    "m64_sk3": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 3},
    "m64_sk4_c1x1": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 4, "cluster_n": 1},
    "m64_stream": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 1, "stream_k": True},
    # and with the overlapped promotion (overlap: a run's groups in two accumulator sets; a count known at run
    # time takes whole runs, then its rest drained a slice at a time: mainloop._run_overlapped_each)
    "ov4_sk2": {"rung": "v10", "split_k": 2, "overlap": 4},
    "ov4_sk3": {"rung": "v10", "split_k": 3, "overlap": 4},
    "ov4_stream": {"rung": "v10", "split_k": 1, "stream_k": True, "overlap": 4},
    "m64_ov2_sk2": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2, "overlap": 2},
    "m64_ov4_sk2": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2, "overlap": 4},
    "m64_ov2_sk3": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 3, "overlap": 2},
    "m64_ov4_sk3": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 3, "overlap": 4},
    "m64_ov2": {**SMALL_M_KNOBS, "overlap": 2},
    "m64_ov4": {**SMALL_M_KNOBS, "overlap": 4},
    # deeper rings (cuBLASLt's kernels at these shapes run 7- to 16-stage rings)
    "m64_ov4_d12": {**SMALL_M_KNOBS, "overlap": 4, "pipe_depth": 12},
    "m64_ov4_sk3_d12": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 3, "overlap": 4, "pipe_depth": 12},
    "m64_ov4_sk2_d12": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2, "overlap": 4, "pipe_depth": 12},
    "sk2_d6": {"rung": "v10", "split_k": 2, "pipe_depth": 6},
    "sk3_d6": {"rung": "v10", "split_k": 3, "pipe_depth": 6},
    # tiles whose count fills the SMs' waves (run 5): 64x64 in 2x1 clusters sharing B (256x2112: 4 x 33 = 132
    # tiles; a 1x2 cluster would leave 33 columns one short), 128x64 (1024x2112: 8 x 33 = 264, two whole
    # waves; 256x2112 split two ways: 132 units), 64x128 (256x4096: 128 tiles), 64x192 (256x6144: 128 tiles;
    # no second accumulator set fits beside 96 promoted sums, so drained), the small-M split four ways in
    # 1x1 clusters (64x2112: 33 x 4 = 132 units)
    "m64n64_c2x1_ov4": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4},
    "m64n64_c1x1_ov4": {**SMALL_M_KNOBS, "cluster_n": 1, "overlap": 4},
    "n64_ov4_sk2": {"rung": "v10", "blk_n": 64, "overlap": 4, "split_k": 2, "pipe_depth": 8},
    "n64_ov4": {"blk_n": 64, "overlap": 4},
    "n64_ov4_d8": {"blk_n": 64, "overlap": 4, "pipe_depth": 8},
    "n64_d8_u": {"blk_n": 64, "pipe_depth": 8, "epi_under": True},  # epi_under takes one accumulator set
    "m64n128_c2x1_ov4": {**SMALL_M_KNOBS, "blk_n": 128, "cluster_m": 2, "cluster_n": 1, "overlap": 4},
    "m64n128_c1x2_ov4": {**SMALL_M_KNOBS, "blk_n": 128, "overlap": 4},
    "m64n192_c2x1": {**SMALL_M_KNOBS, "blk_n": 192, "cluster_m": 2, "cluster_n": 1, "pipe_depth": 6},
    "m64n192_c1x2": {**SMALL_M_KNOBS, "blk_n": 192, "pipe_depth": 6},
    "m64_ov4_sk4_c1x1": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 4, "cluster_n": 1, "overlap": 4},
    "m64n64_c2x1_ov4_d12": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12},
    # run 22: the overlapped promotion's loop unrolled over the whole tile (v9's unroll_k)
    "m64n64_c2x1_ov4_d12_u": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12,
                              "unroll_k": True},
    "m64_ov4_u": {**SMALL_M_KNOBS, "overlap": 4, "unroll_k": True},
    # run 23: and v10's split units where the split divides the slices (a unit's count fixed), the fill tile over
    # two consumers taking alternate slices (k_consumers=2), unrolled
    "m64_ov4_sk2_u": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2, "overlap": 4, "unroll_k": True},
    "m64_ov4_sk4_c1x1_u": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 4, "cluster_n": 1, "overlap": 4,
                           "unroll_k": True},
    "m64n64_c2x1_ov4_sk2_u": {**SMALL_M_KNOBS, "rung": "v10", "cluster_m": 2, "cluster_n": 1, "overlap": 4,
                              "split_k": 2, "unroll_k": True},
    # run 24: the unrolled tiles promoting every 2 slices (half the adds), and the fill tile's ring one stage deeper
    "m64n64_c2x1_ov2_d12_p2_u": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 2, "pipe_depth": 12,
                                 "promote": 2, "unroll_k": True},
    "m64n64_c2x1_ov4_d13_e32_u": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 13,
                                  "epi_n": 32, "unroll_k": True},
    "m64n64_c2x1_ov4_d12_kc2_u": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12,
                                  "k_consumers": 2, "unroll_k": True},
    # cuBLASLt's widths (run 7; ncu and torch's profiler at the weak sub-wave shapes: 128x96 at 256x6144x4096,
    # 128x112 at 256x7168x16384, 128x144 at 1024x2112x7168): blk_n in whole 16s, each chunk leaving in 64-, 32-
    # or 16-column boxes (epilogue.chunk_swizzle), rings as deep as fit; 144 and 160 drained (a second
    # accumulator set passes the registers)
    "n96_ov4_d7": {"blk_n": 96, "epi_n": 96, "overlap": 4, "pipe_depth": 7},
    "n96_e32_ov4_d7": {"blk_n": 96, "epi_n": 32, "overlap": 4, "pipe_depth": 7},
    "n112_ov4_d6": {"blk_n": 112, "epi_n": 112, "overlap": 4, "pipe_depth": 6},
    "n112_e16_ov4_d7": {"blk_n": 112, "epi_n": 16, "overlap": 4, "pipe_depth": 7},
    "n112_e16_ov4_d7_u": {"blk_n": 112, "epi_n": 16, "overlap": 4, "pipe_depth": 7, "unroll_k": True},
    "n144_e16_d6": {"blk_n": 144, "epi_n": 16, "pipe_depth": 6},
    "n144_e48_d5": {"blk_n": 144, "epi_n": 48, "pipe_depth": 5},
    "n160_e32_d5": {"blk_n": 160, "epi_n": 32, "pipe_depth": 5},
    # run 9: 128x224 in halves (two 112-wide wgmma groups a promotion, every 2 slices; 224 tiles of 128x256 take two
    # waves at 85% where 256 of 128x224 take them at 97%), its chunks of 16 or a half's 112 columns; the widths'
    # modules in other clusters (cuBLASLt's 128x144 kernel at 1024x2112x7168 runs 1x4)
    "n224_h_p2_u_e16": {"blk_n": 224, "halves": True, "promote": 2, "epi_under": True, "epi_n": 16},
    "n224_h_p2_u": {"blk_n": 224, "halves": True, "promote": 2, "epi_under": True, "epi_n": 112, "pipe_depth": 3},
    "n112_e16_ov4_d7_c1x1": {"blk_n": 112, "epi_n": 16, "overlap": 4, "pipe_depth": 7, "cluster_m": 1},
    "n144_e16_d6_c1x2": {"blk_n": 144, "epi_n": 16, "pipe_depth": 6, "cluster_m": 1, "cluster_n": 2},
    "n144_e16_d6_c1x1": {"blk_n": 144, "epi_n": 16, "pipe_depth": 6, "cluster_m": 1},
    # run 11: the sub-wave and width tiles promoted every 2 slices (half the promotion's drains and adds; 128x256 in
    # halves, promoted so, kept torch's error to K = 16384), two groups a run where the promotion overlaps
    "n112_e16_ov2_d7_p2": {"blk_n": 112, "epi_n": 16, "overlap": 2, "pipe_depth": 7, "promote": 2},
    "n96_e32_ov2_d7_p2": {"blk_n": 96, "epi_n": 32, "overlap": 2, "pipe_depth": 7, "promote": 2},
    "n144_e16_d6_p2": {"blk_n": 144, "epi_n": 16, "pipe_depth": 6, "promote": 2},
    "m64n64_c2x1_ov2_d12_p2": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 2, "pipe_depth": 12,
                               "promote": 2},
    "m64_ov2_sk4_c1x1_p2": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 4, "cluster_n": 1, "overlap": 2, "promote": 2},
    "m64_ov2_sk2_p2": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 2, "overlap": 2, "promote": 2},
    # run 12: 128x192, drained as 128x144 is, promoted every 2 slices (run 11: 128x144 +9% so)
    "n192_p2": {"blk_n": 192, "promote": 2},
    # run 13: two consumers on a 64-row tile taking alternate K slices (v9's k_consumers, sm90a/kconsumers.py: as
    # cuBLASLt's 64x64 kernel runs a producer and two consumers), the second's sums handed over in shared memory
    "m64n64_c2x1_ov4_d10_kc2": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 10,
                                "k_consumers": 2},
    "m64n64_c2x1_ov4_d12_kc2": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12,
                                "k_consumers": 2},
    "m64n64_c2x1_d12_kc2": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "pipe_depth": 12, "k_consumers": 2},
    "m64n128_c2x1_ov4_d6_kc2": {**SMALL_M_KNOBS, "blk_n": 128, "cluster_m": 2, "cluster_n": 1, "overlap": 4,
                                "pipe_depth": 6, "k_consumers": 2},
    "m64n128_c2x1_ov4_d8": {**SMALL_M_KNOBS, "blk_n": 128, "cluster_m": 2, "cluster_n": 1, "overlap": 4},
    "m64_ov4_kc2": {**SMALL_M_KNOBS, "overlap": 4, "k_consumers": 2},
    "m64_ov4_d12_kc2": {**SMALL_M_KNOBS, "overlap": 4, "pipe_depth": 12, "k_consumers": 2},
    # run 14: the small-M and fill tiles without stream_b's L2 hints (B evict-first, A evict-last, 256-byte
    # promotion), and with the promotion alone (l2_promo: v12's)
    "m64n64_c2x1_ov4_d12_nosb": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12,
                                 "stream_b": False},
    "m64n64_c2x1_d12_kc2_nosb": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "pipe_depth": 12,
                                 "k_consumers": 2, "stream_b": False},
    "m64n128_c2x1_ov4_d8_nosb": {**SMALL_M_KNOBS, "blk_n": 128, "cluster_m": 2, "cluster_n": 1, "overlap": 4,
                                 "stream_b": False},
    "m64_ov4_nosb": {**SMALL_M_KNOBS, "overlap": 4, "stream_b": False},
    "m64_ov4_sk3_nosb": {**SMALL_M_KNOBS, "rung": "v10", "split_k": 3, "overlap": 4, "stream_b": False},
    # run 15: the two consumers each a contiguous half of K (k_halves: the halves loaded in turn), and a 13-stage ring
    # beside 32-column chunks (cuBLASLt's 64x64 kernel runs 13 stages)
    "m64n64_c2x1_ov4_d12_kc2h": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 12,
                                 "k_consumers": 2, "k_halves": True},
    "m64n64_c2x1_d12_kc2h_nosb": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "pipe_depth": 12,
                                  "k_consumers": 2, "k_halves": True, "stream_b": False},
    "m64n64_c2x1_ov4_d13_e32": {**SMALL_M_KNOBS, "cluster_m": 2, "cluster_n": 1, "overlap": 4, "pipe_depth": 13,
                                "epi_n": 32},
    "m64_ov4_kc2h": {**SMALL_M_KNOBS, "overlap": 4, "k_consumers": 2, "k_halves": True},
    # run 16: v10's split K over wide tiles, the units one wave (256x6144: 64 tiles of 128x192 two ways, 128 units;
    # 256x2112: 22 tiles six ways, 132 units, or four, 88; 64x2112: 17 tiles of 64x128 seven ways, 119 units)
    "sk2_n192": {"rung": "v10", "split_k": 2, "blk_n": 192},
    "sk6_n192": {"rung": "v10", "split_k": 6, "blk_n": 192},
    "sk4_n192": {"rung": "v10", "split_k": 4, "blk_n": 192},
    "m64n128_ov4_sk7_c1x1": {**SMALL_M_KNOBS, "rung": "v10", "blk_n": 128, "split_k": 7, "cluster_n": 1, "overlap": 4},
    # and tiles whose width divides N = 2112 (11 x 192, 12 x 176) at M = 4096, where 192x128 leaves a ragged column
    "n176_e16_d5_p2": {"blk_n": 176, "epi_n": 16, "pipe_depth": 5, "promote": 2},
    # run 19: four row tiles a cluster sharing B's tile (cluster_m=4: cuBLASLt's 1x4 at 1024x2112x7168), and
    # cuBLASLt's 128x96 with two column tiles sharing A at 256x6144x4096
    "n256_h_p2_u_c4x1": {"blk_n": 256, "halves": True, "promote": 2, "epi_under": True, "cluster_m": 4},
    "n160_e32_d5_p2_c4x1": {"blk_n": 160, "epi_n": 32, "pipe_depth": 5, "promote": 2, "cluster_m": 4},
    "n192_c4x1": {"blk_n": 192, "cluster_m": 4},
    "n224_h_p2_u_e16_c4x1": {"blk_n": 224, "halves": True, "promote": 2, "epi_under": True, "epi_n": 16,
                             "cluster_m": 4},
    "m192_c4x1_u": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 4, "cluster_n": 1, "epi_under": True},
    "n96_e32_ov4_d7_c1x2": {"blk_n": 96, "epi_n": 32, "overlap": 4, "pipe_depth": 7, "cluster_m": 1, "cluster_n": 2},
    "n176_e16_d5_p2_c1x2": {"blk_n": 176, "epi_n": 16, "pipe_depth": 5, "promote": 2, "cluster_m": 1, "cluster_n": 2},
    # run 20: at 64 < M <= 128 the small-M tiles' two rows in 2x1 clusters (sharing B, as the fill rule's) split K
    # (and unsplit: m64n64_c2x1_ov4, run 5's)
    "m64n64_c2x1_ov4_sk2": {**SMALL_M_KNOBS, "rung": "v10", "cluster_m": 2, "cluster_n": 1, "overlap": 4, "split_k": 2},
    "m64n64_c2x1_ov4_sk4": {**SMALL_M_KNOBS, "rung": "v10", "cluster_m": 2, "cluster_n": 1, "overlap": 4, "split_k": 4},
    "m64n64_c2x1_ov4_sk3": {**SMALL_M_KNOBS, "rung": "v10", "cluster_m": 2, "cluster_n": 1, "overlap": 4, "split_k": 3},
}
# run 27: the policy's module at each of its fp8 rules (at 1abad3d) launched as a programmatic dependent of the kernel
# before it (the pdl knob, sm90a/common.py; the 16-bit policy's since plan.pdl_pays)
PDL_OF = ("n112_e16_ov4_d7_u", "m64_ov4_u", "n256_h_p2_u", "m192_c1x2_u", "m64n64_c2x1_ov2_d12_p2_u", "n144_e16_d6_p2")
CONFIGS.update({f"{name}_pdl": {**CONFIGS[name], "pdl": True} for name in PDL_OF})
# shape -> the configs timed there. The six runs of benchmarks/results/2026-11-27_h100_fp8_halves/ timed the
# 128x256 tiles promoted in halves (the n256_h configs: promotion interval, clusters, stagger, k_zigzag, L2
# groups) and ov4 at cuBLAS's ring depth, each run's list in its JSON's rows.
# The first two runs (benchmarks/results/2026-11-26_h100_fp8_sweep/) timed the promotion's interval, the
# tile, clusters, ``overlap`` and ``stagger``: ov4 best past M = 128 (0.94-0.98x torch), 128x256 without
# the promotion 1.06x but 4x torch's error at K = 8192. The list of benchmarks/results/2026-11-27_h100_fp8_under/
# (runs 1 and 3) timed the policy's tiles with and without the epilogue under the next tile (the _u configs); its
# run 5 timed the _u configs' variants (L2 groups, k_zigzag, epi_n, clusters), its list in that run's rows.
# benchmarks/results/2026-11-27_h100_fp8_split/ timed the split K (sk2, sk4, sk8) at M = 256, and later runs the
# fp8 suite's sub-wave cases: the policy's module beside stream-K and the uneven or small-M splits.
SWEEP = {
    "4096^3": ("ov4", "n256_h_p2", "n256_h_p2_u", "n256_h_p2_u_c1x2"),
    "8192^3": ("m192_c1x2", "m192_c1x2_u", "m192_c1x2_p2", "n256_h_p2", "n256_h_p2_u"),
    "4096x7168x16384": ("m192_c1x2", "m192_c1x2_u", "n256_h_p2", "n256_h_p2_u"),
    # benchmarks/results/2026-11-28_h100_fp8_fill/ run 5 timed the tiles that fill whole waves beside the policy's
    # module at d25b481 (its list in that run's rows); run 6: the fill rule's tiles (plan.fp8_fill_n) against the
    # policy before it, at two weights it was chosen on and two it was not, 128x192 again at a short K
    "256x2112x7168": ("sk3_d6", "m64n64_c2x1_ov4", "m64n64_c2x1_ov4_d12"),
    "256x4096x14336": ("sk2_d6", "m64n128_c2x1_ov4"),
    "256x4096x4096": ("ov4_d6", "m64n128_c2x1_ov4"),
    "200x2048x8192": ("sk3_d6", "m64n64_c2x1_ov4"),
    "256x24576x1536": ("ov4", "n192"),
    # run 7 (benchmarks/results/2026-11-28_h100_fp8_widths/, ``prepare --shapes`` these): cuBLASLt's widths
    # against the policy's module at 562c659, at the three weak shapes where cuBLASLt runs them and three it was
    # not chosen on (Mistral-7B's and Qwen2.5-7B's up projections at M = 256, 2112x7168 at M = 2048), and
    # 1024x6144x4096 at 128x192 (one wave of 256 tiles; the policy's 128x128 take three)
    "1024x2112x7168": ("m192_c1x2_u", "n144_e16_d6", "n144_e48_d5", "n160_e32_d5"),
    "256x6144x4096": ("ov4_d6", "n96_ov4_d7", "n96_e32_ov4_d7", "n112_e16_ov4_d7"),
    "256x7168x16384": ("ov4_d6", "n112_ov4_d6", "n112_e16_ov4_d7"),
    "1024x6144x4096": ("ov4", "n192"),
    "256x18944x3584": ("ov4", "n144_e16_d6", "n96_ov4_d7"),
    "2048x2112x7168": ("m192_c1x2_u", "n144_e16_d6"),
    # run 8: the width rule's module (plan.fp8_width) against the policy's before it, where run 7 did
    # not time it (with 256x6144x4096's 128x112 above, 256x24576x1536's 128x192 of run 6, and 1024x14336x4096's
    # ov4 and n192 under run 10's list below)
    "512x28672x8192": ("ov4", "n192"),
    "256x18432x7168": ("ov4", "n144_e16_d6"),
    "512x6144x4096": ("n256_h_p2_u", "n192"),
    "768x6144x4096": ("m192_c1x2_u", "n144_e16_d6"),
    "512x2112x7168": ("ov4_d6", "n112_e16_ov4_d7"),
    "1536x1024x8192": ("ov4_d6", "n112_e16_ov4_d7"),
    "1536x2112x7168": ("n256_h_p2_u", "n192"),
    "256x7168x2048": ("ov4_d6", "n112_e16_ov4_d7"),
    # run 9: 128x224 in halves against 128x256 where 224 fills two waves better (and held out, Mistral-7B's up
    # projection at M = 512); the widths' modules in other clusters
    "1024x7168x16384": ("n256_h_p2_u", "n224_h_p2_u_e16", "n224_h_p2_u"),
    "512x14336x4096": ("n192", "n256_h_p2_u", "n224_h_p2_u_e16"),
    "256x6144x4096_c": ("n112_e16_ov4_d7", "n112_e16_ov4_d7_c1x1"),
    "1024x2112x7168_c": ("n144_e16_d6", "n144_e16_d6_c1x2", "n144_e16_d6_c1x1"),
    # run 10: 128x224 in halves (plan.FP8_WIDTH_KNOBS[224]) against the policy's module before it, held out:
    # Llama-3-70B's up projection and DeepSeek-V3's dense one, Mistral-7B's up and down projections and M of
    # DeepSeek-V3's o_proj-sized weights; 1024x14336x4096 against its run-8 module (128x192) and 128x128
    "256x28672x8192": ("n256_h_p2_u", "n224_h_p2_u_e16"),
    "768x18432x7168": ("m192_c1x2_u", "n224_h_p2_u_e16"),
    "1024x14336x4096": ("n192", "ov4", "n224_h_p2_u_e16"),
    "2048x7168x2048": ("m192_c1x2_u", "n224_h_p2_u_e16"),
    "4096x3584x18944": ("m192_c1x2_u", "n224_h_p2_u_e16"),
    "512x7168x2048": ("n256_h_p2_u", "n224_h_p2_u_e16"),
    "256x14336x4096": ("n256_h_p2_u", "n112_e16_ov4_d7", "n224_h_p2_u_e16"),
    # run 11: the per-tensor suite's four cases under 0.9x at c5b8cc1's policy (and 256x7168x16384, the longest K),
    # the policy's module against the same tiles promoted every 2 slices
    "256x6144x4096_p2": ("n112_e16_ov4_d7", "n112_e16_ov2_d7_p2", "n96_e32_ov2_d7_p2"),
    "1024x2112x7168_p2": ("n144_e16_d6", "n144_e16_d6_p2"),
    "256x2112x7168_p2": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov2_d12_p2"),
    "64x2112x7168_p2": ("m64_ov4_sk3", "m64_ov2_sk4_c1x1_p2", "m64_ov2_sk2_p2"),
    "256x7168x16384_p2": ("n112_e16_ov4_d7", "n112_e16_ov2_d7_p2"),
    # run 12: the drained width tiles every 2 slices where run 11 did not time them (128x144 at held-out shapes,
    # 128x192 at the shapes the rule gives it)
    "256x18944x3584_p2": ("n144_e16_d6", "n144_e16_d6_p2"),
    "2048x2112x7168_p2": ("n144_e16_d6", "n144_e16_d6_p2"),
    "1024x6144x4096_p2": ("n192", "n192_p2"),
    "512x6144x4096_p2": ("n192", "n192_p2"),
    "1536x2112x7168_p2": ("n192", "n192_p2"),
    "256x24576x1536_p2": ("n192", "n192_p2"),
    # run 13: two consumers on one 64-row tile (k_consumers=2) against the policy's module at 7684e89 (the fill
    # tiles at M = 256, the small-M tiles at M = 64 and 128), at the suite's weights and, held out, Llama-3-8B's
    # o_proj at M = 256 and 2112x7168 at M = 128
    "256x2112x7168_kc": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov4_d10_kc2", "m64n64_c2x1_ov4_d12_kc2",
                         "m64n64_c2x1_d12_kc2"),
    "256x4096x14336_kc": ("m64n128_c2x1_ov4_d8", "m64n128_c2x1_ov4_d6_kc2"),
    "256x4096x4096_kc": ("m64n128_c2x1_ov4_d8", "m64n128_c2x1_ov4_d6_kc2"),
    "64x6144x4096_kc": ("m64_ov4", "m64_ov4_kc2", "m64_ov4_d12_kc2"),
    "64x7168x16384_kc": ("m64_ov4", "m64_ov4_kc2", "m64_ov4_d12_kc2"),
    "64x24576x1536_kc": ("m64_ov4", "m64_ov4_kc2"),
    "128x2112x7168_kc": ("m64_ov4", "m64_ov4_kc2", "m64_ov4_d12_kc2"),
    # run 14: stream_b's L2 hints on and off, at the fill tiles (M = 256), the split (M = 64) and the small-M tiles
    "256x2112x7168_sb": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov4_d12_nosb", "m64n64_c2x1_d12_kc2_nosb"),
    "256x4096x14336_sb": ("m64n128_c2x1_ov4_d8", "m64n128_c2x1_ov4_d8_nosb"),
    "64x2112x7168_sb": ("m64_ov4_sk3", "m64_ov4_sk3_nosb"),
    "64x6144x4096_sb": ("m64_ov4", "m64_ov4_nosb"),
    "128x2112x7168_sb": ("m64_ov4", "m64_ov4_nosb"),
    # run 15: the two consumers on contiguous halves of K, and 13 stages
    "256x2112x7168_kh": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov4_d12_kc2h", "m64n64_c2x1_d12_kc2h_nosb",
                         "m64n64_c2x1_ov4_d13_e32"),
    "64x6144x4096_kh": ("m64_ov4", "m64_ov4_kc2h"),
    "128x2112x7168_kh": ("m64_ov4", "m64_ov4_kc2h"),
    "256x6144x4096_kh": ("n112_e16_ov4_d7",),  # profiled beside cuBLASLt's 128x96 (ncu)
    # run 16: the split over wide tiles against the policy's module at 7684e89
    "256x6144x4096_sk": ("n112_e16_ov4_d7", "sk2_n192"),
    "256x2112x7168_sk": ("m64n64_c2x1_ov4_d12", "sk6_n192", "sk4_n192"),
    "64x2112x7168_sk": ("m64_ov4_sk3", "m64n128_ov4_sk7_c1x1"),
    "4096x2112x7168_w": ("m192_c1x2_u", "n192", "n176_e16_d5_p2"),
    # run 17: 128x176 (promoted every 2 slices, drained) against the policy's module at 7684e89 where a width rate of
    # 1.05 would give it, and 128x128 at 4096x2112x7168 (the rate's yardstick); held out: Llama-2-7B's up projection,
    # a 5120^2 weight, Qwen2.5-1.5B's up projection
    "4096x2112x7168_r": ("ov4", "n176_e16_d5_p2"),
    "8192x2112x7168_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "768x7168x16384_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "2048x7168x16384_r": ("n224_h_p2_u_e16", "n176_e16_d5_p2"),
    "1024x14336x4096_r": ("n224_h_p2_u_e16", "n176_e16_d5_p2"),
    "512x28672x8192_r": ("n224_h_p2_u_e16", "n176_e16_d5_p2"),
    "4096x14336x4096_r": ("n256_h_p2_u", "n176_e16_d5_p2"),
    "1024x11008x4096_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "512x5120x5120_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "1536x8960x1536_r": ("n224_h_p2_u_e16", "n176_e16_d5_p2"),
    # run 18, held out: where the width rule with 128x176 at its rate (plan.FP8_WIDTH_RATE[176]) changes the module and
    # run 17 did not time it (Qwen2.5-7B's down projection, a 7168x2048 weight, Llama-2-7B's up projection, 5120^2)
    "768x7168x2048_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "1536x3584x18944_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "256x11008x4096_r": ("n192", "n176_e16_d5_p2"),
    "2048x11008x4096_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    "1024x5120x5120_r": ("m192_c1x2_u", "n176_e16_d5_p2"),
    # run 19: clusters of four row tiles (and cuBLASLt's 1x2 at 256x6144x4096) against the policy's module at 6913a98
    "1024x4096x14336_c4": ("n256_h_p2_u", "n256_h_p2_u_c4x1"),
    "1024x2112x7168_c4": ("n144_e16_d6_p2", "n160_e32_d5_p2_c4x1", "n192_c4x1"),
    "1024x6144x4096_c4": ("n192", "n192_c4x1"),
    "1024x7168x16384_c4": ("n224_h_p2_u_e16", "n224_h_p2_u_e16_c4x1"),
    "1024x24576x1536_c4": ("n256_h_p2_u", "n256_h_p2_u_c4x1"),
    "4096^3_c4": ("n256_h_p2_u", "n256_h_p2_u_c4x1"),
    "8192^3_c4": ("m192_c1x2_u", "m192_c4x1_u", "n256_h_p2_u_c4x1"),
    "256x6144x4096_c4": ("n112_e16_ov4_d7", "n96_e32_ov4_d7_c1x2"),
    "4096x2112x7168_c4": ("n176_e16_d5_p2", "n176_e16_d5_p2_c1x2"),
    # run 20: M = 65-128 where the small-M tiles fill half the SMs or less (the policy's module at 05574a6: 64x64 in
    # 1x2 clusters, unsplit or split), the two rows in 2x1 clusters split two or four ways
    "128x2112x7168_s2": ("m64_ov4", "m64n64_c2x1_ov4", "m64n64_c2x1_ov4_sk2"),
    "96x2112x7168_s2": ("m64_ov4", "m64n64_c2x1_ov4_sk2"),
    "128x1024x7168_s2": ("m64_ov4_sk3", "m64n64_c2x1_ov4_sk2", "m64n64_c2x1_ov4_sk4"),
    "128x2048x8192_s2": ("m64_ov4_sk2", "m64n64_c2x1_ov4_sk2"),
    # run 21, held out: the pair rule (plan.FP8_SMALL_PAIR_KNOBS) against the policy's module before it, at
    # Qwen2.5-1.5B's down projection, a 1024x8192 weight, M = 112, and 128x1024x7168's three ways in 2x1
    "128x1536x8960_p": ("m64_ov4_sk2", "m64n64_c2x1_ov4_sk2"),
    "128x1024x8192_p": ("m64_ov4_sk3", "m64n64_c2x1_ov4_sk3"),
    "112x2112x7168_p": ("m64_ov4", "m64n64_c2x1_ov4_sk2"),
    "128x1024x7168_p": ("m64_ov4_sk3", "m64n64_c2x1_ov4_sk3", "m64n64_c2x1_ov4_sk4"),
    # run 22: the overlapped tiles with their loop over runs unrolled (unroll_k) against the same tiles rolled (the
    # policy's module at b05697f), where plan.fp8_unrolled sets it: the suite's fill, small-M and 128x112 cases, and
    # held out, 200x2048x8192 (fill), M = 96 and 64 of 4096x4096 and 11008x4096 (small-M), 256x5120x5120 (128x112);
    # 256x2112x14336, the fill tile past the estimate's K (budget.fp8_unroll_fits refuses it), rolled only
    "256x2112x7168_u": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov4_d12_u"),
    "64x6144x4096_u": ("m64_ov4", "m64_ov4_u"),
    "256x6144x4096_u": ("n112_e16_ov4_d7", "n112_e16_ov4_d7_u"),
    "64x24576x1536_u": ("m64_ov4", "m64_ov4_u"),
    "200x2048x8192_u": ("m64n64_c2x1_ov4_d12", "m64n64_c2x1_ov4_d12_u"),
    "96x4096x4096_u": ("m64_ov4", "m64_ov4_u"),
    "64x11008x4096_u": ("m64_ov4", "m64_ov4_u"),
    "256x5120x5120_u": ("n112_e16_ov4_d7", "n112_e16_ov4_d7_u"),
    "256x2112x14336_u": ("m64n64_c2x1_ov4_d12",),
    # run 23: v10's split units unrolled where the split divides the slices, against the policy's module (at 6c92c36,
    # rolled): 64x4096x14336 (two ways, 56 slices a unit), 128x2112x7168 (2x1 pairs, two ways); 64x2112x7168 four
    # ways (14 slices a unit; the policy's three ways cannot unroll) and two; held out 128x1536x8960, 96x2048x8192;
    # and the fill tile over two consumers (k_consumers=2) unrolled, against the policy's (unrolled) fill tile
    "64x4096x14336_u": ("m64_ov4_sk2", "m64_ov4_sk2_u"),
    "128x2112x7168_u": ("m64n64_c2x1_ov4_sk2", "m64n64_c2x1_ov4_sk2_u"),
    "64x2112x7168_u": ("m64_ov4_sk3", "m64_ov4_sk4_c1x1", "m64_ov4_sk4_c1x1_u", "m64_ov4_sk2_u"),
    "128x1536x8960_u": ("m64n64_c2x1_ov4_sk2", "m64n64_c2x1_ov4_sk2_u"),
    "96x2048x8192_u": ("m64n64_c2x1_ov4_sk2", "m64n64_c2x1_ov4_sk2_u"),
    "256x2112x7168_u2": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov4_d12_kc2_u"),
    # run 24: the policy's unrolled tiles (at 54c885d) against the same promoted every 2 slices, and (fill) 13 stages;
    # 128x112 promoted every 2 slices and unrolled (n112_e16_ov2_d7_p2_u: spilled 448 bytes a thread, 0.51-0.53x
    # torch, its rows in the run's JSON) is refused since (budget.UNROLL_MAX_REGS_PAIRS), so its config is gone
    "256x2112x7168_u3": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u", "m64n64_c2x1_ov4_d13_e32_u"),
    "256x6144x4096_u3": ("n112_e16_ov4_d7_u",),
    "200x2048x8192_u3": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u", "m64n64_c2x1_ov4_d13_e32_u"),
    "256x5120x5120_u3": ("n112_e16_ov4_d7_u",),
    # run 25: the 64x64 fill tile promoted every 2 slices (unrolled) against the policy's every slice, at the suite's
    # shape again and at four (weights, M) the fill rule takes it that no run chose on
    "256x2112x7168_u4": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u"),
    "256x2048x4096_u4": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u"),
    "192x2112x7168_u4": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u"),
    "256x2112x3584_u4": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u"),
    "256x2048x8192_u4": ("m64n64_c2x1_ov4_d12_u", "m64n64_c2x1_ov2_d12_p2_u"),
    # run 26: the suite's last case under 0.9 (256x6144x4096: the width rule's 128x112, cuBLASLt runs 128x96),
    # 128x96 unrolled (n96_e32_ov4_d7_u: spilled 192 bytes a thread, 0.72x torch against 0.85x rolled; its rows in
    # the run's JSON; unroll_k refuses it since, budget.UNROLL_WIDTHS) beside the policy's 128x112 unrolled
    "256x6144x4096_u5": ("n112_e16_ov4_d7_u", "n96_e32_ov4_d7"),
    "256x5120x5120_u5": ("n112_e16_ov4_d7_u",),
    # run 27: the policy's module with and without programmatic dependent launch (PDL_OF)
    "256x6144x4096_pdl": ("n112_e16_ov4_d7_u", "n112_e16_ov4_d7_u_pdl"),
    "64x6144x4096_pdl": ("m64_ov4_u", "m64_ov4_u_pdl"),
    "4096^3_pdl": ("n256_h_p2_u", "n256_h_p2_u_pdl"),
    "8192^3_pdl": ("m192_c1x2_u", "m192_c1x2_u_pdl"),
    "256x2112x7168_pdl": ("m64n64_c2x1_ov2_d12_p2_u", "m64n64_c2x1_ov2_d12_p2_u_pdl"),
    "128x4096x7168_pdl": ("m64_ov4_u", "m64_ov4_u_pdl"),
    "1024x2112x7168_pdl": ("n144_e16_d6_p2", "n144_e16_d6_p2_pdl"),
}
ROUNDS, PER_ROUND = 10, 4  # rounds (the order rotates, then reverses) x replays per kernel per round
MAX_DIR_MIB = 8.0  # what the lead carries to the GPU box


@dataclass(frozen=True)
class Sweep:
    """One recipe's sweep: its shapes, its configs (knobs over v9's fp8 defaults; a config may name
    another ``recipe``: a peer module timed beside the sweep's), which configs each shape times, and
    (``peer``) the config of our own other-recipe module each shape compares with (block: per-tensor)."""

    recipe: str
    shapes: tuple
    configs: dict
    sweep: dict
    peer: dict


# block-wise (DeepSeek-V3): v9's block defaults (one K block a promotion, drained, its scales applied
# as it is added) against the overlapped promotion (two accumulator sets, each slice's scaled adds
# under the next slice's wgmmas, the total added in place: fp8.py), the cluster, the ring's depth;
# 128x256 tiles do not fit with the promoted sums (296 registers a consumer), 192 cuts a B block
BLOCK_SHAPES = (("4096x7168x16384", 4096, 7168, 16384), ("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192),
                ("4096x4096x7168", 4096, 4096, 7168), ("128x4096x7168", 128, 4096, 7168))
BLOCK_CONFIGS = {
    "base": {},
    "c1x2": {"cluster_m": 1, "cluster_n": 2},
    "ov2": {"overlap": 2},
    "ov4": {"overlap": 4},
    "ov8": {"overlap": 8},
    "ov4_c1x2": {"overlap": 4, "cluster_m": 1, "cluster_n": 2},
    "ov4_c1x1": {"overlap": 4, "cluster_m": 1},
    "ov4_d3": {"overlap": 4, "pipe_depth": 3},
    "ov4_d5": {"overlap": 4, "pipe_depth": 5},
    "ov4_d6": {"overlap": 4, "pipe_depth": 6},
    "ov8_c1x2": {"overlap": 8, "cluster_m": 1, "cluster_n": 2},
    # small M: the per-tensor policy's 64x64 tiles (B read once, streamed), and 64x128
    "sm": dict(SMALL_M_KNOBS),
    "sm_ov2": {**SMALL_M_KNOBS, "overlap": 2},
    "sm_ov4": {**SMALL_M_KNOBS, "overlap": 4},
    "sm_n128_ov4": {**SMALL_M_KNOBS, "blk_n": 128, "overlap": 4},
    # the scales staged in shared memory by the producer's TMA with each ring stage (fp8.StagedScales)
    "ov2_ss": {"overlap": 2, "stage_scales": True},
    "ov4_ss": {"overlap": 4, "stage_scales": True},
    "ov8_ss": {"overlap": 8, "stage_scales": True},
    "sm_ov2_ss": {**SMALL_M_KNOBS, "overlap": 2, "stage_scales": True},
    "sm_ov4_ss": {**SMALL_M_KNOBS, "overlap": 4, "stage_scales": True},
    # our per-tensor fp8 at the per-tensor policy's knobs (plan.fp8_knobs), the peer of each shape
    "tensor_policy": {"recipe": "tensor", "overlap": 4},
    "tensor_policy_wide": {"recipe": "tensor", **{k: v for k, v in serve_plan.FP8_WIDE_KNOBS.items() if k != "promote"}},
    # (its one block shape, 128x4096x7168: K = 7168, where the policy unrolls the small-M tiles' loop)
    "tensor_policy_small": {"recipe": "tensor", **serve_plan.fp8_unrolled(serve_plan.FP8_SMALL_KNOBS, 7168, "tensor")},
    "tensor_policy_halves": {"recipe": "tensor", **serve_plan.FP8_HALVES_KNOBS},
    # 128x256 tiles promoted in halves (fp8.py's halves), each half scaled by its own B block
    "n256_h": {"blk_n": 256, "halves": True},
    "n256_h_c1x2": {"blk_n": 256, "halves": True, "cluster_m": 1, "cluster_n": 2},
    # and with the epilogue under the next tile's first pair of slices (epi_under, mainloop._run_block_halves)
    "n256_h_u": {"blk_n": 256, "halves": True, "epi_under": True},
    # and with the scales staged in the ring (stage_scales, mainloop._run_block_halves_staged): a 128x256
    # ring of four stages, its staging and the scales' rows pass the 227 KiB a block may use, so three stages
    "n256_h_u_d3": {"blk_n": 256, "halves": True, "epi_under": True, "pipe_depth": 3},
    "n256_h_u_ss_d3": {"blk_n": 256, "halves": True, "epi_under": True, "pipe_depth": 3, "stage_scales": True},
    "n256_h_u_ssb_d3": {"blk_n": 256, "halves": True, "epi_under": True, "pipe_depth": 3, "stage_scales": True,
                        "stage_bulk": True},
    # 192x128 tiles over three consumers, the per-tensor fp8-wide tile: each consumer's drained promotion under the
    # other two's wgmmas (two accumulator sets do not fit 152 registers a consumer); B shared in 1x2 or A in 2x1
    "m192": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2},
    "m192_c2x1": {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 2, "cluster_n": 1},
}
# shape -> the configs timed there. The first run (c7cf3e4, benchmarks/results/2026-11-26_h100_fp8_block_overlap/)
# timed the overlap, clusters and ring depths: overlap=4 best past M = 128 (0.82-0.92x torch's block-wise), the
# small-M knobs with overlap=2 at M = 128 (1.15x); a second (e6edcac) timed the scale loads pinned a slice ahead
# as plain ld.global (3-7% slower: the knob is gone). This list is the policy's configs (ov4; sm_ov2 at small M)
# beside the scales staged in shared memory by the producer's TMA (``stage_scales``, the ``_ss`` configs).
# benchmarks/results/2026-11-27_h100_fp8_halves/ timed ov4_ss beside n256_h and n256_h_c1x2 (its JSONs' rows);
# benchmarks/results/2026-11-27_h100_fp8_under/ the halves with the epilogue under (n256_h_u) at the first three
# shapes. This list is the policy's tiles (ov4_ss, n256_h_u: plan.fp8_tile) beside the halves without it.
BLOCK_SWEEP = {
    "4096x7168x16384": ("ov4_ss", "n256_h_u", "n256_h_u_d3", "n256_h_u_ss_d3", "n256_h_u_ssb_d3", "m192", "m192_c2x1"),
    "4096^3": ("ov4_ss", "n256_h_u", "n256_h_u_d3", "n256_h_u_ss_d3", "n256_h_u_ssb_d3"),
    "8192^3": ("ov4_ss", "n256_h_u", "n256_h_u_d3", "n256_h_u_ss_d3", "n256_h_u_ssb_d3", "m192"),
    "4096x4096x7168": ("ov4_ss", "n256_h_u", "n256_h_u_ss_d3", "m192", "m192_c2x1"),
    "128x4096x7168": ("sm_ov2", "sm_ov2_ss", "sm_ov4_ss"),
}
BLOCK_PEER = {label: {"small": "tensor_policy_small", "wide": "tensor_policy_wide", "halves": "tensor_policy_halves",
                      "square": "tensor_policy"}[serve_plan.fp8_tile(M, N, 132, "tensor")]
              for label, M, N, _ in BLOCK_SHAPES}
SWEEPS = {"tensor": Sweep(RECIPE, SHAPES, CONFIGS, SWEEP, {}),
          "block": Sweep("block", BLOCK_SHAPES, BLOCK_CONFIGS, BLOCK_SWEEP, BLOCK_PEER)}


def shape_of(label: str, recipe: str = RECIPE) -> tuple[int, int, int]:
    for name, M, N, K in SWEEPS[recipe].shapes:
        if name == label:
            return M, N, K
    raise KeyError(f"no shape {label!r}; the {recipe} sweep's shapes are {[s[0] for s in SWEEPS[recipe].shapes]}")


def config_recipe(config: str, recipe: str = RECIPE) -> str:
    """The recipe of a config's module: the sweep's, or the one the config names (a peer)."""
    return SWEEPS[recipe].configs[config].get("recipe", recipe)


def module_name(label: str, config: str, recipe: str = RECIPE) -> str:
    """A module's name in the folder: its recipe, weight (N x K) and config (one module serves every M)."""
    _, N, K = shape_of(label, recipe)
    return f"{config_recipe(config, recipe)[0]}_{N}x{K}_{config}"


def timed_configs(label: str, recipe: str = RECIPE) -> tuple:
    """The configs timed at a shape: the sweep's, then its peer module's (if any)."""
    sw = SWEEPS[recipe]
    return tuple(sw.sweep[label]) + ((sw.peer[label],) if label in sw.peer else ())


def plan_modules(recipe: str = RECIPE, shapes=None) -> dict[str, dict]:
    """Every module the sweep builds, by name: its N, K, recipe, promotion and knobs (a config timed at
    two shapes of one weight is one module); ``shapes``: only those labels' (None: all)."""
    out = {}
    sw = SWEEPS[recipe]
    for label in sw.sweep:
        if shapes is not None and label not in shapes:
            continue
        _, N, K = shape_of(label, recipe)
        for config in timed_configs(label, recipe):
            knobs = dict(sw.configs[config])
            knobs.pop("recipe", None)
            rung = knobs.pop("rung", "v9")
            promote = knobs.pop("promote", 1)
            out[module_name(label, config, recipe)] = {"N": N, "K": K, "recipe": config_recipe(config, recipe),
                                                       "promote": promote, "bias": None, "knobs": knobs,
                                                       "config": config, "rung": rung}
    return out


ODD_M = (1, 333)  # extra rows a staged-scales module is checked at: its 1-D scale maps take any M (fp8.StagedScales)


def odd_m_cases(plan: dict) -> list[tuple[str, int]]:
    """(module, M) checks beyond the shapes' M for every module that stages its block scales
    (``stage_scales``) or promotes in halves (``halves``): one row, and an M that is no multiple of 4
    (scale_a's K blocks then start off a 16-byte boundary) or of a tile; a module that fails one is
    not timed."""
    return [(name, m) for name, entry in sorted(plan["modules"].items())
            if entry.get("knobs", {}).get("stage_scales") or entry.get("knobs", {}).get("halves") for m in ODD_M]


def build_knobs(entry: dict) -> dict:
    """The build knobs of a planned module (a runtime-M v9 fp8 module, as ``scaled_mm`` builds)."""
    return {"spec": fp8_check.spec_of(entry["recipe"], entry["bias"]).text(), "dtype": "bfloat16",
            "dynamic_m": True, "promote": entry["promote"], **entry["knobs"]}


def best_of(rows: list[dict]) -> dict[str, dict]:
    """Per shape, the fastest config whose checks passed (kernel timing), and its ratio to torch."""
    best: dict[str, dict] = {}
    for r in rows:
        if not r.get("correct") or not r.get("tflops"):
            continue
        key = f"{r['M']}x{r['N']}x{r['K']}"
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = {"config": r["config"], "tflops": r["tflops"], "ratio_to_scaled_mm": r["ratio_to_scaled_mm"]}
    return best


# -- prepare (build box) -----------------------------------------------------------------------------
def prepare(out, recipe: str = RECIPE, shapes=None) -> int:
    # the build layer: this box's TVM compiler
    from gemm_ladder.compile import module_cache  # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile.batch import BuildJob  # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile.sass import has_device_binary  # pylint: disable=import-outside-toplevel

    out = Path(out)
    files.open_folder(out)
    shapes = list(shapes) if shapes else list(SWEEPS[recipe].sweep)
    plan = {"format": FORMAT, "modules": {}, "bf16": {}, "recipes": [recipe], "shapes": shapes,
            "sweep": {label: c for label, c in SWEEPS[recipe].sweep.items() if label in shapes},
            "peer": SWEEPS[recipe].peer}  # shape -> the config of its peer module (informational)
    for name, entry in plan_modules(recipe, shapes).items():
        path, how = module_cache.get_or_build(BuildJob(entry.get("rung", "v9"), (256, entry["N"], entry["K"]),
                                                               build_knobs(entry)))
        plan["modules"][name] = fp8_check._copy(path, out, name) | entry  # pylint: disable=protected-access
        if not has_device_binary((out / f"{name}.so").read_bytes()):  # the GPU box has no compiler
            print(f"fp8_sweep prepare: {name}.so holds no compiled kernel (built without the driver stub?): "
                  "clear its module cache entry and build again", file=sys.stderr)
            return 1
        print(f"{name}: {how} {path}", flush=True)
    files.write_json(out / PLAN_FILE, plan)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 2**20
    print(f"{len(plan['modules'])} modules, {size:.1f} MiB in {out}")
    if size > MAX_DIR_MIB:
        print(f"fp8_sweep prepare: {size:.1f} MiB is over the {MAX_DIR_MIB} MiB the GPU box takes: drop configs "
              "from its sweep (SWEEP, BLOCK_SWEEP)", file=sys.stderr)
        return 1
    return 0


# -- run (GPU box) ------------------------------------------------------------------------------------
def time_shape(folder, plan, label: str, names: list[str], loaded: dict, recipe: str = RECIPE,
               peer: str | None = None) -> dict:
    """The modules ``names`` (one weight) and torch._scaled_mm at ``label``'s M, on the same input
    sets (spilling L2 three times), in rounds whose order rotates and reverses: the median ms of
    each as kernels (CUDA graphs) and as queued calls. Block: with the peers of
    ``fp8_check._block_peers`` (``peer``: the name of our per-tensor module at the shape, None if it
    failed its checks); a peer this torch refuses (block-wise fast accumulation) is left out with its message."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    M, N, K = shape_of(label, recipe)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = []
    for i in range(max(2, math.ceil(3 * l2 / (M * K + N * K + 2 * M * N)))):
        aq, wq, sa, sb, _ = fp8_check.inputs(M, N, K, recipe, None, seed=100 + i)
        sets.append((aq, wq, sa, sb, torch.empty((M, N), dtype=torch.bfloat16, device="cuda")))
    kernels = {}
    for name in names:
        if name not in loaded:
            loaded[name] = gemm_ladder.load(Path(folder) / plan["modules"][name]["file"])
        launch = loaded[name].launcher(sets[0][0], sets[0][1], sets[0][4],
                                       **fp8_check.kernel_scales(sets[0][2], sets[0][3], recipe))
        kernels[name] = (lambda a, w, sa, sb, d, f=launch:
                         f(a, w, d, *fp8_check.kernel_scales(sa, sb, recipe).values()), sets)
    peer_of = fp8_check._scaled_mm_peer  # pylint: disable=protected-access
    kernels["torch_scaled_mm"] = (peer_of(recipe, False), sets)
    kernels["torch_scaled_mm_fast_accum"] = (peer_of(recipe, True), sets)
    if recipe == "block" and peer is not None:
        kernels |= fp8_check._block_peers(folder, plan, peer, M, N, K, loaded, l2)  # pylint: disable=protected-access
    left_out = fp8_check.drop_failing(kernels)  # peer -> why
    order0 = list(kernels)
    calls = max(8, max(len(ss) for _, ss in kernels.values()))
    graph, call = {n: [] for n in order0}, {n: [] for n in order0}
    t0 = time.time()
    for r in range(ROUNDS):
        order = order0[r % len(order0):] + order0[:r % len(order0)]
        for n in (order if (r // len(order0)) % 2 == 0 else order[::-1]):
            fn, ss = kernels[n]
            graph[n] += harness.graph_times(fn, ss, PER_ROUND, calls)
            call[n] += harness.event_times(fn, ss, PER_ROUND)
    return {"kernel_ms": {n: statistics.median(v) for n, v in graph.items()},
            "call_ms": {n: statistics.median(v) for n, v in call.items()},
            "kernel_spread": {n: [min(v), max(v)] for n, v in graph.items()}, "input_sets": len(sets),
            "peers_left_out": left_out, "t0": t0, "t1": time.time()}


def rows_of(plan, label: str, timing: dict, checks: dict, sampler_clocks, recipe: str = RECIPE) -> list[dict]:
    """The issue's result rows of one shape's timing (``checks``: module name -> its check): a row a
    config of the sweep (not its peer module), its peer ratios those of every peer timed beside it
    (torch's, and with block scales our per-tensor module and cuBLAS bf16)."""
    M, N, K = shape_of(label, recipe)
    g, c = timing["kernel_ms"], timing["call_ms"]
    torch_ms, torch_call = g.get("torch_scaled_mm"), c.get("torch_scaled_mm")
    peer_names = [p for p in g if p not in plan["modules"]]  # torch's, and block's peers (not our modules)
    rows = []
    for name in SWEEPS[recipe].sweep[label]:
        mod = module_name(label, name, recipe)
        chk = checks.get(mod, {})
        row = {"recipe": recipe, "M": M, "N": N, "K": K, "shape": label, "config": name, "module": mod,
               "promote": plan["modules"][mod]["promote"], "knobs": plan["modules"][mod]["knobs"],
               "correct": bool(chk.get("correct")), "rel_err": chk.get("rel_err"),
               "torch_rel_err": chk.get("torch_rel_err"), "mean_rel_err": chk.get("mean_rel_err"),
               "torch_mean_rel_err": chk.get("torch_mean_rel_err"), "yardstick": chk.get("yardstick"),
               "check_error": chk.get("error")}
        ours = g.get(mod)
        row |= {"tflops": fp8_check.tflops(M, N, K, ours), "kernel_ms": ours, "call_ms": c.get(mod),
                "ratio_to_scaled_mm": fp8_check.ratio(torch_ms, ours),
                "call_ratio_to_scaled_mm": fp8_check.ratio(torch_call, c.get(mod)),
                "peer_ratios": {p: fp8_check.ratio(g[p], ours) for p in peer_names},
                "clocks": sampler_clocks}
        rows.append(row)
    return rows


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"fp8_sweep run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    plan = json.loads((Path(folder) / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        print(f"fp8_sweep run: {folder}/{PLAN_FILE} is not a sweep's plan: run fp8_sweep.py prepare", file=sys.stderr)
        return 2
    recipe = plan["recipes"][0]
    shapes = plan.get("shapes", list(SWEEPS[recipe].sweep))  # prepare --shapes: a subset
    sweep = {label: c for label, c in SWEEPS[recipe].sweep.items() if label in shapes}
    missing = sorted(set(plan_modules(recipe, shapes)) - set(plan["modules"]))
    if missing:
        print(f"fp8_sweep run: {folder} lacks {missing}: prepare it again with this script", file=sys.stderr)
        return 2
    start, sampler = time.time(), Sampler()
    cases = []
    for label in sweep:
        M = shape_of(label, recipe)[0]
        cases += [(module_name(label, c, recipe), M) for c in timed_configs(label, recipe)
                  if (module_name(label, c, recipe), M) not in cases]
    cases += odd_m_cases(plan)
    checks = fp8_check.check_all(folder, cases)
    # (module, M) -> its check: a module timed at two shapes' M (a weight's) has a check at each
    by_case = {(c["name"], c["M"]): c for c in checks}
    _, timable = fp8_check.modules_that_pass(checks)
    rows, loaded, timings = [], {}, {}
    try:
        for label in sweep:
            names = [module_name(label, c, recipe) for c in sweep[label] if module_name(label, c, recipe) in timable]
            peer = SWEEPS[recipe].peer.get(label)
            peer = module_name(label, peer, recipe) if peer else None
            timing = time_shape(folder, plan, label, names, loaded, recipe,
                                peer if peer in timable else None)  # a peer that failed its checks is not timed
            timings[label] = {k: v for k, v in timing.items() if k not in ("t0", "t1")}
            M = shape_of(label, recipe)[0]
            at_m = {name: c for (name, m), c in by_case.items() if m == M}
            shape_rows = rows_of(plan, label, timing, at_m, sampler.between(timing["t0"], timing["t1"]), recipe)
            rows += shape_rows
            for r in shape_rows:
                print(f"{label} {r['config']}: {fp8_check.f3(r['tflops'])} TFLOPS, x torch._scaled_mm "
                      f"{fp8_check.f3(r['ratio_to_scaled_mm'])}, err {fp8_check.f3(r['rel_err'])} "
                      f"(torch {fp8_check.f3(r['torch_rel_err'])}){'' if r['correct'] else ' NOT CORRECT'}",
                      flush=True)
    finally:
        sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start), "recipe": recipe,
              "tolerance": fp8_check.TOLERANCE, "rounds": ROUNDS, "per_round": PER_ROUND, "checks": checks,
              "timings": timings, "best": best_of(rows), "rows": rows}
    check_cli.write_result(out, result)
    for shape, b in result["best"].items():
        print(f"best at {shape}: {b['config']} {b['tflops']:.0f} TFLOPS, x torch._scaled_mm "
              f"{fp8_check.f3(b['ratio_to_scaled_mm'])}")
    print(f"{sum(1 for c in checks if c.get('correct'))} of {len(checks)} checks pass; {len(rows)} rows; "
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, _, _ = check_cli.subcommands(__doc__, "build box: the sweep's modules and plan",
                                        "GPU box: check every module, then time each shape's against "
                                        "torch._scaled_mm", "fp8_sweep.json")
    pr.add_argument("--recipe", choices=sorted(SWEEPS), default=RECIPE,
                    help="the recipe to sweep (block: the block-wise sweep and its peers); run sweeps what "
                         "prepare built")
    pr.add_argument("--shapes", type=lambda t: [x.strip() for x in t.split(",")], default=None,
                    help="label,...: only these shapes of the sweep (its SWEEP or BLOCK_SWEEP keys)")
    a = p.parse_args(argv)
    if a.cmd == "prepare" and a.shapes:
        unknown = [x for x in a.shapes if x not in SWEEPS[a.recipe].sweep]
        if unknown:
            p.error(f"--shapes {','.join(unknown)}: not in the {a.recipe} sweep ({', '.join(SWEEPS[a.recipe].sweep)})")
    return prepare(a.out, a.recipe, a.shapes) if a.cmd == "prepare" else run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
