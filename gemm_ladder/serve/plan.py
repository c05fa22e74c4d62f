"""Which kernel for a shape: the tuning database by shape bucket, else the rules below; and what a
tensor needs before TMA can read it.

The front door (:func:`gemm_ladder.matmul`) asks :func:`choose` for a rung and its knobs, and
:func:`layout_fixes` for the copies a tensor needs. Both are data plus small pure functions, so
each rule has its own test and a new rung is one more table entry.

**Rules.** :data:`RULES` is an ordered list of :class:`Rule`; the first whose rung has a form
for the arch, whose ``when`` holds for the problem and whose knobs the validator accepts, wins. A
rule passed over is kept with the reason for ``explain``. Today's table (Hopper; Blackwell takes
v9's defaults)::

    rule              when                            rung, knobs                               why
    swap-ab-64        32 < M <= 64, N / 64 tiles       v11: swap-ab-narrow's knobs, all M rows   the most CTAs streaming
                      times the split in one wave; no  as wgmma's N (64)                         B; faster at all 35
                      epilogue or bias/act/alpha                                                 shapes it moved
    long-k-split      64 < M <= 128, K > 8192, 64x128  v10: 64x128 tiles, one consumer, 2x1      1.05-1.07x swap AB's
                      tiles split in two in one wave;  clusters, split_k 2, ring <= 8            128 rows split in 3
                      no epilogue or bias/act/alpha
    small-m-split     as small-m-epilogue, no          v10: its tiles and knobs, split_k 2       twice the CTAs
                      residual, tiles fill <= half                                               stream B; a short K
                      the SMs, K >= 3072                                                         or a second wave lose
    small-m-epilogue  an epilogue call (16-bit D, not  v9: 64x64 tiles, one consumer, a 2x1     more CTAs stream B
                      gated), 32 < M <= 128, 64x64     cluster for two row tiles (M > 64), the   (the others leave
                      tiles that fit in one wave; no   deepest ring (<= 8)                       16-64 of them); v11
                      residual: K <= 8192                                                        builds no residual
    row-tiles         32 < M <= 128, 32 or more        v9: 64x128 tiles, one consumer, a 2x1     each CTA streams its own
                      64x128 tiles that fit in one     cluster for two row tiles (M > 64), the   rows of A against a slice
                      wave, and K <= 8192              deepest ring (<= 8)                       of B: no split, no swap
    swap-ab-narrow    M <= 32, N / 64 tiles times the  v11: 64 rows of N, one consumer, split    twice the CTAs of
                      split fit in one wave            until 96 CTAs, slices >= 768 of K         128 rows stream B
    swap-ab-192       M <= 64, N / 192 tiles times the v11: 192 rows of N, one consumer, split   1.00-1.40x swap-ab's
                      split in one wave, swap-ab's     until 48 CTAs, the deepest ring (<= 8)    128 rows at every
                      grid <= 3/4 of the SMs (and not                                            shape it moves (>= 1.05
                      the narrow swap's)                                                         at 84 of 86 pairs)
    swap-ab           M <= 64                          v11: blk_m a power of two >= M (8..64),   reading B is the whole
                                                       blk_n 128, the deepest ring (<= 8),       cost: N fills the MMA's
                                                       split_k until 48 CTAs stream B            64 rows
    weight-streaming  M <= 64 (without v11)            v9, 64-row tiles, one consumer, blk_n by  as many CTAs as the tiles
                                                       makespan, the deepest ring (<= 8)         allow stream B at once
    swap-ab-128       64 < M <= 128                    v11: blk_m 128, blk_n 128, split_k        as swap-ab, for B too
                                                       until 96 CTAs stream B                    large for row-tiles
    tile-224          M > 128 and 128x224 tiles finish v9: 128x224 tiles, epi_n 32, depth 4,     224 columns fill the
                      no later than 128x256's, the     2x1 cluster; epi_under where tiles > SMs  waves where 256 leave
                      other tiles' and stream-K's                                                a ragged last one
                      (makespan)
    stream-k          M > 128, a partial last wave     v10 stream_k: v9's tiles, the last        the last wave's idle SMs
                      of 2x1 clusters, and stream-K    wave's K slices dealt out over every      outweigh two meets of
                      finishes >= 1% sooner than the   cluster                                   partial sums a CTA
                      best v9 tile (makespan)
    split-k           M > 64, the wave model finishes  v10: 128x256 or 128x128 tiles and the     too few tiles for whole
                      sooner split, each split keeps   split_k the model ranks first             waves: split the K loops
                      >= 4096 of K, and 128x128 tiles
                      fill at most half the SMs
    mid-tiles(-split) M > 128, 128x128 tiles fill <=   64x128 or 64x64, one consumer, B          12-64 CTAs of 128x128
                      half the SMs, no split-k: the    streamed, 2x1 clusters; v10 split in two  ran 0.40-0.68x cuBLAS;
                      64-row tile and split (1, 2;     where a slice keeps >= 1536 of K (v9      the 64-row tiles that
                      2 without a residual) with the   whole otherwise)                          fill the SMs 0.76-0.94x
                      most CTAs in one wave
    tile-shape        M > 64 and 128x192 or 128x128    v9 with that tile and the deepest ring    fewer tiles than SMs, or
                      tiles finish first (makespan     it fits (6 for 128x128)                   a ragged last wave
                      over the tile's measured rate)
    large             otherwise                        v9 defaults (128x256, 2 consumers,        measured 0.95-1.05x
                                                       depth 4, 2x1 cluster, epi_n 64); with     cuBLAS on squares;
                                                       epi_under where tiles > SMs               epi_under +0.4-2.8%

An fp8 problem (its spec's operands are e4m3: ``scaled_mm``'s) takes :data:`FP8_RULES` instead, and asks
the tuning database for entries of its own spec only (``tune --dtype float8_e4m3``: knobs timed against
``torch._scaled_mm``); a 16-bit entry's knobs are never an fp8 kernel's.

The small-M rules (swap-ab-64 to swap-ab-128) and the mid-tiles rules also set ``stream_b``: B's loads evict first
from L2, A's last, with 256-byte L2 fills (+1.6-6.3% as kernels at 18 of the suite's 20 cases
with M <= 128, ``benchmarks/results/2026-11-22_h100_stream_b/``).

The thresholds are measurements, not guesses: ``benchmarks/results/2026-11-22_h100_shape_sweep/``
timed every candidate of the suite's weak cases as a kernel alone (CUDA graphs) against cuBLAS.
Split K lost wherever each split kept less than 4096 of K (1024^3, M = 128 and 512 at K = 4096)
and won at K = 14336; v11 streams best with 128-row tiles and an 8-deep ring, split until about
48 CTAs (M <= 64) or 96 (M = 128) read B; 64-row v9 tiles beat both while they fit in one wave.

The wave model is ``schedulers.wave_model`` (tiles, split-K units, waves, and what bounds each:
DRAM, an SM's read rate, the tensor cores); its numbers go into ``explain``. *Makespan in tile
units* (:func:`makespan`) is its wave quantization alone: a persistent grid of ``sms`` CTAs runs
``ceil(tiles / sms)`` waves, each costing one tile's area over the tile's rate
(:data:`TILE_RATE`: a 128x128 tile does less work per wgmma and per byte of shared memory read),
and the larger tile wins a tie.

A new rung plugs in as a :class:`Rule` where it should take precedence, with its test in
``tests/test_plan.py``; a rule whose rung is missing is passed over (the ladder falls back).

A grouped weight (v12, mixture of experts) is not a :class:`Problem`: :func:`grouped_choices` gives
it a decode module and prefill modules and the token counts each serves (the rules and their
evidence are beside it), for the kernel packs (``kernel_pack.plan_grouped``).

**The tuning database** (``gemm_ladder.serve.tuning_db``) is asked first: its best entry in the shape's
bucket (every dim rounded to a power of two) replaces the rule's choice, by ratio to cuBLAS. A
measured entry beats a rule that rests on a model alone, whatever its rung; against a rule with
committed measurements (``Rule.evidence``) only entries of rungs at or above the rule's count,
since the ladder has moved past the others (v9 at its defaults beats the v6 entries the database
holds for 4096^3 and 8192^3).

**Layout.** What a tensor needs before TMA can read it (padding, clones, a staged output) is
:mod:`gemm_ladder.serve.tma_layout`'s.

Importing this module imports no TVM and no torch (``schedulers``' wave model is plain Python);
the tuning database it reads is :mod:`gemm_ladder.serve.tuning_db`, which the tuner writes.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

from schedulers import wave_model

from ..core import device
from ..core.budget import fp8_unroll_fits, max_pipe_depth
from ..core.config import DEFAULT_ARCH, DEFAULT_DTYPE, DTYPE_BYTES, LARGEST_TILE, ConfigError, GemmConfig, check_extents
from ..core.device import MODEL_MACHINE
from ..core.spec import FP8_DTYPES, GemmSpec, spec_knobs
from ..rungs import available, make_config
from . import tuning_db as tdb

MODEL_ONLY = "model only: not yet measured"
# the small-M rules stream B past a few rows of A (sm90a/producer.load_hints; see the docstring)
STREAM_B = {"stream_b": True}
MAX_SMALL_M_DEPTH = 8  # stages a 64-row tile may take for weight streaming (more hides no more latency)


@dataclass(frozen=True)
class Problem:
    """The question a rule answers: D[M, N] = A[M, K] . B[N, K]^T on ``sms`` SMs of ``arch``."""

    M: int
    N: int
    K: int
    dtype: str = DEFAULT_DTYPE
    arch: str = DEFAULT_ARCH
    sms: int = 132
    spec: GemmSpec | None = None  # the operands (gemm_ladder.core.spec); None: dtype in and out, no epilogue

    def tiles(self, blk_m: int, blk_n: int) -> int:
        return math.ceil(self.M / blk_m) * math.ceil(self.N / blk_n)

    def waves(self, blk_m: int, blk_n: int) -> int:
        return math.ceil(self.tiles(blk_m, blk_n) / self.sms)

    @property
    def bytes_moved(self) -> int:
        """A, B and D once each: the least DRAM traffic of any kernel."""
        return (self.M * self.K + self.N * self.K + self.M * self.N) * DTYPE_BYTES[self.dtype]

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


# v9's kernel-only rate per tile shape, relative to 128x256, where waves do not matter (many
# of them): 8192x28672x4096 0.99 / 0.86, 8192x4096x4096 0.98 / 0.89, 512x128256x4096 1.02 / 0.88
# (128x192 / 128x128; benchmarks/results/2026-11-22_h100_shape_sweep/); 128x224's is taken as 128x192's (not measured
# alone: the tile-224 rule's evidence is its moved run)
TILE_RATE = {(128, 256): 1.0, (128, 224): 0.98, (128, 192): 0.98, (128, 128): 0.87}


def makespan(p: Problem, blk_m: int, blk_n: int) -> float:
    """Waves x tile area over the tile's rate: the time of a persistent grid in units of one
    element's K loop at 128x256's rate."""
    return p.waves(blk_m, blk_n) * blk_m * blk_n / TILE_RATE.get((blk_m, blk_n), 1.0)


def best_tile(p: Problem, tiles) -> tuple[int, int]:
    """The ``(blk_m, blk_n)`` of ``tiles`` (largest first) with the least :func:`makespan`; the
    first (largest) on a tie."""
    return min(tiles, key=lambda t: makespan(p, *t))  # min keeps the first of equals


def _deepest(rung: str, p: Problem, knobs: dict, cap: int) -> int:
    """The deepest ring shared memory allows for these knobs (the arch table's limit), up to ``cap``."""

    fields = set(GemmConfig.__dataclass_fields__)
    cfg = GemmConfig(rung=rung, M=p.M, N=p.N, K=p.K, dtype=p.dtype, arch=p.arch,
                     **{k: v for k, v in knobs.items() if k in fields},
                     extra=tuple(sorted((k, v) for k, v in knobs.items() if k not in fields)))
    return max(2, min(cap, max_pipe_depth(cfg)))


# -- the rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One line of the heuristic: when it applies, the rung and knobs it picks, and why.

    ``knobs(problem)`` gives the rung knobs (dtype and arch are added); ``evidence`` names the
    committed results behind the choice, or says it is a model's choice not yet measured.
    """

    name: str
    arch: str
    rung: str
    when: Callable[[Problem], bool]
    knobs: Callable[[Problem], dict]
    why: str
    evidence: str = MODEL_ONLY
    detail: Callable[[Problem], str] | None = None  # the model's numbers for this problem, for explain

    @property
    def measured(self) -> bool:
        return self.evidence != MODEL_ONLY


def _small_m_knobs(p: Problem) -> dict:
    # not 64x64: v9 stages a 64-column epilogue chunk that TVM 0.27 cannot place 128 B-aligned then
    blk_m, blk_n = best_tile(p, [(64, 256), (64, 128)])
    knobs = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 1, "epi_n": 64}
    return {**knobs, "pipe_depth": _deepest("v9", p, knobs, MAX_SMALL_M_DEPTH), **STREAM_B}


SQUARE_TILES = [(128, 256), (128, 192), (128, 128)]


def _tile_shape(p: Problem) -> bool:
    return p.M > 64 and best_tile(p, SQUARE_TILES) != (128, 256)


def _tile_shape_knobs(p: Problem) -> dict:
    """The tile of least makespan, with the deepest ring it fits (128x128: 6 stages, not v9's 4:
    0.80 -> 0.93x cuBLAS at 512x4096x4096, benchmarks/results/2026-11-22_h100_shape_sweep_depth/)."""
    knobs = dict(zip(("blk_m", "blk_n"), best_tile(p, SQUARE_TILES)))
    return {**knobs, "pipe_depth": _deepest("v9", p, knobs, MAX_SMALL_M_DEPTH)}


ROW_TILES_MAX_K, ROW_TILES_MIN = 8192, 32  # longer K, or fewer 64x128 tiles: v11 splits K instead


def _row_tiles(p: Problem) -> bool:
    return 32 < p.M <= 128 and ROW_TILES_MIN <= p.tiles(64, 128) <= p.sms and p.K <= ROW_TILES_MAX_K


def _row_tile_knobs(p: Problem) -> dict:
    # two row tiles (M > 64): a 2x1 cluster multicasts B to both, so each slice of B leaves L2 once
    # (with stream_b's evict-first, an unshared second read would miss: 0.81 -> 0.77 at 128x6144x4096,
    # 0.95 with the pair; benchmarks/results/2026-11-22_h100_stream_b/)
    knobs = {"blk_m": 64, "blk_n": 128, "num_warpgroups": 1, "cluster_m": 2 if p.M > 64 else 1, "cluster_n": 1,
             "epi_n": 64}
    return {**knobs, "pipe_depth": _deepest("v9", p, knobs, MAX_SMALL_M_DEPTH), **STREAM_B}


# -- rules that ask the wave model (schedulers.wave_model: tiles, split-K units, waves, and what
# bounds each; imported on first use, build boxes only)
MAX_SWAP_DEPTH = 8  # v11's ring: as deep as shared memory allows, up to 8 (deep rings keep B in flight)


def _waves(p: Problem, tiles, split_ks=(1, 2, 3, 4, 6, 8), pipe_depth: int = 4):
    return wave_model.rank(p.M, p.N, p.K, tiles, split_ks, pipe_depth, wave_model.with_sms(wave_model.H100, p.sms))[0]


def swap_blk_m(M: int) -> int:
    """v11's tile height (wgmma's N) for M rows: a power of two from 8 to 64, so that one module
    serves a range of M (1-8, 9-16, 17-32, 33-64)."""
    return min(64, max(8, 1 << (M - 1).bit_length()))


SWAP_BLK_N = 128  # an 8-deep ring fits beside 128 rows of N; 256 rows leave room for 4-6 stages
SWAP_STREAMS = {64: 48, 128: 96}  # CTAs that should read B at once, by the largest M of the rule
MAX_SPLIT_K = 8


def swap_split_k(p: Problem, blk_n: int = SWAP_BLK_N) -> int:
    """v11's split_k: the fewest K slices that give at least :data:`SWAP_STREAMS` CTAs streaming
    B (each split costs a round of fp32 partials; past that many streams it no longer pays)."""
    target = SWAP_STREAMS[64 if p.M <= 64 else 128]
    tiles = math.ceil(p.N / blk_n)
    return max(1, min(MAX_SPLIT_K, math.ceil(target / tiles), p.K // 64))


def _swap_knobs(p: Problem, blk_m: int | None = None) -> dict:
    bm = blk_m or swap_blk_m(p.M)
    knobs = {"blk_m": bm, "blk_n": SWAP_BLK_N, "split_k": swap_split_k(p)}
    return {**knobs, "pipe_depth": _deepest("v11", p, knobs, MAX_SWAP_DEPTH), **STREAM_B}


def _swap_detail(blk_n: int, split_k: Callable[[Problem], int]) -> Callable[[Problem], str]:
    """``explain``'s line for a swap rule of ``blk_n`` rows of N split by ``split_k``: its tiles, its split and
    the CTAs that stream B."""
    def detail(p: Problem) -> str:
        sk, tiles = split_k(p), math.ceil(p.N / blk_n)
        return f"{tiles} tiles of {blk_n} rows of N x split_k={sk}: {tiles * sk} CTAs stream B"
    return detail


# -- swap AB in 64-row slices of N (one consumer) at M <= 32. On an H200 (SWAP_WIDTHS: v11 at 64 and 128 rows
# of N, split 1, 2, 4, kernels in graphs, bias+GELU and no epilogue, M = 1, 16, 32, the suite's weights and three
# held-out ones) the swap-ab rule's 128-row tiles with 48 CTAs were behind at every weight whose 64-row tiles fit
# in one wave: 6144x4096 0.95-0.98x cuBLAS -> 1.00-1.04x (96 CTAs, no split), 4096x4096 1.03 -> 1.08-1.13x and
# 4096x14336 0.93-1.05 -> 0.99-1.12x (64 tiles split in two), held out 3072x768 0.67-0.74 -> 0.81-0.88x and
# 4096x1024 0.75-0.85 -> 0.96-1.01x (no split: a split of a K this short costs more than its CTAs gain),
# 768x3072 level (1.0-1.19x, split in four where the rule split in eight). Where 64-row tiles take more than a
# wave (28672 and 128256 rows) 128 rows stayed ahead (0.96-1.06x against 0.92-1.03x): the swap-ab rule keeps
# those. The split is the fewest that keeps as many rows of N in flight as the swap-ab rule's 48 CTAs of 128
# (96 of 64: a stage of 64 rows carries half the bytes), and no fewer than SWAP_MIN_SLICE of K a slice; the
# rule applies only where those CTAs fit in one wave. Timed on the every-model samples' shapes it moves, which
# it was not fitted on (NARROW_MOVED), it lost 7-27% where its split took a second wave (N = 4544-5120, 10
# shapes, since excluded); at the 58 it still moves, 1.02-1.26x swap-ab's module at 54, 0.93-0.99x at 4
# (1280x1280, 768x3072), 1.07x in geomean.
# Two ways to get more out of the SMs a small-M grid leaves idle were timed against the policy's modules on its
# memory-bound cases (kernels in graphs, H200) and lost: v10's stream-K in 64-row tiles over every SM (0.74-0.78x
# geomean at M = 1-128, STREAM_SMALL), and swap AB's A shared by a 1x2 cluster at M = 16-64 (0.98x, SWAP_PAIRS);
# so did asking L2 for the weight before the grid wait of a programmatic dependent (0.82-1.00x, PREFETCH_UNDER_WAIT).
STREAM_SMALL = "benchmarks/results/2026-11-29_h200_stream_small/README.md"
SWAP_PAIRS = "benchmarks/results/2026-11-29_h200_swap_pairs/README.md"
PREFETCH_UNDER_WAIT = "benchmarks/results/2026-11-29_h200_prefetch/README.md"
SWAP_WIDTHS = "benchmarks/results/2026-11-28_h200_swap_widths/README.md"
NARROW_MOVED = "benchmarks/results/2026-11-28_h200_narrow_moved/README.md"
SWAP_NARROW = (32, 64)  # (the largest M, blk_n): one consumer of 64 rows of N
SWAP_STREAM_ROWS = SWAP_STREAMS[64] * SWAP_BLK_N  # rows of N that should stream at once (M <= 64)
SWAP_MIN_SLICE = 768  # of K a split keeps, at least (3072x768 and 4096x1024 lost splitting to 384 and 512)


def _swap_narrow(p: Problem) -> bool:
    """M <= 32 and the narrow swap's CTAs (its tiles times its split) in one wave: where 64-row tiles would
    need a split to stream enough rows and the split a second wave (N = 4544-5120, 71-80 tiles split in two:
    0.71-0.84x against swap-ab's 0.89-1.07x, NARROW_MOVED), swap-ab's 128 rows serve."""
    max_m, blk_n = SWAP_NARROW
    return p.M <= max_m and math.ceil(p.N / blk_n) * swap_narrow_split_k(p) <= p.sms


def swap_narrow_split_k(p: Problem) -> int:
    """The narrow swap's split_k: the fewest K slices that keep :data:`SWAP_STREAM_ROWS` rows of N
    streaming, each slice at least :data:`SWAP_MIN_SLICE` of K, at most :data:`MAX_SPLIT_K`."""
    tiles = math.ceil(p.N / SWAP_NARROW[1])
    want = math.ceil(SWAP_STREAM_ROWS / (tiles * SWAP_NARROW[1]))
    return max(1, min(MAX_SPLIT_K, want, p.K // SWAP_MIN_SLICE))


def _swap_narrow_knobs(p: Problem) -> dict:
    knobs = {"blk_m": swap_blk_m(p.M), "blk_n": SWAP_NARROW[1], "num_warpgroups": 1, "split_k": swap_narrow_split_k(p)}
    return {**knobs, "pipe_depth": _deepest("v11", p, knobs, MAX_SWAP_DEPTH), **STREAM_B}


# -- swap AB in 192 rows of N (one consumer over three 64-row atoms) at M <= 64 (fitted at M <= 16), where the narrow
# swap's 64-row tiles take more than a wave. On an H200 (SWAP_WIDE: v11 at 192 and 256 rows of N, split 1 and 2, no epilogue, kernels in
# graphs, the every-model samples under 85% of their own-size copy at M <= 16 and the suite's wide weights) the
# swap-ab rule's 128 rows split until 48 CTAs stream B were 1.22-1.34x slower wherever 192 rows split the same way
# fit in one wave: 7x9216x3072 0.86 -> 1.15x cuBLAS (48 CTAs), 16x10240x8192 0.81 -> 1.09x (54), 7x5120x5120
# 0.75 -> 0.91x and 16x5120x13824 0.80 -> 1.02x (27 tiles split in two); level at 7x18176x4544 (95 tiles, 0.99x).
# Past a wave (28672 rows: 150 tiles) 128 rows stayed ahead (0.89-0.94x), and where the narrow swap's 64 rows fit
# (6144, 4096, 3584, 7168 rows) they stayed ahead of both (0.52-0.94x). 256 rows (two consumers) were behind 192
# at three of the four; the split is swap-ab's (the fewest giving 48 CTAs: the better split at all four).
# Timed then at every shape of the suite and the every-model samples (five seeds) it moved, no epilogue and
# bias+GELU (SWAP_WIDE_MOVED, 88 pairs, 78 not fitted on): 1.13-1.40x the policy without it wherever swap-ab's
# grid of 128-row tiles left the SMs under two thirds full (72-80 CTAs: 4544-10240 rows), but 0.76x where it
# filled 128 of 132 (16384 rows: 86 CTAs of 192 against 128 of 128) and level past a wave (18176 rows, 142). So
# it takes only grids swap-ab would fill to at most SWAP_WIDE_MAX_FILL of the SMs. Past M = 16 (SWAP_WIDE_M64: the
# same rule up to M = 64, at every shape that moves among the suite, the every-model samples and the rule's weights
# at M = 32, 48, 64, no epilogue and bias+GELU) it ran 1.05-1.26x swap-ab's module at 20 of 22 pairs and level
# (1.00x) at 9728x896: so it takes M <= 64.
SWAP_WIDE = "benchmarks/results/2026-11-29_h200_swap_wide/README.md"
SWAP_WIDE_MOVED = "benchmarks/results/2026-11-29_h200_swap_wide_moved/README.md"
SWAP_WIDE_M64 = "benchmarks/results/2026-11-29_h200_swap_wide_m64/README.md"
SWAP_WIDE_TILE = (64, 192)  # (the largest M measured, blk_n)
SWAP_WIDE_MAX_FILL = 0.75  # of the SMs swap-ab's 128-row grid fills, at most (won at 0.55-0.61, lost at 0.97)


def _swap_wide(p: Problem) -> bool:
    """M <= 64, 192-row tiles times swap-ab's split for them in one wave, and swap-ab's own grid of 128-row tiles
    filling at most :data:`SWAP_WIDE_MAX_FILL` of the SMs (the rule comes after the narrow swap's, which keeps the
    weights its 64-row tiles fit in a wave)."""
    max_m, blk_n = SWAP_WIDE_TILE
    swap_units = math.ceil(p.N / SWAP_BLK_N) * swap_split_k(p)
    return (p.M <= max_m and math.ceil(p.N / blk_n) * swap_split_k(p, blk_n) <= p.sms
            and swap_units <= SWAP_WIDE_MAX_FILL * p.sms)


def _swap_wide_knobs(p: Problem) -> dict:
    blk_n = SWAP_WIDE_TILE[1]
    knobs = {"blk_m": swap_blk_m(p.M), "blk_n": blk_n, "num_warpgroups": 1, "split_k": swap_split_k(p, blk_n)}
    return {**knobs, "pipe_depth": _deepest("v11", p, knobs, MAX_SWAP_DEPTH), **STREAM_B}


SPLIT_K_MIN_SLICE = 4096  # each split keeps at least this much of K (measured: shorter slices lose)


def split_plan(p: Problem):
    """The wave model's best 128-row tile (256 or 128 columns) and split_k for ``p``, among the
    split counts that keep :data:`SPLIT_K_MIN_SLICE` of K each (1 where no split does): what the
    split-K rule takes, and whether it applies (a split above 1 for M > 64)."""
    splits = [s for s in (1, 2, 3, 4, 6, 8) if s == 1 or p.K // s >= SPLIT_K_MIN_SLICE]
    return _waves(p, [(128, 256), (128, 128)], tuple(splits))


# Split K only where v9's 128x128 tiles leave most SMs idle. On an H200 (SPLIT_PROBE: the policy with and
# without its split-k and stream-k rules, same rounds, kernels in graphs) at N x K = 4096x14336 the split
# ran 1.38-1.47x v9's 128x128 tiles at M = 256 (64 tiles on 132 SMs), and 0.92x, 0.90-0.93x, 0.81-0.83x at
# M = 384, 512, 768 (96, 128, 192 tiles), with no epilogue, bias+GELU and a residual alike. On the 17 plain
# shapes of the suite and the every-model samples that the threshold moves (epilogue_split_fill.json beside
# it), v9's tiles ran 1.106x the split in geomean, faster at 14, slower at one (333x3584x14336, 0.83x).
SPLIT_PROBE = "benchmarks/results/2026-11-28_h200_epilogue_split/epilogue_split_probe.json"
SPLIT_K_MAX_FILL = 0.5  # v9's 128x128 tiles over the SMs, at most


def _split_k_wins(p: Problem) -> bool:
    return p.M > 64 and p.tiles(128, 128) <= SPLIT_K_MAX_FILL * p.sms and split_plan(p).split_k > 1


def _split_k_knobs(p: Problem) -> dict:
    best = split_plan(p)
    knobs = {"blk_m": 128, "blk_n": best.blk_n, "split_k": best.split_k}
    return {**knobs, "cluster_m": 1} if p.M <= 128 else knobs  # one row of tiles: no pair to share B


# -- stream-K (v10 ``stream_k``): v9's 128x256 tiles in 2x1 clusters for the whole waves, the partial
# wave's K slices dealt out evenly over the clusters. Every CTA then runs tiles / SMs of a tile, and
# meets its neighbours twice (fp32 partials through L2, a fence, its K loop drained and refilled):
# about 14k cycles an SM at 4096^3, some 14 K slices of a 128x256 tile
# (benchmarks/results/2026-11-23_h100_stream_k/). It must beat the best v9 tile by 1%: the meet's
# cost is one measurement, and a gain of less is within a run's spread.
STREAM_K_MEET_SLICES = 14
STREAM_K_MARGIN = 0.99
STREAM_K = "benchmarks/results/2026-11-23_h100_stream_k/README.md"


def stream_k_makespan(p: Problem) -> float | None:
    """v10 ``stream_k``'s time in :func:`makespan`'s units, or None where it makes no cut (whole
    waves of cluster tiles: v10 then runs v9's schedule) or this policy does not weigh it (fewer
    cluster tiles than clusters: 16-bit sub-wave shapes take the split K, ``split-k``)."""
    clusters = p.sms // 2
    cluster_tiles = math.ceil(math.ceil(p.M / 128) / 2) * math.ceil(p.N / 256)
    if cluster_tiles < clusters or cluster_tiles % clusters == 0:
        return None
    meets = STREAM_K_MEET_SLICES / math.ceil(p.K / 64)  # in tiles
    return (p.tiles(128, 256) / p.sms + meets) * 128 * 256


def _stream_k_wins(p: Problem) -> bool:
    sk = stream_k_makespan(p)
    return p.M > 128 and sk is not None and sk <= STREAM_K_MARGIN * min(makespan(p, *t) for t in SQUARE_TILES)


# -- 224-column tiles: at 512x28672x4096 (Llama-3-8B's fused gate/up weight) v10's stream-K over 128x256 tiles (448
# tiles, 3.4 waves, the last cut into K slices) ran 0.92-0.94x cuBLAS as a kernel in four runs; v9's 128x224 tiles
# make 512, 3.9 waves, and ran 0.95-0.96x (2x1 or 1x1 clusters) and 0.98-1.01x with the epilogue under the next tile
# [WIDE_MID]. Where 224-wide tiles' waves finish no later than every other tile's and stream-K's (makespan;
# 128x224's rate taken as 128x192's), the rule takes them. At the 29 shapes it moves among the suite, the held-out
# weights and every every-model sample (M = 333-16384), with no epilogue and bias+GELU, it ran 1.084x and 1.081x the
# policy without it in geomean, faster at 54 of the 58 pairs; 4096x3584x4096, where stream-K had run 1.04-1.09x
# cuBLAS, lost (0.88-0.91x the policy before, 0.95-0.96x cuBLAS) [TILE_224_MOVED].
WIDE_MID = "benchmarks/results/2026-11-29_h200_wide_mid/"
TILE_224_MOVED = "benchmarks/results/2026-11-29_h200_tile224/epilogue_tile224_moved.json"
TILE_224 = (128, 224)
TILE_224_MARGIN = 1.0


def _tile_224(p: Problem) -> bool:
    if p.M <= 128:
        return False
    others = [makespan(p, *t) for t in SQUARE_TILES]
    sk = stream_k_makespan(p)
    return makespan(p, *TILE_224) <= TILE_224_MARGIN * min(others + ([sk] if sk is not None else []))


def _tile_224_knobs(p: Problem) -> dict:
    knobs = {"blk_m": TILE_224[0], "blk_n": TILE_224[1], "epi_n": 32, "pipe_depth": 4}
    return {**knobs, "epi_under": True} if p.tiles(*TILE_224) > p.sms else knobs


def _stream_k_detail(p: Problem) -> str:
    sk = stream_k_makespan(p)
    tiles = ", ".join(f"{bm}x{bn} {makespan(p, bm, bn):.0f}" for bm, bn in SQUARE_TILES)
    return f"makespan (tile units): stream-K {sk:.0f} against {tiles}" if sk is not None else "no partial wave to cut"


# -- swap AB at mid M (128 < M <= SWAP_MID_MAX_M). At M = 333 cuBLAS puts our N in wgmma's 64-row slot and our M as
# its N, 168 wide: two tiles cover 336 rows in 128 CTAs (benchmarks/results/2026-11-29_h200_fill_tiles/
# cublas_mid.json), where v9's 128-row tiles compute 384 rows in 96 CTAs and ran 0.68-0.92x cuBLAS. v11 takes any
# multiple of 8 up to 256 as its blk_m. Timed on an H200 (SWAP_MID: v11 at blk_m covering M in 1-4 tiles, 64, 128 and
# 192 rows of N, split 1 and 2, no epilogue, kernels in graphs) the tiles this rule picks ran 1.10-1.55x the policy's
# module at 333x4096x14336, 333x4096x4096, 333x6144x4096, 333x7168x5120, 333x16384x2048, 256x2048x8192,
# 384x4096x4096 and 200x4096x14336 (0.68-0.92x cuBLAS -> 0.83-1.12x); 256-row blk_m lost everywhere (0.64-0.88x), as
# did three or four M tiles at M = 512 and 768 (0.74-1.01x). So: the fewest M tiles of at most SWAP_MID_MAX_BLK_M rows,
# and the rows of N and split of least makespan, counted in waves x rows of N x K slice; on a tie, two consumers over
# 128 rows of N unless that needs a split leaving less than SWAP_MID_TWO_MIN_SLICE of K (4096x14336 at M = 333: 1.41
# against 64 rows' 1.14; 4096x4096: 1.27 against 1.39). Two M tiles share each weight tile through a 2x1 cluster
# (1.31 -> 1.55x at 256x2048x8192, level elsewhere). Timed then at every shape it moved among the suite, the
# every-model samples of five seeds and the suite's and held-out weights at M = 160-384, no epilogue and bias+GELU
# (SWAP_MID_MOVED: 70 pairs, 62 not fitted on): 1.23x the policy without it in geomean at the 64 it still takes
# (52 not fitted on: 1.24x; 0.76 -> 0.93x cuBLAS), level at the least (0.995x: 384x3072x768); but 0.95-1.02x where
# the mid-tiles rules' 64-row tiles cover M exactly in as many CTAs (M = 256 at 4096x4096, 3072x768, 4096x1024): it
# leaves those to them (and takes 256x4096x14336 and 256x2048x8192 from split-k: 1.10-1.55x).
# Widened after SWAP_MID_NARROW (narrow weights at M = 160-448 and M = 448, splits up to four: 1.04-2.13x the policy's
# module at all ten shapes, 160x2560x10240 0.46 -> 0.98x cuBLAS split in three): M up to 448, one to four tiles of M,
# split one to four, the fewest M tiles on a tie of cost. Timed at every shape that moves among the suite, the
# every-model samples and the suite's, held-out and narrow weights at M = 160-448 (SWAP_MID_MORE: 156 pairs), it lost
# in two places, which it now leaves: tiles of more than 128 rows of M over K slices under 2048 (384x2048x2048 0.73-0.77x,
# 384x1024x4096 0.90x, 448x768x3072 0.94-0.99x, 333x2048x2048 0.95-0.96x; 1.10-1.12x at 333x1024x4096), and two waves
# of three or four M tiles (448x6144x4096 0.86x; 333x9216x3072 and 333x10240x8192 level). At the 138 pairs it takes:
# 1.21x in geomean, 0.990x the least.
SWAP_MID = "benchmarks/results/2026-11-29_h200_swap_mid/README.md"
SWAP_MID_MOVED = "benchmarks/results/2026-11-29_h200_swap_mid_moved/README.md"
SWAP_MID_NARROW = "benchmarks/results/2026-11-29_h200_swap_mid_narrow/README.md"
SWAP_MID_MORE = "benchmarks/results/2026-11-29_h200_swap_mid_more/README.md"
SWAP_MID_MAX_M = 448  # the largest M measured ahead
SWAP_MID_MAX_BLK_M = 200  # rows of M a tile (wgmma's N) at most: 104-200 won, 256 lost
SWAP_MID_WIDTHS = ((64, 1), (128, 2))  # (rows of N, consumers)
SWAP_MID_SPLITS = (1, 2, 3, 4)
SWAP_MID_MIN_SLICE = 1024  # of K a split keeps
SWAP_MID_TWO_MIN_SLICE = 4096  # of K two consumers' split keeps to win a tie
SWAP_MID_MIN_FILL = 0.7  # of its waves' slots the grid fills, at least (0.73-0.97 measured)
SWAP_MID_MAX_WAVES = 2  # and past one wave only unsplit, over one or two tiles of M
SWAP_MID_TALL = (128, 2048)  # a tile of more rows of M than this splits K no shorter than this


def swap_mid_plan(p: Problem) -> tuple[int, int, int, int, int] | None:
    """(blk_m, blk_n, num_warpgroups, split_k, M tiles) of the swap-ab-mid rule for ``p``: over 1-4 tiles of M (each
    the fewest multiple of 8 rows, at most :data:`SWAP_MID_MAX_BLK_M`), :data:`SWAP_MID_WIDTHS` and
    :data:`SWAP_MID_SPLITS`, the grid of least waves x tile area x K slice that fills at least
    :data:`SWAP_MID_MIN_FILL` of its waves; on a tie the fewest M tiles, then two consumers unless their split leaves
    less than :data:`SWAP_MID_TWO_MIN_SLICE` of K, then the fewest slices. None where no grid fills."""
    best = None
    for m_tiles in range(1, 5):
        blk_m = math.ceil(p.M / m_tiles / 8) * 8
        if blk_m > SWAP_MID_MAX_BLK_M or math.ceil(p.M / blk_m) != m_tiles:
            continue
        for blk_n, consumers in SWAP_MID_WIDTHS:
            for split_k in SWAP_MID_SPLITS:
                if split_k > 1 and p.K // split_k < SWAP_MID_MIN_SLICE:
                    continue
                units = m_tiles * math.ceil(p.N / blk_n) * split_k
                waves = math.ceil(units / p.sms)
                if (waves > SWAP_MID_MAX_WAVES or (waves > 1 and (split_k > 1 or m_tiles > 2))
                        or units < SWAP_MID_MIN_FILL * waves * p.sms):
                    continue
                two = consumers == 2 and (split_k == 1 or p.K // split_k >= SWAP_MID_TWO_MIN_SLICE)
                key = (waves * blk_m * blk_n * math.ceil(p.K / split_k), m_tiles, not two, split_k)
                if best is None or key < best[0]:
                    best = (key, (blk_m, blk_n, consumers, split_k, m_tiles))
    return best[1] if best else None


def _swap_mid(p: Problem) -> bool:
    if not (128 < p.M <= SWAP_MID_MAX_M and _bias_act_only(p)) or (found := swap_mid_plan(p)) is None:
        return False
    blk_m, blk_n, _, split_k, m_tiles = found
    tall, short = SWAP_MID_TALL
    if blk_m > tall and split_k > 1 and p.K // split_k < short:  # 0.73-0.99x at four of five (SWAP_MID_MORE)
        return False
    return not _mid_tiles_keep(p, m_tiles * math.ceil(p.N / blk_n) * split_k)


def _mid_tiles_keep(p: Problem, units: int) -> bool:
    """Whether the mid-tiles rules take ``p`` (the split-k rule before them does not) with at least ``units`` CTAs
    and 64-row tiles that cover M exactly: swap AB ran level or behind those (SWAP_MID_MOVED)."""
    if p.M % 64 or not _mid_tiles(p) or _split_k_wins(p):
        return False
    blk_m, blk_n, split_k = mid_tile_plan(p)
    return p.tiles(blk_m, blk_n) * split_k >= units


def _swap_mid_knobs(p: Problem) -> dict:
    blk_m, blk_n, consumers, split_k, m_tiles = swap_mid_plan(p)
    knobs = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": consumers, "split_k": split_k,
             "cluster_m": 2 if m_tiles % 2 == 0 else 1, "cluster_n": 1}
    return {**knobs, "pipe_depth": _deepest("v11", p, knobs, MAX_SMALL_M_DEPTH)}


def _swap_mid_detail(p: Problem) -> str:
    blk_m, blk_n, _, split_k, m_tiles = swap_mid_plan(p)
    units = m_tiles * math.ceil(p.N / blk_n) * split_k
    return (f"{m_tiles} tile(s) of {blk_m} rows of M x {math.ceil(p.N / blk_n)} of {blk_n} rows of N x split_k="
            f"{split_k}: {units} CTAs on {p.sms} SMs (128-row tiles: {p.tiles(128, 128)} of {math.ceil(p.M / 128) * 128} "
            f"rows)")


SWEEP = "benchmarks/results/2026-11-22_h100_shape_sweep/sweep.json"


# -- v9's epilogue under the next tile (``epi_under``) pays where a CTA has a next tile: at six
# shapes of 1.9 to 7.8 waves of 128x256 tiles it was 0.4-2.8% faster in the same rounds, at 2048^3
# (one tile a CTA, nothing to hide it under) 2.6% slower, and at the one-tile shapes of the
# tile-shape rule 0.9-4.3% slower (benchmarks/results/2026-11-23_h100_front_door_epi_under/).
EPI_UNDER_AB = "benchmarks/results/2026-11-23_h100_front_door_epi_under/"


def _epi_under_pays(p: Problem) -> bool:
    """The busiest CTAs of a persistent 128x256 grid run two tiles or more."""
    return p.tiles(128, 256) > p.sms


def _large_knobs(p: Problem) -> dict:
    return {"epi_under": True} if _epi_under_pays(p) else {}


# -- epilogue calls at small M (issue 31). v11 and v10 built no epilogue then, so a call with a bias, an
# activation or a residual at M <= 128 fell to v9's row tiles (64x128: 32-64 CTAs) or the tile-shape
# rule (128x128: 16-112 CTAs). At M = 128 the residual epilogue then ran 0.74x torch's unfused path
# at N x K = 4096x14336 (32 CTAs) and 0.94x at 4096x4096 (row tiles, 64 CTAs); 64x64 tiles, 128 CTAs
# in one wave, ran 1.07x and 1.00x (alpha+bias+gelu+residual: 0.64 -> 0.90x, 0.95 -> 1.00x). Where
# 64x64 tiles need more than one wave they lost: at N x K = 14336x4096 (448 tiles, 3.4 waves) 1.045 ->
# 0.96x (gelu+residual 1.06 -> 0.91x) against the tile-shape rule's one wave of 112 [SMALL_M_EPILOGUE,
# rows residual_prefetch and residual_prefetch_64x64, alpha_bias_gelu_tanh+residual_prefetch(_64x64),
# M = 128]. So: 64x64 tiles where they fit in one wave, for 32 < M <= 128. Timed as the rule against
# the policy before it (benchmarks/epilogue_check.py prepare --set rule) at M = 64, 128, 256 with the
# residual, alpha+bias+gelu+residual and bias+gelu: the rule won all 12 rows where it applies,
# 1.054-1.456x (geomean 1.16x), and 64x64 forced where it does not lost or tied in all 15, 0.57-1.01x
# [SMALL_M_EPILOGUE_RULE]. M <= 32 keeps weight-streaming (not measured with 64x64).
SMALL_M_EPILOGUE = "benchmarks/results/2026-11-26_h100_epilogue_c_prefetch/epilogue_check.json"
SMALL_M_EPILOGUE_RULE = "benchmarks/results/2026-11-26_h100_epilogue_small_m_rule/epilogue_rule.json"
SMALL_EPILOGUE_TILE = (64, 64)
SMALL_M_EPILOGUE_ROWS = (32, 128)  # 32 < M <= 128
# Since v11 builds a bias, an activation and alpha (issue 31, 2026-11-28), an epilogue call without a
# residual may take swap AB at M <= 128; timed against this rule [SPLIT_EPILOGUE, rows rule now /
# no_small_rule]: bias+GELU at N x K = 4096x14336 ran 0.77 (M = 64) and 0.85x (128) cuBLASLt's fused
# epilogue in the rule's 64x64 tiles, 0.89 and 0.98x swap AB with its split K; at K <= 4096 the rule won
# or tied (0.70-0.91x against 0.60-0.83x). So past K = 8192 (where row-tiles stops too) the rule keeps
# the residual (which v11 does not build) only.
SPLIT_EPILOGUE = "benchmarks/results/2026-11-28_h200_epilogue_split/epilogue_split.json"
SMALL_M_EPILOGUE_SWAP_K = 8192


def _small_m_epilogue(p: Problem) -> bool:
    """A 16-bit epilogue call (bias, activation, alpha or residual; not SwiGLU's gated B, whose
    chunks take half a tile, nor a float32 D, not measured) at 32 < M <= 128 whose 64x64 tiles fit
    in one wave; without a residual, only at K <= :data:`SMALL_M_EPILOGUE_SWAP_K` (past it swap AB)."""
    spec = p.spec
    if spec is None or spec.epilogue == "none" or spec.gated or spec.is_fp8 or spec.d != p.dtype:
        return False
    lo, hi = SMALL_M_EPILOGUE_ROWS
    if spec.residual is None and p.K > SMALL_M_EPILOGUE_SWAP_K:  # swap AB builds it and streams long K better
        return False
    return lo < p.M <= hi and p.tiles(*SMALL_EPILOGUE_TILE) <= p.sms


def _small_m_epilogue_knobs(p: Problem) -> dict:
    # two row tiles (M > 64) share B through a 2x1 cluster, as the row-tiles rule's (and as measured)
    blk_m, blk_n = SMALL_EPILOGUE_TILE
    knobs = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": 1, "cluster_m": 2 if p.M > 64 else 1, "cluster_n": 1,
             "epi_n": 64}
    return {**knobs, "pipe_depth": _deepest("v9", p, knobs, MAX_SMALL_M_DEPTH), **STREAM_B}


# -- the small-M epilogue rule's tiles split in two along K (v10), where the tiles fill at most half the SMs and K
# is long. On an H200 (FEW_TILES: bias+GELU, kernels in graphs against cuBLASLt's fused epilogue, the policy's
# module beside candidate tiles and splits in the same rounds) the rule's 64x64 tiles ran 0.86x at 64x4096x4096
# (64 tiles), 0.73x at 64x768x3072 (12) and 0.74x at 128x768x3072 (24); split in two 0.93x, 0.86x and 0.84x. Where
# two slices a tile would take more than the SMs (64x6144x4096: 0.97 -> 0.74x; 128x4096x4096: 0.90 -> 0.69x) or K
# is short (64x4096x1024: 0.92 -> 0.71x; 64x3072x768: 0.81 -> 0.69x) the split lost. A residual keeps the rule's
# v9 tiles (C loaded ahead of the K loop, c_prefetch, which v10 cannot do: not measured split).
# On the 15 shapes of the suite and the every-model samples it moves (SMALL_SPLIT_MOVED, 13 not fitted on): 1.05-1.37x
# the v9 tiles, geomean 1.22x.
FEW_TILES = "benchmarks/results/2026-11-28_h200_few_tiles/README.md"
SMALL_SPLIT_MOVED = "benchmarks/results/2026-11-28_h200_small_split_moved/README.md"
SMALL_M_SPLIT_MIN_K = 3072  # each of the two slices keeps >= 1536 of K


def _small_m_split(p: Problem) -> bool:
    return (_small_m_epilogue(p) and p.spec.residual is None and p.K >= SMALL_M_SPLIT_MIN_K
            and 2 * p.tiles(*SMALL_EPILOGUE_TILE) <= p.sms)


def _small_m_split_knobs(p: Problem) -> dict:
    knobs = {**_small_m_epilogue_knobs(p), "split_k": 2}
    knobs.pop("pipe_depth")
    return {**knobs, "pipe_depth": _deepest("v10", p, knobs, MAX_SMALL_M_DEPTH)}


# -- rows of N as the CTAs' tiles at 32 < M <= 128 (DEEP_RINGS: no epilogue and bias+GELU at M = 64 and 128 on
# Llama-8B's 4096x4096 and 4096x14336, the policy's module beside v9, v10 and v11 tiles and splits at 8 stages and
# at the deepest ring they fit, kernels in graphs against cuBLAS and cuBLASLt's fused epilogue on an H200).
# - At M = 64, swap AB with 64 rows of N per CTA (the narrow swap's tile, M as wgmma's N = 64) split in two: no
#   epilogue 0.776 -> 0.917x cuBLAS at 4096x4096 (row-tiles' 64x128, 32 CTAs), 0.997 -> 1.091x at 4096x14336
#   (swap-ab's 128 rows); bias+GELU 0.914 -> 0.954x (small-m-split) and 0.884 -> 0.978x (swap-ab).
# - At M = 128 with K past SMALL_M_EPILOGUE_SWAP_K, 64x128 tiles in 2x1 clusters split in two (v10, 128 CTAs):
#   no epilogue 1.011 -> 1.088x, bias+GELU 1.058 -> 1.129x at 4096x14336 (swap-ab-128).
# - The rings past 8 stages lost at every one of these shapes (64x64 tiles at 13 stages, cuBLAS's depth there:
#   0.69-0.85x against 0.76-0.98x at 8; every candidate was slower deeper): the caps stay.
# On the 37 shapes of the suite, the every-model samples and the epilogue suite they move (SWAP_64_MOVED, 34 not
# fitted on), with no epilogue and with bias+GELU: faster at every one, 1.23x (none) and 1.07x (bias+GELU) the
# modules before them in geomean, 1.014x the least.
DEEP_RINGS = "benchmarks/results/2026-11-29_h200_deep_rings/README.md"
SWAP_64_MOVED = "benchmarks/results/2026-11-29_h200_swap64_moved/README.md"
ROW64_MOVED = "benchmarks/results/2026-11-29_h200_row64_moved/README.md"
SWAP_64_ROWS = (32, 64)  # 32 < M <= 64
LONG_K_SPLIT_ROWS = (64, 128)  # 64 < M <= 128
LONG_K_SPLIT_TILE = (64, 128)


def _bias_act_only(p: Problem) -> bool:
    """No epilogue, or a bias, an activation and alpha with D in the inputs' dtype: what v11 builds and what
    swap-ab-64 and long-k-split were measured with (not a residual, SwiGLU's gated B, fp8 or a float32 D)."""
    spec = p.spec
    return spec is None or not (spec.residual is not None or spec.gated or spec.is_fp8 or spec.d != p.dtype)


def _swap_64(p: Problem) -> bool:
    """32 < M <= 64 where the narrow swap's 64-row tiles, times its split, fit in one wave (:func:`_bias_act_only`)."""
    lo, hi = SWAP_64_ROWS
    return lo < p.M <= hi and _bias_act_only(p) and math.ceil(p.N / SWAP_NARROW[1]) * swap_narrow_split_k(p) <= p.sms


def _long_k_split(p: Problem) -> bool:
    """64 < M <= 128, K past :data:`SMALL_M_EPILOGUE_SWAP_K` and the 64x128 tiles split in two in one wave
    (:func:`_bias_act_only`)."""
    lo, hi = LONG_K_SPLIT_ROWS
    return (lo < p.M <= hi and p.K > SMALL_M_EPILOGUE_SWAP_K and _bias_act_only(p)
            and 2 * p.tiles(*LONG_K_SPLIT_TILE) <= p.sms)




def _long_k_split_knobs(p: Problem) -> dict:
    blk_m, blk_n = LONG_K_SPLIT_TILE
    knobs = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": 1, "cluster_m": 2, "cluster_n": 1, "epi_n": 64,
             **STREAM_B, "split_k": 2}
    return {**knobs, "pipe_depth": _deepest("v10", p, knobs, MAX_SMALL_M_DEPTH)}


# -- past M = 128 where v9's 128x128 tiles leave most SMs idle and K is too short for the split-k rule. On an H200
# (MID_TILES: no epilogue at M = 256 and 512, bias+GELU at 512, on five narrow weights: 768x3072, 1024x4096,
# 1280x1280, 896x4864, 2048x2048; the policy's module beside 64-row tiles, whole and split in two) the tile-shape
# rule's 128x128 tiles (12-64 of them) ran 0.40-0.68x cuBLAS; the 64-row tiles that put the most CTAs on the SMs in
# one wave ran 0.76-0.94x: 64x64 split in two at 256x768x3072 (0.43 -> 0.88x), 256x1024x4096 (0.42 -> 0.94x),
# 256x896x4864 (0.40 -> 0.90x); 64x128 split in two where 64x64 alone would fill the same CTAs (512x1024x4096 0.79
# against 0.75x, 512x896x4864 0.78 against 0.66x); whole tiles where K is too short to split (1280x1280, 2048x2048:
# slices of 640 and 1024 lost to the whole tiles, 0.67 against 0.77x, 0.71 against 0.80x).
# On the 27 shapes of the suite and the every-model samples they move (MID_MOVED, 23 not fitted on): 1.31-1.98x the
# 128x128 tiles, geomean 1.50x (0.53 -> 0.80x cuBLAS).
MID_TILES = "benchmarks/results/2026-11-28_h200_mid_tiles/README.md"
MID_MOVED = "benchmarks/results/2026-11-28_h200_mid_moved/README.md"
MID_TILE_SHAPES = ((64, 128), (64, 64))  # larger first: it wins a tie of CTAs (fewer re-reads of A and B)
MID_SPLIT_MIN_SLICE = 1536  # of K a split keeps (1024 and 640 lost)


def mid_tile_plan(p: Problem) -> tuple[int, int, int] | None:
    """(blk_m, blk_n, split_k) of the 64-row tile and split (1 or 2) with the most CTAs in one wave, the
    larger tile on a tie; None when none fits one wave. A split only where each slice keeps
    :data:`MID_SPLIT_MIN_SLICE` of K and the spec has no residual (not measured split)."""
    splits = (1, 2) if p.K // 2 >= MID_SPLIT_MIN_SLICE and (p.spec is None or p.spec.residual is None) else (1,)
    fits = [(p.tiles(bm, bn) * sk, -i, (bm, bn, sk)) for i, (bm, bn) in enumerate(MID_TILE_SHAPES) for sk in splits
            if p.tiles(bm, bn) * sk <= p.sms]
    return max(fits)[2] if fits else None


def _mid_tiles(p: Problem) -> bool:
    spec = p.spec
    if spec is not None and (spec.gated or spec.is_fp8 or spec.d != p.dtype):  # not measured
        return False
    if not (p.M > 128 and p.tiles(128, 128) <= SPLIT_K_MAX_FILL * p.sms):
        return False
    found = mid_tile_plan(p)
    return found is not None and p.tiles(*found[:2]) * found[2] > p.tiles(128, 128)


def _mid_tiles_split(p: Problem) -> bool:
    return _mid_tiles(p) and mid_tile_plan(p)[2] > 1


def _mid_tiles_whole(p: Problem) -> bool:
    return _mid_tiles(p) and mid_tile_plan(p)[2] == 1


def _mid_tile_knobs(p: Problem) -> dict:
    blk_m, blk_n, split_k = mid_tile_plan(p)
    knobs = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": 1, "cluster_m": 2, "cluster_n": 1, "epi_n": 64,
             **STREAM_B, **({"split_k": split_k} if split_k > 1 else {})}
    rung = "v10" if split_k > 1 else "v9"
    return {**knobs, "pipe_depth": _deepest(rung, p, knobs, MAX_SMALL_M_DEPTH)}


