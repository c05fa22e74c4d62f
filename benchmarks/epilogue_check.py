"""The fused epilogue with a scale and a residual (issue 31) on a GPU: every new epilogue checked at
odd shapes, then timed at the Llama-8B weight shapes against torch's best paths.

    D = act(alpha . A . W^T + bias) + beta . C          (C may be D itself: out=C, in place)

- checks (each module in a child process with a timeout, so a hang or a crash is a row, not the
  end of the run): random inputs, D poisoned with NaN first, the error against a float64 reference
  with torch's own error on the same formula (``front.TorchMatmul``, the front door's fallback) as
  the yardstick (ours within 2x of it, or 1e-2 absolute where both are tiny); in place (out = C)
  as well as into a separate D; fp16 and bf16; alpha and beta not 1; a float32 D; SwiGLU (its
  reference: silu of the gate half times the up half of the float64 product).
- timing (bf16, the modules the front door's policy picks, ``plan.choose``): ``residual``
  (``D = x . W^T + C``) against cuBLAS's fused ``torch.addmm(C, x, W.t())`` and the unfused
  ``F.linear`` then ``+ C``; ``alpha_bias_gelu_tanh+residual`` against
  ``torch._addmm_activation(b, x, W.t(), use_gelu=True)`` then ``+ C`` (cuBLASLt's fused
  bias+GELU) and the unfused ``F.gelu(F.linear(x, W, b), approximate="tanh") + C``; a float32 D
  (``fp32_out``) against ``torch.mm(..., out_dtype=torch.float32)`` where torch has it and
  ``F.linear`` then a copy into float32; ``swiglu`` (W_gu = cat([Wg, Wu]) 28672x4096, Llama-8B's
  MLP) against HF's two linears and one ``F.linear`` with W_gu then the halves. Kernel level:
  CUDA graphs of calls cycling input sets that spill L2, ours and the peers taking turns in rounds
  (``harness.graph_times``); call level: queued calls with the host's checks (``GemmModule.__call__``
  against the torch calls), events around each burst.
- the residual's C loaded ahead (v9's ``c_prefetch``, on by default): each residual timing case is
  built twice, with C loaded at each chunk (``c_prefetch=False``: op ``residual``, the kernel measured
  before) and ahead (op ``residual_prefetch``), and at M = 128 a third time ahead in 64x64 tiles
  (``_prefetch_64x64``: 128 CTAs where the policy's tiles give 16-64 at these weights); all of them
  and the torch peers take turns in the same rounds, and each row says its time against the
  at-chunk module's (``vs_at_chunk``). Checked in place as well as into a new D, like every module.
- a residual with a float32 D (``fp32_out+residual``: ``D = A . W^T + C``, C and D float32, the
  accumulation of a wgrad into fp32 gradients) against ``torch.addmm(C, x, W^T, out_dtype=float32)``
  where torch has it, and ``torch.mm(..., out_dtype=float32)`` then ``+ C``.

- the small-M epilogue rule (``plan``'s ``small-m-epilogue``: v9 64x64 tiles for an epilogue call at
  32 < M <= 128 where they fit in one wave), ``prepare --set rule`` (alone) or ``--set all`` (with the
  rest): at M = 64, 128, 256 and the Llama weights, for the residual, alpha+bias+gelu+residual and
  bias+gelu (no residual: the rule takes it on the same reasoning, unmeasured), the policy's module
  with the rule (``rule``) beside the module it chose before (``before``, the rules without it); where
  the rule does not apply, the policy's module (``unchanged``) beside 64x64 tiles forced
  (``probe_64x64``), to test the threshold, and past M = 128 where 64x128 tiles fit in one wave the
  rule's knobs with 64x128 tiles (``probe_64x128``: the next step's question, the rule at M = 256 with
  tiles twice as wide). Each row has a ``rule`` field (that variant), the plan rule
  that chose the module (``chosen_by``) and its time against the ``before`` (or ``unchanged``) module of
  the same rounds (``vs_policy_before``).

- v10 and v11 with the fused epilogue (``--set split``): their modules checked at odd shapes (splits of 2 to
  4, the atomic reduction, stream-K pieces, a float32 D, the residual in place; swap AB at 8 to 128 rows),
  and bias+GELU and the residual timed at M = 1 to 512 on the Llama weights and three held-out weights
  (GPT-2 small's MLP, ViT-L's first MLP layer): the policy's module (``now``) beside the one it chose
  before v10 and v11 built the epilogue (``before``, :func:`epilogues_as_before`) and without the small-M
  rule (``no_small_rule``). ``--set split_probe``: the same past M = 256 against the policy without its
  split-k and stream-k rules (``no_split``). ``--set suite``: issue 31's target, bias+GELU and bias+ReLU at
  the shape suite's weights and M (and the held-out weights) against cuBLASLt's fused epilogue and the
  unfused path. ``--set split_fill``: the plain bf16 shapes of the suite and the every-model samples whose choice
  the split-k rule's fill threshold moved, against the rule without it (``fill_before``). ``--set few_tiles``: the
suite's weakest bias+GELU shapes, the policy's module beside candidate tiles and splits (v9 64x64, 64x128, 128x128,
v10 splitting 128x128, 64x64, 64x128; at M <= 16, v11 at 64 and 128 rows of N split 1, 2, 4); ``--set
swap_widths``: those v11 candidates at M = 1, 16, 32 on the suite's and the held-out weights, bias+GELU and no
epilogue. ``--set narrow_moved`` and ``--set small_split_moved``: the shapes of the suite and the every-model
samples whose choice plan's ``swap-ab-narrow`` (no epilogue, M = 1 and 7) or ``small-m-split`` (bias+GELU)
changed, against the policy without that rule (``no_narrow``, ``no_small_split``). ``--set deep_rings``: rings past
plan's 8 stages (the deepest each candidate fits) beside the same candidates at 8, at M = 64 and 128 on the 4096-wide
weights (no epilogue and bias+GELU) and swap AB's at M <= 16; ``--set swap64_moved``: the shapes plan's
``swap-ab-64`` and ``long-k-split`` move, against the policy without them (``no_swap64``); ``--set row64_moved``:
the shapes plan's candidate ``ROW_TILES_64`` would move, the policy with it (``with_row64``) against the policy;
``--set bias_stash``: the suite set, and where the policy's kernel loads the tile's bias into registers before its
K loop (``epilogue.BiasStash``), the same module reading it where it is added (``read``); ``--set tile224_moved``:
every shape plan's ``tile-224`` moves, against the policy without it (``no_tile224``); ``--set swap256_moved``:
every shape a candidate rule (swap AB over 256 rows of N, :data:`SWAP256_VARIANT`) would move, against the policy,
also launched without PDL (``with_swap256_nopdl``).

Rows (``--out X.json``; the file name must contain ``epilogue``): ``op``, ``M``, ``N``, ``K``,
``dtype``, ``kernel_ratio`` and ``call_ratio`` (the best torch peer's time over ours: above 1 we
are faster), each peer's ratio and every time in ms; plus ``checks`` and the GPU's name and clocks.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/epilogue_check.py prepare build/epi     # build box
    (--set rule: only the small-M rule's cases, about 50 modules, a run of 1-2 minutes)
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/epilogue_check.py run build/epi --out out/epilogue_check.json    # GPU box
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import math
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

from gemm_ladder.core import files
from gemm_ladder.core.spec import spec_for, spec_knobs, torch_activation
from gemm_ladder.serve import plan

PLAN_FILE = "epilogue_plan.json"
CHECK_SHAPES = [(200, 264, 320), (1000, 3000, 520)]  # odd-ish: partial tiles in M, N and K
CHECK_EPILOGUES = ["residual", "alpha", "alpha_bias_gelu_tanh+residual", "bias_relu+residual"]
LLAMA_WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K): attention out, MLP up, MLP down
# the shape suite's weights (measure.suite: Llama-8B's q/k/v, o, gate/up, down, lm_head)
SUITE_WEIGHTS = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
TIME_MS = [128, 2048, 8192]
TIME_EPILOGUES = ["residual", "alpha_bias_gelu_tanh+residual"]
FP32_EPILOGUES = ["none", "alpha_bias_relu", "residual", "alpha_bias_relu+residual"]  # with a float32 D
GLU_CHECK_SHAPES = [(200, 528, 320), (1000, 3008, 520)]  # (M, W_gu's rows, K): D 264 and 1504 wide
ALPHA, BETA = 0.75, 0.5  # not 1: the scalars must reach the kernel
ROUNDS, PER_ROUND = 6, 5
# the residual's timing variants (v9's c_prefetch): name -> knobs over the policy's; the op of a row is
# the epilogue and the name's suffix (at_chunk: none, the kernel measured before c_prefetch)
C_VARIANTS = {"at_chunk": {"c_prefetch": False}, "prefetch": {"c_prefetch": True}}
SMALL_TILES = {"c_prefetch": True, "blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "cluster_n": 1,
               "epi_n": 64, "pipe_depth": 8, "stream_b": True}  # M = 128: 2 x N / 64 CTAs
FP32_RESIDUAL_MS = [2048, 8192]  # a wgrad's M is tokens
# the small-M epilogue rule (plan's small-m-epilogue): its choice beside the choice before it
RULE_MS = [64, 128, 256]
RULE_EPILOGUES = ["residual", "alpha_bias_gelu_tanh+residual", "bias_gelu_tanh"]
RULE_NAME = "small-m-epilogue"
# variant -> the rules plan_job takes: the policy's ("rule"), the policy without the rule ("before"),
# the rule forced where it does not apply ("probe_64x64"), and with 64x128 tiles past its M ("probe_64x128");
# "unchanged": the policy's, the rule not applying
RULE_VARIANTS = ("rule", "before", "unchanged", "probe_64x64", "probe_64x128")
WIDE_PROBE = (64, 128)  # probe_64x128's tile
# the fused epilogue on split-K (v10) and swap AB (v11), ``prepare --set split``: bias+GELU (cuBLASLt fuses
# it: torch._addmm_activation) and the residual (v10 only) at the small and middling M where the policy's
# 16-bit choice is one of them, on
# the Llama weights and on held-out weights that carry a bias and a GELU in their own models (GPT-2 small's
# MLP, 768 <-> 3072; ViT-L's first MLP layer, 1024 -> 4096); the policy's module now (``now``) beside the one
# it chose while v10 and v11 built no epilogue (``before``), and at 32 < M <= 128 beside the policy without
# the small-M epilogue rule (``no_small_rule``: split-K or swap AB there instead of v9's 64x64 tiles)
SPLIT_EPILOGUES = ["bias_gelu_tanh", "residual"]
HELD_OUT_BIAS_WEIGHTS = [(3072, 768), (768, 3072), (4096, 1024)]
SPLIT_MS = [1, 16, 64, 128, 256, 512]
SPLIT_VARIANTS = ("now", "before", "no_small_rule", "no_split", "fill_before")
# where split-K and stream-K pay for an epilogue call past the small M (``prepare --set split_probe``): the
# policy's module beside the policy without its split-k and stream-k rules (``no_split``), for bias+GELU, the
# residual and no epilogue (the plain GEMM the rules were measured on), at the suite's weights
PROBE_EPILOGUES = ["bias_gelu_tanh", "residual", "none"]
PROBE_MS = [256, 384, 512, 768, 1024, 2048, 4096]
SPLIT_RULES = ("split-k", "stream-k")
# issue 31's epilogue target on the shape suite (``prepare --set suite``): bias+GELU and bias+ReLU, the two
# activations cuBLASLt fuses after a bias, at the suite's weights and M (measure.suite), and at the held-out
# weights with a bias and a GELU in their own models; the policy's module each, against cuBLASLt's fused
# epilogue (torch._addmm_activation) and torch's unfused path, kernel and call level
SUITE_EPILOGUES = ["bias_gelu_tanh", "bias_relu"]
SUITE_MS = [1, 16, 64, 128, 512, 2048, 8192]
# the split-k rule's fill threshold (plan.SPLIT_K_MAX_FILL) on the plain GEMMs it moved, ``prepare --set
# split_fill``: every shape of the shape suite and of the every-model samples (seeds 1-3) whose choice it
# changed, bf16 with no epilogue, the policy's module (``now``) beside the rule without the threshold
# (``fill_before``)
FILL_SEEDS = (1, 2, 3)
# the suite's weakest cases against cuBLASLt's fused epilogue (``prepare --set few_tiles``): shapes whose
# tiles leave SMs idle or whose K loops are short (M = 64-128 on the 4096-wide weights, the held-out small
# weights at M = 64-2048), bias+GELU, the policy's module (``now``) beside candidates of other tiles and
# splits (:data:`FEW_TILE_CANDIDATES`), each built where the rung's validator takes it
FEW_TILE_CASES = [(64, 4096, 4096), (64, 6144, 4096), (128, 4096, 4096), (64, 3072, 768), (64, 768, 3072),
                  (64, 4096, 1024), (128, 768, 3072), (128, 3072, 768), (512, 768, 3072), (512, 3072, 768),
                  (512, 4096, 4096), (512, 4096, 1024), (2048, 768, 3072), (2048, 4096, 1024)]
SMALL_ONE_CONSUMER = {"num_warpgroups": 1, "cluster_n": 1, "epi_n": 64, "stream_b": True}
FEW_TILE_CANDIDATES = {  # name -> (rung, knobs; cluster_m 2 where two row tiles can share B)
    "v9_64x64": ("v9", {"blk_m": 64, "blk_n": 64, **SMALL_ONE_CONSUMER}),
    "v9_64x128": ("v9", {"blk_m": 64, "blk_n": 128, **SMALL_ONE_CONSUMER}),
    "v9_64x64_1x2": ("v9", {"blk_m": 64, "blk_n": 64, **SMALL_ONE_CONSUMER, "cluster_n": 2}),
    "v9_128x128": ("v9", {"blk_m": 128, "blk_n": 128}),
    "v10_128x128_s2": ("v10", {"blk_m": 128, "blk_n": 128, "split_k": 2}),
    "v10_128x128_s4": ("v10", {"blk_m": 128, "blk_n": 128, "split_k": 4}),
    "v10_64x64_s2": ("v10", {"blk_m": 64, "blk_n": 64, **SMALL_ONE_CONSUMER, "split_k": 2}),
    "v10_64x128_s2": ("v10", {"blk_m": 64, "blk_n": 128, **SMALL_ONE_CONSUMER, "split_k": 2}),
}
# and at M <= 16 (swap AB's M), swap AB's splits and widths: short K loops on small weights pay a split's
# reduction for few slices
FEW_TILE_SWAP_CASES = [(1, 3072, 768), (16, 3072, 768), (1, 4096, 1024), (16, 4096, 1024), (1, 6144, 4096),
                       (16, 6144, 4096)]
FEW_TILE_SWAP_CANDIDATES = {f"v11_{bn}_s{sk}": ("v11", {"blk_n": bn, "num_warpgroups": bn // 64, "split_k": sk,
                                                         "stream_b": True})
                            for bn in (64, 128) for sk in (1, 2, 4)}
# swap AB's widths and splits at the suite's weights and the held-out ones (``prepare --set swap_widths``),
# bias+GELU and no epilogue, M = 1, 16, 32: the policy's module beside :data:`FEW_TILE_SWAP_CANDIDATES`
SWAP_WIDTH_MS = [1, 16, 32]
SWAP_WIDTH_EPILOGUES = ["bias_gelu_tanh", "none"]
# the narrow swap (plan's swap-ab-narrow) on the shapes it moved (``prepare --set narrow_moved``): every shape
# of the shape suite and of the every-model samples (seeds 1-3) whose choice it changed, no epilogue,
# bf16, the policy's module (``now``) beside the policy without the rule (``no_narrow``)
NARROW_RULE = "swap-ab-narrow"
NARROW_EPILOGUES = ["none"]
NARROW_MS = (1, 7)  # the every-model samples' M <= 8 (one module of 8 rows a weight)
# the small-M epilogue rule's tiles split in two (plan's small-m-split) on the shapes it moved (``prepare --set
# small_split_moved``): bias+GELU at every shape of the suite and the every-model samples whose choice it changed,
# the policy's module (``now``) beside the policy without the rule (``no_small_split``)
SMALL_SPLIT_RULE = "small-m-split"
# past M = 128 on narrow weights (``prepare --set mid_tiles``): where 128x128 tiles leave most SMs idle and K is too
# short for the split-k rule, the policy's module beside :data:`FEW_TILE_CANDIDATES`; no epilogue at M = 256 and
# 512, bias+GELU at 512
MID_TILE_WEIGHTS = [(768, 3072), (1024, 4096), (1280, 1280), (896, 4864), (2048, 2048)]
MID_TILE_MS = (256, 512)
# the mid-tiles rules (plan's mid-tiles and mid-tiles-split) on the shapes they move (``prepare --set mid_moved``):
# every shape of the suite and the every-model samples whose plain bf16 choice they change, the policy's module
# (``now``) beside the policy without them (``no_mid``)
MID_RULES = ("mid-tiles", "mid-tiles-split")
# rings past plan's 8 stages (MAX_SMALL_M_DEPTH) at M = 64-128 on the 4096-wide weights (``prepare --set
# deep_rings``): cuBLAS runs 64x64 tiles in 2x1 clusters with 13 stages of 64 there (128x4096x4096,
# ../2026-11-26_h100_cublas_kernels/), where a 64x64 tile of ours fits 13 too; no epilogue and bias+GELU, the
# policy's module (``now``, and ``now_deep``: its knobs with the deepest ring they fit) beside
# :data:`DEEP_RING_CANDIDATES`, each at 8 stages and at the deepest ring it fits (``_deep``; up to
# :data:`DEEP_RING_CAP`)
DEEP_RING_CASES = [(64, 4096, 4096), (128, 4096, 4096), (64, 4096, 14336), (128, 4096, 14336)]
DEEP_RING_EPILOGUES = ["none", "bias_gelu_tanh"]
DEEP_RING_CAP = 16
DEEP_RING_CANDIDATES = {name: FEW_TILE_CANDIDATES[name] for name in ("v9_64x64", "v9_64x128", "v10_64x64_s2",
                                                                     "v10_64x128_s2")}
DEEP_RING_CANDIDATES.update({f"v11_64_s{sk}": ("v11", {"blk_n": 64, "num_warpgroups": 1, "split_k": sk,
                                                       "stream_b": True}) for sk in (1, 2)})
# and swap AB's rings at M <= 16 (plan caps them at 8 too, MAX_SWAP_DEPTH): decode's weight streaming, no epilogue
DEEP_RING_SWAP_CASES = [(1, 4096, 4096), (16, 4096, 14336), (1, 6144, 4096), (16, 28672, 4096)]
DEEP_RING_SWAP_CANDIDATES = {name: DEEP_RING_CANDIDATES[name] for name in ("v11_64_s1", "v11_64_s2")}
DEEP_RING_SWAP_CANDIDATES["v11_128_s1"] = ("v11", {"blk_n": 128, "num_warpgroups": 2, "split_k": 1, "stream_b": True})
# the rules the deep-rings run led to (plan's swap-ab-64 and long-k-split) on the shapes they move (``prepare --set
# swap64_moved``): every shape of the suite, the every-model samples and issue 31's epilogue suite (its weights at
# its M) whose bf16 choice they change, no epilogue and bias+GELU, the policy's module (``now``) beside the policy
# without them (``no_swap64``)
SWAP64_RULES = ("swap-ab-64", "long-k-split")
# plan's ROW_TILES_64, measured and not yet in its rules (``prepare --set row64_moved``): the shapes it would move,
# no epilogue, the policy with it (``with_row64``) against the policy (``now``)
ROW64_VARIANT = "with_row64"
# programmatic dependent launch (the production kernel's ``pdl`` knob, ``prepare --set pdl``): at every weight of the
# suite and the held-out weights at SUITE_MS, no epilogue and bias+GELU, the policy's module without it (``now``: the
# policy as it was when this set was run, before plan.pdl_pays) beside the same module launched as a programmatic
# dependent of the kernel before it (``pdl``)
PDL_EPILOGUES = ("none", "bias_gelu_tanh")
# pdl's L2 warm-up (the production kernel's optional ``l2_warm`` knob, ``prepare --set l2_warm``): at every weight of
# the suite and the held-out weights at SUITE_MS up to L2_WARM_MAX_M and at STREAM_SMALL_SAMPLES (the every-model
# samples' memory-bound cases), no epilogue and bias+GELU, wherever the policy's module launches with pdl: that module
# (``now``) beside the same knobs with ``l2_warm=True`` (``warm``: B's first slices asked of L2 before the grid wait,
# producer.warm_l2)
L2_WARM_EPILOGUES = PDL_EPILOGUES
# tiles of N narrow enough for one CTA per SM (``prepare --set narrow_n``): cuBLAS runs 64x32 tiles in 1x2 clusters
# (A shared by multicast), 128 CTAs, at 64x4096x4096 (../results/2026-11-29_h200_deep_rings/cublas_small.json),
# where v11's 64 rows of N split in two run 0.96x. At the suite's and the held-out weights at M = 16, 64 and 128
# (no epilogue and bias+GELU) and the every-model samples' memory-bound cases (no epilogue): the policy's module
# (``now``) beside v9 with 64 (M <= 64) or 128 rows of M and the narrowest whole 16 columns of N that fit one wave,
# in 1x2 clusters (``v9_narrow_c2``, and at a 16-stage ring ``v9_narrow_c2_deep``) and alone (``v9_narrow``)
NARROW_N_MS = (16, 64, 128)
# the rule that run led to (plan's narrow-n) on every shape it moves (``prepare --set narrow_n_moved``): the suite's and
# the every-model samples' of five seeds, and every every-model weight at NARROW_N_MOVED_MS, no epilogue and bias+GELU,
# the policy's module (``now``) beside the policy without the rule (``no_narrow_n``)
NARROW_N_RULE = "narrow-n"
NARROW_N_MOVED_MS = (48, 64, 96, 128)
L2_WARM_MAX_M = 512  # past it a kernel is long enough that its first loads are a small part of it
# stream-K under one wave (``prepare --set stream_small``): a small-M grid of fewer tiles than SMs leaves SMs idle
# while the weight streams (issue 30's memory-bound cases: 72-112 units on 132 SMs); v10's ``stream_k`` deals every
# tile's K slices out evenly over all the clusters instead. At the suite's and the held-out weights at M = 1-128 and
# the every-model samples' memory-bound cases below 85% of their own-size copy
# (../results/2026-11-29_h200_every_model_pdl/), no epilogue, and bias+GELU at the suite's weights at M = 64 and 128
# (issue 31's weakest): the policy's module beside v10 stream-K in 64-row tiles, launched as a programmatic dependent
STREAM_SMALL_CANDIDATES = {f"v10_sk_64x{bn}": ("v10", {"blk_m": 64, "blk_n": bn, **SMALL_ONE_CONSUMER, "split_k": 1,
                                                       "stream_k": True, "pdl": True}) for bn in (64, 128)}
STREAM_SMALL_MS = [1, 16, 64, 128]
STREAM_SMALL_SAMPLES = [(7, 9216, 3072), (48, 3072, 8192), (16, 3072, 2048), (16, 3584, 4096), (48, 5120, 1280),
                        (2, 896, 4864), (2, 3072, 3072), (7, 1024, 4096), (16, 1280, 5120), (48, 2048, 2048),
                        (16, 5120, 13824), (48, 8192, 8192), (16, 10240, 8192), (7, 5120, 5120)]
# swap AB's A shared over a 1x2 cluster (``prepare --set swap_pairs``): at M = 32-64 a 64-row tile of N reads as many
# bytes of A as of B each K slice, and every CTA reads the same A; two CTAs of neighbouring N tiles in a cluster
# each load half of it for both (TMA multicast). The policy's module (``now``) beside the same knobs with
# ``cluster_n=2`` (``c1x2``) at the suite's and the held-out weights at M = 16, 32 and 64 and the every-model samples
# of M >= 16 above, no epilogue, and bias+GELU at the suite's weights at M = 64
SWAP_PAIR_MS = [16, 32, 64]
# swap AB's wider tiles of N (``prepare --set swap_wide``): where 64 rows of N take more than a wave and the swap-ab
# rule's 128 rows leave 72-80 CTAs (N = 9216-10240), 192 and 256 rows split in one or two (more rows of B in
# flight per CTA, or more CTAs); at the every-model samples under 85% of their own-size copy at M <= 16 and the
# suite's wide weights at M = 1 and 16, no epilogue: the policy's module beside each
SWAP_WIDE_CANDIDATES = {f"v11_{bn}_s{sk}": ("v11", {"blk_n": bn, "num_warpgroups": 1 if bn == 192 else 2,
                                                    "split_k": sk, "stream_b": True, "pdl": True})
                        for bn in (192, 256) for sk in (1, 2)}
# the rule that run led to (plan's swap-ab-192) on the shapes it moves (``prepare --set swap_wide_moved``): every
# shape of the suite and the every-model samples of all five seeds whose bf16 choice it changes, no epilogue and
# bias+GELU, the policy's module (``now``) beside the policy without it (``no_swap192``)
SWAP_WIDE_RULE = "swap-ab-192"
# the same rule past M = 16 (``prepare --set swap_wide_m64``): the policy with swap-ab-192 taking M <= 64
# (``wide_to_64``) beside the policy, at the shapes that moves among the suite, the every-model samples of five
# seeds and the rule's weights at M = 32, 48, 64, no epilogue and bias+GELU. Since 2b4a568 the policy takes M <= 64
# itself, so the set moves nothing now: it stays as the record of ../results/2026-11-29_h200_swap_wide_m64/ (built
# from eeae73f's policy with this set)
SWAP_WIDE_M64_WEIGHTS = [(9216, 3072), (10240, 8192), (5120, 5120), (5120, 13824), (4544, 4544), (4544, 18176),
                         (9728, 896)]
SWAP_WIDE_CASES = [(7, 9216, 3072), (16, 10240, 8192), (7, 5120, 5120), (16, 5120, 13824), (16, 3584, 4096),
                   (1, 6144, 4096), (16, 6144, 4096), (1, 28672, 4096), (16, 28672, 4096), (1, 4096, 14336),
                   (7, 18176, 4544), (16, 7168, 5120)]
# tiles the policy has not tried at mid M (``prepare --set fill_tiles``): issue 31's suite runs 0.89-0.99x cuBLASLt's
# fused epilogue at M = 64-512 on most of its weights, and at M = 333 torch beat every module of ours on ten
# every-model weights at first use (../results/2026-11-29_h200_every_model_swap192_m64/), where 128-row tiles fill
# half to all of the SMs in one wave and 64-row tiles need two. cuBLAS runs 64-row tiles with two consumers of 384
# threads there (../results/2026-11-26_h100_cublas_kernels/). Candidates: v9's ``k_consumers=2`` on 64-row tiles (two
# consumers take alternate K slices of one tile), 64-row tiles 192 and 256 wide (one consumer, one wave where 128-wide
# tiles take two), the same split in two (v10), and 128x192 and 128x256 tiles split in two; all launched as
# programmatic dependents. At the suite's weights at M = 64, 128, 512 with bias+GELU, and with no epilogue at
# FILL_TILE_PLAIN: the policy's module beside each candidate the validator takes
FILL_TILE_CANDIDATES = {
    "v9_64x64_kc2": ("v9", {"blk_m": 64, "blk_n": 64, **SMALL_ONE_CONSUMER, "k_consumers": 2, "pdl": True}),
    "v9_64x128_kc2": ("v9", {"blk_m": 64, "blk_n": 128, **SMALL_ONE_CONSUMER, "k_consumers": 2, "pdl": True}),
    **{f"v9_64x{bn}": ("v9", {"blk_m": 64, "blk_n": bn, **SMALL_ONE_CONSUMER, "pdl": True}) for bn in (192, 256)},
    **{f"v10_64x{bn}_s2": ("v10", {"blk_m": 64, "blk_n": bn, **SMALL_ONE_CONSUMER, "split_k": 2, "pdl": True})
       for bn in (192, 256)},
    **{f"v10_128x{bn}_s2": ("v10", {"blk_m": 128, "blk_n": bn, "split_k": 2, "pdl": True}) for bn in (192, 256)},
}
FILL_TILE_MS = (64, 128, 512)
FILL_TILE_PLAIN = [(333, 4096, 14336), (333, 4096, 4096), (333, 6144, 4096), (333, 7168, 5120), (333, 16384, 2048),
                   (128, 6144, 4096), (128, 3072, 8192), (256, 2048, 8192)]
# swap AB at mid M (``prepare --set swap_mid``): at M = 333 cuBLAS runs our N in its 64-row slot and our M as wgmma's
# N, 168 wide (two tiles: 336 rows for 333), 128 CTAs in one wave (../results/2026-11-29_h200_fill_tiles/
# cublas_mid.json), where our 128-row tiles compute 384 rows in 96 CTAs. v11 takes any multiple of 8 up to 256 as
# its blk_m: at each case, blk_m the fewest multiple of 8 that covers M in 1-4 tiles, beside 64 (one consumer), 128
# (two) and 192 (one) rows of N, split in one or two, wherever the grid fills 60-100% of the SMs (or, unsplit, 2-4
# waves whose last is at least 85% full); with the M tiles
# paired in a cluster (cluster_m=2: one load of each weight tile for both) where their count is even
SWAP_MID_RULE = "swap-ab-mid"  # the rule that set led to; ``prepare --set swap_mid_moved`` times it against the
# policy without it (``no_swap_mid``) at every shape it moves among the suite, the every-model samples of five seeds
# and the suite's and held-out weights at SWAP_MID_MS, no epilogue and bias+GELU. Its run (70 pairs) timed the rule as
# first written; the six pairs at M = 256 it has since left to the mid-tiles rules the set no longer lists
SWAP_MID_MS = (160, 192, 256, 333, 384)
# the rule widened by the narrow run (``prepare --set swap_mid_more``): M up to 448, 1-4 tiles of M, splits up to
# four; every shape it moves among the suite, the every-model samples of five seeds and the suite's, the held-out and
# SWAP_MID_NARROW's weights at SWAP_MID_MORE_MS, no epilogue and bias+GELU (the first run's shapes again too)
SWAP_MID_MORE_MS = (160, 192, 256, 333, 384, 448)
SWAP_MID_PLAIN = [(333, 4096, 14336), (333, 4096, 4096), (333, 6144, 4096), (333, 7168, 5120), (333, 16384, 2048),
                  (256, 2048, 8192), (256, 4096, 4096), (384, 4096, 4096), (200, 4096, 14336), (768, 4096, 4096)]
SWAP_MID_FUSED = [(512, N, K) for N, K in SUITE_WEIGHTS if N < 100_000]
SWAP_MID_WIDTHS = ((64, 1), (128, 2), (192, 1))  # (blk_n: rows of N, consumers)
# where the rule's grids (split in one or two) do not fill 70% of a wave: narrow weights at M = 160-448, and M = 448
# (``prepare --set swap_mid_narrow``: the same candidates split up to four, each slice >= 1024 of K)
SWAP_MID_NARROW = [(160, 2560, 10240), (320, 2560, 10240), (448, 2560, 10240), (333, 1280, 5120), (333, 1024, 4096),
                   (333, 768, 3072), (448, 4096, 4096), (448, 4096, 14336), (200, 2048, 2048), (448, 6144, 4096)]


def swap_mid_candidates(M: int, N: int, sms: int = 132, splits=(1, 2)) -> dict:
    """name -> (rung, knobs) of :data:`SWAP_MID_WIDTHS`'s v11 tiles at ``M``, ``N``, split by each of ``splits`` (see
    the set's note)."""
    out = {}
    for t in range(1, 5):
        blk_m = -(-M // (8 * t)) * 8
        if not 8 <= blk_m <= 256:
            continue
        for blk_n, warpgroups in SWAP_MID_WIDTHS:
            for sk in splits:
                units = t * -(-N // blk_n) * sk
                waves = units / sms
                if not (0.6 <= waves <= 1 or (sk == 1 and 1 < waves <= 4 and waves % 1 >= 0.85)):
                    continue
                for cm in (1, 2) if t % 2 == 0 else (1,):
                    out[f"v11_{blk_m}x{blk_n}_s{sk}" + ("_c2x1" if cm == 2 else "")] = (
                        "v11", {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": warpgroups, "split_k": sk,
                                "cluster_m": cm, "cluster_n": 1, "pdl": True})
    return out


def swap_mid_cases(sms: int = 132, narrow: bool = False) -> list[dict]:
    """The swap_mid set's timing cases: the policy's module (``now``) and :func:`swap_mid_candidates` (the deepest
    ring each fits, up to 8) at :data:`SWAP_MID_PLAIN` with no epilogue and :data:`SWAP_MID_FUSED` with bias+GELU;
    ``narrow`` (``--set swap_mid_narrow``): at :data:`SWAP_MID_NARROW`, no epilogue, split up to four."""
    out = []
    shapes = ([("none", s) for s in SWAP_MID_NARROW] if narrow else
              [("none", s) for s in SWAP_MID_PLAIN] + [("bias_gelu_tanh", s) for s in SWAP_MID_FUSED])
    for epilogue, (M, N, K) in shapes:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", epilogue))
        case = {"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16", "shape": [M, N, K],
                "held_out": False}
        out.append({**case, "variant": "now"})
        for name, (rung, knobs) in swap_mid_candidates(M, N, sms, (1, 2, 3, 4) if narrow else (1, 2)).items():
            if K // knobs["split_k"] < 1024:
                continue
            depth = plan._deepest(rung, p, {**knobs, **spec_knobs(p.spec)}, plan.MAX_SMALL_M_DEPTH)  # pylint: disable=protected-access
            built = plan.with_spec({**knobs, "pipe_depth": depth, "dynamic_m": True}, p)
            if plan._validate(rung, p, built) is None:  # pylint: disable=protected-access
                out.append({**case, "rung": rung, "variant": name, "knobs": built})
    return out


CASE_SETS = ("all", "epilogues", "rule", "split", "split_probe", "suite", "split_fill", "few_tiles", "swap_widths",
             "narrow_moved", "small_split_moved", "mid_tiles", "mid_moved", "deep_rings", "swap64_moved",
             "row64_moved", "pdl", "stream_small", "swap_pairs", "swap_wide", "swap_wide_moved", "swap_wide_m64",
             "fill_tiles", "swap_mid", "swap_mid_moved", "swap_mid_narrow", "swap_mid_more", "l2_warm", "narrow_n",
             "narrow_n_moved", "bias_stash", "tile224_moved", "swap256_moved")
CHECK_TIMEOUT = 120.0
# plan's tile-224 (128x224 tiles where their waves fill better, ``prepare --set tile224_moved``): every shape of the
# suite, the held-out weights and every every-model sample it moves, no epilogue and bias+GELU, the policy with it
# (``now``) against the policy without it (``no_tile224``)
TILE_224_RULE = "tile-224"
# a candidate, not a rule yet (``prepare --set swap256_moved``): swap AB with 256 rows of N over two consumers at M <= 64
# where swap-ab's 128-row tiles (unsplit) need a second wave and 256-row tiles fit in one (64x28672x4096: 1.024x cuBLAS
# against 0.98-1.00x in four runs, ../results/2026-11-29_h200_wide_mid/); every shape it would move, no epilogue and
# bias+GELU, the policy with it (``with_swap256``, and without PDL: ``with_swap256_nopdl``) against the policy (``now``)
SWAP256_VARIANT = "with_swap256"


def cases() -> list[dict]:
    """What ``prepare`` builds: (purpose, epilogue, dtype of A and B, D's dtype, M, N, K, knobs
    beyond the policy's)."""
    out = [{"purpose": "check", "epilogue": e, "dtype": d, "shape": list(s)}
           for e in CHECK_EPILOGUES for d in ("float16", "bfloat16") for s in CHECK_SHAPES[:1]]
    out += [{"purpose": "check", "epilogue": "alpha_bias_gelu_tanh+residual", "dtype": "bfloat16",
             "shape": list(CHECK_SHAPES[1])}]
    # a float32 D (the policy's knobs, and 64-column float32 chunks: epi_n=128 with three stages)
    out += [{"purpose": "check", "epilogue": e, "dtype": d, "d": "float32", "shape": list(s)}
            for e in FP32_EPILOGUES for d in ("float16", "bfloat16")
            for s in (CHECK_SHAPES if d == "bfloat16" else CHECK_SHAPES[:1])]
    out += [{"purpose": "check", "epilogue": e, "dtype": "bfloat16", "d": "float32",
             "shape": list(CHECK_SHAPES[0]), "knobs": {"epi_n": 128, "pipe_depth": 3, "cluster_m": 1}}
            for e in ("bias_gelu_tanh", "alpha_bias_relu+residual")]
    # C at each chunk (the kernel before c_prefetch), and one chunk a tile (epi_n = blk_n, one buffer)
    out += [{"purpose": "check", "epilogue": e, "dtype": "bfloat16", "shape": list(s), "knobs": {"c_prefetch": False}}
            for e in ("residual", "alpha_bias_gelu_tanh+residual") for s in CHECK_SHAPES]
    out += [{"purpose": "check", "epilogue": "residual", "dtype": "bfloat16", "d": "float32",
             "shape": list(CHECK_SHAPES[1]), "knobs": {"c_prefetch": False}}]
    out += [{"purpose": "check", "epilogue": "alpha_bias_gelu_tanh+residual", "dtype": "float16",
             "shape": list(CHECK_SHAPES[1]), "knobs": {"blk_m": 128, "blk_n": 256, "num_warpgroups": 2, "epi_n": 256,
                                                    "pipe_depth": 3}}]
    out += [{"purpose": "time", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K], "variant": v,
             "knobs": knobs}
            for e in TIME_EPILOGUES for N, K in LLAMA_WEIGHTS for M in TIME_MS
            for v, knobs in (*C_VARIANTS.items(), *((("prefetch_64x64", SMALL_TILES),) if M == 128 else ()))]
    out += [{"purpose": "time", "epilogue": "residual", "dtype": "bfloat16", "d": "float32", "shape": [M, N, K]}
            for N, K in LLAMA_WEIGHTS for M in FP32_RESIDUAL_MS]
    out += [{"purpose": "time", "epilogue": "none", "dtype": "bfloat16", "d": "float32", "shape": [M, N, K]}
            for N, K in LLAMA_WEIGHTS for M in TIME_MS[1:]]  # a wgrad's M is tokens: 2048 and up
    # SwiGLU: N is W_gu's rows (both halves), D has N / 2 columns
    out += [{"purpose": "check", "epilogue": "swiglu", "dtype": d, "shape": list(s)}
            for d in ("float16", "bfloat16") for s in (GLU_CHECK_SHAPES if d == "bfloat16" else GLU_CHECK_SHAPES[:1])]
    out += [{"purpose": "check", "epilogue": "swiglu", "dtype": "bfloat16", "shape": list(GLU_CHECK_SHAPES[0]),
             "knobs": {"cluster_m": 1}}]
    out += [{"purpose": "time", "epilogue": "swiglu", "dtype": "bfloat16", "shape": [M, 2 * 14336, 4096]}
            for M in TIME_MS]
    return out


def rule_cases(sms: int = 132) -> list[dict]:
    """The small-M epilogue rule's timing cases (see the module docstring): per epilogue, Llama
    weight and M of :data:`RULE_MS`, ``rule`` and ``before`` where the rule applies, ``unchanged``
    and ``probe_64x64`` where it does not, and ``probe_64x128`` past the rule's M where 64x128 tiles
    fit in one wave. Pure Python (the policy's rules, no build)."""
    out = []
    for e in RULE_EPILOGUES:
        for N, K in LLAMA_WEIGHTS:
            for M in RULE_MS:
                p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", e))
                variants = ("rule", "before") if plan.rule_applies(RULE_NAME, p) else ("unchanged", "probe_64x64")
                if M > plan.SMALL_M_EPILOGUE_ROWS[1] and p.tiles(*WIDE_PROBE) <= sms:
                    variants += ("probe_64x128",)
                for v in variants:
                    out.append({"purpose": "time", "set": "rule", "epilogue": e, "dtype": "bfloat16",
                                "shape": [M, N, K], "variant": v})
    return out


def epilogues_as_before():
    """v10 and v11 as they were before they built the fused epilogue (v10: none and fp8's scales; v11:
    none): the policy then passes over them for an epilogue call, as it did (a context)."""
    # the rungs (TVM's script layer): only where modules are planned and built
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.sm90a import hgemm_v10, hgemm_v11

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(hgemm_v10, "EPILOGUES", ("none", "scaled")))
    stack.enter_context(mock.patch.object(hgemm_v11, "EPILOGUES", ("none",)))
    return stack


