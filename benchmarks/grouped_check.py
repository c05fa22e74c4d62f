"""The grouped GEMM (v12, ``gemm_ladder.grouped_mm`` and ``grouped_mm_masked``) on a GPU: correct
under the routing a model makes, CUDA-graph capturable with changing counts, and timed against
torch's grouped GEMM and a loop of cuBLAS GEMMs at MoE shapes (issue 33's contiguous layout), and
for the masked layout (decode) also against a cuBLAS bmm over every slot.

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
The masked layout (modules built with ``layout="masked"``, :data:`MASKED_VARIANTS` beside): the
check (``masked_check_job``) runs :data:`MASKED_CHECK_ROUTINGS` (every expert empty, one expert
full, Zipf top-k, odd counts, counts past max_tokens or below zero that the kernel clamps) with D
poisoned (the rows past each count must stay NaN), the front door (``out`` poisoned too: kept) and
the op (zeros there) giving the kernel's bits, and one graph replayed after the counts were
overwritten; the timing (``masked_time_job``, bf16) runs the decode batches of
:data:`MASKED_SHAPES` (batch tokens, top-k each, max_tokens = batch) against ``torch._grouped_mm``
on the same rows gathered contiguous, a bmm over every slot (a decode graph without masking) and a
loop over the experts with rows. ``run --layout masked`` runs only these.

``prepare DIR --pack`` builds instead a kernel pack of the SHAPES' weights (``pack build --grouped``:
a module per token range of ``plan.grouped_choices``, both layouts, both dtypes) into DIR/pack, and ``run`` then
serves every case through the front doors with ``use_pack`` and ``strict=True``
(``pack_check_job``): at one token count inside each module's range, the front door must take that
module (``explain``), be correct on two routings with D poisoned, replay a CUDA graph of the front
door after the routing changed, and (bf16) be timed against ``torch._grouped_mm`` (masked: also the
bmm over every slot). Rows add ``served_by`` and ``rule``.

3. rows in the issue's results format (``layout``, ``experts``, ``tokens``, ``N``, ``K``,
   ``dtype``, ``routing``, ``correct``, ``ratio_to_grouped_mm`` = torch's time over ours (graphs),
   ``peer_ratios``), the GPU, its clocks (sampled through the run) and the commit.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_check.py prepare build/grouped          # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_check.py run build/grouped --out out/grouped_check.json   # GPU box
    (kernel packs: prepare build/grouped_pack --pack, run build/grouped_pack --out out/grouped_pack_check.json)

About 2-3 minutes on an H100 for the contiguous layout, about 2 more for the masked one (estimates
until the first run); DIR about 6.5 MiB (30 modules: the shapes in both dtypes and both layouts, and
the variants of each).
"""

from __future__ import annotations

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
import check_cli  # noqa: E402  (a sibling script, not a package)

import gemm_ladder  # noqa: E402
import gemm_ladder.serve.grouped_ops  # noqa: E402,F401  (registers torch.ops.gemm_ladder.grouped_mm)
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve import front, grouped as grouped_door, grouped_masked, kernel_pack, runtime  # noqa: E402
from gemm_ladder.serve.grouped import spec_of_dtype, use_grouped_module  # noqa: E402

FORMAT = "gemm_ladder.grouped_check"
PLAN_FILE = "grouped_check.json"
# (name, experts, N, K): Mixtral-like (8 experts of 14336x4096), Qwen-MoE-like (64 of 1408x2048),
# DeepSeek-V3-like (256 of 2048x7168), and an odd one for the edges (N not a multiple of the tile, K of
# the slice)
SHAPES = [("mixtral", 8, 14336, 4096), ("qwen_moe", 64, 1408, 2048), ("deepseek_v3", 256, 2048, 7168),
          ("odd", 5, 1000, 520)]
# the grouped suite's weights (family, experts, N, K) and token counts (rows of A in all: tokens x top-k,
# the 64 to 32768), here so that grouped_prefill_check's --promo plan and grouped_suite share them
SUITE_FAMILIES = [("mixtral", 8, 14336, 4096), ("qwen_moe", 64, 1408, 2048), ("qwen3_moe", 128, 768, 2048),
                  ("deepseek_v3", 256, 2048, 7168), ("odd", 5, 1000, 520)]
SUITE_TOKENS = (64, 128, 256, 512, 2048, 8192, 32768)
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

# the masked layout (decode: A [E, max_tokens, K], counts [E]): the same shapes, each with the top-k
# of its model and the decode batches timed (tokens = batch x top-k rows in all, max_tokens = batch:
# a token picks an expert at most once); the larger batches show where masking stops paying
MASKED_SHAPES = {"mixtral": (2, (8, 32, 128, 512)), "qwen_moe": (8, (8, 32, 256)), "deepseek_v3": (8, (8, 32, 128)),
                 "odd": (2, ())}
# knob variants for decode: 64-row tiles (one consumer) waste half the MMA work of 128 on a few rows;
# 128-wide n-tiles make twice the work units (less idle in the last wave of a weight-streaming
# launch: 8 x 56 units of 14336 / 256 fill 3.4 waves of 132 CTAs) and 8 stages keep more bytes in flight
DECODE_SMALL = {"blk_m": 64, "num_warpgroups": 1}
DECODE_NARROW = {"blk_m": 64, "num_warpgroups": 1, "blk_n": 128, "pipe_depth": 8}
MASKED_VARIANTS = {"mixtral": [DECODE_SMALL, DECODE_NARROW], "qwen_moe": [DECODE_NARROW],
                   "deepseek_v3": [DECODE_SMALL, DECODE_NARROW]}
MASKED_CHECK_ROUTINGS = ("empty", "one_full", "zipf", "odd", "clamped")
MASKED_TIMED_DTYPES = ("bfloat16",)  # torch._grouped_mm's dtype; both dtypes are checked
LAYOUTS = ("contiguous", "masked")


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


