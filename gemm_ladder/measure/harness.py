"""Check and time loaded modules on a GPU: the one harness every rung, test and benchmark uses.

Runtime-only (torch + the TVM runtime). The method:

- correctness: fresh random inputs (randn) for every check, the output poisoned with NaN before
  the launch, the error ||D - ref|| / ||ref|| against a float64 reference, compared with the
  error of torch's own fp16/bf16 matmul (cuBLAS) on the same inputs: the kernel passes when its
  error is within 2x of cuBLAS's (plus a small floor), no element is NaN (every output
  written) and its worst element is within 8x of cuBLAS's worst element;
- timing: warm-up, then the median of many runs timed with CUDA events, queued back to back
  (one synchronisation per round, so the events bracket GPU work, not the host's launch path),
  rotating through enough input sets that they do not fit in L2; cuBLAS (``torch.matmul``) is
  timed the same way in the same process, in alternating rounds with the module (a
  power-capped GPU's clock drifts within a run: both sides see the same drift).
  ``timer="graph"`` times CUDA-graph replays instead: each sample is one replay of
  ``GRAPH_CALLS`` launches (rotating through the input sets) over ``GRAPH_CALLS``, for the module
  and for cuBLAS alike, so the GPU's launch gaps between kernels shrink to what a model captured
  in a graph sees. Read its ratio as "under capture", not as the queued one: cuBLAS may run other
  kernels when captured (H100, 4096^3 fp16: 667-671 TFLOPS captured, 738-744 queued, in one run:
  ``benchmarks/results/2026-11-22_h100_v9_timers/``).

A module whose operand spec (``gemm_ladder.core.spec``) has a bias gets a random one, and one with
an activation has it in the reference (``spec.torch_activation`` in float64) and in torch's side:
``check`` compares with torch's unfused path (``addmm`` or ``matmul``, rounded, then the
activation), and ``time_module`` times against it too (``F.linear`` then the activation, the
unfused path a model runs). cuBLASLt's fused epilogue, ``torch._addmm_activation`` (relu, and GELU
by tanh's formula, with a bias), is the other peer where it applies (``fused_peer`` says so); it is
not timed here.

A scaled fp8 module (``scaled_mm``'s: a spec with fp8 operands and a scale recipe) gets randn A and B
quantized by the recipe (``serve.scaled.quantize_fp8``, as a user's call would), its scales as the
kernel takes them (:func:`fp8_inputs`), and a bias where its spec has one. Its reference is the
float64 product of the dequantized inputs (plus the bias), and its peer, in the checks and the
timing alike, ``torch._scaled_mm`` on the same fp8 inputs (per-tensor: cuBLASLt; rowwise: torch's
CUTLASS kernel; block-wise: cuBLASLt's block scaling, where this torch runs it on the GPU, else a
check compares with torch in D's dtype on the dequantized inputs and timing is refused). The
``cublas_*`` fields and ``ratio_to_cublas`` of its timing are that peer's (``cublas_path`` names it),
so the tuner ranks fp8 candidates as it ranks 16-bit ones.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass

from ..core import device
from ..core.provenance import git_commit, utc_now
from ..core.spec import FP8_DTYPES, torch_activation
from ..serve.scaled import BLOCK, dequantize, quantize_fp8, torch_runs_block

ERROR_FLOOR = {"float16": 2e-4, "bfloat16": 2e-3}


@dataclass
class CheckResult:
    ok: bool
    rel_err: float
    torch_rel_err: float
    max_abs_err: float
    torch_max_abs_err: float
    nan_count: int
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _torch_dtype(name):
    import torch  # pylint: disable=import-outside-toplevel

    return getattr(torch, name)


def random_inputs(M, N, K, dtype, device="cuda", seed=0):
    import torch  # pylint: disable=import-outside-toplevel

    g = torch.Generator(device=device).manual_seed(seed)
    A = torch.randn((M, K), generator=g, device=device, dtype=torch.float32).to(_torch_dtype(dtype))
    B = torch.randn((N, K), generator=g, device=device, dtype=torch.float32).to(_torch_dtype(dtype))
    return A, B


# the M values a module with a runtime M is checked at (besides the M its knobs were chosen
# for): one row, an odd few, one tile, many tiles with a ragged edge, just under a power of two
DYNAMIC_M_CHECKS = (1, 7, 64, 1000, 8191)


def check_ms(mod) -> tuple[int, ...]:
    """The M values ``check`` runs ``mod`` at: its M, and for a runtime-M module the
    :data:`DYNAMIC_M_CHECKS` too."""
    if not getattr(mod, "dynamic_m", False):
        return (mod.M,)
    return tuple(sorted({mod.M, *DYNAMIC_M_CHECKS}))


def is_scaled(spec) -> bool:
    """Whether ``spec`` is a scaled fp8 GEMM's that :func:`check` and :func:`time_module` take (one weight)."""
    return spec is not None and spec.is_fp8 and bool(spec.scales) and not spec.grouped


