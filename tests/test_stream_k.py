"""v10's ``stream_k``: whole tiles for the full waves, the tail's K loops spread over every cluster.

CPU tier (CI): the knob's validation; the split of the grid into whole tiles and stream-K pieces
over many (tiles, clusters, K slices), against what ``streamk`` promises (every slice once, at
most two pieces a tile from neighbouring clusters, whole tiles and heads from slice 0 first);
the meeting of two pieces played out in numpy in random interleavings of the clusters (D equal
to A.B^T, written once, every counter back at zero, every slot and counter inside the workspace
the runtime allocates); the workspace sizes of kernel and runtime from one record; one build,
its kernel source and SASS (the acquire read, the one atomic and reset, the partner's L2 loads,
no spills). The GPU cases live with v10's in ``test_sm90a_small_m``.
"""

import itertools
import re

import numpy as np
import pytest

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.sm90a import streamk


@pytest.mark.parametrize(
    "knobs, words",
    [
        (dict(stream_k=1), ["stream_k=1", "not a bool"]),
        (dict(stream_k="on"), ["stream_k='on'", "a string, not a bool"]),
        (dict(stream_k=True, split_k=2), ["split_k=2", "use split_k=1 with stream_k"]),
    ],
)
def test_refuses_bad_stream_k_with_a_fix(knobs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config("v10", 4096, 4096, 4096, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_stream_k_is_a_v10_knob_only():
    assert gemm_ladder.make_config("v10", 4096, 4096, 4096, split_k=1, stream_k=True).knobs()["stream_k"] is True
    for rung in ("v9", "v11"):
        with pytest.raises(ConfigError, match="no knob stream_k"):
            gemm_ladder.make_config(rung, 4096, 4096, 4096, stream_k=True)


def _cover(tiles, clusters, k_tiles):
    """Every cluster's pieces in its order: {cluster: [(stream-K tile, k0, nk), ...]}."""
    dp, sk = streamk.split(tiles, clusters)
    out = {}
    for g in range(clusters):
        first, end = streamk.cluster_range(g, sk, clusters, k_tiles)
        out[g] = [streamk.piece(p, first, end, k_tiles) for p in range(streamk.pieces(first, end, k_tiles))]
        assert sum(nk for _, _, nk in out[g]) == end - first
    return dp, sk, out


@pytest.mark.parametrize("clusters", [1, 2, 3, 33, 66, 132])
def test_the_split_covers_every_slice_once_in_at_most_two_pieces(clusters):
    for tiles, k_tiles in itertools.product([1, 5, 65, 66, 67, 131, 132, 133, 256, 384, 1024], [1, 2, 3, 24, 64]):
        dp, sk, pieces = _cover(tiles, clusters, k_tiles)
        full, rem = divmod(tiles, clusters)
        # whole waves of whole tiles; the partial wave's tiles by slices when they are at least
        # half a wave, else with the whole wave before them (none under one wave); all whole
        # without a partial wave
        assert dp + sk == tiles and (dp % clusters == 0 or sk == 0)
        assert sk == (0 if not rem else rem if 2 * rem >= clusters else rem + clusters if full else 0)
        most = 3 if sk == rem else 2  # pieces a tile: half a tile or more a cluster, or a tile or more
        owner = {}
        for g, ps in pieces.items():
            kinds = []
            for j, k0, nk in ps:
                assert 0 <= j < sk and nk >= 1 and 0 <= k0 and k0 + nk <= k_tiles
                for k in range(k0, k0 + nk):
                    assert (j, k) not in owner, "a slice twice"
                    owner[j, k] = g
                kinds.append("whole" if nk == k_tiles else "head" if k0 == 0 else "tail")
            # whole tiles, then the head, then the tail: heads start at slice 0 with the whole tiles
            assert kinds == sorted(kinds, key=["whole", "head", "tail"].index), kinds
            assert kinds.count("head") <= 1 and kinds.count("tail") <= 1
        assert len(owner) == sk * k_tiles, "a slice missing"
        for j in range(sk):
            gs = [owner[j, k] for k in range(k_tiles)]
            first = streamk.cluster_of(j * k_tiles, sk, clusters, k_tiles)
            last = streamk.cluster_of((j + 1) * k_tiles - 1, sk, clusters, k_tiles)
            # neighbouring clusters in K order, as cluster_of finds them
            assert gs == sorted(gs) and sorted(set(gs)) == list(range(first, last + 1)), (tiles, clusters, j, gs)
            assert last - first + 1 <= most, (tiles, clusters, k_tiles, j, gs)


def _emulate(M, N, K, knobs, clusters, seed):
    """Every piece of every cluster, the clusters interleaved at random (each in its own order),
    through the workspace as ``streamk.meet`` and ``add_partner`` use it."""
    from schedulers.orders import tile_order

    from tests.test_sm90a_small_m import _consumer_coords, _operands

    cfg = gemm_ladder.make_config("v10", M, N, K, split_k=1, stream_k=True, **knobs)
    bm, bn, W, kt = cfg.blk_m, cfg.blk_n, cfg.num_warpgroups, cfg.k_tiles
    cm, cn = dict(cfg.extra)["cluster_m"], dict(cfg.extra)["cluster_n"]
    cs = cm * cn
    rows, cols = -(-M // (bm * cm)), -(-cfg.grid_mn[1] // cn)
    order = tile_order(cfg.tile_order, rows, cols, cfg.l2_group_size)
    ws = streamk.workspace(cfg, W)
    P = np.full(clusters * cs * ws["float32_per_cta"], np.nan)
    C = np.zeros(clusters * cs * ws["int32_per_cta"], dtype=np.int64)
    A, B, Ap, Bp = _operands(M, N, K, rows * cm * bm, cols * cn * bn, kt, seed)
    rng = np.random.default_rng(seed)  # the clusters' interleaving
    D = np.full((rows * cm * bm, cols * cn * bn), np.nan)
    writes = np.zeros_like(D, dtype=np.int64)
    coords = [_consumer_coords(False, bm, bn, W, c) for c in range(W)]
    acc = coords[0][0].shape[1]

    def store(m_cta, n_cta, c, dreg):
        r, q = coords[c]
        D[m_cta * bm + r, n_cta * bn + q] = dreg
        np.add.at(writes, (m_cta * bm + r, n_cta * bn + q), 1)

    def offsets(slot, j):
        return np.array([streamk.slot_offset(slot, j, t, acc) for t in range(128)])[:, None] + np.arange(4)

    dp, sk, pieces = _cover(len(order), clusters, kt)
    work = {g: [(order[t], 0, kt, None) for t in range(g, dp, clusters)] + [(order[dp + j], k0, nk, True)
                                                                             for j, k0, nk in pieces[g]]
            for g in range(clusters)}
    sk_index = {g: [None] * (len(work[g]) - len(pieces[g])) + [j for j, _, _ in pieces[g]] for g in range(clusters)}
    queue = [g for g in range(clusters) for _ in work[g]]
    rng.shuffle(queue)
    nxt = dict.fromkeys(range(clusters), 0)
    for g in queue:  # cluster g runs its next piece
        (m_idx, n_idx), k0, nk, is_sk = work[g][nxt[g]]
        nxt[g] += 1
        for rank in range(cs):
            m_cta, n_cta = m_idx * cm + rank % cm, n_idx * cn + rank // cm
            ks = slice(k0 * 64, (k0 + nk) * 64)
            part = Ap[m_cta * bm:(m_cta + 1) * bm, ks] @ Bp[n_cta * bn:(n_cta + 1) * bn, ks].T
            for c in range(W):
                dreg = part[coords[c]]
                if nk == kt:
                    store(m_cta, n_cta, c, dreg)
                    continue
                j = sk_index[g][nxt[g] - 1]
                g_h = streamk.cluster_of(j * kt, sk, clusters, kt)
                n = streamk.cluster_of((j + 1) * kt - 1, sk, clusters, kt) - g_h + 1
                second = [int(streamk.cluster_range(x, sk, clusters, kt)[0] < j * kt) for x in range(g_h, g_h + n)]
                slots = [streamk.slot(g_h + i, rank, c, second[i], cs, W) for i in range(n)]
                cnt = streamk.counter(g_h, rank, c, cs, W)
                last = C[cnt] == n - 1  # meet: every other piece counted
                if not last:
                    for q in range(acc // 4):
                        P[offsets(slots[g - g_h], q)] = dreg[:, 4 * q:4 * q + 4]
                    C[cnt] += 1
                    last = C[cnt] == n
                if last:  # sum in K order, this piece's own registers at its place
                    total = None
                    for i in range(n):
                        v = dreg if i == g - g_h else np.concatenate(
                            [P[offsets(slots[i], q)] for q in range(acc // 4)], axis=1)
                        total = v.copy() if total is None else total + v
                    C[cnt] = 0
                    store(m_cta, n_cta, c, total)
    return D[:M, :N], writes[:M, :N], C, A @ B.T, sk


@pytest.mark.parametrize(
    "shape, knobs, clusters",
    [
        # 3 x 5 cluster tiles (2x1) on 4 clusters: 8 whole, 7 by slices (9 a tile, K partial)
        ((300, 600, 520), dict(blk_m=64, blk_n=128, num_warpgroups=1, cluster_m=2), 4),
        # 2 x 2 cluster tiles (1x2, the last CTA column past N) on 3 clusters: all 4 by slices
        ((200, 296, 328), dict(blk_m=128, blk_n=128, cluster_m=1, cluster_n=2, epi_n=64), 3),
        # 3 x 9 tiles on 4 clusters: 20 whole, 7 by slices of 4
        ((130, 520, 200), dict(blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=1, tile_order="grouped",
                               l2_group_size=2), 4),
        # 1 x 5 tiles on 8 clusters: under one wave, all 5 by slices (ranges of 5 of a tile's 9 slices)
        ((64, 320, 520), dict(blk_m=64, blk_n=64, num_warpgroups=1, cluster_m=1), 8),
    ],
    ids=str,
)
def test_two_pieces_meet_in_any_order_and_compute_the_product(shape, knobs, clusters):
    for seed in (1, 2, 3):
        D, writes, C, ref, sk = _emulate(*shape, knobs, clusters, seed)
        assert sk > 0, "the case must have stream-K tiles"
        assert (writes == 1).all(), "every element of D stored exactly once"
        np.testing.assert_array_equal(D, ref)  # small integers: exact in float64
        assert (C == 0).all(), "every counter back at zero for the next launch"


def test_workspace_grows_with_the_ctas_and_agrees_between_kernel_and_runtime():
    from gemm_ladder.rungs import rung_module
    from gemm_ladder.serve.runtime import GemmModule
    from gemm_ladder.sm90a import splitk

    cfg = gemm_ladder.make_config("v10", 4096, 4096, 4096, split_k=1, stream_k=True)
    launch = rung_module("v10").launch(cfg)
    ws = launch["workspace"]
    mod = GemmModule("x.so", {"rung": "v10", "shape": [4096] * 3, "dtype": "float16", "arch": "sm_90a",
                              "knobs": cfg.knobs(), "tvm_version": "", "launch": launch}, None)
    for ctas in (2, 66, 132):
        want = {k: splitk.workspace_elems(ws, 4096, k, ctas) for k in ("float32", "int32")}
        # two slots of every consumer's accumulators per CTA, a counter per consumer
        assert mod.workspace_elems(4096, ctas) == want == {"float32": 2 * ctas * 128 * 256, "int32": 2 * ctas}
    with pytest.raises(ValueError, match="pass num_ctas"):
        mod.workspace_elems(4096)
    # without stream_k the workspace does not depend on the CTAs
    plain = rung_module("v10").launch(gemm_ladder.make_config("v10", 4096, 4096, 4096, split_k=1))["workspace"]
    assert splitk.workspace_elems(plain, 4096, "float32") == 1


STREAM_K_BUILD = ("v10", (3000, 5000, 1000), dict(split_k=1, stream_k=True, dtype="bfloat16"))


def test_kernel_meets_once_per_piece_and_sums_up_to_three_slots(built):
    src = built(*STREAM_K_BUILD).module.cuda_source()
    body = src[src.index("__global__ void"):]
    assert body.count("ld_acquire_gpu_global_u32(") == 1  # the partner counted already?
    assert body.count("atom_acq_rel_gpu_global_add_u32(") == 1
    assert body.count("st_relaxed_gpu_global_u32(") == 1  # the reset, by the last piece
    # a 16-byte L2 load per register quad (128 accumulators a consumer) and other piece, in one
    # straight-line sum per (pieces, place of this one): 2 pieces (2 places, 1 load a quad) and 3
    # (3 places, 2 loads a quad)
    assert body.count("ld_vec_global_cg_v4_f32(") == (2 * 1 + 3 * 2) * 128 // 4

def _inner_loops(text, most=300):
    """The instruction lists of the SASS's loops (a backward branch and what it jumps over) of at
    most ``most`` instructions: the K loops; the longer spans are the barrier waits' retry paths."""
    ins = [(int(a, 16), op.strip()) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = []
    for pc, op in ins:
        m = re.search(r"\bBRA(?:\.[A-Z.]+)?\s+0x([0-9a-f]+)", op)
        if m and int(m.group(1), 16) < pc:
            body = [o for p, o in ins if int(m.group(1), 16) <= p <= pc]
            if len(body) <= most:
                loops.append(body)
    return loops


def test_sass_keeps_the_k_loops_free_of_spills(built):
    """The producer's 40 registers hold its stream-K state only in part: ptxas spills a few
    scalars around each piece (a handful of local loads and stores, once a piece), never in a K
    loop of loads or wgmmas; the consumers spill nothing."""
    b = built(*STREAM_K_BUILD)
    text, counts = b.sass, b.counts
    assert counts["LDL"] + counts["STL"] <= 16, counts
    loops = _inner_loops(text)
    loads = [b for b in loops if any("UTMALDG" in o for o in b)]
    mmas = [b for b in loops if any("HGMMA" in o for o in b)]
    assert loads and mmas, "no K loop found"
    for body in loads + mmas:
        assert not any(re.search(r"(^|\s)(LDL|STL)[.\s]", o) for o in body), body
    assert re.search(r"ATOMG\.E\.ADD\.STRONG\.GPU", text)
    assert re.search(r"LDG\.E\.128\.STRONG\.GPU", text) and re.search(r"STG\.E\.128", text)
    assert re.search(r"HGMMA\.64x256x16\.F32\.BF16", text)


def test_cli_takes_switches():
    from gemm_ladder.cli import parse_knob

    assert parse_knob("stream_k=true") == ("stream_k", True)
    assert parse_knob("stream_b=False") == ("stream_b", False)
    assert parse_knob("pipe_depth=4") == ("pipe_depth", 4)
    assert parse_knob("tile_order=snake") == ("tile_order", "snake")
