"""The fp8 policy (issue 32, ``plan.FP8_RULES``): its knobs validate wherever ``scaled_mm`` can be
called (N and K multiples of 16, any M), so no fp8 problem falls through to the defaults' rule
unasked, and explain names the rule and the sweep it rests on. CPU only."""

from __future__ import annotations

import pytest

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import plan


@pytest.mark.parametrize("recipe", ["tensor", "row"])
@pytest.mark.parametrize("N, K", [(4096, 7168), (3008, 1008), (48, 32), (7168, 16384), (1024, 16)])
def test_the_policys_knobs_validate_at_every_shape_scaled_mm_takes(recipe, N, K):
    spec = GemmSpec.fp8("bfloat16", recipe)
    for M in (1, 77, plan.FP8_SMALL_M, plan.FP8_SMALL_M + 1, 1000, 8192):
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        assert choice.rule == ("fp8-small-m" if M <= plan.FP8_SMALL_M else "fp8"), (M, choice.skipped)
        assert {k: v for k, v in choice.knobs.items() if k in plan.fp8_knobs(M, N, K, recipe)} == \
            plan.fp8_knobs(M, N, K, recipe)


def test_block_scales_keep_the_defaults_and_explain_names_the_sweep():
    block = plan.rule_choice(plan.Problem(4096, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert block.rule == "fp8-block" and plan.fp8_knobs(4096, 4096, 7168, "block") == {}
    text = plan.rule_choice(plan.Problem(4096, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8())).text()
    assert "fp8_sweep" in text and f"every {plan.FP8_PROMOTE} slice(s)" in text and "overlap=4" in text
