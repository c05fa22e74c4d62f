"""The shared-memory and register budget of a rung, for both archs: one formula, one check.

Every rung lays out its shared memory the same way (both ``sm90a`` and ``sm100a``)::

    [ barriers, the TMEM address slot ... padded to 1 KiB ][ A ring ][ B ring ][ D staging ]
      BARRIER_BYTES                                         stages x stage_bytes  out_bytes

The operand ring holds ``stages`` copies of an A tile (``blk_m x blk_k``) and a B tile
(``blk_n x blk_k``); the swizzled tiles must start 1 KiB aligned, which is why the barriers
take a whole KiB. The output ``D`` is staged from the TMA-store epilogue on (``epilogue_tile``):
the whole ``blk_m x blk_n`` tile, or two column chunks of it where a rung stores in chunks
(``epi_n``). A CTA pair that shares one MMA (Blackwell v8+) holds half of B per CTA. What a block may use comes from the GPU when one of the arch is
present (:func:`limits_for`, through :mod:`gemm_ladder.core.device`), else from the arch table in
:mod:`gemm_ladder.core.config`. The deepest ring (:func:`max_pipe_depth`) follows from the two.

On Hopper the fp32 accumulators live in registers: ``blk_m x blk_n / (128 x warpgroups)`` per
thread, which must leave room in the 255-register file for addresses and loop state.
"""

from __future__ import annotations

import dataclasses

from . import device
from .config import ARCHS, ArchLimits, ConfigError, GemmConfig
from .spec import operand_bytes, spec_of

BARRIER_BYTES = 1024  # barriers (and the TMEM address) padded to the 1 KiB swizzle alignment
MIN_PIPE_DEPTH = 2  # a ring: one stage loading while another is read by the tensor cores
THREADS_PER_WARPGROUP = 128
ACC_REGS_MAX = 192  # accumulator registers per thread that leave room in the 255-register file
# unroll_k (the overlapped promotion's loop over runs unrolled whole, sm90a/mainloop._run_overlapped), where ptxas and
# the instruction cache keep up (benchmarks/results/2026-11-28_h200_fp8_unroll/): two accumulator sets and the total
# at most this many registers a thread (64x112 over one consumer, 168, ran 3% faster; 64x128, 192, spilled and ran
# 4-25% slower), and at most this much of the estimated K loop (slices x (accumulators + UNROLL_SLICE_EXTRA)
# instructions a warp: 80 slices of 64x64, 6400, ran 5% faster; 112 of them, 8960, 26% slower; 128 of 64x112, 79%)
UNROLL_MAX_REGS = 168
# promoting every 2 slices or more (a group's two slices held across the unrolled loop): 64x64 over one consumer (96)
# ran unspilled and 3% faster; 128x112 over two (168) spilled 448 bytes a thread and ran at half speed (run 24)
UNROLL_MAX_REGS_PAIRS = 96
# the widths (a consumer's 64 rows) whose unrolled loop ptxas kept unspilled and ran faster: 64 and 112. 96 fits the
# registers above yet spilled 192 bytes a thread and ran 16-18% slower unrolled (run 26); 128 spilled (192 registers)
UNROLL_WIDTHS = (64, 112)
UNROLL_SLICE_EXTRA = 48
UNROLL_MAX_LOOP = 6400


