"""Grouped GEMM over experts (mixture of experts, contiguous layout): the production kernel's parts
with a schedule of (expert, m-tile, n-tile) work units read from the routing on the device.

    D[offs[e-1]:offs[e], :] = A[offs[e-1]:offs[e], :] . W[e]^T     for every expert e   (offs[-1] = 0)

A ``[M, K]`` holds the tokens sorted by expert, W ``[E, N, K]`` one ``nn.Linear`` weight per expert,
``offs`` (int32, ``[E]``, on the GPU) the cumulative END row of each expert (``torch._grouped_mm``'s
``offs``), D ``[M, N]``. One persistent launch; nothing of the routing crosses to the host, so a
CUDA graph captured once serves any later routing (the counts change, the graph does not).

Why a scheduler of our own: TVM's tile schedulers (``schedulers.make_tirx_scheduler``) walk one
grid fixed at launch; here the grid is a union of per-expert grids whose sizes live in device
memory. The walk, in every CTA:

    prologue (all threads): ends[e] = offs[e] (one load each) -> shared;     cta_sync
             thread 0:      clamp into [0, M], non-decreasing (a running max: bad offs can give a
                            wrong answer, never a write outside D) and count each expert's tiles:
                            tile_end[e] = sum over e' <= e of ceil(rows(e') / blk_m) * n_tiles
             (the cluster barrier that follows the barrier inits publishes both tables)
    work:    t = cta, cta + num_ctas, ... while t < tile_end[E - 1]:
             e      = #{e' : tile_end[e'] <= t}              (a binary search, log2(E) shared loads)
             local  = t - tile_end[e - 1]                    (experts with no rows own no tiles)
             (m, n) = grouped order inside the expert       (bands of l2_group_size m-tiles; in a
                                                               band, the m-tiles of one n-tile run
                                                               side by side, so a wave shares each
                                                               weight tile across a band of tokens)
             A rows  ends[e-1] + m * blk_m ...   B rows  e * N + n * blk_n ... of W viewed [E*N, K]
             D rows  as A's, columns n * blk_n ...

The producer thread and every consumer thread compute the same walk from the same tables, so they
agree on every tile without talking (the ring still carries the data). :func:`walk` is the model
of this walk in plain Python; the tests hold it against a per-expert reference over random routing,
and hold the kernel's TMA loads (every CTA of a launch run by the barrier checker, with the offsets
of :func:`checker_params` or others) against it. Thread 0's scan is serial: about E times a few
cycles before the first load (``warp_scan``, below, scans in chunks of 32 experts).

Why a body beside ``gemm.kernel``'s rather than another form of it: the template's loops take a
TVM tile scheduler (``valid``, ``next_tile``, ``m_idx``) and one epilogue path; here each unit is a
search with an expert-dependent A row, B row and end row, and two epilogue paths. The parts are the
template's own (``Ring``, ``Producer``, ``Consumer``, ``ChunkedEpilogue``), so v9's protocol is
unchanged; threading the walk through the template would touch every branch of v9-v11's loops.

Edges. B rows past an expert's N (N not a multiple of blk_n) are the next expert's weight (or TMA's
zero fill past ``E * N``): they only feed D columns >= N, which the store clips. A rows past the
expert's last row are the next expert's tokens: their output rows must not be written, and a TMA
store clips only at D's end. So the last m-tile of an expert (rows < blk_m) leaves by plain stores
from the registers, each guarded by the expert's end row (``rows_to_global``); whole tiles take the
TMA stores of v9's chunked epilogue. Chosen over tensor maps rewritten on the device per expert (a
``tensormap.replace`` plus a fence per boundary tile, and a map per CTA in global memory): the
guarded stores need no new protocol and touch at most E * n_tiles tiles (one per expert and
n-tile), the minority wherever experts hold more than a few m-tiles.

Masked layout (``layout="masked"``, decode under CUDA graphs, DeepGEMM's "masked"): A is
``[E, max_tokens, K]`` viewed ``[E * max_tokens, K]`` (so the runtime M is ``E * max_tokens``) and
the int32 operand holds each expert's COUNT of valid rows. Only the prologue and the expert's first
row change: ``ends[e] = e * max_tokens + clamp(counts[e], 0, max_tokens)`` (no running max: the
experts' rows do not depend on one another; a count past max_tokens cannot be refused on the
device, so it is cut there, never into the next expert's slot) and an expert's first row is
``e * max_tokens``. The tile count, the search, the order inside an expert and the guarded last
m-tile are the contiguous layout's, so the rows of a slot past its count are never written
(:func:`masked_tables` and ``walk(layout="masked")`` are the model).

Decode (``swap_ab``): a tile of v9's roles spends wgmma's 64-row A slot on tokens, and decode gives an
expert 1-8 of them (DeepSeek-like: top-8 of 256), so most of the MMA work and the A loads are of rows
the expert lacks, while the cost that counts is streaming W. With ``swap_ab`` the tile is v11's
transpose (``common.SwapPlan``): W's ``blk_n`` rows (64 per consumer) fill wgmma's A slot and the
expert's ``blk_m`` tokens (a multiple of 8 from 8 to 256) its N, so a tile streams ``blk_n x K`` of W
once at full width and the tokens ride along. The walk is unchanged (``blk_m`` tokens a tile: the
same units, the same model); the accumulators hold D^T: a whole token tile leaves through
``epilogue.TransposedEpilogue`` (stmatrix.trans, TMA stores), the expert's last one through
:func:`rows_to_global_swapped` (2-byte stores guarded by the expert's end row and N).

The routing's tables (``warp_scan``): thread 0's pass over E experts is E dependent steps (a shared
load, a max, a multiply-add: about 4 us at E = 256 on an H100, all of it before the first load). With
``warp_scan`` the 32 lanes of one warp scan a chunk of ``ceil(E / 32)`` experts each (unrolled: the
loads overlap), and pass their partial results through shared memory at CTA barriers
(:func:`fill_tables_warp`; :func:`warp_scan_tables` is its model, equal to :func:`tables` and
:func:`masked_tables`): three chunk passes and two 31-load carries. Shared memory and CTA barriers
rather than warp shuffles: the barrier checker follows the tables through shared memory from the
stores to the loads (``protocol.exprs.is_table``), so it runs the kernel's own walk under the new
prologue; the depth is the same order as a shuffle scan's (chunks of 32 experts).

SwiGLU (the spec's ``gated``, ``gemm_ladder.grouped_swiglu``): W ``[E, 2I, K]`` holds each expert's
``cat([W_gate, W_up])`` and D is ``[M, I]``. The walk is unchanged (n-tiles over the 2I columns); the
producer loads a tile's B as v9's gated loads do (``producer.gated_row``): its first ``blk_n / 2``
rows the expert's gate rows ``e * 2I + n * blk_n / 2 ...``, the others the up rows of the same outputs
``I`` later, so one thread holds each output's gate and up accumulators. A whole tile leaves through
v9's chunked epilogue with ``gated`` (``silu(gate) * up`` at D's column ``n * blk_n / 2``), the
expert's last m-tile through :func:`rows_to_global_gated`. Gate rows past I (I not a multiple of
``blk_n / 2``) read the expert's up rows and up rows past 2I the next expert's: both feed only D
columns >= I, which the stores clip. Not with ``swap_ab`` (refused: the transposed epilogue has no
gated form). The masked layout takes it unchanged in the kernel; no front door serves it yet.

fp8 (``fp8.enabled``: e4m3 A and W, rowwise scales; ``gemm_ladder.scaled_grouped_mm``): the ring holds
1-byte tiles (blk_k = 128), the consumers promote into fp32 sums as v9's fp8 kernels do, and before
either epilogue path each sum is multiplied by ``scale_a[row]`` and ``scale_b[e, col]``: the dense row
recipe's ``fp8.scale_sums`` with ``scale_b`` viewed as ``[E * N]`` (W's rows), so the tile's first W
row (``e * N + n0``) is its first column's scale; columns past N read the next expert's (their D
columns are clipped) and rows past the expert's end the next tokens' (their rows are not written).

Roles, ring and barriers are v9's (``gemm.py``): a producer warpgroup, ``num_warpgroups``
consumers each owning its rows, ``tma2mma`` / ``mma2tma`` per stage, a named barrier per consumer
for its chunked TMA stores. No narrow tail: not built in this slice.

Clusters (knobs ``cluster_m`` / ``cluster_n``, 1x1 by default; issue 33's floor case). At K = 520 (the odd
5 x 1000x520 weight at 32768 tokens) a 128x256 tile streams 128x520 of A and 256x520 of W from L2 for
only 9 K slices: the kernel is bound by L2 -> SM traffic, not by the MMAs. In a 2x1 cluster two CTAs
take two adjacent m-tiles of ONE expert and the same n-tile, and each loads half of W's tile and
multicasts it into both (``producer.Producer`` with ``cluster_m=2``, v9's loads), a third less traffic a
tile; 1x2 shares A's tile between two n-tiles. So that both CTAs of a cluster hold the same expert, the
work unit is the cluster's (:func:`cluster_units`: an m-PAIR by an n-tile; the tables count
``ceil(m_tiles(e) / 2) * n_tiles`` units an expert), a cluster walks units ``cluster, cluster +
num_clusters, ...`` and the CTA of rank_m r takes m-tile ``2 * pair + r``; bands of ``l2_group_size``
m-tiles are bands of half as many pairs. Where an expert holds an odd number of m-tiles, its last pair's
second m-tile lies past the expert's rows: this PHANTOM still loads its half of W (its partner waits on
those bytes) and runs its K loop (the ring's releases go to both CTAs), and writes nothing: no row of
it is before the expert's end row, which guards the last m-tile's stores (its A rows are the next
expert's tokens, or TMA's zero fill past M). A 1x2 phantom is an n-tile past N: its loads read the
next expert's W rows (or zero fill), its D columns are clipped. The phantoms waste up to half the MMA
work where experts hold one m-tile (decode): clusters are for large experts. With swap AB the producer is
the same (A's tile holds the tokens, B's W's rows), so a 2x1 cluster is two token tiles of an expert sharing
W's tile, and its phantom's transposed stores are guarded by the expert's end row like any last token tile.
Not with fp8 or a gated W_gu (refused by name); :func:`walk` with ``cluster_m`` / ``cluster_n`` is the model.

The epilogue under the next tile (``epi_under``, v9's knob, not with ``swap_ab``): at K = 520 (the
suite's odd 5 x 1000x520 weight) a tile's K loop is 9 slices, and the 128x256 tile's chunked stores
are a large part of each tile (0.91-0.94x ``torch._grouped_mm`` at 32768 tokens,
``benchmarks/results/2026-11-26_h100_grouped_suite``). With it, a WHOLE tile's accumulators are rounded
into 16-bit pairs as soon as its K loop retires, and its chunks go out one under each of the next
tile's first K slices (``Consumer.issue_under``), or after the CTA's last tile. The pairs carry the
place of the tile they belong to (``m_prev``, ``n_prev``, saved in the whole-tile branch), never the
walk entry of the tile in flight, which may be another expert's; a whole tile needs no bound but D's.
The expert's last m-tile is never deferred: it leaves at once by stores guarded by its own expert's
end row, and the tile after it has no pairs to store (``pairs_wait``). The walk is unchanged. Measured
(H100, ``benchmarks/results/2026-11-26_h100_grouped_epi_under``): 0.98-0.99x the defaults on the odd
shape (its stores are not what limits it: the floor case stays at 0.92-0.93x torch with ``epi128``), 1.01-1.03x
on Mixtral-like at 8192 tokens, even on DeepSeek-V3-like at 32768; off by default, not in the policy.

Constraints: those of v9's tile (blk_m = 64 x consumers x atoms, epi_n), clusters 1x1, 2x1 or 1x2, N and K
multiples of 8, a runtime M (any number of tokens; masked: E x max_tokens), E = ``experts`` fixed at
build (the weight's). With ``swap_ab``: v11's tile (blk_m a multiple of 8 up to 256, blk_n whole
64-row atoms over 1 or 2 consumers), the whole ``blk_m x blk_n`` tile staged (counted in the
shared-memory check).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole
from tvm.tirx.script.builder import ir as tirx_builder

import layouts
from ..core import budget
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from ..sync.classes import MBarrier, TMABar
from . import common, epilogue, fp8
from .common import WG_M, HopperPlan, SwapPlan
from .epilogue import ChunkedEpilogue, TransposedEpilogue
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring

MAX_EXPERTS = 1024  # the shared tables: 8 bytes an expert
# where each expert's rows are: "contiguous" (A [M, K] sorted by expert, the int32 operand holds
# cumulative end rows) or "masked" (A [E * max_tokens, K], expert e's rows start at e * max_tokens,
# the int32 operand holds each expert's count of valid rows)
LAYOUTS = ("contiguous", "masked")


# -- the walk, in plain Python (the model the tests check) and as the kernel computes it --------------
# on non-negative ints or PrimExprs (truncating division: the walk's values are never negative)
def _ints(*xs) -> bool:
    return all(isinstance(x, int) for x in xs)


def _min(a, b):
    return min(a, b) if _ints(a, b) else T.min(a, b)


def _div(a, b):
    return a // b if _ints(a, b) else T.truncdiv(a, b)


def _mod(a, b):
    return a % b if _ints(a, b) else T.truncmod(a, b)


def tiles_over(rows, blk_m: int):
    """``ceil(rows / blk_m)`` for a non-negative int or PrimExpr."""
    return _div(rows + (blk_m - 1), blk_m)


def tile_in_expert(local, m_tiles, n_tiles: int, group: int):
    """(m-tile, n-tile) of an expert's ``local``-th work unit: bands of ``group`` m-tiles; inside a
    band the band's m-tiles of n-tile 0 come first, then those of n-tile 1, ... (ints or PrimExprs)."""
    band_units = group * n_tiles
    band = _div(local, band_units)
    within = local - band * band_units
    rows_in_band = _min(group, m_tiles - band * group)
    return band * group + _mod(within, rows_in_band), _div(within, rows_in_band)


