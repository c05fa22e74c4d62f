"""hgemm_v10 (Hopper): split-K, several CTAs share the K loop of one output tile.

v10 is a preset of the production kernel (``sm90a/gemm.py``, the template that owns the roles,
the ring, the loop over work units and the barriers): v9's parts with split-K's schedule.

What changed from v9: v9 gives every output tile to one CTA, so a shape with fewer tiles than
SMs (or a little more than a whole number of waves of them) leaves SMs idle for the whole
kernel: 978x2640x3336 in 128x256 tiles is 88 tiles on 132 SMs, two thirds of the GPU. v10 cuts
each tile's K loop into ``split_k`` work units (unit ``s`` runs K slices
``[s * k_tiles / split_k, (s+1) * k_tiles / split_k)``): ``split_k`` times as many units, each
``split_k`` times shorter, so the waves fill. Each unit ends with fp32 accumulators that are
only part of the sum; the units of a tile meet in a workspace in global memory and the last one
to finish adds them up and stores the tile (``sm90a/splitk.py`` draws the protocol):

    consumer c, unit (tile, s):  K slices of split s: wait tma2mma; wgmma; ...  (as v9)
                                 st.global Dreg -> workspace slot (tile, c, s)
                                 bar.sync 1+c; thread 0: fence; old = atom.add count[tile, c]
                                 bar.sync 1+c
                                 old == split_k - 1 (the last):
                                   Dreg = slot 0 + ... + slot split_k-1  (split order)
                                   count[tile, c] = 0; the v9 epilogue (chunks, TMA store)
                                 -> next unit

The scheduler walks a grid whose columns are (N tile, split) pairs (column ``n * split_k + s``
of the cluster grid), so the units of a tile are neighbours in every tile order: they run in the
same wave, their partials are still in L2 when the last one reads them, and no unit ever waits
for another (no deadlock whatever runs when). The sum is taken in split order whoever comes
last: the same bits on every run.

The fused epilogue (issue 31: a bias, an activation, alpha, a residual C, a float32 D) runs where the
tile is stored, in the last unit (or piece) on the sum: the same ``ChunkedEpilogue`` as v9's, so an
epilogue call at a sub-wave shape splits its K loop as a plain one does (bias+GELU at 256x4096x14336,
0.59x cuBLASLt's fused epilogue in v9's 128x128 tiles, ran 0.86x split in two,
benchmarks/results/2026-11-28_h200_epilogue_split/). A residual's C is loaded at each chunk (v9's
``c_prefetch`` would load it before a K loop whose unit may not be the last); the protocol checker, which
sees one cluster and not the other CTAs' counts, takes the last-unit branch both ways
(``sync.classes.COUNTED_BRANCHES_ATTR``).

fp8 (per-tensor and rowwise scales, ``sm90a/fp8.py``'s ``check_split``): each unit (or stream-K piece)
promotes its sums into an fp32 total as v9 does (``overlap`` too); the totals are the partials, and the
last unit applies the scales once to their sum before the epilogue. A unit whose count of slices is known
only at run time (a split that does not divide the slices, a stream-K piece) takes the promotion every
slice (``mainloop._run_promoted_each``, ``_run_overlapped_each``).

Roles and registers: v9's (warpgroup 0 produces, consumers 1..W own their rows and epilogues).
Barriers: v9's, and a counter in global memory per tile and consumer:

    ============  ============================================  ================================
    barrier       arrived by                                    waited by (phase)
    ============  ============================================  ================================
    tma2mma[s]    as v9 (the producer's expect_tx + the bytes)  every consumer thread, as v9
    mma2tma[s]    as v9 (lane 0 of every consumer warp of the   the producer before a refill
                  cluster, after the wait_group)
    bar 1+c       consumer c's 128 threads: twice per unit      (named barrier, no phase)
                  around the count, twice per stored chunk
    count[t, c]   thread 0 of consumer c in each of tile t's    nobody: the unit whose add
    (global)      split_k units (fence; atom.acq_rel.gpu.add)   returns split_k - 1 sums
    ============  ============================================  ================================

The partials: ``split_k`` fp32 slots per tile and consumer, in fragment order
(``launch["workspace"]``; the runtime allocates them and zeroes the counters once, the last unit
of each tile puts its counter back to zero).

``reduce="atomic"`` (off by default; ``splitk`` draws it): the last unit above reads ``split_k``
slots on one SM after its K loop (split 4 of a 128x128 tile: 256 KiB through one SM's L2 port, a
few microseconds of a 10-20 us sub-wave kernel). With it every unit adds its partial into the
part's one slot with ``red.global.add.v4.f32`` (the adds run in L2, spread over the units' SMs) and
the last reads that one slot back and zeroes it: a workspace ``split_k`` times smaller, the sum in
the order the adds arrive (not the same bits on every run, as cuBLAS's split-K reductions are not).

When it pays: fewer tile units than about two waves (a few big tiles over many SMs: small or
middling M and N with a long K). It costs the partials' traffic, ``split_k`` x blk_m x blk_n x
4 bytes per tile written and read back through L2, and shorter K loops (the ring fills once per
unit); ``schedulers.wave_model`` models both and picks ``split_k``. ``split_k=1`` is v9 (with an
unused workspace).

Stream-K (``stream_k=True`` with ``split_k=1``, off by default; ``sm90a/streamk.py`` draws it):
split-K cuts every tile evenly, stream-K only the tail. T cluster tiles on G clusters leave the
last wave ``G - T % G`` clusters idle; with ``stream_k`` the full waves run whole tiles as v9
does, and the K slices of the partial wave's tiles (with the wave before them when they are
fewer than half a wave) are dealt out evenly, a contiguous range to each cluster. A tile then
has two or three pieces on neighbouring clusters; they meet in the workspace as split-K units
do, except that a piece reads the counter first and skips publishing when the others are in,
and the last one sums the pieces in K order with its own registers at its place (the same bits
whatever arrives last). Each cluster runs its whole tiles, then the piece from slice 0, then
the one up to the end of its range, so the clusters read the same K slices at about the same
time (in the range's own order DRAM reads went up from 147 to 280 MB at 4096^3).

    consumer c, piece (tile j, slices [k0, k0 + nk)):  the K loop (as v9)
        whole tile:  the v9 epilogue
        else:        bar.sync; thread 0: seen = ld.acquire.gpu count[j, c]; bar.sync
                     seen < pieces - 1: st.global Dreg -> slot; bar.sync; thread 0: fence;
                                        old = atom.add count[j, c]; bar.sync
                     last (seen or old == pieces - 1): Dreg = p0 + p1 (+ p2), own at its place;
                                        count[j, c] = 0; the v9 epilogue

On an H100 (``benchmarks/results/2026-11-23_h100_stream_k/``) it pays where the tail is most of
a wave: 1792x2560x8192 (70 cluster tiles on 66 clusters) 0.95x cuBLAS against v9's 0.56x and
split-K's 0.64x, 2560x2560x8192 0.96x against 0.82x, 2304x4096x4096 0.92x against 0.73x (but v9
in 128x192 tiles, whose waves come out whole there, 0.99x); 6144^3 0.99-1.01x against
0.95-1.00x. The front door chooses it by makespan (``plan``'s rule ``stream-k``). It loses where the
partial wave is nearly full: 4096^3 (58 of 66) 0.95x against v9's 1.00x, 3072x8192x1536
0.93x against 1.01x: every cluster meets twice (publishes 128 KiB or reads it back, a fence,
the K loop drained and refilled), about 14k cycles an SM, more than the 8 slices it saves.

Constraints:
  - those of v9 (clusters, consumers, epi_n, registers, shared memory; ``dynamic_m``, ``stream_b``);
  - stream_k only with split_k=1; its workspace is two slots of every consumer's accumulators
    and a counter per CTA of the launch (the runtime sizes it for the GPU at hand);
  - split_k from 1 to the K slices (K / 64, rounded up) and at most 32. With 128 accumulators
    a consumer (128x256 over two) and split_k >= 3, ptxas spills one register around the last
    unit's sum (a store and a load once a tile, off the K loop).

Run:  python -m gemm_ladder build v10 --shape 978x2640x3336 --knob split_k=2 --out build/
      python -m gemm_ladder build v10 --shape 333x1280x5120 --knob split_k=4 --knob reduce=atomic --out build/
      python -m gemm_ladder build v10 --shape 1792x2560x8192 --knob split_k=1 --knob stream_k=true --out build/
"""

