"""``benchmarks/grouped_check.py`` on the CPU: the routings it checks and times, and the arithmetic
of a result row on made-up timings. (Running it is a GPU benchmark: ``grouped_check.py run``.)"""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "grouped_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("grouped_check", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grouped_check"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("experts", [1, 5, 8, 64, 256])
@pytest.mark.parametrize("tokens", [0, 1, 64, 1000, 8192])
def test_every_routing_places_its_tokens(gc, experts, tokens):
    for routing in gc.CHECK_ROUTINGS:
        counts = gc.counts_of(routing, experts, tokens, seed=3)
        assert len(counts) == experts and min(counts) >= 0
        assert sum(counts) == tokens - (min(37, tokens) if routing == "tail" else 0), routing
        if routing == "one" and tokens:
            assert sum(c > 0 for c in counts) == 1
        if routing == "half_empty" and experts > 1:
            assert all(c == 0 for c in counts[::2])
        if routing == "balanced":
            assert max(counts) - min(counts) <= 1


def test_zipf_is_skewed_and_the_offsets_are_cumulative_ends(gc):
    counts = gc.counts_of("zipf", 64, 8192)
    assert max(counts) > 8 * (8192 // 64) and sorted(counts)[0] < 8192 // 64
    assert gc.offsets_of([3, 0, 5]) == [3, 3, 8]
    with pytest.raises(ValueError, match="routing 'topk'"):
        gc.counts_of("topk", 8, 100)


def test_a_row_has_the_issues_fields_and_ratios_as_peer_over_ours(gc):
    times = {"ours": {"graph_ms": 1.0, "queued_ms": 1.2}, "grouped_mm": {"graph_ms": 1.25, "queued_ms": 1.5},
             "cublas_loop": {"graph_ms": 3.0, "queued_ms": 2.4}}
    r = gc.row({"experts": 8, "tokens": 512, "N": 14336, "K": 4096, "dtype": "bfloat16", "routing": "zipf"}, True,
               times)
    for key in ("layout", "experts", "tokens", "N", "K", "dtype", "routing", "correct", "ratio_to_grouped_mm",
                "peer_ratios"):
        assert key in r
    assert r["layout"] == "contiguous" and r["ratio_to_grouped_mm"] == pytest.approx(1.25)
    assert r["peer_ratios"]["cublas_loop_graph"] == pytest.approx(3.0)
    assert r["peer_ratios"]["grouped_mm_queued"] == pytest.approx(1.25)
    # a peer that did not run (torch without fp16 grouped_mm) leaves its ratio empty
    assert gc.row({}, True, {"ours": {"graph_ms": 1.0}})["ratio_to_grouped_mm"] is None


def test_run_wants_a_results_name_with_grouped(gc, tmp_path, capsys):
    with pytest.raises(SystemExit):
        gc.main(["run", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert "must contain 'grouped'" in capsys.readouterr().err


def test_a_variant_is_named_by_its_knobs(gc):
    assert gc.variant_text({}) == "default"
    assert gc.variant_text({"blk_n": 128, "pipe_depth": 5}) == "blk_n128_pipe_depth5"
    assert all(name in {s[0] for s in gc.SHAPES} for name in gc.VARIANTS)
