"""The fused epilogue's scale and residual (issue 31) on the CPU: the spec's new field and operands,
v9's kernel (C loaded by TMA into the staging buffer and read back with ldmatrix, alpha and beta as
fp32 parameters), the barrier checker on it, the front door's and the op's checks, fake tensors,
and the torch fallback's formula against float64."""

import sys

import pytest
import torch

import gemm_ladder
import gemm_ladder.serve.ops  # noqa: F401  (registers the ops)
from gemm_ladder.compile import builder, sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, epilogue_names, spec_for
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.serve import plan
from gemm_ladder.serve.front import TorchMatmul
from gemm_ladder.serve.runtime import ModuleInputError, scalar_arg
from gemm_ladder.sm90a import gemm

sys_path_bench = __import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"


# -- the spec ---------------------------------------------------------------------------------------
def test_alpha_and_the_residual_are_operands_after_the_bias_in_order():
    spec = spec_for("bfloat16", "alpha_bias_gelu_tanh+residual")
    assert (spec.alpha, spec.bias, spec.act, spec.residual) == (True, "bfloat16", "gelu_tanh", "bfloat16")
    ops = spec.epilogue_operands()
    assert [(o.name, o.role, o.shape) for o in ops] == [("bias", "epilogue", ("N",)), ("alpha", "scalar", ()),
                                                        ("C", "epilogue", ("M", "N")), ("beta", "scalar", ())]
    assert spec.epilogue == "alpha_bias_gelu_tanh+residual" and spec.tag() == "alpha_bias_gelu_tanh-residual"


@pytest.mark.parametrize("name", [n for n in epilogue_names() if "alpha" in n or "residual" in n])
def test_every_new_epilogue_name_round_trips(name):
    spec = spec_for("float16", name)
    assert spec.epilogue == name
    assert GemmSpec.parse(spec.text()) == spec and GemmSpec.from_dict(spec.to_dict()) == spec


def test_specs_without_alpha_write_what_they_wrote_before():
    assert "alpha" not in GemmSpec.with_bias().to_dict() and "alpha" not in GemmSpec().text()


def test_v9_refuses_a_residual_with_epi_under_and_other_rungs_refuse_it():
    with pytest.raises(ConfigError, match="residual C with epi_under=True is not built.*epi_under=False"):
        make_config("v9", 512, 512, 512, spec=spec_for("float16", "residual"), epi_under=True)
    with pytest.raises(ConfigError, match="no residual"):
        make_config("v11", 64, 512, 512, spec=spec_for("float16", "residual"), split_k=2)
    with pytest.raises(ConfigError, match="residual=float32"):
        make_config("v9", 512, 512, 512, spec=GemmSpec(residual="float32"))


def test_the_policy_turns_epi_under_off_for_a_residual_and_keeps_the_rule():
    spec = spec_for("float16", "residual")
    for M in (256, 8192):
        choice = plan.choose(plan.Problem(M, 4096, 4096, "float16", "sm_90a", 132, spec), use_db=False)
        assert choice.rung == "v9" and not choice.knobs.get("epi_under")
        assert choice.knobs["spec"] == spec.text()


# -- the kernel ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_v9_reads_c_through_the_staging_buffer_and_takes_the_scalars(dtype):
    """C is a TMA-loaded tensor map (no C pointer read from global memory in the epilogue), read back
    with ldmatrix (as many as the stmatrix stores), alpha and beta are float parameters after C."""
    cfg = make_config("v9", 200, 264, 320, spec=spec_for(dtype, "alpha_bias_relu+residual"), cluster_m=1,
                      dtype=dtype)
    assert [str(p.name) for p in kernel_of(cfg).params][-5:] == ["num_ctas", "bias", "alpha", "C", "beta"]
    mod = builder.build(kernel_of(cfg))
    src = mod.cuda_source()
    assert "C_tensormap" in src and "float alpha" in src and "float beta" in src
    stores = [line for line in src.splitlines() if "stmatrix_sync_aligned" in line and "void" not in line]
    assert src.count("ldmatrix_sync_aligned_m8n8_x4_shared_b16(c_pairs") == len(stores) > 0
    assert "Dreg_ptr[0] * alpha" in src and "(beta * " in src
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    counts = sass.instruction_counts(text)
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.local == 0, (counts, res)
    assert counts["LDSM"] > 0 and counts["UTMALDG"] > 0


def test_the_plain_kernel_has_no_residual_read():
    src = builder.build("v9", 200, 264, 320, cluster_m=1).cuda_source()
    assert "C_tensormap" not in src and "ldmatrix" not in src.split("__global__")[-1]


