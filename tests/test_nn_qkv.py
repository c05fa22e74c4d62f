"""``gemm_ladder.nn.patch(model, fuse=True)``'s q, k and v as one GEMM (``nn.SharedInput``) on the
CPU, with a recording CPU product standing in for the kernels: which attentions it groups, that
a forward makes one GEMM for the three and returns each member's own product, and every case
where the members must run alone (another input, an input written in place, changed weights,
a gradient, a forward that reads only some members)."""

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.serve import ops


class Attention(nn.Module):
    """HF Llama's projections (q, then k, then v of one input; k and v narrower), ``order``
    permuting the calls; the products reshaped by their last dimension as the attention does."""

    def __init__(self, hidden=32, kv=8, bias=False, order="qkv"):
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, kv, bias=bias)
        self.v_proj = nn.Linear(hidden, kv, bias=bias)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.order = order

    def forward(self, x):
        got = {c: getattr(self, f"{c}_proj")(x) for c in self.order}
        B, S, _ = x.shape
        heads = got["q"].view(B, S, -1, self.k_proj.out_features)  # each product split by its last dim
        mixed = heads * got["k"].view(B, S, 1, -1) + got["v"].view(B, S, 1, -1)
        return self.o_proj(mixed.reshape(B, S, -1))


@pytest.fixture
def gemms(monkeypatch):
    """The op's product on the CPU (fp32, rounded once), each call's B shape recorded."""
    calls = []

    def cpu_matmul(A, B, bias=None, activation=None, **_):  # pylint: disable=unused-argument
        calls.append(tuple(B.shape))
        return (A.float() @ B.float().T + (0 if bias is None else bias.float())).to(A.dtype)

    monkeypatch.setattr(ops, "matmul", cpu_matmul)
    monkeypatch.setattr(gnn, "uses_kernel", lambda x, w: True)
    return calls


def _patched(dtype=torch.float16, **kw):
    torch.manual_seed(0)
    ref = Attention(**kw)
    ours = copy.deepcopy(ref).to(dtype)
    report = gnn.patch(ours, verbose=False, fuse=True)
    return ref, ours, report


def _separate(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x.float(), lin.weight.float(), None if lin.bias is None else lin.bias.float()).to(x.dtype)


def test_patch_groups_q_k_v_and_keeps_names_parameters_and_state_dict():
    ref = Attention(bias=True)
    params = dict(ref.named_parameters())
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    report = gnn.patch(ref, verbose=False, fuse=True)
    assert report.fused == [("", "qkv: q_proj, k_proj and v_proj in one GEMM")]
    group = ref.q_proj.shared
    assert isinstance(group, gnn.SharedInput) and group.widths == [32, 8, 8]
    assert group.members == [ref.q_proj, ref.k_proj, ref.v_proj] and ref.k_proj.shared is group
    assert ref.o_proj.shared is None and sorted(report) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert all(p is params[n] for n, p in ref.named_parameters())
    assert ref.state_dict().keys() == state.keys()
    assert gnn.patch(ref, verbose=False, fuse=True).left == [("", "already fused")]


@pytest.mark.parametrize("change, why", [
    (lambda m: setattr(m, "k_proj", nn.Linear(16, 8)), "differ in input width"),
    (lambda m: setattr(m, "v_proj", nn.Linear(32, 8, bias=True)), "bias"),
    (lambda m: setattr(m, "q_proj", nn.Conv1d(32, 32, 1)), "not all nn.Linear"),
    (lambda m: setattr(m, "k_proj", gnn.Linear.from_linear(nn.Linear(32, 8), "relu")), "not all nn.Linear"),
    (lambda m: m.v_proj.half(), "dtype"),
])
def test_look_alikes_are_left_and_say_why(change, why):
    m = Attention()
    change(m)
    report = gnn.patch(m, verbose=False, fuse=True)
    assert report.fused == [] and len(report.left) == 1 and why in report.left[0][1]
    assert all(getattr(lin, "shared", None) is None for lin in m.modules())


def test_a_group_of_other_linears_is_refused():
    a, b = gnn.Linear(8, 8), gnn.Linear(4, 8)
    with pytest.raises(ValueError, match="one input width"):
        gnn.SharedInput([a, b])
    with pytest.raises(ValueError, match="two or more"):
        gnn.SharedInput([gnn.Linear.from_linear(nn.Linear(8, 8), "silu"), gnn.Linear(8, 8)])


@pytest.mark.parametrize("order", ["qkv", "vkq", "kqv"])
@pytest.mark.parametrize("bias", [False, True])
def test_one_gemm_gives_each_member_its_own_product(gemms, order, bias):
    ref, ours, _ = _patched(order=order, bias=bias)
    x = torch.randn(2, 5, 32).half()
    seen = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(ours, name).register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, o))
    with torch.no_grad():
        out = ours(x)
    assert gemms == [(48, 32), (32, 32)]  # q, k and v in one GEMM of 32 + 8 + 8 columns, then o
    base = seen["q_proj"].untyped_storage().data_ptr()
    for name in ("q_proj", "k_proj", "v_proj"):
        got = seen[name]
        assert got.untyped_storage().data_ptr() == base  # column slices of the one product
        torch.testing.assert_close(got, _separate(getattr(ours, name), x), rtol=1e-3, atol=1e-3)
    assert ours.q_proj.shared._kept is None  # pylint: disable=protected-access  # nothing held after the forward
    torch.testing.assert_close(out.float(), ref(x.float()), rtol=2e-2, atol=2e-2)


