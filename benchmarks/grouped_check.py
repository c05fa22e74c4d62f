"""The grouped GEMM (v12, ``gemm_ladder.grouped_mm``) on a GPU: correct under the routing a model
makes, CUDA-graph capturable with changing counts, and timed against torch's grouped GEMM and a
loop of cuBLAS GEMMs at MoE shapes (issue 33's contiguous layout).

``prepare DIR`` (build box) builds one v12 module per (experts, N, K, dtype) of :data:`SHAPES`, and
per knob variant of :data:`VARIANTS`, through the module cache and copies them, with their
manifests and ``grouped_check.json`` (what to run), into DIR. ``run DIR --out FILE.json`` (GPU box: TVM runtime and torch only):

1. correctness, each module in a child process with a deadline (``gemm_ladder.measure.isolate``:
   a deadlock fails its module instead of hanging the run): random inputs, D poisoned with NaN,
   every routing of :data:`CHECK_ROUTINGS` (balanced, Zipf-skewed, every expert empty but one,
   counts that are not multiples of the tile, half the experts empty, and rows past ``offs[-1]``
   that must stay untouched: the guarded last m-tile of each expert), against a per-expert fp32
   reference with torch's own per-expert error as the yardstick; then one CUDA graph captured on
   one routing and replayed after ``offs`` was overwritten with two others (the same graph must
   give the new answers);
2. timing of the correct modules, in a child per module: ours, ``torch._grouped_mm`` (where this
   torch runs the dtype) and a loop of ``torch.matmul`` over the experts (cuBLAS; the counts are
   handed to it on the host for free), taking turns in rotating rounds in one process, both as
   queued calls (CUDA events) and as kernels in CUDA graphs cycling input sets that spill L2
   (``harness.graph_times``), at :data:`TOKENS` rows of A and two routings;
3. rows in the issue's results format (``layout``, ``experts``, ``tokens``, ``N``, ``K``,
   ``dtype``, ``routing``, ``correct``, ``ratio_to_grouped_mm`` = torch's time over ours (graphs),
   ``peer_ratios``), the GPU, its clocks (sampled through the run) and the commit.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_check.py prepare build/grouped          # build box
    PYTHONPATH=$PWD/build/runtime/site:$PWD TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_check.py run build/grouped --out out/grouped_check.json   # GPU box

About 2-3 minutes on an H100 (an estimate until the first run); DIR about 2.7 MiB (twelve modules:
the shapes in both dtypes, and :data:`VARIANTS`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)

import gemm_ladder  # noqa: E402
import gemm_ladder.serve.grouped_ops  # noqa: E402,F401  (registers torch.ops.gemm_ladder.grouped_mm)
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve.grouped import spec_of_dtype, use_grouped_module  # noqa: E402

FORMAT = "gemm_ladder.grouped_check"
PLAN_FILE = "grouped_check.json"
# (name, experts, N, K): Mixtral-like (8 experts of 14336x4096), Qwen-MoE-like (64 of 1408x2048),
# DeepSeek-V3-like (256 of 2048x7168), and an odd one for the edges (N not a multiple of the tile, K of
# the slice)
SHAPES = [("mixtral", 8, 14336, 4096), ("qwen_moe", 64, 1408, 2048), ("deepseek_v3", 256, 2048, 7168),
          ("odd", 5, 1000, 520)]
# knob variants beside the defaults (128x256 tiles), by shape: 128-wide tiles fit N = 1408 (11 of
# them; 5.5 of 256) and give a few tokens per expert more, smaller work units to spread over the SMs
VARIANTS = {"qwen_moe": [{"blk_n": 128}], "deepseek_v3": [{"blk_n": 128}]}
DTYPES = ("float16", "bfloat16")
BUILD_M = 4096  # the M the modules are built at (M is read at run time)
CHECK_TOKENS = 1000  # rows of A in the correctness cases (not a multiple of the tile)
CHECK_ROUTINGS = ("balanced", "zipf", "one", "odd", "half_empty", "tail")
TOKENS = (64, 512, 2048, 8192)  # rows of A in the timed cases (tokens x top-k)
TIMED_ROUTINGS = ("balanced", "zipf")
ROUNDS, PER_ROUND = 5, 3
CHECK_TIMEOUT, TIME_TIMEOUT = 120.0, 150.0
ERROR_FLOOR = {"float16": 1e-3, "bfloat16": 8e-3}


# -- routing (pure Python: the CPU tests check it) -------------------------------------------------
def counts_of(routing: str, experts: int, tokens: int, seed: int = 0) -> list[int]:
    """Rows of A per expert for a named routing; they sum to ``tokens`` (``tail``: 37 fewer, the
    rows after ``offs[-1]`` that no expert owns)."""
    rng = random.Random(seed)
    if routing == "balanced":
        base, extra = divmod(tokens, experts)
        return [base + (e < extra) for e in range(experts)]
    if routing == "zipf":  # a router's skew: expert popularity falls as 1 / rank^1.2, ranks shuffled
        weights = [1 / (r + 1) ** 1.2 for r in range(experts)]
        rng.shuffle(weights)
        counts = [int(tokens * w / sum(weights)) for w in weights]
        counts[max(range(experts), key=lambda e: weights[e])] += tokens - sum(counts)
        return counts
    if routing == "one":  # every expert empty but one
        counts = [0] * experts
        counts[rng.randrange(experts)] = tokens
        return counts
    if routing in ("odd", "half_empty", "tail"):
        live = [e for e in range(experts) if routing != "half_empty" or e % 2 == 1] or [0]
        total = tokens - (min(37, tokens) if routing == "tail" else 0)
        cuts = sorted(rng.randrange(total + 1) for _ in range(len(live) - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [total])]
        counts = [0] * experts
        for e, s in zip(live, sizes):
            counts[e] = s
        return counts
    raise ValueError(f"routing {routing!r}: use one of {CHECK_ROUTINGS}")


def variant_text(knobs: dict) -> str:
    """A knob variant's name in files and rows (``default``: the v12 defaults)."""
    return "_".join(f"{k}{v}" for k, v in sorted(knobs.items())) or "default"


