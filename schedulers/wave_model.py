"""Tiles, split-K units and waves: a time model that says which tile and ``split_k`` finish a
shape first on a persistent grid (pure Python, no TVM).

A persistent GEMM (Hopper v6-v11) runs ``ctas`` CTAs, one per SM; each walks its share of the
work units in turn. A unit is an output tile (``blk_m x blk_n``) or, with split-K (v10, v11),
one of its ``split_k`` K ranges. ``ceil(units / ctas)`` waves: the busiest CTA runs that many
units, and the kernel lasts as long as it does, or as long as DRAM takes to deliver A and B,
whichever is longer::

    time = max(waves x unit time, DRAM bytes / HBM bandwidth) + launch

    unit time = max(MMA time, stream time) + fill
      MMA time     2 x blk_m x blk_n x k_len / (the SM's share of the tensor cores' rate)
      stream time  (blk_m + blk_n) x k_len x 2 bytes / the SM's read rate, which is the lesser
                   of its L2 port and what its ring keeps in flight over the memory latency
                   (pipe_depth x stage bytes / latency)
      fill         the ring's first load and the epilogue (+ the partial tile written and read
                   back through L2 when split_k > 1)

Why split-K wins for a small-M, weight-streaming shape (M = 16, N = K = 4096, 16x128 tiles of
swap AB): 32 tiles on 132 SMs. With split_k = 1, 32 SMs each stream a 1 MiB panel of B at the
rate their rings allow (about 100 GB/s each: 3.2 TB/s would need every SM), so the kernel is
bound by those 32 SMs (``bound="sm_stream"``); with split_k = 4, 128 units on 128 SMs stream a
quarter each and the kernel is bound by DRAM (``bound="dram"``), at the cost of 128 partial
tiles (16 x 128 x 4 B each) through L2. Why it loses for a big square: 8192^3 in 128x256 tiles
is 2048 tiles, 15.5 waves; split_k = 2 makes 31 waves of half-length units plus a partial tile
each: the same waves of work, more fill and partial traffic.

``fill`` (units / (waves x ctas)) is the share of the SMs' time slots with work: the wave
quantization that ``plan.makespan`` of the front door also counts.

Which rung for which shape class (Hopper; what the front door's rules in ``gemm_ladder.serve.plan``
build on, ``rank`` choosing the tile and split_k among those the rung takes)::

    M <= 64, large N (decode)        v11 swap AB: blk_m = swap_blk_m(M) (8..64), blk_n 256 or 128,
                                     the deepest ring up to 8, split_k = best_split_k (about 3-4
                                     at N = 4096, 1 from N = 28672 on)
    all M <= 64 with one module      v11 dynamic_m=True, blk_m=64, knobs as for M = 64
    64 < M <= 256, under a wave      v11 with blk_m = swap_blk_m(M, 256) (one tile of M), or v10
    M > 256, under ~2 waves of       v10 split-K, 128x256 or 128x128, split_k 2-4
      128x256 tiles
    the rest                         v9 (dynamic_m=True for one module over a range of M)

The constants are an H100 SXM's (:data:`H100`; 132 SMs, ~3.0 TB/s copy bandwidth, ~700 TFLOPS
fp16 dense achieved), rough by design: the model ranks choices and explains them; it does not
predict microseconds. ``tests/test_sm90a_small_m.py`` checks the rankings it gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

BLK_K = 64


@dataclass(frozen=True)
class GPUModel:
    """What the model knows of a GPU (:data:`H100`; ``replace(H100, sms=...)`` for another)."""

    sms: int = 132
    hbm_bytes_per_s: float = 3.0e12  # what a copy reaches (read + write)
    mma_flops_per_s: float = 700e12  # dense fp16/bf16 with fp32 accumulation, achieved
    sm_l2_bytes_per_s: float = 110e9  # one SM's read port from L2 (64 B a clock)
    latency_s: float = 2.0e-6  # DRAM latency under load: what a ring must cover
    fill_s: float = 0.8e-6  # a unit's first load and its epilogue
    launch_s: float = 3e-6


H100 = GPUModel()


@dataclass(frozen=True)
class WavePlan:
    """The modelled run of one (tile, split_k) choice."""

    M: int
    N: int
    K: int
    blk_m: int
    blk_n: int
    split_k: int
    tiles: int
    units: int
    ctas: int
    waves: int
    fill: float  # units / (waves * ctas)
    k_slices: int  # the longest unit's K slices
    dram_bytes: int  # A and B once, D written once
    partial_bytes: int  # fp32 partials written and read back (split_k > 1)
    unit_s: float
    time_s: float
    bound: str  # "dram", "sm_stream" (the busiest SMs' read rate), "mma" or "launch"

    @property
    def tflops(self) -> float:
        return 2 * self.M * self.N * self.K / self.time_s / 1e12

    @property
    def gbps(self) -> float:
        return self.dram_bytes / self.time_s / 1e9

    def why(self) -> str:
        return (f"{self.blk_m}x{self.blk_n} split_k={self.split_k}: {self.tiles} tiles -> {self.units} units on "
                f"{self.ctas} SMs = {self.waves} wave(s) ({self.fill:.0%} of the slots busy), {self.k_slices} K "
                f"slices per unit; bound by {self.bound}, ~{self.time_s * 1e6:.1f} us")


def plan(M: int, N: int, K: int, blk_m: int, blk_n: int, split_k: int = 1, pipe_depth: int = 4,
         gpu: GPUModel = H100, dtype_bytes: int = 2) -> WavePlan:
    """Model one choice: ``blk_m x blk_n`` tiles (as the kernel pads them: a swap-AB rung's
    blk_m may be 8), ``split_k`` units per tile, a ``pipe_depth``-stage ring."""
    for name, v in (("M", M), ("N", N), ("K", K), ("blk_m", blk_m), ("blk_n", blk_n), ("split_k", split_k),
                    ("pipe_depth", pipe_depth)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    tiles = math.ceil(M / blk_m) * math.ceil(N / blk_n)
    units = tiles * split_k
    ctas = gpu.sms
    waves = math.ceil(units / ctas)
    k_slices = math.ceil(math.ceil(K / BLK_K) / split_k)
    k_len = k_slices * BLK_K

    stage_bytes = (blk_m + blk_n) * BLK_K * dtype_bytes
    in_flight_rate = pipe_depth * stage_bytes / gpu.latency_s
    # one SM reads no faster than its L2 port or than its ring's bytes in flight allow; what the
    # SMs read together from DRAM is bounded below, by dram_s
    sm_rate = min(gpu.sm_l2_bytes_per_s, in_flight_rate)
    stream_s = (blk_m + blk_n) * k_len * dtype_bytes / sm_rate
    mma_s = 2 * blk_m * blk_n * k_len / (gpu.mma_flops_per_s / ctas)
    partial = blk_m * blk_n * 4 if split_k > 1 else 0  # one fp32 tile out, and the last one reads them
    fill_s = gpu.fill_s + 2 * partial / gpu.sm_l2_bytes_per_s
    unit_s = max(mma_s, stream_s) + fill_s

    dram_bytes = (M * K + N * K + M * N) * dtype_bytes
    dram_s = dram_bytes / gpu.hbm_bytes_per_s
    busy_s = waves * unit_s
    time_s = max(busy_s, dram_s) + gpu.launch_s
    if max(busy_s, dram_s) < gpu.launch_s:
        bound = "launch"
    elif dram_s >= busy_s:
        bound = "dram"
    else:
        bound = "mma" if mma_s >= stream_s else "sm_stream"
    return WavePlan(M, N, K, blk_m, blk_n, split_k, tiles, units, ctas, waves, units / (waves * ctas), k_slices,
                    dram_bytes, units * partial * 2, unit_s, time_s, bound)


def rank(M: int, N: int, K: int, tiles, split_ks=(1, 2, 3, 4, 6, 8), pipe_depth: int = 4,
         gpu: GPUModel = H100, dtype_bytes: int = 2) -> list[WavePlan]:
    """Every (tile, split_k) of ``tiles`` x ``split_ks`` that the K loop allows (each unit at least
    one slice), fastest modelled first; ties go to fewer units (less partial traffic)."""
    k_tiles = math.ceil(K / BLK_K)
    plans = [plan(M, N, K, bm, bn, s, pipe_depth, gpu, dtype_bytes)
             for bm, bn in tiles for s in split_ks if s <= k_tiles]
    return sorted(plans, key=lambda p: (round(p.time_s, 9), p.units, -p.blk_m * p.blk_n))


def best_split_k(M: int, N: int, K: int, blk_m: int, blk_n: int, split_ks=(1, 2, 3, 4, 6, 8),
                 pipe_depth: int = 4, gpu: GPUModel = H100) -> WavePlan:
    """The split_k the model picks for one tile shape."""
    return rank(M, N, K, [(blk_m, blk_n)], split_ks, pipe_depth, gpu)[0]


def swap_blk_m(M: int, most: int = 64) -> int:
    """The swap-AB tile height for ``M`` rows: M rounded up to a multiple of 8 (wgmma's N), at
    most ``most`` (a larger M takes several tiles)."""
    return min(most, -(-M // 8) * 8)


def with_sms(gpu: GPUModel, sms: int) -> GPUModel:
    return replace(gpu, sms=sms)
