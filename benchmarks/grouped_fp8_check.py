"""The grouped fp8 GEMM (v12 with e4m3 operands and rowwise scales, ``gemm_ladder.scaled_grouped_mm``)
on a GPU: correct under the routing a model makes, CUDA-graph capturable with changing counts, and
timed against ``torch._scaled_grouped_mm`` at MoE shapes (issue 33's fp8, issue 32's row recipe).

``prepare DIR`` (build box) builds, through the module cache, one fp8 v12 module per shape of
:data:`SHAPES` and knob variant of :data:`VARIANTS`, and the bf16 v12 module of each timed shape
(our bf16 grouped GEMM, a peer), and writes ``grouped_fp8_check.json`` (what to run) beside them.
``run DIR --out FILE.json`` (GPU box: TVM runtime and torch only):

1. correctness, each fp8 module in a child process with a deadline (``gemm_ladder.measure.isolate``):
   A and W random, quantized rowwise (``quantize_fp8(A, 'row')``, ``quantize_experts(W)``), D poisoned
   with NaN, every routing of :data:`CHECK_ROUTINGS` (balanced, Zipf, one expert with all tokens,
   half the experts empty, counts that are not multiples of the tile, rows past ``offs[-1]`` that must
   stay NaN), error against the fp64 product of the dequantized inputs (``grouped_fp8.reference``)
   within 2x ``torch._scaled_grouped_mm``'s own error on the same inputs (or, where torch refuses,
   2x the error of rounding the reference to bf16: the row says which); the front door (W as
   ``[E, N, K]`` and as torch's ``[E, K, N]`` view) and the torch op give the module's bits; then one
   CUDA graph captured on one routing and replayed after ``offs`` was overwritten with two others;
2. timing of the correct modules: ours, ``torch._scaled_grouped_mm`` (rowwise), our bf16 grouped GEMM
   and ``torch._grouped_mm`` (bf16) at the same shapes, taking turns in rotating rounds in one
   process, as kernels in CUDA graphs cycling input sets that spill L2 and as queued calls, at
   :data:`TOKENS` rows of A, balanced and Zipf;
3. rows in issue 33's results format (``layout``, ``experts``, ``tokens``, ``N``, ``K``, ``dtype``
   ``float8_e4m3fn``, ``routing``, ``correct``, ``ratio_to_grouped_mm`` = torch._scaled_grouped_mm's
   time over ours, ``peer_ratios``) with issue 32's fields (``recipe`` ``row``, ``tflops``,
   ``ratio_to_scaled_mm``, the same ratio), the GPU, its clocks and the commit. Where
   ``torch._scaled_grouped_mm`` does not run, ``torch_refused`` says why and the ratios are None.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_fp8_check.py prepare build/grouped_fp8     # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_fp8_check.py run build/grouped_fp8 --out out/grouped_fp8_check.json

``prepare DIR --pack`` builds instead a kernel pack of the SHAPES' weights (``pack build --grouped
E,N,K --dtypes float8_e4m3``: ``plan.grouped_choices``' fp8 tiers, a 64x128 decode module and the
128x128 defaults) into DIR/pack, and ``run`` then serves each (shape, tokens) case through the front
door with ``use_pack`` and ``strict=True`` (``pack_job``): the module the pack's rule picks for the
token count must serve it (``explain``), be correct on two routings with D poisoned, replay a CUDA
graph of the front door after the routing changed, and be timed (the front door's call) against
``torch._scaled_grouped_mm``. Rows add ``kind`` ``pack``, ``served_by`` and ``rule``.

About 2-3 minutes on an H100 (an estimate until the first run); DIR about 2 MiB (10 modules);
``--pack``: about 1-2 minutes, DIR about 2 MiB (8 modules).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)
from grouped_check import counts_of, gpu_plan, offsets_of, pack_results, time_rounds  # noqa: E402  (the routings and rounds of the bf16 grouped check)

import gemm_ladder  # noqa: E402
import gemm_ladder.serve.grouped_ops  # noqa: E402,F401  (registers torch.ops.gemm_ladder.scaled_grouped_mm)
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve import front, grouped_fp8, kernel_pack  # noqa: E402
from gemm_ladder.serve.grouped import spec_of_dtype, use_grouped_module  # noqa: E402
from gemm_ladder.serve.grouped_fp8 import quantize_experts, reference, spec_of, use_scaled_grouped_module  # noqa: E402

FORMAT = "gemm_ladder.grouped_fp8_check"
PLAN_FILE = "grouped_fp8_check.json"
DTYPE = "float8_e4m3fn"  # the rows' dtype (torch's name)
# (name, experts, N, K): Mixtral-like, Qwen-MoE-like, DeepSeek-V3-like, and an odd one for the edges
# (N not a multiple of the tile; K a multiple of 16, not of the 128-wide slice)
SHAPES = [("mixtral", 8, 14336, 4096), ("qwen_moe", 64, 1408, 2048), ("deepseek_v3", 256, 2048, 7168),
          ("odd", 5, 1000, 528)]
TIMED = ("mixtral", "qwen_moe", "deepseek_v3")
# knob variants beside the fp8 defaults (128x128x128 tiles, promote=1): the promotion overlapped with
# the next group's wgmmas (dense fp8: +5% at 4096^3, sm90a/fp8.py)
VARIANTS = {"mixtral": [{"overlap": 4}], "qwen_moe": [{"overlap": 4}], "deepseek_v3": [{"overlap": 4}]}
BUILD_M = 4096
CHECK_TOKENS = 1000  # rows of A in the correctness cases (not a multiple of the tile)
CHECK_ROUTINGS = ("balanced", "zipf", "one", "odd", "half_empty", "tail")
TOKENS = (512, 2048, 8192)
TIMED_ROUTINGS = ("balanced", "zipf")
ROUNDS = 5
CHECK_TIMEOUT, TIME_TIMEOUT = 150.0, 240.0
ERROR_FLOOR = 1e-3  # relative: a few bf16 roundings of D, where both errors are tiny
PEERS = ("scaled_grouped_mm", "bf16_grouped_mm_ours", "bf16_grouped_mm_torch")
# prepare --variants: knob sets timed side by side with the defaults and torch in the same rounds (a
# deeper ring, the overlapped promotion, the consumers' drains staggered, the 64x128 decode tile)
KNOB_SWEEP = [{"overlap": 4}, {"pipe_depth": 6}, {"overlap": 4, "pipe_depth": 6}, {"overlap": 4, "stagger": True},
              {"blk_m": 64, "num_warpgroups": 1, "blk_n": 128, "pipe_depth": 8}]


def variant_text(knobs: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(knobs.items())) or "default"


def judge(rel: float, torch_rel: float | None, round_rel: float) -> bool:
    """Ours within 2x torch's own error (or, without torch's, 2x the error of rounding the exact
    product to D's dtype) plus a small floor."""
    yardstick = torch_rel if torch_rel is not None else round_rel
    return math.isfinite(rel) and rel <= 2 * max(yardstick, round_rel) + ERROR_FLOOR


