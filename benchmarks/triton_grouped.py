"""A Triton grouped GEMM for mixture-of-experts, the Triton peer of issue 33's suite
(``benchmarks/grouped_suite.py``): D[offs[e-1]:offs[e]] = A[offs[e-1]:offs[e]] @ W[e]^T for every
expert e, with ``torch._grouped_mm``'s contiguous layout (A [tokens, K] sorted by expert, W [E, N, K],
``offs`` int32 cumulative row counts, on the GPU).

Why our own: the issue asks for "Triton's grouped GEMM" as a peer, and the GPU box has Triton but
no MoE library, so this is the kernel a Triton user would write for that layout. It was written for
this suite after reading the public Triton grouped-GEMM tutorial and MoE kernels (learned from, not
copied): unlike the tutorial's (a host-side array of per-group pointers and sizes), it reads
``offs`` on the device, so it needs no host synchronisation and replays in a CUDA graph under a
changing routing, as ours and ``torch._grouped_mm`` do.

How it works: one persistent launch of ``PROGS_PER_SM`` x SMs programs. The work is the list of
(expert, tile) pairs, expert by expert, each expert's tiles ``m_tiles x n_tiles`` with the m-tile
fastest (neighbouring programs share a W n-tile: the weight read once from HBM, the rest from L2).
Each program reads ``offs`` once, as a vector of all experts, and scans it (``tl.cumsum``) into
the index of every expert's first tile and the total; it then takes the tiles ``t = pid, pid +
programs, ...`` and finds a tile's expert by counting the experts whose tiles all come before it
(a vector compare and sum, no serial walk of the experts: 256 dependent loads of ``offs`` would
cost a decode-size launch tens of microseconds). No atomics, no host tables, an empty expert owns
no tile. Rows are clamped into the expert (duplicate loads, not masks, on the last m-tile; the
store is masked), N and K past the weight's edge are masked or clamped. Accumulation in fp32
(``tl.dot``: wgmma on sm_90 for 64- and 128-row tiles), D in A's dtype.

Autotuned (a few tiles and ring depths) per (N, K, E, token bucket): the bucket is the power of two
of the rows of A, read from the tensor's shape on the host, so routing changes never retune and the
tuning never syncs on ``offs``. The tuning benchmarks briefly (``_quick_bench``) to keep a suite
of many shapes inside its time budget.

Constraints: fp16 or bf16, E up to a few thousand (the scan holds every expert in registers), A and W with a unit stride in K, offs int32 of E values (non-decreasing,
the last at most the rows of A: rows past it are not written), CUDA only.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16)


def _config(block_m: int, block_n: int, block_k: int, stages: int, warps: int, progs_per_sm: int = 1):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "PROGS_PER_SM": progs_per_sm},
                         num_stages=stages, num_warps=warps)


# large tiles for experts of many rows (MMA-bound prefill), 128x128 and 64-row tiles for the middle,
# 32-row tiles with two programs an SM for decode (few rows an expert: weight streaming)
CONFIGS = [
    _config(128, 256, 64, 3, 8),
    _config(128, 128, 64, 4, 8),
    _config(64, 128, 64, 4, 4, 2),  # 96 KiB of ring (3 buffers): two an SM
    _config(64, 256, 64, 3, 8),
    _config(32, 128, 128, 3, 4, 2),  # 80 KiB of ring: two programs fit an SM's 228 KiB
]


TUNE_WARMUP_MS, TUNE_REP_MS = 10, 50


def _quick_bench(fn, quantiles=None, **_):
    """The autotuner's timer, shorter than Triton's default (25 ms warm-up, 100 ms of runs a
    config): the suite tunes dozens of keys. Not much shorter: at 15 ms a 4 ms kernel got three
    runs, and Triton's time at DeepSeek-V3-like 32768 Zipf moved from 1.11x to 0.85x ours between
    two H100 runs, likely a different pick (``benchmarks/results/2026-11-26_h100_grouped_suite``)."""
    return triton.testing.do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)


def chosen_config() -> str | None:
    """The autotuner's pick at the last call (for the results), or None before any."""
    best = getattr(_grouped_kernel, "best_config", None)
    return str(best) if best is not None else None


def token_bucket(rows: int) -> int:
    """The autotune key's token bucket: the power of two at or above ``rows`` (at least 16)."""
    return max(16, triton.next_power_of_2(max(int(rows), 1)))


# the autotuner takes a timer from Triton 3.3 on; before, its warm-up and repetitions in ms
_QUICK = ({"do_bench": _quick_bench} if "do_bench" in inspect.signature(triton.autotune).parameters
          else {"warmup": TUNE_WARMUP_MS, "rep": TUNE_REP_MS})


