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
    assert out.grad_fn is not None and "gemm_ladder" in out.grad_fn.name()
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
