"""Test support: deliberately broken variants of real rungs, one protocol fault each.

The barrier checker must catch every one on the CPU (``tests/test_barriers.py``), naming the
barrier, the phase and the role; on a GPU the watchdog build must turn the ones that hang into
a named exception (``benchmarks/barrier_watchdog.py``). Nothing here is shipped: a fault is
injected while a real rung is traced, either by handing the rung a barrier class that misbehaves
in one way (the rung module's class names are swapped for the duration of the trace), or by
editing the traced TIR (moving one statement).

    =================================  ======  =====================================================
    variant                            rung    fault
    =================================  ======  =====================================================
    expect_tx_one_box_over             v5 H    arrive.expect_tx counts one A box more than TMA moves
    arrival_missing                    v5 H    the last MMA warp never releases a stage
    phase_one_late                     v5 H    the MMA waits flip their phase one K slice late
    release_before_wait_group          v5 H    a stage is released before wgmma.wait_group retired
                                               the group that reads it
    multicast_missing_cta              v5 H    (2-CTA clusters) rank 1 multicasts its half of the
                                               B slice to itself only
    bw_expect_tx_one_box_over          v6 B    as above, on the Blackwell persistent rung
    bw_epilogue_arrival_missing        v6 B    one epilogue thread never frees its accumulator
    ws_release_before_wait_group       v7 H    a consumer warp releases a stage before
                                               wgmma.wait_group retired the group that reads it
    cluster_release_own_only           v8 H    (2x1 clusters) each consumer warp releases a stage
                                               to its own CTA's producer only, not to the peer's,
                                               which multicasts into it too
    cluster_multicast_own_only         v8 H    (2x1 clusters) each CTA multicasts its half of the
                                               B slice to itself only: the mask misses the peer
    bw_pair_tma_own_barrier            v8 B    (CTA pairs) the TMA copies complete on the issuing
                                               CTA's tma2mma, not on the pair leader's
    cluster_expect_tx_one_box_over     v9 H    (2x1 clusters) arrive.expect_tx counts one B part
                                               box more than its own and its peer's copies move
    bw_pair_expect_tx_one_box_under    v9 B    (CTA pairs) the leader expects one A box less than
                                               the pair's copies move
    =================================  ======  =====================================================
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field

WATCHDOG_SECONDS = 2


@dataclass(frozen=True)
class Variant:
    name: str
    rung: str
    arch: str
    shape: tuple
    fault: str
    expect: tuple  # (check, barrier name) the checker must report
    gpu: tuple  # what a GPU run may end in: hang (the watchdog names it), wrong, ok (a race may not show)
    knobs: dict = field(default_factory=dict)

    @property
    def hangs(self) -> bool:
        return self.gpu == ("hang",)

    def config(self, shape=None, watchdog=None):
        import gemm_ladder

        knobs = dict(self.knobs, arch=self.arch)
        if watchdog:
            knobs["watchdog"] = watchdog
        return gemm_ladder.make_config(self.rung, *(shape or self.shape), **knobs)

    def prim_func(self, shape=None, watchdog=None):
        """The broken kernel as a prim_func that ``gemm_ladder.build`` takes."""
        cfg = self.config(shape, watchdog)
        return _FAULTS[self.name](cfg)


VARIANTS = {v.name: v for v in [
    Variant("expect_tx_one_box_over", "v5", "sm_90a", (1000, 1000, 520),
            "arrive.expect_tx counts one A box (16384 B) more than the copies move",
            ("expect-tx", "tma2mma"), ("hang",), {"pipe_depth": 3}),
    Variant("arrival_missing", "v5", "sm_90a", (1000, 1000, 520),
            "lane 0 of the last MMA warp never arrives on mma2tma",
            ("arrivals", "mma2tma"), ("hang",), {"pipe_depth": 3}),
    Variant("phase_one_late", "v5", "sm_90a", (1000, 1000, 520),
            "the MMA threads' tma2mma wait flips its phase one K slice late",
            ("race", "tma2mma"), ("hang", "wrong"), {"pipe_depth": 3}),
    Variant("release_before_wait_group", "v5", "sm_90a", (1000, 1000, 520),
            "mma2tma is arrived on before wgmma.wait_group retires the group reading the stage",
            ("release", "mma2tma"), ("wrong", "ok"), {"pipe_depth": 3}),
    Variant("multicast_missing_cta", "v5", "sm_90a", (1024, 1024, 520),
            "rank 1 of each 2-CTA cluster multicasts its half of B to itself only",
            # on an H100 rank 0's multicasts may land after rank 1 (which got all its bytes) has
            # left: a launch failure within seconds rather than the watchdog's record
            ("expect-tx", "tma2mma"), ("hang", "error"), {"pipe_depth": 3, "num_warpgroups": 1, "blk_n": 128}),
    Variant("bw_expect_tx_one_box_over", "v6", "sm_100a", (1000, 1024, 520),
            "arrive.expect_tx counts one A box more than the copies move",
            ("expect-tx", "tma2mma"), ("hang",)),
    Variant("bw_epilogue_arrival_missing", "v6", "sm_100a", (1000, 1024, 520),
            "the last epilogue thread never arrives on epi2mma",
            ("arrivals", "epi2mma"), ("hang",)),
    Variant("cluster_release_own_only", "v8", "sm_90a", (256, 256, 320),
            "each consumer warp arrives on its own CTA's mma2tma only: the peer's producer, which "
            "multicasts its B half into this CTA's stage, never sees the stage released",
            ("arrivals", "mma2tma"), ("hang",), {"cluster_m": 2, "cluster_n": 1}),
    Variant("bw_pair_tma_own_barrier", "v8", "sm_100a", (256, 256, 320),
            "the TMA copies complete on the issuing CTA's tma2mma (no remote view of the pair "
            "leader's), so the leader's barrier receives its own CTA's bytes only",
            ("expect-tx", "tma2mma"), ("hang",), {"cluster_n": 1}),
    Variant("ws_release_before_wait_group", "v7", "sm_90a", (256, 512, 320),
            "mma2tma is arrived on before wgmma.wait_group retires the group reading the stage",
            ("release", "mma2tma"), ("wrong", "ok"), {"pipe_depth": 2}),
    Variant("cluster_multicast_own_only", "v8", "sm_90a", (256, 256, 320),
            "each CTA's B part goes to its own stage only: the multicast mask misses the peer CTA",
            ("expect-tx", "tma2mma"), ("hang",), {"cluster_m": 2, "cluster_n": 1}),
    Variant("cluster_expect_tx_one_box_over", "v9", "sm_90a", (256, 256, 320),
            "arrive.expect_tx counts one B part box (16384 B) more than the cluster's copies move",
            ("expect-tx", "tma2mma"), ("hang",), {"cluster_m": 2, "cluster_n": 1}),
    Variant("bw_pair_expect_tx_one_box_under", "v9", "sm_100a", (256, 256, 320),
            "the pair leader's arrive.expect_tx counts one A box (16384 B) less than the pair's "
            "copies move: a phase completes before its last box lands",
            ("expect-tx", "tma2mma"), ("wrong", "hang"), {"cluster_n": 1}),
]}


# -- tracing a rung with swapped barrier classes ------------------------------------------------
@contextlib.contextmanager
def swapped(module, **classes):
    """The rung ``module`` sees ``classes`` under their names while it is traced."""
    saved = {name: getattr(module, name) for name in classes}
    for name, cls in classes.items():
        setattr(module, name, cls)
    try:
        yield
    finally:
        for name, cls in saved.items():
            setattr(module, name, cls)


def _trace(cfg, **classes):
    """Trace ``cfg``'s kernel with ``classes`` swapped in where it creates its barriers: the rung
    module, or for a preset of the production kernel (``PRESET``) the template's module."""
    from gemm_ladder.rungs import kernel_of, rung_module

    mod = rung_module(cfg.rung, cfg.arch)
    if hasattr(mod, "PRESET"):
        mod = sys.modules[type(mod.PRESET).__module__]
    with swapped(mod, **classes):
        return kernel_of(cfg)


