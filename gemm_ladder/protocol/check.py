"""The mbarrier protocol check of a kernel: run its threads, report per barrier, name the faults.

    from gemm_ladder.protocol import check
    report = check.check_config(gemm_ladder.make_config("v5", 1000, 1000, 520))
    print(report.table())          # one block per barrier
    assert report.ok, report.findings

What is checked, over the threads of one CTA (a cluster: all its CTAs) and a few schedules:

- every phase completes with exactly its init count of arrivals, and its expect_tx bytes equal
  the bytes of the TMA copies that complete on it (the full box, zero-filled edges included);
  a phase that never completes is reported as the deadlock it causes, with the barrier's state;
- every wait lands on the next phase of its barrier: not the same one again (a phase that did
  not flip), not one later (a waiter two phases behind, which a parity cannot tell apart);
- an MMA reads a stage only after the TMA copy into it landed (a wait on the phase its bytes
  completed), and a stage is refilled (TMA or thread stores) only after every MMA read of it
  retired (``wgmma.wait_group``, or the ``tcgen05.commit`` barrier) *and* that release reached
  the writer through a barrier phase;
- barriers are initialised before use, and the kernel does not end with a phase half done or
  TMA copies in flight;
- no TMA box lies wholly outside its tensor (all zero-fill: a tile index past the grid), but
  in a cluster whose tile hangs over the grid's edge: there a CTA whose own tile is past the
  edge still loads its boxes so that its multicast parts reach its peers (a note, not a finding).

Clusters run whole: every thread of every CTA of the cluster, with remote arrives (``mapa``),
multicast and ``.cta_group::2`` TMA, pair MMAs and commits, and the cluster barrier
(``barrier.cluster.arrive`` / ``wait``) that orders the mbarrier inits before the peers use them.

Each finding names the check, the barrier and phase, the role (producer / consumer / MMA /
epilogue, from what the threads do after the wait or before the arrive) and the threads.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from ..core.spec import spec_of
from ..sm90a import grouped
from ..sync.classes import COUNTED_BRANCHES_ATTR, NAMED_BARRIERS_ATTR, WATCHDOG_ATTR
from .interp import Program
from .kernel_ir import KernelIR, load
from .sim import Finding, Sim
from .values import SimError
from .words import describe, unit_of

POLICIES = ("forward", "reverse", "lockstep")
TILES_PER_CTA = 3  # persistent rungs: CTA 0 gets this many tiles


@dataclass
class Report:
    title: str
    kir: KernelIR
    program: Program
    sims: list[Sim]
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # by design, not a fault (printed in the table)
    raw: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    roles: dict = field(default_factory=dict)
    site_threads: dict = field(default_factory=dict)
    site_bars: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        status = "ok" if self.ok else f"{len(self.findings)} finding(s)"
        bars = ", ".join(f"{b.name}[{b.depth}]" for b in self.kir.barriers) or "no mbarriers"
        return f"{self.title}: {bars}: {status} ({self.seconds:.1f} s)"

    def table(self) -> str:
        return render_table(self)

    def site_table(self) -> list[dict]:
        """role and unit of every wait site, as the watchdog's decoder reads them."""
        out = []
        for site in self.program.sites:
            if site.kind != "wait":
                continue
            wd = site.extra.get("watchdog_site")
            out.append({"site": wd if wd is not None else site.id, "role": self.roles.get(site.id),
                        "unit": unit_of(self.site_threads.get(site.id, set()), self.sims[0].n_threads),
                        "who": describe(self.site_threads.get(site.id, set()), self.sims[0].n_threads),
                        "phase": site.phase_text})
        return out


