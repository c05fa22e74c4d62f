"""The grouped SwiGLU (v12 with the gated epilogue, ``gemm_ladder.grouped_swiglu``) on a GPU: correct
under the routing a model makes, CUDA-graph capturable with changing counts, and timed against
torch's unfused path and our own grouped_mm followed by torch's elementwise, at MoE shapes.

``prepare DIR`` (build box) builds, through the module cache, the gated modules the pack would hold
for each weight of :data:`SHAPES` (``plan.grouped_choices(..., epilogue="swiglu")``: the 64x128
module for few rows an expert and the 128x256 defaults past it) in both dtypes, and for the timed
bf16 cases the plain v12 modules of W_gu [E, 2I, K] the grouped_mm policy serves at those token counts
(our grouped_mm, the second peer); it copies them with their manifests and ``grouped_swiglu_check.json``
into DIR. ``run DIR --out FILE.json`` (GPU box: TVM runtime and torch only):

1. correctness, each gated module in a child process with a deadline (``gemm_ladder.measure.isolate``):
   random inputs, H poisoned with NaN, the six routings of ``grouped_check`` (balanced, Zipf, one
   expert with every token, counts that are not multiples of the tile, half the experts empty, and
   rows past ``offs[-1]`` that must stay NaN), error against a per-expert fp32 reference of
   silu(A Wg^T) * (A Wu^T) with torch's unfused error (its own products and elementwise in the
   dtype) as the yardstick; the front door and the op must give the kernel's bits; then one CUDA
   graph captured on one routing and replayed after ``offs`` was overwritten with others;
2. timing (bf16), a child per weight: each gated module, torch's unfused path
   (``torch._grouped_mm`` into h [T, 2I], then ``F.silu(h[:, :I]) * h[:, I:]``) and our grouped_mm
   (the policy's module for the token count) then torch's elementwise, taking turns in rotating
   rounds in one process, as queued calls and as kernels in CUDA graphs cycling input sets that
   spill L2 (``grouped_check._rounds``), at :data:`TOKENS` rows and balanced / Zipf routing;
3. rows in issue 33's results format plus ``op: "swiglu"`` (``ratio_to_grouped_mm`` = torch's unfused
   time over ours, graphs; ``peer_ratios``), ``policy`` marking the module the pack serves at that
   count, the GPU, its clocks and the commit.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_swiglu_check.py prepare build/gswiglu          # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_swiglu_check.py run build/gswiglu --out out/grouped_swiglu.json  # GPU box

The masked layout (``grouped_swiglu_masked``): the decode module of each weight (bf16; fp16 too at the
odd shape) is checked by ``masked_check_job`` (grouped_check's masked routings, rows past each count
poisoned and kept, the front door and the op, a graph replayed with new counts); not timed.

Beside the policy's gated tiers, :data:`EXTRA_VARIANTS` (bf16) are checked and timed (rows with
``policy`` false), to measure the tiers' rule.

About 2-3 minutes on an H100 (an estimate until the first run); DIR about 6.5 MiB (29 modules).
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
import torch.nn.functional as F  # noqa: E402
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)
import grouped_check as gc  # noqa: E402  (a sibling script: the routings, the rounds, the row format)

import gemm_ladder  # noqa: E402
import gemm_ladder.serve.grouped_ops  # noqa: E402,F401  (registers torch.ops.gemm_ladder.grouped_swiglu)
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve import plan as policy, runtime  # noqa: E402
from gemm_ladder.serve.grouped import GroupedModule, use_grouped_module  # noqa: E402

FORMAT = "gemm_ladder.grouped_swiglu_check"
PLAN_FILE = "grouped_swiglu_check.json"
# (name, experts, I, K): W_gu [E, 2I, K]. Mixtral-like (8 experts, I = 14336, K = 4096), Qwen-MoE-like
# (64 of I = 1408, K = 2048), DeepSeek-V3-like (256 of I = 2048, K = 7168), and an odd one for the edges
# (I not a multiple of the tile's 128 gate columns, K not of the 64-wide slice)
SHAPES = [("mixtral", 8, 14336, 4096), ("qwen_moe", 64, 1408, 2048), ("deepseek_v3", 256, 2048, 7168),
          ("odd", 5, 504, 520)]
DTYPES = ("float16", "bfloat16")
TIMED_DTYPE = "bfloat16"  # torch._grouped_mm's
BUILD_M = 4096  # the M the modules are built at (M is read at run time)
CHECK_TOKENS = 1000  # rows of A in the correctness cases (not a multiple of the tile)
TOKENS = (512, 2048, 8192)  # rows of A in the timed cases (tokens x top-k)
TIMED_ROUTINGS = ("balanced", "zipf")
CHECK_TIMEOUT, TIME_TIMEOUT = 120.0, 150.0
ERROR_FLOOR = gc.ERROR_FLOOR
PEERS = ("torch_unfused", "grouped_mm_then_torch")
# gated tiles beside the policy's (bf16, checked and timed, never the policy's: tokens None): 128x128 over two
# consumers, twice the work units of 128x256 where an expert holds a few hundred rows
EXTRA_VARIANTS = {"mixtral": [{"blk_n": 128}], "qwen_moe": [{"blk_n": 128}], "deepseek_v3": [{"blk_n": 128}]}
# the masked layout (grouped_swiglu_masked, decode): its decode module checked in these dtypes (correctness only)
MASKED_DTYPES = {"mixtral": ("bfloat16",), "qwen_moe": ("bfloat16",), "deepseek_v3": ("bfloat16",),
                 "odd": ("float16", "bfloat16")}


# -- pure Python (the CPU tests check it) -------------------------------------------------------------
def serving(choices, tokens: int):
    """The choice of ``choices`` (``plan.grouped_choices``) whose token range holds ``tokens``."""
    return next(g.choice for g in choices if g.tokens[0] <= tokens <= g.tokens[1])


def tier_name(choice) -> str:
    """A module's short name in files and rows: its rule without the ``grouped-`` prefix."""
    return choice.rule.removeprefix("grouped-")


