"""Tutorial 16 (fp8): the wgmma a built module issues, a numpy model of the tensor cores' limited-
precision accumulation and what the promotion buys, and the committed fp8 measurements.

    from gemm_ladder.teach import fp8
    print(fp8.wgmma_instruction(built))                 # the PTX of the module's wgmma, registers elided
    errors = fp8.promotion_errors()                     # the model's error by K, with and without promotion
    teach.show(fp8.plot_promotion(errors, fp8.measured_promotion()))
    fp8.show_measured()                                 # benchmarks/results/2026-11-26_h100_fp8/

**The model** (:func:`model_dot`) is not the hardware, only its one property that matters here:
inside a chain of fp8 wgmmas, the running sum keeps about ``bits`` significant bits (DeepSeek-V3's
report measured about 14 on an H800), so each k32 step's products are added exactly and the sum is
then cut to ``bits`` bits, toward zero. Over a long K the cuts add up, always in one direction
(toward zero, a bias that does not average out); the promotion adds the tensor cores' sum into a
separate fp32 sum every few steps and starts them over from zero, so the chain they cut is never
longer than those steps. The inputs are e4m3 values (:func:`e4m3`: 3 mantissa bits, round to
nearest even, saturating at 448, subnormals below 2^-6), and the output is rounded to bf16 as the
kernel stores it.

Importing this module imports numpy only (matplotlib on the first picture).
"""

from __future__ import annotations

import json
import re

import numpy as np

from .plots import _figure
from .results import RESULTS_DIR

FP8_RUN = RESULTS_DIR / "2026-11-26_h100_fp8" / "fp8_check.json"
ACC_BITS = 14  # significant bits the tensor cores keep in an fp8 chain (DeepSeek-V3: "around 14 bits")
K_STEP = 32  # K of one fp8 wgmma
PROMOTE_STEPS = 4  # k32 steps between promotions: every 128 of K (v9's promote=1 with blk_k = 128)
BF16_BITS = 8  # significant bits of a bf16 (7 stored + the implicit one)
E4M3_MAX, E4M3_MIN_NORMAL, E4M3_BITS = 448.0, 2.0 ** -6, 4


def _cut(x, bits: int, toward_zero: bool):
    """``x`` to ``bits`` significant bits: cut toward zero, or rounded to nearest even."""
    x = np.asarray(x, dtype=np.float64)
    exp = np.floor(np.log2(np.abs(x), where=x != 0, out=np.zeros_like(x)))
    unit = 2.0 ** (bits - 1 - exp)
    return (np.trunc(x * unit) if toward_zero else np.round(x * unit)) / unit


def e4m3(x):
    """``x`` rounded to float8 e4m3 values (as float64): 4 significant bits, nearest even,
    saturating at +-448, a fixed step of 2^-9 below the smallest normal 2^-6."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    sub = np.round(x * 2.0 ** 9) / 2.0 ** 9
    return np.where(np.abs(x) < E4M3_MIN_NORMAL, sub, _cut(x, E4M3_BITS, toward_zero=False))


def model_dot(a, b, bits: int = ACC_BITS, promote_steps: int | None = None, k_step: int = K_STEP):
    """Rows of ``a`` [R, K] times ``b`` [K] as the model tensor core sums them: a k32 step's
    products exactly, then the running sum cut to ``bits`` bits toward zero; with
    ``promote_steps``, that sum is added into an fp32 sum every ``promote_steps`` steps and starts
    over from zero (the promotion). fp32's 24 bits are modelled as exact: they are 10 more."""
    rows, K = a.shape
    chain, promoted = np.zeros(rows), np.zeros(rows)
    for step, k in enumerate(range(0, K, k_step)):
        chain = _cut(chain + a[:, k:k + k_step] @ b[k:k + k_step], bits, toward_zero=True)
        if promote_steps and (step + 1) % promote_steps == 0:
            promoted, chain = promoted + chain, np.zeros(rows)
    return promoted + chain


