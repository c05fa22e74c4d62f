"""The watchdog around GPU jobs: a hanging or crashing kernel is recorded, and the rest still run."""

import time

import pytest

from gemm_ladder.measure import isolate


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


def test_the_rounds_job_answers_for_every_module_of_its_group(tmp_path):
    """The tuner's second pass times a group in one child: an error there (a missing module) comes
    back once per module of the group, in order, and names the problem."""
    paths = [tmp_path / "a.so", tmp_path / "b.so"]
    res = isolate.run_batch("rounds", paths, (2, 1, 0.0), timeout=60, explain=False)
    assert [r["status"] for r in res] == ["error", "error"]
    assert [r["module"] for r in res] == ["a.so", "b.so"]
    assert "a.so" in res[0]["detail"]


def test_verify_refuses_a_spec_it_cannot_check_and_says_where_its_check_is():
    """``harness.check`` (``verify``'s job) computes act(A . B^T + bias) into a 16-bit or float32 D, or a
    scaled fp8 GEMM of one weight (every recipe, a bias); a module that also needs a residual, alpha, a
    gated B, groups or MN-major operands is refused by name, not called with operands it does not take
    (which read as a wrong module)."""
    import dataclasses

    from gemm_ladder.core.spec import GemmSpec, as_spec
    from gemm_ladder.measure import harness

    scaled = [GemmSpec.fp8("bfloat16", r) for r in ("tensor", "row", "block")] + [
        GemmSpec.fp8("float16", "row", "float32"), GemmSpec.fp8("bfloat16", "tensor", b="float8_e5m2")]
    for ok in (None, GemmSpec.default("bfloat16"), as_spec("d_float32.a_bfloat16.b_bfloat16", "bfloat16"), *scaled):
        harness._checkable(ok)  # pylint: disable=protected-access
    assert all(harness.is_scaled(s) for s in scaled) and not harness.is_scaled(GemmSpec.default("bfloat16"))
    grouped = dataclasses.replace(GemmSpec.fp8("bfloat16", "row"), grouped=True)
    assert not harness.is_scaled(grouped)
    with pytest.raises(ValueError, match="adds groups"):
        harness._checkable(grouped)  # pylint: disable=protected-access
    base = GemmSpec.default("bfloat16")
    for field, value, name in (("residual", "bfloat16", "a residual C"), ("alpha", True, "alpha"),
                               ("a_major", "M", "MN-major operands")):
        with pytest.raises(ValueError, match=f"adds {name}: check it through the front door"):
            harness._checkable(dataclasses.replace(base, **{field: value}))  # pylint: disable=protected-access


def test_job_arguments_come_back_whole_or_are_refused():
    args = ["build/x", "strict", "fuse=act+qkv", 3]
    assert isolate.split_args(isolate.join_args(args)) == ["build/x", "strict", "fuse=act+qkv", "3"]
    for bad in (["fuse=act,qkv"], ["a", ""]):
        with pytest.raises(ValueError, match="would not reach the job whole"):
            isolate.join_args(bad)