def topk_counts(routing: str, experts: int, batch: int, topk: int, seed: int = 0) -> list[int]:
    """Rows per expert when ``batch`` tokens each pick ``topk`` distinct experts (decode): ``balanced``
    (round robin) or ``zipf`` (popularity 1 / rank^1.2, ranks shuffled). No count passes ``batch``."""
    rng = random.Random(seed)
    k = min(topk, experts)
    counts = [0] * experts
    if routing == "balanced":
        for b in range(batch):
            for j in range(k):
                counts[(b * k + j) % experts] += 1
        return counts
    if routing == "zipf":
        weights = [1 / (r + 1) ** 1.2 for r in range(experts)]
        rng.shuffle(weights)
        for _ in range(batch):
            picked: set = set()
            while len(picked) < k:
                picked.add(rng.choices(range(experts), weights)[0])
            for e in picked:
                counts[e] += 1
        return counts
    raise ValueError(f"routing {routing!r}: use balanced or zipf")


def masked_counts_of(routing: str, experts: int, max_tokens: int, seed: int = 0) -> list[int]:
    """Counts of a masked-layout check: ``empty`` (every expert), ``one_full`` (one expert with
    max_tokens, the others none), ``zipf`` (top-k decode routing), ``odd`` (random counts, rarely
    multiples of the tile), ``clamped`` (counts past max_tokens and below zero: the kernel clamps)."""
    rng = random.Random(seed)
    if routing == "empty":
        return [0] * experts
    if routing == "one_full":
        counts = [0] * experts
        counts[rng.randrange(experts)] = max_tokens
        return counts
    if routing == "zipf":  # top-k of a quarter of the experts, at most 8 (Mixtral 2 of 8, DeepSeek 8 of 256)
        return topk_counts("zipf", experts, max_tokens, min(8, max(1, experts // 4)), seed)
    if routing == "odd":
        return [rng.randrange(max_tokens + 1) for _ in range(experts)]
    if routing == "clamped":
        return [rng.choice([-5, 0, max_tokens + 1, 2 * max_tokens + 7, rng.randrange(max_tokens + 1)])
                for _ in range(experts)]
    raise ValueError(f"routing {routing!r}: use one of {MASKED_CHECK_ROUTINGS}")


def shape_name(experts: int, N: int, K: int) -> str:
    """The name in SHAPES of (experts, N, K)."""
    return next(name for name, e, n, k in SHAPES if (e, n, k) == (experts, N, K))


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


def row(case: dict, correct: bool, times: dict, layout: str = "contiguous",
        peers: tuple = ("grouped_mm", "cublas_loop")) -> dict:
    """One result row (the issue's format): ``times`` maps each timed party to its median ms as
    kernels in CUDA graphs and as queued calls (None where it did not run); ``peers``: the parties
    whose time over ours goes into ``peer_ratios`` (the masked layout's: grouped_mm, bmm, expert_loop)."""
    ours = times.get("ours", {})

    def ratio(peer, how):
        theirs, mine = times.get(peer, {}).get(how), ours.get(how)
        return theirs / mine if theirs and mine else None

    beside = [r for r in (ratio(peer, "graph_ms") for peer in peers) if r]
    return {"layout": layout, **case, "correct": correct,
            "ratio_to_grouped_mm": ratio("grouped_mm", "graph_ms"),
            "ratio_to_best_peer": min(beside) if beside else None,
            "peer_ratios": {f"{peer}_{how.removesuffix('_ms')}": ratio(peer, how)
                            for peer in peers for how in ("graph_ms", "queued_ms")},
            "times": times}


# -- prepare (build box) ----------------------------------------------------------------------------
def module_plan() -> list[tuple]:
    """(layout, shape name, E, N, K, dtype, knob variant) of every module prepare builds."""
    plan = []
    for layout in LAYOUTS:
        variants = VARIANTS if layout == "contiguous" else MASKED_VARIANTS
        for name, E, N, K in SHAPES:
            for dtype in DTYPES:
                plan += [(layout, name, E, N, K, dtype, v) for v in [{}] + variants.get(name, [])]
    return plan


def prepare(out) -> int:
    # optional: the build layer (TVM's compiler), on the build box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob

    folder = files.open_folder(out)
    modules = []
    for layout, name, E, N, K, dtype, variant in module_plan():
        knobs = {"experts": E, "dtype": dtype, "spec": spec_of_dtype(dtype).text(), **variant}
        if layout == "masked":
            knobs["layout"] = "masked"
        path, _ = module_cache.get_or_build(BuildJob("v12", (BUILD_M, N, K), knobs))
        text = variant_text(variant)
        stem = f"grouped_{name}_{dtype}" + ("_masked" if layout == "masked" else "") + (f"_{text}" if variant else "")
        for src in Path(path).parent.iterdir():
            if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
                shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
        modules.append({"file": f"{stem}.so", "layout": layout, "shape": name, "experts": E, "N": N, "K": K,
                        "dtype": dtype, "variant": text})
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "modules": modules})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


# -- kernel packs (prepare --pack; run serves through the front doors with use_pack) -------------------
PACK_FOLDER = "pack"
PACK_TIMED_DTYPES = ("bfloat16",)  # torch._grouped_mm's dtype; both dtypes are checked


def pack_cases(entries) -> list[dict]:
    """One case a pack entry: its weight and layout, and a token count inside its range (rows of
    A; masked: max_tokens) near the checks' usual size, so that each module of the pack serves one."""
    cases = []
    for e in entries:
        if not kernel_pack.is_grouped(e):
            continue
        lo, hi = e["tokens"]
        usual = CHECK_TOKENS if e["layout"] == "contiguous" else check_max_tokens(e["experts"])
        cases.append({"layout": e["layout"], "experts": e["experts"], "N": e["shape"][1], "K": e["shape"][2],
                      "dtype": e["dtype"], "tokens": max(lo, min(hi, usual)), "file": e["file"],
                      "rule": (e.get("choice") or {}).get("rule")})
    return sorted(cases, key=lambda c: (c["layout"], c["experts"], c["dtype"], c["tokens"]))


def case_item(folder, case: dict) -> str:
    """A case as the one word isolate hands a child job: the pack folder and the case, ``#``-joined."""
    return "#".join([str(folder)] + [str(case[k]) for k in ("layout", "experts", "N", "K", "dtype", "tokens")])


def parse_case_item(item: str) -> tuple[str, dict]:
    folder, layout, E, N, K, dtype, tokens = item.split("#")
    return folder, {"layout": layout, "experts": int(E), "N": int(N), "K": int(K), "dtype": dtype, "tokens": int(tokens)}


def prepare_pack(out) -> int:
    """The SHAPES' weights as a kernel pack (both layouts and dtypes), and the plan of its cases."""
    folder = files.open_folder(out)
    man = kernel_pack.build_pack(folder / PACK_FOLDER, [], list(DTYPES),
                                 grouped=[(E, N, K, None) for _, E, N, K in SHAPES],
                                 request={"grouped": [f"{E},{N},{K}" for _, E, N, K in SHAPES]})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r['detail']}", file=sys.stderr)
    cases = pack_cases(man["modules"])
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "pack": PACK_FOLDER, "cases": cases})
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{len(man['results'])} modules in a pack, {len(cases)} cases, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


