"""Any M of a packed weight against the best module the pack holds for that M (issue 30's target:
within 0.9x), and both against cuBLAS, as kernels.

A whole-range kernel pack (``pack build --weights NxK``) holds one module per choice of the policy
over the weight's M buckets (``kernel_pack.M_BUCKETS``); ``KernelPack.find`` picks one for each M,
and that is what the front door runs. This benchmark asks, per weight and M, whether another module
of the same pack would have been faster, and by how much:

- the M: one in every cell of the buckets (:data:`M_POINTS`: off the tile multiples where the cell
  allows, plus 1 and 8), up to the most rows the weight's modules index (``weight_buckets``);
- the candidates: every module of the pack that serves that M, a runtime-M module (``dynamic_m``)
  at any M up to ``config.max_m_of``, a module of one M at that M only;
- each checked first (random inputs, the output poisoned with NaN, up to 256 rows against a float64
  reference with cuBLAS's error as the yardstick: ``suite.check_case``); a wrong one is not timed;
- a screen: three queued launches each; a candidate more than :data:`SCREEN` times slower than the
  fastest keeps that rough time and leaves the rounds (it cannot be the best; the chosen one is
  always timed);
- then the rest and cuBLAS (``torch.matmul(A, W.T, out=D)``) in :data:`ROUNDS` rounds, the order
  rotating from round to round (each kernel first, both ways round, as ``measure.rounds``), each
  sample one replay of a CUDA graph of calls cycling through input sets that spill L2 three times
  (``harness.graph_times``: no host in the time, what a model served with CUDA graphs sees).

Per row: the module ``find`` chose and how it fits, the best module, ``chosen_ratio`` and
``best_ratio`` (cuBLAS's time over theirs: above 1, faster than cuBLAS) and ``chosen_over_best``
(the best's time over the chosen one's: the target is >= 0.9), ``held_out`` (a weight of no model
the policy was tuned on: ``every_model.FAMILIES``), every candidate's time.

    PYTHONPATH=. .venv/bin/python benchmarks/m_range_check.py prepare build/m_range     # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/m_range_check.py run build/m_range --out out/m_range_check.json   # GPU box

``prepare`` builds the pack into the folder (through the module cache) and writes the M to test in
``m_range.json`` beside ``pack.json``; ``run`` needs the TVM runtime and torch only. The default
four weights in fp16: 35 modules, 7.4 MiB, 56 (weight, M), 490 module checks; sized for 1-2
minutes on an H100 (an estimate until the first run: checks, captures and the lm_head's large M
take most of it); ``--rounds`` and ``--per-round`` trade time for spread. ``run`` writes the rows
as it goes (``OUT.jsonl``), so a crash loses only what was left.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import cli_types, device, files  # noqa: E402
from gemm_ladder.core.config import max_m_of  # noqa: E402
from gemm_ladder.core.procs import progress as progress_bar  # noqa: E402
from gemm_ladder.core.records import Bool, Int, List, Obj, RecordError, Str, read_json  # noqa: E402
from gemm_ladder.measure import every_model, harness, suite  # noqa: E402
from gemm_ladder.measure.report import table as fmt  # noqa: E402
from gemm_ladder.core.spec import GemmSpec, spec_of_manifest  # noqa: E402
from gemm_ladder.serve import first_use  # noqa: E402
from gemm_ladder.serve.kernel_pack import (KernelPack, bucket_cells, build_pack, plan_pack,  # noqa: E402
    weight_buckets)

FORMAT = "gemm_ladder.m_range_check"
PLAN_FILE = "m_range.json"  # beside pack.json: the weights and the M to test each at
# Llama-8B's attention output, down projection and LM head (the policy was tuned on them), and
# phi-2's fc2 (2560x10240), a weight of no model it was tuned on
WEIGHTS = "4096x4096,4096x14336,128256x4096,2560x10240"
# one M in every cell of kernel_pack.M_BUCKETS (bucket_cells: 1 | 2..8 | 9..16 | ... | 12289..16384),
# about 3/4 up the cell and off the tile multiples where the cell allows (a ragged last tile), plus
# 8, the top of decode's 2..8 cell
M_POINTS = (1, 3, 8, 12, 24, 48, 96, 160, 200, 320, 448, 700, 900, 1200, 1792, 2560, 3500, 5000, 7000, 10000, 14000)
TARGET = 0.9  # issue 30: any M of a packed weight within 0.9x of the best module for that M
SCREEN = 2.0  # a candidate this many times slower than the fastest, roughly, leaves the rounds
ROUNDS, PER_ROUND = 8, 4  # rounds x replays per kernel per round
GRAPH_US = 300.0  # a timed replay lasts at least this long (fewer calls for a long kernel)

PLAN_SCHEMA = Obj({"format": Str([FORMAT]), "weights": List(Obj(
    {"N": Int(lo=1), "K": Int(lo=1), "dtype": Str(), "held_out": Bool(), "ms": List(Int(lo=1), min_len=1)}))})


# -- planning (build box; no compiler needed) ---------------------------------------------------
def tuned_weights() -> set[tuple[int, int]]:
    """The (N, K) of the families the policy was tuned on (every_model: the others are held out)."""
    return {nk for fam in every_model.FAMILIES.values() if not fam["held_out"] for nk in fam["weights"].values()}


def m_points(N: int, K: int) -> list[int]:
    """The M a weight is tested at: :data:`M_POINTS` up to the most its pack serves (its last
    bucket, ``weight_buckets``), and the top of any of its cells that none falls in (a weight too
    wide for 16384 rows stops at a bucket of its own)."""
    cells = bucket_cells(weight_buckets(N, K))
    ms = {m for m in M_POINTS if m <= cells[-1][2]}
    return sorted(ms | {hi for _, lo, hi in cells if not any(lo <= m <= hi for m in ms)})


def plan(weights, dtypes) -> dict:
    """What ``prepare`` writes to :data:`PLAN_FILE`: per weight and dtype, the M to test."""
    bad = [f"{N}x{K}" for N, K in weights if N % 8 or K % 8]
    if bad:
        raise ValueError(f"weights {', '.join(bad)}: N and K must be multiples of 8 (an odd one takes the padded "
                         "path, which copies and times more than the kernel): pick aligned weights")
    tuned = tuned_weights()
    return {"format": FORMAT, "weights": [{"N": N, "K": K, "dtype": d, "held_out": (N, K) not in tuned,
                                           "ms": m_points(N, K)} for N, K in weights for d in dtypes]}


def prepare(out, weights, dtypes, sms: int, dry_run: bool = False) -> int:
    """Build the whole-range pack of ``weights`` into ``out`` and write :data:`PLAN_FILE` there."""
    doc = plan(weights, dtypes)
    cases = sum(len(w["ms"]) for w in doc["weights"])
    if dry_run:
        items = plan_pack([], dtypes, sms=sms, weights=weights)
        print(f"{len(items)} modules for {len(weights)} weights x {len(dtypes)} dtypes; {cases} (weight, M) to test")
        for w in doc["weights"]:
            print(f"  {w['N']}x{w['K']} {w['dtype']}{' (held out)' if w['held_out'] else ''}: M = "
                  f"{', '.join(map(str, w['ms']))}")
        return 0
    man = build_pack(out, [], dtypes, sms=sms, weights=weights,
                     request={"weights": [f"{N}x{K}" for N, K in weights], "dtypes": list(dtypes),
                              "by": "benchmarks/m_range_check.py"})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
    files.write_json(Path(out) / PLAN_FILE, doc)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"{len({e['file'] for e in man['modules']})} modules ({len(man['modules'])} entries), "
          f"{size / 2**20:.1f} MiB in {out}; {cases} (weight, M) to test")
    return 1 if failed else 0


# -- which modules serve an M, and the row of one M (no GPU: the arithmetic) -------------------
def candidates(pack: KernelPack, M: int, N: int, K: int, dtype: str, arch: str) -> list[dict]:
    """Every module (one entry a file) of ``pack`` of the default spec that serves M rows of this
    weight: a runtime-M one up to the M its 32-bit indices take, a module of one M at that M."""
    out = {}
    for e in pack.modules:
        if (e["shape"][1], e["shape"][2], e["dtype"], e["arch"]) != (N, K, dtype, arch) \
                or spec_of_manifest(e) != GemmSpec.default(dtype):
            continue
        serves = M <= max_m_of(N, K, e["knobs"]) if e["dynamic_m"] else e["shape"][0] == M
        if serves:
            out.setdefault(e["file"], e)
    return list(out.values())


def make_row(weight: dict, M: int, chosen: str | None, fit: str | None, timed: dict, cublas_ms: float | None) -> dict:
    """One row of the result: ``timed`` maps each candidate's file to ``{"correct", "ms", "rough"}``
    (``ms`` None for a wrong one; ``rough`` true where the screen left it out of the rounds)."""
    good = {f: t for f, t in timed.items() if t.get("correct") and t.get("ms")}
    best = min(good, key=lambda f: good[f]["ms"]) if good else None
    mine = good.get(chosen)
    best_ms = good[best]["ms"] if best else None

    def ratio(ms):
        return cublas_ms / ms if ms and cublas_ms else None

    return {"weight": f"{weight['N']}x{weight['K']}", "N": weight["N"], "K": weight["K"], "held_out": weight["held_out"],
            "M": M, "dtype": weight["dtype"], "chosen": chosen, "chosen_fit": fit, "best": best,
            "chosen_ms": mine["ms"] if mine else None, "best_ms": best_ms, "cublas_ms": cublas_ms,
            "chosen_ratio": ratio(mine["ms"] if mine else None), "best_ratio": ratio(best_ms),
            "chosen_over_best": best_ms / mine["ms"] if mine and best_ms else None,
            "correct": bool(chosen in timed and timed[chosen].get("correct")),
            "wrong": sorted(f for f, t in timed.items() if not t.get("correct")),
            "modules": [{"file": f, **t} for f, t in sorted(timed.items(), key=lambda ft: ft[1].get("ms") or math.inf)]}


def add_measured(row: dict, measured: str | None, queued_us: dict) -> dict:
    """The front door's measured choice at first use under CUDA-graph capture (``first_use``: the
    pack's modules that serve the M as they are and torch, timed as kernels in a graph, torch only
    by its margin) against the best module as kernels: ``measured_over_best`` (torch's choice
    counts at cuBLAS's time)."""
    good = {m["file"]: m["ms"] for m in row["modules"] if m.get("correct") and m.get("ms")}
    ms = row["cublas_ms"] if measured == first_use.TORCH else good.get(measured)
    row.update(measured=measured, measured_us=queued_us, measured_ms=ms,
               measured_ratio=row["cublas_ms"] / ms if ms and row["cublas_ms"] else None,
               measured_over_best=row["best_ms"] / ms if ms and row["best_ms"] else None)
    return row


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict]) -> dict:
    """Counts against :data:`TARGET` (a row with no timed chosen module counts as below it), for
    the tuned and held-out weights apart and together."""
    out = {"target": TARGET}
    for name, part in (("tuned", [r for r in rows if not r["held_out"]]), ("held_out", [r for r in rows if r["held_out"]]),
                       ("all", rows)):
        cob = [r["chosen_over_best"] for r in part]
        out[name] = {"rows": len(part), "correct": sum(r["correct"] for r in part),
                     "below_target": sum(c is None or c < TARGET for c in cob),
                     "chosen_is_best": sum(r["chosen"] is not None and r["chosen"] == r["best"] for r in part),
                     "min_chosen_over_best": min((c for c in cob if c is not None), default=None),
                     "geomean_chosen_over_best": _geomean(cob),
                     "geomean_chosen_ratio": _geomean(r["chosen_ratio"] for r in part),
                     "geomean_best_ratio": _geomean(r["best_ratio"] for r in part)}
        if any("measured" in r for r in part):
            mob = [r.get("measured_over_best") for r in part]
            out[name].update(measured_below_target=sum(c is None or c < TARGET for c in mob),
                             min_measured_over_best=min((c for c in mob if c is not None), default=None),
                             geomean_measured_over_best=_geomean(mob),
                             geomean_measured_ratio=_geomean(r.get("measured_ratio") for r in part),
                             measured_torch=sum(r.get("measured") == first_use.TORCH for r in part))
    out["met"] = out["all"]["rows"] > 0 and out["all"]["below_target"] == 0
    if "measured_below_target" in out["all"]:
        out["met_measured"] = out["all"]["rows"] > 0 and out["all"]["measured_below_target"] == 0
    return out