def variant_rules(variant: str):
    """The rules a split-set variant plans with (None: the policy's own)."""
    if variant == "no_small_rule":
        return [r for r in plan.RULES if r.name != RULE_NAME]
    if variant == "no_split":
        return [r for r in plan.RULES if r.name not in SPLIT_RULES]
    if variant == "no_narrow":
        return [r for r in plan.RULES if r.name != NARROW_RULE]
    if variant == "no_mid":
        return [r for r in plan.RULES if r.name not in MID_RULES]
    if variant == "no_small_split":
        return [r for r in plan.RULES if r.name != SMALL_SPLIT_RULE]
    if variant == "no_swap64":
        return [r for r in plan.RULES if r.name not in SWAP64_RULES]
    if variant == "no_swap192":
        return [r for r in plan.RULES if r.name != SWAP_WIDE_RULE]
    if variant == "no_narrow_n":
        return [r for r in plan.RULES if r.name != NARROW_N_RULE]
    if variant == "no_swap_mid":
        return [r for r in plan.RULES if r.name != SWAP_MID_RULE]
    if variant == "no_tile224":
        return [r for r in plan.RULES if r.name != TILE_224_RULE]
    if variant == ROW64_VARIANT:
        return plan.with_row_tiles_64()
    if variant in (SWAP256_VARIANT, SWAP256_VARIANT + "_nopdl"):
        rules = list(plan.RULES)
        at = next(i for i, r in enumerate(rules) if r.name == "swap-ab")
        return rules[:at] + [_swap256_rule()] + rules[at:]
    return None


