"""``scaled_mm``'s repeated call, on the CPU: a call like one already checked skips the checks its
layout settles and launches the remembered route (``scaled._repeat``, and the C++ table's
``scaled_lookup`` in ``fastpath.cpp``, built here as a GPU box builds it), with the views the launch
takes (B as [N, K], the scales as vectors or block's transposed) and D made there; it passes over
every call the checked path would treat differently (another layout, dtype, out_dtype or strict,
grad wanted, misaligned block scales, ``out`` over an input). Also the checked path's own refusals
that the repeated call relies on: ``out`` over what the kernel reads, and autograd (D comes back with
a backward that refuses, as ``torch._scaled_mm``'s does, not detached)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import front, native, scaled
from gemm_ladder.serve.front import Route
from gemm_ladder.serve.runtime import ModuleInputError

from .test_fp8_first_use import Ours

M, N, K = 24, 32, 256


@pytest.fixture(scope="module")
def table():
    """The C++ extension, built once for this file (``test_native_lookup.py`` builds the same source:
    the cache makes it once)."""
    return native.load(native.build())


@pytest.fixture
def fresh(table):
    table.scaled_clear()
    yield table
    table.scaled_clear()


def fp8(*shape):
    return torch.randn(shape).to(torch.float8_e4m3fn)


def product(a, b_nk, sa, sb, bias=None, block=False):
    """The scaled product as the kernel's stand-in computes it (sa, sb as the launch takes them)."""
    if block:  # sa [K/128, M], sb [N/128, K/128]: dequantize per group and block
        a_f = a.float() * sa.t().repeat_interleave(128, 1)
        b_f = b_nk.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)[: b_nk.shape[0], : b_nk.shape[1]]
        d = a_f @ b_f.T
    else:
        d = a.float() @ b_nk.float().T * sa.reshape(-1, 1) * sb.reshape(1, -1)
    return (d if bias is None else d + bias.float()).to(torch.bfloat16)


class Launch:
    """A route's bound launch: ``launch(A, B_nk, D, [bias,] scale_a, scale_b)``, recording its calls."""

    def __init__(self, block=False):
        self.seen, self.block = [], block

    def __call__(self, a, b_nk, d, *extras):
        self.seen.append((a, b_nk, d, extras))
        d.copy_(product(a, b_nk, extras[-2], extras[-1], extras[0] if len(extras) == 3 else None, self.block))


def keep(table, A, B, sa, sb, bias=None, out=None, out_dtype=None, strict=None, block=False):
    launch = Launch(block)
    assert table.scaled_remember(A, B, sa, sb, bias, out, out_dtype, strict, launch, M, N, torch.bfloat16, block,
                                 A.nbytes, B.nbytes, M * N * 2)
    return launch


def test_a_remembered_call_launches_with_the_kernels_views_and_a_new_d(fresh):
    A, W = fp8(M, K), fp8(N, K)
    sa, sb = torch.tensor(0.5), torch.tensor([2.0])  # a 0-dim and a [1] scale
    launch = keep(fresh, A, W.t(), sa, sb)
    D = fresh.scaled_lookup(A, W.t(), sa, sb, None, None, None, None)
    a, b_nk, d, (va, vb) = launch.seen[-1]
    assert a is A and b_nk.shape == (N, K) and b_nk.data_ptr() == W.data_ptr() and b_nk.is_contiguous()
    assert d is D and D.shape == (M, N) and D.dtype == torch.bfloat16
    assert va.shape == (1,) and vb is sb  # the 0-dim scale as a vector, the vector as it is
    torch.testing.assert_close(D, product(A, W, sa, sb))


def test_rowwise_scales_become_vectors_and_out_and_the_bias_pass_through(fresh):
    A, W = fp8(M, K), fp8(N, K)
    sa, sb, bias = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5, torch.randn(N).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    launch = keep(fresh, A, W.t(), sa, sb, bias, out)
    assert fresh.scaled_lookup(A, W.t(), sa, sb, bias, out, None, None) is out
    _, _, _, (vbias, va, vb) = launch.seen[-1]
    assert vbias is bias and va.shape == (M,) and vb.shape == (N,)
    torch.testing.assert_close(out, product(A, W, sa, sb, bias))


