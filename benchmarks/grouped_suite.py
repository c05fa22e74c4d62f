"""Issue 33's grouped GEMM suite in one run: every token count the issue names (64 to 32768) on the
issue's MoE families, served through the front door from a kernel pack, against every peer the
issue names, plus the dense-vs-grouped comparison of its second target.

Why one script: the runs before measured pieces (``grouped_prefill_check.py --pack``: 512-16384
tokens on four weights, 1.083x ``torch._grouped_mm``; ``grouped_check.py --decode``: 8-256 tokens),
none with a Triton peer, none at 32768 tokens or with 128 small experts, none against our dense
GEMM. This one serves every case the way a user calls it and writes rows in the issue's results
format, so the targets can be read off one file.

- Cases (:func:`cases`): :data:`FAMILIES` (Mixtral-like 8 x 14336x4096, Qwen-MoE-like 64 x
  1408x2048, Qwen3-MoE-like 128 x 768x2048, DeepSeek-V3-like 256 x 2048x7168, and the odd
  5 x 1000x520) x :data:`TOKENS` (rows of A in all: tokens x top-k) x balanced and Zipf routing
  (``grouped_check.counts_of``), bf16 (``torch._grouped_mm``'s dtype), less :data:`SKIPPED` (each
  with its reason, written into the JSON).
- Ours: a kernel pack of the five weights (``pack build --grouped``: ``plan.grouped_choices``' tiers
  over the whole token range, contiguous, bf16 only) served by ``gemm_ladder.grouped_mm(...,
  strict=True)``; a case is correct only if the pack's module for that M served it
  (``served_by``), its D (poisoned with NaN first) is within twice torch's own error of an fp32
  reference (plus a floor), and a second call whose routing leaves :data:`TAIL` rows past
  ``offs[-1]`` leaves those rows NaN.
- Peers (``peer_ratios``: the peer's time over ours, kernels in CUDA graphs; ``peer_ratios_queued``
  for queued calls between event pairs; ``peer_ratios_stream`` for a stream of calls, the wall clock with
  the host's launch path in it, the call as users make it): ``torch._grouped_mm`` (also ``ratio_to_grouped_mm``), ``cublas_loop`` (a
  ``torch.matmul`` per expert with rows, the counts handed to it on the host for free) and
  ``triton_grouped`` (``benchmarks/triton_grouped.py``: our own persistent Triton kernel, autotuned,
  ``offs`` read on the device). Triton is first probed per family in a child process
  (:func:`triton_probe_job`: odd routings, an empty-but-one routing, rows past ``offs[-1]``); a
  family where it failed, crashed or hung is timed without it, a case whose child crashed is run
  again without it, and the failure is recorded (``triton``), never fatal.
- Dense vs grouped (rows with ``op: "dense_compare"``): at :data:`DENSE_TOKENS`, Mixtral-like
  balanced, our dense GEMM of M = tokens, N = 14336, K = 4096 (the policy's module in the same pack:
  v10 stream-k at 8192, v9 at 32768; through ``gemm_ladder.matmul(strict=True)``), timed in the
  same rounds on the same A. Why that dense shape: it
  does exactly the grouped layer's FLOPs (tokens x 14336 x 4096 x 2: the eight experts' rows
  stacked) with the same A, D and tile grid, so the ratio isolates what grouping costs: eight
  weights streamed instead of one (940 MB against 117 MB, a few percent of the FLOPs' time at these
  token counts) and the per-expert tile edges. Eight dense GEMMs of one expert's shape would add
  eight launches and tails, which is not what the target asks.
- Timing (:func:`_rounds`): every party in the same rotating rounds, as kernels in CUDA graphs
  cycling input sets that spill L2 (``harness.graph_times``), as queued calls (``harness.event_times``)
  and as a stream of calls (``harness.stream_ms``); fewer rounds for cases whose calls take milliseconds.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_suite.py prepare build/gsuite            # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_suite.py run build/gsuite --out out/grouped_suite.json   # GPU box

``tables FILE.json`` (any box) prints a run's summary and cases as the markdown tables of its results
folder's README (:func:`markdown_of`).

Rows: the issue's results format (``layout``, ``experts``, ``tokens``, ``N``, ``K``, ``dtype``,
``routing``, ``correct``, ``ratio_to_grouped_mm``, ``peer_ratios``) plus ``family``, ``served_by``,
``expected``, ``rule``, ``kernel_us`` (ours, graphs), ``tflops``, ``tb_per_s`` (A, D and the W of
experts with rows over our time), ``ratio_to_best_peer`` and ``checks``; ``summary``
(:func:`summary_of`). 59 s on an H100 at 5/3 rounds, 56 s at 8/5 (Triton's cache warm); DIR 4.4 MiB
(20 modules). Results: ``benchmarks/results/2026-11-26_h100_grouped_suite``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)
import grouped_check as gc  # noqa: E402  (a sibling script: the routings, the error check)
import grouped_prefill_check as gpc  # noqa: E402  (a sibling script: the pack's expected module, geomean)

import gemm_ladder  # noqa: E402
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve import front, kernel_pack  # noqa: E402

FORMAT = "gemm_ladder.grouped_suite"
PLAN_FILE = "grouped_suite.json"
PACK_FOLDER = "pack"
DTYPE = "bfloat16"
FAMILIES = gc.SUITE_FAMILIES  # (family, experts, N, K)
TOKENS = gc.SUITE_TOKENS  # rows of A in all (tokens x top-k), the 64 to 32768
ROUTINGS = ("balanced", "zipf")
SKIPPED: dict = {}  # (family, tokens) -> why it is not run (none so far: every call is under 10 ms)
DENSE_FAMILY, DENSE_TOKENS = "mixtral", (8192, 32768)  # balanced: 1024 and 4096 rows an expert
PEERS = ("grouped_mm", "cublas_loop", "triton_grouped")
DECODE_TOKENS = 256  # the decode target: total tokens <= 256
MANY_SMALL = (64, 1536 * 2048)  # "many and small" experts: at least 64 of them, N x K at most this
TAIL = 37  # rows of A past offs[-1] in the tail check: they must stay NaN
PROBE_TOKENS = 1000  # rows of A in the Triton probe (not a multiple of any tile)
PROBE_ROUTINGS = ("odd", "one", "half_empty", "tail", "zipf")
PROBE_TIMEOUT, CASE_TIMEOUT = 150.0, 150.0
SLOW_MS = 1.0  # a call slower than this gets SLOW_ROUNDS rounds, not ROUNDS
# the first H100 run (5 and 3 rounds) took 59 s of the 4 minutes: more rounds tighten the medians
ROUNDS, SLOW_ROUNDS = 8, 5


# -- cases, items, rows and summary (pure Python: the CPU tests check them) ---------------------------
def family(name: str) -> tuple[int, int, int]:
    """(E, N, K) of a family of :data:`FAMILIES`, or a ValueError naming the families."""
    for n, E, N, K in FAMILIES:
        if n == name:
            return E, N, K
    raise ValueError(f"family {name!r}: use one of {[f[0] for f in FAMILIES]}")


def cases() -> list[dict]:
    """Every (family, tokens) the suite runs (each at both routings), :data:`SKIPPED` left out."""
    return [{"family": n, "experts": E, "N": N, "K": K, "tokens": t} for n, E, N, K in FAMILIES for t in TOKENS
            if (n, t) not in SKIPPED]


def case_item(pack: str, name: str, tokens: int, triton_on: bool) -> str:
    """A case as the one word a child job gets: ``pack#family#tokens#triton`` (1 or 0)."""
    return f"{pack}#{name}#{tokens}#{int(triton_on)}"


