"""Split-K (v10, v11): the K loop of one output tile shared by ``split_k`` work units, and the
reduction of their fp32 partial tiles inside the kernel, by the last unit of a tile to finish.

Work units. The persistent scheduler walks a grid whose columns are (N tile, split) pairs:
virtual column ``v = n * split_k + s``, so the ``split_k`` units of a tile sit next to each other
in every tile order (they run in the same wave, and their partials are still in L2 when the last
one sums them). Unit ``s`` runs K slices ``[s * k_tiles / split_k, (s+1) * k_tiles / split_k)``
(integer division: the slices differ by at most one, none is empty since split_k <= k_tiles).

The reduction, per consumer warpgroup (each owns its part of the tile's accumulators):

    every unit:   st.global  its fp32 accumulators -> workspace slot (tile, s, consumer)
                  bar.sync 1+c                      (all 128 threads' stores are before ...)
                  thread 0: fence.acq_rel.gpu; old = atom.acq_rel.gpu.add(count[tile, c], 1)
                            flag[c] = old           (... the release of thread 0's atomic)
                  bar.sync 1+c
    the last      flag[c] == split_k - 1: every other unit's slot is written and visible
    (flag[c] ==   (its atomic came before ours; ours acquires: MEMBAR + L1 invalidate)
     split_k-1):  Dreg = slot 0 + slot 1 + ... + slot split_k-1, in that order (ld.global.cg)
                  thread 0: count[tile, c] = 0      (ready for the next launch)
                  the usual epilogue: Dreg -> shared -> TMA store
    the others:   nothing more: on to their next unit

No unit ever waits for another, so residency and scheduling order cannot deadlock it. The sum
runs over the slots in split order whoever arrives last (its own partial too goes through the
workspace), so the result is the same bits on every run. A slot is written in the fragment's
own order (register quad j of thread t at ``(j * 128 + t) * 4``): 512 contiguous bytes per quad
per warpgroup, so every store and load is a whole 16-byte vector per thread, fully coalesced.

The atomic reduction (v10's ``reduce="atomic"``, off by default): the slots above cost the last
unit of a tile ``split_k`` slot reads on one SM after its own K loop (split 4 of a 128x128 tile:
256 KiB through one SM's L2 port, several microseconds on a 10 us kernel). With it, every unit
adds its partial into the part's one slot with ``red.global.add.v4.f32`` (the adds happen in L2,
spread over the units' SMs), counts as above, and the last reads the one slot back, stores zeros
over it for the next launch and runs the epilogue:

    every unit:   red.global.add  its fp32 accumulators -> the part's slot (tile, consumer)
                  bar.sync 1+c; thread 0: fence.acq_rel.gpu; old = atom.acq_rel.gpu.add; bar.sync
    the last:     Dreg = slot (ld.global.cg); slot = 0; count = 0; the usual epilogue

The sum's order is the order the adds reach L2, so the bits may differ from run to run (within
fp32 rounding of the partials); ``"slots"`` keeps the same bits on every run.

Workspace (the runtime allocates it, ``runtime.GemmModule``; the manifest's
``launch["workspace"]`` says how big): per ``m_step`` rows of M (a row of cluster tiles),
``float32_per_m_step`` partial elements (``split_k`` slots of every tile) and
``int32_per_m_step`` counters (one per tile and consumer), zeroed once: the last unit of each
tile puts its counter back to zero. At least one element each, so a split_k=1 kernel (which
never touches them) still gets valid pointers. Two launches of one module on two streams at
once would share the runtime's workspace: launch a module from one stream at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

from ..core.config import ConfigError, GemmConfig
from . import common

MAX_SPLIT_K = 32  # more slots than this cost more in partial traffic than they spread
REDUCE_MODES = ("slots", "atomic")  # where a tile's units meet: a slot each, or one slot they add into


def split_k(cfg: GemmConfig) -> int:
    return dict(cfg.extra).get("split_k", 1)


def check_split_k(cfg: GemmConfig) -> None:
    """``split_k``: an int from 1 to the tile's K slices (each unit gets at least one), at most
    :data:`MAX_SPLIT_K`."""
    s = split_k(cfg)
    most = min(cfg.k_tiles, MAX_SPLIT_K)
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= most:
        raise ConfigError(
            f"split_k={s!r}: K={cfg.K} has {cfg.k_tiles} slices of blk_k={cfg.blk_k}, and each of the "
            f"split_k units needs at least one (and at most {MAX_SPLIT_K} units); use split_k from 1 to {most}"
        )


def reduce_mode(cfg: GemmConfig) -> str:
    return dict(cfg.extra).get("reduce", REDUCE_MODES[0])


def atomic(cfg: GemmConfig) -> bool:
    """Whether the units of a tile add into one slot (``reduce="atomic"`` with ``split_k`` > 1)."""
    return split_k(cfg) > 1 and reduce_mode(cfg) == "atomic"


def check_reduce(cfg: GemmConfig) -> None:
    """``reduce``: one of :data:`REDUCE_MODES`; ``"atomic"`` only where there is something to add
    (``split_k`` > 1)."""
    mode = reduce_mode(cfg)
    if mode not in REDUCE_MODES:
        raise ConfigError(f"reduce={mode!r}: use one of {', '.join(map(repr, REDUCE_MODES))}")
    if mode == "atomic" and split_k(cfg) == 1:
        raise ConfigError("reduce='atomic' adds split-K units' partials, and split_k=1 has none: use split_k >= 2, "
                          "or leave reduce at 'slots'")


def cluster_grid(cfg: GemmConfig, M=None) -> tuple:
    """The grid of cluster tiles (for ``M``, default cfg.M; a runtime M gives a runtime number
    of rows); the scheduler walks it with ``split_k`` columns per tile column."""
    cm, cn = common.cluster_shape(cfg)
    M = cfg.M if M is None else M
    return common.tiles_over(M, cfg.blk_m * cm), -(-cfg.grid_mn[1] // cn)


def check_grid(cfg: GemmConfig) -> None:
    """What v10 and v11 check past their tiles: clusters, ``split_k``, the schedule over
    ``split_k`` columns per tile column, a runtime M."""
    common.check_cluster(cfg)
    check_split_k(cfg)
    rows, cols = cluster_grid(cfg)
    common.check_schedule(cfg, grid=(rows, cols * split_k(cfg)))
    common.check_dynamic_m(cfg)


def tile_workspace(cfg: GemmConfig) -> dict:
    """Per row of cluster tiles (blk_m x cluster_m rows of M): cluster_m x (cluster columns x
    cluster_n) CTA tiles, each with a counter per consumer and split_k partial slots."""
    cm, cn = common.cluster_shape(cfg)
    tiles = cm * cluster_grid(cfg)[1] * cn
    return workspace(cfg, cfg.blk_m * cm, tiles, cfg.num_warpgroups)


def launch(cfg: GemmConfig) -> dict:
    """The launch of a split-K rung: persistent clusters, a producer warpgroup beside the
    consumers, and the workspace the runtime allocates."""
    cm, cn = common.cluster_shape(cfg)
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True, cluster=cm * cn)
    info = {**info, "threads": info["threads"] + common.THREADS_PER_WG, "cluster_shape": [cm, cn],
            "workspace": tile_workspace(cfg)}
    return common.dynamic_launch(cfg, info)


def workspace(cfg: GemmConfig, m_step: int, tiles_per_m_step: int, consumers: int) -> dict:
    """The manifest's ``launch["workspace"]``: what the runtime allocates for ``M`` rows,
    ``ceil(M / m_step)`` times the per-step counts (at least one element of each)."""
    s = split_k(cfg)
    slots = 1 if atomic(cfg) else s  # the atomic reduction: one slot a tile part, its units add into it
    return {
        "m_step": m_step,
        "float32_per_m_step": tiles_per_m_step * slots * cfg.blk_m * cfg.blk_n if s > 1 else 0,
        "int32_per_m_step": tiles_per_m_step * consumers if s > 1 else 0,
        "zeroed": True,
    }


def workspace_elems(ws: dict, M, kind: str, num_ctas=None):
    """Elements of the ``kind`` ("float32" or "int32") workspace for ``M`` rows and a launch of
    ``num_ctas`` CTAs: a Python int, or an expression of a runtime M or CTA count (the kernel's
    buffer shape; the host code checks it). At least one element."""
    per, per_cta = ws[f"{kind}_per_m_step"], ws.get(f"{kind}_per_cta", 0)
    if per == 0 and per_cta == 0:
        return 1
    total = 0
    if per:
        step = ws["m_step"]
        total = -(-M // step) * per if isinstance(M, int) else T.truncdiv(M + (step - 1), step) * per
    if per_cta:
        if num_ctas is None:
            raise ValueError("this workspace grows with the launch's CTAs: pass num_ctas")
        total = total + num_ctas * per_cta
    return total


# -- the index arithmetic, on Python ints and PrimExprs alike (the kernels and the model test) ----
def unit(col, S):
    """Scheduler column ``col`` of a split-K grid -> (tile column, split)."""
    return col // S, col % S


def k_slices(split, S, k_tiles):
    """(first K slice, slice count) of split ``split`` of ``S``: the counts differ by at most one;
    where ``S`` divides ``k_tiles`` the count is the int ``k_tiles // S`` (a fixed count: fp8's
    promoted K loop takes no other, ``fp8.check_split``)."""
    if isinstance(k_tiles, int) and isinstance(S, int) and k_tiles % S == 0:
        return split * (k_tiles // S), k_tiles // S
    k0 = split * k_tiles // S
    return k0, (split + 1) * k_tiles // S - k0


def counter_index(m_tile, n_tile, c, n_tiles, consumers):
    """The counter of consumer ``c``'s part of CTA tile (m_tile, n_tile)."""
    return (m_tile * n_tiles + n_tile) * consumers + c


