"""The C++ call lookup (``gemm_ladder/serve/fastpath.cpp``, built by ``serve.native``), on the CPU:
built here with the same compiler call a GPU box makes, its table answers a call like a remembered
one (torch's route through ``aten::linear``, a kernel's through the Python launch) and passes over
every call the Python lookup would refuse or that it cannot judge (another layout, dtype or device,
grad wanted, a misaligned kernel operand, ``out`` over an input, a tensor subclass, a torch function
or dispatch mode). ``test_fast_views_native.py`` runs the front door's fast-path tests through it."""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gemm_ladder.serve import front, native


@pytest.fixture(scope="session")
def table():
    """The extension, built once for the session (about 30 s of one core)."""
    return native.load(native.build())


@pytest.fixture
def fresh(table):
    table.clear()
    yield table
    table.clear()


class Counted:
    """A stand-in Route: the C++ side counts torch's route's calls on it."""

    calls = 0


def r(*shape, dtype=torch.float16):
    return torch.randn(shape).to(dtype)


def keep(table, A, B, out=None, bias=None, kind=0, call=None):
    """Remember a call like this one (``kind`` 0: torch's route; 1: ``call``)."""
    route = Counted()
    d_bytes = A.shape[0] * B.shape[0] * A.element_size() if A.dim() == 2 else out.nbytes
    assert table.remember(A, B, out, bias, kind, route, call or (lambda *a: None), A.nbytes, B.nbytes, d_bytes)
    return route


def test_torchs_route_writes_a_linear_into_out_and_counts_the_call(fresh):
    A, B, D = r(32, 16), r(24, 16), torch.full((32, 24), float("nan")).half()
    route = keep(fresh, A, B, D)
    for _ in range(3):
        A.normal_()
        assert fresh.lookup(A, B, D, None) is D
        torch.testing.assert_close(D, F.linear(A, B))
    assert route.calls == 3


def test_torchs_route_without_out_returns_a_new_d_and_adds_the_bias(fresh):
    A, B, bias = r(32, 16), r(24, 16), r(24)
    keep(fresh, A, B, None, bias)
    D = fresh.lookup(A, B, None, r(24).copy_(bias))
    assert isinstance(D, torch.Tensor) and D.shape == (32, 24)
    torch.testing.assert_close(D, F.linear(A, B, bias))
    assert fresh.lookup(A, B, None, None) is None  # no bias: another key


def test_another_shape_stride_dtype_or_device_misses(fresh):
    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    keep(fresh, A, B, D)
    assert fresh.lookup(r(16, 32).t(), B, D, None) is None  # same shape, MN-major
    assert fresh.lookup(r(32, 16, dtype=torch.bfloat16), B, D, None) is None
    assert fresh.lookup(r(32, 8), r(24, 8), D, None) is None
    assert fresh.lookup(A, B, None, None) is None  # no out: another key
    meta = torch.empty(32, 16, dtype=torch.float16, device="meta")
    assert fresh.lookup(meta, B, D, None) is None
    assert fresh.lookup(A, B, D, None) is D  # and the remembered one still hits


def test_grad_wanted_misses_unless_grad_mode_is_off(fresh):
    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    keep(fresh, A, B, D)
    A.requires_grad_()
    assert fresh.lookup(A, B, D, None) is None
    with torch.no_grad():
        assert fresh.lookup(A, B, D, None) is D


def test_out_over_an_input_or_the_bias_misses(fresh):
    store = r(64 * 16)
    A = store[: 32 * 16].view(32, 16)
    B, bias = r(24, 16), r(24)
    D = r(32, 24)
    keep(fresh, A, B, D, bias)
    over_a = store[16:16 + 32 * 24].view(32, 24)  # D's layout, over A's last rows
    assert fresh.lookup(A, B, over_a, bias) is None
    big = r(32 * 24 + 24)
    beside = big[24:].view(32, 24)
    assert fresh.lookup(A, B, beside, big[:24]) is beside  # the bias just before D: apart
    touching = r(32 * 24)
    assert fresh.lookup(A, B, touching.view(32, 24), touching[:24]) is None  # the bias inside D
    assert fresh.lookup(A, B, D, bias) is D