def row(case: dict, correct: bool, times: dict, torch_refused: str | None = None) -> dict:
    """One result row in issue 33's format with issue 32's fields; ``times``: party -> its medians."""
    ours = times.get("ours", {})

    def ratio(peer, how):
        theirs, mine = times.get(peer, {}).get(how), ours.get(how)
        return theirs / mine if theirs and mine else None

    main = ratio("scaled_grouped_mm", "graph_ms")
    return {"layout": "contiguous", "dtype": DTYPE, "recipe": "row", **case, "correct": correct,
            "ratio_to_grouped_mm": main, "ratio_to_scaled_mm": main,
            "tflops": ours.get("tflops_graph"),
            "peer_ratios": {f"{p}_{how.removesuffix('_ms')}": ratio(p, how)
                            for p in PEERS for how in ("graph_ms", "queued_ms")},
            "torch_refused": torch_refused, "times": times}


# -- prepare (build box) ----------------------------------------------------------------------------
def module_plan(variants: bool = False) -> list[dict]:
    """Every module prepare builds: the fp8 modules (shape x variant), then the bf16 peers;
    ``variants``: the timed shapes at the defaults and each knob set of :data:`KNOB_SWEEP` instead."""
    plan = []
    if variants:
        for name, E, N, K in SHAPES:
            if name in TIMED:
                plan += [{"kind": "fp8", "shape": name, "experts": E, "N": N, "K": K, "knobs": v,
                          "file": f"grouped_fp8_{name}_{variant_text(v)}.so"} for v in [{}] + KNOB_SWEEP]
        return plan
    for name, E, N, K in SHAPES:
        for v in [{}] + VARIANTS.get(name, []):
            plan.append({"kind": "fp8", "shape": name, "experts": E, "N": N, "K": K, "knobs": v,
                         "file": f"grouped_fp8_{name}_{variant_text(v)}.so"})
    for name, E, N, K in SHAPES:
        if name in TIMED:
            plan.append({"kind": "bf16", "shape": name, "experts": E, "N": N, "K": K, "knobs": {},
                         "file": f"grouped_bf16_{name}.so"})
    return plan


def build_knobs(m: dict) -> dict:
    spec = spec_of("bfloat16") if m["kind"] == "fp8" else spec_of_dtype("bfloat16")
    return {"experts": m["experts"], "dtype": "bfloat16", "spec": spec.text(), **m["knobs"]}


def prepare(out, variants: bool = False) -> int:
    # optional: the build layer (TVM's compiler), on the build box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob

    folder = files.open_folder(out)
    modules = module_plan(variants)
    for m in modules:
        path, _ = module_cache.get_or_build(BuildJob("v12", (BUILD_M, m["N"], m["K"]), build_knobs(m)))
        stem = Path(m["file"]).stem
        for src in Path(path).parent.iterdir():
            if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
                shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "modules": modules, "variants": variants})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


