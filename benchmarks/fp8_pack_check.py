"""fp8 from a kernel pack (issue 32) on an H100: ``scaled_mm`` served by ``pack build --dtypes
float8_e4m3`` modules on a box with no TVM compiler, checked and timed against torch._scaled_mm.

    PYTHONPATH=. .venv/bin/python benchmarks/fp8_pack_check.py prepare build/fp8_pack       # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/fp8_pack_check.py run build/fp8_pack --out out/fp8_pack_check.json  # GPU box

``prepare`` builds the pack of :data:`WEIGHTS` (each recipe of :data:`RECIPES`, or of ``--recipes``
such as ``block``, without and with a
bf16 bias: one runtime-M module each, through the module cache, as ``pack build`` does) into
``DIR/pack`` and writes the cases to ``DIR/fp8_pack.json``. ``prepare --suite`` builds the fp8 column of
the suite instead: :data:`SUITE_WEIGHTS` (DeepSeek-V3's and Llama-3-8B's), no bias, every M of
:data:`SUITE_MS` timed, and ``run`` ends with each recipe's geomean and lowest ratio (``summary``). ``run`` needs the TVM runtime and torch:

- correctness first, each case in a child process with a deadline (``measure.isolate.run_batch``:
  a hang or crash costs its case, a new child goes on): ``gemm_ladder.use_pack(DIR/pack)``, then
  ``scaled_mm(..., strict=True, explain=True)`` at odd M (1, 77, 1000) and at M = 4096, 8192 on random
  bf16 inputs quantized with ``quantize_fp8``, into a D poisoned with NaN; the error against a
  float64 product of the dequantized inputs, with ``torch._scaled_mm``'s own error on the same
  inputs as the yardstick (within 2x, no NaN), and ``explain`` must name the pack's module (strict
  mode: a call no pack module serves raises instead of falling back to torch);
- then, in this process, the timed cases whose checks all passed: ``scaled_mm`` through the pack
  in strict mode (our kernel, the front door's whole path), ``torch._scaled_mm``, and ``scaled_mm``
  as users call it (``front_door``: not strict, so its first call times our kernel against torch's
  and keeps the faster, ``serve.scaled._settle``; remembered in this process only), in rounds whose
  order rotates, as queued calls and as kernels in CUDA graphs cycling input sets that spill L2
  (``harness.event_times``/``graph_times``); the GPU's clocks and power sampled throughout.

``prepare --bf16`` also puts the front door's bf16 modules of the timed squares (4096^3, 8192^3) in the
pack, and ``run`` times ``gemm_ladder.matmul`` on bf16 inputs there beside the rest (``ours_bf16``: our bf16
kernel's time over our fp8 kernel's in ``peer_ratios``, issue 32's fp8-over-bf16 target).

Rows (the issue's results format): recipe, M, N, K, correct, tflops (ours, in graphs),
ratio_to_scaled_mm and peer_ratios (torch's time over our kernel's), the pack module and explain lines;
``front_door``: torch's time over the front door's, as kernels and as calls, and what its first use chose.
About 1-2 minutes on an H100 (an estimate until its first run); DIR about 2 MiB.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fp8_check  # noqa: E402  (a sibling script: inputs, references and the pass rule)
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402
from gemm_ladder.serve import first_use  # noqa: E402

FORMAT = "gemm_ladder.fp8_pack_check"
PLAN_FILE = "fp8_pack.json"
PACK = "pack"
WEIGHTS = ((3008, 1024), (4096, 4096), (8192, 8192))  # N x K: an N off the 128-column tile, squares (8192: fp8-wide)
RECIPES = ("tensor", "row")  # the default; ``prepare --recipes`` may name block too (a pack builds it where asked)
ALL_RECIPES = ("tensor", "row", "block")
BIASES = (None, "bfloat16")  # a bias in D's dtype: what a pack's fp8 modules take (--epilogue bias)
CHECK_MS = (1, 77, 1000, 4096, 8192)
# ``prepare --suite``: the fp8 column of the suite (issue 32's "fp8 suite"), weights of DeepSeek-V3 (DeepGEMM's
# published N x K: 2112x7168, 24576x1536, 7168x16384) and Llama-3-8B (qkv 6144x4096, down 4096x14336), no bias,
# every M of SUITE_MS timed (M = 1, 200 and 333 checked only). M = 320-768 joined after the rules' 2x1 clusters
# were found to add a wave at an odd row of 128-row tiles (0.36x torch._scaled_mm at 320x4096x14336:
# plan.fp8_tile_cluster): 320, 384 and 640 are three and five rows of tiles, 512 and 768 pack buckets' tops.
SUITE_WEIGHTS = ((2112, 7168), (24576, 1536), (7168, 16384), (6144, 4096), (4096, 14336))
SUITE_MS = (64, 256, 320, 384, 512, 640, 768, 1024, 4096)
SUITE_CHECK_MS = (1, 200, 333) + SUITE_MS  # 200: an odd M of the split-K bucket (129..256)
TIMED_MS = {(3008, 1024): 1000, (4096, 4096): 4096, (8192, 8192): 8192}
CHECK_TIMEOUT = 60.0
ROUNDS, PER_ROUND = 6, 8


def case_name(N: int, K: int, recipe: str, bias) -> str:
    return f"{recipe}_{N}x{K}" + ("_bias" if bias else "")


def weight_arg(text: str) -> tuple:
    """``--weights``: a comma-separated subset of :data:`WEIGHTS` as NxK (a smaller pack, built sooner)."""
    chosen = []
    for part in text.split(","):
        try:
            N, K = (int(x) for x in part.strip().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not NxK; use for example 3008x1024") from None
        if (N, K) not in WEIGHTS:
            raise argparse.ArgumentTypeError(f"{part!r} is not one of this check's weights "
                                             f"({', '.join(f'{n}x{k}' for n, k in WEIGHTS)})")
        chosen.append((N, K))
    return tuple(chosen)


def recipe_arg(text: str) -> tuple:
    """``--recipes``: a comma-separated subset of :data:`ALL_RECIPES`."""
    chosen = tuple(part.strip() for part in text.split(","))
    bad = [r for r in chosen if r not in ALL_RECIPES]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: the recipes are {', '.join(ALL_RECIPES)} (comma-separated)")
    return chosen


def cases(weights=WEIGHTS, recipes=RECIPES, suite: bool = False) -> list[dict]:
    """Every correctness case (weight x recipe x bias x M), and the timed ones (no bias, one M each);
    ``suite``: :data:`SUITE_WEIGHTS` with no bias, checked at :data:`SUITE_CHECK_MS`, timed at every M of
    :data:`SUITE_MS`."""
    out = []
    if suite:
        for (N, K) in SUITE_WEIGHTS:
            for recipe in recipes:
                for M in SUITE_CHECK_MS:
                    out.append({"name": case_name(N, K, recipe, None), "M": M, "N": N, "K": K, "recipe": recipe,
                                "bias": None, "timed": M in SUITE_MS})
        return out
    for (N, K) in weights:
        for recipe in recipes:
            for bias in BIASES:
                for M in CHECK_MS:
                    out.append({"name": case_name(N, K, recipe, bias), "M": M, "N": N, "K": K, "recipe": recipe,
                                "bias": bias, "timed": bias is None and M == TIMED_MS[(N, K)]})
    return out


def item(case: dict) -> str:
    """A case as the isolate child's item (no path separators, no commas): NAME@M."""
    return f"{case['name']}@{case['M']}"


