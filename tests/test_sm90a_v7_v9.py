"""v7 (warp specialization), v8 (clusters + TMA multicast), v9 (per-consumer epilogues) on sm_90a.

CPU tier (CI): knob validation (cluster shape, consumers, epi_n, registers, shared memory),
the register budgets of the roles, the multicast masks, and building a sample of knob
combinations once each: their SASS must show the instructions each technique implies
(``USETMAXREG`` in v7+, ``UTMALDG...MULTICAST`` in v8+, one named barrier per consumer in v9)
with no local-memory spills. GPU tier (``gpu``): every rung in both dtypes at the benchmark
shapes, a skinny shape, K shorter than the ring and shapes that are not multiples of the tile,
plus a knob sample, each checked against a float64 reference in a child process with a
deadline (a deadlocked barrier protocol fails its case instead of hanging the run).
"""

import re

import pytest

from tests.gpu_cases import Case

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.core.budget import limits_for

V7_V9 = ("v7", "v8", "v9")


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rung, knobs, words",
    [
        ("v7", dict(pipe_depth=4), ["pipe_depth=4", "use pipe_depth=3 or less"]),
        ("v7", dict(num_warpgroups=3), ["num_warpgroups=3", "1 or 2"]),
        ("v7", dict(num_warpgroups=1), ["256 fp32 accumulator", "num_warpgroups"]),
        ("v8", dict(cluster_m=4), ["cluster_m=4", "1 or 2"]),
        ("v8", dict(cluster_n=True), ["cluster_n=True", "bool", "cluster_n=1"]),
        ("v8", dict(cluster_m=2, blk_n=64, blk_m=64, num_warpgroups=1, cluster_n=2), []),
        ("v9", dict(epi_n=96), ["epi_n=96", "multiple of 16 that divides blk_n=256", "[16, 32, 64, 128, 256]"]),
        ("v9", dict(epi_n=192), ["epi_n=192", "divides blk_n=256"]),
        ("v9", dict(num_warpgroups=4), ["num_warpgroups=4", "1 or 2 or 3"]),
        ("v9", dict(num_warpgroups=3, blk_m=192, blk_n=256, pipe_depth=3), ["128 fp32 accumulator", "152"]),
        ("v9", dict(epi_n=256), ["pipe_depth=4", "use pipe_depth=3 or less"]),
        # pingpong is retired: its old default is ignored (test_a_retired_knob_...), anything else refused
        ("v9", dict(pingpong=True), ["pingpong=True", "no longer builds", "2026-11-22_h100_v9_pingpong",
                                     "rebuild it without pingpong"]),
        ("v9", dict(pingpong="yes"), ["pingpong='yes'", "rebuild it without pingpong"]),
        ("v10", dict(pingpong=False), ["no knob pingpong"]),
        ("v9", dict(epi_under=True, tail_n=232), ["epi_under=True", "tail_n", "tail_n=0", "epi_under=False"]),
        ("v9", dict(epi_under=True, num_warpgroups=3, blk_m=192, blk_n=192, pipe_depth=3),
         ["epi_under=True", "48 registers", "152", "use epi_under=False"]),
        ("v9", dict(epi_under="yes"), ["epi_under='yes'", "bool"]),
        ("v9", dict(k_zigzag=1), ["k_zigzag=1", "an int, not a bool"]),
        ("v9", dict(epi_under=True, k_zigzag=True), []),
        ("v9", dict(epi_under=True, num_warpgroups=1, blk_m=64), []),
        ("v6", dict(cluster_m=2), ["no knob cluster_m"]),
        ("v7", dict(epi_n=64), ["no knob epi_n"]),
    ],
)
def test_refuses_bad_knobs_with_a_fix(rung, knobs, words):
    if not words:  # a config that must be accepted, each knob as given
        cfg = gemm_ladder.make_config(rung, 4096, 4096, 4096, **knobs)
        assert {k: cfg.knobs()[k] for k in knobs} == knobs, cfg.knobs()
        return
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, 4096, 4096, 4096, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_role_registers_fit_the_register_file():
    from gemm_ladder.sm90a import common

    for consumers in (1, 2, 3):
        regs = common.role_registers(consumers)
        threads = 128 * (consumers + 1)
        assert regs.entry * threads <= common.REGISTER_FILE  # what ptxas caps at launch
        if regs.consumer is None:  # no reallocation: every thread keeps what it starts with
            assert regs.producer is None and regs.entry == 255
            continue
        assert regs.producer * 128 + regs.consumer * 128 * consumers <= common.REGISTER_FILE
        assert regs.producer % 8 == 0 and regs.consumer % 8 == 0  # setmaxnreg's unit
        assert regs.producer < regs.entry < regs.consumer
    assert common.role_registers(1).consumer is None  # one consumer already holds 255


