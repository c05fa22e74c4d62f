"""Tutorial 14 (the fused epilogue): the bytes a fused epilogue saves, a time model of what that is
worth, its picture, and the lines of generated CUDA where the epilogue runs.

The model counts each tensor once per kernel that touches it (what a kernel reads or writes in
HBM when its tiles stay in L2): a GEMM reads A and B and writes D; an elementwise kernel after
it reads its inputs and writes its output. Time is ``max(bytes / bandwidth, FLOPs / MMA rate)``
per kernel at :data:`schedulers.wave_model.H100`'s rates (rough by design: it explains the
measured ratios, it does not predict microseconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schedulers import wave_model

from .built import _kernel_body
from .plots import _figure

# the epilogues the tutorial compares, as the committed runs name them
OPS = ("bias_act", "residual", "fp32_out", "swiglu")


@dataclass(frozen=True)
class Kernel:
    """One kernel of a path: its name, the HBM bytes it moves, its FLOPs."""

    name: str
    bytes: int
    flops: int = 0

    def seconds(self, gpu=wave_model.H100) -> float:
        return max(self.bytes / gpu.hbm_bytes_per_s, self.flops / gpu.mma_flops_per_s)


def paths(op: str, M: int, N: int, K: int, elem: int = 2) -> dict[str, list[Kernel]]:
    """The kernels of the fused path (``"fused"``) and of torch's unfused one (``"unfused"``) for
    epilogue ``op`` (one of :data:`OPS`) at D = [M, N], K deep, 16-bit operands of ``elem`` bytes.

    ``bias_act``: ``act(x . W^T + b)``; unfused, ``F.linear`` then the activation, which reads D
    and writes it again. ``residual``: ``x . W^T + C``; unfused, ``F.linear`` then the add (D and
    C read, the sum written). ``fp32_out``: D in fp32; unfused, ``F.linear`` in 16 bits then
    ``.float()``. ``swiglu``: ``silu(x . Wg^T) * (x . Wu^T)`` with Wg, Wu [N, K] each; unfused,
    Hugging Face's two linears, ``silu`` and the product.
    """
    if op not in OPS:
        raise ValueError(f"op {op!r} is not modelled; use one of {OPS}")
    for name, v in (("M", M), ("N", N), ("K", K), ("elem", elem)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    a, b, d, flops = M * K * elem, N * K * elem, M * N * elem, 2 * M * N * K
    if op == "bias_act":
        fused = [Kernel("GEMM + bias + act", a + b + N * elem + d, flops)]
        unfused = [Kernel("F.linear (bias in cuBLAS)", a + b + N * elem + d, flops), Kernel("activation", 2 * d)]
    elif op == "residual":
        fused = [Kernel("GEMM + C", a + b + d + d, flops)]
        unfused = [Kernel("F.linear", a + b + d, flops), Kernel("+ C", 3 * d)]
    elif op == "fp32_out":
        fused = [Kernel("GEMM, fp32 D", a + b + 2 * d, flops)]
        unfused = [Kernel("F.linear", a + b + d, flops), Kernel(".float()", d + 2 * d)]
    else:  # swiglu: B is cat([Wg, Wu]), 2N rows; D has N columns
        fused = [Kernel("GEMM, silu(gate) * up", a + 2 * b + d, 2 * flops)]
        unfused = [Kernel("x . Wg^T", a + b + d, flops), Kernel("x . Wu^T", a + b + d, flops),
                   Kernel("silu", 2 * d), Kernel("* up", 3 * d)]
    return {"fused": fused, "unfused": unfused}


def model_rows(shapes, ops=OPS, elem: int = 2, gpu=wave_model.H100) -> list[dict]:
    """Per (op, shape): the bytes of each path, the bytes fusing saves, and the modelled ratio
    unfused time / fused time."""
    rows = []
    for op in ops:
        for M, N, K in shapes:
            p = paths(op, M, N, K, elem)
            fused_b, unfused_b = (sum(k.bytes for k in p[w]) for w in ("fused", "unfused"))
            fused_s, unfused_s = (sum(k.seconds(gpu) for k in p[w]) for w in ("fused", "unfused"))
            rows.append({"op": op, "M": M, "N": N, "K": K, "fused MB": round(fused_b / 1e6, 1),
                         "unfused MB": round(unfused_b / 1e6, 1), "saved MB": round((unfused_b - fused_b) / 1e6, 1),
                         "kernels": f"{len(p['unfused'])} -> 1", "model ratio": round(unfused_s / fused_s, 3)})
    return rows


# a committed epilogue run's ops (benchmarks/epilogue_check.py) -> the modelled op and the key of the
# kernel-level ratio against torch's unfused path
MEASURED = {"residual": ("residual", "kernel_ratio_unfused"),
            "fp32_out": ("fp32_out", "kernel_ratio_linear_then_float"),
            "swiglu": ("swiglu", "kernel_ratio_two_linears")}


def measured_vs_model(rows, gpu=wave_model.H100) -> list[dict]:
    """The rows of a committed epilogue run (``committed_run(...).rows``) beside the model: the
    modelled ratio to the unfused path, the measured one, and the measured ratio to torch's best
    path (``kernel_ratio``: cuBLAS's own fused epilogue where torch has one). A SwiGLU row's N is
    the fused weight's rows (gate and up): D has half."""
    out = []
    for r in rows:
        if r.get("op") not in MEASURED or r.get(MEASURED[r["op"]][1]) is None:
            continue
        op, key = MEASURED[r["op"]]
        n = r["N"] // 2 if op == "swiglu" else r["N"]
        p = paths(op, r["M"], n, r["K"])
        model = sum(k.seconds(gpu) for k in p["unfused"]) / sum(k.seconds(gpu) for k in p["fused"])
        out.append({"op": r["op"], "M": r["M"], "N": r["N"], "K": r["K"], "model x unfused": f"{model:.3f}",
                    "measured x unfused": f"{r[key]:.3f}", "measured x torch's best": f"{r['kernel_ratio']:.3f}"})
    return out


def activation_rows(rows, gpu=wave_model.H100) -> list[dict]:
    """The rows of the committed bias + activation bench (``python -m gemm_ladder bench``: each
    module against torch's path named in its ``cublas_path``, ``addmm then <act>``, queued calls)
    beside the model's ratio for ``bias_act``; the plain module's row is against ``F.linear``."""
    out = []
    for r in rows:
        M, N, K = r["shape"]
        path = r.get("cublas_path", "F.linear")
        act = re.search(r"then (\w+)", path)
        p = paths("bias_act", M, N, K)
        model = sum(k.seconds(gpu) for k in p["unfused"]) / sum(k.seconds(gpu) for k in p["fused"])
        out.append({"epilogue": f"bias + {act.group(1)}" if act else "none", "shape": f"{M}x{N}x{K}",
                    "dtype": r["dtype"], "ours ms": f"{r['ms']:.3f}",
                    "torch's path": path.replace(" (torch's unfused path)", ""),
                    "measured": f"{r['ratio_to_cublas']:.3f}", "model": f"{model:.3f}" if act else ""})
    return out


def plot_epilogue_bytes(M: int, N: int, K: int, elem: int = 2, gpu=wave_model.H100):
    """Bytes moved in HBM per path (left) and modelled time per kernel (right), for each op at one
    shape: the unfused paths' extra kernels are the round trips the fused epilogue saves."""
    import matplotlib  # pylint: disable=import-outside-toplevel  # optional: only to draw

    colors = matplotlib.colormaps["tab10"]
    fig = _figure(figsize=(12, 4.2))
    ax_b, ax_t = fig.subplots(1, 2)
    all_paths = {op: paths(op, M, N, K, elem) for op in OPS}
    widest = {ax: max(sum(measure(k) for k in ks) for p in all_paths.values() for ks in p.values())
              for ax, measure in ((ax_b, lambda k: k.bytes / 1e6), (ax_t, lambda k: k.seconds(gpu) * 1e6))}
    labels, y = [], 0
    for op in OPS:
        for way in ("unfused", "fused"):
            left = {ax_b: 0.0, ax_t: 0.0}
            for i, k in enumerate(all_paths[op][way]):
                for ax, width in ((ax_b, k.bytes / 1e6), (ax_t, k.seconds(gpu) * 1e6)):
                    ax.barh(y, width, left=left[ax], color=colors(0 if k.flops else 1 + i), edgecolor="black", lw=0.5)
                    if width > 0.15 * widest[ax]:
                        ax.text(left[ax] + width / 2, y, k.name, ha="center", va="center", fontsize=6)
                    left[ax] += width
            labels.append(f"{op} {way}")
            y += 1
        y += 0.5
    ticks = [i + 0.5 * (i // 2) for i in range(len(labels))]
    for ax, xlabel in ((ax_b, "MB moved in HBM"), (ax_t, f"modelled us ({gpu.hbm_bytes_per_s / 1e12:.1f} TB/s, "
                                                          f"{gpu.mma_flops_per_s / 1e12:.0f} TFLOPS)")):
        ax.set_yticks(ticks)
        ax.set_yticklabels(labels if ax is ax_b else [], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
    ax_b.set_title(f"D = [{M}, {N}], K = {K}: the first kernel of each path is the GEMM", fontsize=9)
    ax_t.set_title("the extra kernels are memory-bound: bytes / bandwidth", fontsize=9)
    return fig


# TVM's exact float literal with its decimal value as a comment (the sign, if any, is in both)
_HEX_FLOAT = re.compile(r"(?<![\w.])-?0x[0-9a-fA-F.]+p[-+]?\d+f/\*([^*]+)\*/")


def readable(line: str) -> str:
    """A generated CUDA line with TVM's exact float literals (``0x1p-1f/*5.000000e-01*/``) shown as
    their decimal comments (``5.000000e-01f``)."""
    return _HEX_FLOAT.sub(lambda m: m.group(1).strip() + "f", line)


def epilogue_lines(built, what: str = "activation") -> list[tuple[int, str]]:
    """The lines of a built module's kernel where the epilogue works on its first accumulator pair,
    as (line number, readable text): what each accumulator becomes before it is rounded (``what``
    = ``"activation"``: the bias add into ``pre_act`` and the activation around it; ``"residual"``:
    the ``ldmatrix`` of C and the sum; ``"gated"``: gate times up) up to its ``stmatrix``, then the
    fence and the chunk's TMA store. Raises LookupError when the module has no such epilogue."""
    lines, offset = _kernel_body(built.cuda_source())
    start = {"activation": r"float pre_act\b", "residual": r"ldmatrix", "gated": r"cvt_\w+\(packed_ptr\[0\]"}
    if what not in start:
        raise ValueError(f"what={what!r}; use one of {sorted(start)}")
    first = next((i for i, s in enumerate(lines) if re.search(start[what], s)), None)
    if first is None:
        raise LookupError(f"{built.cfg.rung} {built.cfg.M}x{built.cfg.N}x{built.cfg.K} has no {what} epilogue "
                          f"(no line matches {start[what]!r}): build it with spec=spec_for(dtype, ...) naming one")
    start = first
    first = next(i for i in range(start, len(lines)) if "cvt_" in lines[i])  # the first rounding
    # back to what feeds it: the bias adds, the wait for C's chunk; the index arithmetic (cse_v) left out
    feeds = re.compile(r"^\s*(float pre_act|int cse_v|ushort v_|tvm_builtin_cuda_mbarrier_wait)")
    while start > 0 and feeds.search(lines[start - 1]):
        start -= 1
    picked = [i for i in range(start, first + 1) if not re.search(r"^\s*int cse_v", lines[i])]
    # then, in order: the stores into the staging buffer, the fence that hands them to the async
    # proxy, the consumer's barrier, and the TMA store of the chunk
    at = first
    for pattern in (r"stmatrix", r"fence_proxy", r"bar_sync", r"cp_async_bulk_tensor"):
        at = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        if at is None:
            raise LookupError(f"the {what} epilogue of {built.cfg.rung} has no {pattern!r} line after its rounding")
        picked.append(at)
    return [(i + offset + 1, readable(lines[i].strip())) for i in sorted(set(picked))]


def show_epilogue(built, what: str = "activation", width: int = 220) -> None:
    """Print :func:`epilogue_lines`, long lines cut at ``width`` characters."""
    prev = None
    for n, text in epilogue_lines(built, what):
        if prev is not None and n > prev + 1:
            print("   ...")
        print(f"{n:5d}  {text if len(text) <= width else text[:width - 5] + ' ...)'}")
        prev = n
