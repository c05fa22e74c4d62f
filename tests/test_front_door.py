"""The front door on the CPU: input errors, the padded-copy path (with a stand-in kernel that
checks what TMA would need), where a kernel comes from (pack, cache, build) and what ``explain``
says, and the torch op's fake implementation (meta tensors, ``torch.export``).

The GPU tier (``tests/test_front_door_gpu.py``) runs the real kernels."""

import json
import warnings
import weakref

import pytest
import torch

from gemm_ladder.serve import front, kernel_pack
from gemm_ladder.core.config import IndexRangeError
from gemm_ladder.serve.tma_layout import Fixes, Layout, layout_fixes
from gemm_ladder.serve.runtime import ModuleInputError

from .test_kernel_pack import _module, _pack


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """No pack from the environment, a private cache and database, no choice remembered."""
    monkeypatch.delenv(kernel_pack.PACK_ENV, raising=False)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMM_LADDER_TUNING_DB", "off")
    monkeypatch.setattr(front, "TINY_FLOPS", 0)  # these small shapes stand for any: no torch for tiny ones
    front.reset()
    yield
    front.reset()


# -- inputs ---------------------------------------------------------------------------------------
def h(*shape, dtype=torch.float16):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("A, B, out, words", [
    (h(4, 64, dtype=torch.float32), h(8, 64, dtype=torch.float32), None, ["float32", "torch.float16 or torch.bfloat16"]),
    (h(4, 64), h(8, 64, dtype=torch.bfloat16), None, ["torch.float16 and B is torch.bfloat16", "B.to("]),
    (h(4, 64), h(8, 32), None, ["last dim must be B's K=32"]),
    (h(4, 64), h(2, 8, 64), None, ["B must be [N, K]"]),
    (h(4, 64), h(8, 64), None, ["A is on cpu", "A.cuda()"]),
    (h(64, 4).t(), h(8, 64), None, ["A is on cpu"]),  # a transposed view: an MN-major A (issue 31)
    (h(4, 128)[:, ::2], h(8, 64), None, ["A is not contiguous", "A.contiguous()"]),
    (h(4, 64), h(8, 128)[:, ::2], None, ["B is not contiguous"]),
    (h(4, 64), h(8, 64), h(4, 9), ["out has shape (4, 9)", "(4, 8)"]),
    (h(4, 64), h(8, 64), h(4, 8, dtype=torch.bfloat16), ["out has dtype torch.bfloat16"]),
    ("A", h(8, 64), None, ["must be a torch.Tensor"]),
])
def test_bad_inputs_get_the_fix(A, B, out, words):
    with pytest.raises(ModuleInputError) as err:
        front.matmul(A, B, out)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_batch_dims_flatten_into_m():
    A, B = h(2, 3, 64).to("meta"), h(8, 64).to("meta")
    with pytest.raises(ModuleInputError, match="is on meta"):
        front.matmul(A, B)
    assert front.check_shapes(h(2, 3, 64), h(8, 64), h(2, 3, 8)) == (6, 8, 64, (2, 3, 8))
    assert front.check_shapes(h(64), h(8, 64), None) == (1, 8, 64, (8,))
    assert front.check_shapes(h(0, 64), h(8, 64), None) == (0, 8, 64, (0, 8))


# -- the padded-copy path ----------------------------------------------------------------------
class TmaKernel:
    """Stands in for a loaded module: refuses what TMA cannot describe, then computes D = A . B^T."""

    def __init__(self, M=None):
        self.M = M
        self.seen = []

    def __call__(self, a, b, out):
        for name, t in (("A", a), ("B", b), ("out", out)):
            assert t.is_contiguous() and t.data_ptr() % 16 == 0, f"{name} is not TMA-ready"
            assert t.shape[-1] % 8 == 0, f"{name} rows are not 16-byte multiples"
        if self.M is not None:
            assert a.shape[0] == self.M
        self.seen.append((tuple(a.shape), tuple(b.shape), tuple(out.shape)))
        out.copy_((a.float() @ b.float().T).to(out.dtype))


def _misaligned(M, K, dtype=torch.float16):
    """A contiguous [M, K] view that starts 2 bytes past a 16-byte boundary."""
    flat = torch.randn(M * K + 8).to(dtype)
    return flat[1:1 + M * K].view(M, K)


@pytest.mark.parametrize("M, N, K, a_off, b_off, with_out, out_off, module_M, names", [
    (5, 64, 64, False, False, False, False, None, ()),
    (5, 64, 100, False, False, False, False, None, ("pad-k",)),
    (5, 100, 64, False, False, True, False, None, ("pad-n",)),
    (5, 64, 64, True, True, False, False, None, ("copy-a", "copy-b")),
    (5, 64, 64, False, False, True, True, None, ("stage-out",)),
    (1, 64, 64, False, False, False, False, 2, ()),           # a module of M=2: A copied into 2 rows
    (7, 36, 20, True, True, True, True, 16, ("pad-k", "pad-n")),
    (5, 250, 64, False, False, True, False, None, ("split-n",)),
    (3, 131, 64, True, True, True, True, 16, ("split-n", "copy-a", "copy-b")),
])
def test_the_padded_path_is_correct_and_tma_ready(M, N, K, a_off, b_off, with_out, out_off, module_M, names):
    A = _misaligned(M, K) if a_off else torch.randn(M, K).half()
    B = _misaligned(N, K) if b_off else torch.randn(N, K).half()
    out = (_misaligned(M, N) if out_off else torch.empty(M, N).half()) if with_out else None
    layout = Layout(M, N, K, "float16", A.data_ptr() % 16 == 0, B.data_ptr() % 16 == 0,
                    out is None or out.data_ptr() % 16 == 0, out is not None)
    fixes = layout_fixes(layout)
    assert fixes.names == names
    kernel = TmaKernel(module_M)
    route = front.Route(kernel, module_M, "test", "v9", {})
    D = front.launch_route(route, A, B, out, M, N, K, fixes)
    ref = (A.float() @ B.float().T).half()  # the padded product may round the fp32 sums differently
    torch.testing.assert_close(D, ref, rtol=2e-3, atol=2e-3)
    assert out is None or D is out
    assert len(kernel.seen) == 1


