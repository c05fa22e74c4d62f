"""pdl's L2 warm-up (the production presets' optional ``l2_warm`` knob, ``producer.warm_l2``) on the CPU: the knob
(kept only where set, with ``pdl`` only, refused with the reason where the kernel cannot warm its weight), what the
generated CUDA source does before the grid wait (one warp asks L2 for this CTA's rows of B over its first slices,
and nothing else touches global memory), the barrier checker on the warm kernels, and the benchmark set that times
them. The GPU side (the result right after a kernel that writes the weight, eagerly and in a CUDA graph) is
``benchmarks/epilogue_check.py``'s ``check_weight_written``, run over ``prepare --set l2_warm``."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, spec_for
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import common, producer

from .built import built
from .conftest import benchmark_script

# one of each preset at the small-M knobs the policy gives them: (rung, M, N, K, knobs, rows of B a CTA warms)
CONFIGS = {
    # two CTAs of a 2x1 cluster share each 64-row B tile: 32 rows each
    "v9": ("v9", 128, 768, 3072, {"blk_m": 64, "blk_n": 64, "num_warpgroups": 1, "cluster_m": 2, "stream_b": True,
                                  "pipe_depth": 8}, 32),
    "v10": ("v10", 128, 768, 3072, {"blk_m": 64, "blk_n": 128, "num_warpgroups": 1, "cluster_m": 1, "split_k": 2,
                                    "stream_b": True, "pipe_depth": 6}, 128),
    "v11": ("v11", 16, 3072, 768, {"blk_m": 16, "blk_n": 64, "num_warpgroups": 1, "split_k": 1, "stream_b": True,
                                   "pipe_depth": 8}, 64),
}
PREFETCH = re.compile(r"cp_async_bulk_prefetch\w*L2_global\(\(&\(B_ptr\[(.*)\]\)\), \(uint\)(\d+)\);")


def _cfg(name: str, warm: bool = True, **more):
    rung, M, N, K, knobs, _ = CONFIGS[name]
    return make_config(rung, M, N, K, **{**knobs, **more, "pdl": True, **({"l2_warm": True} if warm else {})})


def _body(cfg) -> str:
    src = built(cfg).cuda_source()
    return src[src.index("__global__"):]


# -- the knob -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rung", ["v9", "v10", "v11"])
def test_the_knob_is_kept_only_where_set(rung):
    plain = make_config(rung, 256, 256, 256, pdl=True)
    assert "l2_warm" not in plain.knobs() and not common.l2_warm(plain)  # tags and cache keys as they were
    assert "l2warm" not in plain.tag()
    warm = make_config(rung, 256, 256, 256, pdl=True, l2_warm=True)
    assert warm.knobs()["l2_warm"] is True and common.l2_warm(warm) and warm.tag() != plain.tag()


def test_the_knob_needs_pdl_and_a_bool():
    with pytest.raises(ConfigError, match="l2_warm=True needs pdl=True"):
        make_config("v9", 256, 256, 256, l2_warm=True)
    with pytest.raises(ConfigError, match="l2_warm=1 is an int, not a bool"):
        make_config("v11", 16, 256, 256, pdl=True, l2_warm=1)


@pytest.mark.parametrize("rung, M, N, K, knobs, words", [
    # B stored [K, N]: a row of B in memory is one K of every column
    ("v9", 256, 256, 256, {"spec": dataclasses.replace(GemmSpec(), b_major="N").text()}, "B is MN-major"),
    # SwiGLU's W_gu: a tile's rows come from its gate and its up halves
    ("v9", 256, 512, 256, {"spec": spec_for("bfloat16", "swiglu").text(), "dtype": "bfloat16"}, "gated weight"),
])
def test_a_weight_the_kernel_cannot_warm_is_refused_with_the_reason(rung, M, N, K, knobs, words):
    cfg = make_config(rung, M, N, K, **knobs, pdl=True)  # the same kernel without the knob builds
    assert common.can_warm(cfg) is not None
    with pytest.raises(ConfigError, match=f"l2_warm=True on {rung}: .*{words}.*; use l2_warm=False"):
        make_config(rung, M, N, K, **knobs, pdl=True, l2_warm=True)


# -- the kernel's source --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_one_warp_asks_l2_for_its_rows_of_b_before_the_wait(name):
    rung, M, N, K, knobs, rows = CONFIGS[name]
    body = _body(_cfg(name))
    wait = body.index("griddepcontrol_wait()")
    found = [(m.start(), int(m.group(2))) for m in PREFETCH.finditer(body)]
    # unrolled over the rows of the CTA's part, a row a lane in turns
    assert len(found) == math.ceil(rows / producer.WARM_LANES)
    assert all(at < wait for at, _ in found)
    # the first pipe_depth slices of K (or all of them, fewer): bytes of one row of B
    slices = min(knobs["pipe_depth"], math.ceil(K / knobs.get("split_k", 1) / 64))
    assert {size for _, size in found} == {slices * 64 * 2}
    # inside the producer warpgroup's first warp
    assert body.rindex("if (warp_id_in_cta == 0) {", 0, found[0][0]) > body.rindex("barrier_cluster_wait", 0, wait)
    # nothing else before the wait reads or writes global memory (a TMA copy, or a global pointer indexed)
    first_other = min(m.start() for m in re.finditer(r"cp_async_bulk_tensor|\b(?!pool_buf_ptr)\w+_ptr\)\[", body))
    assert wait < first_other
    assert "cp_async_bulk_prefetch" not in _body(_cfg(name, warm=False))


def test_a_short_k_warms_no_further_than_k():
    """Four slices of K = 256 under an eight-stage ring: 512 bytes a row, not the ring's 1024."""
    cfg = make_config("v11", 16, 1024, 256, blk_m=16, blk_n=64, num_warpgroups=1, split_k=1, pipe_depth=8, pdl=True,
                      l2_warm=True)
    sizes = {int(m.group(2)) for m in PREFETCH.finditer(_body(cfg))}
    assert sizes == {256 * 2}


@pytest.mark.parametrize("name", ["v9", "v11"])
def test_the_barrier_checker_passes_the_warm_kernels(name):
    result = check_config(_cfg(name))
    assert result.findings == []


# -- the benchmark set -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def check():
    return benchmark_script("epilogue_check")


def test_the_l2_warm_set_pairs_each_pdl_module_with_its_warm_twin(check):
    from gemm_ladder.serve import plan

    groups = check.time_groups(check.cases_of("l2_warm"))
    assert groups
    for group in groups:
        assert [c["variant"] for c in group] == ["now", "warm"]
        assert group[0]["knobs"] == {} and group[1]["knobs"] == {"l2_warm": True}
        M, N, K = group[0]["shape"]
        assert M <= check.L2_WARM_MAX_M or (M, N, K) in check.STREAM_SMALL_SAMPLES
        p = plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec_for("bfloat16", group[0]["epilogue"]))
        assert plan.choose(p).knobs.get("pdl") is True