def parse_case_item(item: str) -> tuple[str, str, int, bool]:
    pack, name, tokens, triton_on = item.split("#")
    return pack, name, int(tokens), triton_on == "1"


def is_dense_case(name: str, tokens: int, routing: str) -> bool:
    return name == DENSE_FAMILY and tokens in DENSE_TOKENS and routing == "balanced"


def rounds_for(slowest_ms: float) -> int:
    """Rounds for a case whose slowest party takes ``slowest_ms`` a call: fewer where calls take ms
    (their medians settle sooner, and the run has a budget)."""
    return SLOW_ROUNDS if slowest_ms > SLOW_MS else ROUNDS


def moved_bytes(E_live_bytes: int, tokens: int, N: int, K: int, itemsize: int = 2) -> int:
    """Bytes a grouped GEMM must move at least: A [tokens, K], D [tokens, N] and the W of the
    experts with rows (``E_live_bytes``)."""
    return tokens * (K + N) * itemsize + E_live_bytes


def _ratio(times: dict, peer: str, how: str) -> float | None:
    theirs, mine = times.get(peer, {}).get(how), times.get("ours", {}).get(how)
    return theirs / mine if theirs and mine else None


def round_quartiles(times: dict, peer: str) -> list[float] | None:
    """Quartiles of the peer's time over ours round by round (each round's median of its graph
    samples; the rounds rotate the order): how far one run's ratio can be trusted."""
    theirs, mine = times.get(peer, {}).get("graph_round_ms"), times.get("ours", {}).get("graph_round_ms")
    if not theirs or not mine:
        return None
    ratios = [t / m for t, m in zip(theirs, mine)]
    return [round(q, 4) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else [round(ratios[0], 4)] * 3


def case_row(case: dict, correct: bool, times: dict, bytes_moved: int | None) -> dict:
    """One row in the issue's results format (contiguous layout): ``times`` maps a party (``ours``
    and :data:`PEERS`) to ``graph_ms``/``queued_ms``; a missing party's ratio is None."""
    peer_ratios = {p: _ratio(times, p, "graph_ms") for p in PEERS}
    ours_ms = times.get("ours", {}).get("graph_ms")
    flops = 2.0 * case["tokens"] * case["N"] * case["K"]
    timed = [r for r in peer_ratios.values() if r]
    return {"layout": "contiguous", "op": "grouped_mm", **case, "dtype": DTYPE, "correct": correct,
            "ratio_to_grouped_mm": peer_ratios["grouped_mm"], "peer_ratios": peer_ratios,
            "peer_ratios_queued": {p: _ratio(times, p, "queued_ms") for p in PEERS},
            "peer_ratios_stream": {p: _ratio(times, p, "stream_ms") for p in PEERS},
            "peer_ratio_round_quartiles": {p: round_quartiles(times, p) for p in PEERS},
            "ratio_to_best_peer": min(timed) if timed else None,
            "kernel_us": ours_ms * 1e3 if ours_ms else None,
            "tflops": flops / ours_ms / 1e9 if ours_ms else None,
            "tb_per_s": bytes_moved / ours_ms / 1e9 if ours_ms and bytes_moved else None,
            "times": times}


def dense_row(case: dict, times: dict, check: dict | None) -> dict | None:
    """The dense-vs-grouped row of a Mixtral-like balanced case timed beside our dense GEMM of the
    same FLOPs (``check``: the dense module's; None where the case has no dense party): grouped
    TFLOPS over dense TFLOPS (the issue: within 10%, i.e. at least 0.9)."""
    if check is None:
        return None
    g, d = times.get("ours", {}).get("graph_ms"), times.get("dense", {}).get("graph_ms")
    flops = 2.0 * case["tokens"] * case["N"] * case["K"]
    return {"layout": "contiguous", "op": "dense_compare", **case, "dtype": DTYPE,
            "correct": bool(check.get("ok") and g and d and str(case.get("dense_served_by")).startswith("kernel pack")),
            "dense_check": check,
            "dense_shape": [case["tokens"], case["N"], case["K"]],
            "grouped_tflops": flops / g / 1e9 if g else None, "dense_tflops": flops / d / 1e9 if d else None,
            "ratio_grouped_to_dense": d / g if g and d else None,
            "times": {k: times[k] for k in ("ours", "dense") if k in times}}


def failure_row(name: str, tokens: int, res: dict) -> dict:
    E, N, K = family(name)
    return {"layout": "contiguous", "op": "grouped_mm", "family": name, "experts": E, "N": N, "K": K,
            "tokens": tokens, "routing": None, "dtype": DTYPE, "correct": False, "ratio_to_grouped_mm": None,
            "peer_ratios": {p: None for p in PEERS}, "detail": json.dumps(res)[:4000]}


def _least(values):
    values = [v for v in values if v]
    return min(values) if values else None


def summary_of(rows: list[dict]) -> dict:
    """Geomean and least ratio to torch._grouped_mm over every contiguous case and over decode-size
    ones (<= DECODE_TOKENS), to the best peer, per peer, x the cuBLAS loop where experts are many
    and small (MANY_SMALL), and the dense comparison; wrong cases count as failures, not ratios."""
    grouped = [r for r in rows if r.get("op") == "grouped_mm"]
    ok = [r for r in grouped if r["correct"]]
    decode = [r for r in ok if r["tokens"] <= DECODE_TOKENS]
    many_small = [r for r in ok if r["experts"] >= MANY_SMALL[0] and r["N"] * r["K"] <= MANY_SMALL[1]]
    dense = [r for r in rows if r.get("op") == "dense_compare"]

    def stats(rs, key):
        vals = [key(r) for r in rs]
        return {"geomean": gpc.geomean(vals), "min": _least(vals), "cases": sum(1 for v in vals if v)}

    return {"cases": len(grouped), "correct": len(ok),
            "to_grouped_mm": stats(ok, lambda r: r["ratio_to_grouped_mm"]),
            # the call as users make it: a stream of calls, host included (harness.stream_ms)
            "to_grouped_mm_stream": stats(ok, lambda r: (r.get("peer_ratios_stream") or {}).get("grouped_mm")),
            "to_grouped_mm_decode": stats(decode, lambda r: r["ratio_to_grouped_mm"]),
            "to_best_peer": stats(ok, lambda r: r["ratio_to_best_peer"]),
            "to_best_peer_decode": stats(decode, lambda r: r["ratio_to_best_peer"]),
            "per_peer": {p: stats(ok, lambda r, p=p: r["peer_ratios"].get(p)) for p in PEERS},
            "to_cublas_loop_many_small": stats(many_small, lambda r: r["peer_ratios"].get("cublas_loop")),
            "dense_compare": [{"tokens": r["tokens"], "ratio_grouped_to_dense": r["ratio_grouped_to_dense"]}
                              for r in dense],
            "targets": {"to_grouped_mm_geomean": 1.10, "to_grouped_mm_min": 0.95, "to_cublas_loop_many_small": 2.0,
                        "grouped_to_dense": 0.90, "decode_to_best_peer": 1.05}}


# -- prepare (build box) ------------------------------------------------------------------------------
def prepare(out) -> int:
    """The five weights (contiguous, bf16) and the dense shapes as one kernel pack in DIR/pack, and
    the plan ``run`` follows."""
    folder = files.open_folder(out)
    weights = [(E, N, K, "contiguous") for _, E, N, K in FAMILIES]
    E, N, K = family(DENSE_FAMILY)
    dense = [(t, N, K) for t in DENSE_TOKENS]
    man = kernel_pack.build_pack(folder / PACK_FOLDER, dense, [DTYPE], grouped=weights, alternatives=False,
                                 request={"shapes": [list(s) for s in dense],
                                          "grouped": [f"{E},{N},{K},contiguous" for E, N, K, _ in weights]})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r['detail']}", file=sys.stderr)
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "pack": PACK_FOLDER, "cases": cases(),
                                          "skipped": {f"{n}@{t}": why for (n, t), why in SKIPPED.items()}})
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{len(man['results'])} modules in a pack, {len(cases())} cases, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


