"""The front door's inputs that used to mislead (issue 28), on the CPU: an ``out`` that overlaps A
or B, tensors that want grad, B passed as a transposed view (since issue 31 an MN-major B), arguments that are not tensors, and
a bias (issue 29) of the wrong shape, dtype or layout, through ``gemm_ladder.matmul``, the torch op
and ``gemm_ladder.build``/``load``. Each is refused
before any GPU is asked, so the checks run here; a call that passes them all is told, here, to
move its tensors to the GPU. The fast path's share is in ``tests/test_front_door.py``."""

import hashlib
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gemm_ladder
from gemm_ladder.serve import front, ops
from gemm_ladder.serve.kernel_pack import PACK_FORMAT, PACK_MANIFEST, PACK_VERSION
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.core.spec import GemmSpec, torch_activation
from gemm_ladder.serve.tma_layout import Layout, layout_fixes

mm = torch.ops.gemm_ladder.mm
ON_CPU = "move it to the GPU"  # what a call that passes every other check is told here


@pytest.fixture(autouse=True)
def fresh():
    front.reset()
    yield
    front.reset()


def h(*shape, device="cpu"):
    return torch.zeros(shape, dtype=torch.float16, device=device)


def refused(call, *words, error=ModuleInputError):
    with pytest.raises(error) as err:
        call()
    for w in words:
        assert w in str(err.value), str(err.value)


# -- out overlapping A or B -----------------------------------------------------------------------
def test_out_that_is_a_or_b_is_refused():
    """``matmul(A, W, out=A)`` with N == K used to run, reading A while writing it."""
    A, B = torch.randn(8, 64).half(), torch.randn(64, 64).half()
    refused(lambda: gemm_ladder.matmul(A, B, out=A), "out overlaps A", "shares no memory with A or B")
    refused(lambda: gemm_ladder.matmul(A, B, out=B[:8]), "out overlaps B")
    refused(lambda: gemm_ladder.matmul(A, B, out=torch.empty(8, 64).half()), ON_CPU)  # an out of its own


@settings(max_examples=80, deadline=None)
@given(M=st.integers(1, 4), N=st.integers(1, 4), K=st.integers(1, 4), one_buffer=st.booleans(),
       starts=st.tuples(st.integers(0, 48), st.integers(0, 48), st.integers(0, 48)))
def test_out_is_refused_exactly_when_it_shares_an_element_with_a_or_b(M, N, K, one_buffer, starts):
    """A, B and out cut from one buffer at any element offsets (or B from its own): the call is
    refused for overlap exactly when out's elements meet A's or B's (A meeting B is fine: both
    are only read)."""
    flat, other = torch.zeros(64).half(), torch.zeros(64).half()
    a0, b0, d0 = starts
    A = flat[a0:a0 + M * K].view(M, K)
    B = (flat if one_buffer else other)[b0:b0 + N * K].view(N, K)
    out = flat[d0:d0 + M * N].view(M, N)
    d_elems = set(range(d0, d0 + M * N))
    if d_elems & set(range(a0, a0 + M * K)):
        refused(lambda: front.matmul(A, B, out), "out overlaps A")
    elif one_buffer and d_elems & set(range(b0, b0 + N * K)):
        refused(lambda: front.matmul(A, B, out), "out overlaps B")
    else:
        refused(lambda: front.matmul(A, B, out), ON_CPU)


# -- tensors that want grad -----------------------------------------------------------------------
@pytest.mark.parametrize("which", ["A", "B", "out"])
def test_a_tensor_that_wants_grad_is_refused_while_grad_mode_is_on(which):
    """The result of matmul has no grad_fn: with grad mode on, gradients would stop there."""
    args = {"A": h(4, 64), "B": h(8, 64), "out": h(4, 8)}
    args[which].requires_grad_()
    call = lambda: gemm_ladder.matmul(args["A"], args["B"], out=args["out"])  # noqa: E731
    refused(call, f"{which} requires grad", "torch.no_grad()", "torch.ops.gemm_ladder.mm")
    with torch.no_grad():
        refused(call, ON_CPU)
    with torch.inference_mode():
        refused(call, ON_CPU)


def stand_in_matmul(A, B, bias=None, activation=None):
    """``gemm_ladder.matmul`` for the op's tests on the CPU: its checks, then a CPU product (with
    the bias and the activation)."""
    act = front.check_activation(activation)
    front.check_shapes(A, B, None, bias)
    return torch_activation(A.float() @ B.float().T + (0 if bias is None else bias.float()), act).to(A.dtype)


