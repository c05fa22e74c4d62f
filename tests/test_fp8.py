"""fp8 (issue 32, first slice): the spec, v9's e4m3 kernel (SASS, barriers), the front door's checks,
the fake op, the quantize helper, and the GPU check's pure parts. CPU only."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torch._subclasses.fake_tensor import FakeTensorMode

import gemm_ladder
import gemm_ladder.serve.scaled_ops  # noqa: F401  (registers torch.ops.gemm_ladder.scaled_mm)
from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, check_built, not_built
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.serve import scaled
from gemm_ladder.serve.front import KernelFallbackWarning, NoKernelError
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.serve.scaled import check_call
from gemm_ladder.sm90a import hgemm_v9

from .built import built

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_check  # noqa: E402  (the GPU check's pure parts)

V9 = hgemm_v9.EPILOGUES


# -- the spec --------------------------------------------------------------------------------------
def test_fp8_specs_are_built_for_v9_and_refused_by_name_elsewhere():
    for spec in (GemmSpec.fp8(), GemmSpec.fp8("float16", "row", "float32"), GemmSpec.fp8(b="float8_e5m2"),
                 GemmSpec.fp8(scales="block")):
        check_built(spec, "v9", V9)
    cases = [(GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16"), "takes fp32 scales"),
             (GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="tensor", b_major="N"),
              r"K-major: pass B as \[N, K\] row-major / call .t\(\).contiguous\(\)"),
             (GemmSpec(a="float8_e4m3", b="float8_e4m3", d="float32", scales="tensor"), "fp32 out is not built"),
             (GemmSpec(a="float8_e5m2", b="float8_e4m3", d="bfloat16", scales="tensor"), "A float8_e4m3"),
             (GemmSpec.fp8(bias="float16"), "bias=float16"),
             (GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row", act="relu"), "activation")]
    for spec, words in cases:
        with pytest.raises(ConfigError, match=words):
            check_built(spec, "v9", V9)
    assert "built for v9" in not_built(GemmSpec.fp8(), "v10")


def test_16bit_knobs_and_tags_are_unchanged_and_fp8_has_its_own():
    plain = make_config("v9", 256, 256, 512)
    assert "promote" not in plain.knobs() and plain.blk_k == 64 and plain.blk_n == 256
    # (pdl: the production presets' launch knob, 2026-11-29, off by default)
    assert plain.tag() == "v9_256x256x512_float16_sm_90a_m128n256k64w2p4g8clusterm2clustern1dynamicmFalseepin64" \
                          "epiunderFalsekzigzagFalsepdlFalsestreambFalsetailn0tileordersnake"
    cfg = make_config("v9", 256, 256, 512, spec=GemmSpec.fp8())
    assert (cfg.dtype, cfg.blk_k, cfg.blk_n, cfg.knobs()["promote"]) == ("bfloat16", 128, 128, 1)
    assert cfg.tag().endswith("_a_float8_e4m3-b_float8_e4m3-scales_tensor")
    with pytest.raises(ConfigError, match="promote: fp8 specs only"):
        make_config("v9", 256, 256, 512, promote=1)


@pytest.mark.parametrize("knobs, words", [({"blk_k": 64}, "blk_k=128"), ({"epi_under": True, "promote": 0}, "epi_under=True with fp8 and promote=0"),
                                          ({"blk_n": 256}, "use blk_n=128"), ({"promote": -1}, "promote=-1")])
def test_fp8_knobs_that_do_not_build_are_refused_before_compiling(knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 512, 512, 512, spec=GemmSpec.fp8(), **knobs)
    make_config("v9", 512, 512, 512, spec=GemmSpec.fp8(), blk_n=256, promote=0)  # no promoted sums: it fits


def test_fp8_k_must_be_a_multiple_of_16():
    with pytest.raises(ConfigError, match="multiple of 16"):
        make_config("v9", 512, 512, 520, spec=GemmSpec.fp8())


# -- the kernel ------------------------------------------------------------------------------------
def _sass(cfg):
    mod = built(cfg)
    try:
        return mod, sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")


def _count(text: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\b", text))


def test_v9_fp8_runs_e4m3_wgmma_and_the_promotion_adds():
    """The e4m3 wgmma (QGMMA in SASS) at k32; with promote=1 a tile's sums are added in fp32 (FADDs
    that promote=0 does not have), and neither spills."""
    spec = GemmSpec.fp8("bfloat16", "row")
    on = make_config("v9", 1000, 3008, 1024, spec=spec, promote=1)
    off = make_config("v9", 1000, 3008, 1024, spec=spec, promote=0)
    src = built(on).cuda_source()
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in src and "scale_a_ptr" in src
    _, t_on, r_on = _sass(on)
    _, t_off, r_off = _sass(off)
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in t_on and "QGMMA.64x128x32.F32.E4M3.E4M3" in t_off
    assert _count(t_on, "FADD") >= 64 and _count(t_off, "FADD") == 0, (_count(t_on, "FADD"), _count(t_off, "FADD"))
    assert r_on.local == 0 and r_off.local == 0 and _count(t_on, "STL") == 0


def test_v9_fp8_with_e5m2_b_and_a_bias_builds():
    cfg = make_config("v9", 256, 512, 512, spec=GemmSpec.fp8("float16", "tensor", "float32", b="float8_e5m2"))
    assert [str(p.name) for p in kernel_of(cfg).params][-4:] == ["num_ctas", "bias", "scale_a", "scale_b"]
    assert ".e4m3.e5m2" in built(cfg).cuda_source()


@pytest.mark.parametrize("promote", [0, 1, 3])
def test_the_barrier_checker_passes_the_fp8_kernel(promote):
    """The promotion's groups release every slot once, after its wgmmas retired (the checker's
    model of the ring), with groups that divide K (3 does not: a shorter last group)."""
    assert check_config(make_config("v9", 512, 512, 1280, spec=GemmSpec.fp8(), promote=promote)).ok


# -- the front door --------------------------------------------------------------------------------
def _operands(M=64, N=48, K=32, recipe="row"):
    a, w = torch.randn(M, K), torch.randn(N, K)
    aq, sa = gemm_ladder.quantize_fp8(a, recipe)
    wq, sw = gemm_ladder.quantize_fp8(w, recipe)
    return aq, wq.t(), sa, (sw.t() if recipe == "row" else sw)


def test_quantize_fp8_round_trips_within_e4m3s_precision():
    x = torch.randn(64, 256) * torch.logspace(-2, 2, 64).unsqueeze(1)  # rows of very different ranges
    for recipe in ("tensor", "row"):
        q, s = gemm_ladder.quantize_fp8(x, recipe)
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
        assert s.shape == (() if recipe == "tensor" else (64, 1))
        assert q.float().abs().max() == 448  # the amax lands on the largest e4m3
        back = q.float() * s
        rel = ((back - x).abs() / x.abs().amax(dim=1, keepdim=True)).max()
        assert rel <= 2 ** -4, rel  # 3 mantissa bits: half an ulp at the row's top binade
    q, s = gemm_ladder.quantize_fp8(torch.zeros(4, 16), "row")
    assert torch.isfinite(s).all() and (q.float() == 0).all()
    with pytest.raises(ModuleInputError, match="recipe 'block128'"):
        gemm_ladder.quantize_fp8(x, "block128")


def test_check_call_takes_torch_scaled_mm_layouts_and_recipes():
    aq, b, sa, sb = _operands()
    call = check_call(aq, b, sa, sb)
    assert (call.M, call.N, call.K, call.recipe) == (64, 48, 32, "row") and call.spec == GemmSpec.fp8("bfloat16", "row")
    assert check_call(aq, b, sa.reshape(-1), sb.reshape(-1)).recipe == "row"
    aq, b, sa, sb = _operands(recipe="tensor")
    call = check_call(aq, b, sa, sb, bias=torch.zeros(48), out_dtype=torch.float16)
    assert call.spec == GemmSpec.fp8("float16", "tensor", "float32")
    assert check_call(aq, b, sa, sb, out_dtype=torch.float32).spec is None  # torch's


@pytest.mark.parametrize("change, words", [
    (lambda o: {**o, "A": o["A"].float()}, "A is torch.float32; pass torch.float8_e4m3fn"),
    (lambda o: {**o, "B": o["B"].t().contiguous().t().contiguous()}, r"column-major.*\.t\(\)\.contiguous\(\)"),
    (lambda o: {**o, "B": o["B"].t()}, r"looks like \[N, K\]: pass B.t\(\)"),
    (lambda o: {**o, "A": o["A"].t().contiguous().t()}, "row-major"),
    (lambda o: {**o, "scale_a": o["scale_a"].double()}, "scales are torch.float32"),
    (lambda o: {**o, "scale_a": o["scale_a"][:10]}, "no recipe"),
    (lambda o: {**o, "bias": torch.zeros(47)}, r"shape \[48\]"),
    (lambda o: {**o, "bias": torch.zeros(48, dtype=torch.float16)}, "bias is torch.float16"),
    (lambda o: {**o, "out_dtype": torch.int8}, "out_dtype"),
    (lambda o: {**o, "out": torch.empty(64, 48)}, r"out must be a \[64, 48\] torch.bfloat16"),
])
def test_check_call_refuses_with_the_fix(change, words):
    aq, b, sa, sb = _operands()
    o = change({"A": aq, "B": b, "scale_a": sa, "scale_b": sb})
    with pytest.raises(ModuleInputError, match=words):
        check_call(o["A"], o["B"], o["scale_a"], o["scale_b"], o.get("bias"), o.get("out_dtype"), o.get("out"))


def test_k_and_n_must_be_multiples_of_16_and_k_not_0():
    aq, b, sa, sb = _operands(K=24)
    with pytest.raises(ModuleInputError, match="multiples of 16"):
        check_call(aq, b, sa, sb)
    aq, b, sa, sb = _operands(N=40)
    with pytest.raises(ModuleInputError, match="multiples of 16"):
        check_call(aq, b, sa, sb)
    z = torch.empty(64, 0, dtype=torch.float8_e4m3fn)
    with pytest.raises(ModuleInputError, match="K=0"):
        check_call(z, torch.empty(48, 0, dtype=torch.float8_e4m3fn).t(), torch.ones(1), torch.ones(1))


def test_scaled_mm_refuses_cpu_tensors_and_the_fake_op_gives_shapes():
    aq, b, sa, sb = _operands()
    with pytest.raises(ModuleInputError, match="GPU"):
        gemm_ladder.scaled_mm(aq, b, sa, sb)
    with FakeTensorMode():
        a = torch.empty(1000, 1024, dtype=torch.float8_e4m3fn)
        w = torch.empty(3008, 1024, dtype=torch.float8_e4m3fn)
        d = torch.ops.gemm_ladder.scaled_mm(a, w.t(), torch.ones(1000, 1), torch.ones(1, 3008), None, torch.float16)
        assert d.shape == (1000, 3008) and d.dtype == torch.float16
        with pytest.raises(ModuleInputError, match="column-major"):
            torch.ops.gemm_ladder.scaled_mm(a, w.t().contiguous(), torch.ones(1), torch.ones(1))


def test_scaled_mm_routes_to_a_given_module_else_to_torch_with_one_warning(monkeypatch):
    """use_module's module where it fits (its spec, N and K; any M at runtime M); else, where
    nothing can be built, torch._scaled_mm with one warning per shape, or NoKernelError (strict)."""
    monkeypatch.setattr(scaled.device, "arch_of", lambda index: "sm_90a")
    monkeypatch.setattr(scaled, "why_no_build", lambda: "GEMM_LADDER_BUILD=0")
    scaled.reset()
    call = check_call(*_operands(M=64, N=48, K=32))
    with pytest.warns(KernelFallbackWarning, match=r"torch._scaled_mm computes it.*GEMM_LADDER_BUILD=0"):
        route = scaled._resolve(call, 0, False, torch.bfloat16)
    assert isinstance(route.module, scaled.TorchScaledMM) and route.lines[0] == "kernel: torch._scaled_mm"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        scaled._resolve(call, 0, False, torch.bfloat16)
    with pytest.raises(NoKernelError, match="use_module"):
        scaled._resolve(call, 0, True, torch.bfloat16)
    tensor = SimpleNamespace(spec=GemmSpec.fp8(scales="tensor"), N=48, K=32, M=None, dynamic_m=True, rung="v9",
                             path="t.so")
    rows = SimpleNamespace(spec=call.spec, N=48, K=32, M=None, dynamic_m=True, rung="v9", path="r.so")
    scaled.use_module(rows)
    scaled.use_module(tensor)  # newest first, but not the call's recipe
    route = scaled._resolve(call, 0, True, torch.bfloat16)
    assert route.module is rows and route.lines[1] == "source: use_module r.so"
    with pytest.raises(ModuleInputError, match="no fp8 module"):
        scaled.use_module(SimpleNamespace(spec=GemmSpec(), path="h.so"))
    scaled.reset()


# -- the GPU check's pure parts --------------------------------------------------------------------
def test_the_gpu_check_plans_modules_that_build_and_judges_by_torchs_error():
    for _, N, K, recipe, promote, bias, more in fp8_check.MODULES:
        make_config("v9", 256, N, K, spec=fp8_check.spec_of(recipe, bias), dynamic_m=True, promote=promote, **more)
    names = {m[0] for m in fp8_check.MODULES}
    assert {n for n, _ in fp8_check.CHECKS} <= names and {n for n, _, _ in fp8_check.TIMED} <= names
    assert {n for n, _ in fp8_check.CHECKS} >= {n for n, _, _ in fp8_check.TIMED}  # nothing timed unchecked
    assert fp8_check.passes(1.9e-3, 1e-3) and not fp8_check.passes(2.1e-3, 1e-3)
    assert not fp8_check.passes(float("nan"), 1e-3) and fp8_check.passes(0.0, 0.0)
    assert fp8_check.tflops(4096, 4096, 4096, 0.1) == pytest.approx(1374.39, rel=1e-4)
    assert fp8_check.ratio(2.0, 1.0) == 2.0 and fp8_check.ratio(None, 1.0) is None
    checks = [{"name": "a", "rel_err": 1e-3, "torch_rel_err": 1e-3, "nan": False, "correct": True},
              {"name": "a", "rel_err": 5e-3, "torch_rel_err": 1e-3, "nan": False, "correct": False},  # less accurate
              {"name": "b", "rel_err": 1e-3, "torch_rel_err": 1e-3, "nan": False, "correct": True},
              {"name": "c", "rel_err": 1.0, "torch_rel_err": 1e-3, "nan": False, "correct": False},  # wrong
              {"name": "d", "rel_err": 1e-3, "torch_rel_err": 1e-3, "nan": True, "correct": False},  # NaN left
              {"name": "e", "correct": False, "error": "timeout"}]  # hung
    assert fp8_check.modules_that_pass(checks) == ({"b"}, {"a", "b"})


def test_the_gpu_checks_children_record_a_crash_and_go_on(tmp_path):
    """A child that dies (here: no plan in the folder) costs its case; a new child takes the next."""
    results = fp8_check.check_all(tmp_path, [("a", 1), ("b", 2)])
    assert [(r["name"], r["M"], r["correct"]) for r in results] == [("a", 1, False), ("b", 2, False)]
    assert all("its child ended (rc 1)" in r["error"] and "fp8_plan.json" in r["error"] for r in results)