def _served(layout, E, N, K, dtype, tokens) -> tuple[str, str]:
    """(source, kernel line) of the front door's route for this call (strict)."""
    index = torch.cuda.current_device()
    route = (grouped_door.route_of(E, N, K, dtype, index, tokens, True) if layout == "contiguous" else
             grouped_masked.route_of(E, N, K, dtype, index, True, tokens))
    return route.source, route.lines[0]


def pack_check_job(item, args) -> dict:
    """One case through the front door with the pack (strict: no fallback): which module served,
    two routings checked with D poisoned, a CUDA graph of the front door replayed after the
    routing changed, then (bf16) timed against torch's peers."""
    folder, c = parse_case_item(item)
    if not any(p.folder == Path(folder) for p in front.packs()):  # once a child (its jobs run one after another)
        gemm_ladder.use_pack(folder)
    E, N, K, dtype, tokens, layout = c["experts"], c["N"], c["K"], c["dtype"], c["tokens"], c["layout"]
    masked = layout == "masked"
    floor, dt = ERROR_FLOOR[dtype], getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(11)
    W = torch.randn(E, N, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    if masked:
        A = torch.randn(E, tokens, K, device="cuda", generator=g, dtype=dt)
        D = torch.empty(E, tokens, N, device="cuda", dtype=dt)
        routings = ("zipf", "odd", "one_full")

        def table(routing, seed):
            return masked_counts_of(routing, E, tokens, seed)

        def call(t):
            gemm_ladder.grouped_mm_masked(A, W, t, out=D, strict=True)

        def errors(values):
            return _masked_errors(A, W, values, D)
    else:
        A = torch.randn(tokens, K, device="cuda", generator=g, dtype=dt)
        D = torch.empty(tokens, N, device="cuda", dtype=dt)
        routings = ("zipf", "odd", "one")

        def table(routing, seed):
            return offsets_of(counts_of(routing, E, tokens, seed))

        def call(t):
            gemm_ladder.grouped_mm(A, W, t, out=D, strict=True)

        def errors(values):
            return _errors(A, W, values, D, tokens)

    source, kernel = _served(layout, E, N, K, dtype, tokens)
    cases, ok_all = [], source == "kernel pack"
    t = torch.tensor(table(routings[0], 0), dtype=torch.int32, device="cuda")
    for i, routing in enumerate(routings[:2]):
        values = table(routing, i)
        t.copy_(torch.tensor(values, dtype=torch.int32))
        D.fill_(float("nan"))
        call(t)
        torch.cuda.synchronize()
        rel, trel, nan, past = errors(values)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        ok_all &= ok
        cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                      "rows_past_written": past})
    # the front door captured once, replayed after the routing changed on the device
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(t)
    values = table(routings[2], 5)
    t.copy_(torch.tensor(values, dtype=torch.int32))
    D.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    rel, trel, nan, past = errors(values)
    graph_ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
    ok_all &= graph_ok
    cases.append({"routing": routings[2] + " (graph replay)", "ok": graph_ok, "rel_err": rel, "torch_rel_err": trel,
                  "nan": nan, "rows_past_written": past})
    out = {"status": "ok" if ok_all else "wrong", "source": source, "kernel": kernel, "cases": cases}
    if ok_all and dtype in PACK_TIMED_DTYPES:
        out["times"] = _pack_times(c, W)
    return out


