"""A narrow last wave (v9's ``tail_n``): the tiles of the partial wave are cut again, narrower,
so every cluster runs one narrow tile where some ran a whole one and the rest none.

Why. T cluster tiles on G clusters run in ceil(T / G) waves, and a partial last wave takes the
time of a whole one: 4096^3 in 128x256 tiles is 512 tiles on 132 SMs, 3.88 waves that take as
long as 4 (``benchmarks/results/2026-11-23_h100_stream_k/``). Stream-K (v10's ``stream_k``)
spreads the last wave's K loops, and pays for partial sums that meet in global memory. Cutting
the last wave along N needs no partial sums: a tile is still one CTA's whole K loop, only
``tail_n`` columns wide instead of ``blk_n``.

The cut (in the kernel, from the launch's cluster count G; rows and columns of cluster tiles):

    waves   = ceil(M_TILES x N_TILES / G)
    r       = M_TILES - (waves - 1) x G // N_TILES     the last r rows are cut narrower
    KN      = ceil(N / (cluster_n x tail_n))            narrow tiles a row (a build-time constant)
    whole   = (M_TILES - r) x N_TILES                   the tile order's, over the first rows
    narrow  = r x KN                                    row by row, after the whole ones
    r = 0 unless whole + narrow <= waves x G            (no cluster runs more tiles than before)

Cluster g runs the whole tiles g, g + G, ... below ``whole``, then the narrow ones the same
stride reaches: ``whole <= (waves - 1) x G`` leaves it at most waves - 1 whole tiles, and
``whole + narrow <= waves x G`` at most waves tiles in all, so its columns of work are at most
(waves - 1) x blk_n + tail_n (two narrow tiles are fewer than a whole and a narrow one) where
v9's busiest cluster runs waves x blk_n. 4096^3, 128x256 tiles, 132 SMs, ``tail_n = 232``:

    r = 32 - 396 // 16 = 8 rows, KN = ceil(4096 / 232) = 18 (17 x 232 + 152 columns)
    whole = 24 x 16 = 384, narrow = 8 x 18 = 144, 384 + 144 = 528 = 4 x 132
    CTAs 0..119: 3 whole + 1 narrow = 1000 columns; CTAs 120..131: 2 + 2 = 976; v9: 1024

``best_tail_n`` picks the narrowest width (a multiple of 8) whose cut fits, for a GPU's count.

A narrow tile: the producer loads the usual boxes (blk_n rows of B: the ones past the narrow
tile are read and not used), the consumers issue ``m64n{tail_n}k16`` into their first
``tail_n / 2`` accumulators a thread (the fragment of the first tail_n columns of the whole
tile's), and store ``epi_n``-wide chunks as v9 does; the last ``tail_n % epi_n`` columns go
straight from the registers (4-byte stores, guarded at D's edges: a row's last narrow tile may
end past N).

On an H100 (``benchmarks/results/2026-11-23_h100_narrow_tail/``) it does not pay where it was
meant to: 4096^3 got 5% slower in 1x1 clusters and stayed level in 2x1. The tensor pipe's cycles
follow the columns (a 232-wide wgmma costs 0.91 of a 256-wide one) but a narrow tile took about
1.1x a whole tile's time: it loads the whole tile's boxes for 0.91 of the work, and where its
loads stall is not yet measured (loading only its ``tail_n`` rows of B is the next thing to try).
8192^3 fp16 (``tail_n=176``) was 1.5-5% faster in 4 passes of 4, bf16 in 2 of 4. Off by default.

Written here because TVM's tile schedulers cut every tile the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

import layouts
from schedulers.tirx_orders import RUNTIME_M_ORDERS

from ..core.config import ConfigError, GemmConfig
from .common import MMA_K, WG_M, HopperPlan
from .streamk import _both, _select  # pylint: disable=protected-access

TAIL_STEP = 8  # wgmma's N granularity for 16-bit inputs


def tail_n(cfg: GemmConfig) -> int:
    return dict(cfg.extra).get("tail_n", 0)


def check(cfg: GemmConfig) -> None:
    """``tail_n``: 0 (off) or a multiple of 8 narrower than blk_n; a fixed M (the cut is the
    shape's), the cooperative consumers, and a tile order that takes a runtime row count."""
    t = tail_n(cfg)
    if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t % TAIL_STEP or (t and t >= cfg.blk_n):
        raise ConfigError(f"tail_n={t!r} must be 0 (off) or a multiple of {TAIL_STEP} below blk_n={cfg.blk_n}; "
                          f"use 0, or for example {cfg.blk_n - 3 * TAIL_STEP}")
    if not t:
        return
    extra = dict(cfg.extra)
    if extra.get("dynamic_m", False):
        raise ConfigError("tail_n cuts the last wave of one shape's tiles, and dynamic_m=True leaves M to the "
                          "launch; use dynamic_m=False with tail_n, or tail_n=0")
    if cfg.tile_order not in RUNTIME_M_ORDERS:
        raise ConfigError(f"tail_n walks the whole tiles' rows in a count known at launch, which "
                          f"tile_order={cfg.tile_order!r} cannot; use one of {RUNTIME_M_ORDERS}, or tail_n=0")


# -- the cut, on Python ints and PrimExprs alike (the kernel and the model test), with stream-K's
# helpers for a select and an and that take either
def per_row(n: int, cluster_n: int, width: int) -> int:
    """Narrow cluster tiles in a row of N (``width`` columns per CTA)."""
    return -(-n // (cluster_n * width))


def rows(m_tiles, n_tiles, kn, clusters):
    """How many of the last rows of cluster tiles are cut into ``kn`` narrow tiles each: enough
    that the whole tiles left fill whole waves but the last; none when the narrow ones would
    add a wave (or the waves are whole)."""
    tiles = m_tiles * n_tiles
    waves = (tiles + clusters - 1) // clusters
    r = m_tiles - (waves - 1) * clusters // n_tiles
    fits = _both(r > 0, (m_tiles - r) * n_tiles + r * kn <= waves * clusters)
    return _select(_both(fits, tiles % clusters != 0), r, 0)


def narrow_tile(q, m_whole, kn):
    """(row, column) of narrow tile ``q`` (cluster tiles: the row of whole tiles, the column of
    narrow ones)."""
    return m_whole + q // kn, q % kn


def columns_per_cluster(m_tiles, n_tiles, blk_n, width, kn, clusters):
    """The columns of work (tile widths summed) of each cluster, in launch order: the model of
    the cut the kernel makes (pure Python)."""
    r = rows(m_tiles, n_tiles, kn, clusters)
    whole = (m_tiles - r) * n_tiles
    total = whole + r * kn
    return [sum(blk_n if t < whole else width for t in range(g, total, clusters)) for g in range(clusters)]


def best_tail_n(m_tiles: int, n_tiles: int, n: int, blk_n: int, cluster_n: int, clusters: int) -> int:
    """The narrowest ``tail_n`` whose cut fits on ``clusters`` clusters (0: none does, or the
    waves are whole): the busiest cluster's work is then the least."""
    for width in range(TAIL_STEP, blk_n, TAIL_STEP):
        if rows(m_tiles, n_tiles, per_row(n, cluster_n, width), clusters):
            return width
    return 0


# -- the narrow tile's plan and epilogue -------------------------------------------------------------
@dataclass(frozen=True)
class NarrowPlan(HopperPlan):
    """A Hopper plan whose wgmma is ``tail_n`` columns wide; the accumulators keep the whole
    tile's stride (the narrow tile's are the first ``tail_n / 2`` of each 64-row atom's)."""

    width: int = 0

    @property
    def n_regs(self) -> int:
        return self.width // 2

    @property
    def acc_stride(self) -> int:
        return self.cfg.blk_n // 2

    @property
    def n_cols(self) -> int:
        return self.width

    @property
    def mma_op(self) -> str:
        t = {"float16": "f16", "bfloat16": "bf16"}[self.cfg.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.width}k{MMA_K}.f32.{t}.{t}"


@T.inline
def cols_to_global(plan, Dreg, D, m0, n0, row0, col0, ncols, warp_id, lane_id):
    """Columns ``[col0, col0 + ncols)`` of one warpgroup's accumulators straight to D (rows from
    ``m0 + row0``): each thread stores the pairs its fragment holds there, one 4-byte store a
    pair, the pairs past D's edges skipped."""
    for mi in T.unroll(plan.m_atoms):
        for pp in T.unroll(ncols // 4):
            p = T.meta_var(col0 // 4 + pp)  # pairs 2p, 2p + 1: columns 8 (p // 2) + ...
            row, col = T.meta_var(layouts.acc_fragment_coord(2 * p, warp_id, lane_id))
            gr = T.meta_var(m0 + row0 + mi * WG_M + row)
            gc = T.meta_var(n0 + col)
            if T.And(gr < D.shape[0], gc < D.shape[1]):
                for v in T.vectorized(2):
                    D[gr, gc + v] = T.cast(Dreg[mi * plan.acc_stride + 2 * p + v], plan.cfg.dtype)

