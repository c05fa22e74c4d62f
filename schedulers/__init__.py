"""Schedules of a GEMM: which CTA computes which output tile when (the tile orders of a
persistent kernel), and when one tile's K slices load and multiply (the pipeline model).

Modules, and what each may import:

- ``orders``: pure-Python models of the tile orders ("row", "column", TVM's "grouped"
  and "serpentine", our "snake"), drawn as ASCII grids in its docstring.
- ``traffic``: an L2/DRAM traffic model per order and ``l2_group_size``, for tuners.
- ``pipeline``: a timing model of one tile's K loop through a ``pipe_depth``-stage ring.
- ``plots``: pictures of orders and traffic (imports matplotlib on first call).
- ``tirx_orders``: the orders as TIRx schedulers for kernels (imports TVM).
- ``tvm_bridge``: runs a TIRx scheduler's index arithmetic on the CPU (imports TVM).

``import schedulers`` imports neither TVM nor matplotlib.
"""

from .orders import ORDERS, assignment, check_order, format_grid, tile_order, waves
from .pipeline import pipeline_schedule
from .plots import plot_order, plot_traffic_vs_group, write_all
from .traffic import Traffic, dram_traffic, rank_group_sizes

__all__ = [
    "ORDERS",
    "Traffic",
    "assignment",
    "check_order",
    "dram_traffic",
    "format_grid",
    "make_tirx_scheduler",
    "pipeline_schedule",
    "plot_order",
    "plot_traffic_vs_group",
    "rank_group_sizes",
    "tile_order",
    "waves",
    "write_all",
]


def make_tirx_scheduler(order, prefix, num_m_tiles, num_n_tiles, num_clusters,
                        l2_group_size=8, cluster_m=1, cluster_n=1):
    """See ``schedulers.tirx_orders.make_tirx_scheduler`` (imports TVM on first call)."""
    from .tirx_orders import make_tirx_scheduler as make

    return make(order, prefix, num_m_tiles=num_m_tiles, num_n_tiles=num_n_tiles,
                num_clusters=num_clusters, l2_group_size=l2_group_size,
                cluster_m=cluster_m, cluster_n=cluster_n)
