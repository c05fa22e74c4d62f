"""v10's atomic split-K reduction (``reduce="atomic"``, ``sm90a/splitk.py``): every unit of a tile
adds its fp32 partial into the part's one slot (``red.global.add.v4.f32``), the last to count reads
the slot back, zeroes it and stores the tile.

CPU tier: the knob's validation and that the default leaves every other module as it was (knobs,
tag, workspace, kernel text); the workspace's one slot a part; the reduction played out in numpy
over the kernel's own index arithmetic in several arrival orders (D right, written once, every slot
and counter back at zero for the next launch); the built kernel's source and SASS (the vector
reductions in L2, one read of the slot, its zeroing, no spills, no slot per split)."""

import re

import numpy as np
import pytest

import gemm_ladder
from gemm_ladder import ConfigError
from tests.test_sm90a_small_m import _consumer_coords, _operands


# -- the knob ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rung, knobs, words", [
    ("v10", dict(reduce="tree"), ["reduce='tree'", "'slots', 'atomic'"]),
    ("v10", dict(reduce=True), ["reduce=True", "not a string"]),
    ("v10", dict(split_k=1, reduce="atomic"), ["split_k=1", "split_k >= 2"]),
    ("v10", dict(split_k=1, stream_k=True, reduce="atomic"), ["split_k=1", "split_k >= 2"]),
    ("v9", dict(reduce="atomic"), ["no knob reduce"]),
    ("v11", dict(split_k=2, reduce="atomic"), ["no knob reduce"]),
])
def test_refuses_a_bad_reduce_with_a_fix(rung, knobs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, 333, 1280, 5120, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_the_default_reduce_leaves_a_module_as_it_was():
    """``reduce="slots"`` given or not: the same knobs and tag (so the same cache key and pack
    names as before the knob); ``"atomic"`` shows in both."""
    plain = gemm_ladder.make_config("v10", 333, 1280, 5120, blk_n=128, split_k=4)
    slots = gemm_ladder.make_config("v10", 333, 1280, 5120, blk_n=128, split_k=4, reduce="slots")
    atomic = gemm_ladder.make_config("v10", 333, 1280, 5120, blk_n=128, split_k=4, reduce="atomic")
    assert slots == plain and slots.tag() == plain.tag() and "reduce" not in plain.knobs()
    assert atomic.knobs()["reduce"] == "atomic" and "reduceatomic" in atomic.tag()


def test_the_atomic_workspace_holds_one_slot_a_part():
    from gemm_ladder.rungs import rung_module

    v10 = rung_module("v10")
    for split in (2, 4, 8):
        slots = v10.workspace(gemm_ladder.make_config("v10", 333, 1280, 5120, blk_n=128, split_k=split))
        atomic = v10.workspace(gemm_ladder.make_config("v10", 333, 1280, 5120, blk_n=128, split_k=split,
                                                       reduce="atomic"))
        assert atomic["float32_per_m_step"] * split == slots["float32_per_m_step"]
        assert atomic["int32_per_m_step"] == slots["int32_per_m_step"] and atomic["zeroed"]


# -- the reduction, played out in numpy ----------------------------------------------------------
def _emulate_atomic(M, N, K, knobs, arrival_seed):
    """Every unit of the kernel's schedule in a random arrival order: adds into its part's slot
    (``splitk.slot_offset(counter, 0, 1, ...)``), counts, and the last reads, zeroes and stores."""
    from gemm_ladder.rungs import rung_module
    from gemm_ladder.sm90a import splitk
    from schedulers.orders import tile_order

    cfg = gemm_ladder.make_config("v10", M, N, K, reduce="atomic", **knobs)
    assert splitk.atomic(cfg)
    mod = rung_module("v10")
    bm, bn, W, S = cfg.blk_m, cfg.blk_n, cfg.num_warpgroups, splitk.split_k(cfg)
    cm, cn = dict(cfg.extra)["cluster_m"], dict(cfg.extra)["cluster_n"]
    rows, cols = mod.cluster_grid(cfg)
    ws = mod.workspace(cfg)
    A, B, Ap, Bp = _operands(M, N, K, rows * cm * bm, cols * cn * bn, cfg.k_tiles, seed=0)
    P = np.zeros(splitk.workspace_elems(ws, M, "float32"))  # the runtime zeroes it once
    C = np.zeros(splitk.workspace_elems(ws, M, "int32"), dtype=np.int64)
    D = np.full((rows * cm * bm, cols * cn * bn), np.nan)
    writes = np.zeros_like(D, dtype=np.int64)
    coords = [_consumer_coords(False, bm, bn, W, c) for c in range(W)]
    acc = coords[0][0].shape[1]
    units = [(m_idx, col, rank) for m_idx, col in tile_order(cfg.tile_order, rows, cols * S, cfg.l2_group_size)
             for rank in range(cm * cn)]
    for u in np.random.default_rng(arrival_seed).permutation(len(units)):
        m_idx, col, rank = units[u]
        n_col, split = splitk.unit(col, S)
        k0, nk = splitk.k_slices(split, S, cfg.k_tiles)
        m_cta, n_cta = m_idx * cm + rank % cm, n_col * cn + rank // cm
        ks = slice(k0 * 64, (k0 + nk) * 64)
        part = Ap[m_cta * bm:(m_cta + 1) * bm, ks] @ Bp[n_cta * bn:(n_cta + 1) * bn, ks].T
        for c in range(W):
            r, q = coords[c]
            counter = splitk.counter_index(m_cta, n_cta, c, cols * cn, W)
            offs = np.array([[splitk.slot_offset(counter, 0, 1, j, t, acc) for j in range(acc // 4)]
                             for t in range(128)])  # [thread, quad]
            idx = (offs[:, :, None] + np.arange(4)).reshape(128, acc)  # each register's float
            assert idx.max() < len(P)
            P[idx] += part[r, q]  # red.global.add.v4.f32
            old = C[counter]
            C[counter] += 1
            if old != S - 1:
                continue
            dreg = P[idx].copy()  # the last: the slot holds every unit's partial
            P[idx] = 0
            C[counter] = 0
            D[m_cta * bm + r, n_cta * bn + q] = dreg
            np.add.at(writes, (m_cta * bm + r, n_cta * bn + q), 1)
    return D[:M, :N], writes[:M, :N], P, C, A @ B.T


@pytest.mark.parametrize("shape, knobs", [
    ((200, 296, 520), dict(blk_m=128, blk_n=128, split_k=3, cluster_m=1)),
    ((200, 296, 200), dict(blk_m=64, blk_n=64, num_warpgroups=1, split_k=4, cluster_m=2, tile_order="grouped",
                           l2_group_size=2)),
    ((150, 264, 328), dict(blk_m=128, blk_n=128, split_k=2, cluster_m=1, cluster_n=2)),
    ((333, 520, 1024), dict(blk_m=128, blk_n=256, split_k=8, cluster_m=2)),
], ids=str)
def test_every_unit_adds_into_one_slot_and_the_last_stores_the_product(shape, knobs):
    for seed in (1, 2, 3):
        D, writes, P, C, ref = _emulate_atomic(*shape, knobs, seed)
        assert (writes == 1).all(), "every element of D stored exactly once"
        np.testing.assert_array_equal(D, ref)  # small integers: exact in float64
        assert not P.any() and not C.any(), "every slot and counter back at zero for the next launch"


# -- the built kernel ------------------------------------------------------------------------------
def test_the_kernel_adds_in_l2_and_reads_one_slot(built):
    b = built("v10", (333, 1280, 5120), dict(blk_n=128, split_k=4, reduce="atomic"))
    src = b.module.cuda_source()
    body = src[src.index("__global__ void"):]
    quads = 128 * 128 // (2 * 128) // 4  # a consumer's register quads (128x128 over two consumers)
    assert body.count("red_vec_f32_global_add_v4_f32(") == quads  # every unit's adds
    assert body.count("ld_vec_global_cg_v4_f32(") == quads  # the last reads one slot, not split_k
    assert body.count("st_vec_global_v4_f32(") == quads  # and zeroes it
    assert body.count("atom_acq_rel_gpu_global_add_u32(") == 1 and body.count("st_relaxed_gpu_global_u32(") == 1
    text, counts = b.sass, b.counts
    assert len(re.findall(r"\bREDG\.E\.ADD\.F32", text)) == quads, re.findall(r"REDG\S*", text)[:3]
    assert counts["LDL"] == 0 and counts["STL"] == 0 and b.resources.local == 0
    assert len(re.findall(r"LDG\.E\.128\.STRONG\.GPU", text)) == quads


def test_the_atomic_reduction_passes_the_barrier_check():
    """The protocol check (``protocol.check``) over v10's longest-K scenario with the atomic
    reduction: the named barriers around the count and the ring are the slots' own."""
    from gemm_ladder.barriers.ladder import scenarios
    from gemm_ladder.protocol.check import check_config

    cfgs = scenarios("v10", "sm_90a", {"split_k": 2, "reduce": "atomic"})
    assert cfgs and all(dict(c.extra)["reduce"] == "atomic" for c in cfgs)
    report = check_config(cfgs[-1], policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()
