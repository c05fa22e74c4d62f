"""fp8's promotion in halves (issue 32, knob ``halves``): a 128x256 tile whose promotion fits a
consumer's registers, each group's wgmmas issued as two 128-wide groups into one 64-register set. CPU
only: which total registers a half's sums go to, the SASS (two half-width wgmma groups a slice, each
drained and added, no spills), the barrier checker, and validation."""

from __future__ import annotations

import re

import pytest

import layouts
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import fp8

from .built import built_sass

HALF_QGMMA = "QGMMA.64x128x32.F32.E4M3.E4M3"


def _cfg(K=4096, recipe="tensor", **knobs):
    return make_config("v9", 4096, 4096, K, spec=GemmSpec.fp8("bfloat16", recipe),
                       **{"blk_n": 256, "halves": True, **knobs})


@pytest.mark.parametrize("blk_n", [256, 128])
def test_a_halfs_sums_are_the_columns_of_its_registers_in_the_total(blk_n):
    """Half h's accumulator r holds the column that the whole tile's fragment keeps in register
    h * blk_n/4 + r (what the promotion adds it into), for every lane; and half 1's B rows start
    blk_n/2 rows (of 128 bytes) into the slot."""
    cfg = make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), blk_n=blk_n, halves=True)
    half = fp8.HalfPlan(cfg)
    full = fp8.HopperPlan(cfg)
    assert half.n_cols == blk_n // 2 and half.acc_regs == full.acc_regs // 2
    assert f"m64n{blk_n // 2}k32" in half.mma_op
    for lane in range(32):
        for h in range(2):
            for r in range(half.n_regs):
                row, col = layouts.acc_fragment_coord(r, 0, lane)
                whole = layouts.acc_fragment_coord(h * half.n_regs + r, 0, lane)
                assert whole == (row, col + h * blk_n // 2)
    assert half.b_offset16 == blk_n // 2 * 128 // 16


@pytest.mark.parametrize("recipe, slices", [("tensor", 1), ("block", 2)])
def test_each_half_is_drained_and_added_before_the_other_is_issued(recipe, slices):
    """A slice is two groups of four 64x128x32 e4m3 wgmmas, each followed by a drain and its 64 adds
    (block: fused multiply-adds by the scales) of a thread, with no spills (the 128 sums, 64
    accumulators and loop state within a consumer's registers). The block loop runs two slices a
    turn (their scales in two register sets)."""
    text, res = built_sass(_cfg(recipe=recipe))
    assert text.count(HALF_QGMMA) == 8 * slices
    assert "QGMMA.64x256" not in text
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[01])", text)
    assert waits == ["0x0"] * 2 * slices
    # the adds of each half follow its drain
    op = r"\bFADD\b" if recipe == "tensor" else r"\bFFMA\b"
    after, last = [0] * 2 * slices, -1
    for line in text.splitlines():
        if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", line):
            last += 1
        elif last >= 0 and re.search(op, line):
            after[last] += 1
    assert min(after) >= 64, after
    assert res.local == 0 and res.stack == 0


@pytest.mark.parametrize("K, recipe, knobs", [(1280, "tensor", {}), (1280, "tensor", {"promote": 4}),
                                              (384, "tensor", {"promote": 4}),
                                              (512, "tensor", {"cluster_m": 1, "cluster_n": 2}),
                                              (1280, "tensor", {"promote": 2, "stagger": True}),
                                              (1280, "block", {})])
def test_the_barrier_checker_passes_the_promotion_in_halves(K, recipe, knobs):
    """Every slot is released once, after both halves' wgmmas retired: groups that divide K, a tail
    group (10 slices in groups of 4), a tile shorter than a group, a 1x2 cluster, staggered consumers
    (the odd one's half group first), block scales."""
    cfg = make_config("v9", 512, 512, K, spec=GemmSpec.fp8("bfloat16", recipe), blk_n=256, halves=True, **knobs)
    assert check_config(cfg).ok


@pytest.mark.parametrize("knobs, words", [
    ({"promote": 0}, "halves=True with promote=0: .* use halves=True with promote=1"),
    ({"overlap": 4}, "halves=True with overlap=4"),
    ({"halves": 1}, "halves=1 is an int, not a bool"),
])
def test_halves_that_do_not_build_are_refused_with_the_fix(knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), **{"blk_n": 256, "halves": True, **knobs})


def test_block_scales_in_halves_need_one_b_block_a_half():
    with pytest.raises(ConfigError, match="halves=True with block scales and blk_n=128"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8("bfloat16", "block"), blk_n=128, halves=True)


def test_halves_off_leaves_the_module_as_it_was():
    """``halves`` is an optional knob: off, it is not in the config (tags and cache keys of existing
    modules are unchanged); 128x256 without it still refuses the promotion's registers."""
    plain = make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8())
    assert "halves" not in dict(plain.extra)
    assert make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), halves=False) == plain
    with pytest.raises(ConfigError, match="use blk_n=128"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), blk_n=256)


def test_halves_on_a_16_bit_tile_is_refused():
    with pytest.raises(ConfigError, match="halves=True with a 16-bit spec"):
        make_config("v9", 4096, 4096, 4096, dtype="bfloat16", halves=True)


def test_a_packs_halves_module_with_a_bias_has_a_file_name_the_file_system_takes():
    """Its knobs spelt out make a ~270-character tag, past the 255 bytes of a file name (the first pack
    build of one failed with "File name too long"): the stem keeps the tag's start and a digest of the
    whole, within what the module and its manifest (".so.json") may take; distinct configs keep distinct
    names, short tags stay as they are."""
    from gemm_ladder.compile.batch import BuildJob
    from gemm_ladder.core import files
    from gemm_ladder.serve.kernel_pack import _name

    knobs = {"blk_n": 256, "halves": True, "promote": 2, "dynamic_m": True,
             "spec": GemmSpec.fp8("bfloat16", "tensor", "bfloat16")}
    tag = make_config("v9", 256, 3008, 1024, **knobs).tag()
    assert len(tag) > files.NAME_MAX - len(".so.json")
    stem = _name(BuildJob("v9", (256, 3008, 1024), knobs), True)
    assert len((stem + ".so.json").encode()) <= files.NAME_MAX and stem.startswith("v9_anyMx3008x1024")
    other = _name(BuildJob("v9", (256, 3008, 1024), {**knobs, "promote": 1}), True)
    assert other != stem
    plain = make_config("v9", 256, 3008, 1024).tag()
    assert files.module_stem(plain) == plain
