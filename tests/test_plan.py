"""The front door's policy (``gemm_ladder.plan``): one test per rule of the heuristic, the tuning
database by shape bucket, the makespan model, and one test per layout rule (what TMA cannot
describe gets copied)."""

import json

import pytest

from gemm_ladder import plan
from gemm_ladder.budget import max_pipe_depth
from gemm_ladder.plan import Layout, Problem, Rule, choose, layout_fixes, rule_choice
from gemm_ladder.rungs import make_config
from gemm_ladder.tune import cache, db

H100 = 132
TVM = cache.tvm_version()


@pytest.fixture(autouse=True)
def private_db(tmp_path, monkeypatch):
    path = tmp_path / "tuning_db.json"
    monkeypatch.setenv(db.DB_ENV, str(path))
    return path


def P(M, N, K, dtype="float16", arch="sm_90a"):
    return Problem(M, N, K, dtype, arch, H100)


def rung_knobs(choice):
    return {k: v for k, v in choice.knobs.items() if k not in ("dtype", "arch")}


# -- the makespan model -----------------------------------------------------------------------
def test_makespan_counts_waves_of_tile_area():
    p = P(512, 4096, 4096)
    assert p.tiles(128, 256) == 4 * 16 and p.waves(128, 256) == 1
    assert plan.makespan(p, 128, 256) == 128 * 256           # 64 tiles: one wave, 68 SMs idle
    assert plan.makespan(p, 128, 128) == 128 * 128           # 128 tiles: still one wave, half the area
    assert plan.best_tile(p, [(128, 256), (128, 128)]) == (128, 128)
    tie = P(512, 6144, 4096)                                 # 96 tiles vs 192 (two waves): a tie
    assert plan.makespan(tie, 128, 256) == plan.makespan(tie, 128, 128)
    assert plan.best_tile(tie, [(128, 256), (128, 128)]) == (128, 256)  # the larger tile on a tie


# -- one test per rule ------------------------------------------------------------------------
@pytest.mark.parametrize("M, N, blk_n", [(1, 4096, 128), (16, 6144, 128), (64, 28672, 256), (7, 128256, 256)])
def test_rule_weight_streaming(M, N, blk_n):
    """M <= 64: 64-row tiles, one consumer, no cluster, blk_n by makespan, the deepest ring <= 8."""
    c = rule_choice(P(M, N, 4096))
    assert (c.rule, c.rung) == ("weight-streaming", "v9")
    k = rung_knobs(c)
    assert (k["blk_m"], k["num_warpgroups"], k["cluster_m"], k["cluster_n"], k["blk_n"]) == (64, 1, 1, 1, blk_n)
    cfg = make_config("v9", M, N, 4096, **{**k, "pipe_depth": 2})
    assert k["pipe_depth"] == min(plan.MAX_SMALL_M_DEPTH, max_pipe_depth(cfg))
    assert "reading B" in c.why


def test_rule_weight_streaming_stops_above_m_64():
    assert rule_choice(P(64, 4096, 4096)).rule == "weight-streaming"
    assert rule_choice(P(65, 4096, 4096)).rule != "weight-streaming"


@pytest.mark.parametrize("M, N, K", [(128, 4096, 4096), (1024, 1024, 1024), (512, 4096, 14336)])
def test_rule_few_tiles(M, N, K):
    """Fewer 128x256 tiles than SMs: 128x128 tiles finish in fewer tile-units."""
    c = rule_choice(P(M, N, K))
    assert (c.rule, c.rung, rung_knobs(c)) == ("few-tiles", "v9", {"blk_m": 128, "blk_n": 128})
    assert plan.makespan(P(M, N, K), 128, 128) < plan.makespan(P(M, N, K), 128, 256)


@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (8192, 128256, 4096), (512, 6144, 4096), (978, 2640, 3336)])
def test_rule_large(M, N, K):
    """Enough tiles for every SM (or a tie): v9 at its defaults, with the evidence named."""
    c = rule_choice(P(M, N, K))
    assert (c.rule, c.rung, rung_knobs(c)) == ("large", "v9", {})
    assert "v6_v9_sweep.json" in c.why


def test_rule_large_on_blackwell():
    c = rule_choice(P(16, 4096, 4096, arch="sm_100a"))
    assert (c.rule, c.rung, c.knobs["arch"]) == ("large", "v9", "sm_100a")