def offsets_of(counts: list[int]) -> list[int]:
    """torch._grouped_mm's offs: the cumulative end row of each expert."""
    out, run = [], 0
    for c in counts:
        run += c
        out.append(run)
    return out


def row(case: dict, correct: bool, times: dict) -> dict:
    """One result row (the issue's format): ``times`` maps each timed party to its median ms as
    kernels in CUDA graphs and as queued calls (None where it did not run)."""
    ours = times.get("ours", {})

    def ratio(peer, how):
        theirs, mine = times.get(peer, {}).get(how), ours.get(how)
        return theirs / mine if theirs and mine else None

    return {"layout": "contiguous", **case, "correct": correct,
            "ratio_to_grouped_mm": ratio("grouped_mm", "graph_ms"),
            "peer_ratios": {f"{peer}_{how.removesuffix('_ms')}": ratio(peer, how)
                            for peer in ("grouped_mm", "cublas_loop") for how in ("graph_ms", "queued_ms")},
            "times": times}


# -- prepare (build box) ----------------------------------------------------------------------------
def prepare(out) -> int:
    # optional: the build layer (TVM's compiler), on the build box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob

    folder = files.open_folder(out)
    modules = []
    for name, E, N, K in SHAPES:
        for dtype in DTYPES:
            for variant in [{}] + VARIANTS.get(name, []):
                knobs = {"experts": E, "dtype": dtype, "spec": spec_of_dtype(dtype).text(), **variant}
                path, _ = module_cache.get_or_build(BuildJob("v12", (BUILD_M, N, K), knobs))
                text = variant_text(variant)
                stem = f"grouped_{name}_{dtype}" + (f"_{text}" if variant else "")
                for src in Path(path).parent.iterdir():
                    if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
                        shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
                modules.append({"file": f"{stem}.so", "shape": name, "experts": E, "N": N, "K": K, "dtype": dtype,
                                "variant": text})
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "modules": modules})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


# -- the GPU jobs (each in a child process: gemm_ladder.measure.isolate) ------------------------------
def _inputs(E, N, K, dtype, counts, M, seed):
    """A [M, K] (M >= the counts' sum: rows past offs[-1] too), W [E, N, K] scaled to keep D near
    one, offs on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    A = torch.randn(M, K, device="cuda", generator=g, dtype=dt)
    W = torch.randn(E, N, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    offs = torch.tensor(offsets_of(counts), dtype=torch.int32, device="cuda")
    return A, W, offs


def _errors(A, W, offs_list, D, M) -> tuple[float, float, int, int]:
    """(our relative error, torch's, NaN outputs inside the experts' rows, rows past offs[-1] that
    were written) against a per-expert fp32 reference."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ours_sq = theirs_sq = ref_sq = 0.0
    nan = 0
    start = 0
    for e, end in enumerate(offs_list):
        if end > start:
            ref = A[start:end].float() @ W[e].float().T
            theirs = (A[start:end] @ W[e].T).float()
            mine = D[start:end].float()
            nan += int(torch.isnan(mine).sum())
            ours_sq += float(torch.nan_to_num(mine - ref, nan=1e30).square().sum())
            theirs_sq += float((theirs - ref).square().sum())
            ref_sq += float(ref.square().sum())
        start = end
    written_past = int((~torch.isnan(D[start:M])).any(dim=1).sum()) if start < M else 0
    norm = math.sqrt(ref_sq) or 1.0
    return math.sqrt(ours_sq) / norm, math.sqrt(theirs_sq) / norm, nan, written_past


