"""hgemm_v9 (Hopper): consumers that own their rows, epilogues that overlap the next tile.

v9 is a preset of the production kernel (``sm90a/gemm.py``: the template owns the roles, the
ring, the loop over tiles and the barriers; this file names the parts and declares the knobs).

What changed from v8: in v8 the consumer warpgroups finished a tile together. Both waited at
one named barrier for the previous store to leave the output tile, wrote their rows into it,
met again, and one thread stored the whole tile: a consumer that was done first idled until the
other caught up, and the next tile's first wgmma waited for the slowest warpgroup's epilogue.
v9 makes each consumer warpgroup a worker of its own. Consumer ``c`` owns rows
``[c * blk_m/W, (c+1) * blk_m/W)`` of every tile, and runs its epilogue alone:

  - its own named barrier (``bar.sync 1+c, 128``), so no warpgroup waits for another;
  - its rows leave in ``epi_n``-wide column chunks through two shared buffers of its own: while
    the TMA store of chunk j drains, the warpgroup already writes chunk j+1 into the other buffer
    (``stmatrix``), and only before a buffer is reused does its storing thread wait for the
    store that read it (``cp.async.bulk.wait_group.read(1)``);
  - when the last chunk is handed to TMA, the warpgroup goes straight to the next tile's first
    K slice, which the producer has long loaded: the store drains under the next mainloop.

Smaller staging also gives the ring room: a 128x256 tile with ``epi_n = 64`` stages 2 x 2 x
64 x 64 halves (32 KiB) where v8 staged the whole 64 KiB tile, so four stages fit beside it.
Up to three consumer warpgroups (``num_warpgroups``; 192-row tiles) where their registers allow.

    consumer c, tile t:   for k: wait tma2mma; wgmma; commit; wait_group(1); release (cluster)
                          wait_group(0); release the last slice
                          for each chunk j of epi_n columns (buffer b = chunk count % 2):
                            thread 0 of c: bulk wait_group.read(1)   (buffer b's old store left)
                            bar.sync 1+c; stmatrix rows of c, columns j -> Esmem[c, b]; fence
                            bar.sync 1+c; thread 0 of c: TMA store Esmem[c, b] -> D, commit
                          -> tile t+1, while the stores drain

Roles and registers:

    ==========  ===========================  ==========  ======================================
    warpgroup   role                         registers   why
    ==========  ===========================  ==========  ======================================
    0           producer (one thread issues  40 (W>1)    a scheduler, a slice counter, TMA
                the cluster's TMA parts)                 coordinates and multicast masks
    1..W        consumer c = warpgroup - 1:  232 (W=2)   blk_m/W x blk_n / 128 accumulators
                wgmma, its own epilogue      152 (W=3)   (128 at 128x256 / 2, 96 at 192x192 / 3),
                                             255 (W=1)   descriptors, stmatrix staging; with
                                                         epi_under, half as many again for the
                                                         last tile's 16-bit pairs (192 of 232)
    ==========  ===========================  ==========  ======================================

Barriers (one mbarrier per stage and CTA, as in v8; named barriers 1..W, one per consumer):

    ==========  ==========================================  =================================
    barrier     arrived by                                  waited by (phase)
    ==========  ==========================================  =================================
    tma2mma[s]  this CTA's producer (arrive.expect_tx of     every consumer thread of this
                the whole stage) + the bytes of this CTA's   CTA, (it / S) & 1
                parts and of its peers' multicast parts
    mma2tma[s]  lane 0 of every consumer warp of every CTA   this CTA's producer before
                of the cluster (4 x W x cluster size)        refill it, ((it / S) & 1) ^ 1
    bar 1+c     the 128 threads of consumer c, twice per     (named barrier, no phase)
                chunk
    ==========  ==========================================  =================================

The consumers stay in step through the ring alone: a stage is refilled only when every
consumer warp of the cluster released it, so a consumer that runs ahead into the next tile
can be at most ``pipe_depth`` slices ahead of the slowest.

One module for every M (``dynamic_m=True``): M becomes a runtime value of the kernel (a
symbolic ``M`` bound from A's shape by the host code; the TMA descriptors, encoded on the host
at every call, take it as their extent, so loads zero-fill and stores clip at the real M), and
the scheduler's number of M tiles is computed from it at run time. N and K stay fixed (they
are the weights). The knobs are validated and tuned at the shape's M; the manifest says
``launch["dynamic_m"]`` and the M range they were chosen for (``dynamic_m["tuned_for_m"]``).
Tile orders: grouped or snake (``schedulers.tirx_orders.RUNTIME_M_ORDERS``).

Ping-pong consumers (each consumer whole tiles, in turn) are not a knob: they measured slower
on every shape (0.79-0.99x cuBLAS where the cooperative consumers ran 1.00-1.03x in the same
process: ``benchmarks/results/2026-11-22_h100_v9_pingpong/``; tutorial 10 tells why).

Streaming B (``stream_b=True``, off by default): when few rows of A meet a large B (M up to
128: the weights stream past a handful of tokens), B is read once and A again by every CTA. The
loads then say so: B's TMA copies carry an L2 evict-first policy and A's evict-last, and both
tensor maps fetch 256 bytes per L2 miss (``producer.load_hints``). On an H100 it paid 1.6-6.3% at
18 of 20 shapes with M <= 128 and lost 1% at M = 512 (and 4% where two CTAs read one B tile
without multicast), so the front door's small-M rules set it and the others do not.

A narrow last wave (``tail_n``, 0 = off; ``sm90a/narrowtail.py`` draws the cut): the rows of
tiles the partial wave would run are cut again into ``tail_n``-wide tiles, enough of them that
every cluster runs one (``m64n{tail_n}k16``, the columns after the last ``epi_n`` chunk stored
from the registers), so the busiest cluster runs (waves - 1) x blk_n + tail_n columns instead of
waves x blk_n: 1000 against 1024 at 4096^3 (``tail_n=232``). The cut is computed at launch from
the cluster count, and none is made where it would not fit. On an H100 it paid at 8192^3 fp16
(1.5-5%) but not at 4096^3 (5% slower in 1x1 clusters, level in 2x1): a narrow tile took 1.1x a
whole one's time for 0.91 of its wgmma cycles (``benchmarks/results/2026-11-23_h100_narrow_tail/``).

The epilogue under the next tile (``epi_under=True``, off by default; the tuning database
turns it on at every benchmark shape, the front door's ``large`` rule wherever 128x256 tiles
outnumber the SMs: with one tile a CTA there is nothing to hide the stores under, and it
measured 1-4% slower). Above, a consumer's tensor cores idle from its last
slice's retirement until its last chunk's store is issued: about 3k of a 67k-cycle tile at
4096^3 on an H100. With ``epi_under`` the consumer only rounds the accumulators into 16-bit
pairs there (``epilogue.acc_to_pairs``: 64 registers a thread at 128x256 / 2, kept beside the
next tile's accumulators) and goes straight to the next tile; chunk j of the old tile leaves
from the pairs once the new tile's slice j is issued and slice j - 1 has retired, while slice j
runs (``mainloop.Consumer.issue_under``). The last tile stores after its loop as before. Same
barriers, same named-barrier use per chunk; only where the chunks sit moves:

    consumer c, tile t:   for k < chunks: wait tma2mma; wgmma; commit; wait_group(1); release
                                          [t > 0] chunk k of tile t-1 from the pairs (as above)
                          for the other k: as above
                          wait_group(0); release the last slice; accumulators -> pairs
    after the last tile:  its chunks from the pairs

On an H100 (``benchmarks/results/2026-11-23_h100_epi_under/``, modules and cuBLAS taking turns
in the same rounds) it is 1.7-2.1% faster at 4096^3 (1.019-1.027x cuBLAS), 1.1-2.2% at 8192^3,
1.2-1.4% at 6144^3 fp16 and 3.8-5.8% at 3072x8192x1536; ncu counts 4-5k fewer cycles on the
busiest SM at 4096^3. What it leaves: the wgmma pipe still drains and refills at every boundary
(ptxas serialises all wgmmas when a loop that reads accumulators carries pending wgmma groups
over its back edge, so the next tile's first slice cannot be issued under the last one's), and
192 of the 232 registers are taken.

Reading K backwards on every second tile of a CTA (``k_zigzag=True``, off by default): the
producer loads that tile's slices from the last to the first, so it starts on the K panels of A
and B the tile before ended with, still in L2 (the consumers add the slices in the order they
land). At 4096^3 on an H100 it cut DRAM reads by 12-33%
(``benchmarks/results/2026-11-23_h100_tile_boundary/``) and the time by 0-0.2%.

A residual's C loaded ahead (``c_prefetch=True``, residual specs only, on by default; issue 31):
the epilogue adds ``beta . C``, C's chunk loaded by TMA into the staging buffer the chunk is then
stored from (``epilogue.ResidualRead``). At each chunk that load's latency sat in front of every
chunk (0.65-0.91x torch at M = 128, ``benchmarks/results/2026-11-26_h100_epilogue/``); with the
knob the tile's first chunk is loaded before its K loop (its buffer's store has left it) and lands
under the wgmmas, and each next chunk's is issued one chunk ahead. Each staging buffer has its own
``c_ready`` mbarrier (two loads may be in flight a consumer). ``c_prefetch=False`` keeps the load at
the chunk, for the A/B of ``benchmarks/epilogue_check.py``.

fp8 (``spec=GemmSpec.fp8(...)``, issue 32; ``sm90a/fp8.py`` says what changes): e4m3 operands
through the same ring at blk_k = 128 (one 128-byte swizzle row), ``m64nNk32`` e4m3 wgmmas, fp32
scales (one a tensor, or one a row of A and a column of B) on the sums before the bias, and the
promotion (knob ``promote``, fp8 specs only: the tensor cores' sums added into fp32 every
``promote`` slices), with two knobs against the drain before each promotion's adds: ``overlap``
(groups in two accumulator sets, a group's adds under the next group's wgmmas) and ``stagger`` (the
consumers' drains take turns; ``sm90a/fp8.py``). Its defaults: 128x128 tiles over two consumers (the
promoted sums double the accumulators), ``promote=1``, ``overlap=0``, ``stagger=False``; with a
promotion in one accumulator set, ``epi_under`` stores the previous tile's pairs under the next tile's
first promotion group (``mainloop.Consumer.run_under``); no ``tail_n`` yet.

Two consumers on one tile's rows (``k_consumers=2``, off by default; ``sm90a/kconsumers.py``): each
consumer's rows get a second consumer warpgroup, the two taking alternate K slices of the tile into
sums of their own, the second's handed to the first through shared memory at the tile's end (the
first stores the tile). Where a 64-row tile leaves one consumer to issue every wgmma alone (fp8 at
small M, cuBLASLt runs two consumers on its 64x64 tiles there); measured 1-16% slower than one consumer
at the fp8 shapes timed (``benchmarks/results/2026-11-28_h100_fp8_kconsumers/``), so no rule sets it.

fp8's overlapped promotion unrolled over the whole tile (``unroll_k``, off by default; ``fp8.unroll_k``):
the loop over runs of ``overlap`` groups carries ``#pragma unroll``, so nvcc keeps the ring's slot and the
wgmma descriptors in uniform registers where the 64-row tiles' rolled loop moved them over for every wgmma;
where two accumulator sets and the total fit 168 registers and the unrolled loop stays short enough for the
instruction cache (``budget.fp8_unroll_fits``): +1-4.4% at the policy's overlapped tiles, level or faster at the
shapes held out (``benchmarks/results/2026-11-28_h200_fp8_unroll/``).

Constraints:
  - those of v8, with num_warpgroups (consumers) 1, 2 or 3 (blk_m a multiple of 64 x W);
  - blk_n a multiple of 16 from 32 to 256 (cuBLASLt's 96-, 112- and 144-wide tiles among them; 32 and 48 for
    one row of tiles at small M, as many CTAs as SMs);
    epi_n a multiple of 16 that divides blk_n (epi_n = blk_n: one buffer per consumer, the whole
    row band at once); a chunk leaves in 64-, 32- or 16-column boxes, the widest that divide it;
  - pipe_depth up to what shared memory allows beside the staging buffers;
  - tail_n a multiple of 8 below blk_n, with a fixed M, the cooperative consumers and a grouped
    or snake tile order;
  - epi_under with the cooperative consumers, tail_n = 0 and room for the pairs (accumulators
    x 1.5 + 40 registers within the consumer's budget: not three consumers).

Run:  python -m gemm_ladder build v9 --shape 8192x8192x8192 --knob pipe_depth=4 --out build/
"""

