"""Stream-K for the tail (v10's ``stream_k``): whole tiles for the full waves, and the K loops of
the partial wave's tiles dealt out evenly over every cluster.

Why. T cluster tiles on G clusters run in ceil(T / G) waves; when T is not a multiple of G the
last wave leaves ``G - T % G`` clusters idle. 4096^3 in 128x256 tiles on an H100 is 256 cluster
tiles on 66 clusters: 3.88 waves that take the time of 4 (5632x3072x4096, 3% more work in
exactly 4 waves, took the same time: ``benchmarks/results/2026-11-23_h100_stream_k/``).

The split (computed in the kernel, from the cluster count of the launch):

    full, rem = divmod(T, G)
    sk_tiles  = rem       if 2 * rem >= G      (half a wave or more: ranges of half a tile or more;
                                                with full == 0, every tile: a grid under one wave)
                rem + G   otherwise            (with the wave before: ranges of a tile or more)
                0         if rem == 0, or full == 0 and 2 * rem < G (ranges under half a tile)
    dp_tiles  = T - sk_tiles                   (whole tiles, the scheduler's order)
    I         = sk_tiles * K_TILES             (the stream-K tiles' K slices, tile after tile)
    cluster g: dp tiles g, g + G, ... below dp_tiles, then slices [g * I // G, (g+1) * I // G):
               its whole tiles, then its head, then its tail (``piece``)

Stream-K tile j is the scheduler's tile ``dp_tiles + j`` (the tile order's neighbours stay
together). A range of at least half a tile leaves a tile at most three pieces (head, a middle
that is a whole range, tail), a range of a tile or more at most two; the pieces of a tile are
on neighbouring clusters, from ``cluster_of`` its first slice to ``cluster_of`` its last.

The pieces meet in a workspace, and none waits for another (whatever runs when, no deadlock):
per consumer warpgroup and CTA,

    piece:   bar.sync; thread 0 reads the tile's counter (ld.acquire.gpu); bar.sync
             counter == pieces - 1: the others published: we are last, skip to the sum
             else: st.global our fp32 accumulators -> our slot; bar.sync;
                   thread 0: fence.acq_rel.gpu; old = atom.acq_rel.gpu.add(counter, 1); bar.sync
                   old == pieces - 1: we are last
    last:    Dreg = (p0 + p1) + p2 in K order, our registers at our place, the others' slots
             read from L2 (ld.global.cg); counter = 0 (for the next launch); the usual epilogue
    not last: on to the next piece

The sum runs in K order whoever comes last, so the result is the same bits on every run. Slots
are per (cluster, CTA rank, consumer) and two: 0 for a piece its range starts in, 1 for the
head of a tile its range reaches from before; the counter of a split tile is its first slice's
cluster's (a range holds the first slice of at most one split tile). The workspace grows with
the launch's CTA count (``launch["workspace"]``: ``float32_per_cta``, ``int32_per_cta``); the
runtime sizes it for the GPU at hand.

Written here because TVM's tile schedulers have no stream-K mode.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..core.config import ConfigError, GemmConfig
from . import splitk


def enabled(cfg: GemmConfig) -> bool:
    return bool(dict(cfg.extra).get("stream_k", False))


def check(cfg: GemmConfig) -> None:
    """``stream_k``: a bool; it takes whole tiles' K loops, so not with ``split_k`` > 1."""
    on = dict(cfg.extra).get("stream_k", False)
    if not isinstance(on, bool):
        raise ConfigError(f"stream_k={on!r} must be True or False")
    if on and dict(cfg.extra).get("split_k", 1) != 1:
        raise ConfigError(
            f"stream_k=True splits the K loops of the tail tiles itself; it does not combine with "
            f"split_k={dict(cfg.extra)['split_k']}: use split_k=1 with stream_k, or stream_k=False")


# -- the index arithmetic, on Python ints and PrimExprs alike (the kernel and the model test) ----
def _select(cond, a, b):
    return (a if cond else b) if isinstance(cond, bool) else T.Select(cond, a, b)


def _both(a, b):
    return (a and b) if isinstance(a, bool) and isinstance(b, bool) else T.And(a, b)