def check_job(path, args) -> dict:
    """Every routing of CHECK_ROUTINGS on one module (and through the front door and the op), then
    the CUDA-graph replay with new offs."""

    mod = use_grouped_module(path)
    E, N, K, dtype = mod.experts, mod.N, mod.K, mod.dtype
    floor = ERROR_FLOOR[dtype]
    cases, ok_all = [], True
    for i, routing in enumerate(CHECK_ROUTINGS):
        counts = counts_of(routing, E, CHECK_TOKENS, seed=i)
        M = CHECK_TOKENS  # tail: rows past offs[-1], poisoned like the rest, must stay so
        A, W, offs = _inputs(E, N, K, dtype, counts, M, seed=i)
        D = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
        mod.launch(A, W, offs, D)
        torch.cuda.synchronize()
        rel, trel, nan, past = _errors(A, W, offsets_of(counts), D, M)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        # the front door and the torch op serve this module (registered) with the same bits
        front = gemm_ladder.grouped_mm(A, W, offs)
        op = torch.ops.gemm_ladder.grouped_mm(A, W, offs)
        end = offsets_of(counts)[-1]
        same = bool(torch.equal(front[:end], D[:end]) and torch.equal(op[:end], D[:end]))
        ok = ok and same
        ok_all &= ok
        cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                      "rows_past_offs_written": past, "front_door_and_op_same": same, "counts_head": counts[:8]})
    # one graph, three routings: offs overwritten in place between replays
    routings = ("balanced", "one", "zipf")
    A, W, offs = _inputs(E, N, K, dtype, counts_of(routings[0], E, CHECK_TOKENS), CHECK_TOKENS, seed=99)
    D = torch.full((CHECK_TOKENS, N), float("nan"), dtype=A.dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.launch(A, W, offs, D)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.launch(A, W, offs, D)
    graph_cases = []
    for j, routing in enumerate(routings):
        counts = counts_of(routing, E, CHECK_TOKENS, seed=100 + j)
        offs.copy_(torch.tensor(offsets_of(counts), dtype=torch.int32))
        D.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rel, trel, nan, past = _errors(A, W, offsets_of(counts), D, CHECK_TOKENS)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        ok_all &= ok
        graph_cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan})
    return {"status": "ok" if ok_all else "wrong", "cases": cases, "graph_replays": graph_cases}


def _grouped_mm_works(A, W, offs) -> bool:
    try:
        torch._grouped_mm(A, W.transpose(1, 2), offs=offs)  # pylint: disable=protected-access
        torch.cuda.synchronize()
        return True
    except (RuntimeError, AttributeError):
        return False


