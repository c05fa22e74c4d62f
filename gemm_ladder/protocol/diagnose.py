"""What the simulator says when a run ends badly: a phase left open at exit, or a deadlock with,
for each phase that cannot complete, why (bytes that do not add up, an arrive predicated off,
threads that left without arriving, arrivals that go to another CTA's barrier only). A mixin of
:class:`gemm_ladder.protocol.sim.Sim`.
"""

from __future__ import annotations

from .state import Finding


class DiagnoseMixin:
    """End-of-run checks and the deadlock report."""

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
            return
        self._why_stuck_cluster(bar)

    def _why_stuck_cluster(self, bar):
        """Threads that arrive on this slot in other CTAs of the cluster but never on this CTA's,
        while every thread that does arrive on it is in: a release (or commit) that misses a
        CTA whose barrier counts it."""
        arrivals = self.arrive_map.get(bar.label, {})
        current = {(a[0], a[1]) for a in bar.arrivals}
        if len(self.ctas) < 2 or any(bar.rank in seen and th not in current for th, seen in arrivals.items()):
            return  # a thread that arrives here is still to come (blocked elsewhere)
        elsewhere: dict = {}
        for (r, t), seen in arrivals.items():
            if bar.rank not in seen:
                site = next(iter(seen.values()))
                elsewhere.setdefault((r, site), []).append((r, t))
        for (r, site), ths in sorted(elsewhere.items()):
            ranks = sorted({b for th in ths for b in self.arrive_map[bar.label][th]})
            self.find("arrivals", bar.label, bar.n, ths, self.program.sites[site],
                      f"arrive on {bar.label} of cluster {_ranks(ranks)} but never on that of cluster "
                      f"rank {bar.rank}, whose phase {bar.n} waits for them: it gets "
                      f"{self.barrier_state_text(bar)}", r)


def _ranks(ranks) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
