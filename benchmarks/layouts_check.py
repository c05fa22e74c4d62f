"""MN-major operands and the op's backward on a GPU (issue 31): correctness of all four operand
layouts, the gradients of ``torch.ops.gemm_ladder.mm`` against torch's, and the two backward
GEMMs of a training step against cuBLAS at Llama-8B's weight shapes.

A layout is the spec's ``(a_major, b_major)``: ``KK`` is the forward (A [M, K], B [N, K]), ``KN``
a B stored [K, N] (dX = dY . W reads W [N_out, K_in] so: the "NN" GEMM of the backward), ``MK`` an
A stored [K, M], ``MN`` both (dW = dY^T . X reads dY and X as they lie: "TN"). At the front door
an MN-major operand is the transposed view of a contiguous tensor (``W.t()``, ``dY.t()``).

- checks (a child process each batch, with a deadline: ``measure.isolate``): every layout in fp16
  and bf16 at odd shapes (partial tiles in M, N and K), random inputs, the output poisoned with
  NaN, up to 256 rows against a float64 reference with cuBLAS's own error as the yardstick
  (``suite.check_case``), through the module and through ``gemm_ladder.matmul`` (strict: no torch
  fallback); every timing shape likewise before it is timed;
- gradients: ``mm(X, W, b)`` forward and backward (our kernels for the forward, dX and dW, strict)
  against float64 formulas on the same bf16 values, with torch's own bf16 autograd's error as the
  yardstick, and dbias;
- timing (here, in this process): dX (op ``dX_NN``: M = tokens, N = K_in, K = N_out) and dW (op
  ``dW_TN``: M = N_out, N = K_in, K = tokens) for the weights of :data:`WEIGHTS` at :data:`TOKENS`,
  ours against ``torch.matmul`` with the same layouts (``dY @ W``, ``dY.t() @ X``), as kernels
  (CUDA graphs of calls cycling input sets that spill L2, taking turns in rotating rounds:
  ``m_range_check.time_together``) and as queued calls (``gemm_ladder.matmul`` on the views
  against ``torch.matmul``, alternating rounds); ``kernel_ratio`` and ``call_ratio`` are cuBLAS's
  time over ours.

    PYTHONPATH=. .venv/bin/python benchmarks/layouts_check.py prepare build/layouts            # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/layouts_check.py run build/layouts --out out/layouts_check.json     # GPU box

``prepare`` builds one kernel pack (through the module cache) and writes the cases to
``layouts.json`` beside ``pack.json``; ``run`` needs the TVM runtime and torch only.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from m_range_check import time_together  # noqa: E402  (a sibling script, not a package)
from power_probe import Sampler  # noqa: E402
import check_cli  # noqa: E402  (a sibling script, not a package)

import gemm_ladder  # noqa: E402  (the front door)
import gemm_ladder.serve.ops  # noqa: E402,F401  (registers torch.ops.gemm_ladder.mm)
from gemm_ladder.core import cli_types, device, files  # noqa: E402
from gemm_ladder.core.records import Int, List, Obj, RecordError, Str, read_json  # noqa: E402
from gemm_ladder.core.spec import OPERAND_LAYOUTS, GemmSpec  # noqa: E402
from gemm_ladder.measure import harness, isolate, suite  # noqa: E402
from gemm_ladder.measure.report import table as fmt  # noqa: E402
from gemm_ladder.serve.kernel_pack import KernelPack, build_pack  # noqa: E402

FORMAT = "gemm_ladder.layouts_check"
PLAN_FILE = "layouts.json"
LAYOUTS = OPERAND_LAYOUTS  # name -> (a_major, b_major)
# odd shapes: M, N and K multiples of 8 (what TMA reads an MN-major operand at) but not of any tile
CHECK_SHAPES = ((328, 264, 520), (1000, 1528, 776))
CHECK_DTYPES = ("float16", "bfloat16")
# the op's gradient check: X [2, 136, 512], W [384, 512], a bias; forward KK with the bias, then
# dX (M = 272, N = 512, K = 384, KN) and dW (M = 384, N = 512, K = 272, MN)
GRAD = {"batch": 2, "seq": 136, "n_out": 384, "k_in": 512, "dtype": "bfloat16"}
# Llama-8B's weights (N_out x K_in): q/o, gate/up, down, fused qkv; and the tokens of a step
WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096))
TOKENS = (2048, 4096, 8192)
TIME_DTYPE = "bfloat16"
OPS = {"dX_NN": "KN", "dW_TN": "MN"}  # the backward GEMMs and their layouts
ROUNDS, PER_ROUND, CALL_REPS = 4, 3, 6
BAR = 0.9  # issue 31: no shape below 0.9x cuBLAS

PLAN_SCHEMA = Obj({"format": Str([FORMAT]),
                   "checks": List(Obj({"layout": Str(list(LAYOUTS)), "dtype": Str(), "M": Int(lo=1), "N": Int(lo=1),
                                       "K": Int(lo=1)})),
                   "grad": Obj({k: (Str() if k == "dtype" else Int(lo=1)) for k in GRAD}),
                   "timing": List(Obj({"op": Str(list(OPS)), "layout": Str(list(LAYOUTS)), "dtype": Str(),
                                       "weight": Str(), "tokens": Int(lo=1), "M": Int(lo=1), "N": Int(lo=1),
                                       "K": Int(lo=1)}))})


# -- the cases (no GPU) -------------------------------------------------------------------------
def backward_shapes(n_out: int, k_in: int, tokens: int) -> dict:
    """(M, N, K) of dX = dY . W and dW = dY^T . X for a weight [n_out, k_in] and ``tokens`` rows."""
    return {"dX_NN": (tokens, k_in, n_out), "dW_TN": (n_out, k_in, tokens)}


def plan() -> dict:
    """What ``prepare`` writes to :data:`PLAN_FILE`: the checks, the gradient case, the timings."""
    checks = [{"layout": lay, "dtype": d, "M": M, "N": N, "K": K}
              for (M, N, K) in CHECK_SHAPES for d in CHECK_DTYPES for lay in LAYOUTS]
    timing = [{"op": op, "layout": OPS[op], "dtype": TIME_DTYPE, "weight": f"{n}x{k}", "tokens": t,
               "M": s[0], "N": s[1], "K": s[2]}
              for n, k in WEIGHTS for t in TOKENS for op, s in backward_shapes(n, k, t).items()]
    return {"format": FORMAT, "checks": checks, "grad": dict(GRAD), "timing": timing}


def pack_requests(doc: dict) -> list[dict]:
    """The ``build_pack`` calls that build every module the plan runs: per (layout, dtype,
    epilogue), the shapes."""
    groups: dict = {}

    def add(layout, dtype, epilogue, shape):
        groups.setdefault((layout, dtype, epilogue), set()).add(tuple(shape))

    for c in doc["checks"]:
        add(c["layout"], c["dtype"], "none", (c["M"], c["N"], c["K"]))
    g = doc["grad"]
    rows = g["batch"] * g["seq"]
    add("KK", g["dtype"], "bias", (rows, g["n_out"], g["k_in"]))
    for op, shape in backward_shapes(g["n_out"], g["k_in"], rows).items():
        add(OPS[op], g["dtype"], "none", shape)
    for t in doc["timing"]:
        add(t["layout"], t["dtype"], "none", (t["M"], t["N"], t["K"]))
    return [{"layouts": [LAYOUTS[lay]], "dtypes": [dtype], "epilogues": [epi], "shapes": sorted(shapes)}
            for (lay, dtype, epi), shapes in sorted(groups.items())]


def spec_of_case(layout: str, dtype: str, bias: bool = False) -> GemmSpec:
    a_major, b_major = LAYOUTS[layout]
    return GemmSpec(a=dtype, b=dtype, d=dtype, a_major=a_major, b_major=b_major, bias=dtype if bias else None)


def item_of(kind: str, case: dict) -> str:
    """A case as an item of an isolated batch (``check_item`` parses it back)."""
    return f"{kind}:{case.get('layout', 'KK')}:{case['dtype']}:{case['M']}x{case['N']}x{case['K']}"


def parse_item(item: str) -> tuple[str, str, str, tuple[int, int, int]]:
    kind, layout, dtype, shape = item.split(":")
    M, N, K = (int(x) for x in shape.split("x"))
    return kind, layout, dtype, (M, N, K)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict], checks: list[dict], grad: dict) -> dict:
    """Per op: the geomean and least kernel and call ratios, and how many shapes fall below
    :data:`BAR`; the checks and the gradients passed or not."""
    out = {"bar": BAR, "checks_ok": sum(c.get("status") == "ok" for c in checks), "checks": len(checks),
           "grad_ok": grad.get("status") == "ok"}
    for op in OPS:
        part = [r for r in rows if r["op"] == op]
        kr = [r["kernel_ratio"] for r in part if r.get("kernel_ratio")]
        out[op] = {"rows": len(part), "geomean_kernel_ratio": geomean(kr),
                   "min_kernel_ratio": min(kr, default=None),
                   "below_bar": sum(1 for r in part if not r.get("kernel_ratio") or r["kernel_ratio"] < BAR),
                   "geomean_call_ratio": geomean(r.get("call_ratio") for r in part)}
    return out


def table(rows: list[dict]) -> str:
    def f3(x):
        return f"{x:.3f}" if x is not None else "-"

    out = [{"op": r["op"], "weight": r["weight"], "tokens": r["tokens"], "M": r["M"], "N": r["N"], "K": r["K"],
            "ok": "yes" if r["correct"] else "NO", "kernel x cuBLAS": f3(r.get("kernel_ratio")),
            "call x cuBLAS": f3(r.get("call_ratio"))} for r in rows]
    return fmt(out, list(out[0])) if out else "no rows"


# -- prepare (build box) ------------------------------------------------------------------------
def prepare(out, sms: int, workers: int | None = None) -> int:
    doc = plan()
    results = []
    for req in pack_requests(doc):
        man = build_pack(out, req["shapes"], req["dtypes"], sms=sms, workers=workers, epilogues=req["epilogues"],
                         layouts=req["layouts"], request={"by": "benchmarks/layouts_check.py"})
        results += man["results"]
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
    files.write_json(Path(out) / PLAN_FILE, doc)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"{len({r['file'] for r in results})} modules, {size / 2**20:.1f} MiB in {out}; {len(doc['checks'])} checks, "
          f"{len(doc['timing'])} timings")
    return 1 if failed else 0


# -- the GPU side -------------------------------------------------------------------------------
def operands(layout: str, M: int, N: int, K: int, dtype: str, seed: int):
    """Random logical A [M, K] and B [N, K] whose memory is the layout's (a transposed view of a
    contiguous [K, M] / [K, N] tensor where MN-major), and the kernel's stored tensors."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, dtype)
    a_major, b_major = LAYOUTS[layout]
    a_st = torch.randn((K, M) if a_major == "M" else (M, K), generator=g, device="cuda").to(t)
    b_st = torch.randn((K, N) if b_major == "N" else (N, K), generator=g, device="cuda").to(t)
    A = a_st.t() if a_major == "M" else a_st
    B = b_st.t() if b_major == "N" else b_st
    return A, B, a_st, b_st


