"""fp8 with the previous tile's epilogue under the next tile (issue 32, v9's ``epi_under`` with a
promotion): the tile's sums are scaled and rounded into 16-bit pairs once its K loop ends, and its
chunks leave while the next tile's first promotion group runs (with ``halves``, each half's columns
under that half's wgmmas). CPU only: the SASS (the stores sit between the first group's wgmma issue and
its drain, the wgmmas are not serialised, no spills), the barrier checker, and validation."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config

from .built import built_sass

HALVES = {"blk_n": 256, "halves": True, "promote": 2}
WIDE = {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1, "cluster_n": 2, "promote": 1}
BLOCK = {"blk_n": 256, "halves": True, "promote": 1}  # block scales: each half one B block, promoted every slice


def _cfg(recipe="tensor", M=4096, N=4096, K=4096, **knobs):
    return make_config("v9", M, N, K, spec=GemmSpec.fp8("bfloat16", recipe), **knobs)


def _events(text: str) -> list[str]:
    """The SASS's wgmma issues (``Q``), wgmma waits (``W0``/``W1``), stmatrix stores (``S``) and TMA
    stores (``T``), in program order."""
    out = []
    for line in text.splitlines():
        if "QGMMA" in line:
            out.append("Q")
        elif m := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([01])", line):
            out.append("W" + m.group(1))
        elif re.search(r"\bSTSM\b", line):
            out.append("S")
        elif "UTMASTG" in line:
            out.append("T")
    return out


@pytest.mark.parametrize("recipe, knobs, wgmmas, parts", [("tensor", HALVES, 8, 2), ("row", HALVES, 8, 2),
                                                          ("tensor", WIDE, 4, 1), ("block", BLOCK, 4, 2)])
def test_the_previous_tile_leaves_while_the_first_groups_wgmmas_run(recipe, knobs, wgmmas, parts):
    """Each part's stores (two 64-column chunks of a half, or a 192x128 tile's two chunks) follow that
    part's wgmma issues and come before the wait that drains them (block scales: under the halves of
    the first of the two slices the loop peels); the last tile's four (two) chunks follow the loop. ptxas keeps the wgmmas in flight (as many waits as without ``epi_under``, not one a
    wgmma: a first group whose sums were copied into the total ran out of registers and serialised
    them), with no spills."""
    text, res = built_sass(_cfg(recipe, **knobs, epi_under=True))
    plain, _ = built_sass(_cfg(recipe, **knobs))
    ev = "".join(_events(text))
    # the first group, peeled: each part's wgmmas, its chunks' stmatrix and TMA stores, then the drain
    under = ("Q" * wgmmas + "(?:W1)?" + "(?:S+T){2}" + "W0") * parts
    assert re.search(under, ev), ev
    waits = [e for e in _events(text) if e.startswith("W")]
    plain_waits = [e for e in _events(plain) if e.startswith("W")]
    assert len(waits) == 2 * len(plain_waits) and text.count("QGMMA") == 2 * plain.count("QGMMA")
    assert res.local == 0 and res.stack == 0
    assert not re.search(under, "".join(_events(plain)))  # without the knob every store follows the K loop


@pytest.mark.parametrize("K, recipe, knobs", [(1280, "tensor", HALVES), (384, "tensor", {**HALVES, "promote": 4}),
                                              (512, "row", {**HALVES, "cluster_m": 1, "cluster_n": 2}),
                                              (1280, "tensor", WIDE), (640, "tensor", {"promote": 1}),
                                              (1280, "block", BLOCK), (384, "block", BLOCK), (128, "block", BLOCK)])
def test_the_barrier_checker_passes_fp8_with_the_epilogue_under(K, recipe, knobs):
    """Tiles of several groups and a tail group, a tile shorter than a group (K = 384 in groups of 4), a 1x2
    cluster with row scales, three consumers, 128x128, block scales in halves (an even, an odd and a
    one-slice K): every slot released once, every staging buffer rewritten only after its store left it."""
    assert check_config(_cfg(recipe, 512, 512, K, **knobs, epi_under=True)).ok


@pytest.mark.parametrize("knobs, words", [
    ({"promote": 0}, "epi_under=True with fp8 and promote=0"),
    ({"overlap": 4}, "epi_under=True with overlap=4"),
    ({**HALVES, "stagger": True}, "stagger=True: built for one accumulator set"),
    ({**HALVES, "epi_n": 256, "pipe_depth": 3}, "epi_under=True with halves and epi_n=256.*use epi_n=64"),
])
def test_fp8_with_the_epilogue_under_refuses_what_is_not_built(knobs, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(**knobs, epi_under=True)


def test_block_scales_with_the_epilogue_under_need_the_halves():
    with pytest.raises(ConfigError, match="epi_under=True with block scales is built in halves only.*or epi_under=False"):
        _cfg("block", promote=1, overlap=0, epi_under=True)


def test_the_epilogue_under_with_fp8_is_v9s_only():
    """v12's grouped fp8 K loop has no run_under: with the knob it would round sums it never promoted."""
    spec = GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row", grouped=True).text()
    with pytest.raises(ConfigError, match="epi_under=True is not built for fp8 on v12.*use epi_under=False"):
        make_config("v12", 4096, 4096, 4096, experts=8, spec=spec, epi_under=True, dtype="bfloat16")
