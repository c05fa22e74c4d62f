"""The masked grouped front door (``gemm_ladder.grouped_mm_masked``) and its torch op on the CPU:
every bad input refused with its fix before anything launches, the fake op's shapes, the torch
fallback's semantics (each expert's first counts[e] rows, the rest of ``out`` kept) against a
per-expert float64 reference, strict mode, and the route's registry key.
"""

from __future__ import annotations

import pytest
import torch

import gemm_ladder
from gemm_ladder.serve import grouped, grouped_masked, grouped_ops
from gemm_ladder.serve.front import NoKernelError
from gemm_ladder.serve.runtime import ModuleInputError


def h(*shape, dtype=torch.float16, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


def counts_of(*c, device="cpu"):
    return torch.tensor(c, dtype=torch.int32, device=device)


def refused(fn, *words, error=ModuleInputError):
    with pytest.raises(error) as err:
        fn()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def reference(A, W, counts, out):
    """Per expert in float64: D[e, :c] = A[e, :c] . W[e]^T (c clamped into [0, max_tokens]); the
    other rows are out's."""
    D = out.double().clone()
    for e, c in enumerate(counts.tolist()):
        c = min(max(c, 0), A.shape[1])
        D[e, :c] = A[e, :c].double() @ W[e].double().T
    return D


A, W, COUNTS = h(3, 10, 64), h(3, 32, 64), counts_of(4, 0, 10)


@pytest.mark.parametrize("args, words", [
    ((h(30, 64), W, COUNTS), ["A must be [E, max_tokens, K]", "grouped_mm with offs"]),
    ((A, h(32, 64), COUNTS), ["W [E, N, K]", "(32, 64)"]),
    ((h(4, 10, 64), W, COUNTS), ["A has 4 expert slots and W 3 experts"]),
    ((A, h(3, 32, 64, dtype=torch.bfloat16), COUNTS), ["A is torch.float16 and W is torch.bfloat16"]),
    ((h(3, 10, 64, dtype=torch.float32), h(3, 32, 64, dtype=torch.float32), COUNTS),
     ["torch.float16 or torch.bfloat16"]),
    ((A, h(3, 64, 32), COUNTS), ["W's last dim must be A's K=64", "[E, N, K]"]),
    ((A, W, counts_of(4, 6)), ["counts has shape (2,)", "(3,)", "not cumulative"]),
    ((A, W, COUNTS.long()), ["counts has dtype torch.int64", "counts.to(torch.int32)"]),
    ((A, W, [4, 0, 10]), ["counts must be a torch.Tensor"]),
    ((A, h(3, 64, 32).transpose(1, 2), COUNTS), ["transposed view", "[E, N, K]"]),
    ((h(3, 10, 128)[..., ::2], W, COUNTS), ["A is not contiguous"]),
])
def test_bad_inputs_are_refused_with_the_fix(args, words):
    refused(lambda: gemm_ladder.grouped_mm_masked(*args), *words)
    op_words = words if all(isinstance(a, torch.Tensor) for a in args) else ["counts", "Tensor"]
    refused(lambda: grouped_ops.grouped_mm_masked(*args), *op_words, error=(ModuleInputError, RuntimeError))


def test_a_bad_out_is_refused():
    refused(lambda: gemm_ladder.grouped_mm_masked(A, W, COUNTS, out=h(3, 10, 31)), "out has shape (3, 10, 31)",
            "(3, 10, 32)")
    refused(lambda: gemm_ladder.grouped_mm_masked(A, W, COUNTS, out=h(3, 10, 32, dtype=torch.bfloat16)),
            "out has dtype")


def test_inputs_that_fit_reach_the_device_check_and_an_aliased_out_is_refused():
    refused(lambda: gemm_ladder.grouped_mm_masked(A, W, COUNTS), "A is on cpu", "move it to the GPU")
    # the overlap check itself (devices aside): an out that is A's memory
    refused(_overlapping_out, "out overlaps A", "shares no memory")


class _OnGpu:
    """A CPU tensor's addresses under a GPU device: the aliasing check reads addresses only."""

    class device:  # pylint: disable=invalid-name
        type, index = "cuda", 0

    def __init__(self, t):
        self.numel, self.data_ptr, self.nbytes = t.numel, t.data_ptr, t.nbytes


def _overlapping_out():
    a = torch.zeros(3, 10, 64, dtype=torch.float16)
    out = a[:, :, :32]  # D's bytes inside A's
    grouped.check_devices(_OnGpu(a), _OnGpu(W), _OnGpu(COUNTS), _OnGpu(out), who=grouped_masked.WHO, table="counts")


def test_counts_need_no_16_byte_alignment_and_are_named_in_messages():
    """The counts are read by plain loads: a slice at any int32 boundary is fine (a TMA operand
    must start on 16 bytes); an out over the counts names them."""
    a, w, out = (torch.zeros(s, dtype=torch.float16) for s in ((3, 10, 64), (3, 32, 64), (3, 10, 32)))
    table = torch.zeros(8, dtype=torch.int32)
    grouped.check_devices(_OnGpu(a), _OnGpu(w), _OnGpu(table[1:4]), _OnGpu(out), table="counts")
    refused(lambda: grouped.check_devices(_OnGpu(a), _OnGpu(w), _OnGpu(table), _OnGpu(table), table="counts"),
            "out overlaps counts")
    refused(lambda: grouped.check_devices(_OnGpu(a[:, :, 1:]), _OnGpu(w), _OnGpu(table), None, table="counts"),
            "A does not start on a 16-byte boundary")


def test_a_weight_that_wants_grad_is_refused():
    refused(lambda: gemm_ladder.grouped_mm_masked(A, h(3, 32, 64).requires_grad_(), COUNTS), "W require grad")


def test_counts_checked_on_request_name_the_bad_one():
    refused(lambda: grouped_masked.check_counts(counts_of(4, 11, 0), 10), "counts[1] = 11", "0..10")
    refused(lambda: grouped_masked.check_counts(counts_of(-1, 0, 0), 10), "counts[0] = -1")
    grouped_masked.check_counts(counts_of(0, 10, 3), 10)


def test_the_fake_op_gives_d_of_any_slot_size():
    meta = dict(device="meta")
    got = grouped_ops.grouped_mm_masked(h(3, 77, 64, **meta), h(3, 32, 64, **meta), h(3, dtype=torch.int32, **meta))
    assert got.shape == (3, 77, 32) and got.dtype == torch.float16
    refused(lambda: grouped_ops.grouped_mm_masked(h(3, 7, 64, **meta), h(3, 32, 64, **meta),
                                                  h(2, dtype=torch.int32, **meta)),
            "counts has shape (2,)", error=(ModuleInputError, RuntimeError))


def _fallback(a, w, c, out=None):
    out = torch.zeros(a.shape[0], a.shape[1], w.shape[1], dtype=a.dtype) if out is None else out
    grouped_masked.torch_masked_mm(a, w, c, out)
    return out


@pytest.mark.parametrize("counts", [(0, 0, 0, 0), (9, 0, 0, 0), (3, 0, 9, 1), (-2, 20, 5, 9)],
                         ids=["all_empty", "one_full", "ragged", "out_of_range_clamped"])
def test_the_fallback_writes_each_experts_rows_and_keeps_the_rest(counts):
    gen = torch.Generator().manual_seed(3)
    Ar, Wr = torch.randn(4, 9, 32, generator=gen).half(), torch.randn(4, 16, 32, generator=gen).half()
    out = torch.full((4, 9, 16), float("nan"), dtype=torch.float16)  # poisoned: the rows past counts stay NaN
    c = counts_of(*counts)
    want = reference(Ar, Wr, c, out)
    got = _fallback(Ar, Wr, c, out)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2, equal_nan=True)
    kept = sum(9 - min(max(x, 0), 9) for x in counts) * 16
    assert int(torch.isnan(got).sum()) == kept