def _check_one(pack: KernelPack, layout: str, dtype: str, M: int, N: int, K: int) -> dict:
    spec = spec_of_case(layout, dtype)
    found = pack.find(M, N, K, dtype, device.arch_of(0), spec)
    if found is None:
        return {"status": "error", "detail": f"no module of {spec.text()} for {M}x{N}x{K} in the pack"}
    mod = pack.load(found.entry)
    A, B, a_st, b_st = operands(layout, M, N, K, dtype, seed=M + N + K)
    D = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    mod(a_st, b_st, out=D)
    torch.cuda.synchronize()
    module = suite.check_case(A, B, D, dtype)
    D.fill_(float("nan"))
    gemm_ladder.matmul(A, B, out=D, strict=True)  # the front door's route: the views, no copies
    torch.cuda.synchronize()
    front = suite.check_case(A, B, D, dtype)
    ok = module["ok"] and front["ok"]
    return {"status": "ok" if ok else "wrong", "file": found.entry["file"], "module": module, "front": front}


def _grad_check(dtype: str, batch: int, seq: int, n_out: int, k_in: int) -> dict:
    """mm(X, W, b) forward and backward on our kernels (strict) against float64 formulas on the
    same values; torch's own autograd in ``dtype`` as the yardstick."""
    t = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(31)
    X = torch.randn((batch, seq, k_in), generator=g, device="cuda").to(t)
    W = (torch.randn((n_out, k_in), generator=g, device="cuda") / math.sqrt(k_in)).to(t)
    b = torch.randn((n_out,), generator=g, device="cuda").to(t)
    G = torch.randn((batch, seq, n_out), generator=g, device="cuda").to(t)  # dL/dD
    ref_x, ref_w = G.double() @ W.double(), G.reshape(-1, n_out).double().t() @ X.reshape(-1, k_in).double()
    ref_b = G.reshape(-1, n_out).double().sum(0)
    grads = {}
    for who, fn in (("ours", lambda x, w, bb: torch.ops.gemm_ladder.mm(x, w, bb)),
                    ("torch", torch.nn.functional.linear)):
        x, w, bb = (v.clone().requires_grad_() for v in (X, W, b))
        fn(x, w, bb).backward(G)
        torch.cuda.synchronize()
        grads[who] = {"dX": x.grad, "dW": w.grad, "dbias": bb.grad}
    out = {"status": "ok"}
    for name, ref in (("dX", ref_x), ("dW", ref_w), ("dbias", ref_b)):
        norm = ref.norm().item() or 1.0
        ours = grads["ours"][name].double()
        rel = torch.nan_to_num(ours - ref, nan=float("inf")).norm().item() / norm
        trel = (grads["torch"][name].double() - ref).norm().item() / norm
        ok = rel <= 2 * trel + harness.ERROR_FLOOR[dtype]
        out[name] = {"rel_err": rel, "torch_rel_err": trel, "ok": ok}
        if not ok:
            out["status"] = "wrong"
    return out


