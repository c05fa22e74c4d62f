"""Programmatic dependent launch (the production presets' ``pdl`` knob, ``sm90a/common.py``): on the CPU, what
the build holds. With the knob the module asks the driver for the launch attribute (TVM's launch tag in the
exported library) and every thread waits for the previous grid before anything reads or writes global
memory; without it the kernel is the one it was. The GPU side (two calls back to back, the second reading the
first's D and writing over its A, eagerly and in a CUDA graph) is ``benchmarks/epilogue_check.py``'s chained
check (``check_chained``), run over ``prepare --set pdl``."""

from __future__ import annotations

import re

import pytest

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import common

from .built import built
from .conftest import benchmark_script

# one of each preset, at the small-M knobs the policy gives them (clusters, one consumer, B streamed, a split)
CONFIGS = {
    "v9": ("v9", 128, 768, 3072, {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "stream_b": True,
                                  "pipe_depth": 8}),
    "v10": ("v10", 128, 768, 3072, {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "split_k": 2,
                                    "stream_b": True, "pipe_depth": 8}),
    "v11": ("v11", 16, 3072, 768, {"blk_m": 16, "blk_n": 64, "num_warpgroups": 1, "split_k": 1, "stream_b": True,
                                   "pipe_depth": 8}),
    # fp8 with per-tensor scales, the small-M tiles and the overlapped promotion (its scales read from global memory)
    "v9_fp8": ("v9", 64, 512, 1024, {"spec": GemmSpec.fp8("bfloat16", "tensor").text(), "dtype": "bfloat16",
                                     "blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_n": 2, "cluster_m": 1,
                                     "stream_b": True, "pipe_depth": 8, "overlap": 4}),
}


def _body(cfg) -> str:
    src = built(cfg).cuda_source()
    return src[src.index("__global__"):]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_wait_comes_after_the_set_up_and_before_any_global_access(name, tmp_path):
    rung, M, N, K, knobs = CONFIGS[name]
    on, off = (make_config(rung, M, N, K, **knobs, pdl=flag) for flag in (True, False))
    body = _body(on)
    wait = body.index("griddepcontrol_wait()")
    # the barriers are set up and the cluster has met before it (the set-up that runs under the previous grid)
    assert body.rindex("mbarrier_init", 0, wait) < body.rindex("barrier_cluster_wait", 0, wait) < wait
    # the next grid may launch right after it; no TMA load, store or global read or write before it
    assert body.index("griddepcontrol_launch_dependents()") > wait
    # (a TMA copy, or a global pointer indexed: every kernel parameter ``X_ptr`` but the shared pool's)
    first_global = min(m.start() for m in re.finditer(r"cp_async_bulk_tensor|\b(?!pool_buf_ptr)\w+_ptr\)\[", body))
    assert wait < first_global
    assert body.count("griddepcontrol_wait()") == 1
    # the launch attribute: TVM's tag, in the exported library's function table
    for cfg, expect in ((on, True), (off, False)):
        path = built(cfg).export(tmp_path / f"{name}_{cfg.knobs()['pdl']}.so")
        assert (common.PDL_LAUNCH_TAG.encode() in path.read_bytes()) is expect
    assert "griddepcontrol" not in _body(off)


def test_the_knob_is_off_by_default_and_a_bool():
    from gemm_ladder.core.config import ConfigError

    for rung in ("v9", "v10", "v11"):
        assert make_config(rung, 256, 256, 256).knobs()["pdl"] is False
    with pytest.raises(ConfigError, match="pdl=1 is an int, not a bool"):
        make_config("v9", 256, 256, 256, pdl=1)


@pytest.fixture(scope="module")
def check():
    return benchmark_script("epilogue_check")


def test_the_pdl_set_times_each_policy_module_with_and_without(check):
    cases = check.cases_of("pdl")
    groups = check.time_groups(cases)
    weights = check.SUITE_WEIGHTS + check.HELD_OUT_BIAS_WEIGHTS
    assert len(groups) == len(check.PDL_EPILOGUES) * len(weights) * len(check.SUITE_MS)
    for group in groups:
        assert [c["variant"] for c in group] == ["now", "pdl"]
        assert group[0]["knobs"] == {"pdl": False} and group[1]["knobs"] == {"pdl": True}
        assert group[0]["held_out"] == (tuple(group[0]["shape"][1:]) in check.HELD_OUT_BIAS_WEIGHTS)


def test_prepare_builds_a_policy_case_with_its_own_knobs(check, tmp_path, monkeypatch):
    """A split-set case's knobs beyond the policy's reach its module (they were dropped once: the deep-rings
    run's ``now_deep`` built the policy's own ring), and its rung and rule are recorded."""
    from gemm_ladder.compile import module_cache

    jobs = []

    def fake_build(job):
        jobs.append(job)
        folder = tmp_path / "cache" / str(len(jobs))
        folder.mkdir(parents=True)
        (folder / "m.so").write_bytes(b"so")
        (folder / "m.so.json").write_text("{}")
        return folder / "m.so", None

    monkeypatch.setattr(module_cache, "get_or_build", fake_build)
    monkeypatch.setattr(check, "cases_of", lambda which, sms=132: check.pdl_cases()[:2])
    assert check.prepare(str(tmp_path / "out"), which="pdl") == 0
    now, pdl = jobs
    assert pdl.knobs == {**now.knobs, "pdl": True} and now.knobs["pdl"] is False
    import json
    doc = json.loads((tmp_path / "out" / check.PLAN_FILE).read_text())
    assert [c["module_knobs"]["pdl"] for c in doc["cases"]] == [False, True]
    assert all(c["rung"] == now.rung and c["chosen_by"] for c in doc["cases"])
