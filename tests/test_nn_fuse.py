"""``gemm_ladder.nn.patch(model, fuse=True)`` on the CPU: which MLPs and Linear -> activation pairs
it recognises (and which look-alikes it leaves alone), the state dict it keeps, the fused
weight's cache, and -- on the op's path with a CPU product standing in for the kernels -- the
fused forward and gradients against the unfused model, eager and traced."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.core.spec import torch_activation
from gemm_ladder.serve import front, ops


class SiLUActivation(nn.Module):  # transformers' legacy ACT2FN["silu"]: not a torch.nn module
    def forward(self, input):  # pylint: disable=redefined-builtin
        return F.silu(input)


class LlamaMLP(nn.Module):
    """HF's LlamaMLP's structure (MistralMLP and Qwen2MLP are the same): act_fn = ACT2FN[...]."""

    def __init__(self, hidden=16, inter=24, act=None, gate_bias=False):
        super().__init__()
        self.hidden_size, self.intermediate_size = hidden, inter
        self.gate_proj = nn.Linear(hidden, inter, bias=gate_bias)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU() if act is None else act

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class FunctionalMLP(LlamaMLP):  # benchmarks/e2e_check.py's MLP: F.silu, the product the other way round
    def forward(self, x):
        return self.down_proj(self.up_proj(x) * F.silu(self.gate_proj(x)))


class SwappedRoles(LlamaMLP):  # the same attributes, silu on the up projection: not SwiGLU as fused
    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


class Scaled(LlamaMLP):  # one more operation
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 0.5)


@pytest.mark.parametrize("mlp", [LlamaMLP(), LlamaMLP(act=SiLUActivation()), FunctionalMLP()],
                         ids=["nn.SiLU", "SiLUActivation", "F.silu"])
def test_llama_style_mlps_are_recognised(mlp):
    assert gnn.swiglu_mismatch(mlp) is None


@pytest.mark.parametrize("mlp, why", [
    (LlamaMLP(act=nn.GELU()), "activation is GELU"),
    (LlamaMLP(act=nn.GELU(approximate="tanh")), "activation is GELU"),
    (LlamaMLP(gate_bias=True), "has a bias"),
    (SwappedRoles(), "forward is not"),
    (Scaled(), "forward is not"),
], ids=["gelu", "gelu_tanh", "gate-bias", "swapped-roles", "extra-op"])
def test_look_alikes_are_not_fused_and_say_why(mlp, why):
    assert why in gnn.swiglu_mismatch(mlp)
    model = nn.Sequential(mlp)
    report = gnn.patch(model, verbose=False, fuse=True)
    assert type(model[0]) is type(mlp) and report.fused == [] and report.left[0][0] == "0"


def test_a_hooked_gate_is_not_fused():
    mlp = LlamaMLP()
    mlp.gate_proj.register_forward_hook(lambda *a: None)
    assert "hooks" in gnn.swiglu_mismatch(mlp)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = LlamaMLP()
        self.other = LlamaMLP(act=nn.GELU())
        self.head = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 16), nn.ReLU())

    def forward(self, x):
        return self.head(self.mlp(x) + self.other(x))


def test_patch_fuse_keeps_names_state_dict_parameters_and_output(capsys):
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    x = torch.randn(3, 16)
    before = model(x)
    report = gnn.patch(model, fuse=True)
    assert [n for n, _ in report.fused] == ["0.mlp", "1.mlp", "0.head.0", "0.head.2", "1.head.0", "1.head.2"]
    assert [n for n, _ in report.left] == ["0.other", "1.other"]
    assert type(model[0].mlp) is gnn.SwiGLUMLP and type(model[0].other) is LlamaMLP
    assert model[0].head[0].activation == "gelu_tanh" and model[0].head[2].activation == "relu"
    assert type(model[0].head[1]) is nn.Identity
    assert "0.head.0" in report and "0.mlp.gate_proj" in report  # every linear runs on our kernels
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p is params[n] for n, p in model.named_parameters())  # an optimizer built before stays valid
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # off the GPU: the MLP's own formula
    err = capsys.readouterr().err
    assert "fused 6:" in err and "0.other: its activation is GELU, not silu" in err
    fresh = nn.Sequential(Block(), Block())
    fresh.load_state_dict(model.state_dict())  # and back: the keys a checkpoint of the original has
    torch.testing.assert_close(fresh(x), before, rtol=0, atol=0)


def test_fuse_false_is_the_plain_swap_and_a_root_mlp_is_left():
    model = nn.Sequential(LlamaMLP())
    assert sorted(gnn.patch(model, verbose=False)) == ["0.down_proj", "0.gate_proj", "0.up_proj"]
    assert type(model[0]) is LlamaMLP
    report = gnn.patch(LlamaMLP(), verbose=False, fuse=True)
    assert "model itself" in report.left[0][1] and report.fused == []


def test_sequential_pairs_take_only_plain_sequential_and_unhooked_modules():
    class MySeq(nn.Sequential):
        pass
    assert gnn.sequential_pairs(nn.Sequential(nn.Linear(4, 4), nn.SiLU(), nn.Tanh())) == [(0, "silu")]
    assert gnn.sequential_pairs(MySeq(nn.Linear(4, 4), nn.ReLU())) == []
    seq = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    seq[0].register_forward_hook(lambda *a: None)
    assert gnn.sequential_pairs(seq) == []


def test_the_fused_weight_is_cached_until_a_weight_changes():
    mlp = gnn.SwiGLUMLP.from_mlp(LlamaMLP())
    w = mlp.fused_weight(torch.float32)
    assert mlp.fused_weight(torch.float32) is w
    torch.testing.assert_close(w, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), rtol=0, atol=0)
    other = LlamaMLP()
    mlp.load_state_dict(other.state_dict())  # in place: the version counters move
    w2 = mlp.fused_weight(torch.float32)
    assert w2 is not w and torch.equal(w2[24:], other.up_proj.weight)
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(2)
    assert torch.equal(mlp.fused_weight(torch.float32)[:24], mlp.gate_proj.weight)
    with torch.inference_mode():
        inside = mlp.fused_weight(torch.float16)
    assert not inside.is_inference() and inside.dtype == torch.float16  # a later forward with grad may save it
    assert mlp.fused_weight(torch.float32, cache=False) is not mlp.fused_weight(torch.float32)


def test_meta_and_fake_forwards_give_the_shapes():
    with torch.device("meta"):
        mlp = gnn.SwiGLUMLP.from_mlp(LlamaMLP())
        assert mlp(torch.empty(2, 5, 16)).shape == (2, 5, 16)
    with torch._subclasses.fake_tensor.FakeTensorMode():  # pylint: disable=protected-access
        with torch.device("cuda"):
            lin = lambda i, o: nn.Linear(i, o, bias=False, dtype=torch.bfloat16)  # noqa: E731
            mlp = gnn.SwiGLUMLP(lin(16, 24), lin(16, 24), lin(24, 16))
            x = torch.empty(2, 5, 16, dtype=torch.bfloat16)
        assert gnn.traced(x) and mlp(x).shape == (2, 5, 16)  # through the op's fake impl


# -- the op's path with a CPU product for the kernels -------------------------------------------
def _cpu_matmul(A, B, bias=None, activation=None, **_):
    act = front.check_activation(activation)
    out = A.float() @ B.float().T + (0 if bias is None else bias.float())
    return torch_activation(out, act).to(A.dtype)


def _cpu_swiglu(x, W_gu, out=None, strict=None):  # pylint: disable=unused-argument
    """The gated kernel's numbers: the product in fp32, silu(gate) * up in fp32, rounded once."""
    return front.glu_halves(x.float() @ W_gu.float().T).to(x.dtype)