# -- the GPU jobs (each in a child process) ----------------------------------------------------------
def quantized_inputs(E, N, K, M, seed):
    """A [M, K] e4m3 and its row scales [M], W [E, N, K] e4m3 and its scales [E, N] (quantized from
    randn, W scaled to keep D near one, expert by expert: DeepSeek's W is 3.7 GB in fp8)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    Aq, sa = gemm_ladder.quantize_fp8(torch.randn(M, K, device="cuda", generator=g), "row")
    Wq = torch.empty(E, N, K, device="cuda", dtype=torch.float8_e4m3fn)
    sw = torch.empty(E, N, device="cuda", dtype=torch.float32)
    for e0 in range(0, E, 8):
        w = torch.randn(min(8, E - e0), N, K, device="cuda", generator=g).div_(math.sqrt(K))
        Wq[e0:e0 + 8], sw[e0:e0 + 8] = quantize_experts(w)
    return Aq, sa.reshape(-1).contiguous(), Wq, sw


def torch_scaled(Aq, Wq, sa, sw, offs):
    """torch._scaled_grouped_mm's D (bf16), or the reason it refused."""
    try:
        out = torch._scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa, sw, offs=offs,  # pylint: disable=protected-access
                                       out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        return out, None
    except (RuntimeError, ValueError, TypeError, AttributeError, NotImplementedError) as err:  # N % 16: ValueError
        return None, f"{type(err).__name__}: {str(err)[:300]}"


def errors(Aq, Wq, sa, sw, offs_list, D, M, theirs=None) -> dict:
    """Relative errors against the fp64 product of the dequantized inputs (rows up to offs[-1]):
    ours, torch's (``theirs``), and rounding the exact product to bf16; NaNs in ours; rows past
    offs[-1] written."""
    end = offs_list[-1] if offs_list else 0
    ref = reference(Aq, Wq, sa, sw, torch.tensor(offs_list))[:end]
    norm = float(ref.norm()) or 1.0
    mine = D[:end].double()
    out = {"rel_err": float(torch.nan_to_num(mine - ref, nan=1e30).norm()) / norm,
           "torch_rel_err": float((theirs[:end].double() - ref).norm()) / norm if theirs is not None else None,
           "round_rel_err": float((ref.to(torch.bfloat16).double() - ref).norm()) / norm,
           "nan": int(torch.isnan(mine).sum()),
           "rows_past_offs_written": int((~torch.isnan(D[end:M].float())).any(dim=1).sum()) if end < M else 0}
    out["ok"] = out["nan"] == 0 and out["rows_past_offs_written"] == 0 and judge(
        out["rel_err"], out["torch_rel_err"], out["round_rel_err"])
    return out


def checked_run(run, Aq, Wq, sa, sw, offs, offs_list, D, M) -> tuple[dict, str | None]:
    """``offs`` set to ``offs_list`` in place, D poisoned with NaN, ``run()`` (a launch, a front-door
    call or a graph's replay), then :func:`errors` against torch's product of the same inputs;
    returns the errors and why torch refused, if it did."""
    offs.copy_(torch.tensor(offs_list, dtype=torch.int32))
    D.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    theirs, why = torch_scaled(Aq, Wq, sa, sw, offs)
    return errors(Aq, Wq, sa, sw, offs_list, D, M, theirs), why


def check_job(path, args) -> dict:  # pylint: disable=unused-argument
    """Every routing of CHECK_ROUTINGS on one module, the front door and the op, then the graph replay."""
    mod = use_scaled_grouped_module(path)
    E, N, K, M = mod.experts, mod.N, mod.K, CHECK_TOKENS
    cases, ok_all, refused = [], True, None
    for i, routing in enumerate(CHECK_ROUTINGS):
        counts = counts_of(routing, E, M, seed=i)
        offs_list = offsets_of(counts)
        Aq, sa, Wq, sw = quantized_inputs(E, N, K, M, seed=i)
        offs = torch.tensor(offs_list, dtype=torch.int32, device="cuda")
        D = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        mod.launch(Aq, Wq, sa, sw, offs, D)
        torch.cuda.synchronize()
        theirs, why = torch_scaled(Aq, Wq, sa, sw, offs)
        refused = refused or why
        res = errors(Aq, Wq, sa, sw, offs_list, D, M, theirs)
        # the front door (both W layouts) and the op serve this module (registered) with its bits
        end = offs_list[-1]
        front = gemm_ladder.scaled_grouped_mm(Aq, Wq, sa, sw, offs, strict=True)
        view = gemm_ladder.scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa, sw, offs, strict=True)
        op = torch.ops.gemm_ladder.scaled_grouped_mm(Aq, Wq, sa, sw, offs)
        res["front_door_and_op_same"] = all(bool(torch.equal(x[:end], D[:end])) for x in (front, view, op))
        res["ok"] = res["ok"] and res["front_door_and_op_same"]
        ok_all &= res["ok"]
        cases.append({"routing": routing, "counts_head": counts[:8], **res})
        del Aq, Wq, D
    # one graph, three routings: offs overwritten in place between replays
    routings = ("balanced", "one", "zipf")
    Aq, sa, Wq, sw = quantized_inputs(E, N, K, M, seed=99)
    offs = torch.tensor(offsets_of(counts_of(routings[0], E, M)), dtype=torch.int32, device="cuda")
    D = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.launch(Aq, Wq, sa, sw, offs, D)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.launch(Aq, Wq, sa, sw, offs, D)
    graph_cases = []
    for j, routing in enumerate(routings):
        offs_list = offsets_of(counts_of(routing, E, M, seed=100 + j))
        res, _ = checked_run(graph.replay, Aq, Wq, sa, sw, offs, offs_list, D, M)
        ok_all &= res["ok"]
        graph_cases.append({"routing": routing, **res})
    return {"status": "ok" if ok_all else "wrong", "cases": cases, "graph_replays": graph_cases,
            "torch_refused": refused}