from dataclasses import dataclass

from ..core.config import GemmConfig
from . import common, epilogue, fp8, gemm, splitk, streamk

PRESET = gemm.V10
TECHNIQUE = "split-K: a tile's K loop over several CTAs, the last one sums the fp32 partials"
# the operand spec's epilogues this preset builds (gemm_ladder.core.spec): v9's chunked epilogue in the last
# unit (the bias, the activations, alpha, the residual, a float32 D; not the gated B), and scaled, fp8
# per-tensor and rowwise scales (issue 32: the sub-wave fp8 shapes, a tile's K over several CTAs, each unit's
# promoted fp32 sums the partials, scaled once by the last unit; ``fp8.check_split``)
EPILOGUES = ("none", "bias", "act", "scaled", "alpha", "residual", "fp32_out")
# knobs of its fp8 kernels only (``rungs.make_config`` adds them where the spec is fp8), v9's promotion
FP8_KNOBS = {"promote": fp8.PROMOTE_DEFAULT, "overlap": fp8.OVERLAP_DEFAULT}
FP8_DEFAULTS = {"blk_k": 128, "blk_n": 128}  # one 128-byte swizzle row of fp8; room for the promoted sums


@dataclass(frozen=True)
class V10Knobs(gemm.ProductionKnobs):
    """v10's knobs and their defaults (``KNOBS``; ``rungs.make_config`` validates them): the
    production kernel's, and the split."""

    split_k: int = 2  # work units a tile's K loop is cut into
    stream_k: bool = False  # (split_k=1) the partial wave's K loops spread evenly over the clusters


