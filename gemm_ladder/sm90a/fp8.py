"""FP8 (e4m3) on the production kernel (v9, issue 32): what changes from 16-bit operands.

    D[m, n] = round(sum_k A8[m, k] B8[n, k] * scale_a * scale_b + bias[n])      (tensor)
    D[m, n] = round(sum_k A8[m, k] B8[n, k] * scale_a[m] * scale_b[n] + bias[n]) (row)

The template (``gemm.py``) runs unchanged; the operand spec (``spec.GemmSpec.fp8``) changes four
parts of it:

- the ring holds 1-byte operands: a 128-byte swizzle row is 128 fp8, so ``blk_k`` is 128 (v9's
  ``FP8_DEFAULTS``), and a stage of a 128x128 tile is 32 KiB as for 16-bit data at blk_k = 64;
- the wgmma is ``m64nNk32.f32.e4m3.e4m3`` (``HopperPlan.mma_op``): 32 bytes of K a step as
  for 16-bit operands (the same descriptor step), and no transpose immediates: fp8 wgmma reads
  both operands K-major only;
- the promotion (knob ``promote``, slices between promotions; 0: none): Hopper's fp8 wgmma adds
  its products into the fp32 accumulators with fewer mantissa bits kept over a long K chain, so
  every ``promote`` slices the tensor cores' sums go into a second fp32 array by the CUDA cores'
  exact adds and the tensor cores start over (``mainloop.Consumer`` with ``promote``: DeepGEMM
  and CUTLASS promote every 128 of K, ``promote=1`` here). It doubles the accumulator registers:
  a 128x128 tile over two consumers (64 + 64 a thread) fits, 128x256 does not;
- the scales, fp32, applied to the sums before the epilogue op (the bias) and the rounding
  (:func:`scale_sums`): a scalar ``scale_a[0] * scale_b[0]`` (tensor), or each sum's row of
  ``scale_a`` and column of ``scale_b`` (row). The row is why it is a step of its own and not an
  ``epilogue.EpilogueOp``: an op sees a fragment's column only.

Constraints (:func:`check`): blk_k = 128, K a multiple of 16 (TMA's 16-byte strides), no
``epi_under`` and no ``tail_n`` yet, the accumulators (twice, with promotion) within the
consumer's registers.
"""

from __future__ import annotations

from tvm.script import tirx as T

import layouts
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from .common import WG_M, HopperPlan, role_registers

PROMOTE_DEFAULT = 1  # slices of blk_k = 128 between promotions: every 128 of K, as DeepGEMM and CUTLASS
LOOP_REGS = 40  # registers a consumer keeps for addresses and loop state (common.check_consumer_registers)


def enabled(cfg: GemmConfig) -> bool:
    """Whether ``cfg``'s operand spec is an fp8 GEMM."""
    return spec_of(cfg).is_fp8


def promote(cfg: GemmConfig) -> int:
    """Slices between promotions (0: none, or not fp8)."""
    return int(dict(cfg.extra).get("promote", 0)) if enabled(cfg) else 0


def recipe(cfg: GemmConfig) -> str:
    """The scale recipe, ``tensor`` or ``row`` (the spec's ``scales``)."""
    return spec_of(cfg).scales


def scale_regs(plan: HopperPlan) -> int:
    """Registers :func:`scale_sums` holds a thread's scales in: its two rows of every 64-row atom
    (row recipe), or the one product (tensor)."""
    return 2 * plan.m_atoms


def check(cfg: GemmConfig) -> None:
    """What v9 builds with an fp8 spec (see the module docstring), before anything compiles."""
    if not enabled(cfg):
        return
    extra = dict(cfg.extra)
    every = extra.get("promote", 0)
    if every < 0:
        raise ConfigError(f"promote={every}: the slices between promotions are 0 (none) or more; use "
                          f"promote={PROMOTE_DEFAULT} (every {cfg.blk_k} of K)")
    if extra.get("epi_under"):
        raise ConfigError("epi_under=True is not built for fp8 yet (the scales and the promotion run before the "
                          "epilogue); use epi_under=False")
    if extra.get("tail_n"):
        raise ConfigError("tail_n is not built for fp8 yet (the narrow tiles' epilogue has no scales); use tail_n=0")
    if cfg.K % 16:
        raise ConfigError(f"K={cfg.K}: fp8 rows of A and B must be a multiple of 16 bytes for TMA; pad K to "
                          f"{-(-cfg.K // 16) * 16} with zeros")
    regs = role_registers(cfg.num_warpgroups)
    budget = regs.consumer or regs.entry
    acc = HopperPlan(cfg).acc_regs
    need = acc * (2 if every else 1) + LOOP_REGS
    if need > budget:
        raise ConfigError(
            f"fp8 with promote={every} holds {acc} tensor-core accumulators"
            + (f" and {acc} promoted sums" if every else "")
            + f" a thread for a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer(s), {need} "
            f"registers with addresses and loop state, over the {budget} a consumer may hold; use blk_n=128 "
            "(blk_m=128, two consumers)" + (", or promote=0" if every else ""))


@T.inline
def scale_sums(plan, sums, scale_a, scale_b, how, m0, n0, warp_id, lane_id, sreg):
    """Multiply a consumer's fp32 sums of the tile at rows ``m0`` (its first row) and columns
    ``n0`` by the scales, in place: ``scale_a[0] * scale_b[0]`` (``how == "tensor"``), or
    ``scale_a[row] * scale_b[col]`` at each sum's place in the m64nN fragment (``row``); rows and
    columns past M and N read the last scale (the stores clip them). ``sreg``: float32 locals
    (:func:`scale_regs`)."""
    NR = T.meta_var(plan.acc_stride)
    if how == "tensor":
        sreg[0] = scale_a[0] * scale_b[0]
        for r in T.unroll(plan.acc_regs):
            sums[r] = sums[r] * sreg[0]
    else:
        for mi in T.unroll(plan.m_atoms):
            for h in T.unroll(2):
                # this thread's rows of atom mi: 16 w + lane / 4, and 8 below
                sreg[2 * mi + h] = scale_a[T.min(m0 + mi * WG_M + warp_id * 16 + lane_id // 4 + 8 * h,
                                                 scale_a.shape[0] - 1)]
        for r in T.unroll(plan.acc_regs):
            col = T.meta_var(n0 + layouts.acc_fragment_coord(r % NR, 0, lane_id)[1])
            sums[r] = sums[r] * sreg[2 * (r // NR) + (r % 4) // 2] * scale_b[T.min(col, scale_b.shape[0] - 1)]
