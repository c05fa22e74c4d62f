"""Huge extents (issue 28): a shape past the kernels' 32-bit indices is refused by the one
validator, for every rung of both archs, and by the policy, the pack planner and the tuner, in
one line and at once; the tuner's L2 model costs the same for 2^40 rows as for 4096.

CPU only; nothing here traces a kernel.
"""

from __future__ import annotations

import io
import re
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gemm_ladder
from gemm_ladder.compile import batch
from gemm_ladder.core import config
from gemm_ladder.serve import kernel_pack, plan
from gemm_ladder import rungs
from gemm_ladder.core.config import INDEX_LIMIT, ConfigError, IndexRangeError
from gemm_ladder.tune import space as tune_space
from schedulers import dram_traffic, rank_group_sizes
from schedulers.orders import check_order

EVERY_RUNG = [(r, a) for a in config.ARCHS for r in rungs.RUNGS if rungs.available(r, a)]
HUGE = [(2**31, 65536, 65536), (2**40, 65536, 65536), (32768, 65536, 65536),  # B = N x K alone overflows
        (2**31, 4096, 4096), (2**40, 4096, 4096), (524288, 4096, 4096)]  # M x K overflows


@pytest.fixture
def no_tracing(monkeypatch):
    """A test that must not trace a kernel: tracing one fails it."""
    def traced(*args, **kwargs):
        raise AssertionError("a kernel was traced")

    monkeypatch.setattr(rungs, "kernel_of", traced)


def _one_line(err: Exception) -> str:
    text = str(err)
    assert "\n" not in text and len(text) < 400, text
    assert "32-bit" in text and str(INDEX_LIMIT - 1) in text, text
    return text


# -- the validator: every rung of both archs --------------------------------------------------------
@pytest.mark.parametrize("rung, arch", EVERY_RUNG)
def test_every_rung_refuses_shapes_past_32_bit_indices(rung, arch, no_tracing):
    rungs.rung_module(rung, arch)  # the import (TVM's), outside the clock
    started = time.perf_counter()
    for shape in HUGE:
        with pytest.raises(IndexRangeError) as err:
            rungs.make_config(rung, *shape, arch=arch)
        assert isinstance(err.value, ConfigError)
        text = _one_line(err.value)
        assert text.startswith(f"{rung}: {'x'.join(map(str, shape))}:"), text
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("rung, arch", EVERY_RUNG)
def test_the_m_a_refusal_offers_fits(rung, arch):
    """The M the message offers is one the index rule takes (the rung may still want its own M,
    as v1 and v2 do), and M one tile past it is refused."""
    with pytest.raises(IndexRangeError) as err:
        rungs.make_config(rung, 2**31, 4096, 4096, arch=arch)
    most = int(re.search(r"use M <= (\d+)", str(err.value)).group(1))
    try:
        cfg = rungs.make_config(rung, most, 4096, 4096, arch=arch)
    except IndexRangeError as again:
        pytest.fail(f"the suggested M={most} is refused too: {again}")
    except ConfigError:  # the rung's own rules (v1: M == blk_m), not the index rule
        return
    assert config.max_m(cfg) == most
    with pytest.raises(IndexRangeError):
        rungs.make_config(rung, most + cfg.blk_m, 4096, 4096, arch=arch)


def test_the_ladder_still_takes_its_ordinary_shapes():
    """The main job's shapes (4096^3, 8192^3 and each rung's fallbacks) keep every rung of both
    archs, and large real shapes (a 128k vocabulary, 16k squares) still validate."""
    jobs = batch.main_jobs([(4096, 4096, 4096), (8192, 8192, 8192)], ["float16"], list(config.ARCHS))
    assert {(j.rung, j.knobs["arch"]) for j in jobs} == set(EVERY_RUNG)
    for shape in [(8192, 128256, 4096), (16384, 16384, 16384), (16384, 65536, 8192), (1, 128256, 4096)]:
        gemm_ladder.make_config("v9", *shape)
        gemm_ladder.make_config("v4", *shape)


