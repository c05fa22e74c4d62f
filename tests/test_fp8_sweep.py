"""``benchmarks/fp8_sweep.py`` on the CPU: every config it plans validates as a v9 fp8 module, the
modules are named per weight and config, the rows carry the issue's fields, and the best config of
a shape is the fastest correct one. (Running it is a GPU benchmark: ``fp8_sweep.py run``.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gemm_ladder.rungs import make_config
from gemm_ladder.serve import plan as serve_plan
from gemm_ladder.sm90a import fp8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_sweep  # noqa: E402  (the GPU benchmark's pure parts)


def test_every_planned_module_validates_and_each_shape_times_its_configs():
    plan = fp8_sweep.plan_modules()
    for name, entry in plan.items():
        cfg = make_config(entry.get("rung", "v9"), 256, entry["N"], entry["K"], **fp8_sweep.build_knobs(entry))
        assert cfg.blk_k == 128 and dict(cfg.extra)["promote"] == entry["promote"], name
    for label, configs in fp8_sweep.SWEEP.items():
        assert len(set(configs)) == len(configs) and set(configs) <= set(fp8_sweep.CONFIGS), label
        assert {fp8_sweep.module_name(label, c) for c in configs} <= set(plan)
    # the knobs reach the module: a config's promotion and tile, the defaults where it names none
    assert plan["t_8192x8192_m192_c1x2_p2"]["promote"] == 2
    assert plan["t_8192x8192_m192_c1x2_p2"]["knobs"] == {"blk_m": 192, "num_warpgroups": 3, "cluster_m": 1,
                                                         "cluster_n": 2}
    assert plan["t_4096x4096_ov4"]["promote"] == 1 and plan["t_4096x4096_ov4"]["knobs"] == {"overlap": 4}
    with pytest.raises(KeyError, match="no shape"):
        fp8_sweep.shape_of("1x1x1")


def _row(config, tflops, correct, M=4096):
    return {"M": M, "N": 4096, "K": 4096, "config": config, "tflops": tflops, "correct": correct,
            "ratio_to_scaled_mm": None if tflops is None else tflops / 1300.0}


def test_the_best_config_is_the_fastest_correct_one_per_shape():
    rows = [_row("base", 976.0, True), _row("n256_p0", 1294.0, False), _row("every2", 1047.0, True),
            _row("c1x1", None, True), _row("base", 216.0, True, M=128), _row("c1x2", 300.0, True, M=128)]
    best = fp8_sweep.best_of(rows)
    assert best["4096x4096x4096"]["config"] == "every2"  # n256_p0 is faster but not correct
    assert best["128x4096x4096"]["config"] == "c1x2"


def test_a_shapes_rows_carry_the_issues_fields_and_the_ratio_to_torch():
    plan = {"modules": fp8_sweep.plan_modules()}
    label = "8192^3"
    names = [fp8_sweep.module_name(label, c) for c in fp8_sweep.SWEEP[label]]
    timing = {"kernel_ms": {n: 1.0 for n in names} | {"torch_scaled_mm": 0.8, "torch_scaled_mm_fast_accum": 0.75},
              "call_ms": {n: 1.1 for n in names} | {"torch_scaled_mm": 0.9, "torch_scaled_mm_fast_accum": 0.8}}
    checks = {names[0]: {"correct": True, "rel_err": 2e-3, "torch_rel_err": 2e-3}}
    rows = fp8_sweep.rows_of(plan, label, timing, checks, None)
    assert [r["config"] for r in rows] == list(fp8_sweep.SWEEP[label])
    first = rows[0]
    for key in ("recipe", "M", "N", "K", "correct", "tflops", "ratio_to_scaled_mm", "peer_ratios"):
        assert key in first
    assert first["recipe"] == "tensor" and first["correct"] and not rows[1]["correct"]  # unchecked: not correct
    assert first["ratio_to_scaled_mm"] == pytest.approx(0.8)
    assert first["peer_ratios"]["torch_scaled_mm_fast_accum"] == pytest.approx(0.75)
    assert first["tflops"] == pytest.approx(2 * 8192**3 / 1e-3 / 1e12)


# -- the block-wise sweep (``prepare --recipe block``) ----------------------------------------------
def test_the_block_sweep_plans_block_modules_and_one_per_tensor_peer_a_shape():
    plan = fp8_sweep.plan_modules("block")
    for name, entry in plan.items():
        cfg = make_config(entry.get("rung", "v9"), 256, entry["N"], entry["K"], **fp8_sweep.build_knobs(entry))
        assert fp8.recipe(cfg) == entry["recipe"] and cfg.blk_k == 128, name
    assert plan["b_7168x16384_ov4_ss"]["knobs"] == {"overlap": 4, "stage_scales": True}
    assert plan["b_7168x16384_n256_h_u_ss_d3"]["knobs"] == {"blk_n": 256, "halves": True, "epi_under": True,
                                                           "pipe_depth": 3, "stage_scales": True}
    for label, M, N, K in fp8_sweep.BLOCK_SHAPES:
        names = [fp8_sweep.module_name(label, c, "block") for c in fp8_sweep.timed_configs(label, "block")]
        recipes = [plan[n]["recipe"] for n in names]
        assert recipes == ["block"] * (len(names) - 1) + ["tensor"], label  # the sweep's, then its peer
        assert all(n.startswith("b_" if r == "block" else "t_") and f"_{N}x{K}_" in n for n, r in zip(names, recipes))
    assert fp8_sweep.shape_of("4096x4096x7168", "block") == (4096, 4096, 7168)
    with pytest.raises(KeyError, match="no shape '4096x4096x7168'; the tensor sweep"):
        fp8_sweep.shape_of("4096x4096x7168")


def test_the_block_sweeps_per_tensor_peers_are_the_per_tensor_policys_knobs():
    """Our per-tensor module beside each block shape is what scaled_mm builds for per-tensor scales
    there (so the row's ratio to it is the cost of the block recipe, not of other knobs)."""
    plan = fp8_sweep.plan_modules("block")
    for label, M, N, K in fp8_sweep.BLOCK_SHAPES:
        entry = plan[fp8_sweep.module_name(label, fp8_sweep.BLOCK_PEER[label], "block")]
        policy = serve_plan.fp8_knobs(M, N, K, "tensor")
        assert {"promote": entry["promote"], **entry["knobs"]} == {"promote": 1, **policy}, label


def test_a_block_shapes_rows_carry_every_peer_but_not_the_peer_modules_own_row():
    plan = {"modules": fp8_sweep.plan_modules("block")}
    label = "4096x7168x16384"
    names = [fp8_sweep.module_name(label, c, "block") for c in fp8_sweep.BLOCK_SWEEP[label]]
    peer = fp8_sweep.module_name(label, fp8_sweep.BLOCK_PEER[label], "block")
    others = {"torch_scaled_mm": 1.0, "ours_fp8_tensor": 0.8, "torch_scaled_mm_tensor": 0.75, "torch_bf16_mm": 1.6}
    timing = {"kernel_ms": {n: 0.8 for n in names} | {peer: 0.7} | others,
              "call_ms": {n: 0.9 for n in names} | {peer: 0.8} | others}
    checks = {names[1]: {"correct": True, "rel_err": 2e-3, "torch_rel_err": 2e-3,
                         "yardstick": "torch._scaled_mm block-wise"}}
    rows = fp8_sweep.rows_of(plan, label, timing, checks, None, "block")
    assert [r["config"] for r in rows] == list(fp8_sweep.BLOCK_SWEEP[label])  # no row for the per-tensor peer
    row = rows[1]
    assert row["recipe"] == "block" and row["correct"] and not rows[0]["correct"]
    assert row["ratio_to_scaled_mm"] == pytest.approx(1.25)
    assert set(row["peer_ratios"]) == set(others)  # not the sweep's other configs
    assert row["peer_ratios"]["torch_bf16_mm"] == pytest.approx(2.0)
    assert row["yardstick"] == "torch._scaled_mm block-wise"


class _NoSampler:
    def between(self, t0, t1):
        return {"t0": t0, "t1": t1}

    def stop(self):
        pass


def test_a_block_run_checks_every_module_then_times_the_ones_that_pass_with_their_peer(tmp_path, monkeypatch):
    """``run`` on a block plan with the GPU parts stubbed: every module (the per-tensor peers too) is
    checked at its shape's M, a module that failed is not timed and its row says so, a peer that
    failed is not handed to the timing, and the JSON has a row a config of the sweep."""
    from gemm_ladder.measure import harness

    plan = {"format": fp8_sweep.FORMAT, "recipes": ["block"], "modules": fp8_sweep.plan_modules("block")}
    (tmp_path / fp8_sweep.PLAN_FILE).write_text(json.dumps(plan))
    broken = {fp8_sweep.module_name("4096^3", "n256_h_u_d3", "block"),
              fp8_sweep.module_name("8192^3", fp8_sweep.BLOCK_PEER["8192^3"], "block")}
    checked, timed = [], []

    def check_all(folder, cases):
        checked.extend(cases)
        return [{"name": n, "M": M, "correct": n not in broken, "rel_err": 1.0 if n in broken else 2e-3,
                 "torch_rel_err": 2e-3, "nan": n in broken} for n, M in cases]

    def time_shape(folder, plan, label, names, loaded, recipe, peer):
        timed.append((label, tuple(names), peer))
        return {"kernel_ms": {n: 1.0 for n in names} | {"torch_scaled_mm": 1.1}, "call_ms": {n: 1.0 for n in names},
                "t0": 0.0, "t1": 1.0}

    monkeypatch.setattr(fp8_sweep.device, "why_no_gpu", lambda index=0: None)
    monkeypatch.setattr(fp8_sweep.fp8_check, "check_all", check_all)
    monkeypatch.setattr(fp8_sweep, "time_shape", time_shape)
    monkeypatch.setattr(fp8_sweep, "Sampler", _NoSampler)
    monkeypatch.setattr(harness, "gpu_info", lambda index=0: {"name": "stub"})
    monkeypatch.setattr(harness, "run_info", lambda commit=None: {})
    out = tmp_path / "block_fp8.json"
    assert fp8_sweep.run(tmp_path, out) == 0
    assert len(checked) == len(set(checked)) and {n for n, _ in checked} == set(plan["modules"])
    by_label = {t[0]: t for t in timed}
    assert fp8_sweep.module_name("4096^3", "n256_h_u_d3", "block") not in by_label["4096^3"][1]
    assert by_label["8192^3"][2] is None and by_label["4096^3"][2] == "t_4096x4096_tensor_policy_halves"
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == sum(len(c) for c in fp8_sweep.BLOCK_SWEEP.values())
    bad = [r for r in rows if not r["correct"]]
    assert [(r["shape"], r["config"], r["tflops"]) for r in bad] == [("4096^3", "n256_h_u_d3", None)]
    assert all(r["recipe"] == "block" and r["ratio_to_scaled_mm"] == pytest.approx(1.1) for r in rows if r["correct"])


def test_staged_scale_modules_are_checked_at_one_row_and_an_m_off_16_bytes():
    """The block sweep's ``stage_scales`` modules and its per-tensor peers promoted in halves (and only
    they) get checks at M = 1 and an M that is no multiple of 4 beyond their shapes' M (their 1-D scale
    tensor maps take any M; a halves tile's rows past M)."""
    planned = fp8_sweep.plan_modules("block")
    cases = fp8_sweep.odd_m_cases({"modules": planned})
    odd = {n for n, e in planned.items() if e["knobs"].get("stage_scales") or e["knobs"].get("halves")}
    assert any(planned[n]["knobs"].get("stage_scales") for n in odd) and {n for n, _ in cases} == odd
    assert sorted({m for _, m in cases}) == [1, 333] and all(m % 4 for _, m in cases if m > 1)
    for name in odd:
        cfg = make_config(planned[name].get("rung", "v9"), 256, planned[name]["N"], planned[name]["K"],
                          **fp8_sweep.build_knobs(planned[name]))
        assert fp8.staged(cfg) or fp8.halves(cfg), name
