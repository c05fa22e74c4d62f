"""Sub-wave shapes (issue 30): the policy's module against the split-K alternatives a pack carries
beside it (``plan.alternatives``), against cuBLAS, and what the front door's measured choice at
first use picks among them, on an H100.

    PYTHONPATH=. .venv/bin/python benchmarks/subwave_check.py prepare build/subwave        # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/subwave_check.py run build/subwave --out out/subwave_check.json  # GPU box

The shapes (:data:`CASES`) are weights of the every-model suite (``measure.every_model.FAMILIES``) at
an M where the policy's grid fills fewer than half of 132 SMs with K >= 2048: the worst kernel of
the 2026-11-26 run (ViT-H's fc2 at M = 333: v9 34 us, cuBLAS 14 us), the others like it in the
held-out families, and one of Llama-8B (tuned). ``prepare`` builds their pack into ``DIR/pack``
(``build_pack`` with the shapes, alternatives on: each shape's choice and its alternatives, runtime-M
modules, through the module cache; every ``.so`` must hold its device binary) and writes the cases,
each with the files of its choice and alternatives, to ``DIR/subwave.json``. ``run`` needs the TVM
runtime and torch only:

- correctness first: every (module, M) in a child process with a deadline (the case's modules
  and every other one the front door may time for that M: ``KernelPack.serving``)
  (``measure.isolate.run_batch``: a hang or crash costs its module, a new child goes on): random
  inputs, D poisoned with NaN, checked against a float64 reference with cuBLAS's error as the
  yardstick (``suite.check_case``); a wrong module is not timed;
- then per shape, in this process, the right modules and cuBLAS in :data:`ROUNDS` rounds whose order
  alternates: as kernels (one replay of a CUDA graph of calls cycling through input sets that spill
  L2: ``harness.graph_times``) and as queued calls (``harness.event_times``; the module's own call
  against ``torch.matmul(out=)``);
- and the front door's measured choice (``gemm_ladder.use_pack(DIR/pack)``, choices kept in the
  process only): its first eager call times its candidates and torch (``first_use``), and the
  winners are what it picked (eager, and under capture); then ``matmul(A, W, out=D)`` is timed the
  same two ways beside cuBLAS (``F.linear`` for the call): ``kernel_ratio`` and ``call_ratio``.

Rows (the issue's results format): family, held_out, layer, M, N, K, dtype, correct, main_ratio and
best_alt_ratio (cuBLAS's kernel time over the module's: above 1, faster), their call ratios, the
best alternative, first_use (candidates, eager and graph winners), kernel_ratio and call_ratio (the
front door after its choice), every module's times. About 1-2 minutes on an H100 (an estimate
until its first run); DIR about 6 MiB.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.core.records import Bool, Int, List, Obj, Str, read_json  # noqa: E402

FORMAT = "gemm_ladder.subwave_check"
PLAN_FILE = "subwave.json"
PACK = "pack"
SMS = 132  # the H100 SXM the policy plans for
# (family, layer, M, dtype): each grid of the policy's choice fills < 66 SMs, K >= 2048. Since the mid-tiles rules
# (M > 128: 64-row tiles and splits that fill the wave) and swap-ab-mid (M = 129-448) these are the row-tile rule's grids
# at M = 96-128 on narrow weights; the run of 2026-11-26 timed :data:`CASES_2026_11_26`, the
# policy's 128x128 grids of then (the sub-wave sweep still times those).
CASES = (
    # (llama-3.2-1b's down at M = 256 and 192, the split-k rule's v10 then, are swap-ab-mid's v11 since 2026-11-29;
    # llama-3.2-1b's qkv, gemma-2-9b's o and llama-3.1-8b's o at M = 128 narrow-n's 32-wide tiles, 96-128 CTAs)
    ("llama-3.2-1b", "down", 112, "float16"),
    ("llama-3.2-1b", "down", 128, "float16"),  # row-tiles (64x128, no split) against split K
    ("llama-3.2-1b", "qkv", 96, "float16"),
    ("llama-3.2-1b", "qkv", 112, "float16"),
    ("llama-3.2-1b", "o", 96, "float16"),
    ("phi-3-mini", "down", 128, "float16"),
    ("phi-3-mini", "o", 96, "float16"),
    ("phi-3-mini", "down", 96, "bfloat16"),
    ("gemma-2-9b", "o", 112, "float16"),
    ("gemma-2-9b", "o", 96, "float16"),
    ("llama-3.1-8b", "o", 96, "bfloat16"),     # the family the policy was tuned on
)
CASES_2026_11_26 = (
    ("vit-h-14", "fc2", 333, "float16"),     # the every-model run's worst kernel: 0.41x cuBLAS
    ("vit-h-14", "fc2", 768, "float16"),
    ("qwen2.5-0.5b", "down", 333, "float16"),
    ("qwen2.5-0.5b", "down", 512, "float16"),
    ("llama-3.2-1b", "o", 333, "float16"),
    ("llama-3.2-1b", "down", 256, "float16"),  # the split-k rule's v10 (split 2) against split 3, 4
    ("phi-3-mini", "down", 128, "float16"),    # row-tiles (64x128, no split) against split K
    ("gemma-2-9b", "o", 192, "float16"),
    ("bert-large", "fc2", 512, "float16"),
    ("gpt2", "fc2", 333, "float16"),
    ("llama-3.1-8b", "o", 256, "bfloat16"),    # the family the policy was tuned on
)
CHECK_TIMEOUT = 60.0
ROUNDS, PER_ROUND = 6, 4
GRAPH_US = 300.0  # a timed replay lasts at least this long
CUBLAS = "cublas"
FRONT = "front"

CASE_SCHEMA = Obj({"family": Str(), "layer": Str(), "held_out": Bool(), "M": Int(lo=1), "N": Int(lo=1),
                   "K": Int(lo=1), "dtype": Str(), "main": Str(), "alternatives": List(Str())})
PLAN_SCHEMA = Obj({"format": Str([FORMAT]), "cases": List(CASE_SCHEMA, min_len=1)})


# -- the cases and the rows (no GPU: the arithmetic) -------------------------------------------------
def case_list(cases=CASES) -> list[dict]:
    """``cases`` (default :data:`CASES`) with their weights' N and K and whether the family is held out."""
    # the suite's families (pure data)
    from gemm_ladder.measure.every_model import FAMILIES  # pylint: disable=import-outside-toplevel

    out = []
    for fam, layer, M, dtype in cases:
        N, K = FAMILIES[fam]["weights"][layer]
        out.append({"family": fam, "layer": layer, "held_out": FAMILIES[fam]["held_out"], "M": M, "N": N, "K": K,
                    "dtype": dtype})
    return out


