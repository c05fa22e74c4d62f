"""The production Hopper GEMM: one warp-specialized kernel built from parts; v9, v10 and v11 are
presets of it.

In the spirit of ThunderKittens' ``lcf`` template: the template owns the roles, the ring, the
loop over work units and the barriers; the parts do one job each, and a :class:`Preset` names
which parts a rung combines.

    ==========  =======================================  =====================================
    part        module                                   job
    ==========  =======================================  =====================================
    ring        ``ring.Ring``                            stages, full/empty barriers, phases
    producer    ``producer.Producer``                    TMA loads, multicast, L2 hints
    consumers   ``mainloop.Consumer``                    the wgmma K loop (``issue_under``)
    epilogue    ``epilogue.ChunkedEpilogue`` /           accumulators -> shared -> TMA stores
                ``epilogue.TransposedEpilogue``
    schedule    ``schedule.Schedule``, ``splitk``,       which work units a cluster runs:
                ``streamk``, ``narrowtail``              whole tiles, split-K units, stream-K
                                                         pieces, narrow tail tiles
    ==========  =======================================  =====================================

    ======  ==============  ===========  ==========  ==========================================
    preset  operands        schedule     epilogue    options (knobs)
    ======  ==============  ===========  ==========  ==========================================
    v9      A rows x B      persistent   chunked     epi_n, tail_n, epi_under, k_zigzag,
                                                     stream_b, dynamic_m
    v10     A rows x B      split-K      chunked     split_k, stream_k, epi_n, stream_b,
                                                     dynamic_m
    v11     swap AB         split-K      transposed  split_k, stream_b, dynamic_m
    ======  ==============  ===========  ==========  ==========================================

Every preset also takes ``pdl``: launched as a programmatic dependent of the kernel before it, the set-up
(barriers, the cluster's meeting) runs under that kernel's tail and ``griddepcontrol.wait`` comes before any
load or store (``common.wait_for_previous_grid``). With ``pdl``, the optional ``l2_warm`` asks L2 for the
weight's first slices of the CTA's first unit before that wait (``producer.warm_l2``); it lost 2% in geomean
where the policy launches with pdl, so the policy leaves it off.

Roles: warpgroup 0 is the producer (one thread issues the CTA's TMA parts), warpgroups 1..W the
consumers, each owning its rows of every tile and running its own epilogue. The barriers are
the ring's (``tma2mma``, ``mma2tma``), one named barrier per consumer (the epilogue's), and,
with a workspace, a counter in global memory per tile part (``splitk``, ``streamk``); the
presets' docstrings draw them.

The kernel's operands come from one list (:func:`operands`: A, B, D, a fused epilogue's
tensors, then the workspace of a split-K preset), which picks the prim_func's form (the end of
:func:`kernel`) and shapes its buffers; the body is one. What the epilogue does to each fp32
accumulator before it is rounded to D's type is the preset's ``epilogue_op``
(``epilogue.EpilogueOp``: nothing), or the one the operand spec asks for (``epilogue.op_of``: a
per-column bias and an activation after it; v9's and v10's chunked epilogue, where v10's last unit of a
tile runs it on the sum of the partials, and v11's transposed one, at each value's column of D, a row of
its D^T fragment; an fp8 spec's scales multiply the sums before it,
``fp8.scale_sums``, and its ``promote`` knob gives the consumers an fp32 total, ``mainloop.Consumer``,
into which block scales, ``fp8.BlockScales``, are applied as each K block is added;
a runtime scale alpha before the bias), then a residual ``+ beta . C`` (``epilogue.ResidualRead``:
C's chunk loaded by TMA into the staging buffer it is about to be stored from, which makes ``out=C``
safe; with v9's ``c_prefetch`` the tile's first chunk before its K loop, the others a chunk
ahead; v10 loads it at each chunk, as only the last unit of a tile stores it, and v11 builds none); the spec's epilogue operands (tensors and fp32 scalars) are parameters after ``num_ctas``
(``epilogue.kernel_operands``, in the form here), the runtime's argument order.

The running counts that index the ring (``load_it``, ``it``) and the staging buffers
(``epi_it``) are never reset; only the ring turns them into a stage and a phase.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tvm.script import tirx as T
from tvm.backend.cuda.lang.warp_role import WarpgroupRole

from ..sync.classes import COUNTED_BRANCHES_ATTR, NAMED_BARRIERS_ATTR, MBarrier, TMABar
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from . import common, epilogue, fp8, kconsumers, narrowtail, producer, splitk, streamk
from .common import HopperPlan, SwapPlan
from .epilogue import NO_OP, ChunkedEpilogue, EpilogueOp, TransposedEpilogue
from .mainloop import Consumer
from .producer import Producer
from .ring import Ring
from .schedule import Schedule


# -- presets and their knobs ---------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A combination of parts: the operands' roles, the schedule of work units, the epilogue."""

    name: str
    swap_ab: bool = False  # B's rows fill wgmma's 64-row slot, A's rows are its N (small M)
    split_k: bool = False  # work units are split-K units (and stream-K pieces) over a workspace
    epilogue: str = "chunked"  # "chunked" (epi_n columns at a time) or "transposed" (D^T as D)
    epilogue_op: EpilogueOp = NO_OP  # the chunked epilogue's work on each accumulator before rounding

    def plan(self, cfg: GemmConfig) -> HopperPlan:
        return SwapPlan(cfg) if self.swap_ab else HopperPlan(cfg)

    def cluster_grid(self, cfg: GemmConfig, M=None) -> tuple:
        """The grid of cluster tiles the scheduler walks (for ``M``, default cfg.M; a runtime M
        gives a runtime number of rows)."""
        if self.split_k:
            return splitk.cluster_grid(cfg, M)
        cm, cn = common.cluster_shape(cfg)
        M = cfg.M if M is None else M
        return common.tiles_over(M, cfg.blk_m * cm), -(-cfg.grid_mn[1] // cn)


V9 = Preset("v9")
V10 = Preset("v10", split_k=True)
V11 = Preset("v11", swap_ab=True, split_k=True, epilogue="transposed")


@dataclass(frozen=True)
class ProductionKnobs:
    """The knobs every preset with the chunked epilogue takes (v9 and v10 add their own), with
    their defaults: a 128x256 tile over two consumers, four stages, 2x1 clusters."""

    blk_m: int = 128
    blk_n: int = 256
    blk_k: int = 64
    num_warpgroups: int = 2  # consumer warpgroups
    pipe_depth: int = 4
    l2_group_size: int = 8
    tile_order: str = common.DEFAULT_TILE_ORDER
    cluster_m: int = 2
    cluster_n: int = 1
    epi_n: int = 64  # columns of one epilogue chunk
    dynamic_m: bool = False  # M a runtime value: one module for every M
    stream_b: bool = False  # L2 hints: B read once, A kept
    pdl: bool = False  # programmatic dependent launch: the set-up under the previous kernel's tail (common.pdl)


def knob_defaults(knobs_class) -> dict:
    """A preset's ``KNOBS`` (the defaults the one validator, ``rungs.make_config``, fills in and
    types from) from its frozen knob dataclass: names, types and defaults declared once."""
    return {f.name: f.default for f in dataclasses.fields(knobs_class)}


# -- the operands: one list, the prim_func's signature and buffer shapes ---------------------------
@dataclass(frozen=True)
class Operand:
    name: str  # the prim_func's parameter
    shape: tuple
    dtype: str


def workspace(cfg: GemmConfig, preset: Preset) -> dict | None:
    """A split-K preset's workspace (``launch["workspace"]``): split-K's slots and counters per
    row of tiles, stream-K's per CTA of the launch (v10 only)."""
    if not preset.split_k:
        return None
    if preset.swap_ab:
        return splitk.tile_workspace(cfg)
    return {**splitk.tile_workspace(cfg), **streamk.workspace(cfg, cfg.num_warpgroups)}


def operands(cfg: GemmConfig, preset: Preset, M, num_ctas) -> list[Operand]:
    """The kernel's tensors in the order of its parameters (``num_ctas`` follows them); ``M``:
    the kernel's M (``common.m_extent``: an int, or the one runtime variable every extent uses)."""
    N, K = cfg.N, cfg.K
    plan = preset.plan(cfg)  # A's and B's types: D's, or fp8 (sm90a/fp8.py)
    # an MN-major operand is stored [K, M] (or [K, N]) row-major (the operand spec's a_major / b_major)
    a_shape = (M, K) if plan.a_major == "K" else (K, M)
    b_shape = (N, K) if plan.b_major == "K" else (K, N)
    d_cols = N // 2 if spec_of(cfg).gated else N  # a gated B (SwiGLU): N is both halves, D one
    ops = [Operand("a", a_shape, plan.a_dtype), Operand("b", b_shape, plan.b_dtype),
           Operand("d", (M, d_cols), spec_of(cfg).d)]
    ops += preset.epilogue_op.operands(cfg, M)  # a fused epilogue's tensors (a bias vector, ...)
    ws = workspace(cfg, preset)
    if ws is not None:
        ops += [Operand("p", (splitk.workspace_elems(ws, M, "float32", num_ctas),), "float32"),  # partial slots
                Operand("cnt", (splitk.workspace_elems(ws, M, "int32", num_ctas),), "int32")]  # tile counters
    return ops


def launch(cfg: GemmConfig, preset: Preset) -> dict:
    """Persistent clusters, as many as the SMs hold (the runtime rounds num_ctas), a producer
    warpgroup beside the consumers, and a split-K preset's workspace."""
    if preset.split_k:
        info = splitk.launch(cfg)
        return {**info, "workspace": workspace(cfg, preset)}
    cm, cn = common.cluster_shape(cfg)
    info = common.launch_info(cfg, cfg.pipe_depth, persistent=True, cluster=cm * cn)
    if fp8.staged(cfg):  # the block scales' rows beside the ring (fp8.scale_smem_bytes)
        info = {**info, "smem_bytes": info["smem_bytes"] + fp8.scale_smem_bytes(cfg)}
    # k_consumers: a second consumer on each consumer's rows, and its sums' hand-over (kconsumers.py)
    lanes = kconsumers.lanes(cfg)
    info = {**info, "smem_bytes": info["smem_bytes"] + kconsumers.smem_bytes_more(cfg),
            "threads": info["threads"] * lanes + common.THREADS_PER_WG, "cluster_shape": [cm, cn]}
    return common.dynamic_launch(cfg, info)


# -- the template ----------------------------------------------------------------------------------
def _store_sums(epi, sums, scales, m0, n0, chunk_it) -> None:
    """A tile's sums through the epilogue at (``m0``, ``n0``); fp8's times their scales first
    (``scales``: an ``fp8.SumScales``, or None)."""
    if scales is not None:
        scales.apply(sums, m0, n0)
    epi.store_tile(sums, m0, n0, chunk_it)


def bias_stash_regs(cfg: GemmConfig, preset: Preset) -> int:
    """Registers a consumer thread of ``preset``'s kernel for ``cfg`` gives to its bias stash
    (:class:`epilogue.BiasStash`, :func:`epilogue.bias_stash_regs`), 0 where it has none."""
    under = not preset.split_k and common.epi_under(cfg)
    return epilogue.bias_stash_regs(cfg, preset.plan(cfg), preset.epilogue == "transposed", under)


def kernel(cfg: GemmConfig, preset: Preset):
    """The preset's kernel for ``cfg`` (validated by ``rungs.make_config``), a ``T.prim_func``."""
    plan = preset.plan(cfg)
    M, N, K = common.m_extent(cfg), cfg.N, cfg.K  # M: an int or runtime
    BLK_N = cfg.blk_n
    cluster_m, cluster_n = common.cluster_shape(cfg)
    cluster_size = cluster_m * cluster_n
    m_tiles, n_tiles = preset.cluster_grid(cfg, M)  # in cluster tiles
    n_cta_tiles = n_tiles * cluster_n  # tile columns of the workspace
    units_per_tile = splitk.split_k(cfg) if preset.split_k else 1  # split-K units of a tile
    stages = cfg.pipe_depth
    slices_per_tile = cfg.k_tiles
    consumers = cfg.num_warpgroups  # consumer warpgroups that own rows of the tile
    lanes = kconsumers.lanes(cfg)  # consumers on each owner's rows, taking alternate K slices (k_consumers)
    warpgroups = consumers * lanes  # consumer warpgroups of the CTA
    # every consumer warp of every CTA of the cluster that reads a stage (one lane's) frees it
    releases = 4 * consumers * cluster_size
    regs = common.role_registers(warpgroups)
    acc_regs = plan.acc_regs
    rows_per_wg = plan.rows_per_wg  # of a_smem (A, or B under swap AB)
    A_layout, B_layout = plan.ab_layouts(stages)
    if preset.epilogue == "transposed":
        staging_shape = (consumers, plan.m_cols, rows_per_wg)  # one D band per consumer (split_m: its rows of M)
    else:
        # epi_n columns of 16-bit D a chunk; of a float32 D half as many (the same staging bytes)
        chunk_cols = dict(cfg.extra)["epi_n"] * 2 // epilogue.d_bytes(cfg)
        buffers = 2 if chunk_cols < BLK_N else 1  # staging buffers per consumer
        staging_shape = (consumers * buffers, rows_per_wg, chunk_cols)
    d_dtype = spec_of(cfg).d  # the staging buffers hold D's values
    E_layout = epilogue.staging_layout(cfg, *staging_shape, dtype=d_dtype)
    has_workspace = preset.split_k
    atomic_sum = preset.split_k and splitk.atomic(cfg)  # a tile's units add into one slot (reduce="atomic")
    stream_k = preset.split_k and not preset.swap_ab and streamk.enabled(cfg)  # the tail's K loops spread evenly
    tail_n = 0 if preset.split_k else narrowtail.tail_n(cfg)  # the partial wave's tiles cut tail_n wide (0: not)
    narrow_on = tail_n > 0
    narrow_per_row = narrowtail.per_row(N, cluster_n, tail_n) if narrow_on else 0  # narrow cluster tiles a row
    narrow_plan = narrowtail.NarrowPlan(cfg, width=tail_n) if narrow_on else None
    narrow_chunks, narrow_rest = divmod(tail_n, chunk_cols) if narrow_on else (0, 0)  # staged chunks, the columns after
    under = not preset.split_k and common.epi_under(cfg)  # a tile's chunks stored under the next tile's wgmmas
    zigzag = not preset.split_k and bool(dict(cfg.extra).get("k_zigzag", False))  # odd tiles load K backwards
    scaled = fp8.enabled(cfg)  # fp8: the sums scaled before the epilogue (sm90a/fp8.py)
    promote = fp8.promote(cfg)  # fp8: K slices between promotions into fp32 sums (0: none)
    at_promotion = fp8.at_promotion(cfg)  # fp8 block scales: applied as each K block is promoted
    total_regs = acc_regs if promote else 1  # the promoted sums (one unused register without)
    sums_under = under and promote > 0  # fp8: the previous tile's pairs stored under the next one's first group
    overlap = fp8.overlap(cfg)  # fp8: promotion groups between drains, in two accumulator sets (0: one set)
    halves = fp8.halves(cfg)  # fp8: each group's wgmmas as two half-width groups into one half-size set
    if halves and (preset.swap_ab or preset.split_k or type(plan) is not HopperPlan):
        raise ConfigError(f"halves=True on {preset.name}: the halves are built for the whole-tile K loop of "
                          "v9's own plan (no swap AB, no split K); use halves=False")
    scale_regs = fp8.scale_regs(plan) if scaled else 1
    stage_scales = fp8.staged(cfg)  # fp8 block scales: staged in the ring by the producer's TMA, read from there
    residual = bool(spec_of(cfg).residual)  # + beta . C, C loaded into the staging buffers
    c_prefetch = epilogue.c_prefetch(cfg)  # C's first chunk loaded under the tile's K loop
    gated = spec_of(cfg).gated  # B = cat([W_gate, W_up]): D = act(gate) * up, N / 2 columns
    pdl = common.pdl(cfg)  # launched as a programmatic dependent of the kernel before it (common.with_pdl)
    warm = common.l2_warm(cfg)  # with pdl: B's first slices asked of L2 before the wait (producer.warm_l2)
    transposed = preset.epilogue == "transposed"
    stash_regs = bias_stash_regs(cfg, preset)  # the tile's bias loaded into registers before its K loop
    stashing = stash_regs > 0

    def backwards(load_it):
        # k_zigzag: this CTA's odd tiles start on the K panels its even tiles ended on
        return (load_it // slices_per_tile) % 2 == 1 if zigzag else False

    def cut_rows(num_clusters):
        return narrowtail.rows(m_tiles, n_tiles, narrow_per_row, num_clusters) if narrow_on else 0

    def whole_tiles_left(ts, dp_tiles):
        # stream_k: the scheduler hands out the whole tiles only, the stream-K ones come after
        return T.And(ts.valid(), ts.linear_idx < dp_tiles) if stream_k else ts.valid()

    def unit(n_idx):
        # column n * units_per_tile + s of the scheduler's grid: unit s of tile column n, K
        # slices [k0, k0 + nk); whole tiles without split-K
        if not preset.split_k:
            return n_idx, 0, 0, slices_per_tile
        n_col, split = splitk.unit(n_idx, units_per_tile)
        k0, nk = splitk.k_slices(split, units_per_tile, slices_per_tile)
        return n_col, split, k0, nk

    # fmt: off
    @T.inline
    def body(g, num_ctas):
        A = T.meta_var(g["a"])
        B = T.meta_var(g["b"])
        D = T.meta_var(g["d"])
        epi_op = T.meta_var(epilogue.op_of(cfg, preset.epilogue_op).bind(g))  # the spec's (a bias), with its tensors
        cta = T.cta_id([num_ctas])  # whole clusters: the runtime rounds the SM count down
        rank = T.cta_id_in_cluster([cluster_size])
        clu = T.meta_var(cta // cluster_size)
        num_clusters = T.meta_var(num_ctas // cluster_size)
        # tail_n: how many of the last rows of tiles are cut narrow, for this launch's clusters
        narrow_rows = T.meta_var(cut_rows(num_clusters))
        # stream_k: the partial wave's tiles (with the wave before them when they are fewer than
        # half a wave; none if the waves are whole) go by K slices, [sk_first, sk_end) to this cluster
        dp_tiles, sk_tiles = T.meta_var(streamk.split(m_tiles * n_tiles, num_clusters))
        sk_first, sk_end = T.meta_var(streamk.cluster_range(clu, sk_tiles, num_clusters, slices_per_tile))
        wg_id = T.warpgroup_id([warpgroups + 1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        tma2mma = TMABar(pool, stages)
        mma2tma = MBarrier(pool, stages)
        ring = Ring(tma2mma, mma2tma, cluster_size=cluster_size)  # the stages, their barriers and phases
        # per consumer: units of the tile counted before this one (split-K, stream-K)
        flag = T.meta_var(pool.alloc((consumers,), "int32") if has_workspace else None)
        # a residual C: one TMA load of C's chunk in flight per staging buffer (epilogue.ResidualRead)
        if residual:
            c_ready = TMABar(pool, consumers * buffers)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc(plan.a_shape(stages), plan.a_dtype, layout=A_layout)  # [stages, BLK_M, BLK_K] or MN-major
        Bsmem = pool.alloc(plan.b_shape(stages), plan.b_dtype, layout=B_layout)
        Esmem = pool.alloc(staging_shape, d_dtype, layout=E_layout)
        if stage_scales:
            # fp8 block scales staged with each ring stage by the producer (fp8.StagedScales)
            Ssmem = pool.alloc((stages, fp8.scale_row(cfg)), "float32", align=128)
        if lanes > 1:
            # k_consumers: lane 1's sums, handed to lane 0 at a tile's end (kconsumers.HandOver)
            Rsmem = pool.alloc(kconsumers.buffer_shape(cfg), "float32", align=128)
        pool.commit()
        ring.init(releases=releases)
        if residual:
            c_ready.init(1)  # the storing thread's arrive.expect_tx, then C's bytes
        # make the barrier inits visible to the async proxy and to the peers before any TMA
        # completes or any peer arrives on them
        T.ptx.fence.mbarrier_init.release.cluster()
        common.cluster_sync()
        rank_m = T.meta_var(rank % cluster_m)
        rank_n = T.meta_var(rank // cluster_m)
        sched = T.meta_var(Schedule(cfg=cfg, m_tiles=m_tiles, n_tiles=n_tiles, cluster_m=cluster_m, cluster_n=cluster_n,
                                    rank_m=rank_m, rank_n=rank_n, units_per_tile=units_per_tile))
        if pdl:
            if warm:
                # l2_warm: the weight's first slices of this CTA's first unit asked of L2 meanwhile (producer.warm_l2)
                if T.And(wg_id == common.PRODUCER_WG, warp_id == 0):
                    ts_warm = sched.tiles("ts_warm", num_clusters, narrow_rows if narrow_on else 0)
                    ts_warm.init(clu)
                    if whole_tiles_left(ts_warm, dp_tiles):
                        n_warm, _, k0_warm, nk_warm = T.meta_var(unit(ts_warm.n_idx))
                        producer.warm_l2(plan, B, sched.n_start(n_warm), rank_m, cluster_m, k0_warm, nk_warm, lane_id)
            # the set-up above overlaps the previous kernel's last CTAs; global memory only after this
            common.wait_for_previous_grid()
            common.launch_next_grid()
        if stage_scales:
            # the scale tensors as rows of floats, the same memory (fp8.StagedScales: 1-D tensor maps)
            scale_a_flat = T.decl_buffer(fp8.flat_shape(g["scale_a"]), "float32", data=g["scale_a"].data)
            scale_b_flat = T.decl_buffer(fp8.flat_shape(g["scale_b"]), "float32", data=g["scale_b"].data)
        loads = T.meta_var(Producer(plan=plan, a=A, b=B, a_smem=Asmem, b_smem=Bsmem, ring=ring, cluster_m=cluster_m,
                                    cluster_n=cluster_n, rank_m=rank_m, rank_n=rank_n,
                                    gated_n=N // 2 if gated else 0,
                                    scales=fp8.StagedScales(cfg=cfg, a_flat=scale_a_flat,
                                                            b_flat=scale_b_flat,
                                                            smem=Ssmem, m_extent=M) if stage_scales else None))

        with WarpgroupRole(wg_id, common.PRODUCER_WG, regs=regs.producer):
            if T.And(warp_id == 0, lane_id == 0):
                if narrow_on:
                    cut_load: T.int32 = narrow_rows
                # tail_n: the whole tiles are those of the rows above the narrow ones
                ts_load = sched.tiles("ts_load", num_clusters, cut_load if narrow_on else 0)
                ts_load.init(clu)
                load_it: T.int32 = 0
                if stream_k:
                    # computed once (as expressions, their selects and divisions by the runtime
                    # cluster count would swamp the compiler wherever they are used)
                    dp_load: T.int32 = dp_tiles
                    first_load: T.int32 = sk_first
                    end_load: T.int32 = sk_end
                while whole_tiles_left(ts_load, dp_load if stream_k else 0):
                    # each stage refilled once its previous slice (one lap back) was released
                    n_col, _, k0, nk = T.meta_var(unit(ts_load.n_idx))
                    loads.load_tile(load_it, sched.m_start(ts_load.m_idx), sched.n_start(n_col),
                                    first_slice=k0, num_slices=nk, backwards=backwards(load_it),
                                    parts=lanes if kconsumers.halves(cfg) else 1)
                    load_it = load_it + nk
                    ts_load.next_tile()
                if narrow_on:
                    # the narrow tiles this cluster's stride reaches past the whole ones: the same
                    # boxes (B's rows past the narrow tile are read and not used)
                    q_load: T.int32 = ts_load.linear_idx - (m_tiles - cut_load) * n_tiles
                    while q_load < cut_load * narrow_per_row:
                        nm, nn = T.meta_var(narrowtail.narrow_tile(q_load, m_tiles - cut_load, narrow_per_row))
                        loads.load_tile(load_it, sched.m_start(nm), sched.n_start(nn, tail_n))
                        load_it = load_it + slices_per_tile
                        q_load = q_load + num_clusters
                if stream_k:
                    for p in range(streamk.pieces(first_load, end_load, slices_per_tile)):
                        j, k0, nk = T.meta_var(streamk.piece(p, first_load, end_load, slices_per_tile))
                        ts_load.init(dp_load + j)  # the scheduler's place of stream-K tile j
                        loads.load_tile(load_it, sched.m_start(ts_load.m_idx), sched.n_start(ts_load.n_idx),
                                        first_slice=k0, num_slices=nk)
                        load_it = load_it + nk

        with common.ConsumerRole(wg_id, warpgroups, regs.consumer):
            # this consumer's rows (their owner) and, with k_consumers, its lane of K slices
            c = T.meta_var((wg_id - 1) % consumers if lanes > 1 else wg_id - 1)
            lane = T.meta_var((wg_id - 1) // consumers)
            wtid = T.meta_var(warp_id * 32 + lane_id)
            # its rows of a_smem (of N under swap AB: all of them with split_m, which gives it rows of M instead)
            wg_row0 = T.meta_var(plan.n_first(c) if preset.swap_ab else c * rows_per_wg)
            wg_col0 = T.meta_var(plan.m_first(c) if preset.swap_ab else 0)  # its first row of b_smem (split_m)
            # with halves the tensor cores' accumulators hold one half of the tile (fp8.HalfPlan)
            Dreg = T.alloc_local((acc_regs // 2 if halves else acc_regs,), "float32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            if halves:
                desc_b_half = T.alloc_local((1,), "uint64")  # at B's second half of rows
            packed = T.alloc_local((4,), "uint32")
            if residual:
                c_pairs = T.alloc_local((4,), "uint32")  # one ldmatrix of C
            if under:
                # the last tile's output as 16-bit pairs, stored under the next tile
                Preg = T.alloc_local((acc_regs // 2,), "uint32")
            # fp8: the promoted fp32 sums, and a thread's scales (one register each when unused)
            Freg = T.alloc_local((total_regs,), "float32")
            if overlap > 0:
                Dreg2 = T.alloc_local((acc_regs,), "float32")  # fp8 overlap: the second accumulator set
            Sreg = T.alloc_local((scale_regs,), "float32")
            # swap AB: B's rows are wgmma's 64-row operand, A's rows its N
            # fp8 block scales: applied at each promotion (fp8.BlockScales), not in the epilogue
            block_scales = T.meta_var(fp8.BlockScales(plan=plan, scale_a=g["scale_a"], scale_b=g["scale_b"],
                                                      sreg=Sreg, warp_id=warp_id, lane_id=lane_id,
                                                      smem=Ssmem if stage_scales else None)
                                      if at_promotion else None)
            # fp8 per-tensor and rowwise: the sums times the scales once a tile's K loop (or its split's sum) is done
            sum_scales = T.meta_var(fp8.SumScales(plan=plan, scale_a=g["scale_a"], scale_b=g["scale_b"],
                                                  how=fp8.recipe(cfg), row0=wg_row0, warp_id=warp_id, lane_id=lane_id,
                                                  sreg=Sreg, swapped=preset.swap_ab,
                                                  col0=wg_col0) if scaled else None)
            # k_consumers: this lane's view of the ring (ring.Lane: every second position from its own)
            lane_ring = T.meta_var(ring.lane(lanes, lane) if lanes > 1 else ring)
            mma = T.meta_var(Consumer(plan=plan, ring=lane_ring, a_smem=Bsmem if preset.swap_ab else Asmem,
                                      b_smem=Asmem if preset.swap_ab else Bsmem, acc=Dreg, desc_a=desc_a,
                                      desc_b=desc_b, row0=wg_row0, lane_id=lane_id, promote=promote, total=Freg,
                                      scales=block_scales, overlap=overlap, acc2=Dreg2 if overlap > 0 else None,
                                      unroll=fp8.unroll_k(cfg), stagger=fp8.stagger(cfg), consumer=c,
                                      halves=fp8.HalfPlan(cfg) if halves else None,
                                      desc_b_half=desc_b_half if halves else None,
                                      col0=wg_col0))
            if stashing:
                Breg = T.alloc_local((stash_regs,), "float32")  # the tile's bias (epilogue.BiasStash)
            stash = T.meta_var(epilogue.BiasStash(regs=Breg, count=stash_regs, transposed=transposed, warp_id=warp_id,
                                                  lane_id=lane_id) if stashing else None)
            # the first column of this consumer's part of the tile (under swap AB its rows of N are D's columns)
            stash_n0 = T.meta_var(plan.n_first(c) if transposed else 0)
            if preset.epilogue == "transposed":
                epi = T.meta_var(TransposedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid,
                                                    warp_id=warp_id, lane_id=lane_id, packed=packed, op=epi_op))
            else:
                epi = T.meta_var(ChunkedEpilogue(plan=plan, d=D, staging=Esmem, consumer=c, thread=wtid,
                                                 warp_id=warp_id, lane_id=lane_id, packed=packed,
                                                 chunk_cols=chunk_cols, buffers=buffers, op=epi_op,
                                                 residual=epilogue.ResidualRead.of(
                                                     cfg, g, c_ready if residual else None,
                                                     c_pairs if residual else None), gated=gated))
            # the whole tiles' epilogue: its bias from the stash, loaded before each tile's K loop
            epi_tiles = T.meta_var(dataclasses.replace(epi, op=epi_op.with_stash(stash)) if stashing else epi)
            if lanes > 1:
                hand_over = T.meta_var(kconsumers.HandOver(buf=Rsmem, regs=acc_regs, thread=wtid, owner=c,
                                                           owners=consumers))
            if has_workspace:
                # fp8 (v10): each unit's promoted fp32 sums are its partials (fp8.check_split)
                parts = T.meta_var(splitk.Partials(slots=g["p"], counters=g["cnt"], acc=Freg if promote > 0 else Dreg,
                                                   acc_regs=acc_regs, thread=wtid, flag=flag, consumer=c))
            if under:
                m_prev: T.int32 = 0  # where the tile whose pairs wait goes in D
                n_prev: T.int32 = 0
            it: T.int32 = 0  # (unit, slice) pairs consumed by this CTA: never reset
            epi_it: T.int32 = 0  # output chunks this consumer stored: never reset
            if under:
                # tiles of this CTA so far (declared here: moved above ``it``, ptxas schedules
                # the epi_under + k_zigzag + dynamic_m kernel differently)
                tiles_done: T.int32 = 0
            if narrow_on:
                cut: T.int32 = narrow_rows
            ts = sched.tiles("ts", num_clusters, cut if narrow_on else 0)
            ts.init(clu)
            if stream_k:
                dp_mine: T.int32 = dp_tiles
                first_mine: T.int32 = sk_first
                end_mine: T.int32 = sk_end
                pc = T.alloc_local((3,), "int32")  # the piece: stream-K tile, first slice, count
                mt = T.alloc_local((2,), "int32")  # a split tile's: cluster of its slice 0, pieces
                sb = T.alloc_local((3,), "int32")  # and where its pieces' slots start (this thread's part)
            while whole_tiles_left(ts, dp_mine if stream_k else 0):
                n_col, split, _, nk = T.meta_var(unit(ts.n_idx))
                if sums_under:
                    # fp8: the previous tile's pairs stored under this tile's first promotion group
                    mma.run_under(it, slices_per_tile, epilogue.PairsUnder(
                        epi=epi, pairs=Preg, has_prev=tiles_done > 0, m0=m_prev, n0=n_prev, chunk_it=epi_it,
                        parts=2 if halves else 1), sched.m_start(ts.m_idx) + wg_row0, sched.n_start(ts.n_idx))
                    if tiles_done > 0:
                        epi_it = epi_it + epi.chunks_per_tile
                    # the sums scaled and rounded: the total is free for the next tile
                    sum_scales.apply(Freg, sched.m_start(ts.m_idx), sched.n_start(ts.n_idx))
                    epilogue.acc_to_pairs(plan, Freg, Preg, epi_op, lane_id, sched.n_start(ts.n_idx))
                    m_prev = sched.m_start(ts.m_idx)
                    n_prev = sched.n_start(ts.n_idx)
                    tiles_done = tiles_done + 1
                elif under:
                    # the previous tile's chunks, one under each of this tile's first slices
                    mma.issue_under(it, slices_per_tile, epi, Preg, m_prev, n_prev, tiles_done > 0, epi_it)
                    if tiles_done > 0:
                        epi_it = epi_it + epi.chunks_per_tile
                    mma.retire(it, slices_per_tile)
                    # the accumulators are free for the next tile
                    epilogue.acc_to_pairs(plan, Dreg, Preg, epi_op, lane_id, sched.n_start(ts.n_idx))
                    m_prev = sched.m_start(ts.m_idx)
                    n_prev = sched.n_start(ts.n_idx)
                    tiles_done = tiles_done + 1
                elif at_promotion:
                    mma.run(it, nk, sched.m_start(ts.m_idx) + wg_row0, sched.n_start(n_col))
                elif lanes > 1:
                    # k_consumers: this lane's slices, then lane 1's sums into lane 0's (kconsumers.py)
                    if stashing:
                        stash.load(epi_op, sched.n_start(n_col) + stash_n0)
                    if c_prefetch:
                        if lane == 0:
                            epi.prefetch_c(sched.m_start(ts.m_idx), sched.n_start(n_col), epi_it)
                    mma.run(it // lanes, nk // lanes)
                    hand_over.meet(mma.sums, lane)
                else:
                    if stashing:
                        stash.load(epi_op, sched.n_start(n_col) + stash_n0)
                    if c_prefetch:
                        # the tile's first C chunk lands under its K loop (epilogue.ResidualRead)
                        epi.prefetch_c(sched.m_start(ts.m_idx), sched.n_start(n_col), epi_it)
                    mma.run(it, nk)
                it = it + nk
                m_st = T.meta_var(sched.m_start(ts.m_idx))
                n_st = T.meta_var(sched.n_start(n_col))
                if units_per_tile > 1:
                    counter = T.meta_var(splitk.counter_index(sched.cta_m(ts.m_idx), sched.cta_n(n_col), c,
                                                              n_cta_tiles, consumers))
                    if atomic_sum:
                        parts.add_unit(counter)
                    else:
                        parts.publish_unit(counter, split, units_per_tile)
                    if parts.counted_before() == units_per_tile - 1:  # the last unit of the tile: sum and store
                        if atomic_sum:
                            parts.take_units(counter)
                        else:
                            parts.sum_units(counter, units_per_tile)
                        _store_sums(epi_tiles, mma.sums, sum_scales, m_st, n_st, epi_it)
                        if preset.epilogue == "chunked":
                            epi_it = epi_it + epi.chunks_per_tile
                elif lanes > 1:
                    if lane == 0:  # k_consumers: lane 0 stores the tile
                        _store_sums(epi_tiles, mma.sums, sum_scales, m_st, n_st, epi_it)
                        epi_it = epi_it + epi.chunks_per_tile
                elif not under:
                    _store_sums(epi_tiles, mma.sums, sum_scales, m_st, n_st, epi_it)
                    if preset.epilogue == "chunked":
                        epi_it = epi_it + epi.chunks_per_tile
                ts.next_tile()
            if narrow_on:
                q: T.int32 = ts.linear_idx - (m_tiles - cut) * n_tiles
                while q < cut * narrow_per_row:
                    nm, nn = T.meta_var(narrowtail.narrow_tile(q, m_tiles - cut, narrow_per_row))
                    # m64n{tail_n}k16 into the first tail_n / 2 accumulators of each atom
                    mma.with_plan(narrow_plan).run(it, slices_per_tile)
                    it = it + slices_per_tile
                    if narrow_chunks > 0:
                        epi.with_plan(narrow_plan).store_tile(Dreg, sched.m_start(nm), sched.n_start(nn, tail_n),
                                                              epi_it)
                        epi_it = epi_it + narrow_chunks
                    if narrow_rest > 0:
                        # the columns after the last whole chunk: from the registers, guarded
                        narrowtail.cols_to_global(narrow_plan, Dreg, D, sched.m_start(nm), sched.n_start(nn, tail_n),
                                                  wg_row0, narrow_chunks * chunk_cols, narrow_rest, warp_id, lane_id)
                    q = q + num_clusters
            if stream_k:
                for p in range(streamk.pieces(first_mine, end_mine, slices_per_tile)):
                    j, k0, nk = T.meta_var(streamk.piece(p, first_mine, end_mine, slices_per_tile))
                    pc[0] = j
                    pc[1] = k0
                    pc[2] = nk
                    ts.init(dp_mine + pc[0])
                    mma.run(it, pc[2])
                    it = it + pc[2]
                    m_sk = T.meta_var(sched.m_start(ts.m_idx))
                    n_sk = T.meta_var(sched.n_start(ts.n_idx))
                    if pc[2] == slices_per_tile:  # a whole tile in this cluster's range
                        _store_sums(epi, mma.sums, sum_scales, m_sk, n_sk, epi_it)
                        epi_it = epi_it + epi.chunks_per_tile
                    else:
                        # the tile's 2 or 3 pieces are clusters g_h, g_h + 1, ... in K order; the
                        # counter is g_h's; a piece's slot is 1 if its range began before the tile
                        tile0 = T.meta_var(pc[0] * slices_per_tile)
                        sk_tiles_now = T.meta_var(m_tiles * n_tiles - dp_mine)
                        mt[0] = streamk.cluster_of(tile0, sk_tiles_now, num_clusters, slices_per_tile)  # g_h
                        mt[1] = streamk.cluster_of(tile0 + slices_per_tile - 1, sk_tiles_now, num_clusters,
                                                   slices_per_tile) - mt[0] + 1  # pieces
                        g_h = T.meta_var(mt[0])
                        head_first = T.meta_var(streamk.cluster_range(g_h, sk_tiles_now, num_clusters,
                                                                      slices_per_tile)[0])
                        cnt_i = T.meta_var(streamk.counter(g_h, rank, c, cluster_size, consumers))
                        mine = T.meta_var(streamk.slot(clu, rank, c, T.Select(first_mine < tile0, 1, 0),
                                                       cluster_size, consumers))
                        streamk.meet_pieces(parts, cnt_i, mine, mt[1] - 1)
                        if parts.counted_before() == mt[1] - 1:  # the other pieces counted first: sum and store
                            sb[0] = streamk.slot_offset(streamk.slot(g_h, rank, c, T.Select(head_first < tile0, 1, 0),
                                                                     cluster_size, consumers), 0, wtid, acc_regs)
                            sb[1] = streamk.slot_offset(streamk.slot(g_h + 1, rank, c, 0, cluster_size, consumers), 0,
                                                        wtid, acc_regs)
                            sb[2] = streamk.slot_offset(streamk.slot(g_h + 2, rank, c, 0, cluster_size, consumers), 0,
                                                        wtid, acc_regs)
                            streamk.sum_tile_pieces(parts, cnt_i, mt[1], clu - g_h, sb)
                            _store_sums(epi, mma.sums, sum_scales, m_sk, n_sk, epi_it)
                            epi_it = epi_it + epi.chunks_per_tile
            if under:
                if tiles_done > 0:
                    epi.store_pairs(Preg, m_prev, n_prev, epi_it)
            if wtid == 0:
                # Esmem must outlive the last copy: the CTA's shared memory goes when it exits
                T.ptx.cp.async_.bulk.wait_group.read(0)
        # no CTA leaves while a peer may still arrive on its barriers or multicast into it
        common.cluster_sync()

    # the prim_func's form for the operand list (the same body, its tensors by name): TVMScript
    # spells a signature out, so each list of operands has its form here (a new operand, one more)
    def shapes(num_ctas):
        return {op.name: op for op in operands(cfg, preset, M, num_ctas)}

    names = tuple(op.name for op in operands(cfg, preset, M, 1))
    if names == ("a", "b", "d", "p", "cnt"):
        @T.prim_func
        def hgemm(a: T.handle, b: T.handle, d: T.handle, p: T.handle, cnt: T.handle, num_ctas: T.int32):
            ops = T.meta_var(shapes(num_ctas))
            A = T.match_buffer(a, ops["a"].shape, ops["a"].dtype)
            B = T.match_buffer(b, ops["b"].shape, ops["b"].dtype)
            D = T.match_buffer(d, ops["d"].shape, ops["d"].dtype)
            P = T.match_buffer(p, ops["p"].shape, ops["p"].dtype)
            C = T.match_buffer(cnt, ops["cnt"].shape, ops["cnt"].dtype)
            # and the spec's epilogue operands (fp8's scales), parameters after num_ctas
            g = T.meta_var(epilogue.kernel_operands(cfg, M, N, K, {"a": A, "b": B, "d": D, "p": P, "cnt": C}))
            T.device_entry()
            body(g, num_ctas)
    elif names == ("a", "b", "d"):
        @T.prim_func
        def hgemm(a: T.handle, b: T.handle, d: T.handle, num_ctas: T.int32):
            ops = T.meta_var(shapes(num_ctas))
            A = T.match_buffer(a, ops["a"].shape, ops["a"].dtype)
            B = T.match_buffer(b, ops["b"].shape, ops["b"].dtype)
            D = T.match_buffer(d, ops["d"].shape, ops["d"].dtype)
            # and the spec's epilogue operands (a bias), parameters after num_ctas
            g = T.meta_var(epilogue.kernel_operands(cfg, M, N, K, {"a": A, "b": B, "d": D}))
            T.device_entry()
            body(g, num_ctas)
    else:
        raise NotImplementedError(f"the production kernel has no prim_func form for the operands {names}: add it "
                                  "beside the others in gemm.kernel")
    # fmt: on

    # the C loads' mbarrier is ordered by the consumers' named barrier, and k_consumers' lanes meet at one:
    # the checker models them
    if residual or lanes > 1:
        hgemm = hgemm.with_attr(NAMED_BARRIERS_ATTR, True)
    # a residual's C loads sit in the branch of a split tile's last unit (or piece), which the counters
    # of other CTAs decide: the checker takes it both ways
    if residual and preset.split_k:
        hgemm = hgemm.with_attr(COUNTED_BRANCHES_ATTR, True)
    return common.with_pdl(cfg, hgemm)
