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
- where the promotion's time goes (``benchmarks/results/2026-11-26_h100_fp8_sweep/``: 128x128 ran
  1249 TFLOPS without it, 913 with it every slice; 1132 once the total was added in place,
  ``mainloop._zero_total``, and 1190 with ``overlap=4``, at 4096^3): a group's sums can be read
  only once its wgmmas retired (``wait_group(0)``), so the consumer's tensor-core queue drains before
  its adds, and both consumers drain at the same slices. Two knobs attack that, the old path kept:
  ``overlap`` (groups per drain, 0: off) issues the groups into two accumulator sets in turn, each
  group's adds after ``wait_group(1)`` while the next group's wgmmas run, and drains once a run of
  ``overlap`` groups (three sets of sums a thread: 128x128 over two consumers only; a run carried
  over the loop's back edge made ptxas serialise every wgmma, and runs longer than
  :data:`OVERLAP_MOST` spilled); ``stagger`` cuts the odd consumers' groups (or runs) half a group
  later, so their drains fall between the even consumers' and one consumer's queue keeps the tensor
  cores busy while the other drains and adds; ``unroll_k`` unrolls the loop over runs over the whole
  tile where it fits (:func:`unroll_k`), and the K loop moves each wgmma's descriptors by a 32-bit add
  (``common.desc_plus``): the 64-row tiles' issue cost a slice, not their data, held them back
  (``benchmarks/results/2026-11-28_h200_fp8_unroll/``);
- the scales, fp32, applied to the sums before the epilogue op (the bias) and the rounding
  (:func:`scale_sums`): a scalar ``scale_a[0] * scale_b[0]`` (tensor), or each sum's row of
  ``scale_a`` and column of ``scale_b`` (row). The row is why it is a step of its own and not an
  ``epilogue.EpilogueOp``: an op sees a fragment's column only;
