"""v12 in 2x1 and 1x2 clusters (issue 33's floor case: the odd 5 x 1000x520 weight at 32768 tokens)
on the CPU: the walk of cluster units against the per-expert reference over random routing (odd
m-tile counts: the phantom partner; empty experts; one expert with all rows; E up to 256), the
kernel's loads (a whole cluster run by the barrier checker, multicast halves) against the model,
the protocol check at the suite's weights with a phantom in the routing (swap AB's 64-token tiles
too: two token tiles of an expert sharing W's tile), the refusals by name, and the build for sm_90a
(multicast TMA, cluster launch). (The timing: ``benchmarks/grouped_prefill_check.py
prepare --large``.)"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from gemm_ladder import make_config
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import rung_module
from gemm_ladder.sm90a import grouped

from .grouped_loads import CHECKED_WEIGHTS, cumulative, loads_of
from .test_grouped import reference_units, routing

GROUPED = GemmSpec(grouped=True).text()
BF16 = GemmSpec(a="bfloat16", b="bfloat16", d="bfloat16", grouped=True).text()
CLUSTERS = [(2, 1), (1, 2)]


def _real(unit, n_tiles) -> bool:
    """A unit inside its expert's rows and D's n-tiles (not a cluster's phantom)."""
    return unit.row0 < unit.row_end and unit.n_tile < n_tiles


@settings(max_examples=150, deadline=None)
@given(offs=routing(), blk_m=st.sampled_from([64, 128]), n_tiles=st.integers(1, 9),
       group=st.sampled_from([1, 2, 8]), clusters=st.sampled_from([1, 3, 66]), shape=st.sampled_from(CLUSTERS),
       layout=st.sampled_from(["contiguous", "masked"]))
def test_cluster_walk_covers_every_expert_tile_once(offs, blk_m, n_tiles, group, clusters, shape, layout):
    cm, cn = shape
    size = cm * cn
    if layout == "masked":  # the same draw as counts into slots of the largest count
        counts = [b - a for a, b in zip([0] + offs[:-1], offs)]
        slot = max(counts + [1])
        M, table = slot * len(counts), counts
        want = {(e, e * slot + r, e * slot + c, n) for e, c in enumerate(counts)
                for r in range(0, c, blk_m) for n in range(n_tiles)}
    else:
        M, table = offs[-1], offs
        want = reference_units(offs, M, blk_m, n_tiles)
    units = grouped.walk(table, M, blk_m, n_tiles, group, clusters * size, layout=layout, cluster_m=cm, cluster_n=cn)
    got = [(u.expert, u.row0, u.row_end, u.n_tile) for mine in units for u in mine if _real(u, n_tiles)]
    assert len(got) == len(set(got))  # no tile twice
    assert set(got) == want
    for clu in range(clusters):
        pair = units[clu * size:(clu + 1) * size]
        # the CTAs of a cluster walk the same units in the same order: the same experts, one tile apart
        assert len({len(mine) for mine in pair}) == 1
        for us in zip(*pair):
            assert len({u.expert for u in us}) == 1
            if cm == 2:
                assert us[1].row0 == us[0].row0 + blk_m and us[0].n_tile == us[1].n_tile
                assert us[0].row0 < us[0].row_end, "rank 0 of a pair is never the phantom"
            else:
                assert us[1].n_tile == us[0].n_tile + 1 and us[0].row0 == us[1].row0
                assert us[0].n_tile < n_tiles
    # phantoms: only an expert's odd last m-tile (2x1) or an odd last n-tile (1x2)
    phantoms = [u for mine in units for u in mine if not _real(u, n_tiles)]
    if cm == 2:
        assert all(u.row0 - u.row_end < blk_m for u in phantoms)
        tiles = {e: 0 for e in range(len(table))}
        for e, _, _, n in want:
            tiles[e] += 1
        assert len(phantoms) == sum(((c // n_tiles) % 2) * n_tiles for c in tiles.values())
    else:
        assert all(u.n_tile == n_tiles for u in phantoms) and (phantoms == [] or n_tiles % 2 == 1)


def test_cluster_walk_at_1x1_is_the_plain_walk():
    offs = cumulative([0, 300, 1, 0, 129, 4000])
    assert grouped.walk(offs, offs[-1], 128, 4, 8, 12) == \
        grouped.walk(offs, offs[-1], 128, 4, 8, 12, cluster_m=1, cluster_n=1)


def test_cluster_walk_bands_over_pairs():
    # one expert of 7 m-tiles (4 pairs, the last a phantom's), 2 n-tiles, bands of 4 m-tiles = 2 pairs
    rank0, rank1 = grouped.walk([7 * 128], 7 * 128, 128, 2, 4, 2, cluster_m=2)
    assert [(u.row0 // 128, u.n_tile) for u in rank0] == [(0, 0), (2, 0), (0, 1), (2, 1), (4, 0), (6, 0), (4, 1),
                                                            (6, 1)]
    assert [(u.row0 // 128, u.n_tile) for u in rank1] == [(m + 1, n) for m, n in ((u.row0 // 128, u.n_tile)
                                                                                 for u in rank0)]
    assert [u.row0 >= u.row_end for u in rank1] == [False] * 5 + [True, False, True]  # m-tile 7: the phantom


def test_cluster_walk_refuses_part_clusters():
    with pytest.raises(ValueError, match="whole clusters of 2"):
        grouped.walk([100], 100, 128, 2, 8, 3, cluster_m=2)


@pytest.mark.parametrize("knobs, words", [
    (dict(cluster_m=2, cluster_n=2), ["cluster_m=2, cluster_n=2", "2x1", "1x2"]),
    (dict(cluster_m=3), ["cluster_m=3"]),
    (dict(cluster_m=2, spec=GemmSpec(act="silu", gated=True, grouped=True).text()),
     ["a gated W_gu (SwiGLU) is not built"]),
    (dict(cluster_m=2, dtype="bfloat16", spec=GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row",
                                                       grouped=True).text()), ["an fp8 spec is not built"]),
])
def test_refuses_clusters_where_not_built(knobs, words):
    with pytest.raises(ConfigError) as err:
        make_config("v12", 4096, 4096, 4096, **{"experts": 8, "spec": GROUPED, **knobs})
    for w in words:
        assert w in str(err.value), str(err.value)


@pytest.mark.parametrize("shape", CLUSTERS)
def test_launch_carries_the_cluster(shape):
    cm, cn = shape
    cfg = make_config("v12", 4096, 1000, 520, experts=5, spec=GROUPED, cluster_m=cm, cluster_n=cn)
    launch = rung_module("v12", "sm_90a").launch(cfg)
    assert launch["cluster"] == 2 and launch["cluster_shape"] == [cm, cn]
    plain = make_config("v12", 4096, 1000, 520, experts=5, spec=GROUPED, cluster_m=1)
    assert "cluster" not in rung_module("v12", "sm_90a").launch(plain)
    assert "cluster" not in plain.tag()  # 1x1 modules keep their tags and cache keys


@pytest.mark.parametrize("shape", CLUSTERS)
@pytest.mark.parametrize("layout, table, M", [
    # expert 1: 3 m-tiles (the second pair's partner a phantom), expert 4: 1 m-tile (a phantom partner),
    # the last expert's phantom past M (TMA zero fill)
    ("contiguous", cumulative((0, 259, 0, 0, 100, 1)), 600),
    ("masked", (0, 130, 125, 0, 3), 640),
])
def test_the_cluster_walk_is_the_models(monkeypatch, shape, layout, table, M):
    """The producer's loads in a 2x1 (1x2) cluster: each CTA loads its own A tile (its half) and its
    half of W's (A's) tile, at the model's units in order, phantoms included."""
    cm, cn = shape
    E, N = len(table), 520 if cn == 1 else 776  # 1x2: 7 n-tiles of 128 (the last 8 columns), the 8th a phantom
    cfg = make_config("v12", M, N, 128, experts=E, spec=GROUPED, layout=layout, cluster_m=cm, cluster_n=cn,
                      pipe_depth=2, **({"blk_n": 128} if cn == 2 else {}))
    num_ctas = 4
    loads = loads_of(monkeypatch, cfg, table, M, num_ctas, cluster=2)
    n_tiles = -(-N // cfg.blk_n)
    want = grouped.walk(list(table), M, cfg.blk_m, n_tiles, cfg.l2_group_size, num_ctas, layout=layout,
                        cluster_m=cm, cluster_n=cn)
    assert any(u.row0 >= u.row_end or u.n_tile >= n_tiles for w in want for u in w), "no phantom in the routing"
    a_part, b_part = cfg.blk_m // cn, cfg.blk_n // cm
    for cta in range(num_ctas):
        rank_m, rank_n = (cta % 2, 0) if cm == 2 else (0, cta % 2)
        mine = [(name, c) for b, name, c in loads if b == cta]
        a_rows = [c[1] for name, c in mine if name.startswith("A")][::cfg.k_tiles]
        b_rows = [c[1] for name, c in mine if name.startswith("B")][::cfg.k_tiles]
        assert a_rows == [u.row0 + rank_n * a_part for u in want[cta]]
        assert b_rows == [u.expert * N + u.n_tile * cfg.blk_n + rank_m * b_part for u in want[cta]]


SWAP64 = dict(swap_ab=True, blk_m=64, blk_n=128, num_warpgroups=2, pipe_depth=8)


@pytest.mark.parametrize("shape", CHECKED_WEIGHTS)
@pytest.mark.parametrize("tile", [dict(cluster_m=2), dict(cluster_m=2, epi_n=128, pipe_depth=3),
                                  dict(cluster_n=2), dict(SWAP64, cluster_m=2), dict(SWAP64, cluster_n=2)])
def test_cluster_presets_pass_the_protocol_check(shape, tile):
    """The barrier checker over the suite's weights with whole clusters (multicast halves, releases to
    both CTAs) and its routing for clusters (``grouped.checker_params``: an expert of one m-tile, whose
    partner is a phantom, beside a whole pair and the rest on the last expert)."""
    M, N, K, E = shape
    cfg = make_config("v12", M, N, K, experts=E, spec=GROUPED, warp_scan=True, **tile)
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()
    assert all(len(s.ctas) == 2 for s in report.sims)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_cluster_with_epi_under_passes_the_protocol_check(layout):
    """2x1 with the epilogue under the next tile (a phantom's guarded stores write nothing and leave no
    pairs waiting) and in the masked layout, at the odd weight."""
    cfg = make_config("v12", 600, 1000, 520, experts=5, spec=GROUPED, cluster_m=2, epi_under=True, layout=layout)
    report = check_config(cfg, policies=("forward",))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()


def test_checker_routing_holds_a_phantom():
    cfg = make_config("v12", 600, 1000, 520, experts=5, spec=GROUPED, cluster_m=2)
    offs = grouped.checker_params(cfg)["offsets"]
    units = grouped.walk(offs, 600, 128, 4, 8, 8, cluster_m=2)  # the checker's 4 clusters
    assert any(u.row0 >= u.row_end for u in units[1]), "the first cluster runs no phantom"


@pytest.mark.parametrize("tile", [dict(cluster_m=2), dict(cluster_m=2, epi_n=128, pipe_depth=3), dict(cluster_n=2),
                                  dict(SWAP64, cluster_m=2)])
def test_builds_with_multicast_loads(built, tile):
    """The odd weight (5 x 1000x520, bf16) in clusters: multicast TMA loads of the shared tile's half,
    remote releases, no spills, the guarded stores of an expert's last m-tile (and its phantom)."""
    b = built("v12", (1000, 1000, 520), dict(experts=5, dtype="bfloat16", spec=BF16, **tile))
    text, src = b.sass, b.module.source
    assert "multicast::cluster" in src
    assert re.search(r"\bUTMALDG\.\S*MULTICAST", text), "no multicast load"
    assert not re.findall(r"\bLDL\b", text) and not re.findall(r"\bSTL\b", text), "spills"
    assert len(re.findall(r"\bSTG\.E\b", text)) >= b.module.cfg.blk_n // 4, "no guarded stores"
    assert b.module.extra["launch"]["cluster"] == 2
