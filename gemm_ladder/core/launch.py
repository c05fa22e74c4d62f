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

A grid of one CTA per tile must fit CUDA's grid (:data:`GRID_LIMITS`: 65535 along y, where the
rungs put the N tiles): :func:`check_grid`, which the validator runs on every rung's launch.
"""

from __future__ import annotations

from schedulers.orders import check_order

from .config import TILE_ORDERS, ConfigError, GemmConfig

PERSISTENT_GRID = "num_ctas"
GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's largest gridDim.x, .y and .z


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
    """``tile_order`` is one of :data:`gemm_ladder.core.config.TILE_ORDERS` and, with ``l2_group_size``,
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


def check_grid(cfg: GemmConfig, info: dict) -> None:
    """The launch ``info`` (:func:`launch_info`) within CUDA's grid limits; a persistent grid (the
    SM count, filled in at launch) always is."""
    for axis, extent, most in zip("xyz", info["grid"], GRID_LIMITS):
        if isinstance(extent, int) and extent > most:
            grid_m, grid_n = cfg.grid_mn
            fix = (f"split N into parts of at most {most * cfg.blk_n} columns" if (axis, extent) == ("y", grid_n)
                   else f"split M into parts of at most {most * cfg.blk_m} rows" if (axis, extent) == ("x", grid_m)
                   else "split the problem")
            raise ConfigError(f"{cfg.rung}: {cfg.M}x{cfg.N}x{cfg.K} launches {extent} CTAs along grid {axis}, over "
                              f"the {most} CUDA allows; {fix}, or use a persistent rung (v6 and up: one CTA per SM)")