def _qkv(model, x) -> list:
    return [model.q_proj(x), model.k_proj(x), model.v_proj(x)]


def test_the_fused_weight_is_cached_and_rebuilt_when_a_member_changes(gemms):
    _, ours, _ = _patched()
    group = ours.q_proj.shared
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        _qkv(ours, x)
        W = group._fused[1]  # pylint: disable=protected-access
        _qkv(ours, x)
        assert group._fused[1] is W  # pylint: disable=protected-access
        ours.k_proj.weight.mul_(2)  # an in-place write: its version counter
        got = _qkv(ours, x)
        assert group._fused[1] is not W  # pylint: disable=protected-access
        for lin, y in zip((ours.q_proj, ours.k_proj, ours.v_proj), got):
            torch.testing.assert_close(y, _separate(lin, x), rtol=1e-3, atol=1e-3)
        ours.load_state_dict({k: v * 0 for k, v in ours.state_dict().items()})  # writes in place
        assert not any(y.any() for y in _qkv(ours, x))
    assert gemms == [(48, 32)] * 4 and group.off is None


def test_a_member_whose_weight_changed_after_the_product_was_made_gets_a_new_one(gemms):
    _, ours, _ = _patched()
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        ours.q_proj(x)
        ours.v_proj.weight.add_(1)
        torch.testing.assert_close(ours.v_proj(x), _separate(ours.v_proj, x), rtol=1e-3, atol=1e-3)
    assert gemms == [(48, 32), (48, 32)]


def test_a_member_gets_no_product_made_from_another_input(gemms):
    _, ours, _ = _patched()
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        ours.q_proj(x)
        other = x.clone()
        torch.testing.assert_close(ours.k_proj(other), _separate(ours.k_proj, other), rtol=1e-3, atol=1e-3)
    assert gemms == [(48, 32), (48, 32)]  # k's product of the other input: a GEMM of its own


def test_a_member_gets_no_product_of_its_input_before_an_in_place_write(gemms):
    _, ours, _ = _patched()
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        ours.q_proj(x)
        x.add_(1)  # written in place after q read it
        torch.testing.assert_close(ours.v_proj(x), _separate(ours.v_proj, x), rtol=1e-3, atol=1e-3)
    assert gemms == [(48, 32), (48, 32)] and ours.q_proj.shared.off is None  # one miss is not a pattern


def test_a_forward_that_reads_only_q_turns_the_group_off_with_a_warning(gemms):
    _, ours, _ = _patched()
    group = ours.q_proj.shared
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(group.MISSES + 2):
            torch.testing.assert_close(ours.q_proj(x.clone()), _separate(ours.q_proj, x), rtol=1e-3, atol=1e-3)
    assert group.off is not None and "did not read every member" in group.off
    assert len([w for w in caught if "SharedInput: turned off" in str(w.message)]) == 1
    assert gemms[-2:] == [(32, 32), (32, 32)]  # then q alone, its own width


@pytest.fixture
def trains(gemms, monkeypatch):
    """The op's CPU product (``gemms``) where a gradient is recorded too."""
    monkeypatch.setattr(gnn, "group_uses_kernel", lambda x, w, dtype, autocast: dtype in (torch.float16,
                                                                                          torch.bfloat16))
    return gemms


@pytest.mark.parametrize("bias", [False, True])
def test_with_a_gradient_one_gemm_each_way_and_the_unfused_gradients(trains, bias):
    """Training: one forward GEMM over the three weights, one dX over all the columns' gradient
    (K = 48), one dW (M = 48 rows), o's three; the gradients are the unfused model's."""
    ref, ours, _ = _patched(dtype=torch.float16, bias=bias)
    ref = ref.half()
    x = torch.randn(2, 3, 32).half()
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(xr).float().square().sum().backward()
    out = ours(xo)
    assert trains == [(48, 32), (32, 32)]  # the forward: q, k and v in one GEMM, then o
    out.float().square().sum().backward()
    # B of each backward GEMM: o's dX (W_o) and dW (x^T, 6 rows); q/k/v's dX (W_qkv^T: K = 48) and dW
    assert sorted(trains[2:]) == sorted([(32, 32), (32, 6), (32, 48), (32, 6)])
    torch.testing.assert_close(xo.grad, xr.grad, rtol=2e-2, atol=2e-3)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, ref.get_parameter(name).grad, rtol=2e-2, atol=2e-3, msg=name)
    assert ours.q_proj.shared._kept is None  # pylint: disable=protected-access


