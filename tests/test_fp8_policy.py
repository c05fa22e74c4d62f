"""The fp8 policy (issue 32, ``plan.FP8_RULES``): its knobs validate wherever ``scaled_mm`` can be
called (N and K multiples of 16, any M), so no fp8 problem falls through to the defaults' rule
unasked, and explain names the rule and the sweep it rests on. CPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import plan


@pytest.mark.parametrize("recipe", ["tensor", "row"])
@pytest.mark.parametrize("N, K", [(4096, 7168), (3008, 1008), (48, 32), (7168, 16384), (1024, 16)])
def test_the_policys_knobs_validate_at_every_shape_scaled_mm_takes(recipe, N, K):
    spec = GemmSpec.fp8("bfloat16", recipe)
    for M in (1, 77, plan.FP8_SMALL_M, plan.FP8_SMALL_M + 1, 1000, 8192):
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        tile = plan.fp8_tile(M, N, recipe=recipe)
        large = "fp8-width" if tile.startswith("n") else \
            {"wide": "fp8-wide", "halves": "fp8-halves", "square": "fp8"}.get(tile)
        fill = plan.fp8_fill_n(M, N, 132, recipe)
        if fill is not None:  # 64-row tiles come to one whole wave: v9's, no split
            assert choice.rule == "fp8-fill" and choice.rung == "v9" and choice.knobs["blk_n"] == fill, M
            assert (choice.knobs["blk_m"], choice.knobs["cluster_m"], choice.knobs["cluster_n"]) == (64, 2, 1)
            continue
        ways = plan.fp8_split_ways(M, N, K, 132, recipe)
        if ways > 1:  # the tiles would fill at most half the SMs: v10's split K
            assert choice.rule == "fp8-split-k" and choice.rung == "v10" and choice.knobs["split_k"] == ways, M
            continue
        assert choice.rule == ("fp8-small-m" if M <= plan.FP8_SMALL_M else large), (M, choice.skipped)
        assert {k: v for k, v in choice.knobs.items() if k in plan.fp8_knobs(M, N, K, recipe)} == \
            plan.fp8_knobs(M, N, K, recipe)


def test_the_small_m_split_pairs_two_rows_of_tiles_in_2x1_clusters():
    """``plan.FP8_SMALL_PAIR_KNOBS``: at 64 < M <= 128 the small-M tiles' two rows split in 2x1 clusters (sharing
    B), their ways counted over those clusters' tiles (128x2112x7168: 33 of them, two ways fill the SMs, where
    the 1x2 clusters' 34 left it unsplit at half the SMs); one row of tiles keeps 1x2 (a 2x1 pair would be
    half empty), unsplit tiles keep 1x2 (level, run 20), and the rule cites its run."""
    rung, knobs = plan.fp8_module(128, 2112, 7168, "tensor")
    assert rung == "v10" and knobs["split_k"] == 2 and (knobs["cluster_m"], knobs["cluster_n"]) == (2, 1)
    assert plan.fp8_module(96, 2112, 7168, "row")[1]["cluster_m"] == 2  # an odd second row of tiles too
    rung, knobs = plan.fp8_module(64, 2112, 7168, "tensor")
    assert rung == "v10" and (knobs["cluster_m"], knobs["cluster_n"], knobs["split_k"]) == (1, 2, 3)
    rung, knobs = plan.fp8_module(128, 4096, 14336, "tensor")  # 128 tiles: one wave, not split
    assert rung == "v9" and knobs == {**plan.FP8_SMALL_KNOBS, "pdl": True}  # (one wave: plan.pdl_pays)
    spec = GemmSpec.fp8("bfloat16", "tensor")
    choice = plan.rule_choice(plan.Problem(128, 2112, 7168, "bfloat16", "sm_90a", 132, spec))
    assert choice.rule == "fp8-split-k" and plan.FP8_PAIR_RESULTS in choice.text()
    assert (Path(__file__).resolve().parents[1] / plan.FP8_PAIR_RESULTS).is_file()


@pytest.mark.parametrize("N, K", [(4096, 7168), (3008, 1008), (48, 32), (7168, 16384), (1024, 16), (200, 144)])
def test_the_block_policys_knobs_validate_at_every_shape_scaled_mm_takes(N, K):
    """Block scales: the small-M knobs with overlap=2 up to M = 128, past it overlap=4 on 128x128 or
    128x256 in halves with the epilogue under (whichever fills its waves best), valid at any M, N and K a
    block call may have (K of one slice: a run's tail alone; N not a multiple of 128)."""
    spec = GemmSpec.fp8("bfloat16", "block")
    for M in (1, 77, plan.FP8_SMALL_M, plan.FP8_SMALL_M + 1, 1000, 8192):
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        tile = plan.fp8_tile(M, N, recipe="block")
        rule = {"small": "fp8-block-small-m", "square": "fp8-block", "halves": "fp8-block-halves"}[tile]
        assert choice.rule == rule, (M, choice.skipped)
        assert choice.knobs.get("overlap") == {"small": 2, "square": 4, "halves": None}[tile]
        assert choice.knobs.get("promote", 1) == 1
        assert (choice.knobs.get("blk_m"), choice.knobs.get("blk_n")) == {"small": (64, 64), "square": (None, None),
                                                                          "halves": (None, 256)}[tile]


def test_the_block_policy_rests_on_its_sweep_and_explain_names_it():
    """The block rules cite the block sweep's results (committed), the numbers it measured, and the
    per-tensor rules are not changed by them."""
    block = plan.rule_choice(plan.Problem(129, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert block.rule == "fp8-block" and plan.fp8_knobs(129, 4096, 7168, "block") == {"promote": 1, "overlap": 4,
                                                                                        "stage_scales": True}
    assert "2026-11-26_h100_fp8_block_staged_fix" in block.text() and "overlap=4" in block.text()
    assert "stage_scales" in block.text()
    halves = plan.rule_choice(plan.Problem(4096, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert halves.rule == "fp8-block-halves" and halves.knobs["halves"] is True and halves.knobs["epi_under"] is True
    assert "2026-11-27_h100_fp8_under" in halves.text()
    for results in (plan.FP8_BLOCK_RESULTS, plan.FP8_BLOCK_STAGED_RESULTS, plan.FP8_UNDER_RESULTS):
        assert (Path(__file__).resolve().parents[1] / results).is_file()
    small = plan.rule_choice(plan.Problem(128, 4096, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8(scales="block")))
    assert small.rule == "fp8-block-small-m" and "1.31x torch._scaled_mm block-wise" in small.text()
    assert plan.fp8_knobs(128, 4096, 7168, "block")["stage_scales"] is True
    # the small-M tiles at small M per-tensor, their overlapped loop unrolled (56 slices of 64x64 fit)
    assert plan.fp8_knobs(128, 4096, 7168, "tensor") == {**plan.FP8_SMALL_KNOBS, "unroll_k": True}
    text = plan.rule_choice(plan.Problem(129, 8192, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8())).text()
    assert "fp8_sweep" in text and f"every {plan.FP8_PROMOTE} slice(s)" in text and "overlap=4" in text


def test_many_waves_of_per_tensor_fp8_take_the_tile_that_fills_them_best():
    """Past small M, per-tensor and rowwise scales take the tile whose waves, weighed by its measured
    rate, use the SMs best: 128x256 in halves at 4096^3 (512 tiles, 3.9 waves), 192x128 over three
    consumers at 8192^3 (2752 tiles, 20.8 waves); each rule cites its
    sweep. Block scales weigh 128x128 against 128x256 in halves the same way."""
    spec = GemmSpec.fp8("bfloat16", "tensor")
    wide = plan.rule_choice(plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, spec))
    assert wide.rule == "fp8-wide" and wide.knobs["blk_m"] == 192 and wide.knobs["num_warpgroups"] == 3
    assert "2026-11-26_h100_fp8_wide" in wide.text() and (Path(__file__).resolve().parents[1] / plan.FP8_WIDE_RESULTS).is_file()
    halves = plan.rule_choice(plan.Problem(4096, 4096, 4096, "bfloat16", "sm_90a", 132, spec))
    assert halves.rule == "fp8-halves" and halves.knobs["blk_n"] == 256 and halves.knobs["halves"] is True
    assert halves.knobs["promote"] == plan.FP8_HALVES_PROMOTE == 2
    assert "2026-11-27_h100_fp8_halves" in halves.text()
    assert (Path(__file__).resolve().parents[1] / plan.FP8_HALVES_RESULTS).is_file()
    assert plan.rule_choice(plan.Problem(16384, 16384, 4096, "bfloat16", "sm_90a", 132, spec)).rule == "fp8-wide"
    assert plan.fp8_tile(129, 8192) == "square" and plan.fp8_tile(128, 65536) == "small"
    assert plan.fp8_tile(8192, 8192, recipe="block") == "halves" and plan.fp8_tile(1000, 200, recipe="block") == "square"
    row = plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "row"))
    assert plan.rule_choice(row).rule == "fp8-wide" and plan.rule_choice(row).knobs["blk_m"] == 192
    block = plan.Problem(8192, 8192, 8192, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "block"))
    assert plan.rule_choice(block).rule == "fp8-block-halves" and plan.rule_choice(block).knobs.get("blk_m") is None
    # the waves decide: 8192^3's 2048 halves tiles take 16 waves of 132 SMs at 97%, its 2752 wide tiles 21 at
    # 98.5%; on 128 SMs the halves fill 16 waves whole and the wide ones 22 at 97.7%
    assert plan.fp8_wide(8192, 8192, sms=132) and plan.fp8_halves(8192, 8192, sms=128)
    # 4096 x 1000 rows: 8 x 16 halves tiles are one wave of 132 SMs (97%) but two of 112 (57%), where the
    # 6 x 32 wide tiles and 8 x 24 of 128x176 fill two waves of 112 better (74%, 81%)
    assert plan.fp8_halves(1000, 4096, sms=132) and plan.fp8_tile(1000, 4096, sms=112) == "n176"


def test_the_width_rule_takes_cuBLASLts_widths_where_they_fill_the_waves_and_not_past_their_measured_range():
    """``plan.fp8_width`` (rule ``fp8-width``): 128-row tiles 96 to 224 wide where their waves, weighed
    by their measured rates, beat the other tiles: cuBLASLt's 128x144 at 1024x2112 (120 tiles, 91% of a wave, where
    128x128 take two waves at 52%), 128x112 at 256x7168 (128 tiles), 128x192 at 1024x6144 (256 tiles, two waves),
    128x176 at 4096x2112 (12 x 176 = N: 2.9 waves, where 192x128 leave a 17th column half empty);
    not where 128x128 fill at most half the SMs (the fill rule's or the split's), not under 128 columns past
    FP8_NARROW_MAX_M, never with block scales (whose tiles cover whole 128-column B blocks)."""
    spec = GemmSpec.fp8("bfloat16", "tensor")
    for (M, N, K), width in {(1024, 2112, 7168): 144, (256, 7168, 16384): 112, (1024, 6144, 4096): 192,
                             (256, 18944, 3584): 144, (4096, 2112, 7168): 176, (1024, 11008, 4096): 176}.items():
        choice = plan.rule_choice(plan.Problem(M, N, K, "bfloat16", "sm_90a", 132, spec))
        assert plan.fp8_width(M, N) == width and choice.rule == "fp8-width", (M, N)
        assert {k: choice.knobs[k] for k in plan.FP8_WIDTH_KNOBS[width]} == plan.FP8_WIDTH_KNOBS[width]
        assert plan.FP8_WIDTHS_RESULTS in choice.text()
    assert (Path(__file__).resolve().parents[1] / plan.FP8_WIDTHS_RESULTS).is_file()
    # 8 x 8 tiles of 128x128 at 1024 x 1024: under half the SMs, so no width is weighed (the split's shapes)
    assert plan.fp8_width(1024, 1024) is None and plan.fp8_module(256, 1024, 8192, "tensor")[0] == "v10"
    # 128x112 would fill 1536 x 1024 better (120 tiles) but ran 0.79x against 128x128's 0.91x: M past the range
    assert plan.fp8_width(plan.FP8_NARROW_MAX_M, 2112) == 112 and plan.fp8_width(1536, 1024) is None
    assert plan.fp8_tile(1536, 1024) == "square"
    # 128x176's fill only 2% better than 128x224's and 128x256's in halves: it lost there at K = 4096 (run 17)
    assert plan.fp8_tile(1024, 14336) == "n224" and plan.fp8_tile(4096, 14336) == "halves"
    assert plan.fp8_tile(1536, 8960) == "n224"
    for M, N in ((1024, 2112), (256, 7168), (1024, 6144)):
        assert not plan.fp8_tile(M, N, recipe="block").startswith("n")
        assert plan.fp8_width(M, N, recipe="row") == plan.fp8_width(M, N)  # rowwise scales take the same tiles


def test_128x128_tiles_under_one_wave_take_the_deeper_ring():
    """``plan.FP8_SUBWAVE_DEPTH``: per-tensor and rowwise 128x128 tiles that fit one wave (128 and 126 tiles at
    M = 256) wait on their loads and take 6 stages; over many waves (2433x4096 on 128x128) the four stages stay,
    and block scales keep theirs."""
    for N in (8192, 8064):
        assert plan.fp8_tile(256, N) == "square" and plan.fp8_knobs(256, N, 4096, "row")["pipe_depth"] == 6
    assert plan.fp8_tile(2433, 4096) == "square"  # 20 x 32 = 640 tiles of 128x128 on 132 SMs: 4.8 waves
    assert plan.fp8_knobs(2433, 4096, 4096, "tensor") == plan.FP8_LARGE_KNOBS
    assert "pipe_depth" not in plan.FP8_LARGE_KNOBS
    assert "pipe_depth" not in plan.fp8_knobs(256, 6144, 4096, "block")


@pytest.mark.parametrize("M, N, fill", [
    (256, 2112, 64),  # 4 rows x 33 columns of 64x64: 132 tiles (FP8_FILL_RESULTS)
    (256, 4096, 128),  # 4 x 32 of 64x128: 128 (FP8_FILL_RESULTS)
    (129, 2112, 64),  # 3 rows, paired into 2x1 clusters: 4 x 33
    (200, 4096, 128),
    (256, 6144, None),  # 64x128: 192 tiles, past one wave; 64x64: 384
    (256, 7168, None),
    (512, 2048, 128),  # 8 x 16
    (1024, 2112, None),  # 128x128 fills more than half the SMs
    (128, 2112, None),  # the small-M rule's
])
def test_the_fill_rule_takes_64_row_tiles_where_they_come_to_one_whole_wave(M, N, fill):
    """``plan.fp8_fill_n``: 64-row tiles in 2x1 clusters where 128x128 would fill at most half the SMs and
    these (their rows paired) come to 95-100% of one wave; the widest such blk_n; the rule's module on v9."""
    assert plan.fp8_fill_n(M, N, 132, "tensor") == fill
    assert plan.fp8_fill_n(M, N, 132, "row") == fill
    assert plan.fp8_fill_n(M, N, 132, "block") is None  # block scales keep their own tiles
    rung, knobs = plan.fp8_module(M, N, 7168, "tensor")
    if fill is not None:
        tile = {**plan.FP8_FILL_KNOBS, "blk_n": fill, "pipe_depth": plan.FP8_FILL_DEPTH[fill]}
        # the loop unrolled where the tile fits (64x64: 56 slices, then promoted every 2 slices; 64x128 over one
        # consumer: not)
        # (and launched as a programmatic dependent: past M = 128, or one wave, plan.pdl_pays)
        tile = {**tile, "pdl": True}
        assert rung == "v9" and knobs == ({**tile, "unroll_k": True, **plan.FP8_FILL_PAIRS} if fill == 64 else tile)
        rows = 2 * -(-(-(-M // 64)) // 2)
        assert 0.95 * 132 <= rows * -(-N // fill) <= 132
    choice = plan.rule_choice(plan.Problem(M, N, 7168, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "tensor")))
    assert (choice.rule == "fp8-fill") == (fill is not None)
    if fill is not None:
        assert plan.FP8_FILL_RESULTS in choice.text() and "0.99-0.995x" in choice.text()
        assert (Path(__file__).resolve().parents[1] / plan.FP8_FILL_RESULTS).is_file()


@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_no_tiles_cluster_rounds_an_odd_row_of_tiles_up_by_a_wave(recipe):
    """``plan.fp8_tile_cluster``: the persistent grid is one of cluster tiles, so 2x1 clusters over three
    rows of 128-row tiles run as four rows. At M = 320 the rules' 128x112 made 74 clusters of 2x1 where a
    wave holds 66 (two waves for 111 tiles: 0.36x torch._scaled_mm at 320x4096x14336). For the policy's
    v9 modules past FP8_SMALL_M the grid of cluster tiles takes as many waves as the tiles alone would."""
    from gemm_ladder.rungs import make_config

    spec = GemmSpec.fp8("bfloat16", recipe)
    for M in (257, 320, 384, 448, 576, 640, 896, 1152, 3000):
        for N, K in ((4096, 14336), (6144, 4096), (7168, 16384), (28672, 8192), (18944, 3584), (24576, 1536),
                     (2112, 7168), (11008, 4096)):
            rung, knobs = plan.fp8_module(M, N, K, recipe)
            cfg = make_config(rung, M, N, K, spec=spec, **knobs).knobs()
            if rung != "v9" or cfg["blk_m"] == 64:  # the split's and the fill rule's own cluster counts
                continue
            cluster = (cfg["cluster_m"], cfg["cluster_n"])
            tiles = plan.cluster_waves(M, N, cfg["blk_m"], cfg["blk_n"], (1, 1))
            assert plan.cluster_waves(M, N, cfg["blk_m"], cfg["blk_n"], cluster) == tiles, (M, N, K, cfg)


def test_an_odd_row_of_tiles_runs_unclustered_and_an_even_one_keeps_its_pair():
    """Three rows of 128x112 at 320x4096 (37 columns): 2x1 would take two waves, 1x1 takes one (111 of 132
    SMs); two rows (M = 256) and four (M = 512) keep the 2x1 pair; the wide tiles' 1x2 (sharing A) is kept
    where its columns pair up without a wave; the small-M tiles' clusters are not this function's."""
    assert plan.cluster_waves(320, 4096, 128, 112, (2, 1)) == 2 and plan.cluster_waves(320, 4096, 128, 112, (1, 1)) == 1
    assert plan.fp8_tile(320, 4096) == "n112" and plan.fp8_tile_cluster(320, 4096, "n112") == (1, 1)
    knobs = plan.fp8_knobs(320, 4096, 14336, "row")  # v9's (the module there takes swapped operands: fp8-swap)
    assert (knobs["blk_n"], knobs["cluster_m"], knobs["cluster_n"]) == (112, 1, 1)
    assert plan.fp8_tile_cluster(512, 4096, "n112") == (2, 1) and plan.fp8_tile_cluster(256, 7168, "n112") == (2, 1)
    assert "cluster_m" not in plan.fp8_knobs(512, 6144, 4096, "tensor")
    assert plan.fp8_tile_cluster(8192, 8192, "wide") == (1, 2)
    # 128x128 at 320x14336: 3 x 112 tiles, three waves; 2 x 112 clusters of 2x1 take four. 128x256: 3 x 56 tiles and
    # 2 x 56 clusters, two waves either way
    assert plan.fp8_tile_cluster(320, 14336, "square") == (1, 1)
    assert plan.fp8_tile_cluster(320, 14336, "halves") == (2, 1)
    assert plan.fp8_tile(320, 14336, recipe="block") == "square"
    assert plan.fp8_knobs(320, 14336, 4096, "block") == {**plan.FP8_BLOCK_LARGE_KNOBS, "cluster_m": 1, "cluster_n": 1}
    with pytest.raises(ValueError, match="small-M"):
        plan.fp8_tile_cluster(64, 4096, "small")