def table(rows: list[dict]) -> str:
    def f3(x):
        return f"{x:.3f}" if x is not None else "-"

    def short(file):  # rung, tile, split-K, stream-K (the JSON has the whole file name)
        knobs = re.sub(r"^.*?_sm_\d+a_", "", file)
        tile, split = re.match(r"m\d+n\d+", knobs), re.search(r"splitk(\d+)", knobs)
        return " ".join([file.split("_")[0], tile.group(0) if tile else "?",
                         *([f"split {split.group(1)}"] if split and split.group(1) != "1" else []),
                         *(["stream-k"] if "streamkTrue" in knobs else [])])

    out = [{"weight": r["weight"] + (" *" if r["held_out"] else ""), "M": r["M"], "ok": "yes" if r["correct"] else "NO",
            "chosen": short(r["chosen"]) if r["chosen"] else "-",
            "x cuBLAS": f3(r["chosen_ratio"]), "best": "=" if r["best"] == r["chosen"] else
            short(r["best"]) if r["best"] else "-",
            "best x cuBLAS": f3(r["best_ratio"]), "chosen/best": f3(r["chosen_over_best"]) +
            (" <" if r["chosen_over_best"] is None or r["chosen_over_best"] < TARGET else "")} for r in rows]
    return fmt(out, list(out[0])) + "\n(* held out: a weight of no model the policy was tuned on)" if out else "no rows"