def test_under_autocast_fp32_weights_get_fp32_gradients_from_one_cast_of_x(trains):
    ref, ours, _ = _patched(dtype=torch.float32)
    x = torch.randn(2, 3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours(x).float().square().sum().backward()
        ref(x).float().square().sum().backward()
    assert trains[0] == (48, 32)
    for name, p in ours.named_parameters():
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, ref.get_parameter(name).grad, rtol=5e-2, atol=5e-2, msg=name)


def test_traced_the_members_run_alone(trains):
    _, ours, _ = _patched()
    x = torch.randn(1, 3, 32).half()
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):  # pylint: disable=protected-access
        assert ours.q_proj(x).shape == (1, 3, 32) and ours.k_proj(x).shape == (1, 3, 8)
    assert ours.q_proj.shared._kept is None and trains == []  # pylint: disable=protected-access


def test_off_the_kernels_path_the_members_are_their_linears():
    _, ours, _ = _patched(dtype=torch.float32)  # CPU tensors: uses_kernel is False
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        assert torch.equal(ours.k_proj(x), F.linear(x, ours.k_proj.weight))
    assert ours.q_proj.shared._fused is None  # pylint: disable=protected-access


def test_copies_and_pickles_drop_the_cache_and_keep_their_own_group(gemms):
    _, ours, _ = _patched()
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        ours(x)
        ours.q_proj(x)  # a product of k and v kept
    twin = copy.deepcopy(ours)
    group = twin.q_proj.shared
    assert group is not ours.q_proj.shared and group.members == [twin.q_proj, twin.k_proj, twin.v_proj]
    assert group._fused is None and group._kept is None  # pylint: disable=protected-access
    back = pickle.loads(pickle.dumps(ours))
    assert back.v_proj.shared._fused is None and back.v_proj.shared.members[2] is back.v_proj  # pylint: disable=protected-access
    with torch.no_grad():
        torch.testing.assert_close(twin(x), ours(x.clone()), rtol=0, atol=0)


def test_fuse_names_the_fusions_and_refuses_others():
    m = nn.ModuleDict({"attn": Attention(), "seq": nn.Sequential(nn.Linear(4, 4), nn.ReLU())})
    report = gnn.patch(m, verbose=False, fuse=("act",))
    assert [n for n, _ in report.fused] == ["seq.0"] and m["attn"].q_proj.shared is None
    assert [n for n, _ in gnn.patch(Attention(), verbose=False, fuse="qkv").fused] == [""]
    assert gnn.fusions(True) == set(gnn.FUSIONS) and gnn.fusions(False) == set()
    for bad in ("qvk", ("swiglu", "mlp"), 3):
        with pytest.raises(ValueError, match="some of swiglu, qkv, act"):
            gnn.patch(Attention(), verbose=False, fuse=bad)


def test_a_model_made_under_inference_mode_fuses_and_runs(gemms, monkeypatch):
    """Inference tensors have no version counter: the caches key them without one."""
    monkeypatch.setattr(ops, "swiglu", lambda x, W, **_: F.silu((x.float() @ W.float().T)[..., :W.shape[0] // 2]
                                                                ).mul((x.float() @ W.float().T)[..., W.shape[0] // 2:]
                                                                      ).to(x.dtype))
    monkeypatch.setattr(gnn, "swiglu_uses_kernel", lambda *a: True)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(32, 24, bias=False), nn.Linear(32, 24, bias=False)
            self.down_proj = nn.Linear(24, 32, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = Attention(), MLP()

        def forward(self, x):
            return self.mlp(self.attn(x))

    torch.manual_seed(1)
    ref = Layer()
    with torch.inference_mode():
        ours = copy.deepcopy(ref).half()
        assert ours.attn.q_proj.weight.is_inference()
        report = gnn.patch(ours, verbose=False, fuse=True)
        assert sorted(n for n, _ in report.fused) == ["attn", "mlp"]
        x = torch.randn(2, 3, 32)
        got = ours(x.half())
        got_again = ours(x.half())
    assert gemms == [(48, 32), (32, 32), (32, 24)] * 2  # q/k/v, o, down; gate and up on the swiglu op
    with torch.no_grad():
        torch.testing.assert_close(got.float(), ref(x), rtol=3e-2, atol=3e-3)
    assert torch.equal(got, got_again)


def test_a_sibling_called_with_grad_after_a_no_grad_call_gets_its_own_graph(trains):
    _, ours, _ = _patched(dtype=torch.float16)
    x = torch.randn(1, 3, 32).half()
    with torch.no_grad():
        ours.q_proj(x)  # k and v of x kept, without a graph
    k = ours.k_proj(x)  # grad on: not the kept product
    assert k.requires_grad and trains == [(48, 32), (48, 32)]
    k.float().sum().backward()
    torch.testing.assert_close(ours.k_proj.weight.grad.float(), x.float().sum((0, 1)).expand(8, 32),
                               rtol=1e-2, atol=1e-2)
    assert ours.q_proj.weight.grad is not None and not ours.q_proj.weight.grad.any()  # q's rows: no gradient
