"""Run the threads of one CTA (or one cluster) through a kernel's barrier protocol.

Every thread runs the compiled program (:mod:`gemm_ladder.barriers.interp`) as a generator.
The simulator owns the state the program touches:

- each mbarrier: init count, pending arrivals, tx-count, completed phases, and for every phase
  who arrived, how many bytes were expected and which TMA copies delivered how many;
- the TMA copies in flight (they complete at once, or only when nothing else can run);
- CTA-wide and named barriers (``bar.sync``), the cluster barrier, and warp-collective
  instructions (``wgmma`` is ``.sync.aligned``: the lanes of a warp meet there);
- the MMA operand tiles (``Asmem[s]``, ``Bsmem[s]``): who wrote a stage last (a TMA copy, or
  the threads) and which MMA reads of it are still in flight (a wgmma group not yet retired by
  ``wgmma.wait_group``, a tcgen05.mma not yet covered by a ``tcgen05.commit`` whose barrier
  phase the writer has seen).

Happens-before is tracked with vector clocks: one component per thread and one per mbarrier
(its completed-phase count). A waiter that passes a phase takes the clock of everything that
completed it (the arrivals, and the issue of the copies whose bytes it counted). So "a stage is
refilled only after its release" is a clock comparison, independent of how this particular run
interleaved the threads; the runs still differ in which phase a parity wait lands on, so the
checker runs a few schedules (threads in order, in reverse, in lockstep).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .values import TICK, UNKNOWN, SimError, Smem, TMap
from .state import (CTA, TX_LIMIT, BarrierState, Copy, Finding, Pending, PhaseRecord, Read,
                    Thread)
from .words import plural

MAX_STEPS = 3_000_000
CLUSTER_SPLIT = -2  # Thread.sync_gen key of a barrier.cluster.arrive awaiting its wait


class Sim:
    """One run of a cluster (or a single CTA) under one schedule."""

    def __init__(self, kir, program, blocks, params, policy="forward", cluster=1, step_budget=None):
        self.kir, self.program, self.policy = kir, program, policy
        self.step_budget = step_budget  # stop quietly after this many steps (enough to learn roles)
        self.params = params
        self.cluster = cluster
        n_threads = _extent(kir.launch, program, "threadIdx.x", params)
        self.n_threads = n_threads
        self.slots = [b.offset + i for b in kir.barriers for i in range(b.depth)]
        n_ranks = len(blocks)
        self.vc_len = n_ranks * n_threads + n_ranks * len(self.slots)
        self.comp_base = n_ranks * n_threads
        self.ctas: list[CTA] = []
        self.threads: list[Thread] = []
        for rank, block in enumerate(blocks):
            cta = CTA(rank, block, [])
            self.ctas.append(cta)
            for tid in range(n_threads):
                th = Thread(self, cta, tid, rank * n_threads + tid)
                cta.threads.append(th)
                self.threads.append(th)
                cta.live_lanes[tid // 32] = cta.live_lanes.get(tid // 32, 0) + 1
                cta.live += 1
        self.version = 0
        self.copies: list[Copy] = []
        self.in_flight: deque = deque()
        self.findings: list[Finding] = []
        self._seen: set = set()
        self.site_threads: dict[int, set] = {}
        self.site_roles: dict[int, dict] = {}
        self.site_phases: dict[int, set] = {}
        self.site_bar: dict[int, str] = {}
        self.steps = 0
        self.deadlocked: list = []
        self.stuck: list = []  # barriers threads wait on forever, after a deadlock
        self.finished = False
        self._cluster = {"waiting": set(), "gen": 0, "snaps": {}, "released": {}}

    # -- clocks --------------------------------------------------------------------------------
    def zero_vc(self):
        return np.zeros(self.vc_len, dtype=np.int64)

    def comp(self, rank, off) -> int:
        return self.comp_base + rank * len(self.slots) + self.slots.index(off // 8)

    @staticmethod
    def join(a, b):
        return np.maximum(a, b)

    # -- findings --------------------------------------------------------------------------------
    def find(self, check, barrier, phase, who, site, text, cta=None, others=None, key=None):
        """Record a finding once (``key``: what counts as the same one; default its text)."""
        f = Finding(check, barrier, phase, who, site.id if site is not None else None, text, cta)
        f.others = sorted(set(others or []))
        key = key or f.key()
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(f)

    # -- coordinates -----------------------------------------------------------------------------
    def sreg(self, th, name):
        bx, by, bz = th.cta.block
        if name.startswith("clusterid."):
            axis = "xyz".index(name[-1])
            return (bx // self.cluster, by, bz)[axis]
        if name in ("cluster_ctarank", "cluster_ctaid.x"):
            return th.rank
        if name.startswith("ctaid."):
            return th.cta.block["xyz".index(name[-1])]
        return UNKNOWN

    def _start(self, th):
        env = th.env
        tags = self.program.thread_tags
        bx, by, bz = th.cta.block
        values = {"threadIdx.x": th.tid, "threadIdx.y": 0, "threadIdx.z": 0,
                  "blockIdx.x": bx, "blockIdx.y": by, "blockIdx.z": bz,
                  "clusterCtaIdx.x": th.rank, "clusterCtaIdx.y": 0, "clusterCtaIdx.z": 0}
        for tag, slot in tags.items():
            env[slot] = values.get(tag, 0)
        for name, slot in self.program.params.items():
            if name in self.params:
                env[slot] = self.params[name]
        th.gen = self.program.run(th)

    # -- barriers --------------------------------------------------------------------------------
    def _bar(self, th, addr, site, what):
        """The mbarrier an address names (another CTA's for a mapped address)."""
        if not isinstance(addr, Smem):
            raise SimError(f"{what} on an address the checker cannot follow ({addr!r}) at {site.text}")
        rank = th.rank if addr.rank is None else addr.rank
        if not 0 <= rank < len(self.ctas):
            raise SimError(f"{what} on CTA rank {rank}, outside the cluster of {len(self.ctas)}")
        cta = self.ctas[rank]
        bar = cta.bars.get(addr.off)
        if bar is None:
            label = self.kir.slot_label(addr.off)
            if self.kir.barrier_at(addr.off) is None:
                raise SimError(f"{what} at {site.text}: byte {addr.off} of shared memory is no mbarrier "
                               "the trace recorded")
            bar = cta.bars[addr.off] = BarrierState(rank, addr.off, self.comp(rank, addr.off), label)
        return bar

    def _use(self, th, bar, site, what):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        self.site_bar[site.id] = bar.label.split("[")[0]
        if bar.count is None:
            self.find("init", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"{what} {bar.label} before any thread initialised it", th.rank)
            return False
        g, e = bar.init_by
        if th.vc[g] < e:
            self.find("init", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"{what} {bar.label} without a barrier after its init "
                      f"(fence.mbarrier_init + CTA/cluster sync) ordering the init before it", th.rank)
        return True

    def mbar_init(self, th, addr, count, site):
        bar = self._bar(th, addr, site, "init")
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if not isinstance(count, int) or not 1 <= count <= TX_LIMIT:
            self.find("init", bar.label, None, [(th.rank, th.tid)], site,
                      f"initialises {bar.label} with count {count}: must be 1..{TX_LIMIT}", th.rank)
        if bar.count is not None and (bar.arrivals or bar.n):
            self.find("init", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"initialises {bar.label} again while it is in use (phase {bar.n})", th.rank)
        bar.count = count if isinstance(count, int) else 1
        bar.pending = bar.count
        bar.init_by = (th.g, th.tick())
        bar.acc = th.vc.copy()

    def mbar_arrive(self, th, addr, count, tx, site):
        bar = self._bar(th, addr, site, "arrive")
        if not self._use(th, bar, site, "arrives on"):
            return
        th.tick()
        if tx is not None:
            self.site_phases.setdefault(site.id, set()).add(tx)
            self._expect(th, bar, tx, site)
        self._record_arrive_role(th, site)
        if any(a[0] == th.rank and a[1] == th.tid and a[3] == site.id for a in bar.arrivals):
            self.find("arrivals", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"arrives twice on {bar.label} in phase {bar.n} from the same site", th.rank)
        for rd in th.unreleased:
            if rd.retire is None:
                rd.released.append((bar.label, bar.n))
        th.unreleased = [rd for rd in th.unreleased if rd.retire is None]
        bar.arrivals.append((th.rank, th.tid, count, site.id))
        bar.pending -= count
        bar.acc = self.join(bar.acc, th.vc)
        if bar.pending < 0:
            self.find("arrivals", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"{bar.label} phase {bar.n} gets {bar.count - bar.pending} arrivals, over its "
                      f"init count {bar.count} (its tx-count holds the phase open)", th.rank)
        self._maybe_complete(bar)

    def mbar_skip(self, th, addr, site):
        """A predicated arrive this thread reached with its predicate false."""
        bar = self._bar(th, addr, site, "arrive")
        self.site_bar[site.id] = bar.label.split("[")[0]
        bar.skipped.append((th.rank, th.tid, site.id))

    def mbar_expect_tx(self, th, addr, tx, site):
        bar = self._bar(th, addr, site, "expect_tx")
        if self._use(th, bar, site, "expects bytes on"):
            self._expect(th, bar, tx, site)
            self._maybe_complete(bar)

    def _expect(self, th, bar, tx, site):
        if not isinstance(tx, int):
            raise SimError(f"expect_tx byte count {tx!r} is not known at {site.text}")
        bar.tx += tx
        bar.expected += tx
        bar.expected_sites.append(site.id)
        if bar.expected > TX_LIMIT:
            self.find("expect-tx", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"{bar.label} phase {bar.n} expects {bar.expected} bytes, over the tx-count "
                      f"limit {TX_LIMIT}", th.rank)

    def _maybe_complete(self, bar):
        if bar.count is None or bar.pending > 0 or bar.tx != 0:
            return
        n = bar.n
        clock = bar.acc.copy() if bar.acc is not None else self.zero_vc()
        clock[bar.comp] = max(clock[bar.comp], n + 1)
        bar.clocks.append(clock)
        for p in bar.pendings:
            p.alts.append((bar.comp, n + 1))
        for c in bar.copies:
            if c.issue_phase != n:
                self.find("expect-tx", bar.label, n, [c.issuer], None,
                          f"a TMA copy into {self._region_text(c.dst_off)} issued for phase "
                          f"{c.issue_phase} of {bar.label} completes phase {n}: an earlier phase "
                          f"completed before all its bytes landed (expect_tx counted fewer bytes "
                          f"than its copies)", bar.rank)
        bar.history.append(PhaseRecord(bar.arrivals, bar.expected, bar.copies, self.steps))
        bar.n += 1
        bar.pending = bar.count
        bar.tx = 0
        bar.expected = 0
        bar.arrivals, bar.copies, bar.pendings, bar.expected_sites, bar.skipped = [], [], [], [], []
        bar.acc = self.zero_vc()
        self.version += 1

    def mbar_wait(self, th, addr, parity, site):
        bar = self._bar(th, addr, site, "wait")
        retry = th.token is not None and th.token[0] == "wait" and th.token[1] is bar and th.token[3] is site
        if not retry and not self._use(th, bar, site, "waits on"):
            return None
        if not isinstance(parity, int):
            raise SimError(f"wait phase {parity!r} is not known at {site.text}")
        if (bar.n & 1) == (parity & 1):
            th.token = ("wait", bar, parity, site)
            return th.token
        th.token = None
        observed = bar.n - 1
        if observed >= 0:
            th.vc = self.join(th.vc, bar.clocks[observed])
        th.tick()
        key = (bar.rank, bar.off)
        prev = th.observed.get(key)
        if prev is None:
            if observed > 0:
                self.find("phase", bar.label, observed, [(th.rank, th.tid)], site,
                          f"first wait on {bar.label} (parity {parity & 1}) passes on phase {observed}: "
                          f"it never waited for phases 0..{observed - 1}", th.rank)
        elif observed == prev:
            self.find("phase", bar.label, observed, [(th.rank, th.tid)], site,
                      f"waits on {bar.label} for parity {parity & 1} and passes on phase {observed} "
                      f"again, without a new phase: the phase it asks for did not flip", th.rank)
        elif observed > prev + 1:
            self.find("phase", bar.label, observed, [(th.rank, th.tid)], site,
                      f"waits on {bar.label} for parity {parity & 1} and passes on phase {observed} "
                      f"after phase {prev}: it missed phase {prev + 1} (a parity wait cannot tell "
                      f"them apart)", th.rank)
        th.observed[key] = observed
        th.after_wait.append(site.id)
        th.last_action = "wait"
        return None

    # -- TMA -------------------------------------------------------------------------------------
    def tma_load(self, th, dst, tmap, coords, mbar, mask, site):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if not isinstance(dst, Smem) or not isinstance(mbar, Smem):
            raise SimError(f"TMA load with an address the checker cannot follow at {site.text}")
        info = self.kir.tensormaps.get(tmap.name) if isinstance(tmap, TMap) else None
        if info is None:
            raise SimError(f"TMA load from an unknown tensor map {tmap!r} at {site.text}")
        self._role_after_wait(th, "producer")
        th.last_action = "tma"
        th.tick()
        if mask is None:
            ranks = [th.rank]
        else:
            if not isinstance(mask, int):
                raise SimError(f"multicast mask {mask!r} is not known at {site.text}")
            ranks = [r for r in range(16) if mask >> r & 1]
            bad = [r for r in ranks if r >= len(self.ctas)]
            if bad:
                self.find("multicast", "", None, [(th.rank, th.tid)], site,
                          f"multicast mask 0x{mask:x} names CTA ranks {bad} outside the cluster of "
                          f"{len(self.ctas)}", th.rank)
                ranks = [r for r in ranks if r < len(self.ctas)]
        inb = info.in_bounds_bytes(coords)
        if inb == 0:
            dims = "x".join(map(str, reversed(info.dims)))
            at = ", ".join(map(str, reversed(coords)))
            self.find("tma-bounds", info.name.replace("_tensormap", ""), None, [(th.rank, th.tid)], site,
                      f"loads a {info.describe()} at ({at}), wholly outside the {dims} tensor: every "
                      f"byte is zero-filled (a tile index past the grid?)", th.rank,
                      key=("tma-bounds", site.id, info.name))
        for r in ranks:
            bar = self._bar(th, Smem(mbar.off, r), site, "TMA complete_tx")
            if bar.count is None:
                self.find("init", bar.label, None, [(th.rank, th.tid)], site,
                          f"TMA completes on {bar.label} of CTA rank {r} before it is initialised", r)
                continue
            self.site_bar[site.id] = bar.label.split("[")[0]
            copy = Copy(len(self.copies), (th.rank, th.tid), site.id, info.name, info.box_bytes, inb, r,
                        dst.off, mbar.off, th.vc.copy(), bar.n)
            self.copies.append(copy)
            self._write(th, r, dst.off, ("tma", copy), site)
            self.in_flight.append(copy)
        if self.policy != "lockstep":
            self.land_all()

    def land_all(self):
        while self.in_flight:
            self.land(self.in_flight.popleft())

    def land(self, copy):
        bar = self.ctas[copy.dst_rank].bars[copy.bar_off]
        copy.done = True
        bar.tx -= copy.box_bytes
        bar.copies.append(copy)
        bar.pendings.append(copy.landed)
        bar.acc = self.join(bar.acc, copy.issue_vc)
        self.version += 1
        self._maybe_complete(bar)

    # -- MMA and operand tiles -------------------------------------------------------------------
    def _region(self, rank, off):
        reg = self.kir.region_of(off)
        if reg is None or reg[0] not in self.kir.operand_buffers:
            return None
        return self.ctas[rank].regions.setdefault(reg, {"write": None, "reads": [], "key": reg})

    def _region_text(self, off):
        reg = self.kir.region_of(off)
        return self.kir.region_label(reg) if reg else f"shared byte {off}"

    def _visible(self, th, token) -> bool:
        if token is None:
            return False
        if isinstance(token, Pending):
            return token.visible(th.vc)
        _, g, e = token
        return th.vc[g] >= e

    def _write(self, th, rank, off, how, site):
        region = self._region(rank, off)
        if region is None:
            return
        label = self.kir.region_label(region["key"])
        stage = region["key"][1]
        early: dict = {}
        unordered = []
        for rd in region["reads"]:
            if rd.retire is None:
                # the release that went out before the read retired: the owner's arrive on the
                # slot of this stage, else its first arrive after the read
                rel = next((r for r in rd.released if r[0].endswith(f"[{stage}]")), None) or \
                    (rd.released[0] if rd.released else ("", None))
                early.setdefault((rel[0], rel[1], rd.engine), []).append(rd.thread)
            elif not self._visible(th, rd.retire):
                unordered.append(rd.thread)
        for (bar, phase, engine), readers in early.items():
            pending = ("their wgmma group is not retired (wgmma.wait_group)" if engine == "wgmma"
                       else "no tcgen05.commit covers it yet")
            how_released = (f"; they released it by arriving on {bar} before the read retired" if bar else "")
            self.find("release", bar or label, phase, [(th.rank, th.tid)], site,
                      f"refills {label} while the MMA reads of it by {_readers(readers, engine)} are in "
                      f"flight: {pending}{how_released}", rank, key=("release", region["key"][0], "early"))
        if unordered:
            self.find("release", label, None, [(th.rank, th.tid)], site,
                      f"refills {label} without waiting for the release of the MMA reads by "
                      f"{_readers(unordered, 'wgmma' if any(r.engine == 'wgmma' for r in region['reads']) else '')}: "
                      f"no barrier phase orders their retirement before this write", rank,
                      key=("release", region["key"][0], "unordered"))
        region["reads"] = []
        region["write"] = how

    def smem_store(self, th, addr, site):
        if not isinstance(addr, Smem):
            return
        if self._region(th.rank, addr.off) is None:
            return
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        e = th.tick()
        self._write(th, th.rank, addr.off, ("gen", th.g, e, (th.rank, th.tid)), site)

    def wgmma_issue(self, th, descs, site):
        """One wgmma of a warp (its lanes just met): lane 0 owns the reads; the check that the
        data landed uses the least clock of the lanes, so every lane must have waited."""
        lanes = [t for t in th.cta.threads[th.warp * 32:th.warp * 32 + 32] if t.state != "done"]
        for t in lanes:
            self._role_after_wait(t, "consumer")
            t.last_action = "mma"
        vc = np.min(np.stack([t.vc for t in lanes]), axis=0)
        self.mma_issue(th.cta.threads[th.warp * 32], "wgmma", descs, site, vc,
                       who=[(t.rank, t.tid) for t in lanes])
        self.site_threads.setdefault(site.id, set()).update((t.rank, t.tid) for t in lanes)
        return True

    def mma_issue(self, th, engine, descs, site, vc=None, who=None):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        self._role_after_wait(th, "consumer" if engine == "wgmma" else "MMA")
        th.last_action = "mma"
        th.tick()
        if vc is None:
            vc = th.vc
        who = who or [(th.rank, th.tid)]
        for d in descs:
            if not isinstance(d, int):
                raise SimError(f"MMA descriptor {d!r} is not known at {site.text}")
            off = (d & 0x3FFF) << 4
            region = self._region(th.rank, off)
            if region is None:
                continue
            w = region["write"]
            label = region["key"]
            if w is None:
                label = self.kir.region_label(label)
                self.find("race", label, None, who, site,
                          f"MMA reads {label} before anything wrote it", th.rank)
            elif w[0] == "tma":
                copy = w[1]
                if not copy.done or not copy.landed.visible(vc):
                    label = self.kir.region_label(label)
                    bar = self.kir.slot_label(copy.bar_off)
                    self.find("race", bar, copy.issue_phase, who, site,
                              f"MMA reads {label} before the TMA copy into it landed: no wait on "
                              f"phase {copy.issue_phase} of {bar} orders it", th.rank)
            elif w[0] == "gen":
                if vc[w[1]] < w[2]:
                    label = self.kir.region_label(label)
                    self.find("race", label, None, who, site,
                              f"MMA reads {label} before the stores of thread {w[3][1]} are ordered "
                              f"before it", th.rank)
            rd = Read((th.rank, th.tid), th.g, site.id, engine, region["key"])
            region["reads"].append(rd)
            th.unreleased.append(rd)
            (th.wg_open if engine == "wgmma" else th.tc_open).append(rd)

    def wgmma_commit(self, th, site):
        th.wg_groups.append(th.wg_open)
        th.wg_open = []


    def tcgen05_commit(self, th, addr, mask, site):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        ranks = [th.rank] if mask is None else [r for r in range(len(self.ctas)) if mask >> r & 1]
        pending = Pending()
        for rd in th.tc_open:
            rd.retire = pending
        th.tc_open = []
        votes = self.site_roles.setdefault(site.id, {})
        votes["MMA"] = votes.get("MMA", 0) + 1
        th.last_action = "commit"
        for r in ranks:
            target = addr if addr.rank is not None or r == th.rank else Smem(addr.off, r)
            bar = self._bar(th, target, site, "tcgen05.commit")
            if not self._use(th, bar, site, "commits to"):
                continue
            th.tick()
            bar.arrivals.append((th.rank, th.tid, 1, site.id))
            bar.pending -= 1
            bar.pendings.append(pending)
            bar.acc = self.join(bar.acc, th.vc)
            self._maybe_complete(bar)

    # -- CTA, named and cluster barriers, warp collectives --------------------------------------
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

    def cluster_sync(self, th, site):
        """``T.cuda.cluster_sync()``: every live thread of the cluster meets (arrive and wait)."""
        state = self._cluster
        key = -1
        gen = th.sync_gen.get(key)
        if gen is not None:
            self._cluster_try_complete()  # a thread may have exited since
            if state["gen"] > gen:
                del th.sync_gen[key]
                return None
            return ("cluster_sync",)
        th.sync_gen[key] = state["gen"]
        state["waiting"].add(th.g)
        state["snaps"][th.g] = th.vc.copy()
        self._cluster_try_complete()
        if state["gen"] > th.sync_gen[key]:
            del th.sync_gen[key]
            return None
        return ("cluster_sync",)

    def cluster_arrive(self, th, site):
        """``barrier.cluster.arrive.release``: counted now (with what this thread did so far),
        waited for by its :meth:`cluster_wait`; the thread runs on in between."""
        state = self._cluster
        th.sync_gen[CLUSTER_SPLIT] = state["gen"]
        state["waiting"].add(th.g)
        state["snaps"][th.g] = th.vc.copy()
        th.tick()
        self._cluster_try_complete()
        return None

    def cluster_wait(self, th, site):
        """``barrier.cluster.wait.acquire``: until every live thread of the cluster arrived on
        this thread's phase; then it has seen what each did before its arrive."""
        state = self._cluster
        gen = th.sync_gen.get(CLUSTER_SPLIT)
        if gen is None:  # no arrive of its own: the phase it would wait on is the current one
            return None
        self._cluster_try_complete()
        if state["gen"] > gen:
            del th.sync_gen[CLUSTER_SPLIT]
            th.vc = np.maximum(th.vc, state["released"][gen])
            th.tick()
            return None
        return ("cluster_sync",)

    def _cluster_try_complete(self):
        """The cluster barrier's phase completes when every live thread arrived (a thread that
        has exited counts as arrived, as on the hardware)."""
        state = self._cluster
        need = sum(t.state != "done" for t in self.threads)
        if not state["waiting"] or len(state["waiting"]) < need:
            return
        merged = np.max(np.stack(list(state["snaps"].values())), axis=0)
        state["released"][state["gen"]] = merged
        for g in state["waiting"]:
            m = self.threads[g]
            if m.sync_gen.get(CLUSTER_SPLIT) != state["gen"]:  # blocked in cluster_sync: leaves with it
                m.vc = merged.copy()
                m.tick()
        state["waiting"], state["snaps"] = set(), {}
        state["gen"] += 1
        self.version += 1

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

    # -- roles -------------------------------------------------------------------------------
    def _role_after_wait(self, th, role):
        for sid in th.after_wait:
            votes = self.site_roles.setdefault(sid, {})
            votes[role] = votes.get(role, 0) + 1
        th.after_wait = []

    def _record_arrive_role(self, th, site):
        role = {"tma": "producer", "wait_group": "consumer", "mma": "MMA", "commit": "MMA"}.get(
            th.last_action, "epilogue")
        votes = self.site_roles.setdefault(site.id, {})
        votes[role] = votes.get(role, 0) + 1

    # -- the run ---------------------------------------------------------------------------------
    def _ready(self, th) -> bool:
        return th.state == "run" or (th.state == "blocked" and self.version > th.blocked_at)

    def _step(self, th) -> bool:
        """Resume ``th`` until it blocks, ticks or ends; whether it made progress."""
        try:
            tok = next(th.gen)
        except StopIteration:
            th.state = "done"
            self._thread_done(th)
            return True
        if tok is TICK:
            th.state = "run"
            th.blocked_at = -1
            return True
        was = th.blocked_at
        th.state = "blocked"
        th.token = tok
        th.blocked_at = self.version
        return was < 0 or was != self.version

    def _thread_done(self, th):
        cta = th.cta
        cta.live_lanes[th.warp] -= 1
        cta.live -= 1
        for bar_id in list(cta.syncs):
            if cta.syncs[bar_id]["waiting"]:
                self._try_release_sync(cta, bar_id)
        self._try_release_collective(cta, th.warp)
        if self._cluster["waiting"]:
            need = sum(t.state != "done" for t in self.threads)
            if len(self._cluster["waiting"]) >= need:
                self.version += 1
        self.version += 1

    def run(self) -> "Sim":
        order = list(self.threads)
        if self.policy == "reverse":
            order.reverse()
        for th in self.threads:
            self._start(th)
        try:
            self._loop(order)
        except SimError as err:
            self.find("simulate", "", None, [], None, str(err))
        return self

    def _loop(self, order):
        lockstep = self.policy == "lockstep"
        while True:
            progressed = False
            for th in order:
                if th.state == "done":
                    continue
                while self._ready(th):
                    self.steps += 1
                    if self.step_budget is not None and self.steps > self.step_budget:
                        return
                    if self.steps > MAX_STEPS:
                        raise SimError(f"the simulation ran over {MAX_STEPS} steps: a loop that does not end?")
                    moved = self._step(th)
                    progressed = progressed or moved
                    if th.state == "done" or th.state == "blocked" or lockstep:
                        break
            if lockstep and self.in_flight:
                # copies land at the end of a round: late enough to catch a consumer that does
                # not wait for them
                self.land(self.in_flight.popleft())
                progressed = True
            if all(t.state == "done" for t in self.threads):
                self.land_all()
                self.finished = True
                self._at_exit()
                return
            if not progressed:
                if self.in_flight:
                    self.land(self.in_flight.popleft())
                    continue
                self.deadlocked = [t for t in self.threads if t.state != "done"]
                self._report_deadlock()
                return

    # -- end of run ------------------------------------------------------------------------------
    def _at_exit(self):
        for cta in self.ctas:
            for bar in cta.bars.values():
                if bar.arrivals or bar.tx or bar.copies:
                    got = sum(a[2] for a in bar.arrivals)
                    delivered = sum(c.box_bytes for c in bar.copies)
                    self.find("exit", bar.label, bar.n, [(a[0], a[1]) for a in bar.arrivals], None,
                              f"the kernel ends with phase {bar.n} of {bar.label} open: {got} of "
                              f"{bar.count} arrivals, {bar.expected} bytes expected, {delivered} "
                              f"delivered", cta.rank)

    def barrier_state_text(self, bar) -> str:
        got = sum(a[2] for a in bar.arrivals)
        delivered = sum(c.box_bytes for c in bar.copies)
        parts = [f"{got} of {bar.count} arrivals"]
        if bar.expected or bar.copies:
            boxes = " + ".join(
                f"{c.tmap.replace('_tensormap', '')} {c.box_bytes}"
                + (f" from rank {c.issuer[0]}" if c.issuer[0] != bar.rank else "") for c in bar.copies)
            parts.append(f"expect_tx {bar.expected} bytes, its copies delivered {delivered}"
                         + (f" ({boxes})" if boxes else ""))
            zero = sum(c.box_bytes - c.in_bounds for c in bar.copies)
            if zero:
                parts.append(f"{zero} of them zero-filled past the tensor's edge (TMA counts the full box)")
        return "; ".join(parts)

    def _report_deadlock(self):
        """The blocked threads, grouped; and for each stuck phase, why it cannot complete."""
        groups: dict = {}
        for th in self.deadlocked:
            tok = th.token
            if tok is None:
                key = ("other", th.rank)
            elif tok[0] == "wait":
                key = ("wait", th.rank, id(tok[1]), tok[2] & 1, tok[3].id)
            else:
                key = (tok[0], th.rank, tok[1] if len(tok) > 1 else None)
            groups.setdefault(key, []).append(th)
        summary = []
        stuck = {}
        for key, ths in groups.items():
            who = [(t.rank, t.tid) for t in ths]
            if key[0] == "wait":
                bar, parity, site = ths[0].token[1], ths[0].token[2] & 1, ths[0].token[3]
                stuck[id(bar)] = bar
                summary.append((who, site.id, f"wait on {bar.label} for parity {parity} "
                                              f"(phase {bar.n}: {self.barrier_state_text(bar)})"))
            elif key[0] == "sync":
                summary.append((who, None, f"wait at named barrier {key[2]}"))
            else:
                summary.append((who, None, f"wait at {key[0]}"))
        self.stuck = list(stuck.values())
        for bar in self.stuck:
            self._why_stuck(bar)
        f = Finding("deadlock", "", None, [], None, "no thread can go on", None)
        f.groups = summary
        if f.key() not in self._seen:
            self._seen.add(f.key())
            self.findings.append(f)

    def _why_stuck(self, bar):
        """A stuck phase's cause, when it is visible in the phase itself."""
        who = [(a[0], a[1]) for a in bar.arrivals]
        if bar.count is not None and bar.pending <= 0 and bar.tx != 0:
            site = self.program.sites[bar.expected_sites[0]] if bar.expected_sites else None
            self.find("expect-tx", bar.label, bar.n, who, site,
                      f"every arrival is in but the bytes do not add up: {self.barrier_state_text(bar)}",
                      bar.rank)
            return
        if bar.skipped:
            site = self.program.sites[bar.skipped[0][2]]
            self.find("arrivals", bar.label, bar.n, [(r, t) for r, t, _ in bar.skipped], site,
                      f"reach the arrive on {bar.label} with its predicate off: the phase gets "
                      f"{self.barrier_state_text(bar)}", bar.rank)
            return
        arrivers = {(r, t) for sid, ths in self.site_threads.items()
                    if self.site_bar.get(sid) == bar.label.split("[")[0]
                    and self.program.sites[sid].kind in ("arrive", "commit") for r, t in ths if r == bar.rank}
        missing = arrivers - set(who)
        gone = [m for m in missing if self.ctas[m[0]].threads[m[1]].state == "done"]
        if missing and len(gone) == len(missing):
            self.find("arrivals", bar.label, bar.n, sorted(gone), None,
                      f"left the kernel without arriving on {bar.label} (they arrive on it elsewhere): "
                      f"the phase gets {self.barrier_state_text(bar)}", bar.rank)


def _extent(launch, program, tag, params):
    v = program.launch_extents.get(tag)
    if v is None:
        return 1
    if hasattr(v, "value"):
        return int(v.value)
    name = getattr(v, "name", None)
    if name in params:
        return params[name]
    raise SimError(f"launch extent {tag} = {v} is not known")


def _readers(threads, engine) -> str:
    ranks = sorted({r for r, _ in threads})
    where = f" of cluster {plural('rank', ranks)}" if ranks != [0] else ""
    if engine == "wgmma":
        return f"the wgmma of {plural('warp', [t // 32 for _, t in threads])}{where}"
    return f"the MMA issued by {plural('thread', [t for _, t in threads])}{where}"