def _checkable(spec) -> None:
    """:func:`check` computes ``act(A . B^T + bias)`` from K-major 16-bit A and B into a 16-bit or float32 D,
    or a scaled fp8 GEMM's ``A . B^T * scales + bias`` (:func:`fp8_inputs`); a module whose operand spec needs
    more (a residual, alpha, a gated B, MN-major operands, groups) is refused with where its own check is,
    rather than called with operands it does not take."""
    if spec is None:
        return
    extra = [name for name, on in (("fp8 operands without scales", spec.is_fp8 and not spec.scales),
                                   ("a residual C", spec.residual),
                                   ("alpha", spec.alpha), ("a gated B", spec.gated), ("groups", spec.grouped),
                                   ("MN-major operands", (spec.a_major, spec.b_major) != ("K", "K"))) if on]
    if extra:
        raise ValueError(f"verify checks D = act(A . B^T + bias) (16-bit A and B, 16-bit or float32 D); this "
                         f"module's spec ({spec}) adds {', '.join(extra)}: check it through the front door "
                         "(gemm_ladder.matmul, scaled_mm, grouped_mm) or its GPU tests")


def check(mod, seed: int = 0, M: int | None = None) -> CheckResult:
    """Run ``mod`` once on fresh random inputs and compare with a float64 reference (at ``M``
    rows, for a module with a runtime M; default the module's M)."""
    import torch  # pylint: disable=import-outside-toplevel

    spec = getattr(mod, "spec", None)
    _checkable(spec)
    M = mod.M if M is None else M
    if is_scaled(spec):
        return _check_fp8(mod, seed, M)
    A, B = random_inputs(M, mod.N, mod.K, mod.dtype, seed=seed)
    d_dtype = torch.float32 if getattr(spec, "d", None) == "float32" else A.dtype  # the spec's D
    out = torch.full((M, mod.N), float("nan"), dtype=d_dtype, device=A.device)
    # a module whose operand spec adds a bias (gemm_ladder.core.spec): a random one, in the reference too
    bias = random_inputs(1, mod.N, 1, mod.dtype, seed=seed + 1)[1][:, 0].contiguous() \
        if getattr(getattr(mod, "spec", None), "bias", None) else None
    act = getattr(getattr(mod, "spec", None), "act", "none")
    mod(A, B, out=out, **({} if bias is None else {"bias": bias}))
    torch.cuda.synchronize()
    ref = torch_activation(A.double() @ B.double().T + (0 if bias is None else bias.double()), act)
    theirs = torch_activation(A @ B.T if bias is None else torch.addmm(bias, A, B.T), act).double()
    return judge(out.double(), ref, theirs, ERROR_FLOOR[mod.dtype])


def judge(ours, ref, theirs, floor: float) -> CheckResult:
    """The pass rule of the module docstring: ``ours`` (float64, NaN where never written) against
    ``ref``, within 2x the error of ``theirs`` (torch's path) plus ``floor``, and no element past 8x
    torch's worst."""
    import torch  # pylint: disable=import-outside-toplevel

    nan_count = int(torch.isnan(ours).sum().item())
    ref_norm = ref.norm().item() or 1.0
    diff = torch.nan_to_num(ours - ref, nan=float("inf"))
    rel = (diff.norm().item()) / ref_norm
    trel = (theirs - ref).norm().item() / ref_norm
    mabs = diff.abs().max().item()
    tmabs = (theirs - ref).abs().max().item()
    ok = nan_count == 0 and rel <= 2 * trel + floor and mabs <= 8 * tmabs + floor * 16
    detail = ""
    if not ok:
        bad = (diff.abs() > 8 * tmabs + floor * 16).nonzero()
        if nan_count:
            detail = f"{nan_count} outputs never written (NaN)"
        elif len(bad):
            rows, cols = bad[:, 0], bad[:, 1]
            detail = (
                f"{len(bad)} bad elements, rows {rows.min().item()}..{rows.max().item()}, "
                f"cols {cols.min().item()}..{cols.max().item()}, first at {tuple(bad[0].tolist())}"
            )
    return CheckResult(ok, rel, trel, mabs, tmabs, nan_count, detail)