class WeightSeen(TmaKernel):
    """Keeps a weak reference to every B it was given (the padded copy, where B needs one)."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def __call__(self, a, b, out):
        self.weights.append(weakref.ref(b))
        super().__call__(a, b, out)


def test_a_weights_padded_copy_is_kept_until_the_weight_changes():
    """An odd-N weight is copied into padded rows once, not on every call (that copy cost GPT-2's
    decode 0.43x cuBLAS); an in-place update of the weight, or another tensor at its address, makes
    a fresh copy, so no call ever reads a stale weight."""
    A, B = torch.randn(7, 64).half(), torch.randn(36, 64).half()
    fixes = layout_fixes(Layout(7, 36, 64, "float16"))
    assert fixes.names == ("pad-n",)
    kernel = WeightSeen()
    route = front.Route(kernel, None, "test", "v9", {})
    first = front.launch_route(route, A, B, None, 7, 36, 64, fixes)
    again = front.launch_route(route, A, B, None, 7, 36, 64, fixes)
    assert kernel.weights[1]() is kernel.weights[0]()  # the same copy served the second call
    torch.testing.assert_close(again, first)
    B.mul_(2)  # in place: the version counter moves
    doubled = front.launch_route(route, A, B, None, 7, 36, 64, fixes)
    torch.testing.assert_close(doubled.float(), (A.float() @ B.float().T), rtol=2e-3, atol=2e-2)
    assert kernel.weights[2]() is not kernel.weights[0]()
    other = B.clone()  # another tensor, same shape: never served B's copy
    front.launch_route(route, A, other, None, 7, 36, 64, fixes)
    assert kernel.weights[3]() is not kernel.weights[2]()
    del other
    front.launch_route(route, A, B, None, 7, 36, 64, fixes)
    kept = kernel.weights[4]
    assert kept() is kernel.weights[2]()  # B's copy, still kept
    del B
    assert kept() is not None  # the cache holds it
    front.reset()
    assert kept() is None  # reset let it go


class CheckedOnce(TmaKernel):
    """A module with ``launcher``: the inputs are checked when it is made, once per GPU."""

    made = 0

    def launcher(self, a, b, out):
        self.made += 1
        return lambda x, y, z: self(x, y, z)


def test_a_route_checks_once_then_launches():
    kernel = CheckedOnce()
    route = front.Route(kernel, None, "test", "v9", {})
    A, B = torch.randn(5, 64).half(), torch.randn(64, 64).half()
    for _ in range(3):
        D = front.launch_route(route, A, B, None, 5, 64, 64, Fixes((), 64, 64))
    assert kernel.made == 1 and len(kernel.seen) == 3
    torch.testing.assert_close(D, (A.float() @ B.float().T).half(), rtol=2e-3, atol=2e-3)


def _remembered(M, N, K, shape, with_out):
    """A route remembered for the fast path as a checked GPU call would leave it (CPU stand-ins; the
    one private seam here: only a GPU call gets as far as remembering). A later ``front.matmul``
    that the fast path does not take runs the checked path, which refuses CPU tensors."""
    kernel = TmaKernel()
    route = front.Route(kernel, None, "test", "v9", {})
    A = torch.randn(*shape[:-1], K).half()
    B = torch.randn(N, K).half()
    out = torch.empty(*shape).half() if with_out else None
    spans = (A.nbytes, B.nbytes, M * N * A.element_size())
    front._FAST[front._fast_key(A, B, out)] = (route, kernel, M, N, K, tuple(shape), spans, False)
    return kernel, route, A, B, out


@pytest.mark.parametrize("shape, with_out", [((6, 64), False), ((6, 64), True), ((2, 3, 64), False),
                                             ((2, 3, 64), True)])
def test_a_call_like_a_checked_one_launches_at_once(shape, with_out):
    """Same shapes, dtypes and GPUs as a remembered call: the remembered launch, on new data."""
    kernel, route, A, B, out = _remembered(6, 64, 32, shape, with_out)
    A2 = torch.randn_like(A)
    D = front.matmul(A2, B, out)
    assert tuple(D.shape) == shape and (out is None or D is out)
    assert len(kernel.seen) == 1 and route.calls == 1
    torch.testing.assert_close(D.reshape(6, 64), (A2.reshape(6, 32).float() @ B.float().T).half(),
                               rtol=2e-3, atol=2e-3)


def test_the_fast_path_misses_what_it_has_not_seen_checked():
    """Another shape, dtype, a non-contiguous or misaligned tensor, a missing or extra out, or
    no tensor at all: no launch (the checked path runs and says what is wrong)."""
    kernel, route, A, B, out = _remembered(6, 64, 32, (6, 64), True)
    flat = torch.randn(6 * 32 + 8).half()
    misses = [
        (torch.randn(7, 32).half(), B, torch.empty(7, 64).half()),        # another M
        (A.bfloat16(), B.bfloat16(), out.bfloat16()),                      # another dtype
        (torch.randn(32, 6).half().t(), B, out),                           # not contiguous
        (flat[1:1 + 6 * 32].view(6, 32), B, out),                          # 2 bytes off 16
        (A, B, None),                                                      # no out where one was
        (A, B, torch.empty(6, 64, dtype=torch.float32)),                   # out of another dtype
        ("A", B, out),
        (A.numpy(), B, out),
    ]
    for a, b, o in misses:
        with pytest.raises(ModuleInputError):
            front.matmul(a, b, o)
    assert kernel.seen == [] and route.calls == 0
    assert front.matmul(A, B, out) is out and len(kernel.seen) == 1
    front.reset()
    with pytest.raises(ModuleInputError, match="A is on cpu"):  # reset forgets it
        front.matmul(A, B, out)


def test_the_fast_path_leaves_an_overlapping_out_or_grad_to_the_checked_path():
    """An ``out`` that shares bytes with A or B, or a tensor that wants grad (grad mode on): no
    launch; the checked path refuses it. An out right after A, or grad mode off: the launch."""
    kernel, route, A, B, out = _remembered(6, 64, 64, (6, 64), True)  # N == K: out=A fits the key
    flat = torch.randn(3 * 6 * 64).half()  # A, then 3 rows more of it, then the rest
    a_in_flat = flat[:6 * 64].view(6, 64)
    misses = [
        (A, B, A, "out overlaps A"),
        (A, B, B[:6], "out overlaps B"),
        (a_in_flat, B, flat[3 * 64:9 * 64].view(6, 64), "out overlaps A"),
        (A.clone().requires_grad_(), B, out, "A requires grad"),
        (A, B.clone().requires_grad_(), out, "B requires grad"),
        (A, B, out.clone().requires_grad_(), "out requires grad"),
    ]
    for a, b, o, words in misses:
        with pytest.raises(ModuleInputError, match=words):
            front.matmul(a, b, o)
    assert kernel.seen == [] and route.calls == 0
    adjacent = flat[6 * 64:12 * 64].view(6, 64)  # right after A, no byte shared
    assert front.matmul(a_in_flat, B, adjacent) is adjacent
    with torch.no_grad():
        assert front.matmul(A.clone().requires_grad_(), B, out) is out
    assert len(kernel.seen) == 2


def test_explain_says_what_was_copied_and_why():
    route = front.Route(None, 16, "kernel pack", "v9", {}, ["kernel: v9 (blk_m=64)", "source: kernel pack P: f.so"])
    text = front.explain_text(7, 36, 20, "float16", "sm_90a", route, layout_fixes(Layout(7, 36, 20)), True, (1, 7, 20))
    for words in ["M=7 N=36 K=20 float16 on sm_90a", "A (1, 7, 20) flattened into M=7", "kernel: v9", "source: kernel pack",
                  "copy A into 16 zero-padded rows", "zero-padded K", "padded D", "correct, slower",
                  "already loaded in this process"]:
        assert words in text, text


# -- where the kernel comes from ---------------------------------------------------------------
@pytest.fixture
def no_gpu_needed(monkeypatch):
    """The GPU questions answered for an H100, modules 'loaded' as their paths."""
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")  # (device.arch_of's answer is cached)
    monkeypatch.setattr(front.device, "sm_count", lambda index: 132)
    monkeypatch.setattr(front, "load", lambda path: TmaKernel())  # the runtime's loader, as front sees it


@pytest.fixture
def small_pack(tmp_path):
    folder = tmp_path / "pack"
    folder.mkdir()
    any_m = _module(folder, "any.so", shape=(1, 256, 512), dynamic=True)
    any_m["m_range"] = [1, 64]
    return _pack(folder, [any_m, _module(folder, "m128.so", shape=(128, 256, 512))])


def test_a_pack_serves_first(small_pack, monkeypatch, no_gpu_needed):
    monkeypatch.setenv(kernel_pack.PACK_ENV, str(small_pack))
    exact = front.route_of(128, 256, 512)
    assert (exact.source, exact.module_M) == ("kernel pack", 128)
    assert any("m128.so" in line and "built for M=128" in line for line in exact.lines)
    assert any("rule 'r'" in line for line in exact.lines)
    ranged = front.route_of(16, 256, 512)
    assert ranged.module_M is None and "knobs chosen for M in 1..64" in "\n".join(ranged.lines)
    assert front.route_of(16, 256, 512) is ranged  # remembered


def test_without_a_compiler_a_pack_serves_less_well_or_the_error_says_how(small_pack, monkeypatch, no_gpu_needed):
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    front.use_pack(small_pack)
    near = front.route_of(200, 256, 512)  # outside the runtime-M module's range 1..64, within 4x
    assert near.module_M is None and near.source == "kernel pack"
    assert "nothing can be built here" in "\n".join(near.lines)
    with pytest.raises(front.NoKernelError) as err:
        front.route_of(16, 4096, 4096, strict=True)
    for words in ["M=16, N=4096, K=4096", str(small_pack), "switched off",
                  "pack build --weights 4096x4096 --dtypes float16", "GEMM_LADDER_PACK"]:
        assert words in str(err.value)


def test_where_no_kernel_serves_torch_does_and_says_so_once(small_pack, monkeypatch, no_gpu_needed):
    """A runtime-only box with no pack for a shape: torch's matmul computes it (a model with one
    such layer still runs), a warning says how to get a kernel, once per shape."""
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    front.use_pack(small_pack)
    A, B = torch.randn(16, 96).half(), torch.randn(40, 96).half()
    with pytest.warns(front.KernelFallbackWarning) as caught:
        route = front.route_of(16, 40, 96)
    assert len(caught) == 1
    text = str(caught[0].message)
    for words in ["M=16 N=40 K=96", "torch's own matmul", "pack build --weights 40x96", "GEMM_LADDER_STRICT=1"]:
        assert words in text, text
    assert route.source == "torch fallback" and "torch.matmul" in route.lines[0]
    D = torch.full((16, 40), float("nan")).half()
    route.run(A, B, D)
    torch.testing.assert_close(D.float(), (A.float() @ B.float().T), rtol=2e-3, atol=2e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same shape again: remembered, no second warning
        assert front.route_of(16, 40, 96) is route


@pytest.mark.parametrize("strict_env", ["1", "true"])
def test_strict_mode_restores_the_error(small_pack, monkeypatch, no_gpu_needed, strict_env):
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    monkeypatch.setenv(front.STRICT_ENV, strict_env)
    front.use_pack(small_pack)
    with pytest.raises(front.NoKernelError, match="no kernel pack serves it"):
        front.route_of(16, 40, 96)  # strict=None: the environment's
    with pytest.warns(front.KernelFallbackWarning):  # the argument wins over the environment
        assert front.route_of(16, 40, 96, strict=False).source == "torch fallback"


def test_a_module_made_for_a_far_m_is_not_used_silently(small_pack, monkeypatch, no_gpu_needed, tmp_path):
    """A runtime-M module chosen for M in 1..64 asked for M = 4096 (a split-K module chosen for
    M = 2 once ran M = 4096 at 0.04x cuBLAS): torch serves it, with a warning; strict mode keeps
    the module, still with a warning."""
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    front.use_pack(small_pack)
    with pytest.warns(front.KernelFallbackWarning, match="far outside M 1..64"):
        route = front.route_of(4096, 256, 512)
    assert route.source == "torch fallback"
    with pytest.warns(front.KernelFallbackWarning, match="strict mode"):
        kept = front.route_of(4096, 256, 512, strict=True)
    assert kept.source == "kernel pack"
    front.reset()  # a pack of one module, built for M=128: it serves at most twice the rows a call has
    one = tmp_path / "m128"
    one.mkdir()
    front.use_pack(_pack(one, [_module(one, "m128.so", shape=(128, 256, 512))]))
    served = front.route_of(100, 256, 512)
    assert (served.source, served.module_M) == ("kernel pack", 128)  # 128 rows for 100: served
    with pytest.warns(front.KernelFallbackWarning, match="A would be copied into 128 rows for M=16"):
        assert front.route_of(16, 256, 512).source == "torch fallback"


def test_an_m_past_32_bit_indices_is_never_launched_on_our_kernels(small_pack, monkeypatch, no_gpu_needed):
    """A runtime-M module reads M as an int32: a pack's module is not used past the M it indexes
    (config.max_m_of), and a shape the policy refuses (IndexRangeError) goes to torch, whose
    indices are 64-bit; strict mode says why instead."""
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    front.use_pack(small_pack)
    huge = 2**23  # [M, 512] rows of A: past 2^31 elements
    with pytest.warns(front.KernelFallbackWarning, match="reads M as a 32-bit index and serves M <= "):
        route = front.route_of(huge, 256, 512)
    assert route.source == "torch fallback"
    front.reset()
    monkeypatch.delenv("GEMM_LADDER_BUILD")  # TVM's compiler is here: the policy is asked
    front.reset()
    with pytest.warns(front.KernelFallbackWarning, match="32-bit"):
        route = front.route_of(2**31, 4096, 4096)
    assert route.source == "torch fallback"
    with pytest.raises(IndexRangeError, match="32-bit"):
        front.route_of(2**31, 4096, 4096, strict=True)


def test_a_tiny_problem_runs_ours_eagerly_and_torchs_in_a_graph(small_pack, monkeypatch, no_gpu_needed):
    """Where cuBLAS's kernel measured faster (a few microseconds of work either way), a call under
    CUDA-graph capture runs torch's matmul and an eager call ours (the shorter host path); explain
    says so; strict mode runs ours always."""
    monkeypatch.setattr(front, "TINY_FLOPS", 2e9)
    front.use_pack(small_pack)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a choice, not a gap: no warning
        route = front.route_of(128, 256, 512)
    assert route.source == "kernel pack" and "under CUDA-graph capture: torch.matmul" in "\n".join(route.lines)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    want = (A.float() @ B.float().T)
    for capturing, ours_calls in ((False, 1), (True, 1)):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        ours = route.module.eager
        before = len(ours.seen)
        D = torch.full((128, 256), float("nan")).half()
        route.module(A, B, D)
        torch.testing.assert_close(D.float(), want, rtol=2e-3, atol=2e-3)
        assert len(ours.seen) - before == (0 if capturing else ours_calls)
    assert route.module.seen is route.module.eager.seen  # the rest of the module reads through
    strict = front.route_of(128, 256, 512, strict=True)
    assert not isinstance(strict.module, front.ByCapture)
    assert front.is_tiny(1, 768, 768) and front.is_tiny(1536, 768, 768) and front.is_tiny(128, 1024, 1024)
    assert not front.is_tiny(16, 4096, 4096) and not front.is_tiny(2, 1280, 5120)  # 33 MB and 13 MB moved


def test_the_fallback_takes_any_layout_without_copies(small_pack, monkeypatch, no_gpu_needed):
    """torch's matmul needs none of TMA's copies: an odd K and a misaligned A go straight to it."""
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    front.use_pack(small_pack)
    monkeypatch.setattr(front, "_check", lambda A, B, out, bias=None: (A.shape[0], B.shape[0], B.shape[1], A, out, (A.shape[0], B.shape[0])))
    A, B = _misaligned(5, 100), torch.randn(36, 100).half()
    with pytest.warns(front.KernelFallbackWarning):
        D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)


def test_a_damaged_pack_in_the_environment_is_an_error(tmp_path, monkeypatch, no_gpu_needed):
    (tmp_path / "p").mkdir()
    monkeypatch.setenv(kernel_pack.PACK_ENV, str(tmp_path / "p"))
    with pytest.raises(kernel_pack.PackError, match="pack.json is missing"):
        front.route_of(16, 256, 512)


@pytest.mark.slow
def test_with_a_compiler_the_policy_builds_into_the_cache(tmp_path, no_gpu_needed):
    """No pack: the policy's choice is built on first use, found in the cache by the next
    process (here: after forgetting), and a runtime-M module serves another M of its rule."""
    from gemm_ladder.serve import plan

    rule = plan.rule_choice(plan.Problem(16, 256, 512))
    first = front.route_of(16, 256, 512)
    assert first.source == "fresh build" and first.rung == rule.rung
    text = "\n".join(first.lines)
    assert f"rule {rule.rule!r}" in text and "built now, on first use" in text and str(tmp_path / "cache") in text
    front.reset()
    again = front.route_of(16, 256, 512)
    assert again.source == "module cache"
    if first.module_M is None:  # the rung takes M at run time: one module for the rule's M
        other = front.route_of(12, 256, 512)  # the same v11 tile (blk_m=16) as M=16
        assert other.source == "module cache" and other.lines[-1] == again.lines[-1]


# -- the torch op's fake implementation ------------------------------------------------------------
import gemm_ladder.serve.ops  # noqa: E402  (registers torch.ops.gemm_ladder.mm)

mm = torch.ops.gemm_ladder.mm


@pytest.mark.parametrize("a_shape", [(5, 64), (2, 3, 64), (64,), (0, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_shapes_dtypes_and_batch_dims(a_shape, dtype):
    A = torch.empty(a_shape, dtype=dtype, device="meta")
    B = torch.empty(40, 64, dtype=dtype, device="meta")
    D = mm(A, B)
    assert D.shape == (*a_shape[:-1], 40) and D.dtype == dtype and D.device.type == "meta"


@pytest.mark.parametrize("A, B, words", [
    (torch.empty(5, 64, device="meta"), torch.empty(40, 64, device="meta"), "use torch.float16 or torch.bfloat16"),
    (torch.empty(5, 64, dtype=torch.float16, device="meta"), torch.empty(40, 64, dtype=torch.bfloat16, device="meta"),
     "pass one dtype"),
    (torch.empty(5, 32, dtype=torch.float16, device="meta"), torch.empty(40, 64, dtype=torch.float16, device="meta"),
     "last dim 32 is not B's K=64"),
    (torch.empty(5, 64, dtype=torch.float16, device="meta"), torch.empty(2, 40, 64, dtype=torch.float16, device="meta"),
     "B must be [N, K]"),
])
def test_fake_refuses_what_the_op_refuses(A, B, words):
    with pytest.raises(RuntimeError, match=words.replace("[", r"\[").replace("]", r"\]")):
        mm(A, B)


def test_the_op_off_the_gpu_says_so():
    with pytest.raises(ModuleInputError, match="move it to the GPU"):
        mm(torch.zeros(4, 64, dtype=torch.float16), torch.zeros(8, 64, dtype=torch.float16))


def test_fake_backward_shapes():
    A = torch.empty(2, 3, 64, dtype=torch.float16, device="meta", requires_grad=True)
    B = torch.empty(40, 64, dtype=torch.float16, device="meta", requires_grad=True)
    mm(A, B).sum().backward()
    assert A.grad.shape == A.shape and B.grad.shape == B.shape


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(128, 64, dtype=torch.float16))
        self.down = torch.nn.Parameter(torch.randn(64, 128, dtype=torch.float16))

    def forward(self, x):
        return mm(torch.nn.functional.silu(mm(x, self.up)), self.down) + x


def test_export_traces_the_op_without_a_graph_break():
    ep = torch.export.export(Tiny(), (torch.randn(2, 5, 64, dtype=torch.float16),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and "gemm_ladder" in str(n.target)]
    assert len(calls) == 2
    assert [tuple(n.meta["val"].shape) for n in calls] == [(2, 5, 128), (2, 5, 64)]


def test_dynamo_captures_one_graph():
    """torch.compile's frontend: one graph, no break (the backend here only records it)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(2, 5, 64, dtype=torch.float16),)

    torch._dynamo.reset()
    torch.compile(Tiny(), backend=record, fullgraph=True)(torch.randn(2, 5, 64, dtype=torch.float16))
    torch._dynamo.reset()
    assert len(graphs) == 1
    assert sum("gemm_ladder" in str(n.target) for n in graphs[0].graph.nodes) == 2


