"""The tutorials' helpers: the GPU cells, driven on the CPU with the GPU jobs answered by canned
results; the committed-run reader; tutorial 14's fusion model and epilogue excerpt; tutorial 15's
operand layouts, TMA boxes, descriptors and autograd calls; tutorial 16's fp8 models.

The notebooks call ``teach.check_and_time`` when a GPU is there; CI has none, so this runs the
same function with ``isolate.run_isolated`` replaced: the glue (export, check, time, printing,
stopping on a wrong kernel) is exercised here, the kernels themselves by the GPU tier.
"""

import hashlib
import json
import re

import pytest

from gemm_ladder import teach
from gemm_ladder.core.records import RecordError
from gemm_ladder.core.spec import GemmSpec, spec_for
from gemm_ladder.measure import isolate
from gemm_ladder.rungs import make_config
from gemm_ladder.teach import fusion, operands

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


# -- committed runs (teach.committed_run) ---------------------------------------------------------------------
def _run_file(tmp_path, data, name="x_check.json"):
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / name).write_text(json.dumps(data))
    return teach.committed_run("run", name, results_dir=tmp_path)


GPU = {"name": "NVIDIA H100 80GB HBM3", "sm_clock_mhz_max": "1980 MHz", "power_limit": "700.00 W", "driver": "580"}


def test_a_committed_run_gives_its_gpu_commit_and_a_geomean_per_op(tmp_path):
    rows = [{"op": "a", "kernel_ratio": 1.0}, {"op": "a", "kernel_ratio": 4.0}, {"op": "b", "kernel_ratio": 0.5},
            {"op": "b"}]  # a row without the ratio is left out
    run = _run_file(tmp_path, {"gpu": GPU, "run": {"date": "2026-11-26T03:11:11", "commit": "2feb607abc"},
                               "rows": rows})
    assert run.commit == "2feb607abc" and len(run.rows) == 4
    line = run.describe()
    assert "H100" in line and "commit 2feb607:" in line and "2026-11-26," in line
    summary = {r["op"]: r for r in teach.ratio_summary(run.rows)}
    assert summary["a"]["geomean"] == 2.0 and summary["a"]["lowest"] == 1.0 and summary["b"]["rows"] == 1
    # the date and commit at the top, the rows as "results" (python -m gemm_ladder bench)
    bench = _run_file(tmp_path, {"gpu": GPU, "date": "2026-11-26", "commit": "6f46cf6", "results": rows}, "b.json")
    assert bench.commit == "6f46cf6" and len(bench.rows) == 4


def test_a_damaged_committed_run_is_named(tmp_path):
    with pytest.raises(RecordError, match=r"x_check.json.*commit"):
        _run_file(tmp_path, {"gpu": GPU, "rows": []})
    with pytest.raises(RecordError, match=r"x_check.json.*gpu"):
        _run_file(tmp_path, {"date": "d", "commit": "c", "rows": []})
    with pytest.raises(RecordError, match="nothing.json"):
        teach.committed_run("run", "nothing.json", results_dir=tmp_path)
    with pytest.raises(ValueError, match="positive"):
        teach.geomean([1.0, 0.0])


def test_the_committed_epilogue_run_reads_as_its_readme_says():
    """The reader takes the kernel-level ratio against torch's best path: SwiGLU's 1.118 geomean."""
    run = teach.committed_run("2026-11-26_h100_epilogue", "epilogue_check.json")
    summary = {r["op"]: r for r in teach.ratio_summary(run.rows)}
    assert summary["swiglu"]["geomean"] == 1.118 and summary["residual"]["geomean"] == 0.986
    assert all(r["measured x unfused"] for r in fusion.measured_vs_model(run.rows))


def test_sampled_clocks_sum_up_the_busy_samples_and_name_a_bad_line(tmp_path):
    (tmp_path / "run").mkdir()
    head = "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu\n"
    idle, busy = "t, 345 MHz, 2619 MHz, 70.0 W, 34\n", ["t, 1980 MHz, 2619 MHz, 400.0 W, 50\n",
                                                        "t, 1400 MHz, 2619 MHz, 700.0 W, 64\n",
                                                        "t, 1500 MHz, 2619 MHz, 690.0 W, 60\n"]
    (tmp_path / "run" / "clocks.csv").write_text(head + idle + "".join(busy) + idle)
    line = teach.sampled_clocks("run", results_dir=tmp_path)
    assert line.startswith("3 busy sample(s) of 5") and "median 1500 MHz (lowest 1400)" in line
    assert "700 W and 64 C" in line
    (tmp_path / "run" / "clocks.csv").write_text(head + idle + "t, fast, 2619 MHz, 400 W, 50\n")
    with pytest.raises(RecordError, match=r"clocks.csv: line 3"):
        teach.sampled_clocks("run", results_dir=tmp_path)
    (tmp_path / "run" / "clocks.csv").write_text("timestamp, power.draw [W]\n" + idle)
    with pytest.raises(RecordError, match=r"no clocks.current.sm \[MHz\] / temperature.gpu column"):
        teach.sampled_clocks("run", results_dir=tmp_path)


