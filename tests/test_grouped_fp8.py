"""The grouped fp8 GEMM (issue 33's fp8, issue 32's row recipe) on the CPU: the spec v12 accepts and
what it refuses by name, the kernel's SASS (e4m3 wgmma, the promotion's adds, the scales' multiplies,
no spills) and barriers, its walk of TMA loads at blk_k = 128, the front door's checks and fallback,
the fake op, the Python reference of the rowwise scale placement, and the GPU check's pure parts."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gemm_ladder
import gemm_ladder.serve.grouped_ops  # noqa: F401  (registers torch.ops.gemm_ladder.scaled_grouped_mm)
from gemm_ladder.compile import module_cache, sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, check_built, spec_of as spec_of_config, spec_of_manifest
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.serve import front, grouped_fp8, kernel_pack, plan
from gemm_ladder.serve.front import KernelFallbackWarning, NoKernelError
from gemm_ladder.serve.kernel_pack import KernelPack
from gemm_ladder.serve.grouped_fp8 import check_call, quantize_experts, reference, spec_of
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.sm90a import grouped, hgemm_v9, hgemm_v12

from .built import built
from .grouped_loads import loads_of
from .test_grouped_pack import IDENT, stand_in_build  # the pack tests' stand-in module (no compile)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import grouped_fp8_check  # noqa: E402  (the GPU check's pure parts)

SPEC = spec_of("bfloat16")
V12 = hgemm_v12.EPILOGUES


# -- the spec --------------------------------------------------------------------------------------
def test_grouped_fp8_rowwise_is_built_on_v12_and_the_rest_refused_by_name():
    check_built(SPEC, "v12", V12)
    check_built(spec_of("float16"), "v12", V12)
    fp8 = dict(a="float8_e4m3", b="float8_e4m3", d="bfloat16", grouped=True)
    cases = [(GemmSpec(**fp8, scales="tensor"), "rowwise scales only"),
             (GemmSpec(**fp8, scales="block"), "rowwise scales only"),
             (GemmSpec(**{**fp8, "b": "float8_e5m2"}, scales="row"), "e4m3 weights"),
             (GemmSpec(**{**fp8, "a": "float8_e5m2"}, scales="row"), "A float8_e4m3"),
             (GemmSpec(**fp8, scales="row", bias="bfloat16"), "bias"),
             (GemmSpec(**fp8), "takes fp32 scales")]
    for spec, words in cases:
        with pytest.raises(ConfigError, match=words):
            check_built(spec, "v12", V12)
    with pytest.raises(ConfigError, match="v12 only"):
        check_built(SPEC, "v9", hgemm_v9.EPILOGUES)
    # the grouped spec's scale_b is one an expert's column; the dense row recipe's stays [N]
    assert [o.shape for o in SPEC.epilogue_operands()] == [("M",), ("G", "N"), ("G",)]
    assert [o.shape for o in GemmSpec.fp8(scales="row").epilogue_operands()][-1] == ("N",)


def test_v12_fp8_takes_the_fp8_defaults_and_refuses_what_is_not_built():
    cfg = make_config("v12", 4096, 4096, 4096, experts=8, spec=SPEC)
    assert (cfg.dtype, cfg.blk_k, cfg.blk_n, cfg.knobs()["promote"]) == ("bfloat16", 128, 128, 1)
    plain = make_config("v12", 4096, 4096, 4096, experts=8, dtype="bfloat16")
    assert "promote" not in plain.knobs() and plain.blk_k == 64  # 16-bit modules keep their knobs and tags
    for knobs, words in (({"swap_ab": True, "blk_m": 32}, "swap_ab=True with an fp8 spec"),
                         ({"layout": "masked"}, "layout='masked' with an fp8 spec"),
                         ({"blk_n": 256}, "blk_n=128"), ({"blk_k": 64}, "blk_k=128")):
        with pytest.raises(ConfigError, match=words):
            make_config("v12", 4096, 4096, 4096, experts=8, spec=SPEC, **knobs)
    with pytest.raises(ConfigError, match="multiple of 16"):
        make_config("v12", 4096, 4096, 4104, experts=8, spec=SPEC)


# -- the kernel ------------------------------------------------------------------------------------
def _count(text: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\b", text))


def test_v12_fp8_runs_e4m3_wgmma_the_promotion_and_the_scales_without_spills():
    """The e4m3 wgmma (QGMMA) at k32; with promote=1 the fp32 adds of the promotion (FADDs that
    promote=0 lacks), the scales' multiplies, guarded stores for each expert's last m-tile, and the
    operands in the spec's order after num_ctas."""
    on = make_config("v12", 1000, 1000, 512, experts=5, spec=SPEC)
    off = make_config("v12", 1000, 1000, 512, experts=5, spec=SPEC, promote=0)
    assert [str(p.name) for p in kernel_of(on).params] == ["A", "B", "D", "num_ctas", "scale_a", "scale_b", "offsets"]
    mod_on = built(on)
    src = mod_on.cuda_source()
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in src and "scale_b_ptr" in src
    try:
        t_on, t_off = sass.disassemble(mod_on.binary), sass.disassemble(built(off).binary)
        res = sass.resource_usage(mod_on.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in t_on and "QGMMA.64x128x32.F32.E4M3.E4M3" in t_off
    assert _count(t_on, "FADD") >= 64 and _count(t_off, "FADD") == 0, (_count(t_on, "FADD"), _count(t_off, "FADD"))
    assert _count(t_on, "FMUL") >= 64  # each sum times its token's and its column's scale
    assert _count(t_on, "LDL") == 0 and _count(t_on, "STL") == 0 and res.local == 0
    assert _count(t_on, "STG") >= 32  # the boundary tile's guarded stores


def test_the_barrier_checker_passes_the_grouped_fp8_kernel():
    for knobs in ({}, {"promote": 3}, {"overlap": 4}):
        cfg = make_config("v12", 360, 320, 640, experts=4, spec=SPEC, pipe_depth=2, **knobs)
        assert check_config(cfg).ok, knobs


def test_the_fp8_kernels_loads_are_the_models_walk(monkeypatch):
    """At blk_k = 128 the producer loads each tile's K in 128-wide slices from the expert's first row
    and W row ``e * N``: the model's work units in order (a K of 5 slices: 640)."""
    counts = (0, 129, 0, 231)
    cfg = make_config("v12", 360, 320, 640, experts=4, spec=SPEC, pipe_depth=2)
    offs = [sum(counts[: e + 1]) for e in range(4)]
    loads = loads_of(monkeypatch, cfg, offs, 360, 3)
    want = grouped.walk(offs, 360, cfg.blk_m, 3, cfg.l2_group_size, 3)
    for cta in range(3):
        mine = [(name, c) for b, name, c in loads if b == cta]
        a_loads = [c for name, c in mine if name.startswith("A")]
        assert [c[0] for c in a_loads[:cfg.k_tiles]] == [128 * k for k in range(5)]  # K in 128-byte slices
        assert [c[1] for c in a_loads][::cfg.k_tiles] == [u.row0 for u in want[cta]]
        assert [c[1] for name, c in mine if name.startswith("B")][::cfg.k_tiles] == \
            [u.expert * 320 + u.n_tile * cfg.blk_n for u in want[cta]]


# -- the Python reference of the rowwise scale placement --------------------------------------------
def test_the_reference_scales_each_token_row_and_each_experts_column():
    """``reference`` against the definition written the other way round: each output row's expert
    found by a search over offs, the raw fp8 dot product, then times scale_a[m] * scale_b[e, n]."""
    g = torch.Generator().manual_seed(3)
    for E, N, K, M in ((3, 8, 16, 20), (6, 16, 32, 37), (1, 8, 16, 5)):
        counts = torch.randint(0, 8, (E,), generator=g)
        offs = counts.cumsum(0).clamp(max=M - 2).to(torch.int32)  # two rows past offs[-1] at least
        Aq, sa = gemm_ladder.quantize_fp8(torch.randn(M, K, generator=g), "row")
        Wq, sw = quantize_experts(torch.randn(E, N, K, generator=g))
        got = reference(Aq, Wq, sa.view(-1), sw, offs)
        want = torch.zeros(M, N, dtype=torch.float64)
        for m in range(int(offs[-1])):
            e = int(torch.searchsorted(offs, torch.tensor(m, dtype=torch.int32), right=True))
            dot = Aq[m].double() @ Wq[e].double().T
            want[m] = dot * sa[m, 0].double() * sw[e].double()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_quantize_experts_rounds_each_output_column_like_quantize_fp8():
    W = torch.randn(3, 16, 32) * torch.logspace(-2, 2, 16)[None, :, None]
    Wq, sw = quantize_experts(W)
    assert Wq.dtype == torch.float8_e4m3fn and sw.shape == (3, 16) and sw.is_contiguous()
    for e in range(3):
        q, s = gemm_ladder.quantize_fp8(W[e], "row")
        assert torch.equal(q.float(), Wq[e].float()) and torch.equal(s.view(-1), sw[e])
    with pytest.raises(ModuleInputError, match=r"\[E, N, K\]"):
        quantize_experts(torch.randn(16, 32))


# -- the front door --------------------------------------------------------------------------------
def _call(E=4, N=16, K=32, M=40):
    g = torch.Generator().manual_seed(0)
    Aq, sa = gemm_ladder.quantize_fp8(torch.randn(M, K, generator=g), "row")
    Wq, sw = quantize_experts(torch.randn(E, N, K, generator=g))
    offs = torch.tensor([5, 5, 30, 38], dtype=torch.int32)[:E]
    return Aq, Wq, sa.view(-1), sw, offs


def test_check_call_takes_both_weight_layouts_without_a_copy():
    Aq, Wq, sa, sw, offs = _call()
    call = check_call(Aq, Wq, sa, sw, offs)
    assert (call.M, call.E, call.N, call.K, call.out_dtype, call.torch_layout) == (40, 4, 16, 32, "bfloat16", False)
    view = check_call(Aq, Wq.transpose(1, 2), sa.view(-1, 1), sw, offs, torch.float16)
    assert (view.N, view.K, view.out_dtype, view.torch_layout) == (16, 32, "float16", True)
    assert grouped_fp8.weight_nk(Wq.transpose(1, 2), 32).data_ptr() == Wq.data_ptr()


@pytest.mark.parametrize("change, words", [
    (lambda a: {**a, "A": a["A"].float()}, "float8_e4m3fn"),
    (lambda a: {**a, "W": a["W"].to(torch.float8_e5m2)}, "float8_e4m3fn"),
    (lambda a: {**a, "W": a["W"].transpose(1, 2).contiguous()}, "MN-major"),
    (lambda a: {**a, "A": a["A"].view(1, 40, 32)}, "masked"),
    (lambda a: {**a, "scale_a": a["scale_a"][:1]}, r"one scale a token, \[40\]"),
    (lambda a: {**a, "scale_b": a["scale_b"][0]}, r"\[4, 16\]"),
    (lambda a: {**a, "scale_b": a["scale_b"].double()}, "torch.float32"),
    (lambda a: {**a, "scale_b": a["scale_b"].t().contiguous().t()}, "not contiguous"),
    (lambda a: {**a, "offs": a["offs"].long()}, "int32"),
    (lambda a: {**a, "offs": a["offs"][:3]}, r"\(4,\)"),
    (lambda a: {**a, "out_dtype": torch.float32}, "out_dtype"),
    (lambda a: {**a, "out": torch.empty(40, 8, dtype=torch.bfloat16)}, r"\[40, 16\]"),
    (lambda a: {**a, "scale_a": a["scale_a"].clone().requires_grad_()}, "no backward"),
])
def test_check_call_refuses_with_the_fix(change, words):
    Aq, Wq, sa, sw, offs = _call()
    args = change({"A": Aq, "W": Wq, "scale_a": sa, "scale_b": sw, "offs": offs})
    with pytest.raises(ModuleInputError, match=words):
        check_call(args["A"], args["W"], args["scale_a"], args["scale_b"], args["offs"], args.get("out_dtype"),
                   args.get("out"))


def test_k_and_n_must_fit_tma():
    Aq, Wq, sa, sw, offs = _call(K=32)
    with pytest.raises(ModuleInputError, match="multiple of 16"):
        check_call(Aq[:, :24].contiguous(), Wq[:, :, :24].contiguous(), sa, sw, offs)
    with pytest.raises(ModuleInputError, match="multiple of 8"):
        check_call(Aq, Wq[:, :12].contiguous(), sa, sw[:, :12].contiguous(), offs)


def test_cpu_tensors_are_refused_and_the_fake_op_gives_shapes():
    Aq, Wq, sa, sw, offs = _call()
    with pytest.raises(ModuleInputError, match="move them to the GPU"):
        gemm_ladder.scaled_grouped_mm(Aq, Wq, sa, sw, offs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in (Aq, Wq.transpose(1, 2), sa, sw, offs)]
        out = torch.ops.gemm_ladder.scaled_grouped_mm(*fake)
        assert tuple(out.shape) == (40, 16) and out.dtype == torch.bfloat16
        out16 = torch.ops.gemm_ladder.scaled_grouped_mm(*fake, torch.float16)
        assert out16.dtype == torch.float16
        with pytest.raises(ModuleInputError, match="scale_b"):
            torch.ops.gemm_ladder.scaled_grouped_mm(fake[0], fake[1], fake[2], fake[2], fake[4])


def test_no_module_is_an_error_when_strict_else_torch_with_one_warning(monkeypatch):
    """Without a registered module or a pack: strict names the pack command; else a warning and
    torch's product (here on the CPU, where torch._scaled_grouped_mm refuses: the dequantized one),
    which is the reference rounded to bf16 and leaves the rows past offs[-1] alone."""
    grouped_fp8.reset()
    monkeypatch.setattr(grouped_fp8, "arch_at", lambda index: "sm_90a")
    monkeypatch.setattr(grouped_fp8, "from_packs", lambda *a: None)
    Aq, Wq, sa, sw, offs = _call()
    call = check_call(Aq, Wq, sa, sw, offs)
    with pytest.raises(NoKernelError, match=r"pack build --grouped 4,16,32,contiguous --dtypes float8_e4m3"):
        grouped_fp8.route_of(call, 0, strict=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        route = grouped_fp8.route_of(call, 0)
        assert grouped_fp8.route_of(call, 0) is route  # made once
    assert route.source == "torch fallback" and sum(w.category is KernelFallbackWarning for w in seen) == 1
    D = torch.full((40, 16), float("nan"), dtype=torch.bfloat16)
    route.run(Aq, Wq, sa, sw, offs, D)
    torch.testing.assert_close(D[:38].float(), reference(Aq, Wq, sa, sw, offs)[:38].to(torch.bfloat16).float(),
                               rtol=1e-2, atol=1e-2)
    assert torch.isnan(D[38:].float()).all()
    grouped_fp8.reset()


# -- the GPU check's pure parts ----------------------------------------------------------------------
def test_the_gpu_check_plans_modules_that_validate_and_fit_its_budget():
    plan = grouped_fp8_check.module_plan()
    assert {m["shape"] for m in plan if m["kind"] == "bf16"} == set(grouped_fp8_check.TIMED)
    for m in plan:
        cfg = make_config("v12", grouped_fp8_check.BUILD_M, m["N"], m["K"], **grouped_fp8_check.build_knobs(m))
        assert (cfg.blk_k == 128) == (m["kind"] == "fp8")
    assert len({m["file"] for m in plan}) == len(plan) <= 12  # about 200 KiB each: DIR well under 8 MiB
    sweep = grouped_fp8_check.module_plan(variants=True)
    assert len({m["file"] for m in sweep}) == len(sweep) <= 24
    for m in sweep:
        make_config("v12", grouped_fp8_check.BUILD_M, m["N"], m["K"], **grouped_fp8_check.build_knobs(m))
        assert grouped_fp8_check.variant_of(f"/d/{m['file']}") == grouped_fp8_check.variant_text(m["knobs"])


def test_the_gpu_check_judges_by_torchs_error_and_writes_the_issues_fields():
    judge = grouped_fp8_check.judge
    assert judge(4e-3, 3e-3, 2e-3) and not judge(9e-3, 3e-3, 2e-3) and not judge(float("nan"), 3e-3, 2e-3)
    assert judge(4e-3, None, 2e-3) and not judge(6e-3, None, 2e-3)  # torch refused: the rounding's error
    times = {"ours": {"graph_ms": 1.0, "queued_ms": 1.2, "tflops_graph": 900.0},
             "scaled_grouped_mm": {"graph_ms": 1.5, "queued_ms": 1.5},
             "bf16_grouped_mm_ours": {"graph_ms": 1.8, "queued_ms": 2.4}}
    r = grouped_fp8_check.row({"experts": 8, "tokens": 512, "N": 14336, "K": 4096, "routing": "zipf",
                               "variant": "default", "kind": "timed"}, True, times)
    for key in ("layout", "experts", "tokens", "N", "K", "dtype", "routing", "correct", "ratio_to_grouped_mm",
                "peer_ratios", "recipe", "tflops", "ratio_to_scaled_mm"):
        assert key in r, key
    assert (r["dtype"], r["recipe"], r["ratio_to_grouped_mm"], r["ratio_to_scaled_mm"]) == \
        ("float8_e4m3fn", "row", 1.5, 1.5)
    assert r["peer_ratios"]["bf16_grouped_mm_ours_graph"] == 1.8 and r["peer_ratios"]["bf16_grouped_mm_torch_graph"] \
        is None
    summary = grouped_fp8_check.summary_of([r, {**r, "ratio_to_grouped_mm": 0.9}])
    assert summary["default"]["min_ratio_to_scaled_grouped_mm"] == 0.9


# -- kernel packs ------------------------------------------------------------------------------------
def test_the_fp8_rule_plans_a_decode_and_a_prefill_module_that_validate_at_blk_k_128():
    choices = plan.grouped_choices(8, 14336, 4096, "float8_e4m3")
    assert [(g.tokens, g.choice.rule) for g in choices] == [
        ((1, 128), "grouped-fp8-decode"), ((129, plan.GROUPED_MAX_TOKENS), "grouped-fp8-prefill")]  # 16 an expert
    for g in choices:
        cfg = make_config("v12", 4096, 14336, 4096, **g.choice.knobs)
        assert cfg.blk_k == 128 and cfg.dtype == "bfloat16" and spec_of_config(cfg) == SPEC
        # both tiers' evidence is committed
        assert g.choice.measured and plan.GROUPED_FP8 in g.choice.why
    assert (Path(__file__).resolve().parents[1] / plan.GROUPED_FP8).is_file()
    decode, prefill = choices
    assert make_config("v12", 4096, 14336, 4096, **decode.choice.knobs).blk_m == 64
    assert (prefill.choice.knobs["overlap"], prefill.choice.knobs["pipe_depth"]) == (4, 6)
    # where a 6-deep ring does not fit beside the experts' tables, the 4-deep one, and the refusal named
    many = plan.grouped_choices(1024, 2048, 7168, "float8_e4m3")[-1].choice
    assert many.knobs["overlap"] == 4 and many.knobs.get("pipe_depth", 4) == 4 and "pipe_depth': 6" in many.skipped[0]
    with pytest.raises(ConfigError, match="layout='masked' with an fp8 spec"):
        plan.grouped_choices(8, 14336, 4096, "float8_e4m3", "masked")


def test_a_pack_files_grouped_fp8_modules_apart_and_the_front_door_finds_them(tmp_path, monkeypatch):
    """``pack build --grouped E,N,K --dtypes float8_e4m3 bfloat16``: the fp8 modules (contiguous only)
    are found under float8_e4m3, never by a bf16 lookup of the same weight, and the grouped fp8 front
    door's pack lookup takes the one for its token count. Modules are stand-ins (no compile)."""
    real = module_cache.get_or_build
    monkeypatch.setattr(module_cache, "get_or_build",
                        lambda job, root=None: real(job, root, build=stand_in_build, ident=IDENT))
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["float8_e4m3", "bfloat16"], workers=1,
                                 cache_root=tmp_path / "cache", grouped=[(8, 14336, 4096, "contiguous")])
    assert all(r["status"] == "built" for r in man["results"]), man["results"]
    pk = KernelPack(tmp_path / "pack")
    few = pk.find_grouped("contiguous", 8, 14336, 4096, "float8_e4m3", "sm_90a", 64)
    many = pk.find_grouped("contiguous", 8, 14336, 4096, "float8_e4m3", "sm_90a", 8192)
    assert (few.entry["choice"]["rule"], many.entry["choice"]["rule"]) == ("grouped-fp8-decode", "grouped-fp8-prefill")
    assert spec_of_manifest(few.entry) == SPEC and few.fit == many.fit == "tuned-range"
    bf16 = pk.find_grouped("contiguous", 8, 14336, 4096, "bfloat16", "sm_90a", 64)
    assert bf16 is not None and not spec_of_manifest(bf16.entry).is_fp8
    assert pk.find_grouped("masked", 8, 14336, 4096, "float8_e4m3", "sm_90a", 64) is None
    front.reset()
    gemm_ladder.use_pack(tmp_path / "pack")
    try:
        found = grouped_fp8.from_packs("contiguous", 8, 14336, 4096, grouped_fp8.pack_dtype("bfloat16"), "sm_90a", 100)
        assert found.entry["file"] == few.entry["file"]
    finally:
        front.reset()


def test_pack_build_refuses_a_masked_fp8_weight_by_name():
    bad = subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", "build", "--dry-run", "--dtypes", "float8_e4m3",
                          "--grouped", "8,14336,4096,masked"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert bad.returncode == 2 and "contiguous layout only" in bad.stderr, bad.stderr


def test_the_gpu_checks_pack_mode_gives_each_case_the_module_whose_range_holds_it():
    items = kernel_pack.plan_grouped([(E, N, K, "contiguous") for _, E, N, K in grouped_fp8_check.SHAPES],
                                     [grouped_fp8_check.PACK_DTYPE])
    entries = [e for i in items for e in kernel_pack.entries_of(i)]
    cases = grouped_fp8_check.pack_cases(entries)
    assert len(cases) == len(grouped_fp8_check.TIMED) * len(grouped_fp8_check.TOKENS) + 1  # and the odd shape once
    rules = {(c["shape"], c["tokens"]): c["rule"] for c in cases}
    assert rules[("deepseek_v3", 2048)] == "grouped-fp8-decode" and rules[("mixtral", 512)] == "grouped-fp8-prefill"
    for c in cases:
        entry = next(e for e in entries if e["file"] == c["file"] and e["tokens"][0] <= c["tokens"] <= e["tokens"][1])
        assert spec_of_manifest(entry) == SPEC
        folder, back = grouped_fp8_check.parse_case_item(grouped_fp8_check.case_item("/x/pack", c))
        assert folder == "/x/pack" and back == {k: c[k] for k in ("experts", "N", "K", "tokens")}


def test_the_16bit_grouped_front_door_points_fp8_callers_here():
    Aq, Wq, _, _, offs = _call()
    with pytest.raises(ModuleInputError, match="scaled_grouped_mm"):
        gemm_ladder.grouped_mm(Aq, Wq, offs)


def test_a_gated_weight_with_fp8_scales_is_refused_by_name():
    # the grouped SwiGLU and the grouped fp8 GEMM each build; together they do not (yet)
    gated_fp8 = GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row", act="silu", gated=True,
                         grouped=True)
    with pytest.raises(ConfigError, match="grouped fp8 GEMM with .*a gated B is not built"):
        make_config("v12", 4096, 4096, 4096, experts=8, spec=gated_fp8)
    with pytest.raises(ConfigError, match="no gated epilogue yet"):
        plan.grouped_spec("float8_e4m3", "swiglu")
    with pytest.raises(ConfigError, match="no swiglu epilogue yet"):
        kernel_pack.plan_grouped([(8, 4096, 4096, None, "swiglu")], ["float8_e4m3"])