def _either(a, b):
    return (a or b) if isinstance(a, bool) and isinstance(b, bool) else T.Or(a, b)


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else T.min(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else T.max(a, b)


def split(tiles, clusters):
    """(dp_tiles, sk_tiles) of ``tiles`` cluster tiles on ``clusters`` clusters: the partial
    wave's tiles go by slices when they are at least half a wave (every cluster then runs at
    least half a tile: three pieces a tile at most), else with the wave before them (a tile and
    more each: two pieces at most); none without a partial wave. A grid under one wave goes by
    slices whole when it is at least half a wave (48 cluster tiles on 66 clusters: 0.73 of a tile's
    slices each instead of one tile; for fp8 at M = 256 that measured slower than whole tiles, the
    meetings cost more than it saves: benchmarks/results/2026-11-27_h100_fp8_subwave/), and whole
    tiles below that (a range under half a tile would cut a tile into more pieces than a slot pair
    holds)."""
    rem = tiles % clusters
    sk = _select(2 * rem >= clusters, rem, _select(tiles >= clusters, rem + clusters, 0))
    sk = _select(rem > 0, sk, 0)
    return tiles - sk, sk


def cluster_range(g, sk_tiles, clusters, k_tiles):
    """[first, end) of cluster ``g``'s stream-K slices."""
    total = sk_tiles * k_tiles
    return g * total // clusters, (g + 1) * total // clusters


def cluster_of(x, sk_tiles, clusters, k_tiles):
    """The cluster whose range holds stream-K slice ``x``: the largest g with g * I // G <= x."""
    return ((x + 1) * clusters - 1) // (sk_tiles * k_tiles)


def _parts(first, end, k_tiles):
    fk, et, ek = first % k_tiles, end // k_tiles, end % k_tiles
    whole = _max(et - (first + k_tiles - 1) // k_tiles, 0)
    has_tail = fk != 0  # from mid-tile: the rest of the tile, or a middle piece inside it
    has_head = _both(ek != 0, _either(fk == 0, et != first // k_tiles))  # from slice 0, ends mid-tile
    return whole, has_head, has_tail


def pieces(first, end, k_tiles):
    """How many pieces the range ``[first, end)`` holds: its whole tiles, a head, a tail."""
    whole, has_head, has_tail = _parts(first, end, k_tiles)
    return whole + _select(has_head, 1, 0) + _select(has_tail, 1, 0)


def piece(p, first, end, k_tiles):
    """Piece ``p`` of the range ``[first, end)``: (stream-K tile, first slice, slice count).

    The order is the whole tiles, then the head (slices from 0 of the tile the range ends in),
    then the tail (from where the range starts to the end of that tile, or to the range's end
    when it lies inside one tile: a middle piece). Every cluster then runs its whole tiles and
    its head from slice 0 together, and its tail up to the end of its range together, as the
    full waves do: they read the same K slices of A and B at about the same time and find them
    in L2 (in the range's own order every cluster is at another K offset, and the stream-K
    tiles' panels overflow L2)."""
    whole, has_head, has_tail = _parts(first, end, k_tiles)
    t0 = (first + k_tiles - 1) // k_tiles  # the first whole tile
    is_whole = p < whole
    is_head = _both(p == whole, has_head)
    fk = first % k_tiles
    j = _select(is_whole, t0 + p, _select(is_head, end // k_tiles, first // k_tiles))
    k0 = _select(_either(is_whole, is_head), 0, fk)
    tail = _min(k_tiles, end - (first - fk)) - fk
    nk = _select(is_whole, k_tiles, _select(is_head, end % k_tiles, tail))
    return j, k0, nk


def slot(g, rank, c, second, cluster_size, consumers):
    """The slot of cluster ``g``'s piece of a split tile (its CTA ``rank``, consumer ``c``):
    ``second`` is 1 if the cluster's range started before the tile (the piece is the head), 0 if
    it starts in it (the tail or middle: the range's first piece)."""
    return ((g * cluster_size + rank) * consumers + c) * 2 + second


def counter(g_head, rank, c, cluster_size, consumers):
    """The counter of a split tile's part (consumer ``c`` of CTA ``rank``): by the cluster of its
    slice 0 (a range holds the first slice of at most one split tile)."""
    return (g_head * cluster_size + rank) * consumers + c


def slot_offset(slot_idx, quad, thread, acc_regs):
    """fp32 offset of register quad ``quad`` of warpgroup thread ``thread`` in slot ``slot_idx``
    (fragment order, 16 bytes per thread: every access a whole coalesced vector)."""
    return slot_idx * (acc_regs * 128) + (quad * 128 + thread) * 4


def workspace(cfg: GemmConfig, consumers: int) -> dict:
    """Per CTA of the launch: two slots of every consumer's accumulators, a counter each."""
    if not enabled(cfg):
        return {"float32_per_cta": 0, "int32_per_cta": 0}
    return {"float32_per_cta": 2 * cfg.blk_m * cfg.blk_n, "int32_per_cta": consumers}


# -- the meeting of the pieces ---------------------------------------------------------------------
@T.inline
def meet(P, C, Dreg, acc_regs, cnt, mine, others, wtid, flag, c):
    """Publish this piece unless the ``others`` pieces of its tile all did; then ``flag[c]`` is
    ``others`` when this piece is the last of the tile (it then sums, with :func:`sum_pieces`)."""
    # every thread has read flag[c] for the previous piece before thread 0 rewrites it
    T.ptx.bar.sync(T.Cast("uint32", 1 + c), 128)
    if wtid == 0:
        seen = T.alloc_local((1,), "uint32")
        T.ptx["ld.acquire.gpu.global.u32"](seen[0], C.ptr_to([cnt]))
        flag[c] = T.Cast("int32", seen[0])
    T.ptx.bar.sync(T.Cast("uint32", 1 + c), 128)
    if flag[c] < others:  # not all in: publish and count (as a split-K unit does)
        splitk.publish(P, C, Dreg, acc_regs, slot_offset(mine, 0, wtid, acc_regs), cnt, wtid, flag, c)


@T.inline
def _sum_in_k_order(P, Dreg, acc_regs, bases, n, me):
    """``Dreg`` = the sum of ``n`` pieces in K order, piece ``me`` from the registers (``n`` and
    ``me`` are Python ints: every quad's loads are straight-line code, free to be issued ahead of
    the adds; a branch per quad would wait out an L2 round trip per quad)."""
    part = T.alloc_local((4,), "float32")
    acc = T.alloc_local((4,), "float32")
    for j in T.unroll(acc_regs // 4):
        for i in T.unroll(n):
            if i == me:
                for e in T.unroll(4):
                    if i == 0:
                        acc[e] = Dreg[4 * j + e]
                    else:
                        acc[e] = acc[e] + Dreg[4 * j + e]
            else:
                T.ptx["ld.global.cg.v4.f32"](part[0], part[1], part[2], part[3], P.ptr_to([bases[i] + j * 512]))
                for e in T.unroll(4):
                    if i == 0:
                        acc[e] = part[e]
                    else:
                        acc[e] = acc[e] + part[e]
        for e in T.unroll(4):
            Dreg[4 * j + e] = acc[e]


@T.inline
def sum_pieces(P, C, Dreg, acc_regs, cnt, n, me, bases, wtid):
    """The last piece: the tile's ``n`` (2 or 3) pieces summed in K order, ``(p0 + p1) + p2``,
    this piece's own accumulators at its place ``me`` and the others' slots (``ld.global.cg``:
    L2, where their stores are), whatever order they came in: the same bits on every run. Then
    the counter back to zero (every piece of the tile has been here). ``bases``: the three
    pieces' ``slot_offset(slot, 0, wtid, acc_regs)``, each quad 512 floats further."""
    if n == 2:
        if me == 0:
            _sum_in_k_order(P, Dreg, acc_regs, bases, 2, 0)
        else:
            _sum_in_k_order(P, Dreg, acc_regs, bases, 2, 1)
    else:
        if me == 0:
            _sum_in_k_order(P, Dreg, acc_regs, bases, 3, 0)
        elif me == 1:
            _sum_in_k_order(P, Dreg, acc_regs, bases, 3, 1)
        else:
            _sum_in_k_order(P, Dreg, acc_regs, bases, 3, 2)
    if wtid == 0:
        T.ptx["st.relaxed.gpu.global.u32"](C.ptr_to([cnt]), T.uint32(0))


def meet_pieces(parts: splitk.Partials, cnt, mine, others) -> None:
    """:func:`meet` for one consumer's side of the workspace (``splitk.Partials``)."""
    meet(parts.slots, parts.counters, parts.acc, parts.acc_regs, cnt, mine, others, parts.thread, parts.flag,
         parts.consumer)


def sum_tile_pieces(parts: splitk.Partials, cnt, n, me, bases) -> None:
    """:func:`sum_pieces` for one consumer's side of the workspace (``splitk.Partials``)."""
    sum_pieces(parts.slots, parts.counters, parts.acc, parts.acc_regs, cnt, n, me, bases, parts.thread)
