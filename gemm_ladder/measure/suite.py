"""The shape suite: ``gemm_ladder.matmul`` against cuBLAS over the shapes users have (a benchmark).

    python -m gemm_ladder pack build --suite --out build/suite_pack          # build box
    python -m gemm_ladder suite run --pack build/suite_pack --out suite.json  # GPU box, runtime-only
    python -m gemm_ladder suite plot suite.json --out suite.png

The suite (:func:`cases`): the squares 1024^3 ... 8192^3, and the weight shapes of an
8-billion-parameter Llama-style model (``kernel_pack.MODELS["llama-8b"]``: N x K = 6144 x 4096,
4096 x 4096, 28672 x 4096, 4096 x 14336, 128256 x 4096) at M = 1, 16, 64, 128, 512, 2048, 8192,
each in fp16 and bf16. Targets on an H100: geometric mean >= 0.95x cuBLAS, no shape with
M >= 128 below 0.85x, none below 0.75x (:func:`summary`).

Method, per case, all in one child process with a deadline per case (``isolate``, job
``gemm_ladder.measure.suite:time_case``), so cuBLAS and the front door share the process and the GPU's
state: random inputs; the output poisoned with NaN, then checked against a float64 reference on
up to 256 rows (every column), with the error of cuBLAS on the same rows as the yardstick (as
``harness.check``); then both timed in alternating rounds, each sample a burst of back-to-back
calls between two CUDA events (so a kernel shorter than the host's launch cost measures what a
caller sees, for both sides alike), rotating through enough input sets to spill L2. The front
door is timed as users call it (``matmul(A, B, out=D)``: its checks, the lookup and the launch);
``host_us`` is what one call costs the CPU.

Memory-bound cases (arithmetic intensity below the GPU's balance of peak FLOPS to HBM bandwidth)
also get GB/s: A, B and D moved once, over the time, against the HBM peak read off the device.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from ..core import device, files
from ..core.device import PEAK_TFLOPS
from ..core.procs import progress as progress_bar
from ..serve.front import matmul, route_of
from ..serve.kernel_pack import MODELS
from . import harness, isolate

SQUARES = (1024, 2048, 4096, 8192)
SUITE_M = (1, 16, 64, 128, 512, 2048, 8192)
SUITE_DTYPES = ("float16", "bfloat16")
SUITE_MODEL = "llama-8b"
SUITE_FORMAT = "gemm_ladder.shape_suite"
TARGETS = {"geomean": 0.95, "min_m_ge_128": 0.85, "min": 0.75}
CHECK_ROWS = 256
ROUNDS = 6
BURST_US = 300.0  # a timed sample lasts at least this long


def cases(dtypes=SUITE_DTYPES) -> list[dict]:
    """Every case of the suite: ``{"id", "M", "N", "K", "dtype", "group"}``."""
    out = []
    for dtype in dtypes:
        for s in SQUARES:
            out.append({"M": s, "N": s, "K": s, "dtype": dtype, "group": f"square {s}^3"})
        for name, (N, K) in MODELS[SUITE_MODEL].items():
            for M in SUITE_M:
                out.append({"M": M, "N": N, "K": K, "dtype": dtype, "group": f"{SUITE_MODEL} {name}"})
    for c in out:
        c["id"] = f"{c['dtype']}-{c['M']}x{c['N']}x{c['K']}"
    return out


def select(dtypes=SUITE_DTYPES, only=None) -> list[dict]:
    """The cases of ``dtypes`` whose id or group holds one of the texts of ``only`` (all: None)."""
    return [c for c in cases(dtypes) if not only or any(o in c["id"] or o in c["group"] for o in only)]


def shapes() -> list[tuple[int, int, int]]:
    """The distinct (M, N, K) of the suite (what its kernel pack must serve)."""
    return sorted({(c["M"], c["N"], c["K"]) for c in cases(SUITE_DTYPES[:1])})


def parse_id(case_id: str) -> tuple[int, int, int, str]:
    dtype, _, shape = case_id.partition("-")
    M, N, K = (int(x) for x in shape.split("x"))
    return M, N, K, dtype


# -- the child: one case ------------------------------------------------------------------------
def check_case(A, B, D, dtype) -> dict:
    """D against a float64 reference on up to CHECK_ROWS rows; cuBLAS's error on them as yardstick."""
    import torch  # pylint: disable=import-outside-toplevel

    M = A.shape[0]
    rows = torch.linspace(0, M - 1, min(M, CHECK_ROWS), device=A.device).round().long().unique()
    ref = A[rows].double() @ B.double().T
    theirs = (A[rows] @ B.T).double()
    ours = D[rows].double()
    nan = int(torch.isnan(D).sum().item())
    norm = ref.norm().item() or 1.0
    diff = torch.nan_to_num(ours - ref, nan=float("inf"))
    rel, trel = diff.norm().item() / norm, (theirs - ref).norm().item() / norm
    mabs, tmabs = diff.abs().max().item(), (theirs - ref).abs().max().item()
    floor = harness.ERROR_FLOOR[dtype]
    ok = nan == 0 and rel <= 2 * trel + floor and mabs <= 8 * tmabs + 16 * floor
    return {"ok": ok, "rel_err": rel, "cublas_rel_err": trel, "max_abs_err": mabs, "cublas_max_abs_err": tmabs,
            "nan_count": nan, "rows_checked": int(rows.numel())}