_PACKS_SET: set = set()


def _use_pack(folder) -> None:
    """The front door on this pack alone, strict (a shape no module serves is an error, not
    torch's answer); once a process."""
    os.environ["GEMM_LADDER_STRICT"] = "1"
    if str(folder) not in _PACKS_SET:
        gemm_ladder.use_pack(folder)
        _PACKS_SET.add(str(folder))


def check_item(item: str, args) -> dict:
    """An isolated job (``measure.isolate``, ``package.module:function``): one check or the
    gradient case; ``args``: the pack folder."""
    folder = args[0]
    _use_pack(folder)
    kind, layout, dtype, (M, N, K) = parse_item(item)
    if kind == "grad":
        g = dict(GRAD, dtype=dtype)
        return _grad_check(dtype, g["batch"], g["seq"], g["n_out"], g["k_in"])
    return _check_one(KernelPack(folder), layout, dtype, M, N, K)


def _time_case(pack: KernelPack, case: dict, l2_bytes: int, rounds: int, per_round: int) -> dict:
    M, N, K, dtype, layout = case["M"], case["N"], case["K"], case["dtype"], case["layout"]
    found = pack.find(M, N, K, dtype, device.arch_of(0), spec_of_case(layout, dtype))
    mod = pack.load(found.entry)
    n_sets = harness.sets_to_spill_l2(M, N, K, l2_bytes)
    sets = []
    for i in range(n_sets):
        A, B, a_st, b_st = operands(layout, M, N, K, dtype, seed=1000 + i)
        sets.append((A, B, a_st, b_st, torch.empty((M, N), dtype=A.dtype, device="cuda")))
    launch = mod.launcher(sets[0][2], sets[0][3], sets[0][4])
    kernels = {"ours": lambda A, B, a, b, d, launch=launch: launch(a, b, d),
               # cuBLAS on the same memory: torch.matmul(A, B^T) with A and B^T the views
               "cublas": lambda A, B, a, b, d: torch.matmul(A, B.t(), out=d)}
    calls = {"ours": lambda A, B, a, b, d: gemm_ladder.matmul(A, B, out=d),
             "cublas": lambda A, B, a, b, d: torch.matmul(A, B.t(), out=d)}
    rough = {}
    for name, fn in kernels.items():
        fn(*sets[0])
        rough[name] = statistics.median(harness.event_times(fn, sets, 3))
    t0 = time.time()
    got = time_together(kernels, sets, rough, rounds, per_round)
    call_ms: dict = {"ours": [], "cublas": []}
    for name in calls:
        calls[name](*sets[0])
    for r in range(rounds):
        for name in (("ours", "cublas") if r % 2 == 0 else ("cublas", "ours")):
            call_ms[name] += harness.event_times(calls[name], sets, CALL_REPS)
    t1 = time.time()
    call = {n: statistics.median(v) for n, v in call_ms.items()}
    del sets, launch
    torch.cuda.empty_cache()
    return {"op": case["op"], "weight": case["weight"], "tokens": case["tokens"], "M": M, "N": N, "K": K,
            "dtype": dtype, "layout": layout, "file": found.entry["file"],
            "kernel_ms": got["ours"], "cublas_kernel_ms": got["cublas"], "kernel_ratio": got["cublas"] / got["ours"],
            "call_ms": call["ours"], "cublas_call_ms": call["cublas"], "call_ratio": call["cublas"] / call["ours"],
            "tflops": 2.0 * M * N * K / got["ours"] / 1e9, "input_sets": n_sets, "t0": t0, "t1": t1}


