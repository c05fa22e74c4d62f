"""The every-model suite on the CPU: its families and split, the fixed sample, the summary. (Running
it is a GPU benchmark: ``python -m gemm_ladder.measure.every_model run``.)"""

import json
import math

import pytest

from gemm_ladder.measure import every_model
from gemm_ladder.serve import kernel_pack


def test_the_families_are_many_and_llama_8b_is_the_tuned_one():
    fams = every_model.FAMILIES
    assert len(fams) >= 10
    assert [f for f, spec in fams.items() if not spec["held_out"]] == ["llama-3.1-8b"]
    assert fams["llama-3.1-8b"]["weights"] == kernel_pack.MODELS["llama-8b"]  # the shape suite's model
    shapes = {nk for spec in fams.values() for nk in spec["weights"].values()}
    assert any(n % 8 or k % 8 for n, k in shapes), "no weight takes the padded path"
    assert min(every_model.M_CHOICES) == 1 and max(every_model.M_CHOICES) >= 16384


def test_the_sample_is_fixed_split_and_holds_an_odd_shape():
    a, b = every_model.cases(40), every_model.cases(40)
    assert a == b and len(a) == 40 and len({c["id"] + c["family"] + c["layer"] for c in a}) == 40
    held = [c for c in a if c["held_out"]]
    assert len(a) // 2 <= len(held) < len(a)
    assert any(c["N"] % 8 or c["K"] % 8 for c in a)
    assert len(every_model.cases(None)) == len(every_model.all_cases())
    assert every_model.cases(7, seed=1) != every_model.cases(7, seed=2)


def _row(ratio_k, ratio_c, held_out, status="ok", rung="v9"):
    return {"held_out": held_out, "status": status, "correct": status == "ok", "kernel_ratio": ratio_k,
            "call_ratio": ratio_c, "route": {"rung": rung}}


def test_summary_keeps_tuned_and_held_out_apart():
    rows = [_row(1.1, 1.2, False), _row(0.8, 1.0, True), _row(0.95, 1.05, True, rung="torch"),
            _row(0, 0, True, status="wrong")]
    s = every_model.summary(rows)
    assert s["cases"] == 4 and s["correct"] == 3
    assert s["tuned"]["kernel_geomean"] == 1.1 and s["tuned"]["cases"] == 1
    assert math.isclose(s["held_out"]["kernel_geomean"], math.sqrt(0.8 * 0.95))
    assert s["held_out"]["kernel_below_0_9"] == 1 and s["held_out"]["torch"] == 1
    assert s["held_out"]["ok"] == 2 and s["held_out"]["cases"] == 3
    assert math.isclose(s["all"]["call_min"], 1.0)


def test_memory_bound_cases_are_held_to_the_copy_bandwidth():
    from gemm_ladder.measure import suite

    rows = [{"memory_bound": True, "status": "ok", "gbps": 2700.0, "cublas_gbps": 2500.0},
            {"memory_bound": True, "status": "ok", "gbps": 2000.0, "cublas_gbps": 2800.0},
            {"memory_bound": False, "status": "ok", "gbps": 100.0, "cublas_gbps": 100.0},  # compute-bound: not counted
            {"memory_bound": True, "status": "wrong"}]
    s = suite.memory_bound_summary(rows, 3000.0)
    assert s["cases"] == 2 and s["at_85pct_of_copy"] == 1 and s["cublas_at_85pct_of_copy"] == 1
    assert math.isclose(s["min_of_copy"], 2000.0 / 3000.0)
    assert suite.memory_bound_summary(rows, None) == {"cases": 2, "copy_gbps": None}  # no copy measured: no fractions
    assert "same_bytes_cases" not in s  # no own-size copy measured: no such counts


def test_memory_bound_cases_are_also_held_to_a_copy_of_their_own_bytes():
    """A small case is weighed against a copy of its size too: 2000 GB/s where the copy of those bytes
    reaches 2200 is 91% of it, though 67% of the 1 GiB copy's 3000."""
    from gemm_ladder.measure import suite

    rows = [{"memory_bound": True, "status": "ok", "gbps": 2000.0, "cublas_gbps": 1800.0,
             "gbps_of_same_bytes_copy": 2000.0 / 2200.0, "cublas_gbps_of_same_bytes_copy": 1800.0 / 2200.0},
            {"memory_bound": True, "status": "ok", "gbps": 600.0, "cublas_gbps": 700.0,
             "gbps_of_same_bytes_copy": 600.0 / 900.0, "cublas_gbps_of_same_bytes_copy": 700.0 / 900.0},
            {"memory_bound": True, "status": "ok", "gbps": 2900.0, "cublas_gbps": 2900.0}]  # copy ran out of memory
    s = suite.memory_bound_summary(rows, 3000.0)
    assert s["cases"] == 3 and s["at_85pct_of_copy"] == 1
    assert s["same_bytes_cases"] == 2 and s["at_85pct_of_same_bytes_copy"] == 1
    assert s["cublas_at_85pct_of_same_bytes_copy"] == 0
    assert math.isclose(s["min_of_same_bytes_copy"], 600.0 / 900.0)


def test_the_command_refuses_a_negative_sample_and_a_folder_for_out(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        every_model.main(["list", "--sample", "-3"])
    assert err.value.code == 2
    assert "--sample" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        every_model.main(["run", "--out", str(tmp_path)])  # a folder: refused before any GPU work
    assert err.value.code == 2 and "--out" in capsys.readouterr().err


def test_plot_draws_both_ratios_from_result_files_and_refuses_a_wrong_file(tmp_path, capsys):
    rows = [{"M": m, "held_out": m > 100, "status": "ok", "kernel_ratio": 0.9 + m / 1e4, "call_ratio": 1.1}
            for m in (1, 16, 333, 4096)] + [{"M": 7, "held_out": True, "status": "wrong"}]
    result = tmp_path / "every_model_seed0.json"
    result.write_text(json.dumps({"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "rows": rows}))
    png = tmp_path / "plots" / "every_model.png"
    assert every_model.main(["plot", str(result), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"M": -1, "held_out": True, "status": "ok"}]}))
    assert every_model.main(["plot", str(bad), "--out", str(png)]) == 2
    assert "bad.json" in capsys.readouterr().err