- block-wise scales (DeepSeek-V3's recipe, ``block``): A's in 1x128 groups along K (one a row and
  128 of K, stored M-major: ``scale_a[kb, m]``), B's in 128x128 blocks (``scale_b[nb, kb]``). A
  scale changes every 128 of K, so it cannot wait for the epilogue: it is applied at the
  promotion, which runs every slice (``promote=1``, ``blk_k=128``: a slice is one K block)::

      total[r] += acc[r] * (scale_a[kb, row(r)] * scale_b[(n0 + col(r)) / 128, kb])

  (:class:`BlockScales`; one FFMA a sum a slice where the other recipes add). A thread's scales of
  a slice are its two rows of each 64-row atom and the tile's one B block (two at blk_n = 256): a
  few floats, loaded from global memory (L2: the scales of a 4096x16384 A are 2 MiB, read by the
  N tiles of a row) one slice ahead, into the other of two register sets (the K loop runs two
  slices a turn): K block g + 1's load before slice g's wgmmas are issued and are read at slice
  g + 1's promotion, so the load's latency hides under a slice's wgmmas with no register move to
  wait on it; not staged through shared memory by the producer's TMA (DeepGEMM's way), which
  would add a TMA box and bytes to every stage and its barrier for three floats a thread. No
  scale in the epilogue (a bias still is). With ``overlap`` (even), a run's slices alternate
  between two accumulator sets and their scales between the two register sets with them (slice j's
  sums and scales in set j % 2, ``mainloop._block_groups``): each slice's scaled adds run under the
  next slice's wgmmas, the total is added in place from 0, and a K block's scales load two slices
  before the promotion that reads them (after the promotion of the slice before, whose set they take).
  Measured (``benchmarks/results/2026-11-26_h100_fp8_block_overlap/``): +11-18% over the drained
  promotion, 0.87-0.94x ``torch._scaled_mm`` block-wise and 0.86-0.89x our per-tensor kernel at
  M >= 4096. ptxas sinks the read-only scale loads to just before their FFMAs (the promotion waits on
  L2); plain ``ld.global`` loads kept a slice ahead measured 1-7% slower (the slot release after them
  waits for them). The knob ``stage_scales`` (:class:`StagedScales`, off: the source above unchanged)
  stages them instead, DeepGEMM's way: with each ring stage's A and B tiles the producer's TMA copies
  that K block's ``blk_m`` A scales (one box of the flat ``scale_a``: any M) and each B block's scale
  (a 16-byte box of the flat ``scale_b``), counted in the stage's full barrier; each consumer reads
  its slice's scales from shared memory after the full-barrier wait it already does
  (``mainloop._block_groups_staged``), so no global load is left on its path (with ``overlap``;
  in halves, ``mainloop._run_block_halves_staged``).
  The first version died on the GPU (H100, 2026-11-26, ``benchmarks/results/2026-11-26_h100_fp8_block_staged/``):
  every staged module hit "an illegal instruction", though the CPU checks (SASS, barrier checker)
  passed. The cause: its 1-D boxes started at any float (A's at ``kb * M + m_st``, B's at
  ``nb * K/128 + kb``), and Hopper refuses a TMA copy whose innermost start is not 16-byte aligned,
  at run time only (shown by ``benchmarks/fp8_block_bisect.py``'s probes). Every box now starts
  16-byte aligned (:class:`StagedScales`), which ``tests/test_tma_box_starts.py`` proves for every
  copy on the CPU. Measured (``benchmarks/results/2026-11-26_h100_fp8_block_staged_fix/``): 32 of 32
  checks right (M = 1, 333 and the shapes'), +6.5-10.6% over the overlapped promotion alone past
  M = 128 (1060-1111 TFLOPS, 0.95-0.98x ``torch._scaled_mm`` block-wise) and +12.4% at M = 128
  (1.31x it); the block policy (``plan.FP8_RULES``) stages them. Off by default in v9's own knobs.
  The knob ``stage_bulk`` (with ``stage_scales``; :func:`_stage_scales_bulk`) copies the same boxes
  by plain ``cp.async.bulk`` (no tensor map: 4.4% faster than the tensor copies in the probe run),
  each guarded by its exact bound, the tensor copy where a box would run past the scale tensor.

- the promotion in halves (knob ``halves``, :class:`HalfPlan`): with the promotion a 128x256 tile
  over two consumers needs 128 tensor-core sums and 128 promoted sums a thread, over the 232 a
  consumer may hold. In halves each promotion group's wgmmas are issued as two ``m64n128k32``
  groups (the tile's first and last 128 columns, the second from a descriptor 128 B rows further)
  into one 64-register set; each half is drained and added into its half of the total (a
  fragment's register ``r`` holds column ``8 (r // 4) + ..``, so half h's are the total's
  ``h * 64 ..``) before the other is issued, and a slot goes back once its second half's
  wgmmas retired (``mainloop._halves_group``): 128 + 64 registers, half the operand traffic a
  product of 128x128. While one consumer drains and adds, the other's wgmmas keep the tensor cores
  busy. Block scales take each half's own B block at its adds (:meth:`BlockScales.promote_half`).
  Measured (``benchmarks/results/2026-11-27_h100_fp8_halves/``): promoted every 2 slices,
  1.03-1.05x ``torch._scaled_mm`` at 4096^3 (128x128 with ``overlap=4``: 0.93-0.995x), 2-4% below
  the same tile unpromoted; every slice 3-4% slower, every 4 slices 0.70x (a group then holds all
  four ring stages through both halves, and the producer waits).

- the epilogue under the next tile (v9's ``epi_under``; ``mainloop.Consumer.run_under``): once a
  tile's K loop ends its promoted sums are scaled and rounded into 16-bit pairs
  (``epilogue.acc_to_pairs``, 64 registers a thread at 128x256), the total starts over at 0, and the
  tile's chunks leave while the next tile's first promotion group runs: with ``halves``, each half's
  columns after that half's wgmmas are issued and before they are drained. The first group's sums are
  added into the zeroed total as any group's (a copy into the total made ptxas 13.0 serialise every
  wgmma, too few registers for its pipeline), and storing straight from the total, with no pairs,
  spilled at 128x256 (the whole total live beside the accumulators and the stores: 0.6x).
  Measured (``benchmarks/results/2026-11-27_h100_fp8_under/``, four runs): +1.0-1.6% at 4096^3 in
  halves (1.027-1.089x ``torch._scaled_mm`` on three H100s), -0.3 to +2.3% for the 192x128 tiles at 8192^3.
  Block scales in halves peel their K loop's first pair of slices (``mainloop._run_block_halves``):
  1124-1179 TFLOPS, +3.7-7.9% over 128x128 with ``overlap=4`` and staged scales. With ``stage_scales``
  (``mainloop._run_block_halves_staged``: each slice's scales read from its ring slot under half 0's
  wgmmas into one register set, the first slice peeled for the epilogue; a three-stage ring, as four
  stages, the staging and the scales' rows pass a block's shared memory), 1118-1219 TFLOPS, 1.006-1.050x
  ``torch._scaled_mm`` block-wise, +0.8-4.9% over the unstaged four-stage ring
  (``benchmarks/results/2026-11-27_h100_fp8_block_staged_halves/``).

- on v10, a split K or stream-K (:func:`check_split`): each unit (or stream-K piece) runs v9's promoted
  K loop over its share of the slices, its fp32 total is its partials (``splitk.Partials``), and the last
  unit (or piece) adds them up and applies the scales once before the epilogue; per-tensor and rowwise
  scales only (block scales apply by K block at each promotion), no bias yet. A split that does not divide
  the slices, and stream-K's pieces, give a unit a count known only at run time: the promotion every
  slice takes it (``mainloop._run_promoted_each``), a longer interval needs a fixed count. At M = 256
  (``benchmarks/results/2026-11-27_h100_fp8_split/``): two ways +23-25% where 128x128 fills at most half
  the SMs, slower past it; three ways where that takes fewer waves, and the small-M tiles split the same
  way (``benchmarks/results/2026-11-27_h100_fp8_subwave/``: 64x2112x7168 0.60x -> 0.83x
  ``torch._scaled_mm``); the policy's ``fp8-split-k``. Stream-K measured slower than whole tiles there.

Constraints (:func:`check`): blk_k = 128, K a multiple of 16 (TMA's 16-byte strides), no
``tail_n`` yet; ``epi_under`` needs a promotion in one accumulator set (no ``overlap``, no
``stagger``), block scales only in halves, and with ``halves`` chunks within a half; the accumulators (twice with promotion, three times with
``overlap``, one and a half with ``halves``) within the consumer's registers; ``overlap``,
``stagger`` and ``halves`` need a promotion (and ``stagger`` two consumers, groups or runs of two
or more, and no block scales; ``halves`` no ``overlap``, and with block scales blk_n = 256, a B
block a half); block scales also need ``promote=1``, no ``k_zigzag`` (the slices must land in K
order), a blk_n that is a multiple or a divisor of 128 (a tile in whole B blocks) and an even
``overlap`` (a run ends on the scale set it began with); ``stage_scales`` needs block scales and
``overlap`` or ``halves``; ``stage_bulk`` needs ``stage_scales``. ``halves`` is built on v9's own K loop only (no
swap AB, no split K: ``gemm.kernel`` refuses it there).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

import layouts
from ..core.budget import (UNROLL_MAX_LOOP, UNROLL_MAX_REGS, UNROLL_MAX_REGS_PAIRS, UNROLL_WIDTHS, fp8_unroll_cost,
                           limits_for, smem_bytes)
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from .common import WG_M, HopperPlan, consumer_warpgroups, role_registers

BLOCK = 128  # the block recipe's groups: A's 1 x 128 of K, B's 128 x 128
PROMOTE_DEFAULT = 1  # slices of blk_k = 128 between promotions: every 128 of K, as DeepGEMM and CUTLASS
OVERLAP_DEFAULT = 0  # promotion groups issued back to back in two accumulator sets (0: one set, the adds after a drain)
# promote -> the longest run (overlap) whose SASS has no spills and no serialised wgmmas at 128x128 (ptxas 13.0;
# tests/test_fp8_overlap.py): 4 x 3 slices spilled 350 registers and waited after every wgmma, 4 x 2 spilled 40
OVERLAP_MOST = {1: 8, 2: 2}
# registers a consumer keeps for addresses and loop state beside its sums (common.check_consumer_registers):
# ptxas 13.0 fits a 192x128 tile over three consumers with the promotion (64 accumulators and 64 promoted
# sums a thread) in their 152 without spills (tests/test_fp8_overlap.py), which 40 refused
LOOP_REGS = 24


def enabled(cfg: GemmConfig) -> bool:
    """Whether ``cfg``'s operand spec is an fp8 GEMM."""
    return spec_of(cfg).is_fp8


def promote(cfg: GemmConfig) -> int:
    """Slices between promotions (0: none, or not fp8)."""
    return int(dict(cfg.extra).get("promote", 0)) if enabled(cfg) else 0


def overlap(cfg: GemmConfig) -> int:
    """Promotion groups a consumer issues between two drains of its wgmmas, in two accumulator
    sets taken in turn (0: one set, each group drained before its adds; ``mainloop._overlapped_groups``)."""
    return int(dict(cfg.extra).get("overlap", 0)) if enabled(cfg) and promote(cfg) else 0


def unroll_k(cfg: GemmConfig) -> bool:
    """Whether the overlapped promotion's loop over runs is unrolled over the whole tile (knob
    ``unroll_k``, ``budget.fp8_unroll_fits``)."""
    return bool(dict(cfg.extra).get("unroll_k", False)) and overlap(cfg) > 0


def _check_unroll(cfg: GemmConfig) -> None:
    """``unroll_k`` unrolls the overlapped promotion's loop over runs (per-tensor and row scales,
    ``overlap`` > 0) where its registers and code stay within what was measured to pay
    (``budget.fp8_unroll_fits``): with the loop gone nvcc keeps the ring's slot and descriptor arithmetic in
    uniform registers, where the 64-row tiles' loop kept it in vector ones and moved it over for
    every wgmma."""
    if not dict(cfg.extra).get("unroll_k", False):
        return
    if not enabled(cfg) or not overlap(cfg):
        raise ConfigError("unroll_k=True unrolls fp8's overlapped promotion (promote >= 1 and overlap >= 2); use "
                          "overlap=4 with an fp8 spec, or drop unroll_k")
    if recipe(cfg) == "block" or halves(cfg) or stagger(cfg):
        raise ConfigError("unroll_k=True is built for the per-tensor and rowwise overlapped promotion only (not "
                          "block scales, halves or stagger); drop unroll_k")
    extra = dict(cfg.extra)
    slices, split = -(-cfg.K // cfg.blk_k), extra.get("split_k", 1)
    if extra.get("stream_k", False) or slices % split:
        fits = [s for s in range(1, min(slices, 8) + 1) if slices % s == 0]
        raise ConfigError(f"unroll_k=True with split_k={split}" + (" and stream_k=True" if extra.get("stream_k") else "")
                          + f": a unit's count of slices is known only at run time (K={cfg.K} is {slices} slices), "
                          f"and only a fixed count unrolls; use split_k in {fits}, or drop unroll_k")
    if cfg.blk_m != WG_M * cfg.num_warpgroups or cfg.blk_n not in UNROLL_WIDTHS:
        raise ConfigError(f"unroll_k=True with a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer(s): "
                          f"built for 64 rows a consumer and blk_n in {list(UNROLL_WIDTHS)}, the widths whose unrolled "
                          "loop ptxas kept unspilled (128x96 spilled and ran 16-18% slower); use one of them, or drop "
                          "unroll_k")
    regs, loop = fp8_unroll_cost(cfg.blk_m, cfg.blk_n, cfg.num_warpgroups, slices // split * cfg.blk_k, cfg.blk_k)
    most = UNROLL_MAX_REGS if promote(cfg) <= 1 else UNROLL_MAX_REGS_PAIRS
    if regs > most:
        raise ConfigError(f"unroll_k=True with a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer(s)"
                          + (f" and promote={promote(cfg)}" if promote(cfg) > 1 else "") + ": two accumulator sets "
                          f"and the total take {regs} registers a thread, over the {most} where the unrolled loop "
                          "stays unspilled; use " + ("promote=1, or a 64x64 tile over one consumer" if promote(cfg) > 1
                                                     else "blk_n <= 112 per 64 rows a consumer") + ", or drop unroll_k")
    if loop > UNROLL_MAX_LOOP:
        raise ConfigError(f"unroll_k=True at K={cfg.K}" + (f" split {split} ways" if split > 1 else "")
                          + f": the unrolled K loop comes to about {loop} instructions a "
                          f"warp, over the {UNROLL_MAX_LOOP} the instruction cache kept up with; drop unroll_k "
                          "(the loop over runs is kept)")


def stagger(cfg: GemmConfig) -> bool:
    """Whether odd consumers cut their promotion groups half a group (or run) after even ones
    (``mainloop._run_staggered``), so that the consumers do not drain the tensor cores together."""
    return bool(dict(cfg.extra).get("stagger", False)) if enabled(cfg) and promote(cfg) else False


def halves(cfg: GemmConfig) -> bool:
    """Whether the consumers issue each promotion group as two half-width wgmma groups into one
    half-size accumulator set (knob ``halves``, :class:`HalfPlan`), each half promoted into its
    half of the total before the other is issued: a 128x256 tile's promotion in 128 + 64
    registers a thread where two full sets would take 256."""
    return bool(dict(cfg.extra).get("halves", False)) if enabled(cfg) and promote(cfg) else False


@dataclass(frozen=True)
class HalfPlan(HopperPlan):
    """The wgmma of one half of a tile's columns (knob ``halves``): ``m64n{blk_n/2}k32`` into
    ``blk_n / 4`` accumulators a thread an atom. Half ``h``'s sums are the fragment of columns
    ``h * blk_n/2 ..`` of the whole tile's, so they add into the total's registers
    ``h * blk_n/4 ..`` of each atom (a fragment's register ``r`` holds column ``8 (r // 4) + ..``);
    its B rows start ``b_offset16`` 16-byte units into the ring slot."""

    @property
    def n_regs(self) -> int:
        return self.cfg.blk_n // 4

    @property
    def n_cols(self) -> int:
        return self.cfg.blk_n // 2

    @property
    def b_offset16(self) -> int:
        """16-byte units from a slot's B tile to its row ``blk_n / 2`` (the second half's)."""
        return self.desc_b.offset16(rows=self.cfg.blk_n // 2)


def staged(cfg: GemmConfig) -> bool:
    """Whether the producer stages each K block's scales in shared memory with its A and B tiles
    (knob ``stage_scales``, block scales only: :class:`StagedScales`) instead of every consumer
    thread loading them from global memory."""
    return bool(dict(cfg.extra).get("stage_scales", False)) if at_promotion(cfg) else False


def stage_bulk(cfg: GemmConfig) -> bool:
    """Whether the staged scales come by plain bulk copies (knob ``stage_bulk`` with
    ``stage_scales``: no tensor map; :func:`_stage_scales_bulk`) rather than 1-D TMA tensor copies."""
    return staged(cfg) and bool(dict(cfg.extra).get("stage_bulk", False))


def bulk_split(cfg: GemmConfig) -> bool:
    """Whether :func:`_stage_scales_bulk` copies A's box as its first ``blk_m`` floats and the 4 after
    them (knob ``stage_bulk_split``, a probe: the 528-byte bulk copies ran 9% slower than the tensor
    copies on the H100 where the probe's 512-byte ones had run 4.4% faster)."""
    return stage_bulk(cfg) and bool(dict(cfg.extra).get("stage_bulk_split", False))


def recipe(cfg: GemmConfig) -> str:
    """The scale recipe, ``tensor``, ``row`` or ``block`` (the spec's ``scales``)."""
    return spec_of(cfg).scales


def at_promotion(cfg: GemmConfig) -> bool:
    """Whether the scales are applied at the promotion (block) rather than in the epilogue."""
    return enabled(cfg) and recipe(cfg) == "block"


def b_blocks(plan: HopperPlan) -> int:
    """B's 128-column scale blocks one tile spans (a tile of blk_n <= 128 lies in one)."""
    return max(1, plan.cfg.blk_n // BLOCK)


def scale_regs(plan: HopperPlan) -> int:
    """Registers a thread holds its scales in: its two rows of every 64-row atom (row recipe, or
    the one product: tensor); block: those rows and the tile's B blocks, two sets (one read while
    the next slice's load into the other)."""
    if at_promotion(plan.cfg):
        return 2 * BlockScales.per_slice(plan)
    return 2 * plan.m_atoms


def check(cfg: GemmConfig, plan: HopperPlan | None = None) -> None:
    """What v9 builds with an fp8 spec (see the module docstring), before anything compiles; ``plan``: the rung's
    tile plan where it is not v9's (v11's swapped tile), whose accumulators the register budget counts."""
    if dict(cfg.extra).get("stage_bulk", False) and not enabled(cfg):
        raise ConfigError("stage_bulk=True with a 16-bit spec: it copies fp8 block scales (with stage_scales=True); "
                          "drop stage_bulk")
    if dict(cfg.extra).get("halves", False) and not enabled(cfg):
        raise ConfigError("halves=True with a 16-bit spec: it splits fp8's promotion groups (a 16-bit tile has no "
                          "promotion); drop halves")
    _check_unroll(cfg)
    if not enabled(cfg):
        return
    extra = dict(cfg.extra)
    _check_staged(cfg)
    every = extra.get("promote", 0)
    if every < 0:
        raise ConfigError(f"promote={every}: the slices between promotions are 0 (none) or more; use "
                          f"promote={PROMOTE_DEFAULT} (every {cfg.blk_k} of K)")
    _check_under(cfg)
    if extra.get("tail_n"):
        raise ConfigError("tail_n is not built for fp8 yet (the narrow tiles' epilogue has no scales); use tail_n=0")
    if cfg.K % 16:
        raise ConfigError(f"K={cfg.K}: fp8 rows of A and B must be a multiple of 16 bytes for TMA; pad K to "
                          f"{-(-cfg.K // 16) * 16} with zeros")
    if recipe(cfg) == "block":
        _check_block(cfg, every)
    runs = extra.get("overlap", 0)
    _check_overlap(cfg, every, runs)
    _check_stagger(cfg, every, runs)
    _check_halves(cfg, every, runs)
    regs = role_registers(consumer_warpgroups(cfg))
    budget = regs.consumer or regs.entry
    acc = (plan or HopperPlan(cfg)).acc_regs  # the rung's own tile (v11's swapped: blk_m / 2 an atom)
    if halves(cfg):
        need = acc + acc // 2 + LOOP_REGS
        if need > budget:
            raise ConfigError(f"halves=True holds {acc} promoted sums and {acc // 2} tensor-core accumulators a "
                              f"thread for a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer(s), "
                              f"{need} registers with addresses and loop state, over the {budget} a consumer may "
                              "hold; use blk_n=256 with blk_m=128 and two consumers")
        return
    sets = 2 if runs else 1  # tensor-core accumulator sets
    need = acc * (sets + (1 if every else 0)) + LOOP_REGS
    if need > budget:
        raise ConfigError(
            f"fp8 with promote={every}" + (f", overlap={runs}" if runs else "") + f" holds {acc * sets} tensor-core "
            "accumulators" + (" (two sets)" if runs else "") + (f" and {acc} promoted sums" if every else "")
            + f" a thread for a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} consumer(s), {need} "
            f"registers with addresses and loop state, over the {budget} a consumer may hold; use "
            + ("overlap=0, or blk_n=128 (blk_m=128, two consumers)" if runs else
               "blk_n=128 (blk_m=128, two consumers)" + (", or promote=0" if every else "")))


def check_split(cfg: GemmConfig, plan: HopperPlan | None = None) -> None:
    """v10's fp8 (split-K and stream-K): :func:`check`, then what they do not build. Each unit's (or
    piece's) promoted fp32 sums are the partials the last one adds up before the scales and the
    epilogue, so the scales must be applied once, after the sum: per-tensor and rowwise only (block
    scales apply at each promotion, by K block from the tile's first). A unit whose count of slices is
    known only at run time (stream-K's pieces, a split that does not divide the slices) needs the
    promotion every slice (``mainloop._run_promoted_each``). ``plan``: as :func:`check`'s."""
    if not spec_of(cfg).is_fp8:
        return
    check(cfg, plan)
    if recipe(cfg) == "block":
        raise ConfigError(f"{cfg.rung} with block scales: a split K's units and stream-K's pieces start past the "
                          "tile's first K block, and block scales are applied by K block at each promotion; use "
                          "per-tensor or rowwise scales (block scales: v9)")
    if spec_of(cfg).bias is not None:
        raise ConfigError(f"{cfg.rung} fp8 with a bias: not built on the split K yet; use v9 for a biased fp8 GEMM")
    slices, split = -(-cfg.K // cfg.blk_k), dict(cfg.extra).get("split_k", 1)
    every = promote(cfg)
    if every > 1 and dict(cfg.extra).get("stream_k", False):
        raise ConfigError(f"{cfg.rung} fp8 with stream_k=True and promote={every}: a stream-K piece's slices are "
                          "counted at run time, and only the promotion every slice takes such a count; use promote=1")
    if every > 1 and slices % split:
        fits = [s for s in range(1, min(slices, 8) + 1) if slices % s == 0]
        raise ConfigError(f"{cfg.rung} fp8 with split_k={split}, K={cfg.K} and promote={every}: an uneven split "
                          f"counts a unit's slices at run time, and only the promotion every slice takes such a "
                          f"count; use promote=1, or split_k in {fits} (dividing the {slices} slices of {cfg.blk_k})")


def _check_under(cfg: GemmConfig) -> None:
    """``epi_under`` with fp8 stores the previous tile under the next tile's first promotion group
    (``mainloop.Consumer.run_under``): it needs the total (a promotion) in one accumulator set, the
    consumers' groups in step, block scales only in halves (their K loop peels its first pair of
    slices), and with ``halves`` a tile's chunks in two equal halves."""
    extra = dict(cfg.extra)
    if not extra.get("epi_under"):
        return
    fix = ("use epi_under=True with promote >= 1, overlap=0, stagger=False (block scales: halves=True), or "
           "epi_under=False")
    if cfg.rung != "v9":
        raise ConfigError(f"epi_under=True is not built for fp8 on {cfg.rung} (v9's promoted K loop stores the "
                          "previous tile under its first group; this rung's loop would store 16-bit pairs of "
                          "sums it has not promoted); use epi_under=False")
    if not extra.get("promote", 0):
        raise ConfigError(f"epi_under=True with fp8 and promote=0: the previous tile is stored while the next tile's "
                          f"first promotion group runs; {fix}")
    if extra.get("overlap", 0) or extra.get("stagger", False):
        raise ConfigError(f"epi_under=True with overlap={extra.get('overlap', 0)}, stagger="
                          f"{extra.get('stagger', False)}: built for one accumulator set with the consumers' groups "
                          f"in step; {fix}")
    if recipe(cfg) == "block" and not extra.get("halves", False):
        raise ConfigError(f"epi_under=True with block scales is built in halves only (halves=True, blk_n=256: "
                          f"the promotion every slice in one accumulator set); {fix}")
    if extra.get("halves", False) and (cfg.blk_n // 2) % extra.get("epi_n", cfg.blk_n):
        raise ConfigError(f"epi_under=True with halves and epi_n={extra.get('epi_n')}: each half of the tile "
                          f"({cfg.blk_n // 2} columns) leaves under its own wgmmas in whole chunks; use epi_n=64")


def _check_halves(cfg: GemmConfig, every: int, runs: int) -> None:
    """``halves`` splits each promotion group's wgmmas into two half-width groups with one
    accumulator set between them: it needs a promotion and no second set (``overlap``), and with block scales each half one B block (blk_n = 256). Every blk_n v9 takes (64-256) halves
    into whole 8-column wgmmas with a multiple of 4 accumulators a thread."""
    if not dict(cfg.extra).get("halves", False):
        return
    fix = "use halves=True with promote=1, overlap=0 and blk_n=256, or halves=False"
    if not every:
        raise ConfigError(f"halves=True with promote=0: the halves are promoted one after the other, and without "
                          f"a promotion there is nothing to add them into; {fix}")
    if runs:
        raise ConfigError(f"halves=True with overlap={runs}: the halves take turns in one accumulator set, built "
                          f"without a second set; {fix}")
    if recipe(cfg) == "block" and cfg.blk_n != 2 * BLOCK:
        raise ConfigError(f"halves=True with block scales and blk_n={cfg.blk_n}: each half takes one B block's "
                          f"scale at its promotion, so a half must be one {BLOCK}-column block; {fix}")


def _check_stagger(cfg: GemmConfig, every: int, runs: int) -> None:
    """``stagger`` offsets the odd consumers' groups by half a group (or half a run): there must be
    two consumers and a half to offset by."""
    if not dict(cfg.extra).get("stagger"):
        return
    fix = "use stagger=False, or promote=4 (or overlap=4) with two consumers"
    if cfg.num_warpgroups < 2:
        raise ConfigError(f"stagger=True with num_warpgroups={cfg.num_warpgroups}: it offsets one consumer's "
                          f"promotions against another's; {fix}")
    if (every if not runs else runs) < 2:
        raise ConfigError(f"stagger=True with promote={every}, overlap={runs}: a drain every slice has no half "
                          f"to offset by; {fix}")
    if recipe(cfg) == "block":
        raise ConfigError(f"stagger=True is not built for block scales (one slice a promotion); {fix}")


def _check_overlap(cfg: GemmConfig, every: int, runs) -> None:
    """``overlap`` alternates two accumulator sets between promotions: it needs a promotion, and
    block scales (applied as each K block is added, from registers loaded a slice ahead) are not built
    with it yet."""
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 0 or runs == 1:
        raise ConfigError(f"overlap={runs!r}: the promotion groups issued between two drains are 0 (off) or 2 and "
                          "more (two accumulator sets taken in turn); use overlap=4")
    if runs and not every:
        raise ConfigError(f"overlap={runs} with promote=0: there is no promotion to overlap; use promote=1, or "
                          "overlap=0")
    most = OVERLAP_MOST.get(every, 0)
    if runs > most:
        raise ConfigError(
            f"overlap={runs} with promote={every}: ptxas keeps two accumulator sets and the total in registers "
            f"for runs of up to {max(OVERLAP_MOST.values())} one-slice groups or {OVERLAP_MOST[2]} groups of two "
            "slices (longer runs spilled, or serialised the wgmmas); use overlap=4 with promote=1, or overlap=2 "
            "with promote=2")
    if runs % 2 and recipe(cfg) == "block":
        raise ConfigError(f"overlap={runs} with block scales: a K block's scales take the register set of its "
                          "sums' accumulator set, alternating by slice, so a run must end on the set it began with "
                          "(an even number of groups); use overlap=4, or overlap=2")


def _check_staged(cfg: GemmConfig) -> None:
    """``stage_scales`` stages block scales (they change every K block) in the ring, read by the
    overlapped promotion (:func:`mainloop._block_groups_staged`) or the promotion in halves
    (:func:`mainloop._run_block_halves_staged`): block scales with ``overlap`` or ``halves`` only."""
    want = dict(cfg.extra).get("stage_scales", False)
    if not isinstance(want, bool):
        raise ConfigError(f"stage_scales={want!r}: it is True (the producer's TMA stages A's and B's block scales "
                          "with each ring stage) or False; use stage_scales=True")
    if dict(cfg.extra).get("stage_bulk_split", False) and not dict(cfg.extra).get("stage_bulk", False):
        raise ConfigError("stage_bulk_split=True without stage_bulk=True: it splits the bulk copy of A's scales; "
                          "add stage_bulk=True (and stage_scales=True), or drop stage_bulk_split")
    if dict(cfg.extra).get("stage_bulk", False) and not want:
        raise ConfigError("stage_bulk=True without stage_scales=True: it says how the staged scales are copied "
                          "(plain bulk copies instead of tensor copies); add stage_scales=True, or drop stage_bulk")
    if not want:
        return
    if recipe(cfg) != "block":
        raise ConfigError(f"stage_scales=True with {recipe(cfg)} scales: only block scales change along K (the "
                          "others are applied once, in the epilogue); use stage_scales=False")
    need = smem_bytes(cfg, cfg.pipe_depth) + scale_smem_bytes(cfg)
    most = limits_for(cfg.arch).smem_per_block
    if need > most:
        raise ConfigError(f"stage_scales=True with pipe_depth={cfg.pipe_depth}: the ring, staging and scales take "
                          f"{need} bytes of shared memory, over the {most} a block may use; use a smaller pipe_depth")
    if not dict(cfg.extra).get("overlap", 0) and not dict(cfg.extra).get("halves", False):
        raise ConfigError("stage_scales=True with overlap=0 and halves=False: the staged scales are read by the "
                          "overlapped promotion and the promotion in halves only (the drained one loads them from "
                          "global memory); use overlap=4 (or 2), or halves=True with blk_n=256")


def _check_block(cfg: GemmConfig, every: int) -> None:
    """Block scales change every 128 of K: one slice a promotion, in K order, whole B blocks a tile."""
    fix = "use blk_k=128, promote=1, k_zigzag=False, blk_n=128 (v9's fp8 defaults)"
    if cfg.blk_k != BLOCK or every != 1:
        raise ConfigError(f"block scales with blk_k={cfg.blk_k}, promote={every}: a K block's scales are applied "
                          f"as its sums are promoted, so each promotion must cover one {BLOCK}-wide K block; {fix}")
    if dict(cfg.extra).get("k_zigzag"):
        raise ConfigError(f"block scales with k_zigzag=True: the consumers count K blocks in load order, so a "
                          f"backwards tile would scale its slice j (K block nk-1-j) by block j's scales; {fix}")
    if cfg.blk_n % BLOCK and BLOCK % cfg.blk_n:
        raise ConfigError(f"block scales with blk_n={cfg.blk_n}: a tile must cover whole {BLOCK}-column B blocks or "
                          f"lie in one (a multiple or a divisor of {BLOCK}); {fix}")


@dataclass(frozen=True)
class BlockScales:
    """Block-wise scales at the promotion (the module docstring): the consumer's scale tensors, the
    registers that hold a slice's scales (``sreg``: two sets of :meth:`per_slice`, one being read
    while the other loads: ``mainloop._run_block_scaled``), and where this thread's sums lie
    (``warp_id``, ``lane_id``)."""

    plan: HopperPlan
    scale_a: object  # float32 [K/128, M] global: A's 1x128 groups, M-major
    scale_b: object  # float32 [N/128, K/128] global: B's 128x128 blocks
    sreg: object  # float32[scale_regs] local
    warp_id: object
    lane_id: object
    smem: object = None  # stage_scales: the ring's staged scales ([stages, scale_row], StagedScales), else None

    @property
    def staged(self) -> bool:
        return self.smem is not None

    def load_staged(self, slot, row0, scale_set, m0, n0, kb) -> None:
        """``stage_scales``: ring slot ``slot``'s scales (its K block ``kb``'s; call after the
        slot's full-barrier wait, before its release) of this thread's rows (``row0``: its
        consumer's first row of the tile; ``m0``: the same row in A) and the tile's B blocks (from
        column ``n0``), from shared memory into ``scale_set``, each float at its offset in the
        16-byte aligned boxes :class:`StagedScales` copies."""
        _load_staged(self, slot, row0, m0, n0, kb, scale_set * self.per_slice(self.plan))

    @staticmethod
    def per_slice(plan: HopperPlan) -> int:
        """A thread's scales of one K block: two rows of each 64-row atom, then the B blocks."""
        return 2 * plan.m_atoms + b_blocks(plan)

    def load(self, m0, n0, kb, scale_set) -> None:
        """K block ``kb``'s scales of this thread's rows (from ``m0``, its first row of the tile)
        and the tile's B blocks (from column ``n0``) into register set ``scale_set`` (0 or 1);
        rows and blocks past A and B read the last (the stores clip them)."""
        _load_block(self, m0, n0, kb, scale_set * self.per_slice(self.plan))

    def promote(self, total, acc, first, scale_set) -> None:
        """``total[r] (=|+=) acc[r] * scale_a * scale_b`` with register set ``scale_set``'s scales."""
        _promote_block(self, total, acc, first, scale_set * self.per_slice(self.plan))

    def promote_half(self, total, acc, half: "HalfPlan", h: int, scale_set: int) -> None:
        """Knob ``halves``: half ``h``'s sums ``acc`` into its registers of ``total``
        (:class:`HalfPlan`), each times its row's A scale and B block ``h``'s scale from register
        set ``scale_set``."""
        _promote_half_block(self, total, acc, half, h, scale_set * self.per_slice(self.plan))


@T.inline
def _load_block(bs, m0, n0, kb, base):
    MA = T.meta_var(2 * bs.plan.m_atoms)
    for mi in T.unroll(bs.plan.m_atoms):
        for h in T.unroll(2):
            # this thread's rows of atom mi: 16 w + lane / 4, and 8 below
            bs.sreg[base + 2 * mi + h] = bs.scale_a[kb, T.min(m0 + mi * WG_M + bs.warp_id * 16 + bs.lane_id // 4
                                                             + 8 * h, bs.scale_a.shape[1] - 1)]
    for j in T.unroll(b_blocks(bs.plan)):
        bs.sreg[base + MA + j] = bs.scale_b[T.min(n0 // BLOCK + j, bs.scale_b.shape[0] - 1), kb]


def a_scale_slot(r, regs_per_atom):
    """Which of a thread's A scales (:meth:`BlockScales.load`'s order: two rows an atom) accumulator
    ``r`` takes: its atom ``r // regs_per_atom``, and its row half ``(r % 4) // 2`` (rows l/4 and
    l/4 + 8 of the m64nN fragment)."""
    return 2 * (r // regs_per_atom) + (r % 4) // 2


def b_scale_slot(r, regs_per_atom):
    """Which of the tile's B blocks accumulator ``r`` lies in: its column 8 ((r % regs_per_atom) // 4)
    + 2 (lane % 4) + r % 2 of the tile, over 128 (64 registers a 128-column block)."""
    return (r % regs_per_atom) // (BLOCK // 2)


@T.inline
def _promote_block(bs, total, acc, first, base):
    NR = T.meta_var(bs.plan.acc_stride)
    MA = T.meta_var(base + 2 * bs.plan.m_atoms)
    if first:
        for r in T.unroll(bs.plan.acc_regs):
            total[r] = acc[r] * (bs.sreg[base + a_scale_slot(r, NR)] * bs.sreg[MA + b_scale_slot(r, NR)])
    else:
        for r in T.unroll(bs.plan.acc_regs):
            total[r] = total[r] + acc[r] * (bs.sreg[base + a_scale_slot(r, NR)] * bs.sreg[MA + b_scale_slot(r, NR)])


@T.inline
def _promote_half_block(bs, total, acc, half, h, base):
    NR = T.meta_var(bs.plan.acc_stride)
    NH = T.meta_var(half.n_regs)
    B = T.meta_var(base + 2 * bs.plan.m_atoms + h)
    for mi in T.unroll(bs.plan.m_atoms):
        for r in T.unroll(NH):
            total[mi * NR + h * NH + r] = total[mi * NR + h * NH + r] + acc[mi * NH + r] * (
                bs.sreg[base + 2 * mi + (r % 4) // 2] * bs.sreg[B])


@T.inline
def scale_sums(plan, sums, scale_a, scale_b, how, m0, n0, warp_id, lane_id, sreg):
    """Multiply a consumer's fp32 sums of the tile at rows ``m0`` (its first row) and columns
    ``n0`` by the scales, in place: ``scale_a[0] * scale_b[0]`` (``how == "tensor"``), or
    ``scale_a[row] * scale_b[col]`` at each sum's place in the m64nN fragment (``row``); nothing for
    ``block`` (:class:`BlockScales` applied them at the promotion). Rows and columns past M and N
    read the last scale (the stores clip them). ``sreg``: float32 locals (:func:`scale_regs`)."""
    NR = T.meta_var(plan.acc_stride)
    if how == "tensor":
        sreg[0] = scale_a[0] * scale_b[0]
        for r in T.unroll(plan.acc_regs):
            sums[r] = sums[r] * sreg[0]
    elif how == "row":
        for mi in T.unroll(plan.m_atoms):
            for h in T.unroll(2):
                # this thread's rows of atom mi: 16 w + lane / 4, and 8 below
                sreg[2 * mi + h] = scale_a[T.min(m0 + mi * WG_M + warp_id * 16 + lane_id // 4 + 8 * h,
                                                 scale_a.shape[0] - 1)]
        for r in T.unroll(plan.acc_regs):
            col = T.meta_var(n0 + layouts.acc_fragment_coord(r % NR, 0, lane_id)[1])
            sums[r] = sums[r] * sreg[2 * (r // NR) + (r % 4) // 2] * scale_b[T.min(col, scale_b.shape[0] - 1)]


@dataclass(frozen=True)
class SumScales:
    """One consumer's side of :func:`scale_sums` (per-tensor and rowwise scales, applied to a tile's
    fp32 sums once its K loop, or its split's sum, is done): the scale operands, the recipe, the
    consumer's first row in a tile, its warp and lane, its scale registers.

    ``swapped`` (v11, swap AB): the sums are D^T's fragment, its rows N and its columns M, so the rowwise recipe's
    B scales go with the fragment's rows and A's with its columns; ``row0`` is then the consumer's first row of N in
    the tile and ``col0`` its first row of M (``common.SwapPlan.n_first``, ``m_first``)."""

    plan: object
    scale_a: object
    scale_b: object
    how: str
    row0: object
    warp_id: object
    lane_id: object
    sreg: object
    swapped: bool = False
    col0: object = 0

    def apply(self, sums, m0, n0) -> None:
        """``sums`` of the tile at rows from ``m0`` and columns from ``n0`` times their scales, in place."""
        if self.swapped:  # the fragment's rows are N: B's scales by row, A's by column
            scale_sums(self.plan, sums, self.scale_b, self.scale_a, self.how, n0 + self.row0, m0 + self.col0,
                       self.warp_id, self.lane_id, self.sreg)
        else:
            scale_sums(self.plan, sums, self.scale_a, self.scale_b, self.how, m0 + self.row0, n0, self.warp_id,
                       self.lane_id, self.sreg)


# -- block scales staged in shared memory by the producer (knob ``stage_scales``) ----------------
TMA_ALIGN = 4  # floats (16 bytes): TMA's alignment of a box's innermost start (and size) in global memory
SCALE_B_BOX = TMA_ALIGN  # floats of a B scale's box: the aligned 16 bytes that hold it
SCALE_ALIGN = 32  # floats (128 bytes): TMA's shared-memory alignment of each box's place in a stage's row


def a_box(cfg: GemmConfig) -> int:
    """Floats of A's scale box a stage: the tile's ``blk_m``, from the first rounded down to 16
    bytes, so 4 more (:class:`StagedScales`)."""
    return cfg.blk_m + TMA_ALIGN


def b_scale_at(cfg: GemmConfig) -> int:
    """Where a stage's first B box lands in its scale row: the first 128-byte boundary past A's box."""
    return -(-a_box(cfg) // SCALE_ALIGN) * SCALE_ALIGN


def scale_row(cfg: GemmConfig) -> int:
    """Floats of one ring stage's scales in shared memory: A's box of the stage's K block, then a
    128-byte aligned place for each B block's 16-byte box."""
    return b_scale_at(cfg) + SCALE_ALIGN * max(1, cfg.blk_n // BLOCK)


def scale_stage_bytes(cfg: GemmConfig) -> int:
    """Bytes the scale copies of one stage bring (counted in the stage's full barrier): A's box and
    one 16-byte box a B block. TMA counts a box whole, zero-filled past the end."""
    return 4 * a_box(cfg) + 4 * SCALE_B_BOX * max(1, cfg.blk_n // BLOCK)


def scale_smem_bytes(cfg: GemmConfig) -> int:
    """Shared memory of the staged scales (0 without ``stage_scales``): a :func:`scale_row` a stage."""
    return 4 * cfg.pipe_depth * scale_row(cfg) if staged(cfg) else 0


@dataclass(frozen=True)
class StagedScales:
    """The producer's side of ``stage_scales``: K block ``kb``'s scales of a tile, copied by TMA
    into ring stage ``stage``'s row of ``smem`` (``[stages, scale_row]`` float32) on the stage's
    full barrier, with its A and B tiles.

    Why: loaded from global memory by each consumer thread, the scales are read-only loads that
    ptxas sinks to just before the FFMAs that use them, so the promotion waits on L2
    (``benchmarks/results/2026-11-26_h100_fp8_block_overlap/``). Staged, they are in shared memory
    once the consumer's full-barrier wait passes (DeepGEMM's way), a few cycles from the FFMAs.

    The copies read the scale tensors as flat arrays (``a_flat``: scale_a ``[K/128, M]``, M-major,
    as ``K/128 * M`` floats; ``b_flat``: scale_b ``[N/128, K/128]``): a one-dimensional tensor map
    has no row stride, so any M works (a two-dimensional box would need M a multiple of 4 for
    TMA's 16-byte strides). Every box starts on a 16-byte boundary: TMA refuses a box whose
    innermost start is not 16-byte aligned with "an illegal instruction" at run time (the encode
    and the compile take it): the first version started A's box at ``kb * M + m_st`` and B's at
    ``nb * K/128 + kb``, any float, and died so on the H100
    (``benchmarks/results/2026-11-26_h100_fp8_block_staged/``, found by
    ``benchmarks/fp8_block_bisect.py``). So A's box is the :func:`a_box` floats from
    ``kb * M + m_st`` rounded down to 4 (rows past M read the next K block's scales, or zeros past
    the end, which only multiply sums whose rows the stores clip), B's the 4 floats from
    ``nb * K/128 + kb`` rounded down; each consumer reads its floats at their offsets there."""

    cfg: GemmConfig
    a_flat: object
    b_flat: object
    smem: object
    m_extent: object  # M: an int or the kernel's runtime M

    @property
    def nbytes(self) -> int:
        return scale_stage_bytes(self.cfg)

    def load(self, stage, m_st, n_st, kb, mbar) -> None:
        """One thread (the producer): K block ``kb``'s scales of the tile at ``m_st``, ``n_st``
        into ``stage``, completing on ``mbar`` (this CTA's full barrier; not multicast)."""
        _stage_scales(self, stage, m_st, n_st, kb, mbar)


def flat_shape(buf) -> tuple:
    """A scale tensor's shape as one row of its floats (:class:`StagedScales`' copies read it so)."""
    size = 1
    for extent in buf.shape:
        size = size * extent
    return (size,)


def aligned_start(first):
    """A box's start: float ``first`` rounded down to 16 bytes (TMA's innermost alignment)."""
    return first // TMA_ALIGN * TMA_ALIGN


BULK_COPY = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"  # TVM's PTX table entry


@T.inline
def _stage_scales_tensor(ss, stage, m_st, n_st, kb, mbar):
    KB = T.meta_var(-(-ss.cfg.K // BLOCK))
    a0 = T.meta_var(aligned_start(kb * ss.m_extent + m_st))
    Tx.copy_async(ss.smem[stage, 0:a_box(ss.cfg)], ss.a_flat[a0:a0 + a_box(ss.cfg)], dispatch="tma_auto", mbar=mbar)
    for j in T.unroll(max(1, ss.cfg.blk_n // BLOCK)):
        b0 = T.meta_var(aligned_start((n_st // BLOCK + j) * KB + kb))
        s0 = T.meta_var(b_scale_at(ss.cfg) + SCALE_ALIGN * j)
        Tx.copy_async(ss.smem[stage, s0:s0 + SCALE_B_BOX], ss.b_flat[b0:b0 + SCALE_B_BOX], dispatch="tma_auto",
                      mbar=mbar)


@T.inline
def _stage_scales_bulk(ss, stage, m_st, n_st, kb, mbar):
    """:func:`_stage_scales_tensor`'s boxes by plain bulk copies (knob ``stage_bulk``): the
    same 16-byte aligned starts, sizes and places in shared memory, so the same bytes on the full
    barrier and the same reads (:func:`_load_staged`), but no tensor map: in the probe run
    (``benchmarks/results/2026-11-26_h100_fp8_block_staged_fix/``, probe ``bulk``) they ran 4.4%
    faster than the tensor copies. TVM's PTX table has the instruction (``cp_async_bulk_g2s_cluster``).
    A bulk copy does not clamp: it must start 16-byte aligned in global and shared memory (the
    rounded starts; the scale tensors' bases are checked 16-byte aligned by ``serve.scaled``) and
    must not read past the tensor. A box that would (A's in the last K block's last tile, B's
    last when ``N/128 * K/128`` is no multiple of 4, every box when the tensor is shorter than
    one) falls back to the tensor copy of :func:`_stage_scales_tensor`, which zero-fills past the
    end and counts the same bytes; the guard is the exact bound, so no bulk copy reads outside."""
    KB = T.meta_var(-(-ss.cfg.K // BLOCK))
    BOX_A = T.meta_var(a_box(ss.cfg))
    a0 = T.meta_var(aligned_start(kb * ss.m_extent + m_st))
    if bulk_split(ss.cfg):
        if a0 + BOX_A <= ss.a_flat.shape[0]:
            # the box as 512 bytes and the 16 after them (a probe: is a 528-byte bulk copy slow?)
            T.ptx[BULK_COPY](ss.smem.ptr_to([stage, 0]), ss.a_flat.ptr_to([a0]), T.uint32(4 * ss.cfg.blk_m), mbar)
            T.ptx[BULK_COPY](ss.smem.ptr_to([stage, ss.cfg.blk_m]), ss.a_flat.ptr_to([a0 + ss.cfg.blk_m]),
                             T.uint32(4 * TMA_ALIGN), mbar)
        else:
            Tx.copy_async(ss.smem[stage, 0:BOX_A], ss.a_flat[a0:a0 + BOX_A], dispatch="tma_auto", mbar=mbar)
    elif a0 + BOX_A <= ss.a_flat.shape[0]:
        T.ptx[BULK_COPY](ss.smem.ptr_to([stage, 0]), ss.a_flat.ptr_to([a0]), T.uint32(4 * BOX_A), mbar)
    else:
        Tx.copy_async(ss.smem[stage, 0:BOX_A], ss.a_flat[a0:a0 + BOX_A], dispatch="tma_auto", mbar=mbar)
    for j in T.unroll(max(1, ss.cfg.blk_n // BLOCK)):
        b0 = T.meta_var(aligned_start((n_st // BLOCK + j) * KB + kb))
        s0 = T.meta_var(b_scale_at(ss.cfg) + SCALE_ALIGN * j)
        if b0 + SCALE_B_BOX <= ss.b_flat.shape[0]:
            T.ptx[BULK_COPY](ss.smem.ptr_to([stage, s0]), ss.b_flat.ptr_to([b0]), T.uint32(4 * SCALE_B_BOX), mbar)
        else:
            Tx.copy_async(ss.smem[stage, s0:s0 + SCALE_B_BOX], ss.b_flat[b0:b0 + SCALE_B_BOX], dispatch="tma_auto",
                          mbar=mbar)


@T.inline
def _stage_scales(ss, stage, m_st, n_st, kb, mbar):
    if stage_bulk(ss.cfg):
        _stage_scales_bulk(ss, stage, m_st, n_st, kb, mbar)
    else:
        _stage_scales_tensor(ss, stage, m_st, n_st, kb, mbar)


@T.inline
def _load_staged(bs, slot, row0, m0, n0, kb, base):
    MA = T.meta_var(2 * bs.plan.m_atoms)
    KB = T.meta_var(-(-bs.plan.cfg.K // BLOCK))
    # where the tile's first A scale and each B block's scale lie in their aligned boxes (_stage_scales)
    a_off = T.meta_var((kb * bs.scale_a.shape[1] + m0 - row0) % TMA_ALIGN)
    for mi in T.unroll(bs.plan.m_atoms):
        for h in T.unroll(2):
            # this thread's rows of atom mi (of the tile: row0 is its consumer's first)
            bs.sreg[base + 2 * mi + h] = bs.smem[slot, a_off + row0 + mi * WG_M + bs.warp_id * 16 + bs.lane_id // 4
                                                 + 8 * h]
    for j in T.unroll(b_blocks(bs.plan)):
        bs.sreg[base + MA + j] = bs.smem[slot, b_scale_at(bs.plan.cfg) + SCALE_ALIGN * j
                                         + ((n0 // BLOCK + j) * KB + kb) % TMA_ALIGN]