def _pack_times(c: dict, W) -> dict:
    """The front door (with the pack) against torch._grouped_mm (masked: on the same rows gathered
    contiguous, and a bmm over every slot) on balanced routing, in rotating rounds."""
    E, N, K, tokens, masked = c["experts"], c["N"], c["K"], c["tokens"], c["layout"] == "masked"
    Wt = W.transpose(1, 2)
    l2 = device.probe(0).l2_bytes or (50 << 20)
    counts = counts_of("balanced", E, E * tokens // 2 if masked else tokens)  # masked: each slot half full
    rows = sum(counts)
    per_set = 2 * ((E * tokens if masked else rows) + rows) * (K + N)
    sets = []
    for _ in range(max(2, math.ceil(2 * l2 / (per_set + W.numel() * W.element_size())))):
        A = torch.randn(*((E, tokens) if masked else (rows,)), K, device="cuda").to(W.dtype)
        D = torch.empty(*((E, tokens) if masked else (rows,)), N, device="cuda", dtype=W.dtype)
        table = torch.tensor(counts if masked else offsets_of(counts), dtype=torch.int32, device="cuda")
        sets.append((A, table, D, torch.randn(rows, K, device="cuda").to(W.dtype),
                     torch.tensor(offsets_of(counts), dtype=torch.int32, device="cuda")))

    def ours(A, table, D, Ac, offs):  # pylint: disable=unused-argument
        (gemm_ladder.grouped_mm_masked if masked else gemm_ladder.grouped_mm)(A, W, table, out=D, strict=True)

    def grouped_mm(A, table, D, Ac, offs):  # pylint: disable=unused-argument
        torch._grouped_mm(Ac, Wt, offs=offs)  # pylint: disable=protected-access

    def bmm(A, table, D, Ac, offs):  # pylint: disable=unused-argument
        torch.bmm(A, Wt, out=D)

    parties = {"ours": ours, **({"bmm": bmm} if masked else {})}
    if _grouped_mm_works(sets[0][3], W, sets[0][4]):
        parties["grouped_mm"] = grouped_mm
    return _rounds(parties, sets, 2.0 * rows * N * K)


def pack_results(folder, plan: dict, job: str, sampler, timeout: float, item_of) -> list[dict]:
    """Every case of a ``prepare --pack`` DIR's plan through ``job`` in children (a deadline each,
    ``measure.isolate``), ``item_of(pack folder, case)`` its argument; the clock ``sampler`` stopped
    after, whatever happened. The results in the cases' order."""
    items = [item_of(Path(folder) / plan["pack"], c) for c in plan["cases"]]
    try:
        return isolate.run_batch(job, items, timeout=timeout, explain=False)
    finally:
        sampler.stop()


def run_pack(folder, out, plan: dict) -> int:
    """run for a DIR of prepare --pack: every case in children, rows in the issue's format."""
    sampler, start = Sampler(), time.time()
    cases = plan["cases"]
    results = pack_results(folder, plan, "benchmarks.grouped_check:pack_check_job", sampler, TIME_TIMEOUT, case_item)
    rows = []
    for c, res in zip(cases, results):
        correct = res.get("status") == "ok" and c["file"] in res.get("kernel", "")
        peers = MASKED_PEERS[:2] if c["layout"] == "masked" else ("grouped_mm",)
        base = {k: c[k] for k in ("experts", "N", "K", "dtype", "tokens")}
        rows.append({**row({**base, "routing": "balanced" if res.get("times") else None, "kind": "pack",
                            "served_by": res.get("kernel"), "expected": c["file"], "rule": c["rule"],
                            "cases": res.get("cases"), "detail": None if correct else json.dumps(res)[:2000]},
                           correct, res.get("times") or {}, c["layout"], peers)})
    ratios = [r["ratio_to_grouped_mm"] for r in rows if r["ratio_to_grouped_mm"]]
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"cases": len(rows), "correct": sum(r["correct"] for r in rows),
                          "geomean_ratio_to_grouped_mm": math.exp(statistics.fmean(map(math.log, ratios)))
                          if ratios else None},
              "rows": rows}
    files.write_record(out, result)
    for r in rows:
        print(f"{r['layout']:10s} E={r['experts']:3d} {r['N']}x{r['K']} {r['dtype']:8s} tokens={r['tokens']:6d} "
              f"{r['rule'] or '':16s} correct={r['correct']} x grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
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
            times = _rounds(parties, sets, flops)
            results.append({"tokens": tokens, "routing": routing, "times": times})
    return {"status": "ok", "rows": results}


# -- the masked layout's GPU jobs ---------------------------------------------------------------------
def check_max_tokens(experts: int) -> int:
    """Rows an expert's slot holds in the masked checks: not a multiple of the tile (fewer for 256
    experts of DeepSeek's size, whose A and D would be large)."""
    return 300 if experts <= 64 else 130


def _masked_errors(A, W, counts, D) -> tuple[float, float, int, int]:
    """(our relative error, torch's, NaN outputs in the valid rows, rows past a count that were
    written) against a per-expert fp32 reference; counts are clamped into [0, max_tokens]."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ours_sq = theirs_sq = ref_sq = 0.0
    nan = written_past = 0
    T = A.shape[1]
    for e, c in enumerate(counts):
        c = min(max(c, 0), T)
        if c:
            ref = A[e, :c].float() @ W[e].float().T
            theirs = (A[e, :c] @ W[e].T).float()
            mine = D[e, :c].float()
            nan += int(torch.isnan(mine).sum())
            ours_sq += float(torch.nan_to_num(mine - ref, nan=1e30).square().sum())
            theirs_sq += float((theirs - ref).square().sum())
            ref_sq += float(ref.square().sum())
        written_past += int((~torch.isnan(D[e, c:])).any(dim=1).sum())
    norm = math.sqrt(ref_sq) or 1.0
    return math.sqrt(ours_sq) / norm, math.sqrt(theirs_sq) / norm, nan, written_past


def masked_check_job(path, args) -> dict:
    """Every routing of MASKED_CHECK_ROUTINGS on one masked module, directly, through the front door
    (out poisoned: the rows past the counts must stay NaN) and the op (zeros there); then one CUDA
    graph captured once and replayed after the counts were overwritten in place."""
    mod = use_grouped_module(path)
    E, N, K, dtype = mod.experts, mod.N, mod.K, mod.dtype
    if mod.layout != "masked":
        return {"status": "error", "detail": f"{path} is a {mod.layout} module"}
    floor, T, dt = ERROR_FLOOR[dtype], check_max_tokens(E), getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    W = torch.randn(E, N, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    A = torch.randn(E, T, K, device="cuda", generator=g, dtype=dt)

    def launch(counts_t, D):
        mod.launch(A.view(-1, K), W, counts_t, D.view(-1, N))

    def poisoned():
        return torch.full((E, T, N), float("nan"), dtype=dt, device="cuda")

    cases, ok_all = [], True
    for i, routing in enumerate(MASKED_CHECK_ROUTINGS):
        counts = masked_counts_of(routing, E, T, seed=i)
        counts_t = torch.tensor(counts, dtype=torch.int32, device="cuda")
        D = poisoned()
        launch(counts_t, D)
        torch.cuda.synchronize()
        rel, trel, nan, past = _masked_errors(A, W, counts, D)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        front = poisoned()
        gemm_ladder.grouped_mm_masked(A, W, counts_t, out=front)
        op = torch.ops.gemm_ladder.grouped_mm_masked(A, W, counts_t)
        valid = (torch.arange(T, device="cuda")[None, :] < counts_t.clamp(0, T)[:, None])[..., None].expand(E, T, N)
        same = bool(torch.equal(front[valid], D[valid]) and torch.equal(op[valid], D[valid]))
        front_kept = bool(torch.isnan(front[~valid]).all())  # rows past the counts untouched in out
        op_zero = bool((op[~valid] == 0).all())  # the op's rows past the counts: zeros
        ok = ok and same and front_kept and op_zero
        ok_all &= ok
        cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                      "tokens": sum(min(max(c, 0), T) for c in counts), "rows_past_counts_written": past,
                      "front_door_and_op_same": same,
                      "front_door_rows_past_kept": front_kept, "op_rows_past_zero": op_zero,
                      "counts_head": counts[:8]})
    # one graph captured on one routing, replayed with others written into the same counts tensor
    routings = ("zipf", "one_full", "empty", "odd")
    counts_t = torch.tensor(masked_counts_of(routings[0], E, T), dtype=torch.int32, device="cuda")
    D = poisoned()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(counts_t, D)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(counts_t, D)
    graph_cases = []
    for j, routing in enumerate(routings):
        counts = masked_counts_of(routing, E, T, seed=100 + j)
        counts_t.copy_(torch.tensor(counts, dtype=torch.int32))
        D.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rel, trel, nan, past = _masked_errors(A, W, counts, D)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        ok_all &= ok
        graph_cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                            "rows_past_counts_written": past})
    return {"status": "ok" if ok_all else "wrong", "cases": cases, "graph_replays": graph_cases}


def _rounds(parties: dict, sets: list, flops: float) -> dict:
    """:func:`time_rounds` at this check's :data:`ROUNDS`."""
    return time_rounds(parties, sets, flops)


def time_rounds(parties: dict, sets: list, flops: float | None = None, rounds: int = ROUNDS) -> dict:
    """Median ms of every party as kernels in CUDA graphs, as queued calls between event pairs and as a
    stream of calls (``harness.stream_ms``: the wall clock, host included; one sample a round of
    ``PER_ROUND x calls`` calls), in ``rounds`` rounds whose order rotates (and reverses every other
    round), :data:`PER_ROUND` samples a party a round;
    also each round's median graph time (``graph_round_ms``: the spread between rounds) and, with
    ``flops``, TFLOPS as kernels. The grouped checks share it (grouped_fp8_check, grouped_suite,
    grouped_swiglu_check, grouped_prefill_check)."""
    calls = max(len(sets), 2)
    samples = {p: {"graph": [], "queued": [], "stream": []} for p in parties}
    names = list(parties)
    for fn in parties.values():  # warm up, and capture each graph once
        harness.graph_times(fn, sets, reps=1, calls=calls)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order.reverse()
        for p in order:
            samples[p]["graph"] += harness.graph_times(parties[p], sets, reps=PER_ROUND, calls=calls)
            samples[p]["queued"] += harness.event_times(parties[p], sets, reps=PER_ROUND * calls, start=r)
            samples[p]["stream"].append(harness.stream_ms(parties[p], sets, reps=PER_ROUND * calls, start=r))
    out = {}
    for p, s in samples.items():
        graph = statistics.median(s["graph"])
        out[p] = {"graph_ms": graph, "queued_ms": statistics.median(s["queued"]),
                  "stream_ms": statistics.median(s["stream"]),
                  "graph_round_ms": [statistics.median(s["graph"][i:i + PER_ROUND])
                                     for i in range(0, len(s["graph"]), PER_ROUND)]}
        if flops is not None:
            out[p]["tflops_graph"] = flops / graph / 1e9
    return out


def masked_time_job(path, args) -> dict:
    """Ours against torch._grouped_mm on the same rows gathered contiguous (the gather not timed),
    a cuBLAS bmm over every slot's max_tokens rows (a decode graph without masking) and a loop of
    cuBLAS GEMMs over the experts with rows (counts handed to it on the host for free), per decode
    batch of the shape and routing."""
    mod = use_grouped_module(path)
    E, N, K, dtype = mod.experts, mod.N, mod.K, mod.dtype
    topk, batches = MASKED_SHAPES[shape_name(E, N, K)]
    l2 = device.probe(0).l2_bytes or (50 << 20)
    W = torch.randn(E, N, K, device="cuda", dtype=getattr(torch, dtype)).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    results = []
    for batch in batches:
        for routing in TIMED_ROUTINGS:
            counts = topk_counts(routing, E, batch, topk, seed=batch)
            tokens, T = sum(counts), batch  # a token picks an expert at most once: a slot of batch rows
            offs_list = offsets_of(counts)
            per_set = 2 * (E * T * (K + N) + tokens * (K + N))
            n_sets = max(2, math.ceil(2 * l2 / (per_set + W.numel() * W.element_size())))
            sets = []
            for _ in range(n_sets):
                A = torch.randn(E, T, K, device="cuda").to(W.dtype)
                sets.append((A, torch.tensor(counts, dtype=torch.int32, device="cuda"),
                             torch.empty(E, T, N, dtype=W.dtype, device="cuda"),
                             torch.randn(tokens, K, device="cuda").to(W.dtype),
                             torch.tensor(offs_list, dtype=torch.int32, device="cuda")))
            live = [(e, c) for e, c in enumerate(counts) if c]

            def ours(A, counts_t, D, Ac, offs):  # pylint: disable=unused-argument
                mod.launch(A.view(-1, K), W, counts_t, D.view(-1, N))

            def grouped_mm(A, counts_t, D, Ac, offs):  # pylint: disable=unused-argument
                torch._grouped_mm(Ac, Wt, offs=offs)  # pylint: disable=protected-access

            def bmm(A, counts_t, D, Ac, offs):  # pylint: disable=unused-argument
                torch.bmm(A, Wt, out=D)

            def expert_loop(A, counts_t, D, Ac, offs):  # pylint: disable=unused-argument
                for e, c in live:
                    torch.matmul(A[e, :c], W[e].T, out=D[e, :c])

            parties = {"ours": ours, "bmm": bmm, "expert_loop": expert_loop}
            if tokens and _grouped_mm_works(sets[0][3], W, sets[0][4]):
                parties["grouped_mm"] = grouped_mm
            times = _rounds(parties, sets, 2.0 * tokens * N * K)
            results.append({"tokens": tokens, "max_tokens": T, "batch": batch, "topk": topk, "routing": routing,
                            "active_experts": len(live), "times": times})
    return {"status": "ok", "rows": results}


# -- decode: swap AB and the warp scan beside the 64x128 decode module (prepare --decode) ---------------
# The decode modules side by side, per (layout, shape), timed in the same rounds in one process: the
# pack's decode module until now (64x128 tiles, one consumer, 8 stages), the same with the warp scan
# (its prologue alone), and swap AB with 16- and 32-token tiles (W's 128 rows over two consumers);
# the odd shape is checked only (N and K off the tile: W rows past N, K past the slice).
DECODE = "decode"  # the plan's key
DECODE_SHAPES = ("mixtral", "qwen_moe", "deepseek_v3")
DECODE_TOKENS = (8, 64, 256)  # rows of a decode step in all (batch x top-k)
NARROW = {"blk_m": 64, "num_warpgroups": 1, "blk_n": 128, "pipe_depth": 8}  # the pack's decode module before
SWAP = {"swap_ab": True, "blk_n": 128, "num_warpgroups": 2, "pipe_depth": 8, "warp_scan": True}
DECODE_VARIANTS = {"narrow": NARROW, "narrow_scan": {**NARROW, "warp_scan": True},
                   "swap16": {**SWAP, "blk_m": 16}, "swap32": {**SWAP, "blk_m": 32}}
DECODE_BASELINE = "narrow"
DECODE_ODD = (("float16", "swap16"), ("bfloat16", "swap16"), ("bfloat16", "swap32"))  # checked only
DECODE_TOPK = {"mixtral": 2, "qwen_moe": 8, "deepseek_v3": 8}


def decode_plan() -> list[tuple]:
    """(layout, shape name, E, N, K, dtype, variant name) of every module ``prepare --decode`` builds."""
    shapes = {name: (E, N, K) for name, E, N, K in SHAPES}
    plan = []
    for layout in LAYOUTS:
        plan += [(layout, name, *shapes[name], "bfloat16", v) for name in DECODE_SHAPES for v in DECODE_VARIANTS]
        plan += [(layout, "odd", *shapes["odd"], dtype, v) for dtype, v in DECODE_ODD]
    return plan


def prepare_decode(out) -> int:
    """The decode variants' modules (:func:`decode_plan`) into DIR, and the plan ``run`` follows."""
    # optional: the build layer (TVM's compiler), on the build box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob

    folder = files.open_folder(out)
    modules = []
    for layout, name, E, N, K, dtype, variant in decode_plan():
        knobs = {"experts": E, "dtype": dtype, "spec": spec_of_dtype(dtype).text(), "layout": layout,
                 **DECODE_VARIANTS[variant]}
        path, _ = module_cache.get_or_build(BuildJob("v12", (BUILD_M, N, K), knobs))
        stem = f"grouped_decode_{name}_{dtype}_{layout}_{variant}"
        for src in Path(path).parent.iterdir():
            if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
                shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
        modules.append({"file": f"{stem}.so", "layout": layout, "shape": name, "experts": E, "N": N, "K": K,
                        "dtype": dtype, "variant": variant})
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, DECODE: True, "modules": modules})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} decode modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


