"""The simulator's asynchronous engines: TMA copies, wgmma and tcgen05 MMAs, and the operand
tiles they write and read. A mixin of :class:`gemm_ladder.protocol.sim.Sim`.

Which mbarrier a TMA copy completes on, as PTX defines it (``cp.async.bulk.tensor``):

- unicast: the mbarrier operand, which must lie in the destination CTA (``.cta_group::1``);
- ``.multicast::cluster``: the mbarrier at the operand's offset in every destination CTA;
- ``.cta_group::2`` (Blackwell CTA pairs): the destination's own mbarrier or its pair peer's,
  whichever has the parity of the CTA the operand names; with multicast, for every
  destination. So a non-leader's copies complete on its pair leader's barrier.

A ``tcgen05.mma.cta_group::2`` (issued by the pair's even CTA) reads the operand tiles of both
CTAs of the pair at the same offsets; its commit covers the reads in both.
"""

from __future__ import annotations

import numpy as np

from .state import Copy, Pending, Read
from .values import SimError, Smem, TMap
from .words import plural


class EngineMixin:
    """TMA loads, MMA issues and commits, stores into operand tiles."""

    # -- TMA -------------------------------------------------------------------------------------
    def tma_load(self, th, dst, tmap, coords, mbar, mask, site, pair=False):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if not isinstance(dst, Smem) or not isinstance(mbar, Smem):
            raise SimError(f"TMA load with an address the checker cannot follow at {site.text}")
        info = self.kir.tensormaps.get(tmap.name) if isinstance(tmap, TMap) else None
        if info is None:
            raise SimError(f"TMA load from an unknown tensor map {tmap!r} at {site.text}")
        self._role_after_wait(th, "producer")
        th.last_action = "tma"
        th.tick()
        home = th.rank if dst.rank is None else dst.rank
        named = th.rank if mbar.rank is None else mbar.rank  # the CTA the mbarrier operand names
        if mask is None:
            ranks = [home]
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
        first = None
        for r in ranks:
            if pair:
                b = (r & ~1) | (named & 1)
            elif mask is None:
                b = named
                if b != r:
                    self.find("tma", self.kir.slot_label(mbar.off), None, [(th.rank, th.tid)], site,
                              f"a copy into cluster rank {r} completes on an mbarrier of rank {b}: "
                              f"only a .cta_group::2 copy may signal another CTA", th.rank)
            else:
                b = r
            bar = self._bar(th, Smem(mbar.off, b), site, "TMA complete_tx")
            if bar.count is None:
                self.find("init", bar.label, None, [(th.rank, th.tid)], site,
                          f"TMA completes on {bar.label} of CTA rank {b} before it is initialised", b)
                continue
            g, e = bar.init_by
            if th.vc[g] < e:
                self.find("init", bar.label, None, [(th.rank, th.tid)], site,
                          f"TMA completes on {bar.label} of CTA rank {b} without a barrier after its "
                          f"init (fence.mbarrier_init + CTA/cluster sync) ordering the init before it", b)
            self.site_bar[site.id] = bar.label.split("[")[0]
            copy = Copy(len(self.copies), (th.rank, th.tid), site.id, info.name, info.box_bytes, inb, r,
                        dst.off, mbar.off, th.vc.copy(), bar.n, b)
            self.copies.append(copy)
            first = first or copy
            self._write(th, r, dst.off, ("tma", copy), site)
            self.in_flight.append(copy)
        if inb == 0 and first is not None:
            self.outside.append((th, site, info, coords, first))
        if self.policy != "lockstep":
            self.land_all()

    def bulk_load(self, th, dst, size, mbar, site):
        """A plain bulk copy (no tensor map) of ``size`` bytes into this CTA's shared memory at
        ``dst``, completing on ``mbar``: counted as a tensor copy's box is, all in bounds (a bulk
        copy has no bounds to clamp to: the kernel keeps it inside its tensor). PTX requires the
        destination and the size 16-byte aligned (a finding if not)."""
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if not isinstance(dst, Smem) or not isinstance(mbar, Smem):
            raise SimError(f"bulk copy with an address the checker cannot follow at {site.text}")
        if not isinstance(size, int):
            raise SimError(f"bulk copy of {size!r} bytes, not known, at {site.text}")
        self._role_after_wait(th, "producer")
        th.last_action = "tma"
        th.tick()
        home = th.rank if dst.rank is None else dst.rank
        b = th.rank if mbar.rank is None else mbar.rank
        if dst.off % 16 or size % 16:
            self.find("tma", self.kir.slot_label(mbar.off), None, [(th.rank, th.tid)], site,
                      f"a bulk copy of {size} bytes into shared offset {dst.off}: PTX needs both multiples of 16",
                      th.rank)
        if b != home:
            self.find("tma", self.kir.slot_label(mbar.off), None, [(th.rank, th.tid)], site,
                      f"a bulk copy into cluster rank {home} completes on an mbarrier of rank {b}", th.rank)
        bar = self._bar(th, Smem(mbar.off, b), site, "bulk copy complete_tx")
        if bar.count is None:
            self.find("init", bar.label, None, [(th.rank, th.tid)], site,
                      f"a bulk copy completes on {bar.label} of CTA rank {b} before it is initialised", b)
            return
        self.site_bar[site.id] = bar.label.split("[")[0]
        copy = Copy(len(self.copies), (th.rank, th.tid), site.id, "bulk copy", size, size, home, dst.off, mbar.off,
                    th.vc.copy(), bar.n, b)
        self.copies.append(copy)
        self._write(th, home, dst.off, ("tma", copy), site)
        self.in_flight.append(copy)
        if self.policy != "lockstep":
            self.land_all()

    def land_all(self):
        while self.in_flight:
            self.land(self.in_flight.popleft())

    def land(self, copy):
        bar = self.ctas[copy.bar_rank].bars[copy.bar_off]
        copy.done = True
        if copy.issue_phase != bar.n:
            where = self._region_text(copy.dst_off) + (f" of cluster rank {copy.dst_rank}"
                                                       if copy.dst_rank != copy.bar_rank else "")
            self.find("expect-tx", bar.label, copy.issue_phase, [copy.issuer], self.program.sites[copy.site],
                      f"a TMA copy into {where} issued for phase {copy.issue_phase} of {bar.label} lands "
                      f"in phase {bar.n}: phase {copy.issue_phase} completed before all its bytes landed "
                      f"(its expect_tx counted fewer bytes than its copies)", bar.rank)
        bar.tx -= copy.box_bytes
        bar.copies.append(copy)
        bar.pendings.append(copy.landed)
        bar.acc = self.join(bar.acc, copy.issue_vc)
        self.version += 1
        self._maybe_complete(bar)

    def judge_outside(self):
        """Boxes wholly outside their tensor: a finding (a tile index past the grid?), or, in a
        cluster where other boxes of the same refill of the stage (its phase) are in bounds, a
        note: a cluster hanging over the grid's edge still loads every part of its tile (the
        parts past the edge zero-filled), so that each CTA's multicast parts reach its peers
        and every stage's byte count is met."""
        live = {(c.bar_off, c.issue_phase) for c in self.copies if c.in_bounds}
        for th, site, info, coords, copy in self.outside:
            dims = "x".join(map(str, reversed(info.dims)))
            at = ", ".join(map(str, reversed(coords)))
            text = (f"loads a {info.describe()} at ({at}), wholly outside the {dims} tensor: every "
                    f"byte is zero-filled")
            key = ("tma-bounds", site.id, info.name)
            if len(self.ctas) > 1 and (copy.bar_off, copy.issue_phase) in live:
                stage = self.kir.slot_label(copy.bar_off)
                self.find("tma-bounds", info.name.replace("_tensormap", ""), None, [(th.rank, th.tid)], site,
                          f"{text} and counted, by design: the cluster's tile hangs over the grid's "
                          f"edge, and other boxes of the same refill (phase {copy.issue_phase} of "
                          f"{stage}) are in bounds", th.rank, key=key + ("note",), note=True)
            else:
                self.find("tma-bounds", info.name.replace("_tensormap", ""), None, [(th.rank, th.tid)], site,
                          f"{text} (a tile index past the grid?)", th.rank, key=key)

    # -- MMA and operand tiles -------------------------------------------------------------------
    def _region(self, rank, off):
        reg = self.kir.region_of(off)
        if reg is None or reg[0] not in self.kir.operand_buffers:
            return None
        return self.ctas[rank].regions.setdefault(reg, {"write": None, "reads": [], "key": reg})

    def _region_text(self, off):
        reg = self.kir.region_of(off)
        return self.kir.region_label(reg) if reg else f"shared byte {off}"

    @staticmethod
    def _visible(th, token) -> bool:
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
            if rd.retire is not None and self._visible(th, rd.retire):
                continue
            if rd.retire is None or any(r[0].endswith(f"[{stage}]") for r in rd.released):
                # the release that went out before the read retired: the owner's arrive on the
                # slot of this stage, else its first arrive after the read
                rel = next((r for r in rd.released if r[0].endswith(f"[{stage}]")), None) or \
                    (rd.released[0] if rd.released else ("", None))
                early.setdefault((rel[0], rel[1], rd.engine, rd.retire is None), []).append(rd.thread)
            else:
                unordered.append(rd.thread)
        for (bar, phase, engine, in_flight), readers in early.items():
            if in_flight:
                pending = ("are in flight: their wgmma group is not retired (wgmma.wait_group)"
                           if engine == "wgmma" else "are in flight: no tcgen05.commit covers it yet")
                pending += f"; they released it by arriving on {bar} before the read retired" if bar else ""
            else:  # retired since, but after the release this write waited for
                pending = (f"may be in flight: they released it by arriving on {bar} before "
                           + ("wgmma.wait_group retired their group" if engine == "wgmma"
                              else "a tcgen05.commit covered them"))
            self.find("release", bar or label, phase, [(th.rank, th.tid)], site,
                      f"refills {label} while the MMA reads of it by {_readers(readers, engine)} "
                      f"{pending}", rank, key=("release", region["key"][0], "early"))
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

    def mma_issue(self, th, engine, descs, site, vc=None, who=None, pair=False):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        self._role_after_wait(th, "consumer" if engine == "wgmma" else "MMA")
        th.last_action = "mma"
        th.tick()
        if vc is None:
            vc = th.vc
        who = who or [(th.rank, th.tid)]
        ranks = [th.rank]
        if pair:  # the pair's operand tiles, at the same offsets in both CTAs
            ranks = [r for r in (th.rank & ~1, th.rank | 1) if r < len(self.ctas)]
        for d in descs:
            if not isinstance(d, int):
                raise SimError(f"MMA descriptor {d!r} is not known at {site.text}")
            off = (d & 0x3FFF) << 4
            for rank in ranks:
                self._mma_read(th, engine, rank, off, site, vc, who)

    def _mma_read(self, th, engine, rank, off, site, vc, who):
        region = self._region(rank, off)
        if region is None:
            return
        w = region["write"]
        label = self.kir.region_label(region["key"]) + (f" of cluster rank {rank}" if rank != th.rank else "")
        if w is None:
            self.find("race", label, None, who, site, f"MMA reads {label} before anything wrote it", th.rank)
        elif w[0] == "tma":
            copy = w[1]
            if not copy.done or not copy.landed.visible(vc):
                bar = self.kir.slot_label(copy.bar_off)
                self.find("race", bar, copy.issue_phase, who, site,
                          f"MMA reads {label} before the TMA copy into it landed: no wait on "
                          f"phase {copy.issue_phase} of {bar} orders it", th.rank)
        elif w[0] == "gen" and vc[w[1]] < w[2]:
            self.find("race", label, None, who, site,
                      f"MMA reads {label} before the stores of thread {w[3][1]} are ordered before it", th.rank)
        rd = Read((th.rank, th.tid), th.g, site.id, engine, region["key"])
        region["reads"].append(rd)
        th.unreleased.append(rd)
        (th.wg_open if engine == "wgmma" else th.tc_open).append(rd)

    def wgmma_commit(self, th, site):
        th.wg_groups.append(th.wg_open)
        th.wg_open = []

    def tcgen05_commit(self, th, addr, mask, site):
        self.site_threads.setdefault(site.id, set()).add((th.rank, th.tid))
        if mask is not None and not isinstance(mask, int):
            raise SimError(f"commit multicast mask {mask!r} is not known at {site.text}")
        pending = Pending()
        for rd in th.tc_open:
            rd.retire = pending
        th.tc_open = []
        votes = self.site_roles.setdefault(site.id, {})
        votes["MMA"] = votes.get("MMA", 0) + 1
        th.last_action = "commit"
        # multicast: the mbarrier at the operand's offset in every CTA of the mask
        targets = [addr] if mask is None else [Smem(addr.off, r) for r in range(len(self.ctas)) if mask >> r & 1]
        for target in targets:
            bar = self._bar(th, target, site, "tcgen05.commit")
            if not self._use(th, bar, site, "commits to"):
                continue
            th.tick()
            bar.arrivals.append((th.rank, th.tid, 1, site.id))
            bar.pending -= 1
            bar.pendings.append(pending)
            bar.acc = self.join(bar.acc, th.vc)
            self._note_arrival(th, bar, site)
            self._maybe_complete(bar)


def _readers(threads, engine) -> str:
    ranks = sorted({r for r, _ in threads})
    where = f" of cluster {plural('rank', ranks)}" if ranks != [0] else ""
    if engine == "wgmma":
        return f"the wgmma of {plural('warp', [t // 32 for _, t in threads])}{where}"
    return f"the MMA issued by {plural('thread', [t for _, t in threads])}{where}"