RUNTIME_ONLY_ROUTE = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the build stub stands in for the driver
from gemm_ladder.serve import front
front._arch = lambda index: "sm_90a"
route = front.route_of(16, 256, 512, strict=True)  # the pack's module, tiny or not
import tvm
assert tvm.base._RUNTIME_ONLY and "tvm_compiler" not in tvm.base._LOADED_LIBS
compiler_side = [m for m in sys.modules if m.startswith(("layouts", "gemm_ladder.sync.classes", "gemm_ladder.protocol",
                                                        "gemm_ladder.sm90a", "gemm_ladder.sm100a"))]
assert not compiler_side, f"the compiler side was imported: {compiler_side}"
print(route.source, route.rung, type(route.module).__name__, route.module.dynamic_m)
"""


@pytest.mark.slow
def test_a_pack_serves_with_the_tvm_runtime_alone(tmp_path):
    """What a GPU box without TVM's compiler does: the front door finds the module in a pack and
    loads it with a runtime-only TVM, importing nothing of the compiler side."""
    import os
    import subprocess
    import sys

    from gemm_ladder.compile import toolchain
    from gemm_ladder.serve.pack import pack_runtime

    kernel_pack.build_pack(tmp_path / "pack", [(16, 256, 512)], ["float16"], sms=132, workers=1)
    site = pack_runtime(tmp_path / "rt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site)] + [p for p in sys.path if p.endswith("site-packages")]),
           "TVM_USE_RUNTIME_LIB": "1", kernel_pack.PACK_ENV: str(tmp_path / "pack")}
    out = subprocess.run([sys.executable, "-c", RUNTIME_ONLY_ROUTE, str(toolchain.stub_driver())], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:2] == ["kernel", "pack"] and out.stdout.split()[3] == "GemmModule"


def test_in_a_graph_a_weight_needing_a_padded_copy_goes_to_torch(small_pack, monkeypatch, no_gpu_needed):
    """Inside capture the padded copy of a weight would be made on every replay: where nothing was
    timed, torch's matmul reads it as it is (no copy kept, none made); eager calls and strict mode
    keep ours and the copy; where the first call timed ours (copy in the graph) faster, ours."""
    front.use_pack(small_pack)
    monkeypatch.setattr(front, "_check", lambda A, B, out, bias=None: (A.shape[0], B.shape[0], B.shape[1], A, out, (A.shape[0], B.shape[0])))
    monkeypatch.setattr(front.first_use, "can_measure", lambda a: False)
    A, B = torch.randn(16, 508).half(), torch.randn(256, 508).half()  # K = 508: padded to 512 for TMA
    want = A.float() @ B.float().T
    for capturing, strict, copied in ((True, False, False), (False, False, True), (True, True, True)):
        front._B_COPIES.clear()
        monkeypatch.setattr(front, "_capturing", lambda a, c=capturing: c)
        D = front.matmul(A, B, strict=strict)
        torch.testing.assert_close(D.float(), want, rtol=2e-3, atol=2e-3)
        assert bool(front._B_COPIES) == copied, (capturing, strict)

    front.route_of(16, 256, 512).candidates = {}  # as measured, ours the winner under capture
    front._B_COPIES.clear()
    monkeypatch.setattr(front, "_capturing", lambda a: True)
    torch.testing.assert_close(front.matmul(A, B).float(), want, rtol=2e-3, atol=2e-3)
    assert front._B_COPIES  # ours, with its copy


def test_in_a_graph_a_split_n_weight_stays_ours_and_is_read_where_it_lies(small_pack, monkeypatch, no_gpu_needed):
    """N = 257 with K a multiple of 8: nothing to copy on a replay (the kernel reads the weight's
    first 256 rows as they lie, torch's matmul the last), so capture keeps ours, untimed too."""
    kernel = EpilogueKernel()
    monkeypatch.setattr(front, "load", lambda path: kernel)
    front.use_pack(small_pack)
    monkeypatch.setattr(front, "_check", lambda A, B, out, bias=None: (A.shape[0], B.shape[0], B.shape[1], A, out, (A.shape[0], B.shape[0])))
    monkeypatch.setattr(front.first_use, "can_measure", lambda a: False)
    monkeypatch.setattr(front, "_capturing", lambda a: True)
    A, B = torch.randn(16, 512).half(), torch.randn(257, 512).half()
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert kernel.weights == [(B.data_ptr(), (256, 512))] and not front._B_COPIES


def test_the_fast_path_takes_a_padded_shape_too_but_not_inside_capture(monkeypatch):
    """N = 100 (padded to 104 for TMA): a repeated call skips the checks and keeps the weight's
    padded copy; inside CUDA-graph capture it leaves the call to the checked path (where torch
    reads the weight as it is)."""
    M, N, K = 6, 100, 64
    kernel = TmaKernel()
    route = front.Route(kernel, None, "test", "v9", {})
    fixes = layout_fixes(Layout(M, N, K, "float16"))
    assert fixes.names == ("pad-n",) and fixes.N == 104
    A, B, out = torch.randn(M, K).half(), torch.randn(N, K).half(), torch.empty(M, N).half()
    spans = (A.nbytes, B.nbytes, M * N * A.element_size())
    front._FAST[front._fast_key(A, B, out)] = (route, front.padded_launch(route, M, N, K, fixes), M, N, K, (M, N),
                                               spans, True)
    monkeypatch.setattr(front, "_capturing", lambda a: False)
    for _ in range(2):
        A2 = torch.randn_like(A)
        assert front.matmul(A2, B, out) is out
        torch.testing.assert_close(out.float(), A2.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert [s[1] for s in kernel.seen] == [(104, 64), (104, 64)] and len(front._B_COPIES) == 1
    monkeypatch.setattr(front, "_capturing", lambda a: True)
    with pytest.raises(ModuleInputError, match="A is on cpu"):  # the checked path
        front.matmul(A, B, out)
    assert len(kernel.seen) == 2


@pytest.mark.parametrize("M, N, K", [(6, 100, 64), (5, 64, 100), (7, 250, 100)])
def test_a_padded_launch_keeps_its_scratch_and_the_weights_copy_between_calls(M, N, K):
    """The padded fast launch (pad-n, pad-k, both): D = A . B^T into the caller's D every call, the
    kernel handed the same padded A, D and weight copy each time (made once), a weight written in
    place copied again (its version counter), and another weight object copied for itself."""
    kernel = TmaKernel()
    route = front.Route(kernel, None, "test", "v9", {})
    fixes = layout_fixes(Layout(M, N, K, "float16"))
    launch = front.padded_launch(route, M, N, K, fixes)
    B = torch.randn(N, K).half()
    seen = []
    kernel_call = kernel.__call__

    def spy(a, b, out):
        seen.append((a.data_ptr(), b.data_ptr(), out.data_ptr()))
        kernel_call(a, b, out)

    route.module = spy
    for step in range(4):
        if step == 2:
            B.mul_(-1)  # written in place: a new padded copy
        A, D = torch.randn(M, K).half(), torch.full((M, N), float("nan")).half()
        assert launch(A, B, D) is D
        torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    if fixes.K != K:  # the kept, padded A
        assert len({s[0] for s in seen}) == 1
    if fixes.N != N:  # the kept, padded D
        assert len({s[2] for s in seen}) == 1 and all(s[2] != D.data_ptr() for s in seen)
    assert seen[0][1] == seen[1][1] and seen[2][1] == seen[3][1]  # one weight copy until B changed
    other = torch.randn(N, K).half()
    A, D = torch.randn(M, K).half(), torch.empty(M, N).half()
    launch(A, other, D)
    torch.testing.assert_close(D.float(), A.float() @ other.float().T, rtol=2e-3, atol=2e-3)


class EpilogueKernel(TmaKernel):
    """A stand-in for a module with the whole epilogue: D = act(alpha A.B^T + bias) + beta C, each
    operand refused unless TMA could read it; keeps the B tensors it was handed."""

    ACTS = {"none": lambda z: z, "relu": torch.relu, "silu": torch.nn.functional.silu,
            "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}

    def __init__(self, act="none"):
        super().__init__()
        self.act, self.weights = act, []

    def __call__(self, a, b, out, bias=None, alpha=None, C=None, beta=None):
        for name, t in (("bias", bias), ("C", C)):
            assert t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0), f"{name} is not TMA-ready"
        assert bias is None or bias.shape == (b.shape[0],), "the bias is cut like N"
        assert C is None or C.shape == out.shape
        self.weights.append((b.data_ptr(), tuple(b.shape)))
        z = a.float() @ b.float().T * (1.0 if alpha is None else alpha)
        z = self.ACTS[self.act](z + (0 if bias is None else bias.float()))
        super().__call__(a, b, out)  # the TMA checks of A, B and D
        out.copy_(z + (0 if C is None else beta * C.float()))


@pytest.mark.parametrize("with_bias, act, alpha, residual, fp32_out", [
    (False, "none", None, None, False),
    (True, "relu", 0.5, "apart", False),
    (True, "gelu_tanh", None, "in place", False),
    (False, "silu", 2.0, "in place", True),
])
def test_a_split_n_reads_the_weight_where_it_lies_and_computes_the_whole_epilogue(with_bias, act, alpha, residual,
                                                                                  fp32_out):
    """N = 250 with K a multiple of 8: the kernel computes D's first 248 columns from B's first rows
    as they lie (no padded copy of the weight kept), torch's matmul the last two with the same
    epilogue (bias, activation, alpha, a residual that may be D itself, a float32 D)."""
    M, N, K = 5, 250, 64
    fixes = layout_fixes(Layout(M, N, K, "float16"))
    assert fixes.names == ("split-n",) and fixes.N == 248 and not fixes.copies_weight
    kernel = EpilogueKernel(act)
    route = front.Route(kernel, None, "test", "v9", {})
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(M, K, generator=g).half(), torch.randn(N, K, generator=g).half()
    bias = torch.randn(N, generator=g).half() if with_bias else None
    d_dtype = torch.float32 if fp32_out else None
    out = torch.randn(M, N, generator=g).to(d_dtype or torch.float16)
    C = {None: None, "apart": torch.randn(M, N, generator=g).to(out.dtype), "in place": out}[residual]
    beta = 0.5 if C is not None else 1.0
    z = A.float() @ B.float().T * (1.0 if alpha is None else alpha) + (0 if bias is None else bias.float())
    ref = EpilogueKernel.ACTS[act](z) + (0 if C is None else beta * C.float())
    D = front.launch_route(route, A, B, out, M, N, K, fixes, bias, alpha, C, beta, d_dtype, act=act)
    assert D is out
    torch.testing.assert_close(D.float(), ref, rtol=2e-3, atol=2e-3)
    assert kernel.weights == [(B.data_ptr(), (248, K))] and not front._B_COPIES


def test_a_split_n_fast_launch_reads_the_weight_as_it_is_now():
    """The fast path's launch of a split N: the kernel handed B's own first rows and a kept D, each
    call; a weight written in place is read as written (there is no copy to go stale)."""
    M, N, K = 6, 250, 64
    kernel = EpilogueKernel()
    route = front.Route(kernel, None, "test", "v9", {})
    launch = front.padded_launch(route, M, N, K, layout_fixes(Layout(M, N, K, "float16")))
    B = torch.randn(N, K).half()
    kept = []
    kernel_call = kernel.__call__

    def spy(a, b, out):
        kept.append(out.data_ptr())
        kernel_call(a, b, out)

    route.module = spy
    for step in range(3):
        if step == 2:
            B.mul_(-1)
        A, D = torch.randn(M, K).half(), torch.full((M, N), float("nan")).half()
        assert launch(A, B, D) is D
        torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert kernel.weights == [(B.data_ptr(), (248, K))] * 3 and len(set(kept)) == 1 and not front._B_COPIES


class RecordedGraph:
    """A stand-in for :func:`front._capture_split`'s CUDA graph: what a replay does (the kernel and
    torch's matmul on the buffers and weight it was captured with, read as they are at the replay)."""

    def __init__(self, route, a_in, b, d_main, tail):
        self.replays, Nk, b = 0, d_main.shape[1], weakref.ref(b)  # a graph holds B's address, not B
        self.ops = lambda: (route.run(a_in, b()[:Nk], d_main), torch.mm(a_in, b()[Nk:].t(), out=tail))

    def replay(self):
        self.replays += 1
        self.ops()


def test_a_split_n_fast_launch_replays_one_graph_per_weight(monkeypatch):
    """The fast path's split launch captures the kernel and torch's matmul once per weight (kept
    by identity and address) and replays that graph on a copy of each call's A: a new A each call,
    two weights in turn, one written in place (read as written), one moved to new memory (captured
    again); past SPLIT_GRAPHS weights the launches go one by one, with nothing captured."""
    captured = []

    def capture(*args):
        captured.append(RecordedGraph(*args))
        return captured[-1]

    monkeypatch.setattr(front, "_capture_split", capture)
    monkeypatch.setattr(front, "SPLIT_GRAPHS", 3)
    M, N, K = 6, 250, 64
    kernel = EpilogueKernel()
    route = front.Route(kernel, None, "test", "v9", {})
    launch = front.padded_launch(route, M, N, K, layout_fixes(Layout(M, N, K, "float16")))
    weights = [torch.randn(N, K).half() for _ in range(2)]

    def call(B):
        A, D = torch.randn(M, K).half(), torch.full((M, N), float("nan")).half()
        assert launch(A, B, D) is D
        torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)

    for step in range(3):
        if step == 2:
            weights[0].mul_(-1)
        for B in weights:
            call(B)
    assert len(captured) == 2 and [g.replays for g in captured] == [3, 3]
    weights[1].data = torch.randn(N, K).half()  # the same Parameter-like object, new memory
    call(weights[1])
    assert len(captured) == 3 and captured[2].replays == 1
    more = [torch.randn(N, K).half() for _ in range(2)]
    call(more[0])  # a third weight beside the two: SPLIT_GRAPHS = 3 reached
    call(more[1])  # a fourth: one by one
    assert len(captured) == 3 + 1 and kernel.weights[-1] == (more[1].data_ptr(), (248, K))
    del weights[0]  # a weight gone frees its place
    call(more[1])
    assert len(captured) == 5 and captured[-1].replays == 1


def test_a_padded_launch_for_a_module_of_another_m_goes_the_checked_way():
    """A module built for a larger M (its rows past M zero): the kept scratch does not apply, the
    launch copies A into the module's rows as the checked path does."""
    kernel = TmaKernel(M=8)
    route = front.Route(kernel, 8, "test", "v9", {})
    fixes = layout_fixes(Layout(6, 100, 64, "float16"))
    A, B, D = torch.randn(6, 64).half(), torch.randn(100, 64).half(), torch.empty(6, 100).half()
    front.padded_launch(route, 6, 100, 64, fixes)(A, B, D)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert kernel.seen == [((8, 64), (104, 64), (8, 104))]


def test_torch_linear_writes_a_times_b_transposed_plus_bias_into_out():
    """The fast path's launch of torch's route (``aten::linear.out``): D = A . B^T (+ bias) written
    into the caller's ``out``, for a contiguous B and for B given as a transposed view."""

    g = torch.Generator().manual_seed(5)
    a, b, bias = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((5, 7), (3, 7), (3,)))
    for w in (b, b.t().contiguous().t()):
        d = torch.full((5, 3), float("nan"), dtype=torch.float64)
        front.torch_linear(a, w, d)
        assert torch.allclose(d, a @ b.T)
        front.torch_linear(a, w, d, bias)
        assert torch.allclose(d, a @ b.T + bias)
