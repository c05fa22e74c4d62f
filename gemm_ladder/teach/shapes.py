"""Pictures and tables of tutorial 11 (every shape): tiles and waves per shape, why small M is
bound by reading the weights, the swap-AB and split-K pictures, and the front door's policy over
the shape suite. The numbers come from the models (``gemm_ladder.serve.plan``, ``schedulers.wave_model``);
nothing here is measured."""

from __future__ import annotations

import contextlib
import io

from schedulers import wave_model

from ..measure import isolate
from ..serve import plan
from ..serve.front import matmul
from .plots import _figure, _rect


def wave_rows(shapes, sms: int = 132, tiles=((128, 256), (128, 128), (64, 128))) -> list[dict]:
    """Per shape: tiles, waves and the share of SM slots with work, for each tile shape."""
    rows = []
    for M, N, K in shapes:
        p = plan.Problem(M, N, K, sms=sms)
        row = {"shape": f"{M}x{N}x{K}"}
        for bm, bn in tiles:
            t, w = p.tiles(bm, bn), p.waves(bm, bn)
            row[f"{bm}x{bn}"] = f"{t} tiles, {w} wave{'s' * (w > 1)}, {t / (w * sms):.0%} busy"
        rows.append(row)
    return rows


def plot_fill(shapes, sms: int = 132, tile=(128, 256)):
    """The share of SM slots with work per shape (wave quantization), for one tile shape."""
    fig = _figure(figsize=(11, 3.6))
    ax = fig.subplots()
    labels, fills = [], []
    for M, N, K in shapes:
        p = plan.Problem(M, N, K, sms=sms)
        labels.append(f"{M}x{N}x{K}")
        fills.append(p.tiles(*tile) / (p.waves(*tile) * sms))
    ax.bar(range(len(fills)), fills, color=["tab:red" if f < 0.5 else "tab:orange" if f < 0.85 else "tab:green"
                                          for f in fills])
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("SM slots with work")
    ax.set_title(f"{tile[0]}x{tile[1]} tiles on {sms} SMs: tiles / (waves x SMs)", fontsize=10)
    return fig


def plot_weight_streaming(N: int = 4096, K: int = 4096, Ms=(1, 4, 16, 64, 128, 256, 512, 1024, 4096, 8192),
                          gpu=wave_model.H100):
    """The least time a GEMM can take, from bytes (A, B, D once at the copy bandwidth) and from
    FLOPs (at the tensor cores' rate): below the crossing M, reading B is the whole cost."""
    fig = _figure(figsize=(10, 3.8))
    ax, bx = fig.subplots(1, 2)
    mem = [(M * K + N * K + M * N) * 2 / gpu.hbm_bytes_per_s * 1e6 for M in Ms]
    mma = [2 * M * N * K / gpu.mma_flops_per_s * 1e6 for M in Ms]
    ax.loglog(Ms, mem, "o-", label="bytes / HBM bandwidth")
    ax.loglog(Ms, mma, "s-", label="FLOPs / tensor-core rate")
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("least time (us)")
    ax.set_title(f"N = {N}, K = {K}: memory-bound below M ~ {gpu.mma_flops_per_s / gpu.hbm_bytes_per_s:.0f}",
                 fontsize=9)
    ax.legend(fontsize=8)
    share = [N * K / (M * K + N * K + M * N) for M in Ms]
    bx.semilogx(Ms, share, "o-", color="tab:purple")
    bx.set_ylim(0, 1.05)
    bx.set_xlabel("M (tokens)")
    bx.set_ylabel("share of the bytes that are B")
    bx.set_title("what a small-M GEMM reads: the weights", fontsize=9)
    return fig