# -- scaled fp8 modules (scaled_mm's kernels) --------------------------------------------------------
FP8_TORCH = "torch._scaled_mm"


@dataclass
class Fp8Inputs:
    """One set of a scaled fp8 module's inputs: A and B in fp8 as the kernel reads them ([M, K], [N, K]),
    the epilogue operands as the kernel takes them, in its spec's order (bias, scale_a, scale_b: block
    scales as they lie, scale_a [K/128, M], scale_b [N/128, K/128]), the scales as ``torch._scaled_mm``
    takes them, and the bias."""

    A: object
    B: object
    operands: dict
    torch_scales: tuple
    bias: object

    def dequantized(self, recipe: str) -> tuple:
        """A and B times their scales, in float64."""
        sa, sb = self.operands["scale_a"], self.operands["scale_b"]
        if recipe == "block":
            return (dequantize(self.A, sa.t()).double(), dequantize(self.B, sb, (BLOCK, BLOCK)).double())
        M, N = self.A.shape[0], self.B.shape[0]
        rows_a = sa.double().reshape(-1, 1).expand(M, 1) if recipe == "row" else sa.double().reshape(1, 1)
        rows_b = sb.double().reshape(-1, 1).expand(N, 1) if recipe == "row" else sb.double().reshape(1, 1)
        return self.A.double() * rows_a, self.B.double() * rows_b


def fp8_inputs(M: int, N: int, K: int, spec, seed: int = 0) -> Fp8Inputs:
    """randn A [M, K] and B [N, K] quantized by ``spec``'s recipe (``quantize_fp8``: the rounding a user's
    call gets; B in the spec's e4m3 or e5m2), and a randn bias in the spec's bias dtype where it has one."""
    import torch  # pylint: disable=import-outside-toplevel

    a, b = random_inputs(M, N, K, "float32", seed=seed)
    b_dtype = getattr(torch, "float8_e5m2" if spec.b == FP8_DTYPES[1] else "float8_e4m3fn")
    if spec.scales == "block":
        aq, sa = quantize_fp8(a, "block")  # [M, K/128], M-major
        bq, sb = quantize_fp8(b, "block", dtype=b_dtype, block=(BLOCK, BLOCK))  # [N/128, K/128]
        scales, torch_scales = (sa.t(), sb), (sa, sb.t())
    else:
        aq, sa = quantize_fp8(a, spec.scales)
        bq, sb = quantize_fp8(b, spec.scales, dtype=b_dtype)
        scales = (sa.reshape(-1), sb.reshape(-1))
        torch_scales = (sa.reshape(M, 1), sb.reshape(1, N).contiguous()) if spec.scales == "row" else \
            (sa.reshape(1), sb.reshape(1))
    bias = random_inputs(1, N, 1, spec.bias, seed=seed + 1)[1][:, 0].contiguous() if spec.bias else None
    operands = {} if bias is None else {"bias": bias}
    operands.update(scale_a=scales[0], scale_b=scales[1])
    return Fp8Inputs(aq, bq, operands, torch_scales, bias)


def fp8_peer(spec, index: int = 0):
    """``(peer(inputs, out), its name)``: ``torch._scaled_mm`` on an :class:`Fp8Inputs` set into ``out``
    (a bias in float32, or with block scales, added to its float32 product: neither is in torch's
    epilogue there); None for block scales where this torch does not run them on GPU ``index``."""
    import torch  # pylint: disable=import-outside-toplevel

    if spec.scales == "block" and not torch_runs_block(index):
        return None, f"{FP8_TORCH} has no block-wise kernel on this GPU in torch {torch.__version__}"
    d = getattr(torch, spec.d)
    fused = spec.bias == spec.d and spec.scales != "block"

    def peer(x: Fp8Inputs, out):
        if x.bias is None or fused:
            return torch._scaled_mm(x.A, x.B.t(), *x.torch_scales, bias=x.bias, out_dtype=d, out=out)
        return out.copy_(torch._scaled_mm(x.A, x.B.t(), *x.torch_scales, out_dtype=torch.float32) + x.bias)

    return peer, FP8_TORCH if fused or not spec.bias else f"{FP8_TORCH} in float32, then the {spec.bias} bias added"