def slot_offset(counter, split, S, quad, thread, acc_regs):
    """fp32 offset of register quad ``quad`` of warpgroup thread ``thread`` in the partial slot
    of split ``split`` of ``counter``'s tile part: the ``S`` slots of a part are contiguous,
    each in fragment order (quad-major, 16 bytes per thread)."""
    return (counter * S + split) * (acc_regs * 128) + (quad * 128 + thread) * 4


@T.inline
def count_in(C, counter, wtid, flag, c):
    """Count this consumer's stores (or adds) of its part on ``counter``: the barrier orders every
    thread's writes (and its read of ``flag``) before thread 0's release, whose fence and acq_rel
    atomic make them visible at GPU scope to the unit that counts last; ``flag[c]`` then holds how
    many counted before this one."""
    T.ptx.bar.sync(T.Cast("uint32", 1 + c), 128)
    if wtid == 0:
        old = T.alloc_local((1,), "uint32")
        T.ptx["fence.acq_rel.gpu"]()
        T.ptx["atom.acq_rel.gpu.global.add.u32"](old[0], C.ptr_to([counter]), T.uint32(1))
        flag[c] = T.Cast("int32", old[0])
    T.ptx.bar.sync(T.Cast("uint32", 1 + c), 128)


@T.inline
def publish(P, C, Dreg, acc_regs, base, counter, wtid, flag, c):
    """Store this consumer's fp32 accumulators at ``base`` of the workspace (this thread's first
    quad; each quad 512 floats on) and count them on ``counter``: ``flag[c]`` then holds how many
    counted before (split-K units here, stream-K pieces in ``streamk.meet``)."""
    for j in T.unroll(acc_regs // 4):
        T.ptx["st.global.v4.f32"](P.ptr_to([base + j * 512]),
                                  Dreg[4 * j], Dreg[4 * j + 1], Dreg[4 * j + 2], Dreg[4 * j + 3])
    count_in(C, counter, wtid, flag, c)


@T.inline
def add_and_count(P, C, Dreg, acc_regs, counter, wtid, flag, c):
    """The atomic reduction, every unit: add this consumer's fp32 accumulators into the part's one
    slot (``red.global.add.v4.f32``: performed in L2, nothing comes back) and count them as
    :func:`publish` does; ``flag[c]`` then holds how many units counted before this one."""
    base = slot_offset(counter, 0, 1, 0, wtid, acc_regs)
    for j in T.unroll(acc_regs // 4):
        T.ptx["red.global.add.v4.f32"](P.ptr_to([base + j * 512]),
                                       Dreg[4 * j], Dreg[4 * j + 1], Dreg[4 * j + 2], Dreg[4 * j + 3])
    count_in(C, counter, wtid, flag, c)


@T.inline
def take_sum(P, C, Dreg, acc_regs, counter, wtid):
    """The atomic reduction, the last unit: its accumulators become the part's slot, which every
    unit (this one too) has added into; zeros go back over the slot and the counter for the next
    launch (the last accesses to them in this launch: every unit of the tile has counted)."""
    part = T.alloc_local((4,), "float32")
    base = slot_offset(counter, 0, 1, 0, wtid, acc_regs)
    for j in T.unroll(acc_regs // 4):
        T.ptx["ld.global.cg.v4.f32"](part[0], part[1], part[2], part[3], P.ptr_to([base + j * 512]))
        T.ptx["st.global.v4.f32"](P.ptr_to([base + j * 512]), T.float32(0), T.float32(0), T.float32(0),
                                  T.float32(0))
        for e in T.unroll(4):
            Dreg[4 * j + e] = part[e]
    if wtid == 0:
        T.ptx["st.relaxed.gpu.global.u32"](C.ptr_to([counter]), T.uint32(0))


@T.inline
def publish_and_count(P, C, Dreg, acc_regs, counter, split, wtid, flag, c, S):
    """Every unit: store this consumer's partial into its slot of the workspace and count it
    on the tile's counter; ``flag[c]`` then holds how many units of the tile counted before this
    one (``S - 1``: this is the last)."""
    publish(P, C, Dreg, acc_regs, slot_offset(counter, split, S, 0, wtid, acc_regs), counter, wtid, flag, c)


@T.inline
def sum_partials(P, C, Dreg, acc_regs, counter, wtid, S):
    """The last unit of a tile: its accumulators become the sum of the part's ``S`` slots, in
    split order, and the counter goes back to zero.

    ``ld.global.cg`` reads L2, where the other SMs' stores are (the acquire above also
    invalidated this SM's L1). The counter reset is the last access to it in this launch: every
    unit of the tile has counted. (ptxas hoists the loads of all slots ahead of the adds; with
    128 accumulators a consumer and split_k >= 3 that spills one register here, once a tile.)"""
    part = T.alloc_local((4,), "float32")
    for j in T.unroll(acc_regs // 4):
        for s in T.unroll(S):
            T.ptx["ld.global.cg.v4.f32"](part[0], part[1], part[2], part[3],
                                        P.ptr_to([slot_offset(counter, s, S, j, wtid, acc_regs)]))
            for e in T.unroll(4):
                if s == 0:  # the accumulators were stored: overwrite, do not add
                    Dreg[4 * j + e] = part[e]
                else:
                    Dreg[4 * j + e] = Dreg[4 * j + e] + part[e]
    if wtid == 0:
        T.ptx["st.relaxed.gpu.global.u32"](C.ptr_to([counter]), T.uint32(0))


@dataclass(frozen=True)
class Partials:
    """One consumer warpgroup's side of the workspace where the parts of a tile meet (split-K
    units here, stream-K pieces in ``streamk``): the fp32 ``slots`` and int32 ``counters`` in
    global memory, the consumer's accumulators, and the shared ``flag`` through which its thread 0
    tells the others how many parts counted before this one."""

    slots: object  # P: float32 partial slots
    counters: object  # C: int32 counters, one per tile part and consumer
    acc: object  # float32[acc_regs] local: the accumulators
    acc_regs: int
    thread: object  # this thread in its warpgroup (0 counts)
    flag: object  # shared int32[consumers]
    consumer: object  # this consumer warpgroup, 0-based

    def publish_unit(self, counter, split, splits) -> None:
        """Split-K: this unit's partial into slot ``split`` of ``counter``'s tile part, counted
        (:func:`publish_and_count`)."""
        publish_and_count(self.slots, self.counters, self.acc, self.acc_regs, counter, split, self.thread,
                          self.flag, self.consumer, splits)

    def add_unit(self, counter) -> None:
        """Split-K, the atomic reduction: this unit's partial added into ``counter``'s tile part's
        one slot, counted (:func:`add_and_count`)."""
        add_and_count(self.slots, self.counters, self.acc, self.acc_regs, counter, self.thread, self.flag,
                      self.consumer)

    def take_units(self, counter) -> None:
        """Split-K, the atomic reduction, the last unit: the accumulators become the slot's sum,
        the slot and the counter go back to zero (:func:`take_sum`)."""
        take_sum(self.slots, self.counters, self.acc, self.acc_regs, counter, self.thread)

    def counted_before(self):
        """How many parts of the tile counted before this one (after a publish or a meet)."""
        return self.flag[self.consumer]

    def sum_units(self, counter, splits) -> None:
        """Split-K, the last unit: the accumulators become the sum of the ``splits`` slots in
        split order (:func:`sum_partials`)."""
        sum_partials(self.slots, self.counters, self.acc, self.acc_regs, counter, self.thread, splits)
