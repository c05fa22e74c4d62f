"""The small-M candidate sets of ``benchmarks/epilogue_check.py`` (``prepare --set stream_small``, ``swap_pairs``,
``swap_wide``, ``swap_wide_moved``, ``fill_tiles``, ``swap_mid``, ``swap_mid_moved``): on the CPU, that each builds
what its run says it timed. The runs themselves are ``benchmarks/results/2026-11-29_h200_{stream_small,swap_pairs,
swap_wide,swap_wide_moved,fill_tiles,swap_mid,swap_mid_moved}/``."""

from __future__ import annotations

import pytest

from gemm_ladder.core.spec import spec_for
from gemm_ladder.serve import plan

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def check():
    return benchmark_script("epilogue_check")


def _groups(check, which: str) -> list[list[dict]]:
    return check.time_groups(check.cases_of(which))


def test_stream_small_sets_each_policy_module_beside_v10_stream_k_in_64_row_tiles(check):
    groups = _groups(check, "stream_small")
    assert len(groups) == 50
    for group in groups:
        assert group[0]["variant"] == "now" and "rung" not in group[0]
        for case in group[1:]:
            k = case["knobs"]
            assert case["rung"] == "v10" and case["variant"] in check.STREAM_SMALL_CANDIDATES
            assert (k["blk_m"], k["split_k"], k["stream_k"], k["pdl"]) == (64, 1, True, True)
            M, N, K = case["shape"]
            p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", case["epilogue"]))
            assert plan._validate("v10", p, k) is None  # pylint: disable=protected-access


def test_swap_pairs_sets_the_policy_beside_its_knobs_in_a_1x2_cluster(check):
    groups = _groups(check, "swap_pairs")
    assert len(groups) == 38
    for group in groups:
        assert [(c["variant"], c["knobs"]) for c in group] == [("now", {}), ("c1x2", {"cluster_n": 2})]
        assert 16 <= group[0]["shape"][0] <= 64


def test_swap_wide_sets_192_and_256_rows_of_n_at_m_16_or_less(check):
    for group in _groups(check, "swap_wide"):
        M, N, K = group[0]["shape"]
        assert M <= 16 and group[0]["variant"] == "now"
        widths = {c["knobs"]["blk_n"] for c in group[1:]}
        assert widths <= {192, 256} and all(c["rung"] == "v11" and c["knobs"]["blk_m"] == plan.swap_blk_m(M)
                                            for c in group[1:])


def test_swap_wide_moved_pairs_the_rule_with_the_policy_without_it(check):
    """Each shape the set lists is one the rule takes now, and the policy without it chose another module."""
    groups = _groups(check, "swap_wide_moved")
    assert groups
    for group in groups:
        assert [c["variant"] for c in group] == ["now", "no_swap192"]
        M, N, K = group[0]["shape"]
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", group[0]["epilogue"]))
        assert plan.choose(p).rule == "swap-ab-192"
        assert check.split_choice(p, "no_swap192").rule != "swap-ab-192"


def test_fill_tiles_sets_the_policy_beside_each_tile_the_validator_takes(check):
    """``--set fill_tiles`` (``../2026-11-29_h200_fill_tiles/``): the suite's weights at M = 64, 128, 512 with
    bias+GELU and FILL_TILE_PLAIN without; each candidate valid for its problem, k_consumers' ring shallow enough
    for the second consumer's hand-over."""
    groups = _groups(check, "fill_tiles")
    assert len(groups) == 5 * 3 + len(check.FILL_TILE_PLAIN)
    for group in groups:
        assert group[0]["variant"] == "now"
        for case in group[1:]:
            name = case["variant"].removesuffix("_deep")
            rung, base = check.FILL_TILE_CANDIDATES[name]
            k = case["knobs"]
            assert case["rung"] == rung and all(k[key] == v for key, v in base.items() if key != "cluster_m")
            M, N, K = case["shape"]
            p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", case["epilogue"]))
            assert plan._validate(rung, p, k) is None  # pylint: disable=protected-access


def test_swap_mid_sets_v11_tiles_whose_blk_m_covers_m_in_few_tiles(check):
    """``--set swap_mid``: each candidate's blk_m is the fewest multiple of 8 covering M in its tile count, its
    grid fills 60-100% of one wave (or unsplit 2-4 waves, the last 85% full)."""
    groups = _groups(check, "swap_mid")
    assert len(groups) == len(check.SWAP_MID_PLAIN) + len(check.SWAP_MID_FUSED)
    for group in groups:
        M, N, K = group[0]["shape"]
        assert group[0]["variant"] == "now"
        for case in group[1:]:
            k = case["knobs"]
            tiles = -(-M // k["blk_m"])
            assert case["rung"] == "v11" and k["blk_m"] % 8 == 0 and k["blk_m"] == -(-M // (8 * tiles)) * 8
            assert k["blk_n"] == 64 * k["num_warpgroups"] or (k["blk_n"], k["num_warpgroups"]) == (192, 1)
            units = tiles * -(-N // k["blk_n"]) * k["split_k"]
            assert 0.6 * 132 <= units <= 132 or (k["split_k"] == 1 and units / 132 % 1 >= 0.85 and units <= 4 * 132)
            assert k["cluster_m"] == 1 or tiles % 2 == 0


def test_swap_mid_moved_pairs_the_rule_with_the_policy_without_it(check):
    """``--set swap_mid_moved``: each shape the rule takes, beside the policy without it. The run timed 70 pairs, the
    rule as first written; the six at M = 256 it has since left to the mid-tiles rules (their pairs are why) the set
    no longer lists, and the rule widened since takes 36 more of its shapes (timed in ``swap_mid_more``)."""
    groups = _groups(check, "swap_mid_moved")
    assert len(groups) == 100
    for group in groups:
        assert [c["variant"] for c in group] == ["now", "no_swap_mid"]
        M, N, K = group[0]["shape"]
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", group[0]["epilogue"]))
        assert plan.choose(p).rule == "swap-ab-mid" and check.split_choice(p, "no_swap_mid").rule != "swap-ab-mid"