def _swap256_rule():
    """:data:`SWAP256_VARIANT`'s rule: swap-ab's where its unsplit 128-row tiles take more than one wave and
    256-row tiles fit in one, with 256 rows of N over two consumers and the deepest ring (<= 8) they fit."""
    def when(p):
        return (p.M <= 64 and plan.swap_split_k(p) == 1 and math.ceil(p.N / plan.SWAP_BLK_N) > p.sms
                and math.ceil(p.N / 256) <= p.sms)

    def knobs(p):
        k = {"blk_m": plan.swap_blk_m(p.M), "blk_n": 256, "num_warpgroups": 2, "split_k": 1}
        return {**k, "pipe_depth": plan._deepest("v11", p, k, plan.MAX_SWAP_DEPTH),  # pylint: disable=protected-access
                **plan.STREAM_B}
    return plan.Rule("swap-ab-256", "sm_90a", "v11", when=when, knobs=knobs,
                     why="M <= 64 where swap-ab's 128-row tiles need a second wave and 256-row tiles fit in one "
                         "(a candidate measured by epilogue_check --set swap256_moved)")


def _variant_context(variant: str):
    """The context a variant plans in (the rungs or the rule as they were before), or a null one."""
    if variant == "before":
        return epilogues_as_before()
    if variant == "wide_to_64":  # swap-ab-192 past the M it was measured at
        return mock.patch.object(plan, "SWAP_WIDE_TILE", (64, plan.SWAP_WIDE_TILE[1]))
    if variant == "fill_before":  # the split-k rule without its fill threshold, as it was before it
        return mock.patch.object(plan, "SPLIT_K_MAX_FILL", float("inf"))
    return contextlib.nullcontext()


