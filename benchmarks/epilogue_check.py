"""The fused epilogue with a scale and a residual (issue 31) on a GPU: every new epilogue checked at
odd shapes, then timed at the Llama-8B weight shapes against torch's best paths.

    D = act(alpha . A . W^T + bias) + beta . C          (C may be D itself: out=C, in place)

- checks (each module in a child process with a timeout, so a hang or a crash is a row, not the
  end of the run): random inputs, D poisoned with NaN first, the error against a float64 reference
  with torch's own error on the same formula (``front.TorchMatmul``, the front door's fallback) as
  the yardstick (ours within 2x of it, or 1e-2 absolute where both are tiny); in place (out = C)
  as well as into a separate D; fp16 and bf16; alpha and beta not 1; a float32 D; SwiGLU (its
  reference: silu of the gate half times the up half of the float64 product).
- timing (bf16, the modules the front door's policy picks, ``plan.choose``): ``residual``
  (``D = x . W^T + C``) against cuBLAS's fused ``torch.addmm(C, x, W.t())`` and the unfused
  ``F.linear`` then ``+ C``; ``alpha_bias_gelu_tanh+residual`` against
  ``torch._addmm_activation(b, x, W.t(), use_gelu=True)`` then ``+ C`` (cuBLASLt's fused
  bias+GELU) and the unfused ``F.gelu(F.linear(x, W, b), approximate="tanh") + C``; a float32 D
  (``fp32_out``) against ``torch.mm(..., out_dtype=torch.float32)`` where torch has it and
  ``F.linear`` then a copy into float32; ``swiglu`` (W_gu = cat([Wg, Wu]) 28672x4096, Llama-8B's
  MLP) against HF's two linears and one ``F.linear`` with W_gu then the halves. Kernel level:
  CUDA graphs of calls cycling input sets that spill L2, ours and the peers taking turns in rounds
  (``harness.graph_times``); call level: queued calls with the host's checks (``GemmModule.__call__``
  against the torch calls), events around each burst.

Rows (``--out X.json``; the file name must contain ``epilogue``): ``op``, ``M``, ``N``, ``K``,
``dtype``, ``kernel_ratio`` and ``call_ratio`` (the best torch peer's time over ours: above 1 we
are faster), each peer's ratio and every time in ms; plus ``checks`` and the GPU's name and clocks.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/epilogue_check.py prepare build/epi     # build box
    PYTHONPATH=$PWD/build/runtime/site:$PWD TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/epilogue_check.py run build/epi --out out/epilogue_check.json    # GPU box
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from gemm_ladder.core import files
from gemm_ladder.core.spec import spec_for, spec_of_manifest, torch_activation

PLAN_FILE = "epilogue_plan.json"
CHECK_SHAPES = [(200, 264, 320), (1000, 3000, 520)]  # odd-ish: partial tiles in M, N and K
CHECK_EPILOGUES = ["residual", "alpha", "alpha_bias_gelu_tanh+residual", "bias_relu+residual"]
LLAMA_WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K): attention out, MLP up, MLP down
TIME_MS = [128, 2048, 8192]
TIME_EPILOGUES = ["residual", "alpha_bias_gelu_tanh+residual"]
FP32_EPILOGUES = ["none", "alpha_bias_relu"]  # with a float32 D
GLU_CHECK_SHAPES = [(200, 528, 320), (1000, 3008, 520)]  # (M, W_gu's rows, K): D 264 and 1504 wide
ALPHA, BETA = 0.75, 0.5  # not 1: the scalars must reach the kernel
ROUNDS, PER_ROUND = 6, 5
CHECK_TIMEOUT = 120.0


def cases() -> list[dict]:
    """What ``prepare`` builds: (purpose, epilogue, dtype of A and B, D's dtype, M, N, K, knobs
    beyond the policy's)."""
    out = [{"purpose": "check", "epilogue": e, "dtype": d, "shape": list(s)}
           for e in CHECK_EPILOGUES for d in ("float16", "bfloat16") for s in CHECK_SHAPES[:1]]
    out += [{"purpose": "check", "epilogue": "alpha_bias_gelu_tanh+residual", "dtype": "bfloat16",
             "shape": list(CHECK_SHAPES[1])}]
    # a float32 D (the policy's knobs, and 64-column float32 chunks: epi_n=128 with three stages)
    out += [{"purpose": "check", "epilogue": e, "dtype": d, "d": "float32", "shape": list(s)}
            for e in FP32_EPILOGUES for d in ("float16", "bfloat16")
            for s in (CHECK_SHAPES if d == "bfloat16" else CHECK_SHAPES[:1])]
    out += [{"purpose": "check", "epilogue": "bias_gelu_tanh", "dtype": "bfloat16", "d": "float32",
             "shape": list(CHECK_SHAPES[0]), "knobs": {"epi_n": 128, "pipe_depth": 3, "cluster_m": 1}}]
    out += [{"purpose": "time", "epilogue": e, "dtype": "bfloat16", "shape": [M, N, K]}
            for e in TIME_EPILOGUES for N, K in LLAMA_WEIGHTS for M in TIME_MS]
    out += [{"purpose": "time", "epilogue": "none", "dtype": "bfloat16", "d": "float32", "shape": [M, N, K]}
            for N, K in LLAMA_WEIGHTS for M in TIME_MS[1:]]  # a wgrad's M is tokens: 2048 and up
    # SwiGLU: N is W_gu's rows (both halves), D has N / 2 columns
    out += [{"purpose": "check", "epilogue": "swiglu", "dtype": d, "shape": list(s)}
            for d in ("float16", "bfloat16") for s in (GLU_CHECK_SHAPES if d == "bfloat16" else GLU_CHECK_SHAPES[:1])]
    out += [{"purpose": "check", "epilogue": "swiglu", "dtype": "bfloat16", "shape": list(GLU_CHECK_SHAPES[0]),
             "knobs": {"cluster_m": 1}}]
    out += [{"purpose": "time", "epilogue": "swiglu", "dtype": "bfloat16", "shape": [M, 2 * 14336, 4096]}
            for M in TIME_MS]
    return out


def spec_of_case(case: dict):
    """The operand spec of a case: its epilogue, with D (and the bias) in float32 where it says."""
    spec = spec_for(case["dtype"], case["epilogue"])
    if case.get("d") == "float32":
        spec = dataclasses.replace(spec, d="float32", bias="float32" if spec.bias else None)
    return spec


def prepare(out: str, sms: int = 132) -> int:
    """Build every case's module (the front door's policy; through the module cache, so the .so
    holds the compiled fatbin) and copy it into ``out`` with :data:`PLAN_FILE`."""
    # the build layer: this step runs where TVM's compiler is (the GPU box has the runtime only)
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile import module_cache
    from gemm_ladder.serve import plan
    from gemm_ladder.serve.front import plan_job

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    doc, failed = {"cases": []}, 0
    for case in cases():
        M, N, K = case["shape"]
        spec = spec_of_case(case)
        try:
            _, job = plan_job(plan.Problem(M, N, K, case["dtype"], "sm_90a", sms, spec))
            if case.get("knobs"):
                job = dataclasses.replace(job, knobs={**job.knobs, **case["knobs"]})
            path, _ = module_cache.get_or_build(job)
        except Exception as err:  # pylint: disable=broad-except  (a row that says why)
            print(f"failed: {case}: {err}", file=sys.stderr)
            failed += 1
            continue
        name = f"{path.parent.name}.so"
        if not (folder / name).exists():
            shutil.copyfile(path, folder / name)
            shutil.copyfile(Path(str(path) + ".json"), folder / (name + ".json"))
        doc["cases"].append({**case, "file": name, "knobs": job.knobs, "module_shape": list(job.shape)})
        print(f"{case['purpose']} {spec.text()} {M}x{N}x{K}: {name}")
    files.write_json(folder / PLAN_FILE, doc)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(doc['cases'])} cases, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