# -- the GPU jobs (each in a child process: gemm_ladder.measure.isolate) ------------------------------
def _check(D, A, W, offs_list, rows, floor) -> dict:
    rel, trel, nan, past = gc._errors(A, W, offs_list, D, rows)  # pylint: disable=protected-access
    return {"ok": nan == 0 and past == 0 and rel <= 2 * trel + floor, "rel_err": rel, "torch_rel_err": trel,
            "nan": nan, "rows_past_written": past}


def triton_probe_job(name, args) -> dict:
    """Triton's kernel on one family at PROBE_ROUTINGS with D poisoned (rows past offs[-1] must stay
    NaN), and once in a CUDA graph replayed after offs changed."""
    import triton_grouped  # pylint: disable=import-outside-toplevel  (optional: Triton; a sibling script)

    E, N, K = family(name)
    g = torch.Generator(device="cuda").manual_seed(3)
    dt = getattr(torch, DTYPE)
    A = torch.randn(PROBE_TOKENS, K, device="cuda", generator=g, dtype=dt)
    W = torch.randn(E, N, K, device="cuda", generator=g, dtype=dt).div_(math.sqrt(K))
    D = torch.empty(PROBE_TOKENS, N, device="cuda", dtype=dt)
    offs = torch.zeros(E, dtype=torch.int32, device="cuda")
    checks, ok = {}, True
    for i, routing in enumerate(PROBE_ROUTINGS):
        offs_list = gc.offsets_of(gc.counts_of(routing, E, PROBE_TOKENS, seed=i))
        offs.copy_(torch.tensor(offs_list, dtype=torch.int32))
        D.fill_(float("nan"))
        triton_grouped.grouped_mm(A, W, offs, out=D)
        torch.cuda.synchronize()
        checks[routing] = _check(D, A, W, offs_list, PROBE_TOKENS, gc.ERROR_FLOOR[DTYPE])
        ok &= checks[routing]["ok"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_grouped.grouped_mm(A, W, offs, out=D)
    offs_list = gc.offsets_of(gc.counts_of("balanced", E, PROBE_TOKENS))
    offs.copy_(torch.tensor(offs_list, dtype=torch.int32))
    D.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    checks["balanced (graph replay)"] = _check(D, A, W, offs_list, PROBE_TOKENS, gc.ERROR_FLOOR[DTYPE])
    ok &= checks["balanced (graph replay)"]["ok"]
    return {"status": "ok" if ok else "wrong", "checks": checks}


def _rounds(parties: dict, sets: list, rounds: int) -> dict:
    """grouped_check's rotating rounds (``time_rounds``), ``rounds`` of them."""
    return gc.time_rounds(parties, sets, rounds=rounds)


def _triton():
    """The Triton peer's module, or the reason it cannot be imported."""
    try:
        import triton_grouped  # pylint: disable=import-outside-toplevel  (optional: Triton; a sibling script)
        return triton_grouped, None
    except Exception as err:  # pylint: disable=broad-except  (any import failure: recorded, the run goes on)
        return None, f"{type(err).__name__}: {err}"


def case_job(item, args) -> dict:
    """One (family, tokens) through the front door with the pack (strict), balanced and Zipf: the
    module that served, the checks (D poisoned; a tail routing), each peer checked, then every
    party in the same rounds."""
    pack, name, tokens, triton_on = parse_case_item(item)
    if not any(p.folder == Path(pack) for p in front.packs()):  # once a child (its jobs run one after another)
        gemm_ladder.use_pack(pack)
    E, N, K = family(name)
    floor = gc.ERROR_FLOOR[DTYPE]
    source, kernel = gc._served("contiguous", E, N, K, DTYPE, tokens)  # pylint: disable=protected-access
    tg, triton_error = _triton() if triton_on else (None, "off: the probe failed for this family")
    l2 = device.probe(0).l2_bytes or (50 << 20)
    W = torch.randn(E, N, K, device="cuda", dtype=getattr(torch, DTYPE)).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    results = []
    for routing in ROUTINGS:
        counts = gc.counts_of(routing, E, tokens, seed=tokens)
        offs_list = gc.offsets_of(counts)
        n_sets = max(2, math.ceil(2 * l2 / max(2 * tokens * (K + N) + W.numel() * W.element_size(), 1)))
        sets = [(torch.randn(tokens, K, device="cuda").to(W.dtype), torch.tensor(offs_list, dtype=torch.int32,
                 device="cuda"), torch.empty(tokens, N, dtype=W.dtype, device="cuda")) for _ in range(n_sets)]
        spans = [(e, s, t) for e, (s, t) in enumerate(zip([0] + offs_list[:-1], offs_list)) if t > s]

        def ours(A, offs, D):
            gemm_ladder.grouped_mm(A, W, offs, out=D, strict=True)

        def grouped_mm(A, offs, D):  # pylint: disable=unused-argument  (torch allocates its D)
            torch._grouped_mm(A, Wt, offs=offs)  # pylint: disable=protected-access

        def cublas_loop(A, offs, D, spans=spans):  # pylint: disable=unused-argument  (counts known on the host)
            for e, s, t in spans:
                torch.matmul(A[s:t], W[e].T, out=D[s:t])

        def triton_grouped(A, offs, D):
            tg.grouped_mm(A, W, offs, out=D)

        def dense(A, offs, D):  # pylint: disable=unused-argument  (the same FLOPs: every row times W[0])
            gemm_ladder.matmul(A, W[0], out=D, strict=True)

        A, offs, D = sets[0]
        checks: dict = {}
        D.fill_(float("nan"))
        ours(A, offs, D)
        torch.cuda.synchronize()
        checks["ours"] = _check(D, A, W, offs_list, tokens, floor)
        # the tail: a routing that leaves TAIL rows past offs[-1] (M, hence the module, unchanged)
        tail_list = gc.offsets_of(gc.counts_of(routing, E, tokens - TAIL, seed=tokens + 1))
        tail_offs = torch.tensor(tail_list, dtype=torch.int32, device="cuda")
        D.fill_(float("nan"))
        ours(A, tail_offs, D)
        torch.cuda.synchronize()
        checks["ours_tail"] = _check(D, A, W, tail_list, tokens, floor)
        parties = {"ours": ours} if checks["ours"]["ok"] and checks["ours_tail"]["ok"] else {}
        if gc._grouped_mm_works(A, W, offs):  # pylint: disable=protected-access
            parties["grouped_mm"] = grouped_mm
        parties["cublas_loop"] = cublas_loop
        if tg is not None:
            try:
                D.fill_(float("nan"))
                triton_grouped(A, offs, D)
                torch.cuda.synchronize()
                checks["triton_grouped"] = {**_check(D, A, W, offs_list, tokens, floor), "config": tg.chosen_config()}
                if checks["triton_grouped"]["ok"]:
                    parties["triton_grouped"] = triton_grouped
            except Exception as err:  # pylint: disable=broad-except  (Python-side failures: recorded, go on)
                if "CUDA" in str(err):
                    raise  # the context is gone: the child must die (the parent retries without Triton)
                checks["triton_grouped"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:1000]}
        else:
            checks["triton_grouped"] = {"ok": False, "error": triton_error}
        dense_served = None
        if is_dense_case(name, tokens, routing):
            try:
                route = front.route_of(tokens, N, K, DTYPE, torch.cuda.current_device(), True)
                dense_served = " | ".join([route.source, *route.lines])  # the kernel, why, and which pack file
                D.fill_(float("nan"))
                dense(A, offs, D)
                torch.cuda.synchronize()
                checks["dense"] = _check(D, A, W, [tokens] * E, tokens, floor)  # every row expert 0's: W[0]
            except Exception as err:  # pylint: disable=broad-except  (no dense module: recorded, the case goes on)
                if "CUDA" in str(err):
                    raise
                checks["dense"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:1000]}
            if checks["dense"]["ok"]:
                parties["dense"] = dense
        # one call each to size the rounds
        slowest = max(harness.event_times(fn, sets, reps=2, start=0)[-1] for fn in parties.values())
        times = _rounds(parties, sets, rounds_for(slowest))
        live = sum(1 for c in counts if c)
        results.append({"routing": routing, "sets": n_sets, "checks": checks, "times": times,
                        "live_experts": live, "dense_served_by": dense_served})
        del sets
    return {"status": "ok", "source": source, "kernel": kernel, "rows": results}


