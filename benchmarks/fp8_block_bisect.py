"""fp8 block scales staged by TMA (``stage_scales``, issue 32): why they died, and the fix beside the control.

    PYTHONPATH=. .venv/bin/python benchmarks/fp8_block_bisect.py prepare build/fp8_bisect        # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/fp8_block_bisect.py run build/fp8_bisect --out out/fp8_block_bisect.json  # GPU box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        compute-sanitizer --tool memcheck --show-backtrace device \\
        python3 benchmarks/fp8_block_bisect.py sanitize build/fp8_bisect --module b_7168x16384_full --m 333

Every module with ``stage_scales`` failed its check on the H100 with "an illegal instruction"
(``benchmarks/results/2026-11-26_h100_fp8_block_staged/``) while the CPU checks (SASS, barrier
checker) passed. The cause: the producer's 1-D TMA boxes of the scales started at any float (A's
at ``kb * M + m_st``, B's at ``nb * K/128 + kb``), and Hopper refuses a tensor copy whose
innermost start is not 16-byte aligned, at run time (the encode and the compile take it; public
reports: triton-lang/triton#7385, tile-ai/tilelang#2681). The first version of this script (commit
e9d4fe8) built probes that keep one part each (knob ``stage_probe``: A's copy and reads alone,
B's alone, the copies without the reads, plain bulk copies, every box start rounded down to 16
bytes) to show it on the GPU in one run. The fix (``fp8.StagedScales``): every box starts 16-byte
aligned (A's rounded down and 4 floats longer, B's the aligned 16 bytes holding its scale), each
consumer reads its floats at their offsets; ``tests/test_tma_box_starts.py`` proves every copy's
start aligned on the CPU.

Run 3 (issue 32, the next step): the policy (``stage_scales``: 1-D TMA tensor copies, the ``control``
of each shape) beside the same with the scales copied by plain bulk copies (knob ``stage_bulk``:
``cp.async.bulk`` with no tensor map, guarded by each box's bound, the tensor copy where a box would
run past the scale tensor; 4.4% faster in the probe run) at the block sweep's shapes and two odd
ones (K/128 = 10 and 9: B's rows start off 16 bytes; N = 3008 cuts the last B block; the last boxes
fall back). Each is checked first (``fp8_check.check_all``: a child a case with a deadline; random
inputs quantized as ``quantize_fp8`` does, output poisoned with NaN, error against a float64 product
within 2x of ``torch._scaled_mm`` block-wise's own) at its shape's M and at M = 1 and 333 (A's
first scales then lie off 16 bytes, and the last A boxes run past the tensor); every module that
passed is timed with the policy and ``torch._scaled_mm`` block-wise in the same rounds
(``fp8_sweep.time_shape``: kernels in CUDA graphs cycling input sets that spill L2, and queued
calls, the order rotating and reversing), clocks sampled. ``sanitize`` runs one module once, for ``compute-sanitizer`` (its report names a
faulting instruction's offset and thread: thread 0 of a CTA is the producer, 128 and up the
consumers). Run 4 adds ``split`` (A's bulk copy as 512 + 16 bytes: run 3's 528-byte copies ran 9% slower
than the tensor copies, 42 of 42 right). Under a minute on an H100 (run 3: 10 s); the folder is about 4.4 MiB.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_check  # noqa: E402  (sibling scripts: the checks, the children, the timing)
import fp8_sweep  # noqa: E402
from power_probe import Sampler  # noqa: E402
import check_cli  # noqa: E402

from gemm_ladder.core import device  # noqa: E402

FORMAT = "gemm_ladder.fp8_block_bisect"
BIG = "4096x7168x16384"  # issue 32's block target shape
SMALL = "128x4096x7168"  # the small-M policy's shape
# odd shapes: K/128 = 10 and 9 (B's rows start off 16 bytes), N = 3008 (the last B block cut), M odd
ODD, ODD_SMALL = "1000x3008x1280", "77x3008x1152"
SHAPES = ((BIG, 4096, 7168, 16384), ("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192),
          ("4096x4096x7168", 4096, 4096, 7168), (SMALL, 128, 4096, 7168), (ODD, 1000, 3008, 1280),
          (ODD_SMALL, 77, 3008, 1152))
SMALL_M = fp8_sweep.SMALL_M_KNOBS  # the block policy's small-M knobs (plan.FP8_BLOCK_SMALL_KNOBS)
CONFIGS = {
    "policy": {"overlap": 4, "stage_scales": True},  # the block policy past M = 128 (plan.FP8_BLOCK_LARGE_KNOBS)
    "bulk": {"overlap": 4, "stage_scales": True, "stage_bulk": True},  # its scales by plain bulk copies
    "sm_policy": {**SMALL_M, "overlap": 2, "stage_scales": True},  # up to M = 128 (plan.FP8_BLOCK_SMALL_KNOBS)
    "sm_bulk": {**SMALL_M, "overlap": 2, "stage_scales": True, "stage_bulk": True},
    # run 4: A's bulk copy as 512 + 16 bytes (run 3: the 528-byte copies 9% slower than the tensor copies)
    "split": {"overlap": 4, "stage_scales": True, "stage_bulk": True, "stage_bulk_split": True},
    "sm_split": {**SMALL_M, "overlap": 2, "stage_scales": True, "stage_bulk": True, "stage_bulk_split": True},
}
LARGE, SMALL_PAIR = ("policy", "bulk", "split"), ("sm_policy", "sm_bulk", "sm_split")
TIMED = {BIG: LARGE, "4096^3": LARGE, "8192^3": LARGE, "4096x4096x7168": LARGE, SMALL: SMALL_PAIR, ODD: LARGE,
         ODD_SMALL: SMALL_PAIR}  # each shape's first is its control: the policy (tensor copies)
BISECT = fp8_sweep.Sweep("block", SHAPES, CONFIGS, TIMED, {})
ODD_MS = (1, 333)  # extra rows a staged module is checked at: A's first scales of most K blocks lie off 16 bytes


@contextlib.contextmanager
def bisect_sweep():
    """fp8_sweep's helpers (module names, prepare, timing, rows) read the block sweep from
    ``fp8_sweep.SWEEPS``: inside this, it is the bisect's (restored after: a test process goes on)."""
    saved = fp8_sweep.SWEEPS
    fp8_sweep.SWEEPS = {**saved, "block": BISECT}
    try:
        yield
    finally:
        fp8_sweep.SWEEPS = saved