def run(folder, out, rounds: int = ROUNDS, per_round: int = PER_ROUND, timeout: float = 120.0) -> int:
    """Checks (isolated), gradients (isolated), then the timings of what checked out; writes ``out``.
    0 once written, 2 where it cannot run."""
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"layouts_check run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    fix = f"run benchmarks/layouts_check.py prepare {folder} on the build box and carry the folder here"
    try:
        pack = KernelPack(folder)
        doc = read_json(Path(folder) / PLAN_FILE, "layouts_check plan", fix, PLAN_SCHEMA)
    except RecordError as err:
        print(f"layouts_check run: {err}", file=sys.stderr)
        return 2
    start = time.time()
    sampler = Sampler()
    g = doc["grad"]
    items = [item_of("check", c) for c in doc["checks"]]
    items.append(f"grad:KK:{g['dtype']}:{g['batch'] * g['seq']}x{g['n_out']}x{g['k_in']}")
    items += [item_of("check", t) for t in doc["timing"]]
    results = isolate.run_batch(f"{__name__ if __name__ != '__main__' else 'benchmarks.layouts_check'}:check_item",
                                items, [str(folder)], timeout=timeout, explain=False)
    by_item = dict(zip(items, results))
    checks = [{"item": i, **r} for i, r in by_item.items() if not i.startswith("grad")]
    grad = next(r for i, r in by_item.items() if i.startswith("grad"))
    _use_pack(folder)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for case in doc["timing"]:
        res = by_item[item_of("check", case)]
        if res.get("status") != "ok":
            rows.append({"op": case["op"], "weight": case["weight"], "tokens": case["tokens"], "M": case["M"],
                         "N": case["N"], "K": case["K"], "dtype": case["dtype"], "correct": False,
                         "kernel_ratio": None, "call_ratio": None, "check": res})
            continue
        row = _time_case(pack, case, l2, rounds, per_round)
        row.update(correct=True, rel_err=res["module"]["rel_err"], cublas_rel_err=res["module"]["cublas_rel_err"],
                   clocks=sampler.between(row.pop("t0"), row.pop("t1")))
        rows.append(row)
    sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "method": __doc__.split("\n\n")[1].strip(), "rounds": rounds, "per_round": per_round,
              "summary": summary(rows, checks, grad), "checks": checks, "grad": grad, "rows": rows}
    files.write_record(out, result)
    print(table(rows))
    s = result["summary"]
    print(f"checks {s['checks_ok']}/{s['checks']} ok; gradients {'ok' if s['grad_ok'] else 'WRONG'}; " + "; ".join(
        f"{op}: geomean x{s[op]['geomean_kernel_ratio'] or 0:.3f} kernel, x{s[op]['geomean_call_ratio'] or 0:.3f} call, "
        f"{s[op]['below_bar']} below {BAR}" for op in OPS) + f"; {result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, r, _ = check_cli.subcommands(__doc__, "build box: the kernel pack of every case and the plan",
                                        "GPU box: check, gradients, time against cuBLAS", "layouts_check.json")
    pr.add_argument("--sms", type=cli_types.count, default=132, help="SM count the policy plans for (H100 SXM)")
    pr.add_argument("--workers", type=cli_types.count, default=None)
    r.add_argument("--rounds", type=cli_types.count, default=ROUNDS)
    r.add_argument("--per-round", type=cli_types.count, default=PER_ROUND)
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out, a.sms, a.workers)
    check_cli.require_in_name(p, a.out, "layouts", 31)
    return run(a.folder, a.out, a.rounds, a.per_round)


if __name__ == "__main__":
    sys.exit(main())