def fp8_unroll_cost(blk_m: int, blk_n: int, consumers: int, K: int, blk_k: int = 128) -> tuple[int, int]:
    """(registers of two accumulator sets and the promoted total a thread, the estimated instructions
    a warp of the unrolled K loop) of an overlapped fp8 tile on Hopper: what v9's ``unroll_k`` is held
    to (:data:`UNROLL_MAX_REGS`, :data:`UNROLL_MAX_LOOP`). A consumer's m64nN wgmma keeps N / 2
    accumulators a thread a 64-row atom."""
    acc = blk_m // consumers // 64 * blk_n // 2
    return 3 * acc, -(-K // blk_k) * (acc + UNROLL_SLICE_EXTRA)


def fp8_unroll_fits(blk_m: int, blk_n: int, consumers: int, K: int, blk_k: int = 128, promote: int = 1) -> bool:
    """Whether an overlapped fp8 tile of these sizes may take v9's ``unroll_k`` (:func:`fp8_unroll_cost`;
    promoting every ``promote`` slices; a consumer's tile of 64 rows and one of :data:`UNROLL_WIDTHS`)."""
    regs, loop = fp8_unroll_cost(blk_m, blk_n, consumers, K, blk_k)
    return (blk_m == 64 * consumers and blk_n in UNROLL_WIDTHS
            and regs <= (UNROLL_MAX_REGS if promote <= 1 else UNROLL_MAX_REGS_PAIRS) and loop <= UNROLL_MAX_LOOP)


def limits_for(arch: str, index: int | None = None) -> ArchLimits:
    """Limits for ``arch``: read off CUDA device ``index`` (default 0) when it is of that arch,
    else the arch table's documented numbers (a build box without a GPU)."""
    if arch not in ARCHS:
        raise ConfigError(f"unknown arch {arch!r}: gemm-ladder has forms for {sorted(ARCHS)}")
    base = ARCHS[arch]
    gpu = device.probe(0 if index is None else index, arch=arch)
    if gpu is None:
        return base
    return dataclasses.replace(base, smem_per_block=gpu.smem_per_block_optin or base.smem_per_block,
                               sm_count=gpu.sm_count)


def stage_bytes(cfg: GemmConfig, cta_group: int = 1) -> int:
    """Bytes of one ring stage in one CTA: an A tile and a B tile of one K slice. Where a CTA
    pair shares one MMA (``cta_group=2``, Blackwell v8+), each CTA holds half of B."""
    return (cfg.blk_m + cfg.blk_n // cta_group) * cfg.blk_k * operand_bytes(spec_of(cfg))


def out_bytes(cfg: GemmConfig) -> int:
    """Bytes of the output staged in shared memory for the TMA store: the whole tile, or, for a
    rung with the ``epi_n`` knob narrower than the tile (Hopper v9), two ``blk_m x epi_n``
    column chunks in flight."""
    epi_n = cfg.knobs().get("epi_n", cfg.blk_n)
    if epi_n >= cfg.blk_n:
        return cfg.blk_m * cfg.blk_n * cfg.elem_bytes
    return 2 * cfg.blk_m * epi_n * cfg.elem_bytes


def smem_bytes(cfg: GemmConfig, stages: int, epilogue_tile: bool = True, cta_group: int = 1) -> int:
    """Shared memory of a rung with a ``stages``-deep ring (and the output, if staged)."""
    return (BARRIER_BYTES + stages * stage_bytes(cfg, cta_group)
            + (out_bytes(cfg) if epilogue_tile else 0))


def acc_regs_per_thread(cfg: GemmConfig) -> int:
    """fp32 accumulator registers each MMA thread holds when the accumulators live in registers."""
    return cfg.blk_m * cfg.blk_n // (THREADS_PER_WARPGROUP * cfg.num_warpgroups)


def check_budget(cfg: GemmConfig, smem: int, limits: ArchLimits | None = None) -> None:
    """``smem`` bytes of shared memory, and the accumulator registers, against the limits."""
    limits = limits or limits_for(cfg.arch)
    if smem > limits.smem_per_block:
        raise ConfigError(
            f"{cfg.rung} with blk_m={cfg.blk_m}, blk_n={cfg.blk_n}, pipe_depth={cfg.pipe_depth} needs "
            f"{smem} bytes of shared memory, over the {limits.smem_per_block} a block may use on "
            f"{cfg.arch}; lower pipe_depth or the tile size"
        )
    if limits.acc_in_registers:
        regs = acc_regs_per_thread(cfg)
        if regs > ACC_REGS_MAX:
            raise ConfigError(
                f"a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} warpgroup(s) needs {regs} "
                f"fp32 accumulator registers per thread, over the {ACC_REGS_MAX} that leave room in "
                f"the {limits.regs_per_thread}-register file; use a smaller tile or more warpgroups "
                "(num_warpgroups)"
            )


def max_pipe_depth(cfg: GemmConfig, smem_per_block: int | None = None, epilogue_tile: bool = True,
                   cta_group: int = 1) -> int:
    """The deepest ring that fits beside the barriers and the output tile in ``smem_per_block``
    bytes (default: what a block may use on ``cfg.arch``, device or table)."""
    if smem_per_block is None:
        smem_per_block = limits_for(cfg.arch).smem_per_block
    free = smem_per_block - smem_bytes(cfg, 0, epilogue_tile, cta_group)
    return max(free // stage_bytes(cfg, cta_group), 0)


def check_pipe_depth(cfg: GemmConfig, limits: ArchLimits | None = None, cta_group: int = 1) -> None:
    """``pipe_depth`` is an int from 2 up to what shared memory allows, and the budget holds."""
    limits = limits or limits_for(cfg.arch)
    depth = cfg.pipe_depth
    most = max_pipe_depth(cfg, limits.smem_per_block, cta_group=cta_group)
    tile = f"blk_m={cfg.blk_m}, blk_n={cfg.blk_n}"
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < MIN_PIPE_DEPTH:
        raise ConfigError(
            f"pipe_depth={depth!r}: a ring needs at least {MIN_PIPE_DEPTH} stages (one loading, one "
            f"read by the MMA); use pipe_depth={max(MIN_PIPE_DEPTH, min(4, most))}"
        )
    if most < MIN_PIPE_DEPTH:
        raise ConfigError(
            f"{tile} leaves room for {most} stage(s) of {stage_bytes(cfg, cta_group)} bytes in the "
            f"{limits.smem_per_block} bytes of shared memory a block may use on {cfg.arch}; "
            f"use a smaller tile (e.g. blk_m=128, blk_n=128)"
        )
    if depth > most:
        raise ConfigError(
            f"pipe_depth={depth} with {tile} needs {smem_bytes(cfg, depth, cta_group=cta_group)} bytes of "
            f"shared memory, over the {limits.smem_per_block} a block may use on {cfg.arch} "
            f"({stage_bytes(cfg, cta_group)} bytes per stage plus {smem_bytes(cfg, 0, cta_group=cta_group)} "
            f"for barriers and the output tile); use pipe_depth={most} or less"
        )
    check_budget(cfg, smem_bytes(cfg, depth, cta_group=cta_group), limits)