def test_a_new_rung_is_one_table_entry():
    """A rule before 'large' takes the shapes it names; one whose rung is not in the ladder, or
    whose knobs the validator refuses, is passed over with the reason."""
    missing = Rule("swap-ab", "sm_90a", "v99", when=lambda p: p.M <= 64, knobs=lambda p: {}, why="swap A and B")
    refused = Rule("odd", "sm_90a", "v5", when=lambda p: p.M <= 64, knobs=lambda p: {"blk_n": 96}, why="x")
    new = Rule("tiny", "sm_90a", "v5", when=lambda p: p.M <= 64, knobs=lambda p: {"blk_n": 128}, why="tiny M")
    rules = [missing, refused, new] + plan.RULES
    c = rule_choice(P(16, 4096, 4096), rules)
    assert (c.rule, c.rung, rung_knobs(c)) == ("tiny", "v5", {"blk_n": 128})
    assert any("v99" in s and "no form" in s for s in c.skipped), c.skipped
    assert any("blk_n=96" in s for s in c.skipped), c.skipped
    assert rule_choice(P(4096, 4096, 4096), rules).rule == "large"


def test_every_rule_validates_and_every_shape_has_a_rule():
    for M in (1, 2, 7, 16, 63, 64, 65, 128, 300, 1000, 4096, 8191):
        for N, K in ((4096, 4096), (6144, 4096), (128256, 4096), (4096, 14336), (8, 8)):
            c = rule_choice(P(M, N, K))
            make_config(c.rung, M, N, K, **c.knobs)


# -- the tuning database ------------------------------------------------------------------------
def _entry(rung, shape, knobs, ratio, tflops=600.0):
    return {"rung": rung, "shape": list(shape), "bucket": db.shape_bucket(shape), "dtype": "float16",
            "arch": "sm_90a", "gpu": "NVIDIA H100 80GB HBM3", "tvm_version": TVM, "knobs": knobs,
            "tflops": tflops, "cublas_tflops": tflops / ratio, "ratio_to_cublas": ratio,
            "date": "2026-11-22T00:00:00+00:00", "commit": "abc", "sources": "s"}


def _write_db(path, entries):
    path.write_text(json.dumps({"format": db.DB_FORMAT, "version": db.DB_VERSION, "entries": entries}))


def test_no_database_entry_means_the_rule(private_db):
    c = choose(P(4096, 4096, 4096))
    assert c.source == "rule" and c.rule == "large"


def test_database_by_bucket_at_or_above_the_rules_rung(private_db):
    """The database's best in the shape's bucket wins when its rung is not below the rule's; a
    v6 entry is ignored for a shape the rule gives v9 (and explain says so)."""
    v6 = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2, "pipe_depth": 3}
    v9 = {"blk_m": 128, "blk_n": 192, "pipe_depth": 4, "tile_order": "grouped"}
    _write_db(private_db, [_entry("v6", (4096, 4096, 4096), v6, 1.2),
                           _entry("v9", (4096, 4096, 4096), v9, 0.99)])
    c = choose(P(4000, 4104, 4096))                     # same bucket as 4096^3
    assert (c.source, c.rung, rung_knobs(c)) == ("db", "v9", v9)
    assert "best in bucket 4096x4096x4096" in c.why and "0.99x cuBLAS" in c.why
    assert any("v6" in s and "below the rule's v9" in s for s in c.skipped), c.skipped
    assert "tuning database" in c.text()
    other = choose(P(2048, 4096, 4096))                 # another bucket: the rule
    assert other.source == "rule"


def test_database_entries_the_validator_refuses_are_not_used(private_db):
    _write_db(private_db, [_entry("v9", (4096, 4096, 4096), {"blk_n": 96}, 1.1)])
    c = choose(P(4096, 4096, 4096))
    assert c.source == "rule"


# -- layout: one test per rule ----------------------------------------------------------------
def test_layout_aligned_needs_nothing():
    f = layout_fixes(Layout(100, 4096, 4096))
    assert f.names == () and (f.N, f.K) == (4096, 4096) and f.lines() == []


def test_layout_pad_k():
    f = layout_fixes(Layout(100, 4096, 100, a_aligned=False))
    assert f.names == ("pad-k",) and f.K == 104 and f.N == 4096  # the padded copy of A is aligned too
    assert "16 bytes" in f.lines()[0] and "slower" in f.lines()[0]


def test_layout_pad_n():
    f = layout_fixes(Layout(100, 1001, 4096, out_given=True, out_aligned=False))
    assert f.names == ("pad-n",) and f.N == 1008


def test_layout_copy_a_and_b():
    f = layout_fixes(Layout(100, 4096, 4096, a_aligned=False, b_aligned=False))
    assert f.names == ("copy-a", "copy-b") and (f.N, f.K) == (4096, 4096)


def test_layout_stage_out():
    assert layout_fixes(Layout(100, 4096, 4096, out_given=True, out_aligned=False)).names == ("stage-out",)
    assert layout_fixes(Layout(100, 4096, 4096, out_given=False, out_aligned=False)).names == ()


def test_layout_bf16_pads_to_eight_elements_too():
    assert layout_fixes(Layout(1, 12, 20, dtype="bfloat16")).names == ("pad-k", "pad-n")
    assert (layout_fixes(Layout(1, 12, 20, dtype="bfloat16")).N, layout_fixes(Layout(1, 12, 20)).K) == (16, 24)
