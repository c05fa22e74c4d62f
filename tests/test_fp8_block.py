"""fp8 block-wise scales (issue 32, DeepSeek-V3's recipe): the spec's operands, the knobs the
recipe refuses, v9's kernel (the scale multiply-add at the promotion in the CUDA source and the
SASS, no scale in the epilogue, barriers), the register -> scale maps against the fragment's
layout, the front door's checks, quantize_fp8's blocks, the fallback and packs. CPU only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch._subclasses.fake_tensor import FakeTensorMode

import gemm_ladder
import gemm_ladder.serve.scaled_ops  # noqa: F401  (registers torch.ops.gemm_ladder.scaled_mm)
import layouts
from gemm_ladder.compile import sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.serve import kernel_pack
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.serve import scaled
from gemm_ladder.serve.scaled import TorchScaledMM, check_call, dequantize
from gemm_ladder.sm90a import fp8

from .built import built

BLOCK = GemmSpec.fp8("bfloat16", "block")


# -- the spec and the knobs ------------------------------------------------------------------------
def test_block_scales_are_operands_a_m_major_and_b_in_blocks():
    ops = {o.name: o for o in BLOCK.epilogue_operands()}
    assert ops["scale_a"].extent(1000, 3008, 1008) == (8, 1000)  # [ceil(K/128), M]: M-major
    assert ops["scale_b"].extent(1000, 3008, 1008) == (24, 8)  # [ceil(N/128), ceil(K/128)]
    assert ops["scale_b"].extent(5, 128, 128) == (1, 1)


@pytest.mark.parametrize("knobs, words", [
    ({"promote": 0}, "promote=0: .* one 128-wide K block"),
    ({"promote": 2}, "promote=2"),
    ({"k_zigzag": True}, "k_zigzag=True: .*load order"),
    ({"blk_n": 192, "pipe_depth": 3}, "blk_n=192: .*whole 128-column B blocks"),
])
def test_block_scales_refuse_knobs_that_break_a_k_block_a_promotion(knobs, words):
    with pytest.raises(ConfigError, match=words) as err:
        make_config("v9", 512, 512, 1024, spec=BLOCK, **knobs)
    assert "use blk_k=128, promote=1, k_zigzag=False, blk_n=128" in str(err.value)
    make_config("v9", 512, 512, 1024, spec=BLOCK, blk_n=64)  # a divisor of 128: the tile lies in one block


def test_the_scale_slots_follow_the_accumulator_fragment():
    """Register r of a thread takes the A scale of its row and the B scale of its column's block,
    as the m64nN fragment places it (layouts.acc_fragment_coord), for 128- and 256-wide tiles."""
    for blk_n in (128, 256):
        regs_per_atom = blk_n // 2
        for lane in (0, 5, 31):
            for r in range(2 * regs_per_atom):  # two 64-row atoms
                row, col = layouts.acc_fragment_coord(r % regs_per_atom, 0, lane)
                slot = fp8.a_scale_slot(r, regs_per_atom)
                assert (slot // 2, slot % 2) == (r // regs_per_atom, (row - lane // 4) // 8)
                assert fp8.b_scale_slot(r, regs_per_atom) == col // 128


# -- the kernel ------------------------------------------------------------------------------------
def _count(text: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\b", text))


def test_v9_block_scales_multiply_add_at_the_promotion_and_not_in_the_epilogue():
    """At M, N odd multiples of 16 and K = 1008 (not a multiple of 128: the last block is cut), the
    promotion is an FFMA of each sum with its two scales' product; the scale loads are K block 0's
    and each turn's next two (two rows and one B block a thread each), none in the epilogue."""
    cfg = make_config("v9", 1000, 3008, 1008, spec=BLOCK, dynamic_m=True)
    mod = built(cfg)
    src = mod.cuda_source()
    assert "m64n128k32.f32.e4m3.e4m3" in src
    for b_reg in (2, 5):  # total += acc * (scale_a[row] * scale_b[block]), from either register set
        promoted = (r"Freg_ptr\[\d+\] = \(Freg_ptr\[\d+\] \+ \(Dreg_ptr\[\d+\] \* "
                    rf"\(Sreg_ptr\[\d\] \* Sreg_ptr\[{b_reg}\]\)\)\)")
        assert re.search(promoted, src)
    # K block 0's before the loop, then one load of each set a turn of two slices
    assert src.count("= scale_a_ptr[") == 6 and src.count("= scale_b_ptr[") == 3
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in text
    # 64 sums a thread a promotion: FFMAs where the row recipe's promotion has FADDs (test_fp8.py)
    ffma, fadd = _count(text, "FFMA"), _count(text, "FADD")
    assert ffma + fadd >= 64 and ffma >= 56 and fadd < 8, (ffma, fadd)
    assert res.local == 0 and _count(text, "STL") == 0