def passes_case(res: dict) -> bool:
    """A check passes: within 2x torch's error, no NaN left, served by the pack, and the repeated
    calls gave the same bits (:func:`repeat_check`)."""
    return (res.get("status") == "ok" and not res.get("nan") and bool(res.get("from_pack"))
            and fp8_check.passes(res["rel_err"], res["torch_rel_err"])
            and res.get("repeat", {}).get("same_bits") is True)


def make_row(case: dict, times: dict | None, checks: list[dict]) -> dict:
    """The result row of a timed case: ``times`` maps ``ours`` / ``torch_scaled_mm`` to
    ``{"kernel_ms", "call_ms"}`` (None: not timed, its checks failed)."""
    mine = [c for c in checks if c.get("name") == case["name"]]
    correct = bool(mine) and all(c.get("correct") for c in mine)
    row = {"recipe": case["recipe"], "M": case["M"], "N": case["N"], "K": case["K"], "module": case["name"],
           "correct": correct, "tflops": None, "ratio_to_scaled_mm": None, "peer_ratios": {}}
    if times and "front_door" in times and "torch_scaled_mm" in times:
        door, peer = times["front_door"], times["torch_scaled_mm"]
        row["front_door"] = {"kernel_ratio": fp8_check.ratio(peer["kernel_ms"], door["kernel_ms"]),
                             "call_ratio": fp8_check.ratio(peer["call_ms"], door["call_ms"])}
    if times:
        ours = times["ours"]
        row.update(tflops=fp8_check.tflops(case["M"], case["N"], case["K"], ours["kernel_ms"]), times=times)
        if "torch_scaled_mm" in times:  # absent where this torch refused the case (time_case's left_out)
            peer = times["torch_scaled_mm"]
            row.update(ratio_to_scaled_mm=fp8_check.ratio(peer["kernel_ms"], ours["kernel_ms"]),
                       peer_ratios={"torch_scaled_mm": fp8_check.ratio(peer["kernel_ms"], ours["kernel_ms"])},
                       call_ratio_to_scaled_mm=fp8_check.ratio(peer["call_ms"], ours["call_ms"]))
        if "ours_bf16" in times:  # our bf16 kernel's time over our fp8 kernel's (issue 32: >= 1.7 at 8192^3)
            row["peer_ratios"]["ours_bf16"] = fp8_check.ratio(times["ours_bf16"]["kernel_ms"], ours["kernel_ms"])
    return row


