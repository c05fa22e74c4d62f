"""Tile orders of a persistent GEMM, as pure-Python models (no TVM import).

A persistent kernel launches ``num_ctas`` CTAs (one per SM) and hands out output tiles
through a linear *work index*: CTA ``c`` processes work items ``c, c + num_ctas,
c + 2 * num_ctas, ...``, and work item ``w`` belongs to *wave* ``w // num_ctas`` (the
tiles that run at the same time).  An *order* is the map ``work index -> (m, n)``.
Which tiles share a wave decides which A row-panels and B column-panels are live in
L2 together, so the order is a DRAM-traffic knob (see ``schedulers.traffic``).

The grids below show the work index of every tile of a 6 x 8 tile grid (rows are m,
columns are n) with ``l2_group_size=4``.  They are produced by ``format_grid`` and a
test checks that they match it, so they cannot drift from the code.

row: what a plain ``blockIdx`` launch does; a wave spans few A panels but every B panel::

     0  1  2  3  4  5  6  7
     8  9 10 11 12 13 14 15
    16 17 18 19 20 21 22 23
    24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39
    40 41 42 43 44 45 46 47

column: the transpose; few B panels, every A panel::

     0  6 12 18 24 30 36 42
     1  7 13 19 25 31 37 43
     2  8 14 20 26 32 38 44
     3  9 15 21 27 33 39 45
     4 10 16 22 28 34 40 46
     5 11 17 23 29 35 41 47

grouped: TVM's ``ClusterPersistentScheduler2D`` (the default).  Rows are cut into L2
groups of ``l2_group_size`` rows; inside a group the order is column-major, groups run
top to bottom; the last group has the left-over rows (2 here)::

     0  4  8 12 16 20 24 28
     1  5  9 13 17 21 25 29
     2  6 10 14 18 22 26 30
     3  7 11 15 19 23 27 31
    32 34 36 38 40 42 44 46
    33 35 37 39 41 43 45 47

serpentine: TVM's ``serpentine=True``.  ``l2_group_size`` x ``l2_group_size`` blocks,
row-major inside a block, blocks walk down the first block column and up the next;
left-over rows (or columns) are a strip at the end::

     0  1  2  3 16 17 18 19
     4  5  6  7 20 21 22 23
     8  9 10 11 24 25 26 27
    12 13 14 15 28 29 30 31
    32 34 36 38 40 42 44 46
    33 35 37 39 41 43 45 47

    TVM 0.27 gets this order wrong when there are left-over rows AND left-over columns
    and at least one full block column (e.g. 10 x 10 tiles, size 4): the bottom strip is
    never visited and its work items all compute tile (0, 0).  ``tile_order`` reproduces
    that with ``check=False`` and raises ``ValueError`` (with sizes that work) otherwise.

snake (ours, not in TVM): ``grouped`` with every odd group walking N backwards.  The
last columns of group g are the first columns of group g+1, so the B panels that the
previous wave just pulled into L2 are the ones the next wave needs::

     0  4  8 12 16 20 24 28
     1  5  9 13 17 21 25 29
     2  6 10 14 18 22 26 30
     3  7 11 15 19 23 27 31
    46 44 42 40 38 36 34 32
    47 45 43 41 39 37 35 33

Clusters: with ``cluster_m`` x ``cluster_n`` > 1 (as TVM does) the order runs over the
grid of cluster tiles and consecutive work items are the CTAs of one cluster:
``m = row * cluster_m + w % cluster_m``, ``n = col * cluster_n + (w // cluster_m) %
cluster_n`` where (row, col) is the order applied to ``w // (cluster_m * cluster_n)``.
"""

from __future__ import annotations

import itertools

ORDERS = ("row", "column", "grouped", "serpentine", "snake")

Tile = tuple[int, int]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"unknown tile order {order!r}; choose one of {ORDERS}")


# ---------------------------------------------------------------------------
# order functions on the grid of cluster tiles: tile_linear -> (row, col)
# rows/cols: size of that grid.  Each mirrors the TIR a scheduler emits, branch by
# branch, so that the tests can compare them with TVM work item by work item.
# ---------------------------------------------------------------------------


def _row(t: int, rows: int, cols: int, g: int) -> Tile:
    return t // cols, t % cols


def _column(t: int, rows: int, cols: int, g: int) -> Tile:
    return t % rows, t // rows


