"""fp8 (issue 32) on an H100: v9's scaled e4m3 kernels checked and timed against torch._scaled_mm.

    PYTHONPATH=. .venv/bin/python benchmarks/fp8_check.py prepare build/fp8            # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/fp8_check.py run build/fp8 --out out/fp8_check.json         # GPU box

``prepare`` builds one runtime-M module per (N, K, recipe, promote) of :data:`MODULES` through the
module cache and copies them (and their manifests) into the folder with ``fp8_plan.json``.
``run`` needs the TVM runtime and torch only:

- correctness first, in child processes with a deadline a case (a kernel that hangs or crashes
  costs its case, and a new child goes on with the next): random bf16 inputs quantized with
  ``gemm_ladder.quantize_fp8`` (the recipe's scales), the output poisoned with NaN, the error
  against a float64 product of the dequantized inputs, with ``torch._scaled_mm``'s own error on
  the same inputs as the yardstick (pass: within 2x of it, and no NaN); the same call through the
  front door (``scaled_mm`` with ``use_module``) must give the same bits; the promotion's effect at
  K = 16384 (the same inputs through the modules with and without it, largest and mean error);
- then each timed case whose module's checks all came near the answer (no NaN, within 16x torch's
  error: a module without the promotion is less accurate, not broken; its row's ``correct`` says
  whether it met the 2x): ours, ``torch._scaled_mm`` (same recipe, with and without its fast
  accumulation) and our bf16 v9 (at 4096^3 and 8192^3) in rounds whose order rotates, as kernels
  (one replay of a CUDA graph of calls cycling input sets that spill L2: ``harness.graph_times``)
  and as queued calls (``harness.event_times``); the GPU's clocks and power sampled throughout
  (``power_probe``).

Block-wise scales (``recipe`` ``block``: A's 1x128 groups, B's 128x128 blocks, applied at each
promotion): the correctness yardstick is ``torch._scaled_mm`` block-wise where this torch runs it
(2.11 does on an H100) and the case has no bias, else torch computing the same product in bf16 (the
inputs dequantized to bf16, ``torch.mm``), each against the float64 product of the dequantized inputs
(the check's ``yardstick`` says which), and the peers are
``torch._scaled_mm`` block-wise where this torch runs it (left out with its message where not), our
per-tensor fp8 module and torch's per-tensor ``_scaled_mm`` at the shape, and cuBLAS bf16
(``torch.mm``). DeepGEMM is not installed on the GPU box. ``--recipes block`` (both commands) runs
the block modules and the per-tensor ones they are compared with only.

Rows (the issue's results format): recipe, M, N, K, correct, tflops (ours, kernel timing),
ratio_to_scaled_mm (torch's time over ours), peer_ratios (peer -> its time over ours), the kernel
and call times of each. Sized for two to three minutes on an H100 (an estimate until its first run).
"""

from __future__ import annotations

import json
import math
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import cli_types, device, files  # noqa: E402
from gemm_ladder.core.spec import GemmSpec  # noqa: E402