def with_modules(case: dict, entries: list[dict]) -> dict:
    """The case with the files of the pack's entries that serve its M and weight: ``main`` (the
    policy's choice) and ``alternatives``; ValueError where the pack holds no choice or no
    alternative for it (the check would have nothing to compare)."""
    mine = [e for e in entries if (e["shape"][1], e["shape"][2], e["dtype"]) == (case["N"], case["K"], case["dtype"])
            and e["m_range"][0] <= case["M"] <= e["m_range"][1]]
    main = [e["file"] for e in mine if not e.get("alternative")]
    alts = list(dict.fromkeys(e["file"] for e in mine if e.get("alternative")))
    what = f"{case['M']}x{case['N']}x{case['K']} {case['dtype']}"
    if len(main) != 1 or not alts:
        raise ValueError(f"{what}: the pack holds {len(main)} modules of the policy's choice and {len(alts)} "
                         "alternatives for it (want 1 and at least 1): is the shape sub-wave (plan.sub_wave)?")
    return {**case, "main": main[0], "alternatives": alts}


def ratio(theirs, ours):
    return theirs / ours if theirs and ours else None


def make_row(case: dict, checks: dict, times: dict | None, picked: dict | None) -> dict:
    """One result row. ``checks``: file -> the check's result; ``times``: label (a file,
    :data:`CUBLAS`, :data:`FRONT`, ``linear``) -> ``{"kernel_ms", "call_ms"}`` (None: not timed);
    ``picked``: the front door's first use (``eager``, ``graphs``, ``candidates``)."""
    files_ = [case["main"], *case["alternatives"]]
    correct = all(checks.get(f, {}).get("ok") for f in files_)
    times = times or {}
    cub = times.get(CUBLAS, {})

    def r(label, kind):
        t = times.get(label)
        return ratio(cub.get(f"{kind}_ms") if kind == "kernel" else times.get("linear", {}).get("call_ms"),
                     t and t.get(f"{kind}_ms"))

    alts = {f: r(f, "kernel") for f in case["alternatives"] if r(f, "kernel")}
    best_alt = max(alts, key=alts.get) if alts else None
    row = {k: case[k] for k in ("family", "held_out", "layer", "M", "N", "K", "dtype", "main", "alternatives")}
    row.update(correct=correct, checks={f: checks.get(f) for f in files_},
               main_ratio=r(case["main"], "kernel"), main_call_ratio=r(case["main"], "call"),
               best_alt=best_alt, best_alt_ratio=alts.get(best_alt),
               best_alt_call_ratio=r(best_alt, "call") if best_alt else None,
               alt_over_main=ratio(r(best_alt, "kernel"), r(case["main"], "kernel")) if best_alt else None,
               first_use=picked, kernel_ratio=ratio(cub.get("kernel_ms"), times.get(FRONT, {}).get("kernel_ms")),
               call_ratio=ratio(times.get("linear", {}).get("call_ms"), times.get(FRONT, {}).get("call_ms")),
               times=times)
    if picked:  # what the measurement chose, scored by the kernels' own timings
        row["picked_alternative"] = picked.get("graphs") in case["alternatives"] or picked.get("eager") in case["alternatives"]
    return row