def module_plan(shapes=SHAPES, dtypes=DTYPES, tokens=TOKENS) -> list[dict]:
    """Every module prepare builds: each gated tier of each weight in each dtype (``kind`` swiglu), and
    the plain grouped_mm modules of W_gu that serve the timed token counts in bf16 (``kind`` mm), each
    with its knobs and token range."""
    out = []
    for name, E, I, K in shapes:
        for dtype in dtypes:
            for g in policy.grouped_choices(E, 2 * I, K, dtype, "contiguous", epilogue="swiglu"):
                out.append({"kind": "swiglu", "shape": name, "experts": E, "I": I, "K": K, "dtype": dtype,
                            "tier": tier_name(g.choice), "tokens": list(g.tokens), "knobs": dict(g.choice.knobs)})
            for knobs in EXTRA_VARIANTS.get(name, []) if dtype == TIMED_DTYPE else []:
                base = policy.grouped_choices(E, 2 * I, K, dtype, "contiguous", epilogue="swiglu")[-1].choice
                out.append({"kind": "swiglu", "shape": name, "experts": E, "I": I, "K": K, "dtype": dtype,
                            "tier": "_".join(f"{k}{v}" for k, v in sorted(knobs.items())), "tokens": None,
                            "knobs": {**base.knobs, **knobs}})
            if dtype in MASKED_DTYPES.get(name, ()):  # the masked layout's decode module (a slot of a few tokens)
                g = policy.grouped_choices(E, 2 * I, K, dtype, "masked", epilogue="swiglu")[0]
                out.append({"kind": "swiglu_masked", "shape": name, "experts": E, "I": I, "K": K, "dtype": dtype,
                            "tier": tier_name(g.choice), "tokens": list(g.tokens), "knobs": dict(g.choice.knobs)})
        if name == "odd":
            continue
        plain = policy.grouped_choices(E, 2 * I, K, TIMED_DTYPE, "contiguous")
        for choice in {tier_name(c): c for c in (serving(plain, t) for t in tokens)}.values():
            lo, hi = next(g.tokens for g in plain if g.choice is choice)
            out.append({"kind": "mm", "shape": name, "experts": E, "I": I, "K": K, "dtype": TIMED_DTYPE,
                        "tier": tier_name(choice), "tokens": [lo, hi], "knobs": dict(choice.knobs)})
    for m in out:
        m["file"] = f"gswiglu_{m['shape']}_{m['dtype']}_{m['kind']}_{m['tier']}.so"
    return out


