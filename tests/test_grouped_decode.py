"""The grouped GEMM's decode options (v12's ``swap_ab`` and ``warp_scan`` knobs, issue 33) on the
CPU: the warp scan's tables against thread 0's serial pass over random routing, the kernel's
walk under both options against the model as the barrier checker runs it, the protocol check,
the build for sm_90a, and what the validator refuses.

``swap_ab`` changes the tile's roles (W's rows fill wgmma's 64-row slot, an expert's few tokens
its N) and the epilogue, not the walk: the walk over (expert, token tile, n-tile) is
``grouped.walk`` with ``blk_m`` tokens a tile, so the tests hold the kernel's loads to it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from gemm_ladder import ConfigError, make_config
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.sm90a import grouped

from .grouped_loads import cumulative, loads_of

GROUPED = GemmSpec(grouped=True).text()
SWAP = dict(swap_ab=True, blk_m=16, blk_n=128, num_warpgroups=2, pipe_depth=4)


@st.composite
def counts_of(draw, most: int = 256):
    """Tokens per expert as decode routing makes them, for up to ``most`` experts: all empty, one
    expert with all, Zipf-skewed, random (past max_tokens and below zero too: the kernel clamps)."""
    E = draw(st.integers(1, most))
    kind = draw(st.sampled_from(["empty", "one", "zipf", "random"]))
    if kind == "empty":
        return [0] * E
    if kind == "one":
        counts = [0] * E
        counts[draw(st.integers(0, E - 1))] = draw(st.integers(1, 600))
        return counts
    if kind == "zipf":
        total = draw(st.integers(0, 2048))
        weights = [1 / (r + 1) ** 1.2 for r in range(E)]
        return [int(total * w / sum(weights)) for w in weights]
    return draw(st.lists(st.integers(-3, 300), min_size=E, max_size=E))


@settings(max_examples=200, deadline=None)
@given(counts=counts_of(), blk_m=st.sampled_from([8, 16, 32, 64, 128]), n_tiles=st.integers(1, 16),
       max_tokens=st.integers(1, 300), past=st.integers(0, 50))
def test_warp_scan_makes_the_serial_tables(counts, blk_m, n_tiles, max_tokens, past):
    E = len(counts)
    # contiguous: offs cumulative (and M short of the last end by ``past``: clamped), masked: counts
    offs = cumulative(max(c, 0) for c in counts)
    M = max(1, offs[-1] - past)
    assert grouped.warp_scan_tables(offs, M, blk_m, n_tiles) == grouped.tables(offs, M, blk_m, n_tiles)
    Mm = E * max_tokens
    assert grouped.warp_scan_tables(counts, Mm, blk_m, n_tiles, masked=True) == \
        grouped.masked_tables(counts, Mm, blk_m, n_tiles)


@pytest.mark.parametrize("E", [1, 31, 32, 33, 256, 1000, 1024])
def test_warp_scan_of_bad_offsets_is_the_serial_clamp(E):
    # decreasing, negative and past-M offsets: the chunked running max gives thread 0's clamp
    offs = [((e * 7919) % 600) - 50 for e in range(E)]
    assert grouped.warp_scan_tables(offs, 400, 16, 3) == grouped.tables(offs, 400, 16, 3)
    assert grouped.scan_chunk(E) * grouped.SCAN_LANES >= E


@settings(max_examples=100, deadline=None)
@given(counts=counts_of(), blk_m=st.sampled_from([8, 16, 32]), n_tiles=st.integers(1, 12),
       num_ctas=st.sampled_from([1, 7, 132]))
def test_decode_walk_covers_each_expert_token_tile_once(counts, blk_m, n_tiles, num_ctas):
    """Masked decode with swap-sized token tiles: every (expert, token tile, n-tile) of the clamped
    counts once, none for an empty expert, no tile starting past its expert's count."""
    E, max_tokens = len(counts), 64
    units = grouped.walk(counts, E * max_tokens, blk_m, n_tiles, 8, num_ctas, layout="masked")
    got = [(u.expert, u.row0, u.row_end, u.n_tile) for mine in units for u in mine]
    want = set()
    for e, c in enumerate(counts):
        rows = min(max(c, 0), max_tokens)
        for r in range(0, rows, blk_m):
            want.update((e, e * max_tokens + r, e * max_tokens + rows, n) for n in range(n_tiles))
    assert len(got) == len(set(got)) and set(got) == want


