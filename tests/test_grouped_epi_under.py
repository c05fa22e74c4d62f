"""v12 with the epilogue under the next tile (``epi_under``, issue 33) on the CPU: the combination is
accepted where built and refused by name elsewhere, the kernel builds for sm_90a without spills with
a whole tile's stmatrix between the next tile's wgmmas, the deferred store carries the place of the
tile it belongs to (never the next one's, which may be another expert's), the walk is the model's
and the protocol check passes at the grouped suite's weights. (The timing:
``benchmarks/grouped_prefill_check.py prepare --large``.)"""

from __future__ import annotations

import re

import pytest

from gemm_ladder import make_config
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.sm90a import grouped

from .grouped_loads import CHECKED_WEIGHTS, cumulative, loads_of

GROUPED = GemmSpec(grouped=True).text()
BF16 = GemmSpec(a="bfloat16", b="bfloat16", d="bfloat16", grouped=True).text()
UNDER_TILES = [dict(epi_under=True), dict(epi_under=True, epi_n=128, pipe_depth=3)]


@pytest.mark.parametrize("knobs, words", [
    (dict(swap_ab=True, blk_m=16, blk_n=128, epi_under=True), ["swap_ab=True with epi_under=True", "epi_under=False"]),
    (dict(swap_ab=True, blk_m=64, blk_n=128, epi_under=True, layout="masked"), ["swap_ab=True with epi_under"]),
    # the gated epilogue needs fp32 gate and up halves; fp8's scales run before the epilogue
    (dict(epi_under=True, spec=GemmSpec(act="silu", gated=True, grouped=True).text()),
     ["epi_under=True with a gated W_gu", "epi_under=False"]),
    (dict(epi_under=True, dtype="bfloat16", spec=GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row",
                                                          grouped=True).text()),
     ["epi_under=True is not built for fp8"]),
])
def test_refuses_epi_under_where_not_built(knobs, words):
    with pytest.raises(ConfigError) as err:
        make_config("v12", 4096, 4096, 4096, **{"experts": 8, "spec": GROUPED, **knobs})
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("tile", UNDER_TILES)
def test_accepts_epi_under_with_both_layouts(layout, tile):
    cfg = make_config("v12", 4096, 1000, 520, experts=5, spec=GROUPED, layout=layout, **tile)
    assert dict(cfg.extra)["epi_under"] is True


def _lines_of(text, pattern):
    return [i for i, line in enumerate(text.splitlines()) if re.search(pattern, line)]


@pytest.mark.parametrize("tile", [dict(), *UNDER_TILES, dict(epi_under=True, epi_n=256, pipe_depth=3)])
def test_builds_with_the_stores_under_the_next_tiles_wgmmas(built, tile):
    """The odd weight of the suite (5 x 1000x520, bf16): without spills; with ``epi_under`` some of a
    tile's stmatrix sit between the next tile's wgmma issues (without it every stmatrix follows the
    K loop's last wgmma), and the wgmmas stay asynchronous; the boundary tile's guarded stores are
    there either way."""
    b = built("v12", (1000, 1000, 520), dict(experts=5, dtype="bfloat16", spec=BF16, **tile))
    text = b.sass
    hgmma, stsm = _lines_of(text, r"\bHGMMA\."), _lines_of(text, r"\bSTSM\b")
    under = bool(tile)
    assert hgmma and stsm
    assert bool([i for i in stsm if hgmma[0] < i < hgmma[-1]]) == under, tile
    assert len(_lines_of(text, r"WARPGROUP\.DEPBAR")) < len(hgmma) / 2
    assert not _lines_of(text, r"\bLDL\b") and not _lines_of(text, r"\bSTL\b"), "spills"
    assert len(re.findall(r"\bSTG\.E\b", text)) >= b.module.cfg.blk_n // 4, "no guarded stores"
    assert _lines_of(text, r"\bUTMASTG\b")


def test_the_deferred_store_goes_to_its_own_tile(built):
    """The CUDA source: the tile's place (its first row and column) is saved beside its pairs in the
    branch of whole tiles (the one where the expert's end row is past the tile), and every TMA store
    of D reads the saved place, never the walk entry of the tile now in flight (which may be another
    expert's); the expert's last m-tile leaves at once by stores guarded by its own end row."""
    src = built("v12", (1000, 1000, 520), dict(experts=5, dtype="bfloat16", spec=BF16, epi_under=True)).module.source
    body = src[src.index("__global__ void"):]
    whole = body.index("if ((at_ptr[1] + 128) <= at_ptr[2]) {")
    saved = body.index("m_prev_ptr[0] = at_ptr[1];")
    guarded = body.index("} else {", saved)
    assert whole < saved < guarded and "n_prev_ptr[0] = at_ptr[3];" in body[whole:guarded]
    assert "< (at_ptr[2] + 64)" in body[guarded:], "the last m-tile's stores are not guarded by its end row"
    stores = [line for line in body.splitlines() if "s2g" in line]
    assert len(stores) == 2 * 4, stores  # the 4 chunks under the next tile's slices, and after the last tile
    assert all("m_prev_ptr[0]" in line and "n_prev_ptr[0]" in line and "at_ptr" not in line for line in stores)


@pytest.mark.parametrize("layout, table, M", [
    # expert 1's last tile (3 rows) follows its whole tile in the same CTA, then expert 4's tiles
    ("contiguous", cumulative((0, 259, 0, 0, 300)), 600),
    ("contiguous", cumulative((5, 0, 129, 0, 70)), 210),
    ("masked", (0, 130, 125, 128, 3), 640),
])
@pytest.mark.parametrize("tile", UNDER_TILES)
def test_the_walk_under_epi_under_is_the_models(monkeypatch, layout, table, M, tile):
    """The producer's loads with ``epi_under`` are the model's work units (the consumers' deferred
    stores do not change the walk), with tiles of different experts following each other in a CTA."""
    E = len(table)
    cfg = make_config("v12", M, 520, 128, experts=E, spec=GROUPED, layout=layout, **tile)
    loads = loads_of(monkeypatch, cfg, table, M, num_ctas=2)
    want = grouped.walk(list(table), M, cfg.blk_m, -(-520 // cfg.blk_n), cfg.l2_group_size, 2, layout=layout)
    assert any(len({u.expert for u in w}) > 1 for w in want), "no CTA runs two experts' tiles"
    for cta in range(2):
        mine = [(name, c) for b, name, c in loads if b == cta]
        assert [c[1] for name, c in mine if name.startswith("A")][::cfg.k_tiles] == [u.row0 for u in want[cta]]


@pytest.mark.parametrize("shape", CHECKED_WEIGHTS)
@pytest.mark.parametrize("tile", UNDER_TILES)
def test_epi_under_passes_the_protocol_check(shape, tile):
    """The barrier checker over the suite's weights (the odd 5 x 1000x520, DeepSeek-V3-like,
    Mixtral-like) with its routing (an empty expert, a whole tile and one row, the rest on the last)."""
    M, N, K, E = shape
    cfg = make_config("v12", M, N, K, experts=E, spec=GROUPED, warp_scan=True, **tile)
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()