def for_tokens(modules: list[dict], kind: str, tokens: int) -> dict | None:
    """The module of ``kind`` among one weight's ``modules`` whose token range holds ``tokens``."""
    return next((m for m in modules if m["kind"] == kind and m["tokens"] and m["tokens"][0] <= tokens <= m["tokens"][1]),
                None)


def swiglu_reference(A, W_gu, offs_list, dtype_path: bool = False):
    """Per expert e: silu(A_e Wg_e^T) * (A_e Wu_e^T) in fp32 (``dtype_path``: torch's unfused path in
    A's dtype, its products and elementwise rounded as it rounds them), the rows past offs[-1] left
    out; a list of (start, end, H_e)."""
    I = W_gu.shape[1] // 2
    out, start = [], 0
    for e, end in enumerate(offs_list):
        if end > start:
            if dtype_path:
                h = A[start:end] @ W_gu[e].T
                out.append((start, end, (F.silu(h[:, :I]) * h[:, I:]).float()))
            else:
                h = A[start:end].float() @ W_gu[e].float().T
                out.append((start, end, F.silu(h[:, :I]) * h[:, I:]))
        start = end
    return out


def errors(A, W_gu, offs_list, H, M) -> tuple[float, float, int, int]:
    """(our relative error, torch's unfused one, NaN outputs inside the experts' rows, rows past
    offs[-1] that were written) against :func:`swiglu_reference`."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ours_sq = theirs_sq = ref_sq = 0.0
    nan = 0
    for (s, t, ref), (_, _, theirs) in zip(swiglu_reference(A, W_gu, offs_list),
                                           swiglu_reference(A, W_gu, offs_list, dtype_path=True)):
        mine = H[s:t].float()
        nan += int(torch.isnan(mine).sum())
        ours_sq += float(torch.nan_to_num(mine - ref, nan=1e30).square().sum())
        theirs_sq += float((theirs - ref).square().sum())
        ref_sq += float(ref.square().sum())
    end = max([0] + list(offs_list))
    written_past = int((~torch.isnan(H[end:M])).any(dim=1).sum()) if end < M else 0
    norm = math.sqrt(ref_sq) or 1.0
    return math.sqrt(ours_sq) / norm, math.sqrt(theirs_sq) / norm, nan, written_past


# -- prepare (build box) ----------------------------------------------------------------------------
def prepare(out) -> int:
    # optional: the build layer (TVM's compiler), on the build box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob

    folder = files.open_folder(out)
    modules = module_plan()
    for m in modules:
        path, _ = module_cache.get_or_build(BuildJob("v12", (max(BUILD_M, m["experts"]), 2 * m["I"], m["K"]),
                                                     m["knobs"]))
        stem = Path(m["file"]).stem
        for src in Path(path).parent.iterdir():
            if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
                shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "modules": modules})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


# -- the GPU jobs (each in a child process) -----------------------------------------------------------
def _inputs(E, I, K, dtype, counts, M, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    A = torch.randn(M, K, device="cuda", generator=g, dtype=dt)
    W = torch.randn(E, 2 * I, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    offs = torch.tensor(gc.offsets_of(counts), dtype=torch.int32, device="cuda")
    return A, W, offs


def check_job(path, args) -> dict:
    """The six routings on one gated module (directly, through the front door and the op), then the
    CUDA-graph replay with new offs."""
    mod = use_grouped_module(path)
    if mod.epilogue != "swiglu":
        return {"status": "error", "detail": f"{path} is a {mod.epilogue} module, not a grouped SwiGLU"}
    E, I, K, dtype = mod.experts, mod.N // 2, mod.K, mod.dtype
    floor = ERROR_FLOOR[dtype]
    cases, ok_all = [], True
    M = CHECK_TOKENS
    for i, routing in enumerate(gc.CHECK_ROUTINGS):
        counts = gc.counts_of(routing, E, M, seed=i)
        offs_list = gc.offsets_of(counts)
        A, W, offs = _inputs(E, I, K, dtype, counts, M, seed=i)
        H = torch.full((M, I), float("nan"), dtype=A.dtype, device="cuda")
        mod.launch(A, W, offs, H)
        torch.cuda.synchronize()
        rel, trel, nan, past = errors(A, W, offs_list, H, M)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        front = gemm_ladder.grouped_swiglu(A, W, offs, strict=True)
        op = torch.ops.gemm_ladder.grouped_swiglu(A, W, offs)
        end = offs_list[-1]
        same = bool(torch.equal(front[:end], H[:end]) and torch.equal(op[:end], H[:end]))
        ok = ok and same
        ok_all &= ok
        cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                      "rows_past_offs_written": past, "front_door_and_op_same": same, "counts_head": counts[:8]})
    routings = ("balanced", "one", "zipf", "half_empty")
    A, W, offs = _inputs(E, I, K, dtype, gc.counts_of(routings[0], E, M), M, seed=99)
    H = torch.full((M, I), float("nan"), dtype=A.dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.launch(A, W, offs, H)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.launch(A, W, offs, H)
    graph_cases = []
    for j, routing in enumerate(routings):
        counts = gc.counts_of(routing, E, M, seed=100 + j)
        offs.copy_(torch.tensor(gc.offsets_of(counts), dtype=torch.int32))
        H.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rel, trel, nan, past = errors(A, W, gc.offsets_of(counts), H, M)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        ok_all &= ok
        graph_cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                            "rows_past_offs_written": past})
    return {"status": "ok" if ok_all else "wrong", "cases": cases, "graph_replays": graph_cases}


def masked_errors(A, W_gu, counts, H) -> tuple[float, float, int, int]:
    """:func:`errors` for the masked layout: each slot's first ``clamp(counts[e], 0, max_tokens)`` rows
    against the reference, the rows after them must stay NaN."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ours_sq = theirs_sq = ref_sq = 0.0
    nan = written_past = 0
    T, I = A.shape[1], H.shape[2]
    for e, c in enumerate(counts):
        c = min(max(c, 0), T)
        if c:
            (_, _, ref), = swiglu_reference(A[e, :c], W_gu[e:e + 1], [c])
            (_, _, theirs), = swiglu_reference(A[e, :c], W_gu[e:e + 1], [c], dtype_path=True)
            mine = H[e, :c].float()
            nan += int(torch.isnan(mine).sum())
            ours_sq += float(torch.nan_to_num(mine - ref, nan=1e30).square().sum())
            theirs_sq += float((theirs - ref).square().sum())
            ref_sq += float(ref.square().sum())
        written_past += int((~torch.isnan(H[e, c:, :I])).any(dim=1).sum())
    norm = math.sqrt(ref_sq) or 1.0
    return math.sqrt(ours_sq) / norm, math.sqrt(theirs_sq) / norm, nan, written_past