# -- prepare (build box) -------------------------------------------------------------------------
def prepare(out, weights=WEIGHTS, recipes=RECIPES, suite: bool = False, bf16: bool = False) -> int:
    # the build layer: this box's TVM compiler
    from gemm_ladder.serve import kernel_pack  # pylint: disable=import-outside-toplevel

    out = Path(out)
    files.open_folder(out)
    weights = SUITE_WEIGHTS if suite else weights
    man = kernel_pack.build_pack(out / PACK, [], [kernel_pack.FP8_INPUT], sms=132, weights=list(weights),
                                 epilogues=("none",) if suite else ("none", "bias"), fp8_scales=recipes, fp8_out=("bfloat16",),
                                 request={"weights": [f"{N}x{K}" for N, K in weights], "dtypes": ["float8_e4m3"],
                                          "fp8_scales": list(recipes), "by": "benchmarks/fp8_pack_check.py"})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    squares = [(TIMED_MS[w], *w) for w in weights if bf16 and w[0] == w[1] and w in TIMED_MS]
    if squares:  # the front door's bf16 modules of the timed squares, into the same pack (issue 32's 1.7x)
        more = kernel_pack.build_pack(out / PACK, squares, ["bfloat16"], sms=132,
                                      request={"shapes": [f"{M}x{N}x{K}" for M, N, K in squares],
                                               "dtypes": ["bfloat16"], "by": "benchmarks/fp8_pack_check.py --bf16"})
        failed += [r for r in more["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
    files.write_json(out / PLAN_FILE, {"format": FORMAT, "suite": suite, "cases": cases(weights, recipes, suite),
                                       "bf16": [[M, N, K] for M, N, K in squares]})
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len({e['file'] for e in man['modules']})} modules, {size / 2**20:.1f} MiB in {out}; "
          f"{len(cases(weights, recipes, suite))} cases")
    return 1 if failed else 0


# -- run (GPU box) -------------------------------------------------------------------------------
_PACKS: dict = {}


def _plan(folder) -> dict:
    fix = f"run benchmarks/fp8_pack_check.py prepare {folder} on the build box and carry the folder here"
    return read_json(Path(folder) / PLAN_FILE, "fp8 pack check plan", fix)


def _use_pack(folder) -> None:
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    if folder not in _PACKS:
        _PACKS[folder] = gemm_ladder.use_pack(Path(folder) / PACK)