def rows_of(entries: list[dict], item: str, res: dict) -> list[dict]:
    """A (family, tokens)'s rows: correct only where the pack's module for that M served (strict,
    from the pack) and every check of ours passed; a dense_compare row where timed."""
    _, name, tokens, _ = parse_case_item(item)
    E, N, K = family(name)
    if res.get("status") != "ok":
        return [failure_row(name, tokens, res)]
    want = gpc.expected_module(entries, E, N, K, tokens)
    served = bool(want) and res.get("source") == "kernel pack" and want["file"] in (res.get("kernel") or "")
    out = []
    for r in res["rows"]:
        case = {"family": name, "experts": E, "N": N, "K": K, "tokens": tokens, "routing": r["routing"],
                "served_by": res.get("kernel"), "expected": (want or {}).get("file"),
                "rule": ((want or {}).get("choice") or {}).get("rule"), "live_experts": r["live_experts"],
                "sets": r["sets"], "checks": r["checks"]}
        correct = served and r["checks"]["ours"]["ok"] and r["checks"]["ours_tail"]["ok"]
        out.append(case_row(case, correct, r["times"], moved_bytes(r["live_experts"] * N * K * 2, tokens, N, K)))
        d = dense_row({"family": name, "experts": E, "N": N, "K": K, "tokens": tokens, "routing": r["routing"],
                       "dense_served_by": r.get("dense_served_by")}, r["times"], r["checks"].get("dense"))
        if d is not None:
            out.append(d)
    return out