# -- the reference (no GPU needed: float64 on any device) -------------------------------------------
def reference(A, B, bias, act: str, alpha: float, C, beta: float):
    """act(alpha . A . B^T + bias) + beta . C in float64, the formula the kernel computes in fp32."""
    z = (A.double() @ B.double().t()) * alpha
    if bias is not None:
        z = z + bias.double()
    z = torch_activation(z, act)
    return z + beta * C.double() if C is not None else z


def within(ours: float, theirs: float) -> bool:
    """Ours within 2x torch's own error on the same formula, or both tiny (1e-2 absolute)."""
    return ours == ours and (ours <= 2.0 * theirs or ours <= 1e-2)


def operands_of(spec, M: int, N: int, seed: int):
    """The epilogue's inputs of a spec: (bias or None, alpha, C or None, beta), in the spec's dtypes."""
    import torch  # pylint: disable=import-outside-toplevel

    g = torch.Generator(device="cuda").manual_seed(seed)
    bias = torch.randn(N, generator=g, device="cuda").to(getattr(torch, spec.bias)) if spec.bias else None
    C = torch.randn(M, N, generator=g, device="cuda").to(getattr(torch, spec.residual)) if spec.residual else None
    return bias, (ALPHA if spec.alpha else 1.0), C, (BETA if spec.residual else 1.0)