def check_case(name_at_m: str, args) -> dict:
    """One correctness case in an isolate child (``measure.isolate``'s ``module:function`` job)."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    folder = args[0]
    name, _, M = name_at_m.rpartition("@")
    case = next(c for c in _plan(folder)["cases"] if c["name"] == name and c["M"] == int(M))
    _use_pack(folder)
    M, N, K, recipe, bias = case["M"], case["N"], case["K"], case["recipe"], case["bias"]
    aq, wq, sa, sb, b = fp8_check.inputs(M, N, K, recipe, bias, seed=M + N + K)
    d = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    try:
        _, lines = gemm_ladder.scaled_mm(aq, wq.t(), sa, sb, bias=b, out=d, explain=True, strict=True)
    except Exception as err:  # pylint: disable=broad-except  (NoKernelError: the pack did not serve it)
        return {"name": name, "M": M, "status": "error", "correct": False, "error": f"{type(err).__name__}: {err}"}
    if recipe == "block":  # torch's block-wise _scaled_mm, or bf16 on the dequantized inputs with a bias
        ref_t, _ = fp8_check.block_yardstick(aq, wq, sa, sb, b)
    else:
        ref_t = fp8_check.torch_scaled(aq, wq, sa, sb, b, recipe)
    torch.cuda.synchronize()
    a64, w64 = fp8_check.dequantized(aq, wq, sa, sb, recipe)
    ref = a64 @ w64.t()
    if b is not None:
        ref = ref + b.double()
    top = ref.abs().max().item() or 1.0
    res = {"name": name, "M": M, "status": "ok", "rel_err": ((d.double() - ref).abs().max() / top).item(),
           "torch_rel_err": ((ref_t.double() - ref).abs().max() / top).item(), "nan": bool(torch.isnan(d).any()),
           "from_pack": any(line.startswith("source: kernel pack") for line in lines), "explain": lines,
           "repeat": repeat_check(aq, wq, sa, sb, b, d)}
    res["correct"] = passes_case(res)
    return res


def repeat_check(aq, wq, sa, sb, b, d) -> dict:
    """The same call repeated as users repeat it (``scaled_mm``'s remembered calls: the Python lookup,
    then the C++ table where it is loaded), into ``out`` poisoned with NaN and into a new D: each must
    give the checked call's bits ``d``. Says which tables held the call."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import scaled  # pylint: disable=import-outside-toplevel

    same = []
    for use_out in (True, True, True, False, False, False):
        out = torch.full_like(d, float("nan")) if use_out else None
        got = gemm_ladder.scaled_mm(aq, wq.t(), sa, sb, bias=b, out=out, strict=True)
        same.append(bool(torch.equal(got, d)) and (got is out) == use_out)
    table = scaled._NATIVE["module"]  # pylint: disable=protected-access
    return {"same_bits": all(same), "calls": len(same),
            "python_entries": len(scaled._FAST),  # pylint: disable=protected-access
            "native_entries": table.scaled_size() if table is not None else None}


def check_all(folder) -> list[dict]:
    # the GPU side (TVM runtime, torch): imported where it runs, as the other checks do
    from gemm_ladder.measure import isolate  # pylint: disable=import-outside-toplevel

    # the child imports this script by name: benchmarks/ on its path
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    todo = [item(c) for c in _plan(folder)["cases"]]  # the cases prepare wrote (its --weights)
    results = isolate.run_batch("fp8_pack_check:check_case", todo, [str(folder)], timeout=CHECK_TIMEOUT,
                                explain=False)
    out = []
    for it, res in zip(todo, results):
        name, _, M = it.rpartition("@")
        res = {"name": name, "M": int(M), "correct": False, **res}
        out.append(res)
        print(f"check {it}: {'ok' if res.get('correct') else 'FAIL'} err {res.get('rel_err')} "
              f"(torch {res.get('torch_rel_err')}) repeat {res.get('repeat')} "
              f"{res.get('error', res.get('detail', ''))[:300]}", flush=True)
    return out


