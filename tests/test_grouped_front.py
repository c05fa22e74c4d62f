"""The grouped front door (``gemm_ladder.grouped_mm``) and its torch op on the CPU: every bad input
refused with its fix before anything launches, the fake op's shapes (a dynamic token count under
torch.compile), and the torch fallback's semantics against a per-expert reference.
"""

from __future__ import annotations

import pytest
import torch

import gemm_ladder
from gemm_ladder.serve import grouped, grouped_masked, grouped_ops, grouped_swiglu
from gemm_ladder.serve.runtime import ModuleInputError

ON_CPU = "move it to the GPU"


def h(*shape, device="cpu", dtype=torch.float16):
    return torch.zeros(shape, dtype=dtype, device=device)


def offs_of(*counts, device="cpu"):
    return torch.tensor(counts, dtype=torch.int32, device=device).cumsum(0).to(torch.int32)


def refused(fn, *words, error=ModuleInputError):
    with pytest.raises(error) as err:
        fn()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def reference(A, W, offs):
    """Per expert in float64: D[rows of e] = A[rows of e] . W[e]^T (rows past offs[-1]: zero)."""
    D = torch.zeros(A.shape[0], W.shape[1], dtype=torch.float64)
    start = 0
    for e, end in enumerate(offs.tolist()):
        D[start:end] = A[start:end].double() @ W[e].double().T
        start = end
    return D


A, W, OFFS = h(10, 64), h(3, 32, 64), offs_of(4, 0, 6)


@pytest.mark.parametrize("args, words", [
    ((h(10, 64), h(32, 64), OFFS), ["W [E, N, K]", "(32, 64)"]),
    ((h(2, 5, 64), W, OFFS), ["A must be [M, K]"]),
    ((h(10, 64), h(3, 32, 64, dtype=torch.bfloat16), OFFS), ["A is torch.float16 and W is torch.bfloat16"]),
    ((h(10, 64, dtype=torch.float32), h(3, 32, 64, dtype=torch.float32), OFFS), ["torch.float16 or torch.bfloat16"]),
    ((h(10, 64), h(3, 64, 32), OFFS), ["W's last dim must be A's K=64", "mat_b [E, K, N]", "transpose(1, 2)"]),
    ((A, W, offs_of(4, 6)), ["offs has shape (2,)", "(3,)", "cumsum"]),
    ((A, W, OFFS.long()), ["offs has dtype torch.int64", "offs.to(torch.int32)"]),
    ((A, W, [4, 4, 10]), ["offs must be a torch.Tensor"]),
    ((A, h(3, 64, 32).transpose(1, 2), OFFS), ["transposed view", "[E, N, K]"]),
    ((h(10, 128)[:, ::2], W, OFFS), ["A is not contiguous"]),
])
def test_bad_inputs_are_refused_with_the_fix(args, words):
    refused(lambda: gemm_ladder.grouped_mm(*args), *words)
    # the op's schema refuses what is not a tensor itself, by the argument's name
    op_words = words if all(isinstance(a, torch.Tensor) for a in args) else ["offs", "Tensor"]
    refused(lambda: grouped_ops.grouped_mm(*args), *op_words, error=(ModuleInputError, RuntimeError))


def test_a_bad_out_is_refused():
    refused(lambda: gemm_ladder.grouped_mm(A, W, OFFS, out=h(10, 31)), "out has shape (10, 31)", "(10, 32)")
    refused(lambda: gemm_ladder.grouped_mm(A, W, OFFS, out=h(10, 32, dtype=torch.bfloat16)), "out has dtype")


def test_inputs_that_fit_reach_the_device_check():
    refused(lambda: gemm_ladder.grouped_mm(A, W, OFFS), "A is on cpu", ON_CPU)


def test_a_weight_that_wants_grad_is_refused():
    refused(lambda: gemm_ladder.grouped_mm(A, h(3, 32, 64).requires_grad_(), OFFS), "W require grad", "no backward")
    with torch.no_grad():
        refused(lambda: gemm_ladder.grouped_mm(A, h(3, 32, 64).requires_grad_(), OFFS), ON_CPU)


def test_offsets_checked_on_request_name_the_bad_one():
    refused(lambda: grouped.check_offsets(offs_of(4, 0, 6), 9), "offs[2] = 10", "0..9")
    refused(lambda: grouped.check_offsets(torch.tensor([4, 3, 9], dtype=torch.int32), 10), "offs[1] = 3 after 4")
    grouped.check_offsets(offs_of(4, 0, 6), 10)