from dataclasses import dataclass

from ..core.config import BLK_N_16, GemmConfig
from . import common, epilogue, fp8, gemm, kconsumers, narrowtail

PRESET = gemm.V9
TECHNIQUE = "consumers with their own rows and epilogues, stores draining under the next tile"
# the operand spec's epilogues this preset builds (gemm_ladder.core.spec; scaled: fp8)
EPILOGUES = ("none", "bias", "act", "scaled", "alpha", "residual", "fp32_out", "gated")
MN_MAJOR = True  # the spec's a_major="M" / b_major="N": A [K, M], B [K, N] through transposed wgmma operands
# knobs of its fp8 kernels only (``rungs.make_config`` adds them where the spec is fp8: the knobs
# and tags of 16-bit modules stay as they were), and their defaults for v9's own (sm90a/fp8.py)
# K slices between promotions into fp32 (0: none); promotion groups between drains, two accumulator sets (0: off);
# odd consumers' groups offset by half a group or run (the consumers' drains take turns)
FP8_KNOBS = {"promote": fp8.PROMOTE_DEFAULT, "overlap": fp8.OVERLAP_DEFAULT, "stagger": False, "stage_scales": False}
# knobs taken anywhere, kept only away from their defaults (``rungs.make_config``: the tags and cache
# keys of other modules stay as they were): fp8 block scales staged by plain bulk copies (fp8.stage_bulk),
# fp8's promotion groups in two half-width wgmma groups (fp8.halves: a 128x256 tile with its promotion),
# a second consumer on each consumer's rows taking alternate K slices (kconsumers.py), fp8's overlapped
# promotion unrolled over the whole tile (fp8.unroll_k), pdl's L2 warm-up of the weight (producer.warm_l2), and,
# on by default, a 16-bit bias epilogue's values loaded into registers before the tile's K loop (epilogue.BiasStash;
# bias_stash=False reads them where they are added, as before: kept to measure the stash against)
OPTIONAL_KNOBS = {"stage_bulk": False, "stage_bulk_split": False, "halves": False, "k_consumers": 1,
                  "k_halves": False, "unroll_k": False, "l2_warm": False, "bias_stash": True}