def _geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict]) -> dict:
    """Geomeans of the main module's, the best alternative's and the front door's ratios (kernel
    and call), and how often an alternative beat the main module and was picked."""
    out = {}
    for name, part in (("held_out", [r for r in rows if r["held_out"]]), ("all", rows)):
        out[name] = {"rows": len(part), "correct": sum(r["correct"] for r in part),
                     "geomean_main_ratio": _geomean(r["main_ratio"] for r in part),
                     "geomean_best_alt_ratio": _geomean(r["best_alt_ratio"] for r in part),
                     "geomean_best_of_both": _geomean(max(filter(None, (r["main_ratio"], r["best_alt_ratio"])),
                                                          default=None) for r in part),
                     "geomean_kernel_ratio": _geomean(r["kernel_ratio"] for r in part),
                     "geomean_call_ratio": _geomean(r["call_ratio"] for r in part),
                     "min_kernel_ratio": min((r["kernel_ratio"] for r in part if r["kernel_ratio"]), default=None),
                     "alt_beats_main": sum((r["alt_over_main"] or 0) > 1 for r in part),
                     "alternative_picked": sum(bool(r.get("picked_alternative")) for r in part)}
    return out


def table(rows: list[dict]) -> str:
    from gemm_ladder.measure.report import table as fmt  # pylint: disable=import-outside-toplevel

    def f3(x):
        return f"{x:.3f}" if x is not None else "-"

    out = [{"shape": f"{r['M']}x{r['N']}x{r['K']}" + (" *" if r["held_out"] else ""), "family": r["family"],
            "ok": "yes" if r["correct"] else "NO", "main x cuBLAS": f3(r["main_ratio"]),
            "best alt x cuBLAS": f3(r["best_alt_ratio"]), "picked (graphs)": _short((r["first_use"] or {}).get("graphs")),
            "kernel": f3(r["kernel_ratio"]), "call": f3(r["call_ratio"])} for r in rows]
    return fmt(out, list(out[0])) + "\n(* held out)" if out else "no rows"


def _short(file) -> str:
    if not file:
        return "-"
    if file == "torch":
        return "torch"
    split = file.split("splitk")[1][:1] if "splitk" in file else "1"
    return f"{file.split('_')[0]} split {split}"


# -- prepare (build box) -------------------------------------------------------------------------
def prepare(out) -> int:
    # the build layer: this box's TVM compiler
    from gemm_ladder.compile.sass import has_device_binary  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import kernel_pack  # pylint: disable=import-outside-toplevel

    out = Path(out)
    files.open_folder(out)
    cases = case_list()
    by_dtype: dict = {}
    for c in cases:
        by_dtype.setdefault(c["dtype"], []).append((c["M"], c["N"], c["K"]))
    failed, modules = [], []
    for dtype, shapes in by_dtype.items():
        man = kernel_pack.build_pack(out / PACK, shapes, [dtype], sms=SMS,
                                     request={"shapes": ["x".join(map(str, s)) for s in shapes], "dtypes": [dtype],
                                              "alternatives": True, "by": "benchmarks/subwave_check.py"})
        failed += [r for r in man["results"] if r["status"] == "failed"]
        modules = man["modules"]  # the manifest merges: the last holds every entry
    for r in failed:
        print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
    no_binary = [e["file"] for e in modules if not has_device_binary((out / PACK / e["file"]).read_bytes())]
    for f in no_binary:
        print(f"{f}: no device binary in the exported module (built without the fake libcuda?)", file=sys.stderr)
    planned = [with_modules(c, modules) for c in cases]
    files.write_json(out / PLAN_FILE, {"format": FORMAT, "cases": planned})
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len({e['file'] for e in modules})} modules, {size / 2**20:.1f} MiB in {out}; {len(planned)} shapes, "
          f"{sum(len(c['alternatives']) for c in planned)} alternatives")
    return 1 if failed or no_binary else 0


