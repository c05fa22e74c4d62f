"""CPU tests of barrier safety: the protocol check over the ladder, the broken variants it must
catch, and the watchdog build (free when off, bounded and decodable when on).

Every config is traced and lowered, never compiled, except where SASS is compared; each report
is computed once per module (about a second per config on two cores).
"""

from __future__ import annotations

import re

import pytest

from gemm_ladder.rungs import RUNGS, available

from .barrier_faults import VARIANTS

SCHEDULES = ("forward", "lockstep")  # reverse is the CLI's third; two keep CI fast
PAIRS = [(r, a) for a in ("sm_90a", "sm_100a") for r in RUNGS if available(r, a)]
KNOB_SAMPLE = [
    ("v5", "sm_90a", {"pipe_depth": 4, "num_warpgroups": 1, "blk_m": 64, "blk_n": 128}),
    ("v6", "sm_90a", {"pipe_depth": 4, "blk_n": 128, "tile_order": "grouped", "l2_group_size": 2}),
    ("v6", "sm_100a", {"pipe_depth": 6, "blk_n": 64, "tile_order": "snake"}),
    # clusters: multicast of both operands and remote releases to 4 CTAs; 3 consumers
    ("v8", "sm_90a", {"cluster_m": 2, "cluster_n": 2, "blk_n": 128, "pipe_depth": 4}),
    ("v9", "sm_90a", {"num_warpgroups": 3, "blk_m": 192, "blk_n": 128, "epi_n": 128}),
    # L2 cache policies on every load, one of them multicast, and split K
    ("v11", "sm_90a", {"stream_b": True, "cluster_m": 2, "blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "split_k": 2}),
    # launched as a programmatic dependent: the grid wait after the barriers' set-up, before any load
    ("v9", "sm_90a", {"pdl": True, "stream_b": True, "blk_m": 64, "blk_n": 64, "num_warpgroups": 1}),
    # stream-K: whole tiles, then the tail's pieces (a counter in global memory, no mbarrier)
    ("v10", "sm_90a", {"stream_k": True, "split_k": 1}),
    # CTA pairs: one pair (no A multicast), with one and two epilogue consumers
    ("v8", "sm_100a", {"cluster_n": 1}),
    ("v9", "sm_100a", {"epi_consumers": 2, "cluster_n": 1, "pipe_depth": 3}),
]


@pytest.fixture(scope="module")
def reports():
    """(rung, arch, knobs) -> [Report] for the ladder's edge scenarios, each checked once."""
    from gemm_ladder.protocol.check import check_config
    from gemm_ladder.barriers.ladder import scenarios

    cache: dict = {}  # config -> Report: a test asking for the last scenario reuses the ladder's

    def get(rung, arch, knobs=None, only_last=False, ends=False):
        cfgs = scenarios(rung, arch, knobs)
        cfgs = cfgs[-1:] if only_last else cfgs[::max(1, len(cfgs) - 1)] if ends else cfgs
        for c in cfgs:
            if c not in cache:
                cache[c] = check_config(c, policies=SCHEDULES)
        return [cache[c] for c in cfgs]
    return get


# -- the ladder passes -------------------------------------------------------------------------
@pytest.mark.parametrize("rung, arch", PAIRS, ids=[f"{r}-{a}" for r, a in PAIRS])
def test_every_rung_passes_the_protocol_check(reports, rung, arch):
    # v1-v3 have no ring: one scenario (the longest K) is enough; v7-v9 run v6's ring, so its
    # two ends (fewer K slices than stages, more with a partial last one); v10 and v11 share v9's
    # ring: their longest K (a partial last slice) only. The CLI runs every scenario.
    got = reports(rung, arch, only_last=rung in ("v1", "v2", "v3", "v10", "v11"), ends=rung in ("v7", "v8", "v9"))
    assert got, f"no scenario of {rung} {arch} could be configured"
    for report in got:
        assert report.ok, report.table()
        assert all(s.finished for s in report.sims), report.summary()
        if arch == "sm_100a" or rung in ("v4", "v5", "v6"):
            assert report.kir.barriers, f"{report.title}: the checker saw no mbarrier"


@pytest.mark.parametrize("rung, arch, knobs", KNOB_SAMPLE, ids=[f"{r}-{a}-{k}" for r, a, k in KNOB_SAMPLE])
def test_knob_sample_passes(reports, rung, arch, knobs):
    for report in reports(rung, arch, knobs, only_last=True):
        assert report.ok, report.table()


def test_scenarios_cover_the_ring_edges():
    from gemm_ladder.barriers.ladder import scenarios

    k_tiles = [c.k_tiles for c in scenarios("v5", "sm_90a", {"pipe_depth": 3})]
    assert k_tiles == [2, 3, 5]  # fewer slices than stages, as many, more (last one partial)
    assert scenarios("v5", "sm_90a", {"pipe_depth": 3})[-1].K % 64
    v6 = scenarios("v6", "sm_90a")[0]
    assert v6.grid_mn[0] * v6.grid_mn[1] == 6  # three tiles for each of two persistent CTAs


def test_table_says_who_arrives_and_waits(reports):
    text = "\n".join(r.table() for r in reports("v5", "sm_90a"))
    assert "tma2mma (TMABar x3, init 1)" in text and "mma2tma (MBarrier x3, init 8)" in text
    assert "producer thread 0: arrive.expect_tx 49152 B" in text
    assert "consumer lane 0 of warps 0-7: arrive" in text
    assert "consumer all 256 threads: parity k // 3 & 1" in text
    assert "producer thread 0: parity " in text  # (k - 1) // 3 & 1, folded where k is known
    assert "expect_tx 49152 B, delivered 49152 B" in text and "8 arrival(s) of 8" in text
    # the last K slice is partial: TMA zero-fills past K and the phase still counts the full box
    assert re.search(r"A box 128x64 = 16384 B; edge boxes zero-fill up to \d+ B, counted", text)
    bw = reports("v6", "sm_100a")[0].table()
    assert "epi2mma (MBarrier x2, init 128)" in bw
    assert "MMA thread 160 (warp 5 lane 0): tcgen05.commit" in bw
    assert "epilogue warpgroup 0 (128 threads): arrive" in bw


def test_every_tma_phase_counts_its_boxes(reports):
    """What tests/test_sm100a.py once checked by parsing the source, per phase and both archs:
    each phase of a TMA barrier expects exactly the bytes of the boxes that complete on it."""
    for rung, arch in (("v5", "sm_90a"), ("v6", "sm_90a"), ("v5", "sm_100a"), ("v6", "sm_100a")):
        for report in reports(rung, arch):
            cfg = report.kir.cfg
            stage = (cfg.blk_m + cfg.blk_n) * cfg.blk_k * cfg.elem_bytes
            phases = [h for s in report.sims for c in s.ctas for b in c.bars.values()
                      if b.label.startswith("tma2mma") for h in b.history]
            assert phases, report.title
            for h in phases:
                assert h.expected == sum(c.box_bytes for c in h.copies) == stage, report.title
                assert sorted(c.tmap for c in h.copies) == ["A_tensormap", "B_tensormap"] or \
                    sorted(c.tmap.rstrip("_1") for c in h.copies) == ["A_tensormap", "B_tensormap"]


def test_cluster_kernel_passes(tmp_path):
    """The 2-CTA multicast kernel (tests/cluster_rung.py): remote arrives, multicast bytes."""
    import gemm_ladder
    from gemm_ladder.protocol.check import check_kernel

    from .barrier_faults import cluster_prim_func

    cfg = gemm_ladder.make_config("v5", 512, 256, 320, pipe_depth=3, num_warpgroups=1, blk_n=128)
    report = check_kernel(cluster_prim_func(cfg), policies=SCHEDULES)
    assert report.ok, report.table()
    assert len(report.sims[0].ctas) == 2
    text = report.table()
    assert "(multicast)" in text and "init 8" in text  # 4 MMA warps x 2 CTAs release each stage


def test_cluster_rungs_run_whole_clusters(reports):
    """Hopper v8: the cluster barrier orders the inits before the peers' multicasts and remote
    releases; every CTA's stage counts its own and its peer's parts."""
    report = reports("v8", "sm_90a", only_last=True)[0]
    assert [c.block for c in report.sims[0].ctas] == [(0, 0, 0), (1, 0, 0)]
    text = report.table()
    assert "mma2tma (MBarrier x3, init 16)" in text and "16 arrival(s) of 16" in text
    assert "expect_tx 49152 B, delivered 49152 B" in text and "(multicast)" in text


def test_cta_pairs_complete_on_the_leader(reports):
    """Blackwell v8: the pair's copies (the peer's through its remote view of the leader's
    barrier, the other pair's multicast A parts) all complete on the leader's tma2mma."""
    report = reports("v8", "sm_100a", only_last=True)[0]
    assert len(report.sims[0].ctas) == 4 and min(c.block[0] for c in report.sims[0].ctas) == 0
    assert [b.name for b in report.kir.barriers] == ["tma2mma", "mma2tma", "mma2epi", "epi2mma"]
    assert "expect_tx 65536 B, delivered 65536 B" in report.table()
    leader_phases = [h for c in report.sims[0].ctas for b in c.bars.values() if b.label.startswith("tma2mma")
                     for h in b.history]
    assert leader_phases and {b.rank for c in report.sims[0].ctas for b in c.bars.values()
                              if b.label.startswith("tma2mma") and b.history} == {0, 2}
    assert all({c.issuer[0] for c in h.copies} == {0, 1, 2, 3} for h in leader_phases)


def test_box_past_the_grid_is_a_note_in_a_cluster(reports):
    """A cluster hanging over the grid's edge loads every part of its tile: a note, not a finding."""
    for rung, arch in (("v8", "sm_90a"), ("v8", "sm_100a")):
        report = reports(rung, arch, only_last=True)[0]
        assert report.ok, report.table()
        notes = [n for n in report.notes if n.startswith("[tma-bounds]")]
        assert notes and all("by design" in n and "CTA " in n for n in notes), report.notes
        assert "  NOTE    [tma-bounds]" in report.table()


def test_box_past_the_grid_is_a_finding_outside_clusters():
    """The same box loaded by a CTA of no cluster (here one CTA past v5's grid) is a finding."""
    import gemm_ladder
    from gemm_ladder.protocol.interp import Program
    from gemm_ladder.protocol.kernel_ir import load
    from gemm_ladder.protocol.sim import Sim

    kir = load(gemm_ladder.make_config("v5", 256, 256, 128, pipe_depth=2))
    program = Program(kir.device, kir.operand_buffers)
    past = int(program.launch_extents["blockIdx.x"].value)
    sim = Sim(kir, program, [(past, 0, 0)], {}, "forward").run()
    hits = [f.text for f in sim.findings if f.check == "tma-bounds"]
    assert hits and all("wholly outside" in t and "past the grid?" in t for t in hits), hits
    assert not sim.notes


# -- the broken variants are caught -----------------------------------------------------------
@pytest.fixture(scope="module")
def broken():
    from gemm_ladder.protocol.check import check_kernel

    cache: dict = {}

    def get(name):
        if name not in cache:
            cache[name] = check_kernel(VARIANTS[name].prim_func(), policies=SCHEDULES)
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(VARIANTS))
def test_broken_variant_is_caught(broken, name):
    variant = VARIANTS[name]
    report = broken(name)
    assert not report.ok, f"{name} ({variant.fault}) passed the check"
    check, barrier = variant.expect
    hits = [f for f in report.findings if f.startswith(f"[{check}] {barrier}[")]
    assert hits, f"{name}: no [{check}] finding on {barrier}:\n" + "\n".join(report.findings)
    for f in hits:
        assert re.search(r"\] \w+\[\d+\] phase \d+: ", f), f"no phase named: {f}"
        assert re.search(r": (producer|consumer|MMA|epilogue) ", f), f"no role named: {f}"
        assert "CTA " in f


EXPECTED = {
    "expect_tx_one_box_over": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 0 of CTA 0: every arrival is "
                              r"in but the bytes do not add up: 1 of 1 arrivals; expect_tx 65536 bytes, its copies "
                              r"delivered 49152 \(A 16384 \+ B 32768\)",
    "arrival_missing": r"\[arrivals\] mma2tma\[0\] phase 0: consumer thread 224 \(warp 7 lane 0\) of CTA 0: reach "
                       r"the arrive on mma2tma\[0\] with its predicate off: the phase gets 7 of 8 arrivals",
    "phase_one_late": r"\[race\] tma2mma\[0\] phase 0: consumer .* of CTA 0: MMA reads Asmem\[0\] before the TMA "
                      r"copy into it landed: no wait on phase 0 of tma2mma\[0\] orders it",
    "release_before_wait_group": r"\[release\] mma2tma\[0\] phase 0: producer thread 0 of CTA 0: refills Asmem\[0\] "
                                 r"while the MMA reads of it by the wgmma of warps? [\d, -]+ are in flight: their "
                                 r"wgmma group is not retired \(wgmma.wait_group\); they released it by arriving on "
                                 r"mma2tma\[0\] before the read retired",
    "multicast_missing_cta": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 0 of CTA 0 \(cluster rank 0\): "
                             r"every arrival is in but the bytes do not add up: 1 of 1 arrivals; expect_tx 32768 "
                             r"bytes, its copies delivered 24576 \(A 16384 \+ B 8192\)",
    "bw_expect_tx_one_box_over": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 128 \(warp 4 lane 0\) of CTA "
                                 r"0: every arrival is in but the bytes do not add up",
    "bw_epilogue_arrival_missing": r"\[arrivals\] epi2mma\[0\] phase 0: epilogue thread 127 \(warp 3 lane 31\) of "
                                   r"CTA 0: reach the arrive on epi2mma\[0\] with its predicate off: the phase gets "
                                   r"127 of 128 arrivals",
    "cluster_release_own_only": r"\[arrivals\] mma2tma\[0\] phase 0: consumer lane 0 of warps 4-11 of CTA 1 \(cluster "
                                r"rank 1\): arrive on mma2tma\[0\] of cluster rank 1 but never on that of cluster rank "
                                r"0, whose phase 0 waits for them: it gets 8 of 16 arrivals",
    "bw_pair_tma_own_barrier": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 128 \(warp 4 lane 0\) of CTA 0 "
                               r"\(cluster rank 0\): every arrival is in but the bytes do not add up: 1 of 1 arrivals; "
                               r"expect_tx 65536 bytes, its copies delivered 32768 \(A 16384 \+ B 16384\)",
    "ws_release_before_wait_group": r"\[release\] mma2tma\[0\] phase 0: producer thread 0 of CTA 0: refills "
                                    r"Asmem\[0\] while the MMA reads of it by the wgmma of warps 4-11 may be in "
                                    r"flight: they released it by arriving on mma2tma\[0\] before wgmma.wait_group "
                                    r"retired their group",
    "cluster_multicast_own_only": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 0 of CTA 0 \(cluster rank "
                                  r"0\): every arrival is in but the bytes do not add up: 1 of 1 arrivals; expect_tx "
                                  r"49152 bytes, its copies delivered 32768 \(A 16384 \+ B 16384\)",
    "cluster_expect_tx_one_box_over": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 0 of CTA 1 \(cluster "
                                      r"rank 1\): every arrival is in but the bytes do not add up: 1 of 1 arrivals; "
                                      r"expect_tx 65536 bytes, its copies delivered 49152 \(B 16384 from rank 0 \+ "
                                      r"A 16384 \+ B 16384\)",
    "bw_pair_expect_tx_one_box_under": r"\[expect-tx\] tma2mma\[0\] phase 0: producer thread 256 \(warp 8 lane 0\) "
                                       r"of CTA 1 \(cluster rank 1\): a TMA copy into Bsmem\[0\] of cluster rank 1 "
                                       r"issued for phase 0 of tma2mma\[0\] lands in phase 1: phase 0 completed "
                                       r"before all its bytes landed",
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_broken_variant_message(broken, name):
    report = broken(name)
    assert any(re.match(EXPECTED[name], f) for f in report.findings), "\n".join(report.findings)


def test_every_variant_has_a_message():
    assert set(EXPECTED) == set(VARIANTS)


def test_deadlock_names_every_blocked_group(broken):
    text = "\n".join(broken("arrival_missing").findings)
    assert re.search(r"\[deadlock\] no thread can go on: producer thread 0 of CTA 0 wait on mma2tma\[0\] "
                     r"for parity 0 \(phase 0: 7 of 8 arrivals\).*consumer warps 1-7 \(224 threads\) of CTA 0 "
                     r"wait on tma2mma\[0\] for parity 1", text), text


# -- the watchdog build ----------------------------------------------------------------------
def _tvm_classes_build(cfg):
    """The rung built with TVM's own barrier classes and no barrier table: what shipped before."""
    import json

    from tvm.backend.cuda.lang import pipeline

    from gemm_ladder.compile import builder
    from gemm_ladder.rungs import CONFIG_ATTR, rung_module

    from .barrier_faults import swapped

    mod = rung_module(cfg.rung, cfg.arch)
    names = {n: getattr(pipeline, n) for n in ("MBarrier", "TMABar", "TCGen05Bar") if hasattr(mod, n)}
    with swapped(mod, **names):
        func = mod.kernel(cfg)
    return builder.build(func.with_attr(CONFIG_ATTR, json.dumps(cfg.to_dict(), sort_keys=True)))


@pytest.mark.parametrize("rung, arch", [("v6", "sm_90a"), ("v6", "sm_100a")])
def test_watchdog_off_is_free(rung, arch):
    """Off (the default), the rungs' barrier classes emit exactly TVM's code: same source, same SASS."""
    import gemm_ladder
    from gemm_ladder.compile import sass

    cfg = gemm_ladder.make_config(rung, 1000, 1024, 520, arch=arch)
    ours, theirs = gemm_ladder.build(cfg.rung, cfg.M, cfg.N, cfg.K, **cfg.knobs()), _tvm_classes_build(cfg)
    assert ours.source == theirs.source
    assert sass.disassemble(ours.binary) == sass.disassemble(theirs.binary)
    assert "watchdog" not in ours.manifest()


@pytest.fixture(scope="module")
def watchdog_build():
    import gemm_ladder

    return gemm_ladder.build("v5", 1000, 1000, 520, pipe_depth=3, blk_n=256, num_warpgroups=2, watchdog=2)


def test_watchdog_bounds_every_wait(watchdog_build):
    from gemm_ladder.compile import sass
    from gemm_ladder.sync.watchdog import WAIT_FN

    src = watchdog_build.source
    assert re.search(r"hgemm_kernel\([^)]*, int64_t barrier_watchdog\)", src), "no trailing record argument"
    assert "tvm_builtin_cuda_mbarrier_wait(" not in src.split("extern \"C\" __global__")[-1]
    calls = re.findall(WAIT_FN + r"\(\(&\(\(\(uint64_t\*\)pool_buf_ptr\)\[[^]]+\]\)\), [^;]*;", src)
    assert len(calls) == 2, calls  # the MMA threads' full wait and the producer's empty wait
    assert "%%globaltimer" in src and "exit;" in src and "trap" not in src
    text = sass.disassemble(watchdog_build.binary)
    assert "GLOBALTIMER" in text.upper() and "EXIT" in text


def test_watchdog_manifest_names_barriers_and_roles(watchdog_build):
    man = watchdog_build.manifest()
    assert man["config"]["watchdog"] == 2 and "watchdog2" in watchdog_build.cfg.tag()
    table = man["watchdog"]
    assert [b["name"] for b in table["barriers"]] == ["tma2mma", "mma2tma"]
    sites = {(s["barrier"], s["role"], s["unit"]) for s in table["sites"]}
    assert sites == {(0, "consumer", "warpgroup"), (1, "producer", "thread")}


def test_watchdog_record_in_words():
    from gemm_ladder.sync import watchdog

    table = {"seconds": 2.0, "barriers": [{"name": "tma2mma"}, {"name": "mma2tma"}],
             "sites": [{"site": 0, "barrier": 0, "role": "consumer", "unit": "warpgroup"},
                       {"site": 1, "barrier": 1, "role": "producer", "unit": "thread"}]}
    words = [0] * watchdog.RECORD_WORDS
    words[watchdog.BAR], words[watchdog.STAGE], words[watchdog.PARITY], words[watchdog.SITE] = 0, 2, 1, 0
    words[watchdog.CTA], words[watchdog.THREAD], words[watchdog.WAITED_NS] = 17, 130, 2_000_000_000
    rec = watchdog.decode(words, table)
    assert watchdog.message("v6", rec).startswith(
        "v6: consumer warpgroup 1 of CTA 17 waits on tma2mma[2] (phase parity 1) for 2.0 s")
    words[watchdog.SITE], words[watchdog.BAR], words[watchdog.THREAD] = 1, 1, 0
    assert watchdog.message("v6", watchdog.decode(words, table)).startswith(
        "v6: producer thread 0 of CTA 17 waits on mma2tma[2]")


def test_watchdog_fault_after_the_record_is_the_stop():
    """A kernel that faults once its record is out (threads left mid-protocol) counts as stopped
    by the watchdog; a fault before any record is the fault, raised as it is."""
    from gemm_ladder.sync import watchdog

    class Faulted:
        def query(self):
            raise RuntimeError("CUDA error: an illegal instruction was encountered")

    class Running:
        def query(self):
            return False

    lid = 1234
    rec = [0] * watchdog.RECORD_WORDS
    rec[watchdog.DONE] = lid
    assert watchdog.finished(Faulted(), rec, lid) is True
    assert watchdog.finished(Running(), rec, lid) is False
    rec[watchdog.DONE] = lid - 1  # a record of an earlier launch: this one's fault is its own
    with pytest.raises(RuntimeError, match="illegal instruction"):
        watchdog.finished(Faulted(), rec, lid)


def test_watchdog_waiters_leave_after_the_record():
    """Only the claimer writes the record; the other waiters leave once it is out."""
    from gemm_ladder.sync.watchdog import WAIT_SOURCE

    body = WAIT_SOURCE.split("gemm_ladder_watchdog_claim >= launch)", 1)[1].split("}", 2)
    assert "rec[1] != launch" in body[0] and "exit;" in body[1]


@pytest.mark.parametrize("value", [0, -1, "2", True, 10_000])
def test_watchdog_knob_is_checked(value):
    import gemm_ladder

    with pytest.raises(gemm_ladder.ConfigError, match="watchdog="):
        gemm_ladder.make_config("v5", 1024, 1024, 1024, watchdog=value)


def test_isolate_reports_a_barrier_timeout_as_a_hang():
    """A watchdog build's exception becomes status "hang" with its words; a kernel that did not
    stop makes the child leave (its CUDA context is stuck) and the batch goes on in a fresh one."""
    from gemm_ladder.measure.isolate import run_batch

    res = run_batch("selftest", ["barrier", "ok"], timeout=20)
    assert res[0]["status"] == "hang" and "waits on tma2mma[1]" in res[0]["detail"]
    assert res[0]["barrier"]["barrier"] == "tma2mma"
    assert res[1]["status"] == "ok"


def test_timeout_finds_the_watchdog_twin(tmp_path):
    import json

    from gemm_ladder.barriers.explain import find_twin

    cfg = {"rung": "v5", "M": 64, "N": 64, "K": 64, "dtype": "float16", "arch": "sm_90a"}
    (tmp_path / "v5.so").write_bytes(b"")
    (tmp_path / "v5.so.json").write_text(json.dumps({"config": cfg}))
    assert find_twin(tmp_path / "v5.so") is None
    (tmp_path / "watchdog").mkdir()
    (tmp_path / "watchdog" / "v5_wd.so").write_bytes(b"")
    (tmp_path / "watchdog" / "v5_wd.so.json").write_text(
        json.dumps({"config": {**cfg, "watchdog": 2}, "watchdog": {"seconds": 2}}))
    assert find_twin(tmp_path / "v5.so") == tmp_path / "watchdog" / "v5_wd.so"
    assert find_twin(tmp_path / "watchdog" / "v5_wd.so") is None  # a twin has no twin


def test_a_timing_hang_is_explained_by_checking_the_twin(tmp_path):
    """A bench (job "time") that timed out: its watchdog twin runs the check job once (a watchdog
    build cannot be timed in a CUDA graph); other jobs run the twin as they ran the module."""
    import json

    from gemm_ladder.barriers.explain import explain_timeouts

    cfg = {"rung": "v5", "M": 64, "N": 64, "K": 64, "dtype": "float16", "arch": "sm_90a"}
    (tmp_path / "v5.so").write_bytes(b"")
    (tmp_path / "v5.so.json").write_text(json.dumps({"config": cfg}))
    (tmp_path / "watchdog").mkdir()
    (tmp_path / "watchdog" / "v5_wd.so").write_bytes(b"")
    (tmp_path / "watchdog" / "v5_wd.so.json").write_text(
        json.dumps({"config": {**cfg, "watchdog": 2}, "watchdog": {"seconds": 2}}))
    calls = []

    def run_isolated(job, path, *args, timeout):
        calls.append((job, path.name, args))
        return {"status": "hang", "detail": "v5: producer thread 0 of CTA 3 waits on mma2tma[0]",
                "barrier": {"barrier": "mma2tma"}}

    for job, args, want in (("time", (50, "graph"), ("check", (0,))), ("check", (0, 1), ("check", (0, 1)))):
        calls.clear()
        results = [{"status": "timeout", "detail": "no answer in 60 s"}]
        explain_timeouts(job, [tmp_path / "v5.so"], args, results, run_isolated)
        assert calls == [(want[0], "v5_wd.so", want[1])]
        assert results[0]["barrier"] == {"barrier": "mma2tma"} and "waits on mma2tma[0]" in results[0]["detail"]


# -- on a GPU (each kernel in a child process with a deadline, see tests/conftest.py) ---------
from .gpu_cases import Case  # noqa: E402

WATCHDOG_CASES = [Case("v5", 2048, 2048, 1024, watchdog=2), Case("v6", 2048, 2048, 1024, watchdog=2),
                  Case("v4", 1000, 1000, 520, watchdog=2)]
GPU_VARIANTS = [n for n, v in VARIANTS.items() if v.arch == "sm_90a"]
GPU_SHAPE = (2048, 2048, 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("case", WATCHDOG_CASES, ids=str)
def test_watchdog_build_computes_the_right_answer(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result


@pytest.fixture(scope="module")
def broken_on_gpu(tmp_path_factory):
    """Every Hopper broken variant with the watchdog, checked in one batch (or exported for the
    GPU box under GEMM_LADDER_GPU_EXPORT, or loaded from GEMM_LADDER_PREBUILT)."""
    import json
    import os
    from pathlib import Path

    export, prebuilt = os.environ.get("GEMM_LADDER_GPU_EXPORT"), os.environ.get("GEMM_LADDER_PREBUILT")
    if prebuilt:
        folder = Path(prebuilt) / "barriers"
    else:
        import gemm_ladder

        folder = Path(export) / "barriers" if export else tmp_path_factory.mktemp("broken")
        folder.mkdir(parents=True, exist_ok=True)
        for name in GPU_VARIANTS:
            gemm_ladder.build(VARIANTS[name].prim_func(shape=GPU_SHAPE, watchdog=2)).export(folder / f"{name}.so")
        (folder / "broken.json").write_text(json.dumps(GPU_VARIANTS))
        if export:
            pytest.skip(f"exported for the GPU box into {folder}")
    from gemm_ladder.measure.isolate import run_batch

    names = json.loads((folder / "broken.json").read_text())
    results = run_batch("check", [folder / f"{n}.so" for n in names], (0,), timeout=60)
    return dict(zip(names, results))


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_watchdog_names_the_hang(broken_on_gpu, name):
    variant, res = VARIANTS[name], broken_on_gpu[name]
    assert res["status"] in variant.gpu, res
    if res["status"] == "hang":
        assert re.match(r"(BarrierTimeoutError: )?\S+: (producer|consumer|MMA|epilogue) \S+ \d+ of CTA \d+.* waits on "
                        r"(tma2mma|mma2tma)\[\d\] \(phase parity [01]\) for [\d.]+ s", res["detail"]), res
