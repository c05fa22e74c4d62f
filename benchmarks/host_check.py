"""The host path of a training step on a GPU (issue 31): per call, per layer and per step, ours
against torch, on the kernel pack ``benchmarks/e2e_check.py prepare`` builds.

The end-to-end training step ran at 0.52x torch with about equal GPU time: ours was host-bound
(the transposed-view calls of the backward took the front door's checked path every call, and
``gemm_ladder.nn.Linear`` went through the custom op's dispatch). This measures what a step is
made of, at the 125M Llama's shapes (batch 8 x 512 tokens, bf16), each phase in a child process
with a deadline (``measure.isolate``: a hang costs its phase, not the run):

- ``calls``: for each distinct weight W [N, K], the three GEMMs of its layer -- forward
  ``matmul(X, W)``, dX ``matmul(dY, W.t())`` (an MN-major B) and dW ``matmul(dY.t(), X.t())`` (an
  MN-major A and B) -- against torch's ``mm`` of the same operands. Correctness first: ours into an
  ``out`` poisoned with NaN, then the plain call a training step makes, each against a float64
  product, within twice torch's own bf16 error plus bf16's floor (``e2e_check.error_ok``); then
  whether the repeated call takes the front door's fast path, the host microseconds of one call
  (the GPU kept busy, so the host never waits), and the queued time per call, ours and torch's in
  alternating rounds, median;
- ``linear``: ``gemm_ladder.nn.Linear`` against ``nn.Linear`` on fp32 master weights under bf16
  autocast, forward and backward of one layer (q, gate and down's shapes): output, dX and dW
  checked against float64 as above, then alternating rounds, with the registered op
  ``torch.ops.gemm_ladder.mm`` called eagerly as a third (``op_us``: the custom op's dispatch on
  the same kernels, which Linear's eager path skips);
- ``train``: the e2e training step (``e2e_check``'s model, batches and optimizer) for
  :data:`TRAIN_STEPS` steps of torch and ours in turn from the same weights, the median step time
  after :data:`TRAIN_WARMUP`, and whether the losses agree (:func:`loss_close`).

    PYTHONPATH=. .venv/bin/python benchmarks/e2e_check.py prepare build/e2e             # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/host_check.py run build/e2e --out out/host_check.json          # GPU box

``--front strict`` (default) makes every patched GEMM ours; ``--front measured`` is what a user
gets (the front door's first-use timing, torch's matmul where it is faster). About a minute on
an H100.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_check  # noqa: E402  (a sibling script: the model, its plan, its timers)
import phase_runs  # noqa: E402  (run's scaffolding, shared with e2e_check)
from power_probe import Sampler  # noqa: E402

import gemm_ladder  # noqa: E402
import gemm_ladder.nn as gnn  # noqa: E402
from gemm_ladder.core import device  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402
from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.measure.report import table as fmt  # noqa: E402
from gemm_ladder.serve import front  # noqa: E402
from gemm_ladder.serve.front import operand_majors  # noqa: E402
from gemm_ladder.serve.kernel_pack import KernelPack  # noqa: E402

FORMAT = "gemm_ladder.host_check"
PHASES = ("calls", "linear", "train")
PHASE_TIMEOUT = {"calls": 75.0, "linear": 60.0, "train": 90.0}  # seconds a phase's child may take
LINEAR_LAYERS = ("q_proj", "gate_proj", "down_proj")  # one of each weight shape class of a layer
TRAIN_STEPS, TRAIN_WARMUP = 30, 5
LOSS_LAST = 10  # the last steps whose mean losses loss_close compares
ROUNDS, CALL_REPS, LINEAR_REPS = 7, 30, 10
HOST_REPS = 50
DTYPE = torch.bfloat16


# -- what is measured (no GPU) --------------------------------------------------------------------
def call_cases(cfg: e2e_check.Config, rows: int, fused: bool = False) -> list[dict]:
    """The GEMMs of a training step's layers, one per distinct weight [N, K] and op: ``fwd``
    (rows x N x K, A and B K-major), ``dX`` (rows x K x N: dY . W, W read as it lies, an MN-major
    B) and ``dW`` (N x K x rows: dY^T . X, both MN-major); ``layers`` names the weights of that shape.
    ``fused`` (a plan prepared with ``--fuse``): also the fused MLP's W_gu [2I, H] (``gate_up``),
    whose three GEMMs the fused MLP's training path makes in place of gate's and up's, and the
    attention's W_qkv [Nq + Nk + Nv, H] (``qkv``: ``gnn.SharedInput``'s, in place of q's, k's and v's)."""
    names: dict = {}
    for name, w in cfg.linears().items():
        names.setdefault(w, []).append(name)
    if fused:
        names.setdefault((2 * cfg.intermediate, cfg.hidden), []).append("gate_up")
        names.setdefault((cfg.hidden + 2 * cfg.kv_heads * cfg.head_dim, cfg.hidden), []).append("qkv")
    cases = []
    for (n_out, k_in), layers in sorted(names.items()):
        for op, layout, shape in (("fwd", "KK", (rows, n_out, k_in)), ("dX", "KN", (rows, k_in, n_out)),
                                  ("dW", "MN", (n_out, k_in, rows))):
            cases.append({"op": op, "layout": layout, "M": shape[0], "N": shape[1], "K": shape[2],
                          "weight": [n_out, k_in], "layers": layers})
    return cases