# -- run (GPU box) -------------------------------------------------------------------------------
def _plan(folder) -> dict:
    fix = f"run benchmarks/subwave_check.py prepare {folder} on the build box and carry the folder here"
    return read_json(Path(folder) / PLAN_FILE, "subwave check plan", fix, PLAN_SCHEMA)


def check_module(file_at_m: str, args) -> dict:
    """One module at one M in an isolate child (``measure.isolate``'s ``module:function`` job)."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness, suite  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.kernel_pack import KernelPack  # pylint: disable=import-outside-toplevel

    file, _, M = file_at_m.rpartition("@")
    pack = KernelPack(Path(args[0]) / PACK)
    entry = next(e for e in pack.modules if e["file"] == file)
    mod = pack.load(entry)
    M, N, K, dtype = int(M), entry["shape"][1], entry["shape"][2], entry["dtype"]
    A, B = harness.random_inputs(M, N, K, dtype, seed=M + N + K)
    D = torch.full((M, N), float("nan"), dtype=A.dtype, device=A.device)
    mod(A, B, out=D)
    torch.cuda.synchronize()
    return {"status": "ok", **suite.check_case(A, B, D, dtype)}


def pool_of(case: dict, serving: list[str]) -> list[str]:
    """The files a case checks: its choice, its alternatives, and every other module the front
    door may time for its M (``serving``: ``KernelPack.serving``'s files), each once."""
    return list(dict.fromkeys([case["main"], *case["alternatives"], *serving]))


def check_all(folder, pools: list) -> dict:
    """``"file@M"`` -> the check's result, for every module of every case's pool (``pools``: one
    ``(M, files)`` a case), in isolate children."""
    # the GPU side (TVM runtime, torch): imported where it runs, as the other checks do
    from gemm_ladder.measure import isolate  # pylint: disable=import-outside-toplevel

    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])  # the child imports us
    todo = list(dict.fromkeys(f"{f}@{M}" for M, pool in pools for f in pool))
    results = isolate.run_batch("subwave_check:check_module", todo, [str(folder)], timeout=CHECK_TIMEOUT,
                                explain=False)
    out = {}
    for it, res in zip(todo, results):
        res = {**res, "ok": res.get("status") == "ok" and bool(res.get("ok"))}
        out[it] = res
        print(f"check {it}: {'ok' if res['ok'] else 'FAIL'} err {res.get('rel_err')} (cuBLAS "
              f"{res.get('cublas_rel_err')}) {str(res.get('detail', ''))[:300]}", flush=True)
    return out


def _label(mod) -> str:
    """A front-door module's name: its file, or ``torch`` for torch's own matmul."""
    path = getattr(mod, "path", "")
    return Path(path).name if path else "torch"


