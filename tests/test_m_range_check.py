"""``benchmarks/m_range_check.py`` on the CPU: the M it tests, the held-out split, which modules serve
an M, and the arithmetic of a row and the summary on made-up timings. (Running it is a GPU
benchmark: ``python3 benchmarks/m_range_check.py run``.)"""

import math
from types import SimpleNamespace

import pytest

from gemm_ladder.core.spec import spec_for
from gemm_ladder.serve.kernel_pack import M_BUCKETS, bucket_cells, weight_buckets

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def mrc():
    return benchmark_script("m_range_check")


def test_every_cell_of_the_buckets_gets_an_m(mrc):
    ms = mrc.m_points(4096, 4096)
    assert ms == sorted(mrc.M_POINTS)
    for bucket, lo, hi in bucket_cells(M_BUCKETS):
        assert any(lo <= m <= hi for m in ms), f"no M in the cell {lo}..{hi} of bucket {bucket}"
    # a weight too wide for 16384 rows: up to the most it takes, every cell of its own with an M
    for N, K in ((152064, 5120), (262144, 4096)):
        cells, ms = bucket_cells(weight_buckets(N, K)), mrc.m_points(N, K)
        assert max(ms) <= cells[-1][2] < M_BUCKETS[-1]
        assert all(any(lo <= m <= hi for m in ms) for _, lo, hi in cells)


def test_the_plan_splits_tuned_and_held_out_weights_and_refuses_odd_ones(mrc):
    doc = mrc.plan([(4096, 4096), (2560, 10240)], ["float16", "bfloat16"])
    got = {(w["N"], w["K"], w["dtype"]): w["held_out"] for w in doc["weights"]}
    assert got == {(4096, 4096, "float16"): False, (4096, 4096, "bfloat16"): False,
                   (2560, 10240, "float16"): True, (2560, 10240, "bfloat16"): True}
    default = [tuple(map(int, w.split("x"))) for w in mrc.WEIGHTS.split(",")]
    held = [w for w in default if w not in mrc.tuned_weights()]
    assert len(held) >= 1 and len(held) < len(default), "the default weights need a held-out one and a tuned one"
    with pytest.raises(ValueError, match="multiples of 8"):
        mrc.plan([(50257, 768)], ["float16"])


def _entry(file, M, dynamic, m_range, knobs=None, N=4096, K=4096, **extra):
    return {"file": file, "rung": "v9", "shape": [M, N, K], "dtype": "float16", "arch": "sm_90a",
            "knobs": {"blk_m": 128, "blk_n": 256, "blk_k": 64, **(knobs or {})}, "dynamic_m": dynamic,
            "m_range": m_range, **extra}


def test_candidates_are_every_module_that_serves_the_m(mrc):
    pack = SimpleNamespace(modules=[
        _entry("a.so", 1, True, [1, 8]), _entry("a.so", 1, True, [129, 256]),  # one file, two ranges
        _entry("b.so", 64, True, [33, 64]),
        _entry("s.so", 200, False, [200, 200]),  # a module of one M
        _entry("bias.so", 1, True, [1, 16384], spec=spec_for("float16", "bias").to_dict()),
        _entry("other.so", 1, True, [1, 16384], N=2560, K=10240),
        _entry("split.so", 1, True, [1, 8], knobs={"split_k": 16})])  # its workspace: 16x the rows
    assert sorted(e["file"] for e in mrc.candidates(pack, 200, 4096, 4096, "float16", "sm_90a")) == \
        ["a.so", "b.so", "s.so", "split.so"]
    assert sorted(e["file"] for e in mrc.candidates(pack, 12000, 4096, 4096, "float16", "sm_90a")) == \
        ["a.so", "b.so", "split.so"]
    # past the M a module's 32-bit indices take (config.max_m_of), it serves no more
    assert sorted(e["file"] for e in mrc.candidates(pack, 100_000, 4096, 4096, "float16", "sm_90a")) == ["a.so", "b.so"]


WEIGHT = {"N": 4096, "K": 4096, "dtype": "float16", "held_out": False}


