"""The consumers' K loop of the warp-specialized Hopper kernels (v8-v11): wgmma over the ring.

    for each slice k of a tile (ring position pos + k):
        ring.wait_full(pos + k); wgmma.fence; the slot's wgmmas; commit
        wgmma.wait_group(1)                  slice k - 1's wgmmas retired in this warp ...
        lane 0: ring.release(pos + k - 1)    ... so its slot goes back to every producer of the cluster
    wgmma.wait_group(0); lane 0: ring.release(the last slice)

A kernel builds one :class:`Consumer` per consumer warpgroup with named fields, and runs a tile
with ``run`` (or ``issue`` and ``retire`` apart, when something goes between:
``issue_under`` with the previous tile's epilogue chunks under the first slices; for fp8's
promoted tiles, ``run_under``, the chunks under the first promotion group). fp8's
promotion (``promote``): groups of slices into fresh accumulators, each group retired and added
into an fp32 ``total`` (with block scales, ``fp8.BlockScales``, scaled as it is added); with
``overlap`` (fp8's knob), two sets of accumulators taken in turn, so that a group's adds run while
the next group's wgmmas do (:func:`_overlapped_groups`; with block scales, each slice's scales in
the register set of its accumulator set: :func:`_block_groups`).
The descriptors of ring slot 0 are encoded once per tile; every slot, 64-row atom and K step is
reached from them by adds (``common.mma_k_slot``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tvm.script import tirx as T

from .common import HopperPlan, encode_slot0, k_loop_unroll, mma_k_slot, slot_step16
from .ring import Ring


@T.inline
def _begin_slice(mma, it, k):
    """Slice ``k`` of a tile: wait for its ring slot and issue its wgmmas (one commit group)."""
    mma.ring.wait_full(it + k)
    T.ptx.wgmma.fence.sync.aligned()
    mma_k_slot(mma.plan, mma.acc, mma.ring.slot(it + k), k == 0, mma.desc_a, mma.desc_b, slot_step16(mma.a_smem),
               slot_step16(mma.b_smem))
    T.ptx.wgmma.commit_group.sync.aligned()


@T.inline
def _end_slice(mma, it, k):
    """Let slice ``k - 1``'s wgmmas retire (slice ``k``'s may run on) and release its slot."""
    T.ptx.wgmma.wait_group.sync.aligned(1)
    if k > 0:
        # slice k-1's wgmmas have retired in this warp
        if mma.lane_id == 0:
            mma.ring.release(it + k - 1)


@T.inline
def _issue(mma, it, nk):
    encode_slot0(mma.plan, mma.a_smem, mma.b_smem, mma.row0, mma.desc_a, mma.desc_b, mma.col0)
    for k in T.serial(nk, unroll=k_loop_unroll(nk)):
        _begin_slice(mma, it, k)
        _end_slice(mma, it, k)


@T.inline
def _issue_group(mma, it, k0, count):
    """Slices ``k0 .. k0 + count`` of a tile into fresh tensor-core accumulators (the first
    slice's first wgmma writes them), a commit group a slice: a slice's slot goes back once the
    slice after it was issued and it retired (``wait_group(1)``); the last two may still run
    (:func:`_drain_group`)."""
    for j in T.unroll(count):
        mma.ring.wait_full(it + k0 + j)
        T.ptx.wgmma.fence.sync.aligned()
        mma_k_slot(mma.plan, mma.acc, mma.ring.slot(it + k0 + j), j == 0, mma.desc_a, mma.desc_b,
                   slot_step16(mma.a_smem), slot_step16(mma.b_smem))
        T.ptx.wgmma.commit_group.sync.aligned()
        if j < count - 1:
            T.ptx.wgmma.wait_group.sync.aligned(1)
            if j > 0:
                if mma.lane_id == 0:
                    mma.ring.release(it + k0 + j - 1)


@T.inline
def _drain_group(mma, it, k0, count):
    """Every wgmma of :func:`_issue_group` retired, before the accumulators are read; the last
    two slices' slots go back."""
    T.ptx.wgmma.wait_group.sync.aligned(0)
    if mma.lane_id == 0:
        if count > 1:
            mma.ring.release(it + k0 + count - 2)
        mma.ring.release(it + k0 + count - 1)


@T.inline
def _promoted_group(mma, it, k0, count):
    """Slices ``k0 .. k0 + count`` of a tile into fresh tensor-core accumulators, then all retired
    and their slots released (:func:`_issue_group`, :func:`_drain_group`)."""
    _issue_group(mma, it, k0, count)
    _drain_group(mma, it, k0, count)


@T.inline
def _promote(mma, acc):
    """The promotion: the tensor cores' partial sums ``acc`` into the fp32 total, by the CUDA
    cores' exact fp32 adds."""
    for r in T.unroll(mma.plan.acc_regs):
        mma.total[r] = mma.total[r] + acc[r]


@T.inline
def _zero_total(mma):
    """The total starts at 0 and every group adds (not ``total = acc`` at a tile's first group):
    with that branch ptxas kept the sums in the accumulators' registers and copied them back
    after every group, 64 MOVs a slice at 128x128."""
    for r in T.unroll(mma.plan.acc_regs):
        mma.total[r] = T.float32(0)


@T.inline
def _start_promoted(mma):
    """A promoted K loop's start: the slot-0 descriptors, and the total at 0 (:func:`_zero_total`)."""
    encode_slot0(mma.plan, mma.a_smem, mma.b_smem, mma.row0, mma.desc_a, mma.desc_b, mma.col0)
    _zero_total(mma)


def promotion_cuts(nk: int, promote: int, overlap: int, staggered: bool) -> tuple[list[int], int, list[int], list[int]]:
    """How a tile's ``nk`` slices are cut into promotion groups (of ``promote`` slices): ``lead``, the
    groups before the loop (a staggered consumer's: half a group, or half a run of ``overlap``
    groups, so that its drains fall between the other consumer's); ``runs`` turns of the loop over
    ``whole`` (one group, or a run of ``overlap`` groups); then ``tail``, the rest's groups (the last
    one shorter). A tile no longer than the lead is not staggered."""
    per_run = max(overlap, 1)
    lead = ([promote // 2] if overlap == 0 else [promote] * (overlap // 2)) if staggered else []
    lead = [g for g in lead if g > 0]
    if sum(lead) >= nk:
        lead = []
    runs, rest = divmod(nk - sum(lead), promote * per_run)
    tail = [promote] * (rest // promote) + ([rest % promote] if rest % promote else [])
    return lead, runs, [promote] * per_run, tail


@T.inline
def _promoted_groups(mma, it, first, groups, rest):
    """From slice ``first``: ``groups`` whole groups, then a group of the ``rest`` slices, each retired
    and added. No wgmma is pending over the loop's back edge (where ptxas would serialise every wgmma
    of the loop)."""
    for g in T.serial(groups):
        _promoted_group(mma, it, first + g * mma.promote, mma.promote)
        _promote(mma, mma.acc)
    if rest > 0:
        _promoted_group(mma, it, first + groups * mma.promote, rest)
        _promote(mma, mma.acc)


@T.inline
def _run_promoted(mma, it, nk, staggered):
    lead, groups, whole, tail = T.meta_var(promotion_cuts(nk, mma.promote, 0, staggered))
    first = T.meta_var(sum(lead))
    lead_size = T.meta_var(sum(lead))  # one group at most (half a group)
    tail_size = T.meta_var(sum(tail))  # one group at most (the rest of a group)
    _start_promoted(mma)
    if lead_size > 0:
        _promoted_group(mma, it, 0, lead_size)
        _promote(mma, mma.acc)
    _promoted_groups(mma, it, first, groups, tail_size)


@T.inline
def _run_promoted_each(mma, it, nk):
    """The promotion after every slice over a count known only at run time (v10's stream-K pieces and
    the units of a split that does not divide the slices): ``nk`` groups of one slice, each drained
    and added (``promote=1``: no group to cut, so no count to know at trace time)."""
    _start_promoted(mma)
    _promoted_groups(mma, it, 0, nk, 0)


@T.inline
def _slice_into(mma, acc, pos, fresh):
    """Ring position ``pos``'s slice into the accumulators ``acc`` (``fresh``: the first wgmma
    overwrites them): wait for its slot, issue its wgmmas, one commit group."""
    mma.ring.wait_full(pos)
    T.ptx.wgmma.fence.sync.aligned()
    mma_k_slot(mma.plan, acc, mma.ring.slot(pos), fresh, mma.desc_a, mma.desc_b, slot_step16(mma.a_smem),
               slot_step16(mma.b_smem))
    T.ptx.wgmma.commit_group.sync.aligned()


@T.inline
def _retire_all_but_last(mma, pos):
    """Every commit group but the newest has retired: slice ``pos`` (the one before it) too, so
    its slot goes back to the producers."""
    T.ptx.wgmma.wait_group.sync.aligned(1)
    if mma.lane_id == 0:
        mma.ring.release(pos)


def _overlapped_groups(mma, pos, sizes) -> None:
    """Groups of ``sizes`` slices from ring position ``pos``, group i into accumulator set i % 2,
    unrolled at trace time (plain Python around inline parts: which set a group takes is fixed):

        group i's slices:  wait full; wgmmas into set i % 2; commit
                           wait_group(1): everything but this slice retired; release the one before
        at group i's first slice, once group i - 1's last retired:  total += set (i - 1) % 2
        after the last:    wait_group(0); release it; total += its set

    so each group's adds are issued while the next group's wgmmas run, and the tensor cores drain
    once a run (``wait_group(0)``) instead of once a group. No wgmma is pending at the end of a run:
    the loop over runs carries none over its back edge (a loop of two groups that carried one over
    it, with no drain at all, made ptxas 13.0 wait after every wgmma: 16 waits for 16 wgmmas). The
    total starts at 0 (:func:`_zero_total`)."""
    sets = (mma.acc, mma.acc2)
    s = 0
    for i, size in enumerate(sizes):
        for j in range(size):
            _slice_into(mma, sets[i % 2], pos + s, j == 0)
            if s > 0:
                _retire_all_but_last(mma, pos + s - 1)
                if j == 0:
                    _promote(mma, sets[(i - 1) % 2])
            s += 1
    _retire(mma, pos, s)
    _promote(mma, sets[(len(sizes) - 1) % 2])


def _runs_unroll(mma):
    """The loop over runs: unrolled whole with ``unroll_k`` (fp8.unroll_k), else as nvcc likes."""
    return True if mma.unroll else None


@T.inline
def _run_overlapped(mma, it, nk, staggered):
    lead, runs, whole, tail = T.meta_var(promotion_cuts(nk, mma.promote, mma.overlap, staggered))
    first = T.meta_var(sum(lead))
    per_run = T.meta_var(mma.promote * mma.overlap)
    _start_promoted(mma)
    if len(lead) > 0:
        _overlapped_groups(mma, it, lead)
    for r in T.serial(runs, unroll=_runs_unroll(mma)):
        _overlapped_groups(mma, it + first + r * per_run, whole)
    if len(tail) > 0:
        _overlapped_groups(mma, it + first + runs * per_run, tail)


@T.inline
def _run_overlapped_each(mma, it, nk):
    """:func:`_run_promoted_each` with ``overlap``: runs of ``overlap`` one-slice groups in the two
    accumulator sets (:func:`_overlapped_groups`) while a whole run is left, then the rest (fewer than
    ``overlap`` slices, a count known at run time) drained a slice at a time."""
    per_run = T.meta_var(mma.overlap)
    whole = T.meta_var([1] * mma.overlap)
    _start_promoted(mma)
    for r in T.serial(nk // per_run):
        _overlapped_groups(mma, it + r * per_run, whole)
    _promoted_groups(mma, it, nk // per_run * per_run, nk % per_run, 0)


def _run_promotion(mma, it, nk, staggered) -> None:
    """A tile's promoted K loop, drained a group (``_run_promoted``) or a run (``_run_overlapped``)."""
    if mma.overlap:
        _run_overlapped(mma, it, nk, staggered)
    else:
        _run_promoted(mma, it, nk, staggered)


@T.inline
def _run_staggered(mma, it, nk, run):
    """Even consumers cut their groups from slice 0, odd ones half a group (or run) later: their
    drains take turns, and one consumer's wgmmas keep the tensor cores busy through the other's.
    ``run``: the K loop taking the cut (:func:`_run_promotion`, or :func:`_run_halves`)."""
    if mma.consumer % 2 == 0:
        run(mma, it, nk, False)
    else:
        run(mma, it, nk, True)


@T.inline
def _run_block_scaled(mma, it, nk, m0, n0):
    """:func:`_run_promoted` at ``promote=1`` with block scales (``fp8.BlockScales``): slice k is K
    block k, promoted as ``total += acc * scales``. The loop runs two slices a turn with two sets of
    scale registers, so block k + 1's scales load while slice k runs and are read a slice later,
    with no move between the sets (a move would wait for the load)."""
    encode_slot0(mma.plan, mma.a_smem, mma.b_smem, mma.row0, mma.desc_a, mma.desc_b, mma.col0)
    mma.scales.load(m0, n0, 0, 0)
    for p in T.serial(nk // 2):
        mma.scales.load(m0, n0, 2 * p + 1, 1)
        _promoted_group(mma, it, 2 * p, 1)
        mma.scales.promote(mma.total, mma.acc, p == 0, 0)
        mma.scales.load(m0, n0, T.min(2 * p + 2, nk - 1), 0)  # the last turn of an even nk reloads its own
        _promoted_group(mma, it, 2 * p + 1, 1)
        mma.scales.promote(mma.total, mma.acc, False, 1)
    if nk % 2 == 1:
        _promoted_group(mma, it, nk - 1, 1)
        mma.scales.promote(mma.total, mma.acc, nk == 1, 0)


def _block_groups(mma, pos, kb0, size, nk, m0, n0) -> None:
    """:func:`_overlapped_groups` with block scales (``fp8.BlockScales``): ``size`` one-slice groups
    from ring position ``pos`` (K blocks ``kb0 ..``), slice j into accumulator set j % 2 and its
    scales into scale register set j % 2, unrolled at trace time:

        slice j:  wgmmas into set j % 2; commit
                  wait_group(1); release slice j - 1;  total += set (j - 1) % 2 * its scales
                  load K block kb0 + j + 1's scales into scale set (j + 1) % 2 (slice j - 1's, just read)
        last:     wait_group(0); release it; total += its set * its scales

    A K block's scales are loaded two slices before the promotion that reads them in the source
    (ptxas sinks these read-only loads towards their use: what that costs is in ``fp8.py``), and the
    set a slice's sums are added with is the one loaded for its own K block. ``kb0`` even and ``size`` even but for a
    tile's tail keep the parity across the loop over runs: the run's last step loads the next run's
    first block into set 0. Before the first run, K block 0's scales go into set 0
    (:func:`_run_block_overlapped`); loads past the tile's last block read its last (``nk - 1``)."""
    if mma.scales.staged:
        _block_groups_staged(mma, pos, kb0, size, m0, n0)
        return
    sets = (mma.acc, mma.acc2)
    for j in range(size):
        _slice_into(mma, sets[j % 2], pos + j, True)
        if j > 0:
            _retire_all_but_last(mma, pos + j - 1)
            mma.scales.promote(mma.total, sets[(j - 1) % 2], False, (j - 1) % 2)
        mma.scales.load(m0, n0, T.min(kb0 + j + 1, nk - 1), (j + 1) % 2)
    _retire(mma, pos, size)
    mma.scales.promote(mma.total, sets[(size - 1) % 2], False, (size - 1) % 2)


def _block_groups_staged(mma, pos, kb0, size, m0, n0) -> None:
    """:func:`_block_groups` with the scales staged in the ring (``fp8.StagedScales``, knob
    ``stage_scales``): slice j's scales are read from its slot's shared memory into scale set
    j % 2 once its full-barrier wait passed (in :func:`_slice_into`), after its wgmmas are issued
    and before the slot is released a slice later; no global load, nothing loaded ahead."""
    sets = (mma.acc, mma.acc2)
    for j in range(size):
        _slice_into(mma, sets[j % 2], pos + j, True)
        mma.scales.load_staged(mma.ring.slot(pos + j), mma.row0, j % 2, m0, n0, kb0 + j)
        if j > 0:
            _retire_all_but_last(mma, pos + j - 1)
            mma.scales.promote(mma.total, sets[(j - 1) % 2], False, (j - 1) % 2)
    _retire(mma, pos, size)
    mma.scales.promote(mma.total, sets[(size - 1) % 2], False, (size - 1) % 2)


@T.inline
def _run_block_overlapped(mma, it, nk, m0, n0):
    """Block scales with ``overlap``: runs of ``overlap`` one-slice groups in two accumulator sets
    (each group's scaled adds under the next group's wgmmas, a drain a run), the total added in
    place from 0 (:func:`_zero_total`), each K block's scales in the register set of its sums'
    accumulator set (:func:`_block_groups`)."""
    runs = T.meta_var(nk // mma.overlap)
    tail = T.meta_var(nk % mma.overlap)
    _start_promoted(mma)
    if not mma.scales.staged:
        mma.scales.load(m0, n0, 0, 0)
    for r in T.serial(runs):
        _block_groups(mma, it + r * mma.overlap, r * mma.overlap, mma.overlap, nk, m0, n0)
    if tail > 0:
        _block_groups(mma, it + runs * mma.overlap, runs * mma.overlap, tail, nk, m0, n0)


@T.inline
def _issue_half(mma, it, k0, count, h, desc_b):
    """Half ``h``'s wgmmas of slices ``k0 .. k0 + count`` (their slots full: half 0 waits for each)
    into fresh accumulators, a commit group a slice. Half 1 is each slot's last reader: a slot goes
    back once its half-1 wgmmas retired (``wait_group(1)`` after the next slice's are issued); the
    last slice's may still run (:func:`_drain_half`)."""
    for j in T.unroll(count):
        if h == 0:
            mma.ring.wait_full(it + k0 + j)
        T.ptx.wgmma.fence.sync.aligned()
        mma_k_slot(mma.halves, mma.acc, mma.ring.slot(it + k0 + j), j == 0, mma.desc_a, desc_b,
                   slot_step16(mma.a_smem), slot_step16(mma.b_smem))
        T.ptx.wgmma.commit_group.sync.aligned()
        if h == 1 and j > 0:
            T.ptx.wgmma.wait_group.sync.aligned(1)
            if mma.lane_id == 0:
                mma.ring.release(it + k0 + j - 1)


@T.inline
def _drain_half(mma, it, k0, count, h):
    """Every wgmma of :func:`_issue_half` retired, before the sums are read; after half 1, the
    last slice's slot goes back."""
    T.ptx.wgmma.wait_group.sync.aligned(0)
    if h == 1:
        if mma.lane_id == 0:
            mma.ring.release(it + k0 + count - 1)


@T.inline
def _promote_half(mma, h):
    """Half ``h``'s sums into its registers of the total (``fp8.HalfPlan``)."""
    NR = T.meta_var(mma.plan.acc_stride)
    NH = T.meta_var(mma.halves.n_regs)
    for mi in T.unroll(mma.plan.m_atoms):
        for r in T.unroll(NH):
            mma.total[mi * NR + h * NH + r] = mma.total[mi * NR + h * NH + r] + mma.acc[mi * NH + r]


def _halves_group(mma, it, k0, count, scale_set=0, under=None, staged_at=None) -> None:
    """One promotion group in halves (knob ``halves``): half 0's wgmmas, drained and added into
    its half of the total, then half 1's from the same slots (B ``blk_n / 2`` rows on), each slot
    back once its half-1 wgmmas retired, then its adds. With block scales (one slice a group) each half is
    scaled by its own B block and the rows' A scales of register set ``scale_set``. While one
    consumer drains and adds, the other's wgmmas keep the tensor cores busy. With ``under``
    (``epilogue.PairsUnder``: a tile's first group with ``epi_under``), the previous tile's half h of
    the columns is stored while half h's wgmmas run, between their issue and their drain. With
    ``staged_at`` (the tile's ``(m0, n0)``: block scales staged in the ring, ``fp8.StagedScales``),
    slice ``k0``'s scales are read from its slot into ``scale_set`` under half 0's wgmmas."""
    for h in range(2):
        desc_b = mma.desc_b if h == 0 else mma.desc_b_half
        _issue_half(mma, it, k0, count, h, desc_b)
        if h == 0 and staged_at is not None:
            mma.scales.load_staged(mma.ring.slot(it + k0), mma.row0, scale_set, staged_at[0], staged_at[1], k0)
        if under is not None:
            _store_under(under, h)
        _drain_half(mma, it, k0, count, h)
        if mma.scales is not None:
            mma.scales.promote_half(mma.total, mma.acc, mma.halves, h, scale_set)
        else:
            _promote_half(mma, h)


@T.inline
def _encode_halves(mma):
    encode_slot0(mma.plan, mma.a_smem, mma.b_smem, mma.row0, mma.desc_a, mma.desc_b, mma.col0)
    mma.desc_b_half[0] = mma.desc_b[0] + T.Cast("uint64", mma.halves.b_offset16)
    _zero_total(mma)


@T.inline
def _halves_groups(mma, it, first, groups, rest):
    """From slice ``first``: ``groups`` whole groups in halves, then a group of the ``rest`` slices."""
    for g in T.serial(groups):
        _halves_group(mma, it, first + g * mma.promote, mma.promote)
    if rest > 0:
        _halves_group(mma, it, first + groups * mma.promote, rest)


@T.inline
def _run_halves(mma, it, nk, staggered):
    """A tile's K loop in halves: a staggered consumer's half group first (``promotion_cuts``),
    whole groups of ``promote`` slices, then the rest."""
    lead, groups, whole, tail = T.meta_var(promotion_cuts(nk, mma.promote, 0, staggered))
    first = T.meta_var(sum(lead))
    rest = T.meta_var(sum(tail))
    _encode_halves(mma)
    if first > 0:
        _halves_group(mma, it, 0, first)
    _halves_groups(mma, it, first, groups, rest)


@T.inline
def _run_block_halves(mma, it, nk, m0, n0, under=None):
    """Block scales in halves: one slice a group, K block k + 1's scales loaded into the other
    register set while slice k runs (as :func:`_run_block_scaled`). With ``under`` (``epi_under``),
    the first pair of slices is peeled, the previous tile's halves stored under slice 0's
    (:func:`_halves_group`)."""
    peeled = T.meta_var(0 if under is None else min(nk, 2))  # slices before the loop
    _encode_halves(mma)
    mma.scales.load(m0, n0, 0, 0)
    if peeled == 2:
        mma.scales.load(m0, n0, 1, 1)
        _halves_group(mma, it, 0, 1, 0, under)
        mma.scales.load(m0, n0, T.min(2, nk - 1), 0)
        _halves_group(mma, it, 1, 1, 1)
    if peeled == 1:
        _halves_group(mma, it, 0, 1, 0, under)
    for p in T.serial(peeled // 2, nk // 2):
        mma.scales.load(m0, n0, 2 * p + 1, 1)
        _halves_group(mma, it, 2 * p, 1, 0)
        mma.scales.load(m0, n0, T.min(2 * p + 2, nk - 1), 0)  # the last turn of an even nk reloads its own
        _halves_group(mma, it, 2 * p + 1, 1, 1)
    if nk % 2 == 1 and peeled != 1:
        _halves_group(mma, it, nk - 1, 1, 0)


@T.inline
def _run_block_halves_staged(mma, it, nk, m0, n0, under=None):
    """:func:`_run_block_halves` with the scales staged in the ring (``fp8.StagedScales``, knob
    ``stage_scales``): slice k's scales are read from its slot's shared memory once its full-barrier
    wait passed, under half 0's wgmmas (:func:`_halves_group`), into one register set; no global
    load, nothing loaded ahead. With ``under``, slice 0 is peeled for the previous tile's halves."""
    peeled = T.meta_var(0 if under is None else 1)  # slices before the loop
    _encode_halves(mma)
    if peeled == 1:
        _halves_group(mma, it, 0, 1, 0, under, (m0, n0))
    for k in T.serial(peeled, nk):
        _halves_group(mma, it, k, 1, 0, None, (m0, n0))


@T.inline
def _store_under(under, part):
    """Part ``part`` of the previous tile (``under``: ``epilogue.PairsUnder``), if there is one."""
    if under.has_prev:
        under.store(part)


@T.inline
def _run_halves_under(mma, it, nk, under):
    """:func:`_run_halves` with the previous tile's epilogue under the first group (``epi_under``):
    half h's wgmmas are issued, the previous tile's half h of the columns is stored from its pairs
    while they run, then they retire and are added as in any group; then the other groups."""
    first = T.meta_var(min(mma.promote, nk))
    lead, groups, whole, tail = T.meta_var(promotion_cuts(nk - first, mma.promote, 0, False))
    rest = T.meta_var(sum(tail))
    _encode_halves(mma)
    _halves_group(mma, it, 0, first, 0, under)
    _halves_groups(mma, it, first, groups, rest)


@T.inline
def _run_promoted_under(mma, it, nk, under):
    """:func:`_run_promoted` with the previous tile's epilogue under the first group (``epi_under``):
    the group's wgmmas are issued, the previous tile is stored from its pairs while they run, then
    they retire and are added as in any group; then the other groups."""
    first = T.meta_var(min(mma.promote, nk))
    lead, groups, whole, tail = T.meta_var(promotion_cuts(nk - first, mma.promote, 0, False))
    rest = T.meta_var(sum(tail))
    _start_promoted(mma)
    _issue_group(mma, it, 0, first)
    _store_under(under, 0)
    _drain_group(mma, it, 0, first)
    _promote(mma, mma.acc)
    _promoted_groups(mma, it, first, groups, rest)


@T.inline
def _retire(mma, it, nk):
    T.ptx.wgmma.wait_group.sync.aligned(0)
    if mma.lane_id == 0:
        mma.ring.release(it + nk - 1)


@T.inline
def _issue_under(mma, it, nk, epi, pairs, m_prev, n_prev, has_prev, chunk_it):
    chunks_per_tile = T.meta_var(epi.chunks_per_tile)
    chunks_under = T.meta_var(min(chunks_per_tile, nk))  # one under each of the first slices
    encode_slot0(mma.plan, mma.a_smem, mma.b_smem, mma.row0, mma.desc_a, mma.desc_b, mma.col0)
    for j in T.unroll(chunks_under):
        _begin_slice(mma, it, j)
        _end_slice(mma, it, j)
        if has_prev:
            # after the wait, not between the issue and the wait: 0.8% fewer SM cycles at 4096^3
            # on an H100 (benchmarks/results/2026-11-23_h100_epi_under/)
            epi.store_chunk(pairs, m_prev, n_prev, chunk_it, j)
    for k in T.serial(nk - chunks_under, unroll=k_loop_unroll(nk)):
        _begin_slice(mma, it, chunks_under + k)
        _end_slice(mma, it, chunks_under + k)
    if has_prev:
        for j in T.unroll(chunks_under, chunks_per_tile):
            epi.store_chunk(pairs, m_prev, n_prev, chunk_it, j)


@dataclass(frozen=True)
class Consumer:
    """One consumer warpgroup's K loop: the ring it reads, the two operand tiles in wgmma's
    order (``a_smem`` fills the 64-row slot: A, or B under swap AB), its accumulators, the
    descriptor registers, and its first row of ``a_smem`` (``row0``)."""

    plan: HopperPlan
    ring: Ring
    a_smem: object  # [stages, rows, blk_k], 128B-swizzled: wgmma's A (64-row atoms)
    b_smem: object  # [stages, cols, blk_k]: wgmma's B (its N)
    acc: object  # float32[acc_regs] local: the accumulators
    desc_a: object  # uint64[1] local: slot 0's descriptor of a_smem at row0
    desc_b: object  # uint64[1] local: slot 0's descriptor of b_smem
    row0: object  # this warpgroup's first row of a_smem
    lane_id: object
    promote: int = 0  # fp8: slices between promotions into ``total`` (0: none, acc holds the sums)
    total: object = None  # float32[acc_regs] local: the promoted sums (with promote)
    scales: object = None  # fp8.BlockScales: block scales applied at each promotion (promote=1), or None
    overlap: int = 0  # fp8: promotion groups issued back to back, in two accumulator sets (0: one set)
    acc2: object = None  # float32[acc_regs] local: the second set (with overlap)
    unroll: bool = False  # fp8 with overlap: the loop over runs unrolled over the whole tile (knob unroll_k)
    stagger: bool = False  # fp8: odd consumers' promotion groups start half a group (or run) later
    consumer: object = 0  # this consumer's index (with stagger)
    halves: object = None  # fp8.HalfPlan: each group's wgmmas in two half-width groups (acc holds a half), or None
    desc_b_half: object = None  # uint64[1] local: slot 0's descriptor of b_smem at the second half's rows
    col0: object = 0  # this warpgroup's first row of b_smem (swap AB's split_m: its rows of M)

    @property
    def sums(self):
        """Where a tile's sums are once :meth:`run` returns: ``total`` with promotion, else ``acc``."""
        return self.total if self.promote else self.acc

    def issue(self, pos, num_slices) -> None:
        """``num_slices`` K slices of one tile from ring positions ``pos, pos + 1, ...``: wait for
        each slot, issue its wgmmas, and release each slot once its wgmmas retired (one slice
        behind: ``wait_group(1)``) to the producer of every CTA of the cluster; the accumulators
        start over at the first slice. The last slice's wgmmas may still run: :meth:`retire`
        waits for them."""
        _issue(self, pos, num_slices)

    def retire(self, pos, num_slices) -> None:
        """Wait for the last of :meth:`issue`'s wgmmas and release its slot."""
        _retire(self, pos, num_slices)

    def run(self, pos, num_slices, m0=None, n0=None) -> None:
        """A tile's K slices, issued and retired; with ``promote``, every ``promote`` slices run
        into fresh accumulators, retire, and are added into ``total`` in fp32 (what DeepGEMM and
        CUTLASS do for fp8: Hopper's fp8 wgmma keeps fewer mantissa bits in a long K chain). With
        block ``scales``, ``m0`` (this consumer's first row of the tile) and ``n0`` (the tile's first
        column) say whose scales: the tile's whole K (slice g is K block g; with ``overlap``, each
        slice's scales in the register set of its accumulator set: :func:`_run_block_overlapped`).
        With ``overlap``, the groups alternate between ``acc`` and ``acc2`` and each one's adds run
        under the next one's wgmmas (:func:`_overlapped_groups`), ``overlap`` groups between two
        drains; with ``stagger``, odd consumers cut their groups half a group (or run) later
        (:func:`_run_staggered`)."""
        if self.halves is not None:
            if not self.promote or not isinstance(num_slices, int) or self.desc_b_half is None:
                raise ValueError("Consumer.run with halves needs a promotion, a fixed number of slices and the "
                                 "second half's descriptor register (desc_b_half); fp8.check refuses the knobs")
            if self.scales is not None:
                if m0 is None or n0 is None or self.promote != 1:
                    raise ValueError("Consumer.run with halves and block scales needs promote=1 and the tile's m0 "
                                     "and n0")
                (_run_block_halves_staged if self.scales.staged else _run_block_halves)(self, pos, num_slices, m0, n0)
            elif self.stagger:
                _run_staggered(self, pos, num_slices, _run_halves)
            else:
                _run_halves(self, pos, num_slices, False)
        elif self.scales is not None:
            if m0 is None or n0 is None or self.promote != 1 or not isinstance(num_slices, int):
                raise ValueError("Consumer.run with block scales needs promote=1, a fixed number of slices and the "
                                 "tile's m0 and n0 (fp8.check refuses the knobs; a schedule that runs such a tile "
                                 "must pass them)")
            if self.overlap:
                if self.acc2 is None or self.overlap % 2:
                    raise ValueError("Consumer.run with block scales and overlap needs the second accumulator set "
                                     "(acc2) and an even overlap (fp8.check refuses the knobs)")
                _run_block_overlapped(self, pos, num_slices, m0, n0)
            else:
                _run_block_scaled(self, pos, num_slices, m0, n0)
        elif self.promote:
            if not isinstance(num_slices, int):
                if self.promote != 1 or self.stagger or (self.overlap and self.acc2 is None):
                    raise ValueError("Consumer.run with promote over a run-time number of slices needs promote=1 and "
                                     "stagger=False, and with overlap the second accumulator set (acc2) "
                                     "(fp8.check_split refuses the knobs elsewhere)")
                (_run_overlapped_each if self.overlap else _run_promoted_each)(self, pos, num_slices)
            elif self.overlap and self.acc2 is None:
                raise ValueError("Consumer.run with promote and overlap needs the second accumulator set (acc2) "
                                 "(fp8.check refuses the knobs elsewhere)")
            elif self.stagger:
                _run_staggered(self, pos, num_slices, _run_promotion)
            else:
                _run_promotion(self, pos, num_slices, False)
        else:
            self.issue(pos, num_slices)
            self.retire(pos, num_slices)

    def issue_under(self, pos, num_slices, epi, pairs, m_prev, n_prev, has_prev, chunk_it) -> None:
        """:meth:`issue` with the previous tile's epilogue under it (v9's ``epi_under``): once
        slice ``j``'s wgmmas are issued and slice ``j - 1``'s have retired, and while slice ``j``'s
        run, chunk ``j`` of the previous tile (``has_prev``, a run-time condition) goes from its
        16-bit ``pairs`` (``epilogue.acc_to_pairs``) through ``epi`` (a ``ChunkedEpilogue``) to D.
        Chunks past the tile's last slice (a K of fewer slices than chunks) follow it."""
        _issue_under(self, pos, num_slices, epi, pairs, m_prev, n_prev, has_prev, chunk_it)

    def run_under(self, pos, num_slices, under, m0=None, n0=None) -> None:
        """:meth:`run` for a promoted tile (no ``overlap``, ``stagger`` or block scales) with the
        previous tile's epilogue under its first promotion group (v9's ``epi_under`` with fp8; block
        scales in halves, with ``m0`` and ``n0`` as :meth:`run` takes them):
        ``under`` (``epilogue.PairsUnder``) stores the previous tile from its 16-bit pairs, in two
        parts with ``halves`` (each half's columns under that half's wgmmas), while the group's
        wgmmas run; they then retire and are added into the zeroed total as in any group (sums
        that became the total by a copy made ptxas 13.0 serialise every wgmma: too few registers
        for the wgmma pipeline)."""
        if not self.promote or self.overlap or self.stagger or not isinstance(num_slices, int) \
                or (self.scales is not None and (self.halves is None or m0 is None or n0 is None)):
            raise ValueError("Consumer.run_under needs a promotion with one accumulator set, no stagger, a fixed "
                             "number of slices, and block scales only in halves with the tile's m0 and n0 "
                             "(fp8.check refuses epi_under elsewhere)")
        if self.scales is not None:
            (_run_block_halves_staged if self.scales.staged else _run_block_halves)(self, pos, num_slices, m0, n0,
                                                                                    under)
        elif self.halves is not None:
            _run_halves_under(self, pos, num_slices, under)
        else:
            _run_promoted_under(self, pos, num_slices, under)

    def with_plan(self, plan: HopperPlan) -> "Consumer":
        """The same K loop for tiles of another width (v9's narrow ``tail_n`` tiles)."""
        return dataclasses.replace(self, plan=plan)