@pytest.mark.parametrize("layout, table, M", [
    ("contiguous", cumulative((0, 17, 0, 0, 3, 0, 0, 40)), 60),
    ("contiguous", cumulative((5, 0, 1) + (0,) * 40 + (9,)), 15),       # past 32 experts: two chunks a lane
    ("masked", (0, 17, 70, 3, -2, 0, 0, 32), 8 * 32),                   # a count past max_tokens, one below 0
])
@pytest.mark.parametrize("knobs", [SWAP, dict(SWAP, warp_scan=True),
                                   dict(warp_scan=True, blk_m=64, blk_n=128, num_warpgroups=1, pipe_depth=2)])
def test_the_kernels_walk_is_the_models(monkeypatch, layout, table, M, knobs):
    """The kernel's loads under swap_ab and warp_scan are the model's work units in order: A rows
    from the expert's first token, W rows from e * N (the tables made by 32 lanes or by thread 0)."""
    E = len(table)
    cfg = make_config("v12", M, 320, 128, experts=E, spec=GROUPED, layout=layout, **knobs)
    loads = loads_of(monkeypatch, cfg, table, M)
    want = grouped.walk(list(table), M, cfg.blk_m, -(-320 // cfg.blk_n), cfg.l2_group_size, 3, layout=layout)
    assert sum(len(w) for w in want) > 0
    for cta in range(3):
        mine = [(name, c) for b, name, c in loads if b == cta]
        assert [c[1] for name, c in mine if name.startswith("A")][::cfg.k_tiles] == [u.row0 for u in want[cta]]
        assert [c[1] for name, c in mine if name.startswith("B")][::cfg.k_tiles] == \
            [u.expert * 320 + u.n_tile * cfg.blk_n for u in want[cta]]


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("knobs", [dict(SWAP, warp_scan=True), dict(SWAP, blk_m=32, num_warpgroups=1, blk_n=64)])
def test_decode_presets_pass_the_protocol_check(layout, knobs):
    # the checker's own routing (grouped.checker_params): an empty expert, a boundary tile, full ones
    cfg = make_config("v12", 8 * 40, 1000, 520, experts=8, spec=GROUPED, layout=layout, **knobs)
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_swap_ab_builds_for_sm90a(built, dtype):
    spec = GemmSpec(a=dtype, b=dtype, d=dtype, grouped=True).text()
    b = built("v12", (4096, 1000, 520), dict(experts=5, dtype=dtype, spec=spec, warp_scan=True, **SWAP))
    text = b.sass
    count = {op: len(re.findall(rf"\b{op}\b", text)) for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM", "LDL", "STL")}
    assert count["UTMALDG"] and count["HGMMA"], count
    assert count["UTMASTG"] and count["STSM"], count  # a whole token tile: stmatrix.trans, TMA stores
    assert count["LDL"] == 0 and count["STL"] == 0, count
    # wgmma's N is the token tile: m64n16 (HGMMA.64x16x16)
    assert re.search(r"HGMMA\.64x16x16", text), "no m64n16 wgmma"
    # the boundary tile's guarded 2-byte stores: a consumer's 64 W rows x 16 tokens / 128 threads
    assert len(re.findall(r"\bSTG\.E\.U16\b", text)) >= 8, "no guarded stores"
    launch = b.module.extra["launch"]
    assert launch["swap_ab"] is True and launch["warp_scan"] is True


@pytest.mark.parametrize("knobs, words", [
    (dict(blk_m=32), ["blk_m=32", "swap_ab=True"]),
    (dict(swap_ab=True, blk_m=12), ["blk_m=12", "multiples of 8"]),
    (dict(swap_ab=True, blk_m=16, blk_n=64, num_warpgroups=2), ["blk_n=64", "64-row", "blk_n=128"]),
    (dict(swap_ab=True, blk_m=16, blk_n=192, num_warpgroups=3), ["num_warpgroups=3", "1 or 2"]),
    # the whole 128x256 tile staged for the transposed stores: 4 stages no longer fit
    (dict(swap_ab=True, blk_m=128, blk_n=256, num_warpgroups=2, pipe_depth=4), ["pipe_depth=4", "use pipe_depth=3"]),
])
def test_refuses_what_swap_ab_cannot_do(knobs, words):
    with pytest.raises(ConfigError) as err:
        make_config("v12", 4096, 4096, 4096, spec=GROUPED, experts=8, **knobs)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_the_default_kernel_takes_neither_option():
    cfg = make_config("v12", 4096, 4096, 4096, spec=GROUPED, experts=8)
    assert not grouped.swap_ab(cfg) and not grouped.warp_scan(cfg)
    assert "swap_ab" not in grouped.launch(cfg) and "warp_scan" not in grouped.launch(cfg)