def _rounds(parties: dict, sets: list, flops: float) -> dict:
    """grouped_check's rotating rounds (``time_rounds``) at this check's :data:`ROUNDS`."""
    return time_rounds(parties, sets, flops, ROUNDS)


def time_item(fp8_path: str, bf16_path: str | None) -> str:
    """The one word isolate hands a timing child: the fp8 module and its bf16 peer, ``#``-joined."""
    return f"{fp8_path}#{bf16_path or ''}"


def time_job(item, args) -> dict:  # pylint: disable=unused-argument
    """Ours, torch._scaled_grouped_mm, our bf16 grouped GEMM and torch._grouped_mm in rotating rounds,
    per (tokens, routing)."""
    fp8_path, bf16_path = item.split("#")
    mod = use_scaled_grouped_module(fp8_path)
    bf16 = use_grouped_module(bf16_path) if bf16_path else None
    E, N, K = mod.experts, mod.N, mod.K
    l2 = device.probe(0).l2_bytes or (50 << 20)
    _, _, Wq, sw = quantized_inputs(E, N, K, 16, seed=7)
    Wb = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).div_(math.sqrt(K)) if bf16 else None
    results, refused = [], None
    for tokens in TOKENS:
        for routing in TIMED_ROUTINGS:
            offs_list = offsets_of(counts_of(routing, E, tokens, seed=tokens))
            per_set = tokens * (3 * K + 4 * N)  # A in fp8 and bf16, D in bf16 twice: W is shared
            n_sets = max(2, math.ceil(2 * l2 / per_set))
            sets = []
            for _ in range(n_sets):
                x = torch.randn(tokens, K, device="cuda")
                Aq, sa = gemm_ladder.quantize_fp8(x, "row")
                sets.append((Aq, sa.reshape(-1).contiguous(), torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                             torch.empty(tokens, N, dtype=torch.bfloat16, device="cuda"), x.to(torch.bfloat16),
                             torch.empty(tokens, N, dtype=torch.bfloat16, device="cuda")))

            def ours(Aq, sa, offs, D, Ab, Db):  # pylint: disable=unused-argument
                mod.launch(Aq, Wq, sa, sw, offs, D)

            def scaled_grouped_mm(Aq, sa, offs, D, Ab, Db):  # pylint: disable=unused-argument
                torch._scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa, sw, offs=offs,  # pylint: disable=protected-access
                                         out_dtype=torch.bfloat16)

            def bf16_grouped_mm_ours(Aq, sa, offs, D, Ab, Db):  # pylint: disable=unused-argument
                bf16.launch(Ab, Wb, offs, Db)

            def bf16_grouped_mm_torch(Aq, sa, offs, D, Ab, Db):  # pylint: disable=unused-argument
                torch._grouped_mm(Ab, Wb.transpose(1, 2), offs=offs)  # pylint: disable=protected-access

            parties = {"ours": ours}
            first = sets[0]
            _, why = torch_scaled(first[0], Wq, first[1], sw, first[2])
            refused = refused or why
            if why is None:
                parties["scaled_grouped_mm"] = scaled_grouped_mm
            if bf16 is not None:
                parties["bf16_grouped_mm_ours"] = bf16_grouped_mm_ours
                try:
                    torch._grouped_mm(first[4], Wb.transpose(1, 2), offs=first[2])  # pylint: disable=protected-access
                    parties["bf16_grouped_mm_torch"] = bf16_grouped_mm_torch
                except (RuntimeError, ValueError, TypeError, AttributeError):
                    pass
            times = _rounds(parties, sets, 2.0 * tokens * N * K)
            results.append({"tokens": tokens, "routing": routing, "times": times})
            del sets
    return {"status": "ok", "rows": results, "torch_refused": refused}