def operands(op: str, X: torch.Tensor, W: torch.Tensor, dY: torch.Tensor) -> tuple:
    """(A, B) of ``D = A . B^T`` for ``op`` of a layer with input X [rows, K], weight W [N, K] and
    output gradient dY [rows, N]: as ``ops.linear_grads`` hands them over (views, no copies)."""
    if op == "fwd":
        return X, W
    if op == "dX":
        return dY, W.t()
    if op == "dW":
        return dY.t(), X.t()
    raise ValueError(f"unknown op {op!r}: use fwd, dX or dW")


def loss_close(ours: list[float], theirs: list[float], last: int = LOSS_LAST) -> dict:
    """Whether a short run's losses agree: all finite, the curves of equal length, and the mean of
    the last ``last`` steps within ``e2e_check.LOSS_TOL`` of torch's. Why not ``e2e_check.loss_ok``:
    its drift compares 50 smoothed steps; over 30 steps from the same weights two correct runs differ
    by rounding only, which stays far below 2% of the loss, while a wrong gradient stops the fall."""
    if len(ours) != len(theirs) or len(ours) < last:
        return {"ok": False, "why": f"{len(ours)} and {len(theirs)} losses; {last} or more each wanted"}
    if not all(math.isfinite(x) for x in ours + theirs):
        return {"ok": False, "why": "a loss is not finite"}
    a, b = statistics.fmean(ours[-last:]), statistics.fmean(theirs[-last:])
    gap = abs(a - b) / abs(b)
    ok = gap <= e2e_check.LOSS_TOL
    return {"ok": ok, "gap": gap, "tolerance": e2e_check.LOSS_TOL, "ours_last": a, "torch_last": b,
            "why": "agree" if ok else f"the last {last} losses differ by {gap:.4f} of torch's"}


def summarize(rows: list[dict]) -> dict:
    """Per phase and op: rows, geomean and least ratio to torch, and whether every check passed."""
    out: dict = {}
    for key in sorted({(r["phase"], r.get("op", "step")) for r in rows}):
        part = [r for r in rows if (r["phase"], r.get("op", "step")) == key]
        ratios = [r["ratio_to_torch"] for r in part]
        out[f"{key[0]} {key[1]}"] = {"rows": len(part), "geomean_ratio": e2e_check.geomean(ratios),
                                     "min_ratio": min(ratios), "ok": all(r.get("ok", r.get("loss_ok")) for r in part)}
    return out


# -- the GPU side -------------------------------------------------------------------------------
def _errors(got: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor) -> dict:
    rel, torch_rel = e2e_check._rel(got, ref), e2e_check._rel(theirs, ref)  # pylint: disable=protected-access
    return {"rel_err": rel, "torch_rel_err": torch_rel, "ok": e2e_check.error_ok(rel, torch_rel)}