@pytest.mark.parametrize("epilogue", ["residual", "alpha_bias_gelu_tanh+residual"])
def test_the_barrier_checker_passes_the_residual_kernel(epilogue):
    """One C load per chunk on each consumer's own mbarrier, ordered by its named barrier: no
    deadlock, no phase mix-up (the checker models bar.sync, without which the storing thread would
    run ahead in the model)."""
    report = check_config(make_config("v9", 512, 512, 512, spec=spec_for("float16", epilogue)))
    assert report.ok, report.findings


def test_the_barrier_checker_still_passes_the_plain_v9_kernel():
    assert check_config(make_config("v9", 512, 512, 512, epi_under=True)).ok


# -- the front door and the op (CPU: checks, fake tensors, the fallback's formula) ---------------------
def _abc(M=5, N=8, K=16, dtype=torch.float16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(M, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype),
            torch.randn(M, N, generator=g).to(dtype))


@pytest.mark.parametrize("kwargs, words", [
    (lambda A, B, C: {"residual": C[:, :4]}, "residual has shape"),
    (lambda A, B, C: {"residual": C.float()}, "residual has dtype"),
    (lambda A, B, C: {"residual": C.t()}, "residual has shape"),
    (lambda A, B, C: {"alpha": float("inf")}, "alpha=inf is not finite"),
    (lambda A, B, C: {"beta": torch.tensor(2.0)}, "beta must be a Python float"),
    (lambda A, B, C: {"out_dtype": torch.int8}, "out_dtype=torch.int8"),
])
def test_bad_epilogue_inputs_are_refused_with_the_fix(kwargs, words):
    A, B, C = _abc()
    with pytest.raises(ModuleInputError, match=words):
        gemm_ladder.matmul(A, B, **kwargs(A, B, C))


def test_a_residual_over_a_or_partly_over_out_is_refused_but_out_is_c_is_not():
    buf = torch.randn(5 * 16 + 5 * 8, dtype=torch.float16)
    A = buf[:80].view(5, 16)
    B = torch.randn(8, 16, dtype=torch.float16)
    with pytest.raises(ModuleInputError, match="residual overlaps A"):
        gemm_ladder.matmul(A, B, residual=buf[40:80].view(5, 8))
    C = torch.randn(6, 8, dtype=torch.float16)
    with pytest.raises(ModuleInputError, match="partly overlaps out"):
        gemm_ladder.matmul(A, B, residual=C[:5], out=C[1:])
    with pytest.raises(ModuleInputError, match="A is on cpu"):  # out=C passes the checks: only the device stops it
        gemm_ladder.matmul(A, B, residual=C[:5], out=C[:5])


def test_a_residual_that_wants_grad_is_refused_under_grad_mode():
    A, B, C = _abc()
    with pytest.raises(ModuleInputError, match="residual requires grad"):
        gemm_ladder.matmul(A, B, residual=C.requires_grad_())


@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_torch_fallback_computes_the_fused_formula(act, bias):
    """TorchMatmul (the fallback and the GPU check's yardstick) against float64, in place as well."""
    A, B, C = _abc(dtype=torch.float32)
    b = torch.randn(8) if bias else None
    ref = torch.nn.functional.linear(A.double(), B.double()) * 0.75 + (b.double() if bias else 0)
    ref = {"none": lambda x: x, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[act](ref) + 0.5 * C.double()
    out = torch.empty(5, 8)
    TorchMatmul(act)(A, B, out, bias=b, alpha=0.75, C=C, beta=0.5)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    Cin = C.clone()
    TorchMatmul(act)(A, B, Cin, bias=b, alpha=0.75, C=Cin, beta=0.5)  # out is C
    assert torch.allclose(Cin.double(), ref, atol=1e-5)


def test_scalars_must_be_finite_floats():
    assert scalar_arg("alpha", 2) == 2.0
    for bad in (True, "1", None, float("nan")):
        with pytest.raises(ModuleInputError):
            scalar_arg("alpha", bad)


def test_the_epilogue_op_has_fake_shapes_and_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode  # pylint: disable=import-outside-toplevel

    with FakeTensorMode():
        A = torch.empty(3, 5, 16, dtype=torch.bfloat16, device="cuda")
        B = torch.empty(8, 16, dtype=torch.bfloat16, device="cuda")
        C = torch.empty(3, 5, 8, dtype=torch.bfloat16, device="cuda")
        D = torch.ops.gemm_ladder.mm_epilogue(A, B, None, "relu", 0.5, C, 2.0)
        assert D.shape == (3, 5, 8) and D.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="C is"):
            torch.ops.gemm_ladder.mm_epilogue(A, B, None, None, 0.5, C[:, :2], 2.0)


