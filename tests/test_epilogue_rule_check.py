"""The GPU check of the small-M epilogue rule (``benchmarks/epilogue_check.py prepare --set rule``):
its pure parts on the CPU. What it builds is the rule's module beside the module the policy chose
before it, at M = 64, 128, 256; the torch peers it times against compute the same formula."""

import importlib.util
from pathlib import Path

import pytest
import torch

from gemm_ladder.core.spec import spec_for
from gemm_ladder.serve import plan

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "epilogue_check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("epilogue_check", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rule_cases_pair_the_rules_choice_with_the_choice_before_it(check):
    """Where the rule applies, its variant ``rule`` is the policy's choice (the rule's 64x64 tiles)
    and ``before`` the policy's without the rule (another rule, another tile); where it does not,
    ``unchanged`` is the policy's and ``probe_64x64`` forces the rule's tiles; one group per shape
    and epilogue, apart from the other timing groups."""
    cases = check.rule_cases()
    groups = check.time_groups(cases)
    shapes = {(c["epilogue"], *c["shape"]) for c in cases}
    assert len(groups) == len(shapes) == len(check.RULE_EPILOGUES) * len(check.LLAMA_WEIGHTS) * len(check.RULE_MS)
    applied = set()
    for group in groups:
        M, N, K = group[0]["shape"]
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, check.spec_of_case(group[0]))
        variants = [c["variant"] for c in group]
        wide = M > 128 and p.tiles(64, 128) <= 132  # 64x128 tiles in one wave past the rule's M
        assert variants == (["rule", "before"] if variants[0] == "rule" else ["unchanged", "probe_64x64"]) \
            + (["probe_64x128"] if wide else [])
        choices = {v: plan.choose(p, rules=check.rules_of(v), use_db=False) for v in variants}
        if variants[0] == "rule":
            applied.add((M, N, K))
            # the rule's tiles, whole or (small-m-split, since 2026-11-28) split in two along K
            assert choices["rule"].rule in (check.RULE_NAME, check.SMALL_SPLIT_RULE)
            assert choices["before"].rule not in (check.RULE_NAME, check.SMALL_SPLIT_RULE)
            assert (choices["before"].knobs["blk_m"], choices["before"].knobs["blk_n"]) != (64, 64)
        else:
            assert choices["unchanged"].rule != check.RULE_NAME and choices["probe_64x64"].rule == check.RULE_NAME
        small = choices["rule" if variants[0] == "rule" else "probe_64x64"].knobs
        assert (small["blk_m"], small["blk_n"], small["cluster_m"]) == (64, 64, 2 if M > 64 else 1)
        if wide:
            probe = choices["probe_64x128"]
            assert probe.rule == check.RULE_NAME and (probe.knobs["blk_m"], probe.knobs["blk_n"]) == (64, 128)
            assert {**small, "blk_n": 128} == probe.knobs  # the rule's knobs but the tile's width
        assert {c.get("set") for c in group} == {"rule"}
    # M = 64 and 128 where 64x64 tiles fit one wave (N = 4096); never M = 256; 64x128 probes at M = 256, N = 4096
    assert applied == {(M, 4096, K) for M in (64, 128) for K in (4096, 14336)}
    assert {tuple(c["shape"]) for c in cases if c["variant"] == "probe_64x128"} == {(256, 4096, 4096), (256, 4096, 14336)}
    assert not set(map(id, groups)) & set(map(id, check.time_groups(check.cases())))


def test_the_sets_prepare_builds(check):
    assert check.cases_of("rule") == check.rule_cases()
    assert check.cases_of("epilogues") == check.cases()
    assert check.cases_of("all") == check.cases() + check.rule_cases()
    with pytest.raises(SystemExit, match="one of all, epilogues, rule"):
        check.cases_of("rules")


def test_a_rule_rows_op_is_its_epilogue(check):
    """The rule's variants name no op of their own: the row's ``rule`` field says which it is."""
    for variant in check.RULE_VARIANTS:
        assert check.op_of(spec_for("bfloat16", "residual"), variant) == "residual"
    assert check.op_of(spec_for("bfloat16", "residual"), "prefetch_64x64") == "residual_prefetch_64x64"


@pytest.mark.parametrize("epilogue", ["residual", "alpha_bias_gelu_tanh+residual", "bias_gelu_tanh"])
def test_the_torch_peers_compute_the_epilogue(check, epilogue):
    """Every peer the rule's groups time writes act(alpha . A . W^T + bias) + beta . C into D (CPU,
    float32: the formula, not the speed)."""
    spec = spec_for("bfloat16", epilogue)  # the spec the check times; the tensors are float32 here
    g = torch.Generator().manual_seed(0)
    A, W = torch.randn(8, 32, generator=g), torch.randn(24, 32, generator=g)
    bias = torch.randn(24, generator=g) if spec.bias else None
    C = torch.randn(8, 24, generator=g) if spec.residual else None
    alpha = check.ALPHA if spec.alpha else 1.0
    beta = check.BETA if spec.residual and spec.epilogue != "residual" else 1.0
    want = check.reference(A, W, bias, spec.act, alpha, C, beta)
    peers = check.peers(check.op_of(spec))
    assert len(peers) == 2
    for name, fn in peers.items():
        D = torch.full((8, 24), float("nan"))
        fn(A, W, D, bias, C)
        # _addmm_activation's GELU is the tanh form on the GPU (cuBLASLt) and erf on the CPU: < 1e-3 apart
        tol = 2e-3 if name == "addmm_activation" else 1e-4
        torch.testing.assert_close(D.double(), want, rtol=tol, atol=tol, msg=name)
