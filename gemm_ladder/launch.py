"""How a rung's CTAs cover the output, for both archs: the launch a manifest records and, for
persistent rungs, the order in which each CTA walks its tiles.

A manifest's ``launch`` is ``{"grid": [...], "threads": T, "smem_bytes": S}``; a persistent rung
(one CTA per SM, the count read off the GPU at launch) adds ``"persistent": true`` and its grid is
the placeholder :data:`PERSISTENT_GRID`, the name of the kernel's trailing argument that the
runtime fills with the SM count (``runtime.GemmModule``, ``runner/gemm_runner.cc``), rounded down
to whole clusters where the rung launches clusters (``"cluster"``: CTAs per cluster), and no more
clusters than the GPU runs at once (``runtime.persistent_grid``; the driver is asked with the
launch's ``threads`` and ``smem_bytes``).

A persistent rung's ``tile_order`` and ``l2_group_size`` pick the scheduler
(``schedulers.make_tirx_scheduler``); :func:`check_schedule` refuses an order that would not
visit every tile exactly once, in constant time whatever the grid (``schedulers.check_order``).
"""

from __future__ import annotations

from schedulers.orders import check_order

from .config import TILE_ORDERS, ConfigError, GemmConfig

PERSISTENT_GRID = "num_ctas"


def launch_info(cfg: GemmConfig, threads: int, smem_bytes: int, grid=None, persistent: bool = False,
                cluster: int = 1) -> dict:
    """Grid, threads and shared memory of a launch, for manifests and the info table.

    ``cluster`` (the CTAs of a thread-block cluster, from Hopper v8 and Blackwell v8 on): the
    runtime rounds a persistent grid down to whole clusters.
    """
    info = {
        "grid": [PERSISTENT_GRID] if persistent else list(grid or cfg.grid_mn),
        "threads": threads,
        "smem_bytes": smem_bytes,
    }
    if persistent:
        info["persistent"] = True
    if cluster > 1:
        info["cluster"] = cluster
    return info


def check_schedule(cfg: GemmConfig, grid=None) -> None:
    """``tile_order`` is one of :data:`gemm_ladder.config.TILE_ORDERS` and, with ``l2_group_size``,
    covers the tile grid exactly once (``grid``: the grid the scheduler walks, if not the tiles
    of ``cfg``, e.g. the cluster tiles of a clustered rung)."""
    if cfg.tile_order not in TILE_ORDERS:
        raise ConfigError(f"tile_order={cfg.tile_order!r} is not supported; use one of {TILE_ORDERS}")
    g = cfg.l2_group_size
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise ConfigError(f"l2_group_size={g!r} is not a positive int; use e.g. l2_group_size=8")
    try:
        check_order(cfg.tile_order, *(grid or cfg.grid_mn), g)
    except ValueError as err:
        raise ConfigError(f"tile_order={cfg.tile_order!r}, l2_group_size={g}: {err}") from None