def test_the_fake_op_gives_d_of_any_token_count():
    meta = dict(device="meta")
    assert grouped_ops.grouped_mm(h(77, 64, **meta), h(3, 32, 64, **meta), h(3, dtype=torch.int32, **meta)).shape \
        == (77, 32)
    refused(lambda: grouped_ops.grouped_mm(h(77, 64, **meta), h(3, 32, 64, **meta), h(2, dtype=torch.int32, **meta)),
            "offs has shape (2,)", error=(ModuleInputError, RuntimeError))


def test_the_op_compiles_with_a_dynamic_token_count(monkeypatch):
    """torch.compile(fullgraph, dynamic) traces the op through its fake with a symbolic M; the
    torch fallback stands in for the kernel (no GPU here) and matches a per-expert reference."""
    monkeypatch.setattr(grouped_ops, "_grouped_mm", lambda a, w, o: _fallback(a, w, o))
    torch._dynamo.reset()
    layer = torch.compile(lambda a, w, o: torch.ops.gemm_ladder.grouped_mm(a, w, o) * 2, fullgraph=True,
                          dynamic=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(0)
    Wr = torch.randn(4, 24, 32, generator=gen).half()
    for counts in ((5, 0, 7, 1), (0, 0, 30, 0), (9, 9, 9, 9)):
        offs = offs_of(*counts)
        Ar = torch.randn(int(offs[-1]), 32, generator=gen).half()
        got = layer(Ar, Wr, offs)
        torch.testing.assert_close(got.double(), 2 * reference(Ar, Wr, offs), rtol=2e-2, atol=2e-2)


def _fallback(a, w, o):
    out = torch.empty(a.shape[0], w.shape[1], dtype=a.dtype)
    grouped.torch_grouped_mm(a, w, o, out)
    return out


def test_the_ops_fake_passes_opcheck(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_mm", lambda a, w, o: _fallback(a, w, o))
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(12, 32, generator=gen).half(), torch.randn(3, 16, 32, generator=gen).half(), offs_of(5, 0, 7))
    result = torch.library.opcheck(torch.ops.gemm_ladder.grouped_mm.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_the_fallback_is_the_per_expert_product_and_clamps_bad_offsets():
    gen = torch.Generator().manual_seed(2)
    Ar, Wr = torch.randn(20, 32, generator=gen).half(), torch.randn(3, 16, 32, generator=gen).half()
    for offs in (offs_of(7, 0, 13), offs_of(0, 20, 0)):
        torch.testing.assert_close(_fallback(Ar, Wr, offs).double(), reference(Ar, Wr, offs), rtol=2e-2, atol=2e-2)
    # offsets past M are clamped (the kernel's rule): the rows that exist are computed, nothing beyond
    got = _fallback(Ar, Wr, torch.tensor([7, 50, 50], dtype=torch.int32))
    torch.testing.assert_close(got.double(), reference(Ar, Wr, torch.tensor([7, 20, 20])), rtol=2e-2, atol=2e-2)


# -- the fast path: a call like one already checked skips the checks and the pack lookup -------------
class Recorder:
    """A route's run that records its launches (no GPU)."""

    def __init__(self):
        self.calls = []

    def __call__(self, A, W, table, out):
        self.calls.append((A.data_ptr(), out.data_ptr()))


@pytest.fixture
def served(monkeypatch):
    """grouped_mm on CPU tensors: the device check passed, routes from a Recorder, the checked path's
    calls counted."""
    grouped.reset()
    run, checked = Recorder(), []
    real_check = grouped.check_grouped
    monkeypatch.setattr(grouped, "check_devices", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CPU tensors have no device index
    monkeypatch.setattr(grouped, "check_grouped", lambda *a, **k: checked.append(1) or real_check(*a, **k))
    monkeypatch.setattr(grouped, "route_of", lambda *a, **k: grouped.Route(run, "test"))
    yield run, checked
    grouped.reset()


def test_a_repeated_call_takes_the_fast_path(served):
    run, checked = served
    out = h(10, 32)
    for _ in range(3):
        assert gemm_ladder.grouped_mm(A, W, OFFS, out=out) is out
    assert len(checked) == 1 and len(run.calls) == 3
    # a new D of the call's shape where out is None (one more checked call: out's absence is in the key)
    D = gemm_ladder.grouped_mm(A, W, OFFS)
    D2 = gemm_ladder.grouped_mm(A, W, OFFS)
    assert D.shape == D2.shape == (10, 32) and D.dtype == A.dtype and D.data_ptr() != D2.data_ptr()
    assert len(checked) == 2 and len(run.calls) == 5


@pytest.mark.parametrize("other", [
    lambda: (h(11, 64), W, OFFS, h(11, 32)),  # another M
    lambda: (h(10, 64, dtype=torch.bfloat16), h(3, 32, 64, dtype=torch.bfloat16), OFFS, h(10, 32, dtype=torch.bfloat16)),
    lambda: (h(64, 10).t(), W, OFFS, h(10, 32)),  # other strides: refused by the checked path
    lambda: (A, W, OFFS, h(10, 31)),  # a bad out: refused by the checked path
])
def test_the_fast_path_misses_what_it_has_not_seen_checked(served, other):
    run, checked = served
    gemm_ladder.grouped_mm(A, W, OFFS, out=h(10, 32))
    args = other()
    try:
        gemm_ladder.grouped_mm(*args[:3], out=args[3])
    except ModuleInputError:
        pass
    assert len(checked) == 2


def test_the_fast_path_leaves_overlap_alignment_grad_and_new_packs_to_the_checked_path(served, monkeypatch):
    run, checked = served
    out = h(10, 32)
    gemm_ladder.grouped_mm(A, W, OFFS, out=out)
    buf = h(10 * 32 + 8)
    # out inside A's memory (the shape and strides of a good out): not the fast path
    before = len(checked)
    big = h(10, 64)
    gemm_ladder.grouped_mm(big, W, OFFS, out=big.view(-1)[:320].view(10, 32))
    assert len(checked) == before + 1
    # an out 2 bytes off a 16-byte boundary: not the fast path (the checked one here, its device check
    # passed over in this test, launches it)
    before = len(checked)
    gemm_ladder.grouped_mm(A, W, OFFS, out=buf[1:321].view(10, 32))
    assert len(checked) == before + 1
    # grad wanted: the checked path refuses it; under no_grad the fast path takes it
    Wg = h(3, 32, 64).requires_grad_()
    refused(lambda: gemm_ladder.grouped_mm(A, Wg, OFFS, out=out), "require grad")
    with torch.no_grad():
        n = len(checked)
        gemm_ladder.grouped_mm(A, Wg, OFFS, out=out)
        assert len(checked) == n  # requires_grad is no part of the key: checked again on the fast path
    # a use_pack since (the front door's packs changed) forgets every remembered call
    n = len(checked)
    monkeypatch.setattr(grouped, "packs", lambda: [object()])
    gemm_ladder.grouped_mm(A, W, OFFS, out=out)
    assert len(checked) == n + 1


def test_explain_and_offsets_first_never_take_the_fast_path(served, capsys, monkeypatch):
    run, checked = served
    monkeypatch.setattr(grouped, "check_offsets", lambda *a, **k: None)
    out = h(10, 32)
    gemm_ladder.grouped_mm(A, W, OFFS, out=out)
    gemm_ladder.grouped_mm(A, W, OFFS, out=out, check_offsets_first=True)
    gemm_ladder.grouped_mm(A, W, OFFS, out=out, explain=True)
    assert len(checked) == 3 and len(run.calls) == 3


A3, COUNTS = h(3, 4, 64), torch.tensor([4, 0, 2], dtype=torch.int32)
DOORS = [  # front door, its module, the route maker and the check it calls, the arguments, D's shape
    ("grouped_mm", grouped, "route_of", "check_grouped", (A, W, OFFS), (10, 32)),
    ("grouped_mm_masked", grouped_masked, "route_of", "check_masked", (A3, W, COUNTS), (3, 4, 32)),
    ("grouped_swiglu", grouped_swiglu, "route_of", "check_swiglu", (A, W, OFFS), (10, 16)),
    ("grouped_swiglu_masked", grouped_swiglu, "route_of_masked", "check_swiglu_masked", (A3, W, COUNTS), (3, 4, 16)),
]


@pytest.mark.parametrize("door, module, route_of, check, args, d_shape", DOORS, ids=[d[0] for d in DOORS])
def test_every_grouped_door_takes_the_fast_path_once_checked(monkeypatch, door, module, route_of, check, args,
                                                              d_shape):
    """Each front door: a second call like a checked one skips its checks and launches the same route;
    a call with another out's shape goes to the checked path and is refused there."""
    grouped.reset()
    run, checked = Recorder(), []
    real_check = getattr(module, check)
    for m in (grouped, grouped_masked):  # the device check, as each door imports it
        monkeypatch.setattr(m, "check_devices", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(module, check, lambda *a, **k: checked.append(1) or real_check(*a, **k))
    monkeypatch.setattr(module, route_of, lambda *a, **k: grouped.Route(run, "test"))
    call = getattr(gemm_ladder, door)
    out = h(*d_shape)
    assert call(*args, out=out) is out and call(*args, out=out) is out
    assert len(checked) == 1 and len(run.calls) == 2
    refused(lambda: call(*args, out=h(*d_shape[:-1], d_shape[-1] + 1)), "out")
    assert len(checked) == 2 and len(run.calls) == 2
    grouped.reset()