def first_use_pick(case: dict, folder) -> dict:
    """The front door's measured choice for the case: its candidates, then its first eager call
    (which times them, as first_use does) and the winners it kept."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import front  # pylint: disable=import-outside-toplevel

    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    route = front.route_of(M, N, K, dtype)
    candidates = sorted(route.candidates)
    A, B = harness.random_inputs(M, N, K, dtype, seed=11)
    D = torch.empty((M, N), dtype=A.dtype, device=A.device)
    gemm_ladder.matmul(A, B, out=D, explain=True)  # the first eager call: measures, adopts the winners
    torch.cuda.synchronize()
    mod = route.module  # the route is the one the front door keeps (route_of: the same object)
    eager, graphs = (mod.eager, mod.graphs) if isinstance(mod, front.ByCapture) else (mod, mod)
    return {"candidates": candidates, "eager": _label(eager), "graphs": _label(graphs), "explain": list(route.lines)}


def time_case(case: dict, loaded: dict) -> dict:
    """The case's right modules, cuBLAS and the front door (after its choice) in rounds whose order
    alternates: kernel_ms (CUDA graphs cycling input sets that spill L2) and call_ms (queued calls)."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    sets = harness.input_sets(M, N, K, dtype, l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
    # a module's kernel alone: its launcher (checked once, as m_range_check captures them); its
    # call: the module's own host path; the front door and cuBLAS the same function both ways
    launchers = {f: m.launcher(*sets[0]) for f, m in loaded.items()}
    kernels = {f: (lambda a, b, d, fn=fn: fn(a, b, d)) for f, fn in launchers.items()}
    kernels[CUBLAS] = lambda a, b, d: torch.matmul(a, b.T, out=d)
    kernels[FRONT] = lambda a, b, d: gemm_ladder.matmul(a, b, out=d)
    calls = {f: (lambda a, b, d, m=m: m(a, b, out=d)) for f, m in loaded.items()}
    calls_only = {"linear": lambda a, b, d: F.linear(a, b)}
    rough = {}
    for n, fn in {**kernels, **calls_only}.items():
        (calls.get(n) or fn)(*sets[0])
        rough[n] = statistics.median(harness.event_times(fn, sets, 3))
    graph_calls = {n: max(len(sets), min(harness.GRAPH_CALLS, math.ceil(GRAPH_US / 1e3 / max(ms, 1e-6))))
                   for n, ms in rough.items()}
    names = list(kernels) + list(calls_only)
    graph, call = {n: [] for n in names}, {n: [] for n in names}
    t0 = time.time()
    for r in range(ROUNDS):
        for n in (names if r % 2 == 0 else names[::-1]):
            if n in kernels:
                graph[n] += harness.graph_times(kernels[n], sets, PER_ROUND, graph_calls[n])
            fn = calls.get(n) or kernels.get(n) or calls_only[n]
            call[n] += harness.event_times(fn, sets, PER_ROUND * 4)
    t1 = time.time()
    del sets
    torch.cuda.empty_cache()
    return {"times": {n: {"kernel_ms": statistics.median(graph[n]) if graph[n] else None,
                          "call_ms": statistics.median(call[n])} for n in names}, "t0": t0, "t1": t1}


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"subwave_check run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import first_use, front  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.kernel_pack import KernelPack  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    cases = _plan(folder)["cases"]
    os.environ[first_use.CHOICES_ENV] = "off"  # every first use measures here, none remembered
    os.environ.pop(first_use.MEASURE_ENV, None)
    start, sampler = time.time(), Sampler()
    rows = []
    try:
        pack = KernelPack(folder / PACK)
        pools = [(c["M"], pool_of(c, [f.entry["file"] for f in pack.serving(c["M"], c["N"], c["K"], c["dtype"],
                                                                             device.arch_of(0))]))
                 for c in cases]
        checks = check_all(folder, pools)
        front.reset()
        front.use_pack(folder / PACK)
        for case, (_, pool) in zip(cases, pools):
            mine = {f: checks.get(f"{f}@{case['M']}", {}) for f in [case["main"], *case["alternatives"]]}
            others = [f for f in pool if f not in mine and not checks.get(f"{f}@{case['M']}", {}).get("ok")]
            if not all(c.get("ok") for c in mine.values()) or others:
                # a wrong module is timed nowhere, not even by the front door's first use
                row = make_row(case, mine, None, None)
                row["wrong_in_pool"] = others
                rows.append(row)
                continue
            loaded = {f: pack.load(next(e for e in pack.modules if e["file"] == f)) for f in mine}
            picked = first_use_pick(case, folder)
            timed = time_case(case, loaded)
            row = make_row(case, mine, timed["times"], picked)
            row["clocks"] = sampler.between(timed["t0"], timed["t1"])
            rows.append(row)
            print(f"{case['M']}x{case['N']}x{case['K']} {case['dtype']}: main {row['main_ratio'] or 0:.3f}, best alt "
                  f"{row['best_alt_ratio'] or 0:.3f} x cuBLAS; first use picked {picked['eager']} / {picked['graphs']}: "
                  f"kernel {row['kernel_ratio'] or 0:.3f}, call {row['call_ratio'] or 0:.3f}", flush=True)
    finally:
        sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "rounds": ROUNDS, "per_round": PER_ROUND, "summary": summary(rows), "rows": rows}
    check_cli.write_result(out, result)
    print(table(rows))
    print(f"{sum(r['correct'] for r in rows)} of {len(rows)} shapes correct; {result['seconds']:.0f} s; wrote {out}")
    return 0 if all(r["correct"] for r in rows) else 1


def main(argv=None) -> int:
    p, _, _, _ = check_cli.subcommands(__doc__, "build box: the pack of the sub-wave shapes with their alternatives",
                                       "GPU box: check every module, then time main vs alternatives vs cuBLAS",
                                       "subwave_check.json")
    a = p.parse_args(argv)
    return prepare(a.out) if a.cmd == "prepare" else run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
