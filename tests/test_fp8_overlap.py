"""fp8's overlapped promotion (issue 32, knob ``overlap``): two accumulator sets in turn, each group's
fp32 adds issued while the next group's e4m3 wgmmas run. CPU only: the SASS (the adds sit between a
wgmma issue and the wait for it, no spills, no serialised wgmmas), the barrier checker, validation,
and how a tile's slices are cut into runs."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import fp8
from gemm_ladder.sm90a.mainloop import promotion_cuts

from .built import built_sass

QGMMA = "QGMMA.64x128x32.F32.E4M3.E4M3"


def _adds_after_waits(text: str) -> dict[str, int]:
    """FADDs by the wgmma wait they follow (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: a group still runs;
    ``0x0``: the tensor cores have drained), in program order."""
    counts, last = {"0x1": 0, "0x0": 0}, None
    for line in text.splitlines():
        wait = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[01])", line)
        if wait:
            last = wait.group(1)
        elif re.search(r"\bFADD\b", line) and last is not None:
            counts[last] += 1
    return counts


@pytest.mark.parametrize("knobs", [{"overlap": 4}, {"overlap": 2, "promote": 2}])
def test_the_adds_run_between_the_next_groups_wgmma_issue_and_its_wait(knobs):
    """With ``overlap=R`` a run of R groups has R - 1 adds under a wgmma group that still runs (after a
    ``wait_group(1)``) and one after the drain (``wait_group(0)``); without it every add follows a
    drain. No spills, and one wgmma wait a slice (ptxas did not serialise the wgmmas)."""
    spec = GemmSpec.fp8("bfloat16", "tensor")
    over = make_config("v9", 4096, 4096, 4096, spec=spec, **knobs)
    base = make_config("v9", 4096, 4096, 4096, spec=spec)
    t_over, r_over = built_sass(over)
    t_base, r_base = built_sass(base)
    runs = knobs["overlap"]
    slices = runs * knobs.get("promote", 1)
    assert t_over.count(QGMMA) == 4 * slices and t_base.count(QGMMA) == 4  # k32 x 4 = 128 of K a slice
    assert len(re.findall(r"WARPGROUP\.DEPBAR", t_over)) == slices  # one wait a slice, not one a wgmma
    acc = fp8.HopperPlan(over).acc_regs
    assert _adds_after_waits(t_over) == {"0x1": (runs - 1) * acc, "0x0": acc}
    assert _adds_after_waits(t_base) == {"0x1": 0, "0x0": acc}
    assert r_over.local == 0 and r_over.stack == 0 and r_base.local == 0 and r_base.stack == 0


def test_the_promotion_adds_in_place_without_copies():
    """The total starts at 0 and each group adds into it: ptxas keeps it in its own registers (with
    ``total = acc`` on a tile's first group it summed into the accumulators and copied back: 64 MOVs a
    slice), so the promoted K loop has no more moves than the unpromoted one beside its adds."""
    spec = GemmSpec.fp8("bfloat16", "tensor")
    on, _ = built_sass(make_config("v9", 4096, 4096, 4096, spec=spec, promote=1))
    off, _ = built_sass(make_config("v9", 4096, 4096, 4096, spec=spec, promote=0))
    moves = [len(re.findall(r"\b(?:IMAD\.)?MOV(?:\.U32)?\b", t)) for t in (on, off)]
    assert moves[0] < moves[1] + 32, moves


@pytest.mark.parametrize("K, knobs", [(1280, {"overlap": 4}), (1280, {"overlap": 2, "promote": 2}),
                                      (512, {"overlap": 8})])
def test_the_barrier_checker_passes_the_overlapped_promotion(K, knobs):
    """Every slot is released once, after its wgmmas retired, with runs that do not divide K
    (10 slices: two runs of 4 and a tail of 2; 5 groups of 2: a tail group of 1) and a tile shorter
    than one run."""
    assert check_config(make_config("v9", 512, 512, K, spec=GemmSpec.fp8(), **knobs)).ok


def test_a_tiles_slices_are_cut_into_whole_runs_and_a_tail():
    assert promotion_cuts(32, 1, 4, False) == ([], 8, [1, 1, 1, 1], [])
    assert promotion_cuts(10, 1, 4, False) == ([], 2, [1, 1, 1, 1], [1, 1])
    assert promotion_cuts(9, 2, 2, False) == ([], 2, [2, 2], [1])
    assert promotion_cuts(3, 1, 8, False) == ([], 0, [1] * 8, [1, 1, 1])
    assert promotion_cuts(32, 4, 0, False) == ([], 8, [4], [])  # drained a group: a run is one group
    # staggered: half a group, or half a run, first; a tile no longer than that is not staggered
    assert promotion_cuts(32, 4, 0, True) == ([2], 7, [4], [2])
    assert promotion_cuts(32, 1, 4, True) == ([1, 1], 7, [1, 1, 1, 1], [1, 1])
    assert promotion_cuts(2, 4, 0, True) == ([], 0, [4], [2])


@pytest.mark.parametrize("knobs", [{"promote": 4, "stagger": True}, {"overlap": 4, "stagger": True}])
def test_staggered_consumers_cut_their_groups_half_a_group_apart(knobs):
    """Both cuts are in the kernel (the consumer's parity picks one at run time): the odd consumer's
    has its half group (or half run) first and a shorter last, and every slot is still released once."""
    cfg = make_config("v9", 512, 512, 2048, spec=GemmSpec.fp8(), **knobs)
    text, res = built_sass(cfg)
    plain, _ = built_sass(make_config("v9", 512, 512, 2048, spec=GemmSpec.fp8(), **{**knobs, "stagger": False}))
    # the odd cut beside the even one: a loop turn (a group of 4, or a run of 4 groups of 1), and
    # half a group and the rest of the last (or two groups and two), 4 k32 wgmmas a slice
    assert text.count(QGMMA) == plain.count(QGMMA) + 4 * (4 + 2 + 2)
    assert res.stack == 0 and res.local == 0
    assert check_config(cfg).ok


@pytest.mark.parametrize("knobs, words", [
    ({"overlap": 1}, "overlap=1: .* use overlap=4"),
    ({"overlap": 4, "promote": 0}, "no promotion to overlap; use promote=1"),
    ({"overlap": 4, "promote": 2}, "use overlap=4 with promote=1, or overlap=2 with promote=2"),
    ({"overlap": 4, "blk_n": 192}, r"312 registers .* over the 232 a consumer may hold; use overlap=0"),
])
def test_overlaps_that_do_not_build_are_refused_with_the_fix(knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), **knobs)


@pytest.mark.parametrize("knobs, words", [
    ({"stagger": True}, "promote=1, overlap=0: a drain every slice has no half"),
    ({"stagger": True, "promote": 4, "blk_m": 64, "num_warpgroups": 1}, "num_warpgroups=1"),
])
def test_staggers_that_do_not_build_are_refused_with_the_fix(knobs, words):
    with pytest.raises(ConfigError, match=words + ".*use stagger=False, or promote=4"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), **knobs)


def test_block_scales_refuse_an_odd_overlap_and_16bit_kernels_do_not_take_it():
    with pytest.raises(ConfigError, match="overlap=3 with block scales: .*an even number of groups.*use overlap=4"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(scales="block"), overlap=3)
    assert make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(scales="block"), overlap=4).knobs()["overlap"] == 4
    with pytest.raises(ConfigError, match="overlap: fp8 specs only"):
        make_config("v9", 4096, 4096, 4096, overlap=2)
    assert make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8()).knobs()["overlap"] == 0  # the old path


@pytest.mark.parametrize("cluster", [{}, {"cluster_m": 1, "cluster_n": 2}])
def test_a_192_row_tile_over_three_consumers_holds_the_promotion_without_spills(cluster):
    """Three consumers of 64 rows each (192x128 tiles: the per-tensor policy's ``fp8-wide`` in 1x2
    clusters) keep their 64 accumulators and 64 promoted sums a thread in the 152 registers each may
    hold: no spills, four k32 wgmmas and one wait a slice, and the adds after it; the barrier checker
    passes the three consumers' protocol."""
    cfg = make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), blk_m=192, num_warpgroups=3, promote=1, **cluster)
    text, res = built_sass(cfg)
    assert text.count(QGMMA) == 4 and len(re.findall(r"WARPGROUP\.DEPBAR", text)) == 1
    assert _adds_after_waits(text) == {"0x1": 0, "0x0": fp8.HopperPlan(cfg).acc_regs}
    assert res.stack == 0 and res.local == 0
    assert check_config(cfg).ok
