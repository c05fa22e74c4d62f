"""The masked layout of the grouped GEMM (v12 with ``layout="masked"``) on the CPU: the walk's
model against a per-expert reference over random counts, the kernel's loads against the model
(through the barrier checker, which also checks the protocol), the knob's refusals, and the build
for sm_90a.

Masked: A ``[E, max_tokens, K]`` viewed ``[E * max_tokens, K]``, ``counts [E]`` on the device;
expert e's rows are ``e * max_tokens + [0, counts[e])``, the count clamped into [0, max_tokens]
on the device (DeepGEMM's masked layout, what decode under CUDA graphs uses).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from gemm_ladder import ConfigError, make_config
from gemm_ladder.protocol.check import check_config
from gemm_ladder.sm90a import grouped

from .grouped_loads import loads_of


def reference_units(counts, max_tokens, blk_m, n_tiles):
    """Every (expert, first row, end row, n-tile) a masked grouped GEMM must compute: expert e's
    first min(count, max_tokens) rows of its slot, cut into blk_m-row tiles, each with every n-tile."""
    out = set()
    for e, c in enumerate(counts):
        start, rows = e * max_tokens, min(max(c, 0), max_tokens)
        for row0 in range(start, start + rows, blk_m):
            out.update((e, row0, start + rows, n) for n in range(n_tiles))
    return out


@st.composite
def masked_routing(draw):
    """(counts, max_tokens) as decode makes them: all empty, one expert full, Zipf-skewed, random
    counts (not multiples of the tile), counts past max_tokens (clamped), up to 256 experts."""
    E = draw(st.integers(1, 256))
    max_tokens = draw(st.sampled_from([1, 7, 64, 128, 129, 256, 300]))
    kind = draw(st.sampled_from(["empty", "one_full", "zipf", "random", "over"]))
    if kind == "empty":
        counts = [0] * E
    elif kind == "one_full":
        counts = [0] * E
        counts[draw(st.integers(0, E - 1))] = max_tokens
    elif kind == "zipf":
        total = draw(st.integers(0, max_tokens * E))
        weights = [1 / (r + 1) ** 1.2 for r in range(E)]
        counts = [min(max_tokens, int(total * w / sum(weights))) for w in weights]
    elif kind == "over":
        counts = draw(st.lists(st.integers(-3, 2 * max_tokens + 5), min_size=E, max_size=E))
    else:
        counts = draw(st.lists(st.integers(0, max_tokens), min_size=E, max_size=E))
    return counts, max_tokens


@settings(max_examples=150, deadline=None)
@given(routing=masked_routing(), blk_m=st.sampled_from([64, 128, 192]), n_tiles=st.integers(1, 9),
       group=st.sampled_from([1, 3, 8]), num_ctas=st.sampled_from([1, 7, 132]))
def test_masked_walk_covers_every_expert_tile_once(routing, blk_m, n_tiles, group, num_ctas):
    counts, max_tokens = routing
    M = len(counts) * max_tokens
    units = grouped.walk(counts, M, blk_m, n_tiles, group, num_ctas, layout="masked")
    got = [(u.expert, u.row0, u.row_end, u.n_tile) for mine in units for u in mine]
    assert len(got) == len(set(got))
    assert set(got) == reference_units(counts, max_tokens, blk_m, n_tiles)
    per_cta = [len(mine) for mine in units]
    assert max(per_cta) - min(per_cta) <= 1
    # no tile starts outside its expert's slot, and no row an expert may write is past its slot
    for mine in units:
        for u in mine:
            assert u.expert * max_tokens <= u.row0 < u.row_end <= (u.expert + 1) * max_tokens


def test_masked_tables_clamp_counts_into_the_slot():
    # max_tokens 100: a negative count is 0, 250 is 100 (never the next expert's rows)
    ends, tile_end = grouped.masked_tables([-4, 250, 37, 0], 400, 64, 2)
    assert ends == [0, 200, 237, 300]
    assert tile_end == [0, 4, 6, 6]


def test_empty_experts_cost_nothing():
    units = grouped.walk([0] * 256, 256 * 64, 128, 4, 8, 132, layout="masked")
    assert not any(units)


def test_masked_layout_knob_refusals():
    with pytest.raises(ConfigError, match="layout='ragged'"):
        make_config("v12", 4096, 4096, 4096, experts=8, layout="ragged")
    with pytest.raises(ConfigError, match="max_tokens"):
        make_config("v12", 4, 4096, 4096, experts=8, layout="masked")


@pytest.mark.parametrize("counts, max_tokens", [
    ((0, 129, 0, 0, 0, 0, 0, 45), 130),        # an empty expert, a tile and a row, a short last one
    ((300, 0, 1, 59, 0, 0, 0, 0), 90),         # a count past max_tokens (clamped to 90)
    ((0,) * 7 + (360,), 360),                   # one expert full
    ((0,) * 300 + (5,), 3),                     # more experts than threads, count clamped to 3
])
def test_the_masked_kernels_walk_is_the_models(monkeypatch, counts, max_tokens):
    """The producer's TMA loads, as the barrier checker runs every CTA of a launch: A rows from
    e * max_tokens, W rows from e * N, in the model's order; and the run finds no protocol fault."""
    E = len(counts)
    M = E * max_tokens
    cfg = make_config("v12", M, 320, 128, experts=E, layout="masked", pipe_depth=2)
    num_ctas = 3
    loads = loads_of(monkeypatch, cfg, counts, M, num_ctas)
    want = grouped.walk(list(counts), M, cfg.blk_m, 2, cfg.l2_group_size, num_ctas, layout="masked")
    for cta in range(num_ctas):
        mine = [(name, c) for b, name, c in loads if b == cta]
        assert [c[1] for name, c in mine if name.startswith("A")][::cfg.k_tiles] == [u.row0 for u in want[cta]]
        assert [c[1] for name, c in mine if name.startswith("B")][::cfg.k_tiles] == \
            [u.expert * 320 + u.n_tile * cfg.blk_n for u in want[cta]]
    clamped = [min(max(c, 0), max_tokens) for c in counts]
    assert sum(len(w) for w in want) == sum(-(-c // cfg.blk_m) * 2 for c in clamped)


@pytest.mark.parametrize("knobs", [dict(), dict(num_warpgroups=1, blk_m=64, blk_n=128)])
def test_masked_preset_passes_the_protocol_check(knobs):
    # the checker's own routing (grouped.checker_params): empty, a boundary tile, a clamped count, full
    cfg = make_config("v12", 8 * 300, 1000, 520, experts=8, layout="masked", **knobs)
    assert grouped.checker_params(cfg)["offsets"] == [0, cfg.blk_m + 1, 305, 0, 0, 0, 0, 300]
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_masked_builds_for_sm90a_with_guarded_stores_and_no_spills(built, dtype):
    b = built("v12", (8 * 128, 1000, 520), dict(experts=8, dtype=dtype, layout="masked"))
    text = b.sass
    count = {op: len(re.findall(rf"\b{op}\b", text)) for op in ("UTMALDG", "UTMASTG", "HGMMA", "LDL", "STL")}
    assert count["UTMALDG"] and count["UTMASTG"] and count["HGMMA"], count
    assert count["LDL"] == 0 and count["STL"] == 0, count
    assert len(re.findall(r"\bSTG\.E\b", text)) >= b.module.cfg.blk_n // 4, "no guarded stores"
    assert dict(b.module.cfg.extra)["layout"] == "masked"