@pytest.mark.parametrize("K", [1280, 1152])
def test_the_barrier_checker_passes_the_block_kernel(K):
    """Two slices a turn of the K loop: 10 slices, and 9 (the last alone after the loop)."""
    assert check_config(make_config("v9", 512, 512, K, spec=BLOCK)).ok


# -- the front door --------------------------------------------------------------------------------
def _block_operands(M=200, N=144, K=304):
    torch.manual_seed(0)
    x, w = torch.randn(M, K), torch.randn(N, K)
    aq, sa = gemm_ladder.quantize_fp8(x, "block")
    wq, sw = gemm_ladder.quantize_fp8(w, "block", block=(128, 128))
    return x, w, aq, wq, sa, sw


def test_quantize_fp8_blocks_have_torchs_layouts_and_round_trip():
    x, w, aq, wq, sa, sw = _block_operands()
    assert sa.shape == (200, 3) and sa.stride() == (1, 200)  # M-major, as torch's BlockWise1x128
    assert sw.shape == (2, 3) and sw.is_contiguous()  # [N/128, K/128] row-major
    for q, s, full, block in ((aq, sa, x, (1, 128)), (wq, sw, w, (128, 128))):
        back = dequantize(q, s, block)
        # each block's amax lands on 448, and each value is within half an e4m3 ulp of its block's top binade
        assert (back - full).abs().max() <= 2 ** -4 * full.abs().max()
        assert q.float().abs().max() == 448
    # a block of its own range: the cut last block of A (columns 256..303) gets its own scale
    x[:, 256:] *= 1000
    _, sa2 = gemm_ladder.quantize_fp8(x, "block")
    assert torch.allclose(sa2[:, 2], sa[:, 2] * 1000, rtol=1e-6) and torch.equal(sa2[:, :2], sa[:, :2])
    with pytest.raises(ModuleInputError, match=r"block=\(64, 64\); use \(1, 128\)"):
        gemm_ladder.quantize_fp8(w, "block", block=(64, 64))


def test_check_call_takes_block_scales_by_their_shapes():
    _, _, aq, wq, sa, sw = _block_operands()
    call = check_call(aq, wq.t(), sa, sw.t())
    assert (call.M, call.N, call.K, call.recipe, call.spec) == (200, 144, 304, "block", BLOCK)
    with FakeTensorMode():
        a = torch.empty(1000, 1024, dtype=torch.float8_e4m3fn)
        w = torch.empty(3008, 1024, dtype=torch.float8_e4m3fn)
        sa_f = torch.empty(8, 1000).t()
        sb_f = torch.empty(24, 8).t()
        d = torch.ops.gemm_ladder.scaled_mm(a, w.t(), sa_f, sb_f, None, torch.float16)
        assert d.shape == (1000, 3008) and d.dtype == torch.float16


