"""The first Hopper rungs: v1 (one tile), v2 (K loop), v3 (grid of tiles with edge guards).

CPU tier: each rung refuses the shapes it cannot take and names the rung or knob that can;
each builds (both dtypes, one and two warpgroups) into SASS that has wgmma and no TMA and no
spills; the source fences the threads' shared-memory stores for wgmma (the async proxy)
before the barrier; v3 guards only the edges a shape has. Every module is built once.

GPU tier (``gpu``): each rung on random inputs against torch, in a child process with a timeout.
"""

import re

import pytest

import gemm_ladder
from gemm_ladder import ConfigError


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rung, shape, knobs, words",
    [
        ("v1", (128, 128, 128), {}, ["K=128", "must be 64", "use v2"]),
        ("v1", (256, 128, 64), {}, ["M=256", "blk_m=128", "pass blk_m=256", "v3"]),
        ("v1", (128, 512, 64), {}, ["N=512", "blk_n=128", "v3"]),
        ("v1", (64, 128, 64), {}, ["M=64", "pass blk_m=64"]),
        ("v1", (64, 128, 64), {"blk_m": 64, "num_warpgroups": 2}, ["blk_m=64", "warpgroup"]),
        ("v1", (128, 128, 64), {"pipe_depth": 2}, ["no knob pipe_depth"]),
        ("v2", (128, 128, 520), {}, ["K=520", "multiple of 64", "use v3"]),
        ("v2", (1000, 128, 128), {}, ["M=1000", "must equal blk_m=128; use v3"]),
        ("v2", (128, 192, 128), {}, ["N=192", "pass blk_n=192"]),
        ("v2", (128, 256, 64), {"blk_n": 256}, ["256 fp32 accumulator registers", "num_warpgroups"]),
        ("v3", (128, 128, 60), {}, ["K=60", "pad K"]),
        ("v3", (65536, 65536, 64), {}, ["32-bit", "D (M x N)", "use M <= 32640"]),  # every rung: config.check_index_range
        ("v3", (4096, 4096, 4096), {"blk_n": 96}, ["blk_n=96"]),
    ],
)
def test_refuses_shapes_it_cannot_take_with_a_fix(rung, shape, knobs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, *shape, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


@pytest.mark.parametrize(
    "rung, shape, knobs",
    [
        ("v1", (128, 128, 64), {}),
        ("v1", (64, 256, 64), {"blk_m": 64, "blk_n": 256}),
        ("v1", (256, 128, 64), {"blk_m": 256, "num_warpgroups": 2}),
        ("v2", (128, 128, 4096), {}),
        ("v3", (1000, 3000, 520), {}),
        ("v3", (1, 8, 8), {"blk_m": 64, "blk_n": 64}),
    ],
)
def test_takes_its_shapes(rung, shape, knobs):
    cfg = gemm_ladder.make_config(rung, *shape, **knobs)  # accepted (a refusal raises ConfigError)
    assert {k: cfg.knobs()[k] for k in knobs} == knobs, cfg.knobs()  # each knob as given


def test_launch_is_one_cta_then_a_grid():
    from gemm_ladder.rungs import rung_module

    for rung, shape, grid in (("v1", (128, 128, 64), [1, 1]), ("v2", (128, 128, 4096), [1, 1]),
                              ("v3", (1000, 3000, 520), [8, 24])):
        cfg = gemm_ladder.make_config(rung, *shape)
        launch = rung_module(rung).launch(cfg)
        # one stage of A and B, no barriers and no output tile in shared memory
        assert launch == {"grid": grid, "threads": 128, "smem_bytes": (128 + 128) * 64 * 2}


# -- build once, check SASS and source ----------------------------------------------------------
BUILDS = {
    "v1_f16": ("v1", (128, 128, 64), {}),
    "v1_bf16_m64": ("v1", (64, 128, 64), {"blk_m": 64, "dtype": "bfloat16"}),
    "v2_f16": ("v2", (128, 128, 256), {}),
    "v2_bf16_2wg": ("v2", (256, 128, 128), {"blk_m": 256, "num_warpgroups": 2, "dtype": "bfloat16"}),
    "v3_edge_f16": ("v3", (1000, 3000, 520), {}),
    "v3_even_bf16": ("v3", (256, 256, 128), {"dtype": "bfloat16"}),
}


def _kernel_body(src: str) -> str:
    return src[src.rindex('extern "C" __global__'):]


@pytest.mark.parametrize("name", list(BUILDS))
def test_sass_has_wgmma_no_tma_no_spills(built, name):
    b = built(*BUILDS[name])
    counts, res = b.counts, b.resources
    assert counts["HGMMA"] >= 4, counts
    assert counts["UTMALDG"] == 0 and counts["UTMASTG"] == 0, counts
    assert counts["LDL"] == 0 and counts["STL"] == 0, counts
    assert res.local == 0 and res.stack == 0 and res.registers <= 255, res
    # the threads copy with 16-byte vectors and store the output without shared staging
    assert counts["LDG"] > 0 and counts["STS"] > 0 and counts["STG"] > 0, counts
    assert counts["LDSM"] == 0 and counts["STSM"] == 0 and counts["LDS"] == 0, counts


@pytest.mark.parametrize("name", list(BUILDS))
def test_copies_are_16_bytes_and_stores_are_pairs(built, name):
    b = built(*BUILDS[name])
    mod, lines = b.module, b.sass.splitlines()
    for op in ("LDG", "STS"):  # global -> shared in 16-byte chunks (one swizzle chunk each)
        found = [line for line in lines if re.search(rf"\b{op}\b", line)]
        assert found and all(".128" in line for line in found), (op, found[:3])
    stg = [line for line in lines if re.search(r"\bSTG\b", line)]
    assert stg and all("STG.E " in line for line in stg)  # 4-byte stores: one (col, col+1) pair
    pairs_per_thread = mod.cfg.blk_m * mod.cfg.blk_n // (2 * 128 * mod.cfg.num_warpgroups)
    assert len(stg) == pairs_per_thread


@pytest.mark.parametrize("name", list(BUILDS))
def test_stores_are_fenced_for_wgmma_before_the_barrier(built, name):
    b = built(*BUILDS[name])
    src = b.module.cuda_source()
    assert "fence.proxy.async.shared::cta" in src
    body = _kernel_body(src)
    fence = body.index("fence_proxy_proxy_async_shared__cta()")
    barrier = body.index("cta_sync()", fence)
    first_mma = body.index("mma_async_sync_aligned_m64n")
    last_copy = body.rindex("st_vec_shared_v4_u32", 0, fence)
    assert last_copy < fence < barrier < first_mma
    assert "FENCE.VIEW.ASYNC.S" in b.sass


def test_k_loop_frees_the_stage_before_the_next_copy(built):
    # v2/v3: a second barrier after wait_group, before the next slice overwrites the stage
    for name in ("v2_f16", "v3_edge_f16"):
        body = _kernel_body(built(*BUILDS[name]).module.cuda_source())
        wait = body.index("wgmma_wait_group")
        assert "cta_sync()" in body[wait:body.index("}", wait)], name


def test_v3_guards_only_the_edges_a_shape_has(built):
    edge_module = built(*BUILDS["v3_edge_f16"]).module
    edge = _kernel_body(edge_module.cuda_source())
    even = _kernel_body(built(*BUILDS["v3_even_bf16"]).module.cuda_source())
    assert "if (" in edge and "= (uint)0;" in edge  # zero-filled chunks past M, N and K
    assert "if (" not in even and "(uint)0" not in even
    assert edge_module.extra["launch"]["grid"] == [8, 24]


def test_export_carries_sass(built):
    from gemm_ladder.compile import sass

    blob = built(*BUILDS["v3_edge_f16"]).path.read_bytes()
    assert sass.has_device_binary(blob) and b"__global__" not in blob


# -- GPU tier ------------------------------------------------------------------------------------
# every case is built (or taken prebuilt) and checked against torch on randn inputs, seeds 0 and
# 1, in one child process per session with a deadline per module (tests/gpu_cases.py)
from tests.gpu_cases import Case  # noqa: E402

GPU_SHAPES = [
    ("v1", (128, 128, 64), {}),
    ("v1", (64, 128, 64), {"blk_m": 64}),
    ("v2", (128, 128, 64), {}),
    ("v2", (128, 128, 128), {}),
    ("v2", (128, 128, 4096), {}),
    ("v3", (4096, 4096, 4096), {}),
    ("v3", (1000, 3000, 520), {}),
    ("v3", (8192, 1024, 8192), {}),
    ("v3", (256, 256, 64), {}),
    ("v3", (256, 256, 128), {}),
]
CASES = [Case(rung, *shape, dtype=d, **knobs) for rung, shape, knobs in GPU_SHAPES
         for d in ("float16", "bfloat16")]
# the other tile shapes and two warpgroups, once each
CASES += [
    Case("v1", 256, 128, 64, blk_m=256, num_warpgroups=2),
    Case("v2", 64, 256, 512, blk_m=64, blk_n=256, dtype="bfloat16"),
    Case("v3", 1000, 3000, 520, blk_m=256, num_warpgroups=2),
    Case("v3", 777, 1000, 200, blk_m=64, blk_n=192),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_is_correct_on_the_gpu(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result
