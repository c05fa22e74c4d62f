"""v9's ``k_consumers``: two consumer warpgroups on one tile's rows, taking alternate K slices
(``sm90a/kconsumers.py``). CPU: the knob's refusals, the launch it asks for, which ring slots and
phases each consumer reads, the producer's order for ``k_halves``, the hand-over's barriers in the
CUDA source, and the barrier checker on the new kernels (and on an odd ring, which it must flag).
GPU: ``benchmarks/fp8_sweep.py`` runs 13 and 15 check every module against torch before timing it."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.compile.builder import build
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, spec_for
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import hgemm_v9, kconsumers
from gemm_ladder.sm90a.producer import interleaved
from gemm_ladder.sm90a.ring import Ring

# the fp8 fill tiles at M = 256 (plan.FP8_FILL_KNOBS), a shallower ring for the CPU checker
FP8_64 = dict(spec=GemmSpec.fp8(), blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=2, cluster_n=1, stream_b=True,
              pipe_depth=6, overlap=4, promote=1)


def _cfg(M=256, N=640, K=1024, **knobs):
    return make_config("v9", M, N, K, **{**FP8_64, **knobs})


@pytest.mark.parametrize("knobs, words", [
    (dict(k_consumers=3), "1 or 2"),
    (dict(k_consumers=2, pipe_depth=5), "even pipe_depth"),
    (dict(k_consumers=2, epi_under=True, overlap=0), "epi_under"),
    (dict(k_consumers=2, spec=GemmSpec.fp8(scales="block"), stage_scales=True), "block scales"),
    (dict(k_consumers=2, pipe_depth=14), "shared memory"),
    (dict(k_halves=True), "k_consumers=2"),
])
def test_knobs_it_cannot_build_are_refused_with_the_fix(knobs, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(**knobs)


def test_a_k_that_does_not_split_evenly_is_refused():
    with pytest.raises(ConfigError, match="do not split evenly"):
        _cfg(K=1152, k_consumers=2)  # 9 slices of 128


def test_only_v9_takes_the_knob():
    with pytest.raises(ConfigError, match="takes no knob k_consumers"):
        make_config("v10", 256, 640, 1024, k_consumers=2)


def test_the_knob_off_leaves_the_module_as_it_was():
    assert "k_consumers" not in _cfg(k_consumers=1).knobs()
    assert "k_consumers" in _cfg(k_consumers=2).knobs()


@pytest.mark.parametrize("owners, knobs", [(1, {}), (2, dict(spec=None, blk_m=128, blk_n=128, num_warpgroups=2,
                                                                   overlap=None, promote=None, stream_b=False,
                                                                   pipe_depth=4))])
def test_the_launch_has_a_second_consumer_a_owner_and_room_for_its_sums(owners, knobs):
    knobs = {k: v for k, v in {**FP8_64, **knobs}.items() if v is not None}
    one = make_config("v9", 256, 640, 1024, **knobs)
    two = make_config("v9", 256, 640, 1024, **knobs, k_consumers=2)
    a, b = hgemm_v9.launch(one), hgemm_v9.launch(two)
    assert (a["threads"], b["threads"]) == (128 * (owners + 1), 128 * (2 * owners + 1))
    regs = one.blk_m // owners * one.blk_n // 128  # the sums a thread of one owner holds
    assert b["smem_bytes"] - a["smem_bytes"] == owners * regs * 128 * 4


class _Bar:
    def __init__(self, depth):
        self.depth = depth


@pytest.mark.parametrize("stages", [4, 6, 12])
def test_with_an_even_ring_each_lane_reads_its_own_slots_at_every_phase(stages):
    ring = Ring(_Bar(stages), _Bar(stages))
    for lane in (0, 1):
        view = ring.lane(2, lane)
        seen = {}
        for p in range(5 * stages):
            seen.setdefault(view.slot(p), []).append(view.phase(p))
        assert {s % 2 for s in seen} == {lane}
        for phases in seen.values():  # phase 0, 1, 0, 1, ...: none skipped
            assert phases == [i % 2 for i in range(len(phases))]


def test_with_an_odd_ring_a_lane_would_skip_phases():
    ring = Ring(_Bar(5), _Bar(5))
    phases = [ring.lane(2, 0).phase(p) for p in range(20) if ring.lane(2, 0).slot(p) == 0]
    # slot 0 at ring positions 0, 10, 20, 30: phases 0, 2, 4, 6 (those between are lane 1's), one parity for all
    assert phases == [0, 0, 0, 0]


@pytest.mark.parametrize("count", [2, 8, 56])
def test_k_halves_loads_each_lanes_half_in_order_and_every_slice_once(count):
    order = [interleaved(k, count, 2) for k in range(count)]
    assert sorted(order) == list(range(count))
    assert order[0::2] == list(range(count // 2))  # lane 0: positions 0, 2, ...
    assert order[1::2] == list(range(count // 2, count))


def test_the_cuda_has_the_hand_over_barrier_of_both_lanes():
    src = build("v9", 256, 640, 1024, **FP8_64, k_consumers=2).source
    owners = 1
    hand_over = f"bar_sync_count_sync((uint){kconsumers.CONSUMER_BARRIER + owners}, (uint)256)"
    assert src.count(hand_over) == 2  # lane 1's sums written, then read
    assert "bar_sync_count_sync((uint)2" not in build("v9", 256, 640, 1024, **FP8_64).source


@pytest.mark.parametrize("knobs", [
    dict(k_consumers=2),
    dict(k_consumers=2, k_halves=True),
    dict(k_consumers=2, overlap=0),
    dict(k_consumers=2, spec=GemmSpec.fp8(scales="row"), M=200),
    dict(k_consumers=2, spec=None, overlap=None, promote=None, blk_n=128, epi_n=64),
    dict(k_consumers=2, spec=None, overlap=None, promote=None, blk_m=128, blk_n=128, num_warpgroups=2,
         pipe_depth=4),
    dict(k_consumers=2, spec=spec_for("float16", "alpha_bias_relu+residual"), dtype="float16", overlap=None,
         promote=None, blk_n=128, epi_n=64),
], ids=["fp8", "fp8-halves", "fp8-drained", "rowwise-odd-m", "16bit", "16bit-two-owners", "16bit-residual"])
def test_the_barrier_checker_passes_the_kernels(knobs):
    M = knobs.pop("M", 256)
    base = {k: v for k, v in {**FP8_64, **knobs}.items() if v is not None}
    report = check_config(make_config("v9", M, 640, 1024, **base))
    assert report.ok, report.findings[:3]


def test_the_barrier_checker_flags_an_odd_ring(monkeypatch):
    monkeypatch.setattr(kconsumers, "check", lambda cfg: None)  # past the knob's own refusal
    report = check_config(_cfg(k_consumers=2, pipe_depth=5))
    assert not report.ok
    assert any("missed phase" in str(f) or "never waited" in str(f) for f in report.findings)


def test_a_stage_is_released_by_the_warps_of_the_lane_that_read_it():
    # the empty barriers wait for 4 warps x 1 owner x 2 CTAs (one lane's), not both lanes' 16
    src = build("v9", 256, 640, 1024, **FP8_64, k_consumers=2).source
    counts = set(re.findall(r"mbarrier_init_init_shared_b64\(.*\), \(uint\)(\d+)\);", src))
    assert counts == {"1", "8"}