def search_steps(experts: int) -> list[int]:
    """The binary search's steps, largest first: powers of two that sum to at least ``experts``."""
    return [1 << s for s in reversed(range(max(1, experts).bit_length()))]


@dataclass(frozen=True)
class WorkUnit:
    """One tile of the walk: expert, its first row of A and D, the rows of the expert after it
    (``row_end``), and the n-tile."""

    expert: int
    row0: int
    row_end: int
    n_tile: int


def tables(offs, M: int, blk_m: int, n_tiles: int) -> tuple[list[int], list[int]]:
    """(ends, tile_end) as the kernel's prologue makes them: each expert's end row clamped into
    [0, M] and non-decreasing, and the running count of tiles through each expert."""
    ends, tile_end, run, tiles = [], [], 0, 0
    for o in offs:
        end = min(max(int(o), run), M)
        tiles += tiles_over(end - run, blk_m) * n_tiles
        ends.append(end)
        tile_end.append(tiles)
        run = end
    return ends, tile_end


def masked_tables(counts, M: int, blk_m: int, n_tiles: int) -> tuple[list[int], list[int]]:
    """The masked layout's (ends, tile_end): expert e's rows start at ``e * max_tokens``
    (``max_tokens = M // E``) and end ``counts[e]`` later, the count clamped into [0, max_tokens]
    on the device (a count past max_tokens cannot be refused there without a host sync: it is
    cut, never read into the next expert's rows)."""
    max_tokens = M // max(1, len(counts))
    ends, tile_end, tiles = [], [], 0
    for e, c in enumerate(counts):
        rows = min(max(int(c), 0), max_tokens)
        tiles += tiles_over(rows, blk_m) * n_tiles
        ends.append(e * max_tokens + rows)
        tile_end.append(tiles)
    return ends, tile_end