def _mid_tile_detail(p: Problem) -> str:
    blk_m, blk_n, split_k = mid_tile_plan(p)
    split = f" x split_k={split_k}" if split_k > 1 else ""
    return f"{p.tiles(blk_m, blk_n)} tiles of {blk_m}x{blk_n}{split} on {p.sms} SMs (128x128: {p.tiles(128, 128)})"


# -- tiles of N narrower than 64 at 32 < M <= 128: one row of tiles, as many CTAs as fit one wave. cuBLAS runs 64x32
# tiles, 128 CTAs, at 64x4096x4096 (DEEP_RINGS' cublas_small.json); v9 takes whole 16 columns from 32. Timed on an H200
# (NARROW_N: the suite's and the held-out weights at M = 16, 64 and 128, no epilogue and bias+GELU, and the every-model
# samples' memory-bound cases; v9 with 64 rows of M (128 past 64, two consumers) and the narrowest whole 16 columns
# whose tiles fit one wave, alone and in 1x2 clusters) the tiles alone won where they are 48 wide, or 32 wide at two
# consumers, and K is short enough that the policy does not split it: 64x6144x4096 0.93 -> 1.04x cuBLAS (bias+GELU
# 0.95 -> 1.04x), 48x5120x1280 0.97 -> 1.04x, 128x6144x4096 0.93 -> 0.97x, 128x4096x1024 0.95 -> 1.02x, 128x3072x768
# 0.97 -> 1.00x (bias+GELU 0.98 -> 1.04x). They lost at K = 8192 and 14336 (0.80-0.93x against the policy's splits),
# 32 wide at M <= 64 (64x4096x4096 0.93 against 0.96x, 64x3072x768 0.97 against 1.01x), and at M = 16 (0.4-0.8x: 64
# rows of M for 16), and the 1x2 clusters lost to the tiles alone. Timed then at every shape it moved among the suite,
# the every-model samples and every every-model weight at M = 48, 64, 96 and 128 (NARROW_N_MOVED: 72 pairs, 60 not
# fitted on): at M = 96, where the second consumer's rows are half past M, 0.65-0.94x the policy's module before it,
# which it leaves; elsewhere 1.052x in geomean (34 not fitted on: 1.052x), 0.984x the least.
NARROW_N = "benchmarks/results/2026-11-29_h200_narrow_n/README.md"
NARROW_N_MOVED = "benchmarks/results/2026-11-29_h200_narrow_n_moved/README.md"
NARROW_N_WIDTHS = (32, 48)  # of N a tile: the widths measured (64 is the row-tiles and swap rules' own)
NARROW_N_MAX_K = 5120  # past it the split rules' modules won
NARROW_N_MIN_FILL = 0.7  # of the SMs the tiles fill, at least (96 of 132 won at 128x3072x768)
# Timed again over every every-model weight the rule takes at M = 48, 64 and 128 (NARROW_RINGS, fp16, as kernels in
# CUDA graphs, two runs): with one consumer, 12 stages ran 1.015x the 8 in geomean at the 10 shapes (0.988x the least,
# 48x5120x1280; 1.02-1.03x at 4544 and 4672 wide); at M = 128 where tiles 32 wide fit, 64x64 tiles in 2x1 clusters
# (the pair of M tiles of one column shares B) ran 1.031x the 32-wide tiles of all 128 rows at the 8 shapes (1.002x
# the least, 128x3840x1280; 1.07x at 128x3072x768, 1.04x at 128x4096x4096). Rings of 6 and 9 stages lost at every
# shape (0.71-0.95x), 10 at all but 6144x4096 (0.81-1.01x); A multicast over 1x2 clusters lost (0.83-0.97x).
NARROW_RINGS = "benchmarks/results/2026-11-29_h200_narrow_rings/README.md"
NARROW_N_ONE_DEPTH = 12  # stages of the one-consumer tiles (NARROW_RINGS)
# with bias+GELU and bias+ReLU (NARROW_PAIRS_EPI: issue 31's epilogue suite with them) the 64x64 pairs ran 1.02-1.05x
# cuBLASLt's fused epilogue at 128x4096x1024 and 0.95-0.97x at 128x3072x768, where the 32-wide tiles over two
# consumers had run 1.05-1.10x and 1.02x in the run before (2026-11-29_h200_epilogue_suite_narrow_n); at
# 128x4096x4096 they gained (0.96 -> 0.97-0.99x). Below this K an epilogue keeps the 32-wide tiles
NARROW_PAIRS_EPI = "benchmarks/results/2026-11-29_h200_epilogue_suite_narrow_rings/README.md"
NARROW_N_PAIRS_EPI_K = 2048


