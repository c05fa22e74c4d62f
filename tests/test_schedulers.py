"""CPU tests of schedulers/: the pure-Python tile orders against TVM's own index
arithmetic (compiled for the host with target "llvm"), the traffic model, the pictures,
and one sm_90a build of a kernel that loops over a scheduler."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import schedulers
from schedulers import (
    ORDERS,
    assignment,
    dram_traffic,
    rank_group_sizes,
    tile_order,
    waves,
)
from schedulers.orders import format_grid, serpentine_ok, visit_grid

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def grid_set(num_m, num_n):
    return {(m, n) for m in range(num_m) for n in range(num_n)}


# ---------------------------------------------------------------------------
# pure models
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("num_m,num_n,g", [(8, 8, 4), (10, 7, 4), (3, 5, 8), (12, 16, 4)])
def test_every_tile_once(order, num_m, num_n, g):
    if order == "serpentine" and not serpentine_ok(num_m, num_n, g):
        with pytest.raises(ValueError, match="skips the bottom strip"):
            tile_order(order, num_m, num_n, g)
        return
    tiles = tile_order(order, num_m, num_n, g)
    assert len(tiles) == num_m * num_n
    assert set(tiles) == grid_set(num_m, num_n)


def test_row_and_column_are_grouped_extremes():
    # the factory relies on this: row = groups of 1 row, column = one group of all rows
    for num_m, num_n in [(7, 5), (8, 8), (1, 9)]:
        assert tile_order("row", num_m, num_n) == tile_order("grouped", num_m, num_n, 1)
        assert tile_order("column", num_m, num_n) == tile_order("grouped", num_m, num_n, num_m)


def test_grouped_matches_tvm_docstring_example():
    # ClusterPersistentScheduler2D docstring: 4x4 tiles, l2_group_size=2
    assert visit_grid("grouped", 4, 4, 2) == [
        [0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]
    ]
    # its serpentine example draws blocks on the way up mirrored ([0, 1, 14, 15] on
    # top), but its code keeps them row-major; the (4, 4, 3, 2) TVM case below runs it
    assert visit_grid("serpentine", 4, 4, 2) == [
        [0, 1, 12, 13], [2, 3, 14, 15], [4, 5, 8, 9], [6, 7, 10, 11]
    ]


def test_snake_reverses_odd_groups_and_shares_columns_at_group_seams():
    num_m, num_n, g = 10, 7, 4
    tiles = tile_order("snake", num_m, num_n, g)
    grouped = tile_order("grouped", num_m, num_n, g)
    for (m, n), (gm, gn) in zip(tiles, grouped):
        assert m == gm
        assert n == (gn if (m // g) % 2 == 0 else num_n - 1 - gn)
    # each group starts in the column where the previous one ended
    for start in (g * num_n, 2 * g * num_n):
        assert tiles[start - 1][1] == tiles[start][1]


def test_assignment_and_waves_follow_the_persistent_stride():
    order, num_m, num_n, ctas, g = "grouped", 10, 7, 6, 4
    tiles = tile_order(order, num_m, num_n, g)
    per_cta = assignment(order, num_m, num_n, ctas, g)
    per_wave = waves(order, num_m, num_n, ctas, g)
    assert len(per_cta) == ctas and len(per_wave) == -(-70 // ctas)
    for w, tile in enumerate(tiles):
        assert per_cta[w % ctas][w // ctas] == tile
        assert per_wave[w // ctas][w % ctas] == tile
    assert [len(c) for c in per_cta] == [12, 12, 12, 12, 11, 11]
    assert len(per_wave[-1]) == 70 - 11 * ctas


def test_clusters_pair_consecutive_work_items():
    tiles = tile_order("grouped", 6, 4, 2, cluster_m=2)
    # work items 2k and 2k+1 are the two CTAs of one cluster: same n, rows 2r and 2r+1
    for w in range(0, len(tiles), 2):
        (m0, n0), (m1, n1) = tiles[w], tiles[w + 1]
        assert (n0, m0 % 2, m1) == (n1, 0, m0 + 1)
    assert set(tiles) == grid_set(6, 4)


def test_bad_grids_fail_with_a_hint():
    # TVM 0.27 serpentine skips the bottom strip when both strips exist
    assert not serpentine_ok(10, 10, 4) and serpentine_ok(10, 8, 4) and serpentine_ok(3, 3, 4)
    raw = tile_order("serpentine", 10, 10, 4, check=False)
    assert raw.count((0, 0)) == 1 + 2 * 8 and (9, 0) not in raw
    with pytest.raises(ValueError, match=r"l2_group_size that works here, e.g. \[1, 2, 5, 10\]"):
        tile_order("serpentine", 10, 10, 4)
    # a partial cluster: TVM rounds the grid up and hands out m = 5 of a 5-row grid
    assert (5, 0) in tile_order("grouped", 5, 3, 2, cluster_m=2, check=False)
    with pytest.raises(ValueError, match="not a whole number of 2 x 1 clusters"):
        tile_order("grouped", 5, 3, 2, cluster_m=2)
    with pytest.raises(ValueError, match="choose one of"):
        tile_order("hilbert", 4, 4)
    with pytest.raises(ValueError, match="l2_group_size must be a positive int"):
        tile_order("grouped", 4, 4, 0)


def _literal_blocks(doc):
    """[(header line, dedented block)] for every ``::`` literal block of a docstring."""
    blocks, lines, header = [], doc.splitlines(), ""
    for i, line in enumerate(lines):
        if re.match(r"^\s*(\w+)( \(.*?\))?: ", line):
            header = line.strip()
        if line.rstrip().endswith("::"):
            block = []
            for nxt in lines[i + 2 :]:
                if not nxt.strip():
                    break
                block.append(nxt)
            blocks.append((header, textwrap.dedent("\n".join(block))))
    return blocks


def _docstring_grids(doc):
    """{order: grid} for the blocks whose paragraph starts with ``<order>:``."""
    grids = {}
    for header, block in _literal_blocks(doc):
        name = re.match(r"^(\w+)", header)
        if name and name.group(1) in ORDERS:
            grids[name.group(1)] = block
    return grids


def test_docstring_grids_are_what_the_models_compute():
    grids = _docstring_grids(schedulers.orders.__doc__)
    assert set(grids) == set(ORDERS)
    for order, text in grids.items():
        assert text == textwrap.dedent(format_grid(order, 6, 8, 4)), order


def test_pure_modules_import_without_tvm_or_matplotlib():
    code = (
        "import sys, schedulers, schedulers.traffic, schedulers.plots; "
        "assert 'tvm' not in sys.modules and 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# ---------------------------------------------------------------------------
# traffic model
# ---------------------------------------------------------------------------

H100 = dict(blk_m=128, blk_n=128, num_ctas=132, l2_bytes=50 * MiB)


def test_grouped_beats_row_major_at_8192():
    row = dram_traffic("row", 8192, 8192, 8192, **H100)
    grouped = dram_traffic("grouped", 8192, 8192, 8192, l2_group_size=8, **H100)
    assert grouped.total_bytes < 0.5 * row.total_bytes
    # why: a row-major wave spans every B panel (3 x 64), a grouped one 8 x 17
    assert row.panels_per_wave[0] == (3, 64)
    assert grouped.panels_per_wave[0] == (8, 17)
    # a row-major wave (67 panels, 134 MB) overflows L2, so nothing survives into the
    # next wave: each full wave pays for all of its panels, even the A panel it shares
    panel = 128 * 8192 * 2
    for nbytes, (a, b) in list(zip(row.per_wave, row.panels_per_wave))[:-1]:
        assert nbytes == panel * (a + b)
    assert row.a_bytes > 8192 * 8192 * 2 and row.b_bytes > 10 * 8192 * 8192 * 2


def test_single_wave_reads_everything_exactly_once():
    t = dram_traffic("row", 1024, 2048, 4096, **H100)  # 8 x 16 = 128 tiles <= 132
    assert len(t.per_wave) == 1
    assert t.total_bytes == t.compulsory_bytes == (1024 + 2048) * 4096 * 2


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", [(8192, 8192, 4096), (3000, 5000, 1000), (16384, 2048, 8192)])
def test_traffic_is_never_below_compulsory(order, shape):
    for g in (1, 3, 8, 16):
        try:
            t = dram_traffic(order, *shape, l2_group_size=g, **H100)
        except ValueError:
            assert order == "serpentine"  # TVM's bug, refused by the model
            continue
        assert t.total_bytes >= t.compulsory_bytes
        assert t.total_bytes == t.a_bytes + t.b_bytes == sum(t.per_wave)
        assert t.a_bytes >= shape[0] * shape[2] * 2 and t.b_bytes >= shape[1] * shape[2] * 2


def test_l2_extremes():
    M, N, K = 4096, 6144, 2048
    big = dict(H100, l2_bytes=2 * (M + N) * K * 2)  # everything fits: no re-reads
    for order in ORDERS:
        assert dram_traffic(order, M, N, K, **big).amplification == 1.0
    # no L2 at all: each wave pays for every panel it touches, counted straight from waves
    tiny = dict(H100, l2_bytes=1)
    panel = 128 * K * 2
    for order in ("row", "grouped", "snake"):
        expect = sum(
            panel * (len({m for m, _ in w}) + len({n for _, n in w}))
            for w in waves(order, M // 128, N // 128, 132, 8)
        )
        assert dram_traffic(order, M, N, K, **tiny).total_bytes == expect


def test_rank_group_sizes():
    ranked = rank_group_sizes(8192, 8192, 8192, **H100)
    sizes = [g for g, _ in ranked]
    totals = [t.total_bytes for _, t in ranked]
    assert sorted(sizes) == [1, 2, 4, 8, 16, 32, 64] and totals == sorted(totals)
    assert sizes[:2] == [16, 8]  # near sqrt(132): the wave footprint is smallest there
    by_g = dict(ranked)
    row = dram_traffic("row", 8192, 8192, 8192, **H100)
    col = dram_traffic("column", 8192, 8192, 8192, **H100)
    assert by_g[1].total_bytes == row.total_bytes  # groups of one row: the row order
    assert by_g[64].total_bytes == col.total_bytes  # one group of all 64 rows: column
    kept = rank_group_sizes(8192, 8192, 8192, **H100, within=0.05)
    assert [g for g, _ in kept] == [16]
    # serpentine sizes that TVM gets wrong on a 10 x 10 grid are left out, not ranked
    serp = rank_group_sizes(1280, 1280, 1024, **H100, order="serpentine", group_sizes=(2, 4, 5))
    assert sorted(g for g, _ in serp) == [2, 5]


# ---------------------------------------------------------------------------
# pictures
# ---------------------------------------------------------------------------


def test_plot_order_draws_the_model(tmp_path):
    path = tmp_path / "snake.png"
    fig = schedulers.plot_order("snake", 6, 8, 5, 4, path=path)
    order_img, wave_img = (ax.images[0].get_array() for ax in fig.axes[:2])
    expect = np.array(visit_grid("snake", 6, 8, 4))
    assert np.array_equal(order_img, expect)
    assert np.array_equal(wave_img, expect // 5)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_traffic_vs_group_draws_the_model():
    args = (2048, 2048, 1024)
    small = dict(blk_m=128, blk_n=128, num_ctas=20, l2_bytes=4 * MiB)
    fig = schedulers.plot_traffic_vs_group(*args, **small, group_sizes=(1, 2, 4, 8))
    lines = {line.get_label(): line.get_ydata() for line in fig.axes[0].lines}
    for g, y in zip((1, 2, 4, 8), lines["grouped"]):
        t = dram_traffic("grouped", *args, l2_group_size=g, **small)
        assert y == pytest.approx(t.total_bytes / 1e9)
    assert lines["compulsory (A + B once)"][0] == pytest.approx(2 * 2048 * 1024 * 2 / 1e9)


def test_write_all(tmp_path):
    paths = schedulers.write_all(tmp_path / "pics")
    names = sorted(Path(p).name for p in paths)
    assert names == sorted(
        [f"order_{o}.png" for o in ORDERS]
        + ["traffic_vs_group_8192x8192x8192.png", "traffic_vs_group_16384x16384x4096.png"]
    )
    assert all(Path(p).stat().st_size > 10_000 for p in paths)


# ---------------------------------------------------------------------------
# TVM: the schedulers' TIR, compiled for the host and run
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bridge():
    pytest.importorskip("tvm")
    from schedulers import tvm_bridge

    return tvm_bridge


def check_trace(trace, expected, num_ctas):
    """Every work item reached once, by CTA w % num_ctas, with the model's tile."""
    assert (trace[:, 2] == np.arange(len(trace)) % num_ctas).all(), "stride or valid() wrong"
    assert [tuple(t) for t in trace[:, :2].tolist()] == expected