def test_a_checked_layout_is_remembered_and_a_changed_one_is_checked_again(monkeypatch):
    """``scaled.checked_call``: the second call of a layout takes the remembered Call (no checks run);
    the same tensors with scale_b made row-major, an out of another dtype or a non-tensor are
    checked and refused, every time; a refused layout is not remembered."""
    _, _, aq, wq, sa, sw = _block_operands()
    scaled._CHECKED.clear()
    runs = []
    monkeypatch.setattr(scaled, "check_call", lambda *a: runs.append(a) or check_call(*a))
    first = scaled.checked_call(aq, wq.t(), sa, sw.t(), None, torch.bfloat16)
    again = scaled.checked_call(aq.clone(), wq.t().clone().t().t(), sa.t().clone().t(), sw.t(), None, torch.bfloat16)
    assert again is first and first == check_call(aq, wq.t(), sa, sw.t()) and len(runs) == 1
    bad_out = torch.empty(200, 144, dtype=torch.float16)
    for _ in range(2):
        with pytest.raises(ModuleInputError, match=r"\.t\(\) of a row-major \[N/128, K/128\]"):
            scaled.checked_call(aq, wq.t(), sa, sw.t().contiguous(), None, torch.bfloat16)
        with pytest.raises(ModuleInputError, match="out must be a \\[200, 144\\] torch.bfloat16 tensor"):
            scaled.checked_call(aq, wq.t(), sa, sw.t(), None, torch.bfloat16, bad_out)
        with pytest.raises(ModuleInputError, match="scale_b must be a torch.Tensor, got list"):
            scaled.checked_call(aq, wq.t(), sa, [1.0], None, torch.bfloat16)
    assert len(runs) == 7 and len(scaled._CHECKED) == 1


@pytest.mark.parametrize("change, words", [
    (lambda o: {**o, "scale_a": o["scale_a"].contiguous()}, r"M-major .* scale_a.t\(\).contiguous\(\).t\(\)"),
    (lambda o: {**o, "scale_b": o["scale_b"].contiguous()}, r"\.t\(\) of a row-major \[N/128, K/128\]"),
    (lambda o: {**o, "scale_b": o["scale_b"][:, :1]}, r"no recipe .* scale_b \[3, 2\] \(block"),
    (lambda o: {**o, "scale_a": o["scale_a"].double()}, "scales are torch.float32"),
])
def test_check_call_refuses_block_scales_with_the_fix(change, words):
    _, _, aq, wq, sa, sw = _block_operands()
    o = change({"A": aq, "B": wq.t(), "scale_a": sa, "scale_b": sw.t()})
    with pytest.raises(ModuleInputError, match=words):
        check_call(o["A"], o["B"], o["scale_a"], o["scale_b"])


def test_the_block_fallback_is_the_dequantized_product():
    """Where no kernel serves a block call (torch 2.11 refuses block scales on sm_90), the fallback
    computes the dequantized inputs' product in fp32: within bf16's rounding of an fp64 reference."""
    _, _, aq, wq, sa, sw = _block_operands()
    bias = torch.randn(144)
    ref = (dequantize(aq, sa).double() @ dequantize(wq, sw, (128, 128)).double().t()) + bias.double()
    d = TorchScaledMM("block", torch.bfloat16)(aq, wq, scale_a=sa.t(), scale_b=sw, bias=bias)
    # bf16's half ulp, and fp32's sums (K = 304) of a near tie
    err = (d.double() - ref).abs()
    assert d.dtype == torch.bfloat16 and (err <= ref.abs() * 2 ** -8 + 1e-5 * ref.abs().max()).all()
    assert (err > ref.abs() * 2 ** -10).any()  # it was rounded to bf16 (not compared to itself)


