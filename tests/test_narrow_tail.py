"""v9's ``tail_n``: the tiles of the partial last wave cut narrower, one more per cluster.

CPU tier (CI): the knob's validation; the cut over many (shape, tile, cluster count), played out
the way the kernel walks it (the tile order's whole tiles over the first rows, then the narrow
ones row by row, each cluster striding by the cluster count): every element of D in exactly one
tile, no cluster with more tiles than v9 gives it, the busiest cluster's columns at most
(waves - 1) x blk_n + tail_n, and ``columns_per_cluster`` (the model the front door reads) the
same as the walk; ``best_tail_n`` the narrowest width that cuts; one build with its SASS (the
narrow wgmma beside the whole one, the columns after the last staged chunk stored from the
registers, no spills). The GPU cases (shapes where the cut happens on 132 SMs) live with v9's in
``test_sm90a_v7_v9``.
"""

import random
import re

import numpy as np
import pytest

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.sm90a import narrowtail
from schedulers.orders import tile_order


@pytest.mark.parametrize(
    "knobs, words",
    [
        (dict(tail_n=100), ["tail_n=100", "multiple of 8 below blk_n=256"]),
        (dict(tail_n=256), ["tail_n=256", "below blk_n=256", "232"]),
        (dict(tail_n=-8), ["tail_n=-8", "0 (off)"]),
        (dict(tail_n=232, dynamic_m=True), ["dynamic_m=True", "use dynamic_m=False with tail_n"]),
        (dict(tail_n=232, pingpong=True, blk_m=64), ["pingpong=True", "use pingpong=False with tail_n"]),
        (dict(tail_n=232, tile_order="row"), ["tile_order='row'", "('grouped', 'snake')"]),
    ],
)
def test_refuses_bad_tail_n_with_a_fix(knobs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config("v9", 4096, 4096, 4096, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_tail_n_is_off_by_default_and_taken_when_it_fits():
    assert gemm_ladder.make_config("v9", 4096, 4096, 4096).knobs()["tail_n"] == 0
    assert gemm_ladder.make_config("v9", 4096, 4096, 4096, tail_n=232).knobs()["tail_n"] == 232


def walk(M, N, blk_m, blk_n, cm, cn, width, clusters, order="snake", group=4):
    """The kernel's walk of the cut, per cluster: a list of (m0, n0, rows, cols) CTA tiles in the
    order it runs them (all the CTAs of the cluster)."""
    m_tiles, n_tiles = -(-M // (blk_m * cm)), -(-N // (blk_n * cn))
    kn = narrowtail.per_row(N, cn, width)
    cut = narrowtail.rows(m_tiles, n_tiles, kn, clusters)
    whole = tile_order(order, m_tiles - cut, n_tiles, group) if m_tiles > cut else []
    runs = []
    for g in range(clusters):
        tiles = [("whole", *whole[t]) for t in range(g, len(whole), clusters)]
        t = len(tiles) * clusters + g  # the scheduler's index after its last whole tile
        while t - len(whole) < cut * kn:
            row, col = narrowtail.narrow_tile(t - len(whole), m_tiles - cut, kn)
            tiles.append(("narrow", row, col))
            t += clusters
        ctas = []
        for kind, row, col in tiles:
            w = blk_n if kind == "whole" else width
            for rm in range(cm):
                for rn in range(cn):
                    ctas.append(((row * cm + rm) * blk_m, (col * cn + rn) * w, blk_m, w))
        runs.append((tiles, ctas))
    return runs, cut, kn


def random_cases(n, seed=0):
    rng = random.Random(seed)
    cases = [(4096, 4096, 128, 256, 1, 1, 232, 132), (8192, 8192, 128, 256, 2, 1, 176, 66),
             (1000, 3000, 128, 256, 1, 1, 232, 132), (4096, 4096, 128, 256, 1, 2, 232, 66)]
    while len(cases) < n:
        blk_m, blk_n = rng.choice([(128, 256), (128, 128), (256, 128), (192, 192), (64, 256)])
        cm, cn = rng.choice([(1, 1), (2, 1), (1, 2)])
        M, N = rng.randrange(64, 6000), rng.randrange(8, 6000, 8)
        clusters = rng.choice([132, 66, 114, 7, 16])
        cases.append((M, N, blk_m, blk_n, cm, cn, rng.randrange(8, blk_n, 8), clusters))
    return cases


@pytest.mark.parametrize("case", random_cases(120), ids=str)
def test_the_cut_covers_d_once_and_shortens_the_busiest_cluster(case):
    M, N, blk_m, blk_n, cm, cn, width, clusters = case
    runs, cut, kn = walk(M, N, blk_m, blk_n, cm, cn, width, clusters)
    covered = np.zeros((M, N), np.int32)
    for _, ctas in runs:
        for m0, n0, rows, cols in ctas:
            covered[m0:m0 + rows, n0:n0 + cols] += 1  # numpy clips at D's edges, as TMA does
    assert (covered == 1).all()
    m_tiles, n_tiles = -(-M // (blk_m * cm)), -(-N // (blk_n * cn))
    waves = -(-m_tiles * n_tiles // clusters)
    work = [sum(blk_n if kind == "whole" else width for kind, _, _ in tiles) for tiles, _ in runs]
    assert work == narrowtail.columns_per_cluster(m_tiles, n_tiles, blk_n, width, kn, clusters)
    assert max(len(tiles) for tiles, _ in runs) <= waves  # no cluster runs more tiles than in v9
    if cut:
        assert max(work) <= (waves - 1) * blk_n + width < waves * blk_n
    else:  # not cut: v9's tiles exactly
        assert max(work) == waves * blk_n


def test_4096_cubed_on_132_sms_is_the_docstrings_example():
    runs, cut, kn = walk(4096, 4096, 128, 256, 1, 1, 232, 132)
    assert (cut, kn) == (8, 18)
    work = [sum(256 if kind == "whole" else 232 for kind, _, _ in tiles) for tiles, _ in runs]
    assert work[:120] == [1000] * 120 and work[120:] == [976] * 12


def test_best_tail_n_is_the_narrowest_that_cuts():
    for m_tiles, n_tiles, n, clusters, want in [(32, 16, 4096, 132, 232), (32, 32, 8192, 66, 176),
                                                (64, 32, 8192, 132, 160)]:
        got = narrowtail.best_tail_n(m_tiles, n_tiles, n, 256, 1, clusters)
        assert got == want
        assert not narrowtail.rows(m_tiles, n_tiles, narrowtail.per_row(n, 1, got - 8), clusters)
    # whole waves: nothing to cut
    assert narrowtail.best_tail_n(33, 16, 4096, 256, 1, 132) == 0


NARROW_TAIL_BUILD = ("v9", (4096, 4096, 4096), dict(tail_n=232, cluster_m=1, dtype="bfloat16"))


def test_sass_has_the_narrow_wgmma_and_register_stores_and_no_spills(built):
    b = built(*NARROW_TAIL_BUILD)
    text, counts = b.sass, b.counts
    assert set(re.findall(r"HGMMA\.(\d+x\d+)x16\.F32\.BF16", text)) == {"64x256", "64x232"}
    assert counts["LDL"] + counts["STL"] == 0, counts
    # 232 = 3 staged chunks of 64 + 40 columns from the registers: 5 column groups of 8, in two
    # rows of the fragment, one 4-byte store a pair
    assert counts["STG"] == 10, counts