# -- the GPU side ---------------------------------------------------------------------------------
def _calls(rough_ms: float, n_sets: int) -> int:
    """Calls per captured graph: a replay of at least :data:`GRAPH_US`, at most
    ``harness.GRAPH_CALLS`` calls, every input set at least once."""
    calls = min(harness.GRAPH_CALLS, max(1, math.ceil(GRAPH_US / 1e3 / max(rough_ms, 1e-6))))
    return max(n_sets, calls)


def time_together(kernels: dict, sets, rough: dict, rounds: int, per_round: int) -> dict:
    """Median ms per call of each of ``kernels`` (name -> launch function; ``rough``: name -> ms of
    a queued launch), in rounds whose order rotates (each kernel in each position, forwards and
    backwards), each sample one replay of its CUDA graph (``harness.graph_times``)."""
    names = list(kernels)
    calls = {n: _calls(rough[n], len(sets)) for n in names}
    for n in names:
        harness.graph_times(kernels[n], sets, 2, calls[n])  # capture, warm up
    orders = [[names[(r + i) % len(names)] for i in range(len(names))] for r in range(len(names))]
    orders += [o[::-1] for o in orders]
    times: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in orders[r % len(orders)]:
            times[n] += harness.graph_times(kernels[n], sets, per_round, calls[n])
    return {n: statistics.median(ts) for n, ts in times.items()}


