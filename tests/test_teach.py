"""The tutorials' GPU cells, driven on the CPU with the GPU jobs answered by canned results.

The notebooks call ``teach.check_and_time`` when a GPU is there; CI has none, so this runs the
same function with ``isolate.run_isolated`` replaced: the glue (export, check, time, printing,
stopping on a wrong kernel) is exercised here, the kernels themselves by the GPU tier.
"""

import hashlib
import json

import pytest

from gemm_ladder.measure import isolate
from gemm_ladder import teach

V4_BUILD = ("v4", (256, 256, 128), {})


def _fake(results):
    calls = []

    def run_isolated(job, path, *args, timeout=0):
        calls.append((job, path.name))
        return results[job]

    return calls, run_isolated


def test_gpu_cell_checks_then_times(monkeypatch, built, tmp_path, capsys):
    calls, fake = _fake({
        "check": {"status": "ok", "rel_err": 2.1e-4, "torch_rel_err": 2.0e-4},
        "time": {"status": "ok", "ms": 0.01, "tflops": 500.0, "cublas_tflops": 600.0, "ratio_to_cublas": 0.833},
    })
    monkeypatch.setattr(isolate, "run_isolated", fake)
    mod = built(*V4_BUILD).module
    out = teach.check_and_time(mod, folder=tmp_path)
    assert [c[0] for c in calls] == ["check", "time"]
    assert (tmp_path / calls[0][1]).exists()  # it exported a real module for the child
    exported = json.loads((tmp_path / (calls[0][1] + ".json")).read_text())
    assert exported["binary_sha256"] == hashlib.sha256(mod.binary).hexdigest()  # the one it was given
    text = capsys.readouterr().out
    assert "rel_err 2.10e-04" in text and "ratio 0.833" in text
    assert out["time"]["tflops"] == 500.0


def test_gpu_cell_stops_on_a_wrong_kernel(monkeypatch, built, tmp_path):
    calls, fake = _fake({"check": {"status": "wrong", "rel_err": 0.5, "torch_rel_err": 2e-4,
                                   "detail": "17 bad elements"}})
    monkeypatch.setattr(isolate, "run_isolated", fake)
    with pytest.raises(AssertionError, match="failed its check"):
        teach.check_and_time(built(*V4_BUILD).module, folder=tmp_path)
    assert [c[0] for c in calls] == ["check"]


def test_gpu_cell_reports_a_hang(monkeypatch, built, tmp_path):
    _, fake = _fake({"check": {"status": "timeout", "detail": "no result after 300 s (a deadlock?)"}})
    monkeypatch.setattr(isolate, "run_isolated", fake)
    out = teach.check_and_time(built(*V4_BUILD).module, folder=tmp_path, strict=False)
    assert out["check"]["status"] == "timeout" and out["time"]["status"] == "skipped"


# -- tutorial 16's fp8 helpers -------------------------------------------------------------------
def test_the_e4m3_model_rounds_as_torch_does():
    import numpy as np
    import torch

    from gemm_ladder.teach import fp8

    x = np.concatenate([np.linspace(-500, 500, 2001), np.logspace(-9, 2, 500), -np.logspace(-9, 2, 500)])
    theirs = torch.from_numpy(np.clip(x, -448, 448)).to(torch.float8_e4m3fn).double().numpy()
    assert np.array_equal(fp8.e4m3(x), theirs)


def test_the_accumulation_model_drifts_without_promotion_as_the_h100_did():
    import numpy as np

    from gemm_ladder.teach import fp8

    rng = np.random.default_rng(1)
    a, b = fp8.e4m3(rng.standard_normal((8, 1024)) * 64), fp8.e4m3(rng.standard_normal(1024) * 64)
    assert np.array_equal(fp8.model_dot(a, b, bits=53), a @ b)  # with fp64's bits the model is the product
    errors = fp8.promotion_errors(ks=(1024, 16384), rows=64)
    assert errors["none"][1] > 2 * errors["none"][0] and errors["none"][1] > 3 * errors["promoted"][1]
    measured = fp8.measured_promotion()
    assert measured["none"] > 3 * measured["promoted"]  # the committed K = 16384 check
    assert 0.5 < errors["none"][1] / measured["none"] < 2  # the tutorial says the model predicts it
    fig = fp8.plot_promotion(errors, measured)
    assert len(fig.axes[0].lines) == 5


def test_the_wgmma_line_elides_the_accumulators_and_the_table_reads_the_committed_run(capsys):
    from types import SimpleNamespace

    from gemm_ladder.teach import fp8

    src = 'asm volatile("{ setp.ne.b32 ps0, %66, 0; wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 ' \
          '{%0, %1, %2, %63}, %64, %65, ps0, 1, 1;\\n}" : "+f"(d0));'
    line = fp8.wgmma_instruction(SimpleNamespace(cuda_source=lambda: src))
    assert line == "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, ..., %63}, %64, %65, ps0, 1, 1;"
    with pytest.raises(LookupError, match="no wgmma"):
        fp8.wgmma_instruction(SimpleNamespace(cuda_source=lambda: "int main() {}"))
    rows = fp8.measured_rows()
    assert {r["recipe"] for r in rows} == {"tensor", "row"}
    assert [r["module"] for r in rows if not r["correct"]] == ["t_1024x16384_p0"]  # promotion off, by design
    fp8.show_measured()
    assert "t_4096x4096" in capsys.readouterr().out