def test_a_kernels_launch_is_called_after_the_checks_and_refuses_misaligned_operands(fresh):
    seen = []

    def launch(A, B, out, bias):
        seen.append((A, B, out, bias))
        return out

    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    keep(fresh, A, B, D, kind=1, call=launch)
    assert fresh.lookup(A, B, D, None) is D and seen[-1][0] is A and seen[-1][3] is None
    shifted = r(32 * 16 + 1)[1:].view(32, 16)  # A's shape and strides, 2 bytes off 16
    assert fresh.lookup(shifted, B, D, None) is None and len(seen) == 1
    keep(fresh, A, B, D)  # the same key as torch's route: aten::linear takes any alignment
    assert fresh.lookup(shifted, B, D, None) is D and len(seen) == 1
    torch.testing.assert_close(D, F.linear(shifted, B))


def test_a_batched_a_with_out_goes_to_the_python_launch_on_torchs_route(fresh):
    seen = []
    A, B, D = r(2, 8, 16), r(24, 16), r(2, 8, 24)
    keep(fresh, A, B, D, call=lambda *args: seen.append(args) or args[2])
    assert fresh.lookup(A, B, D, None) is D and len(seen) == 1


class Sub(torch.Tensor):
    pass


def test_subclasses_and_modes_are_left_to_the_python_lookup(fresh):
    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    keep(fresh, A, B, D)
    assert fresh.lookup(A.as_subclass(Sub), B, D, None) is None
    assert fresh.lookup(A, torch.nn.Parameter(B, requires_grad=False), D, None) is D  # a weight hits

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert fresh.lookup(A, B, D, None) is None
    with Dispatch():
        assert fresh.lookup(A, B, D, None) is None


def test_remembering_a_key_again_replaces_it_and_clear_forgets_all(fresh):
    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    first = keep(fresh, A, B, D)
    second = keep(fresh, A, B, D)
    assert fresh.size() == 1
    fresh.lookup(A, B, D, None)
    assert (first.calls, second.calls) == (0, 1)
    before = sys.getrefcount(second)
    fresh.clear()
    assert fresh.size() == 0 and fresh.lookup(A, B, D, None) is None
    assert sys.getrefcount(second) == before - 1  # the table's reference went with it


def test_bad_arguments_raise_with_the_signature(fresh):
    A, B = r(32, 16), r(24, 16)
    with pytest.raises(TypeError, match="4 arguments"):
        fresh.lookup(A, B)
    with pytest.raises(ValueError, match="kind is 0"):
        fresh.remember(A, B, None, None, 7, Counted(), print, 1, 1, 1)
    with pytest.raises(TypeError, match="callable"):
        fresh.remember(A, B, None, None, 0, Counted(), 3, 1, 1, 1)
    assert fresh.remember("A", B, None, None, 0, Counted(), print, 1, 1, 1) is False  # not a tensor: nothing kept


@pytest.mark.parametrize("native_side", [True, False], ids=["cpp", "python"])
@pytest.mark.parametrize("M,N,K", [(5, 19, 16), (1, 145, 24)])
def test_split_tail_puts_torchs_last_columns_beside_the_kernels(table, monkeypatch, native_side, M, N, K):
    """A split N's call after the kernel (``front.split_tail``): D's first Nk columns from D_main,
    its last ones A . B[Nk:]^T, in place in D (the C++ twin and the Python one alike)."""
    monkeypatch.setitem(front._NATIVE, "module", table if native_side else None)
    A, B = r(M, K, dtype=torch.float32), r(N, K, dtype=torch.float32)
    Nk = N - N % 8
    d_main = torch.randn(M, Nk)  # what the kernel wrote: any values, copied as they are
    D = torch.full((M, N), float("nan"))
    front.split_tail(A, B, d_main, torch.empty(M, N - Nk), D)
    assert torch.equal(D[:, :Nk], d_main)
    torch.testing.assert_close(D[:, Nk:], A @ B[Nk:].t())