# -- tutorial 14: the bytes a fused epilogue saves ------------------------------------------------------------
@pytest.mark.parametrize("op", fusion.OPS)
def test_fusing_keeps_the_gemm_and_drops_memory_bound_kernels(op):
    for M, N, K in ((128, 4096, 4096), (8192, 14336, 4096)):
        p = fusion.paths(op, M, N, K)
        (fused,), unfused = p["fused"], p["unfused"]
        assert fused.flops == sum(k.flops for k in unfused) > 0  # the same math, in one kernel
        assert all(k.bytes > 0 for k in unfused if not k.flops)  # what is dropped only moves bytes
        assert sum(k.bytes for k in unfused) > fused.bytes
        assert sum(k.seconds() for k in unfused) > fused.seconds()
    rows = fusion.model_rows([(8192, 4096, 4096)], ops=(op,))
    assert rows[0]["saved MB"] > 0 and rows[0]["model ratio"] > 1


def test_the_fusion_model_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="use one of"):
        fusion.paths("bias_relu", 128, 128, 128)
    with pytest.raises(ValueError, match="M must be a positive int"):
        fusion.paths("residual", 0, 128, 128)


def test_the_bytes_picture_draws_every_kernel_of_every_path():
    fig = fusion.plot_epilogue_bytes(2048, 4096, 4096)
    ax_b = fig.axes[0]
    kernels = sum(len(ks) for op in fusion.OPS for ks in fusion.paths(op, 2048, 4096, 4096).values())
    assert len(ax_b.patches) == kernels


def test_the_epilogue_excerpt_shows_the_bias_the_activation_and_the_store(built):
    mod = built("v9", (256, 512, 128), {"spec": spec_for("float16", "bias_gelu_tanh")}).module
    lines = [text for _, text in fusion.epilogue_lines(mod)]
    order = [next(i for i, t in enumerate(lines) if re.search(p, t))
             for p in (r"pre_act = .*bias_ptr", r"tanhf", r"stmatrix", r"fence_proxy", r"cp_async_bulk_tensor")]
    assert order == sorted(order)
    assert not any(re.search(r"0x[0-9a-f.]+p", t) for t in lines)  # literals shown as decimals
    with pytest.raises(LookupError, match="no residual epilogue"):
        fusion.epilogue_lines(mod, "residual")


def test_the_epilogue_excerpt_shows_the_residual_read_and_swiglus_up_register(built):
    res = built("v9", (256, 512, 128), {"spec": spec_for("float16", "bias_relu+residual")}).module
    lines = [text for _, text in fusion.epilogue_lines(res, "residual")]
    order = [next(i for i, t in enumerate(lines) if re.search(p, t))
             for p in (r"mbarrier_wait", r"ldmatrix", r"cvt_.*beta \*", r"stmatrix", r"cp_async_bulk_tensor")]
    assert order == sorted(order)  # C's chunk waited for, read back, added before the rounding, stored
    gated = built("v9", (256, 512, 128), {"spec": spec_for("float16", "swiglu")}).module
    rounding = next(t for _, t in fusion.epilogue_lines(gated, "gated") if "cvt_" in t)
    up = re.search(r"expf\(.*?\* Dreg_ptr\[(\d+)\]", rounding)  # silu(gate) * the up register
    assert up and int(up.group(1)) > 1  # the same thread's register, half the accumulators further


# -- tutorial 15: layouts and the backward pass ---------------------------------------------------------------
def test_the_op_backward_calls_mn_major_views_as_the_tutorial_table_says():
    calls = {r["call"]: r for r in operands.autograd_calls(96, 32, 48, activation="relu")}
    assert set(calls) == {"forward", "backward: Z again", "backward: dX", "backward: dW"}
    for row in operands.training_rows(96, 32, 48):
        call = calls["forward" if row["GEMM"] == "forward" else f"backward: {row['GEMM']}"]
        assert (call["A major"], call["B major"]) == (row["A major"], row["B major"])
        assert call["D"] == "x".join(row["M x N x K"].split("x")[:2])
    assert len(operands.autograd_calls(96, 32, 48)) == 3  # no activation: nothing recomputed


def test_an_mn_major_operand_is_loaded_in_k_row_boxes_and_read_transposed():
    cfg = make_config("v9", 256, 512, 256, spec=GemmSpec(b_major="N"), cluster_m=1)
    a, b = operands.operand_rows(cfg)
    assert (a["major"], a["trans"], b["major"], b["trans"]) == ("K", 0, "N", 1)
    assert a["in global"] == "[M, K] = [256, 256]" and b["in global"] == "[K, N] = [256, 512]"
    assert a["TMA box"] == f"{cfg.blk_m}x{cfg.blk_k}"  # rows of M, K contiguous
    assert b["TMA box"] == f"{cfg.blk_k}x64"  # rows of K, 64 of N (one 128-byte line) contiguous
    assert b["smem tile"] == f"{cfg.blk_k}x{cfg.blk_n}"
    assert b["LBO"] > 1 and a["LBO"] == 1  # LBO is the step to the next 64 of N; unused K-major
    fig = operands.plot_operand_tiles()
    assert len(fig.axes) == 2


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