def _grouped(t: int, rows: int, cols: int, g: int) -> Tile:
    # ClusterPersistentScheduler2D._gm_emit_*: full groups of g rows, then one tail
    # group with the left-over rows; column-major inside a group.
    full_groups, tail_rows, span = rows // g, rows % g, g * cols
    if full_groups > 0 and t < full_groups * span:
        group_id, within = divmod(t, span)
        return group_id * g + within % g, within // g
    if tail_rows > 0:
        rem = t - full_groups * span
        return full_groups * g + rem % tail_rows, rem // tail_rows
    return 0, 0  # TVM's fallback; only reached past the last work item


def _serpentine(t: int, rows: int, cols: int, g: int) -> Tile:
    # ClusterPersistentScheduler2D._update_serpentine, including its fallbacks to
    # (0, 0): they are reached for real work items when both strips exist.
    m_blocks, n_blocks = rows // g, cols // g
    full_block_tiles = m_blocks * n_blocks * g * g
    residual_m, residual_n = rows - m_blocks * g, cols - n_blocks * g
    if m_blocks > 0 and n_blocks > 0 and t < full_block_tiles:
        block_linear, within = divmod(t, g * g)
        block_col, block_row = divmod(block_linear, m_blocks)
        if block_col % 2 == 1:  # odd block columns walk back up
            block_row = m_blocks - 1 - block_row
        return block_row * g + within // g, block_col * g + within % g
    rem = t - full_block_tiles
    if residual_n > 0:
        # right strip, all rows, row-major; TVM never visits a bottom strip here
        if rem < rows * residual_n:
            return rem // residual_n, n_blocks * g + rem % residual_n
        return 0, 0
    if residual_m > 0 and rem < residual_m * n_blocks * g:
        return m_blocks * g + rem % residual_m, rem // residual_m
    return 0, 0


def _snake(t: int, rows: int, cols: int, g: int) -> Tile:
    # grouped, but odd groups run n from cols-1 down to 0.  t // span is the group for
    # the tail too, because the tail group is shorter than a full one.
    span = g * cols
    group_id, within = divmod(t, span)
    height = g if group_id < rows // g else max(rows % g, 1)
    step = within // height
    col = step if group_id % 2 == 0 else cols - 1 - step
    return group_id * g + within % height, col


_ORDER_FUNCS = {
    "row": _row,
    "column": _column,
    "grouped": _grouped,
    "serpentine": _serpentine,
    "snake": _snake,
}


def _raw_order(order, num_m, num_n, g, cluster_m, cluster_n, limit=None) -> list[Tile]:
    rows, cols = _ceil_div(num_m, cluster_m), _ceil_div(num_n, cluster_n)
    func = _ORDER_FUNCS[order]
    tiles = []
    # like TVM, the work count is rounded up to whole clusters
    count = rows * cols * cluster_m * cluster_n
    for w in range(count if limit is None else min(limit, count)):
        cm_off, t = w % cluster_m, w // cluster_m
        cn_off, t = t % cluster_n, t // cluster_n
        row, col = func(t, rows, cols, g)
        tiles.append((row * cluster_m + cm_off, col * cluster_n + cn_off))
    return tiles


def serpentine_ok(num_m: int, num_n: int, l2_group_size: int) -> bool:
    """Whether TVM 0.27's serpentine order visits every tile of this grid exactly once.

    It does not when there are left-over rows and left-over columns and at least one
    full block column: the bottom strip is then skipped (see the module docstring).
    """
    g = l2_group_size
    return not (num_m % g > 0 and num_n % g > 0 and num_n // g > 0)


def _coverage_error(order, num_m, num_n, g, cluster_m, cluster_n) -> str:
    if num_m % cluster_m or num_n % cluster_n:
        return (
            f"a {num_m} x {num_n} tile grid is not a whole number of {cluster_m} x "
            f"{cluster_n} clusters: the scheduler rounds up and hands out tiles past the "
            f"edge; pad the grid to a multiple of the cluster shape or use cluster 1 x 1"
        )
    rows, cols = num_m // cluster_m, num_n // cluster_n
    # the first eight sizes that work, looked for among the first 4096 (a grid may have billions
    # of rows); a size past the columns always works (no full block column)
    near = (s for s in range(1, min(max(rows, cols), 4096) + 1) if serpentine_ok(rows, cols, s))
    good = list(itertools.islice(itertools.chain(near, (cols + 1,) if cols >= 4096 else ()), 8))
    return (
        f"TVM 0.27's serpentine order skips the bottom strip of a {rows} x {cols} cluster "
        f"grid with l2_group_size={g} (left-over rows and columns) and computes tile "
        f"(0, 0) several times instead; use an l2_group_size that works here, e.g. "
        f"{good[:8]}, or order='grouped' / 'snake'"
    )


def check_order(
    order: str,
    num_m: int,
    num_n: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
) -> None:
    """Raise ``ValueError`` unless ``order`` visits every tile of the grid exactly once.

    The same verdict as ``tile_order(..., check=True)``, reached without walking the grid:
    row, column, grouped and snake are one-to-one on any grid of whole clusters, and
    serpentine is unless ``serpentine_ok`` says otherwise. Costs the same for 4 tiles and for
    4 billion; ``tests/test_schedulers.py`` compares it with the full walk on small grids.
    """
    _check_order(order)
    _check_positive(
        num_m=num_m,
        num_n=num_n,
        l2_group_size=l2_group_size,
        cluster_m=cluster_m,
        cluster_n=cluster_n,
    )
    whole = num_m % cluster_m == 0 and num_n % cluster_n == 0
    if not whole or (
        order == "serpentine"
        and not serpentine_ok(num_m // cluster_m, num_n // cluster_n, l2_group_size)
    ):
        raise ValueError(
            _coverage_error(order, num_m, num_n, l2_group_size, cluster_m, cluster_n)
        )


def first_tiles(
    order: str,
    num_m: int,
    num_n: int,
    count: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
) -> list[Tile]:
    """The tiles of work items ``0 .. count-1`` (``tile_order(...)[:count]``) after
    ``check_order``: the cost is ``count``, not the size of the grid."""
    check_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n)
    _check_positive(count=count)
    return _raw_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n, limit=count)