def test_split_tail_refuses_parts_that_do_not_make_d(table):
    A, B, D = r(4, 16), r(19, 16), r(4, 19)
    with pytest.raises(ValueError, match="tail \\[M, N - Nk\\]"):
        table.split_tail(A, B, r(4, 16), r(4, 2), D)
    with pytest.raises(TypeError, match="takes tensors"):
        table.split_tail(A, B, r(4, 16), r(4, 3), None)
    with pytest.raises(TypeError, match="5 arguments"):
        table.split_tail(A, B, D)


def test_the_front_door_registers_a_checked_call_and_repeats_it_in_cpp(fresh, monkeypatch):
    """torch's route: the first call is checked and remembered in both tables; the next ones are
    answered by the C++ lookup (the Python key is never made again)."""
    front.reset()
    route = front.Route(front.TorchMatmul(), None, "test", "torch", {})
    monkeypatch.setattr(front, "_route", lambda *a, **k: (route, True))
    checked = []

    def check(A, B, out, bias=None, *extra):
        checked.append(1)
        M, N, K, shape = front.check_shapes(A, B, out, bias)
        return M, N, K, A.reshape(M, K), (out.view(M, N) if out is not None else None), shape

    monkeypatch.setattr(front, "_check", check)
    monkeypatch.setattr(front, "_NATIVE", {"lookup": None, "module": None, "waiting": False})
    monkeypatch.setattr(native, "table", lambda: fresh)
    monkeypatch.setattr(native, "on_load", lambda callback: callback(fresh))
    A, B, D = r(32, 16), r(24, 16), r(32, 24)
    assert front.matmul(A, B, out=D) is D
    keys = []
    monkeypatch.setattr(front, "_fast_key", lambda *a, **k: keys.append(a))
    for _ in range(3):
        A.normal_()
        assert front.matmul(A, B, out=D) is D
        torch.testing.assert_close(D, F.linear(A, B))
    assert len(checked) == 1 and keys == [] and route.calls == 4 and fresh.size() == 1
    front.reset()
    assert fresh.size() == 0 and front._NATIVE["module"] is None  # pylint: disable=protected-access


def test_mode_names_the_choices(monkeypatch):
    monkeypatch.setenv(native.ENV, "sometimes")
    with pytest.raises(ValueError, match="auto.*build.*0"):
        native.mode()


def test_a_failed_build_names_the_compiler_and_leaves_the_python_lookup(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(native.NativeBuildError, match="false failed"):
        native.build()
    native.reset()
    monkeypatch.setenv(native.ENV, "build")
    with pytest.warns(native.NativeWarning, match="Python one"):
        assert native.table() is None
    assert "false failed" in native.error()
    native.reset()


def test_an_unusable_cache_folder_warns_and_leaves_the_python_lookup(monkeypatch, tmp_path):
    """The cache folder a file: no exception reaches the call that asked for the table."""
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(blocker))
    native.reset()
    monkeypatch.setenv(native.ENV, "build")
    with pytest.warns(native.NativeWarning, match="GEMM_LADDER_CACHE"):
        assert native.table() is None
    native.reset()


def test_a_corrupt_library_is_named_with_the_fix(tmp_path):
    bad = tmp_path / "fastpath-0.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(native.NativeBuildError, match="does not load.*--force"):
        native.load(bad)


def test_off_never_builds(monkeypatch):
    native.reset()
    monkeypatch.setenv(native.ENV, "0")
    monkeypatch.setattr(native, "build", lambda *a, **k: pytest.fail("built with GEMM_LADDER_NATIVE=0"))
    assert native.table() is None
    native.reset()


def test_the_native_command_builds_or_names_the_failure(monkeypatch, tmp_path, capsys):
    """``python -m gemm_ladder native``: where it is built, 0 and the path; a failing compiler, 1 and
    the compiler's name; an unusable cache folder, the CLI's usage error (2)."""
    from gemm_ladder import cli  # pylint: disable=import-outside-toplevel

    assert cli.main(["native"]) == 0
    assert "fastpath-" in capsys.readouterr().out
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    assert cli.main(["native"]) == 1
    assert "false failed" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(blocker))
    assert cli.main(["native"]) == 2
    assert "GEMM_LADDER_CACHE" in capsys.readouterr().err
