"""The state the simulator keeps: findings, barriers, copies, MMA reads, CTAs and threads."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TX_LIMIT = (1 << 20) - 1  # tx-count and arrival count range of an mbarrier phase


@dataclass
class Finding:
    check: str  # expect-tx | arrivals | phase | race | release | deadlock | init | exit | tma-bounds | ...
    barrier: str
    phase: int | None
    who: list  # [(rank, tid)]
    site: int | None
    text: str  # the message without the role, which is filled in after the run
    cta: int | None = None
    groups: list = field(default_factory=list)  # deadlock: (who, site, text) per blocked group
    others: list = field(default_factory=list)  # threads the text names as {others}

    def key(self):
        return (self.check, self.barrier, self.phase, self.site, self.text)


@dataclass
class Pending:
    """An event whose ordering is known once a barrier phase it counts towards completes."""

    alts: list = field(default_factory=list)  # (vc component, value needed)

    def visible(self, vc) -> bool:
        return any(vc[c] >= need for c, need in self.alts)


@dataclass
class Copy:
    id: int
    issuer: tuple  # (rank, tid)
    site: int
    tmap: str
    box_bytes: int
    in_bounds: int
    dst_rank: int
    dst_off: int
    bar_off: int
    issue_vc: list
    issue_phase: int
    bar_rank: int  # the CTA whose mbarrier the copy completes on
    landed: Pending = field(default_factory=Pending)
    done: bool = False


@dataclass
class Read:
    thread: tuple
    g: int
    site: int
    engine: str
    region: tuple
    retire: object = None  # ("epoch", g, e) or Pending
    released: list = field(default_factory=list)  # (barrier, phase) the owner arrived on since


@dataclass
class PhaseRecord:
    arrivals: list  # (rank, tid, count, site)
    expected: int
    copies: list  # Copy
    step: int = 0  # the simulation step it completed at


class BarrierState:
    __slots__ = ("rank", "off", "comp", "label", "count", "init_by", "pending", "tx", "n", "acc",
                 "clocks", "arrivals", "expected", "copies", "pendings", "history", "expected_sites",
                 "skipped")

    def __init__(self, rank, off, comp, label):
        self.rank, self.off, self.comp, self.label = rank, off, comp, label
        self.count = None
        self.init_by = None  # (g, epoch)
        self.pending = 0
        self.tx = 0
        self.n = 0
        self.acc = None
        self.clocks: list = []
        self.arrivals: list = []
        self.expected = 0
        self.copies: list = []
        self.pendings: list = []
        self.history: list[PhaseRecord] = []
        self.expected_sites: list = []
        self.skipped: list = []  # (rank, tid, site) that reached an arrive with its predicate off


class CTA:
    def __init__(self, rank, block, threads):
        self.rank = rank
        self.block = block  # (bx, by, bz)
        self.threads = threads
        self.bars: dict[int, BarrierState] = {}
        self.regions: dict[tuple, dict] = {}
        self.syncs: dict[int, dict] = {}  # named barrier id -> {"waiting": set, "gen": int}
        self.collectives: dict[int, dict] = {}  # warp -> {"site": id, "waiting": set}
        self.live_lanes: dict[int, int] = {}  # warp -> lanes not yet done
        self.live = 0
        self.tables: dict[int, int] = {}  # byte offset -> an int a thread stored in a shared table


class Thread:
    def __init__(self, sim, cta, tid, g):
        self.sim, self.cta, self.rank, self.tid, self.g = sim, cta, cta.rank, tid, g
        self.lane, self.warp = tid % 32, tid // 32
        self.env = sim.program.new_env()
        self.gen = None
        self.state = "run"
        self.token = None
        self.blocked_at = -1
        self.vc = sim.zero_vc()
        self.wg_open: list = []
        self.wg_groups: deque = deque()
        self.tc_open: list = []
        self.unreleased: list = []  # MMA reads this thread owns, not yet followed by an arrive
        self.last_action = None
        self.after_wait: list = []  # wait sites passed since the thread last did something
        self.observed: dict = {}  # (rank, off) -> last observed phase
        self.sync_gen: dict = {}
        self.collective_gen = -1
        self.passed_gen = -1
        self.cluster_pending = None  # the cluster barrier phase this thread arrived in, not yet waited
        self.branch_visits: dict = {}  # counted branch -> times this thread came to it (Program.counted_branches)

    def tick(self) -> int:
        self.vc[self.g] += 1
        return int(self.vc[self.g])

    def sreg(self, name: str):
        return self.sim.sreg(self, name)

    def sim_leader_lane(self) -> int:
        return min((t.lane for t in self.cta.threads[self.warp * 32:self.warp * 32 + 32]
                    if t.state != "done"), default=self.lane)