FP8_DEFAULTS = {"blk_k": 128, "blk_n": 128}  # one 128-byte swizzle row of fp8; room for the promoted sums
# knobs of its residual kernels only (the spec's ``residual``; ``rungs.make_config`` adds them there, as
# FP8_KNOBS): the residual's C loaded ahead (epilogue.ResidualRead), the first chunk under the K loop
RESIDUAL_KNOBS = {"c_prefetch": True}


@dataclass(frozen=True)
class V9Knobs(gemm.ProductionKnobs):
    """v9's knobs and their defaults (``KNOBS``; ``rungs.make_config`` validates them): the
    production kernel's, and v9's options."""

    tail_n: int = 0  # the partial wave's tiles cut this wide (0: off)
    epi_under: bool = False  # a tile's chunks stored under the next tile's first slices
    k_zigzag: bool = False  # every second tile of a CTA loads its K slices backwards


KNOBS = gemm.knob_defaults(V9Knobs)
CONSUMERS = (1, 2, 3)
BLK_N_CHOICES = BLK_N_16  # whole 16 columns: the chunked epilogue's boxes narrow to its chunks (epilogue.box_cols)
TUNE_CHOICES = {"cluster_m": (1, 2), "cluster_n": (1, 2), "epi_n": (64, 128, 256), "epi_under": (False, True),
                "k_zigzag": (False, True),
                "num_warpgroups": CONSUMERS, "blk_m": (64, 128, 192, 256)}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg, CONSUMERS)
    epilogue.check_epilogue(cfg)
    common.check_epi_under(cfg)
    common.check_consumer_registers(cfg)
    common.check_pipe_depth(cfg)
    common.check_l2_warm(cfg)
    common.check_cluster(cfg, common.CLUSTER_M_WIDE)
    common.check_schedule(cfg, grid=cluster_grid(cfg))
    common.check_dynamic_m(cfg)
    common.check_majors(cfg)
    narrowtail.check(cfg)
    fp8.check(cfg)
    kconsumers.check(cfg)


def cluster_grid(cfg: GemmConfig, M=None) -> tuple:
    """The grid of cluster tiles the scheduler walks (for ``M``, default cfg.M; a runtime M
    gives a runtime number of rows)."""
    return PRESET.cluster_grid(cfg, M)


def launch(cfg: GemmConfig) -> dict:
    return gemm.launch(cfg, PRESET)


def kernel(cfg: GemmConfig):
    return gemm.kernel(cfg, PRESET)
