"""The front door's GPU checks, run in a child process by ``gemm_ladder.measure.isolate`` (a job named
``tests.front_door_jobs:<function>``, one item per case), so a kernel that hangs fails its test
instead of the session. Each returns ``{"status": "ok" | "wrong", ...}``; the tests in
``tests/test_front_door_gpu.py`` list the cases and the kernel pack they run from.

A case of :func:`check_case` is ``dtype:MxNxK:variant``; the variants:

    plain      A [M, K], B [N, K] fresh and aligned
    out        into a given ``out``
    batch      A [2, M/2, K] (M even): batch dims flattened into M
    views      A, B and out contiguous views 2 bytes past a 16-byte boundary (cloned, staged)
    again      the shape called again (the front door's fast path: checks skipped, a launch as
               the first call's) with new inputs, into ``out``, with batch dims, and with a
               misaligned A, which must miss the fast path and get its copy
"""

from __future__ import annotations

import contextlib
import io

import torch

from gemm_ladder.measure import harness
from gemm_ladder.serve.front import matmul

# check cases need the same layout fixes as the front door's padded path, and the same error bar
# as every kernel check: within 2x of cuBLAS's error on the same inputs (harness)


def _misaligned(shape, dtype, fill=None):
    n = 1
    for s in shape:
        n *= s
    flat = torch.empty(n + 8, dtype=dtype, device="cuda")
    view = flat[1:1 + n].view(*shape)
    if fill is not None:
        view.copy_(fill)
    return view


def _compare(D, A, B, dtype) -> dict:
    A2, D2 = A.reshape(-1, A.shape[-1]), D.reshape(-1, D.shape[-1])
    ref = A2.double() @ B.double().T
    theirs = (A2 @ B.T).double()
    nan = int(torch.isnan(D2).sum().item())
    norm = ref.norm().item() or 1.0
    diff = torch.nan_to_num(D2.double() - ref, nan=float("inf"))
    rel, trel = diff.norm().item() / norm, (theirs - ref).norm().item() / norm
    mabs, tmabs = diff.abs().max().item() if diff.numel() else 0.0, (theirs - ref).abs().max().item() if diff.numel() else 0.0
    floor = harness.ERROR_FLOOR[dtype]
    ok = nan == 0 and rel <= 2 * trel + floor and mabs <= 8 * tmabs + 16 * floor
    return {"status": "ok" if ok else "wrong", "rel_err": rel, "cublas_rel_err": trel, "max_abs_err": mabs,
            "nan_count": nan}