def check_one(path: str, M: int, seed: int = 0) -> dict:
    """One module at M rows: into a separate D (poisoned with NaN) and, with a residual, in place."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.front import TorchMatmul  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.runtime import load  # pylint: disable=import-outside-toplevel

    mod = load(path)
    spec, dtype = mod.spec, getattr(torch, mod.dtype)
    N, K = mod.N, mod.K
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
    B = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
    bias, alpha, C, beta = operands_of(spec, M, N, seed + 1)
    d_dtype = getattr(torch, spec.d)
    if spec.gated:  # SwiGLU: silu(A Wg^T) * (A Wu^T), D N / 2 wide; torch: two products, then the halves
        h = A.double() @ B.double().t()
        ref = torch_activation(h[:, :N // 2], spec.act) * h[:, N // 2:]
        theirs = torch_activation(A @ B[:N // 2].t(), spec.act) * (A @ B[N // 2:].t())
        N = N // 2
    else:
        ref = reference(A, B, bias, spec.act, alpha, C, beta)
        theirs = torch.empty(M, N, dtype=d_dtype, device="cuda")
        TorchMatmul(spec.act)(A, B, theirs, bias=bias, alpha=alpha, C=C, beta=beta)
    err_torch = (theirs.double() - ref).abs().max().item()
    kwargs = {k: v for k, v in (("bias", bias), ("alpha", alpha), ("C", C), ("beta", beta)) if v is not None}
    kwargs = {k: v for k, v in kwargs.items() if k in {o.name for o in spec.epilogue_operands()}}
    rows = []
    D = torch.full((M, N), float("nan"), dtype=d_dtype, device="cuda")
    mod(A, B, out=D, **kwargs)
    torch.cuda.synchronize()
    rows.append(("out", D))
    if C is not None:  # in place: D is C
        Cin = C.clone()
        mod(A, B, out=Cin, **{**kwargs, "C": Cin})
        torch.cuda.synchronize()
        rows.append(("in_place", Cin))
    res = {"file": Path(path).name, "M": M, "N": N, "K": K, "dtype": mod.dtype, "d": spec.d,
           "epilogue": spec.epilogue, "err_torch": err_torch}
    ok = True
    for name, out in rows:
        nan = bool(torch.isnan(out).any().item())
        err = (out.double() - ref).abs().max().item()
        res[f"err_{name}"], res[f"nan_{name}"] = err, nan
        ok = ok and not nan and within(err, err_torch)
    res["status"] = "ok" if ok else "wrong"
    return res


def check_isolated(jobs: list[tuple[Path, int]]) -> list[dict]:
    """:func:`check_one` of every (module, M) in child processes, one after another in each (a
    child's start costs seconds): a module that gives no result within :data:`CHECK_TIMEOUT` (a
    hang) or kills its child (a crash) is a row, and a new child goes on with the next."""
    results: list[dict] = []
    while len(results) < len(jobs):
        rest = jobs[len(results):]
        cmd = [sys.executable, __file__, "check-many", *[f"{p}:{M}" for p, M in rest]]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        # this child's queue and pipe bound now: a killed child's reader ends later, into its own queue
        threading.Thread(target=lambda q=lines, p=proc: [q.put(x) for x in p.stdout] + [q.put(None)], daemon=True).start()
        got = 0
        while got < len(rest):
            try:
                line = lines.get(timeout=CHECK_TIMEOUT + (60 if got == 0 else 0))  # the first: the child's start
            except queue.Empty:
                proc.kill()
                results.append({"file": rest[got][0].name, "M": rest[got][1], "status": "timeout"})
                break
            if line is None:  # the child died: this module crashed it
                proc.wait()
                results.append({"file": rest[got][0].name, "M": rest[got][1], "status": "crash",
                                "detail": (proc.stderr.read() or "")[-800:]})
                break
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
                got += 1
        else:
            proc.wait()
    return results


# -- timing -----------------------------------------------------------------------------------------
def peers(epilogue: str):
    """torch's paths for an epilogue, each ``fn(A, W, D, bias, C)`` writing D."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    if epilogue == "swiglu":  # silu(x Wg^T) * (x Wu^T), W_gu = cat([Wg, Wu])
        def two_linears(a, w, d, b, c):  # HF's LlamaMLP: gate_proj, up_proj apart
            n = w.shape[0] // 2
            torch.mul(F.silu(F.linear(a, w[:n])), F.linear(a, w[n:]), out=d)

        def fused_weight(a, w, d, b, c):  # one product with W_gu, then the halves
            g, u = F.linear(a, w).chunk(2, dim=-1)
            torch.mul(F.silu(g), u, out=d)
        return {"two_linears": two_linears, "fused_weight": fused_weight}
    if epilogue == "fp32_out":  # D = A . W^T in float32
        def mm_out_dtype(a, w, d, b, c):  # torch's own float32-output GEMM (torch >= 2.8), where it exists
            torch.mm(a, w.t(), out_dtype=torch.float32, out=d)
        found = {"linear_then_float": lambda a, w, d, b, c: d.copy_(F.linear(a, w))}
        try:
            probe = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
            torch.mm(probe, probe, out_dtype=torch.float32)
            found["mm_out_dtype"] = mm_out_dtype
        except (TypeError, RuntimeError):
            pass
        return found
    if epilogue == "residual":
        return {"addmm": lambda a, w, d, b, c: torch.addmm(c, a, w.t(), out=d),
                "unfused": lambda a, w, d, b, c: torch.add(F.linear(a, w), c, out=d)}

    def lt(a, w, d, b, c):  # cuBLASLt's fused bias + GELU (tanh), then the residual
        torch.add(torch._addmm_activation(b, a, w.t(), alpha=ALPHA, use_gelu=True), c, alpha=BETA, out=d)  # pylint: disable=protected-access

    def unfused(a, w, d, b, c):  # addmm (bias and alpha in cuBLAS), then the activation, then the residual
        torch.add(F.gelu(torch.addmm(b, a, w.t(), alpha=ALPHA), approximate="tanh"), c, alpha=BETA, out=d)
    return {"addmm_activation": lt, "unfused": unfused}