def _host_us(fn, reps: int = HOST_REPS, dev: torch.device | None = None) -> float:
    """Host microseconds of one call of ``fn`` with the GPU kept busy (a sleep kernel queued
    first), so the host never waits for the GPU: the call's own host path."""
    cuda = dev is None or dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time at H100 clocks; pylint: disable=protected-access
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def calls_phase(doc: dict, dev: str = "cuda", rounds: int = ROUNDS) -> dict:
    """The ``calls`` phase (module docstring); ``dev`` other than cuda: a dry run (tests)."""
    tr = doc["train"]
    cfg = e2e_check.config_of(doc, tr["model"])
    rows_n = tr["batch"] * tr["seq"]
    dev = torch.device(dev)
    g = torch.Generator(device=dev).manual_seed(31)
    tensors: dict = {}
    rows = []
    for case in call_cases(cfg, rows_n, fused=doc.get("fuse", False)):
        n_out, k_in = case["weight"]
        if (n_out, k_in) not in tensors:
            tensors.clear()  # one weight's tensors at a time
            tensors[(n_out, k_in)] = tuple(torch.randn(shape, generator=g, device=dev).to(DTYPE)
                                           for shape in ((rows_n, k_in), (n_out, k_in), (rows_n, n_out)))
        a, b = operands(case["op"], *tensors[(n_out, k_in)])
        t0 = time.time()
        ref = a.double() @ b.double().t()
        theirs = torch.mm(a, b.t())
        poisoned = torch.full((case["M"], case["N"]), float("nan"), device=dev, dtype=DTYPE)
        first = _errors(gemm_ladder.matmul(a, b, out=poisoned), theirs, ref)
        plain = _errors(gemm_ladder.matmul(a, b), theirs, ref)
        gemm_ladder.matmul(a, b)
        fast = front._fast_key(a, b, None) in front._FAST  # pylint: disable=protected-access
        del ref, poisoned
        fns = {"ours": lambda: gemm_ladder.matmul(a, b), "torch": lambda: torch.mm(a, b.t())}
        host = {n: _host_us(f, dev=dev) for n, f in fns.items()}
        ms = e2e_check._alternate(fns, rounds, CALL_REPS, dev)  # pylint: disable=protected-access
        rows.append({"t0": t0, "t1": time.time(), "phase": "calls", **case, "dtype": "bfloat16",
                     "ours_us": ms["ours"] * 1e3, "torch_us": ms["torch"] * 1e3,
                     "ratio_to_torch": ms["torch"] / ms["ours"], "call_ratio": ms["torch"] / ms["ours"],
                     "ours_host_us": host["ours"], "torch_host_us": host["torch"], "fast_path": fast,
                     "majors": list(operand_majors(a, b)), "check_out": first, "check_plain": plain,
                     "ok": first["ok"] and plain["ok"]})
    return {"status": "ok" if all(r["ok"] for r in rows) else "wrong", "rows": rows}