FORMAT = "gemm_ladder.fp8_check"
PLAN_FILE = "fp8_plan.json"
# (name, N, K, recipe, promote, bias, other knobs): one runtime-M module each (v9's fp8 defaults:
# 128x128 tiles over two consumers, blk_k 128, four stages)
MODULES = (
    ("t_3008x1024_bias32", 3008, 1024, "tensor", 1, "float32", {}),
    ("r_3008x1024_bias", 3008, 1024, "row", 1, "bfloat16", {}),
    ("t_4096x4096", 4096, 4096, "tensor", 1, None, {}),
    ("r_4096x4096", 4096, 4096, "row", 1, None, {}),
    ("t_4096x4096_p6", 4096, 4096, "tensor", 1, None, {"pipe_depth": 6}),  # a deeper ring
    ("t_4096x4096_every2", 4096, 4096, "tensor", 2, None, {}),  # half as many promotions
    ("t_4096x4096_n256_p0", 4096, 4096, "tensor", 0, None, {"blk_n": 256}),  # no promotion: room for 128x256
    ("t_8192x8192", 8192, 8192, "tensor", 1, None, {}),
    ("r_8192x8192", 8192, 8192, "row", 1, None, {}),
    ("t_4096x7168", 4096, 7168, "tensor", 1, None, {}),
    ("r_4096x7168", 4096, 7168, "row", 1, None, {}),
    ("t_7168x16384", 7168, 16384, "tensor", 1, None, {}),
    ("t_1024x16384_p0", 1024, 16384, "tensor", 0, None, {}),
    ("t_1024x16384_p1", 1024, 16384, "tensor", 1, None, {}),
    # block scales: K = 1008 and N = 3008 cut the last K block and B block; DeepGEMM's shapes
    ("b_3008x1008_bias", 3008, 1008, "block", 1, "bfloat16", {}),
    ("b_4096x7168", 4096, 7168, "block", 1, None, {}),
    ("b_7168x16384", 7168, 16384, "block", 1, None, {}),
    ("b_8192x8192", 8192, 8192, "block", 1, None, {}),
)
BF16 = (("bf16_4096", 4096, 4096, 4096), ("bf16_8192", 8192, 8192, 8192))  # our bf16 v9, for the 1.7x target
# correctness cases: (module, M); odd M, bias, both recipes, DeepGEMM's 128x4096x7168, the
# promotion at K = 16384 with and without it, and every module at an M it is timed at
CHECKS = (("t_3008x1024_bias32", 1000), ("r_3008x1024_bias", 1000), ("t_4096x7168", 128), ("r_4096x7168", 128),
          ("t_1024x16384_p0", 512), ("t_1024x16384_p1", 512), ("t_4096x4096", 4096), ("r_4096x4096", 4096),
          ("t_4096x4096_p6", 4096), ("t_4096x4096_every2", 4096), ("t_4096x4096_n256_p0", 4096),
          ("t_8192x8192", 8192), ("r_8192x8192", 8192), ("t_7168x16384", 4096), ("r_4096x7168", 4096),
          ("b_3008x1008_bias", 1000), ("b_3008x1008_bias", 1), ("b_4096x7168", 128), ("b_4096x7168", 4096),
          ("b_7168x16384", 4096), ("b_8192x8192", 8192))
# timed cases: (module, M, bf16 peer or None)
TIMED = (("t_4096x4096", 4096, "bf16_4096"), ("r_4096x4096", 4096, "bf16_4096"), ("t_4096x4096_p6", 4096, None),
         ("t_4096x4096_every2", 4096, None), ("t_4096x4096_n256_p0", 4096, None),
         ("t_8192x8192", 8192, "bf16_8192"), ("r_8192x8192", 8192, "bf16_8192"),
         ("t_7168x16384", 4096, None), ("t_4096x7168", 4096, None), ("t_4096x7168", 128, None),
         ("t_4096x7168", 64, None), ("r_4096x7168", 128, None), ("r_4096x7168", 2048, None),
         ("t_1024x16384_p0", 4096, None), ("t_1024x16384_p1", 4096, None),
         # block: the peer is our per-tensor fp8 module of the shape (and torch's, and cuBLAS bf16)
         ("b_7168x16384", 4096, "t_7168x16384"), ("b_4096x7168", 4096, "t_4096x7168"),
         ("b_4096x7168", 128, "t_4096x7168"), ("b_8192x8192", 8192, "t_8192x8192"))
TOLERANCE = 2.0  # ours within 2x of torch._scaled_mm's error
TIMABLE = 16.0  # timed (its row not correct) up to this many times torch's error: less accurate, not broken
CHECK_TIMEOUT = 60.0  # seconds for one case (the first one's child starts torch and CUDA too)
ROUNDS, PER_ROUND = 8, 4  # rounds (the order rotates, then reverses) x replays per kernel per round


def spec_of(recipe: str, bias) -> GemmSpec:
    return GemmSpec.fp8("bfloat16", recipe, bias)


def selected(recipes):
    """The modules, checks and timed cases of ``recipes`` (None: all), with the modules the timed
    cases compare with (a block case's per-tensor peer)."""
    if recipes is None:
        return MODULES, CHECKS, TIMED
    recipe_of = {m[0]: m[3] for m in MODULES}
    timed = tuple(t for t in TIMED if recipe_of[t[0]] in recipes)
    needed = {t[0] for t in timed} | {t[2] for t in timed if t[2] in recipe_of}
    checks = tuple(c for c in CHECKS if recipe_of[c[0]] in recipes or c[0] in needed)
    needed |= {c[0] for c in checks}
    return tuple(m for m in MODULES if m[0] in needed), checks, timed


