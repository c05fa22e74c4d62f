"""The SwiGLU op's backward (``torch.ops.gemm_ladder.swiglu``, the traced path of a fused MLP) on
our kernels, on the CPU: its three GEMMs go through the front door (``gemm_ladder.matmul``, a CPU
product standing in for the kernel after the front door's own checks), in the layouts the front
door reads without copies, in x's dtype; its gradients are torch's own SwiGLU's; and
``torch.library.opcheck`` (schema, fake tensors, autograd registration, AOT dispatch with dynamic
shapes) passes. The GPU smoke tier compares a fused model's gradients with torch's on the GPU
(``tests/test_gpu_smoke.py``, ``test_fused_swiglu_gradients``)."""

import pytest
import torch
import torch.nn.functional as F

from gemm_ladder.serve import front, ops

from .test_front_inputs import stand_in_matmul

swiglu = torch.ops.gemm_ladder.swiglu
DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def fresh():
    front.reset()
    yield
    front.reset()


@pytest.fixture
def gemms(monkeypatch):
    """Every product the op asks of the front door, as (A's and B's majors, M, N, K), after the
    front door's checks (``stand_in_matmul``); the forward's gated call is the front door's
    fallback on the stand-in, so the forward's product is recorded too."""
    seen = []

    def recording(A, B, bias=None, activation=None):
        a2 = A.reshape(-1, A.shape[-1])
        seen.append((front.operand_majors(a2, B), a2.shape[0], B.shape[0], a2.shape[1]))
        return stand_in_matmul(A, B, bias, activation)

    monkeypatch.setattr(ops, "matmul", recording)
    monkeypatch.setattr(ops, "swiglu", lambda x, W_gu: front.glu_halves(recording(x, W_gu)))
    return seen


def _inputs(dtype, batch=(2, 3), N=24, K=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, K, generator=g).to(dtype).requires_grad_()
    W_gu = (torch.randn(2 * N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    return x, W_gu


def _torch_swiglu(x, W_gu):
    """torch's own SwiGLU (HF's LlamaMLP's gate and up), in fp32: the reference."""
    n = W_gu.shape[0] // 2
    return F.silu(F.linear(x, W_gu[:n])) * F.linear(x, W_gu[n:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_backward_runs_its_three_gemms_through_the_front_door_in_the_layouts_it_reads(gemms, dtype,
                                                                                         monkeypatch):
    """After the forward's product: h = x . W_gu^T recomputed (K-major both), dx = dh . W_gu (W_gu's
    memory read as an MN-major B: the NN layout) and dW_gu = dh^T . x (both MN-major), no copy of
    either weight, and nothing through torch.matmul (the grads come back in x's dtype)."""
    x, W_gu = _inputs(dtype)
    y = swiglu(x, W_gu)
    del gemms[:]

    def refused(*args, **kwargs):
        raise AssertionError("the SwiGLU backward called torch.matmul")
    monkeypatch.setattr(torch, "matmul", refused)
    gx, gw = torch.autograd.grad(y, (x, W_gu), torch.randn_like(y))
    M, N2, K = 6, W_gu.shape[0], W_gu.shape[1]
    assert gemms == [(("K", "K"), M, N2, K), (("K", "N"), M, K, N2), (("M", "N"), N2, K, M)]
    assert gx.dtype == gw.dtype == dtype and gx.shape == x.shape and gw.shape == W_gu.shape


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_a_gradient_not_wanted_is_not_computed(gemms, needs):
    x, W_gu = _inputs(torch.bfloat16)
    x.requires_grad_(needs[0])
    W_gu.requires_grad_(needs[1])
    y = swiglu(x, W_gu)
    del gemms[:]
    y.backward(torch.ones_like(y))
    assert len(gemms) == 2  # the recompute and the one product wanted
    assert (x.grad is None) is (not needs[0]) and (W_gu.grad is None) is (not needs[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gradients_are_torchs_swiglus(gemms, dtype):
    """Against torch's own SwiGLU in fp32 on the same (rounded) inputs: ours rounds dh once to x's
    dtype and the GEMMs' outputs once each, so the norms agree to that rounding (2^-8 for bf16, a
    few ulps more for the sums)."""
    x, W_gu = _inputs(dtype, batch=(4, 16), N=64, K=96, seed=1)
    y = swiglu(x, W_gu)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, W_gu), g)
    xf, wf = x.detach().float().requires_grad_(), W_gu.detach().float().requires_grad_()
    rx, rw = torch.autograd.grad(_torch_swiglu(xf, wf), (xf, wf), g.float())
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    for ours, ref in ((gx, rx), (gw, rw)):
        assert (ours.float() - ref).norm() <= tol * ref.norm()
    # and torch's own SwiGLU in the input dtype (its rounding of the gate, silu and product) is as far
    tx, tw = torch.autograd.grad(_torch_swiglu(x, W_gu), (x, W_gu), g)
    for ours, theirs, ref in ((gx, tx, rx), (gw, tw, rw)):
        assert (ours.float() - ref).norm() <= 2 * (theirs.float() - ref).norm() + 1e-3 * ref.norm()


def test_opcheck_passes(gemms):
    """Schema, fake tensors, the autograd registration and AOT dispatch (dynamic shapes) with the
    backward's GEMMs through the op ``gemm_ladder::mm``."""
    x, W_gu = _inputs(torch.bfloat16)
    assert set(torch.library.opcheck(swiglu.default, (x, W_gu)).values()) == {"SUCCESS"}


def test_the_backward_differentiates_again(gemms):
    """A backward that builds a graph (``create_graph=True``): the op's GEMMs and the
    written-out silu' differentiate, so a gradient of a gradient exists and matches torch's."""
    x, W_gu = _inputs(torch.float16, N=8, K=16)
    gx, = torch.autograd.grad(swiglu(x, W_gu).float().sum(), x, create_graph=True)
    ggw, = torch.autograd.grad(gx.float().square().sum(), W_gu)
    xf, wf = x.detach().float().requires_grad_(), W_gu.detach().float().requires_grad_()
    rx, = torch.autograd.grad(_torch_swiglu(xf, wf).sum(), xf, create_graph=True)
    rw, = torch.autograd.grad(rx.square().sum(), wf)
    assert (ggw.float() - rw).norm() <= 3e-2 * rw.norm()