KNOBS = gemm.knob_defaults(V10Knobs)
# knobs kept only where set away from their default (``rungs.make_config``: the tags and cache keys of
# every other v10 module stay as they were): where a tile's split-K units meet (``splitk``: a slot
# each, summed in split order by the last, or one slot they all add into with red.global.add); fp8's
# overlapped promotion unrolled over a unit's slices where a split divides them (v9's unroll_k, fp8.unroll_k);
# pdl's L2 warm-up of the weight (producer.warm_l2); v9's bias_stash (epilogue.BiasStash, on by default)
OPTIONAL_KNOBS = {"reduce": splitk.REDUCE_MODES[0], "unroll_k": False, "l2_warm": False, "bias_stash": True}
CONSUMERS = (1, 2, 3)
# what the tuner tries beyond the defaults (gemm_ladder.tune.space)
TUNE_CHOICES = {"split_k": (1, 2, 3, 4, 6, 8), "stream_k": (False, True)}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg, CONSUMERS)
    epilogue.check_epilogue(cfg)
    common.check_pipe_depth(cfg)
    common.check_l2_warm(cfg)
    common.check_consumer_registers(cfg)
    splitk.check_grid(cfg)
    splitk.check_reduce(cfg)
    streamk.check(cfg)
    fp8.check_split(cfg)


cluster_grid = splitk.cluster_grid


def workspace(cfg: GemmConfig) -> dict:
    """Split-K's slots and counters per row of tiles, stream-K's per CTA of the launch."""
    return gemm.workspace(cfg, PRESET)


def launch(cfg: GemmConfig) -> dict:
    return gemm.launch(cfg, PRESET)


def kernel(cfg: GemmConfig):
    return gemm.kernel(cfg, PRESET)