def linear_phase(doc: dict, dev: str = "cuda", rounds: int = ROUNDS) -> dict:
    """The ``linear`` phase (module docstring); ``dev`` other than cuda: a dry run (tests)."""
    tr = doc["train"]
    cfg = e2e_check.config_of(doc, tr["model"])
    dev = torch.device(dev)
    torch.manual_seed(32)
    rows = []
    for name in LINEAR_LAYERS:
        n_out, k_in = cfg.linears()[name]
        theirs = nn.Linear(k_in, n_out, bias=False, device=dev)  # fp32 master weights
        ours = gnn.Linear.from_linear(copy.deepcopy(theirs))
        x = torch.randn(tr["batch"], tr["seq"], k_in, device=dev).requires_grad_()  # fp32, as RMSNorm gives it
        dY = torch.randn(tr["batch"], tr["seq"], n_out, device=dev, dtype=DTYPE)

        def step(lin):
            with torch.autocast(dev.type, dtype=DTYPE):
                y = lin(x)
            y.backward(dY)
            return y

        t0 = time.time()
        got = {}
        for who, lin in (("ours", ours), ("torch", theirs)):
            x.grad = lin.weight.grad = None
            y = step(lin)
            got[who] = (y.detach(), x.grad.clone(), lin.weight.grad.clone())
        w64, x64, g64 = theirs.weight.double(), x.detach().double(), dY.double()
        refs = (x64 @ w64.t(), g64 @ w64, (g64.reshape(-1, n_out).t() @ x64.reshape(-1, k_in)))
        checks = {part: _errors(got["ours"][i], got["torch"][i], refs[i]) for i, part in enumerate(("out", "dX", "dW"))}
        del refs, w64, x64, g64

        def timed(lin):
            def fn():
                x.grad = lin.weight.grad = None
                step(lin)
            return fn

        # the registered op called eagerly, as Linear did before its autograd.Function: what the
        # custom op's dispatch costs on top of the same kernels
        via_op = copy.deepcopy(theirs)
        via_op.forward = lambda t, w=via_op.weight: torch.ops.gemm_ladder.mm(t.to(DTYPE), w.to(DTYPE))
        fns = {"ours": timed(ours), "torch": timed(theirs), "op": timed(via_op)}
        host = {n: _host_us(f, reps=10, dev=dev) for n, f in fns.items()}
        ms = e2e_check._alternate(fns, rounds, LINEAR_REPS, dev)  # pylint: disable=protected-access
        rows.append({"t0": t0, "t1": time.time(), "phase": "linear", "op": "fwd+bwd", "layer": name,
                     "M": tr["batch"] * tr["seq"], "N": n_out, "K": k_in, "dtype": "bf16 autocast, fp32 weights",
                     "ours_us": ms["ours"] * 1e3, "torch_us": ms["torch"] * 1e3,
                     "ratio_to_torch": ms["torch"] / ms["ours"],
                     "ours_host_us": host["ours"], "torch_host_us": host["torch"], "checks": checks,
                     "op_us": ms["op"] * 1e3, "op_host_us": host["op"],
                     "weight_grad_dtype": str(ours.weight.grad.dtype),
                     "ok": all(c["ok"] for c in checks.values()) and ours.weight.grad.dtype == torch.float32})
    return {"status": "ok" if all(r["ok"] for r in rows) else "wrong", "rows": rows}


def train_phase(doc: dict, steps: int = TRAIN_STEPS, warmup: int = TRAIN_WARMUP, dev: str = "cuda") -> dict:
    """torch and ours from the same weights on the same batches, a step of each in turn (as
    ``e2e_check.train``, without its yardstick run); ``dev`` other than cuda: a dry run (tests)."""
    tr = doc["train"]
    dev = torch.device(dev)
    cfg, models, swapped, opts = e2e_check.training_pair(doc, dev)
    losses: dict = {n: [] for n in models}
    spans: dict = {n: [] for n in models}

    def step(name, x, y):
        return e2e_check.train_step(models[name], opts[name], x, y, cfg.vocab, dev)

    t0 = time.time()
    names = list(models)
    for i in range(steps):
        x, y = e2e_check.train_batch(cfg, tr["batch"], tr["seq"], i, tr["seed"], device=dev)
        for n in (names if i % 2 == 0 else names[::-1]):
            span = e2e_check.Span(dev)
            span.start()
            losses[n].append(step(n, x, y))
            span.stop()
            spans[n].append(span)
    losses = {n: torch.stack(v).tolist() for n, v in losses.items()}
    ms = {n: statistics.median(sp.ms() for sp in v[warmup:]) for n, v in spans.items()}
    rule = loss_close(losses["ours"], losses["torch"])
    row = {"t0": t0, "t1": time.time(), "phase": "train", "model": cfg.name, "batch": tr["batch"], "seq": tr["seq"],
           "tokens": tr["batch"] * tr["seq"], "steps": steps, "warmup": warmup,
           "precision": "bf16 autocast, fp32 master weights", "torch_step_ms": ms["torch"], "ours_step_ms": ms["ours"],
           "ratio_to_torch": ms["torch"] / ms["ours"], "loss_ok": rule["ok"], "loss_rule": rule, "losses": losses}
    return {"status": "ok" if rule["ok"] else "wrong", "swapped": len(swapped), "rows": [row]}