# -- knob variants side by side (prepare --variants) ---------------------------------------------------
def group_time_job(item, args) -> dict:  # pylint: disable=unused-argument
    """One shape's modules (``#``-joined paths) and torch._scaled_grouped_mm in the same rotating
    rounds, per (tokens, routing): each module's party is its variant's name."""
    mods = {}
    for path in item.split("#"):
        mod = grouped_fp8.ScaledGroupedModule(gemm_ladder.load(path))
        mods[variant_of(path)] = mod
    first = next(iter(mods.values()))
    E, N, K = first.experts, first.N, first.K
    l2 = device.probe(0).l2_bytes or (50 << 20)
    _, _, Wq, sw = quantized_inputs(E, N, K, 16, seed=7)
    results, refused = [], None
    for tokens in TOKENS:
        for routing in TIMED_ROUTINGS:
            offs_list = offsets_of(counts_of(routing, E, tokens, seed=tokens))
            sets = []
            for _ in range(max(2, math.ceil(2 * l2 / (tokens * (K + 2 * N))))):
                Aq, sa = gemm_ladder.quantize_fp8(torch.randn(tokens, K, device="cuda"), "row")
                sets.append((Aq, sa.reshape(-1).contiguous(), torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                             torch.empty(tokens, N, dtype=torch.bfloat16, device="cuda")))

            def party(mod):
                def ours(Aq, sa, offs, D):
                    mod.launch(Aq, Wq, sa, sw, offs, D)
                return ours

            def scaled_grouped_mm(Aq, sa, offs, D):  # pylint: disable=unused-argument
                torch._scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa, sw, offs=offs,  # pylint: disable=protected-access
                                         out_dtype=torch.bfloat16)

            parties = {name: party(mod) for name, mod in mods.items()}
            _, why = torch_scaled(sets[0][0], Wq, sets[0][1], sw, sets[0][2])
            refused = refused or why
            if why is None:
                parties["scaled_grouped_mm"] = scaled_grouped_mm
            results.append({"tokens": tokens, "routing": routing,
                            "times": _rounds(parties, sets, 2.0 * tokens * N * K)})
            del sets
    return {"status": "ok", "rows": results, "torch_refused": refused}


def variant_of(path) -> str:
    """A variant module's variant text, from its file name (``grouped_fp8_<shape>_<variant>.so``)."""
    stem = Path(path).name.removesuffix(".so")
    shape = next(name for name, *_ in SHAPES if stem.startswith(f"grouped_fp8_{name}_"))
    return stem[len(f"grouped_fp8_{shape}_"):]