def _check_fp8(mod, seed: int, M: int) -> CheckResult:
    """:func:`check` for a scaled fp8 module: against the dequantized inputs' float64 product, within 2x
    of ``torch._scaled_mm``'s error on the same fp8 inputs (block scales where this torch has no block
    kernel: torch in D's dtype on the dequantized inputs)."""
    import torch  # pylint: disable=import-outside-toplevel

    spec = mod.spec
    x = fp8_inputs(M, mod.N, mod.K, spec, seed)
    d = getattr(torch, spec.d)
    out = torch.full((M, mod.N), float("nan"), dtype=d, device=x.A.device)
    mod(x.A, x.B, out=out, **x.operands)
    a64, b64 = x.dequantized(spec.scales)
    ref = a64 @ b64.T + (0 if x.bias is None else x.bias.double())
    peer, _ = fp8_peer(spec, x.A.device.index or 0)
    theirs = torch.empty_like(out)
    if peer is not None:
        peer(x, theirs)
    else:  # the yardstick where torch has no block-wise kernel: D's dtype on the dequantized inputs
        a16, b16 = a64.to(d), b64.to(d)
        theirs = a16 @ b16.T if x.bias is None else torch.addmm(x.bias.to(d), a16, b16.T)
    torch.cuda.synchronize()
    return judge(out.double(), ref, theirs.double(), ERROR_FLOOR[spec.d])


def fp8_workload(mod, l2_bytes: int | None = None, seed: int = 1000):
    """What :func:`time_module` and the rounds time a scaled fp8 module with: input sets (A, B, D)
    spilling L2 (:func:`sets_to_spill_l2`), the epilogue operands every set shares (one set's scales and
    bias: their values change no kernel's time), and ``torch._scaled_mm`` on a set, with its name.
    ``ValueError`` for block scales where this torch has no block kernel (no peer to time against)."""
    import torch  # pylint: disable=import-outside-toplevel

    spec = mod.spec
    peer, name = fp8_peer(spec)
    if peer is None:
        raise ValueError(f"timing an fp8 module with block scales needs torch's block-wise kernel beside it: "
                         f"{name}; time it on a GPU where torch runs one (torch 2.11 does on an H100 or H200)")
    n = sets_to_spill_l2(mod.M, mod.N, mod.K, l2_bytes or device.probe(0).l2_bytes)
    xs = [fp8_inputs(mod.M, mod.N, mod.K, spec, seed + i) for i in range(n)]
    first = xs[0]
    d = getattr(torch, spec.d)
    sets = [(x.A, x.B, torch.empty((mod.M, mod.N), dtype=d, device=x.A.device)) for x in xs]

    def theirs(a, b, o):
        peer(Fp8Inputs(a, b, first.operands, first.torch_scales, first.bias), o)

    return sets, first.operands, theirs, name


def bytes_once(M: int, N: int, K: int, in_bytes: int = 2) -> int:
    """The fewest bytes a GEMM moves through device memory: A and B read once (``in_bytes`` an element:
    2 for 16-bit, 1 for fp8), a 16-bit D written once."""
    return (M * K + N * K) * in_bytes + M * N * 2