TVM_CASES = [
    # num_m, num_n, ctas, g, cluster_m, cluster_n, serpentine
    (8, 8, 5, 8, 1, 1, False),  # one full group, no tail
    (10, 7, 3, 4, 1, 1, False),  # full groups and a tail of 2 rows
    (5, 3, 4, 8, 1, 1, False),  # tail only (fewer rows than a group)
    (6, 5, 3, 2, 2, 1, False),  # 2 x 1 clusters
    (6, 6, 4, 2, 1, 2, False),  # 1 x 2 clusters
    (5, 6, 3, 2, 2, 1, False),  # partial cluster: TVM hands out row 5
    (8, 8, 3, 4, 1, 1, True),  # serpentine, whole blocks
    (4, 4, 3, 2, 1, 1, True),  # serpentine, the example of TVM's docstring
    (10, 8, 3, 4, 1, 1, True),  # serpentine, bottom strip
    (8, 10, 3, 4, 1, 1, True),  # serpentine, right strip
    (10, 10, 3, 4, 1, 1, True),  # serpentine, both strips: TVM skips one
]


@pytest.mark.parametrize("case", TVM_CASES, ids=str)
def test_model_matches_tvm_scheduler(bridge, case):
    num_m, num_n, ctas, g, cm, cn, serp = case
    trace = bridge.tvm_trace(num_m, num_n, ctas, g, cm, cn, serpentine=serp)
    order = "serpentine" if serp else "grouped"
    expected = tile_order(order, num_m, num_n, g, cm, cn, check=False)
    check_trace(trace, expected, ctas)
    covers = [tuple(t) for t in trace[:, :2].tolist()]
    valid = (num_m % cm == 0) and (num_n % cn == 0) and (not serp or serpentine_ok(num_m, num_n, g))
    assert (sorted(covers) == sorted(grid_set(num_m, num_n))) == valid