SCAN_LANES = 32  # warp_scan: the lanes that scan the routing, each over one chunk of experts


def scan_chunk(experts: int) -> int:
    """Experts a lane of the warp scan owns: ``ceil(E / 32)``, lane l the experts from ``l * chunk``."""
    return -(-max(1, experts) // SCAN_LANES)


def warp_scan_tables(offs, M: int, blk_m: int, n_tiles: int, masked: bool = False) -> tuple[list[int], list[int]]:
    """(ends, tile_end) as the kernel's ``warp_scan`` prologue makes them, pass by pass: 32 lanes,
    each over its chunk of ``scan_chunk(E)`` experts, with the lanes' partial results meeting in
    shared memory between passes (a CTA barrier each). Equal to :func:`tables` (contiguous) and
    :func:`masked_tables` for every routing; the tests hold them to it.

    contiguous: pass 1, each lane's running max of its offsets (``part_max``); pass 2, the max of
    the lanes before it (its carry) clamps its ends into [carry, M] and counts its tiles
    (``part_tiles``); pass 3, the tile counts of the lanes before it added. masked: pass 1 clamps
    the counts and counts the tiles (no expert depends on another), pass 2 adds the carry."""
    E, chunk = len(offs), scan_chunk(len(offs))
    lanes = [range(lane * chunk, min(E, lane * chunk + chunk)) for lane in range(SCAN_LANES)]
    ends, tile_end = [int(o) for o in offs], [0] * E
    part_max, part_tiles = [0] * SCAN_LANES, [0] * SCAN_LANES
    max_tokens = M // max(1, E)
    for lane, mine in enumerate(lanes):  # pass 1
        run = 0
        for e in mine:
            if masked:
                rows = min(max(ends[e], 0), max_tokens)
                run += tiles_over(rows, blk_m) * n_tiles
                ends[e], tile_end[e] = e * max_tokens + rows, run
            else:
                run = max(run, ends[e])
                ends[e] = run
        (part_tiles if masked else part_max)[lane] = run
    if not masked:
        for lane, mine in enumerate(lanes):  # pass 2
            carry = max([0] + part_max[:lane])
            prev, run = min(carry, M), 0
            for e in mine:
                end = min(max(ends[e], carry), M)
                run += tiles_over(end - prev, blk_m) * n_tiles
                ends[e], tile_end[e], prev = end, run, end
            part_tiles[lane] = run
    for lane, mine in enumerate(lanes):  # the last pass: the tiles of the lanes before
        carry = sum(part_tiles[:lane])
        for e in mine:
            tile_end[e] += carry
    return ends, tile_end


def locate(tile_end: list[int], t: int) -> int:
    """The expert of tile ``t``: how many experts end at or before it (the kernel's branchless
    binary search)."""
    e, E = 0, len(tile_end)
    for step in search_steps(E):
        if e + step <= E and tile_end[min(e + step - 1, E - 1)] <= t:
            e += step
    return e


def cluster_units(blk_m: int, n_tiles: int, group: int, cluster_m: int = 1, cluster_n: int = 1) -> tuple[int, int, int]:
    """(rows, n-units, band) of a CLUSTER's work unit: ``cluster_m`` m-tiles side by side (an m-pair
    at 2x1: the CTA of rank_m r takes m-tile ``cluster_m * pair + r``), ``ceil(n_tiles / cluster_n)``
    units across N (an n-pair at 1x2), and bands of ``group`` m-tiles as ``group / cluster_m`` units.
    At 1x1: the tile itself. The tables count these units; an expert's m-tiles past its rows (its
    last pair's second when it holds an odd count) and n-tiles past N are the cluster's phantoms."""
    return blk_m * cluster_m, -(-n_tiles // cluster_n), max(1, group // cluster_m)


def walk(offs, M: int, blk_m: int, n_tiles: int, group: int, num_ctas: int,
         layout: str = "contiguous", cluster_m: int = 1, cluster_n: int = 1) -> list[list[WorkUnit]]:
    """The work units of each CTA in order, as the kernel walks them; ``offs`` is the int32
    operand of ``layout`` (cumulative end rows, or the masked layout's counts).

    In ``cluster_m`` x ``cluster_n`` clusters (CTA ``cta`` is rank ``cta % size`` of cluster
    ``cta // size``, rank = rank_m + cluster_m * rank_n) a cluster walks the units of
    :func:`cluster_units` (``t = cluster, cluster + num_clusters, ...``) and each of its CTAs takes its
    own m-tile and n-tile of the unit: both CTAs of a pair see the same units in the same order (they
    share the ring's stages by multicast). A phantom (``row0 >= row_end``: an m-tile past the expert's
    rows; or ``n_tile >= n_tiles``) still loads and multiplies, and writes nothing."""
    size = cluster_m * cluster_n
    if num_ctas % size:
        raise ValueError(f"num_ctas={num_ctas} is not whole clusters of {size} CTAs; the runtime launches "
                         f"{num_ctas // size * size}")
    masked = layout == "masked"
    unit_rows, unit_n, band = cluster_units(blk_m, n_tiles, group, cluster_m, cluster_n)
    ends, tile_end = (masked_tables if masked else tables)(offs, M, unit_rows, unit_n)
    max_tokens = M // max(1, len(offs))
    total = tile_end[-1] if tile_end else 0
    num_clusters = num_ctas // size
    out = []
    for cta in range(num_ctas):
        clu, rank = divmod(cta, size)
        rank_m, rank_n = rank % cluster_m, rank // cluster_m
        mine = []
        for t in range(clu, total, num_clusters):
            e = locate(tile_end, t)
            start = e * max_tokens if masked else ends[e - 1] if e > 0 else 0
            local = t - (tile_end[e - 1] if e > 0 else 0)
            m, n = tile_in_expert(local, tiles_over(ends[e] - start, unit_rows), unit_n, band)
            mine.append(WorkUnit(e, start + m * unit_rows + rank_m * blk_m, ends[e], n * cluster_n + rank_n))
        out.append(mine)
    return out


# -- the kernel's pieces ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Walk:
    """The kernel's walk: the shared tables (``ends``, ``tile_end``: int32[E]), the shape and the
    layout."""

    ends: object
    tile_end: object
    experts: int
    blk_m: int
    blk_n: int
    n: int  # columns of one expert's weight (D's N)
    n_tiles: int
    group: int
    masked: bool = False  # the masked layout: ends from counts, expert e's first row e * max_tokens
    max_tokens: object = None  # rows an expert owns in the masked layout (M // E, at run time)
    part: object = None  # warp_scan: int32[2 * 32], each scanning lane's running max, then its tiles
    # clusters (cluster_units): a unit is cluster_m m-tiles by cluster_n n-tiles, this CTA's its rank's
    cluster_m: int = 1
    cluster_n: int = 1
    rank_m: object = 0
    rank_n: object = 0

    def total(self):
        return self.tile_end[self.experts - 1]

    @property
    def unit_rows(self) -> int:
        """Rows of A a work unit spans (the tables count units of these): ``blk_m`` a CTA's m-tile."""
        return cluster_units(self.blk_m, self.n_tiles, self.group, self.cluster_m, self.cluster_n)[0]

    @property
    def unit_n(self) -> int:
        """Work units across one expert's N."""
        return cluster_units(self.blk_m, self.n_tiles, self.group, self.cluster_m, self.cluster_n)[1]

    @property
    def band(self) -> int:
        """Work units of a band (``l2_group_size`` m-tiles)."""
        return cluster_units(self.blk_m, self.n_tiles, self.group, self.cluster_m, self.cluster_n)[2]


@T.inline
def fill_tables(w, offs, M, tid, threads):
    """Prologue: every thread loads its experts' offsets into ``ends``; after a CTA barrier thread 0
    clamps them and counts the tiles (the cluster barrier after the barrier inits publishes them)."""
    for i in T.serial((w.experts + threads - 1) // threads):
        if i * threads + tid < w.experts:
            w.ends[i * threads + tid] = offs[i * threads + tid]
    T.cuda.cta_sync()
    if w.masked:
        if tid == 0:
            # the masked layout: no expert's rows depend on another's; only the tile count runs on
            # run[2]: the expert's count clamped into [0, max_tokens] (never into the next expert)
            run = T.alloc_local((3,), "int32")
            run[1] = 0
            for e in T.serial(w.experts):
                run[2] = T.min(T.max(w.ends[e], 0), w.max_tokens)
                run[1] = run[1] + tiles_over(run[2], w.unit_rows) * w.unit_n
                w.ends[e] = e * w.max_tokens + run[2]
                w.tile_end[e] = run[1]
    elif tid == 0:
        # in registers: the last end row, the tiles so far, this expert's end (the loop carries only
        # a max, a min and a multiply-add; the shared loads of later experts do not wait on them)
        run = T.alloc_local((3,), "int32")
        run[0] = 0
        run[1] = 0
        for e in T.serial(w.experts):
            run[2] = T.min(T.max(w.ends[e], run[0]), M)
            run[1] = run[1] + tiles_over(run[2] - run[0], w.unit_rows) * w.unit_n
            w.ends[e] = run[2]
            w.tile_end[e] = run[1]
            run[0] = run[2]


@T.inline
def fill_tables_warp(w, offs, M, tid, threads):
    """Prologue with ``warp_scan``: :func:`warp_scan_tables` (its model) on the device. Every thread
    loads its experts' offsets into ``ends``; then lanes 0..31 of the producer's first warp scan a
    chunk of ``scan_chunk(E)`` experts each, unrolled, their partial results meeting in ``part``
    at CTA barriers (every thread takes part: the others wait for the tables anyway). Depth: three
    chunks and two 31-load carries where thread 0's pass is E dependent steps (at E = 256: about
    60 against 256)."""
    for i in T.serial((w.experts + threads - 1) // threads):
        if i * threads + tid < w.experts:
            w.ends[i * threads + tid] = offs[i * threads + tid]
    T.cuda.cta_sync()
    chunk = T.meta_var(scan_chunk(w.experts))
    first = T.meta_var(tid * chunk)  # this lane's first expert
    if tid < SCAN_LANES:
        # pass 1: masked, clamp each count and count the lane's tiles; contiguous, its running max
        s1 = T.alloc_local((2,), "int32")
        s1[0] = 0
        for j in T.unroll(chunk):
            if first + j < w.experts:
                if w.masked:
                    s1[1] = T.min(T.max(w.ends[first + j], 0), w.max_tokens)
                    s1[0] = s1[0] + tiles_over(s1[1], w.unit_rows) * w.unit_n
                    w.ends[first + j] = (first + j) * w.max_tokens + s1[1]
                    w.tile_end[first + j] = s1[0]
                else:
                    s1[0] = T.max(s1[0], w.ends[first + j])
                    w.ends[first + j] = s1[0]
        if w.masked:
            w.part[SCAN_LANES + tid] = s1[0]
        else:
            w.part[tid] = s1[0]
    T.cuda.cta_sync()
    if not w.masked:
        if tid < SCAN_LANES:
            # pass 2: the lanes before this one give the carry of the max; clamp into [carry, M], count
            # s2: carry, the end before, the tiles so far, this expert's end
            s2 = T.alloc_local((4,), "int32")
            s2[0] = 0
            for lane in T.unroll(SCAN_LANES - 1):
                s2[0] = T.max(s2[0], T.Select(lane < tid, w.part[lane], 0))
            s2[1] = T.min(s2[0], M)
            s2[2] = 0
            for j in T.unroll(chunk):
                if first + j < w.experts:
                    s2[3] = T.min(T.max(w.ends[first + j], s2[0]), M)
                    s2[2] = s2[2] + tiles_over(s2[3] - s2[1], w.unit_rows) * w.unit_n
                    w.ends[first + j] = s2[3]
                    w.tile_end[first + j] = s2[2]
                    s2[1] = s2[3]
            w.part[SCAN_LANES + tid] = s2[2]
        T.cuda.cta_sync()
    if tid < SCAN_LANES:
        # the last pass: the tiles of the lanes before this one
        s3 = T.alloc_local((1,), "int32")
        s3[0] = 0
        for lane in T.unroll(SCAN_LANES - 1):
            s3[0] = s3[0] + T.Select(lane < tid, w.part[SCAN_LANES + lane], 0)
        for j in T.unroll(chunk):
            if first + j < w.experts:
                w.tile_end[first + j] = w.tile_end[first + j] + s3[0]


@T.inline
def locate_tile(w, t, at):
    """Work unit ``t`` into ``at`` (int32[7] local): expert, first row, the expert's end row, the
    first column of D, the first row of W viewed as [E * N, K] (then two scratch slots)."""
    at[0] = 0
    n_steps = T.meta_var(len(search_steps(w.experts)))
    for step in T.unroll(n_steps):
        s = T.meta_var(T.shift_left(1, n_steps - 1 - step))  # search_steps(E)[step]
        at[0] = at[0] + T.Select(T.And(at[0] + s <= w.experts,
                                       w.tile_end[T.min(at[0] + s - 1, w.experts - 1)] <= t), s, 0)
    e = T.meta_var(at[0])
    prev = T.meta_var(T.max(e - 1, 0))
    if w.masked:
        at[1] = e * w.max_tokens  # the expert's first row: its slot of A
    else:
        at[1] = T.Select(e > 0, w.ends[prev], 0)  # the expert's first row
    at[2] = w.ends[e]
    at[3] = t - T.Select(e > 0, w.tile_end[prev], 0)  # its local unit, for a moment
    m, n = T.meta_var(tile_in_expert(at[3], tiles_over(at[2] - at[1], w.unit_rows), w.unit_n, w.band))
    # m and n are expressions of at[1] and at[3]: both computed before either is overwritten
    at[5] = m
    at[6] = n
    if w.cluster_m > 1:
        # this CTA's m-tile of the unit's cluster_m (past the expert's end: a phantom, guarded stores)
        at[1] = at[1] + at[5] * w.unit_rows + w.rank_m * w.blk_m
    else:
        at[1] = at[1] + at[5] * w.blk_m
    if w.cluster_n > 1:
        # this CTA's n-tile of the unit's cluster_n (past N: a phantom, its D columns clipped)
        at[3] = (at[6] * w.cluster_n + w.rank_n) * w.blk_n
    else:
        at[3] = at[6] * w.blk_n
    at[4] = e * w.n + at[3]


@T.inline
def rows_to_global(plan, Dreg, D, m0, n0, row0, row_end, warp_id, lane_id):
    """A boundary tile straight from one warpgroup's accumulators to D: each thread stores the
    pairs its fragment holds, one 4-byte store a pair, only rows before ``row_end`` (the expert's
    end) and columns before D's N."""
    for mi in T.unroll(plan.m_atoms):
        for p in T.unroll(plan.n_cols // 4):
            row, col = T.meta_var(layouts.acc_fragment_coord(2 * p, warp_id, lane_id))
            gr = T.meta_var(m0 + row0 + mi * WG_M + row)
            gc = T.meta_var(n0 + col)
            if T.And(gr < row_end, gc < D.shape[1]):
                for v in T.vectorized(2):
                    D[gr, gc + v] = T.cast(Dreg[mi * plan.acc_stride + 2 * p + v], plan.cfg.dtype)


@T.inline
def rows_to_global_gated(plan, Dreg, D, m0, n0, row0, row_end, warp_id, lane_id, op):
    """:func:`rows_to_global` for a gated W_gu (SwiGLU): the tile's first ``n_cols / 2`` accumulator
    columns are gates, the same thread's registers ``acc_stride / 2`` later their up projections
    (``epilogue.ChunkedEpilogue.gated``), so each thread stores ``op(gate) * up`` of its gate pairs
    at D's column ``n0 / 2 + col`` (``n0``: the tile's column in the kernel's 2I), guarded alike."""
    NR = T.meta_var(plan.acc_stride)
    for mi in T.unroll(plan.m_atoms):
        for p in T.unroll(plan.n_cols // 8):
            row, col = T.meta_var(layouts.acc_fragment_coord(2 * p, warp_id, lane_id))
            gr = T.meta_var(m0 + row0 + mi * WG_M + row)
            gc = T.meta_var(n0 // 2 + col)
            if T.And(gr < row_end, gc < D.shape[1]):
                for v in T.unroll(2):
                    r = T.meta_var(mi * NR + 2 * p + v)
                    D[gr, gc + v] = T.cast(op.apply(Dreg[r], (2 * p + v) % NR, lane_id, n0) * Dreg[r + NR // 2],
                                           plan.cfg.dtype)


@T.inline
def rows_to_global_swapped(plan, Dreg, D, m0, n0, col0, row_end, warp_id, lane_id):
    """Swap AB: a tile straight from one consumer's D^T accumulators to D, guarded by the expert's
    end row (``row_end``) and D's N. Register r of atom a holds D^T[n, m] at the fragment's (row,
    col) = (n, m), so each is one 2-byte store to D[m0 + m, n0 + col0 + 64 a + n]: a warp's store
    covers 4 tokens x 8 adjacent columns (16 bytes a row). Decode's D is a few rows an expert,
    small beside the weight the tile streams."""
    for a in T.unroll(plan.m_atoms):
        for r in T.unroll(plan.n_regs):
            n, m = T.meta_var(layouts.acc_fragment_coord(r, warp_id, lane_id))
            gr = T.meta_var(m0 + m)
            gc = T.meta_var(n0 + col0 + a * WG_M + n)
            if T.And(gr < row_end, gc < D.shape[1]):
                D[gr, gc] = T.cast(Dreg[a * plan.acc_stride + r], plan.cfg.dtype)


def experts_of(cfg: GemmConfig) -> int:
    return int(dict(cfg.extra)["experts"])


def swap_ab(cfg: GemmConfig) -> bool:
    """v12's ``swap_ab`` knob: W's rows in wgmma's 64-row slot, an expert's tokens its N."""
    return bool(dict(cfg.extra).get("swap_ab", False))


def warp_scan(cfg: GemmConfig) -> bool:
    """v12's ``warp_scan`` knob: the routing's tables made by 32 lanes (:func:`fill_tables_warp`)."""
    return bool(dict(cfg.extra).get("warp_scan", False))


def plan_of(cfg: GemmConfig) -> HopperPlan:
    """The kernel's plan: a ``SwapPlan`` with ``swap_ab`` (blk_m tokens as wgmma's N, blk_n W rows
    over the consumers), else v9's."""
    return SwapPlan(cfg) if swap_ab(cfg) else HopperPlan(cfg)


def layout_of(cfg: GemmConfig) -> str:
    """``"contiguous"`` or ``"masked"`` (v12's ``layout`` knob)."""
    return str(dict(cfg.extra).get("layout", "contiguous"))


def checker_params(cfg: GemmConfig) -> dict:
    """The runtime values the barrier check (``gemm_ladder.protocol``) runs the kernel with: M, and
    a routing with an empty expert first, one whole m-tile and one row on the next (a guarded
    boundary tile), the rest of the tokens on the last expert and none on the others."""
    E, M = experts_of(cfg), cfg.M
    if layout_of(cfg) == "masked":
        # max_tokens = M // E rows an expert: the first empty, the second one whole m-tile and a row
        # (a guarded boundary tile), the third past max_tokens (clamped), the last full
        max_tokens = M // E
        counts = [0] * E
        if E > 1:
            counts[1] = min(max_tokens, cfg.blk_m + 1)
        if E > 3:
            counts[2] = max_tokens + 5
        counts[-1] = max_tokens
        return {"M": M, "offsets": counts}
    counts = [0] * E
    if E > 1:
        counts[1] = min(M, cfg.blk_m + 1)
    if E > 3 and common.cluster_shape(cfg) != (1, 1):
        # clusters: an expert of one row, so the first clusters' walk holds a pair with a phantom partner
        counts[2] = 1
    counts[-1] += M - sum(counts)
    offsets = [sum(counts[: e + 1]) for e in range(E)]
    return {"M": M, "offsets": offsets}


def check(cfg: GemmConfig) -> None:
    """The grouped preset's own rules (v9's tile rules are checked beside it)."""
    E = dict(cfg.extra).get("experts")
    if not isinstance(E, int) or isinstance(E, bool) or not 1 <= E <= MAX_EXPERTS:
        raise ConfigError(f"experts={E!r}: the weight's expert count, an int in 1..{MAX_EXPERTS}; pass W.shape[0]")
    layout = layout_of(cfg)
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r}: v12 serves the layouts {LAYOUTS}: 'contiguous' (A [M, K] sorted by "
                          "expert, offs) or 'masked' (A [E, max_tokens, K], counts)")
    if layout == "masked" and cfg.M < E:
        raise ConfigError(f"layout='masked' at M={cfg.M} with {E} experts: M is E * max_tokens (at least one row an "
                          f"expert); build at M={E * max(1, -(-cfg.M // E))} or more")
    if E * cfg.N >= 2**31:
        raise ConfigError(f"experts={E} x N={cfg.N} rows of W pass a 32-bit index; split the experts into groups")
    smem, most = launch(cfg)["smem_bytes"], budget.limits_for(cfg.arch).smem_per_block
    if smem > most:
        raise ConfigError(f"pipe_depth={cfg.pipe_depth} with {E} experts needs {smem} bytes of shared memory (the ring, "
                          f"the staging and 8 bytes an expert), over the {most} a block may use on {cfg.arch}; use "
                          f"pipe_depth={cfg.pipe_depth - 1}")
    check_cluster(cfg)
    if fp8.enabled(cfg):
        check_fp8(cfg)


CLUSTERS = ((1, 1), (2, 1), (1, 2))  # (cluster_m, cluster_n) the grouped kernel builds


def check_cluster(cfg: GemmConfig) -> None:
    """What of clusters the grouped kernel builds: 2x1 (an m-pair shares W's tile) and 1x2 (an n-pair
    shares A's), the contiguous and masked layouts, 16-bit, not gated, swapped or not."""
    cm, cn = common.cluster_shape(cfg)
    if (cm, cn) == (1, 1):
        return
    if (cm, cn) not in CLUSTERS:
        raise ConfigError(f"cluster_m={cm}, cluster_n={cn}: the grouped kernel builds clusters of 2x1 (cluster_m=2: two "
                          "m-tiles of an expert share W's tile) or 1x2 (cluster_n=2: two n-tiles share A's); use one "
                          "of those, or 1x1")
    common.check_cluster(cfg)
    refused = [(fp8.enabled(cfg), "an fp8 spec", "a 16-bit spec (d_bfloat16.grouped_true)"),
               (spec_of(cfg).gated, "a gated W_gu (SwiGLU)", "an ungated grouped spec")]
    for on, what, fix in refused:
        if on:
            raise ConfigError(f"cluster_m={cm}, cluster_n={cn} with {what} is not built (clusters serve the 16-bit, "
                              f"ungated tile); use cluster_m=1, cluster_n=1, or {fix}")


def check_fp8(cfg: GemmConfig) -> None:
    """What of an fp8 spec the grouped kernel builds (issue 33's fp8 slice): the contiguous layout
    without swap AB (the dense fp8 rules, ``fp8.check``, run beside)."""
    if swap_ab(cfg):
        raise ConfigError("swap_ab=True with an fp8 spec is not built (the transposed epilogue has no scales yet); "
                          "use swap_ab=False (64-row token tiles)")
    if layout_of(cfg) != "contiguous":
        raise ConfigError(f"layout={layout_of(cfg)!r} with an fp8 spec is not built (gemm_ladder.scaled_grouped_mm "
                          "serves the contiguous layout); use layout='contiguous' (A [M, K] sorted by expert, offs)")


def launch(cfg: GemmConfig) -> dict:
    """Persistent CTAs (as many as the SMs), a producer warpgroup beside the consumers, M at run
    time; the tables' 8 bytes an expert on top of the ring and the staging."""
    cm, cn = common.cluster_shape(cfg)
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True, cluster=cm * cn)
    tables_bytes = 2 * 4 * experts_of(cfg)  # the warp scan's partial results sit in the barriers' 1 KiB
    # swap AB stages the whole blk_m x blk_n tile (TransposedEpilogue), where the budget counts epi_n chunks
    staging_more = max(0, cfg.blk_m * cfg.blk_n * cfg.elem_bytes - budget.out_bytes(cfg)) if swap_ab(cfg) else 0
    extra = {"swap_ab": True} if swap_ab(cfg) else {}
    extra.update({"warp_scan": True} if warp_scan(cfg) else {})
    extra.update({"cluster_shape": [cm, cn]} if cm * cn > 1 else {})
    return {**info, "threads": info["threads"] + common.THREADS_PER_WG, "dynamic_m": True,
            "smem_bytes": info["smem_bytes"] + tables_bytes + staging_more, "experts": experts_of(cfg),
            "layout": layout_of(cfg), **extra}


def kernel(cfg: GemmConfig):
    """The grouped kernel for ``cfg`` (validated by ``rungs.make_config``), a ``T.prim_func``:
    ``(a [M, K], b [E * N, K], d [M, N], num_ctas, offsets [E] int32)``."""
    plan = plan_of(cfg)
    swapped, scan_by_warp = swap_ab(cfg), warp_scan(cfg)
    under = common.epi_under(cfg)  # a whole tile's chunks stored under the next tile's first K slices
    M = tirx.Var("M", "int32")
    N, K, dtype, E = cfg.N, cfg.K, cfg.dtype, experts_of(cfg)  # dtype: D's (and A's and B's but with fp8)
    # fp8 (rowwise scales): e4m3 tiles in the ring, the promotion into fp32 sums, the sums scaled
    # by the token's and the expert column's scales before the epilogue (sm90a/fp8.py)
    scaled = fp8.enabled(cfg)
    promote = fp8.promote(cfg)
    overlap = fp8.overlap(cfg)
    total_regs = plan.acc_regs if promote else 1  # the promoted sums (one unused register without)
    scale_regs = fp8.scale_regs(plan) if scaled else 1
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    stages = cfg.pipe_depth
    slices_per_tile = cfg.k_tiles
    consumers = cfg.num_warpgroups
    threads = common.THREADS_PER_WG * (consumers + 1)
    # clusters: cluster_m CTAs of adjacent m-tiles share each W tile (cluster_n: n-tiles, A), half each
    # by multicast; a cluster walks the units (cluster_units), its CTAs their own tile of each
    cluster_m, cluster_n = common.cluster_shape(cfg)
    cluster_size = cluster_m * cluster_n
    clustered = cluster_size > 1
    releases = 4 * consumers * cluster_size  # every consumer warp of every CTA of the cluster frees a stage
    regs = common.role_registers(consumers)
    rows_per_wg = plan.rows_per_wg  # of the tile's A rows; swap AB: of its W rows
    A_layout, B_layout = plan.ab_layouts(stages)
    chunk_cols = dict(cfg.extra)["epi_n"]
    buffers = 2 if chunk_cols < BLK_N else 1
    if swapped:
        staging_shape = (consumers, BLK_M, rows_per_wg)  # one D band per consumer (TransposedEpilogue)
    else:
        staging_shape = (consumers * buffers, rows_per_wg, chunk_cols)
    E_layout = epilogue.staging_layout(cfg, *staging_shape)
    n_tiles = -(-N // BLK_N)
    masked = layout_of(cfg) == "masked"
    # SwiGLU: W_gu [E, N, K] holds each expert's cat([W_gate, W_up]) (N = 2I); D [M, N / 2]
    gated = spec_of(cfg).gated
    d_cols = N // 2 if gated else N
    if scan_by_warp and 2 * 8 * stages + 2 * 4 * SCAN_LANES > budget.BARRIER_BYTES:
        raise ConfigError(f"pipe_depth={stages} with warp_scan: the barriers and the scan's partial results pass the "
                          f"{budget.BARRIER_BYTES} bytes below the tiles; use pipe_depth<={(budget.BARRIER_BYTES - 256) // 16}")

    def cluster_of(cta):
        # the first unit this CTA's cluster walks (1x1: the CTA's own index)
        return cta // cluster_size if clustered else cta

    def clusters_in(num_ctas):
        # the walk's stride: the launch's clusters (the runtime launches whole ones)
        return num_ctas // cluster_size if clustered else num_ctas

    # fmt: off
    @T.inline
    def body(A, B, D, offsets, num_ctas, scale_a=None, scale_b=None):
        cta = T.cta_id([num_ctas])
        if clustered:
            rank = T.cta_id_in_cluster([cluster_size])  # rank_m + cluster_m * rank_n
        else:
            rank = T.meta_var(0)
        wg_id = T.warpgroup_id([consumers + 1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, stages)
        mma2tma = MBarrier(pool, stages)
        ring = Ring(tma2mma, mma2tma, cluster_size=cluster_size)  # a release goes to every CTA of the cluster
        if scan_by_warp:
            # the scanning lanes' partial results, in the padding the barriers leave below 1 KiB (two
            # 8-byte barriers a stage, then these 256 bytes: checked above): free, so the warp scan fits
            # wherever the serial scan does (the 128x256 tile at 256 experts fills the block to the byte)
            part = pool.alloc((2 * SCAN_LANES,), "int32")
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((stages, BLK_M, BLK_K), plan.a_dtype, layout=A_layout)
        Bsmem = pool.alloc((stages, BLK_N, BLK_K), plan.b_dtype, layout=B_layout)
        Esmem = pool.alloc(staging_shape, dtype, layout=E_layout)
        # after the tiles (before them they would pass the 1 KiB the barriers leave from 121 experts)
        ends = pool.alloc((E,), "int32")  # each expert's end row, clamped
        tile_end = pool.alloc((E,), "int32")  # work units through each expert
        pool.commit()
        w = T.meta_var(Walk(ends=ends, tile_end=tile_end, experts=E, blk_m=BLK_M, blk_n=BLK_N, n=N, n_tiles=n_tiles,
                            group=cfg.l2_group_size, masked=masked, max_tokens=T.truncdiv(M, E),
                            part=part if scan_by_warp else None, cluster_m=cluster_m, cluster_n=cluster_n,
                            rank_m=rank % cluster_m, rank_n=rank // cluster_m))
        if scan_by_warp:
            fill_tables_warp(w, offsets, M, wg_id * common.THREADS_PER_WG + warp_id * 32 + lane_id, threads)
        else:
            fill_tables(w, offsets, M, wg_id * common.THREADS_PER_WG + warp_id * 32 + lane_id, threads)
        ring.init(releases=releases)
        # the barrier inits (and thread 0's tables) visible to the async proxy and every thread
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        # clustered: this CTA loads its half of the shared tile (W's rows by rank_m, A's by rank_n) into
        # both CTAs' stages; a phantom's loads still go out (its partner waits on their bytes)
        loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring,
                                    cluster_m=cluster_m, cluster_n=cluster_n, rank_m=rank % cluster_m,
                                    rank_n=rank // cluster_m, gated_n=N // 2 if gated else 0))

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=regs.producer):
            if T.And(warp_id == 0, lane_id == 0):
                at_load = T.alloc_local((7,), "int32")
                t_load: T.int32 = cluster_of(cta)
                load_it: T.int32 = 0
                while t_load < w.total():
                    locate_tile(w, t_load, at_load)
                    # each stage refilled once its previous slice (one lap back) was released
                    if gated:
                        # the gated loads take the tile's column in [E * 2N] space (gate rows from
                        # n_st / 2, up rows gated_n later): 2 (e N) + n blk_n puts both in expert e
                        loads.load_tile(load_it, at_load[1], at_load[4] * 2 - at_load[3])
                    else:
                        loads.load_tile(load_it, at_load[1], at_load[4])
                    load_it = load_it + slices_per_tile
                    t_load = t_load + clusters_in(num_ctas)

        with common.ConsumerRole(wg_id, consumers, regs.consumer):
            c = T.meta_var(wg_id - 1)  # this consumer
            wtid = T.meta_var(warp_id * 32 + lane_id)
            wg_row0 = T.meta_var(c * rows_per_wg)  # its rows of the tile
            Dreg = T.alloc_local((plan.acc_regs,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            packed = T.alloc_local((4,), "uint32")
            at = T.alloc_local((7,), "int32")
            if scaled:
                # fp8: the promoted fp32 sums and a thread's scales (16-bit kernels: none, source unchanged)
                Freg = T.alloc_local((total_regs,), "float32")
                Sreg = T.alloc_local((scale_regs,), "float32")
            if overlap > 0:
                Dreg2 = T.alloc_local((plan.acc_regs,), "float32")  # fp8 overlap: the second accumulator set
            # swap AB: W's rows (Bsmem) are wgmma's 64-row operand, the tokens (Asmem) its N
            mma = T.meta_var(Consumer(plan=plan, ring=ring, a_smem=Bsmem if swapped else Asmem,
                                      b_smem=Asmem if swapped else Bsmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=wg_row0, lane_id=lane_id, promote=promote, total=Freg if scaled else None,
                                      overlap=overlap, acc2=Dreg2 if overlap > 0 else None,
                                      stagger=fp8.stagger(cfg), consumer=c))
            if swapped:
                epi = T.meta_var(TransposedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid,
                                                    warp_id=warp_id, lane_id=lane_id, packed=packed))
            else:
                epi = T.meta_var(ChunkedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid,
                                                 warp_id=warp_id, lane_id=lane_id, packed=packed,
                                                 chunk_cols=chunk_cols, buffers=buffers,
                                                 op=epilogue.op_of(cfg), gated=gated))
            if under:
                # the last whole tile's output as 16-bit pairs, stored under the next tile's K loop,
                # and where it goes: its own first row and column (never the next tile's)
                Preg = T.alloc_local((plan.acc_regs // 2,), "uint32")
                m_prev: T.int32 = 0
                n_prev: T.int32 = 0
                pairs_wait: T.int32 = 0  # 1 while Preg holds a whole tile not yet stored
            it: T.int32 = 0  # K slices consumed by this CTA: never reset
            epi_it: T.int32 = 0  # output chunks this consumer stored: never reset
            t: T.int32 = cluster_of(cta)
            while t < w.total():
                locate_tile(w, t, at)
                if under:
                    # the previous whole tile's chunks, one under each of this tile's first slices
                    mma.issue_under(it, slices_per_tile, epi, Preg, m_prev, n_prev, pairs_wait > 0, epi_it)
                    if pairs_wait > 0:
                        epi_it = epi_it + epi.chunks_per_tile
                    mma.retire(it, slices_per_tile)
                else:
                    mma.run(it, slices_per_tile)
                it = it + slices_per_tile
                if scaled:
                    # fp8: the token's scale (its row of A) times the expert's column's: scale_b is
                    # [E, N] viewed [E * N], so W's first row of the tile (at[4] = e * N + n0) is its column
                    fp8.scale_sums(plan, mma.sums, scale_a, scale_b, "row", at[1] + wg_row0, at[4], warp_id, lane_id,
                                   Sreg)
                if under:
                    if at[1] + BLK_M <= at[2]:
                        # a whole tile of the expert's rows: its pairs wait for the next tile (or the end);
                        # a whole tile needs no bound but D's, so its place is all the pairs carry
                        epilogue.acc_to_pairs(plan, Dreg, Preg, epilogue.NO_OP, lane_id, at[3])
                        m_prev = at[1]
                        n_prev = at[3]
                        pairs_wait = 1
                    else:
                        # the expert's last m-tile leaves now, guarded by ITS expert's end row (at[2]),
                        # not deferred: a later tile may be another expert's
                        rows_to_global(plan, Dreg, D, at[1], at[3], wg_row0, at[2], warp_id, lane_id)
                        pairs_wait = 0
                elif swapped:
                    if at[1] + BLK_M <= at[2]:
                        # a whole tile of the expert's tokens: D^T staged as D, 64-column TMA stores
                        epi.store_tile(Dreg, at[1], at[3])
                    else:
                        # the expert's last token tile (in decode, most tiles): guarded stores
                        rows_to_global_swapped(plan, Dreg, D, at[1], at[3], wg_row0, at[2], warp_id, lane_id)
                elif at[1] + BLK_M <= at[2]:
                    # a whole tile of the expert's rows: v9's chunked TMA stores
                    epi.store_tile(mma.sums, at[1], at[3], epi_it)
                    epi_it = epi_it + epi.chunks_per_tile
                else:
                    # the expert's last m-tile: the rows after its end are the next expert's
                    if gated:
                        rows_to_global_gated(plan, mma.sums, D, at[1], at[3], wg_row0, at[2], warp_id, lane_id,
                                             epilogue.op_of(cfg))
                    else:
                        rows_to_global(plan, mma.sums, D, at[1], at[3], wg_row0, at[2], warp_id, lane_id)
                t = t + clusters_in(num_ctas)
            if under:
                if pairs_wait > 0:
                    epi.store_pairs(Preg, m_prev, n_prev, epi_it)
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        common.cluster_sync()

    if scaled:
        @T.prim_func
        def grouped_gemm(a: T.handle, b: T.handle, d: T.handle, num_ctas: T.int32):
            A = T.match_buffer(a, (M, K), plan.a_dtype)
            B = T.match_buffer(b, (E * N, K), plan.b_dtype)
            D = T.match_buffer(d, (M, N), dtype)
            # the spec's epilogue operands after num_ctas, in its order: scale_a [M], scale_b [E, N], offsets [E]
            scale_a = T.meta_var(tirx_builder.arg("scale_a", tirx.decl_buffer((M,), "float32", name="scale_a")))
            scale_b = T.meta_var(tirx_builder.arg("scale_b", tirx.decl_buffer((E, N), "float32", name="scale_b")))
            offsets = T.meta_var(tirx_builder.arg("offsets", tirx.decl_buffer((E,), "int32", name="offsets")))
            T.device_entry()
            # scale_b as W's rows: [E * N], expert e's column n at e * N + n
            scale_w = T.decl_buffer((E * N,), "float32", data=scale_b.data)
            body(A, B, D, offsets, num_ctas, scale_a, scale_w)
    else:
        @T.prim_func
        def grouped_gemm(a: T.handle, b: T.handle, d: T.handle, num_ctas: T.int32):
            A = T.match_buffer(a, (M, K), dtype)
            B = T.match_buffer(b, (E * N, K), dtype)
            D = T.match_buffer(d, (M, d_cols), dtype)
            # the spec's offsets, a parameter after num_ctas (the runtime's order for epilogue operands)
            offsets = T.meta_var(tirx_builder.arg("offsets", tirx.decl_buffer((E,), "int32", name="offsets")))
            T.device_entry()
            body(A, B, D, offsets, num_ctas)
    # fmt: on

    return grouped_gemm
