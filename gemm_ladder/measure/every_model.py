"""The every-model suite: ``gemm_ladder.matmul`` against cuBLAS on the weight shapes of many model
families, timed twice (a benchmark).

    python -m gemm_ladder.measure.every_model list [--sample 40]            # the cases, tuned and held out
    python -m gemm_ladder.measure.every_model pack build/every_model_pack   # build box: a pack for the sample
    python -m gemm_ladder.measure.every_model run --out every_model.json    # GPU box ($GEMM_LADDER_PACK)

Families (:data:`FAMILIES`): dense LLMs from 0.5B to 70B parameters (fused QKV, attention output,
fused gate+up, down projection, LM head), a vision transformer, an encoder, and GPT-2, whose LM
head's N (50257) is not a multiple of 8. ``held_out``: the families the policy was *not* tuned on
(its rules and the tuning database come from the Llama-8B suite, ``gemm_ladder.measure.suite``); every
report gives them apart. M runs from 1 to 16384; :func:`cases` samples it per weight with a fixed
seed, so a run is the same list every time.

Method, per case, in one child process with a deadline (``isolate``, job
``gemm_ladder.measure.every_model:time_case``): random inputs, the output poisoned with NaN, checked
against a float64 reference with cuBLAS's error as the yardstick (``suite.check_case``); then two
timings, each in alternating rounds with cuBLAS in the same process:

- **call**: ``matmul(A, W, out=D)`` as a caller makes it (host checks, lookup, launch) against
  ``torch.nn.functional.linear(A, W)``, bursts of back-to-back calls between CUDA events, rotating
  through enough input sets to spill L2;
- **kernel**: a CUDA graph of calls cycling through those input sets, replayed between CUDA events
  (no host in the time: what a model served with CUDA graphs sees), against a graph of
  ``torch.matmul(A, W.T, out=D)``.

``kernel_ratio`` and ``call_ratio`` are cuBLAS's time over ours (above 1: we are faster).
Memory-bound cases (arithmetic intensity below the GPU's balance of peak FLOPS to the bandwidth its
own copy reaches, measured in the run: ``copy_gbps``, a 1 GiB ``copy_``) also get GB/s against that
copy and the HBM peak, and against a copy of their own size (``copy_same_bytes_gbps``): a graph of
``copy_`` calls, each reading and writing half the bytes the GEMM moves, cycling through as many
buffer pairs as the case has input sets, timed the way its kernel is. A small GEMM cannot stream at
the 1 GiB copy's rate any more than a copy of its size can (a launch, a ramp and a tail): the second
figure says how far a case is from what the GPU's own copy does with those bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

from ..core import cli_types, files
from ..core.device import PEAK_TFLOPS
from ..core.procs import progress as progress_bar
from ..core.records import ANY, Bool, Int, List, Obj, RecordError, Str, read_json
from ..serve.front import matmul
from ..serve.kernel_pack import build_pack
from . import harness, isolate, suite
from .report import table as fmt

FORMAT = "gemm_ladder.every_model"
# what plot reads of a result file (checked when read): rows with M, the split and both ratios
RESULT_SCHEMA = Obj({"rows": List(Obj({"M": Int(lo=0), "held_out": Bool(), "status": Str()},
                                      {"kernel_ratio": ANY, "call_ratio": ANY}))}, {"gpu": ANY})
# (N, K) of each weight: qkv fused, attention output, gate+up fused, down, LM head (an encoder
# or ViT: qkv, out, fc1, fc2). From the models' public configurations.
FAMILIES = {
    "llama-3.1-8b": {"held_out": False, "weights": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                                                    "down": (4096, 14336), "lm_head": (128256, 4096)}},
    "qwen2.5-0.5b": {"held_out": True, "weights": {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896),
                                                   "down": (896, 4864), "lm_head": (151936, 896)}},
    "llama-3.2-1b": {"held_out": True, "weights": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
                                                   "down": (2048, 8192), "lm_head": (128256, 2048)}},
    "phi-3-mini": {"held_out": True, "weights": {"qkv": (9216, 3072), "o": (3072, 3072), "gate_up": (16384, 3072),
                                                 "down": (3072, 8192), "lm_head": (32064, 3072)}},
    "gemma-2-9b": {"held_out": True, "weights": {"qkv": (8192, 3584), "o": (3584, 4096), "gate_up": (28672, 3584),
                                                 "down": (3584, 14336), "lm_head": (256000, 3584)}},
    "qwen2.5-14b": {"held_out": True, "weights": {"qkv": (7168, 5120), "o": (5120, 5120), "gate_up": (27648, 5120),
                                                  "down": (5120, 13824), "lm_head": (152064, 5120)}},
    "llama-3.1-70b": {"held_out": True, "weights": {"qkv": (10240, 8192), "o": (8192, 8192),
                                                    "gate_up": (57344, 8192), "down": (8192, 28672),
                                                    "lm_head": (128256, 8192)}},
    "falcon-7b": {"held_out": True, "weights": {"qkv": (4672, 4544), "o": (4544, 4544), "up": (18176, 4544),
                                                "down": (4544, 18176), "lm_head": (65024, 4544)}},
    "vit-h-14": {"held_out": True, "weights": {"qkv": (3840, 1280), "o": (1280, 1280), "fc1": (5120, 1280),
                                               "fc2": (1280, 5120)}},
    "bert-large": {"held_out": True, "weights": {"qkv": (3072, 1024), "o": (1024, 1024), "fc1": (4096, 1024),
                                                 "fc2": (1024, 4096)}},
    "gpt2": {"held_out": True, "weights": {"qkv": (2304, 768), "o": (768, 768), "fc1": (3072, 768),
                                           "fc2": (768, 3072), "lm_head": (50257, 768)}},
}
M_CHOICES = (1, 2, 7, 16, 48, 128, 333, 512, 1024, 1536, 2048, 4096, 8192, 16384)
DTYPES = ("float16", "bfloat16")


def all_cases() -> list[dict]:
    """Every (family, weight, M, dtype) of the suite."""
    out = []
    for fam, spec in FAMILIES.items():
        for layer, (N, K) in spec["weights"].items():
            for M in M_CHOICES:
                for dtype in DTYPES:
                    out.append({"id": f"{dtype}-{M}x{N}x{K}", "family": fam, "layer": layer,
                                "held_out": spec["held_out"], "M": M, "N": N, "K": K, "dtype": dtype})
    return out


def cases(sample: int | None = None, seed: int = 0) -> list[dict]:
    """A fixed sample of :func:`all_cases` (all of them for ``sample=None``): as many held-out cases
    as tuned ones where the families allow, each weight's M drawn over the whole range."""
    every = all_cases()
    if sample is None or sample >= len(every):
        return every
    rng = random.Random(seed)
    odd = [c for c in every if c["N"] % 8 or c["K"] % 8]  # the padded path: always some of it
    picked = rng.sample(odd, min(len(odd), max(1, sample // 20)))
    tuned = [c for c in every if not c["held_out"] and c not in picked]
    held = [c for c in every if c["held_out"] and c not in picked]
    n_tuned = min(len(tuned), sample // 3)
    picked += rng.sample(tuned, n_tuned) + rng.sample(held, max(0, sample - n_tuned - len(picked)))
    return sorted(picked, key=lambda c: (c["held_out"], c["family"], c["layer"], c["M"], c["dtype"]))


def parse_id(case_id: str) -> tuple[int, int, int, str]:
    return suite.parse_id(case_id)


# -- the child: one case ------------------------------------------------------------------------
def _graph(fn, sets, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn`` cycling through ``sets`` (captured after a warm-up)."""
    import torch  # pylint: disable=import-outside-toplevel  (GPU side)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for j in range(len(sets)):
            fn(*sets[j])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(calls):
            fn(*sets[j % len(sets)])
    torch.cuda.synchronize()
    return g


def _replays(g, n: int, calls: int) -> list[float]:
    """ms per call of ``n`` timed replays of graph ``g`` (of ``calls`` calls)."""
    import torch  # pylint: disable=import-outside-toplevel

    out = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / calls)
    return out


def _alternate(ours, theirs, samples) -> tuple[float, float, list[float]]:
    """Median ms of ours and theirs over alternating rounds (``suite.alternate_rounds``); per-round ratios."""
    mine, cub, ratios = suite.alternate_rounds(ours, theirs, samples)
    return statistics.median(mine), statistics.median(cub), ratios


def time_case(case_id: str, args) -> dict:
    """The child's job: check one case, then time it as a call and as a kernel (module docstring)."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel


    reps = int(args[0]) if args else 30
    M, N, K, dtype, base, sets = suite.checked_case(case_id)
    if sets is None:
        return {"status": "wrong", **base}
    n_sets = len(sets)

    def ours(a, b, o):
        matmul(a, b, out=o)

    def linear(a, b, o):  # what a model calls: F.linear allocates its output
        F.linear(a, b)

    def cublas(a, b, o):
        torch.matmul(a, b.t(), out=o)

    # the call, as users make it
    for fn in (ours, linear):
        suite.burst_samples(fn, sets, 1, 5, 0)
    rough = statistics.median(suite.burst_samples(linear, sets, 1, 5, 0)) * 1e3
    burst = max(1, min(64, math.ceil(suite.BURST_US / max(rough, 1e-3))))
    per_round = max(1, reps // suite.ROUNDS)
    call_ms, lin_ms, call_rounds = _alternate(ours, linear,
                                              lambda fn, r: suite.burst_samples(fn, sets, burst, per_round, r))
    # the kernel, in CUDA graphs (no host in the time)
    calls = max(len(sets), min(256, math.ceil(2000.0 / max(rough, 1e-3))))
    calls -= calls % len(sets)
    graphs = {fn: _graph(fn, sets, calls) for fn in (ours, cublas)}
    for g in graphs.values():
        _replays(g, 2, calls)
    kern_ms, cub_ms, kern_rounds = _alternate(ours, cublas, lambda fn, r: _replays(graphs[fn], per_round, calls))
    moved = harness.bytes_once(M, N, K)
    flops = 2.0 * M * N * K
    balance = float(args[1]) if len(args) > 1 and args[1] else None
    graphs.clear()  # their memory pools, before the copy's buffers
    same = _same_bytes_copy(moved, n_sets, calls, per_round) if balance and flops / moved < balance else {}
    return {"status": "ok", **base,
            "call_ms": call_ms, "linear_ms": lin_ms, "call_ratio": lin_ms / call_ms,
            "call_round_ratios": [round(x, 4) for x in call_rounds],
            "kernel_ms": kern_ms, "cublas_kernel_ms": cub_ms, "kernel_ratio": cub_ms / kern_ms,
            "kernel_round_ratios": [round(x, 4) for x in kern_rounds],
            "tflops": flops / kern_ms / 1e9, "cublas_tflops": flops / cub_ms / 1e9,
            "gbps": moved / kern_ms / 1e6, "cublas_gbps": moved / cub_ms / 1e6,
            "input_sets": n_sets, "graph_calls": calls, "burst": burst, **same}


def _same_bytes_copy(moved: int, n_sets: int, calls: int, per_round: int) -> dict:
    """A memory-bound case's own-size copy (module docstring): ms per ``copy_`` of ``moved // 2``
    bytes in a CUDA graph of ``calls`` copies over ``n_sets`` buffer pairs, median of
    ``suite.ROUNDS * per_round`` replays, and the GB/s it moves (``moved`` bytes a copy)."""
    import torch  # pylint: disable=import-outside-toplevel

    half = max(16, moved // 2)
    try:
        pairs = [(torch.empty(half, dtype=torch.uint8, device="cuda").random_(0, 255),
                  torch.empty(half, dtype=torch.uint8, device="cuda")) for _ in range(n_sets)]
    except torch.OutOfMemoryError:
        return {}
    g = _graph(lambda src, dst: dst.copy_(src), pairs, calls)
    _replays(g, 2, calls)
    ms = statistics.median(_replays(g, suite.ROUNDS * per_round, calls))
    del g, pairs
    torch.cuda.empty_cache()
    return {"copy_same_bytes_ms": ms, "copy_same_bytes_gbps": 2 * half / ms / 1e6}


# -- the parent ---------------------------------------------------------------------------------
def _geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict]) -> dict:
    """Geometric means and minima of both ratios, for the tuned and the held-out families apart."""
    out = {"cases": len(rows), "correct": sum(bool(r.get("correct")) for r in rows)}
    for name, part in (("tuned", [r for r in rows if not r["held_out"]]), ("held_out", [r for r in rows if r["held_out"]]),
                       ("all", rows)):
        ok = [r for r in part if r.get("status") == "ok"]
        out[name] = {"cases": len(part), "ok": len(ok),
                     "kernel_geomean": _geomean(r["kernel_ratio"] for r in ok),
                     "kernel_min": min((r["kernel_ratio"] for r in ok), default=None),
                     "kernel_below_0_9": sum(r["kernel_ratio"] < 0.9 for r in ok),
                     "call_geomean": _geomean(r["call_ratio"] for r in ok),
                     "call_min": min((r["call_ratio"] for r in ok), default=None),
                     "torch": sum((r.get("route") or {}).get("rung") == "torch" for r in ok),
                     "torch_in_graphs": sum(any("under CUDA-graph capture" in line
                                                for line in (r.get("route") or {}).get("explain", ())) for r in ok)}
    return out


def run(out=None, sample: int | None = 40, reps: int = 30, timeout: float = 240.0, progress: bool = True,
        seed: int = 0) -> dict:
    """Run the sample (kernels from ``$GEMM_LADDER_PACK``, else the module cache); write ``out``."""

    todo = cases(sample, seed)
    # the copy first: its balance tells each child whether its case is memory-bound (own-size copy)
    peak, copy = suite.hbm_peak_gbps(), suite.copy_gbps()
    balance = PEAK_TFLOPS.get(suite.gpu_arch(), 0) * 1e12 / (copy * 1e9) if copy else None
    bar = progress_bar(len(todo), "every model") if progress else None
    try:
        got = isolate.run_batch("gemm_ladder.measure.every_model:time_case", [c["id"] for c in todo],
                                [reps, balance or 0.0], timeout=timeout,
                                on_result=(lambda res: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    rows = []
    for c, res in zip(todo, got):
        res.pop("module", None)
        row = {**c, **res, "correct": res.get("status") == "ok" or (res.get("check") or {}).get("ok", False)}
        intensity = 2.0 * c["M"] * c["N"] * c["K"] / harness.bytes_once(c["M"], c["N"], c["K"])
        row["intensity_flop_per_byte"] = round(intensity, 1)
        row["memory_bound"] = bool(balance and intensity < balance)
        if res.get("status") == "ok" and peak:
            row["gbps_of_hbm_peak"] = res["gbps"] / peak
        if res.get("status") == "ok" and copy:
            row["gbps_of_copy"], row["cublas_gbps_of_copy"] = res["gbps"] / copy, res["cublas_gbps"] / copy
        if res.get("copy_same_bytes_gbps"):
            own = res["copy_same_bytes_gbps"]
            row["gbps_of_same_bytes_copy"], row["cublas_gbps_of_same_bytes_copy"] = res["gbps"] / own, res["cublas_gbps"] / own
        rows.append(row)
    doc = {"format": FORMAT, "version": 1, "gpu": harness.gpu_info(), **harness.run_info(), "hbm_peak_gbps": peak,
           "copy_gbps": copy, "machine_balance_flop_per_byte": balance,
           "method": __doc__.split("Method, per case,")[1].strip(), "sample": {"cases": sample, "seed": seed},
           "summary": {**summary(rows), "memory_bound": suite.memory_bound_summary(rows, copy)}, "rows": rows}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        files.write_record(Path(out), doc)
    return doc


def table(doc: dict) -> str:
    rows = [{"family": r["family"] + (" *" if r["held_out"] else ""), "layer": r["layer"], "case": r["id"],
             "status": r.get("status"), "rung": (r.get("route") or {}).get("rung", ""),
             "kernel": f"{r['kernel_ratio']:.3f}" if "kernel_ratio" in r else "",
             "call": f"{r['call_ratio']:.3f}" if "call_ratio" in r else "",
             "GB/s": f"{r['gbps']:.0f}" if "gbps" in r else ""} for r in doc["rows"]]
    return fmt(rows, list(rows[0])) + "\n(* held out: the policy was not tuned on this family)" if rows else "no cases"


def plot(docs: list[dict], path) -> Path:
    """Both ratios against M, one point a case, tuned and held-out families apart, from one or more
    runs (``docs``), as one PNG at ``path`` (matplotlib's Agg canvas, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    rows = [r for d in docs for r in d["rows"] if r.get("status") == "ok"]
    fig = Figure(figsize=(13, 4.8))
    FigureCanvasAgg(fig)
    for ax, key, title in zip(fig.subplots(1, 2, sharey=True), ("kernel_ratio", "call_ratio"),
                              ("kernel (CUDA graphs, L2 spilled)", "call (matmul as users call it)")):
        for held, color, label in ((False, "tab:blue", "tuned on"), (True, "tab:orange", "held out")):
            part = [r for r in rows if bool(r["held_out"]) == held]
            g = _geomean(r[key] for r in part)
            ax.scatter([r["M"] for r in part], [r[key] for r in part], s=18, color=color, alpha=0.8,
                       label=f"{label}: {len(part)} cases, geomean {g:.3f}" if g else label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.9, color="tab:red", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of A)")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
    fig.axes[0].set_ylabel("cuBLAS time / ours (above 1: faster)")
    gpu = (docs[0].get("gpu") or {}).get("name", "") if docs else ""
    fig.suptitle(f"gemm_ladder.matmul on the every-model suite, {gpu}".strip(", "))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return Path(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.measure.every_model", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="print the cases of the sample")
    pk = sub.add_parser("pack", help="build a kernel pack for the sample (build box)")
    pk.add_argument("out")
    pl = sub.add_parser("plot", help="both ratios against M from result files, as a PNG")
    pl.add_argument("results", nargs="+", help="files every_model run --out wrote")
    pl.add_argument("--out", type=cli_types.out_file, default="every_model.png")
    r = sub.add_parser("run", help="time the sample on this GPU")
    r.add_argument("--out", type=cli_types.out_file, default="every_model.json")
    r.add_argument("--reps", type=cli_types.count, default=30)
    for s in (ls, pk, r):  # (plot reads what the files say)
        s.add_argument("--sample", type=cli_types.count_or_zero, default=40, help="cases (0: every case)")
        s.add_argument("--seed", type=int, default=0, help="which fixed sample (a fresh seed: cases not seen before)")
    a = p.parse_args(argv)
    if a.cmd == "plot":
        try:
            docs = [read_json(f, "every-model result", "give a file that every_model run --out wrote", RESULT_SCHEMA)
                    for f in a.results]
        except RecordError as err:
            print(f"every_model plot: {err}", file=sys.stderr)
            return 2
        print(plot(docs, a.out))
        return 0
    todo = cases(a.sample or None, a.seed)
    if a.cmd == "list":
        for c in todo:
            print(c["id"], c["family"], c["layer"], "held out" if c["held_out"] else "tuned")
        return 0
    if a.cmd == "pack":
        by_dtype: dict = {}
        for c in todo:
            by_dtype.setdefault(c["dtype"], set()).add((c["M"], c["N"], c["K"]))
        for dtype, shapes in sorted(by_dtype.items()):
            man = build_pack(Path(a.out) / dtype, sorted(shapes), [dtype])
            failed = [r for r in man["results"] if r["status"] == "failed"]
            for r in failed:
                print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
            print(f"{len(man['modules'])} modules in {Path(a.out) / dtype}")
            if failed:
                return 1
        return 0
    doc = run(a.out, a.sample or None, a.reps, seed=a.seed)
    print(table(doc))
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