def time_case(path: Path, case: dict, rounds: int, per_round: int) -> dict:
    """Ours and the peers at one shape: kernel level (graphs) and call level (queued), in rounds."""
    import torch  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve.runtime import load  # pylint: disable=import-outside-toplevel

    mod = load(path)
    M, N, K = case["shape"]
    dtype, spec = getattr(torch, case["dtype"]), mod.spec
    op = "fp32_out" if spec.d == "float32" else spec.epilogue
    n_sets = harness.sets_to_spill_l2(M, N, K, torch.cuda.get_device_properties(0).L2_cache_size)
    sets = []
    for i in range(max(2, n_sets)):
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
        W = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
        bias, _, C, _ = operands_of(spec, M, N, 200 + i)
        d_cols = N // 2 if spec.gated else N
        sets.append((A, W, torch.empty(M, d_cols, dtype=getattr(torch, spec.d), device="cuda"), bias, C))
    names = [o.name for o in spec.epilogue_operands()]
    vals = {"alpha": ALPHA, "beta": BETA if spec.epilogue != "residual" else 1.0}
    a0, w0, d0, b0, c0 = sets[0]
    launch = mod.launcher(a0, w0, d0, **{n: {"bias": b0, "C": c0}.get(n, vals.get(n)) for n in names})

    def ours(a, w, d, b, c):
        launch(a, w, d, *[{"bias": b, "C": c}.get(n, vals.get(n)) for n in names])

    def ours_call(a, w, d, b, c):
        mod(a, w, out=d, **{n: {"bias": b, "C": c}.get(n, vals.get(n)) for n in names})

    kernels = {"ours": ours, **peers(op)}
    calls = max(len(sets), 20)
    for fn in kernels.values():
        harness.graph_times(fn, sets, 2, calls)  # capture, warm up
    kernel_ms: dict = {n: [] for n in kernels}
    call_ms: dict = {n: [] for n in kernels}
    call_fns = {**kernels, "ours": ours_call}
    for r in range(rounds):
        order = list(kernels) if r % 2 == 0 else list(kernels)[::-1]
        for n in order:
            kernel_ms[n] += harness.graph_times(kernels[n], sets, per_round, calls)
        for n in order:
            call_ms[n] += harness.event_times(call_fns[n], sets, per_round * 4, start=r)
    kmed = {n: statistics.median(v) for n, v in kernel_ms.items()}
    cmed = {n: statistics.median(v) for n, v in call_ms.items()}
    theirs = [n for n in kernels if n != "ours"]
    row = {"op": op, "M": M, "N": N, "K": K, "dtype": case["dtype"], "file": path.name,
           "kernel_ratio": min(kmed[n] for n in theirs) / kmed["ours"],
           "call_ratio": min(cmed[n] for n in theirs) / cmed["ours"],
           "kernel_ms": kmed, "call_ms": cmed}
    for n in theirs:
        row[f"kernel_ratio_{n}"], row[f"call_ratio_{n}"] = kmed[n] / kmed["ours"], cmed[n] / cmed["ours"]
    return row