def test_block_scales_are_passed_transposed_and_misaligned_ones_miss(fresh):
    kb, nb = K // 128, 1
    A, W = fp8(M, K), fp8(N, K)
    sa = (torch.rand(kb, M) + 0.5).t()  # [M, K/128] M-major, as quantize_fp8 makes it
    sb = (torch.rand(nb, kb) + 0.5).t()  # the .t() of a row-major [N/128, K/128]
    launch = keep(fresh, A, W.t(), sa, sb, block=True)
    D = fresh.scaled_lookup(A, W.t(), sa, sb, None, None, None, None)
    _, _, _, (va, vb) = launch.seen[-1]
    assert va.shape == (kb, M) and vb.shape == (nb, kb) and va.is_contiguous() and vb.is_contiguous()
    torch.testing.assert_close(D, product(A, W, va, vb, block=True))
    shifted = torch.rand(kb * M + 1)[1:].view(kb, M).t()  # the same layout, 4 bytes past 16
    assert fresh.scaled_lookup(A, W.t(), shifted, sb, None, None, None, None) is None and len(launch.seen) == 1


def test_another_layout_dtype_out_dtype_or_strict_misses(fresh):
    A, W, sa, sb = fp8(M, K), fp8(N, K), torch.tensor(1.0), torch.tensor(1.0)
    launch = keep(fresh, A, W.t(), sa, sb, out_dtype=torch.bfloat16, strict=None)
    assert fresh.scaled_lookup(A, W.t(), sa, sb, None, None, torch.bfloat16, None) is not None
    misses = [
        (fp8(M + 1, K), W.t(), sa, sb, None, None, torch.bfloat16, None),  # another M
        (A, W.to(torch.float8_e5m2).t(), sa, sb, None, None, torch.bfloat16, None),  # B in e5m2
        (A, W.t(), sa.reshape(1), sb, None, None, torch.bfloat16, None),  # another scale shape
        (A, W.t(), sa, sb, None, None, None, None),  # out_dtype not passed
        (A, W.t(), sa, sb, None, None, torch.float16, None),
        (A, W.t(), sa, sb, None, None, torch.bfloat16, True),  # strict passed
        (A, W.t(), sa, sb, None, None, torch.bfloat16, 1),  # no bool: the checked path reads it
        (A, W.t(), sa, sb, None, None, "bfloat16", None),  # no dtype
        (A, W.t(), sa, sb, torch.zeros(N, dtype=torch.bfloat16), None, torch.bfloat16, None),  # a bias
    ]
    for args in misses:
        assert fresh.scaled_lookup(*args) is None
    assert len(launch.seen) == 1


def test_grad_wanted_misses_unless_grad_mode_is_off(fresh):
    A, W, sb = fp8(M, K), fp8(N, K), torch.tensor(1.0)
    sa = torch.tensor(1.0, requires_grad=True)
    launch = keep(fresh, A, W.t(), sa, sb)
    assert fresh.scaled_lookup(A, W.t(), sa, sb, None, None, None, None) is None
    with torch.no_grad():
        assert fresh.scaled_lookup(A, W.t(), sa, sb, None, None, None, None) is not None
    assert len(launch.seen) == 1


def test_out_over_anything_the_kernel_reads_misses(fresh):
    A, W = fp8(M, K), fp8(N, K)
    big = torch.rand(M * N + 64)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    sa, sb = torch.tensor(1.0), big[:1]
    launch = keep(fresh, A, W.t(), sa, sb, out=out)
    assert fresh.scaled_lookup(A, W.t(), sa, sb, None, out, None, None) is out
    inside = big.view(torch.bfloat16)[: M * N].view(M, N)  # out's bytes hold scale_b's
    assert fresh.scaled_lookup(A, W.t(), sa, sb, None, inside, None, None) is None
    assert len(launch.seen) == 1


def test_modes_subclasses_and_bad_arguments(fresh):
    A, W, sa, sb = fp8(M, K), fp8(N, K), torch.tensor(1.0), torch.tensor(1.0)
    B = W.t()
    keep(fresh, A, B, sa, sb)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert fresh.scaled_lookup(A, B, sa, sb, None, None, None, None) is None
    weight = torch.nn.Parameter(W, requires_grad=False)  # a weight as a module holds it hits
    assert fresh.scaled_lookup(A, weight.t(), sa, sb, None, None, None, None) is not None

    class Sub(torch.Tensor):
        pass

    assert fresh.scaled_lookup(A.as_subclass(Sub), W.t(), sa, sb, None, None, None, None) is None
    with pytest.raises(TypeError, match="takes 8 arguments"):
        fresh.scaled_lookup(A, W.t(), sa, sb)
    with pytest.raises(TypeError, match="launch must be callable"):
        fresh.scaled_remember(A, W.t(), sa, sb, None, None, None, None, 3, M, N, torch.bfloat16, False, 1, 1, 1)
    with pytest.raises(ValueError, match="at least 1"):
        fresh.scaled_remember(A, W.t(), sa, sb, None, None, None, None, Launch(), 0, N, torch.bfloat16, False, 1, 1, 1)
    assert fresh.scaled_size() == 1
    fresh.scaled_clear()
    assert fresh.scaled_size() == 0 and fresh.scaled_lookup(A, W.t(), sa, sb, None, None, None, None) is None