@pytest.fixture
def on_kernel(monkeypatch):
    monkeypatch.setattr(ops, "matmul", _cpu_matmul)
    monkeypatch.setattr(ops, "swiglu", _cpu_swiglu)
    monkeypatch.setattr(gnn, "uses_kernel", lambda x, w: True)
    monkeypatch.setattr(gnn, "swiglu_uses_kernel", lambda *a: True)


def _pair(dtype=torch.float16):
    torch.manual_seed(2)
    ref = FunctionalMLP(32, 48)
    ours = gnn.SwiGLUMLP.from_mlp(FunctionalMLP(32, 48).to(dtype))
    ours.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
    gnn.patch(ours, verbose=False)
    return ref, ours


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_()
    out = model(xi)
    out.float().square().sum().backward()
    return out.detach().float(), xi.grad.float(), {n.removeprefix("_orig_mod."): p.grad.float()
                                                   for n, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True])
def test_eager_fused_forward_and_gradients_are_the_unfused_models(on_kernel, recompute):  # pylint: disable=unused-argument
    """Training's forward and gradients are the unfused model's within rounding, whether it keeps h
    (one GEMM for gate and up, then torch's silu(gate) * up: bit for bit that on h) or runs the
    gated kernel and recomputes h in the backward (bit for bit the inference forward)."""
    ref, ours = _pair()
    ours.recompute, ours.fused_training = recompute, True
    x = torch.randn(2, 3, 32)
    out = ours(x.half().requires_grad_())
    # pylint: disable=protected-access
    assert type(out.grad_fn) is gnn.LinearFunction._backward_cls  # down_proj's, on our kernels
    assert type(out.grad_fn.next_functions[0][0]) is gnn.SwiGLUFunction._backward_cls
    want, got = _grads(ref, x), _grads(ours, x.half())
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(got[1], want[1], rtol=2e-2, atol=2e-3)
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=2e-2, atol=2e-3, msg=name)
    with torch.no_grad():
        inference = ours(x.half()).float()  # the cached fused weight, the gated kernel
        h = _cpu_matmul(x.half(), torch.cat([ours.gate_proj.weight, ours.up_proj.weight]))
        kept = ours.down_proj(F.silu(h[..., :48]) * h[..., 48:]).float()
    torch.testing.assert_close(got[0], inference if recompute else kept, rtol=0, atol=0)
    torch.testing.assert_close(inference, kept, rtol=2e-2, atol=2e-3)


