"""``benchmarks/fp8_block_bisect.py``'s pure parts on the CPU: which modules it checks at which M
(the staged scales by plain bulk copies beside the block policy's tensor copies, at M off 16 bytes too), the verdict
it prints, and that its sweep stays its own. (Running it is a GPU benchmark.)"""

from __future__ import annotations

import sys
from pathlib import Path

from gemm_ladder.rungs import make_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_block_bisect as bisect  # noqa: E402  (the GPU benchmark's pure parts)
import fp8_sweep  # noqa: E402


def test_every_module_validates_and_each_shape_times_its_control_first():
    with bisect.bisect_sweep():
        plan = fp8_sweep.plan_modules("block")
    for name, entry in plan.items():
        make_config("v9", 256, entry["N"], entry["K"], **fp8_sweep.build_knobs(entry))
    for label, configs in bisect.TIMED.items():
        # the policy (tensor-copied staged scales) first, the bulk copies beside it
        first = bisect.CONFIGS[configs[0]]
        assert first.get("stage_scales") and not first.get("stage_bulk"), label
        assert any(bisect.CONFIGS[c].get("stage_bulk") for c in configs), label


def test_every_staged_module_is_checked_at_its_m_and_off_16_bytes_the_unstaged_first():
    shape_m = {label: M for label, M, _, _ in bisect.SHAPES}
    with bisect.bisect_sweep():
        plan = {"modules": fp8_sweep.plan_modules("block")}
        got = bisect.cases(plan)
        timed = {(fp8_sweep.module_name(label, c, "block"), shape_m[label]) for label, cs in bisect.TIMED.items()
                 for c in cs}
    assert fp8_sweep.SWEEPS["block"] is not bisect.BISECT  # restored: the block sweep's own again
    staged = {n for n, e in plan["modules"].items() if e["knobs"].get("stage_scales")}
    assert len(got) == len(set(got)) == len(plan["modules"]) + len(bisect.ODD_MS) * len(staged)
    n_unstaged = len(plan["modules"]) - len(staged)
    assert all(name not in staged for name, _ in got[:n_unstaged])
    assert all(m % 4 for m in bisect.ODD_MS if m > 1)  # A's first scales off 16 bytes
    for name in staged:
        assert {m for n, m in got if n == name} >= set(bisect.ODD_MS)
    assert timed <= set(got)  # each timed module is checked at the M it is timed at


def test_the_verdict_names_each_module_s_outcome_at_each_m():
    checks = [{"name": "b_7168x16384_control", "M": 4096, "correct": True},
              {"name": "b_4096x7168_sm_full", "M": 128, "correct": False, "error": "its child ended (rc 1): illegal"},
              {"name": "b_7168x16384_full", "M": 333, "correct": False}]
    v = bisect.verdict(checks)
    assert v["b_7168x16384_control"] == {"4096": "pass"} and v["b_7168x16384_full"] == {"333": "FAIL (wrong)"}
    assert v["b_4096x7168_sm_full"]["128"].startswith("FAIL: its child ended") and "illegal" in v["b_4096x7168_sm_full"]["128"]
