"""fp8 block scales with the overlapped promotion (issue 32, ``overlap`` with ``scales="block"``): a
run's slices alternate between two accumulator sets, and each K block's scales ride in the register
set of its sums' accumulator set, loaded two slices before the promotion that reads them. CPU only:
the CUDA source (which scales each set's adds read, and when they are loaded), the SASS (the scaled
adds under the next slice's wgmmas, one load of each scale a slice, no spills) and the barrier checker."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import fp8

from .built import built

BLOCK = GemmSpec.fp8("bfloat16", "block")
QGMMA = "QGMMA.64x128x32.F32.E4M3.E4M3"
CONSUMER_REGS = 232  # setmaxnreg's budget of a consumer warpgroup at two consumers (common.role_registers)

_LOAD = re.compile(r"Sreg_ptr\[(\d+)\] = scale_[ab]_ptr\[")
_PROMOTE = re.compile(r"Freg_ptr\[0\] = \(Freg_ptr\[0\] \+ \((Dreg2?)_ptr\[0\] \* \(Sreg_ptr\[(\d+)\] \* "
                      r"Sreg_ptr\[(\d+)\]\)\)\)")
_WAIT = re.compile(r"^\s*tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_[01]\(\);")


def _events(src: str, per_slice: int) -> list[tuple]:
    """The K loop's scale loads ("load", set), promotions of sum 0 ("promote", accumulators, the
    two scale registers) and wgmma waits ("wait",), in source order."""
    out = []
    for line in src.splitlines():
        if m := _LOAD.search(line):
            out.append(("load", int(m.group(1)) // per_slice))
        elif m := _PROMOTE.search(line):
            out.append(("promote", m.group(1), int(m.group(2)), int(m.group(3))))
        elif _WAIT.search(line):
            out.append(("wait",))
    return out


def test_each_slices_scales_ride_with_its_accumulator_set():
    """At K = 1280 (10 slices: a loop over runs of 4, then a tail of 2): the first set's adds read
    the first scale set (rows 0-1, block 2), the second's the second (3-4, 5), the sets take turns;
    each scale set is loaded, then read, then loaded again (a load never overwrites scales not yet
    read), and between a load and its read at least two wgmma waits in the source (the first
    block's: one). (ptxas then sinks these read-only loads towards their use: fp8.py says what that
    costs.)"""
    cfg = make_config("v9", 512, 512, 1280, spec=BLOCK, overlap=4)
    per = fp8.BlockScales.per_slice(fp8.HopperPlan(cfg))
    assert per == 3
    events = _events(built(cfg).cuda_source(), per)
    promotions = [e for e in events if e[0] == "promote"]
    assert [p[1] for p in promotions] == ["Dreg", "Dreg2"] * 3  # a run (the loop body) and the tail
    assert all(p[2:] == ((0, 2) if p[1] == "Dreg" else (3, 5)) for p in promotions)
    for s in (0, 1):
        kinds = "".join("L" if e[0] == "load" else "P" for e in events
                        if (e[0] == "load" and e[1] == s) or (e[0] == "promote" and e[2] == per * s))
        # a set's three registers (two rows of A, one B block) loaded once before each promotion reads them
        *read, last = kinds.split("P")
        assert read and all(seg == "L" * per for seg in read) and last in ("", "L" * per), kinds
    waits_before = []
    pending = {}
    for e in events:
        if e[0] == "load":
            pending.setdefault(e[1], 0)
        elif e[0] == "wait":
            pending = {s: n + 1 for s, n in pending.items()}
        else:
            waits_before.append(pending.pop(e[2] // per))
    assert waits_before[0] == 1 and min(waits_before[1:]) >= 2, waits_before


def _adds_after_waits(text: str) -> dict[str, int]:
    """FFMAs by the wgmma wait they follow (``0x1``: the next slice's wgmmas still run; ``0x0``:
    drained), in program order."""
    counts, last = {"0x1": 0, "0x0": 0}, None
    for line in text.splitlines():
        wait = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[01])", line)
        if wait:
            last = wait.group(1)
        elif re.search(r"\bFFMA\b", line) and last is not None:
            counts[last] += 1
    return counts


@pytest.mark.parametrize("runs", [4, 2])
def test_the_scaled_adds_run_under_the_next_slices_wgmmas_without_spills(runs):
    """At 4096^3 (a whole number of runs): R - 1 slices' scaled adds (an FFMA a sum) after a wait
    that leaves the next slice's wgmmas running, one slice's after the drain, one wgmma wait a slice
    (ptxas did not serialise the wgmmas), one load of each scale a slice (three a thread) and the
    first block's before the loop, no local memory, and the registers within a consumer's budget."""
    cfg = make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=runs)
    mod = built(cfg)
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    acc = fp8.HopperPlan(cfg).acc_regs
    assert text.count(QGMMA) == 4 * runs
    assert len(re.findall(r"WARPGROUP\.DEPBAR", text)) == runs
    assert _adds_after_waits(text) == {"0x1": (runs - 1) * acc, "0x0": acc}
    assert len(re.findall(r"\bLDG\b", text)) == 3 * (runs + 1)
    assert res.local == 0 and res.stack == 0 and not re.search(r"\b(?:STL|LDL)\b", text)
    assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < CONSUMER_REGS


@pytest.mark.parametrize("K, runs", [(1280, 4), (1152, 2), (384, 8), (1008, 4)])
def test_the_barrier_checker_passes_block_scales_with_overlap(K, runs):
    """Every slot released once after its wgmmas retired: runs with a tail (10 slices of 4), an odd
    tail (9 of 2), a tile shorter than a run, and a K whose last block is cut (1008)."""
    assert check_config(make_config("v9", 512, 512, K, spec=BLOCK, overlap=runs)).ok


def test_block_scales_with_overlap_refuse_what_is_not_built_with_the_fix():
    with pytest.raises(ConfigError, match="overlap=5 with block scales: .*even number of groups"):
        make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=5)
    with pytest.raises(ConfigError, match="overlap=10 with promote=1: .*use overlap=4 with promote=1"):
        make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=10)
    with pytest.raises(ConfigError, match="stagger=True"):
        make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4, stagger=True)
    with pytest.raises(ConfigError, match="408 registers .* over the 255 a consumer may hold; use overlap=0"):
        make_config("v9", 4096, 4096, 4096, spec=BLOCK, overlap=4, blk_m=64, blk_n=256, num_warpgroups=1)