def tflops(M: int, N: int, K: int, ms: float | None) -> float | None:
    return None if not ms else 2.0 * M * N * K / (ms * 1e-3) / 1e12


def ratio(peer_ms, ours_ms):
    return None if not peer_ms or not ours_ms else peer_ms / ours_ms


def runs(check: dict) -> bool:
    """A check whose output is numbers near the answer (no NaN, within :data:`TIMABLE` x torch's
    error): a module less accurate than torch (no promotion at a long K) but not broken."""
    return (check.get("rel_err") is not None and not check.get("nan") and math.isfinite(check["rel_err"])
            and check["rel_err"] <= TIMABLE * max(check["torch_rel_err"], 1e-6))


def modules_that_pass(checks) -> tuple[set, set]:
    """The modules every check of which is correct, and those every check of which :func:`runs`
    (timed; a row says whether it is correct)."""
    names = {c["name"] for c in checks}
    correct = {n for n in names if all(c.get("correct") for c in checks if c["name"] == n)}
    timable = {n for n in names if all(runs(c) for c in checks if c["name"] == n)}
    return correct, timable


def f3(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def passes(err: float, torch_err: float) -> bool:
    """Ours within :data:`TOLERANCE` x torch's error (a floor of 1e-6 for exact results), and a number."""
    return math.isfinite(err) and err <= TOLERANCE * max(torch_err, 1e-6)


# -- prepare (build box) -----------------------------------------------------------------------------
def prepare(out, recipes=None) -> int:
    # the build layer: this box's TVM compiler
    from gemm_ladder.compile import module_cache  # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile.batch import BuildJob  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import tuning_db  # pylint: disable=import-outside-toplevel

    out = Path(out)
    files.open_folder(out)
    plan = {"format": FORMAT, "modules": {}, "bf16": {}, "recipes": recipes}
    modules, _, timed = selected(recipes)
    for name, N, K, recipe, promote, bias, more in modules:
        knobs = {"spec": spec_of(recipe, bias).text(), "dtype": "bfloat16", "dynamic_m": True, "promote": promote,
                 **more}
        path, _ = module_cache.get_or_build(BuildJob("v9", (256, N, K), knobs))
        plan["modules"][name] = _copy(path, out, name) | {"N": N, "K": K, "recipe": recipe, "promote": promote,
                                                           "bias": bias, "knobs": more}
        print(f"{name}: {path}")
    for name, M, N, K in (b for b in BF16 if b[0] in {t[2] for t in timed}):
        # the tuning database's knobs for the shape (the front door's choice)
        knobs, _ = tuning_db.tuned_knobs("v9", M, N, K, {"dtype": "bfloat16"})
        path, _ = module_cache.get_or_build(BuildJob("v9", (M, N, K), knobs))
        plan["bf16"][name] = _copy(path, out, name) | {"M": M, "N": N, "K": K, "knobs": knobs}
    files.write_json(out / PLAN_FILE, plan)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{len(plan['modules']) + len(plan['bf16'])} modules, {size / 2**20:.1f} MiB in {out}")
    return 0


def _copy(path: Path, out: Path, name: str) -> dict:
    for src in Path(path).parent.iterdir():
        if src.name.startswith(Path(path).name):  # the .so and its manifest
            shutil.copy(src, out / src.name.replace(Path(path).stem, name, 1))
    return {"file": f"{name}.so"}


# -- run (GPU box) ------------------------------------------------------------------------------------
def inputs(M: int, N: int, K: int, recipe: str, bias, seed: int):
    """bf16 A [M, K] and W [N, K] quantized with the recipe, their scales as scaled_mm takes them
    (block: scale_a [M, K/128] M-major, scale_b [K/128, N/128] the .t() of W's blocks), a bias."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
    w = torch.randn(N, K, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
    if recipe == "block":
        aq, sa = gemm_ladder.quantize_fp8(a, "block")
        wq, sw = gemm_ladder.quantize_fp8(w, "block", block=(128, 128))
        sa, sb = sa, sw.t()
    else:
        aq, sa = gemm_ladder.quantize_fp8(a, recipe)
        wq, sw = gemm_ladder.quantize_fp8(w, recipe)
        sa, sb = (sa, sw.t().contiguous()) if recipe == "row" else (sa.reshape(1), sw.reshape(1))
    b = None if bias is None else torch.randn(N, device="cuda", generator=g).to(getattr(torch, bias))
    return aq, wq, sa, sb, b


def kernel_scales(sa, sb, recipe: str) -> dict:
    """The scales as a module takes them: vectors, or block's as they lie (scale_a [K/128, M],
    scale_b [N/128, K/128]: ``spec.epilogue_operands``)."""
    if recipe == "block":
        return {"scale_a": sa.t(), "scale_b": sb.t()}
    return {"scale_a": sa.reshape(-1), "scale_b": sb.reshape(-1)}


def ours(mod, aq, wq, sa, sb, b, out, recipe="tensor"):
    """Our module on the inputs (its operands: the bias, then the scales)."""
    ops = ({"bias": b} if b is not None else {}) | kernel_scales(sa, sb, recipe)
    return mod(aq, wq, out=out, **ops)


def dequantized(aq, wq, sa, sb, recipe: str):
    """The inputs times their scales in float64 (the reference's operands)."""
    from gemm_ladder.serve.scaled import dequantize  # pylint: disable=import-outside-toplevel

    if recipe == "block":
        return dequantize(aq, sa).double(), dequantize(wq, sb.t(), (128, 128)).double()
    col = (lambda s: s.double().reshape(-1, 1)) if recipe == "row" else (lambda s: s.double())
    return aq.double() * col(sa), wq.double() * col(sb)


BLOCK_YARDSTICKS = ("torch._scaled_mm block-wise", "torch bf16 mm of the dequantized inputs")


def block_yardstick(aq, wq, sa, sb, b):
    """``(torch's product, its name)`` for a block case: ``torch._scaled_mm`` block-wise where this
    torch runs it (2.11 does on an H100: ``benchmarks/results/2026-11-26_h100_fp8_block/``) and there
    is no bias, else torch in bf16 on the dequantized inputs (:func:`torch_scaled`)."""
    import torch  # pylint: disable=import-outside-toplevel

    if b is None:
        try:
            return torch._scaled_mm(aq, wq.t(), sa, sb, out_dtype=torch.bfloat16), BLOCK_YARDSTICKS[0]
        except (RuntimeError, NotImplementedError, ValueError):  # a torch without the block-wise recipe here
            pass
    return torch_scaled(aq, wq, sa, sb, b, "block"), BLOCK_YARDSTICKS[1]


def torch_scaled(aq, wq, sa, sb, b, recipe):
    """torch._scaled_mm on the same inputs (an fp32 bias added in fp32, as ours does); block: torch
    in bf16 on the dequantized inputs (the yardstick where torch has no block-wise _scaled_mm, or a
    bias: :func:`block_yardstick`)."""
    import torch  # pylint: disable=import-outside-toplevel

    M, N = aq.shape[0], wq.shape[0]
    if recipe == "block":
        da, dw = dequantized(aq, wq, sa, sb, recipe)
        a16, w16 = da.to(torch.bfloat16), dw.to(torch.bfloat16)
        # the bias in cuBLAS's epilogue (one rounding, as ours)
        return a16 @ w16.t() if b is None else torch.addmm(b.to(torch.bfloat16), a16, w16.t())
    ssa, ssb = (sa.reshape(M, 1), sb.reshape(1, N)) if recipe == "row" else (sa, sb)
    if b is not None and b.dtype == torch.float32:
        return (torch._scaled_mm(aq, wq.t(), ssa, ssb, out_dtype=torch.float32) + b).to(torch.bfloat16)
    return torch._scaled_mm(aq, wq.t(), ssa, ssb, bias=b, out_dtype=torch.bfloat16)


def check_one(folder, name: str, M: int) -> dict:
    """One correctness case (in a child): ours and torch's error against float64 (the largest error
    over the largest |value|, and the mean error over the mean |value|, where a rounding bias of
    the accumulation shows and the output's bf16 rounding averages out); ours through the front
    door (``scaled_mm`` with the module given to ``use_module``) must give the same bits."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import scaled  # pylint: disable=import-outside-toplevel

    plan = json.loads((Path(folder) / PLAN_FILE).read_text())["modules"][name]
    mod = gemm_ladder.load(Path(folder) / plan["file"])
    N, K, recipe = plan["N"], plan["K"], plan["recipe"]
    aq, wq, sa, sb, b = inputs(M, N, K, recipe, plan["bias"], seed=M + N + K)
    d = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    ours(mod, aq, wq, sa, sb, b, d, recipe)
    if recipe == "block":
        ref_t, yardstick = block_yardstick(aq, wq, sa, sb, b)
    else:
        ref_t, yardstick = torch_scaled(aq, wq, sa, sb, b, recipe), "torch._scaled_mm"
    scaled.use_module(mod)
    d_front, lines = gemm_ladder.scaled_mm(aq, wq.t(), sa, sb, bias=b, out_dtype=torch.bfloat16, explain=True)
    torch.cuda.synchronize()
    da, dw = dequantized(aq, wq, sa, sb, recipe)
    ref = da @ dw.t()
    if b is not None:
        ref = ref + b.double()
    top, mean = ref.abs().max().item() or 1.0, ref.abs().mean().item() or 1.0

    def errs(x):
        diff = (x.double() - ref).abs()
        return (diff.max() / top).item(), (diff.mean() / mean).item()

    (e, em), (et, etm) = errs(d), errs(ref_t)
    nan = bool(torch.isnan(d).any())
    return {"name": name, "M": M, "N": N, "K": K, "recipe": recipe, "promote": plan["promote"], "bias": plan["bias"],
            "rel_err": e, "torch_rel_err": et, "mean_rel_err": em, "torch_mean_rel_err": etm, "nan": nan,
            "front_door_same": bool(torch.equal(d_front, d)), "front_door": lines,
            "yardstick": yardstick,
            "correct": (not nan) and passes(e, et)}


def check_all(folder, cases) -> list[dict]:
    """Every case of ``cases`` in child processes, one JSON line a case: a case that takes more
    than :data:`CHECK_TIMEOUT` seconds (a hang) or crashes its child is recorded as such, and a
    new child goes on with the next."""
    results, todo = [], list(cases)
    while todo:
        cmd = [sys.executable, __file__, "child", str(folder), *[f"{n}:{m}" for n, m in todo]]
        err = tempfile.TemporaryFile(mode="w+")  # a file: a chatty child never blocks on a full pipe
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        lines: queue.Queue = queue.Queue()
        # this child's queue and pipe bound now: a killed child's reader ends later, into its own queue
        threading.Thread(target=lambda q=lines, p=proc: [q.put(x) for x in p.stdout] + [q.put(None)], daemon=True).start()
        while todo:
            try:
                line = lines.get(timeout=CHECK_TIMEOUT)
            except queue.Empty:
                line, why = None, f"no result in {CHECK_TIMEOUT:.0f} s (a hang?)"
                proc.kill()
            else:
                why = None if line is not None else f"its child ended (rc {proc.wait()}): {_tail(err)}"
            if line is not None and not line.startswith("{"):
                continue  # something the child printed besides a result
            name, M = todo.pop(0)
            res = json.loads(line) if line is not None else {"name": name, "M": M, "correct": False, "error": why}
            results.append(res)
            print(f"check {name} M={M}: {'ok' if res.get('correct') else 'FAIL'} err {res.get('rel_err')} "
                  f"(torch {res.get('torch_rel_err')}) {res.get('error', '')}", flush=True)
            if line is None:
                break  # a new child for the rest
        proc.kill()
        proc.wait()
        err.close()
    return results


def _tail(f, chars: int = 600) -> str:
    f.seek(0)
    return f.read()[-chars:]


def _scaled_mm_peer(recipe: str, fast: bool):
    """torch._scaled_mm on an input set (into its D where this torch takes ``out=``)."""
    import torch  # pylint: disable=import-outside-toplevel

    def call(a, w, sa, sb, d):
        ssa, ssb = (sa.reshape(-1, 1), sb.reshape(1, -1)) if recipe == "row" else (sa, sb)
        return torch._scaled_mm(a, w.t(), ssa, ssb, out_dtype=torch.bfloat16, use_fast_accum=fast)

    return call


def drop_failing(kernels: dict) -> dict:
    """Run each of ``kernels`` (name -> (fn, input sets)) once on its first set and drop those that
    raise (a peer this torch lacks, or refuses at this recipe): ``{name: why}`` of those dropped."""
    import torch  # pylint: disable=import-outside-toplevel  (GPU side)

    left_out = {}
    for n, (fn, ss) in list(kernels.items()):
        try:
            fn(*ss[0])
            torch.cuda.synchronize()
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as err:  # a peer this torch lacks
            left_out[n] = str(err)[:300]
            print(f"  {n}: left out: {str(err)[:200]}", flush=True)
            del kernels[n]
    return left_out


def _block_peers(folder, plan, peer: str, M: int, N: int, K: int, loaded: dict, l2: int) -> dict:
    """A block case's peers: our per-tensor fp8 module ``peer`` and torch's per-tensor _scaled_mm
    on tensor-scaled inputs of the shape, and cuBLAS bf16 (``torch.mm``) on bf16 inputs."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    if peer not in loaded:
        loaded[peer] = gemm_ladder.load(Path(folder) / plan["modules"][peer]["file"])
    t_sets = []
    for i in range(max(2, math.ceil(3 * l2 / (M * K + N * K + 2 * M * N)))):
        aq, wq, sa, sb, _ = inputs(M, N, K, "tensor", None, seed=200 + i)
        t_sets.append((aq, wq, sa, sb, torch.empty((M, N), dtype=torch.bfloat16, device="cuda")))
    t_launch = loaded[peer].launcher(t_sets[0][0], t_sets[0][1], t_sets[0][4], **kernel_scales(*t_sets[0][2:4], "tensor"))
    b_sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
               torch.randn(N, K, device="cuda", dtype=torch.bfloat16),
               torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
              for _ in range(max(2, math.ceil(3 * l2 / (2 * (M * K + N * K + M * N)))))]
    return {"ours_fp8_tensor": (lambda a, w, sa, sb, d: t_launch(a, w, d, sa.reshape(-1), sb.reshape(-1)), t_sets),
            "torch_scaled_mm_tensor": (_scaled_mm_peer("tensor", False), t_sets),
            "torch_bf16_mm": (lambda a, w, d: torch.mm(a, w.t(), out=d), b_sets)}