def _tma_bar_plus(extra_bytes):
    from gemm_ladder.sync.classes import TMABar

    class TMABarPlus(TMABar):
        """arrive.expect_tx with ``extra_bytes`` more than the caller asked for."""

        def arrive(self, stage, tx_count=None, remote=None, pred=None):
            if tx_count is not None:
                tx_count = tx_count + extra_bytes
            return super().arrive(stage, tx_count=tx_count, remote=remote, pred=pred)

    return TMABarPlus


def _mbarrier_skipping(skip_thread):
    """An MBarrier whose arrive is predicated off for the threads ``skip_thread(rank)`` picks."""
    from tvm.script import tirx as T

    from gemm_ladder.sync.classes import MBarrier

    class MBarrierSkipping(MBarrier):
        def arrive(self, stage, remote=None, pred=None, count=None):
            return super().arrive(stage, remote=remote, pred=T.Not(skip_thread(T.cuda.thread_rank())),
                                  count=count)

    return MBarrierSkipping


def _tma_bar_late():
    """A TMABar whose wait flips the phase of stage 0 one slice late: parity ^ (stage == 0).

    With S stages the right parity of slice k is (k / S) & 1; one slice late it is
    ((k - 1) / S) & 1, which differs exactly on the first slot of each lap.
    """
    from tvm.script import tirx as T

    from gemm_ladder.sync.classes import TMABar

    class TMABarLate(TMABar):
        def wait(self, stage, phase):
            late = int(stage == 0) if isinstance(stage, int) else T.Cast("int32", stage == 0)
            return super().wait(stage, phase ^ late)

    return TMABarLate


