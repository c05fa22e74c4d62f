"""The simulator's thread barriers: ``bar.sync`` (CTA-wide and named), the cluster barrier and
warp-collective instructions. A mixin of :class:`gemm_ladder.protocol.sim.Sim`.

The cluster barrier is modelled as PTX defines it: ``barrier.cluster.arrive`` (release, unless
``.relaxed``) does not block; ``barrier.cluster.wait`` (acquire) blocks until every thread of
the cluster that has not exited arrived in the same phase, and then takes the clock of every
arrival. ``T.cuda.cluster_sync()`` is the two in a row. So a wait orders what every thread of
every CTA did before its arrive (the mbarrier inits, typically) before what follows the wait.
"""

from __future__ import annotations

import numpy as np


class ClusterBarrier:
    """``barrier.cluster``: the phase, who arrived in it, and the clock of each completed phase."""

    def __init__(self, zero):
        self.gen = 0
        self.arrived: set = set()  # global ids of the threads that arrived in this phase
        self.arrived_live = 0  # of those, the ones not exited
        self.acc = zero
        self.zero = zero
        self.clocks: list = []  # per completed phase: the join of its release arrivals


class SyncMixin:
    """bar.sync, barrier.cluster and warp collectives (``.sync.aligned``)."""

    # -- CTA-wide and named barriers ------------------------------------------------------------
    def bar_sync(self, th, bar_id, count, site):
        cta = th.cta
        state = cta.syncs.setdefault(bar_id, {"waiting": set(), "gen": 0, "count": count})
        gen = th.sync_gen.get(bar_id)
        if gen is not None:
            if state["gen"] > gen:
                del th.sync_gen[bar_id]
                return None
            return ("sync", bar_id)
        th.sync_gen[bar_id] = state["gen"]
        state["waiting"].add(th.tid)
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        self._try_release_sync(cta, bar_id)
        if state["gen"] > th.sync_gen[bar_id]:
            del th.sync_gen[bar_id]
            return None
        return ("sync", bar_id)

    def _try_release_sync(self, cta, bar_id):
        state = cta.syncs[bar_id]
        need = state["count"] if state["count"] is not None else cta.live
        if len(state["waiting"]) < need:
            return
        members = [cta.threads[t] for t in state["waiting"]]
        clock = np.max(np.stack([m.vc for m in members]), axis=0)
        for m in members:
            m.vc = clock.copy()
            m.tick()
        state["waiting"] = set()
        state["gen"] += 1
        self.version += 1

    # -- the cluster barrier ----------------------------------------------------------------------
    def cluster_arrive(self, th, site, release=True):
        cb = self.cluster_bar
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if th.cluster_pending is not None:
            self.find("cluster", "", None, [(th.rank, th.tid)], site,
                      "arrives on the cluster barrier again before waiting on its last arrival", th.rank)
            return
        th.cluster_pending = cb.gen
        cb.arrived.add(th.g)
        cb.arrived_live += 1
        if release:
            th.tick()
            cb.acc = self.join(cb.acc, th.vc)
        self._try_complete_cluster()

    def cluster_wait(self, th, site, acquire=True):
        """None once the phase this thread arrived in completed; else the token to block on."""
        cb = self.cluster_bar
        if th.cluster_pending is None:
            self.find("cluster", "", None, [(th.rank, th.tid)], site,
                      "waits on the cluster barrier without arriving on it first", th.rank)
            return None
        if cb.gen <= th.cluster_pending:
            return ("cluster_sync",)
        if acquire:
            th.vc = self.join(th.vc, cb.clocks[th.cluster_pending])
            th.tick()
        th.cluster_pending = None
        return None

    def _try_complete_cluster(self):
        cb = self.cluster_bar
        if not cb.arrived or cb.arrived_live < self.live_threads:
            return
        cb.clocks.append(cb.acc)
        cb.gen += 1
        cb.arrived = set()
        cb.arrived_live = 0
        cb.acc = cb.zero
        self.version += 1

    # -- warp collectives -------------------------------------------------------------------------
    def warp_collective(self, th, site, wait_group=None):
        """A ``.sync.aligned`` instruction: the lanes of the warp meet before any goes on.

        ``wait_group`` (the n of ``wgmma.wait_group n``) retires the warp's older wgmma groups
        at the meeting, and the lanes leave with each other's clocks: after it, any lane's
        release covers the reads of every lane.
        """
        cta = th.cta
        state = cta.collectives.setdefault(th.warp, {"site": None, "waiting": set(), "gen": 0, "n": None})
        if th.collective_gen >= 0:
            if state["gen"] > th.collective_gen:
                th.passed_gen = th.collective_gen
                th.collective_gen = -1
                return None
            return ("collective", th.warp)
        if state["waiting"] and state["site"] != site.id:
            self.find("simulate", "", None, [(th.rank, th.tid)], site,
                      f"lanes of warp {th.warp} meet at different warp-collective instructions", th.rank)
        state["site"] = site.id
        state["n"] = wait_group
        state["waiting"].add(th.lane)
        th.collective_gen = state["gen"]
        self._try_release_collective(cta, th.warp)
        if state["gen"] > th.collective_gen:
            th.passed_gen = th.collective_gen
            th.collective_gen = -1
            return None
        return ("collective", th.warp)

    def warp_uniform(self, th, site, fn):
        """``fn()`` evaluated once per warp at a collective the lanes just passed together."""
        cache = th.cta.collectives[th.warp].setdefault("cache", {})
        key = (site.id, th.passed_gen)
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = fn()
        return cache[key]

    def _try_release_collective(self, cta, warp):
        state = cta.collectives.get(warp)
        if not state or not state["waiting"]:
            return
        if len(state["waiting"]) < cta.live_lanes.get(warp, 0):
            return
        lanes = [t for t in cta.threads[warp * 32:warp * 32 + 32] if t.lane in state["waiting"]]
        if state["n"] is not None:
            n = state["n"]
            for t in lanes:
                e = t.tick()
                t.last_action = "wait_group"
                while len(t.wg_groups) > n:
                    for rd in t.wg_groups.popleft():
                        rd.retire = ("epoch", t.g, e)
            clock = np.max(np.stack([t.vc for t in lanes]), axis=0)
            for t in lanes:
                t.vc = clock.copy()
        state["waiting"] = set()
        state["gen"] += 1
        self.version += 1

    def _thread_done(self, th):
        cta = th.cta
        cta.live_lanes[th.warp] -= 1
        cta.live -= 1
        self.live_threads -= 1
        if th.g in self.cluster_bar.arrived:
            self.cluster_bar.arrived_live -= 1
        for bar_id in list(cta.syncs):
            if cta.syncs[bar_id]["waiting"]:
                self._try_release_sync(cta, bar_id)
        self._try_release_collective(cta, th.warp)
        self._try_complete_cluster()
        self.version += 1