FACTORY_CASES = [
    ("snake", 10, 7, 3, 4, 1, 1),
    ("snake", 8, 8, 5, 8, 1, 1),  # no tail
    ("snake", 3, 5, 2, 8, 1, 1),  # tail only
    ("snake", 13, 4, 6, 4, 1, 1),  # three reversals deep, odd tail group
    ("snake", 6, 6, 4, 2, 2, 1),
    ("snake", 6, 6, 4, 2, 3, 2),
    ("row", 10, 7, 3, 4, 1, 1),
    ("column", 6, 6, 4, 2, 2, 1),
    ("serpentine", 10, 8, 3, 4, 1, 1),
]


@pytest.mark.parametrize("case", FACTORY_CASES, ids=str)
def test_factory_schedulers_match_model(bridge, case):
    order, num_m, num_n, ctas, g, cm, cn = case
    trace = bridge.factory_trace(order, num_m, num_n, ctas, g, cm, cn)
    check_trace(trace, tile_order(order, num_m, num_n, g, cm, cn), ctas)


def test_factory_refuses_what_tvm_gets_wrong(bridge):
    from schedulers.tirx_orders import SnakeScheduler2D

    with pytest.raises(ValueError, match="serpentine"):
        schedulers.make_tirx_scheduler("serpentine", "ts", 10, 10, 3, 4)
    with pytest.raises(ValueError, match="clusters"):
        schedulers.make_tirx_scheduler("snake", "ts", 5, 4, 3, 4, cluster_m=2)
    with pytest.raises(ValueError, match="choose one of"):
        schedulers.make_tirx_scheduler("zigzag", "ts", 4, 4, 3, 4)
    (_, grid), = _literal_blocks(SnakeScheduler2D.__doc__)
    assert grid == textwrap.dedent(format_grid("snake", 6, 8, 4))