def masked_check_job(path, args) -> dict:
    """grouped_check's masked routings (every expert empty, one slot full, Zipf top-k, odd counts,
    counts past the slot or below zero that the kernel clamps) on one masked gated module, directly,
    through the front door (out poisoned: kept past the counts) and the op (zeros there); then one
    CUDA graph replayed after the counts were overwritten."""
    mod = use_grouped_module(path)
    if mod.epilogue != "swiglu" or mod.layout != "masked":
        return {"status": "error", "detail": f"{path} is a {mod.layout} {mod.epilogue} module"}
    E, I, K, dtype = mod.experts, mod.N // 2, mod.K, mod.dtype
    floor, T, dt = ERROR_FLOOR[dtype], gc.check_max_tokens(E), getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    W = torch.randn(E, 2 * I, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    A = torch.randn(E, T, K, device="cuda", generator=g, dtype=dt)

    def poisoned():
        return torch.full((E, T, I), float("nan"), dtype=dt, device="cuda")

    def launch(counts_t, H):
        mod.launch(A.view(-1, K), W, counts_t, H.view(-1, I))

    cases, ok_all = [], True
    for i, routing in enumerate(gc.MASKED_CHECK_ROUTINGS):
        counts = gc.masked_counts_of(routing, E, T, seed=i)
        counts_t = torch.tensor(counts, dtype=torch.int32, device="cuda")
        H = poisoned()
        launch(counts_t, H)
        torch.cuda.synchronize()
        rel, trel, nan, past = masked_errors(A, W, counts, H)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        front = poisoned()
        gemm_ladder.grouped_swiglu_masked(A, W, counts_t, out=front, strict=True)
        op = torch.ops.gemm_ladder.grouped_swiglu_masked(A, W, counts_t)
        valid = (torch.arange(T, device="cuda")[None, :] < counts_t.clamp(0, T)[:, None])[..., None].expand(E, T, I)
        same = bool(torch.equal(front[valid], H[valid]) and torch.equal(op[valid], H[valid]))
        kept = bool(torch.isnan(front[~valid]).all()) and bool((op[~valid] == 0).all())
        ok = ok and same and kept
        ok_all &= ok
        cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                      "rows_past_counts_written": past, "front_door_and_op_same": same,
                      "past_counts_kept_and_zero": kept, "counts_head": counts[:8]})
    routings = ("zipf", "one_full", "empty", "odd")
    counts_t = torch.tensor(gc.masked_counts_of(routings[0], E, T), dtype=torch.int32, device="cuda")
    H = poisoned()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(counts_t, H)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(counts_t, H)
    graph_cases = []
    for j, routing in enumerate(routings):
        counts = gc.masked_counts_of(routing, E, T, seed=100 + j)
        counts_t.copy_(torch.tensor(counts, dtype=torch.int32))
        H.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rel, trel, nan, past = masked_errors(A, W, counts, H)
        ok = nan == 0 and past == 0 and rel <= 2 * trel + floor
        ok_all &= ok
        graph_cases.append({"routing": routing, "ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan,
                            "rows_past_counts_written": past})
    return {"status": "ok" if ok_all else "wrong", "cases": cases, "graph_replays": graph_cases}