def run_variants(folder, out, plan: dict) -> int:
    """run for a DIR of prepare --variants: every module checked, then each shape's correct modules
    timed side by side with torch; a row per (module, tokens, routing), the summary per variant and
    the best variant of each case."""
    sampler, start = Sampler(), time.time()
    mods = plan["modules"]
    paths = [str(folder / m["file"]) for m in mods]
    job = "benchmarks.grouped_fp8_check:"
    try:
        checks = dict(zip(paths, isolate.run_batch(job + "check_job", paths, timeout=CHECK_TIMEOUT, explain=False)))
        groups = {}
        for m, p in zip(mods, paths):
            if checks[p].get("status") == "ok":
                groups.setdefault(m["shape"], []).append(p)
        names = list(groups)
        timed = dict(zip(names, isolate.run_batch(job + "group_time_job", ["#".join(groups[n]) for n in names],
                                                  timeout=TIME_TIMEOUT, explain=False)))
    finally:
        sampler.stop()
    rows = []
    for m, path in zip(mods, paths):
        rows += module_rows(m, checks[path], None, False)
    for name, res in timed.items():
        m0 = next(m for m in mods if m["shape"] == name)
        base = {"experts": m0["experts"], "N": m0["N"], "K": m0["K"], "shape": name}
        for r in res.get("rows", []):
            for variant, t in r["times"].items():
                if variant == "scaled_grouped_mm":
                    continue
                times = {"ours": t, **({"scaled_grouped_mm": r["times"]["scaled_grouped_mm"]}
                                       if "scaled_grouped_mm" in r["times"] else {})}
                rows.append(row({**base, "tokens": r["tokens"], "routing": r["routing"], "kind": "timed",
                                 "variant": variant}, True, times, res.get("torch_refused")))
        if res.get("status") != "ok":
            rows.append(row({**base, "tokens": None, "routing": None, "kind": "failure", "variant": None,
                             "detail": json.dumps(res)[:4000]}, False, {}))
    timed_rows = [r for r in rows if r["kind"] == "timed" and r["ratio_to_grouped_mm"]]
    cases = {}
    for r in timed_rows:
        cases.setdefault((r["shape"], r["tokens"], r["routing"]), []).append(r)
    best = [max(rs, key=lambda r: r["ratio_to_grouped_mm"]) for rs in cases.values()]
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "summary": {"modules": len(paths), "correct_modules": sum(c.get("status") == "ok" for c in checks.values()),
                          **summary_of(rows),
                          "best_of_each_case": {"geomean": geomean([r["ratio_to_grouped_mm"] for r in best]),
                                                "min": min((r["ratio_to_grouped_mm"] for r in best), default=None),
                                                "winners": {f"{r['shape']} {r['tokens']} {r['routing']}": r["variant"]
                                                            for r in best}}},
              "rows": rows}
    check_cli.write_result(out, result)
    for r in sorted(timed_rows, key=lambda r: (r["shape"], r["tokens"], r["routing"], r["variant"])):
        print(f"{r['shape']:11s} tokens={r['tokens']:5d} {r['routing']:8s} {r['variant']:40s} "
              f"{r['tflops'] or 0:6.0f} TFLOPS  x scaled_grouped_mm {r['ratio_to_grouped_mm']:.3f}")
    for r in rows:
        if not r["correct"]:
            print(f"WRONG {r['shape']} {r['variant']} {r['kind']} {r['routing']}: {(r.get('detail') or '')[:300]}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


# -- kernel packs (prepare --pack; run serves through the front door with use_pack) --------------------
PACK_FOLDER = "pack"
PACK_DTYPE = "float8_e4m3"  # pack build --dtypes float8_e4m3: the grouped fp8 modules, D in bfloat16


def pack_cases(entries) -> list[dict]:
    """One case a (shape, tokens) of the timed shapes at :data:`TOKENS` (and the odd shape at the
    check's count), with the file the pack's rule serves it from (the entry whose range holds it)."""
    cases = []
    for name, E, N, K in SHAPES:
        for tokens in (TOKENS if name in TIMED else (CHECK_TOKENS,)):
            mine = [e for e in entries if kernel_pack.is_grouped(e) and (e["experts"], e["shape"][1], e["shape"][2])
                    == (E, N, K) and e["tokens"][0] <= tokens <= e["tokens"][1]]
            if mine:
                cases.append({"shape": name, "experts": E, "N": N, "K": K, "tokens": tokens, "file": mine[0]["file"],
                              "rule": (mine[0].get("choice") or {}).get("rule")})
    return cases


def shape_of(E: int, N: int, K: int) -> str | None:
    """The name in SHAPES of a weight (None: not one of them)."""
    return next((name for name, e, n, k in SHAPES if (e, n, k) == (E, N, K)), None)


def case_item(folder, case: dict) -> str:
    """A case as the one word isolate hands a child job: the pack folder and the case, ``#``-joined."""
    return "#".join([str(folder)] + [str(case[k]) for k in ("experts", "N", "K", "tokens")])


def parse_case_item(item: str) -> tuple[str, dict]:
    folder, E, N, K, tokens = item.split("#")
    return folder, {"experts": int(E), "N": int(N), "K": int(K), "tokens": int(tokens)}


def prepare_pack(out) -> int:
    """The SHAPES' weights as a kernel pack of grouped fp8 modules, and the plan of its cases."""
    folder = files.open_folder(out)
    man = kernel_pack.build_pack(folder / PACK_FOLDER, [], [PACK_DTYPE],
                                 grouped=[(E, N, K, "contiguous") for _, E, N, K in SHAPES],
                                 request={"grouped": [f"{E},{N},{K},contiguous" for _, E, N, K in SHAPES],
                                          "dtypes": [PACK_DTYPE]})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r['detail']}", file=sys.stderr)
    cases = pack_cases(man["modules"])
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "pack": PACK_FOLDER, "cases": cases})
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{len(man['results'])} modules in a pack, {len(cases)} cases, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


def pack_job(item, args) -> dict:  # pylint: disable=unused-argument
    """One case through the front door with the pack (strict: no fallback): which module served, two
    routings checked with D poisoned, a CUDA graph of the front door replayed after the routing
    changed, then timed against torch._scaled_grouped_mm (where it runs) in rotating rounds."""
    folder, c = parse_case_item(item)
    if not any(p.folder == Path(folder) for p in front.packs()):  # once a child (its jobs run one after another)
        gemm_ladder.use_pack(folder)
    E, N, K, M = c["experts"], c["N"], c["K"], c["tokens"]
    Aq, sa, Wq, sw = quantized_inputs(E, N, K, M, seed=5)
    D = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    offs = torch.zeros(E, dtype=torch.int32, device="cuda")
    route = grouped_fp8.route_of(grouped_fp8.check_call(Aq, Wq, sa, sw, offs), torch.cuda.current_device(), True)

    def run_front(t):
        gemm_ladder.scaled_grouped_mm(Aq, Wq, sa, sw, t, out=D, strict=True)

    cases, ok_all, refused = [], route.source == "kernel pack", None
    for i, routing in enumerate(("zipf", "odd")):
        res, why = checked_run(lambda: run_front(offs), Aq, Wq, sa, sw, offs,
                               offsets_of(counts_of(routing, E, M, seed=i)), D, M)
        refused = refused or why
        ok_all &= res["ok"]
        cases.append({"routing": routing, **res})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_front(offs)
    res, _ = checked_run(graph.replay, Aq, Wq, sa, sw, offs, offsets_of(counts_of("one", E, M, seed=5)), D, M)
    ok_all &= res["ok"]
    cases.append({"routing": "one (graph replay)", **res})
    out = {"status": "ok" if ok_all else "wrong", "source": route.source, "kernel": route.lines[0], "cases": cases,
           "torch_refused": refused}
    if ok_all and shape_of(E, N, K) in TIMED:  # not the odd shape
        out["times"] = _pack_times(c, Wq, sw, refused is None)
    return out