def test_snake_kernel_builds_for_sm90a(bridge):
    src = bridge.cuda_trace_source("snake", 10, 7, 4, 4)
    body = src[src.index("__global__ void trace_kernel_kernel(int* __restrict__ out_ptr) {"):]
    assert "blockIdx.x" in body
    assert "while (1)" in body and "< 70)" in body  # the persistent loop over 70 tiles
    assert "(6 - " in body  # odd groups mirror n: cols - 1 - step


# -- the constant-time check against the full walk -------------------------------------------
def test_check_order_agrees_with_the_full_walk_on_small_grids():
    """``check_order`` (what the validator runs, whatever the grid) gives the verdict, and the
    message, of walking every work item (``tile_order(check=True)``)."""
    from schedulers.orders import ORDERS, check_order, tile_order

    checked = 0
    for order in ORDERS:
        for m in range(1, 11):
            for n in range(1, 11):
                for g in range(1, 12):
                    for cm, cn in ((1, 1), (2, 1), (1, 2), (2, 2)):
                        try:
                            tile_order(order, m, n, g, cm, cn)
                            full = None
                        except ValueError as err:
                            full = str(err)
                        try:
                            check_order(order, m, n, g, cm, cn)
                            fast = None
                        except ValueError as err:
                            fast = str(err)
                        assert fast == full, (order, m, n, g, cm, cn)
                        checked += full is not None
    assert checked > 100  # the walk refuses many of these grids: the comparison has teeth


