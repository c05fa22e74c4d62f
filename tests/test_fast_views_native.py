"""``test_fast_views.py`` again, with the C++ call lookup attached (``serve.native``): every
repeated call there (K-major and transposed views, batched, with a bias, torch's route with and
without ``out``) is answered by ``fastpath.cpp`` where it can be, and every call it must not take
(another layout, dtype or grad) still gets the checked path's checks."""

import pytest
import torch

from gemm_ladder.serve import front, native

from .test_fast_views import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from .test_fast_views import fresh  # noqa: F401  (the autouse reset, before the table is attached)
from .test_fast_views import r, repeat_torchs_route_with_out, want


@pytest.fixture(scope="module")
def cpp_table():
    return native.load(native.build())


@pytest.fixture(autouse=True)
def cpp_lookup(fresh, cpp_table, monkeypatch):  # noqa: F811  pylint: disable=redefined-outer-name,unused-argument
    """The C++ table attached to the front door, as ``native.table()`` attaches it at a remembered call."""
    monkeypatch.setattr(native, "table", lambda: cpp_table)
    monkeypatch.setattr(native, "on_load", lambda callback: callback(cpp_table))
    yield cpp_table
    assert front._NATIVE["module"] in (None, cpp_table)  # pylint: disable=protected-access


def test_torchs_route_repeats_as_f_linear_itself(cpu_gpu, torch_route, monkeypatch, cpp_lookup):  # noqa: F811
    """With the C++ table, a repeated call of torch's route without ``out`` is ``aten::linear`` on
    the caller's tensors from C++ (batch dims, transposed views and bias as they are): neither the
    Python key nor ``F.linear``'s Python binding runs, and the route counts every call."""
    def no_python(*args, **kwargs):
        raise AssertionError("the Python lookup ran for a call the C++ table holds")

    for A, B, bias in ((r(2, 8, 16), r(24, 16), None), (r(16, 32).t(), r(16, 24).t(), None),
                       (r(32, 16), r(24, 16), r(24))):
        checked = cpu_gpu["checked"]
        front.matmul(A, B, bias=bias)
        assert cpu_gpu["checked"] == checked + 1
        with monkeypatch.context() as m:
            m.setattr(front, "_fast_key", no_python)
            D = front.matmul(A, B, bias=bias)
        assert cpu_gpu["checked"] == checked + 1 and D.shape == (*A.shape[:-1], 24)
        torch.testing.assert_close(D.float().reshape(-1, 24), want(A.reshape(-1, A.shape[-1]), B, bias),
                                   rtol=2e-3, atol=2e-3)
    assert sum(rt.calls for rt in torch_route.values()) == 6 and cpp_lookup.size() == 3


def test_torchs_route_repeated_with_out_calls_f_linear_into_out(cpu_gpu, monkeypatch, cpp_lookup):  # noqa: F811
    """With the C++ table, a repeated 2-D call with ``out`` on torch's route is ``aten::linear.out``
    into the caller's tensor from C++; a batched one goes from C++ to the Python launch, which
    writes through the view into ``out`` with ``F.linear``."""
    route, outs, D = repeat_torchs_route_with_out(monkeypatch)
    assert cpu_gpu["checked"] == 2 and route.calls == 6 and cpp_lookup.size() == 2
    # the 2-D calls never reached F.linear's binding; the batched repeats did, into out's memory
    assert len(outs) == 2 and all(o is not None and o.data_ptr() == D.data_ptr() for o in outs)