def retry_items(items: list[str], results: list[dict]) -> list[int]:
    """Indices of the cases whose child crashed or hung with Triton on: run again without it."""
    return [i for i, (item, res) in enumerate(zip(items, results))
            if parse_case_item(item)[3] and res.get("status") in ("crash", "timeout", "error")]


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"grouped_suite run: no GPU here ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        print(f"grouped_suite run: {folder / PLAN_FILE} is not a {FORMAT} plan: run prepare again", file=sys.stderr)
        return 2
    pack = folder / plan["pack"]
    entries = kernel_pack.KernelPack(pack).modules
    sampler, start = Sampler(), time.time()
    try:
        names = sorted({c["family"] for c in plan["cases"]})
        probes = dict(zip(names, isolate.run_batch("benchmarks.grouped_suite:triton_probe_job", names,
                                                   timeout=PROBE_TIMEOUT, explain=False)))
        items = [case_item(str(pack), c["family"], c["tokens"], probes[c["family"]].get("status") == "ok")
                 for c in plan["cases"]]
        results = isolate.run_batch("benchmarks.grouped_suite:case_job", items, timeout=CASE_TIMEOUT, explain=False)
        retried = retry_items(items, results)
        if retried:
            again = [case_item(str(pack), *parse_case_item(items[i])[1:3], False) for i in retried]
            for i, res in zip(retried, isolate.run_batch("benchmarks.grouped_suite:case_job", again,
                                                         timeout=CASE_TIMEOUT, explain=False)):
                res["first_try_with_triton"] = {k: results[i].get(k) for k in ("status", "detail")}
                results[i], items[i] = res, again[retried.index(i)]
    finally:
        sampler.stop()
    rows = [r for item, res in zip(items, results) for r in rows_of(entries, item, res)]
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "triton": {"version": _triton_version(), "probes": probes, "retried_without": [items[i] for i in retried]},
              "skipped": plan.get("skipped", {}), "summary": summary_of(rows), "rows": rows}
    check_cli.write_result(out, result)
    for r in rows:
        if r["op"] == "dense_compare":
            print(f"dense_compare tokens={r['tokens']:6d} grouped {r['grouped_tflops'] or 0:.0f} TFLOPS, dense "
                  f"{r['dense_tflops'] or 0:.0f}: x {r['ratio_grouped_to_dense'] or 0:.3f}")
        else:
            p = r["peer_ratios"]
            print(f"{r['family']:11s} tokens={r['tokens']:6d} {r['routing'] or '-':8s} correct={r['correct']!s:5s} "
                  f"x grouped_mm {p['grouped_mm'] or 0:.3f} x cublas_loop {p['cublas_loop'] or 0:.3f} "
                  f"x triton {p['triton_grouped'] or 0:.3f}  {r.get('kernel_us') or 0:.1f} us")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def _triton_version() -> str | None:
    try:
        import triton  # pylint: disable=import-outside-toplevel  (optional on the GPU box)
        return triton.__version__
    except ImportError:
        return None