def test_first_tiles_is_the_start_of_the_order():
    from schedulers.orders import first_tiles, tile_order

    assert first_tiles("snake", 37, 23, 100, 4) == tile_order("snake", 37, 23, 4)[:100]
    assert len(first_tiles("grouped", 2**20, 2**10, 5)) == 5  # a billion tiles, five built
    with pytest.raises(ValueError, match="serpentine"):
        first_tiles("serpentine", 10, 10, 5, 4)


# -- the K-loop pipeline model ---------------------------------------------------------------
def test_pipeline_model_overlaps_loads_with_deeper_rings():
    from schedulers import pipeline_schedule

    one, two, four = (pipeline_schedule(s, k_tiles=16) for s in (1, 2, 4))
    # one stage: each slice's load waits for the previous slice's wgmmas (no overlap)
    assert all(one["loads"][j][0] >= one["mmas"][j - 1][1] for j in range(1, 16))
    assert one["busy"] < two["busy"] < four["busy"] <= 1.0
    for s in (one, two, four):  # a wgmma never starts before its slice landed, nor overlaps the last
        assert all(m0 >= arrive for (_, arrive), (m0, _) in zip(s["loads"], s["mmas"]))
        assert all(b[0] >= a[1] for a, b in zip(s["mmas"], s["mmas"][1:]))
    # with enough stages the tensor cores wait only for the first load
    deep = pipeline_schedule(8, k_tiles=64, latency=1.5, transfer=0.5)
    assert deep["time"] == pytest.approx(64 * 1.0 + 1.5 + 0.5)