def split_choice(p, variant: str):
    """The policy's choice for a split-set case's variant (:data:`SPLIT_VARIANTS`)."""
    with _variant_context(variant):
        return plan.choose(p, rules=variant_rules(variant))


def suite_and_sample_shapes() -> list[tuple[int, int, int]]:
    """Every (M, N, K) of the shape suite (bf16) and of the every-model samples of :data:`FILL_SEEDS`."""
    # the measuring layer, as the rest of this script takes it: only where it is used
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import every_model, suite

    shapes = {(c["M"], c["N"], c["K"]) for c in suite.cases(("bfloat16",))}
    for seed in FILL_SEEDS:
        shapes |= {(c["M"], c["N"], c["K"]) for c in every_model.cases(seed=seed)}
    return sorted(shapes)


def later_sample_shapes() -> set[tuple[int, int, int]]:
    """Every (M, N, K) of the every-model samples drawn after :data:`FILL_SEEDS` (seeds 4 and 5)."""
    from gemm_ladder.measure import every_model  # pylint: disable=import-outside-toplevel  (as suite_and_sample_shapes)

    return {(c["M"], c["N"], c["K"]) for seed in (4, 5) for c in every_model.cases(seed=seed)}


def moved_cases(variant: str, epilogues=("none",), sms: int = 132, ms=None, extra=()) -> list[dict]:
    """Timing cases at every shape of :func:`suite_and_sample_shapes` and ``extra`` (with an M of ``ms``, when
    given) whose bf16 choice (for each of ``epilogues``) ``variant`` changes: ``now`` and ``variant`` each."""
    out = []
    for e in epilogues:
        for M, N, K in sorted(set(suite_and_sample_shapes()) | set(extra)):
            if ms is not None and M not in ms:
                continue
            p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", e))
            try:
                moved = _distinct_variants(p, [variant])
            except (LookupError, ValueError):  # a shape no rule takes unpadded (odd N), or past 32-bit indices
                continue
            if len(moved) > 1:
                out += [{"purpose": "time", "set": "split", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K],
                         "variant": v} for v in moved]
    return out


def split_fill_cases(sms: int = 132) -> list[dict]:
    """The split-fill set's cases (see :data:`FILL_SEEDS`): the shapes whose plain bf16 choice the
    threshold moved, ``now`` and ``fill_before`` each."""
    return moved_cases("fill_before", sms=sms)


def _distinct_variants(p, variants) -> list[str]:
    """``now`` and each of ``variants`` whose choice differs from every one before it."""
    now = split_choice(p, "now")
    seen, out = {(now.rung, tuple(sorted(now.knobs.items())))}, ["now"]
    for v in variants:
        c = split_choice(p, v)
        key = (c.rung, tuple(sorted(c.knobs.items())))
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def split_probe_cases(sms: int = 132) -> list[dict]:
    """The split probe's timing cases (:data:`PROBE_EPILOGUES` x the suite's weights x :data:`PROBE_MS`):
    ``now`` and, where it differs, ``no_split``."""
    out = []
    for e in PROBE_EPILOGUES:
        for N, K in SUITE_WEIGHTS:
            for M in PROBE_MS:
                p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", e))
                out += [{"purpose": "time", "set": "split", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K],
                         "variant": v} for v in _distinct_variants(p, ["no_split"])]
    return out


