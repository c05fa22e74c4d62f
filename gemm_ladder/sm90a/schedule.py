"""The schedule of the warp-specialized Hopper kernels (v8-v11): which tiles a cluster runs, in
which order, and where each CTA's tile starts in D.

The grid is one of cluster tiles: ``m_tiles`` rows of ``blk_m x cluster_m`` rows of D by
``n_tiles`` columns of ``blk_n x cluster_n`` columns. A persistent cluster walks it in the
config's tile order (``schedulers.make_tirx_scheduler``: TVM's tile schedulers, or ours where
TVM has none), every ``num_clusters``-th tile from its own index. Split-K (v10, v11) puts
``units_per_tile`` columns in the scheduler's grid for each tile column (unit ``s`` of tile
column ``n`` is column ``n * units_per_tile + s``: ``splitk.unit``), so a tile's units are
neighbours in every order. Stream-K (``streamk``) and the narrow tail (``narrowtail``) take the
tiles past the whole waves; they are their own modules.

Within a cluster tile, the CTA at ``(rank_m, rank_n)`` owns CTA tile
``(m_idx * cluster_m + rank_m, n_idx * cluster_n + rank_n)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import schedulers
from ..core.config import GemmConfig


@dataclass(frozen=True)
class Schedule:
    """The grid of cluster tiles and this CTA's place in each: built once per kernel trace."""

    cfg: GemmConfig
    m_tiles: object  # rows of cluster tiles (a run-time value with dynamic_m)
    n_tiles: int  # columns of cluster tiles
    cluster_m: int = 1
    cluster_n: int = 1
    rank_m: object = 0
    rank_n: object = 0
    units_per_tile: int = 1  # split-K units of a tile, side by side in the scheduler's grid

    def tiles(self, prefix: str, num_clusters, skip_rows=0):
        """A tile scheduler over the grid for a launch of ``num_clusters`` clusters (its loop
        variables named after ``prefix``); ``skip_rows`` (a run-time count, or 0): the last rows
        of tiles are left out (v9's narrow tail runs them)."""
        whole_rows = self.m_tiles if isinstance(skip_rows, int) and skip_rows == 0 else self.m_tiles - skip_rows
        return schedulers.make_tirx_scheduler(
            self.cfg.tile_order, prefix,
            num_m_tiles=whole_rows,
            num_n_tiles=self.n_tiles * self.units_per_tile,
            num_clusters=num_clusters, l2_group_size=self.cfg.l2_group_size,
        )

    def cta_m(self, m_idx):
        """This CTA's tile row in D's grid of CTA tiles, in cluster tile row ``m_idx``."""
        return m_idx * self.cluster_m + self.rank_m

    def cta_n(self, n_idx):
        return n_idx * self.cluster_n + self.rank_n

    def m_start(self, m_idx):
        """The first row of D of this CTA's tile in cluster tile row ``m_idx``."""
        return self.cta_m(m_idx) * self.cfg.blk_m

    def n_start(self, n_idx, width=None):
        """The first column of D of this CTA's tile in cluster tile column ``n_idx`` (``width``:
        the tiles' columns, ``blk_n`` unless narrow)."""
        return self.cta_n(n_idx) * (self.cfg.blk_n if width is None else width)
