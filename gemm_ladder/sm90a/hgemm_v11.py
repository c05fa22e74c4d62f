"""hgemm_v11 (Hopper): swap AB, the weights fill the MMA's rows when M is small.

v11 is a preset of the production kernel (``sm90a/gemm.py``, the template that owns the roles,
the ring, the loop over work units and the barriers): v10's parts with the operands swapped
and the transposed epilogue.

What changed from v10: wgmma's A operand is always 64 rows, so a tile of D holds at least 64 rows
of M. When M is small (decoding: M from 1 to 64 tokens, B a weight matrix of many rows N) most
of those rows are padding: TMA zero-fills them at no DRAM cost, but the tensor cores multiply
them and the accumulators hold them (at M = 8, seven eighths of both), and the wgmma's N (the
tile's width in N) is capped at 256 per instruction. v11 computes the transposed tile instead,
D^T = B_tile . A_tile^T:

    v10: wgmma.m64n{blk_n}k16  A = A_tile (64-row atoms of M),  B = B_tile (blk_n rows of N)
    v11: wgmma.m64n{blk_m}k16  A = B_tile (64-row atoms of N),  B = A_tile (blk_m rows of M)

so N, large, fills the 64-row slot and M becomes wgmma's N, which may be as small as 8: blk_m is
a multiple of 8 from 8 to 256 (one module at blk_m=8 serves M = 1..8 with no padding beyond 8
rows). The loads (and their ``stream_b`` hints), the ring, the producer, the scheduler, the
clusters and split-K are v10's: only the operands swap (``Consumer(a_smem=Bsmem, b_smem=Asmem,
...)``, ``common.SwapPlan``)
and consumer ``c`` now owns ``blk_n / W`` rows of N (columns of D) and all ``blk_m`` rows of M.
The accumulators hold D^T, so the epilogue stores them transposed: ``stmatrix ... .trans``
writes each 8x8 block of the fragment as D's rows into the consumer's staging buffer
(``epilogue.acc_to_smem_stmatrix_trans``), which leaves by 64-column TMA stores.

    consumer c, unit (tile, s):  for k: wait tma2mma; wgmma(B rows of c, A); commit; ...  (v10)
                                 [split_k > 1: partials, count, the last one sums]       (v10)
                                 thread 0 of c: bulk wait_group.read(0)  (its buffer is free)
                                 bar.sync 1+c; stmatrix.trans D^T -> Esmem[c] (blk_m x blk_n/W)
                                 fence; bar.sync 1+c; thread 0 of c: TMA stores, commit

fp8 (issue 32, per-tensor and rowwise scales): e4m3 A and B swap roles as 16-bit ones do (both K-major, as fp8 wgmma
reads them), ``wgmma.m64n{blk_m}k32`` into v9's promoted fp32 sums (``promote``, ``overlap``: sm90a/fp8.py), the
scales applied to the sums before the transposed epilogue. The swap puts M on wgmma's N, a multiple of 8
(of 16 here), so mid M takes tiles that divide it where v9's come in 64-row steps: at M = 320, 80-row tiles
make 4 x 32 = 128 tiles of 4096 columns where 128-row ones cover 384 rows (what cuBLASLt runs there:
``benchmarks/results/2026-11-29_h200_fp8_mid/``). Rowwise scales go with the transposed fragment: B's by its rows (N),
A's by its columns (M) (``fp8.SumScales``' ``swapped``). Block scales are applied by K block at each promotion, indexed
by the tile's rows: not built here (v9).

Roles and registers: v10's (a producer warpgroup, W = 1 or 2 consumers); a consumer holds
blk_m x blk_n / (128 W) accumulators (32 at blk_m = 64, blk_n = 128, W = 2).

split_m (a knob, off by default): consumer ``c`` takes all ``blk_n`` rows of N and rows ``[c * blk_m/W, (c+1) *
blk_m/W)`` of M instead of its rows of N: both read the stage's B rows, each its own rows of A (its wgmma's B
descriptor starts at its first row, ``common.encode_slot0``'s ``col0``), ``wgmma.m64n{blk_m/W}``, and it stages and
stores its own rows of D. A 64-row tile of N then has two consumers: at 160x64 fp8 (640x2112x7168), each overlaps its
promotion in 80 rows, where one consumer of 160 rows has no registers for the second set and drains
(1.19x, ``benchmarks/results/2026-11-30_h200_fp8_narrow/``). cuBLASLt runs that tile with two consumers too
(``nvjet_sm90_qqtst_64x160_128x7_1x2_h``).
Barriers: v10's. Workspace: v10's, slots of blk_m x blk_n fp32 partials.

When it pays: small M (up to about 64; up to 256 where N is large) with a large N: the kernel
is bound by reading B once, at the HBM's bandwidth, and split-K (v10) fills the SMs when
N / blk_n tiles are too few: at M <= 64, N = K = 4096 and blk_n = 128 there are 32 tiles for 132
SMs, so split_k = 4 gives 128 units (``schedulers.wave_model`` chooses). Deep rings (pipe_depth 6-8)
keep enough bytes in flight per SM; clusters buy little here (A, the shared operand, is small).

Constraints:
  - sm_90a; float16/bfloat16, K and N multiples of 8, blk_k = 64; or e4m3 A and B with per-tensor or rowwise
    scales (blk_k = 128, no bias, D in 16 bits: ``fp8.check_split``);
  - blk_m a multiple of 8 from 8 to 256 (wgmma's N); blk_n in {64, 128, 192, 256}, a multiple of
    64 x num_warpgroups (1 or 2 consumers, whole 64-row atoms of N each); with split_m, blk_n a multiple of 64 and
    blk_m of 8 x num_warpgroups;
  - pipe_depth from 2 up to what shared memory allows beside the blk_m x blk_n staging;
  - clusters as v8 (a shared A tile splits into whole 8-row parts: blk_m a multiple of 8 x
    cluster_n); split_k, tile orders and dynamic_m as v10.

Run:  python -m gemm_ladder build v11 --shape 16x4096x4096 --knob blk_m=16 --knob split_k=4 --out build/
"""

