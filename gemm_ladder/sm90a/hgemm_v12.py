"""hgemm_v12 (Hopper): grouped GEMM for mixture-of-experts, contiguous layout: one persistent launch
over every expert's GEMM, its work units read from the routing on the device.

v12 is a preset of the production kernel's parts (``sm90a/grouped.py`` owns its body: v9's ring,
producer, consumers and chunked epilogue, with a scheduler over (expert, m-tile, n-tile) that TVM's
tile schedulers cannot express, and a guarded store for each expert's last m-tile).

What changed from v9: the operands. A ``[M, K]`` holds every expert's tokens, sorted by expert; B
is the experts' weights ``W [E, N, K]`` viewed as ``[E * N, K]``; the int32 ``offsets [E]`` (the
cumulative end row of each expert, ``torch._grouped_mm``'s ``offs``) follow ``num_ctas``. The
grid is no longer ``ceil(M / blk_m) x ceil(N / blk_n)`` but the sum over the experts of their own
grids, known only on the device: each CTA builds the table of work units per expert in shared
memory and binary-searches it for every tile (``grouped.walk`` is the model). The tile's A rows
start at the expert's first row, its B rows at ``e * N``; the rows past an expert's end belong to
the next expert, so that tile leaves through stores guarded by the expert's end row.

    ==========  ==============  ===========  ======================  ========================
    preset      operands        schedule     epilogue                knobs
    ==========  ==============  ===========  ======================  ========================
    v12         A rows x W[e]   grouped      chunked; guarded rows   experts, blk_m, blk_n,
                (offsets, or    (experts)    for an expert's last    num_warpgroups,
                masked counts;               m-tile (swap AB:        pipe_depth, epi_n,
                swap AB: W[e]                transposed; guarded     l2_group_size, layout,
                rows x tokens)               2-byte stores;          swap_ab, warp_scan,
                                             epi_under: whole tiles  epi_under,
                                             under the next tile)    cluster_m, cluster_n,
                                                                     l2_promo, stream_b
    ==========  ==============  ===========  ======================  ========================

Masked layout (``layout="masked"``, decode): A ``[E, max_tokens, K]`` viewed ``[E * max_tokens, K]``
and the int32 operand each expert's count of valid rows (clamped on the device into [0, max_tokens]);
expert e's rows start at ``e * max_tokens``. The same kernel: only the prologue's table and an
expert's first row differ (``gemm_ladder.grouped_mm_masked``).

Decode (knobs ``swap_ab``, ``warp_scan``; ``grouped.py`` says how): with ``swap_ab`` the tile is
v11's transpose, W's ``blk_n`` rows in wgmma's 64-row slot and an expert's ``blk_m`` tokens (8..256,
a multiple of 8) its N, so an expert with a few tokens streams its weight once at full width without
64-row tiles of padding; its D^T leaves by the transposed epilogue (whole token tiles) or guarded
2-byte stores (the expert's last). ``warp_scan`` makes the routing's tables with 32 lanes over chunks
of experts instead of thread 0's pass (E dependent steps). Both off by default: the kernels without
them are unchanged, source for source. ``epi_under`` (off by default; not with ``swap_ab``) stores a
whole tile's chunks under the next tile's first K slices, as v9 does; an expert's last m-tile still
leaves at once by its guarded stores (``grouped.py`` says why).

Barriers: v9's (``tma2mma[s]``: the producer's expect_tx and the TMA bytes, its own and its cluster
peer's multicast half; ``mma2tma[s]``: lane 0 of every consumer warp of every CTA of the cluster; named
barrier 1+c per consumer's epilogue), plus one CTA barrier in the prologue, after the offsets land in
shared memory.

Clusters (``cluster_m=2`` or ``cluster_n=2``; 1x1 by default): two CTAs take two m-tiles of one expert
(two n-tiles) and share W's (A's) tile by TMA multicast, half each; a cluster walks units of an m-pair
(n-pair), and an expert's odd last m-tile pairs with a phantom that loads and multiplies and writes
nothing (``grouped.py`` says how). Contiguous and masked, swapped or not (with ``swap_ab`` an m-pair is two
token tiles sharing W's rows: ``torch._grouped_mm``'s 64-token tiles in 2x1 clusters); not with fp8 or a
gated W_gu.

L2 hints (``l2_promo``, ``stream_b``; off by default): ``l2_promo`` asks both tensor maps for 256 bytes an
L2 miss, so a row of W read 128 bytes a K slice reaches DRAM in 256-byte runs; ``stream_b`` is v9's (that,
W evict-first, A evict-last). ``producer.load_hints`` says why and what it measured.

SwiGLU (spec ``grouped`` + ``gated``, ``gemm_ladder.grouped_swiglu``): W ``[E, 2I, K]`` holds each
expert's ``cat([W_gate, W_up])``; a tile loads the gate rows and the up rows of the same outputs
(v9's gated loads, at the expert's first row), so one thread holds gate and up of each output and
v9's gated epilogue writes ``silu(gate) * up`` into D ``[M, I]``; the expert's last m-tile does the
same in its guarded stores. Not with ``swap_ab`` (refused: the transposed epilogue has no gated form).

fp8 (issue 33's fp8 slice; ``gemm_ladder.scaled_grouped_mm``): a spec with e4m3 A and W, rowwise scales
(``scale_a [M]`` a token, ``scale_b [E, N]`` an expert's column: parameters after num_ctas, before
``offsets``) and D in 16 bits runs the dense fp8 path's parts on the same walk (``sm90a/fp8.py``):
1-byte tiles at blk_k = 128, ``m64nNk32`` e4m3 wgmmas, the promotion (``promote``, ``overlap``,
``stagger``: v9's fp8 knobs), and each sum times its token's and its column's scale before the
epilogue (``fp8.scale_sums`` with scale_b viewed as W's rows, ``[E * N]``). Defaults 128x128 (the
promoted sums double the accumulators); contiguous layout, no swap AB (refused by name). Not with a
gated W_gu yet (refused by name).

Constraints: a spec with ``grouped`` and nothing else but a gated W_gu in 16 bits or fp8 rowwise scales
(no bias, no plain activation yet); clusters 1x1, 2x1 or 1x2 (16-bit, not gated);
M at run time (any tokens, one module); N and K multiples of 8; ``experts`` <= 1024.

Run:  python -m gemm_ladder build v12 --shape 4096x14336x4096 --knob experts=8 --out build/
      (masked: add --knob layout=masked; decode: --knob swap_ab=True --knob blk_m=16 --knob blk_n=128
      --knob warp_scan=True; fp8: --knob spec=d_bfloat16.a_float8_e4m3.b_float8_e4m3.scales_row.grouped_true)
"""