def tile_order(
    order: str,
    num_m: int,
    num_n: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
    check: bool = True,
) -> list[Tile]:
    """The tile ``(m, n)`` of every work index, ``result[w]`` for work item ``w``.

    ``check=True`` raises ``ValueError`` unless the order visits each of the
    ``num_m * num_n`` tiles exactly once; ``check=False`` returns what the scheduler
    really computes (TVM's, for "grouped" / "serpentine"), flaws included.
    """
    _check_order(order)
    _check_positive(
        num_m=num_m,
        num_n=num_n,
        l2_group_size=l2_group_size,
        cluster_m=cluster_m,
        cluster_n=cluster_n,
    )
    tiles = _raw_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n)
    if check:
        expected = {(m, n) for m in range(num_m) for n in range(num_n)}
        if len(tiles) != len(expected) or set(tiles) != expected:
            raise ValueError(
                _coverage_error(order, num_m, num_n, l2_group_size, cluster_m, cluster_n)
            )
    return tiles


def assignment(
    order: str,
    num_m: int,
    num_n: int,
    num_ctas: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
    check: bool = True,
) -> list[list[Tile]]:
    """``result[c]`` is the list of tiles CTA ``c`` processes, in execution order."""
    _check_positive(num_ctas=num_ctas)
    tiles = tile_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n, check)
    return [tiles[c::num_ctas] for c in range(num_ctas)]


def waves(
    order: str,
    num_m: int,
    num_n: int,
    num_ctas: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
    check: bool = True,
) -> list[list[Tile]]:
    """``result[w][c]`` is the tile CTA ``c`` processes in wave ``w``.

    The last wave is shorter when the tile count is not a multiple of ``num_ctas``.
    """
    _check_positive(num_ctas=num_ctas)
    tiles = tile_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n, check)
    return [tiles[i : i + num_ctas] for i in range(0, len(tiles), num_ctas)]


def visit_grid(
    order: str,
    num_m: int,
    num_n: int,
    l2_group_size: int = 8,
    cluster_m: int = 1,
    cluster_n: int = 1,
) -> list[list[int]]:
    """``grid[m][n]`` is the work index that computes tile (m, n)."""
    tiles = tile_order(order, num_m, num_n, l2_group_size, cluster_m, cluster_n)
    grid = [[-1] * num_n for _ in range(num_m)]
    for w, (m, n) in enumerate(tiles):
        grid[m][n] = w
    return grid


def format_grid(
    order: str,
    num_m: int,
    num_n: int,
    l2_group_size: int = 8,
    num_ctas: int | None = None,
    value: str = "order",
) -> str:
    """ASCII picture of the tile grid; ``value`` is "order" (work index), "wave" or "cta"."""
    grid = visit_grid(order, num_m, num_n, l2_group_size)
    if value != "order":
        if num_ctas is None or value not in ("wave", "cta"):
            raise ValueError('value="wave" or "cta" needs num_ctas; value="order" does not')
        pick = (lambda w: w // num_ctas) if value == "wave" else (lambda w: w % num_ctas)
        grid = [[pick(w) for w in row] for row in grid]
    width = len(str(max(max(row) for row in grid)))
    return "\n".join(" ".join(f"{v:>{width}}" for v in row) for row in grid)
