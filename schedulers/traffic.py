"""How much A and B a tile order pulls from DRAM: an L2-reuse model for tuning.

Model
-----
Output tile (m, n) reads A row-panel m (``blk_m x K``) and B column-panel n
(``K x blk_n``).  A persistent kernel runs its tiles in waves of ``num_ctas``
(``schedulers.orders.waves``); the CTAs of a wave start together and walk K at about
the same speed, so a panel that several CTAs of one wave read comes from DRAM once.
To see reuse *across* waves the model cuts every panel into ``k_chunks`` slices along
K and plays the waves through an LRU cache of ``l2_bytes``: wave by wave, K slice by
K slice, each distinct panel of the wave touches its slice.  A slice that is still
cached is free, a missing one costs its bytes.  Slice ``k`` of a panel that wave w and
wave w+1 both read survives only if everything touched in between fits: the rest of
wave w after slice k plus wave w+1 up to slice k, i.e. about one wave's footprint.

Why some ``l2_group_size`` values beat others (grouped order, P = ``num_ctas``)
--------------------------------------------------------------------------------
A wave covers about ``g`` A panels and ``P / g`` B panels, so its footprint is about
``(g * blk_m + P / g * blk_n) * K * dtype_bytes``, smallest near
``g = sqrt(P * blk_n / blk_m)`` (about 11 for 132 CTAs and square tiles).

* B is read again by every group, ``num_m / g`` times in all: small ``g`` (g = 1 is
  the row order) re-reads B often.
* A panels of a group are shared by the ``g * num_n / P`` waves that walk across it,
  but only while a wave's footprint fits in L2: big ``g`` (g = num_m is the column
  order) makes waves too tall, A falls out of L2 between waves and is re-read.

So the traffic against ``g`` is a valley; its floor and width depend on K (the
footprint grows with K) and on the L2 size.  ``rank_group_sizes`` orders candidate
sizes by modelled traffic so that a tuner times only the best few.

Large grids: the traffic of a grouped order repeats group after group, so ranking group sizes
needs the first few groups, not all of them. ``max_waves`` plays only the first waves (and
builds only their tiles; a panel's width is a closed form, not a list over the grid): what a
tuner needs for a 32768 x 32768 grid, or a 2^40-row one, at the cost of a small one: time and
memory grow with ``max_waves * num_ctas * k_chunks``, not with the tiles.
``Traffic.waves_total`` says how many there are in all.

Limits: real L2s are not LRU, H100/H200 split L2 into two halves, CTAs drift apart
over K, and the epilogue's C writes (the same for every order) are left out.  Use the
numbers to rank orders and sizes, not to predict bandwidth.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .orders import _ceil_div, _check_positive, first_tiles, waves

DEFAULT_GROUP_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Traffic:
    """Modelled DRAM reads of A and B for one order (bytes)."""

    total_bytes: int
    per_wave: tuple[int, ...]  # bytes fetched during each wave
    a_bytes: int
    b_bytes: int
    compulsory_bytes: int  # every byte of A and B once: the floor
    panels_per_wave: tuple[tuple[int, int], ...]  # distinct (A panels, B panels) per wave
    waves_total: int = 0  # waves of the whole grid (``len(per_wave)`` were played)

    @property
    def amplification(self) -> float:
        """``total_bytes / compulsory_bytes``; 1.0 is perfect reuse."""
        return self.total_bytes / self.compulsory_bytes


def _panel_bytes(extent: int, blk: int, dtype_bytes: int):
    """Bytes per K element of panel ``i`` of ``extent`` rows cut into ``blk``-row panels (the last
    one narrower): a function, so that a grid of billions of panels costs nothing up front."""
    return lambda i: min(blk, extent - i * blk) * dtype_bytes


def _k_slices(K: int, k_chunks: int) -> list[int]:
    n = min(k_chunks, K)
    return [K * (c + 1) // n - K * c // n for c in range(n)]


def dram_traffic(
    order: str,
    M: int,
    N: int,
    K: int,
    blk_m: int,
    blk_n: int,
    num_ctas: int,
    l2_bytes: int,
    l2_group_size: int = 8,
    dtype_bytes: int = 2,
    cluster_m: int = 1,
    cluster_n: int = 1,
    k_chunks: int = 8,
    max_waves: int | None = None,
) -> Traffic:
    """Model the DRAM bytes of A and B read by a persistent GEMM using ``order``.

    ``max_waves``: play only the first waves (see the module docstring); ``total_bytes`` is
    then theirs. Raises ``ValueError`` for an order that does not cover the tile grid exactly
    once (see ``schedulers.orders.tile_order``).
    """
    _check_positive(
        M=M, N=N, K=K, blk_m=blk_m, blk_n=blk_n, l2_bytes=l2_bytes,
        dtype_bytes=dtype_bytes, k_chunks=k_chunks, num_ctas=num_ctas,
    )
    num_m, num_n = _ceil_div(M, blk_m), _ceil_div(N, blk_n)
    waves_total = _ceil_div(num_m * num_n, num_ctas)
    if max_waves is not None and max_waves < waves_total:
        _check_positive(max_waves=max_waves)
        tiles = first_tiles(order, num_m, num_n, max_waves * num_ctas, l2_group_size, cluster_m, cluster_n)
        schedule = [tiles[i : i + num_ctas] for i in range(0, len(tiles), num_ctas)]
    else:
        schedule = waves(order, num_m, num_n, num_ctas, l2_group_size, cluster_m, cluster_n)

    # bytes per K element of each panel; edge panels are narrower
    a_row, b_col = _panel_bytes(M, blk_m, dtype_bytes), _panel_bytes(N, blk_n, dtype_bytes)
    slices = _k_slices(K, k_chunks)

    cache: OrderedDict[tuple[str, int, int], int] = OrderedDict()
    used = 0
    fetched = {"A": 0, "B": 0}
    per_wave, panels = [], []
    for wave in schedule:
        # distinct panels in first-touch order; CTAs of one wave share a fetch
        a_panels = list(dict.fromkeys(m for m, _ in wave))
        b_panels = list(dict.fromkeys(n for _, n in wave))
        panels.append((len(a_panels), len(b_panels)))
        before = fetched["A"] + fetched["B"]
        for c, k_len in enumerate(slices):
            for kind, ids, width in (("A", a_panels, a_row), ("B", b_panels, b_col)):
                for p in ids:
                    key = (kind, p, c)
                    if key in cache:
                        cache.move_to_end(key)
                        continue
                    size = width(p) * k_len
                    fetched[kind] += size
                    cache[key] = size
                    used += size
                    while used > l2_bytes:
                        used -= cache.popitem(last=False)[1]
        per_wave.append(fetched["A"] + fetched["B"] - before)

    return Traffic(
        total_bytes=fetched["A"] + fetched["B"],
        per_wave=tuple(per_wave),
        a_bytes=fetched["A"],
        b_bytes=fetched["B"],
        compulsory_bytes=(M + N) * K * dtype_bytes,
        panels_per_wave=tuple(panels),
        waves_total=waves_total,
    )


def rank_group_sizes(
    M: int,
    N: int,
    K: int,
    blk_m: int,
    blk_n: int,
    num_ctas: int,
    l2_bytes: int,
    order: str = "grouped",
    group_sizes=DEFAULT_GROUP_SIZES,
    dtype_bytes: int = 2,
    cluster_m: int = 1,
    cluster_n: int = 1,
    within: float | None = None,
    max_waves: int | None = None,
) -> list[tuple[int, Traffic]]:
    """``(l2_group_size, Traffic)`` pairs, least modelled traffic first.

    Sizes for which ``order`` does not cover the grid (TVM's serpentine bug) are left
    out.  Ties go to the smaller size.  ``within=0.05`` keeps only sizes whose traffic
    is at most 5 % above the best, which is what a tuner would time.  ``max_waves``
    (see :func:`dram_traffic`) is the same for every size, so the ranking is fair.
    """
    ranked = []
    for g in group_sizes:
        try:
            t = dram_traffic(
                order, M, N, K, blk_m, blk_n, num_ctas, l2_bytes, g, dtype_bytes,
                cluster_m, cluster_n, max_waves=max_waves,
            )
        except ValueError:
            if not isinstance(g, int) or g < 1:
                raise
            continue
        ranked.append((g, t))
    ranked.sort(key=lambda gt: (gt[1].total_bytes, gt[0]))
    if within is not None and ranked:
        limit = ranked[0][1].total_bytes * (1.0 + within)
        ranked = [gt for gt in ranked if gt[1].total_bytes <= limit]
    return ranked