def narrow_n_width(p: Problem) -> int:
    """The narrowest whole 16 columns of N (32 at least) whose tiles fit one wave."""
    width = max(32, math.ceil(p.N / p.sms / 16) * 16)
    while math.ceil(p.N / width) > p.sms:
        width += 16
    return width


def _narrow_n(p: Problem) -> bool:
    # one consumer's 64 rows, or two consumers' 128 (past 64 and short of 128 it lost: NARROW_N_MOVED)
    if not ((32 < p.M <= 64 or p.M == 128) and p.K <= NARROW_N_MAX_K and _bias_act_only(p)):
        return False
    width = narrow_n_width(p)
    if width not in NARROW_N_WIDTHS or (width == 32 and p.M <= 64):
        return False
    return math.ceil(p.N / width) >= NARROW_N_MIN_FILL * p.sms


def _narrow_n_pairs(p: Problem) -> bool:
    """At M = 128 where 32 columns fit: 64x64 tiles, the two of a column in a 2x1 cluster sharing B (NARROW_RINGS),
    but for a bias or an activation at K under NARROW_N_PAIRS_EPI_K, where the two consumers' 32-wide tiles kept it."""
    if not (p.M > 64 and narrow_n_width(p) == 32):
        return False
    return p.spec is None or p.spec.epilogue == "none" or p.K >= NARROW_N_PAIRS_EPI_K


def _narrow_n_knobs(p: Problem) -> dict:
    width, two = narrow_n_width(p), p.M > 64
    if _narrow_n_pairs(p):  # two rows of 64x64 tiles fit one wave: the pair of a column shares B (NARROW_RINGS)
        knobs = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "cluster_n": 1, "epi_n": 64,
                 **STREAM_B}
        return {**knobs, "pipe_depth": _deepest("v9", p, knobs, MAX_SMALL_M_DEPTH)}
    knobs = {"blk_m": 128 if two else 64, "blk_n": width, "num_warpgroups": 2 if two else 1, "cluster_m": 1,
             "cluster_n": 1, "epi_n": width, **STREAM_B}
    cap = MAX_SMALL_M_DEPTH
    if not two and _deepest("v9", p, knobs, NARROW_N_ONE_DEPTH) == NARROW_N_ONE_DEPTH:
        cap = NARROW_N_ONE_DEPTH  # one consumer: 12 stages where they fit (NARROW_RINGS: 9 and 10 lost up to 19%)
    return {**knobs, "pipe_depth": _deepest("v9", p, knobs, cap)}


def _narrow_n_detail(p: Problem) -> str:
    width = narrow_n_width(p)
    if _narrow_n_pairs(p):
        return (f"{2 * math.ceil(p.N / 64)} tiles of 64x64 in 2x1 clusters on {p.sms} SMs (32-wide tiles of all "
                f"{p.M} rows: {math.ceil(p.N / 32)})")
    return f"{math.ceil(p.N / width)} tiles {width} wide on {p.sms} SMs (64-wide: {math.ceil(p.N / 64)})"


RULES: list[Rule] = [
    Rule("narrow-n", "sm_90a", "v9", when=_narrow_n, knobs=_narrow_n_knobs,
         why=f"32 < M <= 64 or M = 128, K <= {NARROW_N_MAX_K}, whose tiles 48 wide (or 32, at M = 128) fit one wave "
             f"and fill {NARROW_N_MIN_FILL:.0%} of it (no residual, D in the inputs' dtype): one row of v9 tiles of "
             "all M rows (two consumers at 128) and the narrowest whole 16 columns of N that fit, no cluster, B "
             f"streamed, {NARROW_N_ONE_DEPTH} stages with one consumer; at M = 128 where 32 columns fit, 64x64 tiles "
             f"instead, the two of a column in a 2x1 cluster sharing B (with a bias or an activation from K = "
             f"{NARROW_N_PAIRS_EPI_K})",
         evidence=NARROW_N + ": 64x6144x4096 0.93 -> 1.04x cuBLAS, 128x4096x1024 0.95 -> 1.02x, 48x5120x1280 0.97 -> "
                  "1.04x; " + NARROW_N_MOVED + ": 1.052x the modules before it in geomean at the 46 pairs it takes "
                  "(34 not fitted on: 1.052x), 0.984x the least; " + NARROW_RINGS + ": 12 stages 1.015x the 8 "
                  "with one consumer, 64x64 tiles in 2x1 clusters 1.031x the 32-wide tiles at M = 128",
         detail=_narrow_n_detail),
    Rule("swap-ab-64", "sm_90a", "v11", when=_swap_64, knobs=_swap_narrow_knobs,
         why="32 < M <= 64 with N's 64-row tiles, times their split, in one wave (no residual, D in the inputs' "
             "dtype): the narrow swap's tiles, 64 rows of N per CTA against all M rows as wgmma's N, K split as "
             "the narrow swap splits it",
         evidence=DEEP_RINGS + ": 0.776 -> 0.917x cuBLAS at 64x4096x4096, 0.997 -> 1.091x at 64x4096x14336; "
                  "bias+GELU 0.914 -> 0.954x and 0.884 -> 0.978x cuBLASLt's fused epilogue; " + SWAP_64_MOVED + ": "
                  "1.24x (none) and 1.07x (bias+GELU) the modules before it at the 35 suite and every-model shapes "
                  "it moves, 1.014x the least",
         detail=_swap_detail(SWAP_NARROW[1], swap_narrow_split_k)),
    Rule("long-k-split", "sm_90a", "v10", when=_long_k_split, knobs=_long_k_split_knobs,
         why=f"64 < M <= 128 with K > {SMALL_M_EPILOGUE_SWAP_K} whose 64x128 tiles split in two fit in one wave "
             "(no residual, D in the inputs' dtype): 64x128 tiles (one consumer, B streamed, 2x1 clusters) with "
             "each K loop split in two (v10)",
         evidence=DEEP_RINGS + ": 1.011 -> 1.088x cuBLAS at 128x4096x14336 (swap-ab-128 before); bias+GELU "
                  "1.058 -> 1.129x cuBLASLt's fused epilogue; " + SWAP_64_MOVED + ": 1.05-1.07x swap-ab-128's module "
                  "at 128x3584x14336 and 128x4096x14336, both epilogues",
         detail=lambda p: f"{p.tiles(*LONG_K_SPLIT_TILE)} tiles of 64x128 x split_k=2 on {p.sms} SMs"),
    Rule("small-m-split", "sm_90a", "v10", when=_small_m_split, knobs=_small_m_split_knobs,
         why="an epilogue call without a residual at 32 < M <= 128 whose 64x64 tiles fill at most half the SMs, "
             f"K >= {SMALL_M_SPLIT_MIN_K}: the small-M epilogue rule's tiles with each K loop split in two (v10), "
             "twice the CTAs streaming B",
         evidence=FEW_TILES + ": bias+GELU 0.86 -> 0.93x cuBLASLt's fused epilogue at 64x4096x4096, 0.73 -> 0.86x at "
                  "64x768x3072, 0.74 -> 0.84x at 128x768x3072; past half the SMs or at K <= 1024 the split lost "
                  "(0.52-0.74x against 0.81-0.97x); " + SMALL_SPLIT_MOVED + ": 1.05-1.37x the v9 tiles at all 15 "
                  "shapes of the suite and the every-model samples it moved",
         detail=lambda p: f"{p.tiles(*SMALL_EPILOGUE_TILE)} tiles of 64x64 x split_k=2 on {p.sms} SMs"),
    Rule("small-m-epilogue", "sm_90a", "v9", when=_small_m_epilogue, knobs=_small_m_epilogue_knobs,
         why="an epilogue call at 32 < M <= 128 whose 64x64 tiles fit in one wave (without a residual, which "
             "swap AB does not build, only at K <= 8192): twice to four times the CTAs of 64x128 or 128x128 tiles "
             "stream B, one consumer, the deepest ring (two row tiles share B through a 2x1 cluster)",
         evidence=SMALL_M_EPILOGUE_RULE + ": 1.054-1.456x the policy before it as kernels in all 12 rows where it "
                  "applies (M = 64, 128; residual 0.86 -> 1.01x torch, geomean), 64x64 forced past one wave "
                  "0.57-1.01x in all 15 others; " + SMALL_M_EPILOGUE + ": residual at M = 128 0.74 -> 1.07x torch",
         detail=lambda p: f"{p.tiles(*SMALL_EPILOGUE_TILE)} tiles of 64x64 on {p.sms} SMs"),
    Rule("row-tiles", "sm_90a", "v9", when=_row_tiles, knobs=_row_tile_knobs,
         why="32 < M <= 128 with a B small enough that 64-row tiles fit in one wave: each CTA streams its "
             "own 64 rows of A against 128 rows of B through a deep ring, with no split and no swap (two row "
             "tiles share B through a 2x1 cluster)",
         evidence=SWEEP + ": 0.77-0.91x cuBLAS as kernels at M = 64, 128 with N x K = 4096x4096, 6144x4096, "
                  "ahead of v11 and v10 there; with the pair and stream_b 0.81-0.95x (2026-11-22_h100_stream_b)",
         detail=lambda p: f"{p.tiles(64, 128)} tiles of 64x128 on {p.sms} SMs"),
    Rule("swap-ab-narrow", "sm_90a", "v11", when=_swap_narrow, knobs=_swap_narrow_knobs,
         why="M <= 32 with N's 64-row tiles, times their split, in one wave: swap AB with 64 rows of N per CTA "
             "(one consumer), twice the CTAs of 128-row tiles streaming B, K split only until as many rows of N "
             f"stream as 48 CTAs of 128 would and each slice keeps {SWAP_MIN_SLICE} of K",
         evidence=SWAP_WIDTHS + ": 1.00-1.13x cuBLAS as kernels at M = 1-32 on 6144x4096, 4096x4096, 4096x14336 "
                  "(swap-ab's 128 rows: 0.93-1.05x), held out 3072x768 0.81-0.88x (0.67-0.74x), 4096x1024 "
                  "0.96-1.01x (0.75-0.85x), 768x3072 level; " + NARROW_MOVED + ": 1.02-1.26x swap-ab's module at "
                  "54 of the 58 every-model shapes it moves (0.93-0.99x at 4), 1.07x in geomean",
         detail=_swap_detail(SWAP_NARROW[1], swap_narrow_split_k)),
    Rule("swap-ab-192", "sm_90a", "v11", when=_swap_wide, knobs=_swap_wide_knobs,
         why="M <= 64 with N's 192-row tiles, times swap-ab's split, in one wave, where 64-row tiles do not fit one "
             "and swap-ab's 128-row tiles would leave a quarter of the SMs or more idle: swap AB with 192 rows of N "
             "per CTA (one consumer over three 64-row atoms), K split until 48 CTAs stream B",
         evidence=SWAP_WIDE + ": 1.22-1.34x swap-ab's 128 rows as kernels at 7x9216x3072, 16x10240x8192, "
                  "7x5120x5120, 16x5120x13824 (0.75-0.86x cuBLAS -> 0.91-1.15x); " + SWAP_WIDE_MOVED + ": 1.13-1.40x "
                  "at all 64 pairs it takes (4544-10240 rows, M = 1-16, no epilogue and bias+GELU; 56 not fitted on); "
                  + SWAP_WIDE_M64 + ": 1.05-1.26x at 20 of 22 pairs at M = 32-64, level at 9728x896",
         detail=_swap_detail(SWAP_WIDE_TILE[1], lambda p: swap_split_k(p, SWAP_WIDE_TILE[1]))),
    Rule("swap-ab", "sm_90a", "v11", when=lambda p: p.M <= 64, knobs=_swap_knobs,
         why="M <= 64: reading B (N x K) is the whole cost; swap AB puts N in wgmma's 64-row slot (M as its N, "
             "a power of two from 8), 128 rows of N per CTA beside an 8-deep ring, and K split until enough "
             "CTAs stream B",
         evidence=SWEEP + ": 0.94-0.97x cuBLAS as kernels at M = 1, 64",
         detail=_swap_detail(SWAP_BLK_N, swap_split_k)),
    Rule("weight-streaming", "sm_90a", "v9", when=lambda p: p.M <= 64, knobs=_small_m_knobs,
         why="M <= 64: reading B (N x K) dominates, so the output is cut into as many 64-row tiles as fill "
             "the SMs (blk_n by makespan), each streaming its slice of B through a deep ring"),
    Rule("swap-ab-128", "sm_90a", "v11", when=lambda p: 64 < p.M <= 128, knobs=lambda p: _swap_knobs(p, 128),
         why="64 < M <= 128 with a B too large for 64-row tiles in one wave (or a long K): swap AB with "
             "128 rows of M as wgmma's N, K split until enough CTAs stream B",
         evidence=SWEEP + ": 0.98-1.01x cuBLAS as kernels at M = 128 with N x K = 28672x4096, 4096x14336, "
                  "128256x4096",
         detail=_swap_detail(SWAP_BLK_N, swap_split_k)),
    Rule("tile-224", "sm_90a", "v9", when=_tile_224, knobs=_tile_224_knobs,
         why="M > 128 where 128x224 tiles fill their waves better than 128x256 tiles, stream-K or the narrower tiles "
             f"(makespan {TILE_224_MARGIN}x theirs or less): v9 at 128x224 (epi_n 32, depth 4), the epilogue under "
             "the next tile where a CTA has one",
         evidence=WIDE_MID + ": 0.98-1.01x cuBLAS as kernels at 512x28672x4096 where stream-K ran 0.92-0.94x; "
                  + TILE_224_MOVED + ": 1.08x the policy without it in geomean at the 58 pairs it moves, faster at "
                  "54 (4096x3584x4096 0.88-0.91x)",
         detail=lambda p: f"makespan (tile units): 128x224 {makespan(p, *TILE_224):.0f} ({p.tiles(*TILE_224)} tiles), "
                          + _stream_k_detail(p)),
    Rule("stream-k", "sm_90a", "v10", when=_stream_k_wins, knobs=lambda p: {"split_k": 1, "stream_k": True},
         why="M > 128 and a partial last wave: v9's tiles for the whole waves, the last wave's K slices dealt "
             "out evenly over the clusters (v10 stream_k), when that finishes at least 1% sooner than the best "
             f"v9 tile with two meets of about {STREAM_K_MEET_SLICES} K slices per CTA",
         evidence=STREAM_K + ": 0.94-0.96x cuBLAS at 1792x2560x8192, 2560x2560x8192, 3072x3072x8192 "
                  "(split-K 0.64-0.74x, v9 0.82x), 1.03-1.07x at 8192^3 (v9 1.01-1.03x)",
         detail=_stream_k_detail),
    Rule("swap-ab-mid", "sm_90a", "v11", when=_swap_mid, knobs=_swap_mid_knobs,
         why=f"128 < M <= {SWAP_MID_MAX_M} (no residual, D in the inputs' dtype): swap AB with M as wgmma's N in one "
             f"to four tiles of at most {SWAP_MID_MAX_BLK_M} rows (a multiple of 8: two of 168 for 333, where 128-row "
             "tiles compute 384), 64 or 128 rows of N and a split of one to four, the grid of least makespan that "
             "fills its waves; not where the mid-tiles rules' 64-row tiles cover M exactly in as many CTAs, nor a "
             "tile of more than 128 rows over K slices under 2048",
         evidence=SWAP_MID + ": 1.10-1.55x the policy's module as kernels at eight shapes of M = 200-384 (0.68-0.92x "
                  "cuBLAS -> 0.83-1.12x); " + SWAP_MID_MOVED + ": 1.23x in geomean at the 64 suite and every-model "
                  "pairs it takes (52 not fitted on: 1.24x), 0.995x the least; " + SWAP_MID_NARROW + ": 1.04-2.13x "
                  "on narrow weights and at M = 448; " + SWAP_MID_MORE + ": 1.21x in geomean, 0.990x the least, at "
                  "the 138 pairs the widened rule takes",
         detail=_swap_mid_detail),
    Rule("split-k", "sm_90a", "v10", when=_split_k_wins, knobs=_split_k_knobs,
         why="too few tiles for whole waves and a long K: the wave model finishes sooner with each tile's K "
             f"loop split over several CTAs (each keeping >= {SPLIT_K_MIN_SLICE} of K; the last one sums the "
             "fp32 partials), where v9's 128x128 tiles would fill at most half the SMs (a threshold measured, "
             f"{SPLIT_PROBE}; the split itself is the model's)",
         detail=lambda p: "wave model: " + split_plan(p).why()),
    Rule("mid-tiles-split", "sm_90a", "v10", when=_mid_tiles_split, knobs=_mid_tile_knobs,
         why="M > 128 where v9's 128x128 tiles fill at most half the SMs and K is too short for the split-k rule: "
             "64-row tiles (one consumer, B streamed, 2x1 clusters) split in two along K, the tile and split that "
             f"put the most CTAs in one wave (each slice >= {MID_SPLIT_MIN_SLICE} of K)",
         evidence=MID_TILES + ": 0.76-0.94x cuBLAS as kernels where 128x128 tiles ran 0.40-0.68x (256x768x3072 "
                  "0.43 -> 0.88x, 256x1024x4096 0.42 -> 0.94x, 512x896x4864 0.42 -> 0.78x); " + MID_MOVED + ": 1.31-1.98x "
                  "the 128x128 tiles at all 27 suite and every-model shapes the two rules move",
         detail=_mid_tile_detail),
    Rule("mid-tiles", "sm_90a", "v9", when=_mid_tiles_whole, knobs=_mid_tile_knobs,
         why="M > 128 where v9's 128x128 tiles fill at most half the SMs and K is too short for the split-k rule: "
             "the 64-row tiles (one consumer, B streamed, 2x1 clusters) that put the most CTAs in one wave",
         evidence=MID_TILES + ": 0.77-0.92x cuBLAS as kernels where 128x128 tiles ran 0.50-0.65x (256x1280x1280, "
                  "512x1280x1280, 256x2048x2048, 512x2048x2048); " + MID_MOVED + ": 1.31-1.98x the 128x128 tiles at "
                  "all 27 suite and every-model shapes the two rules move",
         detail=_mid_tile_detail),
    Rule("tile-shape", "sm_90a", "v9", when=_tile_shape, knobs=_tile_shape_knobs,
         why="128x256 tiles would leave SMs idle (fewer tiles than SMs, or a ragged last wave): a narrower "
             "tile finishes first, its waves weighed by its measured rate",
         evidence=SWEEP + ": 128x192 0.89-1.04x and 128x128 0.79x cuBLAS at M = 512, where 128x256 gave 0.56-1.03x",
         detail=lambda p: "makespan (tile units): " + ", ".join(
             f"{bm}x{bn} {p.tiles(bm, bn)} tiles {makespan(p, bm, bn):.0f}" for bm, bn in SQUARE_TILES)),
    Rule("large", "sm_90a", "v9", when=lambda p: True, knobs=_large_knobs,
         why="enough tiles for every SM: v9 at its defaults (128x256 tiles, two consumers, depth 4, 2x1 cluster), "
             "with each tile's epilogue under the next tile (epi_under) where the busiest CTAs run two tiles or more",
         evidence="benchmarks/results/2026-11-22_h100_v6_v9_sweep.json: 0.95-1.05x cuBLAS at 3072x8192x1536, "
                  "4096^3, 6144^3, 8192^3 (fp16, bf16); " + EPI_UNDER_AB + ": epi_under +0.4% to +2.8% at six "
                  "shapes of 1.9 to 7.8 waves, -2.6% at 2048^3 (one tile a CTA)",
         detail=lambda p: f"{p.tiles(128, 256)} tiles of 128x256 on {p.sms} SMs: epi_under "
                          + ("on" if _epi_under_pays(p) else "off (no CTA runs a second tile)")),
    Rule("large", "sm_100a", "v9", when=lambda p: True, knobs=lambda p: {},
         why="Blackwell: v9 at its defaults (compiled only; no Blackwell GPU has measured it)"),
]