def test_multicast_masks_name_the_ctas_that_share_a_tile():
    from gemm_ladder.sm90a.producer import multicast_masks

    # rank = rank_m + cluster_m * rank_n; A is shared along a cluster row, B along a column
    for cm, cn in ((2, 1), (1, 2), (2, 2)):
        for rank in range(cm * cn):
            rm, rn = rank % cm, rank // cm
            mask_a, mask_b = multicast_masks(cm, cn, rm, rn)
            same_row = {r for r in range(cm * cn) if r % cm == rm}
            same_col = {r for r in range(cm * cn) if r // cm == rn}
            assert {r for r in range(16) if mask_a >> r & 1} == same_row
            assert {r for r in range(16) if mask_b >> r & 1} == same_col


def test_v9_staging_leaves_room_for_a_deeper_ring():
    from gemm_ladder.core import budget

    lim = limits_for("sm_90a").smem_per_block
    v8 = gemm_ladder.make_config("v8", 4096, 4096, 4096)
    v9 = gemm_ladder.make_config("v9", 4096, 4096, 4096)
    assert budget.max_pipe_depth(v8, lim) == 3
    assert budget.max_pipe_depth(v9, lim) == 4
    # two 64-column chunks per 64-row band of each consumer, instead of the whole tile
    assert budget.out_bytes(v9) == 2 * 128 * 64 * 2 and budget.out_bytes(v8) == 128 * 256 * 2
    wide = gemm_ladder.make_config("v9", 4096, 4096, 4096, epi_n=256, pipe_depth=3)
    assert budget.out_bytes(wide) == budget.out_bytes(v8)  # one chunk: the whole tile


# -- building (each module once) ---------------------------------------------------------------
CPU_BUILDS = {
    "v7_default": ("v7", (4096, 4096, 4096), {}),
    "v7_w1_bf16": ("v7", (1000, 3000, 520), dict(blk_n=128, num_warpgroups=1, dtype="bfloat16")),
    "v8_default": ("v8", (8192, 8192, 8192), {}),
    "v8_1x2": ("v8", (1000, 3000, 520), dict(cluster_m=1, cluster_n=2)),
    "v8_2x2": ("v8", (777, 1000, 200), dict(cluster_m=2, cluster_n=2, blk_n=128, tile_order="grouped")),
    "v9_default": ("v9", (8192, 8192, 8192), {}),
    "v9_w3": ("v9", (1000, 3000, 520), dict(num_warpgroups=3, blk_m=192, blk_n=192, pipe_depth=3)),
    "v9_epi256": ("v9", (512, 768, 64), dict(epi_n=256, pipe_depth=3, cluster_m=1, dtype="bfloat16")),
    "v9_under": ("v9", (1000, 3000, 520), dict(epi_under=True, k_zigzag=True)),
}


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_sass_has_the_technique_and_no_spills(built, name):
    b = built(*CPU_BUILDS[name])
    mod, text, counts = b.module, b.sass, b.counts
    for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM", "SYNCS"):
        assert counts[op] > 0, (op, counts)
    assert counts["LDL"] == 0 and counts["STL"] == 0, counts
    res = b.resources
    assert res.stack == 0 and res.local == 0, res
    # v7+: with two or three consumers the producer gives registers back and the consumers take
    # them; with one, every thread already holds 255 and nothing moves
    from gemm_ladder.sm90a.common import role_registers

    regs = role_registers(mod.cfg.num_warpgroups)
    if regs.consumer is None:
        assert "USETMAXREG" not in text
    else:
        assert re.search(rf"USETMAXREG\.DEALLOC\S* {regs.producer:#x}\b", text), "producer setmaxnreg.dec missing"
        assert re.search(rf"USETMAXREG\.TRY_ALLOC\S* \S+ {regs.consumer:#x}\b", text), "consumer setmaxnreg.inc missing"
    # v8+: operand parts go out as multicast TMA loads exactly when the cluster shares a tile
    cm, cn = (dict(mod.cfg.extra).get("cluster_m", 1), dict(mod.cfg.extra).get("cluster_n", 1))
    multicast = len(re.findall(r"UTMALDG\.\S*MULTICAST", text))
    assert (multicast > 0) == (cm * cn > 1), (name, multicast)


def test_launch_records_threads_cluster_and_persistence(built):
    from gemm_ladder.sm90a import common

    for name, case in CPU_BUILDS.items():
        mod = built(*case).module
        launch = mod.extra["launch"]
        assert launch["persistent"] is True
        assert launch["threads"] == 128 * (mod.cfg.num_warpgroups + 1)  # producer + consumers
        assert launch["smem_bytes"] == common.smem_bytes(mod.cfg, mod.cfg.pipe_depth)
        assert launch["smem_bytes"] <= limits_for("sm_90a").smem_per_block
        cm, cn = (dict(mod.cfg.extra).get("cluster_m", 1), dict(mod.cfg.extra).get("cluster_n", 1))
        assert launch.get("cluster", 1) == cm * cn, name


def test_v7_consumers_sync_without_the_producer(built):
    src = built(*CPU_BUILDS["v7_default"]).module.cuda_source()
    body = src[src.index("__global__ void"):]
    assert "__syncthreads" not in body.split("setmaxnreg_dec")[1]  # no CTA barrier after the split
    assert re.search(r"bar_sync_count_sync\(\(uint\)1, \(uint\)256\)", body)  # consumers only


def test_v8_cluster_barriers_fence_the_kernel(built):
    src = built(*CPU_BUILDS["v8_default"]).module.cuda_source()
    body = src[src.index("__global__ void"):]
    assert body.count("barrier_cluster_arrive") == 2 and body.count("barrier_cluster_wait") == 2
    assert "mapa" in src  # releases reach the peer CTA's barrier


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_descriptors_are_encoded_once_per_slice(built, name):
    """``common.mma_k_tile`` encodes each operand's descriptor once per K slice and steps it along
    K with a 64-bit add: an encode (address >> 4, a 64-bit USHF.R.U64) per operand and slice, not
    per wgmma. (The stepped descriptor equals an encode at that address: test_layouts checks the
    offsets against TVM's layout.)"""
    b = built(*CPU_BUILDS[name])
    text, cfg = b.sass, b.module.cfg
    hgmma, encodes = len(re.findall(r"\bHGMMA\.", text)), len(re.findall(r"USHF\.R\.U64", text))
    m_atoms = cfg.blk_m // 64 // cfg.num_warpgroups
    assert hgmma and encodes <= hgmma * (1 + m_atoms) // (4 * m_atoms), (hgmma, encodes)


@pytest.mark.parametrize("name", sorted(n for n in CPU_BUILDS if not n.startswith("v7")))
def test_v8_v9_encode_descriptors_once_per_tile(built, name):
    """v8 and v9 run their K loop through ``mainloop.Consumer.issue``, which encodes ring slot 0's two
    descriptors once per tile (``encode_slot0``) and reaches each slot by an add: the kernel holds
    exactly one encode (a 64-bit USHF.R.U64) per operand, however far the K loop is unrolled.
    (v7 writes its loop out with ``mma_k_tile``'s per-slice encode; the test above bounds it.)"""
    text = built(*CPU_BUILDS[name]).sass
    assert len(re.findall(r"USHF\.R\.U64", text)) == 2
    assert len(re.findall(r"\bHGMMA\.", text)) >= 4  # the K steps of a slice are there


def test_v9_each_consumer_has_its_own_named_barrier(built):
    src = built(*CPU_BUILDS["v9_w3"]).module.cuda_source()
    body = src[src.index("__global__ void"):]
    # bar.sync <consumer warpgroup index>, 128: one barrier id per consumer, 128 threads each
    assert re.search(r"bar_sync_count_sync\(\(\(uint\)\(warp_id_in_cta >> 2\)\), \(uint\)128\)", body)
    assert "wait_group_read_1" in body  # a chunk's buffer waits only for the store before last


def _lines_of(text, pattern):
    return [i for i, line in enumerate(text.splitlines()) if re.search(pattern, line)]


@pytest.mark.parametrize("name, under", [("v9_default", False), ("v9_under", True)])
def test_v9_epi_under_stages_chunks_between_the_next_tiles_wgmmas(built, name, under):
    """With ``epi_under`` the stmatrix of a tile's chunks sit between the next tile's wgmma
    issues, and the wgmmas stay asynchronous (ptxas serialises them, one wait per HGMMA, when
    it cannot prove the accumulators it sees read are not in flight); without it every stmatrix
    comes after the K loop's last wgmma."""
    text = built(*CPU_BUILDS[name]).sass
    hgmma, stsm = _lines_of(text, r"\bHGMMA\."), _lines_of(text, r"\bSTSM\b")
    between = [i for i in stsm if hgmma[0] < i < hgmma[-1]]
    assert bool(between) == under, (name, len(between))
    waits = _lines_of(text, r"WARPGROUP\.DEPBAR")
    assert len(waits) < len(hgmma) / 2, (name, len(waits), len(hgmma))
    # the pairs: one cvt per two accumulators at a tile's end (128 -> 64 at 128x256 over two)
    pairs = len(_lines_of(text, r"F2FP\.F16\.F32\.PACK_AB"))
    assert (pairs >= 64) if under else (pairs == 64), (name, pairs)


# -- GPU tier ------------------------------------------------------------------------------------
GPU_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192), (512, 768, 64),
              (2048, 2048, 128), (1000, 3000, 520), (777, 1000, 200)]
