"""The producer of the warp-specialized Hopper kernels (v8-v11): one thread's TMA loads of the A and
B slices of each tile into the ring, shared across a cluster by multicast, with L2 hints.

    for each tile (the schedule's order), for each K slice k (or from the last, ``backwards``):
        ring.wait_empty(pos)                   the slot's slice one lap back was released
        A rows of this CTA's part -> Asmem[slot] of every CTA of its cluster row    (multicast)
        B rows of this CTA's part -> Bsmem[slot] of every CTA of its cluster column (multicast)
        ring.expect(pos, stage bytes)          arrive.expect_tx on the full barrier
        pos += 1

A kernel builds one :class:`Producer` with named fields and calls ``load_tile`` per tile::

    loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring,
                                cluster_m=CM, cluster_n=CN, rank_m=rank_m, rank_n=rank_n))
    loads.load_tile(load_it, m_st, n_st, first_slice=k0, num_slices=nk)
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..core.config import GemmConfig
from .common import HopperPlan
from .ring import Ring


def multicast_masks(cm: int, cn: int, rank_m, rank_n):
    """The cta_masks of the A and B parts a CTA multicasts, as functions of its place in the
    cluster (rank = rank_m + cluster_m * rank_n).

    A's tile belongs to the CTAs of one cluster row (same rank_m): ranks rank_m + cm*j. B's tile
    belongs to the CTAs of one cluster column (same rank_n): ranks cm*rank_n + i.
    """
    row = sum(1 << (cm * j) for j in range(cn))  # ranks 0, cm, 2cm, ... shifted by rank_m
    col = (1 << cm) - 1  # ranks 0..cm-1, shifted by cm * rank_n
    return row << rank_m, col << (rank_n * cm)


# ``stream_b`` (v9-v11): when B is read once and A again by every CTA (small M: the weights stream
# past a few rows of activations), B's loads ask L2 to evict them first and A's to keep them, and
# both tensor maps fetch 256 bytes per L2 miss (a row of B is read 128 bytes per K slice: the next
# slice's half is then already in L2). On an H100, as kernels: +1.6-6.3% at 18 of the shape
# suite's 20 cases with M <= 128, -1.8% at 128x128256x4096; -1% at M = 512 and -4% where two CTAs
# read the same B tile without multicast (evicted first, the second read misses):
# benchmarks/results/2026-11-22_h100_stream_b/.
# TVM's TMA copy takes both options (``cache_hint``, ``tensormap_l2_promotion``); this only
# chooses them.
STREAM_A = {"cache_hint": "evict_last", "tensormap_l2_promotion": "L2::256B"}
STREAM_B = {"cache_hint": "evict_first", "tensormap_l2_promotion": "L2::256B"}
# ``l2_promo`` (v12): the 256-byte L2 promotion of ``stream_b`` alone, without its eviction hints. A
# grouped kernel streams each expert's weight 128 bytes a row a K slice; with the promotion one L2 miss
# brings the row's next slice too, so the DRAM reads come in 256-byte runs (what a 128-wide K tile of
# 16-bit data reads). Evict-first would hurt where two CTAs read one W tile without multicast (swap AB's
# token tiles of an expert side by side), so only the promotion is asked for. On an H100 (DeepSeek-V3-like
# 256 x 2048x7168 at 32768 tokens, swap AB 64x128): 2.79 ms against 2.96 without it, torch._grouped_mm
# 2.87 (benchmarks/results/2026-11-26_h100_grouped_l2_promo/).
PROMOTE = {"tensormap_l2_promotion": "L2::256B"}


def load_hints(cfg: GemmConfig) -> tuple[dict, dict]:
    """The TMA load options of A and B for ``cfg``: ``stream_b``'s hints, ``l2_promo``'s promotion
    (v12), or none."""
    extra = dict(cfg.extra)
    if extra.get("stream_b"):
        return STREAM_A, STREAM_B
    return (PROMOTE, PROMOTE) if extra.get("l2_promo") else ({}, {})


@T.inline
def _tma_part(Xsmem, X, stage, x_st, row0, rows, k, mbar, cta_mask, hints):
    """Rows ``row0 .. row0+rows`` of a tile's K slice ``k``, multicast to ``cta_mask``."""
    BLK_K = T.meta_var(Xsmem.shape[2])
    Tx.copy_async(Xsmem[stage, row0:row0 + rows, :],
                  X[x_st + row0:x_st + row0 + rows, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=mbar, cta_mask=cta_mask, **hints)


@T.inline
def _tma_whole(Xsmem, X, stage, x_st, rows, k, mbar, hints):
    """A tile's K slice ``k`` whole, into this CTA alone."""
    BLK_K = T.meta_var(Xsmem.shape[2])
    Tx.copy_async(Xsmem[stage, :, :], X[x_st:x_st + rows, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=mbar, **hints)


@T.inline
def _tma_rows(Xsmem, X, stage, x_row, row0, rows, k, mbar, cta_mask, hints):
    """Global rows ``x_row .. x_row+rows`` of ``X``'s K slice ``k`` into rows ``row0 ..`` of the
    stage, multicast to ``cta_mask`` (a gated B's half tile: its rows are not ``n_st + row0``)."""
    BLK_K = T.meta_var(Xsmem.shape[2])
    Tx.copy_async(Xsmem[stage, row0:row0 + rows, :], X[x_row:x_row + rows, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=mbar, cta_mask=cta_mask, **hints)


@T.inline
def _tma_rows_alone(Xsmem, X, stage, x_row, row0, rows, k, mbar, hints):
    """:func:`_tma_rows` into this CTA alone."""
    BLK_K = T.meta_var(Xsmem.shape[2])
    Tx.copy_async(Xsmem[stage, row0:row0 + rows, :], X[x_row:x_row + rows, k * BLK_K:k * BLK_K + BLK_K],
                  dispatch="tma_auto", mbar=mbar, **hints)


def gated_row(row0, half: int, n_st, gated_n: int):
    """The row of a gated B (``W_gu = cat([W_gate, W_up])``, ``gated_n`` rows each) that row
    ``row0`` of the B tile of column ``n_st`` (in the kernel's 2N columns) holds: the tile's first
    ``half`` rows are gate rows from ``n_st / 2``, the others the up rows of the same outputs, so
    that accumulator column c and c + half meet in one thread (``epilogue.ChunkedEpilogue.gated``)."""
    return T.Select(row0 < half, n_st // 2 + row0, gated_n + n_st // 2 + row0 - half)


def _load_gated_b(loads, stage, n_st, k, mbar, mask_b, hint_b) -> None:
    """A gated B's tile: its gate half and its up half, each a TMA box (a cluster part is one half)."""
    c, cm = loads.plan.cfg, loads.cluster_m
    half = c.blk_n // 2
    if cm > 1:
        row0 = loads.rank_m * (c.blk_n // cm)
        _tma_rows(loads.b_smem, loads.b, stage, gated_row(row0, half, n_st, loads.gated_n), row0, c.blk_n // cm, k,
                  mbar, mask_b, hint_b)
    else:
        for h in range(2):
            _tma_rows_alone(loads.b_smem, loads.b, stage, h * loads.gated_n + n_st // 2, h * half, half, k, mbar,
                            hint_b)


MN_BOX = 64  # M (or N) elements of an MN-major box: one 128-byte swizzle atom row of 16-bit values


@T.inline
def _tma_part_mn(Xsmem, X, stage, x_st, row0, rows, k, mbar, cta_mask, hints):
    """An MN-major tile's (``Xsmem[stage]`` is ``[blk_k, rows]``, from X ``[K, M or N]``) columns
    ``row0 .. row0+rows`` of K slice ``k``, multicast to ``cta_mask``: one box of ``blk_k`` rows
    by 64 columns per 128-byte swizzle atom column (a box as wide as the part would make
    ``tma_auto`` fold M into 64-wide groups, which needs M a multiple of 64)."""
    BLK_K = T.meta_var(Xsmem.shape[1])
    for j in T.unroll(rows // MN_BOX):
        c0 = T.meta_var(row0 + j * MN_BOX)
        Tx.copy_async(Xsmem[stage, :, c0:c0 + MN_BOX], X[k * BLK_K:k * BLK_K + BLK_K, x_st + c0:x_st + c0 + MN_BOX],
                      dispatch="tma_auto", mbar=mbar, cta_mask=cta_mask, **hints)


@T.inline
def _tma_whole_mn(Xsmem, X, stage, x_st, rows, k, mbar, hints):
    """An MN-major tile's K slice ``k`` whole, into this CTA alone, in boxes of ``blk_k`` rows
    of K by 64 M (or N) elements (as :func:`_tma_part_mn`)."""
    BLK_K = T.meta_var(Xsmem.shape[1])
    for j in T.unroll(rows // MN_BOX):
        Tx.copy_async(Xsmem[stage, :, j * MN_BOX:j * MN_BOX + MN_BOX],
                      X[k * BLK_K:k * BLK_K + BLK_K, x_st + j * MN_BOX:x_st + j * MN_BOX + MN_BOX],
                      dispatch="tma_auto", mbar=mbar, **hints)


def _operand_loads(major: str):
    """The part and whole loads of an operand stored ``major`` ("K" or "MN")."""
    return (_tma_part, _tma_whole) if major == "K" else (_tma_part_mn, _tma_whole_mn)


def _load_slice(loads: Producer, pos, m_st, n_st, k) -> None:
    """One thread: its CTA's share of the K slice ``k`` of a cluster's A and B tiles, into the
    ring slot of position ``pos``.

    A tile shared by ``cluster_n`` CTAs is loaded in ``cluster_n`` row parts, part ``rank_n`` by
    this CTA, multicast (``cta_mask``) into the same stage of every CTA that shares it; B likewise
    over ``cluster_m``. An unshared tile is loaded whole, as in v7. An MN-major operand (``[K, M]``
in global, ``plan.a_major == "MN"``) is loaded in boxes of the other orientation: K rows by M
columns, into its ``[blk_k, rows]`` tile. Every CTA's full barrier
    (tma2mma) still expects the bytes of the full A and B tiles: its own parts and its peers'
    land on it alike. (Plain Python around inline parts: which form each operand takes is decided
    at trace time.)
    """
    c, cm, cn = loads.plan.cfg, loads.cluster_m, loads.cluster_n
    mask_a, mask_b = multicast_masks(cm, cn, loads.rank_m, loads.rank_n)
    hint_a, hint_b = load_hints(c)
    stage, mbar = loads.ring.slot(pos), loads.ring.full_bar(pos)
    part_a, whole_a = _operand_loads(loads.plan.a_major)
    part_b, whole_b = _operand_loads(loads.plan.b_major)
    if cn > 1:
        part_a(loads.a_smem, loads.a, stage, m_st, loads.rank_n * (c.blk_m // cn), c.blk_m // cn, k, mbar, mask_a,
               hint_a)
    else:
        whole_a(loads.a_smem, loads.a, stage, m_st, c.blk_m, k, mbar, hint_a)
    if loads.gated_n:
        _load_gated_b(loads, stage, n_st, k, mbar, mask_b, hint_b)
    elif cm > 1:
        part_b(loads.b_smem, loads.b, stage, n_st, loads.rank_m * (c.blk_n // cm), c.blk_n // cm, k, mbar, mask_b,
               hint_b)
    else:
        whole_b(loads.b_smem, loads.b, stage, n_st, c.blk_n, k, mbar, hint_b)
    if loads.scales is not None:
        # fp8 block scales staged with the stage (fp8.StagedScales): K slice k is K block k (blk_k = 128)
        loads.scales.load(stage, m_st, n_st, k, mbar)
    loads.ring.expect(pos, loads.plan.stage_bytes + (loads.scales.nbytes if loads.scales is not None else 0))


def interleaved(k: int, count: int, parts: int) -> int:
    """The slice the ``k``-th of ``count`` ring positions takes when ``parts`` consumers each add
    a contiguous part of the K slices, the parts loaded in turn (v9's ``k_consumers`` with
    ``k_halves``): position k holds slice ``(k % parts) * (count / parts) + k / parts``."""
    return (k % parts) * (count // parts) + k // parts


@T.inline
def _load_slices(loads, pos, first, count, m_st, n_st, backwards, parts):
    for k in range(count):
        loads.ring.wait_empty(pos + k)
        _load_slice(loads, pos + k, m_st, n_st,
                    first + interleaved(k, count, parts) if backwards is False
                    else T.Select(backwards, first + count - 1 - k, first + k))


@dataclass(frozen=True)
class Producer:
    """The producer thread's loads: what it reads (``a``, ``b`` in global memory), where to
    (``a_smem``, ``b_smem``: ``[stages, rows, blk_k]`` 128B-swizzled, one slot per ring stage),
    through which ring, and its CTA's place in a ``cluster_m`` x ``cluster_n`` cluster
    (``rank_m``, ``rank_n``: which row part of a shared tile it loads for the others)."""

    plan: HopperPlan
    a: object
    b: object
    a_smem: object
    b_smem: object
    ring: Ring
    cluster_m: int = 1
    cluster_n: int = 1
    rank_m: object = 0
    rank_n: object = 0
    gated_n: int = 0  # a gated B (SwiGLU's W_gu): its gate rows (0: not gated; gated_row)
    scales: object = None  # fp8 block scales staged with each stage (fp8.StagedScales: stage_scales), or None

    def load_tile(self, pos, m_st, n_st, first_slice=0, num_slices=None, backwards=False, parts=1) -> None:
        """Slices ``[first_slice, first_slice + num_slices)`` (default: the whole K) of the tile
        at rows ``m_st`` of A and ``n_st`` of B, into ring positions ``pos, pos + 1, ...``; with
        ``backwards`` (a run-time condition) from the last slice to the first (v9's ``k_zigzag``:
        the consumers add the slices in whatever order they land); with ``parts`` > 1, the K
        slices in that many contiguous parts, loaded in turn (:func:`interleaved`)."""
        count = self.plan.cfg.k_tiles if num_slices is None else num_slices
        _load_slices(self, pos, first_slice, count, m_st, n_st, backwards, parts)


# -- l2_warm: the weight's first slices into L2 while the previous grid finishes ------------------------
# With ``pdl`` a CTA sets up under the previous kernel's last CTAs and then waits for that grid's writes
# (common.wait_for_previous_grid); its first TMA loads go to HBM only after the wait, and a short kernel
# (a few microseconds of weight streaming at small M) spends a fair part of its time on that first
# round trip. ``l2_warm`` asks L2, before the wait, for the B rows of this CTA's first unit over its
# first ``pipe_depth`` K slices (``cp.async.bulk.prefetch.L2``: a hint, no data reaches the CTA).
# It is safe whatever the previous kernel writes: L2 is where every SM's global writes meet, so a line
# it fetched early is updated there by a later write, and the TMA loads after the wait read it from
# there. Written here: TVM's TMA copy has no prefetch form, and this is one PTX instruction a row.
# Measured, it does not pay: at the 92 bf16 cases of ``epilogue_check.py --set l2_warm`` (the suite's and the
# held-out weights at M = 1-512 and the every-model samples' memory-bound cases, no epilogue and bias+GELU,
# kernels in CUDA graphs) the warm kernel ran 0.980x the same kernel without it in geomean (0.88-1.07x): a few
# microseconds of weight streaming chained behind another is bound by HBM throughout, and bytes asked for under
# the previous kernel's tail come out of that kernel's share (benchmarks/results/2026-11-29_h200_l2_warm/). The
# policy leaves it off; the knob stays, off by default, with this measurement.
WARM_LANES = 32  # one warp: a row of B each lane, in turns


def warm_rows(plan, cluster_m: int) -> int:
    """Rows of B one CTA asks L2 for: its part of a B tile shared by ``cluster_m`` CTAs."""
    return plan.cfg.blk_n // cluster_m


@T.inline
def warm_l2(plan, b, n_st, rank_m, cluster_m, first_slice, num_slices, lane_id):
    """One warp: ask L2 for this CTA's rows of B (``n_st`` + its cluster part) over K slices
    ``first_slice ..`` (at most ``pipe_depth`` of them, and no further than ``num_slices`` or K)."""
    c = T.meta_var(plan.cfg)
    rows = T.meta_var(warm_rows(plan, cluster_m))
    elem = T.meta_var(1 if plan.b_dtype.startswith("float8") else 2)
    k_lo = T.meta_var(first_slice * c.blk_k)
    k_hi = T.meta_var(T.min(c.K, (first_slice + T.min(num_slices, c.pipe_depth)) * c.blk_k))
    row0 = T.meta_var(n_st + (rank_m * rows if cluster_m > 1 else 0))
    for i in T.unroll((rows + WARM_LANES - 1) // WARM_LANES):
        r = T.meta_var(i * WARM_LANES + lane_id)
        if T.And(r < rows, row0 + r < c.N):
            T.ptx.cp.async_.bulk.prefetch.L2.global_(T.address_of(b[row0 + r, k_lo]),
                                                      T.Cast("uint32", (k_hi - k_lo) * elem))