def _row_tiles_64(p: Problem) -> bool:
    """The row-tiles rule's shapes at 64 < M <= 128 whose 64x64 tiles (twice as many) still fit in one wave: 128
    CTAs at 128x4096x4096, 0.897 -> 0.965x cuBLAS (DEEP_RINGS), the tiles cuBLAS runs there; faster at all 12
    suite and every-model shapes it moves, 1.07x in geomean, 1.027x the least (ROW64_MOVED)."""
    return 64 < p.M <= 128 and _row_tiles(p) and p.tiles(*SMALL_EPILOGUE_TILE) <= p.sms


# Measured and not yet in RULES: it takes every row-tiles grid that fills under half the SMs at M > 64, the ones the
# pack's sub-wave alternatives (:func:`alternatives`) and their first-use measurement serve today, and
# benchmarks/subwave_check.py's cases; putting it in means taking those alternatives and their cases down to the
# grids still left sub-wave (the split-k rule's), as the mid-tiles rules did. ``epilogue_check.py --set
# row64_moved`` times the policy with it against the policy as it is.
ROW_TILES_64 = Rule("row-tiles-64", "sm_90a", "v9", when=_row_tiles_64, knobs=_small_m_epilogue_knobs,
                    why="64 < M <= 128 where row-tiles applies and its tiles halved to 64x64 still fit in one wave: "
                        "the small-M epilogue rule's 64x64 tiles (one consumer, 2x1 clusters, B streamed), twice the "
                        "CTAs",
                    evidence=DEEP_RINGS + ": 0.897 -> 0.965x cuBLAS at 128x4096x4096 (cuBLAS's own 64x64 tiles "
                             "there); " + ROW64_MOVED + ": 1.03-1.14x row-tiles' 64x128 at all 12 suite and "
                             "every-model shapes it moves",
                    detail=lambda p: f"{p.tiles(*SMALL_EPILOGUE_TILE)} tiles of 64x64 on {p.sms} SMs")


def with_row_tiles_64(rules=None) -> list:
    """``rules`` (default :data:`RULES`) with :data:`ROW_TILES_64` just before row-tiles."""
    rules = list(RULES if rules is None else rules)
    at = next(i for i, r in enumerate(rules) if r.name == "row-tiles")
    return rules[:at] + [ROW_TILES_64] + rules[at:]


def rule_applies(name: str, p: Problem, rules=None) -> bool:
    """Whether the rule called ``name`` (of ``rules``, default :data:`RULES`) is for ``p``'s arch and
    its ``when`` holds for ``p`` (not whether it wins: an earlier rule may; a check that measures a
    rule asks this). KeyError where no rule has that name."""
    found = [r for r in (RULES if rules is None else rules) if r.name == name]
    if not found:
        raise KeyError(f"no rule named {name!r}; the rules: {', '.join(dict.fromkeys(r.name for r in RULES))}")
    return any(r.arch == p.arch and r.when(p) for r in found)


# -- fp8 (issue 32): its own rules, not the ones above. The rules above choose among 16-bit kernels at
# knobs measured for each kind of shape; fp8 is v9's e4m3 kernel (no other rung builds it) at the knobs
# the fp8 sweep measured fastest among the correct ones (benchmarks/fp8_sweep.py, FP8_RESULTS): the
# promotion every slice (torch._scaled_mm's error to K = 16384; every 8 slices is 1.06-1.13x it) with
# overlap=4 (each group's adds under the next group's wgmmas: +2-10% over the drained promotion), 128x128
# tiles in 2x1 clusters (1x2 and staggered consumers measured slower); at small M (FP8_SMALL_M) 64x64
# tiles over one consumer, 1x2 clusters sharing A, B streamed, an 8-deep ring (1.31x 128x64 tiles). Block
# scales (one K block a promotion, its scales applied as it is added) take the same shape of policy from
# their own sweep (FP8_BLOCK_RESULTS: fp8_sweep.py --recipe block): overlap=4 past M = 128 (+11-18% over
# the drained promotion; 8 groups a run was 2% faster at 4096^3 only, 4-7% slower elsewhere; 1x2 and 1x1
# clusters and 3-6 stages slower), and at small M the per-tensor small-M knobs with overlap=2 (1.11x them);
# both with the scales staged in shared memory by the producer's TMA (stage_scales: no global scale load on
# the consumers' path), +6.5-10.6% past M = 128 and +12.4% at M = 128 (FP8_BLOCK_STAGED_RESULTS).
# A weight's M range takes one runtime-M module a rule: a pack built for it holds the modules scaled_mm
# would build itself (scaled.build_job).
FP8_RESULTS = "benchmarks/results/2026-11-26_h100_fp8_sweep/README.md"
FP8_PROMOTE = 1  # slices of 128 of K between promotions
FP8_ERROR = "1.00x"  # the largest error over torch's of the promotion every slice at K = 4096 to 16384 (the sweep's checks)
FP8_SMALL_M = 128  # up to this M: the small-M knobs
FP8_LARGE_KNOBS = {"promote": FP8_PROMOTE, "overlap": 4}
# The small-M tiles take the overlapped promotion too (overlap=4: FP8_SUBWAVE_RESULTS, run 3, +1-2.5% at M = 64 over
# four weights, +2.3% at 128x4096x7168, +15% at 128x2112x7168).
FP8_SMALL_KNOBS = {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 1, "cluster_n": 2, "stream_b": True,
                   "pipe_depth": 8, "overlap": 4}


# Per-tensor and row scales, many waves: 192x128 tiles over three consumers (64 rows each, the promotion
# every slice after a drain, 64 sums and 64 promoted sums a thread in their 152 registers) in 1x2 clusters:
# a fifth less operand traffic a product than 128x128, and three consumers' drains interleave. Measured
# (FP8_WIDE_RESULTS, three sweep runs): 1243-1326 TFLOPS at 8192^3 against ov4's 1144-1180 (0.98-1.03x
# torch._scaled_mm; 1.007-1.073x through a pack); level at 4096x7168x16384; 4% slower at 4096^3, whose 704
# tiles leave the sixth wave a third full. fp8_wide weighs each tile's waves by that rate. Row scales too (applied in the epilogue as
# per-tensor's are): 1245-1259 TFLOPS at 8192^3 through a pack, 1.02-1.03x torch._scaled_mm rowwise against
# 128x128's 0.94x. (Block scales: 128x128 or 128x256 in halves, FP8_BLOCK_HALVES_KNOBS.)
FP8_WIDE_RESULTS = "benchmarks/results/2026-11-26_h100_fp8_wide/README.md"
FP8_WIDE_KNOBS = {"promote": FP8_PROMOTE, "blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2,
                  "epi_under": True}
FP8_WIDE_RATE = 1.11  # 192x128's rate over ov4's 128x128 with whole waves: 1315 / 1180 TFLOPS at 8192^3


# Per-tensor and row scales: 128x256 tiles over two consumers with the promotion in halves (fp8.py's
# ``halves``: each group's wgmmas as two 128-wide groups into one 64-register set, each half added into its
# half of the total before the other is issued: 128 sums + 64 accumulators a thread where two whole sets
# would take 256), every 2 slices (256 of K: within 1.01x torch._scaled_mm's error to K = 16384; every
# slice drains twice as often, 4-5% slower; every 4 slices holds the whole 4-stage ring, 0.70x), 2x1
# clusters (1x2, 1x1 and staggered consumers: slower or not steadily faster over two machines). Measured
# (FP8_HALVES_RESULTS, five runs on two H100s): 1235-1328 TFLOPS at 4096^3, 1.03-1.05x torch._scaled_mm
# (ov4: 0.93-0.995x); 1300-1317 at 4096x7168x16384, 0.94-1.02x (the wide tiles 0.88-0.95x); level with the
# wide tiles at 8192^3 (1266-1300 against 1280-1317). Its rate with whole waves is the wide tiles' (both
# FP8_WIDE_RATE over ov4's): fp8_tile weighs the three tiles' waves by their rates.
FP8_HALVES_RESULTS = "benchmarks/results/2026-11-27_h100_fp8_halves/README.md"
FP8_HALVES_PROMOTE = 2  # slices of 128 of K between promotions in halves
FP8_HALVES_KNOBS = {"promote": FP8_HALVES_PROMOTE, "blk_n": 256, "halves": True, "epi_under": True}
FP8_HALVES_RATE = FP8_WIDE_RATE  # 128x256 in halves over ov4's 128x128 with whole waves (level with 192x128)
# Both take the epilogue under the next tile (``epi_under``: a tile's scaled sums rounded into 16-bit pairs
# once its K loop ends, its chunks stored while the next tile's first promotion group runs, a half's columns
# under that half's wgmmas; mainloop.Consumer.run_under). Measured (FP8_UNDER_RESULTS, four runs, same rounds):
# halves +1.0-1.6% at 4096^3 (1.027-1.089x torch._scaled_mm over three H100s) and -0.4 to +2.5% at 4096x7168x16384, the wide
# tiles -0.3 to +2.3% at 8192^3. Storing straight from the promoted sums instead (no pairs) spilled in halves (0.6x).
FP8_UNDER_RESULTS = "benchmarks/results/2026-11-27_h100_fp8_under/README.md"


# Per-tensor and rowwise 128-row tiles of the widths cuBLASLt runs where ours were weakest (v9's blk_n in whole
# 16s: each epilogue chunk through the widest swizzle that divides it, epilogue.chunk_swizzle). ncu and torch's
# profiler: 128x96 at 256x6144x4096, 128x112 at 256x7168x16384, 128x144 at 1024x2112x7168. Measured
# (FP8_WIDTHS_RESULTS, run 7, kernels against torch._scaled_mm): 1024x2112x7168 0.72x (192x128) -> 0.84x (128x144);
# 256x6144x4096 0.77x (128x128) -> 0.81x (128x96); 256x7168x16384 0.85x -> 0.93x (128x112, 16-column chunks and 7
# stages: 2.7% over one 112-column chunk and 6); 1024x6144x4096 0.93x -> 1.03x (128x192: one wave of 256 tiles
# where 128x128 take three); held out, 256x14336x4096 0.89x (128x256 in halves) -> 0.93x (128x112), 256x18944x3584
# 0.73x (128x128) -> 0.94x (128x144; 128x96 0.88x), 2048x2112x7168 0.76x (192x128) -> 0.84x (128x144). Run 8, the
# rule's modules where run 7 did not time them (held out but for 256x6144x4096 and 256x24576x1536): 128x192 at
# 512x6144x4096 0.95x (128x256 in halves 0.80x), 1536x2112x7168 1.01x (0.87x), 512x28672x8192 0.93x (128x128 0.91x),
# 256x24576x1536 1.01x (0.94x), 1024x14336x4096 0.94x (0.955x: the one loss, 1.6%); 128x144 at 256x18432x7168
# 0.94x (0.70x), 768x6144x4096 0.88x (192x128 0.80x); 128x112 at 256x6144x4096 0.84x (128x96 0.84x, 128x128
# 0.80x), 512x2112x7168 0.71x (0.66x), 256x7168x2048 0.82x (0.80x), 1536x1024x8192 0.79x (0.91x:
# FP8_NARROW_MAX_M). Each
# width's rate (its TFLOPS over the share of its waves it fills, over 128x128's at the same shape; 144 and 192
# against 128x128 elsewhere) weighs its waves in fp8_tile as the other tiles' rates do: the narrow tiles move more
# operand bytes a product and 144 and 192 take the promotion after a drain (a second accumulator set passes the
# registers), 96's rate is from K = 4096 alone. 128x160 (0.81x at 1024x2112x7168) is not offered. Run 9: 128x224 in
# halves (two 112-wide wgmma groups a promotion every 2 slices, 16-column chunks under the next tile), 256 tiles in two
# waves at 97% where 128x256's 224 fill them at 85%: 1024x7168x16384 0.89x -> 0.98x (1373 TFLOPS), held out
# 512x14336x4096 0.97x -> 1.02x; its rate between those two shapes' (1.07, 1.02). Other clusters for the widths
# (1x1, 1x2 at 128x112 and 128x144) were 5-22% slower. Runs 11 and 12: 128x144, drained, promoted every 2 slices
# (as 128x256 in halves is; the error 1.00x torch's max, 1.01x its mean): 1024x2112x7168 0.84x -> 0.92x,
# 2048x2112x7168 0.84x -> 0.95x, 256x18944x3584 0.95x -> 0.93x (K = 3584); 128x192 so was 4-8% slower at four
# shapes, and the overlapped tiles (128x96, 128x112, the fill and split small-M tiles) level (their adds already
# run under the next group's wgmmas), so only 128x144 takes it. Runs 16 and 17: 128x176 (drained, promoted every 2
# slices, as 128x144), where its waves are fuller than the others': 4096x2112x7168 (12 x 176 = N: 384 tiles, 2.9
# waves) 1.061-1.076x against 192x128's 0.991x (374 tiles, 17 columns of 128 for 16.5) and 128x192's 1.027x,
# 8192x2112x7168 1.042x (0.995x), 768x7168x16384 0.953x (0.895x); where its fill is only 2% better it lost to
# 128x224 and 128x256 in halves at K = 4096 (1024x14336x4096 0.996x against 1.007x, 4096x14336x4096 0.968x against
# 1.037x) and won at K = 8192 and 16384 (512x28672x8192 0.977x against 0.953x, 2048x7168x16384 1.008x against
# 0.971x). Its rate, 1.025, is between what those shapes allow (above 1.017: 4096x2112x7168; below 1.032:
# 1024x14336x4096), so it takes the shapes where its fill is 9% and more better than 192x128's; held out:
# Llama-2-7B's up projection at M = 1024 0.977x against 0.910x, 512x5120x5120 0.892x against 0.865x (it takes
# both), Qwen2.5-1.5B's at M = 1536 0.926x against 128x224's 0.954x (it does not).
FP8_WIDTHS_RESULTS = "benchmarks/results/2026-11-28_h100_fp8_widths/README.md"
FP8_WIDTH_KNOBS = {
    96: {"promote": FP8_PROMOTE, "overlap": 4, "blk_n": 96, "epi_n": 32, "pipe_depth": 7},
    112: {"promote": FP8_PROMOTE, "overlap": 4, "blk_n": 112, "epi_n": 16, "pipe_depth": 7},
    144: {"promote": FP8_HALVES_PROMOTE, "blk_n": 144, "epi_n": 16, "pipe_depth": 6},
    176: {"promote": FP8_HALVES_PROMOTE, "blk_n": 176, "epi_n": 16, "pipe_depth": 5},
    192: {"promote": FP8_PROMOTE, "blk_n": 192},
    224: {**FP8_HALVES_KNOBS, "blk_n": 224, "epi_n": 16},
}
FP8_WIDTH_RATE = {96: 0.79, 112: 0.96, 144: 0.97, 176: 1.025, 192: 1.08, 224: 1.05}
# Tiles narrower than 128 only up to this M (four rows of tiles): measured at M = 256 and 512 (run 8: 256x7168x2048
# 0.82x against 128x128's 0.80x, 512x2112x7168 0.71x against 0.66x), and at 1536x1024x8192 128x112 ran 0.79x where
# 128x128 ran 0.91x (each A row block read by ten tile columns where eight would do, a last column of 16)
FP8_NARROW_MAX_M = 512