def expect_tx_one_box_over(cfg):
    return _trace(cfg, TMABar=_tma_bar_plus(cfg.blk_m * cfg.blk_k * cfg.elem_bytes))


bw_expect_tx_one_box_over = expect_tx_one_box_over


def arrival_missing(cfg):
    last_warp = 4 * cfg.num_warpgroups - 1
    return _trace(cfg, MBarrier=_mbarrier_skipping(lambda t: t // 32 == last_warp))


def bw_epilogue_arrival_missing(cfg):
    # the epilogue warpgroup is warpgroup 0: threads 0..127 arrive on epi2mma
    return _trace(cfg, MBarrier=_mbarrier_skipping(lambda t: t == 127))


def phase_one_late(cfg):
    return _trace(cfg, TMABar=_tma_bar_late())


def cluster_release_own_only(cfg):
    """v8 (Hopper) with the ring's ``release_to_cluster`` arriving on the local mma2tma alone."""
    from tvm.script import tirx as T

    from gemm_ladder.sm90a import ring

    @T.inline
    def release_own_cta_only(mma2tma, stage, cluster_size):  # pylint: disable=unused-argument
        mma2tma.arrive(stage)

    with swapped(ring, release_to_cluster=release_own_cta_only):
        return _trace(cfg)


def bw_pair_tma_own_barrier(cfg):
    """v8 (Blackwell) whose tma2mma ``remote_view`` is the local barrier: every CTA's copies
    complete on its own tma2mma, while only the pair leader's expects (and waits for) them."""
    from gemm_ladder.sync.classes import TMABar

    class TMABarNoView(TMABar):
        def remote_view(self, rank):
            return self

    return _trace(cfg, TMABar=TMABarNoView)


def ws_release_before_wait_group(cfg):
    """v7 with each release (the ``if`` around the mma2tma arrive) moved above the
    wgmma.wait_group that precedes it."""
    return release_before_wait_group(cfg)


def cluster_multicast_own_only(cfg):
    """v8 (Hopper) whose B multicast masks name the issuing CTA alone."""
    from gemm_ladder.sm90a import producer

    def own_only(cm, cn, rank_m, rank_n):
        mask_a, _ = producer_masks(cm, cn, rank_m, rank_n)
        return mask_a, 1 << (rank_m + cm * rank_n)

    producer_masks = producer.multicast_masks
    with swapped(producer, multicast_masks=own_only):
        return _trace(cfg)


def cluster_expect_tx_one_box_over(cfg):
    """v9 (Hopper): one box of B's multicast parts (blk_n / cluster_m rows) too many."""
    part_rows = cfg.blk_n // dict(cfg.extra).get("cluster_m", 1)
    return _trace(cfg, TMABar=_tma_bar_plus(part_rows * cfg.blk_k * cfg.elem_bytes))


def bw_pair_expect_tx_one_box_under(cfg):
    return _trace(cfg, TMABar=_tma_bar_plus(-cfg.blk_m * cfg.blk_k * cfg.elem_bytes))


# -- editing the traced TIR -----------------------------------------------------------------
def _rebuild(stmt, fn):
    """Post-order rewrite of a statement tree: ``fn(seq_list)`` may reorder a SeqStmt's list."""
    from tvm import tirx

    t = type(stmt).__name__
    if t == "SeqStmt":
        return tirx.SeqStmt(fn([_rebuild(s, fn) for s in stmt.seq]))
    if t == "For":
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, _rebuild(stmt.body, fn),
                        stmt.thread_binding, stmt.annotations, stmt.step)
    if t == "IfThenElse":
        other = _rebuild(stmt.else_case, fn) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _rebuild(stmt.then_case, fn), other)
    if t == "While":
        return tirx.While(stmt.condition, _rebuild(stmt.body, fn))
    if t == "AttrStmt":
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, _rebuild(stmt.body, fn))
    return stmt


