"""v12's L2 hints on the CPU (issue 33): ``l2_promo`` asks both loads' tensor maps for 256-byte L2
fills and no eviction policy, ``stream_b`` for v9's (the fills, W evict-first, A evict-last), both
off by default with the tags and cache keys of the modules without them unchanged. (The timing, and
where the policy takes them: ``benchmarks/grouped_prefill_check.py prepare --promo``.)"""

from __future__ import annotations

import re

import pytest

from gemm_ladder import ConfigError, make_config
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.kernel_ir import load

BF16 = GemmSpec(a="bfloat16", b="bfloat16", d="bfloat16", grouped=True).text()
SWAP64 = dict(swap_ab=True, blk_m=64, blk_n=128, num_warpgroups=2, pipe_depth=8, warp_scan=True)
DEEPSEEK = (4096, 2048, 7168)  # the weight (256 experts) the promotion was measured on first


def _config(**knobs):
    return make_config("v12", *DEEPSEEK, experts=256, dtype="bfloat16", spec=BF16, **knobs)


@pytest.mark.parametrize("tile", [SWAP64, {}, dict(SWAP64, cluster_m=2)], ids=["swap64", "128x256", "swap64_c2x1"])
@pytest.mark.parametrize("hints, fill", [(dict(l2_promo=True), 3), (dict(stream_b=True), 3), ({}, 2),
                                         (dict(l2_promo=False), 2)])
def test_the_loads_tensor_maps_fetch_what_the_knob_asks(tile, hints, fill):
    """CUtensorMapL2promotion of A's and B's maps: 3 (256 bytes) with either knob, TVM's 2 (128)
    without; the store's map is the same either way."""
    maps = load(_config(**tile, **hints)).tensormaps
    assert {n: t.l2_promotion for n, t in maps.items()} == {"A_tensormap": fill, "B_tensormap": fill,
                                                             "D_tensormap": 2}


def test_off_keeps_the_tags_and_on_changes_them():
    plain = _config(**SWAP64)
    assert _config(**SWAP64, l2_promo=False).tag() == plain.tag()
    assert "promo" not in plain.tag() and _config(**SWAP64, l2_promo=True).tag() != plain.tag()


def test_the_promotion_alone_sets_no_eviction_policy(built):
    """The SASS of the loads: with l2_promo no UTMALDG carries a cache-policy descriptor (``desc[``),
    with stream_b every one does."""
    shape = (1000, 1000, 520)
    for knobs, hinted in ((dict(l2_promo=True), False), (dict(stream_b=True), True)):
        b = built("v12", shape, dict(experts=5, dtype="bfloat16", spec=BF16, **SWAP64, **knobs))
        loads = [line for line in b.sass.splitlines() if re.search(r"\bUTMALDG\b", line)]
        with_policy = [line for line in loads if "desc[" in line]
        assert loads and (len(with_policy) == len(loads) if hinted else not with_policy), (knobs, with_policy[:2])


def test_both_hints_at_once_are_refused_by_name():
    with pytest.raises(ConfigError, match="stream_b's loads already ask for the 256-byte L2 fills"):
        _config(**SWAP64, l2_promo=True, stream_b=True)
