"""The front door's fast path for transposed views (issue 31's training step), on the CPU: the
backward's GEMMs (dX = dY . W with W read as an MN-major B, dW = dY^T . X with both MN-major) and
a forward with a bias, repeated, take the key lookup and the launch alone, as a K-major call
does; a changed stride, dtype or aliasing misses the key and gets the checked path's checks.

The checked path refuses CPU tensors, so these tests give it CPU stand-ins for its two GPU-bound
steps (the device checks of ``_check`` and the route lookup of ``_route``); everything between
them -- the layout decision, the launch, what is remembered -- is the front door's own."""

import pytest
import torch

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import front
from gemm_ladder.serve.runtime import ModuleInputError


@pytest.fixture(autouse=True)
def fresh():
    front.reset()
    yield
    front.reset()


class Recorder:
    """A module of ``spec``: its launcher records the tensors it is handed and computes D = A . B^T
    (+ bias) from them as the kernel would read them (an MN-major operand as its stored [K, M])."""

    def __init__(self, spec: GemmSpec):
        self.spec, self.calls, self.made = spec, [], 0

    def launcher(self, a, b, d, **operands):  # pylint: disable=unused-argument
        self.made += 1

        def launch(x, y, z, *extras):
            self.calls.append((x, y, z, extras))
            xa = x.t() if self.spec.a_major == "M" else x
            yb = y.t() if self.spec.b_major == "N" else y
            z.copy_((xa.float() @ yb.float().T + (extras[0].float() if extras else 0)).to(z.dtype))
        return launch


@pytest.fixture
def cpu_gpu(monkeypatch):
    """The checked path with the CPU as its "GPU": ``_check`` without the device test, ``_route``
    a Recorder of the call's spec. Returns the counts: checked calls, and the modules by spec."""
    seen = {"checked": 0, "modules": {}}
    real_check = front._check  # pylint: disable=protected-access

    def check(A, B, out, bias=None, *extra):
        seen["checked"] += 1
        M, N, K, shape = front.check_shapes(A, B, out, bias)
        return M, N, K, A.reshape(M, K), (out.view(M, N) if out is not None else None), shape

    def route(M, N, K, dtype, index, strict=False, spec=None):  # pylint: disable=unused-argument
        spec = spec or GemmSpec.default(dtype)
        if spec not in seen["modules"]:
            seen["modules"][spec] = front.Route(Recorder(spec), None, "test", "v9", {})
        return seen["modules"][spec], True

    assert real_check is not None
    monkeypatch.setattr(front, "_check", check)
    monkeypatch.setattr(front, "_route", route)
    return seen


def r(*shape, dtype=torch.float16):
    return torch.randn(shape).to(dtype)


def want(A, B, bias=None):
    return A.float() @ B.float().T + (0 if bias is None else bias.float())


@pytest.mark.parametrize("a_major, b_major", [("K", "K"), ("K", "N"), ("M", "N"), ("M", "K")])
def test_a_repeated_call_with_transposed_views_takes_the_fast_path(cpu_gpu, a_major, b_major):
    """dX's (K, N) and dW's (M, N) layouts: the first call is checked, the next ones are not; the
    module gets the memory under each view (no copy) and the result is D = A . B^T."""
    M, N, K = 32, 24, 16
    for i in range(3):
        A = r(K, M).t() if a_major == "M" else r(M, K)
        B = r(K, N).t() if b_major == "N" else r(N, K)
        D = front.matmul(A, B)
        torch.testing.assert_close(D.float(), want(A, B), rtol=2e-3, atol=2e-3)
        mod = cpu_gpu["modules"][GemmSpec(a_major=a_major, b_major=b_major)].module
        x, y, _, _ = mod.calls[-1]
        assert x.is_contiguous() and x.data_ptr() == A.data_ptr()
        assert y.is_contiguous() and y.data_ptr() == B.data_ptr()
    assert cpu_gpu["checked"] == 1 and mod.made == 1 and len(mod.calls) == 3


def test_a_batched_dy_against_a_transposed_weight_takes_the_fast_path(cpu_gpu):
    """dX = dY . W: dY [batch, seq, N] contiguous, W [N, K] handed as W.t(): an MN-major B."""
    W = r(24, 16)
    for _ in range(2):
        dY = r(2, 8, 24)
        D = front.matmul(dY, W.t())
        assert D.shape == (2, 8, 16)
        torch.testing.assert_close(D.float().reshape(16, 16), want(dY.reshape(16, 24), W.t()), rtol=2e-3, atol=2e-3)
    assert cpu_gpu["checked"] == 1