def run(folder: str, out: str, rounds: int = ROUNDS, per_round: int = PER_ROUND) -> int:
    """Checks first (isolated), then timing of the modules whose checks passed; writes ``out``."""
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    if "epilogue" not in Path(out).name:
        raise SystemExit(f"--out {out}: the results file's name must contain 'epilogue' (issue 31's format)")
    folder_p = Path(folder)
    doc = json.loads((folder_p / PLAN_FILE).read_text())
    t0, gpu_start = time.time(), harness.gpu_info(0)  # clocks and power before, and after (below)
    checks, passed = [], set()
    results = check_isolated([(folder_p / case["file"], case["shape"][0]) for case in doc["cases"]])
    for case, res in zip(doc["cases"], results):
        M = case["shape"][0]
        res = {**res, "purpose": case["purpose"]}
        checks.append(res)
        if res["status"] == "ok":
            passed.add((case["file"], M))
        print(f"check {case['epilogue']} {case['dtype']} -> {case.get('d', case['dtype'])} "
              f"{'x'.join(map(str, case['shape']))}: {res['status']} "
              f"{ {k: v for k, v in res.items() if k.startswith('err')} }", flush=True)
    rows = []
    for case in doc["cases"]:
        if case["purpose"] != "time":
            continue
        if (case["file"], case["shape"][0]) not in passed:
            rows.append({"op": "fp32_out" if case.get("d") == "float32" else case["epilogue"], "M": case["shape"][0], "N": case["shape"][1], "K": case["shape"][2],
                         "dtype": case["dtype"], "kernel_ratio": None, "call_ratio": None, "skipped": "check failed"})
            continue
        row = time_case(folder_p / case["file"], case, rounds, per_round)
        rows.append(row)
        print(f"time {row['op']} {row['M']}x{row['N']}x{row['K']}: kernel {row['kernel_ratio']:.3f}x, "
              f"call {row['call_ratio']:.3f}x the best torch path", flush=True)
    result = {"gpu_start": gpu_start, "gpu": harness.gpu_info(0), "run": harness.run_info(), "seconds": time.time() - t0,
              "checks": checks, "rows": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1, default=str))
    bad = [c for c in checks if c["status"] != "ok"]
    print(f"{len(checks) - len(bad)} of {len(checks)} checks ok; {len(rows)} rows in {out} ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the modules into DIR (build box)")
    p.add_argument("dir")
    p.add_argument("--sms", type=int, default=132)
    r = sub.add_parser("run", help="check and time them (GPU box)")
    r.add_argument("dir")
    r.add_argument("--out", required=True)
    r.add_argument("--rounds", type=int, default=ROUNDS)
    r.add_argument("--per-round", type=int, default=PER_ROUND)
    c = sub.add_parser("check-many", help="(internal) modules' checks, in a child process")
    c.add_argument("jobs", nargs="+", help="PATH:M")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args.dir, args.sms)
    if args.cmd == "run":
        return run(args.dir, args.out, args.rounds, args.per_round)
    for job in args.jobs:
        path, M = job.rsplit(":", 1)
        try:
            res = check_one(path, int(M))
        except Exception as err:  # pylint: disable=broad-except  (a row that says why)
            res = {"file": Path(path).name, "M": int(M), "status": "error", "detail": f"{type(err).__name__}: {err}"}
        print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