def test_the_op_has_a_backward_so_it_takes_tensors_that_want_grad():
    """The op's autograd runs the front door with grad mode off: no refusal (the device's error)."""
    refused(lambda: mm(h(2, 4, 64).requires_grad_(), h(8, 64).requires_grad_()), ON_CPU)


def test_the_ops_autograd_and_fake_pass_opcheck_through_the_front_doors_checks(monkeypatch):
    """The op's forward and backward go through the front door's checks (a CPU product stands in
    for the kernel): torch.library.opcheck's schema, autograd, fake-tensor and AOT tests pass, so
    the backward passes operands the op takes (transposed views: MN-major operands), and the
    gradients are torch's."""
    monkeypatch.setattr(ops, "matmul", stand_in_matmul)
    A = torch.randn(3, 5, 64).half().requires_grad_()
    B = torch.randn(40, 64).half().requires_grad_()
    assert set(torch.library.opcheck(mm.default, (A, B)).values()) == {"SUCCESS"}
    mm(A, B).float().square().sum().backward()
    A2, B2 = A.detach().float().requires_grad_(), B.detach().float().requires_grad_()
    (A2 @ B2.T).half().float().square().sum().backward()
    torch.testing.assert_close(A.grad.float(), A2.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(B.grad.float(), B2.grad, rtol=2e-2, atol=2e-2)


# -- B passed as a transposed view (issue 31: an MN-major B, read as it lies) ----------------------
def test_a_transposed_weight_is_an_mn_major_b_not_a_refusal():
    """``matmul(x, W.t())`` (W [K, N] contiguous) is B [N, K] whose memory is [K, N]: an MN-major
    B, accepted without a copy (issue 31; issue 28 refused it). A view that is no transpose of a
    contiguous tensor is still told to be made contiguous."""
    lin = torch.nn.Linear(64, 64, bias=False).half().requires_grad_(False)
    x = h(4, 64)
    refused(lambda: gemm_ladder.matmul(x, lin.weight.t()), ON_CPU)  # checked and accepted: the device's error
    refused(lambda: gemm_ladder.matmul(x, lin.weight), ON_CPU)
    refused(lambda: gemm_ladder.matmul(x, h(8, 128)[:, ::2]), "B is not contiguous", "nor the transposed view")
    refused(lambda: gemm_ladder.matmul(h(8, 128)[:, ::2], lin.weight), "A is not contiguous")


def test_the_op_takes_a_transposed_weight_too_real_and_fake():
    lin = torch.nn.Linear(64, 64, bias=False).half().requires_grad_(False)
    refused(lambda: mm(h(4, 64), lin.weight.t()), ON_CPU)
    assert mm(h(4, 64, device="meta"), h(64, 64, device="meta").t()).shape == (4, 64)
    refused(lambda: mm(h(4, 64), lin.weight), ON_CPU)
    refused(lambda: mm(h(4, 64), h(8, 128)[:, ::2]), ON_CPU)  # other strides: made contiguous, as before
    assert mm(h(4, 64, device="meta"), h(64, 64, device="meta")).shape == (4, 64)


def test_a_transposed_weight_of_another_shape_gets_the_hint_with_the_shape_error():
    """A non-square ``lin.weight.t()`` is [K, N]: the shape error says B looks like it."""
    W = torch.nn.Linear(64, 32, bias=False).half().requires_grad_(False).weight  # [32, 64]
    words = ["A's last dim", "B looks like [K, N]", "pass lin.weight itself"]
    refused(lambda: gemm_ladder.matmul(h(4, 64), W.t()), *words[1:], "must be B's K=32")
    refused(lambda: mm(h(4, 64, device="meta"), W.t().to("meta")), *words, error=RuntimeError)


# -- arguments that are not tensors ---------------------------------------------------------------
W = h(8, 64)


@pytest.mark.parametrize("args, words", [
    ((None, W), ["A must be a torch.Tensor [..., K]", "NoneType"]),
    ((h(4, 64), None), ["B must be a torch.Tensor [N, K]", "NoneType"]),
    (([[1.0] * 64], W), ["A must be a torch.Tensor", "list"]),
    ((h(4, 64), W, 3), ["out must be a torch.Tensor [..., N] or None", "int"]),
])
def test_matmul_names_an_argument_that_is_not_a_tensor(args, words):
    refused(lambda: gemm_ladder.matmul(*args), *words)


@pytest.mark.parametrize("args, words", [
    ((None, W), ["gemm_ladder.mm: A must be a torch.Tensor [..., K]", "NoneType"]),
    ((h(4, 64), None), ["gemm_ladder.mm: B must be a torch.Tensor [N, K]", "NoneType"]),
])
def test_the_op_names_an_argument_that_is_not_a_tensor(args, words):
    refused(lambda: mm(*args), *words)


@pytest.mark.parametrize("first", [42, None, b"v4", 4.0])
def test_build_names_a_first_argument_that_is_neither_a_rung_nor_a_prim_func(first):
    refused(lambda: gemm_ladder.build(first, 128, 128, 64), "gemm_ladder.build takes a rung name ('v4'",
            "gemm_ladder.hgemm_v4(M, N, K)", f"got {type(first).__name__} {first!r}", error=TypeError)


@pytest.mark.parametrize("path", [42, None, ["v4.so"]])
def test_load_names_a_path_that_is_not_one(path):
    refused(lambda: gemm_ladder.load(path), "gemm_ladder.load takes the path of an exported module",
            f"got {type(path).__name__}", error=TypeError)


# -- the bias (the operand spec's per-column epilogue operand) ------------------------------------
@pytest.mark.parametrize("bias, words", [
    (h(7), ["bias has shape (7,)", "one value per column of D: (8,)"]),
    (h(1, 8), ["bias has shape (1, 8)", "(8,)"]),
    (h(16)[::2], ["bias is not contiguous", "bias.contiguous()"]),
    (torch.zeros(8), ["bias has dtype torch.float32", "A's torch.float16", "bias.to(torch.float16)"]),
    ([0.0] * 8, ["bias must be a torch.Tensor of N=8 values or None", "list"]),
])
def test_a_bias_that_does_not_fit_is_refused_with_the_fix(bias, words):
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, bias=bias), *words)
    if isinstance(bias, torch.Tensor) and bias.is_contiguous():  # the op makes its inputs contiguous first
        refused(lambda: mm(h(2, 3, 64), W, bias), *words, error=(ModuleInputError, RuntimeError))