@triton.autotune(configs=CONFIGS, key=["N", "K", "E", "M_BUCKET"], **_QUICK)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _grouped_kernel(g_a, g_w, g_d, g_offs, N, K, E, M_BUCKET, stride_am, stride_we, stride_wn, stride_dm,
                    SMS: tl.constexpr, PROGS_PER_SM: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    progs = SMS * PROGS_PER_SM
    n_tiles = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    # the routing, read once: every expert's rows and the index of its first tile, by a scan
    r_e = tl.arange(0, E_POW2)
    e_ok = r_e < E
    row_end = tl.load(g_offs + r_e, mask=e_ok, other=0)
    row_begin = tl.load(g_offs + r_e - 1, mask=e_ok & (r_e > 0), other=0)
    rows_e = tl.where(e_ok, row_end - row_begin, 0)
    tiles_e = tl.cdiv(rows_e, BLOCK_M) * n_tiles
    tile_end = tl.cumsum(tiles_e, 0)
    tile_begin = tile_end - tiles_e
    total = tl.sum(tiles_e, 0)
    r_m = tl.arange(0, BLOCK_M)
    r_n = tl.arange(0, BLOCK_N)
    r_k = tl.arange(0, BLOCK_K)
    for t in range(pid, total, progs):
        # the tile's expert: how many experts' tiles all come before t (empty experts included)
        e = tl.sum((tile_end <= t).to(tl.int32), 0)
        mine = r_e == e
        first_tile = tl.sum(tl.where(mine, tile_begin, 0), 0)
        row_start = tl.sum(tl.where(mine, row_begin, 0), 0)
        rows = tl.sum(tl.where(mine, rows_e, 0), 0)
        m_tiles = tl.cdiv(rows, BLOCK_M)
        local = t - first_tile
        tile_m = local % m_tiles  # m fastest: neighbouring programs share the W tile
        tile_n = local // m_tiles
        rows_in = tile_m * BLOCK_M + r_m
        a_rows = row_start + tl.minimum(rows_in, rows - 1)  # clamped: the last m-tile loads, then drops, copies
        cols = tile_n * BLOCK_N + r_n
        w_rows = tl.minimum(cols, N - 1)
        g_w_e = g_w + e.to(tl.int64) * stride_we  # 256 experts of 2048x7168 pass 2^31 elements
        p_a = g_a + a_rows.to(tl.int64)[:, None] * stride_am + r_k[None, :]
        p_w = g_w_e + w_rows.to(tl.int64)[None, :] * stride_wn + r_k[:, None]  # [BLOCK_K, BLOCK_N]: W^T
        r_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ks in range(0, k_steps):
            if EVEN_K:
                r_a = tl.load(p_a)
                r_w = tl.load(p_w)
            else:
                k_ok = ks * BLOCK_K + r_k < K
                r_a = tl.load(p_a, mask=k_ok[None, :], other=0.0)
                r_w = tl.load(p_w, mask=k_ok[:, None], other=0.0)
            r_acc = tl.dot(r_a, r_w, r_acc)
            p_a += BLOCK_K
            p_w += BLOCK_K
        d_rows = (row_start + rows_in).to(tl.int64)
        p_d = g_d + d_rows[:, None] * stride_dm + cols[None, :]
        tl.store(p_d, r_acc.to(g_d.dtype.element_ty), mask=(rows_in < rows)[:, None] & (cols < N)[None, :])


def check_operands(A, W, offs, out=None) -> None:
    """A ValueError naming the first operand this kernel does not take, and what would work."""
    if A.dim() != 2 or W.dim() != 3:
        raise ValueError(f"A {tuple(A.shape)}, W {tuple(W.shape)}: the contiguous layout takes A [tokens, K] and "
                         "W [E, N, K]")
    E, N, K = W.shape
    if A.shape[1] != K:
        raise ValueError(f"A has K={A.shape[1]}, W [E, N, K] has K={K}: they must agree")
    if A.dtype != W.dtype or A.dtype not in DTYPES:
        raise ValueError(f"A {A.dtype}, W {W.dtype}: both float16 or both bfloat16")
    if A.stride(1) != 1 or W.stride(2) != 1:
        raise ValueError(f"A strides {A.stride()}, W strides {W.stride()}: K must be the unit stride "
                         "(call .contiguous())")
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.numel() != E:
        raise ValueError(f"offs {offs.dtype} {tuple(offs.shape)}: one int32 per expert ({E}), the cumulative "
                         "row counts")
    if not (A.is_cuda and W.is_cuda and offs.is_cuda):
        raise ValueError("A, W and offs must be on the GPU (offs is read by the kernel: no host sync)")
    if out is not None and (tuple(out.shape) != (A.shape[0], N) or out.dtype != A.dtype or out.stride(1) != 1):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype}: want ({A.shape[0]}, {N}) {A.dtype} with unit stride in N")


def grouped_mm(A, W, offs, out=None):
    """D [tokens, N] (``out`` if given: rows past ``offs[-1]`` are left as they were); see the module
    docstring. Validates first (:func:`check_operands`); one launch, capturable in a CUDA graph."""
    check_operands(A, W, offs, out)
    E, N, K = W.shape
    D = out if out is not None else torch.empty(A.shape[0], N, device=A.device, dtype=A.dtype)
    sms = torch.cuda.get_device_properties(A.device).multi_processor_count

    def grid(meta):
        return (sms * meta["PROGS_PER_SM"],)

    _grouped_kernel[grid](A, W, D, offs, N, K, E, token_bucket(A.shape[0]), A.stride(0), W.stride(0), W.stride(1),
                          D.stride(0), SMS=sms, E_POW2=max(2, triton.next_power_of_2(E)))
    return D