def variant_of(stem: str) -> str:
    """The decode variant a module's file stem ends with (``prepare_decode``'s names)."""
    return max((v for v in DECODE_VARIANTS if stem.endswith("_" + v)), key=len)


def decode_groups(modules: list[dict]) -> list[list[dict]]:
    """The timed groups: per (layout, shape) of DECODE_SHAPES, its variants' modules, baseline first."""
    order = list(DECODE_VARIANTS)
    groups: dict = {}
    for m in modules:
        if m["shape"] in DECODE_SHAPES:
            groups.setdefault((m["layout"], m["shape"]), []).append(m)
    return [sorted(g, key=lambda m: order.index(m["variant"])) for _, g in sorted(groups.items())]


def decode_sets(E: int, active: int, N: int, K: int, l2: int) -> int:
    """Input sets a decode case cycles through: each its own weights (a layer's are cold in L2),
    enough that the active experts' weights of all sets pass three times the L2 (at least 2)."""
    return max(2, math.ceil(3 * l2 / max(1, 2 * active * N * K)))


def decode_time_job(item, args) -> dict:
    """One (layout, shape)'s decode modules (``item``: their paths, ``#``-joined) and torch's peers
    in the same rotating rounds, per decode step of DECODE_TOKENS rows and routing; each variant
    first checked at that step (D poisoned: the rows past the counts must stay NaN)."""
    mods = [grouped_door.GroupedModule(runtime.load(p)) for p in item.split("#")]
    names = [variant_of(Path(p).stem) for p in item.split("#")]
    first = mods[0]
    E, N, K, dtype, layout = first.experts, first.N, first.K, first.dtype, first.layout
    masked = layout == "masked"
    topk = DECODE_TOPK[shape_name(E, N, K)]
    l2 = device.probe(0).l2_bytes or (50 << 20)
    dt = getattr(torch, dtype)
    results = []
    for tokens in DECODE_TOKENS:
        batch = max(1, tokens // topk)
        for routing in TIMED_ROUTINGS:
            counts = topk_counts(routing, E, batch, topk, seed=tokens)
            rows, T = sum(counts), batch  # masked: a slot of batch rows (a token picks an expert once)
            live = [(e, c) for e, c in enumerate(counts) if c]
            offs_list = offsets_of(counts)
            sets = []
            for _ in range(decode_sets(E, len(live), N, K, l2)):
                W = torch.randn(E, N, K, device="cuda", dtype=dt).div_(math.sqrt(K))
                A = torch.randn(*((E, T) if masked else (rows,)), K, device="cuda", dtype=dt)
                D = torch.empty(*((E, T) if masked else (rows,)), N, device="cuda", dtype=dt)
                table = torch.tensor(counts if masked else offs_list, dtype=torch.int32, device="cuda")
                gathered = torch.cat([A[e, :c] for e, c in live]) if masked else A
                sets.append((A, table, D, gathered, torch.tensor(offs_list, dtype=torch.int32, device="cuda"), W))

            def ours_of(mod):
                def ours(A, table, D, Ac, offs, W):  # pylint: disable=unused-argument
                    if masked:
                        mod.launch(A.view(-1, K), W, table, D.view(-1, N))
                    else:
                        mod.launch(A, W, table, D)
                return ours

            def grouped_mm(A, table, D, Ac, offs, W):  # pylint: disable=unused-argument
                torch._grouped_mm(Ac, W.transpose(1, 2), offs=offs)  # pylint: disable=protected-access

            def bmm(A, table, D, Ac, offs, W):  # pylint: disable=unused-argument
                torch.bmm(A, W.transpose(1, 2), out=D)

            def expert_loop(A, table, D, Ac, offs, W):  # pylint: disable=unused-argument
                start = 0
                for e, c in live:
                    if masked:
                        torch.matmul(A[e, :c], W[e].T, out=D[e, :c])
                    else:
                        torch.matmul(A[start:start + c], W[e].T, out=D[start:start + c])
                    start += c

            # correctness at this step first: D poisoned, every variant alone
            checks = {}
            A, table, D, _, _, W = sets[0]
            for name, mod in zip(names, mods):
                D.fill_(float("nan"))
                ours_of(mod)(*sets[0])
                torch.cuda.synchronize()
                rel, trel, nan, past = (_masked_errors(A, W, counts, D) if masked else
                                        _errors(A, W, offs_list, D, rows))
                checks[name] = {"ok": nan == 0 and past == 0 and rel <= 2 * trel + ERROR_FLOOR[dtype],
                                "rel_err": rel, "torch_rel_err": trel, "nan": nan, "rows_past_written": past}
            parties = {f"ours:{name}": ours_of(mod) for name, mod in zip(names, mods) if checks[name]["ok"]}
            parties["expert_loop"] = expert_loop
            if masked:
                parties["bmm"] = bmm
            if rows and _grouped_mm_works(sets[0][3], sets[0][5], sets[0][4]):
                parties["grouped_mm"] = grouped_mm
            times = _rounds(parties, sets, 2.0 * rows * N * K)
            results.append({"tokens": rows, "max_tokens": T if masked else None, "batch": batch, "topk": topk,
                            "routing": routing, "active_experts": len(live), "sets": len(sets),
                            "checks": checks, "times": times})
            del sets
    return {"status": "ok", "rows": results}


DECODE_PEERS = {"masked": ("grouped_mm", "bmm", "expert_loop"), "contiguous": ("grouped_mm", "expert_loop")}


def decode_rows(group: list[dict], checks: dict, timing: dict | None) -> list[dict]:
    """A group's rows in the issue's format: per timed case, one row per variant (``variant``),
    its time as ``ours`` beside the peers of the same rounds, and ``ratio_to_baseline`` (the
    narrow module's time over the variant's)."""
    rows = []
    for r in (timing or {}).get("rows", []):
        base_ms = r["times"].get(f"ours:{DECODE_BASELINE}", {}).get("graph_ms")
        for m in group:
            v = m["variant"]
            mine = r["times"].get(f"ours:{v}", {})
            times = {"ours": mine, **{p: r["times"][p] for p in DECODE_PEERS[m["layout"]] if p in r["times"]}}
            correct = checks.get(m["file"], {}).get("status") == "ok" and r["checks"].get(v, {}).get("ok", False)
            case = {"experts": m["experts"], "N": m["N"], "K": m["K"], "dtype": m["dtype"], "shape": m["shape"],
                    "variant": v, "tokens": r["tokens"], "routing": r["routing"], "kind": "decode",
                    **{k: r[k] for k in ("max_tokens", "batch", "topk", "active_experts", "sets")},
                    "step_check": r["checks"].get(v),
                    "ratio_to_baseline": base_ms / mine["graph_ms"] if base_ms and mine.get("graph_ms") else None}
            rows.append(row(case, correct, times, m["layout"], DECODE_PEERS[m["layout"]]))
    return rows


def decode_summary(rows: list[dict]) -> dict:
    """Per layout and variant: geomeans (and least) of the ratio to torch._grouped_mm, to the best
    peer (issue 33's decode target: >= 1.05 at <= 256 tokens) and to the narrow module."""
    def stats(values):
        values = [v for v in values if v]
        return {"geomean": math.exp(statistics.fmean(map(math.log, values))) if values else None,
                "min": min(values) if values else None}

    out: dict = {}
    for r in rows:
        out.setdefault(r["layout"], {}).setdefault(r["variant"], []).append(r)
    return {layout: {v: {"cases": len(rs), "correct": sum(r["correct"] for r in rs),
                         "to_grouped_mm": stats(r["ratio_to_grouped_mm"] for r in rs),
                         "to_best_peer": stats(r["ratio_to_best_peer"] for r in rs),
                         "to_baseline": stats(r["ratio_to_baseline"] for r in rs)} for v, rs in by.items()}
            for layout, by in out.items()}


def run_decode(folder, out, plan: dict) -> int:
    """run for a DIR of prepare --decode: every module checked (the layouts' check jobs), then each
    (layout, shape)'s variants timed together at decode steps; rows with ``variant``."""
    sampler, start = Sampler(), time.time()
    modules = plan["modules"]
    job = "benchmarks.grouped_check:"
    checks: dict = {}
    timed: list = []
    try:
        for layout, name in (("contiguous", "check_job"), ("masked", "masked_check_job")):
            mine = [m for m in modules if m["layout"] == layout]
            results = isolate.run_batch(job + name, [str(folder / m["file"]) for m in mine], timeout=CHECK_TIMEOUT,
                                        explain=False)
            checks.update({m["file"]: r for m, r in zip(mine, results)})
        groups = [[m for m in g if checks[m["file"]].get("status") == "ok"] for g in decode_groups(modules)]
        groups = [g for g in groups if g]
        items = ["#".join(str(folder / m["file"]) for m in g) for g in groups]
        timed = isolate.run_batch(job + "decode_time_job", items, timeout=TIME_TIMEOUT, explain=False)
    finally:
        sampler.stop()
    rows = []
    for g, t in zip(groups, timed):
        rows += decode_rows(g, checks, t)
    failures = [{"file": f, "check": c} for f, c in checks.items() if c.get("status") != "ok"]
    failures += [{"group": [m["file"] for m in g], "time": t} for g, t in zip(groups, timed) if t.get("status") != "ok"]
    for f in failures:
        m = next((m for m in modules if m["file"] == f.get("file")), {})
        rows.append(row({"experts": m.get("experts"), "N": m.get("N"), "K": m.get("K"), "dtype": m.get("dtype"),
                         "shape": m.get("shape"), "variant": m.get("variant"), "tokens": None, "routing": None,
                         "kind": "failure", "detail": json.dumps(f)[:4000]}, False, {}, m.get("layout", "masked")))
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"modules": len(modules), "correct_modules": sum(c.get("status") == "ok" for c in checks.values()),
                          "by_variant": decode_summary([r for r in rows if r["kind"] == "decode"])},
              "checks": checks, "rows": rows}
    files.write_record(out, result)
    for r in rows:
        if r["kind"] == "decode":
            print(f"{r['layout']:10s} {r['shape']:11s} {r['variant']:11s} tokens={r['tokens']:4d} {r['routing']:8s} "
                  f"correct={r['correct']} x grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f} x best "
                  f"{r['ratio_to_best_peer'] or 0:.3f} x {DECODE_BASELINE} {r['ratio_to_baseline'] or 0:.3f}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


# -- run (GPU box) ------------------------------------------------------------------------------------
MASKED_PEERS = ("grouped_mm", "bmm", "expert_loop")


def module_rows(m: dict, check: dict, timing: dict | None, was_timed: bool) -> list[dict]:
    """One module's rows: a row per checked routing, per timed case, and one for a failure."""
    layout = m.get("layout", "contiguous")
    masked = layout == "masked"
    kw = {"layout": layout, "peers": MASKED_PEERS if masked else ("grouped_mm", "cublas_loop")}
    base = {"experts": m["experts"], "N": m["N"], "K": m["K"], "dtype": m["dtype"], "shape": m["shape"],
            "variant": m.get("variant", "default")}
    correct = check.get("status") == "ok"
    rows = []
    for case in check.get("cases", []):
        rows.append(row({**base, "tokens": case.get("tokens", CHECK_TOKENS), "routing": case["routing"],
                         "kind": "check",
                         "rel_err": case["rel_err"], "torch_rel_err": case["torch_rel_err"]}, case["ok"], {}, **kw))
    t = timing or {}
    for r in t.get("rows", []):
        extra = {k: r[k] for k in ("max_tokens", "batch", "topk", "active_experts") if k in r}
        rows.append(row({**base, "tokens": r["tokens"], "routing": r["routing"], "kind": "timed", **extra}, correct,
                        r["times"], **kw))
    if not correct or (was_timed and t.get("status") != "ok"):
        rows.append(row({**base, "tokens": None, "routing": None, "kind": "failure",
                         "detail": json.dumps({"check": check, "time": t})[:4000]}, False, {}, **kw))
    return rows


def summary_of(rows: list[dict]) -> dict:
    """Per layout, of the default knobs' timed rows: the geomean and least ratio to torch._grouped_mm;
    for the masked layout also to the best peer at total tokens <= 256 (the issue's decode target)."""
    out = {}
    for layout in LAYOUTS:
        mine = [r for r in rows if r["layout"] == layout and r["kind"] == "timed" and r["variant"] == "default"]
        ratios = [r["ratio_to_grouped_mm"] for r in mine if r["ratio_to_grouped_mm"]]
        out[layout] = {"geomean_ratio_to_grouped_mm": math.exp(statistics.fmean(map(math.log, ratios)))
                       if ratios else None, "min_ratio_to_grouped_mm": min(ratios) if ratios else None}
        if layout == "masked":
            best = [r["ratio_to_best_peer"] for r in mine if r["ratio_to_best_peer"] and r["tokens"] <= 256]
            out[layout]["decode_geomean_ratio_to_best_peer"] = (math.exp(statistics.fmean(map(math.log, best)))
                                                                if best else None)
            out[layout]["decode_min_ratio_to_best_peer"] = min(best) if best else None
    return out


def gpu_plan(folder, plan_file: str, fmt: str, who: str) -> dict | None:
    """The plan ``prepare`` wrote into ``folder``, on a box with a GPU; None (after saying why on
    stderr, naming ``who``) where there is no GPU or the file is another script's plan."""
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"{who} run: no GPU here ({why}): run it on the GPU box", file=sys.stderr)
        return None
    path = Path(folder) / plan_file
    plan = json.loads(path.read_text())
    if plan.get("format") != fmt:
        print(f"{who} run: {path} is not a {fmt} plan: run prepare again", file=sys.stderr)
        return None
    return plan


