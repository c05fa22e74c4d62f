"""The watchdog around GPU jobs: a hanging or crashing kernel is recorded, and the rest still run."""

import time

from gemm_ladder import isolate


def test_a_hang_times_out_and_the_batch_goes_on(monkeypatch):
    monkeypatch.setattr(isolate, "STARTUP_SECONDS", 5.0)
    t0 = time.monotonic()
    res = isolate.run_batch("selftest", ["ok", "hang", "ok", "crash", "ok"], timeout=3.0)
    took = time.monotonic() - t0
    assert [r["status"] for r in res] == ["ok", "timeout", "ok", "crash", "ok"]
    assert "deadlock" in res[1]["detail"]
    assert res[3]["returncode"] == 3
    assert took < 60


def test_a_single_job_reports_errors_as_results(tmp_path):
    res = isolate.run_isolated("check", tmp_path / "missing.so", 0, timeout=60)
    assert res["status"] == "error" and "missing.so" in res["detail"]