# -- through scaled_mm (a loaded module's stand-in: test_fp8_first_use's, counting its launches) -----------
@pytest.fixture
def door(monkeypatch):
    """scaled_mm on the CPU: a GPU's route stand-in, the checked path counted, no C++ table unless asked."""
    front.reset()
    scaled.reset()
    module = Ours()
    checks = []
    real_check = scaled.checked_call

    def counted(*a, **k):
        checks.append(1)
        return real_check(*a, **k)

    monkeypatch.setattr(scaled, "checked_call", counted)
    monkeypatch.setattr(scaled, "_require_gpu", lambda A: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(scaled, "route_of", lambda call, index, strict, out_dtype: scaled._ROUTES.setdefault(
        (call, strict), Route(module, None, "test", "v9", {}, ["kernel: v9 fp8 (stand-in)"])))
    monkeypatch.setattr(scaled, "native_table", lambda: None)
    yield module, checks
    front.reset()
    scaled.reset()


def test_the_second_call_repeats_the_launch_without_the_checks(door):
    module, checks = door
    A, W = fp8(M, K), fp8(N, K)
    sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    first = scaled.scaled_mm(A, W.t(), sa, sb)
    for _ in range(3):
        A = fp8(M, K)
        D = scaled.scaled_mm(A, W.t(), sa, sb)
        torch.testing.assert_close(D, product(A, W, sa, sb))
    assert len(checks) == 1 and module.launches == 4 and first.shape == (M, N)
    # another layout, or explain, takes the checked path again
    scaled.scaled_mm(A, W.t(), sa, sb, out_dtype=torch.float16)
    _, lines = scaled.scaled_mm(A, W.t(), sa, sb, explain=True)
    assert len(checks) == 3 and lines[0].startswith("kernel: v9")


def test_the_cpp_table_takes_over_once_loaded(door, fresh, monkeypatch):
    module, checks = door
    A, W, sa, sb = fp8(M, K), fp8(N, K), torch.tensor(0.5), torch.tensor(2.0)
    scaled.scaled_mm(A, W.t(), sa, sb)  # checked, remembered in Python (no table yet)
    monkeypatch.setattr(scaled, "native_table", lambda: fresh)
    scaled.scaled_mm(A, W.t(), sa, sb)  # the Python lookup, which hands the entry to the table
    assert fresh.scaled_size() == 1
    keys = []
    monkeypatch.setattr(scaled, "_fast_key", lambda *a: keys.append(a))
    D = scaled.scaled_mm(A, W.t(), sa, sb)
    torch.testing.assert_close(D, product(A, W, sa, sb))
    assert keys == [] and len(checks) == 1 and module.launches == 3
    front.reset()  # a new pack or table: both tables forget
    assert fresh.scaled_size() == 0 and scaled._FAST == {}  # pylint: disable=protected-access


def test_grad_gives_a_d_whose_backward_refuses_and_out_is_refused(door):
    A, W = fp8(M, K), fp8(N, K)
    sa, sb = torch.tensor(1.0, requires_grad=True), torch.tensor(1.0)
    D = scaled.scaled_mm(A, W.t(), sa, sb)
    assert D.requires_grad
    torch.testing.assert_close(D.detach(), product(A, W, sa.detach(), sb))
    with pytest.raises(RuntimeError, match="no backward"):
        D.float().sum().backward()
    with pytest.raises(ModuleInputError, match="out= does not take autograd"):
        scaled.scaled_mm(A, W.t(), sa, sb, out=torch.empty(M, N, dtype=torch.bfloat16))
    assert scaled._FAST == {}  # pylint: disable=protected-access  (a grad call is never remembered)
    with torch.no_grad():
        assert not scaled.scaled_mm(A, W.t(), sa, sb).requires_grad


def test_out_over_the_bias_or_a_scale_is_refused_with_the_fix(door):
    A, W = fp8(M, K), fp8(N, K)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    with pytest.raises(ModuleInputError, match="out overlaps"):
        scaled.scaled_mm(A, W.t(), torch.tensor(1.0), torch.tensor(1.0), bias=out[0], out=out)
    scale = torch.rand(M * N)
    over = scale.view(torch.bfloat16)[: M * N].view(M, N)
    with pytest.raises(ModuleInputError, match="out overlaps"):
        scaled.scaled_mm(A, W.t(), scale[:1], torch.tensor(1.0), out=over)


def test_the_public_door_leaves_strict_to_the_environment():
    import inspect  # pylint: disable=import-outside-toplevel

    import gemm_ladder  # pylint: disable=import-outside-toplevel

    assert inspect.signature(gemm_ladder.scaled_mm).parameters["strict"].default is None
    assert GemmSpec.fp8("bfloat16", "row", None).is_fp8