def test_a_bias_that_fits_reaches_the_device_check_and_the_fake_op():
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, bias=h(8)), ON_CPU)
    refused(lambda: mm(h(2, 3, 64), W, h(8)), ON_CPU)
    assert mm(h(2, 3, 64, device="meta"), h(8, 64, device="meta"), h(8, device="meta")).shape == (2, 3, 8)
    refused(lambda: mm(h(4, 64, device="meta"), h(8, 64, device="meta"), h(4, device="meta")), "bias has shape (4,)",
            error=(ModuleInputError, RuntimeError))


def test_a_bias_that_wants_grad_or_is_overwritten_is_refused():
    b = h(8).requires_grad_()
    refused(lambda: gemm_ladder.matmul(h(4, 64), W, bias=b), "bias requires grad", "torch.ops.gemm_ladder.mm")
    flat = h(64)
    refused(lambda: gemm_ladder.matmul(h(4, 64), W, out=flat[:32].view(4, 8), bias=flat[:8]), "out overlaps bias")


def test_an_empty_k_gives_the_bias():
    """K = 0: nothing to launch, D is the bias on every row (as torch's addmm gives)."""
    b = torch.arange(8).half()
    D = front._trivial(h(3, 0), None, (3, 8), 3, 8, 0, b)
    torch.testing.assert_close(D, b.expand(3, 8))


def test_the_torch_fallback_adds_the_bias():
    A, B, b = torch.randn(5, 64).half(), torch.randn(8, 64).half(), torch.randn(8).half()
    out = torch.full((5, 8), float("nan")).half()
    front.TorchMatmul()(A, B, out, b)
    torch.testing.assert_close(out, torch.nn.functional.linear(A, B, b))


def test_a_pack_without_a_bias_module_falls_back_to_torch_and_strict_raises(tmp_path, monkeypatch):
    """A runtime-only box whose pack has no bias module: torch computes the bias call, with one
    warning that says how to build one (--epilogue bias); strict mode raises instead."""
    (tmp_path / PACK_MANIFEST).write_text(f'{{"format": "{PACK_FORMAT}", "version": {PACK_VERSION}, "modules": []}}')
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")
    monkeypatch.setattr(front, "_why_no_build", lambda: "TVM's compiler is not installed here")
    front.use_pack(tmp_path)
    with pytest.warns(front.KernelFallbackWarning, match="with a bias.*--epilogue bias"):
        route = front.route_of(16, 256, 512, "float16", 0, False, GemmSpec.with_bias())
    assert isinstance(route.module, front.TorchMatmul)
    A, B, b = torch.randn(16, 512).half(), torch.randn(256, 512).half(), torch.randn(256).half()
    d = torch.empty(16, 256).half()
    route.run(A, B, d, {"bias": b})
    torch.testing.assert_close(d, torch.nn.functional.linear(A, B, b))
    with pytest.raises(front.NoKernelError, match="with a bias.*--epilogue bias"):
        front.route_of(16, 256, 512, "float16", 0, True, GemmSpec.with_bias())