def _pack_times(c: dict, Wq, sw, torch_runs: bool) -> dict:
    """The front door (with the pack) against torch._scaled_grouped_mm on balanced routing."""
    E, N, K, tokens = c["experts"], c["N"], c["K"], c["tokens"]
    l2 = device.probe(0).l2_bytes or (50 << 20)
    offs_list = offsets_of(counts_of("balanced", E, tokens))
    sets = []
    for _ in range(max(2, math.ceil(2 * l2 / (tokens * (K + 2 * N))))):
        Aq, sa = gemm_ladder.quantize_fp8(torch.randn(tokens, K, device="cuda"), "row")
        sets.append((Aq, sa.reshape(-1).contiguous(), torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                     torch.empty(tokens, N, dtype=torch.bfloat16, device="cuda")))

    def ours(Aq, sa, offs, D):
        gemm_ladder.scaled_grouped_mm(Aq, Wq, sa, sw, offs, out=D, strict=True)

    def scaled_grouped_mm(Aq, sa, offs, D):  # pylint: disable=unused-argument
        torch._scaled_grouped_mm(Aq, Wq.transpose(1, 2), sa, sw, offs=offs,  # pylint: disable=protected-access
                                 out_dtype=torch.bfloat16)

    parties = {"ours": ours, **({"scaled_grouped_mm": scaled_grouped_mm} if torch_runs else {})}
    return _rounds(parties, sets, 2.0 * tokens * N * K)


def run_pack(folder, out, plan: dict) -> int:
    """run for a DIR of prepare --pack: every case in children, rows in the issue's format."""
    sampler, start = Sampler(), time.time()
    cases = plan["cases"]
    results = pack_results(folder, plan, "benchmarks.grouped_fp8_check:pack_job", sampler, TIME_TIMEOUT, case_item)
    rows = []
    for c, res in zip(cases, results):
        correct = res.get("status") == "ok" and c["file"] in res.get("kernel", "")
        base = {k: c[k] for k in ("experts", "N", "K", "tokens", "shape")}
        rows.append(row({**base, "routing": "balanced" if res.get("times") else None, "kind": "pack",
                         "variant": "pack", "served_by": res.get("kernel"), "expected": c["file"], "rule": c["rule"],
                         "cases": res.get("cases"), "detail": None if correct else json.dumps(res)[:2000]},
                        correct, res.get("times") or {}, res.get("torch_refused")))
    ratios = [r["ratio_to_grouped_mm"] for r in rows if r["ratio_to_grouped_mm"]]
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "summary": {"cases": len(rows), "correct": sum(r["correct"] for r in rows),
                          "geomean_ratio_to_scaled_grouped_mm": geomean(ratios),
                          "min_ratio_to_scaled_grouped_mm": min(ratios) if ratios else None},
              "rows": rows}
    check_cli.write_result(out, result)
    for r in rows:
        print(f"{r['shape']:11s} tokens={r['tokens']:5d} {r['rule'] or '':20s} correct={r['correct']} "
              f"x scaled_grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f} {r['tflops'] or 0:6.0f} TFLOPS")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


# -- run (GPU box) ------------------------------------------------------------------------------------
def module_rows(m: dict, check: dict, timing: dict | None, was_timed: bool) -> list[dict]:
    """One fp8 module's rows: one per checked routing, per graph replay, per timed case, and one for a failure."""
    base = {"experts": m["experts"], "N": m["N"], "K": m["K"], "shape": m["shape"],
            "variant": variant_text(m["knobs"])}
    correct = check.get("status") == "ok"
    refused = (timing or {}).get("torch_refused") or check.get("torch_refused")
    rows = []
    for kind, cases in (("check", check.get("cases", [])), ("graph_replay", check.get("graph_replays", []))):
        for case in cases:
            rows.append(row({**base, "tokens": CHECK_TOKENS, "routing": case["routing"], "kind": kind,
                             **{k: case.get(k) for k in ("rel_err", "torch_rel_err", "round_rel_err", "nan",
                                                         "rows_past_offs_written")}}, case["ok"], {}, refused))
    t = timing or {}
    for r in t.get("rows", []):
        rows.append(row({**base, "tokens": r["tokens"], "routing": r["routing"], "kind": "timed"}, correct,
                        r["times"], refused))
    if not correct or (was_timed and t.get("status") != "ok"):
        rows.append(row({**base, "tokens": None, "routing": None, "kind": "failure",
                         "detail": json.dumps({"check": check, "time": t})[:4000]}, False, {}, refused))
    return rows