# The 128-row tiles run in clusters (2x1: two rows of tiles sharing B's tile; the wide tiles 1x2, sharing A's), and
# the persistent grid is one of cluster tiles (sm90a/schedule.py), so an odd row (or column) of tiles is rounded up
# to a whole cluster. Where that rounding adds a wave, the tiles take twice the time their count says: at M = 320 the
# rules' 128x112 (3 x 37 = 111 tiles) made 2 x 37 = 74 clusters where a wave holds 66, and ran 0.36x
# torch._scaled_mm at 320x4096x14336, 128x144 0.55x at 320x6144x4096 (benchmarks/results/2026-11-29_h200_fp8_tune/,
# door2). Such a tile runs unclustered (1x1) where that takes fewer waves, at 1x1's rate over 2x1's
# (FP8_WIDTHS_RESULTS run 9: 128x112 at 256x6144x4096, 713 against 753 TFLOPS), and fp8_tile weighs each tile in
# the cluster it would run in (FP8_SWAP_RESULTS' first table: 22 of 22 shapes faster, 1.16-2.08x).
FP8_UNCLUSTERED_RATE = 0.95
FP8_TILE_SHAPES = {"square": (128, 128), "wide": (192, 128), "halves": (128, 256)}  # and n<width>: (128, width)


def fp8_tile_shape(tile: str) -> tuple[int, int]:
    """The (blk_m, blk_n) of :func:`fp8_tile`'s 128-row (or 192-row) tile ``tile``."""
    return (128, int(tile[1:])) if tile.startswith("n") else FP8_TILE_SHAPES[tile]


