"""v5 (multi-stage TMA ring) and v6 (persistent, tile scheduler) on sm_90a.

CPU tier (CI): knob validation, the pipe_depth limit derived from shared memory, building a
few knob combinations once each (module-scoped), their SASS (TMA loads and stores, wgmma, no
local-memory spills), v6's persistent launch and scheduler loop. GPU tier (``gpu``): build,
export and check against a float64 reference in a child process with a timeout, over the
awkward shapes, both dtypes and several knob combinations.
"""

import dataclasses
import json

import pytest

from tests.gpu_cases import Case

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.core.budget import limits_for
from gemm_ladder.core.config import ARCHS, ArchLimits

V5_V6 = ("v5", "v6")


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize("rung", V5_V6)
@pytest.mark.parametrize(
    "knobs, words",
    [
        (dict(pipe_depth=1), ["pipe_depth=1", "at least 2", "pipe_depth="]),
        (dict(pipe_depth=9), ["pipe_depth=9", "shared memory", "use pipe_depth=3 or less"]),
        (dict(blk_n=128, num_warpgroups=1, pipe_depth=7), ["pipe_depth=7", "use pipe_depth=6 or less"]),
        (dict(blk_m=256, blk_n=128, num_warpgroups=1, pipe_depth=2), ["registers", "num_warpgroups"]),
        (dict(blk_m=64, num_warpgroups=2, blk_n=128), ["blk_m=64", "blk_m=128"]),
        (dict(num_warpgroups=3), ["num_warpgroups=3", "1 or 2"]),
    ],
)
def test_refuses_bad_knobs_with_a_fix(rung, knobs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, 4096, 4096, 4096, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_pipe_depth_limit_comes_from_shared_memory():
    from gemm_ladder.sm90a import common

    cfg = gemm_ladder.make_config("v5", 4096, 4096, 4096, blk_n=128, num_warpgroups=1, pipe_depth=2)
    table = ARCHS["sm_90a"]
    # 128x128 fp16: 32 KiB per stage, 32 KiB output tile, 1 KiB barriers: (227 - 33) // 32 = 6
    assert common.max_pipe_depth(cfg, table.smem_per_block) == 6
    small = ArchLimits("sm_90a", "Hopper", smem_per_block=100 * 1024)
    common.check_pipe_depth(cfg, small)
    with pytest.raises(ConfigError, match=r"pipe_depth=3 .* over the 102400 .* use pipe_depth=2 or less"):
        common.check_pipe_depth(dataclasses.replace(cfg, pipe_depth=3), small)
    tiny = ArchLimits("sm_90a", "Hopper", smem_per_block=64 * 1024)
    with pytest.raises(ConfigError, match="smaller tile"):
        common.check_pipe_depth(cfg, tiny)


def test_v6_tile_order_and_group_size():
    with pytest.raises(ConfigError, match="tile_order='diagonal'.*grouped"):
        gemm_ladder.make_config("v6", 4096, 4096, 4096, tile_order="diagonal")
    with pytest.raises(ConfigError, match="l2_group_size=0"):
        gemm_ladder.make_config("v6", 4096, 4096, 4096, l2_group_size=0)
    with pytest.raises(ConfigError, match="no knob tile_order"):
        gemm_ladder.make_config("v5", 4096, 4096, 4096, tile_order="snake")
    tags = set()
    for order in ("grouped", "snake", "row", "column"):
        cfg = gemm_ladder.make_config("v6", 1000, 3000, 520, tile_order=order, l2_group_size=16)
        tags.add(cfg.tag())
    assert len(tags) == 4  # the order changes the binary: it is in the module's name
    with pytest.raises(ConfigError, match="serpentine"):  # both archs take the same orders
        gemm_ladder.make_config("v6", 4096, 4096, 4096, tile_order="serpentine")


def test_knob_defaults_are_valid_on_the_table_limits():
    from gemm_ladder.sm90a import hgemm_v5, hgemm_v6

    for mod in (hgemm_v5, hgemm_v6):
        cfg = gemm_ladder.make_config(mod.__name__.rsplit("_", 1)[1], 8192, 8192, 8192)
        assert cfg.pipe_depth >= 2 and mod.TECHNIQUE


# -- building (each module once) ---------------------------------------------------------------
CPU_BUILDS = {
    "v5_default": ("v5", (4096, 4096, 4096), {}),
    "v5_d2_64x128": ("v5", (1000, 3000, 520), dict(blk_m=64, blk_n=128, num_warpgroups=1, pipe_depth=2,
                                                     dtype="bfloat16")),
    "v6_default": ("v6", (8192, 8192, 8192), {}),
    "v6_snake_d4": ("v6", (1000, 3000, 128), dict(blk_n=128, num_warpgroups=1, pipe_depth=4,
                                                    tile_order="snake", l2_group_size=16)),
}


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_sass_has_tma_wgmma_and_no_spills(built, name):
    b = built(*CPU_BUILDS[name])
    counts = b.counts
    for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM"):
        assert counts[op] > 0, (op, counts)
    assert counts["LDL"] == 0 and counts["STL"] == 0, counts
    res = b.resources
    assert res.stack == 0 and res.local == 0, res
    assert res.registers <= 255


def test_manifests_say_how_to_launch(built):
    v5 = json.loads(built(*CPU_BUILDS["v5_default"]).path.with_suffix(".so.json").read_text())
    v6 = json.loads(built(*CPU_BUILDS["v6_default"]).path.with_suffix(".so.json").read_text())
    assert not v5["launch"].get("persistent")
    assert v5["launch"]["grid"] == [32, 16]
    assert v6["launch"]["persistent"] is True
    assert v6["launch"]["grid"] == ["num_ctas"]  # the kernel's trailing argument, as on sm_100a
    assert v6["knobs"]["tile_order"] == "snake" and v6["knobs"]["l2_group_size"] == 8
    assert v6["launch"]["smem_bytes"] <= limits_for("sm_90a").smem_per_block


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_smem_bytes_match_the_launch(built, name):
    """The budget's formula is what the host asks cuLaunchKernel for (the lowered launch)."""
    from tests.lowered import launch_of

    b = built(*CPU_BUILDS[name])
    launch = json.loads(b.path.with_suffix(".so.json").read_text())["launch"]
    assert int(launch_of(b.lowered)["tirx.use_dyn_shared_memory"]) == launch["smem_bytes"]


def test_v6_source_has_the_scheduler_loop(built):
    src = built(*CPU_BUILDS["v6_default"]).module.cuda_source()
    head = src[src.index("__global__ void"):]
    signature = head[: head.index("{")]
    assert "int num_ctas" in signature  # the grid size arrives at launch
    body = head[len(signature):]
    assert "while (1)" in body and "+ num_ctas)" in body  # the persistent loop strides by the grid
    assert "bulk_wait_group_read" in body  # Dsmem reuse waits for the previous store


def test_v5_source_keeps_one_wgmma_group_in_flight(built):
    src = built(*CPU_BUILDS["v5_default"]).module.cuda_source()
    assert "wait_group_sync_aligned_1" in src and "mbarrier_arrive" in src


# -- GPU tier ------------------------------------------------------------------------------------
GPU_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192), (512, 768, 64),
              (2048, 2048, 128), (1000, 3000, 520)]
GPU_KNOBS = [
    {},
    dict(blk_n=128, num_warpgroups=1, pipe_depth=2),
    dict(blk_n=128, pipe_depth=4),
    dict(blk_m=64, blk_n=128, num_warpgroups=1, pipe_depth=3),
]
V6_ORDERS = [dict(tile_order="grouped", l2_group_size=1), dict(tile_order="grouped", l2_group_size=16),
             dict(tile_order="snake", l2_group_size=8), dict(tile_order="snake", l2_group_size=16)]


CASES = [Case(rung, *shape, dtype=dtype) for rung in V5_V6 for shape in GPU_SHAPES
         for dtype in ("float16", "bfloat16")]
CASES += [Case(rung, *shape, **knobs) for rung in V5_V6 for knobs in GPU_KNOBS[1:]
          for shape in [(512, 768, 64), (2048, 2048, 128), (1000, 3000, 520)]]
CASES += [Case("v6", *shape, dtype="bfloat16", **order) for order in V6_ORDERS
          for shape in [(1000, 3000, 520), (8192, 1024, 8192)]]
CASES += [Case("v6", 4096, 4096, 4096, tile_order=o, l2_group_size=8) for o in ("row", "column")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_v5_v6_are_correct_on_the_gpu(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result
