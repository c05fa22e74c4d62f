"""``benchmarks/host_check.py`` on the CPU: the GEMMs it times are the training plan's (so the e2e
pack serves them) in the layouts the backward hands over (``ops.linear_grads``: views, no
copies), its loss rule, its training phase as a dry run, and ``run``'s results file from its
phases. (Running it is a GPU benchmark: ``host_check.py run``.)"""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from gemm_ladder.core import files
from gemm_ladder.measure import isolate
from gemm_ladder.serve import ops
from gemm_ladder.serve.front import operand_majors

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def hc():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared box
    spec = importlib.util.spec_from_file_location("host_check", _BENCH / "host_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["host_check"] = mod
    spec.loader.exec_module(mod)
    yield mod
    torch.set_num_threads(threads)


def _tiny_doc(hc, steps=12):
    e2e = hc.e2e_check
    doc = e2e.plan()
    doc["models"]["tiny"] = dataclasses.asdict(e2e.Config("tiny", hidden=64, layers=2, heads=4, kv_heads=2,
                                                          intermediate=96, vocab=101, rope_theta=10000.0))
    doc["train"].update(model="tiny", batch=2, seq=16, lr=3e-3)
    return doc


@pytest.mark.parametrize("train_model", ["llama-125m", "llama-350m"])
def test_the_calls_are_the_training_plans_gemms(hc, train_model):
    """Every case is a GEMM the e2e plan builds for training (forward KK, dX KN, dW MN), and every
    such GEMM is a case: the pack ``e2e_check prepare`` builds serves them all -- the GPU-bound
    run's too (``prepare --train llama-350m --phase train``: host_check runs on its folder)."""
    e2e = hc.e2e_check
    doc = e2e.plan(train_model=train_model, phases=("train",) if train_model != "llama-125m" else e2e.PHASES)
    tr = doc["train"]
    cases = hc.call_cases(e2e.CONFIGS[tr["model"]], tr["batch"] * tr["seq"])
    got = {(c["layout"], c["M"], c["N"], c["K"]) for c in cases}
    planned = {(g["layout"], g["M"], g["N"], g["K"]) for g in doc["gemms"] if g["why"].startswith("train")}
    assert got == planned and len(cases) == len(got)
    fused = e2e.plan(fuse=True, train_model=train_model, phases=("train",))
    with_gu = hc.call_cases(e2e.CONFIGS[tr["model"]], tr["batch"] * tr["seq"], fused=True)
    planned = {(g["layout"], g["M"], g["N"], g["K"]) for g in fused["gemms"] if g.get("epilogue") is None}
    assert {(c["layout"], c["M"], c["N"], c["K"]) for c in with_gu} == planned  # the fused MLP's GEMMs timed too
    assert [c["layers"] for c in with_gu if c["op"] == "fwd"].count(["gate_up"]) == 1
    scale = 1.0 if train_model == "llama-125m" else e2e.TRAINS[train_model]["deadline_s"] / e2e.PHASE_TIMEOUT["train"]
    assert hc.deadline(doc, "calls") == pytest.approx(hc.PHASE_TIMEOUT["calls"] * scale)  # more time for more work
    if train_model != "llama-125m":
        return
    assert {c["op"] for c in cases} == {"fwd", "dX", "dW"}
    q = [c for c in cases if "q_proj" in c["layers"]]
    assert [(c["op"], c["M"], c["N"], c["K"]) for c in q] == [("fwd", 4096, 768, 768), ("dX", 4096, 768, 768),
                                                            ("dW", 768, 768, 4096)]


def test_the_operands_are_what_the_backward_hands_the_front_door(hc):
    """fwd, dX and dW take the layouts and the very memory ``ops.linear_grads`` passes (no copies)."""
    rows, n_out, k_in = 32, 24, 16
    X, W, dY = torch.randn(rows, k_in).half(), torch.randn(n_out, k_in).half(), torch.randn(rows, n_out).half()
    handed = []
    ops.linear_grads(dY, X, W, (True, True, False), lambda a, b: handed.append((a, b)))
    cases = {c["op"]: c for c in hc.call_cases(hc.e2e_check.Config("t", 16, 1, 4, 2, 24, 10), rows)
             if c["weight"] == [24, 16]}
    for op, want in (("dX", handed[0]), ("dW", handed[1]), ("fwd", (X, W))):
        a, b = hc.operands(op, X, W, dY)
        assert operand_majors(a, b) == operand_majors(*want) == {"fwd": ("K", "K"), "dX": ("K", "N"),
                                                                 "dW": ("M", "N")}[op]
        assert (a.data_ptr(), b.data_ptr(), a.shape, b.shape) == (want[0].data_ptr(), want[1].data_ptr(),
                                                                  want[0].shape, want[1].shape)
        c = cases[op]
        assert (tuple(a.shape), tuple(b.shape)) == ((c["M"], c["K"]), (c["N"], c["K"]))
    with pytest.raises(ValueError, match="unknown op"):
        hc.operands("dB", X, W, dY)


def test_loss_close_takes_rounding_and_refuses_a_gap(hc):
    base = [3.0 - 0.05 * i for i in range(30)]
    assert hc.loss_close([x * 1.001 for x in base], base)["ok"]
    bad = hc.loss_close([x * 1.05 for x in base], base)
    assert not bad["ok"] and "differ by 0.05" in bad["why"]
    assert not hc.loss_close(base[:-1] + [float("nan")], base)["ok"]
    assert not hc.loss_close(base[:5], base[:5])["ok"]  # too short to say


def test_train_dry_run_times_both_and_agrees_where_the_layers_are_torchs(hc):
    """On the CPU the patched model runs F.linear: its losses are torch's exactly."""
    out = hc.train_phase(_tiny_doc(hc), steps=12, warmup=2, dev="cpu")
    (row,) = out["rows"]
    assert out["status"] == "ok" and out["swapped"] == 2 * 7 + 1
    assert row["losses"]["ours"] == row["losses"]["torch"] and len(row["losses"]["ours"]) == 12
    assert row["loss_ok"] is True and row["ratio_to_torch"] > 0 and row["tokens"] == 32


def _cpu_product(A, B, out=None, bias=None, activation=None):  # pylint: disable=unused-argument
    """The front door on the CPU (its kernels need a GPU): D = A . B^T (+ bias) in fp32, rounded."""
    D = (A.float() @ B.float().T + (0 if bias is None else bias.float())).to(A.dtype)
    return D if out is None else out.copy_(D)


def test_calls_dry_run_checks_then_times_every_case(hc, monkeypatch):
    """The calls phase on the CPU with a CPU product for the front door: every case checked (out
    poisoned, then the plain call) and timed, in the layouts the backward passes."""
    monkeypatch.setattr(hc, "gemm_ladder", type("Front", (), {"matmul": staticmethod(_cpu_product)}))
    out = hc.calls_phase(_tiny_doc(hc), dev="cpu", rounds=1)
    assert out["status"] == "ok" and len(out["rows"]) == 15  # 5 weights x fwd, dX, dW
    for row in out["rows"]:
        assert row["ok"] and row["check_out"]["rel_err"] < 1e-2 and row["ratio_to_torch"] > 0
        assert row["majors"] == {"fwd": ["K", "K"], "dX": ["K", "N"], "dW": ["M", "N"]}[row["op"]]
        assert row["fast_path"] is False  # the stand-in remembers nothing


def test_calls_check_catches_a_wrong_or_unwritten_result(hc, monkeypatch):
    """An ``out`` left as poisoned (NaN) or a result off by a little more than rounding: wrong."""
    def lazy(A, B, out=None, **kwargs):
        return _cpu_product(A, B) * 1.01 if out is None else out

    monkeypatch.setattr(hc, "gemm_ladder", type("Front", (), {"matmul": staticmethod(lazy)}))
    out = hc.calls_phase(_tiny_doc(hc), dev="cpu", rounds=1)
    assert out["status"] == "wrong"
    assert not any(r["check_out"]["ok"] or r["check_plain"]["ok"] for r in out["rows"])


def test_linear_dry_run_checks_ours_torch_and_the_op(hc, monkeypatch):
    """The linear phase on the CPU under bf16 autocast (a CPU product for the kernels): ours, torch
    and the op timed; output, dX and dW checked; the weight's gradient in fp32."""
    monkeypatch.setattr(ops, "matmul", _cpu_product)
    monkeypatch.setattr(hc.gnn, "uses_kernel", lambda x, w: True)
    out = hc.linear_phase(_tiny_doc(hc), dev="cpu", rounds=1)
    assert out["status"] == "ok" and [r["layer"] for r in out["rows"]] == list(hc.LINEAR_LAYERS)
    for row in out["rows"]:
        assert row["weight_grad_dtype"] == "torch.float32" and set(row["checks"]) == {"out", "dX", "dW"}
        assert row["op_us"] > 0 and row["ours_us"] > 0 and row["torch_us"] > 0


class _Clocks:
    def between(self, t0, t1):
        return {"sm_mhz": 1980, "samples": 1 if t0 <= t1 else 0}

    def stop(self):
        pass


def test_run_writes_every_phases_rows_with_clocks_and_a_summary(hc, tmp_path, monkeypatch, capsys):
    doc = _tiny_doc(hc)
    files.write_json(tmp_path / hc.e2e_check.PLAN_FILE, doc)
    monkeypatch.setattr(hc.device, "why_no_gpu", lambda index=0: None)
    monkeypatch.setattr(hc.device, "arch_of", lambda index: "sm_90a")
    monkeypatch.setattr(hc, "KernelPack", lambda folder: None)
    monkeypatch.setattr(hc.e2e_check, "unserved", lambda pack, doc, arch: [])
    monkeypatch.setattr(hc.harness, "gpu_info", lambda index=0: {"name": "stub"})
    monkeypatch.setattr(hc, "Sampler", _Clocks)
    call = {"t0": 1.0, "t1": 2.0, "phase": "calls", "op": "dW", "M": 768, "N": 768, "K": 4096, "ratio_to_torch": 0.9,
            "ours_us": 22.0, "torch_us": 19.8, "ours_host_us": 9.0, "torch_host_us": 6.0, "fast_path": True, "ok": True}
    lin = dict(call, phase="linear", op="fwd+bwd", layer="q_proj", ratio_to_torch=1.1, fast_path=None)
    asked = []

    def run_batch(job, items, args, timeout, explain):  # pylint: disable=unused-argument
        asked.append((job.rpartition(":")[2], items, list(args)))
        (item,) = items
        if item == "train":
            return [hc.train_phase(doc, steps=12, warmup=2, dev="cpu")]
        return [{"status": "ok", "rows": [dict(call if item == "calls" else lin)]}]

    monkeypatch.setattr(isolate, "run_batch", run_batch)  # phase_runs runs the phases
    out = tmp_path / "host_check.json"
    assert hc.main(["run", str(tmp_path), "--out", str(out)]) == 0
    assert [a[1] for a in asked] == [["calls"], ["linear"], ["train"]]
    assert all(a[2] == [str(tmp_path), "strict"] for a in asked)
    got = json.loads(out.read_text())
    assert [r["phase"] for r in got["rows"]] == ["calls", "linear", "train"]
    assert all(r["clocks"]["samples"] == 1 and "t0" not in r for r in got["rows"])
    assert got["summary"]["calls dW"]["min_ratio"] == 0.9 and got["summary"]["train step"]["ok"] is True
    assert {"gpu", "date", "commit", "front_door"} <= set(got) and got["gpu"] == {"name": "stub"}
    assert "wrote" in capsys.readouterr().out


def test_run_refuses_without_a_gpu(hc, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hc.device, "why_no_gpu", lambda index=0: "no driver")
    assert hc.main(["run", str(tmp_path), "--out", str(tmp_path / "h.json")]) == 2
    assert "no GPU (no driver)" in capsys.readouterr().err
