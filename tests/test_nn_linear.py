"""``gemm_ladder.nn`` on the CPU: Linear is nn.Linear's parameters and state dict; off the GPU it is
F.linear; on the op's path (a CPU stand-in for the kernel) its forward and gradients are
nn.Linear's; ``patch`` swaps exactly the nn.Linear layers, sharing their parameters."""

import pytest
import torch
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.serve import front, ops


def test_the_state_dict_is_nn_linears_both_ways():
    torch.manual_seed(0)
    ref = nn.Linear(64, 40)
    ours = gnn.Linear(64, 40)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    back = nn.Linear(64, 40)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, ref.weight) and torch.equal(back.bias, ref.bias)


def test_off_the_gpu_it_is_f_linear():
    lin = nn.Linear(64, 40).half()
    ours = gnn.Linear.from_linear(lin)
    x = torch.randn(3, 64).half()
    assert not gnn.uses_kernel(x, ours.weight)
    assert torch.equal(ours(x), lin(x))


def test_on_the_ops_path_forward_and_gradients_are_nn_linears(monkeypatch):
    """The op's path with a CPU product standing in for the kernel: the output and the gradients
    of x, the weight and the bias are nn.Linear's (in fp32 on the same values)."""
    def stand_in(A, B, bias=None, activation=None):  # pylint: disable=unused-argument
        front.check_shapes(A, B, None, bias)
        return (A.float() @ B.float().T + (0 if bias is None else bias.float())).to(A.dtype)

    monkeypatch.setattr(ops, "matmul", stand_in)
    monkeypatch.setattr(gnn, "uses_kernel", lambda x, w: True)
    torch.manual_seed(1)
    lin = nn.Linear(64, 40).half()
    ours = gnn.Linear.from_linear(nn.Linear(64, 40).half())
    ours.load_state_dict(lin.state_dict())
    x = torch.randn(2, 3, 64).half()
    x1, x2 = x.clone().requires_grad_(), x.float().requires_grad_()
    ref = nn.Linear(64, 40)
    ref.load_state_dict({k: v.float() for k, v in lin.state_dict().items()})
    out = ours(x1)
    assert type(out.grad_fn) is gnn.LinearFunction._backward_cls  # pylint: disable=protected-access
    out.float().sum().backward()
    ref(x2).sum().backward()
    for got, want in ((x1.grad, x2.grad), (ours.weight.grad, ref.weight.grad), (ours.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_patch_swaps_exactly_the_linear_layers_and_shares_their_parameters():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(16, 32)
            self.act = nn.GELU()
            self.down = nn.Linear(32, 16, bias=False)
            self.attn = nn.MultiheadAttention(16, 2)  # its out_proj is a subclass: kept

        def forward(self, x):
            return self.down(self.act(self.up(x)))

    model = nn.Sequential(Block(), nn.Linear(16, 8))
    params = {n: p for n, p in model.named_parameters()}
    x = torch.randn(4, 16)
    before = model(x)
    swapped = gnn.patch(model, verbose=False)
    assert sorted(swapped) == ["0.down", "0.up", "1"]
    assert type(model[0].up) is gnn.Linear and type(model[0].attn.out_proj) is not gnn.Linear
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameter objects
    assert torch.equal(model(x), before)  # on the CPU: F.linear, the same numbers
    assert gnn.patch(model, verbose=False) == []  # nothing left to swap
    with pytest.raises(TypeError, match="from_linear"):
        gnn.patch(nn.Linear(4, 4))


def test_patch_says_what_it_swapped(capsys):
    gnn.patch(nn.Sequential(nn.Linear(8, 8)))
    assert "1 nn.Linear layer(s)" in capsys.readouterr().err


# -- eager without the custom op's dispatch, traced through the op (issue 31's training step) ------
def cpu_product(calls):
    """The front door on the CPU: its shape checks, the operands' layouts and memory recorded
    (``front.operand_majors``; a copy would show as a new data_ptr), then a CPU product."""
    def matmul(A, B, bias=None, activation=None):
        act = front.check_activation(activation)
        front.check_shapes(A, B, None, bias)
        a2 = A.reshape(-1, A.shape[-1]) if A.dim() > 2 else A
        calls.append((front.operand_majors(a2, B), A.data_ptr(), B.data_ptr()))
        out = A.float() @ B.float().T + (0 if bias is None else bias.float())
        return (out if act == "none" else torch.relu(out)).to(A.dtype)
    return matmul


@pytest.fixture
def on_kernel(monkeypatch):
    """Linear on the op's path with a CPU product for the kernel; returns the recorded calls."""
    calls = []
    monkeypatch.setattr(ops, "matmul", cpu_product(calls))
    monkeypatch.setattr(gnn, "uses_kernel", lambda x, w: True)
    return calls


def _layer(bias=True):
    torch.manual_seed(3)
    return gnn.Linear.from_linear(nn.Linear(64, 40, bias=bias).half())


@pytest.mark.parametrize("bias", [True, False])
def test_eager_gradients_are_the_ops_bit_for_bit_and_the_backward_copies_nothing(on_kernel, bias):
    """The eager Function and the registered op on the same values: the same output and the same
    gradients, exactly; the backward hands dX = dY . W the weight's own memory as an MN-major B,
    and dW = dY^T . X the memory of dY and x as MN-major A and B (no copies)."""
    lin = _layer(bias)
    x = torch.randn(2, 3, 64).half()
    dY = torch.randn(2, 3, 40).half()
    got, ref = {}, {}
    for name, fn in (("eager", lin), ("op", lambda t: torch.ops.gemm_ladder.mm(t, lin.weight, lin.bias))):
        lin.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        out = fn(xi)
        on_kernel.clear()
        out.backward(dY)
        (got if name == "eager" else ref).update(out=out.detach(), x=xi.grad, w=lin.weight.grad,
                                                 b=None if lin.bias is None else lin.bias.grad)
        if name == "eager":
            dx_call, dw_call = on_kernel
            assert dx_call == (("K", "N"), dY.data_ptr(), lin.weight.data_ptr())
            assert dw_call == (("M", "N"), dY.data_ptr(), xi.data_ptr())
    for k, v in got.items():
        assert (v is None) == (ref[k] is None) and (v is None or torch.equal(v, ref[k])), k


def test_eager_grad_fn_is_the_function_and_without_grad_there_is_none(on_kernel):
    lin = _layer()
    x = torch.randn(4, 64).half()
    assert type(lin(x).grad_fn) is gnn.LinearFunction._backward_cls  # the weight wants grad
    with torch.no_grad():
        assert lin(x.requires_grad_()).grad_fn is None
    lin.requires_grad_(False)
    assert lin(torch.randn(4, 64).half()).grad_fn is None  # nothing wants grad: the plain call
    assert len(on_kernel) == 3


def test_traced_it_is_the_registered_op(on_kernel):
    """Fake tensors (a dispatch mode) and torch.compile(fullgraph=True) see torch.ops.gemm_ladder.mm;
    the compiled forward and backward give the eager numbers."""
    lin = _layer()
    with torch._subclasses.fake_tensor.FakeTensorMode():  # pylint: disable=protected-access
        x, w = torch.empty(5, 64, dtype=torch.float16), torch.empty(40, 64, dtype=torch.float16)
        assert gnn.traced(x, w)
        assert gnn.linear(x, w).shape == (5, 40)  # the op's fake impl: no data touched
    assert on_kernel == []
    assert not gnn.traced(torch.empty(2), lin.weight)
    x = torch.randn(4, 64).half()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = lin(x1)
    eager.float().sum().backward()
    wgrad = lin.weight.grad.clone()
    lin.zero_grad(set_to_none=True)
    torch._dynamo.reset()  # pylint: disable=protected-access
    targets = []

    def recording(gm, example_inputs):  # pylint: disable=unused-argument
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    compiled = torch.compile(lin, backend=recording, fullgraph=True)(x2)
    assert any("gemm_ladder.mm" in t for t in targets), targets
    compiled.float().sum().backward()
    assert torch.equal(compiled, eager) and torch.equal(x2.grad, x1.grad) and torch.equal(lin.weight.grad, wgrad)


def _cast_nodes(out) -> int:
    """ToCopyBackward0 nodes in ``out``'s graph: the autocast casts whose backward runs."""
    seen, todo, casts = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        casts += node.name() == "ToCopyBackward0"
        todo += [n for n, _ in node.next_functions]
    return casts


def test_under_autocast_it_casts_as_f_linear_does_and_dw_reaches_the_fp32_weight(on_kernel):
    """fp32 master weights under bf16 autocast: x and the weight cast once each, as torch's
    F.linear casts them (no extra cast node); the weight's gradient arrives in fp32."""
    torch.manual_seed(4)
    ref = nn.Linear(64, 40, bias=False)
    ours = gnn.Linear.from_linear(ref)
    x = torch.randn(2, 3, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, out_ref = ours(x), ref(x)
    assert out.dtype == out_ref.dtype == torch.bfloat16
    assert _cast_nodes(out) == _cast_nodes(out_ref) == 1  # the weight's (x wants no grad)
    out.float().sum().backward()
    assert ours.weight.grad.dtype == torch.float32
    ref_grad = ours.weight.grad.clone()
    ref.weight.grad = None
    out_ref.float().sum().backward()
    torch.testing.assert_close(ref_grad, ref.weight.grad, rtol=2e-2, atol=2e-2)


def test_a_backward_that_builds_a_graph_goes_through_the_op_and_differentiates_again(on_kernel):
    """``create_graph=True`` (grad mode on in the backward): the backward's GEMMs are the op's,
    so the gradient has a graph of its own; its values are the plain backward's."""
    lin = _layer(bias=False)
    x = torch.randn(4, 64).half().requires_grad_()
    (gx,) = torch.autograd.grad(lin(x).float().sum(), x, create_graph=True)
    assert gx.grad_fn is not None
    (plain,) = torch.autograd.grad(lin(x).float().sum(), x)
    assert torch.equal(gx.detach(), plain)
    gx.float().square().sum().backward()  # through the op's own backward
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


# -- the fast lane of a repeated inference call ------------------------------------------------
def test_plain_inference_means_no_grad_no_tracer():
    assert not gnn.plain_inference()  # grad recorded (the test's default)
    with torch.no_grad():
        assert gnn.plain_inference()
        with torch._subclasses.fake_tensor.FakeTensorMode():  # pylint: disable=protected-access
            assert not gnn.plain_inference()  # a dispatch mode: the op, which the tracer sees
    with torch.inference_mode():
        assert gnn.plain_inference()


@pytest.fixture
def fast_lane(monkeypatch):
    """gnn.fast_mm recording its calls and answering with a marker tensor (or None: a call no
    checked call was like)."""
    calls, answer = [], {"out": torch.full((3, 40), 7.0)}

    def fake(x, w, bias=None):
        calls.append((x, w, bias))
        return answer["out"]

    monkeypatch.setattr(gnn, "fast_mm", fake)
    return calls, answer


@pytest.mark.parametrize("bias", [False, True])
def test_a_plain_inference_call_tries_the_fast_path_first(fast_lane, bias):
    calls, answer = fast_lane
    lin = nn.Linear(64, 40, bias=bias)
    ours = gnn.Linear.from_linear(lin)
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert ours(x) is answer["out"]
        assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is ours.weight and calls[0][2] is ours.bias
        answer["out"] = None  # no checked call like it: the layer's own path (F.linear off the GPU)
        torch.testing.assert_close(ours(x), lin(x), rtol=0, atol=0)


def test_the_fast_path_is_not_tried_with_grad_an_activation_or_a_subclass(fast_lane):
    calls, _ = fast_lane
    lin = nn.Linear(64, 40)
    x = torch.randn(3, 64)
    assert gnn.Linear.from_linear(lin)(x).requires_grad  # grad recorded: the autograd path
    with torch.no_grad():
        gnn.Linear.from_linear(lin, activation="relu")(x)  # an epilogue: the checked path

        class Marked(torch.Tensor):
            pass

        gnn.Linear.from_linear(lin)(x.as_subclass(Marked))  # a subclass: its own dispatch
    assert calls == []


def test_the_swiglu_fast_path_reads_the_current_fused_weight(monkeypatch):
    from .test_nn_fuse import LlamaMLP  # pylint: disable=import-outside-toplevel

    seen = []
    monkeypatch.setattr(gnn, "fast_swiglu", lambda x, w: seen.append(w) or torch.zeros(x.shape[0], 24))
    mlp = gnn.SwiGLUMLP.from_mlp(LlamaMLP())
    x = torch.randn(5, 16)
    with torch.no_grad():
        mlp(x)  # no fused weight yet: the layer's own path, which builds none off the GPU
        assert seen == []
        mlp.fused_weight(torch.float32)  # as a first call on the GPU leaves it
        assert torch.equal(mlp(x), mlp.down_proj(torch.zeros(5, 24)))
        mlp.gate_proj.weight.mul_(2)  # the version counter moves: a new fused weight
        mlp(x)
    assert len(seen) == 2 and torch.equal(seen[1][:24], mlp.gate_proj.weight)
    assert not torch.equal(seen[0][:24], seen[1][:24])