def phase_job(item: str, args) -> dict:
    """An isolated job (``measure.isolate``): ``item`` a phase of :data:`PHASES`; ``args``: the
    pack folder and the front-door mode."""
    folder, mode = args[0], (args[1] if len(args) > 1 else "strict")
    if item not in PHASES:
        raise ValueError(f"unknown phase {item!r}: " + ", ".join(PHASES))
    doc = read_json(Path(folder) / e2e_check.PLAN_FILE, "e2e_check plan", "run e2e_check.py prepare again",
                    e2e_check.PLAN_SCHEMA)
    e2e_check._use_front(folder, mode)  # pylint: disable=protected-access
    torch.backends.cuda.matmul.allow_tf32 = False  # the references are float64; torch's peer runs bf16
    return {"calls": calls_phase, "linear": linear_phase, "train": train_phase}[item](doc)


def table(rows: list[dict]) -> str:
    out = [{"phase": r["phase"], "what": r.get("op", "step") + (f" {r['layer']}" if "layer" in r else ""),
            "MxNxK": f"{r['M']}x{r['N']}x{r['K']}" if "M" in r else f"{r['batch']}x{r['seq']}",
            "torch": f"{r.get('torch_us', r.get('torch_step_ms', 0)):.1f}",
            "ours": f"{r.get('ours_us', r.get('ours_step_ms', 0)):.1f}",
            "x torch": f"{r['ratio_to_torch']:.3f}",
            "host us ours/torch": (f"{r['ours_host_us']:.1f}/{r['torch_host_us']:.1f}" if "ours_host_us" in r else ""),
            "fast": {True: "yes", False: "NO"}.get(r.get("fast_path"), ""),
            "ok": "yes" if r.get("ok", r.get("loss_ok")) else "NO"} for r in rows]
    return fmt(out, list(out[0])) if out else "no rows"


def deadline(doc: dict, phase: str) -> float:
    """Seconds ``phase``'s child may take: :data:`PHASE_TIMEOUT`, scaled as the plan's training run
    scales its own (``e2e_check.deadline``: a larger model's GEMMs and steps take longer)."""
    return PHASE_TIMEOUT[phase] * e2e_check.deadline(doc, "train") / e2e_check.PHASE_TIMEOUT["train"]


def run(folder, out, mode: str = "strict") -> int:
    """Each phase in a child with its deadline; writes ``out``. 0 once written, 2 where it cannot
    run (``phase_runs.checked_plan`` says why)."""
    doc = phase_runs.checked_plan(
        "host_check", folder,
        lambda fix: read_json(Path(folder) / e2e_check.PLAN_FILE, "e2e_check plan", fix, e2e_check.PLAN_SCHEMA),
        lambda doc: e2e_check.unserved(KernelPack(folder), doc, device.arch_of(0)))
    if doc is None:
        return 2
    start, gpu = time.time(), harness.gpu_info()
    results, rows = phase_runs.run_phases(
        phase_runs.job_of(__name__, "host_check"), PHASES, [str(folder), mode], lambda phase: deadline(doc, phase),
        lambda phase, res: f"{phase}: {res.get('status')} {str(res.get('detail', ''))[-300:]}", Sampler())
    phase_runs.write_results(out, FORMAT, gpu, start, __doc__.split("\n\n")[2].strip(),
                             {"mode": mode, "env": e2e_check.FRONT_MODES[mode]}, summarize(rows), results, rows, table)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    phase_runs.add_run_parser(sub, help="GPU box: per call, per layer and per training step, ours against torch",
                              folder_help="the folder benchmarks/e2e_check.py prepare built (its pack and e2e.json)",
                              out="host_check.json", front_modes=e2e_check.FRONT_MODES,
                              front_help="strict: every GEMM ours (default); measured: the front door's timed choice")
    a = p.parse_args(argv)
    return run(a.folder, a.out, a.front)


if __name__ == "__main__":
    sys.exit(main())