def test_a_row_says_whether_the_chosen_module_is_within_the_target_of_the_best(mrc):
    timed = {"chosen.so": {"correct": True, "ms": 0.5, "rough": False},
             "best.so": {"correct": True, "ms": 0.4, "rough": False},
             "slow.so": {"correct": True, "ms": 2.0, "rough": True},  # screened: its rough time
             "wrong.so": {"correct": False, "ms": None, "rough": False}}
    r = mrc.make_row(WEIGHT, 700, "chosen.so", "tuned-range", timed, 0.45)
    assert r["best"] == "best.so" and r["chosen"] == "chosen.so" and r["correct"]
    assert math.isclose(r["chosen_over_best"], 0.8) and math.isclose(r["chosen_ratio"], 0.9)
    assert math.isclose(r["best_ratio"], 0.45 / 0.4) and r["wrong"] == ["wrong.so"]
    assert [m["file"] for m in r["modules"]] == ["best.so", "chosen.so", "slow.so", "wrong.so"]
    assert r["weight"] == "4096x4096" and r["held_out"] is False and r["M"] == 700
    # the chosen one is the best
    r = mrc.make_row(WEIGHT, 700, "best.so", "tuned-range", timed, 0.45)
    assert r["chosen_over_best"] == 1.0 and r["chosen_ratio"] == r["best_ratio"]
    # a wrong chosen module: not correct, no ratio, below the target
    r = mrc.make_row(WEIGHT, 700, "wrong.so", "tuned-range", timed, 0.45)
    assert not r["correct"] and r["chosen_over_best"] is None and r["best"] == "best.so"


def test_the_summary_counts_rows_below_the_target_apart_for_held_out_weights(mrc):
    def row(cob, held_out, correct=True):
        return {"held_out": held_out, "correct": correct, "chosen_over_best": cob, "chosen": "x.so",
                "best": "x.so" if cob == 1.0 else "y.so", "chosen_ratio": cob, "best_ratio": 1.0}

    rows = [row(1.0, False), row(0.95, False), row(0.85, True), row(None, True, correct=False), row(1.0, True)]
    s = mrc.summary(rows)
    assert s["tuned"]["below_target"] == 0 and s["held_out"]["below_target"] == 2
    assert s["all"]["below_target"] == 2 and s["all"]["correct"] == 4 and s["all"]["chosen_is_best"] == 2
    assert s["all"]["min_chosen_over_best"] == 0.85 and not s["met"]
    assert math.isclose(s["tuned"]["geomean_chosen_over_best"], math.sqrt(0.95))
    assert mrc.summary([row(1.0, False), row(0.91, True)])["met"]
    assert "<" in mrc.table([{**row(0.85, True), "weight": "2560x10240", "M": 3, "chosen": "v11_anyMx1_float16_sm_90a_m8.so",
                              "best": "v9_anyMx1_float16_sm_90a_m64.so"}])


def test_a_graph_of_calls_lasts_long_enough_and_spills_l2(mrc):
    from gemm_ladder.measure.harness import GRAPH_CALLS

    assert mrc._calls(0.005, 5) == GRAPH_CALLS  # a 5 us kernel: as many calls as the harness takes
    assert mrc._calls(20.0, 1) == 1  # a 20 ms kernel: one call a replay
    assert mrc._calls(20.0, 3) == 3  # but every input set once
    assert mrc._calls(0.1, 1) == math.ceil(mrc.GRAPH_US / 100)


def test_run_without_a_gpu_exits_2_with_one_line(mrc, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(mrc.device, "why_no_gpu", lambda index=0: "torch sees no CUDA GPU")
    assert mrc.main(["run", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no GPU" in err and "GPU box" in err
    assert not (tmp_path / "r.json").exists()


def test_prepare_dry_run_prints_the_plan(mrc, capsys, tmp_path):
    assert mrc.main(["prepare", str(tmp_path / "p"), "--weights", "4096x4096,2560x10240", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2560x10240 float16 (held out)" in out and "4096x4096 float16:" in out
    assert not (tmp_path / "p").exists()


def test_the_measured_choice_is_scored_against_the_best_module(mrc):
    """The front door's first-use choice (queued calls) scored as kernels: a module by its own
    time, torch's choice by cuBLAS's; a row without a timed measured choice is below the target."""
    timed = {"chosen.so": {"correct": True, "ms": 0.5, "rough": False},
             "best.so": {"correct": True, "ms": 0.4, "rough": False}}
    row = mrc.add_measured(mrc.make_row(WEIGHT, 700, "chosen.so", "tuned-range", timed, 0.45), "best.so",
                           {"best.so": 30.0, "chosen.so": 40.0, "torch": 33.0})
    assert row["measured_over_best"] == 1.0 and math.isclose(row["measured_ratio"], 0.45 / 0.4)
    by_torch = mrc.add_measured(mrc.make_row(WEIGHT, 700, "chosen.so", "tuned-range", timed, 0.45), "torch", {})
    assert math.isclose(by_torch["measured_over_best"], 0.4 / 0.45) and by_torch["measured_ratio"] == 1.0
    s = mrc.summary([row, by_torch, {**by_torch, "measured_over_best": None}])
    assert s["all"]["measured_below_target"] == 2 and s["all"]["measured_torch"] == 2 and not s["met_measured"]
    assert s["all"]["below_target"] == 3  # the chosen module (0.8 of the best) in every row
    assert mrc.summary([row])["met_measured"]