from dataclasses import dataclass

from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from . import common, fp8, gemm, splitk
from .common import SwapPlan

PRESET = gemm.V11
TECHNIQUE = "swap AB: N in the MMA's 64-row slot, small M as its N, the tile stored transposed"


@dataclass(frozen=True)
class V11Knobs:
    """v11's knobs and their defaults (``KNOBS``; ``rungs.make_config`` validates them)."""

    blk_m: int = 64  # rows of M: wgmma's N, a multiple of 8
    blk_n: int = 128  # rows of N: wgmma's 64-row atoms
    blk_k: int = 64
    num_warpgroups: int = 2  # consumer warpgroups
    pipe_depth: int = 6
    l2_group_size: int = 8
    tile_order: str = common.DEFAULT_TILE_ORDER
    cluster_m: int = 1
    cluster_n: int = 1
    dynamic_m: bool = False  # M a runtime value: one module for every M
    split_k: int = 4  # work units a tile's K loop is cut into
    stream_b: bool = False  # L2 hints: B read once, A kept
    pdl: bool = False  # programmatic dependent launch (gemm.ProductionKnobs)


KNOBS = gemm.knob_defaults(V11Knobs)
# knobs taken anywhere, kept only away from their defaults (``rungs.make_config``): pdl's L2 warm-up of the
# weight's first slices (producer.warm_l2); v9's bias_stash (epilogue.BiasStash, on by default)
# and split_m, the consumers on rows of M where they take rows of N without it (common.SwapPlan.split_m)
OPTIONAL_KNOBS = {"l2_warm": False, "bias_stash": True, "split_m": False}
BLK_M_CHOICES = common.SWAP_BLK_M  # M is wgmma's N
# the operand spec's epilogues this preset builds (gemm_ladder.core.spec): a bias per column of D, an
# activation and alpha, on each value as the transposed epilogue stages it (its column of D is a row of the
# D^T fragment: ``epilogue.acc_to_smem_stmatrix_trans``); not the residual (C would be read transposed into
# the staging buffer) nor a float32 D (stmatrix stores 16-bit values)
# and scaled, fp8 with per-tensor or rowwise scales (issue 32: mid M, the tile's rows on wgmma's N; the scales on the
# sums)
EPILOGUES = ("none", "bias", "act", "alpha", "scaled")
# knobs of its fp8 kernels only (``rungs.make_config`` adds them where the spec is fp8), v9's promotion
FP8_KNOBS = {"promote": fp8.PROMOTE_DEFAULT, "overlap": fp8.OVERLAP_DEFAULT}
FP8_DEFAULTS = {"blk_k": 128, "split_k": 1}  # one 128-byte swizzle row of fp8; whole tiles (a split is asked for)
CONSUMERS = (1, 2)
# what the tuner tries beyond the defaults (gemm_ladder.tune.space)
TUNE_CHOICES = {"blk_m": (8, 16, 32, 64), "blk_n": (64, 128, 256), "pipe_depth": (4, 6, 8),
                "split_k": (1, 2, 3, 4, 6, 8), "cluster_m": (1,), "cluster_n": (1,)}


def check(cfg: GemmConfig) -> None:
    common.check_swap_tile(cfg, CONSUMERS)
    common.check_pipe_depth(cfg)
    common.check_l2_warm(cfg)
    common.check_consumer_registers(cfg, SwapPlan(cfg))
    splitk.check_grid(cfg)
    if spec_of(cfg).is_fp8 and fp8.recipe(cfg) == "block":
        raise ConfigError("v11 fp8 with block scales: swap AB transposes the tile, and block scales are applied by K "
                          "block at each promotion, indexed by the tile's rows; v11 builds per-tensor and rowwise "
                          "scales only (use v9 for block scales)")
    fp8.check_split(cfg, SwapPlan(cfg))  # its registers counted on the swapped tile
    acc = SwapPlan(cfg).acc_regs
    if fp8.overlap(cfg) and cfg.num_warpgroups == 2 and acc > FP8_OVERLAP_MOST_ACC:
        raise ConfigError(
            f"v11 fp8 with overlap={fp8.overlap(cfg)} over two consumers of {acc} accumulators each "
            f"(blk_m={cfg.blk_m}, blk_n={cfg.blk_n}): two sets and the promoted sums spill beside the transposed "
            f"epilogue (400 bytes of stack at 64x256, which ran 0.34x the drained kernel: {FP8_OVERLAP_RESULTS}); "
            f"use overlap=0, or a tile of at most {FP8_OVERLAP_MOST_ACC} accumulators a consumer"
        )


# the most accumulators a consumer of two overlaps its promotion with, without spilling (ptxas, sm_90a: 48 at 96x128,
# 192x64 in split_m and 48x256 take no stack; 64 at 64x256 takes 400 bytes), and where the spill was timed
FP8_OVERLAP_MOST_ACC = 48
FP8_OVERLAP_RESULTS = "benchmarks/results/2026-11-30_h200_fp8_narrow/README.md"

cluster_grid = splitk.cluster_grid


def workspace(cfg: GemmConfig) -> dict:
    return gemm.workspace(cfg, PRESET)


def launch(cfg: GemmConfig) -> dict:
    return gemm.launch(cfg, PRESET)


def kernel(cfg: GemmConfig):
    return gemm.kernel(cfg, PRESET)