from dataclasses import dataclass

from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from . import common, epilogue, fp8, gemm, grouped

PRESET = gemm.Preset("v12")  # the parts of gemm.py; its body is grouped.kernel's
TECHNIQUE = "grouped GEMM over experts: work units from the routing, read on the device"
# the operand spec's parts this rung builds (gemm_ladder.core.spec): grouped, grouped with a gated W_gu
# (SwiGLU: each expert's cat([W_gate, W_up]), D = act(gate) * up, v9's gated epilogue), and scaled (fp8
# with rowwise scales); not gated and scaled together (core.spec.check_built refuses it)
EPILOGUES = ("grouped", "gated", "scaled")
# knobs of its fp8 kernels only, and their defaults (v9's: sm90a/fp8.py): one 128-byte swizzle row of
# fp8 a slice, 128x128 tiles (room for the promoted sums)
FP8_KNOBS = {"promote": fp8.PROMOTE_DEFAULT, "overlap": fp8.OVERLAP_DEFAULT, "stagger": False}
FP8_DEFAULTS = {"blk_k": 128, "blk_n": 128}


@dataclass(frozen=True)
class GroupedKnobs:
    """v12's knobs and their defaults (``KNOBS``): v9's tile, the expert count (clusters:
    ``OPTIONAL_KNOBS``)."""

    experts: int = 8  # E: the weight's experts (W.shape[0])
    blk_m: int = 128
    blk_n: int = 256
    blk_k: int = 64
    num_warpgroups: int = 2
    pipe_depth: int = 4
    l2_group_size: int = 8  # m-tiles of an expert in a band (the grouped order inside an expert)
    tile_order: str = "grouped"
    epi_n: int = 64
    layout: str = "contiguous"  # "masked": A [E * max_tokens, K], the int32 operand each expert's count
    swap_ab: bool = False  # decode: W's rows in wgmma's 64-row slot, blk_m tokens (8..256) its N
    warp_scan: bool = False  # the routing's tables by 32 lanes in chunks, not thread 0's pass over E
    epi_under: bool = False  # a whole tile's chunks stored under the next tile's first K slices (v9's knob)