def test_by_default_training_runs_the_mlps_own_formula_on_its_linears(on_kernel):  # pylint: disable=unused-argument
    """Gate and up as two GEMMs with contiguous outputs (measured faster over a step than the
    fused path's strided halves): the unfused model's graph and gradients; inference stays fused."""
    ref, ours = _pair()
    x = torch.randn(2, 3, 32)
    out = ours(x.half().requires_grad_())
    mul = out.grad_fn.next_functions[0][0]  # down_proj's input: silu(gate) * up, torch's product
    assert type(out.grad_fn) is gnn.LinearFunction._backward_cls and type(mul).__name__ == "MulBackward0"
    assert not any(type(f) is gnn.SwiGLUFunction._backward_cls for f, _ in mul.next_functions if f is not None)
    want, got = _grads(ref, x), _grads(ours, x.half())
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=2e-2, atol=2e-3, msg=name)
    assert ours._fused is None  # pylint: disable=protected-access  # no fused weight built
    with torch.no_grad():
        torch.testing.assert_close(ours(x.half()), got[0].half(), rtol=2e-2, atol=2e-3)
    assert ours._fused is not None  # pylint: disable=protected-access  # inference: the gated kernel's W_gu


def test_under_autocast_the_fp32_weights_get_fp32_gradients(on_kernel):  # pylint: disable=unused-argument
    ref, _ = _pair()
    ours = gnn.SwiGLUMLP.from_mlp(FunctionalMLP(32, 48))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, out_ref = ours(x), ref(x)
    assert out.dtype == out_ref.dtype == torch.bfloat16
    out.float().sum().backward()
    out_ref.float().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32, name
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-3, msg=name)


def test_compiled_it_is_the_swiglu_op_and_gives_the_eager_numbers(on_kernel):  # pylint: disable=unused-argument
    _, ours = _pair()
    ours.recompute = ours.fused_training = True  # eager on the gated kernel too: the op's forward numbers, bit for bit
    x = torch.randn(4, 32).half()
    eager = _grads(ours, x)
    torch._dynamo.reset()  # pylint: disable=protected-access
    targets = []

    def recording(gm, example_inputs):  # pylint: disable=unused-argument
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    compiled = _grads(torch.compile(ours, backend=recording, fullgraph=True), x)
    assert any("gemm_ladder.swiglu" in t for t in targets), targets
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(compiled[1], eager[1], rtol=2e-2, atol=2e-3)  # the op's backward: fp32 GEMMs
    for name, g in eager[2].items():
        torch.testing.assert_close(compiled[2][name], g, rtol=2e-2, atol=2e-3, msg=name)


def test_a_linear_with_an_activation_has_the_ops_gradients(on_kernel):  # pylint: disable=unused-argument
    torch.manual_seed(5)
    ref = nn.Sequential(nn.Linear(32, 24), nn.GELU(approximate="tanh"))
    ours = gnn.Linear.from_linear(nn.Linear(32, 24).half(), activation="gelu_tanh")
    ours.load_state_dict({k.removeprefix("0."): v.half() for k, v in ref.state_dict().items()})
    x = torch.randn(5, 32)
    got, want = _grads(ours, x.half()), _grads(ref, x)
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    for name in ("weight", "bias"):
        torch.testing.assert_close(got[2][name], want[2]["0." + name], rtol=2e-2, atol=2e-3)
    with pytest.raises(ValueError, match="activation='gelu'"):
        gnn.Linear.from_linear(nn.Linear(4, 4), activation="gelu")