class TorchBlock:
    """torch._scaled_mm's block-wise kernel on the CPU: the layouts it takes checked, the product as the
    dequantized inputs', the calls recorded."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, b, scale_a, scale_b, out_dtype=None, out=None, **kw):
        self.calls.append((scale_a.shape, scale_a.stride(), scale_b.shape, scale_b.stride()))
        d = (dequantize(a, scale_a).double() @ dequantize(b.t(), scale_b.t(), (128, 128)).double().t()).to(out_dtype)
        return d if out is None else out.copy_(d)


def test_where_torch_runs_block_scales_its_kernel_takes_them_in_its_own_layouts(monkeypatch):
    """``torch_block``: torch's block-wise ``_scaled_mm`` on the scales as torch lays them out (scale_a
    [M, K/128] M-major, scale_b [K/128, N/128] the .t() of row-major blocks), from the kernel's forms;
    with a bias (which torch's block-wise kernel is not asked to add), the dequantized product."""
    fake = TorchBlock()
    monkeypatch.setattr(torch, "_scaled_mm", fake)
    _, _, aq, wq, sa, sw = _block_operands()
    ref = dequantize(aq, sa).double() @ dequantize(wq, sw, (128, 128)).double().t()
    out = torch.full((200, 144), float("nan"), dtype=torch.bfloat16)
    d = TorchScaledMM("block", torch.bfloat16, torch_block=True)(aq, wq, out=out, scale_a=sa.t().contiguous(),
                                                                 scale_b=sw)
    assert d is out and fake.calls == [((200, 3), (1, 200), (3, 2), (1, 3))]
    torch.testing.assert_close(out.double(), ref, rtol=2 ** -7, atol=1e-6)
    TorchScaledMM("block", torch.bfloat16, torch_block=True)(aq, wq, scale_a=sa.t().contiguous(), scale_b=sw,
                                                            bias=torch.randn(144))
    TorchScaledMM("block", torch.bfloat16)(aq, wq, scale_a=sa.t().contiguous(), scale_b=sw)
    assert len(fake.calls) == 1  # neither the bias call nor one where torch runs no block scales


def test_first_use_offers_torchs_block_kernel_only_where_it_runs_and_without_a_bias():
    route = lambda: scaled.Route("ours", None, "kernel pack", "v9", {})  # noqa: E731
    plain, biased = (scaled.Call(256, 144, 304, "block", GemmSpec.fp8("bfloat16", "block", b))
                     for b in (None, "bfloat16"))
    offered = scaled._offer_torch(route(), "s", plain, False, torch.bfloat16, torch_block=True)
    assert set(offered.candidates) == {"v9", "torch"}
    assert offered.candidates["torch"][1]().module.torch_block is True
    for call, strict, ok in ((plain, False, False), (biased, False, True), (plain, True, True)):
        assert not scaled._offer_torch(route(), "s", call, strict, torch.bfloat16, torch_block=ok).candidates


def test_with_no_kernel_a_block_call_falls_back_to_torchs_kernel_where_it_runs(no_gpu, monkeypatch):
    call = scaled.Call(256, 144, 304, "block", BLOCK)
    for runs in (True, False):
        monkeypatch.setattr(scaled, "torch_runs_block", lambda index, runs=runs: runs)
        with pytest.warns(scaled.KernelFallbackWarning):
            scaled.reset()
            route = scaled._resolve(call, 0, False, torch.bfloat16)
        assert isinstance(route.module, TorchScaledMM) and route.module.torch_block is runs


def test_torch_runs_block_asks_once_per_gpu_and_a_refusal_is_no(monkeypatch):
    monkeypatch.setattr(scaled, "_TORCH_BLOCK", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # a GPU's answer, eagerly
    asked = []

    def probe_ok(make, index):
        asked.append(index)
        return True

    monkeypatch.setattr(scaled, "outside_graph_pools", probe_ok)
    assert scaled.torch_runs_block(0) and scaled.torch_runs_block(0) and asked == [0]

    def refused(make, index):
        raise RuntimeError("Invalid scaling configuration")

    monkeypatch.setattr(scaled, "outside_graph_pools", refused)
    assert not scaled.torch_runs_block(1) and scaled.torch_runs_block(0)
    # inside a capture nothing is asked (the probe would join the caller's graph) and nothing is remembered
    monkeypatch.setattr(scaled, "outside_graph_pools", probe_ok)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not scaled.torch_runs_block(2) and 2 not in scaled._TORCH_BLOCK and asked == [0]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert scaled.torch_runs_block(2) and asked == [0, 2]


def test_packs_build_block_scales_where_asked():
    specs = kernel_pack.pack_specs((kernel_pack.FP8_INPUT,), fp8_scales=("block",), fp8_out=("bfloat16",))
    assert specs == [BLOCK]
    default = kernel_pack.pack_specs((kernel_pack.FP8_INPUT,), fp8_out=("bfloat16",))
    assert {s.scales for s in default} == {"tensor", "row"}  # block quantizes weights differently: only by name


# -- the GPU check's pure parts (benchmarks/fp8_check.py) --------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_check  # noqa: E402  (the GPU check's pure parts)


def test_the_gpu_check_selects_block_cases_with_their_per_tensor_peers():
    modules, checks, timed = fp8_check.selected(["block"])
    names = {m[0] for m in modules}
    recipe = {m[0]: m[3] for m in fp8_check.MODULES}
    # every block module is timed (but the odd shape's, checked only) ...
    assert {t[0] for t in timed} | {"b_3008x1008_bias"} == {n for n in names if recipe[n] == "block"}
    assert {t[2] for t in timed} == {n for n in names if recipe[n] == "tensor"}  # ... beside its per-tensor peer
    assert {c[0] for c in checks} == names  # and every module that runs is checked
    block_shapes = {(m[1], m[2]) for m in modules if m[3] == "block"}
    assert (3008, 1008) in block_shapes  # N and K past whole 128 blocks
    assert {(M, n) for n, M, _ in timed} >= {(4096, "b_7168x16384"), (4096, "b_4096x7168"), (128, "b_4096x7168"),
                                            (8192, "b_8192x8192")}  # DeepGEMM's shapes and 8192^3
    assert fp8_check.selected(None) == (fp8_check.MODULES, fp8_check.CHECKS, fp8_check.TIMED)
    for _, N, K, rec, promote, bias, more in modules:
        make_config("v9", 256, N, K, spec=fp8_check.spec_of(rec, bias), dynamic_m=True, promote=promote, **more)


def test_the_gpu_check_hands_block_scales_to_the_kernel_as_they_lie():
    _, _, aq, wq, sa, sw = _block_operands()
    ops = fp8_check.kernel_scales(sa, sw.t(), "block")
    assert ops["scale_a"].shape == (3, 200) and ops["scale_a"].is_contiguous()  # [K/128, M]
    assert ops["scale_b"].shape == (2, 3) and ops["scale_b"].is_contiguous()  # [N/128, K/128]
    da, dw = fp8_check.dequantized(aq, wq, sa, sw.t(), "block")
    assert torch.equal(da, dequantize(aq, sa).double()) and torch.equal(dw, dequantize(wq, sw, (128, 128)).double())


def test_the_pack_cli_plans_block_modules_by_name():
    out = subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", "build", "--weights", "4096x7168", "--dtypes",
                          "float8_e4m3", "--fp8-scales", "block", "--dry-run"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120,
                         env={**os.environ, "GEMM_LADDER_TUNING_DB": "off"})
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "float8_e4m3" in line]
    # one module up to M = 128 (the small-M knobs); past it the ranges of M where 128x128 or 128x256 in halves
    # fills its waves best (plan.fp8_tile), each served by one of the two modules, as for the other recipes
    assert all("block -> bfloat16" in r for r in rows), out.stdout
    assert "1..128" in rows[0] and "fp8-block-small-m" in rows[0] and "overlap2" in rows[0], out.stdout
    assert rows[1].split()[7].startswith("129..") and rows[-1].split()[7].endswith("..16384"), out.stdout
    square = [r for r in rows[1:] if "fp8-block " in r]
    halves = [r for r in rows[1:] if "fp8-block-halves " in r]
    assert square and halves and len(square) + len(halves) == len(rows) - 1, out.stdout
    assert all("overlap4" in r and "stagescalesTrue" in r for r in square), out.stdout
    assert all("halvesTrue" in r and "epiunderTrue" in r and "n256" in r for r in halves), out.stdout
    assert len({r.split()[0] for r in rows}) == 3  # one module a kind of tile