def measure(pack: KernelPack, weight: dict, M: int, arch: str, loaded: dict, rounds: int, per_round: int) -> dict:
    """Check every candidate for M rows of the weight, screen, time the rest with cuBLAS: a row."""
    import torch  # pylint: disable=import-outside-toplevel  (the GPU box's)

    N, K, dtype = weight["N"], weight["K"], weight["dtype"]
    found = pack.find(M, N, K, dtype, arch)
    chosen, fit = (found.entry["file"], found.fit) if found else (None, None)
    cands = candidates(pack, M, N, K, dtype, arch)
    timed: dict = {}
    A, B = harness.random_inputs(M, N, K, dtype, seed=7)
    D = torch.empty((M, N), dtype=A.dtype, device=A.device)
    for e in cands:
        timed[e["file"]] = {"rung": e["rung"], "m_range": e["m_range"], "correct": False, "ms": None, "rough": False}
        try:  # a module that refuses this M (a workspace past its indices, ...) is a result, not the end
            if e["file"] not in loaded:
                loaded[e["file"]] = pack.load(e)
            D.fill_(float("nan"))
            loaded[e["file"]](A, B, out=D)
            torch.cuda.synchronize()
        except (ValueError, RuntimeError) as err:
            timed[e["file"]]["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            continue
        check = suite.check_case(A, B, D, dtype)
        timed[e["file"]].update(correct=check["ok"], rel_err=check["rel_err"])
    del A, B, D
    torch.cuda.empty_cache()
    sets = harness.input_sets(M, N, K, dtype, l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
    good = [f for f, t in timed.items() if t["correct"]]
    kernels = {f: loaded[f].launcher(*sets[0]) for f in good}

    def cublas(a, b, o):
        torch.matmul(a, b.T, out=o)

    # the screen: three queued launches each, after one
    rough = {}
    for f, fn in {**kernels, "cublas": cublas}.items():
        fn(*sets[0])
        rough[f] = statistics.median(harness.event_times(fn, sets, 3))
    fastest = min((ms for f, ms in rough.items() if f != "cublas"), default=None)
    keep = {f: fn for f, fn in kernels.items() if f == chosen or rough[f] <= SCREEN * fastest}
    for f in kernels:
        if f not in keep:
            timed[f].update(ms=rough[f], rough=True)
    t0 = time.time()
    got = time_together({**keep, "cublas": cublas}, sets, rough, rounds, per_round)
    t1 = time.time()
    for f in keep:
        timed[f]["ms"] = got[f]
    row = make_row(weight, M, chosen, fit, timed, got["cublas"])
    # what the front door's first call would choose: its candidates (KernelPack.serving, at most
    # first_use.MAX_CANDIDATES) and torch, timed as it times them
    serving = [f.entry["file"] for f in pack.serving(M, N, K, dtype, arch)][:first_use.MAX_CANDIDATES]
    queued = {f: kernels[f] for f in serving if f in kernels}
    queued[first_use.TORCH] = cublas
    mine = first_use.input_sets(*sets[0], l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
    queued_us = first_use.time_launches(queued, mine)
    kernel_us = first_use.time_graphs(queued, mine, queued_us)
    del mine
    # the kernels here are timed in graphs: the front door's choice under capture is the one to score
    add_measured(row, first_use.pick(kernel_us or queued_us), kernel_us or queued_us)
    row.update(measured_eager=first_use.pick(queued_us), measured_queued_us=queued_us)
    row.update(input_sets=len(sets), t0=t0, t1=t1)
    del kernels, keep, sets
    torch.cuda.empty_cache()
    return row


def run(folder, out, rounds: int = ROUNDS, per_round: int = PER_ROUND, progress: bool = True) -> int:
    """Every weight and M of the folder's :data:`PLAN_FILE` on this GPU; write ``out`` (and
    ``out`` with ``.jsonl``, row by row). 0 once written (met or not: ``summary["met"]``), 2 where
    it cannot run."""
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"m_range_check run: no GPU to time on ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    fix = f"run benchmarks/m_range_check.py prepare {folder} on the build box and carry the folder here"
    try:
        pack = KernelPack(folder)
        doc = read_json(Path(folder) / PLAN_FILE, "m_range_check plan", fix, PLAN_SCHEMA)
    except RecordError as err:
        print(f"m_range_check run: {err}", file=sys.stderr)
        return 2
    arch = device.arch_of(0)
    todo = [(w, M) for w in doc["weights"] for M in w["ms"]]
    bar = progress_bar(len(todo), "m range") if progress else None
    sampler = Sampler()
    rows, loaded, start = [], {}, time.time()
    files.open_folder(Path(out).parent)
    lines = Path(out).with_suffix(".jsonl").open("w")  # row by row: a crash loses only what is left
    try:
        for w, M in todo:
            row = measure(pack, w, M, arch, loaded, rounds, per_round)
            row["clocks"] = sampler.between(row.pop("t0"), row.pop("t1"))
            rows.append(row)
            lines.write(json.dumps(row) + "\n")
            lines.flush()
            if bar is not None:
                bar.set_postfix_str(f"{row['weight']} M={row['M']}: chosen/best "
                                    f"{row['chosen_over_best'] or 0:.3f}, x cuBLAS {row['chosen_ratio'] or 0:.3f}")
                bar.update(1)
    finally:
        lines.close()
        sampler.stop()
        if bar is not None:
            bar.close()
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "pack": {"folder": str(folder), "commit": pack.manifest.get("commit"), "modules": len(loaded)},
              "method": __doc__.split("This benchmark asks,")[1].split("Per row:")[0].strip(),
              "rounds": rounds, "per_round": per_round, "screen": SCREEN, "summary": summary(rows), "rows": rows}
    files.write_record(out, result)
    print(table(rows))
    s = result["summary"]
    print(f"{s['all']['below_target']} of {len(rows)} (weight, M) below {TARGET}x of the best module "
          f"({s['held_out']['below_target']} held out); {s['all']['correct']} correct; "
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, r, _ = check_cli.subcommands(__doc__, "build box: the whole-range pack of the weights and the M to test",
                                        "GPU box: check and time every module serving each M, against cuBLAS",
                                        "m_range_check.json")
    pr.add_argument("--weights", type=cli_types.weights, default=cli_types.weights(WEIGHTS))
    pr.add_argument("--dtypes", type=cli_types.names(every_model.DTYPES, "dtype"), default=["float16"])
    pr.add_argument("--sms", type=cli_types.count, default=132, help="SM count the policy plans for (H100 SXM)")
    pr.add_argument("--dry-run", action="store_true", help="print the modules and the M; build nothing")
    r.add_argument("--rounds", type=cli_types.count, default=ROUNDS)
    r.add_argument("--per-round", type=cli_types.count, default=PER_ROUND)
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        try:
            return prepare(a.out, a.weights, a.dtypes, a.sms, a.dry_run)
        except ValueError as err:
            p.error(str(err))
    return run(a.folder, a.out, a.rounds, a.per_round)


if __name__ == "__main__":
    sys.exit(main())