def run(folder, out, layouts=LAYOUTS) -> int:
    folder = Path(folder)
    plan = gpu_plan(folder, PLAN_FILE, FORMAT, "grouped_check")
    if plan is None:
        return 2
    if "pack" in plan:
        return run_pack(folder, out, plan)
    if plan.get(DECODE):
        return run_decode(folder, out, plan)
    sampler, start = Sampler(), time.time()
    modules = [m for m in plan["modules"] if m.get("layout", "contiguous") in layouts]
    paths = [str(folder / m["file"]) for m in modules]
    job = "benchmarks.grouped_check:"
    checks: dict = {}
    timed: dict = {}
    try:
        for layout, check_name, time_name in (("contiguous", "check_job", "time_job"),
                                              ("masked", "masked_check_job", "masked_time_job")):
            mine = [p for m, p in zip(modules, paths) if m.get("layout", "contiguous") == layout]
            if not mine:
                continue
            checks.update(zip(mine, isolate.run_batch(job + check_name, mine, timeout=CHECK_TIMEOUT, explain=False)))
            good = [p for m, p in zip(modules, paths) if p in mine and checks[p].get("status") == "ok"
                    and (layout == "contiguous" or (m["dtype"] in MASKED_TIMED_DTYPES
                                                    and MASKED_SHAPES[m["shape"]][1]))]  # odd: no decode batches
            timed.update(zip(good, isolate.run_batch(job + time_name, good, timeout=TIME_TIMEOUT, explain=False)))
    finally:
        sampler.stop()
    rows = []
    for m, path in zip(modules, paths):
        rows += module_rows(m, checks[path], timed.get(path), path in timed)
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"modules": len(paths),
                          "correct_modules": sum(c.get("status") == "ok" for c in checks.values()), **summary_of(rows)},
              "checks": [checks[p] for p in paths], "rows": rows}
    files.write_record(out, result)
    for r in rows:
        if r["kind"] == "timed":
            peers = "  ".join(f"x {k.removesuffix('_graph')} {v or 0:.3f}" for k, v in r["peer_ratios"].items()
                              if k.endswith("_graph"))
            print(f"{r['layout']:10s} {r['shape']:11s} {r['variant']:8s} {r['dtype']:8s} tokens={r['tokens']:5d} "
                  f"{r['routing']:8s} {peers}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, r, _ = check_cli.subcommands(__doc__, "build box: the v12 modules of SHAPES x DTYPES into DIR",
                                        "GPU box: check, capture and time every module of DIR", "grouped_check.json")
    pr.add_argument("--pack", action="store_true", help="a kernel pack of the SHAPES' weights instead (pack build "
                                                          "--grouped); run serves it through the front doors")
    pr.add_argument("--decode", action="store_true", help="the decode variants instead (swap AB, the warp scan, "
                                                            "the 64x128 module); run times them side by side")
    r.add_argument("--layout", choices=("both",) + LAYOUTS, default="both",
                   help="the modules of one layout only (masked: about 2 minutes on an H100)")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        if a.pack and a.decode:
            p.error("prepare: --pack or --decode, not both")
        return prepare_pack(a.out) if a.pack else prepare_decode(a.out) if a.decode else prepare(a.out)
    check_cli.require_in_name(p, a.out, "grouped", 33)
    return run(a.folder, a.out, LAYOUTS if a.layout == "both" else (a.layout,))


if __name__ == "__main__":
    sys.exit(main())