def cluster_waves(M: int, N: int, blk_m: int, blk_n: int, cluster: tuple[int, int], sms: int = 132) -> int:
    """Waves of a persistent grid of ``cluster`` (rows, columns of tiles) cluster tiles of blk_m x blk_n at M x N:
    an odd row or column of tiles rounded up to a whole cluster, ``sms // size`` clusters a wave."""
    cm, cn = cluster
    clusters = math.ceil(math.ceil(M / blk_m) / cm) * math.ceil(math.ceil(N / blk_n) / cn)
    return math.ceil(clusters / (sms // (cm * cn)))


def fp8_tile_cluster(M: int, N: int, tile: str, sms: int = 132) -> tuple[int, int]:
    """The cluster :func:`fp8_tile`'s ``tile`` runs in at M x N: its own (1x2 for ``wide``, else 2x1), or 1x1
    where the own cluster's rounding costs a wave (FP8_UNCLUSTERED_RATE)."""
    if tile == "small":
        raise ValueError("the small-M tiles' clusters are FP8_SMALL_KNOBS' (fp8_module); fp8_tile_cluster is for "
                         "the 128-row and wide tiles")
    bm, bn = fp8_tile_shape(tile)
    own = (1, 2) if tile == "wide" else (2, 1)
    return own if cluster_waves(M, N, bm, bn, own, sms) <= cluster_waves(M, N, bm, bn, (1, 1), sms) else (1, 1)


def fp8_tile(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> str:
    """The tile fp8 at M x N with ``recipe``'s scales takes: ``small`` up to FP8_SMALL_M, then the one
    whose share of its waves' SM time, times its measured rate, is highest (ties: in this order): for
    per-tensor or rowwise scales, ``square`` (128x128, ov4), ``wide`` (192x128 over three consumers),
    ``halves`` (128x256 promoted in halves) and, where 128x128 tiles fill more than half the SMs, ``n96`` ..
    ``n224`` (128 rows, FP8_WIDTH_KNOBS; those under 128 up to FP8_NARROW_MAX_M); for block
    scales (whose tiles cover whole 128-column B blocks), ``square`` (128x128, ov4 with staged scales) and
    ``halves``. Waves are counted in the cluster each tile would run in (:func:`fp8_tile_cluster`)."""
    if M <= FP8_SMALL_M:
        return "small"
    score = fp8_tile_scores(M, N, sms, recipe)
    return max(score, key=score.get)


def fp8_tile_scores(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> dict[str, float]:
    """Each tile :func:`fp8_tile` weighs at M x N (past FP8_SMALL_M): the share of its waves' SM time it fills (in
    the cluster it would run in), times its measured rate."""
    p = Problem(M, N, 1, sms=sms)

    def used(tile: str) -> float:
        (bm, bn), cluster = fp8_tile_shape(tile), fp8_tile_cluster(M, N, tile, sms)
        rate = FP8_UNCLUSTERED_RATE if cluster == (1, 1) else 1.0
        return rate * M * N / (cluster_waves(M, N, bm, bn, cluster, sms) * sms * bm * bn)
    if recipe not in ("tensor", "row"):  # block scales: 128x128 (ov4, staged scales) or 128x256 in halves
        score = {"square": used("square"), "halves": used("halves") * FP8_BLOCK_HALVES_RATE}
    else:
        score = {"square": used("square"), "wide": used("wide") * FP8_WIDE_RATE,
                 "halves": used("halves") * FP8_HALVES_RATE}
        if p.tiles(128, 128) > sms // 2:  # fewer: the fill rule's 64-row tiles or the split (fp8_module)
            score |= {f"n{bn}": used(f"n{bn}") * rate for bn, rate in FP8_WIDTH_RATE.items()
                      if bn >= 128 or M <= FP8_NARROW_MAX_M}
    return score


def fp8_wide(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> bool:
    """Whether fp8 at M x N with ``recipe``'s scales takes FP8_WIDE_KNOBS (:func:`fp8_tile`)."""
    return fp8_tile(M, N, sms, recipe) == "wide"


def fp8_halves(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> bool:
    """Whether fp8 at M x N with ``recipe``'s scales takes FP8_HALVES_KNOBS (:func:`fp8_tile`)."""
    return fp8_tile(M, N, sms, recipe) == "halves"


FP8_BLOCK_RESULTS = "benchmarks/results/2026-11-26_h100_fp8_block_overlap/README.md"
FP8_BLOCK_STAGED_RESULTS = "benchmarks/results/2026-11-26_h100_fp8_block_staged_fix/README.md"
FP8_BLOCK_LARGE_KNOBS = {"promote": FP8_PROMOTE, "overlap": 4, "stage_scales": True}
FP8_BLOCK_SMALL_KNOBS = {**FP8_SMALL_KNOBS, "overlap": 2, "stage_scales": True}
# Block scales in halves (each half one B block's scale at its adds), the epilogue under the next tile's
# first slice, the scales staged in the ring by the producer's TMA and read under half 0's wgmmas
# (stage_scales; a four-stage 128x256 ring, its staging and the scales' rows pass the 227 KiB a block may
# use, so three stages). FP8_UNDER_RESULTS's block runs: unstaged, 1143-1179 TFLOPS, +3.7-7.9% over 128x128
# with overlap=4 and staged scales. FP8_BLOCK_STAGED_HALVES_RESULTS (two runs, same rounds): staged,
# 1118-1219 TFLOPS at 4096^3, 8192^3 and 4096x7168x16384, 1.006-1.050x torch._scaled_mm block-wise, +0.8-4.9%
# over the unstaged four-stage ring and +5.4-10.6% over 128x128 (both tiles' waves equally full there).
# Its rate with whole waves over 128x128's: 1.05 (4096^3's lower gain), weighed by fp8_tile.
FP8_BLOCK_STAGED_HALVES_RESULTS = "benchmarks/results/2026-11-27_h100_fp8_block_staged_halves/README.md"
FP8_BLOCK_HALVES_KNOBS = {"promote": FP8_PROMOTE, "blk_n": 256, "halves": True, "epi_under": True,
                          "stage_scales": True, "pipe_depth": 3}
FP8_BLOCK_HALVES_RATE = 1.05


# Per-tensor and rowwise 128x128 tiles under one wave (each SM one tile, or one split-K unit) wait on their
# loads more than on the tensor cores: a 6-stage ring, as cuBLASLt's kernels there run 7 (FP8_SUBWAVE_RESULTS,
# run 4: 256x6144x4096 0.70x -> 0.79x torch._scaled_mm, 256x7168x16384 0.78x -> 0.88x, the split at
# 256x4096x14336 0.83x -> 0.91x and at 256x2112x7168 0.65x -> 0.67x). Over many waves 6 stages were 1.5-2%
# slower than 4 at 4096^3 (FP8_HALVES_RESULTS), so whole waves keep FP8_LARGE_KNOBS' four.
FP8_SUBWAVE_DEPTH = 6


# The overlapped tiles' K loop unrolled over the whole tile (v9's unroll_k) where its registers and code fit
# (budget.fp8_unroll_fits): the 64-row tiles' loop kept the ring's slot and descriptor arithmetic in vector
# registers, moved over to uniform ones for every wgmma; unrolled, nvcc keeps it uniform. FP8_UNROLL_RESULTS
# (H200): 256x2112x7168's fill tile 13.6 -> 12.8 us (-6%), 64x6144x4096's small-M tile -4%, 256x6144x4096's
# 128x112 -3%, 256x6144x7168's -4%, 256x2112x10240's fill tile -5%; where the estimate says no (K = 14336 at
# 64x64, 64x128 over one consumer) the unrolled loop ran 4-79% slower.
FP8_UNROLL_RESULTS = "benchmarks/results/2026-11-28_h200_fp8_unroll/README.md"
FP8_UNROLL_EVIDENCE = (FP8_UNROLL_RESULTS + ": the overlapped tiles unrolled (unroll_k, where they fit) on an H200, "
                       "256x2112x7168 0.823x -> 0.859x torch._scaled_mm, 64x6144x4096 0.951x -> 0.983x, 256x6144x4096 "
                       "0.844x -> 0.867x; held out faster or level at 4 of 4; runs 24-25: 64x64 fill unrolled every 2 "
                       "slices, 256x2112x7168 0.874x -> 0.900x, held out +0.7-3.7% at 4 of 4")


def fp8_unrolled(knobs: dict, K: int, recipe: str) -> dict:
    """``knobs`` of a v9 (or v10) fp8 tile with ``unroll_k`` added where the overlapped promotion's loop
    fits unrolled (:func:`budget.fp8_unroll_fits`: per-tensor and rowwise, ``overlap`` on, no halves or
    stagger; v10's split only where it divides the slices, a unit's count then fixed)."""
    if (recipe == "block" or not knobs.get("overlap") or knobs.get("halves") or knobs.get("stagger")
            or knobs.get("k_consumers", 1) > 1 or knobs.get("stream_k")):
        return knobs
    slices, split = -(-K // 128), knobs.get("split_k", 1)
    if slices % split:
        return knobs
    blk_m, blk_n = knobs.get("blk_m", 128), knobs.get("blk_n", 128)
    if not fp8_unroll_fits(blk_m, blk_n, knobs.get("num_warpgroups", 2), slices // split * 128, 128,
                           knobs.get("promote", 1)):
        return knobs
    return {**knobs, "unroll_k": True}


def fp8_knobs(M: int, N: int, K: int, recipe: str, sms: int = 132) -> dict:
    """v9's knobs for a scaled e4m3 GEMM (``scaled_mm``'s): the policy above, by M, N and the recipe,
    the overlapped tiles unrolled where they fit (:func:`fp8_unrolled`)."""
    tile = fp8_tile(M, N, sms, recipe)
    if tile == "small":
        return dict(FP8_BLOCK_SMALL_KNOBS) if recipe == "block" else fp8_unrolled(dict(FP8_SMALL_KNOBS), K, recipe)
    unclustered = {"cluster_m": 1, "cluster_n": 1} if fp8_tile_cluster(M, N, tile, sms) == (1, 1) else {}
    if recipe == "block":
        return {**{"square": FP8_BLOCK_LARGE_KNOBS, "halves": FP8_BLOCK_HALVES_KNOBS}[tile], **unclustered}
    if tile == "square" and Problem(M, N, K, sms=sms).tiles(128, 128) <= sms:
        knobs = {**FP8_LARGE_KNOBS, "pipe_depth": FP8_SUBWAVE_DEPTH}
    elif tile.startswith("n"):
        knobs = dict(FP8_WIDTH_KNOBS[int(tile[1:])])
    else:
        knobs = dict({"square": FP8_LARGE_KNOBS, "wide": FP8_WIDE_KNOBS, "halves": FP8_HALVES_KNOBS}[tile])
    return fp8_unrolled({**knobs, **unclustered}, K, recipe)


def fp8_width(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> int | None:
    """The blk_n of FP8_WIDTH_KNOBS fp8 at M x N with ``recipe``'s scales takes (:func:`fp8_tile`), else None."""
    tile = fp8_tile(M, N, sms, recipe)
    return int(tile[1:]) if tile.startswith("n") else None


# Per-tensor and rowwise fp8 whose tiles would fill at most half the SMs (the fp8 suite's sub-wave cases:
# benchmarks/results/2026-11-27_h100_fp8_suite/): v10's split K (each unit's promoted sums the partials, the
# scales once after the sum). FP8_SPLIT_RESULTS (two runs, M = 256, 128x128 tiles): 773-778 TFLOPS at 4096x14336
# (0.83x torch._scaled_mm, v9's 128x128 0.66x) and 381-384 at 2112x7168 (0.59x, from 0.48x), its 64 and 34
# tiles; at 96 and 112 tiles (6144x4096, 7168x16384) slower than v9's (0.48-0.65x against 0.70-0.80x); four ways
# and eight, whose units took two waves, slower everywhere. FP8_SUBWAVE_RESULTS (three runs): three ways at
# 2112x7168 (a split that does not divide its 56 slices: units counted at run time) 0.64x against two ways'
# 0.58-0.60x; the small-M tiles (64x64 in 1x2 clusters) split too, with the overlapped promotion: 64x2112x7168
# three ways 0.83x (v9's small-M tiles 0.60x; drained 0.80-0.81x), 64x4096x14336 two ways 0.95x (0.86-0.87x;
# drained 0.92x). The 128x128 split with overlap=4 was 1.5-3% slower, and stream-K slower than v9 at every
# sub-wave shape measured (0.56-0.74x against 0.70-0.80x). No bias (v10's fp8 is built without one).
FP8_SPLIT_RESULTS = "benchmarks/results/2026-11-27_h100_fp8_split/README.md"
FP8_SUBWAVE_RESULTS = "benchmarks/results/2026-11-27_h100_fp8_subwave/README.md"
FP8_SPLIT_MAX = 3  # the most ways measured with every unit in one wave
FP8_SPLIT_MIN_K = 7168  # the K measured (7168 and 14336): each unit keeps a long K loop


# Per-tensor and rowwise fp8 whose 128x128 tiles fill at most half the SMs, where 64-row tiles over one consumer
# in 2x1 clusters (two row tiles sharing B's tile; the small-M tiles' ring and overlapped promotion) come to
# one whole wave: each SM one tile of the whole K, no split's partial sums, no idle SMs. FP8_FILL_RESULTS (run
# 5, M = 256): 64x64 at 2112x7168 (4 x 33 = 132 tiles) 510 TFLOPS, 0.79x torch._scaled_mm, against the
# three-way 128x128 split's 424 (0.65x) and the same tiles in 1x1 clusters 0.73x; 64x128 at 4096x14336 (128
# tiles) 927, 0.995x, against the two-way split's 845 (0.91x) and 1x2 clusters' 0.77x. 64x192 (128 tiles at
# 6144x4096, drained: no second accumulator set fits) ran 0.76x against 128x128's 0.78x (96 tiles), so it is
# not offered. cuBLASLt's kernel at 256x2112x7168 is the same tiling (ncu: nvjet 64x64, 13 stages, 132 CTAs).
FP8_FILL_RESULTS = "benchmarks/results/2026-11-28_h100_fp8_fill/README.md"
FP8_FILL_KNOBS = {**FP8_SMALL_KNOBS, "cluster_m": 2, "cluster_n": 1}
FP8_FILL_WIDTHS = (128, 64)  # blk_n tried, widest first
# each width's ring: as deep as 192 KiB of stages holds (64x64: 12 stages of 16 KiB, cuBLASLt's 64x64 runs 13;
# run 6: 0.819x against 8 stages' 0.797x at 256x2112x7168); 64x128's 24 KiB stages: 8
FP8_FILL_DEPTH = {64: 12, 128: 8}
# the 64x64 fill tile, unrolled, promotes every 2 slices (two groups a run: half the adds a slice): FP8_UNROLL_RESULTS,
# runs 24-25 on an H200, 256x2112x7168 0.874x / 0.873x -> 0.900x / 0.897x torch._scaled_mm, and faster at each of
# four (weight, M) no run chose on (+0.7-3.7%), the error within torch's; rolled, it was slower (run 11)
FP8_FILL_PAIRS = {"promote": 2, "overlap": 2}
FP8_FILL_MIN = 0.95  # the share of one wave the tiles must fill


def fp8_fill_n(M: int, N: int, sms: int = 132, recipe: str = "tensor") -> int | None:
    """The blk_n of FP8_FILL_KNOBS' 64-row tiles where per-tensor or rowwise fp8 at M x N (M past
    FP8_SMALL_M) takes them: its 128x128 tiles fill at most half the SMs, and these tiles' CTAs (their 2x1
    clusters' rows rounded up to pairs) come to FP8_FILL_MIN to one of a wave (widest first); else None."""
    if recipe not in ("tensor", "row") or M <= FP8_SMALL_M or Problem(M, N, 1, sms=sms).tiles(128, 128) > sms // 2:
        return None
    rows = 2 * math.ceil(math.ceil(M / 64) / 2)
    return next((bn for bn in FP8_FILL_WIDTHS if FP8_FILL_MIN * sms <= rows * math.ceil(N / bn) <= sms), None)


def fp8_cluster_tile(rung: str, knobs: dict) -> tuple[int, int]:
    """The rows and columns a cluster of ``rung``'s e4m3 module with ``knobs`` covers (the rung's fp8
    defaults for the knobs not given): 1x2 of the small-M 64x64 tiles, 2x1 of 128x128."""
    knobs = make_config(rung, 512, 512, 4096, spec=GemmSpec.fp8(), **knobs).knobs()
    return knobs["blk_m"] * knobs["cluster_m"], knobs["blk_n"] * knobs["cluster_n"]


# At 64 < M <= 128 the small-M tiles' two rows split in 2x1 clusters (sharing B's tile, the large operand, as the
# fill rule's tiles do) rather than the small-M 1x2 (sharing A's). FP8_PAIR_RESULTS (run 20, kernels against
# torch._scaled_mm): 128x2112x7168 0.72x (unsplit 1x2: 34 clusters of 1x2 fill half the SMs, not split) -> 0.81x
# (two ways), 96x2112x7168 0.88x -> 0.94x, 128x1024x7168 0.78x (three ways in 1x2) -> 0.87x (four ways in 2x1;
# two ways 0.78x), 128x2048x8192 0.74x (two ways in 1x2) -> 0.84x (two ways in 2x1). Unsplit, 2x1 and 1x2 were
# level (0.718x, 0.721x at 128x2112x7168), so only the split takes the pair.
FP8_PAIR_RESULTS = "benchmarks/results/2026-11-28_h100_fp8_pairs/README.md"
FP8_SMALL_PAIR_KNOBS = {**FP8_SMALL_KNOBS, "cluster_m": 2, "cluster_n": 1}


def _fp8_split_base(tile: str, M: int) -> dict:
    """The knobs v10's fp8 split takes (before ``promote`` and ``split_k``) where v9 takes ``tile``: the
    small-M tiles in 1x2 clusters at one row of tiles, 2x1 at two (FP8_SMALL_PAIR_KNOBS)."""
    if tile == "small":
        return FP8_SMALL_PAIR_KNOBS if M > 64 else FP8_SMALL_KNOBS
    return {"pipe_depth": FP8_SUBWAVE_DEPTH}


def fp8_split_ways(M: int, N: int, K: int, sms: int = 132, recipe: str = "tensor", bias=None) -> int:
    """How many ways per-tensor or rowwise fp8 at M x N x K (no bias, K >= FP8_SPLIT_MIN_K) splits its K on
    v10 (1: not split): where v9 takes the small-M tiles or 128x128, the split up to FP8_SPLIT_MAX whose
    units' waves take the least time, ``ceil(cluster tiles * ways / clusters) / ways`` of a whole K loop,
    when that is at most half the unsplit tiles' time (fewest ways on a tie)."""
    if recipe not in ("tensor", "row") or bias is not None or K < FP8_SPLIT_MIN_K:
        return 1
    tile = fp8_tile(M, N, sms, recipe)
    if tile not in ("small", "square"):
        return 1
    cluster_tiles = Problem(M, N, K, sms=sms).tiles(*fp8_cluster_tile("v10", _fp8_split_base(tile, M)))
    time = {ways: math.ceil(cluster_tiles * ways / (sms // 2)) / ways for ways in range(1, FP8_SPLIT_MAX + 1)}
    best = min(time, key=lambda ways: (time[ways], ways))
    return best if time[best] <= time[1] / 2 else 1


def fp8_module(M: int, N: int, K: int, recipe: str, bias=None, sms: int = 132) -> tuple[str, dict]:
    """The rung and knobs of scaled_mm's module at M x N x K (what the FP8_RULES choose): v10's split K
    where :func:`fp8_split_ways` says so (the small-M tiles with the overlapped promotion), else v9 with
    :func:`fp8_knobs`; launched as a programmatic dependent where :func:`pdl_pays` says, as a pack's module is."""
    rung, knobs = _fp8_module(M, N, K, recipe, bias, sms)
    p = Problem(M, N, K, "bfloat16", "sm_90a", sms, GemmSpec.fp8("bfloat16", recipe, "bfloat16" if bias else None))
    return rung, ({**knobs, "pdl": True} if pdl_pays(p, rung, with_spec(knobs, p)) else knobs)


def fp8_policy(M: int, N: int, K: int, recipe: str, bias=None, sms: int = 132, db=None) -> tuple[str, dict, str]:
    """The rung and knobs of the module ``scaled_mm`` builds at M x N x K, and what chose them: the tuning
    database's entry of this fp8 spec in the shape's bucket (:func:`db_choice`, ``tune --dtype float8_e4m3``)
    where there is one, else :func:`fp8_module` (the :data:`FP8_RULES`). The knobs hold no dtype, arch or
    spec (the caller's build adds them)."""
    p = Problem(M, N, K, "bfloat16", "sm_90a", sms, GemmSpec.fp8("bfloat16", recipe, "bfloat16" if bias else None))
    found, _, _ = db_choice(p, None, db)
    if found is not None:
        return found.rung, {k: v for k, v in found.knobs.items() if k not in ("dtype", "arch", "spec")}, \
            f"tuning database, {found.why}"
    rung, knobs = fp8_module(M, N, K, recipe, bias, sms)
    return rung, knobs, f"plan.FP8_RULES: {knobs or 'v9 fp8 defaults'}"


# Per-tensor and rowwise fp8 at mid M with the operands swapped (v11: B's rows in wgmma's 64-row slot, M on its N, a
# multiple of 16 here): tiles whose rows divide M where v9's come in 64-row steps. cuBLASLt runs such tiles there
# (torch's profiler: 80 rows of M by 128 of N at 320x4096x14336, 160 by 128 at 640x4096x14336, 80 by 64 at
# 320x2112x7168). FP8_SWAP_RESULTS (H200, kernels in graphs, v9's module from the rules at cc5c878 in the same
# rounds), 24 A/Bs at 272 <= M <= 768: 80x128 over two consumers with the overlapped promotion +22-57% at M = 288 and
# 320 of four weights, 160x128 drained (two sets and the sums pass the registers) +9-11% at five shapes, 144x128 +32%
# at 272x6144x4096, 80x64 over one consumer +67% at 320x2112x7168, 64x128 +28% at 384x2112x7168; level or slower where
# v9's tile already fits M (384x4096x14336 0.98x, 576x7168x16384 0.96x, 352x5120x5120 0.93x) or is 112-128 rows of its
# own (0.97-1.01x at five). A swap tile is weighed as fp8_tile weighs v9's (the share of its waves it fills) at its
# rate over v9's 128x128 (fp8_swap_rate), and taken where it beats the rules' v9 tile by FP8_SWAP_MARGIN and that tile
# pads M by FP8_SWAP_PAD or more (or fills at most half the SMs): fitted to the 24, it takes every one that ran 1.05x
# or more and none that ran slower. Past M = 256 (below, the fill and split rules' measured tiles) to FP8_SWAP_MAX_M.
# Rowwise scales from FP8_SWAP_NARROW_RESULTS on (v11 applies them to the transposed fragment, B's by row): the same
# tiles, 1.11-1.93x the rules' v9 at 12 shapes. Not block scales (applied by K block at each promotion, indexed by the
# tile's rows).
# FP8_SWAP_NARROW_RESULTS (2026-11-30): 64 columns of N a tile fill the SMs of a narrow weight (2112 / 64 = 33 columns
# of tiles, M over four rows of them: 132 tiles) where v9's tiles leave part of a wave. Over one consumer, the
# promotion overlapped up to 128 rows (two sets and the sums pass the registers: FP8_SWAP_OVERLAP_MAX_M), 128x64 ran
# 1.24x the rules at 512x2112x7168 (0.95x torch) and 96x64 1.19x at 384x2112x7168 (0.96x); past 128 rows the two
# consumers take half the rows of M each (v11's split_m, each overlapped), 160x64 1.19x at 640x2112x7168 (1.02x torch)
# and 192x64 1.10x at 768 (0.84x). So a 64-column tile is taken without the pad test (the three that lost were drained
# 128-column tiles where v9's tile fit M), at its own rate (FP8_SWAP_N64_RATES).
FP8_SWAP_RESULTS = "benchmarks/results/2026-11-29_h200_fp8_mid/README.md"
FP8_SWAP_NARROW_RESULTS = "benchmarks/results/2026-11-30_h200_fp8_narrow/README.md"
FP8_SWAP_MIN_M, FP8_SWAP_MAX_M = 256, 768  # M past the first, up to the second
FP8_SWAP_RECIPES = ("tensor", "row")  # v11's fp8 scales (block scales index the tile's rows at each promotion)
FP8_SWAP_MARGIN = 1.05
FP8_SWAP_PAD = 1.12  # the rows of M the rules' tiles cover over M, at least (448: 1.14, 576: 1.11)
# the most rows of M whose two accumulator sets and promoted sums fit a consumer's registers: 128-column tiles over
# two consumers (80 and 96 ran), 64-column ones over one (128 ran)
FP8_SWAP_OVERLAP_MAX_M = {128: 96, 64: 128}
FP8_SWAP_SPLIT_MAX_M = 192  # 64-column tiles past 128 rows: two consumers of at most 96 rows each (split_m)
FP8_SWAP_DEPTH = {128: 6, 64: 8}  # each width's ring: as deep as measured (80x128: 6, 80x64: 8 and 12 level)
# a 64-column tile's rate by its rows of M (FP8_SWAP_NARROW_RESULTS, each over the rules' v9 tile weighed as
# fp8_tile weighs it): one consumer 0.52-0.59 at 80 rows, 0.60-0.72 at 96 (1.19x 64x128's, rated 0.8 and filling 0.77
# of its wave there), 0.66-0.68 at 128; two on halves of M 0.75-0.77 at 160, 0.82 at 192
FP8_SWAP_N64_RATES = ((80, 0.55), (96, 0.62), (128, 0.67), (160, 0.76), (192, 0.82))


def fp8_swap_rate(blk_m: int, blk_n: int) -> float:
    """A swap tile's rate over v9's 128x128 (FP8_SWAP_RESULTS): 64 columns FP8_SWAP_N64_RATES' (the first row bound at
    or past ``blk_m``); 128 over two consumers, with the overlapped promotion (up to FP8_SWAP_OVERLAP_MAX_M rows)
    0.8, drained 0.9 under 144 rows and 1.0 from 144."""
    if blk_n == 64:
        return next(rate for most, rate in FP8_SWAP_N64_RATES if blk_m <= most)
    return 0.8 if blk_m <= FP8_SWAP_OVERLAP_MAX_M[128] else 0.9 if blk_m < 144 else 1.0


def fp8_swap_tiles(M: int, N: int, sms: int = 132) -> dict[tuple[int, int], float]:
    """(blk_m, blk_n) -> score of v11's per-tensor fp8 tiles at M x N: rows of M a multiple of 16 from 64 to 256
    (M over 1 to 8 rows of tiles; 64-column tiles up to FP8_SWAP_SPLIT_MAX_M), 128 or 64 columns of N, weighed by
    :func:`fp8_swap_rate`."""
    out = {}
    for blk_n in (128, 64):
        for rows in range(1, 9):
            bm = 16 * math.ceil(math.ceil(M / rows) / 16)
            if not 64 <= bm <= (FP8_SWAP_SPLIT_MAX_M if blk_n == 64 else 256):
                continue
            waves = cluster_waves(M, N, bm, blk_n, (1, 1), sms)
            out[(bm, blk_n)] = fp8_swap_rate(bm, blk_n) * M * N / (waves * sms * bm * blk_n)
    return out


def fp8_swap_knobs(M: int, N: int, K: int, recipe: str, sms: int = 132) -> dict | None:
    """v11's knobs where per-tensor or rowwise fp8 at M x N x K (FP8_SWAP_MIN_M < M <= FP8_SWAP_MAX_M) takes swapped
    operands: the best of :func:`fp8_swap_tiles` where it beats the rules' v9 tile (:func:`fp8_tile_scores`) by
    FP8_SWAP_MARGIN and, for a 128-column tile, that tile pads M by FP8_SWAP_PAD or fills at most half the SMs; else
    None. A 64-column tile past FP8_SWAP_OVERLAP_MAX_M rows runs over two consumers on halves of its rows
    (``split_m``)."""
    if recipe not in FP8_SWAP_RECIPES or not FP8_SWAP_MIN_M < M <= FP8_SWAP_MAX_M:
        return None
    tiles = fp8_swap_tiles(M, N, sms)
    if not tiles:
        return None
    (bm, bn), score = max(tiles.items(), key=lambda t: t[1])
    rules = fp8_tile_scores(M, N, sms, recipe)
    rules_m, rules_n = fp8_tile_shape(max(rules, key=rules.get))
    pads = math.ceil(M / rules_m) * rules_m >= FP8_SWAP_PAD * M
    few = Problem(M, N, 1).tiles(rules_m, rules_n) <= sms // 2
    if score < FP8_SWAP_MARGIN * max(rules.values()) or not (pads or few or bn == 64):
        return None
    split = bn == 64 and bm > FP8_SWAP_OVERLAP_MAX_M[bn]
    knobs = {"blk_m": bm, "blk_n": bn, "num_warpgroups": 2 if split else bn // 64, "split_k": 1,
             "promote": FP8_PROMOTE}
    if split:
        knobs["split_m"] = True
    if split or bm <= FP8_SWAP_OVERLAP_MAX_M[bn]:
        knobs["overlap"] = 4
    p = Problem(M, N, K, "bfloat16", "sm_90a", sms)
    fp8_spec = {"blk_k": 128, **spec_knobs(GemmSpec.fp8("bfloat16", recipe))}
    return {**knobs, "pipe_depth": _deepest("v11", p, {**knobs, **fp8_spec}, FP8_SWAP_DEPTH[bn])}


def _fp8_module(M: int, N: int, K: int, recipe: str, bias, sms: int) -> tuple[str, dict]:
    fill = fp8_fill_n(M, N, sms, recipe)
    if fill is not None:
        knobs = fp8_unrolled({**FP8_FILL_KNOBS, "blk_n": fill, "pipe_depth": FP8_FILL_DEPTH[fill]}, K, recipe)
        if fill == 64 and knobs.get("unroll_k"):
            knobs.update(FP8_FILL_PAIRS)
        return "v9", knobs
    ways = fp8_split_ways(M, N, K, sms, recipe, bias)
    if ways > 1:
        return "v10", {**_fp8_split_base(fp8_tile(M, N, sms, recipe), M), "promote": FP8_PROMOTE, "split_k": ways}
    swap = fp8_swap_knobs(M, N, K, recipe, sms) if bias is None else None
    if swap is not None:
        return "v11", swap
    return "v9", fp8_knobs(M, N, K, recipe, sms)


def _fp8(p: Problem, block: bool) -> bool:
    """Whether ``p`` is a scaled fp8 GEMM with block scales (``block``) or with the others."""
    return p.spec is not None and p.spec.is_fp8 and (p.spec.scales == "block") == block


FP8_RULES: list[Rule] = [
    Rule("fp8-block-small-m", "sm_90a", "v9", when=lambda p: _fp8(p, True) and p.M <= FP8_SMALL_M,
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why=f"fp8 with block scales and M <= {FP8_SMALL_M}: the per-tensor small-M knobs (64x64 tiles over one "
             "consumer, 1x2 clusters sharing A, B streamed, an 8-deep ring) with each K block's scaled adds under "
             "the next block's wgmmas (overlap=2), the scales staged in shared memory by the producer's TMA "
             "(stage_scales)",
         evidence=FP8_BLOCK_STAGED_RESULTS + ": 128x4096x7168, 420 TFLOPS, 1.31x torch._scaled_mm block-wise "
                  "(without stage_scales 374, 1.17x; " + FP8_BLOCK_RESULTS + ": v9's fp8 defaults 0.75x)"),
    Rule("fp8-block-halves", "sm_90a", "v9",
         when=lambda p: _fp8(p, True) and fp8_tile(p.M, p.N, p.sms, "block") == "halves",
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why="fp8 with block scales where 128x256 tiles fill their waves best: two consumers of 64x256, each 128 "
             "of K issued as two 128-wide wgmma groups into one 64-register set (halves=True), each half promoted "
             "with its own B block's scale, the scales staged in a three-stage ring by the producer's TMA and read "
             "under half 0's wgmmas (stage_scales); each tile's epilogue under the next tile's first slice (epi_under)",
         evidence=FP8_BLOCK_STAGED_HALVES_RESULTS + ": 1118-1219 TFLOPS at 4096^3, 8192^3 and 4096x7168x16384, "
                  "1.006-1.050x torch._scaled_mm block-wise, +5.4-10.6% over 128x128 with overlap=4 and staged "
                  "scales; " + FP8_UNDER_RESULTS + ": unstaged, 1143-1179 TFLOPS, 0.96-1.03x"),
    Rule("fp8-block", "sm_90a", "v9", when=lambda p: _fp8(p, True), knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why="fp8 with block scales: v9's e4m3 kernel (128x128 tiles over two consumers, 2x1 clusters), each 128 "
             "of K promoted into fp32 as its block's scales apply, the scaled adds of four K blocks overlapped "
             "with the next block's wgmmas (overlap=4), the scales staged in shared memory by the producer's TMA "
             "(stage_scales)",
         evidence=FP8_BLOCK_STAGED_RESULTS + ": 1060-1111 TFLOPS, 0.95-0.98x torch._scaled_mm block-wise at "
                  "4096^3, 8192^3, 4096x4096x7168, 4096x7168x16384 (without stage_scales 974-1013, 0.86-0.92x)"),
    Rule("fp8-fill", "sm_90a", "v9",
         when=lambda p: _fp8(p, False) and fp8_fill_n(p.M, p.N, p.sms, p.spec.scales) is not None,
         knobs=lambda p: fp8_module(p.M, p.N, p.K, p.spec.scales, p.spec.bias, p.sms)[1],
         why=f"per-tensor or rowwise fp8 whose 128x128 tiles would fill at most half the SMs, where 64-row tiles "
             f"(64 or 128 wide) over one consumer in 2x1 clusters sharing B come to {FP8_FILL_MIN:.0%} of one wave or "
             "more: each SM one tile of the whole K (no split), a 12- or 8-stage ring (192 KiB), each group's adds "
             "under the next group's wgmmas (overlap=4), the loop unrolled over the tile where it fits (unroll_k; "
             "64x64 unrolled promotes every 2 slices, overlap=2)",
         evidence=FP8_FILL_RESULTS + ": M = 256, 64x64 at 2112x7168 0.79-0.80x torch._scaled_mm (the three-way "
                  "split 0.65-0.67x; 12 stages 0.82x), 64x128 at 4096x14336 0.99-0.995x (the two-way split 0.91x); "
                  "held out: 64x128 at 4096x4096 0.895x (128x128 0.72x), 64x64 at 200x2048x8192 0.66x (the split 0.67x); "
                  + FP8_UNROLL_EVIDENCE),
    Rule("fp8-split-k", "sm_90a", "v10",
         when=lambda p: _fp8(p, False) and fp8_split_ways(p.M, p.N, p.K, p.sms, p.spec.scales, p.spec.bias) > 1,
         knobs=lambda p: fp8_module(p.M, p.N, p.K, p.spec.scales, p.spec.bias, p.sms)[1],
         why=f"per-tensor or rowwise fp8 whose tiles (the small-M tiles or 128x128, its ring {FP8_SUBWAVE_DEPTH} deep) "
             f"would fill at most half the SMs: v10's split K, each tile's K over two or three CTAs (up to "
             f"{FP8_SPLIT_MAX}: the fewest units' waves), "
             "each unit's sums promoted into fp32 every 128 of K (the small-M tiles' overlapped, as on v9) and "
             "summed by the last unit, the scales applied once after the sum; the small-M tiles' two rows at "
             "64 < M <= 128 in 2x1 clusters sharing B",
         evidence=FP8_SPLIT_RESULTS + ": M = 256, 773-778 TFLOPS at 4096x14336 (0.83x torch._scaled_mm; v9's "
                  "128x128 0.66x), 381-384 at 2112x7168 (0.59x; 0.48x); " + FP8_SUBWAVE_RESULTS + ": three ways "
                  "at 256x2112x7168 0.64x; 64x2112x7168 0.83x (v9's small-M tiles 0.60x), 64x4096x14336 0.95x "
                  "(0.87x); " + FP8_PAIR_RESULTS + ": 2x1 at M = 96-128, 0.72-0.88x -> 0.81-0.94x at four weights"),
    Rule("fp8-small-m", "sm_90a", "v9", when=lambda p: _fp8(p, False) and p.M <= FP8_SMALL_M,
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why=f"fp8 with M <= {FP8_SMALL_M}: reading B is the cost, so 64x64 tiles over one consumer (four times "
             "v9's fp8 CTAs), 1x2 clusters sharing A, B streamed past L2, an 8-deep ring, each group's adds under "
             "the next group's wgmmas (overlap=4), the loop unrolled over the tile where it fits (unroll_k)",
         evidence=FP8_RESULTS + ": 128x4096x7168, 424 TFLOPS (0.81x torch._scaled_mm; v9's fp8 defaults 0.47x); "
                  + FP8_SUBWAVE_RESULTS + ": overlap=4 447 TFLOPS there (0.84x), +1-2.5% at M = 64; "
                  + FP8_UNROLL_EVIDENCE),
    Rule("fp8-swap", "sm_90a", "v11",
         when=lambda p: (_fp8(p, False) and p.spec.bias is None
                         and fp8_swap_knobs(p.M, p.N, p.K, p.spec.scales, p.sms) is not None),
         knobs=lambda p: fp8_module(p.M, p.N, p.K, p.spec.scales, p.spec.bias, p.sms)[1],
         why=f"per-tensor or rowwise fp8 at {FP8_SWAP_MIN_M} < M <= {FP8_SWAP_MAX_M} where tiles whose rows divide M "
             "fill the waves better than v9's: v11's swapped operands (B's rows in wgmma's 64-row slot, M on its N, "
             "a multiple of 16), 128 columns over two consumers (the overlapped promotion up to 96 rows, drained past "
             "it; taken where v9's tile pads M or fills at most half the SMs) or 64 (one consumer, overlapped, up to "
             "128 rows; two on halves of the rows past it, split_m), each weighed by its measured rate",
         evidence=FP8_SWAP_RESULTS + ": 24 A/Bs against v9's tile at M = 272-768: 80x128 +22-57% at M = 288 and "
                  "320 (0.87-0.93x torch._scaled_mm), 160x128 +9-11% at five shapes, 80x64 +67% at 320x2112x7168; "
                  "not taken at the nine where it ran 0.93-1.04x v9's; " + FP8_SWAP_NARROW_RESULTS + ": 64-column "
                  "tiles at 2112x7168, 96x64 +19% (M = 384), 128x64 +24% (512), 160x64 in split_m +19% (640), 192x64 "
                  "+10% (768); held out, 14 of 14 per-tensor faster or level (1.005-1.30x), rowwise 12 of 12 "
                  "1.11-1.93x"),
    Rule("fp8-width", "sm_90a", "v9",
         when=lambda p: _fp8(p, False) and fp8_width(p.M, p.N, p.sms, p.spec.scales) is not None,
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why="per-tensor or rowwise fp8 where 128-row tiles of cuBLASLt's widths (96, 112 or 144 columns), 192 or "
             "224 fill their waves best, weighed by their measured rates: two consumers, the promotion every slice "
             "at 96 and 112 (overlap=4, unrolled where it fits: unroll_k) and 192 (after a drain), every 2 slices at 144 (after a drain) and 224 (in "
             "halves, its epilogue under the next tile), a ring as deep as fits, each chunk of the epilogue through "
             "the widest swizzle that divides it",
         evidence=FP8_WIDTHS_RESULTS + ": 1024x2112x7168 0.92x torch._scaled_mm (192x128 0.72x), 256x6144x4096 "
                  "0.81x (128x128 0.77x), 256x7168x16384 0.93x (0.85x), 1024x6144x4096 1.03x (0.93x); held out "
                  "256x18944x3584 0.94x (0.73x), 256x14336x4096 0.93x (0.89x), 2048x2112x7168 0.95x (0.76x); 128x224 "
                  "in halves 0.98x at 1024x7168x16384 (128x256 0.89x), held out 1.02x at 512x14336x4096 (0.97x); "
                  + FP8_UNROLL_EVIDENCE),
    Rule("fp8-wide", "sm_90a", "v9", when=lambda p: _fp8(p, False) and fp8_wide(p.M, p.N, p.sms, p.spec.scales),
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why="per-tensor or rowwise fp8 over many waves: 192x128 tiles over three consumers (the promotion every slice after a "
             "drain, in their registers), 1x2 clusters: a fifth less operand traffic a product than 128x128, where "
             f"their waves, weighed by their measured rate ({FP8_WIDE_RATE}x), use the SMs better; each tile's "
             "epilogue under the next tile's first group (epi_under)",
         evidence=FP8_WIDE_RESULTS + ": 1243-1348 TFLOPS at 8192^3, 0.98-1.07x torch._scaled_mm (128x128 with "
                  "overlap=4: 1144-1180); rowwise 1245-1259, 1.02-1.03x (128x128: 0.94x); " + FP8_UNDER_RESULTS
                  + ": epi_under -0.3 to +2.3% at 8192^3 (1.008-1.035x torch._scaled_mm)"),
    Rule("fp8-halves", "sm_90a", "v9", when=lambda p: _fp8(p, False) and fp8_halves(p.M, p.N, p.sms, p.spec.scales),
         knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why="per-tensor or rowwise fp8 where 128x256 tiles fill their waves best: two consumers of 64x256, each "
             f"promotion group (every {FP8_HALVES_PROMOTE} slices of 128 of K) issued as two 128-wide wgmma groups "
             "into one 64-register set, each half added into its half of the fp32 total before the other is issued "
             "(halves=True), 2x1 clusters: half the operand traffic a product of 128x128; each tile's epilogue "
             "under the next tile's first group, a half's columns under that half's wgmmas (epi_under)",
         evidence=FP8_HALVES_RESULTS + ": 1235-1328 TFLOPS, 1.03-1.05x torch._scaled_mm at 4096^3 (128x128 with "
                  "overlap=4: 0.93-0.995x), 1300-1317, 0.94-1.02x at 4096x7168x16384 (192x128: 0.88-0.95x); "
                  "the error within 1.01x torch's to K = 16384; " + FP8_UNDER_RESULTS + ": epi_under +1.0-1.6% at "
                  "4096^3 (1.027-1.089x torch._scaled_mm over three H100s)"),
    Rule("fp8", "sm_90a", "v9", when=lambda p: _fp8(p, False), knobs=lambda p: fp8_knobs(p.M, p.N, p.K, p.spec.scales, p.sms),
         why=f"an fp8 GEMM: v9's e4m3 kernel (128x128 tiles over two consumers, wgmma k32), the tensor cores' "
             f"sums promoted into fp32 every {FP8_PROMOTE} slice(s) of 128 of K (within {FP8_ERROR} of "
             "torch._scaled_mm's error to K = 16384), the adds of four groups overlapped with the next group's "
             f"wgmmas (overlap=4), 2x1 clusters; a {FP8_SUBWAVE_DEPTH}-stage ring where the tiles fit one wave",
         evidence=FP8_RESULTS + ": 1190-1229 TFLOPS, 0.94-0.98x torch._scaled_mm at 4096^3, 8192^3, "
                  "4096x7168x16384 (the promotion after a drain: 0.87-0.93x); " + FP8_SUBWAVE_RESULTS + ": under "
                  "one wave 6 stages 0.79x / 0.88x at 256x6144x4096 / 256x7168x16384 (4 stages 0.70x / 0.78x)"),
    Rule("fp8-defaults", "sm_90a", "v9", when=lambda p: p.spec is not None and p.spec.is_fp8, knobs=lambda p: {},
         why="an fp8 GEMM the rules above do not build: v9 at its fp8 defaults (128x128 tiles over two consumers, "
             "the promotion every 128 of K)",
         evidence="benchmarks/results/2026-11-26_h100_fp8/README.md: correct for the tensor and row recipes, "
                  "0.64-0.86x torch._scaled_mm"),
]


def is_fp8(p: Problem) -> bool:
    """Whether ``p`` is a scaled fp8 GEMM (its spec's operands), which :data:`FP8_RULES` answer."""
    return p.spec is not None and p.spec.is_fp8


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` picked: a rung and its knobs (dtype and arch included), where from
    (``"db"`` or ``"rule"``), the rule's name, why, and what was passed over on the way."""

    rung: str
    knobs: dict
    source: str
    rule: str
    why: str
    skipped: tuple = field(default=())
    db_entry: dict | None = None
    measured: bool = False  # the rule's choice rests on committed measurements, not a model alone
    database: str = ""  # which tuning database files were asked (TuningDB.describe), "" when none was

    def as_dict(self) -> dict:
        return {"rung": self.rung, "knobs": dict(self.knobs), "source": self.source, "rule": self.rule,
                "why": self.why, "skipped": list(self.skipped), "database": self.database}

    def text(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.knobs.items()) if k not in ("dtype", "arch"))
        lines = [f"{self.rung} ({knobs or 'its defaults'})",
                 f"  chosen by: {'tuning database' if self.source == 'db' else 'rule ' + repr(self.rule)}: {self.why}"]
        lines += [f"  passed over: {s}" for s in self.skipped]
        if self.database:
            lines.append(f"  {self.database}")
        return "\n".join(lines)


def _rung_order(rung: str) -> int:
    return int(rung[1:]) if rung[1:].isdigit() else -1


def _available(rung: str, arch: str) -> bool:
    return available(rung, arch)


def _validate(rung: str, p: Problem, knobs: dict) -> str | None:
    """None when the validator takes the knobs for this problem, else its message."""

    if not available(rung, p.arch):
        return f"rung {rung} has no form for {p.arch}"
    try:
        make_config(rung, p.M, p.N, p.K, **knobs)
    except ConfigError as err:
        return str(err)
    return None


# A 2x1 cluster pairs row tiles: with an odd number of them the last pair's second CTA computes a
# whole tile of rows past M. At M = 333 (3 row tiles of 128, computed as 4) v9 and v10 ran at
# 0.56-0.74x cuBLAS as kernels [benchmarks/results/2026-11-25_h100_every_model/every_model_seed1.json];
# pairing column tiles instead (1x2), or none, computes only the tiles there are.
def _pair_along_n(rung: str, p: Problem, knobs: dict) -> tuple[dict, str] | None:
    """The knobs with the cluster turned along N where a 2x1 cluster would pad the row tiles to an
    even count (None: it would not, the rung has no such cluster, or the validator refuses the turn)."""

    if rung not in ("v9", "v10"):  # v11 swaps A and B: its rows are N's
        return None
    cfg = make_config(rung, p.M, p.N, p.K, **knobs).knobs()
    row_tiles, col_tiles = math.ceil(p.M / cfg["blk_m"]), math.ceil(p.N / cfg["blk_n"])
    if cfg.get("cluster_m") != 2 or cfg.get("cluster_n") != 1 or row_tiles % 2 == 0:
        return None
    turned = {**knobs, "cluster_m": 1, "cluster_n": 2 if col_tiles % 2 == 0 else 1}
    if _validate(rung, p, turned) is not None:
        return None
    shape = f"{turned['cluster_m']}x{turned['cluster_n']}"
    return turned, (f"{row_tiles} row tiles of {cfg['blk_m']} (odd): a {shape} cluster, since 2x1 pairs would compute "
                    f"{row_tiles + 1}")


# Programmatic dependent launch (the production presets' ``pdl`` knob, sm90a/common.py): each kernel's set-up
# under the tail of the kernel before it. Measured (PDL: the policy's module with and without it, kernels in CUDA
# graphs, the suite's and the held-out weights at M = 1-8192, no epilogue and bias+GELU; 224 of 224 correct,
# with two calls back to back reading each other's output): 1.10-1.11x at the held-out weights (41 of 42
# faster, up to 1.22x at 1x3072x768), 1.00x over the suite's, where it lost 1-8% at M <= 128 on grids of more
# units than SMs (28672x4096 and 128256x4096 under swap AB: 0.92-0.99x). So it goes past M = 128, and at M <= 128
# where one wave holds the grid (of those it lost only on 6144x4096's 96-unit grids at M = 64 and 128: 0.95-0.99x).
# The fp8 kernels take the same (PDL_FP8: the fp8 policy's module at each of its rules, three runs: 1.01-1.06x at
# M = 64-1024, 256x6144x4096 0.86 -> 0.91x torch._scaled_mm; 4096^3 and 8192^3 within their run-to-run spread).
PDL = "benchmarks/results/2026-11-29_h200_pdl/README.md"
PDL_FP8 = "benchmarks/results/2026-11-29_h200_fp8_pdl/README.md"
PDL_SMALL_M = 128
PDL_RUNGS = ("v9", "v10", "v11")


def pdl_pays(p: Problem, rung: str, knobs: dict) -> bool:
    """Whether ``rung`` at ``knobs`` goes as a programmatic dependent launch for ``p`` (:data:`PDL`,
    :data:`PDL_FP8`): a production preset on Hopper, past :data:`PDL_SMALL_M` rows, or with no more work units
    than SMs."""
    if p.arch != "sm_90a" or rung not in PDL_RUNGS:
        return False
    return p.M > PDL_SMALL_M or grid_units(p, rung, knobs) <= p.sms


def _with_pdl(p: Problem, rung: str, knobs: dict) -> tuple[dict, str]:
    """``knobs`` with ``pdl`` where it pays (:func:`pdl_pays`), and what to say of it."""
    if not pdl_pays(p, rung, knobs):
        return knobs, ""
    return {**knobs, "pdl": True}, (f"; launched as a programmatic dependent of the kernel before it "
                                     f"[{PDL_FP8 if is_fp8(p) else PDL}]")


def rule_choice(p: Problem, rules=None, validate: bool = True) -> Choice:
    """The first rule of ``rules`` (default :data:`RULES`) that applies to ``p`` and validates."""
    check_extents("gemm_ladder", p.M, p.N, p.K, *LARGEST_TILE)  # IndexRangeError past 32-bit indices, at once
    skipped = []
    if rules is None:
        rules = FP8_RULES if is_fp8(p) else RULES
    for rule in rules:
        if rule.arch != p.arch:
            continue
        if validate and not _available(rule.rung, p.arch):
            skipped.append(f"rule {rule.name!r} ({rule.rung}): rung {rule.rung} has no form for {p.arch}")
            continue
        if not rule.when(p):
            skipped.append(f"rule {rule.name!r} does not apply")
            continue
        knobs = with_spec(rule.knobs(p), p)  # a rung that does not
        # build the spec's epilogue is refused by the validator, and the rule passed over
        problem = _validate(rule.rung, p, knobs) if validate else None
        if problem:
            skipped.append(f"rule {rule.name!r} ({rule.rung}): {problem}")
            continue
        why = f"{rule.why} [{rule.evidence}]" + (f"; {rule.detail(p)}" if rule.detail else "")
        # (not fp8: its knobs stay the measured ones, the same at every M)
        if validate and not is_fp8(p) and (paired := _pair_along_n(rule.rung, p, knobs)) is not None:
            knobs, note = paired
            why += f"; {note}"
        if validate:
            knobs, note = _with_pdl(p, rule.rung, knobs)
            why += note
        return Choice(rule.rung, knobs, "rule", rule.name, why,
                      tuple(s for s in skipped if "does not apply" not in s), measured=rule.measured)
    raise LookupError(f"no rule of the heuristic covers {p}; passed over: {'; '.join(skipped) or 'none for this arch'}")


def with_spec(knobs: dict, p: Problem) -> dict:
    """A choice's knobs for ``p``: its dtype, arch and operand spec; with a gated B (SwiGLU), not
    ``epi_under`` and chunks of at most half a tile; with a residual C or a float32 D, not
    ``epi_under`` nor ``tail_n`` (both keep a tile's 16-bit values in registers, while C is
    added in fp32 before a chunk is rounded and a float32 D is not rounded:
    ``sm90a.epilogue.check_epilogue`` refuses them), so the rule or entry still serves."""
    out = {**knobs, "dtype": p.dtype, "arch": p.arch, **spec_knobs(p.spec)}
    if p.spec is not None and p.spec.gated:  # chunks within the output half of a tile, not under the next
        out["epi_under"] = False
        if out.get("epi_n", 64) > out.get("blk_n", 256) // 2:
            out["epi_n"] = 64
    if p.spec is not None and (p.spec.residual or p.spec.d == "float32"):
        for knob, off in (("epi_under", False), ("tail_n", 0)):
            if out.get(knob):
                out[knob] = off
    return out


def db_choice(p: Problem, floor_rung: str | None, db=None) -> tuple[Choice | None, list[str], str]:
    """The tuning database's best entry in ``p``'s bucket among rungs at or above ``floor_rung``
    (any rung when None), by ratio to cuBLAS, notes on the entries passed over, and which files
    the database read (``TuningDB.describe``). An fp8 problem takes entries of its own spec only
    (timed against ``torch._scaled_mm``); any other, 16-bit entries (whose knobs its epilogue takes)."""
    base = db if isinstance(db, tdb.TuningDB) else tdb.TuningDB(db)
    bucket = tdb.shape_bucket((p.M, p.N, p.K))
    spec = p.spec if is_fp8(p) else None
    text = tdb.spec_text(spec, p.dtype)
    near = {e["rung"] for e in base.entries if e["dtype"] == p.dtype and e["arch"] == p.arch
            and e.get("spec") == text and tdb.shape_bucket(e["shape"]) == bucket}
    notes, found = [], []
    for rung in sorted(near, key=_rung_order):
        if floor_rung is not None and _rung_order(rung) < _rung_order(floor_rung):
            notes.append(f"tuning database has {rung} for bucket {'x'.join(map(str, bucket))}: below the rule's "
                         f"{floor_rung} on the ladder, ignored")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # entries refused for this shape are simply not used
            best = tdb.best_knobs(rung, p.M, p.N, p.K, p.dtype, p.arch, db=base, spec=spec)
        if best is not None:
            found.append((rung, *best))
    if not found:
        return None, notes, base.describe()
    rung, knobs, entry = max(found, key=lambda f: f[2].get("ratio_to_cublas") or 0.0)
    peer = "torch._scaled_mm" if spec is not None else "cuBLAS"
    why = (f"best in bucket {'x'.join(map(str, bucket))}: {entry['gpu']} {'x'.join(map(str, entry['shape']))} "
           f"{entry['tflops']:.0f} TFLOPS ({entry.get('ratio_to_cublas') or 0:.2f}x {peer}, "
           f"{str(entry.get('date'))[:10]}; {entry['db']})")
    knobs = with_spec(knobs, p)
    if spec_knobs(p.spec) and (refused := _validate(rung, p, knobs)) is not None:  # the entries tuned no epilogue
        return None, notes + [f"tuning database has {rung} for bucket {'x'.join(map(str, bucket))}: {refused}"], \
            base.describe()
    return Choice(rung, knobs, "db", "tuning database", why, db_entry=entry), notes, base.describe()


def choose(p: Problem, db=None, rules=None, use_db: bool = True) -> Choice:
    """The rung and knobs for ``p``: the tuning database's (see the module docstring), else the
    first rule that applies. Validates with the rungs' own validator (imports the rung files)."""
    rule = rule_choice(p, rules)
    if not use_db:
        return rule
    # a measured entry beats a rule that rests on a model alone, whatever its rung
    found, notes, database = db_choice(p, rule.rung if rule.measured else None, db)
    if found is None:
        return Choice(rule.rung, rule.knobs, rule.source, rule.rule, rule.why, rule.skipped + tuple(notes),
                      measured=rule.measured, database=database)
    return Choice(found.rung, found.knobs, "db", found.rule, found.why,
                  (f"rule {rule.rule!r} would take {rule.rung}",) + tuple(notes), found.db_entry,
                  database=database)


def default_sms(arch: str) -> int:
    """The SM count of the GPU here when it is of ``arch``, else the tuner's model machine."""

    gpu = device.probe(0, arch=arch)
    return gpu.sm_count if gpu is not None else MODEL_MACHINE[arch]["num_sms"]


# -- alternatives for sub-wave grids (issue 30): split-K modules a pack carries beside the choice, for
# the measurement at first use (serve.first_use) to choose among. The split-k rule keeps 4096 of K a
# split because shorter slices lost where the tiles were many (1024^3; M = 128 and 512 at K = 4096,
# SWEEP); where the chosen grid leaves most SMs idle that evidence does not reach: v9 at 333x1280x5120
# (30 tiles of 128x128 on 132 SMs) took 34 us to cuBLAS's 14 (benchmarks/results/2026-11-26_h100_every_model/).
# So split-K modules with slices down to ALT_MIN_SLICE are offered there, not chosen: without the
# measurement (GEMM_LADDER_MEASURE=0) the pack serves the choice. Since the mid-tiles rules (M > 128) choose the
# 64-row tiles and splits that fill the wave at most of those shapes, the grids still offered alternatives are the
# row-tile rule's at M = 96-128 on narrow weights and the split-k rule's 128x128 split in two.
ALT_MIN_SLICE = 1024  # each split keeps at least this much of K (16 K slices of 64)
ALT_MIN_K_SLICES = 8  # and at least this many 64-wide slices (a shorter unit is all fill)
# The sweep of 2026-11-26 (benchmarks/results/2026-11-26_h100_subwave_sweep/: 14 sub-wave shapes x
# v10 split 2-8 in 128x128 / 128x256 / 128x64 / 64x128 tiles, stream-K, v11, the atomic reduction;
# kernels under CUDA graphs) put the fastest split-K module, at every shape where one beat the policy's
# choice (8 of 14), at the split whose units come nearest one wave from below (84-128 units on 132 SMs),
# in 128x128 tiles (4 stages) or 64x128 (one consumer, 6 stages). Geomeans over the shapes of each
# family's best split, x cuBLAS: 128x128 0.62, 64x128 0.60, 128x64 0.57, 128x256 0.52, stream-K 0.49,
# v10's atomic reduction 0.55 (in 128x128; more than a wave lost too: s8 0.44 vs s4 0.63 at
# 333x1280x5120). The policy's choice 0.57; with the two alternatives below (at the depths of the run
# after it), the best of the three 0.72 (fitted on these shapes, not held out). cuBLAS stays ahead at all of them (its kernels 8-27 us): the
# front door's measured choice takes torch there; the split-K module serves where torch does not.
ALT_SPLITS = (2, 3, 4, 6, 8)
# The depth sweep (same folder, subwave_depth.json): the same tiles at the same splits run faster with
# deeper rings, 128x128 at 6 stages (0.74 vs 0.68 at 768x1280x5120) and 64x128 at 8 (0.83 vs 0.75 at
# 128x3072x8192, where it beats the policy's 0.75)
ALT_TILES = ((128, 128, 2, 6), (64, 128, 1, 8))  # blk_m, blk_n, consumers, pipe_depth: best first
ALT_MAX = 3  # alternatives a choice gets (each a module in the pack, each timed at first use)
ALT_RULE = "sub-wave split-k (alternative)"
# v9 without a split, in 64x128 tiles (one consumer, the 8-stage ring shared memory holds beside the
# staging buffers) over a pair cluster: cuBLAS's way at these shapes, one wave of small tiles instead
# of a split of large ones (nvjet 64x64 at 13 stages in 2x1 / 4x2 clusters, 64x56 at 14, 128x64 at 8:
# benchmarks/results/2026-11-26_h100_cublas_kernels/). The small-tile sweep (SUBWAVE_SMALL: the 14
# shapes above and the 350M training step's MN-major dW GEMMs; v9 64x64 at 8/10/12 stages, 64x128 and
# 128x64 at 8, every cluster; kernels under CUDA graphs): 64x128 p8 in a 2x1 cluster is the best
# family (0.713x cuBLAS geomean over 15 shapes; 1x1 0.651, 64x64 p8 2x1 0.628, deeper 64x64 rings
# worse: p12 0.523; the v10 alternatives 0.761 / 0.697 where they apply) and beats the policy's choice
# at 12 of the 13 shapes whose 64x128 tiles fit one wave (the 288-tile shapes lose: 0.53-0.56 vs 0.79).
# Offered beside the choice and the splits, the best of them goes from 0.751 to 0.793 (16 shapes,
# in-sample); at the 350M step's dW 512x2048x16384 (MN-major: v10 builds no such layout, so the only
# alternative) 0.947 against the choice's 0.783. cuBLAS stays ahead at every one of them. Two more runs
# (same folder): a pack with it (runtime M), held out, best alternative 0.735 (0.715 without it), picked
# at first use at 3 of 11; its runtime-M and fixed-M modules level (0.651 both), ahead of the choice at
# 11 of 12 again; against the splits the runs disagree by up to ~15% at these 10-20 us kernels.
SUBWAVE_SMALL = "benchmarks/results/2026-11-26_h100_subwave_small/subwave_small.json"
ALT_SMALL_TILES: tuple = ((64, 128, 1, 8),)  # blk_m, blk_n, consumers, pipe_depth: best first
ALT_SMALL_MAX_WAVES = 1  # offered where its tiles fill at most this many waves
ALT_SMALL_RULE = "sub-wave small tiles (alternative)"


def grid_units(p: Problem, rung: str, knobs: dict) -> int:
    """The work units of ``rung``'s grid at ``knobs`` (tiles x split_k, at the knobs the validator fills in)."""
    full = make_config(rung, p.M, p.N, p.K, **knobs).knobs()
    return p.tiles(full["blk_m"], full["blk_n"]) * full.get("split_k", 1)


def _units_of(choice: Choice, p: Problem) -> int:
    """The work units of the choice's grid (:func:`grid_units`)."""
    return grid_units(p, choice.rung, choice.knobs)


def sub_wave(p: Problem, choice: Choice) -> bool:
    """Whether ``choice`` leaves most of ``p``'s SMs idle (fewer work units than half of them)
    on a problem whose K can be split at all (16-bit, M > 64, a v9/v10 grid, K of two slices of
    :data:`ALT_MIN_SLICE`): where :func:`alternatives` looks for split-K modules."""
    return (not is_fp8(p) and p.M > 64 and p.arch == "sm_90a" and choice.rung in ("v9", "v10")
            and p.K >= 2 * ALT_MIN_SLICE and _units_of(choice, p) < p.sms / 2)


def _whole_pairs(p: Problem, blk_m: int, blk_n: int) -> dict:
    """A cluster that pairs whole tiles: along M where the row tiles are even (a pair shares B's
    tile), else along N where the column tiles are (a pair shares A's), else none; a pair over an
    odd count would run a row or column of nothing."""
    rows, cols = math.ceil(p.M / blk_m), math.ceil(p.N / blk_n)
    cm, cn = (2, 1) if rows % 2 == 0 else (1, 2) if cols % 2 == 0 else (1, 1)
    return {"cluster_m": cm, "cluster_n": cn}


def sub_wave_split(p: Problem, blk_m: int, blk_n: int) -> int | None:
    """The split of ``blk_m x blk_n`` tiles whose units come nearest one wave of ``p.sms`` from below,
    among :data:`ALT_SPLITS` that keep :data:`ALT_MIN_SLICE` of K (and :data:`ALT_MIN_K_SLICES`
    slices) a unit; None where even a split of 2 is more than a wave or cuts K too short."""
    tiles = p.tiles(blk_m, blk_n)
    fits = [s for s in ALT_SPLITS if tiles * s <= p.sms and p.K // s >= ALT_MIN_SLICE
            and math.ceil(p.K / 64) // s >= ALT_MIN_K_SLICES]
    return max(fits, default=None)


def alternatives(p: Problem, choice: Choice) -> list[Choice]:
    """Modules beside a :func:`sub_wave` choice, at most :data:`ALT_MAX`, best first: v9 without a
    split in the small tiles of :data:`ALT_SMALL_TILES` where they fit one wave (:func:`_small_tiles`),
    then split-K modules (v10), one per tile of :data:`ALT_TILES`, each at :func:`sub_wave_split`
    (the most units that fit one wave) with clusters over whole tiles (:func:`_whole_pairs`); none
    for another choice (M <= 64: the swap and row-tile rules split or stream already). Each
    validates for ``p`` with its spec (an MN-major layout: v9's only, v10 builds none); a pack
    builds them beside the choice and the first use times them all (``serve.first_use``)."""
    if not sub_wave(p, choice):
        return []
    main = make_config(choice.rung, p.M, p.N, p.K, **choice.knobs).knobs()
    out: list[Choice] = _small_tiles(p, choice, main)
    for blk_m, blk_n, consumers, depth in ALT_TILES if _available("v10", p.arch) else ():
        split = sub_wave_split(p, blk_m, blk_n)
        if split is None or len(out) == ALT_MAX:
            continue
        knobs = with_spec({"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": consumers, "pipe_depth": depth,
                           "split_k": split, **_whole_pairs(p, blk_m, blk_n)}, p)
        if _validate("v10", p, knobs) is not None:
            continue
        knobs = _with_pdl(p, "v10", knobs)[0]  # launched as the choice is, where it pays
        if choice.rung == "v10" and make_config("v10", p.M, p.N, p.K, **knobs).knobs() == main:
            continue  # the choice itself
        units = p.tiles(blk_m, blk_n) * split
        why = (f"an alternative to {choice.rung} ({choice.rule}), timed at first use: its grid fills "
               f"{_units_of(choice, p)} of {p.sms} SMs; {blk_m}x{blk_n} tiles split {split} ways fill {units} "
               f"(the most within one wave: the sub-wave sweep's fastest split-K modules)")
        out.append(Choice("v10", knobs, "rule", ALT_RULE, why))
    return out


def _small_tiles(p: Problem, choice: Choice, main: dict) -> list[Choice]:
    """v9 modules without a split in :data:`ALT_SMALL_TILES`, where their tiles fill at most
    :data:`ALT_SMALL_MAX_WAVES` waves, each in the first cluster of whole tiles v9 validates for
    ``p`` (a pair along M, along N, or none: an MN-major operand's 64-row tile is not multicast
    in halves), at most :data:`ALT_MAX`."""
    out: list[Choice] = []
    for blk_m, blk_n, consumers, depth in ALT_SMALL_TILES:
        tiles = p.tiles(blk_m, blk_n)
        if tiles > ALT_SMALL_MAX_WAVES * p.sms or len(out) == ALT_MAX:
            continue
        base = {"blk_m": blk_m, "blk_n": blk_n, "num_warpgroups": consumers, "pipe_depth": depth}
        for cluster in (_whole_pairs(p, blk_m, blk_n), {"cluster_m": 1, "cluster_n": 1}):
            knobs = with_spec({**base, **cluster}, p)
            if _validate("v9", p, knobs) is None:
                break
        else:
            continue
        knobs = _with_pdl(p, "v9", knobs)[0]  # launched as the choice is, where it pays
        if choice.rung == "v9" and (main["blk_m"], main["blk_n"]) == (blk_m, blk_n):
            continue  # the choice runs these tiles already (the row-tile and mid-tiles rules: B streamed too)
        why = (f"an alternative to {choice.rung} ({choice.rule}), timed at first use: its grid fills "
               f"{_units_of(choice, p)} of {p.sms} SMs; {blk_m}x{blk_n} tiles in a {depth}-stage ring fill {tiles} "
               f"without a split (what cuBLAS runs at sub-wave shapes)")
        out.append(Choice("v9", knobs, "rule", ALT_SMALL_RULE, why))
    return out


# -- grouped GEMM (v12, issue 33): two modules for an expert weight, by the rows an expert holds. The
# masked runs timed v12's 64x128 tiles (one consumer, an 8-deep ring) against its 128x256 defaults at
# every decode batch on three MoE shapes, kernels under CUDA graphs: the 64-row tiles won wherever the
# experts held 32 rows or fewer on average (Mixtral-like 1.03-1.15x vs 0.97-1.08x torch._grouped_mm,
# Qwen-MoE-like 1.01-1.10x vs 0.86-1.02x, DeepSeek-V3-like 0.97-1.02x vs 0.86-0.99x) and split at 128
# (Mixtral 1024 rows: +6% balanced, -2% Zipf) [GROUPED_MASKED]. A 128-row tile wastes the MMA work of
# the rows an expert lacks, and decode is weight-bound: 128-wide n-tiles make twice the work units to
# spread over the SMs. The contiguous layout's prefill ran the 128x256 defaults at 0.96-1.17x on the
# three shapes from 64 to 8192 tokens [GROUPED]. The split: the decode module while an expert holds at
# most one decode tile of rows on average (contiguous: M / E <= 64; the layouts' kernel is one, only
# the prologue differs, so the contiguous side of the threshold is the masked measurement carried
# over, to be confirmed by benchmarks/grouped_check.py --pack); the masked layout knows max_tokens
# (the slot), not the counts, and won with 64-row tiles at every slot measured up to 256 tokens.
GROUPED = "benchmarks/results/2026-11-26_h100_grouped/README.md"
GROUPED_MASKED = "benchmarks/results/2026-11-26_h100_grouped_masked/README.md"
GROUPED_DECODE = "benchmarks/results/2026-11-26_h100_grouped_decode/README.md"
GROUPED_PACK = "benchmarks/results/2026-11-26_h100_grouped_pack/README.md"
GROUPED_RUNG = "v12"
GROUPED_DECODE_KNOBS = {"blk_m": 64, "blk_n": 128, "num_warpgroups": 1, "pipe_depth": 8}
# The decode module since issue 33's decode follow-up: swap AB (W's 128 rows of a tile in wgmma's 64-row
# slot over two consumers, an expert's tokens its N) and the warp scan of the routing. The tile streams
# W once at full width whatever the count, and no MMA work or A traffic is spent on 64-row tiles of 1-8
# tokens; blk_m (tokens a tile): 32 where experts are few (Mixtral-like: top-2 of 8 gives an expert a
# quarter of the batch), 16 where they are many (top-8 of 64-256: a few tokens each). Measured
# (GROUPED_DECODE, H100, both layouts, 8-256 tokens, balanced and Zipf, the same rounds): swap with 16
# tokens 1.022x the 64x128 module (geomean; masked decode 1.099x the best peer against its 1.075x),
# 32 tokens 1.017x; at 8 experts 32 held up where 16 lost (256 Zipf tokens: 0.991x against 0.945x).
# The 64x128 module stays the fallback where the validator refuses the swap.
GROUPED_SWAP_KNOBS = {"swap_ab": True, "blk_n": 128, "num_warpgroups": 2, "pipe_depth": 8, "warp_scan": True}
GROUPED_SWAP_FEW_EXPERTS = 16  # blk_m 32 up to this many experts, 16 past it
GROUPED_DECODE_ROWS = 64  # contiguous, where swap AB is refused: the 64x128 module up to 64 rows an expert
# Contiguous prefill (issue 33's prefill follow-up; GROUPED_PREFILL, H100, bf16, kernels in CUDA graphs,
# 9 variants and torch._grouped_mm in the same rounds, 4 shapes x 512-16384 tokens x balanced and Zipf):
# the swapped tiles win wherever an expert holds at most about one 128-row tile of tokens on average,
# the 128x256 tile past it. A 128-row tile spends its MMA work and A loads on rows an expert lacks and
# leaves few work units where experts are few (the odd 5 x 1000x520 at 512 tokens: 20 units for 132
# SMs, 0.75x torch); a swapped tile streams W at full width with the tokens as wgmma's N. Tiers by the
# rows an expert holds on average (M / E: the front door knows M and E, not the routing): swap16 (more
# than 16 experts; decode's module, 0.7% ahead of swap32 at decode's 1 row an expert or fewer) up to 1,
# swap32 up to 32 (an expert's rows fill one token tile on average), swap64 up to 128, the 128x256
# defaults past it. Over the 24 cases (two runs averaged): this rule 1.096x torch._grouped_mm (geomean;
# least 0.991), the best variant of each case 1.110x (least 1.022), the rule before (the decode module up
# to 64 rows an expert, the defaults past it) 1.028x (least 0.748); served through a pack and the front
# door (a third run) 1.086x (least 0.981). What the rule leaves is routing: under Zipf a hot expert wants
# the large tile (DeepSeek-V3 8192 tokens: 128x128 1.05x, swap32 0.99x), balanced the swapped one (1.01x
# against 0.98x). Measured and left out: the warp scan at the prefill tiles (0.993x the defaults: the
# prologue is not what limits prefill), 128x128 tiles (4 or 6 stages), 64x256, bands of 16 m-tiles, and
# swapped tiles in bands of 64 token tiles (within 0.5% of bands of 8).
GROUPED_PREFILL = "benchmarks/results/2026-11-26_h100_grouped_prefill/README.md"
GROUPED_SWAP16_ROWS = 1  # contiguous: decode's 16-token swap tiles (more than 16 experts) up to 1 row an expert
GROUPED_PREFILL_SWAPS = ((32, 32), (64, 128))  # (swap tokens a tile, up to rows an expert on average)
# Contiguous prefill of many m-tiles an expert at a short K (issue 33's floor case; GROUPED_CLUSTER, H100, bf16,
# kernels in CUDA graphs beside torch._grouped_mm in the same rounds): v12 in 2x1 clusters, two m-tiles of an expert
# sharing W's tile by TMA multicast (each loads half: a third less L2 -> SM traffic a 128x256 tile). At K = 520 (the
# odd 5 x 1000x520 weight) a tile's 9 K slices are bound by that traffic, not by the MMAs: at 32768 tokens (51
# m-tiles an expert) 1.21-1.26x torch (1.33-1.40x the defaults, which ran 0.90-0.91x). Where K is long (2048-7168:
# the Mixtral-, DeepSeek-V3- and Qwen-like weights) it ran 0.90-1.0x the defaults, and at 8192 tokens of the odd
# weight (13 m-tiles an expert: an odd last pair's phantom, coarser units over the clusters) 0.94-1.03x. So: K up
# to GROUPED_CLUSTER_K and at least GROUPED_CLUSTER_ROWS rows an expert on average (32 m-tiles of 128). Two runs
# (grouped_clusters.*, grouped_clusters2.*) agree within 1%. Measured and left out: 1x2 clusters (two n-tiles
# sharing A's tile): 1.03-1.07x the defaults at the odd weight's 8192 tokens, 0.93-0.99x on the long-K weights
# (DeepSeek-V3-like at 32768 tokens, one m-tile an expert: 0.985x; swap64 serves it).
GROUPED_CLUSTER = "benchmarks/results/2026-11-26_h100_grouped_clusters/README.md"
# The 256-byte L2 promotion on the contiguous layout's swapped tiers (v12's l2_promo, producer.load_hints;
# GROUPED_L2_PROMO, H100, bf16, kernels in CUDA graphs, each tier of this policy beside its twin with the
# promotion in the same rounds, at the grouped suite's token counts it serves, balanced and Zipf): a swapped
# tile streams W 128 bytes a row a K slice, and with the promotion an L2 miss brings the row's next slice
# too. Over the 54 cases of the swapped tiers the twin ran 0.994-1.061x the tier (geomean 1.022 decode,
# 1.034 swap32, 1.021 swap64), level at K = 520; DeepSeek-V3-like at 32768 tokens balanced, the suite's
# least case, went from 0.969x torch._grouped_mm to 1.028x. Measured and left out: the 128x256 defaults
# (1.00-1.07x up to 512 rows an expert, 0.92-1.00x at 1024-4096, 0.89-0.99x at K = 520) and the 2x1 clusters
# (0.88x at K = 520). The masked layout's decode module was not timed with it and stays without.
GROUPED_L2_PROMO = "benchmarks/results/2026-11-26_h100_grouped_l2_promo/README.md"
GROUPED_PROMO_KNOBS = {"l2_promo": True}
GROUPED_CLUSTER_K = 1024
GROUPED_CLUSTER_ROWS = 4096
GROUPED_CLUSTER_KNOBS = {"cluster_m": 2}
# masked: the decode module up to max_tokens = 64. The slot bounds an expert's count, not the count:
# with slots of 256 half full (128 tokens an expert; GROUPED_PACK, 2026-11-26) the swapped module
# re-read each expert's weight once a 16-token tile and ran 0.61-0.83x torch._grouped_mm, where the
# prefill module's 128-row tiles ran 1.03-1.38x at slots of 300. Up to 64 an expert holds at most
# four 16-token tiles (the decode check's Mixtral rows of 64 tokens an expert: 1.01x the 64x128 module).
GROUPED_DECODE_SLOT = 64
GROUPED_MAX_TOKENS = 1 << 20  # the top of the token range a pack plans (contiguous rows of A, masked slot)


@dataclass(frozen=True)
class GroupedChoice:
    """One module of a grouped weight: the choice (rung v12, its knobs) and the token counts it
    serves, ``tokens = (least, largest)``: rows of A for the contiguous layout, max_tokens (the
    slot) for the masked one, the counts the front door knows without a sync."""

    choice: Choice
    tokens: tuple[int, int]


GROUPED_EPILOGUES = ("none", "swiglu")  # grouped_mm's, and grouped_swiglu's gated W_gu [E, 2I, K]
# The gated tiers (swap AB refused: the 64x128 module up to 64 rows an expert, the 128x256 defaults past),
# measured contiguous (H100, bf16, 3 MoE weights x 512-8192 tokens x balanced/Zipf, kernels in CUDA graphs):
# 1.137x torch's unfused path (torch._grouped_mm, then silu(gate) * up), least 1.012x; the better tier
# in 16 of 18 cases. The masked layout's gated modules are checked there, not timed.
GROUPED_SWIGLU = "benchmarks/results/2026-11-26_h100_grouped_swiglu/README.md"


def grouped_spec(dtype: str, epilogue: str = "none") -> GemmSpec:
    """The operand spec of a grouped GEMM in ``dtype`` (``serve.grouped.spec_of_dtype``'s); with
    ``epilogue="swiglu"`` a grouped SwiGLU's (``serve.grouped_swiglu.spec_of_dtype``'s); for
    ``float8_e4m3`` the grouped fp8 GEMM's (``serve.grouped_fp8.spec_of``: rowwise scales, D bf16)."""
    if epilogue not in GROUPED_EPILOGUES:
        raise ConfigError(f"grouped epilogue {epilogue!r}: a grouped weight is built with one of {GROUPED_EPILOGUES}")
    if dtype in FP8_DTYPES:
        if epilogue != "none":
            raise ConfigError(f"grouped epilogue {epilogue!r} in {dtype}: the grouped fp8 GEMM (scaled_grouped_mm) "
                              "has no gated epilogue yet; build the SwiGLU weight in bfloat16 or float16")
        return GemmSpec(a=dtype, b=dtype, d="bfloat16", scales="row", grouped=True)
    if epilogue == "swiglu":
        return GemmSpec(a=dtype, b=dtype, d=dtype, act="silu", gated=True, grouped=True)
    return GemmSpec(a=dtype, b=dtype, d=dtype, grouped=True)


# The grouped fp8 GEMM (issue 33's fp8 slice; gemm_ladder.scaled_grouped_mm): fp8 wgmma reads both
# operands K-major and the transposed epilogue has no scales yet, so no swapped tiles; the tiers that
# validate at blk_k = 128 (k32: one 128-byte swizzle row of fp8 a slice) are the 64x128 decode module
# (one consumer, an 8-deep ring: 24 KiB a stage) and v12's fp8 tile (128x128 over two consumers: the
# promoted sums double the accumulators). Measured (GROUPED_FP8, H100, 3 MoE shapes x 512-8192 tokens x
# balanced and Zipf, kernels in CUDA graphs, 6 variants and torch._scaled_grouped_mm in the same rounds):
# the 64x128 tile wins where an expert holds few rows (DeepSeek-V3 at 2-8 rows an expert, Qwen-MoE at 8)
# and loses badly on large ones (Mixtral 8192 tokens: 0.69x torch); past it the 128x128 tile with the
# promotion overlapped (overlap=4) and a 6-deep ring. Split by the rows an expert holds on average (M / E,
# what the front door knows): the 64x128 module up to 16 (thresholds of 8 to 32 pick the same modules at
# these cases), the 128x128 one past it: 1.249x torch._scaled_grouped_mm (geomean, least 1.113) against
# 1.262x (least 1.113) for the best variant of each case and 1.212x (least 1.038) for the 128x128 defaults.
GROUPED_FP8 = "benchmarks/results/2026-11-26_h100_grouped_fp8/README.md"
GROUPED_FP8_DECODE_ROWS = 16  # the 64x128 decode module up to this many rows an expert on average
GROUPED_FP8_PREFILL_KNOBS = ({"overlap": 4, "pipe_depth": 6}, {"overlap": 4})  # the first that validates


def _grouped_fp8_tiers(E: int, p: Problem, base: dict) -> list[GroupedChoice]:
    """The contiguous fp8 modules by the rows an expert holds on average (the comment above)."""
    top = GROUPED_FP8_DECODE_ROWS * E
    skipped: tuple = ()
    knobs = base
    for extra in GROUPED_FP8_PREFILL_KNOBS:  # a 6-deep ring may not fit beside many experts' tables
        if (refused := _validate(GROUPED_RUNG, p, {**base, **extra})) is None:
            knobs = {**base, **extra}
            break
        skipped += (f"{extra}: {refused}",)
    tile = ", ".join(f"{k}={v}" for k, v in knobs.items() if k in ("overlap", "pipe_depth")) or "its fp8 defaults"
    prefill = Choice(GROUPED_RUNG, knobs, "rule", "grouped-fp8-prefill",
                     f"{GROUPED_RUNG} fp8 at 128x128x128 ({tile}) past M = {top} rows of A ({GROUPED_FP8_DECODE_ROWS} "
                     f"an expert on average) [{GROUPED_FP8}: this rule's tiers 1.249x torch._scaled_grouped_mm over "
                     "18 cases, 512-8192 tokens]", skipped=skipped, measured=True)
    decode_knobs = {**base, **GROUPED_DECODE_KNOBS}
    if (refused := _validate(GROUPED_RUNG, p, decode_knobs)) is not None:
        return [GroupedChoice(dataclasses.replace(prefill, skipped=skipped + (f"rule 'grouped-fp8-decode': {refused}",)),
                              (1, GROUPED_MAX_TOKENS))]
    decode = Choice(GROUPED_RUNG, decode_knobs, "rule", "grouped-fp8-decode",
                    f"{GROUPED_RUNG} fp8 with 64x128 tiles, one consumer, an 8-deep ring while M <= {top} rows of A "
                    f"({GROUPED_FP8_DECODE_ROWS} an expert on average): few rows an expert, weight-bound "
                    f"[{GROUPED_FP8}: 1.11-1.35x torch._scaled_grouped_mm there]", measured=True)
    return [GroupedChoice(decode, (1, top)), GroupedChoice(prefill, (top + 1, GROUPED_MAX_TOKENS))]


def grouped_choices(E: int, N: int, K: int, dtype: str = DEFAULT_DTYPE, layout: str = "contiguous",
                    arch: str = DEFAULT_ARCH, epilogue: str = "none") -> list[GroupedChoice]:
    """The modules of an expert weight ``[E, N, K]`` in ``layout`` and the token ranges they serve,
    fewest tokens first (see the comments above for the rules and their evidence): masked, a decode
    and a prefill module; contiguous, swapped tiles of 16 (more than 16 experts), 32 and 64 tokens
    and the 128x256 defaults, by the rows an expert holds on average (at a short K, up to
    :data:`GROUPED_CLUSTER_K`, the defaults in 2x1 clusters past :data:`GROUPED_CLUSTER_ROWS` rows an expert).
    Where the validator refuses
    swap AB, the 64x128 decode module and the defaults; one module for every token count where it
    refuses that too (it names why). ``epilogue="swiglu"`` (a gated W_gu, N = 2I): the same rules,
    where v12 refuses swap AB with the gated epilogue: the 64x128 module, then the defaults, measured
    contiguous (:data:`GROUPED_SWIGLU`); the masked layout's are not (``measured`` False).
    ConfigError where v12 refuses the weight itself (the expert count, N, K, the layout)."""
    if epilogue != "none":
        timed = layout == "contiguous"
        evidence = (f" [{GROUPED_SWIGLU}: the {epilogue} tiers 1.137x torch's unfused path, least 1.012x]" if timed
                    else f" (the masked {epilogue} modules are checked, not measured yet)")
        return [dataclasses.replace(g, choice=dataclasses.replace(g.choice, measured=timed, why=g.choice.why + evidence))
                for g in _grouped_choices(E, N, K, dtype, layout, arch, epilogue)]
    return _grouped_choices(E, N, K, dtype, layout, arch, epilogue)


def _grouped_choices(E: int, N: int, K: int, dtype: str, layout: str, arch: str, epilogue: str) -> list[GroupedChoice]:
    """:func:`grouped_choices`' rules."""
    if layout not in ("contiguous", "masked"):
        raise ConfigError(f"layout={layout!r}: a grouped weight is served 'contiguous' (grouped_mm) or 'masked' "
                          "(grouped_mm_masked)")
    top = GROUPED_DECODE_ROWS * E if layout == "contiguous" else GROUPED_DECODE_SLOT
    spec = grouped_spec(dtype, epilogue)  # the config's dtype is D's (an fp8 spec's: bfloat16)
    base = {"experts": E, "layout": layout, "dtype": spec.d, "arch": arch, **spec_knobs(spec)}
    build_m = max(4096, E)  # what serve.grouped builds at (M is read at run time; masked: one row an expert)
    if (refused := _validate(GROUPED_RUNG, Problem(build_m, N, K, dtype, arch), base)) is not None:
        raise ConfigError(f"grouped {layout} E={E} N={N} K={K} {dtype}: {refused}")
    if spec.is_fp8:
        return _grouped_fp8_tiers(E, Problem(build_m, N, K, dtype, arch), base)
    evidence = GROUPED_MASKED if layout == "masked" else f"{GROUPED_MASKED}; {GROUPED}"
    bound = (f"M <= {GROUPED_DECODE_ROWS} x E = {top} rows of A ({GROUPED_DECODE_ROWS} an expert on average)"
             if layout == "contiguous" else f"max_tokens <= {GROUPED_DECODE_SLOT}")
    prefill = Choice(GROUPED_RUNG, base, "rule", "grouped-prefill", f"{GROUPED_RUNG} at its 128x256 defaults past "
                     f"{bound} [{GROUPED}: 0.96-1.17x torch._grouped_mm, 64-8192 tokens]", measured=True)
    swap_m = 32 if E <= GROUPED_SWAP_FEW_EXPERTS else 16
    swap_knobs = {**base, **GROUPED_SWAP_KNOBS, "blk_m": swap_m}
    if (swapped := _validate(GROUPED_RUNG, Problem(build_m, N, K, dtype, arch), swap_knobs)) is None:
        if layout == "contiguous":  # prefill's tiers by the rows an expert holds (the comment above)
            return _prefill_tiers(E, Problem(build_m, N, K, dtype, arch), base, swap_m)
        decode = Choice(GROUPED_RUNG, swap_knobs, "rule", "grouped-decode-swap",
                        f"{GROUPED_RUNG} with swap AB ({swap_m} tokens x 128 W rows a tile, two consumers, an 8-deep "
                        f"ring, the warp scan) while {bound}: decode streams the weights, and a swapped tile reads "
                        f"them once at full width with no MMA work on rows an expert lacks ({E} experts: "
                        f"{swap_m}-token tiles) [{GROUPED_DECODE}: 1.02x the 64x128 module, masked decode 1.10x "
                        f"the best peer]", measured=True)
        return [GroupedChoice(decode, (1, top)), GroupedChoice(prefill, (top + 1, GROUPED_MAX_TOKENS))]
    decode_knobs = {**base, **GROUPED_DECODE_KNOBS}
    passed = (f"rule 'grouped-decode-swap' ({GROUPED_RUNG} swap AB {swap_m}x128): {swapped}",)
    if (refused := _validate(GROUPED_RUNG, Problem(build_m, N, K, dtype, arch), decode_knobs)) is not None:
        skipped = passed + (f"rule 'grouped-decode' ({GROUPED_RUNG} 64x128): {refused}",)
        return [GroupedChoice(dataclasses.replace(prefill, why=f"{GROUPED_RUNG} at its 128x256 defaults for every "
                                                  f"token count [{GROUPED}]", skipped=skipped),
                              (1, GROUPED_MAX_TOKENS))]
    decode = Choice(GROUPED_RUNG, decode_knobs, "rule", "grouped-decode",
                    f"{GROUPED_RUNG} with 64x128 tiles, one consumer, an 8-deep ring while {bound}: few rows an "
                    f"expert, weight-bound [{evidence}: won at every decode batch of 3 MoE shapes]", skipped=passed,
                    measured=True)
    return [GroupedChoice(decode, (1, top)), GroupedChoice(prefill, (top + 1, GROUPED_MAX_TOKENS))]


def _prefill_tiers(E: int, p: Problem, base: dict, swap_m: int) -> list[GroupedChoice]:
    """The contiguous layout's modules by the rows an expert holds on average (``M / E``; the rule
    and its evidence: the comment above GROUPED_PREFILL): swapped tiles of ``swap_m`` tokens (the
    decode module), then the wider swapped tiles of :data:`GROUPED_PREFILL_SWAPS` (one the validator
    refuses is passed over, the next tier reaching down), all with the 256-byte L2 fills
    (:data:`GROUPED_PROMO_KNOBS`, measured in :data:`GROUPED_L2_PROMO`), then v12's 128x256 defaults, and at
    K up to :data:`GROUPED_CLUSTER_K` the defaults in 2x1 clusters past :data:`GROUPED_CLUSTER_ROWS` rows an
    expert on average (one the validator refuses is named on the defaults' tier)."""
    wider = [(m, rows) for m, rows in GROUPED_PREFILL_SWAPS if m >= swap_m]
    swaps = ([(swap_m, GROUPED_SWAP16_ROWS)] if swap_m < wider[0][0] else []) + wider
    out: list[GroupedChoice] = []
    skipped: tuple = ()
    for blk_m, rows in swaps:
        knobs = {**base, **GROUPED_SWAP_KNOBS, "blk_m": blk_m, **GROUPED_PROMO_KNOBS}
        name = "grouped-decode-swap" if blk_m == swap_m else f"grouped-prefill-swap{blk_m}"
        if (refused := _validate(GROUPED_RUNG, p, knobs)) is not None:
            skipped += (f"rule {name!r} ({GROUPED_RUNG} swap AB {blk_m}x128): {refused}",)
            continue
        why = (f"{GROUPED_RUNG} with swap AB ({blk_m} tokens x 128 W rows a tile, two consumers, an 8-deep ring, the "
               f"warp scan, 256-byte L2 fills) while M <= {rows} x E = {rows * E} rows of A ({rows} an expert on "
               f"average): a swapped tile streams W at full width with the tokens as wgmma's N, where a 128-row tile "
               f"computes rows an expert lacks [{GROUPED_PREFILL}: this rule's tiers 1.096x torch._grouped_mm over 24 "
               f"prefill cases; {GROUPED_L2_PROMO}: the L2 fills 1.02-1.03x the tier without them")
        why += (f"; {GROUPED_DECODE}: decode, 1.02x the 64x128 module, masked decode 1.10x the best peer]"
                if blk_m == swap_m else "]")
        first = out[-1].tokens[1] + 1 if out else 1
        out.append(GroupedChoice(Choice(GROUPED_RUNG, knobs, "rule", name, why, skipped=skipped, measured=True),
                                 (first, rows * E)))
        skipped = ()
    top = out[-1].tokens[1]
    prefill = Choice(GROUPED_RUNG, base, "rule", "grouped-prefill",
                     f"{GROUPED_RUNG} at its 128x256 defaults past M = {top} rows of A ({top // E} an expert on "
                     f"average): large experts, the tile's MMA work all rows an expert holds [{GROUPED_PREFILL}: "
                     f"1.03-1.24x torch._grouped_mm from 256 rows an expert]", skipped=skipped, measured=True)
    cluster_from = max(top, GROUPED_CLUSTER_ROWS * E)
    if p.K > GROUPED_CLUSTER_K or cluster_from >= GROUPED_MAX_TOKENS:
        return out + [GroupedChoice(prefill, (top + 1, GROUPED_MAX_TOKENS))]
    knobs = {**base, **GROUPED_CLUSTER_KNOBS}
    if (refused := _validate(GROUPED_RUNG, p, knobs)) is not None:
        prefill = dataclasses.replace(prefill, skipped=skipped + (f"rule 'grouped-prefill-c2x1' ({GROUPED_RUNG} "
                                                                  f"2x1 clusters): {refused}",))
        return out + [GroupedChoice(prefill, (top + 1, GROUPED_MAX_TOKENS))]
    clustered = Choice(GROUPED_RUNG, knobs, "rule", "grouped-prefill-c2x1",
                       f"{GROUPED_RUNG} at its 128x256 defaults in 2x1 clusters past M = {cluster_from} rows of A "
                       f"({GROUPED_CLUSTER_ROWS} an expert on average) at K = {p.K} <= {GROUPED_CLUSTER_K}: two m-tiles "
                       f"of an expert share W's tile by TMA multicast, a third less L2 traffic a tile, which bounds "
                       f"a short K loop [{GROUPED_CLUSTER}: 1.21-1.26x torch._grouped_mm at 5 x 1000x520, 32768 "
                       f"tokens, 1.33-1.40x the defaults; 0.90-1.0x them at K >= 2048 or 13 m-tiles an expert]",
                       measured=True)
    return out + [GroupedChoice(prefill, (top + 1, cluster_from)),
                  GroupedChoice(clustered, (cluster_from + 1, GROUPED_MAX_TOKENS))]