def burst_samples(fn, sets, burst: int, n: int, start: int) -> list[float]:
    """``n`` samples of ``burst`` back-to-back calls each; ms per call."""
    import torch  # pylint: disable=import-outside-toplevel

    out = []
    for i in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for j in range(burst):
            fn(*sets[(start + i * burst + j) % len(sets)])
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / burst)
    return out


def _host_us(fn, sets, calls: int = 20) -> float:
    import torch  # pylint: disable=import-outside-toplevel

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for j in range(calls):
        fn(*sets[j % len(sets)])
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def checked_case(case_id: str):
    """A case's first call through the front door, checked: ``(M, N, K, dtype, base, sets)``, with
    ``base`` the route and the check, and ``sets`` the L2-spilling input sets to time it on (None
    when the check failed: ``base`` says how)."""
    import torch  # pylint: disable=import-outside-toplevel


    M, N, K, dtype = parse_id(case_id)
    A, B = harness.random_inputs(M, N, K, dtype, seed=7)
    D = torch.full((M, N), float("nan"), dtype=A.dtype, device=A.device)
    matmul(A, B, out=D)
    torch.cuda.synchronize()
    route = route_of(M, N, K, dtype).as_dict()
    check = check_case(A, B, D, dtype)
    base = {"route": route, "check": check, "rel_err": check["rel_err"]}
    if not check["ok"]:
        return M, N, K, dtype, base, None
    del A, B, D
    return M, N, K, dtype, base, harness.input_sets(M, N, K, dtype, l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)


def alternate_rounds(ours, theirs, samples) -> tuple[list[float], list[float], list[float]]:
    """:data:`ROUNDS` rounds, each timing ``samples(fn, round)`` of both sides, the first side
    alternating: every sample of ours, of theirs, and each round's ratio of medians (theirs / ours)."""
    mine, cub, ratios = [], [], []
    for r in range(ROUNDS):
        first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        a, b = samples(first, r), samples(second, r)
        o, t = (a, b) if r % 2 == 0 else (b, a)
        mine += o
        cub += t
        ratios.append(statistics.median(t) / statistics.median(o))
    return mine, cub, ratios


def time_case(case_id: str, args) -> dict:
    """The child's job: check and time one case (see the module docstring)."""
    import torch  # pylint: disable=import-outside-toplevel


    reps = int(args[0]) if args else 60
    M, N, K, dtype, base, sets = checked_case(case_id)
    if sets is None:
        return {"status": "wrong", **base}

    def ours(a, b, o):
        matmul(a, b, out=o)

    def theirs(a, b, o):
        torch.matmul(a, b.T, out=o)

    for fn in (ours, theirs):
        burst_samples(fn, sets, 1, 5, 0)  # warm-up (clocks, caches, the module's first launch)
    rough = statistics.median(burst_samples(theirs, sets, 1, 5, 0)) * 1e3
    burst = max(1, min(64, math.ceil(BURST_US / max(rough, 1e-3))))
    per_round = max(1, reps // ROUNDS)
    mine, cub, ratios = alternate_rounds(ours, theirs, lambda fn, r: burst_samples(fn, sets, burst, per_round, r))
    ms, cms = statistics.median(mine), statistics.median(cub)
    flops, moved = 2.0 * M * N * K, harness.bytes_once(M, N, K)
    return {"status": "ok", **base, "ms": ms, "cublas_ms": cms, "tflops": flops / ms / 1e9,
            "cublas_tflops": flops / cms / 1e9, "ratio_to_cublas": cms / ms,
            "round_ratios": [round(x, 4) for x in ratios], "gbps": moved / ms / 1e6,
            "cublas_gbps": moved / cms / 1e6, "burst": burst, "samples": len(mine), "input_sets": len(sets),
            "host_us": _host_us(ours, sets), "cublas_host_us": _host_us(theirs, sets)}


# -- the parent: the run, the result, the summary, the plot ----------------------------------------
def hbm_peak_gbps(index: int = 0) -> float | None:
    """The HBM peak the device reports (memory clock x bus width x 2, DDR), GB/s; None when unknown."""
    import torch  # pylint: disable=import-outside-toplevel

    props = torch.cuda.get_device_properties(index)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def copy_gbps(index: int = 0, nbytes: int = 1 << 30, reps: int = 20) -> float | None:
    """The bandwidth the device's own copy reaches (``dst.copy_(src)`` of ``nbytes``: it reads and
    writes each byte once, so ``2 * nbytes`` over the median time), GB/s: the ceiling a memory-bound
    GEMM is held to (issue 30: at least 85% of it), where the datasheet's peak is never reached. None
    when the buffers do not fit."""
    import torch  # pylint: disable=import-outside-toplevel

    try:
        src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}").random_(0, 255)
        dst = torch.empty_like(src)
    except torch.OutOfMemoryError:
        return None
    times = []
    for i in range(reps + 3):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        dst.copy_(src)
        t1.record()
        t1.synchronize()
        if i >= 3:  # warm-up: clocks, the allocator's first touch
            times.append(t0.elapsed_time(t1))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(times) * 1e-3) / 1e9