def time_item(folder, shape: str) -> str:
    return f"{folder}#{shape}"


def time_job(item, args) -> dict:
    """One weight (bf16): every gated module, torch's unfused path and our grouped_mm then torch's
    elementwise, in rotating rounds, per (tokens, routing). The modules that failed their check are
    named in ``args`` (comma-joined files) and left out."""
    folder, shape = item.split("#")
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    bad = set(a for a in args if a)
    mine = [m for m in plan["modules"] if m["shape"] == shape and m["dtype"] == TIMED_DTYPE
            and m["kind"] in ("swiglu", "mm")]
    loaded = {m["file"]: GroupedModule(runtime.load(folder / m["file"])) for m in mine if m["file"] not in bad}
    E, I, K = mine[0]["experts"], mine[0]["I"], mine[0]["K"]
    l2 = device.probe(0).l2_bytes or (50 << 20)
    W = torch.randn(E, 2 * I, K, device="cuda", dtype=torch.bfloat16).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    results = []
    for tokens in TOKENS:
        for routing in TIMED_ROUTINGS:
            counts = gc.counts_of(routing, E, tokens, seed=tokens)
            offs_list = gc.offsets_of(counts)
            per_set = 2 * tokens * (K + 3 * I)  # A, h and H: W is shared (read every call)
            n_sets = max(2, math.ceil(2 * l2 / max(per_set + W.numel() * W.element_size(), 1)))
            sets = [(torch.randn(tokens, K, device="cuda").to(W.dtype),
                     torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                     torch.empty(tokens, I, dtype=W.dtype, device="cuda"),
                     torch.empty(tokens, 2 * I, dtype=W.dtype, device="cuda")) for _ in range(n_sets)]

            def torch_unfused(A, offs, H, h):  # pylint: disable=unused-argument  (torch allocates its h)
                g = torch._grouped_mm(A, Wt, offs=offs)  # pylint: disable=protected-access
                torch.mul(F.silu(g[:, :I]), g[:, I:], out=H)

            parties = {"torch_unfused": torch_unfused}
            ours_files = {}
            for m in mine:
                if m["kind"] == "swiglu" and m["file"] in loaded:
                    mod = loaded[m["file"]]
                    parties[f"ours_{m['tier']}"] = (lambda mod: lambda A, offs, H, h: mod.launch(A, W, offs, H))(mod)
                    ours_files[f"ours_{m['tier']}"] = m
            plain = for_tokens(mine, "mm", tokens)
            if plain is not None and plain["file"] in loaded:
                pm = loaded[plain["file"]]

                def grouped_mm_then_torch(A, offs, H, h, pm=pm):
                    pm.launch(A, W, offs, h)
                    torch.mul(F.silu(h[:, :I]), h[:, I:], out=H)

                parties["grouped_mm_then_torch"] = grouped_mm_then_torch
            if not gc._grouped_mm_works(sets[0][0], W, sets[0][1]):  # pylint: disable=protected-access
                del parties["torch_unfused"]
            times = gc._rounds(parties, sets, 2.0 * tokens * 2 * I * K)  # pylint: disable=protected-access
            policy_tier = (for_tokens(mine, "swiglu", tokens) or {}).get("tier")
            results.append({"tokens": tokens, "routing": routing, "times": times, "policy_tier": policy_tier,
                            "grouped_mm_tier": plain["tier"] if plain else None})
    return {"status": "ok", "rows": results}