def test_the_op_with_a_bias_passes_opcheck_and_its_bias_grad_sums_the_rows(monkeypatch):
    monkeypatch.setattr(ops, "matmul", stand_in_matmul)
    A = torch.randn(3, 5, 64).half().requires_grad_()
    B = torch.randn(40, 64).half().requires_grad_()
    b = torch.randn(40).half().requires_grad_()
    assert set(torch.library.opcheck(mm.default, (A, B, b)).values()) == {"SUCCESS"}
    mm(A, B, b).float().square().sum().backward()
    A2, B2, b2 = (t.detach().float().requires_grad_() for t in (A, B, b))
    torch.nn.functional.linear(A2, B2, b2).half().float().square().sum().backward()
    for ours, theirs in ((A, A2), (B, B2), (b, b2)):
        torch.testing.assert_close(ours.grad.float(), theirs.grad, rtol=2e-2, atol=2e-2)


class _BiasKernel:
    """Stands in for a loaded bias module: refuses what TMA cannot describe, then D = A . B^T + bias."""

    def __call__(self, a, b, out, bias=None):
        for name, t in (("A", a), ("B", b), ("out", out), ("bias", bias)):
            assert t is not None and t.is_contiguous() and t.data_ptr() % 16 == 0, f"{name} is not TMA-ready"
        assert bias.shape == (b.shape[0],), "the bias is padded like N"
        out.copy_((a.float() @ b.float().T + bias.float()).to(out.dtype))


@pytest.mark.parametrize("N, K", [(64, 64), (100, 64), (36, 20), (250, 64)])
def test_a_pack_bias_module_serves_a_bias_call_with_ns_padding(tmp_path, monkeypatch, N, K):
    """The pack's bias module (its entry's spec) serves the bias call; where N is padded for TMA,
    the bias is padded with zeros like B's rows, and D is cut back to N; where N is split (250), the
    module takes the first 248 values and torch the rest."""
    fixes = layout_fixes(Layout(5, N, K, "float16"))
    blob = b"\1" * 64
    (tmp_path / "b.so").write_bytes(blob)
    man = {"format": 2, "rung": "v9", "shape": [1, fixes.N, fixes.K], "dtype": "float16", "arch": "sm_90a",
           "knobs": {"dtype": "float16", "arch": "sm_90a"}, "tvm_version": "0.27.0.post1", "launch": {"dynamic_m": True},
           "so_bytes": 64, "so_sha256": hashlib.sha256(blob).hexdigest(),
           "spec": GemmSpec.with_bias().to_dict()}
    (tmp_path / "b.so.json").write_text(json.dumps(man))
    entry = {k: man[k] for k in ("rung", "shape", "dtype", "arch", "knobs", "so_bytes", "so_sha256", "spec")}
    (tmp_path / PACK_MANIFEST).write_text(json.dumps(
        {"format": PACK_FORMAT, "version": PACK_VERSION,
         "modules": [{**entry, "file": "b.so", "dynamic_m": True, "m_range": [1, 64]}]}))
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")
    monkeypatch.setattr(front, "_load", lambda path: _BiasKernel())
    front.use_pack(tmp_path)
    route = front.route_of(5, N, K, "float16", 0, True, GemmSpec.with_bias())
    assert route.source == "kernel pack" and route.rung == "v9"
    A, B, b = torch.randn(5, K).half(), torch.randn(N, K).half(), torch.randn(N).half()
    D = front.launch_route(route, A, B, None, 5, N, K, fixes, b)
    torch.testing.assert_close(D, torch.nn.functional.linear(A, B, b), rtol=2e-3, atol=2e-3)


# -- the activation (issue 31: the spec's act, after the bias) -------------------------------------
ACTS = ("relu", "gelu_tanh", "gelu_erf", "silu")


