"""MN-major operands at the front door and in the torch op (issue 31), on the CPU: which views
are MN-major, what a module of each layout is handed (the memory under the view, no copy), the
op's backward passing its operands as transposed views (dX = dY . W with W as an MN-major B,
dW = dY^T . X with both MN-major), its gradients against torch's through a CPU stand-in for the
kernel, opcheck, and fake tensors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemm_ladder.core.spec import GemmSpec, torch_activation
from gemm_ladder.serve import front, ops
from gemm_ladder.serve.front import Route, launch_route, operand_majors
from gemm_ladder.serve.runtime import GemmModule, ModuleInputError
from gemm_ladder.serve.tma_layout import Fixes

mm = torch.ops.gemm_ladder.mm


@pytest.fixture(autouse=True)
def fresh():
    front.reset()
    yield
    front.reset()


def r(*shape):
    return torch.randn(shape).half()


# -- which operands are MN-major -------------------------------------------------------------------
def test_operand_majors_reads_the_strides():
    x, w = r(16, 64), r(32, 64)
    assert operand_majors(x, w) == ("K", "K")
    assert operand_majors(x, r(64, 32).t()) == ("K", "N")  # W.t() of a [K, N] weight
    assert operand_majors(r(64, 16).t(), w) == ("M", "K")  # X.t() of a [K, M] tensor
    assert operand_majors(r(64, 16).t(), r(64, 32).t()) == ("M", "N")
    assert operand_majors(r(2, 16, 64), w) == ("K", "K")  # batched A: always K-major
    assert operand_majors(x, r(32, 128)[:, ::2]) == ("K", "K")  # not a transpose (made contiguous, or refused)


# -- what a module is handed -----------------------------------------------------------------------
class Recorder:
    """A module of ``spec`` that records the tensors its launcher is handed (the kernel's A, B)."""

    def __init__(self, spec):
        self.spec, self.calls = spec, []

    def launcher(self, a, b, d, **operands):  # pylint: disable=unused-argument
        return lambda x, y, z, *extras: self.calls.append((x, y, z))


@pytest.mark.parametrize("a_major, b_major", [("K", "N"), ("M", "K"), ("M", "N")])
def test_a_module_gets_the_memory_under_each_transposed_view_without_a_copy(a_major, b_major):
    M, N, K = 16, 24, 32
    A = r(K, M).t() if a_major == "M" else r(M, K)
    B = r(K, N).t() if b_major == "N" else r(N, K)
    mod = Recorder(GemmSpec(a_major=a_major, b_major=b_major))
    launch_route(Route(mod, None, "test", "v9", {}), A, B, None, M, N, K, Fixes((), N, K))
    a, b, d = mod.calls[0]
    assert a.is_contiguous() and b.is_contiguous() and d.shape == (M, N)
    assert tuple(a.shape) == ((K, M) if a_major == "M" else (M, K)) and a.data_ptr() == A.data_ptr()
    assert tuple(b.shape) == ((K, N) if b_major == "N" else (N, K)) and b.data_ptr() == B.data_ptr()


def test_a_module_for_a_larger_m_gets_an_mn_major_a_padded_in_its_own_layout():
    """A module built for M = 32 serving M = 20: A is copied into 32 zero-padded columns of its
    [K, M] memory, not into rows of a K-major copy the MN-major kernel would misread."""
    M, N, K = 20, 24, 32
    A = r(K, M).t()
    mod = Recorder(GemmSpec(a_major="M"))
    launch_route(Route(mod, 32, "test", "v9", {}), A, r(N, K), None, M, N, K, Fixes((), N, K))
    a = mod.calls[0][0]
    assert a.shape == (K, 32) and a.is_contiguous()
    assert torch.equal(a[:, :M], A.t()) and not a[:, M:].any()


def test_torchs_fallback_gets_the_views():
    seen = []
    route = Route(front.TorchMatmul(), None, "torch fallback", "torch", {})
    A, B = r(32, 16).t(), r(32, 24).t()
    route.launchers[None] = lambda a, b, d, *extras: seen.append((a, b))  # the CPU's "GPU": record it
    launch_route(route, A, B, None, 16, 24, 32, Fixes((), 24, 32))
    assert seen[0][0] is A and seen[0][1] is B  # torch.matmul takes any strides


def _module(spec: GemmSpec, M=64, N=32, K=48) -> GemmModule:
    manifest = {"rung": "v9", "shape": [M, N, K], "dtype": "float16", "arch": "sm_90a", "knobs": {},
                "tvm_version": "0.27", "spec": spec.to_dict(), "launch": {}}
    return GemmModule("m.so", manifest, None)


def test_a_module_checks_its_operands_in_their_stored_shapes():
    mod = _module(GemmSpec(a_major="M", b_major="N"))
    assert mod.stored_shape("A", 64) == (48, 64) and mod.stored_shape("B", 64) == (48, 32)
    with pytest.raises(ModuleInputError, match=r"A has shape \(64, 48\); this module wants \(48, 64\)"):
        mod(r(64, 48), r(48, 32))  # a K-major A handed to an MN-major module
    with pytest.raises(ModuleInputError, match="move it to the GPU"):  # the stored shapes pass
        mod(r(48, 64), r(48, 32))
    assert _module(GemmSpec()).stored_shape("B", 64) == (32, 48)


# -- the op's backward -----------------------------------------------------------------------------
def stand_in(calls):
    """``gemm_ladder.matmul`` for the op on the CPU: the front door's checks, the layouts it is
    handed recorded, then a CPU product."""
    def matmul(A, B, bias=None, activation=None):
        act = front.check_activation(activation)
        front.check_shapes(A, B, None, bias)
        calls.append(operand_majors(A.reshape(-1, A.shape[-1]) if A.dim() > 2 else A, B))
        return torch_activation(A.float() @ B.float().T + (0 if bias is None else bias.float()), act).to(A.dtype)
    return matmul


@pytest.mark.parametrize("bias, act", [(False, None), (True, None), (True, "gelu_tanh")])
def test_the_backward_passes_transposed_views_and_its_gradients_are_torchs(monkeypatch, bias, act):
    """dX = dY . W reads W [N, K] as an MN-major B; dW = dY^T . X reads dY and X as an MN-major A
    and B; the bias's gradient is dY's column sums. Against torch in fp32 on the same values."""
    calls = []
    monkeypatch.setattr(ops, "matmul", stand_in(calls))
    X = r(3, 5, 64).requires_grad_()
    W = (r(40, 64) * 0.1).requires_grad_()
    b = r(40).requires_grad_() if bias else None
    out = mm(X, W, b, act)
    calls.clear()
    out.float().square().sum().backward()
    if act is None:
        assert calls == [("K", "N"), ("M", "N")]  # dX, then dW
    else:
        assert calls == [("K", "K"), ("K", "N"), ("M", "N")]  # the pre-activation recomputed first
    X2, W2 = X.detach().float().requires_grad_(), W.detach().float().requires_grad_()
    b2 = b.detach().float().requires_grad_() if bias else None
    ref = torch.nn.functional.linear(X2, W2, b2)
    ref = torch_activation(ref, act or "none")
    ref.half().float().square().sum().backward()
    for got, want in ((X.grad, X2.grad), (W.grad, W2.grad)) + (((b.grad, b2.grad),) if bias else ()):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_opcheck_passes_with_transposed_inputs(monkeypatch):
    """The op's schema, fake, autograd and AOT dispatch tests with an MN-major A and B given to the
    forward (the backward then sees K-major and transposed operands alike)."""
    monkeypatch.setattr(ops, "matmul", stand_in([]))
    A = r(64, 16).t().requires_grad_()
    B = r(64, 24).t().requires_grad_()
    assert set(torch.library.opcheck(mm.default, (A, B)).values()) == {"SUCCESS"}


def test_fake_tensors_take_transposed_views():
    with torch._subclasses.fake_tensor.FakeTensorMode():  # pylint: disable=protected-access
        A, W = torch.empty(64, 16, dtype=torch.float16).t(), torch.empty(64, 24, dtype=torch.float16).t()
        assert mm(A, W).shape == (16, 24)
    meta = torch.empty(64, 24, dtype=torch.bfloat16, device="meta")
    assert mm(torch.empty(16, 64, dtype=torch.bfloat16, device="meta"), meta.t()).shape == (16, 24)
    with pytest.raises(RuntimeError, match="B looks like"):  # the shape is still D = A . B^T's
        mm(torch.empty(16, 64, dtype=torch.bfloat16, device="meta"), meta)


def test_by_capture_hands_each_module_its_own_operands():
    """A route measured at first use may run ours eagerly and torch's inside graph capture (or the
    reverse): ours of an MN-major spec gets the memory under the views, torch's the views."""
    M, N, K = 16, 24, 32
    A, B, d = r(K, M).t(), r(K, N).t(), torch.empty(M, N).half()
    ours, theirs = Recorder(GemmSpec(a_major="M", b_major="N")), Recorder(None)  # theirs: torch's, no spec
    for module, stored in ((ours, True), (theirs, False)):
        front.ByCapture._views(module, A, B, d, {})(A, B, d)  # pylint: disable=protected-access
        a, b, _ = module.calls[-1]
        assert (a.is_contiguous() and b.is_contiguous()) == stored and a.data_ptr() == A.data_ptr()
    # launch_route hands ByCapture the views: it converts per module (its launcher asks CUDA whether
    # a capture is on, so it runs on the GPU tier)
    assert front.takes_stored(front.ByCapture(ours, theirs)) == (False, False)


def _cli(*args):
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "gemm_ladder", *args], capture_output=True, text=True, cwd=repo,
                          env={**os.environ, "PYTHONPATH": str(repo)}, check=False)


def test_pack_build_takes_the_operand_layouts():
    """``pack build --layouts KK,KN,MN``: a module of each (the backward's dX and dW beside the
    forward), named apart; an unknown layout is refused with the known ones."""
    out = _cli("pack", "build", "--shapes", "256x512x384", "--dtypes", "bfloat16", "--layouts", "KK,KN,MN", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "_b_major_N.so" in out.stdout and "_a_major_M-b_major_N.so" in out.stdout and "3 modules" in out.stdout
    bad = _cli("pack", "build", "--shapes", "256x512x384", "--layouts", "NT", "--dry-run")
    assert bad.returncode == 2 and "not a known operand layout" in bad.stderr and "KK,KN,MK,MN" in bad.stderr