def cases(plan: dict) -> list[tuple[str, int]]:
    """(module, M) checks (inside :func:`bisect_sweep`): every module at its shape's M, the staged
    ones also at :data:`ODD_MS`; the unstaged first (a failing case costs a new child)."""
    first, staged = [], []
    for label, M, _, _ in SHAPES:
        for config in TIMED[label]:
            name = fp8_sweep.module_name(label, config, "block")
            if (name, M) in first + staged:
                continue
            knobs = plan["modules"][name]["knobs"]
            (staged if knobs.get("stage_scales") else first).append((name, M))
            if knobs.get("stage_scales"):
                staged += [(name, m) for m in ODD_MS if (name, m) not in staged]
    return first + staged


def verdict(checks: list[dict]) -> dict:
    """Each module's outcome in words: module name -> ``pass`` / ``FAIL...`` at each M it was checked at."""
    out: dict = {}
    for c in checks:
        why = "FAIL: " + str(c.get("error"))[-200:] if c.get("error") else "FAIL (wrong)"
        out.setdefault(c["name"], {})[str(c["M"])] = "pass" if c.get("correct") else why
    return out


# -- prepare (build box) -----------------------------------------------------------------------------
def prepare(out) -> int:
    return fp8_sweep.prepare(out, "block")


# -- run (GPU box) ------------------------------------------------------------------------------------
def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"fp8_block_bisect run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel  (the GPU box's)

    plan = json.loads((Path(folder) / fp8_sweep.PLAN_FILE).read_text())
    missing = sorted(set(fp8_sweep.plan_modules("block")) - set(plan.get("modules", {})))
    if plan.get("format") != fp8_sweep.FORMAT or missing:
        print(f"fp8_block_bisect run: {folder} is not this bisect's folder (missing {missing}): run "
              "fp8_block_bisect.py prepare", file=sys.stderr)
        return 2
    start, sampler = time.time(), Sampler()
    checks = fp8_check.check_all(folder, cases(plan))
    passed_at = {}
    for c in checks:
        passed_at.setdefault(c["name"], []).append(bool(c.get("correct")))
    good = {n for n, oks in passed_at.items() if all(oks)}
    rows, loaded, timings = [], {}, {}
    try:
        for label, M, _, _ in SHAPES:
            names = [fp8_sweep.module_name(label, c, "block") for c in TIMED[label]]
            names = [n for n in names if n in good]
            if not names:
                continue
            try:
                timing = fp8_sweep.time_shape(folder, plan, label, names, loaded, "block", None)
            except Exception as err:  # pylint: disable=broad-except  (a probe that passed its checks and
                # failed here poisons this process's CUDA context: keep the checks, time no more)
                timings[label] = {"error": f"{type(err).__name__}: {err}"[:800]}
                print(f"{label}: timing failed: {timings[label]['error']}", flush=True)
                break
            timings[label] = {k: v for k, v in timing.items() if k not in ("t0", "t1")}
            at_m = {c["name"]: c for c in checks if c["M"] == M}
            shape_rows = fp8_sweep.rows_of(plan, label, timing, at_m, sampler.between(timing["t0"], timing["t1"]),
                                           "block")
            control = timing["kernel_ms"].get(fp8_sweep.module_name(label, TIMED[label][0], "block"))
            for r in shape_rows:
                r["ratio_to_control"] = fp8_check.ratio(control, r["kernel_ms"])
                print(f"{label} {r['config']}: {fp8_check.f3(r['tflops'])} TFLOPS, x control "
                      f"{fp8_check.f3(r['ratio_to_control'])}, x torch._scaled_mm block "
                      f"{fp8_check.f3(r['ratio_to_scaled_mm'])}{'' if r['correct'] else ' NOT CORRECT'}", flush=True)
            rows += shape_rows
    finally:
        sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start), "recipe": "block", "checks": checks,
              "verdict": verdict(checks), "timings": timings, "rows": rows}
    check_cli.write_result(out, result)
    for config, at in result["verdict"].items():
        print(f"verdict {config}: " + ", ".join(f"M={m} {v}" for m, v in at.items()))
    print(f"{sum(1 for c in checks if c.get('correct'))} of {len(checks)} checks pass; {len(rows)} rows; "
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def sanitize(folder, name: str, M: int) -> int:
    """One call of module ``name`` at M rows, synchronized, for ``compute-sanitizer`` (which reports
    the faulting instruction and thread of a hardware exception) or ``cuda-gdb``."""
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    plan = json.loads((Path(folder) / fp8_sweep.PLAN_FILE).read_text())["modules"]
    if name not in plan:
        print(f"fp8_block_bisect sanitize: no module {name!r} in {folder}; one of {sorted(plan)}", file=sys.stderr)
        return 2
    entry = plan[name]
    mod = gemm_ladder.load(Path(folder) / entry["file"])
    aq, wq, sa, sb, b = fp8_check.inputs(M, entry["N"], entry["K"], "block", None, seed=M)
    d = torch.full((M, entry["N"]), float("nan"), dtype=torch.bfloat16, device="cuda")
    print(f"sanitize {name} M={M}: knobs {entry['knobs']}", flush=True)
    fp8_check.ours(mod, aq, wq, sa, sb, b, d, "block")
    torch.cuda.synchronize()
    print(f"sanitize {name} M={M}: finished, NaN left {bool(torch.isnan(d).any())}")
    return 0


def main(argv=None) -> int:
    p, _, _, sub = check_cli.subcommands(__doc__, "build box: the probes' modules and plan",
                                         "GPU box: check every probe, then time those that pass",
                                         "fp8_block_bisect.json")
    s = sub.add_parser("sanitize", help="GPU box: one call of one module (run it under compute-sanitizer)")
    s.add_argument("folder")
    s.add_argument("--module", default=f"b_{SHAPES[0][2]}x{SHAPES[0][3]}_bulk",
                   help="a module of the folder (fp8_sweep.module_name: b_<N>x<K>_<config>)")
    s.add_argument("--m", type=int, default=ODD_MS[-1])
    a = p.parse_args(argv)
    with bisect_sweep():
        if a.cmd == "prepare":
            return prepare(a.out)
        if a.cmd == "sanitize":
            return sanitize(a.folder, a.module, a.m)
        return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
