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