CASES = [Case(rung, *shape, dtype=dtype) for rung in V7_V9 for shape in GPU_SHAPES
         for dtype in ("float16", "bfloat16")]
KNOB_SAMPLE = [
    ("v7", dict(blk_n=128, num_warpgroups=1, pipe_depth=4)),
    ("v7", dict(tile_order="grouped", l2_group_size=1)),
    ("v8", dict(cluster_m=1, cluster_n=2)),
    ("v8", dict(cluster_m=2, cluster_n=2, blk_n=128)),
    ("v8", dict(tile_order="row", pipe_depth=2)),
    ("v9", dict(cluster_m=1, cluster_n=1)),
    ("v9", dict(cluster_m=1, cluster_n=2)),
    ("v9", dict(num_warpgroups=3, blk_m=192, blk_n=192, pipe_depth=3)),
    ("v9", dict(blk_m=256, blk_n=128, pipe_depth=3)),
    ("v9", dict(epi_n=128, pipe_depth=3, tile_order="grouped", l2_group_size=16)),
    ("v9", dict(epi_n=256, pipe_depth=3)),
    ("v9", dict(num_warpgroups=1, blk_n=128, pipe_depth=5)),
]
CASES += [Case(rung, *shape, **knobs) for rung, knobs in KNOB_SAMPLE
          for shape in [(1000, 3000, 520), (777, 1000, 200), (2048, 2048, 128)]]