def _f(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _iqr(quartiles) -> str:
    return "-" if not quartiles else f"{quartiles[0]:.3f}-{quartiles[2]:.3f}"


def markdown_of(result: dict) -> str:
    """The tables of a results folder's README from a run's JSON: the summary against the issue's
    targets, then every case (graphs; ours in us, TFLOPS, TB/s; each peer's time over ours)."""
    s, t = result["summary"], result["summary"]["targets"]
    lines = ["| measure | geomean | least | cases | target |", "|---|---|---|---|---|"]
    for label, key, target in (("x torch._grouped_mm, all", "to_grouped_mm", f">= {t['to_grouped_mm_geomean']} "
                                f"(none below {t['to_grouped_mm_min']})"),
                               ("x torch._grouped_mm, a stream of calls (host included)", "to_grouped_mm_stream", ""),
                               ("x torch._grouped_mm, <= 256 tokens", "to_grouped_mm_decode", ""),
                               ("x best peer, all", "to_best_peer", ""),
                               ("x best peer, <= 256 tokens", "to_best_peer_decode",
                                f">= {t['decode_to_best_peer']} (the issue's: masked layout)"),
                               ("x cuBLAS loop, many small experts", "to_cublas_loop_many_small",
                                f">= {t['to_cublas_loop_many_small']}")):
        v = s[key]
        lines.append(f"| {label} | {_f(v['geomean'])} | {_f(v['min'])} | {v['cases']} | {target} |")
    for peer, v in s["per_peer"].items():
        lines.append(f"| x {peer} | {_f(v['geomean'])} | {_f(v['min'])} | {v['cases']} | |")
    for d in s["dense_compare"]:
        lines.append(f"| grouped / dense TFLOPS, Mixtral-like balanced {d['tokens']} | "
                     f"{_f(d['ratio_grouped_to_dense'])} | | 1 | >= {t['grouped_to_dense']} |")
    lines += ["", f"{s['correct']} of {s['cases']} cases correct.", "",
              "| family | tokens | routing | module (rule) | ours us | TFLOPS | TB/s | x grouped_mm | x cublas_loop "
              "| x triton | x grouped_mm, queued | x grouped_mm, stream | x grouped_mm, rounds' IQR |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r.get("op") == "dense_compare":
            continue
        p, q, w = r["peer_ratios"], r.get("peer_ratios_queued") or {}, r.get("peer_ratios_stream") or {}
        mark = "" if r["correct"] else " (WRONG)"
        lines.append(f"| {r['family']} | {r['tokens']} | {r['routing'] or '-'}{mark} | {r.get('rule') or '-'} | "
                     f"{_f(r.get('kernel_us'), 1)} | {_f(r.get('tflops'), 0)} | {_f(r.get('tb_per_s'), 2)} | "
                     f"{_f(p['grouped_mm'])} | {_f(p['cublas_loop'])} | {_f(p['triton_grouped'])} | "
                     f"{_f(q.get('grouped_mm'))} | {_f(w.get('grouped_mm'))} | "
                     f"{_iqr((r.get('peer_ratio_round_quartiles') or {}).get('grouped_mm'))} |")
    dense = [r for r in result["rows"] if r.get("op") == "dense_compare"]
    if dense:
        lines += ["", "| dense compare (Mixtral-like, balanced) | grouped TFLOPS | dense TFLOPS | grouped / dense |",
                  "|---|---|---|---|"]
        lines += [f"| {r['tokens']} tokens, dense {'x'.join(map(str, r['dense_shape']))} | {_f(r['grouped_tflops'], 0)} "
                  f"| {_f(r['dense_tflops'], 0)} | {_f(r['ratio_grouped_to_dense'])} |" for r in dense]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p, _, _, sub = check_cli.subcommands(__doc__, "build box: a kernel pack of the five MoE weights and the dense shapes",
                                       "GPU box: every case through the front door against every peer",
                                       "grouped_suite.json")
    tables = sub.add_parser("tables", help="any box: a run's JSON as the README's markdown tables")
    tables.add_argument("json", help="the results file run wrote")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out)
    if a.cmd == "tables":
        print(markdown_of(json.loads(Path(a.json).read_text())), end="")
        return 0
    check_cli.require_in_name(p, a.out, "grouped", 33)
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
