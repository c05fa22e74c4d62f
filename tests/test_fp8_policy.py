"""The fp8 policy (issue 32, ``plan.FP8_RULES``): its knobs validate wherever ``scaled_mm`` can be
called (N and K multiples of 16, any M), so no fp8 problem falls through to the defaults' rule
unasked, and explain names the rule and the sweep it rests on. CPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import plan


@pytest.mark.parametrize("recipe", ["tensor", "row"])
@pytest.mark.parametrize("N, K", [(4096, 7168), (3008, 1008), (48, 32), (7168, 16384), (1024, 16)])
def test_the_policys_knobs_validate_at_every_shape_scaled_mm_takes(recipe, N, K):
    spec = GemmSpec.fp8("bfloat16", recipe)
    for M in (1, 77, plan.FP8_SMALL_M, plan.FP8_SMALL_M + 1, 1000, 8192):
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        large = "fp8-wide" if plan.fp8_wide(M, N) else "fp8"
        assert choice.rule == ("fp8-small-m" if M <= plan.FP8_SMALL_M else large), (M, choice.skipped)
        assert {k: v for k, v in choice.knobs.items() if k in plan.fp8_knobs(M, N, K, recipe)} == \
            plan.fp8_knobs(M, N, K, recipe)


@pytest.mark.parametrize("N, K", [(4096, 7168), (3008, 1008), (48, 32), (7168, 16384), (1024, 16), (200, 144)])
def test_the_block_policys_knobs_validate_at_every_shape_scaled_mm_takes(N, K):
    """Block scales: overlap=4 past M = 128 and the small-M knobs with overlap=2 up to it, valid at any
    M, N and K a block call may have (K of one slice: a run's tail alone; N not a multiple of 128)."""
    spec = GemmSpec.fp8("bfloat16", "block")
    for M in (1, 77, plan.FP8_SMALL_M, plan.FP8_SMALL_M + 1, 1000, 8192):
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        small = M <= plan.FP8_SMALL_M
        assert choice.rule == ("fp8-block-small-m" if small else "fp8-block"), (M, choice.skipped)
        assert choice.knobs["overlap"] == (2 if small else 4) and choice.knobs.get("promote", 1) == 1
        assert (choice.knobs.get("blk_m"), choice.knobs.get("blk_n")) == ((64, 64) if small else (None, None))  # large: v9 fp8 128x128


def test_the_block_policy_rests_on_its_sweep_and_explain_names_it():
    """The block rules cite the block sweep's results (committed), the numbers it measured, and the
    per-tensor rules are not changed by them."""
    block = plan.rule_choice(plan.Problem(4096, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert block.rule == "fp8-block" and plan.fp8_knobs(4096, 4096, 7168, "block") == {"promote": 1, "overlap": 4,
                                                                                         "stage_scales": True}
    assert "2026-11-26_h100_fp8_block_staged_fix" in block.text() and "overlap=4" in block.text()
    assert "stage_scales" in block.text()
    for results in (plan.FP8_BLOCK_RESULTS, plan.FP8_BLOCK_STAGED_RESULTS):
        assert (Path(__file__).resolve().parents[1] / results).is_file()
    small = plan.rule_choice(plan.Problem(128, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert small.rule == "fp8-block-small-m" and "1.31x torch._scaled_mm block-wise" in small.text()
    assert plan.fp8_knobs(128, 4096, 7168, "block")["stage_scales"] is True
    assert plan.fp8_knobs(128, 4096, 7168, "tensor") == plan.FP8_SMALL_KNOBS  # no overlap at small M per-tensor
    text = plan.rule_choice(plan.Problem(4096, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8())).text()
    assert "fp8_sweep" in text and f"every {plan.FP8_PROMOTE} slice(s)" in text and "overlap=4" in text


def test_many_waves_of_per_tensor_fp8_take_192_row_tiles_over_three_consumers():
    """The wide tiles where their waves, weighed by their measured rate, use the SMs better: 8192^3 and
    larger, not 4096^3 (its sixth wave nearly empty), nor small M; per-tensor and rowwise scales, not
    block scales (they need overlap's registers); the rule cites its sweep."""
    spec = GemmSpec.fp8("bfloat16", "tensor")
    wide = plan.rule_choice(plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, spec))
    assert wide.rule == "fp8-wide" and wide.knobs["blk_m"] == 192 and wide.knobs["num_warpgroups"] == 3
    assert "2026-11-26_h100_fp8_wide" in wide.text() and (Path(__file__).resolve().parents[1] / plan.FP8_WIDE_RESULTS).is_file()
    assert plan.rule_choice(plan.Problem(4096, 4096, 4096, "bfloat16", "sm_90a", 132, spec)).rule == "fp8"
    assert plan.rule_choice(plan.Problem(16384, 16384, 4096, "bfloat16", "sm_90a", 132, spec)).rule == "fp8-wide"
    assert not plan.fp8_wide(128, 65536) and not plan.fp8_wide(4096, 4096) and not plan.fp8_wide(8192, 8192, recipe="block")
    row = plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "row"))
    assert plan.rule_choice(row).rule == "fp8-wide" and plan.rule_choice(row).knobs["blk_m"] == 192
    block = plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "block"))
    assert plan.rule_choice(block).knobs.get("blk_m") is None
    # the waves decide: 4096^3's 704 wide tiles use 6 waves of 128 SMs at 89% (128x128: 8 waves at 100%),
    # 7 waves of 112 SMs at 87% (128x128: 10 waves at 91%), and 0.87 x 1.11 > 0.91
    assert not plan.fp8_wide(4096, 4096, sms=128) and plan.fp8_wide(4096, 4096, sms=112)
