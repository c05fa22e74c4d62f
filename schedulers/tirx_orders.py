"""Tile orders as TIRx schedulers: the knob a persistent rung turns.

``make_tirx_scheduler(order, ...)`` returns an object with the interface of TVM's
``ClusterPersistentScheduler2D``: ``init(linear)``, ``valid()``, ``next_tile()`` and the
current tile in ``m_idx`` / ``n_idx``.  Call it inside ``@T.prim_func`` where the
kernel would construct the scheduler::

    bx = T.cta_id([NUM_CTAS])
    ts = make_tirx_scheduler("snake", "ts", num_m_tiles=M_TILES, num_n_tiles=N_TILES,
                             num_clusters=NUM_CTAS, l2_group_size=8)
    ts.init(bx)
    while ts.valid():
        m, n = ts.m_idx, ts.n_idx
        ...
        ts.next_tile()

Which class answers (the orders are drawn in ``schedulers.orders``):

=============  ==================================================================
order          scheduler
=============  ==================================================================
"grouped"      ``ClusterPersistentScheduler2D(l2_group_size=g)``
"serpentine"   ``ClusterPersistentScheduler2D(l2_group_size=g, serpentine=True)``
"row"          ``ClusterPersistentScheduler2D(l2_group_size=1)``: groups of one row
"column"       ``ClusterPersistentScheduler2D(l2_group_size=rows)``: a single group
"snake"        ``SnakeScheduler2D`` below
=============  ==================================================================

The factory checks the order against ``schedulers.orders.tile_order`` first, so a grid
that TVM's serpentine order (or a partial cluster) would compute wrongly fails here
with a ``ValueError`` instead of in the output.  ``num_n_tiles`` must be a Python int;
``num_m_tiles`` may be a runtime expression (a kernel with a symbolic M) for the orders
that visit every tile of any grid once (``RUNTIME_M_ORDERS``: "grouped", "snake"): the
check then cannot run, and needs not.

This module and ``schedulers.tvm_bridge`` are the only ones that import TVM.
"""

from __future__ import annotations

from tvm.backend.cuda.lang.tile_scheduler import BaseTileScheduler, ClusterPersistentScheduler2D
from tvm.script import tirx as T

from .orders import ORDERS, _ceil_div, tile_order

# orders that visit every tile of any grid exactly once, whatever the number of rows: those a
# kernel with a runtime M may use (column groups all rows, serpentine breaks on some grids, and
# TVM folds the tail branch of "row", groups of one row, into a division by zero when the row
# count is an expression)
RUNTIME_M_ORDERS = ("grouped", "snake")