@pytest.mark.parametrize("activation, words", [
    ("gelu", ["activation='gelu'", "relu, gelu_tanh, gelu_erf, silu", "F.gelu's default is gelu_erf"]),
    ("tanh", ["activation='tanh'", "use one of"]),
    (torch.nn.functional.relu, ["activation=<function", "or None"]),
])
def test_an_unknown_activation_is_refused_with_the_names(activation, words):
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, activation=activation), *words)
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, bias=h(8), activation=activation), *words)
    if isinstance(activation, str):
        refused(lambda: mm(h(2, 3, 64), W, None, activation), *words, error=(ModuleInputError, RuntimeError))
        refused(lambda: mm(h(2, 3, 64, device="meta"), W.to("meta"), None, activation), *words,
                error=(ModuleInputError, RuntimeError))


@pytest.mark.parametrize("act", ACTS)
def test_an_activation_that_fits_reaches_the_device_check_and_the_fake_op(act):
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, activation=act), ON_CPU)
    refused(lambda: gemm_ladder.matmul(h(2, 3, 64), W, bias=h(8), activation=act), ON_CPU)
    refused(lambda: mm(h(2, 3, 64), W, h(8), act), ON_CPU)
    meta = mm(h(2, 3, 64, device="meta"), h(8, 64, device="meta"), h(8, device="meta"), act)
    assert meta.shape == (2, 3, 8) and meta.dtype == torch.float16


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_op_with_an_activation_passes_opcheck_and_its_grads_go_through_it(monkeypatch, act, with_bias):
    """The backward recomputes the activation's input (Z = mm(A, B, bias)) and takes dD through
    torch's backward of the activation: the grads of A, B and the bias are torch's."""
    monkeypatch.setattr(ops, "matmul", stand_in_matmul)
    A = torch.randn(3, 5, 64).half().requires_grad_()
    B = torch.randn(40, 64).half().requires_grad_()
    b = torch.randn(40).half().requires_grad_() if with_bias else None
    assert set(torch.library.opcheck(mm.default, (A, B, b, act)).values()) == {"SUCCESS"}
    mm(A, B, b, act).float().square().sum().backward()
    ins = [t for t in (A, B, b) if t is not None]
    ref = [t.detach().float().requires_grad_() for t in ins]
    torch_activation(torch.nn.functional.linear(*ref), act).half().float().square().sum().backward()
    for ours, theirs in zip(ins, ref):  # rounding points differ (fp16 Z): compared as norms
        assert (ours.grad.float() - theirs.grad).norm() <= 1e-2 * theirs.grad.norm(), act


@pytest.mark.parametrize("act", ACTS)
def test_the_torch_fallback_and_an_empty_k_apply_the_activation(act):
    A, B, b = torch.randn(5, 64).half(), torch.randn(8, 64).half(), torch.randn(8).half()
    out = torch.full((5, 8), float("nan")).half()
    front.TorchMatmul(act)(A, B, out, b)
    torch.testing.assert_close(out, torch_activation(torch.nn.functional.linear(A, B, b), act))
    D = front._trivial(h(3, 0), None, (3, 8), 3, 8, 0, b, act)
    torch.testing.assert_close(D, torch_activation(b, act).expand(3, 8))


def test_a_pack_without_an_activation_module_falls_back_to_torch_and_strict_raises(tmp_path, monkeypatch):
    """As for the bias: torch computes it (F.linear, then the activation) with one warning that
    names the pack build that makes one (--epilogue bias_gelu_tanh); strict mode raises."""
    (tmp_path / PACK_MANIFEST).write_text(f'{{"format": "{PACK_FORMAT}", "version": {PACK_VERSION}, "modules": []}}')
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")
    monkeypatch.setattr(front, "_why_no_build", lambda: "TVM's compiler is not installed here")
    front.use_pack(tmp_path)
    spec = GemmSpec.with_epilogue("float16", True, "gelu_tanh")
    with pytest.warns(front.KernelFallbackWarning, match="bias_gelu_tanh.*--epilogue bias_gelu_tanh"):
        route = front.route_of(16, 256, 512, "float16", 0, False, spec)
    assert isinstance(route.module, front.TorchMatmul)
    A, B, b = torch.randn(16, 512).half(), torch.randn(256, 512).half(), torch.randn(256).half()
    d = torch.empty(16, 256).half()
    route.run(A, B, d, {"bias": b})
    torch.testing.assert_close(d, torch.nn.functional.gelu(torch.nn.functional.linear(A, B, b), approximate="tanh"))
    with pytest.raises(front.NoKernelError, match="--epilogue bias_gelu_tanh"):
        front.route_of(16, 256, 512, "float16", 0, True, spec)