def test_a_bias_call_takes_the_fast_path_with_its_bias(cpu_gpu):
    A, B, bias = r(32, 16), r(24, 16), r(24)
    for _ in range(2):
        bias = r(24)
        D = front.matmul(A, B, bias=bias)
        torch.testing.assert_close(D.float(), want(A, B, bias), rtol=2e-3, atol=2e-3)
    assert cpu_gpu["checked"] == 1
    mod = cpu_gpu["modules"][GemmSpec.with_bias()].module
    assert mod.calls[-1][3][0] is bias  # this call's bias, not the first one's
    front.matmul(A, B)  # no bias: another key, checked
    assert cpu_gpu["checked"] == 2


def test_a_changed_layout_dtype_or_grad_misses_the_key(cpu_gpu):
    """The same shapes with another stride (a K-major A where an MN-major one was remembered),
    another dtype, an added out or bias: checked again, each on its own module."""
    M, N, K = 32, 24, 16
    A, B = r(K, M).t(), r(K, N).t()
    front.matmul(A, B)
    assert cpu_gpu["checked"] == 1
    for a, b, extra in ((A.contiguous(), B, {}), (A, B.contiguous(), {}),
                        (r(K, M, dtype=torch.bfloat16).t(), r(K, N, dtype=torch.bfloat16).t(), {}),
                        (A, B, {"out": r(M, N)}), (A, B, {"bias": r(N)})):
        before = cpu_gpu["checked"]
        D = front.matmul(a, b, **extra)
        assert cpu_gpu["checked"] == before + 1
        tol = 2e-3 if a.dtype == torch.float16 else 2e-2  # D rounded to 8 bits of mantissa (bf16)
        torch.testing.assert_close(D.float(), want(a, b, extra.get("bias")), rtol=tol, atol=tol * 4)
    with pytest.raises(ModuleInputError, match="A requires grad"):  # the fast path leaves it to the checks
        front.matmul(r(K, M).t().requires_grad_(), B)


def test_an_out_that_overlaps_a_view_misses_the_key_and_is_refused(cpu_gpu):
    """``out`` over the memory under A's transposed view: the fast path leaves it to the checks,
    which refuse it; an out apart from A launches at once."""
    M = N = K = 16
    store = r(K, M)
    A, B = store.t(), r(K, N).t()
    assert front.matmul(A, B, out=r(M, N)) is not None
    checked = cpu_gpu["checked"]
    with pytest.raises(ModuleInputError, match="out overlaps A"):
        front.matmul(A, B, out=store)  # [16, 16] contiguous: the key of the out given before
    assert cpu_gpu["checked"] == checked + 1
    out = r(M, N)
    assert front.matmul(A, B, out=out) is out and cpu_gpu["checked"] == checked + 1


def test_a_bias_that_overlaps_out_is_refused_on_a_repeated_call(cpu_gpu):
    flat = r(16 * 24 + 32)
    A, B, out = r(16, 16), r(24, 16), flat[:16 * 24].view(16, 24)
    front.matmul(A, B, out=out, bias=flat[16 * 24 + 8:16 * 24 + 32])  # apart, 16-byte aligned
    checked = cpu_gpu["checked"]
    with pytest.raises(ModuleInputError, match="out overlaps bias"):
        front.matmul(A, B, out=out, bias=flat[8:32])
    assert cpu_gpu["checked"] == checked + 1


def test_a_transposed_view_copied_for_tma_is_not_remembered(cpu_gpu):
    """M = 12 (not a multiple of 8): the MN-major A is copied K-major for TMA; a later call must be
    checked again (its view is not what the remembered launch was handed), and stays right."""
    M, N, K = 12, 24, 16
    for i in range(2):
        A, B = r(K, M).t(), r(N, K)
        D = front.matmul(A, B)
        assert cpu_gpu["checked"] == i + 1
        torch.testing.assert_close(D.float(), want(A, B), rtol=2e-3, atol=2e-3)
        assert tuple(cpu_gpu["modules"][GemmSpec()].module.calls[-1][0].shape) == (M, K)  # the copy