KNOBS = gemm.knob_defaults(GroupedKnobs)
# clusters (issue 33's floor case): taken, kept only away from 1x1 (the tags and cache keys of 1x1 modules
# stay as they were): cluster_m=2, two m-tiles of an expert share W's tile by multicast; cluster_n=2, two
# n-tiles share A's (grouped.check_cluster says which combinations are built). The L2 hints of the loads
# (producer.load_hints), off by default the same way: l2_promo, 256 bytes an L2 miss in both tensor maps;
# stream_b, v9's (that promotion, W evict-first and A evict-last)
OPTIONAL_KNOBS = {"cluster_m": 1, "cluster_n": 1, "l2_promo": False, "stream_b": False}
CONSUMERS = (1, 2, 3)
SWAP_CONSUMERS = (1, 2)  # v11's: whole 64-row atoms of W per consumer
BLK_M_CHOICES = common.SWAP_BLK_M  # swap AB takes blk_m tokens a multiple of 8; without it check_tile wants 64s


def check(cfg: GemmConfig) -> None:
    if not spec_of(cfg).grouped:
        raise ConfigError("v12 is the grouped GEMM: its spec must be grouped (spec=d_float16.grouped_true, or "
                          "gemm_ladder.grouped_mm); use v9 for one GEMM")
    if cfg.tile_order != "grouped":
        raise ConfigError(f"tile_order={cfg.tile_order!r}: v12 walks each expert in bands of l2_group_size m-tiles; "
                          "use tile_order='grouped'")
    if not isinstance(cfg.l2_group_size, int) or cfg.l2_group_size < 1:
        raise ConfigError(f"l2_group_size={cfg.l2_group_size!r} is not a positive int; use e.g. 8")
    if grouped.swap_ab(cfg) and spec_of(cfg).gated:
        raise ConfigError("swap_ab=True with a gated W_gu (SwiGLU) is not built: the swapped tile holds D^T, whose "
                          "gate and up halves are different threads' accumulator rows, and the transposed epilogue "
                          "has no gated form; use swap_ab=False (blk_m=64 or 128)")
    if common.epi_under(cfg) and spec_of(cfg).gated:
        raise ConfigError("epi_under=True with a gated W_gu (SwiGLU) is not built: the deferred tile waits as 16-bit "
                          "pairs of its accumulators, and act(gate) * up needs both halves in fp32; use "
                          "epi_under=False with a gated spec")
    extra = dict(cfg.extra)
    if extra.get("l2_promo") and extra.get("stream_b"):
        raise ConfigError("l2_promo=True with stream_b=True: stream_b's loads already ask for the 256-byte L2 fills "
                          "(and add its eviction hints); use one of them")
    if grouped.swap_ab(cfg):
        if common.epi_under(cfg):
            raise ConfigError("swap_ab=True with epi_under=True: the swapped tile leaves through the transposed "
                              "epilogue (D^T staged whole), which has no deferred form; use epi_under=False with "
                              "swap_ab, or swap_ab=False with epi_under")
        common.check_swap_tile(cfg, SWAP_CONSUMERS)
    else:
        if cfg.blk_m % common.WG_M:
            raise ConfigError(f"blk_m={cfg.blk_m}: without swap_ab a tile is whole 64-row wgmma atoms of tokens per "
                              f"consumer; for a few tokens an expert use swap_ab=True (blk_m tokens, a multiple of 8, "
                              f"as wgmma's N), or blk_m={common.WG_M * cfg.num_warpgroups}")
        common.check_tile(cfg, CONSUMERS)
    epilogue.check_epilogue(cfg)
    common.check_consumer_registers(cfg, grouped.plan_of(cfg))
    common.check_pipe_depth(cfg)
    fp8.check(cfg)
    grouped.check(cfg)


def launch(cfg: GemmConfig) -> dict:
    return grouped.launch(cfg)


def kernel(cfg: GemmConfig):
    return grouped.kernel(cfg)