def plot_swap_ab(M: int = 16, N_tile: int = 128, atom: int = 64):
    """One output tile's MMA as wgmma sees it: A's slot is always 64 rows. Left, v9/v10: M fills
    it (M real rows, the rest zero padding); right, v11: the tile of B (N rows) fills it and M
    becomes wgmma's N (a multiple of 8)."""
    fig = _figure(figsize=(11, 4.2))
    for ax, title, rows, cols, real_rows, real_cols in (
        (fig.add_subplot(1, 2, 1), f"v9/v10: D tile = A_tile . B_tile^T  (wgmma m64n{N_tile})", atom, N_tile, M, N_tile),
        (fig.add_subplot(1, 2, 2), f"v11 swap AB: D^T tile = B_tile . A_tile^T  (wgmma m64n{-(-M // 8) * 8})",
         atom, -(-M // 8) * 8, atom, M),
    ):
        _rect(ax, 0, 0, cols, rows, facecolor="0.92", edgecolor="black")
        _rect(ax, 0, rows - real_rows, real_cols, real_rows, facecolor="tab:blue", alpha=0.6)
        useful = real_rows * real_cols / (rows * cols)
        ax.text(0.5, 0.04, f"{useful:.0%} of the MMA's work is real rows", ha="center", fontsize=9,
                transform=ax.transAxes)
        ax.set_xlim(-4, max(N_tile, atom) + 4)
        ax.set_ylim(-12, atom + 6)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("wgmma N (columns of the accumulator)")
        ax.set_ylabel("wgmma M: the 64-row slot")
    fig.suptitle(f"M = {M} tokens: the blue part is real, the grey is zero padding", fontsize=10)
    return fig


def plot_split_k(M: int = 16, N: int = 4096, K: int = 4096, blk_m: int = 16, blk_n: int = 128, split_k: int = 4,
                 sms: int = 132):
    """Which SM runs what: one unit per output tile (left) against ``split_k`` units per tile, each a
    K range of it (right); one column per SM, one row per wave."""
    fig = _figure(figsize=(12, 3.4))
    gpu = wave_model.with_sms(wave_model.H100, sms)
    for i, s in enumerate((1, split_k)):
        ax = fig.add_subplot(1, 2, i + 1)
        p = wave_model.plan(M, N, K, blk_m, blk_n, s, gpu=gpu)
        for u in range(p.units):
            tile, part = divmod(u, s)
            w, sm = divmod(u, sms)
            color = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                     "tab:olive")[part % 8]
            _rect(ax, sm, -w - 1, 1, 1, facecolor=color, edgecolor="white", linewidth=0.2)
        ax.set_xlim(0, sms)
        ax.set_ylim(-max(p.waves, 1) - 0.5, 0.5)
        ax.set_xlabel("SM")
        ax.set_yticks([])
        ax.set_title(f"split_k={s}: {p.units} units, {p.waves} wave(s), {p.fill:.0%} busy, "
                     f"~{p.time_s * 1e6:.0f} us ({p.bound})", fontsize=9)
    fig.suptitle(f"{M}x{N}x{K} in {blk_m}x{blk_n} tiles on {sms} SMs (colour: the K range of a tile)", fontsize=10)
    return fig


def policy_rows(shapes, dtype: str = "float16", sms: int = 132) -> list[dict]:
    """What the front door's policy (``plan.choose``) picks for each shape, and by which rule."""
    rows = []
    for M, N, K in shapes:
        c = plan.choose(plan.Problem(M, N, K, dtype, "sm_90a", sms))
        knobs = {k: v for k, v in c.knobs.items() if k not in ("dtype", "arch")}
        rows.append({"shape": f"{M}x{N}x{K}", "rung": c.rung, "rule": c.rule if c.source == "rule" else "database",
                     "knobs": ", ".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "defaults",
                     "intensity": f"{2 * M * N * K / ((M * K + N * K + M * N) * 2):.0f} flop/B"})
    return rows


def explain_job(item: str, args) -> dict:  # pylint: disable=unused-argument
    """A child's job (``gemm_ladder.measure.isolate``): run the front door once with ``explain=True``."""
    import torch  # pylint: disable=import-outside-toplevel

    shape, _, dtype = item.partition(":")
    M, N, K = (int(x) for x in shape.split("x"))
    A = torch.randn(M, K, device="cuda").to(getattr(torch, dtype))
    B = torch.randn(N, K, device="cuda").to(getattr(torch, dtype))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        matmul(A, B, explain=True)
    return {"status": "ok", "text": err.getvalue()}


def explain_on_gpu(M: int, N: int, K: int, dtype: str = "float16", timeout: float = 300.0) -> str:
    """What ``gemm_ladder.matmul(..., explain=True)`` prints for this shape, run in a child process."""

    res = isolate.run_isolated("gemm_ladder.teach.shapes:explain_job", f"{M}x{N}x{K}:{dtype}", timeout=timeout)
    return res.get("text") or f"{res['status']}: {res.get('detail', '')}"