def test_fast_spec_is_the_plain_product_in_either_layout_with_a_bias_at_most():
    assert front.fast_spec(None)
    assert front.fast_spec(GemmSpec(a_major="M", b_major="N"))
    assert front.fast_spec(GemmSpec.with_bias("bfloat16"))
    for spec in (GemmSpec.with_epilogue(act="relu"), GemmSpec.with_epilogue(alpha=True),
                 GemmSpec.with_epilogue(residual=True), GemmSpec(d="float32"), GemmSpec(bias="float32")):
        assert not front.fast_spec(spec), spec


# -- torch's route on the fast path (issue 30's call floor) -------------------------------------------
@pytest.fixture
def torch_route(monkeypatch, cpu_gpu):
    """The checked path's route of each spec: torch's matmul (as where first use measured it
    faster); returns the routes by spec."""
    routes = {}

    def route(M, N, K, dtype, index, strict=False, spec=None):  # pylint: disable=unused-argument
        spec = spec or GemmSpec.default(dtype)
        if spec not in routes:
            routes[spec] = front.Route(front.TorchMatmul(), None, "torch, measured faster", "torch", {})
        return routes[spec], True

    monkeypatch.setattr(front, "_route", route)
    return routes


def test_torchs_route_repeats_as_f_linear_itself(cpu_gpu, torch_route, monkeypatch):
    """Where torch's matmul computes a shape, a repeated call without ``out`` is F.linear on the
    caller's tensors (batch dims, transposed views and bias as they are): no D of ours allocated."""
    seen = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: seen.append(a) or real(*a))
    for A, B, bias in ((r(2, 8, 16), r(24, 16), None), (r(16, 32).t(), r(16, 24).t(), None),
                       (r(32, 16), r(24, 16), r(24))):
        for i in range(2):
            checked = cpu_gpu["checked"]
            D = front.matmul(A, B, bias=bias)
            assert cpu_gpu["checked"] == checked + (i == 0)
            assert D.shape == (*A.shape[:-1], 24)
            torch.testing.assert_close(D.float().reshape(-1, 24), want(A.reshape(-1, A.shape[-1]), B, bias),
                                       rtol=2e-3, atol=2e-3)
        assert seen[-1][0] is A and seen[-1][1] is B and seen[-1][2] is bias  # the second call's
    assert sum(rt.calls for rt in torch_route.values()) == 6 and len(seen) == 3


def test_torchs_route_with_an_out_writes_it(cpu_gpu, torch_route):
    A, B, bias = r(32, 16), r(24, 16), r(24)
    for with_bias in (False, True, True):
        out = torch.full((32, 24), float("nan")).half()
        assert front.matmul(A, B, out=out, bias=bias if with_bias else None) is out
        torch.testing.assert_close(out.float(), want(A, B, bias if with_bias else None), rtol=2e-3, atol=2e-3)
    assert cpu_gpu["checked"] == 2 and sum(rt.calls for rt in torch_route.values()) == 3


def repeat_torchs_route_with_out(monkeypatch):
    """Three calls each of a 2-D and a batched A with ``out`` and a bias on torch's route, each
    checked against A . B^T + bias; returns the route and the ``out`` each F.linear call was given."""
    route = front.Route(front.TorchMatmul(), None, "test", "torch", {})
    monkeypatch.setattr(front, "_route", lambda *a, **k: (route, True))
    outs = []
    real = torch.nn.functional.linear

    def linear(*args, **kwargs):
        outs.append(kwargs.get("out"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    W, bias = r(24, 16), r(24)
    for A, D in ((r(32, 16), r(32, 24)), (r(2, 16, 16), r(2, 16, 24))):
        for _ in range(3):
            A.normal_()
            D.fill_(float("nan"))
            assert front.matmul(A, W, out=D, bias=bias) is D
            torch.testing.assert_close(D.float(), want(A, W, bias), atol=2e-2, rtol=2e-2)
    return route, outs, D


def test_torchs_route_repeated_with_out_calls_f_linear_into_out(cpu_gpu, monkeypatch):
    """Where torch's matmul is the route, a repeated call with ``out`` goes from the key lookup
    straight to ``F.linear(..., out=out)`` (2-D) and a batched one through the view into ``out``;
    both write A . B^T (+ bias) into the caller's tensor, checked once per layout."""
    _, outs, D = repeat_torchs_route_with_out(monkeypatch)
    assert cpu_gpu["checked"] == 2  # the first call of each layout
    assert outs and outs[-1].data_ptr() == D.data_ptr() and outs[2] is not None  # F.linear wrote into out