def test_the_epilogue_ops_backward_matches_torch_autograd():
    """The recomputed backward on the CPU (the forward is the GPU's; here its formula in torch)."""
    ops = gemm_ladder.serve.ops
    A, B, C = (t.double().requires_grad_() for t in _abc())
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    z = torch.nn.functional.gelu(torch.nn.functional.linear(A, B) * 0.75 + b, approximate="tanh") + 0.5 * C
    g = torch.randn_like(z)
    want = torch.autograd.grad(z, (A, B, b, C), g)

    class Ctx:  # what setup_context saves, as register_autograd would
        needs_input_grad = (True, True, True, False, False, True, False)

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors
    ctx = Ctx()
    ops._epilogue_setup(ctx, (A.detach(), B.detach(), b.detach(), "gelu_tanh", 0.75, C.detach(), 0.5), None)
    got = ops._epilogue_backward(ctx, g)
    for w, h in zip(want, (got[0], got[1], got[2], got[5])):
        assert torch.allclose(w, h, rtol=1e-5, atol=1e-5)  # the activation's backward runs in fp32


# -- the GPU check's pure parts -------------------------------------------------------------------------
def test_the_gpu_checks_plan_covers_every_new_epilogue_and_the_llama_shapes():
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("epilogue_check", sys_path_bench / "epilogue_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cases = mod.cases()
    checked = {(c["epilogue"], c["dtype"]) for c in cases if c["purpose"] == "check"}
    assert {e for e, _ in checked} >= {*mod.CHECK_EPILOGUES, *mod.FP32_EPILOGUES, "swiglu"}
    assert {d for _, d in checked} == {"float16", "bfloat16"}
    assert any(c.get("d") == "float32" for c in cases if c["purpose"] == "check")
    timed = {(c["shape"][1], c["shape"][2]) for c in cases if c["purpose"] == "time"}
    assert timed == {(4096, 4096), (14336, 4096), (4096, 14336), (28672, 4096)}  # the last: SwiGLU's W_gu
    assert mod.within(1e-3, 1e-3) and not mod.within(0.5, 0.1) and not mod.within(float("nan"), 1.0)
    A, B, C = (t.double() for t in _abc())
    ref = mod.reference(A, B, None, "relu", 2.0, C, 0.5)
    assert torch.allclose(ref, torch.relu(2.0 * A @ B.t()) + 0.5 * C)


def test_the_checker_needs_the_named_barriers_the_residual_kernel_declares(monkeypatch):
    """Without modelling bar.sync (the kernel's NAMED_BARRIERS_ATTR), the storing thread would run
    ahead in the model and the C barrier's phases mix: the attribute is what makes the check true."""
    from gemm_ladder.protocol import check as check_mod  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(check_mod, "NAMED_BARRIERS_ATTR", "gemm_ladder.not_an_attr")
    report = check_config(make_config("v9", 256, 256, 512, spec=spec_for("float16", "residual"), cluster_m=1))
    assert not report.ok and "c_ready" in " ".join(report.findings)


# -- a float32 D (the spec's d) -------------------------------------------------------------------------
FP32 = GemmSpec(a="bfloat16", b="bfloat16", d="float32", bias="float32", act="relu", alpha=True)


def test_a_float32_d_is_built_for_v9_from_16_bit_inputs_only():
    make_config("v9", 256, 256, 512, spec=FP32, dtype="bfloat16")
    for spec, words in ((GemmSpec(a="float32", b="float32", d="float32"), "float32. is not supported"),
                        (GemmSpec(d="float32", residual="float16"), "in D's dtype"),
                        (GemmSpec(d="float32", bias="float16"), "in D's dtype")):
        with pytest.raises(ConfigError, match=words):
            make_config("v9", 256, 256, 512, spec=spec)
    with pytest.raises(ConfigError, match="no fp32_out"):
        make_config("v11", 64, 256, 512, spec=GemmSpec(d="float32"), split_k=2)
    with pytest.raises(ConfigError, match="float32 D with tail_n=0, epi_under=True"):
        make_config("v9", 256, 256, 512, spec=GemmSpec(d="float32"), epi_under=True)


def test_v9_with_a_float32_d_stages_float32_and_stores_32_column_boxes():
    cfg = make_config("v9", 200, 264, 320, spec=FP32, cluster_m=1, dtype="bfloat16")
    mod = builder.build(kernel_of(cfg))
    src = mod.cuda_source()
    assert "float* __restrict__ bias_ptr" in src and "((float*)pool_buf_ptr)[" in src
    assert "stmatrix_sync_aligned_m8n8_x4_shared_b16(" not in src.split("__global__")[-1]
    assert "cvt_bf16x2" not in src.split("__global__")[-1]  # nothing rounded to 16 bits
    # 256 columns a tile, 32 of float32 a box: 8 stores a tile (16-bit D: 4 of 64)
    stores = [line for line in src.split("__global__")[-1].splitlines() if "cp_async_bulk_tensor_s2g" in line]
    assert len(stores) == 8
    assert mod.manifest()["spec"]["d"] == "float32"


def test_the_barrier_checker_passes_the_float32_d_kernel():
    assert check_config(make_config("v9", 512, 512, 512, spec=FP32, dtype="bfloat16")).ok


def test_out_dtype_is_checked_and_the_fallback_computes_a_float32_d():
    A, B, C = _abc()
    with pytest.raises(ModuleInputError, match="out has dtype torch.float16; it must be D's torch.float32"):
        gemm_ladder.matmul(A, B, out=torch.empty(5, 8, dtype=torch.float16), out_dtype=torch.float32)
    with pytest.raises(ModuleInputError, match="residual has dtype torch.float16; it must be D's torch.float32"):
        gemm_ladder.matmul(A, B, residual=C, out_dtype=torch.float32)
    out = torch.empty(5, 8)
    TorchMatmul("none")(A, B, out, alpha=2.0)
    assert torch.allclose(out.double(), 2.0 * A.double() @ B.double().t(), atol=1e-4)


def test_the_policy_serves_a_float32_d_with_v9_without_epi_under():
    for M in (128, 8192):
        choice = plan.choose(plan.Problem(M, 4096, 4096, "bfloat16", "sm_90a", 132, FP32), use_db=True)
        assert choice.rung == "v9" and not choice.knobs.get("epi_under") and not choice.knobs.get("tail_n")


# -- SwiGLU (the front door's; not one kernel yet) -------------------------------------------------------
def test_swiglu_refuses_an_odd_fused_weight_and_a_bad_out():
    x, W = torch.randn(4, 16, dtype=torch.float16), torch.randn(7, 16, dtype=torch.float16)
    with pytest.raises(ModuleInputError, match="even number of rows"):
        gemm_ladder.swiglu(x, W)
    W = torch.randn(8, 16, dtype=torch.float16)
    with pytest.raises(ModuleInputError, match=r"out must be a contiguous \(4, 4\)"):
        gemm_ladder.swiglu(x, W, out=torch.empty(4, 8, dtype=torch.float16))


def test_swiglus_elementwise_half_is_silu_of_the_gate_times_the_up_half():
    from gemm_ladder.serve.front import glu_halves  # pylint: disable=import-outside-toplevel

    x, Wg, Wu = torch.randn(3, 16).double(), torch.randn(4, 16).double(), torch.randn(4, 16).double()
    h = x @ torch.cat([Wg, Wu]).t()
    want = torch.nn.functional.silu(x @ Wg.t()) * (x @ Wu.t())
    assert torch.allclose(glu_halves(h.half()).double(), want, rtol=2e-2, atol=2e-2)
    out = torch.empty(3, 4, dtype=torch.float64)
    assert glu_halves(h, out) is out and torch.allclose(out, want.float().double(), atol=1e-5)


# -- SwiGLU in one kernel (the spec's gated B) -----------------------------------------------------------
def test_a_gated_spec_halves_d_and_refuses_what_is_not_built():
    spec = spec_for("bfloat16", "swiglu")
    assert (spec.gated, spec.act, spec.epilogue, spec.tag()) == (True, "silu", "swiglu", "swiglu")
    assert spec.operands()[2].extent(7, 528, 320) == (7, 264)
    assert GemmSpec.parse(spec.text()) == spec and GemmSpec.from_dict(spec.to_dict()) == spec
    assert spec_for("float16", "gated_gelu_tanh").act == "gelu_tanh"
    for bad in (GemmSpec(gated=True), GemmSpec(gated=True, act="silu", bias="float16")):
        with pytest.raises(ConfigError, match="gated B"):
            make_config("v9", 256, 512, 512, spec=bad)
    with pytest.raises(ConfigError, match="epi_n dividing blk_n / 2 = 128"):
        make_config("v9", 256, 512, 512, spec=spec, dtype="bfloat16", epi_n=256)
    with pytest.raises(ConfigError, match="no gated"):
        make_config("v10", 256, 512, 512, spec=spec, dtype="bfloat16", split_k=2)


@pytest.mark.parametrize("cluster_m", [1, 2])
def test_v9_swiglu_loads_gate_and_up_rows_into_one_b_tile_and_stores_half(cluster_m):
    """B's tile: the gate rows of the tile's outputs and, past N / 2, their up rows (two boxes, or
    one a CTA of a pair); the epilogue multiplies silu(register r) by register r + acc_stride / 2 and
    stores 128 of the 256 columns (two 64-column stores a consumer a tile)."""
    cfg = make_config("v9", 200, 528, 320, spec=spec_for("float16", "swiglu"), cluster_m=cluster_m)
    assert [o.shape for o in gemm.operands(cfg, gemm.V9, 200, 1)] == [(200, 320), (528, 320), (200, 264)]
    src = builder.build(kernel_of(cfg)).cuda_source()
    body = src.split("__global__")[-1]
    assert "+ 264)" in body  # the up rows start N / 2 = 264 rows down W_gu
    assert "* Dreg_ptr[65])" in body and "* Dreg_ptr[64])" in body  # gate column c meets up column c + 128
    stores = [line for line in body.splitlines() if "cp_async_bulk_tensor_s2g" in line]
    assert len(stores) == 2


def test_the_barrier_checker_passes_the_swiglu_kernel():
    for cluster_m in (1, 2):
        cfg = make_config("v9", 512, 1024, 512, spec=spec_for("float16", "swiglu"), cluster_m=cluster_m)
        assert check_config(cfg).ok


def test_the_policy_serves_swiglu_with_v9_and_half_tile_chunks():
    spec = spec_for("bfloat16", "swiglu")
    for M in (128, 2048, 8192):
        choice = plan.choose(plan.Problem(M, 28672, 4096, "bfloat16", "sm_90a", 132, spec), use_db=True)
        assert choice.rung == "v9" and not choice.knobs.get("epi_under")
        assert choice.knobs.get("epi_n", 64) <= choice.knobs.get("blk_n", 256) // 2


def test_the_swiglu_op_has_fake_shapes():
    """Fake tensors: D is half of W_gu's rows wide; an odd W_gu is refused. (Its backward, on our
    kernels through the op gemm_ladder::mm: tests/test_swiglu_backward.py.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode  # pylint: disable=import-outside-toplevel

    with FakeTensorMode():
        x = torch.empty(2, 3, 16, dtype=torch.bfloat16, device="cuda")
        Y = torch.ops.gemm_ladder.swiglu(x, torch.empty(10, 16, dtype=torch.bfloat16, device="cuda"))
        assert Y.shape == (2, 3, 5)
        with pytest.raises(RuntimeError, match="W_gu has 9 rows"):
            torch.ops.gemm_ladder.swiglu(x, torch.empty(9, 16, dtype=torch.bfloat16, device="cuda"))


def test_the_gpu_checks_children_make_a_hang_and_a_crash_rows_and_go_on(tmp_path, monkeypatch):
    """``run``'s checks never hang: a module that gives no result in time is a ``timeout`` row, one
    that kills its child a ``crash`` row, and a new child goes on with the next (a stand-in child)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("epilogue_check", sys_path_bench / "epilogue_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    child = tmp_path / "child.py"
    child.write_text(
        "import json, os, sys, time\n"
        "for job in sys.argv[2:]:\n"
        "    path, M = job.rsplit(':', 1)\n"
        "    if path.endswith('hang'): time.sleep(60)\n"
        "    if path.endswith('crash'): os._exit(3)\n"
        "    print('RESULT ' + json.dumps({'file': path, 'M': int(M), 'status': 'ok'}), flush=True)\n")
    monkeypatch.setattr(mod, "__file__", str(child))
    monkeypatch.setattr(mod, "CHECK_TIMEOUT", 5.0)  # the stand-in hangs for 60 s
    jobs = [(tmp_path / n, 8) for n in ("a", "hang", "b", "crash", "c")]
    monkeypatch.setattr(mod.sys, "executable", sys.executable)
    got = [r["status"] for r in mod.check_isolated(jobs)]
    assert got == ["ok", "timeout", "ok", "crash", "ok"], got