def promotion_errors(ks=(512, 1024, 2048, 4096, 8192, 16384), rows: int = 256, bits: int = ACC_BITS,
                     promote_steps: int = PROMOTE_STEPS, seed: int = 0) -> dict:
    """The model's error against the exact product of the same e4m3 inputs (random normal, one
    scale), the output rounded to bf16: the largest error over the largest |value|, as
    ``benchmarks/fp8_check.py`` measures the kernel. ``{"K": [...], "none": [...], "promoted": [...]}``."""
    rng = np.random.default_rng(seed)
    out = {"K": list(ks), "none": [], "promoted": [], "bits": bits, "promote_every": promote_steps * K_STEP}
    for K in ks:
        a, b = e4m3(rng.standard_normal((rows, K)) * 64), e4m3(rng.standard_normal(K) * 64)
        exact = a @ b
        for key, steps in (("none", None), ("promoted", promote_steps)):
            d = _cut(model_dot(a, b, bits, steps), BF16_BITS, toward_zero=False)
            out[key].append(float(np.abs(d - exact).max() / np.abs(exact).max()))
    return out


def _run(path=None) -> dict:
    return json.loads((FP8_RUN if path is None else path).read_text())


def measured_promotion(path=None) -> dict:
    """The committed K = 16384 check (1024x16384 at M = 512): our error with the promotion off and
    on, and torch._scaled_mm's, from ``fp8_check.json``'s ``promotion_k16384``."""
    promo = _run(path)["promotion_k16384"]
    return {"K": 16384, "none": promo["0"]["rel_err"], "promoted": promo["1"]["rel_err"],
            "torch": promo["1"]["torch_rel_err"]}


def plot_promotion(errors: dict, measured: dict | None = None):
    """The model's error against K, without and with the promotion, and the measured K = 16384
    points (ours both ways, torch._scaled_mm's)."""
    fig = _figure(figsize=(8, 4.2))
    ax = fig.subplots()
    ax.plot(errors["K"], errors["none"], "o-", color="tab:red", label=f"model: one chain ({errors['bits']} bits)")
    ax.plot(errors["K"], errors["promoted"], "o-", color="tab:green",
            label=f"model: promoted every {errors['promote_every']} of K")
    if measured:
        K = measured["K"]
        ax.plot([K], [measured["none"]], "X", ms=12, color="tab:red", label="H100, v9 promote=0")
        ax.plot([K], [measured["promoted"]], "X", ms=12, color="tab:green", label="H100, v9 promote=1")
        ax.plot([K], [measured["torch"]], "+", ms=14, mew=2, color="black", label="H100, torch._scaled_mm")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K")
    ax.set_ylabel("max |error| / max |D|  (D in bf16)")
    ax.set_title("fp8 accumulation: a long chain of tensor-core adds drifts; the promotion stops it")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def measured_rows(path=None) -> list[dict]:
    """The committed timed rows: recipe, shape, module, correct, TFLOPS, ratio to torch._scaled_mm
    (kernels in CUDA graphs) and to our bf16 v9 where it was timed."""
    run = _run(path)
    return [{"recipe": r["recipe"], "M": r["M"], "N": r["N"], "K": r["K"], "module": r["module"],
             "correct": r["correct"], "tflops": r["tflops"], "x_scaled_mm": r["ratio_to_scaled_mm"],
             "x_bf16": (r.get("peer_ratios") or {}).get("ours_bf16_v9")} for r in run["rows"]]


def show_measured(path=None) -> None:
    """Print :func:`measured_rows` as a table, with the run's GPU, date and commit."""
    run = _run(path)
    print(f"{run['gpu'].get('name', '?')}, {str(run['date'])[:10]}, commit {run['commit']}")
    print(f"{'recipe':6} {'M':>5} {'N':>5} {'K':>6}  {'module':22} {'correct':7} {'TFLOPS':>6} "
          f"{'x _scaled_mm':>12} {'x our bf16':>10}")
    for r in measured_rows(path):
        bf16 = f"{r['x_bf16']:.2f}" if r["x_bf16"] else ""
        print(f"{r['recipe']:6} {r['M']:5} {r['N']:5} {r['K']:6}  {r['module']:22} {str(r['correct']):7} "
              f"{r['tflops']:6.0f} {r['x_scaled_mm']:12.2f} {bf16:>10}")


def wgmma_instruction(built) -> str:
    """The PTX of the first wgmma in a built module's CUDA source, its accumulator registers
    elided: ``wgmma.mma_async...m64n128k32.f32.e4m3.e4m3 {%0, ..., %63}, %64, %65, p, 1, 1;``."""
    src = built.cuda_source()
    m = re.search(r"(wgmma\.mma_async\.[\w.]+)\s*\{([^}]*)\}([^;]*);", src)
    if m is None:
        raise LookupError("no wgmma.mma_async in this module's CUDA source")
    regs = [r.strip() for r in m.group(2).split(",")]
    return f"{m.group(1)} {{{regs[0]}, ..., {regs[-1]}}}{m.group(3)};"