def time_case(folder, plan, name: str, M: int, peer: str | None, loaded: dict) -> dict:
    """Ours, torch._scaled_mm (with and without its fast accumulation) and, with ``peer``, our bf16
    v9 on bf16 inputs of the shape: each on input sets that spill L2 three times, in rounds whose
    order rotates and reverses, as kernels (CUDA graphs) and as queued calls."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    m = plan["modules"][name]
    N, K, recipe = m["N"], m["K"], m["recipe"]
    if name not in loaded:
        loaded[name] = gemm_ladder.load(Path(folder) / m["file"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    n_sets = max(2, math.ceil(3 * l2 / (M * K + N * K + 2 * M * N)))
    sets = []
    for i in range(n_sets):
        aq, wq, sa, sb, _ = inputs(M, N, K, recipe, None, seed=100 + i)
        sets.append((aq, wq, sa, sb, torch.empty((M, N), dtype=torch.bfloat16, device="cuda")))
    launch = loaded[name].launcher(sets[0][0], sets[0][1], sets[0][4], **kernel_scales(*sets[0][2:4], recipe))
    kernels = {"ours": (lambda a, w, sa, sb, d: launch(a, w, d, *kernel_scales(sa, sb, recipe).values()), sets),
               "torch_scaled_mm": (_scaled_mm_peer(recipe, False), sets),  # block: refused by torch 2.11 on sm_90
               "torch_scaled_mm_fast_accum": (_scaled_mm_peer(recipe, True), sets)}
    if recipe == "block" and peer is not None:
        kernels |= _block_peers(folder, plan, peer, M, N, K, loaded, l2)
    elif peer is not None:
        if peer not in loaded:
            loaded[peer] = gemm_ladder.load(Path(folder) / plan["bf16"][peer]["file"])
        b_sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                   torch.randn(N, K, device="cuda", dtype=torch.bfloat16),
                   torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
                  for _ in range(max(2, math.ceil(3 * l2 / (2 * (M * K + N * K + M * N)))))]
        b_launch = loaded[peer].launcher(*b_sets[0])
        kernels["ours_bf16_v9"] = (lambda a, w, d: b_launch(a, w, d), b_sets)
    left_out = drop_failing(kernels)  # (torch's block-wise _scaled_mm on sm_90, fast accumulation with rows, ...)
    names = list(kernels)
    calls = max(8, max(len(ss) for _, ss in kernels.values()))
    graph, call = {n: [] for n in names}, {n: [] for n in names}
    t0 = time.time()
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in (order if (r // len(names)) % 2 == 0 else order[::-1]):
            fn, ss = kernels[n]
            graph[n] += harness.graph_times(fn, ss, PER_ROUND, calls)
            call[n] += harness.event_times(fn, ss, PER_ROUND)
    t1 = time.time()
    g = {n: statistics.median(v) for n, v in graph.items()}
    c = {n: statistics.median(v) for n, v in call.items()}
    return {"recipe": recipe, "M": M, "N": N, "K": K, "module": name, "tflops": tflops(M, N, K, g["ours"]),
            "ratio_to_scaled_mm": ratio(g.get("torch_scaled_mm"), g["ours"]),
            "peer_ratios": {n: ratio(g[n], g["ours"]) for n in g if n != "ours"},
            "kernel_ms": g, "call_ms": c, "call_ratio_to_scaled_mm": ratio(c.get("torch_scaled_mm"), c["ours"]),
            "tflops_by_peer": {n: tflops(M, N, K, v) for n, v in g.items()}, "input_sets": len(sets),
            "peers_left_out": left_out, "t0": t0,
            "t1": t1}


def run(folder, out, recipes=None) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"fp8_check run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    plan = json.loads((Path(folder) / PLAN_FILE).read_text())
    recipes = recipes or plan.get("recipes")  # what prepare built, unless narrowed here
    _, cases, timed = selected(recipes)
    missing = sorted({c[0] for c in cases} - set(plan["modules"]))
    if missing:
        print(f"fp8_check run: {folder} lacks the modules {missing}: prepare it with the same --recipes", file=sys.stderr)
        return 2
    start, sampler = time.time(), Sampler()
    checks = check_all(folder, cases)
    good = {(c["name"], c["M"]) for c in checks if c.get("correct")}
    correct, timable = modules_that_pass(checks)
    rows, loaded = [], {}
    try:
        for name, M, peer in timed:
            if name not in timable:
                rows.append({"recipe": plan["modules"][name]["recipe"], "M": M, "N": plan["modules"][name]["N"],
                             "K": plan["modules"][name]["K"], "module": name, "correct": False, "tflops": None,
                             "ratio_to_scaled_mm": None, "peer_ratios": {}})
                continue
            row = time_case(folder, plan, name, M, peer, loaded)
            row["correct"] = name in correct
            row["clocks"] = sampler.between(row.pop("t0"), row.pop("t1"))
            rows.append(row)
            print(f"{name} M={M}: {row['tflops']:.0f} TFLOPS, x torch._scaled_mm {f3(row['ratio_to_scaled_mm'])} "
                  f"(calls {f3(row['call_ratio_to_scaled_mm'])}), peers "
                  f"{ {n: f3(v) for n, v in row['peer_ratios'].items()} }", flush=True)
    finally:
        sampler.stop()
    promo = {c["promote"]: c for c in checks if c.get("name", "").startswith("t_1024x16384") and "rel_err" in c}
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "tolerance": TOLERANCE, "checks": checks, "good_cases": sorted(map(list, good)),
              "promotion_k16384": {str(k): {"rel_err": v["rel_err"], "torch_rel_err": v["torch_rel_err"]}
                                   for k, v in promo.items()},
              "rows": rows}
    check_cli.write_result(out, result)
    print(f"{sum(1 for c in checks if c.get('correct'))} of {len(checks)} checks pass; {len(rows)} rows; "
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, r, sub = check_cli.subcommands(__doc__, "build box: the fp8 modules and the plan",
                                          "GPU box: check, then time against torch._scaled_mm", "fp8_check.json")
    recipes = cli_types.names(("tensor", "row", "block"), "scale recipe")
    pr.add_argument("--recipes", type=recipes, default=None, help="only these recipes' modules (default all)")
    r.add_argument("--recipes", type=recipes, default=None, help="only these recipes' cases (default: prepare's)")
    c = sub.add_parser("child", help="(internal) correctness cases NAME:M, a JSON line each")
    c.add_argument("folder")
    c.add_argument("cases", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out, a.recipes)
    if a.cmd == "child":
        for case in a.cases:
            name, _, M = case.rpartition(":")
            print(json.dumps(check_one(a.folder, name, int(M))), flush=True)
        return 0
    return run(a.folder, a.out, a.recipes)


if __name__ == "__main__":
    sys.exit(main())