def memory_bound_summary(rows: list[dict], copy: float | None) -> dict:
    """Memory-bound rows (``memory_bound``) against the copy's bandwidth: how many reach 85% of it,
    ours and cuBLAS's, and the least fraction (issue 30's target for those cases)."""
    mem = [r for r in rows if r.get("memory_bound") and r.get("status") == "ok" and "gbps" in r]
    if not copy or not mem:
        return {"cases": len(mem), "copy_gbps": copy}
    ours = [r["gbps"] / copy for r in mem]
    theirs = [r["cublas_gbps"] / copy for r in mem if "cublas_gbps" in r]
    out = {"cases": len(mem), "copy_gbps": copy, "target_of_copy": 0.85,
           "at_85pct_of_copy": sum(x >= 0.85 for x in ours), "min_of_copy": min(ours),
           "median_of_copy": statistics.median(ours),
           "cublas_at_85pct_of_copy": sum(x >= 0.85 for x in theirs),
           "cublas_median_of_copy": statistics.median(theirs) if theirs else None}
    own = [(r["gbps_of_same_bytes_copy"], r["cublas_gbps_of_same_bytes_copy"]) for r in mem
           if "gbps_of_same_bytes_copy" in r]
    if own:  # against a copy of each case's own bytes (every_model: copy_same_bytes_gbps)
        out.update(same_bytes_cases=len(own), at_85pct_of_same_bytes_copy=sum(o >= 0.85 for o, _ in own),
                   median_of_same_bytes_copy=statistics.median(o for o, _ in own),
                   min_of_same_bytes_copy=min(o for o, _ in own),
                   cublas_at_85pct_of_same_bytes_copy=sum(c >= 0.85 for _, c in own),
                   cublas_median_of_same_bytes_copy=statistics.median(c for _, c in own))
    return out


def summary(results: list[dict]) -> dict:
    """Geometric mean and minima of the ratios to cuBLAS, against :data:`TARGETS`."""
    ok = [r for r in results if r.get("status") == "ok"]
    ratios = [r["ratio_to_cublas"] for r in ok]
    big = [r["ratio_to_cublas"] for r in ok if r["M"] >= 128]
    out = {"cases": len(results), "ok": len(ok), "not_ok": [r["id"] for r in results if r.get("status") != "ok"]}
    if ratios:
        out.update(geomean=math.exp(sum(map(math.log, ratios)) / len(ratios)), min=min(ratios),
                   min_m_ge_128=min(big) if big else None,
                   below_0_75=[r["id"] for r in ok if r["ratio_to_cublas"] < TARGETS["min"]],
                   below_0_85_m_ge_128=[r["id"] for r in ok if r["M"] >= 128 and r["ratio_to_cublas"] < 0.85])
        out["targets"] = TARGETS
        out["met"] = bool(len(ok) == len(results) and out["geomean"] >= TARGETS["geomean"] and out["min"] >= TARGETS["min"]
                          and (out["min_m_ge_128"] or 1.0) >= TARGETS["min_m_ge_128"])
    return out