def time_job(path, args) -> dict:
    """Ours, torch._grouped_mm and the cuBLAS loop in rotating rounds, per (tokens, routing)."""

    mod = use_grouped_module(path)
    E, N, K, dtype = mod.experts, mod.N, mod.K, mod.dtype
    l2 = device.probe(0).l2_bytes or (50 << 20)
    results = []
    W = torch.randn(E, N, K, device="cuda", dtype=getattr(torch, dtype)).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    for tokens in TOKENS:
        for routing in TIMED_ROUTINGS:
            counts = counts_of(routing, E, tokens, seed=tokens)
            offs_list = offsets_of(counts)
            per_set = 2 * tokens * (K + N)  # A and D: W is shared (read every call)
            n_sets = max(2, math.ceil(2 * l2 / max(per_set + W.numel() * W.element_size(), 1)))
            sets = []
            for _ in range(n_sets):
                A = torch.randn(tokens, K, device="cuda").to(W.dtype)
                sets.append((A, torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                             torch.empty(tokens, N, dtype=W.dtype, device="cuda")))
            spans = [(e, s, t) for e, (s, t) in enumerate(zip([0] + offs_list[:-1], offs_list)) if t > s]

            def ours(A, offs, D):
                mod.launch(A, W, offs, D)

            def grouped_mm(A, offs, D):  # pylint: disable=unused-argument  (torch allocates its D)
                torch._grouped_mm(A, Wt, offs=offs)  # pylint: disable=protected-access

            def cublas_loop(A, offs, D):
                for e, s, t in spans:
                    torch.matmul(A[s:t], W[e].T, out=D[s:t])

            parties = {"ours": ours, "cublas_loop": cublas_loop}
            if _grouped_mm_works(sets[0][0], W, sets[0][1]):
                parties["grouped_mm"] = grouped_mm
            flops = 2.0 * tokens * N * K
            calls = max(len(sets), 2)
            samples = {p: {"graph": [], "queued": []} for p in parties}
            names = list(parties)
            for fn in parties.values():  # warm up, and capture each graph once
                harness.graph_times(fn, sets, reps=1, calls=calls)
            for r in range(ROUNDS):
                order = names[r % len(names):] + names[:r % len(names)]
                if r % 2:
                    order.reverse()
                for p in order:
                    samples[p]["graph"] += harness.graph_times(parties[p], sets, reps=PER_ROUND, calls=calls)
                    samples[p]["queued"] += harness.event_times(parties[p], sets, reps=PER_ROUND * calls, start=r)
            times = {p: {"graph_ms": statistics.median(s["graph"]), "queued_ms": statistics.median(s["queued"]),
                         "tflops_graph": flops / statistics.median(s["graph"]) / 1e9} for p, s in samples.items()}
            results.append({"tokens": tokens, "routing": routing, "times": times})
    return {"status": "ok", "rows": results}


# -- run (GPU box) ------------------------------------------------------------------------------------
def run(folder, out) -> int:

    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"grouped_check run: no GPU here ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        print(f"grouped_check run: {folder / PLAN_FILE} is not a {FORMAT} plan: run prepare again", file=sys.stderr)
        return 2
    sampler, start = Sampler(), time.time()
    paths = [str(folder / m["file"]) for m in plan["modules"]]
    job = "benchmarks.grouped_check:"
    try:
        checks = isolate.run_batch(job + "check_job", paths, timeout=CHECK_TIMEOUT, explain=False)
        good = [p for p, c in zip(paths, checks) if c.get("status") == "ok"]
        timed = dict(zip(good, isolate.run_batch(job + "time_job", good, timeout=TIME_TIMEOUT, explain=False)))
    finally:
        sampler.stop()
    rows = []
    for m, path, c in zip(plan["modules"], paths, checks):
        base = {"experts": m["experts"], "N": m["N"], "K": m["K"], "dtype": m["dtype"], "shape": m["shape"],
                "variant": m.get("variant", "default")}
        correct = c.get("status") == "ok"
        for case in c.get("cases", []):
            rows.append(row({**base, "tokens": CHECK_TOKENS, "routing": case["routing"], "kind": "check",
                             "rel_err": case["rel_err"], "torch_rel_err": case["torch_rel_err"]}, case["ok"], {}))
        t = timed.get(path, {})
        for r in t.get("rows", []):
            rows.append(row({**base, "tokens": r["tokens"], "routing": r["routing"], "kind": "timed"}, correct,
                            r["times"]))
        if not correct or (path in timed and t.get("status") != "ok"):
            rows.append(row({**base, "tokens": None, "routing": None, "kind": "failure",
                             "detail": json.dumps({"check": c, "time": t})[:4000]}, False, {}))
    ratios = [r["ratio_to_grouped_mm"] for r in rows if r["ratio_to_grouped_mm"] and r["variant"] == "default"]
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"modules": len(paths), "correct_modules": sum(c.get("status") == "ok" for c in checks),
                          "geomean_ratio_to_grouped_mm (default knobs)": math.exp(statistics.fmean(map(math.log, ratios)))
                          if ratios else None, "min_ratio_to_grouped_mm": min(ratios) if ratios else None},
              "checks": checks, "rows": rows}
    files.write_json(out, result)
    for r in rows:
        if r["kind"] == "timed":
            print(f"{r['shape']:11s} {r['variant']:8s} {r['dtype']:8s} tokens={r['tokens']:5d} {r['routing']:8s} "
                  f"x grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f}  x loop {r['peer_ratios']['cublas_loop_graph'] or 0:.3f}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="build box: the v12 modules of SHAPES x DTYPES into DIR")
    pr.add_argument("out")
    r = sub.add_parser("run", help="GPU box: check, capture and time every module of DIR")
    r.add_argument("folder")
    r.add_argument("--out", default="grouped_check.json")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out)
    if "grouped" not in Path(a.out).name:
        p.error(f"--out {a.out}: the results file's name must contain 'grouped' (issue 33's results format)")
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
