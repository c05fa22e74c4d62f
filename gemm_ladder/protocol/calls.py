"""The call half of the compiled kernel: each barrier-relevant call as a generator function.

A mixin of :class:`gemm_ladder.protocol.interp.Program`. Each handler compiles a call's operands
(:mod:`.exprs`) once, registers a :class:`Site` for it, and returns ``run(th)``, which evaluates
the operands in the thread's environment and hands the operation to the simulator (``th.sim``):
mbarrier init / arrive / expect_tx / wait, TMA loads (unicast, multicast, ``.cta_group::2``),
wgmma and tcgen05 MMAs and commits, CTA / named / cluster barriers, ``mapa`` and the MMA
descriptors. A ``run`` yields only where the thread blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .exprs import simplified
from .values import (BULK_G2S, TCGEN05_MMA_PREFIX, UNKNOWN, WGMMA_MMA_PREFIX, WGMMA_OTHER, SimError, Smem, at_once,
    call_operands, call_strings, func_call_name, is_predicated, op_name, until_done, wgmma_descs)


@dataclass
class Site:
    """One barrier-relevant call in the kernel, in program order."""

    id: int
    kind: str  # init, arrive, expect_tx, wait, tma, mma, commit, wait_group, store, sync
    text: str
    phase_text: str = ""
    extra: dict = field(default_factory=dict)


class CallCompiler:
    """The ``_c_*`` handlers; :meth:`call_handler` picks one for a lowered call."""

    def call_handler(self, call):
        """The handler of ``call`` (bound), or None for a call that does not matter."""
        op = op_name(call)
        handler = _CALLS.get(op)
        if handler is None:
            if op.startswith("tirx.ptx.cp_async_bulk_tensor_g2s"):
                handler = CallCompiler._c_tma_load
            elif op.startswith(BULK_G2S):
                handler = CallCompiler._c_bulk_load
            elif op.startswith(TCGEN05_MMA_PREFIX):
                handler = CallCompiler._c_tcgen05_mma
            elif op.startswith(WGMMA_MMA_PREFIX) and op not in WGMMA_OTHER:
                handler = CallCompiler._c_wgmma_mma
            elif op == "tirx.cuda.func_call" and func_call_name(call) == WATCHDOG_FN:
                handler = CallCompiler._c_watchdog_wait
            else:
                return None
        return handler(self, call)

    def _site(self, kind, node, phase_text="", extra=None) -> Site:
        site = Site(len(self.sites), kind, _short(str(node)), phase_text, extra or {})
        self.sites.append(site)
        return site

    def _c_mbarrier_init(self, call):
        ops = call_operands(call)
        addr, count = self._expr(ops[0]), self._expr(ops[1])
        site = self._site("init", call)
        return at_once(lambda th: th.sim.mbar_init(th, addr(th), count(th), site))

    def _c_mbarrier_arrive(self, call):
        ops = call_operands(call)
        count = self._expr(ops[1]) if len(ops) > 1 else (lambda th: 1)
        return self._arrive(call, ops[0], count, None, self._site("arrive", call))

    def _c_mbarrier_arrive_expect_tx(self, call):
        ops = call_operands(call)
        return self._arrive(call, ops[0], lambda th: 1, self._expr(ops[1]),
                            self._site("arrive", call, extra={"expect_tx": True}))

    def _arrive(self, call, addr_e, count, tx, site):
        """An arrive (with its expect_tx bytes, if ``tx``); a predicated one that is off skips."""
        addr, pred = self._expr(addr_e), self._pred(call)

        def arrive(th):
            if pred is None or pred(th):
                th.sim.mbar_arrive(th, addr(th), count(th), tx(th) if tx is not None else None, site)
            else:
                th.sim.mbar_skip(th, addr(th), site)
        return at_once(arrive)

    def _c_mbarrier_expect_tx(self, call):
        ops = call_operands(call)
        addr, tx = self._expr(ops[0]), self._expr(ops[1])
        site = self._site("expect_tx", call)
        return at_once(lambda th: th.sim.mbar_expect_tx(th, addr(th), tx(th), site))

    def _wait(self, call, addr_e, phase_e, site_extra=None):
        addr, phase = self._expr(addr_e), self._expr(phase_e)
        site = self._site("wait", call, phase_text=simplified(phase_e), extra=site_extra or {})

        def run(th):
            a, p = addr(th), phase(th)
            while True:
                tok = th.sim.mbar_wait(th, a, p, site)
                if tok is None:
                    return
                yield tok
        return run

    def _c_mbarrier_wait(self, call):
        ops = call_operands(call)
        return self._wait(call, ops[0], ops[1])

    _c_mbarrier_wait_cluster = _c_mbarrier_wait

    def _c_watchdog_wait(self, call):
        # gemm_ladder_bounded_wait(bar, phase, record, bar_id, stage, site, limit_ns)
        ops = call_operands(call)
        return self._wait(call, ops[0], ops[1], {"watchdog_site": int(ops[5].value)})

    def _c_tma_load(self, call):
        ops = call_operands(call)
        strings = call_strings(call)
        multicast = any("multicast" in x for x in strings)
        dst, tmap = self._expr(ops[0]), self._expr(ops[1])
        # dst, tensor map, coords..., mbar[, cta_mask][, cache hint]
        rest = ops[2:]
        n_extra = 1 if multicast else 0
        if any("L2::cache_hint" in x for x in strings):
            n_extra += 1
        coords_e = rest[: len(rest) - 1 - n_extra]
        coords = [self._expr(c) for c in coords_e]
        mbar = self._expr(rest[len(coords_e)])
        mask = self._expr(rest[len(coords_e) + 1]) if multicast else None
        pair = "cta_group::2" in strings
        site = self._site("tma", call, extra={"multicast": multicast, "pair": pair})

        return at_once(lambda th: th.sim.tma_load(th, dst(th), tmap(th), [c(th) for c in coords], mbar(th),
                                                  mask(th) if mask is not None else None, site, pair))

    def _c_bulk_load(self, call):
        """A plain bulk copy (``cp.async.bulk.shared::cluster.global``, no tensor map): dst, src,
        size, mbar[, cta_mask][, cache hint]; it completes ``size`` bytes on the mbarrier as a
        tensor copy completes its box."""
        ops = call_operands(call)
        strings = call_strings(call)
        if any("multicast" in x for x in strings):
            raise SimError(f"a multicast plain bulk copy the checker does not model: {_short(str(call))}")
        dst, size, mbar = self._expr(ops[0]), self._expr(ops[2]), self._expr(ops[3])
        site = self._site("tma", call, extra={"multicast": False, "pair": False, "bulk": True})
        return at_once(lambda th: th.sim.bulk_load(th, dst(th), size(th), mbar(th), site))

    def _c_tcgen05_mma(self, call):
        ops = call_operands(call)
        descs = [self._expr(ops[1]), self._expr(ops[2])]
        pair = "cta_group::2" in call_strings(call)
        site = self._site("mma", call, extra={"engine": "tcgen05", "pair": pair})

        return at_once(lambda th: th.sim.mma_issue(th, "tcgen05", [d(th) for d in descs], site, pair=pair))

    def _c_tcgen05_commit(self, call):
        ops = call_operands(call)
        strings = call_strings(call)
        addr = self._expr(ops[0])
        mask = self._expr(ops[1]) if any("multicast" in x for x in strings) and len(ops) > 1 else None
        pred = self._pred(call)
        site = self._site("commit", call)

        def commit(th):
            if pred is None or pred(th):
                th.sim.tcgen05_commit(th, addr(th), mask(th) if mask is not None else None, site)
        return at_once(commit)

    def _c_wgmma_mma(self, call):
        strings = call_strings(call)
        descs = [self._expr(d) for d in wgmma_descs(call)]
        site = self._site("mma", call, extra={"engine": "wgmma", "shape": next(
            (x for x in strings if x.startswith("m64")), "")})

        def run(th):
            yield from until_done(lambda t: t.sim.warp_collective(t, site))(th)
            # one issue per warp: the descriptors are warp-uniform, lane 0 computed them
            # (see _lane0_only); the reads belong to lane 0, checked with every lane's clock
            th.sim.warp_uniform(th, site, lambda: th.sim.wgmma_issue(th, [d(th.cta.threads[th.warp * 32])
                                                                          for d in descs], site))
        return run

    def _c_wgmma_commit(self, call):
        site = self._site("commit", call, extra={"engine": "wgmma"})
        return at_once(lambda th: th.sim.wgmma_commit(th, site))

    def _c_wgmma_wait(self, call):
        n = self._expr(call_operands(call)[0])
        site = self._site("wait_group", call)

        return until_done(lambda th: th.sim.warp_collective(th, site, wait_group=n(th)))

    def _c_cta_sync(self, call):
        site = self._site("sync", call)

        return until_done(lambda th: th.sim.bar_sync(th, 0, None, site))

    def _c_warpgroup_sync(self, call):
        bar = self._expr(call_operands(call)[0])
        site = self._site("sync", call)

        return until_done(lambda th: th.sim.bar_sync(th, bar(th), 128, site))

    def _c_named_bar_sync(self, call):
        """``bar.sync id, count`` (``T.ptx.bar.sync``): the epilogues' named barrier of one consumer
        warpgroup, which orders its storing thread's TMA work against the other threads' chunk."""
        ops = call_operands(call)
        bar = self._expr(ops[0])
        count = self._expr(ops[1]) if len(ops) > 1 else (lambda th: None)
        site = self._site("sync", call)

        return until_done(lambda th: th.sim.bar_sync(th, ("named", bar(th)), count(th), site))

    def _c_cluster_sync(self, call):
        """``T.cuda.cluster_sync()``: barrier.cluster.arrive (release) + wait (acquire)."""
        site = self._site("sync", call)

        wait = until_done(lambda th: th.sim.cluster_wait(th, site))

        def run(th):
            th.sim.cluster_arrive(th, site)
            yield from wait(th)
        return run

    def _c_cluster_arrive(self, call):
        release = "relaxed" not in call_strings(call)
        site = self._site("sync", call)

        return at_once(lambda th: th.sim.cluster_arrive(th, site, release))

    def _c_cluster_wait(self, call):
        site = self._site("sync", call)
        return until_done(lambda th: th.sim.cluster_wait(th, site))

    def _c_encode(self, call):
        ops = call_operands(call)
        dst = self._lvalue(ops[0])
        addr = self._expr(ops[1])
        rest = [self._expr(a) for a in ops[2:]]

        def encode(th):
            slot, i = dst(th)
            a = addr(th)
            value = UNKNOWN
            if isinstance(a, Smem):
                lo = (a.off >> 4) & 0x3FFF
                fields = [r(th) for r in rest]
                value = lo
                if fields and isinstance(fields[0], int):
                    value |= (fields[0] & 0x3FFF) << 16
                if len(fields) > 1 and isinstance(fields[1], int):
                    value |= (fields[1] & 0x3FFF) << 32
            arr = th.env[slot]
            if not isinstance(arr, list):
                arr = th.env[slot] = [UNKNOWN] * (i + 1)
            arr[i] = value
        return at_once(encode)

    def _c_mapa(self, call):
        ops = call_operands(call)
        dst = self._lvalue(ops[0])
        addr, rank = self._expr(ops[1]), self._expr(ops[2])

        def mapa(th):
            slot, i = dst(th)
            a, r = addr(th), rank(th)
            arr = th.env[slot]
            if not isinstance(arr, list):
                arr = th.env[slot] = [UNKNOWN] * (i + 1)
            arr[i] = Smem(a.off, r) if isinstance(a, Smem) and isinstance(r, int) else UNKNOWN
        return at_once(mapa)

    def _c_st_vec(self, call):
        ops = call_operands(call)
        addr = self._expr(ops[0])
        site = self._site("store", call)
        return at_once(lambda th: th.sim.smem_store(th, addr(th), site))

    def _pred(self, call):
        """The predicate of a ``@p`` raw PTX call (``pred=``), if the call has one."""
        if not is_predicated(call):
            return None
        return self._expr([a for a in call.args if type(a).__name__ != "StringImm"][-1])


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


WATCHDOG_FN = "gemm_ladder_bounded_wait"

_CALLS = {
    "tirx.ptx.mbarrier_init": CallCompiler._c_mbarrier_init,
    "tirx.ptx.mbarrier_arrive": CallCompiler._c_mbarrier_arrive,
    "tirx.ptx.mbarrier_arrive_expect_tx": CallCompiler._c_mbarrier_arrive_expect_tx,
    "tirx.ptx.mbarrier_expect_tx": CallCompiler._c_mbarrier_expect_tx,
    "tirx.cuda.mbarrier_wait": CallCompiler._c_mbarrier_wait,
    "tirx.cuda.mbarrier_wait_acquire_cluster": CallCompiler._c_mbarrier_wait_cluster,
    "tirx.ptx.tcgen05_commit": CallCompiler._c_tcgen05_commit,
    "tirx.ptx.wgmma_commit_group": CallCompiler._c_wgmma_commit,
    "tirx.ptx.wgmma_wait_group": CallCompiler._c_wgmma_wait,
    "tirx.cuda.cta_sync": CallCompiler._c_cta_sync,
    "tirx.cuda.warpgroup_sync": CallCompiler._c_warpgroup_sync,
    "tirx.ptx.bar_sync_count": CallCompiler._c_named_bar_sync,
    "tirx.cuda.cluster_sync": CallCompiler._c_cluster_sync,
    "tirx.ptx.barrier_cluster_arrive": CallCompiler._c_cluster_arrive,
    "tirx.ptx.barrier_cluster_wait": CallCompiler._c_cluster_wait,
    "tirx.cuda.wgmma_encode_matrix_descriptor": CallCompiler._c_encode,
    "tirx.cuda.tcgen05_encode_matrix_descriptor": CallCompiler._c_encode,
    "tirx.ptx.mapa": CallCompiler._c_mapa,
    "tirx.ptx.st_vec": CallCompiler._c_st_vec,
}