def test_a_split_k_workspace_counts_too():
    """v10's fp32 partials are split_k per element of D: D fits, the workspace does not."""
    gemm_ladder.make_config("v10", 65536, 8192, 8192, split_k=1, cluster_m=1)
    with pytest.raises(IndexRangeError, match=r"split-K workspace .*split_k=8\).*; use split_k <= 3, or M <= 32640$"):
        gemm_ladder.make_config("v10", 65536, 8192, 8192, split_k=8, cluster_m=1)
    gemm_ladder.make_config("v10", 65536, 8192, 8192, split_k=3, cluster_m=1)
    with pytest.raises(IndexRangeError, match=r"; use split_k=1$"):
        gemm_ladder.make_config("v11", 128, 12582912, 64)


@pytest.mark.parametrize("rung, arch", EVERY_RUNG)
def test_a_grid_of_a_cta_per_tile_fits_cudas_grid(rung, arch):
    """12582912 columns: 98304 tiles of 128 along grid y, over CUDA's 65535. A rung that launches a
    CTA per tile refuses (naming the axis, the limit and N parts that fit); a persistent one takes it."""
    shape = (128, 12582912, 64)
    mod = rungs.rung_module(rung, arch)
    try:
        cfg = rungs.make_config(rung, *shape, arch=arch)
    except ConfigError as err:
        if "grid y" in str(err):
            assert re.search(r"over the 65535 CUDA allows; split N into parts of at most (\d+) columns", str(err))
            most = int(re.search(r"at most (\d+) columns", str(err)).group(1))
            rungs.make_config(rung, 128, most, 64, arch=arch)
        return  # refused for the rung's own reasons (v1, v2: one tile; split-K: the workspace)
    grid = mod.launch(cfg)["grid"]
    assert all(not isinstance(g, int) or g <= 65535 for g in grid[1:]), grid


def test_a_runtime_m_module_serves_up_to_max_m():
    """``max_m``: what a dynamic_m module takes at run time (the front door refuses more)."""
    cfg = gemm_ladder.make_config("v9", 4096, 4096, 4096, dynamic_m=True)
    most = config.max_m(cfg)
    assert most == config.largest_m(4096, 4096, cfg.blk_m, cfg.blk_n, cfg.blk_k) == 524160
    assert "M <= 524160" in config.__doc__  # the number the docstring gives
    # from a manifest's knobs (what the runtime has), the same number, also for split-K
    assert config.max_m_of(4096, 4096, dict(cfg.knobs())) == most
    split = gemm_ladder.make_config("v11", 64, 8192, 8192, dynamic_m=True, split_k=4)
    assert config.max_m_of(8192, 8192, dict(split.knobs())) == config.max_m(split) == \
        (INDEX_LIMIT - 1) // (8192 * 4) // split.blk_m * split.blk_m
    config.check_extents("v9", most, 4096, 4096, cfg.blk_m, cfg.blk_n, cfg.blk_k)
    with pytest.raises(IndexRangeError):
        config.check_extents("v9", most + 1, 4096, 4096, cfg.blk_m, cfg.blk_n, cfg.blk_k)


dims = st.integers(1, 2**42)


@settings(max_examples=300, deadline=None)
@given(M=dims, N=dims, K=dims, blk_m=st.sampled_from([1, 8, 64, 128, 256]),
       blk_n=st.sampled_from([1, 64, 128, 192, 256]), blk_k=st.sampled_from([1, 64]), split_k=st.integers(1, 8))
def test_the_rule_refuses_exactly_what_overflows(M, N, K, blk_m, blk_n, blk_k, split_k):
    """Refused iff some count of ``index_counts`` reaches 2^31; a refusal is one line; the sizes
    it offers fit; ``largest_m`` is the largest M that does."""
    tiles = (blk_m, blk_n, blk_k, split_k)
    overflows = max(config.index_counts(M, N, K, *tiles).values()) >= INDEX_LIMIT
    try:
        config.check_extents("v0", M, N, K, *tiles)
    except IndexRangeError as err:
        assert overflows
        text = _one_line(err)
        if found := re.search(r"use M <= (\d+)|, or M <= (\d+)", text):
            config.check_extents("v0", int(found.group(1) or found.group(2)), N, K, *tiles)
        if found := re.search(r"use split_k(?:=| <= )(\d+)", text):
            config.check_extents("v0", M, N, K, blk_m, blk_n, blk_k, int(found.group(1)))
        if found := re.search(r"split K into parts of at most (\d+)", text):
            part_k = int(found.group(1))
            rows = re.search(r"the rows into calls of at most (\d+)", text)
            config.check_extents("v0", int(rows.group(1)) if rows else M, N, part_k, *tiles)
    else:
        assert not overflows
    most = config.largest_m(N, K, *tiles)
    if most:
        config.check_extents("v0", most, N, K, *tiles)
        with pytest.raises(IndexRangeError):
            config.check_extents("v0", most + blk_m, N, K, *tiles)
    else:
        with pytest.raises(IndexRangeError):
            config.check_extents("v0", 1, N, K, *tiles)