# -- running -------------------------------------------------------------------------------------
def _param_values(kir: KernelIR, program: Program, num_ctas: int | None) -> dict:
    """A persistent kernel's grid: whole clusters, about TILES_PER_CTA tiles each."""
    values = {}
    cluster = _extent(program, "clusterCtaIdx.x", {})
    for name in program.params:
        if name == "num_ctas":
            if num_ctas is None:
                tiles = math.prod(kir.cfg.grid_mn) if kir.cfg is not None else 4
                num_ctas = cluster * max(1, math.ceil(math.ceil(tiles / cluster) / TILES_PER_CTA))
            values[name] = num_ctas
    if kir.cfg is not None and spec_of(kir.cfg).grouped:
        # the grouped kernel's schedule follows its runtime M and routing (v12: grouped.checker_params)
        given = grouped.checker_params(kir.cfg)
        values.update({name: given[name.removesuffix("_ptr")] for name in program.params
                       if name.removesuffix("_ptr") in given})  # a tensor's parameter: its pointer
    return values


def _extent(program, tag, params) -> int:
    v = program.launch_extents.get(tag)
    if v is None:
        return 1
    if hasattr(v, "value"):
        return int(v.value)
    return int(params.get(getattr(v, "name", ""), 1))


def block_sets(program: Program, params: dict, which: str = "ends") -> list[tuple[list, int]]:
    """The CTAs to run together (a cluster, or one CTA) and the cluster size: first and last."""
    gx, gy, gz = (_extent(program, f"blockIdx.{a}", params) for a in "xyz")
    cluster = _extent(program, "clusterCtaIdx.x", params)
    first = [(r, 0, 0) for r in range(cluster)]
    last_x = max(0, gx // cluster - 1) * cluster
    last = [(last_x + r, gy - 1, gz - 1) for r in range(cluster)]
    sets = [first]
    if which == "ends" and last != first:
        sets.append(last)
    return [(s, cluster) for s in sets]


def run(kir: KernelIR, *, policies=POLICIES, num_ctas: int | None = None, which: str = "ends",
        title: str | None = None, step_budget: int | None = None) -> Report:
    t0 = time.perf_counter()
    sims: list[Sim] = []
    program = None
    try:
        attrs = kir.func.attrs if kir.func.attrs is not None else {}
        program = Program(kir.device, kir.operand_buffers, named_barriers=NAMED_BARRIERS_ATTR in attrs,
                          counted_branches=COUNTED_BRANCHES_ATTR in attrs)
        params = _param_values(kir, program, num_ctas)
        for blocks, cluster in block_sets(program, params, which):
            for policy in policies:
                sims.append(Sim(kir, program, blocks, params, policy, cluster, step_budget).run())
    except SimError as err:
        report = Report(title or _title(kir), kir, program, sims, seconds=time.perf_counter() - t0)
        report.findings.append(f"[simulate] {err}")
        return report
    report = Report(title or _title(kir), kir, program, sims)
    _merge(report)
    report.seconds = time.perf_counter() - t0
    return report


def _title(kir: KernelIR) -> str:
    c = kir.cfg
    if c is None:
        return f"kernel ({kir.arch})"
    return f"{c.rung} {kir.arch} {c.M}x{c.N}x{c.K} {c.dtype} [{c.tag().split(c.arch)[-1].lstrip('_') or 'defaults'}]"


def _merge(report: Report) -> None:
    roles: dict = {}
    threads: dict = {}
    bars: dict = {}
    for sim in report.sims:
        for site, votes in sim.site_roles.items():
            agg = roles.setdefault(site, {})
            for k, v in votes.items():
                agg[k] = agg.get(k, 0) + v
        for site, ths in sim.site_threads.items():
            threads.setdefault(site, set()).update((0, t) for _, t in ths)
        bars.update(sim.site_bar)
    report.roles = {s: max(v, key=v.get) for s, v in roles.items()}
    sites = report.program.sites
    for site in sites:
        if site.kind == "mma":
            report.roles[site.id] = _MMA_ROLE[site.extra.get("engine")]
        elif site.kind == "tma":
            report.roles[site.id] = "producer"
        elif site.kind == "wait" and site.id not in report.roles:
            # a wait no run got past: the role of what the code does after it
            report.roles[site.id] = _role_after(sites, site.id)
    report.site_threads = threads
    report.site_bars = bars
    merged: dict = {}
    notes: dict = {}
    for sim in report.sims:
        for f in sim.findings:
            text = render_finding(report, sim, f)
            if text not in merged:
                merged[text] = []
                report.raw.append(f)
            merged[text].append(sim.policy)
        for f in sim.notes:
            notes.setdefault(render_finding(report, sim, f), None)
    for text, policies in merged.items():
        names = list(dict.fromkeys(policies))
        report.findings.append(f"{text} [{', '.join(names)} schedule{'s' if len(names) > 1 else ''}]")
    report.notes = list(notes)


_MMA_ROLE = {"wgmma": "consumer", "tcgen05": "MMA", None: "consumer"}


def _role_after(sites, i: int) -> str:
    for site in sites[i + 1:]:
        if site.kind == "tma":
            return "producer"
        if site.kind == "mma":
            return _MMA_ROLE[site.extra.get("engine")]
        if site.kind in ("arrive", "commit", "store"):
            return "epilogue"
    return "epilogue"


def _cta_name(sim: Sim, rank) -> str:
    if rank is None or rank >= len(sim.ctas):
        return ""
    block = sim.ctas[rank].block
    name = f"CTA {block[0]}" if block[1:] == (0, 0) else f"CTA {block}"
    return name + (f" (cluster rank {rank})" if len(sim.ctas) > 1 else "")


def _who(report: Report, sim: Sim, who, site, rank=None) -> str:
    by_rank: dict = {}
    for r, t in who:
        by_rank.setdefault(r, set()).add((r, t))
    if not by_rank:
        return ""
    role = report.roles.get(site) if site is not None else None
    parts = []
    for r in ([rank] if rank in by_rank else sorted(by_rank)):
        parts.append(f"{role + ' ' if role else ''}{describe(by_rank[r], sim.n_threads)} of {_cta_name(sim, r)}")
    return " and ".join(parts)


def render_finding(report: Report, sim: Sim, f: Finding) -> str:
    phase = f" phase {f.phase}" if f.phase is not None else ""
    head = f"[{f.check}]" + (f" {f.barrier}{phase}" if f.barrier else "")
    text = f.text.replace("{others}", describe(f.others, sim.n_threads)) if f.others else f.text
    if f.groups:
        body = "; ".join(f"{_who(report, sim, who, site)} {t}" for who, site, t in f.groups)
        return f"{head} {text}: {body}"
    who = _who(report, sim, f.who, f.site, f.cta)
    return f"{head}: {who + ': ' if who else ''}{text}"


# -- the table -----------------------------------------------------------------------------------
def render_table(report: Report) -> str:
    kir, sims = report.kir, report.sims
    lines = [report.summary()]
    if not sims:
        return "\n".join(lines + [f"  {f}" for f in report.findings])
    sim = sims[0]
    n = sim.n_threads
    sites = {s.id: s for s in report.program.sites}
    for arr in kir.barriers:
        prefix = arr.name + "["
        states = [b for c in sim.ctas for b in c.bars.values() if b.label.startswith(prefix) and b.rank == 0]
        counts = sorted({b.count for b in states if b.count is not None})
        phases = " ".join(str(next((b.n for b in states if b.label == arr.label(i)), 0)) for i in range(arr.depth))
        bad = [f for f in report.findings if f"] {prefix}" in f or f"{arr.name}[" in f.split(":")[0]]
        kind = {"tma": "TMABar", "tcgen05": "TCGen05Bar", "mbarrier": "MBarrier"}.get(arr.kind, arr.kind)
        lines.append(f"  {arr.name} ({kind} x{arr.depth}, init {', '.join(map(str, counts)) or '?'}): "
                     f"phases completed per slot {phases}: {'ok' if not bad else f'{len(bad)} finding(s)'}")
        mine = [sid for sid, name in report.site_bars.items() if name == arr.name]
        block: list[str] = []
        tma_sites: list[int] = []
        for sid in sorted(mine):
            site = sites[sid]
            who = describe(report.site_threads.get(sid, set()), n)
            role = report.roles.get(sid, "")
            if site.kind == "arrive":
                tx = sorted(sim.site_phases.get(sid, set()))
                what = f"arrive.expect_tx {', '.join(map(str, tx))} B" if tx else "arrive"
                block.append(f"    arrive    {role} {who}: {what}")
            elif site.kind == "commit":
                block.append(f"    arrive    {role} {who}: tcgen05.commit (when its MMAs complete)")
            elif site.kind == "tma":
                tma_sites.append(sid)
            elif site.kind == "wait":
                phase = site.phase_text[:-4] if site.phase_text.endswith(" ^ 0") else site.phase_text
                block.append(f"    wait      {role} {who}: parity {phase}")
        block.extend(_tma_lines(kir, sims, sites, tma_sites))
        for line in dict.fromkeys(block):  # unrolled copies of one site print once
            lines.append(line)
        hist = [h for b in states for h in b.history]
        if hist:
            shapes = sorted({(sum(a[2] for a in h.arrivals), h.expected, sum(c.box_bytes for c in h.copies))
                             for h in hist})
            for arrivals, exp, got in shapes:
                tail = f"; expect_tx {exp} B, delivered {got} B" if exp or got else ""
                lines.append(f"    phase     {arrivals} arrival(s) of {counts[0] if counts else '?'}{tail}")
        for f in bad:
            lines.append(f"    FINDING   {f}")
    other = [f for f in report.findings if not any(f"{a.name}[" in f for a in kir.barriers)]
    for f in other:
        lines.append(f"  FINDING {f}")
    for f in report.notes:
        lines.append(f"  NOTE    {f}")
    return "\n".join(lines)


def _tma_lines(kir, sims, sites, tma_sites) -> list[str]:
    """One line per tensor map completing on a barrier: its box, and the most of it that an
    edge box zero-fills (TMA still counts those bytes)."""
    by_map: dict = {}
    for sid in tma_sites:
        for c in (c for s in sims for c in s.copies if c.site == sid):
            key = (c.tmap, bool(sites[sid].extra.get("multicast")))
            by_map[key] = max(by_map.get(key, 0), c.box_bytes - c.in_bounds)
    out = []
    for (tmap, multicast), zero in by_map.items():
        info = next((v for v in kir.tensormaps.values() if v.name == tmap), None)
        mc = " (multicast)" if multicast else ""
        edge = f"; edge boxes zero-fill up to {zero} B, counted" if zero else ""
        out.append(f"    complete  TMA {info.describe() if info else tmap}{mc}{edge}")
    return out


# -- entry points --------------------------------------------------------------------------------
def check_kernel(func_or_cfg, **kw) -> Report:
    """Check a rung's config or a traced prim_func (e.g. a deliberately broken variant)."""
    return run(load(func_or_cfg), **kw)


def check_config(cfg, **kw) -> Report:
    return check_kernel(cfg, **kw)


def check_module(mod, **kw) -> Report:
    """Check a :class:`gemm_ladder.compile.builder.BuiltModule` (its config is traced again)."""
    return check_kernel(mod.cfg, **kw)


def watchdog_table(func) -> dict | None:
    """The table a watchdog build's manifest carries: barrier names and, per bounded wait, its
    role and unit (from a short run of the checker; a site no run reached gets its role from
    the code after it). None for a build without the watchdog."""


    attrs = func.attrs if func.attrs is not None else {}
    if WATCHDOG_ATTR not in attrs:
        return None
    table = json.loads(str(attrs[WATCHDOG_ATTR]))
    try:
        report = run(load(func), policies=("forward",), which="first", step_budget=40_000)
        by_site = {s["site"]: s for s in report.site_table()}
    except Exception as err:  # pylint: disable=broad-except
        by_site = {}
        table["roles_error"] = f"{type(err).__name__}: {err}"
    for site in table["sites"]:
        site.update({k: v for k, v in by_site.get(site["site"], {}).items() if k != "site"})
    return table