def summary_of(rows: list[dict]) -> dict:
    """Of the timed rows, per variant: the geomean and least ratio to torch._scaled_grouped_mm and the
    geomean to our bf16 grouped GEMM."""
    out = {}
    for variant in sorted({r["variant"] for r in rows if r["kind"] == "timed"}):
        mine = [r for r in rows if r["kind"] == "timed" and r["variant"] == variant]
        ratios = [r["ratio_to_grouped_mm"] for r in mine if r["ratio_to_grouped_mm"]]
        bf16 = [r["peer_ratios"]["bf16_grouped_mm_ours_graph"] for r in mine
                if r["peer_ratios"]["bf16_grouped_mm_ours_graph"]]
        out[variant] = {"geomean_ratio_to_scaled_grouped_mm": geomean(ratios),
                        "min_ratio_to_scaled_grouped_mm": min(ratios) if ratios else None,
                        "geomean_ratio_to_bf16_grouped_mm_ours": geomean(bf16)}
    return out


def geomean(xs) -> float | None:
    return math.exp(statistics.fmean(map(math.log, xs))) if xs else None


def run(folder, out) -> int:
    folder = Path(folder)
    plan = gpu_plan(folder, PLAN_FILE, FORMAT, "grouped_fp8_check")
    if plan is None:
        return 2
    if "pack" in plan:
        return run_pack(folder, out, plan)
    if plan.get("variants"):
        return run_variants(folder, out, plan)
    sampler, start = Sampler(), time.time()
    fp8 = [m for m in plan["modules"] if m["kind"] == "fp8"]
    bf16 = {m["shape"]: str(folder / m["file"]) for m in plan["modules"] if m["kind"] == "bf16"}
    paths = [str(folder / m["file"]) for m in fp8]
    job = "benchmarks.grouped_fp8_check:"
    try:
        checks = dict(zip(paths, isolate.run_batch(job + "check_job", paths, timeout=CHECK_TIMEOUT, explain=False)))
        good = [(m, p) for m, p in zip(fp8, paths) if checks[p].get("status") == "ok" and m["shape"] in TIMED]
        items = [time_item(p, bf16.get(m["shape"])) for m, p in good]
        timed = dict(zip([p for _, p in good], isolate.run_batch(job + "time_job", items, timeout=TIME_TIMEOUT,
                                                                explain=False)))
    finally:
        sampler.stop()
    rows = []
    for m, path in zip(fp8, paths):
        rows += module_rows(m, checks[path], timed.get(path), path in timed)
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "summary": {"modules": len(paths), "correct_modules": sum(c.get("status") == "ok" for c in checks.values()),
                          **summary_of(rows)},
              "rows": rows}
    check_cli.write_result(out, result)
    for r in rows:
        if r["kind"] == "timed":
            peers = "  ".join(f"x {k.removesuffix('_graph')} {v or 0:.3f}" for k, v in r["peer_ratios"].items()
                              if k.endswith("_graph"))
            print(f"{r['shape']:11s} {r['variant']:9s} tokens={r['tokens']:5d} {r['routing']:8s} "
                  f"{r['tflops'] or 0:6.0f} TFLOPS  {peers}")
        elif not r["correct"]:
            print(f"WRONG {r['shape']} {r['variant']} {r['kind']} {r['routing']}: rel {r.get('rel_err')} torch "
                  f"{r.get('torch_rel_err')} nan {r.get('nan')} past {r.get('rows_past_offs_written')} "
                  f"{(r.get('detail') or '')[:300]}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, _, _ = check_cli.subcommands(__doc__, "build box: the fp8 (and bf16 peer) v12 modules of SHAPES into DIR",
                                        "GPU box: check, capture and time every fp8 module of DIR",
                                        "grouped_fp8_check.json")
    pr.add_argument("--pack", action="store_true", help="a kernel pack of the SHAPES' weights instead (pack build "
                                                          "--grouped E,N,K --dtypes float8_e4m3); run serves it "
                                                          "through the front door")
    pr.add_argument("--variants", action="store_true", help="the timed shapes' fp8 modules at the defaults and each "
                                                              "knob set of KNOB_SWEEP, timed side by side with torch")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        if a.pack and a.variants:
            p.error("prepare: --pack or --variants, not both")
        return prepare_pack(a.out) if a.pack else prepare(a.out, a.variants)
    check_cli.require_in_name(p, a.out, "grouped", 33)
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
