"""The shorter host path of ``gemm_ladder.nn``'s eager layers, on the CPU: ``ops.direct_mm`` goes
straight to the front door's fast path (``front.fast_mm``) for a call like one already checked,
and to the checked path -- its errors, its copies -- for any other; the training forward's fused
weight of a SwiGLU MLP; and ``benchmarks/host_path_profile.py``, which measures that path with the
launches stubbed."""

import pytest
import torch
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.serve import front, ops

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def hp():
    return benchmark_script("host_path_profile")


@pytest.fixture
def seeded(hp, monkeypatch):
    """A fast-path entry for bf16 A [2, 8, 16] . B [32, 16]^T whose launch records its operands;
    ``ops.matmul`` (the checked path) records its calls instead of running (no GPU here)."""
    launched, checked = [], []
    A, B = torch.randn(2, 8, 16).bfloat16(), torch.randn(32, 16).bfloat16()
    hp._seed(A, B, None, None)
    entry = front._FAST[front._fast_key(A, B, None)]
    front._FAST[front._fast_key(A, B, None)] = (entry[0], lambda a, b, d: launched.append((a, b, d)), *entry[2:])
    monkeypatch.setattr(ops, "matmul", lambda *args, **kw: checked.append((args, kw)) or "checked")
    yield A, B, launched, checked, entry[0]
    front._FAST.clear()


def test_a_call_like_a_checked_one_launches_without_the_checked_path(seeded):
    A, B, launched, checked, route = seeded
    d = ops.direct_mm(A, B)
    assert not checked and len(launched) == 1 and route.calls == 1
    a, b, out = launched[0]
    assert a.shape == (16, 16) and a.data_ptr() == A.data_ptr() and b is B  # A's rows flattened, no copies
    assert out.shape == (16, 32) and out.dtype == torch.bfloat16 and d.shape == (2, 8, 32)
    assert d.data_ptr() == out.data_ptr()  # D is the launch's output, viewed as the call's shape


@pytest.mark.parametrize("change", ["dtype", "strides", "grad", "bias", "activation", "reset", "misaligned"])
def test_any_other_call_takes_the_checked_path(seeded, change):
    """What the key and the fast path's own checks hold apart: another dtype, a layout with other
    strides (B's transposed view of the same shape), a tensor that wants grad with grad on, a
    bias or an activation (epilogues), the entries forgotten (``front.reset``), an operand off a
    16-byte boundary."""
    A, B, launched, checked, _ = seeded
    bias = activation = None
    if change == "dtype":
        A, B = A.half(), B.half()
    elif change == "strides":
        B = torch.randn(16, 32).bfloat16().t()  # [32, 16] as B is, stored [16, 32]: an MN-major B
    elif change == "grad":
        A = A.clone().requires_grad_()
    elif change == "bias":
        bias = torch.zeros(32).bfloat16()
    elif change == "activation":
        activation = "relu"
    elif change == "reset":
        front.reset()
    else:
        A = torch.randn(2 * 8 * 16 + 1).bfloat16()[1:].view(2, 8, 16)  # 2 bytes past the allocation's start
    assert ops.direct_mm(A, B, bias, activation) == "checked"
    assert len(checked) == 1 and not launched


def test_a_bad_call_after_a_good_one_still_gets_the_checked_paths_error(seeded, monkeypatch):
    """The fast path answers only for what it was seeded with: a wrong call's error comes from the
    front door's checks, the first time and every time."""
    A, B, launched, _, _ = seeded
    monkeypatch.setattr(ops, "matmul", front.matmul)
    ops.direct_mm(A, B)
    with pytest.raises(ModuleInputError, match="A is torch.bfloat16 and B is torch.float16"):
        ops.direct_mm(A, B.half())
    with pytest.raises(ModuleInputError, match="B looks like \\[K, N\\]"):
        ops.direct_mm(A, B.t().contiguous())
    assert len(launched) == 1