def time_case(case: dict, bf16=()) -> dict:
    """scaled_mm through the pack against torch._scaled_mm on input sets that spill L2 three times,
    in rounds whose order alternates, as kernels (CUDA graphs) and as queued calls."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    M, N, K, recipe = case["M"], case["N"], case["K"], case["recipe"]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = []
    for i in range(max(2, math.ceil(3 * l2 / (M * K + N * K + 2 * M * N)))):
        aq, wq, sa, sb, _ = fp8_check.inputs(M, N, K, recipe, None, seed=100 + i)
        sets.append((aq, wq, sa, sb, torch.empty((M, N), dtype=torch.bfloat16, device="cuda")))
    peer = fp8_check._scaled_mm_peer(recipe, False)  # pylint: disable=protected-access
    kernels = {"ours": lambda a, w, sa, sb, d: gemm_ladder.scaled_mm(a, w.t(), sa, sb, out=d, strict=True),
               "torch_scaled_mm": peer,
               "front_door": lambda a, w, sa, sb, d: gemm_ladder.scaled_mm(a, w.t(), sa, sb, out=d, strict=False)}
    sets_of = {}
    if [M, N, K] in bf16:  # our bf16 kernel at the shape, on bf16 inputs of its own (the pack's bf16 module)
        sets_of["ours_bf16"] = [(torch.randn(M, K, device="cuda").to(torch.bfloat16),
                                 torch.randn(N, K, device="cuda").to(torch.bfloat16),
                                 torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
                                for _ in range(max(2, math.ceil(3 * l2 / (2 * (M * K + N * K + M * N)))))]
        kernels["ours_bf16"] = lambda a, w, d: gemm_ladder.matmul(a, w, out=d, strict=True)
        kernels["ours_bf16"](*sets_of["ours_bf16"][0])
    # the first call resolves and loads (outside any capture); a peer this torch refuses here (block-wise
    # at an N off its 128-column blocks) is left out with its message, ours timed alone; the front door's
    # first call times its candidates (first use) and says what it chose
    kernels["ours"](*sets[0])
    aq, wq, sa, sb, d = sets[0]
    door = torch.full_like(d, float("nan"))
    chose = gemm_ladder.scaled_mm(aq, wq.t(), sa, sb, out=door, strict=False, explain=True)[1]
    # the front door's D is our kernel's bits or torch's, whichever its first use chose
    kernels["ours"](*sets[0])
    matches = [name for name, want in (("ours", d), ("torch_scaled_mm", peer(*sets[0]))) if torch.equal(door, want)]
    left_out = fp8_check.drop_failing({"torch_scaled_mm": (peer, sets)})
    kernels = {n: fn for n, fn in kernels.items() if n not in left_out}
    torch.cuda.synchronize()
    names = list(kernels)
    graph, call = {n: [] for n in names}, {n: [] for n in names}
    t0 = time.time()
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            ss = sets_of.get(n, sets)
            graph[n] += harness.graph_times(kernels[n], ss, PER_ROUND, max(8, len(ss)))
            call[n] += harness.event_times(kernels[n], ss, PER_ROUND)
    return {"times": {n: {"kernel_ms": statistics.median(graph[n]), "call_ms": statistics.median(call[n])}
                      for n in names}, "t0": t0, "t1": time.time(), "input_sets": len(sets), "left_out": left_out,
            "front_door_explain": chose, "front_door_matches": matches}


def summary(rows: list[dict]) -> dict:
    """Per recipe: how many timed rows, how many correct, and the geometric mean and lowest of their
    kernel and call ratios to torch._scaled_mm (rows with no ratio, torch refusing the case, left out)."""
    out = {}
    for recipe in sorted({r["recipe"] for r in rows}):
        mine = [r for r in rows if r["recipe"] == recipe]
        entry = {"rows": len(mine), "correct": sum(1 for r in mine if r["correct"])}
        for name, get in (("kernel", lambda r: r.get("ratio_to_scaled_mm")),
                          ("call", lambda r: r.get("call_ratio_to_scaled_mm")),
                          ("front_door_kernel", lambda r: r.get("front_door", {}).get("kernel_ratio")),
                          ("front_door_call", lambda r: r.get("front_door", {}).get("call_ratio"))):
            vals = [get(r) for r in mine if get(r)]
            entry[f"{name}_geomean"] = math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None
            entry[f"{name}_min"] = min(vals) if vals else None
        out[recipe] = entry
    return out


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"fp8_pack_check run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    _plan(folder)  # a folder prepare made (a clear error otherwise)
    os.environ[first_use.CHOICES_ENV] = "off"  # the front door's first use measures in this run, remembers nothing
    start, sampler = time.time(), Sampler()
    rows, checks = [], []
    try:
        checks = check_all(folder)
        _use_pack(str(folder))
        for case in (c for c in _plan(folder)["cases"] if c["timed"]):
            row = make_row(case, None, checks)
            if row["correct"]:
                timed = time_case(case, _plan(folder).get("bf16", []))
                row = make_row(case, timed["times"], checks)
                row.update(clocks=sampler.between(timed["t0"], timed["t1"]), input_sets=timed["input_sets"],
                           peers_left_out=timed["left_out"], front_door_explain=timed["front_door_explain"],
                           front_door_matches=timed["front_door_matches"],
                           explain=next((c.get("explain") for c in checks  # this M's check: its rule
                                         if c["name"] == case["name"] and c["M"] == case["M"]), None))
                door = row.get("front_door", {})
                print(f"{case['name']} M={case['M']}: {row['tflops']:.0f} TFLOPS, x torch._scaled_mm "
                      f"{fp8_check.f3(row.get('ratio_to_scaled_mm'))} (calls {fp8_check.f3(row.get('call_ratio_to_scaled_mm'))}); "
                      f"front door {fp8_check.f3(door.get('kernel_ratio'))} (calls {fp8_check.f3(door.get('call_ratio'))}, "
                      f"{timed['front_door_explain'][0]}, the same bits as {timed['front_door_matches'] or 'neither'})",
                      flush=True)
            rows.append(row)
    finally:
        sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "tolerance": fp8_check.TOLERANCE, "checks": checks, "rows": rows, "summary": summary(rows)}
    for recipe, e in result["summary"].items():
        print(f"{recipe}: {e['correct']} of {e['rows']} rows correct; x torch._scaled_mm as kernels geomean "
              f"{fp8_check.f3(e['kernel_geomean'])} (lowest {fp8_check.f3(e['kernel_min'])}), as calls "
              f"{fp8_check.f3(e['call_geomean'])} (lowest {fp8_check.f3(e['call_min'])}); the front door (first use) "
              f"{fp8_check.f3(e['front_door_kernel_geomean'])} (lowest {fp8_check.f3(e['front_door_kernel_min'])}) as "
              f"kernels, {fp8_check.f3(e['front_door_call_geomean'])} (lowest {fp8_check.f3(e['front_door_call_min'])}) as calls")
    check_cli.write_result(out, result)
    print(f"{sum(1 for c in checks if c.get('correct'))} of {len(checks)} checks pass; {len(rows)} rows; "
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0 if all(c.get("correct") for c in checks) else 1


def main(argv=None) -> int:
    p, pr, _, _ = check_cli.subcommands(__doc__, "build box: the fp8 pack and the cases",
                                        "GPU box: check scaled_mm from the pack, then time it against torch._scaled_mm",
                                        "fp8_pack_check.json")
    pr.add_argument("--weights", type=weight_arg, default=WEIGHTS, help="NxK,...: a subset of the weights")
    pr.add_argument("--recipes", type=recipe_arg, default=RECIPES,
                    help=f"recipe,...: of {', '.join(ALL_RECIPES)} (default {','.join(RECIPES)})")
    pr.add_argument("--suite", action="store_true",
                    help="the fp8 suite: SUITE_WEIGHTS (DeepSeek-V3, Llama-3-8B), no bias, every M of SUITE_MS timed")
    pr.add_argument("--bf16", action="store_true",
                    help="also the front door's bf16 modules of the timed squares (4096^3, 8192^3): timed as "
                         "ours_bf16 beside the fp8 kernel (issue 32's fp8 over bf16)")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out, a.weights, a.recipes, a.suite, a.bf16)
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