def _is_wait_group(s) -> bool:
    return type(s).__name__ == "Evaluate" and "wait_group" in str(s) and "wgmma" in str(s)


def _releases(s) -> bool:
    """v5's ``if k > 0:`` block: the mma2tma arrive (and the refill)."""
    return type(s).__name__ == "IfThenElse" and '"arrive"' in str(s)


def release_before_wait_group(cfg):
    """v5's K loop with the ``if k > 0`` block (release + refill) moved above wait_group(1)
    (v7: the release alone; its end-of-tile release moves above wait_group(0) too)."""
    func = _trace(cfg)
    moved = []

    def fn(seq):
        for i, s in enumerate(seq):
            if _is_wait_group(s) and i + 1 < len(seq) and _releases(seq[i + 1]):
                moved.append(i)
                return seq[:i] + [seq[i + 1], s] + seq[i + 2:]
        return seq

    func = func.with_body(_rebuild(func.body, fn))
    assert moved, f"{cfg.rung}'s K loop no longer has wgmma.wait_group followed by the release"
    return func


# -- the cluster kernel --------------------------------------------------------------------------
def cluster_prim_func(cfg, b_mask=None):
    """tests/cluster_rung.py for a v5 config, as a prim_func ``gemm_ladder.build`` takes."""
    from gemm_ladder.sync.classes import traced
    from gemm_ladder.rungs import CONFIG_ATTR

    from . import cluster_rung

    kw = {} if b_mask is None else {"b_mask": b_mask}
    func = traced(cfg, lambda c: cluster_rung.kernel(c, **kw))
    return func.with_attr(CONFIG_ATTR, json.dumps(cfg.to_dict(), sort_keys=True))


def multicast_missing_cta(cfg):
    from . import cluster_rung

    return cluster_prim_func(cfg, lambda rank: cluster_rung.FULL_MASK if rank == 0 else 1 << rank)


_FAULTS = {name: globals()[name] for name in VARIANTS}