# tail_n (tests/test_narrow_tail.py): shapes where the cut happens on 132 SMs (H100, H200)
CASES += [
    Case("v9", 1000, 3000, 520, tail_n=232, cluster_m=1),  # every tile narrow, the rows' last past N
    Case("v9", 1000, 3000, 520, tail_n=200),  # 2x1 clusters, 8 columns from the registers
    Case("v9", 4096, 4096, 512, tail_n=232, cluster_m=1),  # whole tiles, then 8 rows of narrow ones
    Case("v9", 4096, 4096, 512, tail_n=232, cluster_m=1, cluster_n=2, dtype="bfloat16"),
    Case("v9", 8192, 8192, 512, tail_n=176),  # 8192^3's cut, 2x1 clusters
    Case("v9", 2000, 3072, 1000, tail_n=192, tile_order="grouped", l2_group_size=8),  # no columns after the chunks
]
# epi_under (and k_zigzag): a K of more slices than chunks, fewer (3 < 4: chunks after the last
# slice), one slice, one consumer, one buffer, no cluster, runtime M, the benchmark shapes
CASES += [
    Case("v9", 1000, 3000, 520, epi_under=True),
    Case("v9", 1000, 3000, 520, epi_under=True, k_zigzag=True, dtype="bfloat16"),
    Case("v9", 1000, 3000, 192, epi_under=True),
    Case("v9", 777, 1536, 64, epi_under=True, dtype="bfloat16"),
    Case("v9", 1000, 3000, 520, epi_under=True, num_warpgroups=1, blk_m=64, k_zigzag=True),
    Case("v9", 1000, 3000, 520, epi_under=True, epi_n=256, pipe_depth=3),
    Case("v9", 1000, 3000, 520, epi_under=True, cluster_m=1, tile_order="grouped", l2_group_size=4),
    Case("v9", 2000, 3000, 520, epi_under=True, dynamic_m=True, tile_order="grouped"),
    Case("v9", 1000, 3000, 520, k_zigzag=True, cluster_m=1, cluster_n=2),
    Case("v9", 4096, 4096, 4096, epi_under=True, k_zigzag=True),
    Case("v9", 4096, 4096, 4096, epi_under=True, k_zigzag=True, dtype="bfloat16"),
    Case("v9", 8192, 8192, 8192, epi_under=True),
]
# 2x2 clusters on the grid of the clusters that run at once (tests/test_cluster_grid.py)
CASES += [Case("v9", 1000, 3000, 520, cluster_m=2, cluster_n=2), Case("v9", 4096, 4096, 512, cluster_m=2, cluster_n=2)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_v7_v9_are_correct_on_the_gpu(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result


@pytest.mark.gpu
@pytest.mark.parametrize("case", [Case("v9", 1000, 3000, 520, epi_under=True)], ids=str)
def test_the_tuners_second_pass_times_a_group_on_the_gpu(case, gpu_result, _gpu_batch):
    """isolate's ``rounds`` job (the tuner's second pass): a group checked and timed in one
    watched child, taking turns with cuBLAS; the same module twice reads alike."""
    from gemm_ladder.measure import isolate  # pylint: disable=import-outside-toplevel

    assert gpu_result["status"] == "ok", gpu_result
    path = _gpu_batch["paths"][case.key]
    res = isolate.run_batch("rounds", [path, path], (6, 4, 0.2), timeout=120, explain=False)
    assert [r["status"] for r in res] == ["ok", "ok"], res
    for r in res:
        assert r["ratio_to_cublas"] > 0 and r["tflops"] > 0 and r["rel_err"] < 1e-2
        low, mid, high = r["round_ratio_to_cublas_quartiles"]
        assert low <= mid <= high
    assert "ratio_to_first" not in res[0] and 0.8 < res[1]["ratio_to_first"] < 1.25


def test_a_retired_knob_at_its_old_default_is_ignored():
    # tuning records and modules made before v9 dropped pingpong carry pingpong=False
    cfg = gemm_ladder.make_config("v9", 4096, 4096, 4096, pingpong=False)
    assert "pingpong" not in cfg.knobs() and cfg == gemm_ladder.make_config("v9", 4096, 4096, 4096)