# -- the policy and the pack planner ----------------------------------------------------------
@pytest.mark.parametrize("shape", HUGE)
def test_the_policy_and_the_pack_planner_refuse_with_the_validators_error(shape):
    started = time.perf_counter()
    with pytest.raises(IndexRangeError) as chosen:
        plan.choose(plan.Problem(*shape))
    with pytest.raises(IndexRangeError) as packed:
        kernel_pack.plan_pack([shape], ["float16"], sms=132)
    assert time.perf_counter() - started < 2.0
    assert str(chosen.value) == str(packed.value)
    _one_line(chosen.value)


def test_the_m_the_policy_offers_gets_a_kernel():
    with pytest.raises(IndexRangeError) as err:
        plan.choose(plan.Problem(2**31, 4096, 4096))
    most = int(re.search(r"use M <= (\d+)", str(err.value)).group(1))
    choice = plan.choose(plan.Problem(most, 4096, 4096))
    gemm_ladder.make_config(choice.rung, most, 4096, 4096, **choice.knobs)


def test_the_policys_tile_is_the_largest_any_rung_takes():
    """The policy checks at ``LARGEST_TILE``: no rung takes a larger tile, so the M it offers fits
    every rule's tile."""
    blk_m, blk_n, blk_k = config.LARGEST_TILE
    for rung, arch in EVERY_RUNG:
        with pytest.raises(ConfigError):
            rungs.make_config(rung, 4096, 4096, 4096, arch=arch, blk_m=blk_m + 8)
        with pytest.raises(ConfigError):
            rungs.make_config(rung, 4096, 4096, 4096, arch=arch, blk_n=blk_n + 64)
        with pytest.raises(ConfigError):
            rungs.make_config(rung, 4096, 4096, 4096, arch=arch, blk_k=blk_k * 2)


# -- the tuner --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("rung, shape", [("v9", (2**31, 65536, 65536)), ("v9", (2**40, 65536, 65536)),
                                         ("v6", (2**40, 4096, 4096))])
def test_tune_refuses_a_shape_no_knob_can_fit_at_once(rung, shape):
    started = time.perf_counter()
    with pytest.raises(IndexRangeError, match=f"^tune {rung}: "):
        tune_space.search_space(rung, shape)
    assert time.perf_counter() - started < 3.0


def test_the_m_the_tuner_offers_leaves_candidates():
    """The tuner refuses at the tile of its space that takes the most rows, so the M it offers
    is one some point takes; one row more, and none does."""
    space = {"pipe_depth": [3], "num_warpgroups": [1], "blk_n": [128, 256], "tile_order": ["snake"]}
    with pytest.raises(IndexRangeError) as err:
        tune_space.search_space("v6", (2**31, 4096, 4096), space=space, progress=False)
    most = int(re.search(r"use M <= (\d+)", str(err.value)).group(1))
    assert tune_space.search_space("v6", (most, 4096, 4096), space=space, progress=False).candidates
    with pytest.raises(IndexRangeError):
        tune_space.search_space("v6", (most + 1, 4096, 4096), space=space, progress=False)