# -- rows -------------------------------------------------------------------------------------------
def result_row(base: dict, tokens, routing, correct: bool, times: dict, tier: str | None, policy_tier=None,
               **extra) -> dict:
    """One row in issue 33's format (``op`` swiglu): ``ratio_to_grouped_mm`` is torch's unfused time
    over ours (graphs), ``peer_ratios`` each peer's over ours, graphs and queued calls."""
    ours = times.get(f"ours_{tier}", {}) if tier else {}

    def ratio(peer, how):
        theirs, me = times.get(peer, {}).get(how), ours.get(how)
        return theirs / me if theirs and me else None

    return {"op": "swiglu", "layout": extra.pop("layout", "contiguous"), **base, "tokens": tokens, "routing": routing, "correct": correct,
            "variant": tier, "policy": tier is not None and tier == policy_tier,
            "ratio_to_grouped_mm": ratio("torch_unfused", "graph_ms"),
            "peer_ratios": {f"{p}_{how.removesuffix('_ms')}": ratio(p, how) for p in PEERS
                            for how in ("graph_ms", "queued_ms")},
            **extra, "times": times if tier else {}}


def rows_of(modules: list[dict], checks: dict, timings: dict) -> list[dict]:
    """The check rows (one per gated module and routing, plus a failure row) and the timed rows (one
    per gated module, tokens and routing)."""
    rows = []
    for m in modules:
        if m["kind"] not in ("swiglu", "swiglu_masked"):
            continue
        base = {"experts": m["experts"], "N": m["I"], "K": m["K"], "dtype": m["dtype"], "shape": m["shape"]}
        masked = m["kind"] == "swiglu_masked"
        layout = {"layout": "masked"} if masked else {}
        c = checks.get(m["file"]) or {}
        for case in c.get("cases", []) + [dict(r, routing=r["routing"] + " (graph replay)")
                                          for r in c.get("graph_replays", [])]:
            tokens = gc.check_max_tokens(m["experts"]) if masked else CHECK_TOKENS
            rows.append(result_row(base, tokens, case["routing"], case["ok"], {}, m["tier"], kind="check",
                                   rel_err=case["rel_err"], torch_rel_err=case["torch_rel_err"], **layout))
        if c.get("status") != "ok":
            rows.append(result_row(base, None, None, False, {}, m["tier"], kind="failure",
                                   detail=json.dumps(c)[:4000], **layout))
    for shape, t in timings.items():
        for r in t.get("rows", []):
            for m in modules:
                if m["kind"] == "swiglu" and m["shape"] == shape and m["dtype"] == TIMED_DTYPE \
                        and f"ours_{m['tier']}" in r["times"]:
                    base = {"experts": m["experts"], "N": m["I"], "K": m["K"], "dtype": m["dtype"], "shape": shape}
                    rows.append(result_row(base, r["tokens"], r["routing"], checks[m["file"]].get("status") == "ok",
                                           r["times"], m["tier"], r["policy_tier"], kind="timed",
                                           grouped_mm_tier=r["grouped_mm_tier"]))
        if t.get("status") != "ok":
            rows.append(result_row({"shape": shape}, None, None, False, {}, None, kind="failure",
                                   detail=json.dumps(t)[:4000]))
    return rows