@T.meta_class
class SnakeScheduler2D(BaseTileScheduler):
    """Grouped order whose odd L2 groups walk N backwards (the "snake" order).

    Same constructor, methods and attributes as ``ClusterPersistentScheduler2D``
    without ``serpentine``.  6 x 8 tiles, ``l2_group_size=4`` (work index per tile)::

         0  4  8 12 16 20 24 28
         1  5  9 13 17 21 25 29
         2  6 10 14 18 22 26 30
         3  7 11 15 19 23 27 31
        46 44 42 40 38 36 34 32
        47 45 43 41 39 37 35 33

    Group 1 starts on the columns group 0 ended with, so its first wave finds those B
    panels still in L2 (with TVM's order it starts over at n = 0, long evicted).
    """

    def __init__(
        self,
        prefix: str,
        num_m_tiles: int,
        num_n_tiles: int,
        num_clusters: int,
        l2_group_size: int = 8,
        cluster_m: int = 1,
        cluster_n: int = 1,
    ):
        super().__init__(prefix)
        if not isinstance(num_n_tiles, int):
            raise TypeError(f"SnakeScheduler2D needs a Python int num_n_tiles, got {num_n_tiles!r}")
        static_m = isinstance(num_m_tiles, int)
        self._num_clusters = num_clusters
        self._l2_group_size = l2_group_size
        self._cluster_m = cluster_m
        self._cluster_n = cluster_n
        self.tile_count = T.local_scalar("int32")
        self.work_idx = self.linear_idx  # the same names TVM's scheduler offers
        self.tile_idx = self.tile_count

        # a runtime M (num_m_tiles an expression) makes the row counts expressions too; the
        # tail then divides by a runtime count
        rows = _ceil_div(num_m_tiles, cluster_m) if static_m else T.truncdiv(num_m_tiles + cluster_m - 1, cluster_m)
        self._N_TILE_COLS = _ceil_div(num_n_tiles, cluster_n)
        self._FULL_GROUPS = rows // l2_group_size if static_m else T.truncdiv(rows, l2_group_size)
        tail = rows - self._FULL_GROUPS * l2_group_size
        # max(.., 1): the tail branch is emitted even without a tail; never divide by 0
        self._SAFE_TAIL_ROWS = max(tail, 1) if static_m else T.max(tail, 1)
        self._TOTAL_TILES = rows * self._N_TILE_COLS * cluster_m * cluster_n

    # fmt: off
    @T.inline
    def update_current_m_n_idx(self, work_idx):
        CLUSTER_M = T.meta_var(self._cluster_m)
        CLUSTER_N = T.meta_var(self._cluster_n)
        G = T.meta_var(self._l2_group_size)
        COLS = T.meta_var(self._N_TILE_COLS)
        FULL_GROUPS = T.meta_var(self._FULL_GROUPS)
        TAIL_ROWS = T.meta_var(self._SAFE_TAIL_ROWS)
        GROUP_SPAN = T.meta_var(self._l2_group_size * self._N_TILE_COLS)

        # consecutive work items are the CTAs of one cluster, as in TVM's scheduler
        cluster_m_offset = T.meta_var(work_idx % CLUSTER_M)
        t = T.meta_var(work_idx // CLUSTER_M)
        cluster_n_offset = T.meta_var(t % CLUSTER_N)
        tile_linear = T.meta_var(t // CLUSTER_N)

        # the tail group is shorter than GROUP_SPAN, so this is its group id too
        group_id: T.let = tile_linear // GROUP_SPAN
        within_group: T.let = tile_linear % GROUP_SPAN
        # two branches keep every divisor a compile-time constant: no runtime divide
        if group_id < FULL_GROUPS:
            step: T.let = within_group // G
            self.m_idx = (group_id * G + within_group % G) * CLUSTER_M + cluster_m_offset
            self.n_idx = (
                T.Select(group_id % 2 == 0, step, COLS - 1 - step) * CLUSTER_N + cluster_n_offset
            )
        else:
            tail_step: T.let = within_group // TAIL_ROWS
            self.m_idx = (group_id * G + within_group % TAIL_ROWS) * CLUSTER_M + cluster_m_offset
            self.n_idx = (
                T.Select(group_id % 2 == 0, tail_step, COLS - 1 - tail_step) * CLUSTER_N
                + cluster_n_offset
            )

    @T.inline
    def init(self, linear_init):
        self.linear_idx = linear_init
        self.tile_count = 0
        self.update_current_m_n_idx(linear_init)

    @T.inline
    def next_tile(self):
        # persistent stride: every cluster (CTA) owns work items c, c + P, c + 2P, ...
        self.linear_idx = self.linear_idx + self._num_clusters
        self.tile_count = self.tile_count + 1
        self.update_current_m_n_idx(self.linear_idx)
    # fmt: on

    def valid(self):
        return self.linear_idx < self._TOTAL_TILES


def make_tirx_scheduler(
    order: str,
    prefix: str,
    num_m_tiles: int,
    num_n_tiles: int,
    num_clusters: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
):
    """A TIRx tile scheduler for ``order`` (one of ``schedulers.ORDERS``).

    Raises ``ValueError`` (with sizes that work) if the order would not visit every
    tile exactly once; see the module docstring for which class each order gets.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown tile order {order!r}; choose one of {ORDERS}")
    if not isinstance(num_n_tiles, int):
        raise TypeError(f"make_tirx_scheduler needs a Python int num_n_tiles, got {num_n_tiles!r}")
    if isinstance(num_m_tiles, int):
        # the same check the pure model makes: refuse orders TVM would compute wrongly
        tile_order(order, num_m_tiles, num_n_tiles, l2_group_size, cluster_m, cluster_n)
    elif order not in RUNTIME_M_ORDERS:
        raise ValueError(
            f"order {order!r} cannot take a runtime number of M tiles (its shape depends on "
            f"it); use one of {RUNTIME_M_ORDERS}"
        )
    elif num_n_tiles % cluster_n:
        raise ValueError(f"{num_n_tiles} N tiles are not whole clusters of {cluster_n}; pad N or use cluster_n=1")
    kw = dict(
        num_m_tiles=num_m_tiles,
        num_n_tiles=num_n_tiles,
        num_clusters=num_clusters,
        cluster_m=cluster_m,
        cluster_n=cluster_n,
    )
    if order == "snake":
        return SnakeScheduler2D(prefix, l2_group_size=l2_group_size, **kw)
    if order == "row":
        l2_group_size = 1
    elif order == "column":
        l2_group_size = _ceil_div(num_m_tiles, cluster_m)
    return ClusterPersistentScheduler2D(
        prefix, l2_group_size=l2_group_size, serpentine=(order == "serpentine"), **kw
    )