def check_case(item: str, args) -> dict:
    """One shape through ``gemm_ladder.matmul``, compared with a float64 reference."""
    dtype, shape, variant = item.split(":")
    M, N, K = (int(x) for x in shape.split("x"))
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
    A = torch.randn((M, K), generator=g, device="cuda").to(tdt)
    B = torch.randn((N, K), generator=g, device="cuda").to(tdt)
    if variant == "views":
        A, B = _misaligned((M, K), tdt, A), _misaligned((N, K), tdt, B)
        out = _misaligned((M, N), tdt, torch.full((M, N), float("nan"), device="cuda"))
        assert A.data_ptr() % 16 and B.data_ptr() % 16 and out.data_ptr() % 16
        D = matmul(A, B, out=out)
        assert D is out
    elif variant == "out":
        out = torch.full((M, N), float("nan"), dtype=tdt, device="cuda")
        D = matmul(A, B, out=out)
        assert D is out
    elif variant == "batch":
        A = A.view(2, M // 2, K)
        D = matmul(A, B)
        assert D.shape == (2, M // 2, N)
    elif variant == "again":
        matmul(A, B)  # checked, and remembered
        results = []
        for _ in range(2):
            A = torch.randn((M, K), generator=g, device="cuda").to(tdt)
            results.append(_compare(matmul(A, B), A, B, dtype))
            out = torch.full((M, N), float("nan"), dtype=tdt, device="cuda")
            assert matmul(A, B, out=out) is out and matmul(A, B, out=out) is out
            results.append(_compare(out, A, B, dtype))
            A3 = A.view(2, M // 2, K)
            D3 = matmul(A3, B)
            assert D3.shape == (2, M // 2, N)
            results.append(_compare(D3, A3, B, dtype))
        skew = _misaligned((M, K), tdt, A)
        results.append(_compare(matmul(skew, B), skew, B, dtype))
        bad = [r for r in results if r["status"] != "ok"]
        return bad[0] if bad else {**results[-1], "calls": len(results)}
    else:
        D = matmul(A, B)
    torch.cuda.synchronize()
    if M * N == 0 or K == 0:
        ok = D.shape == (M, N) and (K != 0 or bool((D == 0).all()))
        return {"status": "ok" if ok else "wrong", "shape": list(D.shape)}
    return _compare(D, A, B, dtype)


def explain(item: str, args) -> dict:
    """``explain=True`` names the rung, the rule, the source and any copy."""
    M, N, K = (int(x) for x in item.split("x"))
    A = torch.randn((M, K), device="cuda").half()
    B = torch.randn((N, K), device="cuda").half()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        matmul(A, B, explain=True)
        matmul(A, B, explain=True)
    text = err.getvalue()
    want = ["gemm_ladder.matmul:", f"M={M} N={N} K={K}", "kernel:", "chosen by:", "source: kernel pack",
            "already loaded in this process"]
    if K % 8:
        want.append("zero-padded K")
    missing = [w for w in want if w not in text]
    return {"status": "wrong" if missing else "ok", "missing": missing, "text": text[-3000:]}


def opcheck(item: str, args) -> dict:
    """``torch.library.opcheck``: schema, fake tensor, autograd registration, AOT dispatch."""
    import gemm_ladder.serve.ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    import os  # pylint: disable=import-outside-toplevel

    # opcheck's dynamic-shape pass asks for sizes no pack can list ahead (and the backward's MN-major
    # GEMMs): where the front pack has no module, torch computes it (benchmarks/layouts_check.py runs
    # the backward on our kernels); what is checked here is the op's registration
    os.environ["GEMM_LADDER_STRICT"] = "0"
    A = torch.randn((3, 5, 512), device="cuda").half().requires_grad_()
    B = torch.randn((256, 512), device="cuda").half().requires_grad_()
    result = torch.library.opcheck(torch.ops.gemm_ladder.mm.default, (A, B))
    bad = {k: v for k, v in result.items() if v != "SUCCESS"}
    return {"status": "wrong" if bad else "ok", "opcheck": {k: str(v)[:500] for k, v in result.items()}}


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(128, 64, device="cuda").half() / 8)
        self.down = torch.nn.Parameter(torch.randn(64, 128, device="cuda").half() / 8)

    def forward(self, x):
        return torch.ops.gemm_ladder.mm(torch.nn.functional.silu(torch.ops.gemm_ladder.mm(x, self.up)), self.down) + x

    def reference(self, x):
        return torch.nn.functional.silu(x @ self.up.T) @ self.down.T + x


def compile_fullgraph(item: str, args) -> dict:
    """``torch.compile(fullgraph=True)`` of a small model: no graph break, the eager result."""
    import gemm_ladder.serve.ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    model = _Tiny()
    x = torch.randn(2, 5, 64, device="cuda").half()
    breaks = torch._dynamo.explain(model)(x).graph_break_count
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(x)
        eager, ref = model(x), model.reference(x)
    err = (got.float() - ref.float()).abs().max().item()
    ok = breaks == 0 and torch.equal(got, eager) and err < 0.05
    return {"status": "ok" if ok else "wrong", "graph_breaks": breaks, "max_abs_err": err,
            "same_as_eager": bool(torch.equal(got, eager))}


def cuda_graph(item: str, args) -> dict:
    """Capture the op in a CUDA graph (after one warm-up call) and replay it on new inputs."""
    import gemm_ladder.serve.ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    x = torch.randn(32, 512, device="cuda").half()
    w = torch.randn(1024, 512, device="cuda").half()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.gemm_ladder.mm(x, w)  # warm-up: loads the module outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch.ops.gemm_ladder.mm(x, w)
    results = []
    for seed in range(3):
        x.copy_(torch.randn(32, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).half())
        graph.replay()
        torch.cuda.synchronize()
        results.append(_compare(y, x, w, "float16"))
    ok = all(r["status"] == "ok" for r in results)
    return {"status": "ok" if ok else "wrong", "replays": results}


def current_stream(item: str, args) -> dict:
    """The op runs on torch's current stream: on a side stream whose input is written after a
    long sleep, it must wait for the write (on the default stream it would read zeros)."""
    import gemm_ladder.serve.ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    w = torch.randn(1024, 512, device="cuda").half()
    src = torch.randn(64, 512, device="cuda").half()
    x = torch.zeros(64, 512, device="cuda").half()
    torch.ops.gemm_ladder.mm(x, w)  # warm-up
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on s
        x.copy_(src)
        y = torch.ops.gemm_ladder.mm(x, w)
    s.synchronize()
    return _compare(y, src, w, "float16")


def first_use(item: str, args) -> dict:
    """The first call of a shape times the kernels that serve it and torch's (not strict), keeps the
    fastest and says so; the answer is right; a second process (``item``: the choices file, shared)
    takes the remembered winner without timing."""
    import os  # pylint: disable=import-outside-toplevel

    os.environ["GEMM_LADDER_STRICT"] = "0"
    os.environ["GEMM_LADDER_CHOICES"] = item
    A = torch.randn((64, 4096), device="cuda").half()
    B = torch.randn((6144, 4096), device="cuda").half()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        D = matmul(A, B, explain=True)
    text = err.getvalue()
    said = "measured at first use" in text or "chosen at an earlier first use" in text
    check = _compare(D, A, B, "float16")
    ok = said and check["status"] == "ok" and os.path.exists(item)
    return {"status": "ok" if ok else "wrong", "said": said, "check": check, "text": text[-3000:]}


class _ThreeLayers(torch.nn.Module):
    """Three layers through the op at M = 10; the middle one's weight (128 x 128) is in no pack."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n, k, device="cuda").half() / 8)
                                         for n, k in ((128, 64), (128, 128), (64, 128))])

    def forward(self, x):
        for w in self.w:
            x = torch.nn.functional.silu(torch.ops.gemm_ladder.mm(x, w))
        return x

    def reference(self, x):
        for w in self.w:
            x = torch.nn.functional.silu(x @ w.T)
        return x


def compile_fallback(item: str, args) -> dict:
    """``torch.compile(fullgraph=True, mode="reduce-overhead")`` (CUDA-graph replay) of a model one
    of whose layers no pack serves, on a runtime-only box, not strict: it runs, that layer on
    torch's matmul with one warning, replays right on new inputs."""
    import os  # pylint: disable=import-outside-toplevel
    import warnings  # pylint: disable=import-outside-toplevel

    import gemm_ladder.serve.ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    from gemm_ladder.serve.front import KernelFallbackWarning  # pylint: disable=import-outside-toplevel

    os.environ["GEMM_LADDER_STRICT"] = "0"
    model = _ThreeLayers()
    fn = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    errs = []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for seed in range(4):
            x = torch.randn(2, 5, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).half()
            got = fn(x).clone()
            errs.append((got.float() - model.reference(x).float()).abs().max().item())
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, KernelFallbackWarning)]
    ok = max(errs) < 0.05 and len(fallbacks) >= 1 and all("N=128 K=128" in f for f in fallbacks)
    return {"status": "ok" if ok else "wrong", "max_abs_err": errs, "fallbacks": fallbacks[:3]}
