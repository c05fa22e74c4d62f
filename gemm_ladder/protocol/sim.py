"""Run the threads of one CTA (or one cluster) through a kernel's barrier protocol.

Every thread runs the compiled program (:mod:`gemm_ladder.protocol.interp`) as a generator.
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

This module holds the mbarriers and the run; the thread barriers are in :mod:`.syncs`, TMA and
the MMA engines in :mod:`.engines`, the report of a run that ends badly in :mod:`.diagnose`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .diagnose import DiagnoseMixin
from .engines import EngineMixin
from .state import CTA, TX_LIMIT, BarrierState, Finding, PhaseRecord, Thread
from .syncs import ClusterBarrier, SyncMixin
from .values import TICK, UNKNOWN, SimError, Smem

MAX_STEPS = 3_000_000


class Sim(SyncMixin, EngineMixin, DiagnoseMixin):
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
        self.copies: list = []
        self.in_flight: deque = deque()
        self.findings: list[Finding] = []
        self.notes: list[Finding] = []  # what looks wrong but is by design (see judge_outside)
        self._seen: set = set()
        self.outside: list = []  # TMA boxes wholly outside their tensor, judged after the run
        self.arrive_map: dict = {}  # barrier label -> (rank, tid) -> {barrier rank: arrive site}
        self.site_threads: dict[int, set] = {}
        self.site_roles: dict[int, dict] = {}
        self.site_phases: dict[int, set] = {}
        self.site_bar: dict[int, str] = {}
        self.steps = 0
        self.deadlocked: list = []
        self.stuck: list = []  # barriers threads wait on forever, after a deadlock
        self.finished = False
        self.live_threads = len(self.threads)
        self.cluster_bar = ClusterBarrier(self.zero_vc())

    # -- clocks --------------------------------------------------------------------------------
    def zero_vc(self):
        return np.zeros(self.vc_len, dtype=np.int64)

    def comp(self, rank, off) -> int:
        return self.comp_base + rank * len(self.slots) + self.slots.index(off // 8)

    @staticmethod
    def join(a, b):
        return np.maximum(a, b)

    # -- findings --------------------------------------------------------------------------------
    def find(self, check, barrier, phase, who, site, text, cta=None, others=None, key=None, note=False):
        """Record a finding (a note) once (``key``: what counts as the same one; default its text)."""
        f = Finding(check, barrier, phase, who, site.id if site is not None else None, text, cta)
        f.others = sorted(set(others or []))
        key = key or f.key()
        if key not in self._seen:
            self._seen.add(key)
            (self.notes if note else self.findings).append(f)

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
        self._note_arrival(th, bar, site)
        if bar.pending < 0:
            self.find("arrivals", bar.label, bar.n, [(th.rank, th.tid)], site,
                      f"{bar.label} phase {bar.n} gets {bar.count - bar.pending} arrivals, over its "
                      f"init count {bar.count} (its tx-count holds the phase open)", th.rank)
        self._maybe_complete(bar)

    def _note_arrival(self, th, bar, site):
        seen = self.arrive_map.setdefault(bar.label, {}).setdefault((th.rank, th.tid), {})
        seen.setdefault(bar.rank, site.id)

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
        # phases of this barrier the thread already knew complete before the wait, through other
        # barriers (its vector clock): a waiter that skips phases is safe when it knew the phase
        # before the one it asks for was over (a ping-pong consumer, ordered by its peer)
        known = int(th.vc[bar.comp])
        if observed >= 0:
            th.vc = self.join(th.vc, bar.clocks[observed])
        th.tick()
        key = (bar.rank, bar.off)
        prev = th.observed.get(key)
        if known >= observed > 0 and (prev is None or observed > prev + 1):
            pass  # the skipped phases were ordered before this wait: its parity names one phase
        elif prev is None:
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
        self.judge_outside()
        for th in self.threads:  # the report reads barriers, copies and sites, not the frames
            th.gen = th.env = None
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