@pytest.mark.timeout(60)
def test_the_l2_model_at_2_to_the_40_rows_is_bounded():
    """The model the tuner plays (``MODEL_WAVES`` waves) at M = 2^40: well under a few seconds for
    every order and group size, and memory that does not grow with the 2^33 row panels."""
    started = time.perf_counter()
    for order in ("grouped", "snake", "row", "column", "serpentine"):
        ranked = rank_group_sizes(2**40, 65536, 65536, 128, 256, 132, 50 << 20, order=order,
                                  max_waves=tune_space.MODEL_WAVES)
        tiles = (2**40 // 128) * (65536 // 256)
        assert ranked and ranked[0][1].waves_total == -(-tiles // 132)
    assert time.perf_counter() - started < 3.0
    tracemalloc.start()
    try:
        dram_traffic("snake", 2**40, 65536, 65536, 128, 256, 132, 50 << 20, 8, max_waves=tune_space.MODEL_WAVES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


small = st.integers(1, 3000)


@settings(max_examples=60, deadline=None)
@given(M=small, N=small, K=st.integers(1, 4096), blk=st.sampled_from([(64, 64), (128, 128), (128, 256)]),
       order=st.sampled_from(["grouped", "snake", "row", "column"]), g=st.sampled_from([1, 2, 4, 8, 16]),
       ctas=st.integers(1, 40), max_waves=st.integers(1, 12), l2_mb=st.sampled_from([1, 4, 50]))
def test_the_bounded_model_plays_the_exact_models_first_waves(M, N, K, blk, order, g, ctas, max_waves, l2_mb):
    """``max_waves`` plays exactly the first waves of the whole model: the same bytes, wave by
    wave, and the whole model when there are no more waves than that."""
    args = (order, M, N, K, *blk, ctas, l2_mb << 20, g)
    exact = dram_traffic(*args)
    bounded = dram_traffic(*args, max_waves=max_waves)
    assert bounded.per_wave == exact.per_wave[:max_waves]
    assert bounded.total_bytes == sum(exact.per_wave[:max_waves])
    assert bounded.waves_total == exact.waves_total == len(exact.per_wave)
    if max_waves >= exact.waves_total:
        assert bounded == exact


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)])
def test_the_tuners_ranking_of_group_sizes_is_the_exact_models(shape):
    """On ordinary shapes the bounded model keeps the group sizes the exact one ranks first."""
    args = (*shape, 128, 256, 132, 50 << 20)
    for order in ("grouped", "snake"):
        exact = rank_group_sizes(*args, order=order, group_sizes=tune_space.DEFAULT_CHOICES["l2_group_size"])
        bounded = rank_group_sizes(*args, order=order, group_sizes=tune_space.DEFAULT_CHOICES["l2_group_size"],
                                   max_waves=tune_space.MODEL_WAVES)
        assert [g for g, _ in bounded[:3]] == [g for g, _ in exact[:3]], (order, shape)


@pytest.mark.timeout(60)
def test_a_serpentine_refusal_on_a_huge_grid_is_quick_and_its_sizes_work():
    rows, cols = 2**33 + 1, 2**20 + 3  # left-over rows and columns at size 2: skipped by TVM
    started = time.perf_counter()
    with pytest.raises(ValueError, match="serpentine") as err:
        check_order("serpentine", rows, cols, 2)
    assert time.perf_counter() - started < 1.0
    sizes = [int(s) for s in re.search(r"e\.g\. \[([\d, ]+)\]", str(err.value)).group(1).split(",")]
    assert sizes
    for s in sizes:
        check_order("serpentine", rows, cols, s)


def test_a_long_step_of_the_tuner_shows_progress(monkeypatch):
    """Validating the points and the L2 model show a bar once a step runs past PROGRESS_DELAY_S."""
    space = {"pipe_depth": [3], "num_warpgroups": [2], "blk_n": [128, 256]}
    quiet = io.StringIO()
    monkeypatch.setattr("sys.stderr", quiet)
    tune_space.search_space("v6", (4096, 4096, 4096), space=space, num_sms=132, l2_bytes=50 << 20)
    assert quiet.getvalue() == ""  # a short step prints nothing
    monkeypatch.setattr(tune_space, "PROGRESS_DELAY_S", 0.0)
    shown = io.StringIO()
    monkeypatch.setattr("sys.stderr", shown)
    sp = tune_space.search_space("v6", (4096, 4096, 4096), space=space, num_sms=132, l2_bytes=50 << 20)
    text = shown.getvalue()
    assert "validate v6 knobs" in text and f"/{sp.points}" in text
    assert "L2 model, v6" in text
    silent = io.StringIO()
    monkeypatch.setattr("sys.stderr", silent)
    tune_space.search_space("v6", (4096, 4096, 4096), space=space, num_sms=132, l2_bytes=50 << 20,
                            progress=False)
    assert silent.getvalue() == ""