def test_the_training_forwards_fused_weight_is_the_concatenation_with_no_graph():
    """``fused_weight(cache=False)`` (every training forward) without its context managers: the
    cast concatenation, recording no graph although the weights want grad, kept nowhere; inside
    inference_mode still a normal tensor (a later forward with grad may save it)."""
    mlp = gnn.SwiGLUMLP(nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False), nn.Linear(24, 16, bias=False))
    W_gu = mlp.fused_weight(torch.bfloat16, cache=False)
    want = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).bfloat16()
    assert torch.equal(W_gu, want) and W_gu.grad_fn is None and not W_gu.requires_grad
    assert mlp._fused is None and mlp.fused_weight(torch.bfloat16, cache=False) is not W_gu
    with torch.inference_mode():
        inside = mlp.fused_weight(torch.bfloat16, cache=False)
    assert not inside.is_inference() and torch.equal(inside, want)


@pytest.mark.parametrize("fused", [False, True])
def test_the_profile_runs_every_gemm_of_the_layer_on_the_fast_path(hp, fused, monkeypatch):
    """What ``host_path_profile`` times is the fast path: after the warm-up seeded the entries,
    each step of ours launches every GEMM of its forward and backward there (a Linear's three; the
    fused MLP's gate-and-up GEMM, the down projection's three and dX and dW of gate and up: h is
    kept, not recomputed), and the checked path is never entered."""
    ref, ours, x, grad = hp.layers(fused=fused)
    with hp.stubbed(lambda: [hp.step(m, x, grad) for m in (ref, ours)]):
        monkeypatch.setattr(front, "_check", lambda *a, **k: pytest.fail("the checked path ran"))
        before = {id(e[0]): e[0].calls for e in front._FAST.values()}
        hp.step(ours, x, grad)
        launched = sum(e[0].calls - before[id(e[0])] for e in front._FAST.values())
        assert launched == (6 if fused else 3)
        assert x.grad is not None and x.grad.shape == x.shape
    assert not front._FAST and gnn.uses_kernel(x.bfloat16(), x.bfloat16()) is False  # restored: CPU tensors


def test_the_profile_prints_both_columns(hp, capsys):
    assert hp.main(["--calls", "10"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("host us per layer") and "torch " in line and "ours " in line and "CPU-only" in line


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_eager_swiglu_backward_is_torchs_autograd_of_the_unfused_formula(dtype):
    """``swiglu_grads(eager=True)``: dh is what torch's autograd of ``silu(gate) * up`` gives on the
    same h, bit for bit; with the forward's ``h`` given it makes only the two GEMMs of dx and dW
    (no recompute); and it is the differentiable fp32 formula's result within rounding."""
    torch.manual_seed(3)
    x, W_gu = torch.randn(3, 5, 16).to(dtype), torch.randn(2 * 24, 16).to(dtype)
    grad = torch.randn(3, 5, 24).to(dtype)
    calls = []

    def gemm(A, B):  # A . B^T, rounded to A's dtype as the kernels round
        calls.append((tuple(A.shape), tuple(B.shape)))
        return (A.float() @ B.float().T).to(A.dtype)

    h = gemm(x, W_gu)
    leaf = h.clone().requires_grad_()  # gate and up as the same strided views of it
    (want_dh,) = torch.autograd.grad(torch.nn.functional.silu(leaf[..., :24]) * leaf[..., 24:], leaf, grad)
    dh = ops.swiglu_dh(grad, h)
    assert dh.dtype == dtype and torch.equal(dh, want_dh)
    assert torch.equal(ops.swiglu_dh(grad, h, torch.nn.functional.silu(h[..., :24])), dh)  # the forward's silu kept
    calls.clear()
    dx, dW = ops.swiglu_grads(grad, x, W_gu, (True, True), gemm, eager=True, h=h)
    assert calls == [((3, 5, 48), (16, 48)), ((48, 15), (16, 15))] and dW.shape == W_gu.shape  # dh . W_gu, dh^T . x
    calls.clear()
    ops.swiglu_grads(grad, x, W_gu, (True, True), gemm, eager=True)
    assert calls[0] == ((3, 5, 16), (48, 16)) and len(calls) == 3  # h recomputed first
    exact = ops.swiglu_grads(grad, x, W_gu, (True, True), gemm)  # rounded once: close, in norm
    for got, want in zip((dx, dW), exact):
        assert (got.float() - want.float()).norm() <= 2e-2 * want.float().norm()
    assert ops.swiglu_grads(grad, x, W_gu, (False, True), gemm, eager=True, h=h)[0] is None