def test_the_op_returns_zeros_past_the_counts(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_mm_masked", lambda a, w, c, out: _fallback(a, w, c, out))
    gen = torch.Generator().manual_seed(4)
    Ar, Wr = torch.randn(3, 8, 32, generator=gen).half(), torch.randn(3, 16, 32, generator=gen).half()
    c = counts_of(5, 0, 8)
    got = torch.ops.gemm_ladder.grouped_mm_masked(Ar, Wr, c)
    torch.testing.assert_close(got.double(), reference(Ar, Wr, c, torch.zeros(3, 8, 16)), rtol=2e-2, atol=2e-2)
    assert not got[0, 5:].any() and not got[1].any()


def test_the_ops_fake_passes_opcheck(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_mm_masked", lambda a, w, c, out: _fallback(a, w, c, out))
    gen = torch.Generator().manual_seed(5)
    args = (torch.randn(3, 6, 32, generator=gen).half(), torch.randn(3, 16, 32, generator=gen).half(),
            counts_of(5, 0, 6))
    result = torch.library.opcheck(torch.ops.gemm_ladder.grouped_mm_masked.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_the_op_compiles_with_changing_counts(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_mm_masked", lambda a, w, c, out: _fallback(a, w, c, out))
    torch._dynamo.reset()
    layer = torch.compile(lambda a, w, c: torch.ops.gemm_ladder.grouped_mm_masked(a, w, c) * 2, fullgraph=True,
                          backend="aot_eager")
    gen = torch.Generator().manual_seed(6)
    Ar, Wr = torch.randn(4, 8, 32, generator=gen).half(), torch.randn(4, 24, 32, generator=gen).half()
    for counts in ((5, 0, 7, 1), (0, 0, 8, 0), (8, 8, 8, 8)):
        c = counts_of(*counts)
        torch.testing.assert_close(layer(Ar, Wr, c).double(), 2 * reference(Ar, Wr, c, torch.zeros(4, 8, 24)),
                                   rtol=2e-2, atol=2e-2)


def test_strict_mode_raises_where_no_module_serves(monkeypatch):
    monkeypatch.setattr(grouped.device, "arch_of", lambda index: "sm_90a")
    grouped.reset()
    refused(lambda: grouped_masked.route_of(8, 4096, 1024, "float16", 0, strict=True), "strict mode",
            "layout='masked'", "use_grouped_module", error=NoKernelError)
    with pytest.warns(gemm_ladder.serve.front.KernelFallbackWarning, match="layout='masked'"):
        route = grouped_masked.route_of(8, 4096, 1024, "float16", 0, strict=False)
    assert route.run is grouped_masked.torch_masked_mm and route.source == "torch fallback"
    assert "torch.bmm" in route.lines[0] and "no masked v12 module was registered" in route.lines[1]  # explain's
    with pytest.warns(gemm_ladder.serve.front.KernelFallbackWarning, match="TMA's 16-byte strides"):
        grouped_masked.route_of(8, 4100, 1024, "float16", 0)  # N off 8: torch even with a module
    grouped.reset()


def test_a_masked_module_serves_only_the_masked_door(monkeypatch):
    """The registry is keyed by layout: a masked module never serves grouped_mm (whose int32
    operand is offs, not counts), and the other way round."""
    monkeypatch.setattr(grouped.device, "arch_of", lambda index: "sm_90a")
    grouped.reset()

    class Module:
        experts, N, K, dtype, arch, layout = 8, 4096, 1024, "float16", "sm_90a", "masked"
        path = type("P", (), {"name": "masked.so"})()
        key = ("masked", 8, 4096, 1024, "float16", "sm_90a", "none")

    monkeypatch.setitem(grouped._REGISTERED, Module.key, Module())  # pylint: disable=protected-access
    assert grouped_masked.route_of(8, 4096, 1024, "float16", 0).source == "registered"
    with pytest.warns(gemm_ladder.serve.front.KernelFallbackWarning):
        assert grouped.route_of(8, 4096, 1024, "float16", 0).source == "torch fallback"
    grouped.reset()