def sets_to_spill_l2(M: int, N: int, K: int, l2_bytes: int) -> int:
    """How many (A, B, D) sets of 16-bit inputs spill an L2 of ``l2_bytes`` three times (1 to 8), so
    that rotating through them times a kernel reading DRAM, as a caller with fresh inputs sees."""
    return max(1, min(8, -(-3 * l2_bytes // bytes_once(M, N, K))))


def input_sets(M: int, N: int, K: int, dtype: str, seed: int = 1000, l2_bytes: int | None = None) -> list:
    """:func:`sets_to_spill_l2` sets of ``randn`` A, B (seeds ``seed``, ``seed + 1``, ...) and an
    empty D, on the GPU."""
    import torch  # pylint: disable=import-outside-toplevel

    sets = []
    for i in range(sets_to_spill_l2(M, N, K, l2_bytes or device.probe(0).l2_bytes)):
        A, B = random_inputs(M, N, K, dtype, seed=seed + i)
        sets.append((A, B, torch.empty((M, N), dtype=A.dtype, device=A.device)))
    return sets


def event_times(fn, sets, reps: int, start: int = 0) -> list[float]:
    """``reps`` CUDA-event-timed calls of ``fn``, rotating through the input sets.

    The calls are queued back to back and the stream is synchronised once at the end: the host
    runs ahead of the GPU, so each call's start event waits in the stream behind the previous
    call and the pair brackets the GPU's work alone. (Synchronising after every call would add
    the host's launch path -- argument checks, tensor-map encoding, the driver call -- to every
    sample, and that path is not the same length for a loaded module and for cuBLAS.)
    """
    import torch  # pylint: disable=import-outside-toplevel

    events = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[(start + i) % len(sets)]
        s.record()
        fn(*args)
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def stream_ms(fn, sets, reps: int, start: int = 0) -> float:
    """Wall-clock milliseconds a call of ``fn`` over ``reps`` calls issued back to back, rotating
    through the input sets, with one synchronisation at the end: what a caller's stream of calls
    costs, the host's launch path and the GPU's work together (per call the larger of the two, in
    steady state). Where :func:`event_times`' pairs bracket the GPU's work once the host runs ahead,
    this is the number a host-bound caller sees."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
        fn(*sets[(start + i) % len(sets)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def host_us(fn, sets, reps: int = 20) -> float:
    """Microseconds the host spends in one call of ``fn`` (its launch path: checks, argument
    packing, the driver call), with the GPU kept busy so the host never waits for it."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
        fn(*sets[i % len(sets)])
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


ROUNDS = 6  # alternating rounds of ours and cuBLAS per timing
TIMERS = ("queued", "graph")
GRAPH_CALLS = 20  # launches per captured graph (timer="graph")


def graph_times(fn, sets, reps: int, calls: int = GRAPH_CALLS) -> list[float]:
    """``reps`` samples, each one replay of a CUDA graph of ``calls`` calls of ``fn`` rotating
    through ``sets`` (captured on first use and kept on ``fn``), in ms per call. Fewer calls for a
    long kernel keep a sample short (a 20 ms GEMM needs no 20 launches to be timed); at least
    ``len(sets)`` of them, or the graph would not spill L2."""
    import torch  # pylint: disable=import-outside-toplevel

    graph, captured = getattr(fn, "_graph", (None, None))
    if graph is not None and captured != calls:
        raise ValueError(f"this function's graph holds {captured} calls, not {calls}: time it with calls={captured}")
    if graph is None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # capture needs the launches' one-time setup done first
            fn(*sets[0])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        fn._graph = (graph, calls)  # pylint: disable=protected-access
    events = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / calls for s, e in events]


def time_module(mod, warmup: int = 10, reps: int = 50, l2_bytes: int | None = None,
                rounds: int = ROUNDS, timer: str = "queued") -> dict:
    """Median time of ``mod`` and of cuBLAS on the same shape, in one process, same method.

    A GPU held at its power limit drifts in clock within a run, so the two are not timed one
    after the other but in ``rounds`` alternating rounds (ours, cuBLAS, cuBLAS, ours, ...) of
    ``reps / rounds`` calls each, after a warm-up of both: each side sees the same mix of early
    and late, cool and hot. The medians over all calls give ``ms`` and ``cublas_ms``; the
    per-round ratios (``round_ratios``) show the spread within the run.
    """
    import torch  # pylint: disable=import-outside-toplevel

    if timer not in TIMERS:
        raise ValueError(f"timer={timer!r}: use one of {', '.join(TIMERS)}")
    if timer == "graph" and getattr(mod, "manifest", {}).get("watchdog"):
        raise ValueError("a watchdog build cannot be timed in a CUDA graph (each launch waits on its record): "
                         "use timer='queued', or the build without the watchdog")
    spec = getattr(mod, "spec", None)
    flops = 2.0 * mod.M * mod.N * mod.K
    peer_path = {}
    if is_scaled(spec):  # scaled fp8: against torch._scaled_mm on the same fp8 inputs
        sets, operands, theirs_fn, name = fp8_workload(mod, l2_bytes)
        act, peer_path = "none", {"cublas_path": name}
    else:
        sets = input_sets(mod.M, mod.N, mod.K, mod.dtype, seed=1000, l2_bytes=l2_bytes)
        # a bias module (its operand spec, gemm_ladder.core.spec) against cuBLAS's fused bias (addmm)
        bias = random_inputs(1, mod.N, 1, mod.dtype, seed=999)[1][:, 0].contiguous() \
            if getattr(spec, "bias", None) else None
        operands = {} if bias is None else {"bias": bias}
        # an activation module against torch's unfused path: the product, then the activation
        act = getattr(spec, "act", "none")

        def theirs_fn(a, b, o):
            if bias is None:
                torch.matmul(a, b.T, out=o)
            else:
                torch.addmm(bias, a, b.T, out=o)
            if act != "none":
                torch_activation(o, act)
    n_sets = len(sets)

    def ours_fn(a, b, o):
        mod(a, b, out=o, **operands)

    ours_side, theirs_side = ours_fn, theirs_fn
    if timer == "graph":
        ours_fn(*sets[0])  # the checked call once; the graph replays the module's unchecked launch
        if hasattr(mod, "launcher"):
            launch = mod.launcher(*sets[0], **operands)
            ours_side = (lambda a, b, o: launch(a, b, o, *operands.values())) if operands else launch

    def _timed(fn, n, start=0):
        if timer == "graph":
            return graph_times(fn, sets, n)
        return event_times(fn, sets, n, start=start)

    rounds = max(1, min(rounds, reps))
    per_round = max(1, reps // rounds)
    _timed(ours_side, warmup)
    _timed(theirs_side, warmup)
    ours, theirs, ratios = [], [], []
    for r in range(rounds):
        first, second = (ours_side, theirs_side) if r % 2 == 0 else (theirs_side, ours_side)
        a = _timed(first, per_round, start=r * per_round)
        b = _timed(second, per_round, start=r * per_round)
        mine, cub = (a, b) if r % 2 == 0 else (b, a)
        ours += mine
        theirs += cub
        ratios.append(statistics.median(cub) / statistics.median(mine))
    ms, cublas_ms = statistics.median(ours), statistics.median(theirs)
    # what a memory-bound (small-M, weight-streaming) shape is judged by: A, B read and D
    # written once, over the time
    moved = bytes_once(mod.M, mod.N, mod.K, 1 if is_scaled(spec) else 2)
    launch = {"host_us": round(host_us(ours_fn, sets), 1), "cublas_host_us": round(host_us(theirs_fn, sets), 1)}
    return {
        **launch,
        "ms": ms,
        "tflops": flops / ms / 1e9,
        "gbps": moved / ms / 1e6,
        "cublas_gbps": moved / cublas_ms / 1e6,
        "cublas_ms": cublas_ms,
        "cublas_tflops": flops / cublas_ms / 1e9,
        "ratio_to_cublas": cublas_ms / ms,
        "round_ratios": [round(x, 4) for x in ratios],
        "input_sets": n_sets,
        "reps": per_round * rounds,
        "rounds": rounds,
        "warmup": warmup,
        "timer": timer if timer == "queued" else f"graph of {GRAPH_CALLS} launches",
        **peer_path,
        **({} if act == "none" else {
            "cublas_path": f"{'addmm' if bias is not None else 'matmul'} then {act} (torch's unfused path)",
            "fused_peer": ("torch._addmm_activation (cuBLASLt's fused epilogue) applies, not timed here"
                           if bias is not None and act in ("relu", "gelu_tanh") else "none in torch")}),
    }


def _smi(query: str) -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def gpu_info(index: int = 0) -> dict:
    """GPU name, clocks, power limit and driver, as read now."""
    import torch  # pylint: disable=import-outside-toplevel

    gpu = device.probe(index)
    if gpu is None:
        raise RuntimeError(f"no CUDA GPU {index} here ({device.why_no_gpu(index=index)})")
    return {
        "name": gpu.name,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "sm_count": gpu.sm_count,
        "l2_bytes": gpu.l2_bytes,
        "smem_per_block_optin": gpu.smem_per_block_optin,
        "sm_clock_mhz_now": _smi("clocks.sm"),
        "sm_clock_mhz_max": _smi("clocks.max.sm"),
        "mem_clock_mhz_now": _smi("clocks.mem"),
        "power_limit": _smi("power.limit"),
        "driver": _smi("driver_version"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def run_info(commit: str | None = None) -> dict:
    return {
        "date": utc_now(),
        "commit": commit or os.environ.get("GEMM_LADDER_COMMIT") or git_commit(),
    }