def run(out=None, dtypes=SUITE_DTYPES, only=None, reps: int = 60, timeout: float = 240.0, plot=None,
        progress: bool = True) -> dict:
    """Run the suite (the kernels from ``$GEMM_LADDER_PACK`` / the module cache); write ``out``."""

    todo = select(dtypes, only)
    bar = progress_bar(len(todo), "suite") if progress else None
    try:
        got = isolate.run_batch("gemm_ladder.measure.suite:time_case", [c["id"] for c in todo], [reps], timeout=timeout,
                                on_result=(lambda res: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    gpu = harness.gpu_info()
    peak = hbm_peak_gbps()

    balance = PEAK_TFLOPS.get(gpu_arch(), 0) * 1e12 / (peak * 1e9) if peak else None
    results = []
    for c, res in zip(todo, got):
        res.pop("module", None)
        row = {**c, **res}
        intensity = 2.0 * c["M"] * c["N"] * c["K"] / harness.bytes_once(c["M"], c["N"], c["K"])
        row["intensity_flop_per_byte"] = round(intensity, 1)
        row["memory_bound"] = bool(balance and intensity < balance)
        if row.get("status") == "ok" and peak:
            row["gbps_of_hbm_peak"] = row["gbps"] / peak
            row["cublas_gbps_of_hbm_peak"] = row["cublas_gbps"] / peak
        results.append(row)
    doc = {"format": SUITE_FORMAT, "version": 1, "gpu": gpu, **harness.run_info(), "hbm_peak_gbps": peak,
           "machine_balance_flop_per_byte": balance, "method": __doc__.split("Method, per case,")[1].strip(),
           "summary": summary(results), "results": results}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        files.write_record(Path(out), doc)
        if plot is not False:
            try:
                doc["plot"] = str(plot_result(doc, plot or Path(out).with_suffix(".png")))
            except ImportError:
                doc["plot"] = None  # no matplotlib here: python -m gemm_ladder suite plot on the build box
    return doc


def gpu_arch() -> str:
    return device.arch_of(0)


def table_rows(doc: dict) -> list[dict]:
    rows = []
    for r in doc["results"]:
        route = r.get("route") or {}
        rows.append({"case": r["id"], "group": r["group"], "status": r.get("status"),
                     "rung": route.get("rung", ""), "source": route.get("source", ""),
                     "ratio": f"{r['ratio_to_cublas']:.3f}" if "ratio_to_cublas" in r else "",
                     "tflops": f"{r['tflops']:.1f}" if "tflops" in r else "",
                     "GB/s": f"{r['gbps']:.0f}" if r.get("memory_bound") and "gbps" in r else "",
                     "host_us": f"{r['host_us']:.1f}" if "host_us" in r else ""})
    return rows


def figure(doc: dict):
    """Ratio to cuBLAS per case (and the targets); GB/s against the HBM peak for memory-bound
    cases. A matplotlib Figure on the Agg canvas (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    res = doc["results"]
    fig = Figure(figsize=(max(12, len(res) * 0.2), 9))
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2]})
    xs = range(len(res))
    ratios = [r.get("ratio_to_cublas", 0.0) for r in res]
    colors = ["tab:blue" if r["dtype"] == "float16" else "tab:orange" for r in res]
    ax.bar(xs, ratios, color=colors)
    for name, y, style in (("geomean target", TARGETS["geomean"], "-"), ("M>=128 floor", TARGETS["min_m_ge_128"], "--"),
                           ("floor", TARGETS["min"], ":")):
        ax.axhline(y, color="gray", linestyle=style, linewidth=1, label=f"{name} {y}")
    s = doc.get("summary", {})
    ax.set_title(f"gemm_ladder.matmul / cuBLAS on {doc['gpu']['name']} ({doc['date'][:10]}, {str(doc['commit'])[:8]}): "
                 f"geomean {s.get('geomean', 0):.3f}, min {s.get('min', 0):.3f} (blue fp16, orange bf16)")
    ax.set_ylabel("ratio to cuBLAS (higher is faster)")
    ax.set_xticks(list(xs), [f"{r['M']}x{r['N']}x{r['K']}" for r in res], rotation=90, fontsize=6)
    ax.legend(fontsize=7, loc="lower right")
    mem = [(i, r) for i, r in enumerate(res) if r.get("memory_bound") and r.get("status") == "ok"]
    peak = doc.get("hbm_peak_gbps")
    bx.bar([i for i, _ in mem], [r["gbps"] for _, r in mem], color="tab:green", label="gemm_ladder")
    bx.scatter([i for i, _ in mem], [r["cublas_gbps"] for _, r in mem], color="black", s=8, label="cuBLAS", zorder=3)
    if peak:
        bx.axhline(peak, color="red", linewidth=1, label=f"HBM peak {peak:.0f} GB/s")
    bx.set_xlim(-1, len(res))
    bx.set_ylabel("GB/s (memory-bound cases)")
    bx.set_xticks(list(xs), [""] * len(res))
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_result(doc: dict, path) -> Path:
    """:func:`figure` written to ``path`` (PNG)."""
    path = Path(path)
    figure(doc).savefig(path, dpi=110)
    return path