def summary_of(rows: list[dict]) -> dict:
    """Over the policy's timed rows: the geomean and least of each peer's time over ours (graphs)."""
    timed = [r for r in rows if r.get("kind") == "timed" and r["policy"]]
    out = {"timed_cases": len(timed), "checks": sum(r.get("kind") == "check" for r in rows),
           "checks_correct": sum(r.get("kind") == "check" and r["correct"] for r in rows)}
    for key, get in (("torch_unfused", lambda r: r["ratio_to_grouped_mm"]),
                     ("grouped_mm_then_torch", lambda r: r["peer_ratios"]["grouped_mm_then_torch_graph"])):
        vals = [v for v in map(get, timed) if v]
        out[f"geomean_vs_{key}"] = math.exp(statistics.fmean(map(math.log, vals))) if vals else None
        out[f"min_vs_{key}"] = min(vals) if vals else None
    return out


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"grouped_swiglu_check run: no GPU here ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        print(f"grouped_swiglu_check run: {folder / PLAN_FILE} is not a {FORMAT} plan: run prepare again",
              file=sys.stderr)
        return 2
    modules = plan["modules"]
    sampler, start = Sampler(), time.time()
    job = "benchmarks.grouped_swiglu_check:"
    gated = [m for m in modules if m["kind"] == "swiglu"]
    try:
        results = isolate.run_batch(job + "check_job", [str(folder / m["file"]) for m in gated],
                                    timeout=CHECK_TIMEOUT, explain=False)
        checks = {m["file"]: r for m, r in zip(gated, results)}
        masked = [m for m in modules if m["kind"] == "swiglu_masked"]
        results = isolate.run_batch(job + "masked_check_job", [str(folder / m["file"]) for m in masked],
                                    timeout=CHECK_TIMEOUT, explain=False)
        checks.update({m["file"]: r for m, r in zip(masked, results)})
        bad = [f for f, r in checks.items() if r.get("status") != "ok"]
        shapes = sorted({m["shape"] for m in modules if m["kind"] == "mm"})
        timed = isolate.run_batch(job + "time_job", [time_item(folder, s) for s in shapes], args=bad,
                                  timeout=TIME_TIMEOUT, explain=False)
        timings = dict(zip(shapes, timed))
    finally:
        sampler.stop()
    rows = rows_of(modules, checks, timings)
    result = {**check_cli.head(FORMAT, harness, sampler, start), "summary": summary_of(rows), "checks": checks,
              "rows": rows}
    check_cli.write_result(out, result)
    for r in rows:
        if r["kind"] == "timed":
            peers = "  ".join(f"x {k.removesuffix('_graph')} {v or 0:.3f}" for k, v in r["peer_ratios"].items()
                              if k.endswith("_graph"))
            print(f"{r['shape']:11s} {r['variant']:14s} {'*' if r['policy'] else ' '} tokens={r['tokens']:5d} "
                  f"{r['routing']:8s} {peers}")
        elif not r["correct"]:
            print(f"WRONG {r.get('shape')} {r.get('dtype')} {r.get('variant')} {r.get('routing')}: "
                  f"{r.get('detail', '')[:300]}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, _, _, _ = check_cli.subcommands(__doc__, "build box: the gated v12 modules of SHAPES (and the grouped_mm "
                                                "peers) into DIR", "GPU box: check, capture and time them",
                                       "grouped_swiglu_check.json")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out)
    check_cli.require_in_name(p, a.out, "grouped", 33)
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
