"""Block-wise fp8 (issue 32) against DeepGEMM's kernels, built on the GPU box from source.

    PYTHONPATH=. .venv/bin/python benchmarks/deepgemm_peer.py prepare build/dg_peer       # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/deepgemm_peer.py run build/dg_peer --deepgemm build/DeepGEMM --out out/dg.json  # GPU box

Issue 32 asks for DeepGEMM's block-wise kernels as a peer "if they build on the GPU box". That box has
nvcc, g++ and torch but no network, so DeepGEMM travels as source: its repository at a commit, with the
two submodules it compiles against (CUTLASS's ``include/`` and ``{fmt}``) at the commits it pins,
carried under ``build/`` (git-ignored, never committed). ``run`` builds its extension there
(``setup.py build``: the C++ runtime ``deep_gemm._C``; its kernels compile at their first call, with
nvcc) and records how that went, its log's tail included, whether it built or not.

``prepare`` builds our block-wise module for each shape of :data:`SHAPES` (DeepGEMM's own set: M =
4096 and 128 against DeepSeek-V3's weights) as ``scaled_mm`` would (``scaled.build_job``: the policy's
fp8 rule, M at run time), into the folder with ``dg_peer.json``.

``run``, on the GPU:

- inputs: bf16 ``randn`` A and W quantized with ``gemm_ladder.quantize_fp8`` (A's 1x128 groups, W's
  128x128 blocks): one fp8 tensor pair and one pair of fp32 scales feed every kernel. DeepGEMM reads the
  same scales (its ``sfa`` [M, K/128] M-major, ``sfb`` [N/128, K/128]), already in its TMA-aligned
  layout, so its calls do no layout copy;
- correctness first: each kernel's D (poisoned with NaN first) against a float64 product of the
  dequantized inputs; ours must come within 2x of DeepGEMM's error (and torch's, where its block-wise
  ``_scaled_mm`` runs here);
- timing: each kernel replayed from CUDA graphs cycling input sets that spill L2 three times, in
  rounds whose order rotates (``harness.graph_times``), the GPU's clocks and power sampled throughout.

Rows (issue 32's results format): recipe ``block``, M, N, K, correct, tflops (ours), ratio_to_scaled_mm
(torch's time over ours, where torch runs block scales here, else None), peer_ratios (``deepgemm``: its
time over ours), and each kernel's TFLOPS and error.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_cli  # noqa: E402  (a sibling script, not a package)
import fp8_check  # noqa: E402  (a sibling script: inputs, the block yardstick, the peers)
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402

FORMAT = "gemm_ladder.deepgemm_peer"
PLAN_FILE = "dg_peer.json"
# (M, N, K): DeepGEMM's dense fp8 set (its tests' weights of DeepSeek-V3) at M = 4096, and 128 rows
SHAPES = ((4096, 7168, 16384), (4096, 4096, 7168), (4096, 2112, 7168), (4096, 24576, 1536), (128, 4096, 7168),
          (128, 7168, 16384))
BUILD_TIMEOUT_S = 400
ROUNDS, PER_ROUND = 8, 4


def name_of(M: int, N: int, K: int) -> str:
    return f"b_{M}x{N}x{K}"


def prepare(out, shapes=SHAPES) -> int:
    # the build layer: this box's TVM compiler
    from gemm_ladder.compile import module_cache  # pylint: disable=import-outside-toplevel
    from gemm_ladder.core.spec import GemmSpec  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import scaled  # pylint: disable=import-outside-toplevel

    out = Path(out)
    files.open_folder(out)
    plan = {"format": FORMAT, "cases": []}
    for M, N, K in shapes:
        call = scaled.Call(M, N, K, "block", GemmSpec.fp8("bfloat16", "block", None))
        rung, chosen, knobs = scaled.build_job(call, "sm_90a")
        path, how = module_cache.get_or_build((rung, (M, N, K), knobs))
        name = name_of(M, N, K)
        for src in Path(path).parent.iterdir():
            if src.name.startswith(Path(path).name):  # the .so and its manifest
                shutil.copy(src, out / src.name.replace(Path(path).stem, name, 1))
        plan["cases"].append({"name": name, "M": M, "N": N, "K": K, "rung": rung, "knobs": chosen,
                              "file": f"{name}.so"})
        print(f"{name}: {rung} {chosen} ({how})", flush=True)
    files.write_json(out / PLAN_FILE, plan)
    return 0


# -- run (GPU box) ---------------------------------------------------------------------------------
def build_deepgemm(src: Path) -> dict:
    """``setup.py build`` in ``src`` (the extension and the package with CUTLASS's headers beside it);
    returns ``{"built", "seconds", "lib", "log_tail"}``."""
    t0 = time.time()
    env = {**os.environ, "DG_USE_LOCAL_VERSION": "0", "MAX_JOBS": str(os.cpu_count() or 8)}
    shim = src / "_shim"  # setup.py imports wheel's bdist_wheel at its top; the build itself needs no wheel
    if importlib.util.find_spec("wheel") is None:
        (shim / "wheel").mkdir(parents=True, exist_ok=True)
        (shim / "wheel" / "__init__.py").write_text("")
        (shim / "wheel" / "bdist_wheel.py").write_text("from setuptools import Command as bdist_wheel\n")
        env["PYTHONPATH"] = f"{shim}{os.pathsep}{env.get('PYTHONPATH', '')}"
    try:
        proc = subprocess.run([sys.executable, "setup.py", "build"], cwd=src, env=env, capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S, check=False)
        log, ok = proc.stdout + proc.stderr, proc.returncode == 0
    except subprocess.TimeoutExpired as err:
        log, ok = f"{err.stdout or ''}{err.stderr or ''}\ntimed out after {BUILD_TIMEOUT_S} s", False
    libs = sorted(src.glob("build/lib*/deep_gemm/_C*.so"))
    return {"built": ok and bool(libs), "seconds": round(time.time() - t0, 1),
            "lib": str(libs[0].parent.parent) if libs else None, "log_tail": log[-3000:]}


def _error(d, ref) -> float:
    top = ref.abs().max().item() or 1.0
    return ((d.double() - ref).abs().max() / top).item() if not d.isnan().any() else math.inf


def run_case(case: dict, folder: Path, dg) -> dict:
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel
    from gemm_ladder.serve import scaled  # pylint: disable=import-outside-toplevel

    M, N, K = case["M"], case["N"], case["K"]
    scaled.reset()
    scaled.use_module(folder / case["file"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = []
    for i in range(max(2, math.ceil(3 * l2 / (M * K + N * K + 2 * M * N)))):
        aq, wq, sa, sb, _ = fp8_check.inputs(M, N, K, "block", None, seed=300 + i)
        sets.append((aq, wq, sa, sb, torch.empty((M, N), dtype=torch.bfloat16, device="cuda")))
    kernels = {"ours": lambda a, w, sa, sb, d: gemm_ladder.scaled_mm(a, w.t(), sa, sb, out=d, strict=True),
               "torch_scaled_mm": fp8_check._scaled_mm_peer("block", False)}  # pylint: disable=protected-access
    if dg is not None:
        # the scales in DeepGEMM's layout once, outside the timed call (sfa M-major and TMA-aligned; sfb [N/128, K/128])
        align = getattr(dg, "get_mn_major_tma_aligned_tensor", lambda t: t)
        dg_sets = [(a, w, align(sa), sb.t().contiguous(), d) for a, w, sa, sb, d in sets]
        kernels["deepgemm"] = lambda a, w, sa, sb, d: dg.fp8_fp4_gemm_nt((a, sa), (w, sb), d, disable_ue8m0_cast=True)
    sets_of = {"deepgemm": dg_sets} if dg is not None else {}
    aq, wq, sa, sb, _ = sets[0]
    a64, w64 = fp8_check.dequantized(aq, wq, sa, sb, "block")
    ref = a64 @ w64.t()
    errors, left_out = {}, {}
    for name, fn in kernels.items():
        ss = sets_of.get(name, sets)
        d = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        try:
            got = fn(*ss[0][:4], d)  # torch's returns its D; ours and DeepGEMM's write d
            torch.cuda.synchronize()
            errors[name] = _error(got if isinstance(got, torch.Tensor) else d, ref)
        except Exception as err:  # pylint: disable=broad-except  (torch refuses block scales on sm_90; a JIT failure)
            left_out[name] = f"{type(err).__name__}: {str(err)[:300]}"
    kernels = {n: fn for n, fn in kernels.items() if n not in left_out}
    yardsticks = [errors[n] for n in ("deepgemm", "torch_scaled_mm") if n in errors]
    correct = "ours" in errors and bool(yardsticks) and all(fp8_check.passes(errors["ours"], e) for e in yardsticks)
    names = list(kernels)
    graph = {n: [] for n in names}
    t0 = time.time()
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in (order if (r // len(names)) % 2 == 0 else order[::-1]):
            ss = sets_of.get(n, sets)
            graph[n] += harness.graph_times(kernels[n], ss, PER_ROUND, max(8, len(ss)))
    g = {n: statistics.median(v) for n, v in graph.items()}
    tf = {n: fp8_check.tflops(M, N, K, v) for n, v in g.items()}
    return {"recipe": "block", "M": M, "N": N, "K": K, "module": case["name"], "rung": case["rung"],
            "knobs": case["knobs"], "correct": correct, "tflops": tf.get("ours"),
            "ratio_to_scaled_mm": fp8_check.ratio(g.get("torch_scaled_mm"), g.get("ours")),
            "peer_ratios": {n: fp8_check.ratio(g[n], g["ours"]) for n in g if n != "ours"},
            "kernel_ms": g, "tflops_by_kernel": tf, "rel_err": errors, "left_out": left_out,
            "input_sets": len(sets), "t0": t0, "t1": time.time()}


def run(folder, out, deepgemm) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"deepgemm_peer run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    plan = read_json(folder / PLAN_FILE, "deepgemm peer plan",
                     f"run benchmarks/deepgemm_peer.py prepare {folder} on the build box and carry it here")
    start, sampler = time.time(), Sampler()
    build = build_deepgemm(Path(deepgemm)) if deepgemm else {"built": False, "log_tail": "no --deepgemm given"}
    print(f"DeepGEMM build: {'built' if build['built'] else 'FAILED'} in {build.get('seconds')} s", flush=True)
    dg = None
    if build["built"]:
        sys.path.insert(0, build["lib"])
        try:
            import deep_gemm as dg  # pylint: disable=import-outside-toplevel
            build["version"] = getattr(dg, "__version__", None)
        except Exception as err:  # pylint: disable=broad-except  (recorded: the import is part of "builds here")
            build.update(built=False, import_error=f"{type(err).__name__}: {str(err)[:500]}")
            dg = None
    if not build["built"]:
        print(build["log_tail"][-1500:], flush=True)
    rows = []
    try:
        for case in plan["cases"]:
            row = run_case(case, folder, dg)
            row["clocks"] = sampler.between(row.pop("t0"), row.pop("t1"))
            rows.append(row)
            # after each case: a run cut short by its deadline (DeepGEMM's first calls compile) keeps what it has
            check_cli.write_result(out, {**check_cli.head(FORMAT, harness, sampler, start), "deepgemm_build": build,
                                         "rows": rows, "complete": False})
            print(f"{case['name']}: ours {row['tflops']:.0f} TFLOPS, correct {row['correct']}, "
                  f"x peers {({n: round(v, 3) for n, v in row['peer_ratios'].items() if v})}, "
                  f"errors {({n: f'{e:.2e}' for n, e in row['rel_err'].items()})}, left out {list(row['left_out'])}",
                  flush=True)
    finally:
        sampler.stop()
    check_cli.write_result(out, {**check_cli.head(FORMAT, harness, sampler, start), "deepgemm_build": build,
                                 "rows": rows, "complete": len(rows) == len(plan["cases"])})
    return 0 if rows and all(r["correct"] for r in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="build box: our block-wise modules of SHAPES")
    pr.add_argument("out")
    r = sub.add_parser("run", help="GPU box: build DeepGEMM, check and time both")
    r.add_argument("folder")
    r.add_argument("--deepgemm", default=None, help="DeepGEMM's source folder (with its submodules' headers)")
    r.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return prepare(a.out) if a.cmd == "prepare" else run(a.folder, a.out, a.deepgemm)


if __name__ == "__main__":
    sys.exit(main())
