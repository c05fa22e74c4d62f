"""The grouped GEMM (v12, ``sm90a/grouped.py``) on the CPU: the scheduler's walk against a
per-expert reference over random routing, the knobs it refuses, and its build for sm_90a.

The walk is what the kernel's producer and consumers compute from ``offs`` on the device; its
model (``grouped.walk``) uses the kernel's own formulas (``tile_in_expert``, the binary search's
steps), so a mistake in the order or the search shows here without a GPU.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from gemm_ladder import ConfigError, make_config
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.sm90a import grouped

from .grouped_loads import loads_of

GROUPED = GemmSpec(grouped=True).text()


def reference_units(offs, M, blk_m, n_tiles):
    """Every (expert, first row, end row, n-tile) a grouped GEMM must compute: per expert, its rows
    cut into blk_m-row tiles, each with every n-tile (torch._grouped_mm's groups)."""
    out, start = set(), 0
    for e, end in enumerate(offs):
        for row0 in range(start, end, blk_m):
            out.update((e, row0, end, n) for n in range(n_tiles))
        start = end
    return out


@st.composite
def routing(draw):
    """Token counts of up to 256 experts as a router makes them: balanced, skewed, all on one
    expert, many empty, counts that are not multiples of the tile."""
    E = draw(st.integers(1, 256))
    kind = draw(st.sampled_from(["random", "one", "empty_but_few", "zipf"]))
    if kind == "one":
        counts = [0] * E
        counts[draw(st.integers(0, E - 1))] = draw(st.integers(1, 5000))
    elif kind == "empty_but_few":
        counts = [draw(st.sampled_from([0, 0, 0, 1, 127, 129, 300])) for _ in range(E)]
    elif kind == "zipf":
        total = draw(st.integers(0, 8192))
        weights = [1 / (r + 1) ** 1.2 for r in range(E)]
        counts = [int(total * w / sum(weights)) for w in weights]
    else:
        counts = draw(st.lists(st.integers(0, 700), min_size=E, max_size=E))
    offs, run = [], 0
    for c in counts:
        run += c
        offs.append(run)
    return offs


@settings(max_examples=150, deadline=None)
@given(offs=routing(), blk_m=st.sampled_from([64, 128, 192]), n_tiles=st.integers(1, 9),
       group=st.sampled_from([1, 3, 8]), num_ctas=st.sampled_from([1, 7, 132]))
def test_walk_covers_every_expert_tile_once(offs, blk_m, n_tiles, group, num_ctas):
    M = offs[-1]
    units = grouped.walk(offs, M, blk_m, n_tiles, group, num_ctas)
    got = [(u.expert, u.row0, u.row_end, u.n_tile) for mine in units for u in mine]
    assert len(got) == len(set(got))  # no tile twice
    assert set(got) == reference_units(offs, M, blk_m, n_tiles)
    # the CTAs share the work evenly: their counts differ by at most one tile
    counts = [len(mine) for mine in units]
    assert max(counts) - min(counts) <= 1
    # a tile's rows stay inside its expert except the last m-tile's, which the kernel guards
    assert all(u.row0 < u.row_end for mine in units for u in mine)


def test_walk_bands_share_a_weight_tile_across_m_tiles():
    # one expert of 5 m-tiles, 3 n-tiles, bands of 2: the band's m-tiles of n-tile 0 first
    (order,) = grouped.walk([5 * 128], 5 * 128, 128, 3, 2, 1)
    assert [(u.row0 // 128, u.n_tile) for u in order] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
        (4, 0), (4, 1), (4, 2)]


def test_walk_of_bad_offsets_stays_inside_d():
    # offsets that decrease or pass M: clamped (a running max, then M), so no tile starts past M
    units = grouped.walk([300, 100, 5000, -7], 1000, 128, 2, 8, 4)
    assert all(0 <= u.row0 < u.row_end <= 1000 for mine in units for u in mine)
    assert {u.expert for mine in units for u in mine} == {0, 2}


@pytest.mark.parametrize("E", [1, 2, 5, 8, 64, 255, 256, 1000])
def test_locate_is_a_search_over_the_tile_ends(E):
    ends = sorted((i * 37) % 11 for i in range(E))  # runs of equal ends: empty experts
    tile_end = [sum(ends[: i + 1]) for i in range(E)]
    for t in range(tile_end[-1]):
        assert grouped.locate(tile_end, t) == sum(1 for x in tile_end if x <= t)


@pytest.mark.parametrize("knobs, words", [
    (dict(spec="d_float16"), ["v12 is the grouped GEMM", "grouped_true"]),
    (dict(spec=GROUPED, experts=0), ["experts=0", "1..1024", "W.shape[0]"]),
    (dict(spec=GROUPED, experts=True), ["experts=True"]),
    (dict(spec=GROUPED, cluster_m=2, cluster_n=2), ["cluster_m=2, cluster_n=2", "1x1"]),
    (dict(spec=GROUPED, tile_order="snake"), ["tile_order='snake'", "grouped"]),
    (dict(spec=GROUPED, experts=1024), ["1024 experts", "use pipe_depth=3"]),
    (dict(spec=GemmSpec(grouped=True, bias="float16").text()), ["bias or an activation"]),
])
def test_refuses_what_it_does_not_build(knobs, words):
    with pytest.raises(ConfigError) as err:
        make_config("v12", 4096, 4096, 4096, **knobs)
    for w in words:
        assert w in str(err.value)


def test_v12_defaults_to_the_grouped_spec_of_its_dtype():
    cfg = make_config("v12", 4096, 4096, 4096, dtype="bfloat16", experts=4)
    assert dict(cfg.extra)["spec"] == GemmSpec(a="bfloat16", b="bfloat16", d="bfloat16", grouped=True).text()


def test_v9_refuses_a_grouped_spec():
    with pytest.raises(ConfigError, match="v12 only"):
        make_config("v9", 4096, 4096, 4096, spec=GROUPED)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_builds_for_sm90a_with_guarded_stores_and_no_spills(built, dtype):
    b = built("v12", (1000, 1000, 520), dict(experts=5, dtype=dtype,
                                                   spec=GemmSpec(a=dtype, b=dtype, d=dtype, grouped=True).text()))
    text = b.sass
    count = {op: len(re.findall(rf"\b{op}\b", text)) for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM", "LDL", "STL")}
    assert count["UTMALDG"] and count["UTMASTG"] and count["HGMMA"] and count["STSM"], count
    assert count["LDL"] == 0 and count["STL"] == 0, count
    # the boundary tile's guarded stores: one 4-byte store per pair of the fragment (64 at 128x256 / 2)
    assert len(re.findall(r"\bSTG\.E\b", text)) >= b.module.cfg.blk_n // 4, "no guarded stores"
    launch = b.module.extra["launch"]
    assert launch["dynamic_m"] is True and launch["persistent"] is True and launch["experts"] == 5


MANY = tuple(7 if e in (3, 250, 398) else 0 for e in range(400))  # more experts than threads


@pytest.mark.parametrize("counts", [(0, 129, 0, 0, 0, 0, 0, 231), (300, 0, 1, 59, 0, 0, 0, 0), (0,) * 7 + (360,),
                                    MANY[:399] + (339,)])
def test_the_kernels_walk_is_the_models(monkeypatch, counts):
    """The producer's TMA loads, as the barrier checker runs the traced kernel (every CTA of a
    launch, each alone), are the model's work units in order: A rows from the expert's first row,
    W rows from e * N. (A kernel that overwrote a row before its n-tile was computed from it once
    loaded W rows past the grid here while the model was right.)"""
    E = len(counts)
    cfg = make_config("v12", 360, 320, 128, experts=E, spec=GROUPED, pipe_depth=2)
    offs = [sum(counts[: e + 1]) for e in range(E)]
    num_ctas = 3
    loads = loads_of(monkeypatch, cfg, offs, 360, num_ctas)
    want = grouped.walk(offs, 360, cfg.blk_m, 2, cfg.l2_group_size, num_ctas)
    for cta in range(num_ctas):
        mine = [(name, c) for b, name, c in loads if b == cta]
        k_slices = cfg.k_tiles
        assert [c[1] for name, c in mine if name.startswith("A")][::k_slices] == [u.row0 for u in want[cta]]
        assert [c[1] for name, c in mine if name.startswith("B")][::k_slices] == \
            [u.expert * 320 + u.n_tile * cfg.blk_n for u in want[cta]]
    assert sum(len(w) for w in want) == sum(-(-c // cfg.blk_m) * 2 for c in counts)  # every tile ran