def split_cases(sms: int = 132) -> list[dict]:
    """The split set's timing cases (:data:`SPLIT_EPILOGUES` x weights x :data:`SPLIT_MS`): ``now``,
    and each other variant whose choice differs from it (a case whose variants all choose alike is
    ``now`` alone). Plans with the rungs' validator (the build box)."""
    out = []
    for e in SPLIT_EPILOGUES:
        for N, K in LLAMA_WEIGHTS + HELD_OUT_BIAS_WEIGHTS:
            for M in SPLIT_MS:
                p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", e))
                variants = _distinct_variants(p, ["before"] + (["no_small_rule"] if plan.rule_applies(RULE_NAME, p)
                                                                else []))
                out += [{"purpose": "time", "set": "split", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K],
                         "variant": v, "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS} for v in variants]
    return out


# v10's and v11's fused epilogues checked at odd shapes, each module's rung and knobs given (a split of 2 and
# 3, the atomic reduction, stream-K pieces, a float32 D; swap AB at 8 to 64 rows of M, one and two consumers)
SPLIT_CHECKS = [
    ("v10", "bias_gelu_tanh", "bfloat16", None, (200, 264, 1320), {"split_k": 2, "cluster_m": 1}),
    ("v10", "alpha_bias_relu", "float16", None, (1000, 3000, 520), {"split_k": 3}),
    ("v10", "alpha_bias_gelu_erf", "bfloat16", None, (333, 1288, 2056), {"split_k": 4, "reduce": "atomic",
                                                                          "blk_m": 128, "blk_n": 128,
                                                                          "cluster_m": 1}),
    ("v10", "bias_silu", "bfloat16", None, (1000, 2600, 2056), {"split_k": 1, "stream_k": True}),
    ("v10", "bias_gelu_tanh", "bfloat16", "float32", (200, 264, 1320), {"split_k": 2, "cluster_m": 1}),
    ("v10", "alpha_bias_gelu_tanh+residual", "bfloat16", None, (1000, 3000, 2056), {"split_k": 3}),
    ("v10", "residual", "float16", None, (200, 264, 1320), {"split_k": 2, "reduce": "atomic", "cluster_m": 1}),
    ("v10", "residual", "bfloat16", "float32", (333, 1288, 2056), {"split_k": 2}),
    ("v10", "bias_relu+residual", "bfloat16", None, (1000, 2600, 2056), {"split_k": 1, "stream_k": True}),
    ("v11", "bias_gelu_tanh", "bfloat16", None, (5, 4104, 1320), {"blk_m": 8, "split_k": 3}),
    ("v11", "alpha_bias_gelu_erf", "float16", None, (40, 776, 3000), {"blk_m": 64, "split_k": 2}),
    ("v11", "bias_relu", "bfloat16", None, (100, 1032, 520), {"blk_m": 128, "blk_n": 128, "num_warpgroups": 2,
                                                              "split_k": 1}),
    ("v11", "bias", "float16", None, (16, 3000, 2048), {"blk_m": 16, "blk_n": 256, "num_warpgroups": 2,
                                                        "split_k": 4}),
]


def suite_cases() -> list[dict]:
    """The suite set's timing cases: :data:`SUITE_EPILOGUES` x (the suite's weights and the held-out ones)
    x :data:`SUITE_MS`, the policy's module each (``now``)."""
    return [{"purpose": "time", "set": "split", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K],
             "variant": "now", "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS}
            for e in SUITE_EPILOGUES for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SUITE_MS]


def few_tile_cases(sms: int = 132) -> list[dict]:
    """The few-tiles set's timing cases: at each of :data:`FEW_TILE_CASES`, ``now`` and each candidate of
    :data:`FEW_TILE_CANDIDATES` that the rung's validator takes and that differs from ``now`` (the deepest
    ring each fits, up to 8; a 2x1 cluster where there are two row tiles or more, 1x1 where one); at
    :data:`FEW_TILE_SWAP_CASES`, :data:`FEW_TILE_SWAP_CANDIDATES` instead."""
    return _candidate_cases([("bias_gelu_tanh", s) for s in FEW_TILE_CASES + FEW_TILE_SWAP_CASES],
                            set(FEW_TILE_SWAP_CASES), sms)


def swap_width_cases(sms: int = 132) -> list[dict]:
    """The swap-widths set's timing cases (:data:`SWAP_WIDTH_EPILOGUES` x the suite's and the held-out
    weights x :data:`SWAP_WIDTH_MS`): the policy's module and :data:`FEW_TILE_SWAP_CANDIDATES`."""
    shapes = [(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SWAP_WIDTH_MS]
    return _candidate_cases([(e, s) for e in SWAP_WIDTH_EPILOGUES for s in shapes], set(shapes), sms)


def mid_tile_cases(sms: int = 132) -> list[dict]:
    """The mid-tiles set's timing cases (:data:`MID_TILE_WEIGHTS` x :data:`MID_TILE_MS`, no epilogue; bias+GELU at
    the largest M): the policy's module and :data:`FEW_TILE_CANDIDATES`."""
    plain = [("none", (M, N, K)) for N, K in MID_TILE_WEIGHTS for M in MID_TILE_MS]
    bias = [("bias_gelu_tanh", (MID_TILE_MS[-1], N, K)) for N, K in MID_TILE_WEIGHTS]
    return _candidate_cases(plain + bias, set(), sms)


def deep_ring_cases(sms: int = 132) -> list[dict]:
    """The deep-rings set's timing cases (:data:`DEEP_RING_EPILOGUES` x :data:`DEEP_RING_CASES`, and
    :data:`DEEP_RING_SWAP_CASES` with no epilogue): the policy's module and its knobs with the deepest ring
    (``now_deep``), and :data:`DEEP_RING_CANDIDATES` (:data:`DEEP_RING_SWAP_CANDIDATES`) at 8 stages and at the
    deepest (``_deep``) where that is deeper."""
    cases_ = [(e, s) for e in DEEP_RING_EPILOGUES for s in DEEP_RING_CASES]
    depths = (plan.MAX_SMALL_M_DEPTH, DEEP_RING_CAP)
    swap = [("none", s) for s in DEEP_RING_SWAP_CASES]
    out = (_candidate_cases(cases_, set(), sms, DEEP_RING_CANDIDATES, depths)
           + _candidate_cases(swap, set(DEEP_RING_SWAP_CASES), sms, DEEP_RING_SWAP_CANDIDATES, depths))
    for epilogue, (M, N, K) in cases_ + swap:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", epilogue))
        now = plan.choose(p)
        knobs = {k: v for k, v in now.knobs.items() if k not in ("dtype", "arch")}
        deepest = plan._deepest(now.rung, p, knobs, DEEP_RING_CAP)  # pylint: disable=protected-access
        if deepest > now.knobs.get("pipe_depth", 0):
            out.append({"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16",
                        "shape": [M, N, K], "variant": "now_deep", "knobs": {"pipe_depth": deepest},
                        "held_out": False})
    return out


def pdl_cases() -> list[dict]:
    """The pdl set's timing cases (:data:`PDL_EPILOGUES` x the suite's and the held-out weights x
    :data:`SUITE_MS`): ``now`` (the policy's knobs with ``pdl=False``) and ``pdl`` (with ``pdl=True``) at each."""
    out = []
    for epilogue in PDL_EPILOGUES:
        for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS:
            for M in SUITE_MS:
                case = {"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16",
                        "shape": [M, N, K], "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS}
                out += [{**case, "variant": "now", "knobs": {"pdl": False}},
                        {**case, "variant": "pdl", "knobs": {"pdl": True}}]
    return out


def l2_warm_cases(sms: int = 132) -> list[dict]:
    """The l2_warm set's timing cases (:data:`L2_WARM_EPILOGUES` x (the suite's and the held-out weights x
    :data:`SUITE_MS` up to :data:`L2_WARM_MAX_M`, and :data:`STREAM_SMALL_SAMPLES`) where the policy's bf16 module
    has ``pdl`` and its kernel can warm: ``now`` (the policy's knobs) and ``warm`` (with ``l2_warm=True``) at each."""
    shapes = [(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SUITE_MS if M <= L2_WARM_MAX_M]
    shapes += STREAM_SMALL_SAMPLES
    out = []
    for epilogue in L2_WARM_EPILOGUES:
        for M, N, K in shapes:
            p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", epilogue))
            choice = plan.choose(p)
            # the rung's validator says where the kernel cannot warm (an MN-major or gated B, a misaligned row)
            if not choice.knobs.get("pdl") or plan._validate(  # pylint: disable=protected-access
                    choice.rung, p, {**choice.knobs, "l2_warm": True}) is not None:
                continue
            case = {"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16", "shape": [M, N, K],
                    "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS}
            out += [{**case, "variant": "now", "knobs": {}}, {**case, "variant": "warm", "knobs": {"l2_warm": True}}]
    return out


def bias_stash_cases(sms: int = 132) -> list[dict]:
    """The bias_stash set's timing cases: the suite set's (:func:`suite_cases`, the policy's module, ``now``, whose
    bias is loaded into registers before each tile's K loop where its kernel has a stash) and, where it has one, the
    same knobs with ``bias_stash=False`` (``read``: each value read from global memory where it is added, after the
    tile's last wgmma, as every kernel did before the stash)."""
    from gemm_ladder.rungs import make_config, rung_module  # pylint: disable=import-outside-toplevel
    from gemm_ladder.sm90a import gemm  # pylint: disable=import-outside-toplevel

    out = []
    for case in suite_cases():
        out.append({**case, "set": "bias_stash"})
        p = plan.Problem(*case["shape"], "bfloat16", "sm_90a", sms, spec_for("bfloat16", case["epilogue"]))
        choice = plan.choose(p)
        if gemm.bias_stash_regs(make_config(choice.rung, *case["shape"], **choice.knobs),
                                rung_module(choice.rung).PRESET):
            out.append({**case, "set": "bias_stash", "variant": "read", "knobs": {"bias_stash": False}})
    return out


def narrow_width(M: int, N: int, sms: int = 132) -> int | None:
    """The narrowest whole 16 columns of N whose tiles (of 64 rows of M up to 64, else 128) fit one wave on ``sms``
    SMs, fewer than 256 wide (None: no such width)."""
    width = -(-N // sms // 16) * 16
    while -(-N // width) > sms:
        width += 16
    return width if width < 256 else None


def narrow_n_cases(sms: int = 132) -> list[dict]:
    """The narrow_n set's timing cases (see :data:`NARROW_N_MS`)."""
    fused = [(e, (M, N, K)) for e in ("none", "bias_gelu_tanh") for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS
             for M in NARROW_N_MS]
    out = []
    for epilogue, (M, N, K) in fused + [("none", s) for s in STREAM_SMALL_SAMPLES]:
        width = narrow_width(M, N, sms)
        if width is None:
            continue
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", epilogue))
        case = {"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16", "shape": [M, N, K],
                "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS}
        out.append({**case, "variant": "now"})
        base = {"blk_m": 64 if M <= 64 else 128, "blk_n": width, "num_warpgroups": 1 if M <= 64 else 2,
                "cluster_m": 1, "epi_n": min(64, width), "stream_b": True, "pdl": True}
        pairs = -(-N // width) % 2 == 0
        for name, more, cap in (("v9_narrow_c2", {"cluster_n": 2}, plan.MAX_SMALL_M_DEPTH),
                                ("v9_narrow_c2_deep", {"cluster_n": 2}, DEEP_RING_CAP),
                                ("v9_narrow", {"cluster_n": 1}, plan.MAX_SMALL_M_DEPTH)):
            if more["cluster_n"] == 2 and not pairs:
                continue
            knobs = {**base, **more}
            depth = plan._deepest("v9", p, {**knobs, **spec_knobs(p.spec)}, cap)  # pylint: disable=protected-access
            built = plan.with_spec({**knobs, "pipe_depth": depth, "dynamic_m": True}, p)
            if plan._validate("v9", p, built) is None:  # pylint: disable=protected-access
                out.append({**case, "rung": "v9", "variant": name, "knobs": built})
    return out


def stream_small_cases(sms: int = 132) -> list[dict]:
    """The stream_small set's timing cases: the policy's module and :data:`STREAM_SMALL_CANDIDATES` (no epilogue at
    the suite's and the held-out weights x :data:`STREAM_SMALL_MS` and at :data:`STREAM_SMALL_SAMPLES`; bias+GELU at
    the suite's weights at M = 64 and 128)."""
    weights = [(N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS if N < 100_000]
    plain = [("none", (M, N, K)) for N, K in weights for M in STREAM_SMALL_MS]
    plain += [("none", s) for s in STREAM_SMALL_SAMPLES]
    fused = [("bias_gelu_tanh", (M, N, K)) for N, K in SUITE_WEIGHTS if N < 100_000 for M in (64, 128)]
    return _candidate_cases(plain + fused, set(), sms, STREAM_SMALL_CANDIDATES)


def swap_pair_cases() -> list[dict]:
    """The swap_pairs set's timing cases (:data:`SWAP_PAIR_MS`): ``now`` and ``c1x2`` (its knobs, ``cluster_n=2``)."""
    plain = [("none", (M, N, K)) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SWAP_PAIR_MS]
    plain += [("none", s) for s in STREAM_SMALL_SAMPLES if 16 <= s[0] <= 64]
    fused = [("bias_gelu_tanh", (64, N, K)) for N, K in SUITE_WEIGHTS]
    out = []
    for epilogue, (M, N, K) in plain + fused:
        case = {"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16", "shape": [M, N, K],
                "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS}
        out += [{**case, "variant": "now", "knobs": {}}, {**case, "variant": "c1x2", "knobs": {"cluster_n": 2}}]
    return out


def _candidate_cases(cases_: list[tuple[str, tuple]], swap_shapes: set, sms: int, candidates: dict | None = None,
                     depths: tuple[int, ...] = (plan.MAX_SMALL_M_DEPTH,)) -> list[dict]:
    """At each case, the policy's module (``now``) and each candidate (``candidates``, default the few-tiles or,
    at ``swap_shapes``, the swap ones) the rung's validator takes and that differs from ``now``, at the
    deepest ring it fits up to each of ``depths`` (a name past the first depth ends ``_deep``; one as deep as
    the one before is left out)."""
    out = []
    for epilogue, (M, N, K) in cases_:
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", sms, spec_for("bfloat16", epilogue))
        swap = (M, N, K) in swap_shapes
        now = plan.choose(p)
        seen = {(now.rung, tuple(sorted(now.knobs.items())))}
        out.append({"purpose": "time", "set": "split", "epilogue": epilogue, "dtype": "bfloat16",
                    "shape": [M, N, K], "variant": "now", "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS})
        pool = candidates if candidates is not None else FEW_TILE_SWAP_CANDIDATES if swap else FEW_TILE_CANDIDATES
        for name, (rung, base) in pool.items():
            knobs = ({**base, "blk_m": plan.swap_blk_m(M)} if swap or rung == "v11" else
                     {**base, "cluster_m": 2 if M > base["blk_m"] and base.get("cluster_n", 1) == 1 else 1})
            if knobs.get("split_k", 1) > 1 and K // knobs["split_k"] < 256:
                continue
            depth_before = 0
            for i, cap in enumerate(depths):
                depth = plan._deepest(rung, p, {**knobs, **spec_knobs(p.spec)}, cap)  # pylint: disable=protected-access
                if depth <= depth_before:
                    continue
                depth_before = depth
                built = plan.with_spec({**knobs, "pipe_depth": depth, "dynamic_m": True}, p)
                while knobs.get("k_consumers", 1) > 1 and depth > 2 and plan._validate(rung, p, built) is not None:
                    depth -= 1  # the deepest ring leaves no room for the second consumer's hand-over
                    built = {**built, "pipe_depth": depth}
                key = (rung, tuple(sorted(built.items())))
                if key in seen or plan._validate(rung, p, built) is not None:  # pylint: disable=protected-access
                    continue
                seen.add(key)
                out.append({"purpose": "time", "set": "split", "rung": rung, "epilogue": epilogue,
                            "dtype": "bfloat16", "shape": [M, N, K], "variant": name + ("_deep" if i else ""),
                            "knobs": built, "held_out": (N, K) in HELD_OUT_BIAS_WEIGHTS})
    return out


def split_check_cases() -> list[dict]:
    """:data:`SPLIT_CHECKS` as cases (their rung and knobs given, not the policy's)."""
    return [{"purpose": "check", "set": "split", "rung": rung, "epilogue": e, "dtype": d, "shape": list(s),
             "knobs": {**knobs, "dynamic_m": True}, **({"d": out} if out else {})}
            for rung, e, d, out, s, knobs in SPLIT_CHECKS]


def rules_of(variant: str | None):
    """The rules ``plan_job`` takes for a rule case's variant: the policy's own, less the rules that came after
    the small-M epilogue rule and take its shapes first (:data:`SWAP64_RULES` and :data:`NARROW_N_RULE`,
    2026-11-29), so that the set still measures that rule against the policy before it."""
    later = [r for r in plan.RULES if r.name not in (*SWAP64_RULES, NARROW_N_RULE)]
    if variant == "before":  # without the rule, nor its split form (small-m-split, which takes its tiles)
        return [r for r in later if r.name not in (RULE_NAME, SMALL_SPLIT_RULE)]
    if variant == "probe_64x64":
        return [dataclasses.replace(r, when=lambda p: True) for r in plan.RULES if r.name == RULE_NAME]
    if variant == "probe_64x128":
        blk_m, blk_n = WIDE_PROBE
        return [dataclasses.replace(r, when=lambda p: True,
                                    knobs=lambda p, r=r: {**r.knobs(p), "blk_m": blk_m, "blk_n": blk_n})
                for r in plan.RULES if r.name == RULE_NAME]
    return later


def cases_of(which: str, sms: int = 132) -> list[dict]:
    """What ``prepare --set which`` builds (:data:`CASE_SETS`)."""
    if which not in CASE_SETS:
        raise SystemExit(f"--set {which}: one of {', '.join(CASE_SETS)}")
    if which == "split":
        return split_check_cases() + split_cases(sms)
    if which == "split_probe":
        return split_probe_cases(sms)
    if which == "suite":
        return suite_cases()
    if which == "split_fill":
        return split_fill_cases(sms)
    if which == "few_tiles":
        return few_tile_cases(sms)
    if which == "swap_widths":
        return swap_width_cases(sms)
    if which == "narrow_moved":
        return moved_cases("no_narrow", NARROW_EPILOGUES, sms, NARROW_MS)
    if which == "mid_tiles":
        return mid_tile_cases(sms)
    if which == "deep_rings":
        return deep_ring_cases(sms)
    if which == "swap64_moved":
        suite = [(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SUITE_MS]
        return moved_cases("no_swap64", ("none", "bias_gelu_tanh"), sms, extra=suite)
    if which == "row64_moved":
        return moved_cases(ROW64_VARIANT, sms=sms, extra=[(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS
                                                       for M in SUITE_MS])
    if which == "pdl":
        return pdl_cases()
    if which == "narrow_n":
        return narrow_n_cases(sms)
    if which == "narrow_n_moved":
        from gemm_ladder.measure import every_model  # pylint: disable=import-outside-toplevel  (as later_sample_shapes)

        weights = {(c["N"], c["K"]) for c in every_model.all_cases()}
        extra = {(M, N, K) for N, K in weights for M in NARROW_N_MOVED_MS}
        return moved_cases("no_narrow_n", ("none", "bias_gelu_tanh"), sms, extra=sorted(later_sample_shapes() | extra))
    if which == "l2_warm":
        return l2_warm_cases(sms)
    if which == "bias_stash":
        return bias_stash_cases(sms)
    if which == "swap256_moved":
        from gemm_ladder.measure import every_model  # pylint: disable=import-outside-toplevel  (as later_sample_shapes)

        extra = {(c["M"], c["N"], c["K"]) for c in every_model.all_cases()}
        extra |= {(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SUITE_MS}
        moved = moved_cases(SWAP256_VARIANT, ("none", "bias_gelu_tanh"), sms, extra=sorted(extra))
        # and the candidate launched without PDL (the sweep's 1.024x at 64x28672x4096 was), where it would take it
        return moved + [{**c, "variant": SWAP256_VARIANT + "_nopdl", "knobs": {"pdl": False}}
                        for c in moved if c["variant"] == SWAP256_VARIANT]
    if which == "tile224_moved":
        from gemm_ladder.measure import every_model  # pylint: disable=import-outside-toplevel  (as later_sample_shapes)

        extra = {(c["M"], c["N"], c["K"]) for c in every_model.all_cases()}
        extra |= {(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SUITE_MS}
        return moved_cases("no_tile224", ("none", "bias_gelu_tanh"), sms, extra=sorted(extra))
    if which == "stream_small":
        return stream_small_cases(sms)
    if which == "swap_pairs":
        return swap_pair_cases()
    if which == "swap_wide_moved":
        return moved_cases("no_swap192", ("none", "bias_gelu_tanh"), sms,
                           extra=sorted(later_sample_shapes() | set(SWAP_WIDE_CASES)))
    if which == "swap_wide_m64":
        extra = {(M, N, K) for N, K in SWAP_WIDE_M64_WEIGHTS for M in (32, 48, 64)}
        return moved_cases("wide_to_64", ("none", "bias_gelu_tanh"), sms, extra=sorted(later_sample_shapes() | extra))
    if which == "swap_wide":
        return _candidate_cases([("none", s) for s in SWAP_WIDE_CASES], set(SWAP_WIDE_CASES), sms,
                                SWAP_WIDE_CANDIDATES)
    if which == "fill_tiles":
        fused = [("bias_gelu_tanh", (M, N, K)) for N, K in SUITE_WEIGHTS for M in FILL_TILE_MS]
        return _candidate_cases(fused + [("none", s) for s in FILL_TILE_PLAIN], set(), sms, FILL_TILE_CANDIDATES,
                                (plan.MAX_SMALL_M_DEPTH, DEEP_RING_CAP))
    if which == "swap_mid":
        return swap_mid_cases(sms)
    if which == "swap_mid_more":
        weights = SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS + sorted({(N, K) for _, N, K in SWAP_MID_NARROW})
        extra = {(M, N, K) for N, K in weights for M in SWAP_MID_MORE_MS}
        return moved_cases("no_swap_mid", ("none", "bias_gelu_tanh"), sms, extra=sorted(later_sample_shapes() | extra))
    if which == "swap_mid_narrow":
        return swap_mid_cases(sms, narrow=True)
    if which == "swap_mid_moved":
        extra = {(M, N, K) for N, K in SUITE_WEIGHTS + HELD_OUT_BIAS_WEIGHTS for M in SWAP_MID_MS}
        return moved_cases("no_swap_mid", ("none", "bias_gelu_tanh"), sms, extra=sorted(later_sample_shapes() | extra))
    if which == "mid_moved":
        return moved_cases("no_mid", sms=sms)
    if which == "small_split_moved":
        return moved_cases("no_small_split", ["bias_gelu_tanh"], sms)
    return (cases() if which != "rule" else []) + (rule_cases(sms) if which != "epilogues" else [])


def spec_of_case(case: dict):
    """The operand spec of a case: its epilogue, with D (and the bias) in float32 where it says."""
    spec = spec_for(case["dtype"], case["epilogue"])
    if case.get("d") == "float32":
        spec = dataclasses.replace(spec, d="float32", bias="float32" if spec.bias else None,
                                   residual="float32" if spec.residual else None)
    return spec


def op_of(spec, variant: str | None = None) -> str:
    """A row's ``op``: the epilogue (``fp32_out`` for a float32 D, ``fp32_out+residual`` with a
    residual), and a residual timing variant's suffix (none for ``at_chunk``, the kernel before
    c_prefetch: ``residual``, ``residual_prefetch``, ``residual_prefetch_64x64``; none for the rule's
    variants, which a row's ``rule`` field names)."""
    if spec.d == "float32":
        return "fp32_out+residual" if spec.residual else "fp32_out"
    return spec.epilogue + ("" if variant in (None, "at_chunk", *RULE_VARIANTS, *SPLIT_VARIANTS) else f"_{variant}")


def time_groups(cases_: list[dict]) -> list[list[dict]]:
    """The timing cases grouped by what they compute (epilogue, D's dtype, shape): a group's
    modules (the residual's variants) and the torch peers take turns in the same rounds."""
    groups: dict = {}
    for case in cases_:
        if case["purpose"] == "time":
            groups.setdefault((case.get("set"), case["epilogue"], case.get("d"), tuple(case["shape"])), []).append(case)
    return list(groups.values())


def pack_module(path: Path, folder: Path, name: str) -> None:
    """A built module into ``folder`` as ``name.gz`` (gzip: the exported .so files repeat the same
    runtime code, about 215 KiB each, 35 KiB gzipped; 71 of them would be 15 MiB) and its manifest
    ``name.json``; :func:`unpack_modules` undoes it on the GPU box."""
    with open(path, "rb") as src, gzip.open(folder / (name + ".gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(Path(str(path) + ".json"), folder / (name + ".json"))


def unpack_modules(folder: Path, into: Path) -> Path:
    """Every ``X.so.gz`` of ``folder`` as ``into/X.so`` beside its manifest (``folder`` may be
    read-only, as the GPU box's copy is); ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for packed in sorted(folder.glob("*.so.gz")):
        name = packed.name[:-len(".gz")]
        with gzip.open(packed, "rb") as src, open(into / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copyfile(folder / (name + ".json"), into / (name + ".json"))
    return into


def prepare(out: str, sms: int = 132, which: str = "all") -> int:
    """Build every case's module of set ``which`` (the front door's policy, or for a rule case the
    rules of its variant, :func:`rules_of`; through the module cache, so the .so holds the compiled
    fatbin) and copy it into ``out`` with :data:`PLAN_FILE`."""
    # the build layer: this step runs where TVM's compiler is (the GPU box has the runtime only)
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob
    from gemm_ladder.serve.front import plan_job

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    doc, failed = {"cases": []}, 0
    for case in cases_of(which, sms):
        M, N, K = case["shape"]
        spec = spec_of_case(case)
        try:
            p = plan.Problem(M, N, K, case["dtype"], "sm_90a", sms, spec)
            if case.get("rung"):  # a module of its own rung and knobs (the split set's checks)
                job = BuildJob(case["rung"], (M, N, K), {**case["knobs"], **plan.with_spec({}, p)})
            elif case.get("set") == "split":
                with _variant_context(case["variant"]):
                    choice, job = plan_job(p, rules=variant_rules(case["variant"]))
            else:
                choice, job = plan_job(p, rules=rules_of(case.get("variant")) if case.get("set") == "rule" else None)
            # a policy case's knobs beyond the policy's (before its rung is recorded: until 2026-11-29 the
            # split set's ``now_deep`` knobs were dropped here, and its modules were the policy's own)
            if case.get("knobs") and not case.get("rung"):
                job = dataclasses.replace(job, knobs={**job.knobs, **case["knobs"]})
            if case.get("set") in ("rule", "split") and not case.get("rung"):
                case = {**case, "chosen_by": choice.rule, "rung": job.rung}
            path, _ = module_cache.get_or_build(job)
        except Exception as err:  # pylint: disable=broad-except  (a row that says why)
            print(f"failed: {case}: {err}", file=sys.stderr)
            failed += 1
            continue
        name = f"{path.parent.name}.so"
        if not (folder / (name + ".gz")).exists():
            pack_module(path, folder, name)
        doc["cases"].append({**case, "file": name, "module_knobs": job.knobs, "module_shape": list(job.shape)})
        print(f"{case['purpose']} {spec.text()} {M}x{N}x{K}: {name}")
    files.write_json(folder / PLAN_FILE, doc)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(doc['cases'])} cases, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


# -- the reference (no GPU needed: float64 on any device) -------------------------------------------
def reference(A, B, bias, act: str, alpha: float, C, beta: float):
    """act(alpha . A . B^T + bias) + beta . C in float64, the formula the kernel computes in fp32."""
    z = (A.double() @ B.double().t()) * alpha
    if bias is not None:
        z = z + bias.double()
    z = torch_activation(z, act)
    return z + beta * C.double() if C is not None else z


def within(ours: float, theirs: float) -> bool:
    """Ours within 2x torch's own error on the same formula, or both tiny (1e-2 absolute)."""
    return ours == ours and (ours <= 2.0 * theirs or ours <= 1e-2)


def operands_of(spec, M: int, N: int, seed: int):
    """The epilogue's inputs of a spec: (bias or None, alpha, C or None, beta), in the spec's dtypes."""
    import torch  # pylint: disable=import-outside-toplevel

    g = torch.Generator(device="cuda").manual_seed(seed)
    bias = torch.randn(N, generator=g, device="cuda").to(getattr(torch, spec.bias)) if spec.bias else None
    C = torch.randn(M, N, generator=g, device="cuda").to(getattr(torch, spec.residual)) if spec.residual else None
    return bias, (ALPHA if spec.alpha else 1.0), C, (BETA if spec.residual else 1.0)


def check_one(path: str, M: int, seed: int = 0) -> dict:
    """One module at M rows: into a separate D (poisoned with NaN) and, with a residual, in place."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.front import TorchMatmul  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.runtime import load  # pylint: disable=import-outside-toplevel

    mod = load(path)
    spec, dtype = mod.spec, getattr(torch, mod.dtype)
    N, K = mod.N, mod.K
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
    B = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
    bias, alpha, C, beta = operands_of(spec, M, N, seed + 1)
    d_dtype = getattr(torch, spec.d)
    if spec.gated:  # SwiGLU: silu(A Wg^T) * (A Wu^T), D N / 2 wide; torch: two products, then the halves
        h = A.double() @ B.double().t()
        ref = torch_activation(h[:, :N // 2], spec.act) * h[:, N // 2:]
        theirs = torch_activation(A @ B[:N // 2].t(), spec.act) * (A @ B[N // 2:].t())
        N = N // 2
    else:
        ref = reference(A, B, bias, spec.act, alpha, C, beta)
        theirs = torch.empty(M, N, dtype=d_dtype, device="cuda")
        TorchMatmul(spec.act)(A, B, theirs, bias=bias, alpha=alpha, C=C, beta=beta)
    err_torch = (theirs.double() - ref).abs().max().item()
    kwargs = {k: v for k, v in (("bias", bias), ("alpha", alpha), ("C", C), ("beta", beta)) if v is not None}
    kwargs = {k: v for k, v in kwargs.items() if k in {o.name for o in spec.epilogue_operands()}}
    rows = []
    D = torch.full((M, N), float("nan"), dtype=d_dtype, device="cuda")
    mod(A, B, out=D, **kwargs)
    torch.cuda.synchronize()
    rows.append(("out", D))
    if C is not None:  # in place: D is C
        Cin = C.clone()
        mod(A, B, out=Cin, **{**kwargs, "C": Cin})
        torch.cuda.synchronize()
        rows.append(("in_place", Cin))
    res = {"file": Path(path).name, "M": M, "N": N, "K": K, "dtype": mod.dtype, "d": spec.d,
           "epilogue": spec.epilogue, "err_torch": err_torch}
    ok = True
    for name, out in rows:
        nan = bool(torch.isnan(out).any().item())
        err = (out.double() - ref).abs().max().item()
        res[f"err_{name}"], res[f"nan_{name}"] = err, nan
        ok = ok and not nan and within(err, err_torch)
    if N == K and C is None and not spec.gated and spec.d == mod.dtype:
        ok = check_chained(mod, A, B, kwargs, res, (bias, alpha)) and ok
    if mod.knobs.get("l2_warm") and C is None and not spec.gated:
        ok = check_weight_written(mod, A, B, kwargs, res, (bias, alpha)) and ok
    res["status"] = "ok" if ok else "wrong"
    return res


def check_chained(mod, A, B, kwargs: dict, res: dict, bias_alpha) -> bool:
    """Two calls back to back where the second reads the first's D and writes over the first's A (square
    weights, no residual), eagerly and replayed from a CUDA graph: with programmatic dependent launch (the
    ``pdl`` knob) the second kernel starts under the first, so a read of its input before the first has
    finished, or a write over what the first still reads, shows here. Each product against float64 of the
    input it was given; adds ``err_chain_*`` to ``res``."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.front import TorchMatmul  # pylint: disable=import-outside-toplevel

    bias, alpha = bias_alpha
    act = mod.spec.act
    x0 = A.clone()

    extras = [kwargs[o.name] for o in mod.spec.epilogue_operands()]
    launch = mod.launcher(x0, B, torch.empty_like(x0), **kwargs)  # the kernel alone, as the timing runs it

    def two(bufs):
        launch(bufs[0], B, bufs[1], *extras)  # x1 = f(x0)
        launch(bufs[1], B, bufs[0], *extras)  # x2 = f(x1), over x0

    ok = True
    for how in ("eager", "graph"):
        bufs = [x0.clone(), torch.full_like(x0, float("nan"))]
        if how == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                two(bufs)
            bufs[0].copy_(x0)
            bufs[1].fill_(float("nan"))
            graph.replay()
        else:
            two(bufs)
        torch.cuda.synchronize()
        x1, x2 = bufs[1].clone(), bufs[0].clone()
        for step, (given, got) in enumerate(((x0, x1), (x1, x2)), 1):
            ref = reference(given, B, bias, act, alpha, None, 1.0)
            theirs = torch.empty_like(got)
            TorchMatmul(act)(given, B, theirs, bias=bias, alpha=alpha)
            err_torch = (theirs.double() - ref).abs().max().item()
            err = (got.double() - ref).abs().max().item()
            res[f"err_chain_{how}_{step}"] = err
            ok = ok and not bool(torch.isnan(got).any().item()) and within(err, err_torch)
    return ok


def check_weight_written(mod, A, B, kwargs: dict, res: dict, bias_alpha) -> bool:
    """A call right after a kernel that writes its weight (``W.copy_(new)``, a weight update), eagerly and replayed
    from a CUDA graph: with ``l2_warm`` the kernel asks L2 for B's first slices before it waits for the grid before
    it, so a stale line kept past that write would show here. The product against float64 of the new weight; adds
    ``err_weight_*`` to ``res``."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.front import TorchMatmul  # pylint: disable=import-outside-toplevel

    bias, alpha = bias_alpha
    act = mod.spec.act
    extras = [kwargs[o.name] for o in mod.spec.epilogue_operands()]
    d_dtype = getattr(torch, mod.spec.d)
    launch = mod.launcher(A, B, torch.empty(A.shape[0], mod.N, dtype=d_dtype, device="cuda"), **kwargs)
    new = (-B).contiguous()  # every product changes sign: an old line of B anywhere is a wrong D
    ref = reference(A, new, bias, act, alpha, None, 1.0)
    theirs = torch.empty(A.shape[0], mod.N, dtype=d_dtype, device="cuda")
    TorchMatmul(act)(A, new, theirs, bias=bias, alpha=alpha)
    err_torch = (theirs.double() - ref).abs().max().item()
    ok = True
    for how in ("eager", "graph"):
        W = B.clone()
        D = torch.full((A.shape[0], mod.N), float("nan"), dtype=d_dtype, device="cuda")

        def two(W=W, D=D):
            W.copy_(new)  # the weight written by the kernel before ours
            launch(A, W, D, *extras)
        if how == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                two()
            W.copy_(B)
            D.fill_(float("nan"))
            graph.replay()
        else:
            launch(A, W, D, *extras)  # the old weight's product first: its lines are in L2
            two()
        torch.cuda.synchronize()
        err = (D.double() - ref).abs().max().item()
        res[f"err_weight_{how}"] = err
        ok = ok and not bool(torch.isnan(D).any().item()) and within(err, err_torch)
    return ok


def check_isolated(jobs: list[tuple[Path, int]]) -> list[dict]:
    """:func:`check_one` of every (module, M) in child processes, one after another in each (a
    child's start costs seconds): a module that gives no result within :data:`CHECK_TIMEOUT` (a
    hang) or kills its child (a crash) is a row, and a new child goes on with the next."""
    results: list[dict] = []
    while len(results) < len(jobs):
        rest = jobs[len(results):]
        cmd = [sys.executable, __file__, "check-many", *[f"{p}:{M}" for p, M in rest]]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        # this child's queue and pipe bound now: a killed child's reader ends later, into its own queue
        threading.Thread(target=lambda q=lines, p=proc: [q.put(x) for x in p.stdout] + [q.put(None)], daemon=True).start()
        got = 0
        while got < len(rest):
            try:
                line = lines.get(timeout=CHECK_TIMEOUT + (60 if got == 0 else 0))  # the first: the child's start
            except queue.Empty:
                proc.kill()
                results.append({"file": rest[got][0].name, "M": rest[got][1], "status": "timeout"})
                break
            if line is None:  # the child died: this module crashed it
                proc.wait()
                results.append({"file": rest[got][0].name, "M": rest[got][1], "status": "crash",
                                "detail": (proc.stderr.read() or "")[-800:]})
                break
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
                got += 1
        else:
            proc.wait()
    return results


# -- timing -----------------------------------------------------------------------------------------
def peers(epilogue: str):
    """torch's paths for an epilogue, each ``fn(A, W, D, bias, C)`` writing D."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    if epilogue == "swiglu":  # silu(x Wg^T) * (x Wu^T), W_gu = cat([Wg, Wu])
        def two_linears(a, w, d, b, c):  # HF's LlamaMLP: gate_proj, up_proj apart
            n = w.shape[0] // 2
            torch.mul(F.silu(F.linear(a, w[:n])), F.linear(a, w[n:]), out=d)

        def fused_weight(a, w, d, b, c):  # one product with W_gu, then the halves
            g, u = F.linear(a, w).chunk(2, dim=-1)
            torch.mul(F.silu(g), u, out=d)
        return {"two_linears": two_linears, "fused_weight": fused_weight}
    if epilogue == "fp32_out":  # D = A . W^T in float32
        def mm_out_dtype(a, w, d, b, c):  # torch's own float32-output GEMM (torch >= 2.8), where it exists
            torch.mm(a, w.t(), out_dtype=torch.float32, out=d)
        found = {"linear_then_float": lambda a, w, d, b, c: d.copy_(F.linear(a, w))}
        try:
            probe = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
            torch.mm(probe, probe, out_dtype=torch.float32)
            found["mm_out_dtype"] = mm_out_dtype
        except (TypeError, RuntimeError):
            pass
        return found
    if epilogue == "fp32_out+residual":  # D = A . W^T + C, C and D float32
        def mm_then_add(a, w, d, b, c):
            torch.add(c, torch.mm(a, w.t(), out_dtype=torch.float32), out=d)

        def addmm_out_dtype(a, w, d, b, c):  # torch's fused form, where it exists
            torch.addmm(c, a, w.t(), out_dtype=torch.float32, out=d)
        found = {"linear_then_add": lambda a, w, d, b, c: torch.add(c, F.linear(a, w), out=d)}
        probe = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        for name, fn in (("mm_out_dtype_then_add", mm_then_add), ("addmm_out_dtype", addmm_out_dtype)):
            try:
                fn(probe, probe, torch.empty(16, 16, device="cuda"), None, torch.zeros(16, 16, device="cuda"))
                found[name] = fn
            except (TypeError, RuntimeError, NotImplementedError):  # not in this torch
                pass
        return found
    if epilogue == "bias_gelu_tanh":  # no residual (the small-M rule's third epilogue)
        def lt_out(a, w, d, b, c):  # cuBLASLt's fused bias + GELU (tanh) into D
            torch._addmm_activation(b, a, w.t(), use_gelu=True, out=d)  # pylint: disable=protected-access

        def addmm_then_gelu(a, w, d, b, c):
            torch._C._nn.gelu(torch.addmm(b, a, w.t()), approximate="tanh", out=d)  # pylint: disable=protected-access
        return {"addmm_activation": lt_out, "unfused": addmm_then_gelu}
    if epilogue == "none":
        return {"mm": lambda a, w, d, b, c: torch.mm(a, w.t(), out=d)}
    if epilogue == "bias_relu":  # cuBLASLt fuses the ReLU too
        def lt_relu(a, w, d, b, c):
            torch._addmm_activation(b, a, w.t(), use_gelu=False, out=d)  # pylint: disable=protected-access
        return {"addmm_activation": lt_relu, "unfused": lambda a, w, d, b, c: torch.relu_(torch.addmm(b, a, w.t(), out=d))}
    if epilogue == "bias":
        return {"addmm": lambda a, w, d, b, c: torch.addmm(b, a, w.t(), out=d)}
    if epilogue == "residual":
        return {"addmm": lambda a, w, d, b, c: torch.addmm(c, a, w.t(), out=d),
                "unfused": lambda a, w, d, b, c: torch.add(F.linear(a, w), c, out=d)}

    def lt(a, w, d, b, c):  # cuBLASLt's fused bias + GELU (tanh), then the residual
        torch.add(torch._addmm_activation(b, a, w.t(), alpha=ALPHA, use_gelu=True), c, alpha=BETA, out=d)  # pylint: disable=protected-access

    def unfused(a, w, d, b, c):  # addmm (bias and alpha in cuBLAS), then the activation, then the residual
        torch.add(F.gelu(torch.addmm(b, a, w.t(), alpha=ALPHA), approximate="tanh"), c, alpha=BETA, out=d)
    return {"addmm_activation": lt, "unfused": unfused}


def time_group(folder: Path, group: list[dict], rounds: int, per_round: int) -> list[dict]:
    """Our modules of one group (:func:`time_groups`) and the torch peers at one shape, kernel level
    (graphs) and call level (queued), in rounds: one row per module."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.runtime import load  # pylint: disable=import-outside-toplevel

    mods = {case.get("variant") or "ours": load(folder / case["file"]) for case in group}
    case = group[0]
    M, N, K = case["shape"]
    dtype, spec = getattr(torch, case["dtype"]), next(iter(mods.values())).spec
    n_sets = harness.sets_to_spill_l2(M, N, K, torch.cuda.get_device_properties(0).L2_cache_size)
    sets = []
    for i in range(max(2, n_sets)):
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
        W = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
        bias, _, C, _ = operands_of(spec, M, N, 200 + i)
        d_cols = N // 2 if spec.gated else N
        sets.append((A, W, torch.empty(M, d_cols, dtype=getattr(torch, spec.d), device="cuda"), bias, C))
    names = [o.name for o in spec.epilogue_operands()]
    vals = {"alpha": ALPHA, "beta": BETA if spec.epilogue != "residual" else 1.0}
    a0, w0, d0, b0, c0 = sets[0]

    def ours_of(mod):
        launch = mod.launcher(a0, w0, d0, **{n: {"bias": b0, "C": c0}.get(n, vals.get(n)) for n in names})

        def kernel(a, w, d, b, c):
            launch(a, w, d, *[{"bias": b, "C": c}.get(n, vals.get(n)) for n in names])

        def call(a, w, d, b, c):
            mod(a, w, out=d, **{n: {"bias": b, "C": c}.get(n, vals.get(n)) for n in names})
        return kernel, call

    ours = {name: ours_of(mod) for name, mod in mods.items()}
    kernels = {**{name: k for name, (k, _) in ours.items()}, **peers(op_of(spec))}
    call_fns = {**kernels, **{name: c for name, (_, c) in ours.items()}}
    calls = max(len(sets), 20)
    for fn in kernels.values():
        harness.graph_times(fn, sets, 2, calls)  # capture, warm up
    kernel_ms: dict = {n: [] for n in kernels}
    call_ms: dict = {n: [] for n in kernels}
    for r in range(rounds):
        order = list(kernels) if r % 2 == 0 else list(kernels)[::-1]
        for n in order:
            kernel_ms[n] += harness.graph_times(kernels[n], sets, per_round, calls)
        for n in order:
            call_ms[n] += harness.event_times(call_fns[n], sets, per_round * 4, start=r)
    kmed = {n: statistics.median(v) for n, v in kernel_ms.items()}
    cmed = {n: statistics.median(v) for n, v in call_ms.items()}
    theirs = [n for n in kernels if n not in ours]
    rows = []
    for c in group:
        name = c.get("variant") or "ours"
        row = {"op": op_of(spec, c.get("variant")), "M": M, "N": N, "K": K, "dtype": case["dtype"], "file": c["file"],
               "knobs": c.get("module_knobs"),
               "kernel_ratio": min(kmed[n] for n in theirs) / kmed[name],
               "call_ratio": min(cmed[n] for n in theirs) / cmed[name],
               "kernel_ms": kmed, "call_ms": cmed}
        for n in theirs:
            row[f"kernel_ratio_{n}"], row[f"call_ratio_{n}"] = kmed[n] / kmed[name], cmed[n] / cmed[name]
        if "at_chunk" in ours:  # the C-ahead variants against the kernel before them, same rounds
            row["vs_at_chunk"] = {"kernel": kmed["at_chunk"] / kmed[name], "call": cmed["at_chunk"] / cmed[name]}
        if c.get("set") in ("rule", "split"):  # a policy's variant, who chose it, against the policy before
            base = "before" if "before" in ours else "unchanged"
            row.update({"rule": name, "chosen_by": c.get("chosen_by"), "rung": c.get("rung"),
                        **({"held_out": c["held_out"]} if "held_out" in c else {})})
            if base in ours:
                row["vs_policy_before"] = {"kernel": kmed[base] / kmed[name], "call": cmed[base] / cmed[name]}
        rows.append(row)
    return rows


def run(folder: str, out: str, rounds: int = ROUNDS, per_round: int = PER_ROUND) -> int:
    """Checks first (isolated), then timing of the modules whose checks passed; writes ``out``. The
    modules are unpacked (:func:`unpack_modules`) into a temporary folder first."""
    if "epilogue" not in Path(out).name:
        raise SystemExit(f"--out {out}: the results file's name must contain 'epilogue' (issue 31's format)")
    doc = json.loads((Path(folder) / PLAN_FILE).read_text())
    with tempfile.TemporaryDirectory(prefix="epilogue_check_") as tmp:
        return _run(doc, unpack_modules(Path(folder), Path(tmp)), out, rounds, per_round)


def _run(doc: dict, folder_p: Path, out: str, rounds: int, per_round: int) -> int:
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    t0, gpu_start = time.time(), harness.gpu_info(0)  # clocks and power before, and after (below)
    checks, passed = [], set()
    results = check_isolated([(folder_p / case["file"], case["shape"][0]) for case in doc["cases"]])
    for case, res in zip(doc["cases"], results):
        M = case["shape"][0]
        res = {**res, "purpose": case["purpose"]}
        checks.append(res)
        if res["status"] == "ok":
            passed.add((case["file"], M))
        print(f"check {case['epilogue']} {case['dtype']} -> {case.get('d', case['dtype'])} "
              f"{'x'.join(map(str, case['shape']))}: {res['status']} "
              f"{ {k: v for k, v in res.items() if k.startswith('err')} }", flush=True)
    rows = []
    for group in time_groups(doc["cases"]):
        good = [c for c in group if (c["file"], c["shape"][0]) in passed]
        for case in group:
            if case not in good:
                M, N, K = case["shape"]
                rows.append({"op": op_of(spec_of_case(case), case.get("variant")), "M": M, "N": N, "K": K,
                             "dtype": case["dtype"], "kernel_ratio": None, "call_ratio": None,
                             "skipped": "check failed",
                             **({"rule": case["variant"], "chosen_by": case.get("chosen_by")}
                                if case.get("set") in ("rule", "split") else {})})
        for row in time_group(folder_p, good, rounds, per_round) if good else []:
            rows.append(row)
            ahead = f", {row['vs_at_chunk']['kernel']:.3f}x C at each chunk" if "vs_at_chunk" in row else ""
            if "rule" in row:
                ahead = f" [{row['rule']}, {row['chosen_by']}]" + (
                    f", {row['vs_policy_before']['kernel']:.3f}x the policy before" if "vs_policy_before" in row else "")
            print(f"time {row['op']} {row['M']}x{row['N']}x{row['K']}: kernel {row['kernel_ratio']:.3f}x, "
                  f"call {row['call_ratio']:.3f}x the best torch path{ahead}", flush=True)
    result = {"gpu_start": gpu_start, "gpu": harness.gpu_info(0), "run": harness.run_info(), "seconds": time.time() - t0,
              "checks": checks, "rows": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    files.write_record(Path(out), result)
    bad = [c for c in checks if c["status"] != "ok"]
    print(f"{len(checks) - len(bad)} of {len(checks)} checks ok; {len(rows)} rows in {out} ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the modules into DIR (build box)")
    p.add_argument("dir")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--set", dest="which", choices=CASE_SETS, default="all",
                   help="all (default), epilogues (every check and timing but the rule's), rule (the small-M "
                        "epilogue rule's timings alone), split (v10's and v11's epilogues checked, and timed against "
                        "the policy before them), split_probe (split-K and stream-K for an epilogue past the small "
                        "M), suite (bias+GELU and bias+ReLU at the shape suite's weights and M, and held out), split_fill (the plain "
                        "shapes the split-k fill threshold moved, against the rule without it), few_tiles (the weakest "
                        "bias+GELU shapes against candidate tiles and splits), swap_widths (swap AB's widths and splits "
                        "at M <= 32), narrow_moved and small_split_moved (the shapes those two rules moved, against "
                        "the policy without each), pdl (each module with and without programmatic dependent launch), "
                        "stream_small (v10 stream-K under one wave at small M), swap_pairs (swap AB's A shared by a 1x2 "
                        "cluster), swap_wide (swap AB in 192 and 256 rows of N), swap_wide_moved (the shapes plan's "
                        "swap-ab-192 moves, against the policy without it), swap_wide_m64 (that rule up to M = 64)")
    r = sub.add_parser("run", help="check and time them (GPU box)")
    r.add_argument("dir")
    r.add_argument("--out", required=True)
    r.add_argument("--rounds", type=int, default=ROUNDS)
    r.add_argument("--per-round", type=int, default=PER_ROUND)
    c = sub.add_parser("check-many", help="(internal) modules' checks, in a child process")
    c.add_argument("jobs", nargs="+", help="PATH:M")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args.dir, args.sms, args.which)
    if args.cmd == "run":
        return run(args.dir, args.out, args.rounds, args.per_round)
    for job in args.jobs:
        path, M = job.rsplit(":", 1)
        try:
            res = check_one(path, int(M))
        except Exception as err:  # pylint: disable=broad-except  (a row that says why)
            res = {"file": Path(path).name, "M": int(M), "status": "error", "detail": f"{type(err).__name__}: {err}"}
        print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
