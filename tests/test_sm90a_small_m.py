"""v10 (split-K) and v11 (swap AB) on sm_90a, and the wave model that picks their knobs.

CPU tier (CI): knob validation (split_k, swap-AB tile heights, consumers, clusters, registers);
the index arithmetic played out in numpy (every split-K unit of a small problem computed, its
partial stored at ``splitk.slot_offset`` in fragment order, counted, and the last unit of each
tile summing the slots, in several arrival orders: D must equal A.B^T, written once per element,
with every counter back at zero and the same bits whatever the order); the transposed stores of
swap AB against the fragment layout; the wave model's rankings; building a sample once each, its
SASS showing what the techniques imply (``HGMMA.64x{blk_m}`` for v11, ``STSM...MT88`` transposed
stores, the split-K atomics, acquire fence and L2 loads only when split_k > 1, no spills). GPU tier
(``gpu``): each module against a float64 reference at odd shapes (M = 1, 7, 33, 135; N, K not
multiples of the tile) in a child process with a deadline; dynamic-M modules at every M of
``harness.DYNAMIC_M_CHECKS``.
"""

import math
import re

import numpy as np
import pytest

from tests.gpu_cases import Case

import gemm_ladder
from gemm_ladder import ConfigError


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rung, shape, knobs, words",
    [
        ("v10", (978, 2640, 3336), dict(split_k=0), ["split_k=0", "53 slices", "from 1 to 32"]),
        ("v10", (64, 64, 200), dict(split_k=5, blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=1),
         ["split_k=5", "4 slices", "from 1 to 4"]),
        ("v10", (978, 2640, 3336), dict(split_k=True), ["split_k=True", "bool"]),
        ("v10", (978, 2640, 3336), dict(split_k=3, dynamic_m=True, tile_order="row"), ["tile_order='row'", "runtime M"]),
        ("v10", (978, 2640, 3336), dict(split_k=4, tile_order="serpentine"), ["tile_order='serpentine'"]),
        ("v11", (16, 4096, 4096), dict(blk_m=12), ["blk_m=12", "multiples of 8 from 8 to 256"]),
        ("v11", (16, 4096, 4096), dict(blk_m=16, blk_n=64), ["blk_n=64", "2 consumer(s)", "blk_n=128"]),
        ("v11", (16, 4096, 4096), dict(blk_m=8, cluster_n=2), ["blk_m=8", "multiple of 16"]),
        ("v11", (16, 4096, 4096), dict(num_warpgroups=3, blk_n=192), ["num_warpgroups=3", "1 or 2"]),
        ("v11", (256, 4096, 4096), dict(blk_m=256, blk_n=128, num_warpgroups=1, pipe_depth=2),
         ["256 fp32 accumulator", "num_warpgroups"]),
        ("v11", (64, 4096, 4096), dict(pipe_depth=9), ["pipe_depth=9", "use pipe_depth=8 or less"]),
        ("v11", (64, 4096, 4096), dict(epi_n=64), ["no knob epi_n"]),
        ("v9", (64, 4096, 4096), dict(split_k=2), ["no knob split_k"]),
        ("v9", (64, 4096, 4096), dict(blk_m=16), ["blk_m=16", "(64, 128, 192, 256)"]),
        ("v11", (16, 4096, 4096), dict(stream_b=1), ["stream_b=1", "not a bool", "stream_b=False"]),
        ("v9", (64, 4096, 4096), dict(stream_b="yes"), ["stream_b='yes'", "a string, not a bool"]),
        ("v8", (64, 4096, 4096), dict(stream_b=True), ["no knob stream_b"]),
        # accepted
        ("v11", (1, 4096, 4096), dict(blk_m=8, split_k=4), []),
        ("v11", (135, 3688, 6200), dict(blk_m=136, split_k=4, pipe_depth=5), []),
        ("v11", (64, 4096, 4096), dict(cluster_n=2), []),
        ("v10", (64, 64, 8192), dict(blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=1, split_k=32), []),
    ],
)
def test_refuses_bad_knobs_with_a_fix(rung, shape, knobs, words):
    if not words:  # accepted, each knob as given (none dropped or changed on the way)
        cfg = gemm_ladder.make_config(rung, *shape, **knobs)
        assert {k: cfg.knobs()[k] for k in knobs} == knobs, cfg.knobs()
        return
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, *shape, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_workspace_sizes_agree_between_kernel_and_runtime():
    """The kernel's buffer shapes (``splitk.workspace_elems``, checked by the host code) and the
    runtime's allocation (``GemmModule.workspace_elems``) come from one manifest record."""
    from gemm_ladder.serve.runtime import GemmModule
    from gemm_ladder.rungs import rung_module
    from gemm_ladder.sm90a import splitk

    for rung, shape, knobs in [("v10", (978, 2640, 3336), {}), ("v11", (16, 4096, 4096), dict(blk_m=16)),
                               ("v11", (64, 4096, 4096), dict(split_k=1)),
                               ("v10", (1000, 3000, 520), dict(cluster_n=2, cluster_m=2, blk_n=128, split_k=3))]:
        cfg = gemm_ladder.make_config(rung, *shape, **knobs)
        launch = rung_module(rung).launch(cfg)
        ws = launch["workspace"]
        mod = GemmModule("x.so", {"rung": rung, "shape": list(shape), "dtype": "float16", "arch": "sm_90a",
                                  "knobs": cfg.knobs(), "tvm_version": "", "launch": launch}, None)
        for M in (1, 7, 63, 64, 65, 1000, 8191):
            assert mod.workspace_elems(M) == {k: splitk.workspace_elems(ws, M, k) for k in ("float32", "int32")}
        s = splitk.split_k(cfg)
        if s == 1:
            assert mod.workspace_elems(cfg.M) == {"float32": 1, "int32": 1}  # valid pointers, never read
        else:  # every tile: split_k slots of blk_m x blk_n partials and a counter per consumer
            cm, cn = dict(cfg.extra).get("cluster_m", 1), dict(cfg.extra).get("cluster_n", 1)
            tiles = math.ceil(cfg.M / (cfg.blk_m * cm)) * cm * math.ceil(cfg.grid_mn[1] / cn) * cn
            assert mod.workspace_elems(cfg.M) == {"float32": tiles * s * cfg.blk_m * cfg.blk_n,
                                                  "int32": tiles * cfg.num_warpgroups}
            # past what the kernel's 32-bit indices reach: refused before any launch
            from gemm_ladder.serve.runtime import ModuleInputError

            with pytest.raises(ModuleInputError, match="32-bit indices"):
                mod.workspace_args(2**31 // (s * cfg.N) + cfg.blk_m * 2, None)


# -- the index arithmetic, played out in numpy ---------------------------------------------------
def _consumer_coords(swap, blk_m, blk_n, W, c):
    """(D row, D col) within the tile of every (thread, register) of consumer c's accumulators."""
    from layouts import acc_fragment_map

    if not swap:  # rows [c * blk_m/W ...) of M in 64-row atoms, all blk_n columns
        fmap = acc_fragment_map(blk_n)  # [thread, reg, (row, col)]
        atoms = blk_m // W // 64
        rows = np.concatenate([fmap[:, :, 0] + c * blk_m // W + 64 * a for a in range(atoms)], axis=1)
        cols = np.concatenate([fmap[:, :, 1]] * atoms, axis=1)
        return rows, cols
    # swap AB: D^T rows (N) [c * blk_n/W ...) in 64-row atoms, all blk_m columns (M)
    fmap = acc_fragment_map(blk_m)
    atoms = blk_n // W // 64
    n = np.concatenate([fmap[:, :, 0] + c * blk_n // W + 64 * a for a in range(atoms)], axis=1)
    m = np.concatenate([fmap[:, :, 1]] * atoms, axis=1)
    return m, n


def _operands(M, N, K, m_rows, n_rows, k_tiles, seed):
    """Small-integer A (M x K) and B (N x K), and copies zero-padded to whole tiles (m_rows and
    n_rows rows, k_tiles slices of 64): every product is exact in float64."""
    rng = np.random.default_rng(seed)
    A = rng.integers(-4, 5, size=(M, K)).astype(np.float64)
    B = rng.integers(-4, 5, size=(N, K)).astype(np.float64)
    Ap = np.zeros((m_rows, k_tiles * 64))
    Ap[:M, :K] = A
    Bp = np.zeros((n_rows, k_tiles * 64))
    Bp[:N, :K] = B
    return A, B, Ap, Bp


def _emulate(rung, M, N, K, knobs, arrival_seed):
    """Every unit of the kernel's schedule, in a random arrival order, through the workspace."""
    from gemm_ladder.rungs import rung_module
    from gemm_ladder.sm90a import splitk
    from schedulers.orders import tile_order

    cfg = gemm_ladder.make_config(rung, M, N, K, **knobs)
    mod = rung_module(rung)
    swap = rung == "v11"
    bm, bn, W, S = cfg.blk_m, cfg.blk_n, cfg.num_warpgroups, splitk.split_k(cfg)
    cm, cn = dict(cfg.extra).get("cluster_m", 1), dict(cfg.extra).get("cluster_n", 1)
    rows, cols = mod.cluster_grid(cfg)
    ws = mod.workspace(cfg)
    k_tiles = cfg.k_tiles
    A, B, Ap, Bp = _operands(M, N, K, rows * cm * bm, cols * cn * bn, k_tiles, seed=0)
    P = np.full(splitk.workspace_elems(ws, M, "float32"), np.nan)
    C = np.zeros(splitk.workspace_elems(ws, M, "int32"), dtype=np.int64)
    D = np.full((rows * cm * bm, cols * cn * bn), np.nan)
    writes = np.zeros_like(D, dtype=np.int64)
    coords = [_consumer_coords(swap, bm, bn, W, c) for c in range(W)]
    acc = coords[0][0].shape[1]
    units = [(m_idx, col, rank) for m_idx, col in tile_order(cfg.tile_order, rows, cols * S, cfg.l2_group_size)
             for rank in range(cm * cn)]
    assert len(units) == rows * cols * S * cm * cn
    for u in np.random.default_rng(arrival_seed).permutation(len(units)):
        m_idx, col, rank = units[u]
        n_col, split = splitk.unit(col, S)
        k0, nk = splitk.k_slices(split, S, k_tiles)
        assert nk >= 1
        m_cta, n_cta = m_idx * cm + rank % cm, n_col * cn + rank // cm
        ks = slice(k0 * 64, (k0 + nk) * 64)
        part = Ap[m_cta * bm:(m_cta + 1) * bm, ks] @ Bp[n_cta * bn:(n_cta + 1) * bn, ks].T  # [bm, bn]
        for c in range(W):
            r, q = coords[c]
            dreg = part[r, q]  # [thread, reg]: the consumer's accumulators
            counter = splitk.counter_index(m_cta, n_cta, c, cols * cn, W)
            if S > 1:
                for j in range(acc // 4):
                    for t in range(128):
                        off = splitk.slot_offset(counter, split, S, j, t, acc)
                        P[off:off + 4] = dreg[t, 4 * j:4 * j + 4]
                old = C[counter]
                C[counter] += 1
                if old != S - 1:
                    continue
                total = np.zeros_like(dreg)
                for s in range(S):
                    for j in range(acc // 4):
                        offs = np.array([splitk.slot_offset(counter, s, S, j, t, acc) for t in range(128)])
                        total[:, 4 * j:4 * j + 4] += P[offs[:, None] + np.arange(4)]
                dreg = total
                C[counter] = 0
            D[m_cta * bm + r, n_cta * bn + q] = dreg
            np.add.at(writes, (m_cta * bm + r, n_cta * bn + q), 1)
    return D[:M, :N], writes, C, A @ B.T


@pytest.mark.parametrize(
    "rung, shape, knobs",
    [
        ("v10", (200, 296, 520), dict(blk_m=128, blk_n=128, split_k=3, cluster_m=1)),
        ("v10", (200, 296, 200), dict(blk_m=64, blk_n=64, num_warpgroups=1, split_k=4, cluster_m=2,
                                      tile_order="grouped", l2_group_size=2)),
        ("v10", (150, 264, 328), dict(blk_m=128, blk_n=128, split_k=2, cluster_m=1, cluster_n=2)),
        ("v11", (7, 296, 520), dict(blk_m=8, blk_n=128, split_k=3)),
        ("v11", (33, 264, 200), dict(blk_m=40, blk_n=128, num_warpgroups=1, split_k=4)),
        ("v11", (70, 200, 328), dict(blk_m=32, blk_n=128, split_k=2, cluster_m=2, cluster_n=2)),
        ("v11", (20, 184, 328), dict(blk_m=24, blk_n=64, num_warpgroups=1, split_k=1)),
    ],
    ids=str,
)
def test_split_k_schedule_and_reduction_compute_the_product(rung, shape, knobs):
    results = [_emulate(rung, *shape, knobs, seed) for seed in (1, 2)]
    for D, writes, C, ref in results:
        M, N = ref.shape
        assert (writes[:M, :N] == 1).all(), "every element of D stored exactly once"
        np.testing.assert_array_equal(D, ref)  # small integers: exact in float64
        assert (C == 0).all(), "every counter back at zero for the next launch"
    assert np.array_equal(results[0][0], results[1][0])  # whoever arrives last


def test_transposed_stores_put_every_element_of_dt_where_d_wants_it():
    """stmatrix .trans of the fragment's 8x8 matrices (``layouts.stmatrix_trans_row``): row q of
    stored matrix (block, half) holds fragment column 8*block + q, its rows 16w + 8h .. +8."""
    from layouts import acc_fragment_coord, stmatrix_trans_row

    for blk_m in (8, 16, 24, 40):
        out = {}
        for warp in range(4):
            for block in range(blk_m // 8):
                for half in range(2):
                    for q in range(8):
                        row, col = stmatrix_trans_row(block, half, warp, q)
                        for r in range(8):
                            # element r of stored row q = X[r][q]: lane 4r + q//2, its value q%2 of
                            # register pair (4 block + 2 half, +1)
                            lane, reg = 4 * r + q // 2, 4 * block + 2 * half + q % 2
                            n, m = acc_fragment_coord(reg, warp, lane)  # the D^T element it holds
                            out[(row, col + r)] = (m, n)
        assert len(out) == 64 * blk_m
        assert all(where == what for where, what in out.items())  # D[m, n] lands at (m, n)


# -- the wave model ------------------------------------------------------------------------------
def test_wave_model_splits_k_when_the_tiles_cannot_fill_the_sms():
    from schedulers import wave_model

    # decode: 16 x 4096 x 4096 in 16 x 128 swap-AB tiles is 32 tiles on 132 SMs
    one = wave_model.plan(16, 4096, 4096, 16, 128, split_k=1, pipe_depth=6)
    four = wave_model.plan(16, 4096, 4096, 16, 128, split_k=4, pipe_depth=6)
    assert (one.units, four.units) == (32, 128) and one.waves == four.waves == 1
    assert one.bound == "sm_stream" and four.bound == "dram" and four.time_s < one.time_s
    best = wave_model.best_split_k(16, 4096, 4096, 16, 128, pipe_depth=6)
    assert best.split_k > 1 and best.bound == "dram" and best.gbps > 2000
    # many tiles already: split-K adds partial traffic and fill, and wins nothing
    assert wave_model.best_split_k(8192, 8192, 8192, 128, 256).split_k == 1
    assert wave_model.best_split_k(16, 128256, 4096, 16, 256, pipe_depth=6).split_k == 1


def test_wave_model_counts_waves_and_fill():
    from schedulers import wave_model

    p = wave_model.plan(978, 2640, 3336, 128, 256)
    assert (p.tiles, p.units, p.waves) == (8 * 11, 88, 1) and p.fill == pytest.approx(88 / 132)
    q = wave_model.plan(978, 2640, 3336, 128, 256, split_k=3)
    assert (q.units, q.waves, q.k_slices) == (264, 2, 18) and q.partial_bytes == 264 * 128 * 256 * 4 * 2
    assert "88 tiles -> 88 units on 132 SMs = 1 wave(s) (67% of the slots busy)" in p.why()
    assert wave_model.plan(1, 4096, 4096, 8, 128).dram_bytes == (4096 + 4096 * 4096 + 4096) * 2
    with pytest.raises(ValueError, match="split_k must be a positive int"):
        wave_model.plan(1, 4096, 4096, 8, 128, split_k=0)
    ranked = wave_model.rank(135, 3688, 6200, [(136, 128), (128, 128), (256, 128)])
    assert [p.time_s for p in ranked] == sorted(p.time_s for p in ranked)
    assert ranked[0].blk_m == 136  # one 136-row tile of swap AB pads 1 row, two 128-row tiles 121
    assert wave_model.swap_blk_m(1) == 8 and wave_model.swap_blk_m(33) == 40 and wave_model.swap_blk_m(300) == 64


# -- building (each module once) ---------------------------------------------------------------
CPU_BUILDS = {
    "v10_default": ("v10", (978, 2640, 3336), {}),
    "v10_1x2_bf16": ("v10", (1000, 3000, 520), dict(cluster_m=1, cluster_n=2, split_k=2, dtype="bfloat16")),
    "v10_dyn": ("v10", (135, 3688, 6200), dict(blk_n=128, cluster_m=1, split_k=4, dynamic_m=True)),
    "v11_m1": ("v11", (1, 4096, 4096), dict(blk_m=8, split_k=4)),
    "v11_m33_w1": ("v11", (33, 3000, 520), dict(blk_m=40, num_warpgroups=1, split_k=2, dtype="bfloat16")),
    "v11_nosplit": ("v11", (64, 28672, 4096), dict(blk_n=256, split_k=1, pipe_depth=4)),
    "v11_dyn": ("v11", (64, 4096, 4096), dict(dynamic_m=True, tile_order="grouped")),
    # B streamed past 128 rows of A, multicast over a 2x1 cluster, with the stream_b load hints
    "v11_stream": ("v11", (128, 4096, 4096), dict(blk_m=64, blk_n=64, num_warpgroups=1, split_k=2, cluster_m=2,
                                                   stream_b=True)),
}


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_sass_has_the_technique_and_no_spills(built, name):
    from gemm_ladder.sm90a import splitk

    b = built(*CPU_BUILDS[name])
    cfg, text, counts = b.module.cfg, b.sass, b.counts
    for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM", "SYNCS"):
        assert counts[op] > 0, (op, counts)
    res = b.resources
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.stack == 0 and res.local == 0, (counts, res)
    split = splitk.split_k(cfg) > 1
    if cfg.rung == "v11":  # M is wgmma's N; D^T leaves through transposed stmatrix
        assert re.search(rf"HGMMA\.64x{cfg.blk_m}x16\.F32", text), "swapped wgmma shape"
        assert re.search(r"STSM\.16\.MT88\.[24]", text) and not re.search(r"STSM\.16\.M88", text)
    else:
        assert re.search(rf"HGMMA\.64x{cfg.blk_n}x16\.F32", text)
        assert re.search(r"STSM\.16\.M88\.4", text)
    # split-K: the count (a GPU-scope atomic), the partials' 16-byte stores and L2 loads; none of
    # it without (the GPU-scope fence and L1 invalidate, MEMBAR.ALL.GPU and CCTL.IVALL, are
    # there either way: the cluster barrier's release and acquire)
    assert bool(re.search(r"ATOMG\.E\.ADD\.STRONG\.GPU", text)) == split
    assert re.search(r"MEMBAR\.ALL\.GPU", text) and re.search(r"CCTL\.IVALL", text)
    assert bool(re.search(r"LDG\.E\.128\.STRONG\.GPU", text)) == split
    assert bool(re.search(r"STG\.E\.128", text)) == split


def test_stream_b_puts_an_l2_policy_on_every_load(built):
    """stream_b: every TMA load, whole or a multicast part, carries an L2 cache policy (a
    ``desc[...]`` operand on UTMALDG in SASS); the loads of the other builds carry none."""
    for name, case in CPU_BUILDS.items():
        b = built(*case)
        mod = b.module
        loads = [line for line in b.sass.splitlines() if "UTMALDG" in line]
        hinted = [line for line in loads if "desc[" in line]
        if dict(mod.cfg.extra)["stream_b"]:
            assert loads and len(hinted) == len(loads) and any("MULTICAST" in line for line in hinted), name
        else:
            assert loads and not hinted, (name, hinted)


@pytest.mark.parametrize("rung, knobs", [("v9", dict(blk_m=64, blk_n=128, num_warpgroups=1, cluster_m=1)),
                                         ("v11", dict(blk_m=64, split_k=2, cluster_m=2))])
def test_stream_b_tensor_maps_fetch_256_bytes_per_l2_miss(rung, knobs):
    """The loads' tensor maps ask L2 for 256-byte fills with stream_b, TVM's 128 without; the
    store's map is the same either way."""
    from gemm_ladder import make_config
    from gemm_ladder.protocol.kernel_ir import load

    for stream, fill in ((True, 3), (False, 2)):
        maps = load(make_config(rung, 128, 4096, 4096, stream_b=stream, **knobs)).tensormaps
        assert {n: t.l2_promotion for n, t in maps.items()} == {"A_tensormap": fill, "B_tensormap": fill,
                                                                 "D_tensormap": 2}


def test_kernel_source_counts_once_per_consumer_and_sums_in_split_order(built):
    src = built(*CPU_BUILDS["v10_default"]).module.cuda_source()
    body = src[src.index("__global__ void"):]
    assert body.count("atom_acq_rel_gpu_global_add_u32(") == 1
    assert body.count("st_relaxed_gpu_global_u32(") == 1  # the counter's reset, by the last unit
    # the 2 slots of each of the consumer's 32 register quads, read back in split order
    assert body.count("ld_vec_global_cg_v4_f32(") == 2 * 128 * 256 // (2 * 128) // 4
    assert "bar_sync_count_sync" in body


def test_launch_records_the_workspace_and_the_runtime_m(built):
    from gemm_ladder.core.budget import limits_for

    for name, case in CPU_BUILDS.items():
        mod = built(*case).module
        launch = mod.extra["launch"]
        assert launch["persistent"] is True and launch["threads"] == 128 * (mod.cfg.num_warpgroups + 1)
        assert launch["smem_bytes"] <= limits_for("sm_90a").smem_per_block
        ws = launch["workspace"]
        assert ws["m_step"] == mod.cfg.blk_m * dict(mod.cfg.extra).get("cluster_m", 1) and ws["zeroed"]
        assert launch.get("dynamic_m", False) == mod.cfg.knobs()["dynamic_m"], name
    from tvm import tirx

    from gemm_ladder.rungs import kernel_of

    for name in ("v11_dyn", "v10_dyn", "v11_m1", "v11_nosplit"):
        # a runtime M is bound from A by the host code; M = 1 is written with a runtime M too (a
        # constant extent of 1 breaks tma_auto), which the host code checks against A's one row
        func = kernel_of(built(*CPU_BUILDS[name]).module.cfg)
        A, _, D, P = func.params[:4]
        if name == "v11_nosplit":
            assert int(A.shape[0]) == int(D.shape[0]) == 64
        else:
            assert isinstance(A.shape[0], tirx.Var) and A.shape[0].same_as(D.shape[0]), name
        assert (str(P.dtype), str(func.params[4].dtype)) == ("float32", "int32")  # partials, counters


# -- GPU tier ------------------------------------------------------------------------------------
V10_CASES = [
    Case("v10", 978, 2640, 3336),
    Case("v10", 978, 2640, 3336, dtype="bfloat16", split_k=3),
    Case("v10", 135, 3688, 6200, blk_n=128, cluster_m=1, split_k=4),
    Case("v10", 292, 5136, 3152, split_k=2),
    Case("v10", 1000, 3000, 520, cluster_m=1, cluster_n=2, split_k=3),
    Case("v10", 777, 1000, 200, blk_n=128, cluster_m=2, cluster_n=2, split_k=4),  # 4 slices: 1 each
    Case("v10", 64, 64, 8192, blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=1, split_k=16, pipe_depth=6),
    Case("v10", 4096, 4096, 4096, split_k=2),
    Case("v10", 1000, 3000, 520, split_k=1),
    Case("v10", 1000, 3000, 520, num_warpgroups=3, blk_m=192, blk_n=192, pipe_depth=3, split_k=2,
         tile_order="grouped", l2_group_size=2),
    # stream_k (on an H100's 132 SMs: 240 cluster tiles on 66 clusters, 384 tiles on 132, 256 on
    # 66 with 3 K slices a tile, 70 on 66, and 4096^3)
    Case("v10", 3000, 5000, 1000, split_k=1, stream_k=True),
    Case("v10", 2000, 3000, 776, blk_n=128, cluster_m=1, pipe_depth=5, split_k=1, stream_k=True,
         tile_order="grouped", l2_group_size=4, dtype="bfloat16"),
    Case("v10", 4000, 2000, 192, blk_n=128, cluster_m=1, cluster_n=2, epi_n=128, split_k=1, stream_k=True),
    Case("v10", 1792, 2560, 8192, split_k=1, stream_k=True),
    Case("v10", 4096, 4096, 4096, split_k=1, stream_k=True, dtype="bfloat16"),
    # 2x2 clusters (30 of them run at once on an H100, so 108 cluster tiles are 3.6 waves), and a
    # runtime M as the front door builds it (checked at M = 1 ... 8191: no cut, then a cut)
    Case("v10", 3000, 4600, 1000, split_k=1, stream_k=True, cluster_m=2, cluster_n=2),
    Case("v10", 5120, 5120, 1024, split_k=1, stream_k=True, dynamic_m=True),
]
V11_CASES = [
    Case("v11", 1, 4096, 4096, blk_m=8, split_k=4),
    Case("v11", 7, 4096, 4096, blk_m=8, split_k=4, dtype="bfloat16"),
    Case("v11", 16, 4096, 4096, blk_m=16, split_k=4),
    Case("v11", 64, 4096, 4096, split_k=4),
    Case("v11", 64, 4096, 14336, blk_n=256, split_k=3, pipe_depth=4),
    Case("v11", 16, 28672, 4096, blk_m=16, blk_n=256, split_k=1, pipe_depth=6),
    Case("v11", 7, 1000, 520, blk_m=8, split_k=3),
    Case("v11", 33, 3000, 200, blk_m=40, num_warpgroups=1, split_k=2),
    Case("v11", 100, 1000, 520, blk_m=64, split_k=2, cluster_m=2),
    Case("v11", 64, 3000, 520, cluster_n=2, split_k=2),
    Case("v11", 135, 3688, 6200, blk_m=136, split_k=4, pipe_depth=4),
    Case("v11", 20, 184, 328, blk_m=24, blk_n=64, num_warpgroups=1, split_k=1),
    # stream_b: L2 policies on every load (multicast parts too), 256-byte L2 fills
    Case("v11", 128, 4096, 4096, blk_m=64, blk_n=64, num_warpgroups=1, split_k=2, cluster_m=2, stream_b=True),
    Case("v11", 7, 1000, 520, blk_m=8, split_k=3, stream_b=True, dtype="bfloat16"),
]
DYNAMIC_CASES = [
    Case("v11", 64, 4096, 4096, dynamic_m=True, tile_order="grouped"),
    Case("v11", 16, 1000, 520, blk_m=16, dynamic_m=True, split_k=3, dtype="bfloat16"),
    Case("v10", 1000, 3000, 520, dynamic_m=True, split_k=2),
    Case("v10", 1000, 3000, 520, dynamic_m=True, split_k=2, cluster_m=2, stream_b=True),
]


def test_every_gpu_case_is_a_valid_config():
    for case in V10_CASES + V11_CASES + DYNAMIC_CASES:
        rung, M, N, K, knobs = case.build_args()
        gemm_ladder.make_config(rung, M, N, K, **knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", V10_CASES + V11_CASES + DYNAMIC_CASES, ids=str)
def test_v10_v11_are_correct_on_the_gpu(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result
