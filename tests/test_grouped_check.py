"""``benchmarks/grouped_check.py`` on the CPU: the routings it checks and times, and the arithmetic
of a result row on made-up timings. (Running it is a GPU benchmark: ``grouped_check.py run``.)"""

from pathlib import Path

import pytest

from gemm_ladder import make_config

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def gc():
    return benchmark_script("grouped_check")


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


# -- the masked layout's part -------------------------------------------------------------------------
@pytest.mark.parametrize("experts, batch, topk", [(8, 8, 2), (8, 512, 2), (64, 32, 8), (256, 128, 8), (5, 3, 8)])
@pytest.mark.parametrize("routing", ["balanced", "zipf"])
def test_topk_routing_gives_each_token_k_distinct_experts(gc, experts, batch, topk, routing):
    counts = gc.topk_counts(routing, experts, batch, topk, seed=1)
    assert len(counts) == experts and sum(counts) == batch * min(topk, experts)
    assert max(counts) <= batch  # a token picks an expert once: a slot of batch rows holds them all
    if routing == "balanced":
        assert max(counts) - min(counts) <= 1


def test_zipf_topk_is_skewed(gc):
    counts = sorted(gc.topk_counts("zipf", 64, 256, 8, seed=2))
    assert counts[-1] > 3 * (256 * 8 // 64) and counts[0] < 256 * 8 // 64


@pytest.mark.parametrize("experts", [1, 5, 8, 64, 256])
def test_masked_check_routings(gc, experts):
    T = gc.check_max_tokens(experts)
    assert T % 64  # not a multiple of any tile height
    got = {r: gc.masked_counts_of(r, experts, T, seed=4) for r in gc.MASKED_CHECK_ROUTINGS}
    assert got["empty"] == [0] * experts
    assert sorted(got["one_full"])[-1] == T and sum(got["one_full"]) == T
    assert all(0 <= c <= T for r in ("zipf", "odd") for c in got[r])
    if experts >= 8:  # some counts the kernel must clamp
        assert any(c < 0 or c > T for c in got["clamped"])
    with pytest.raises(ValueError, match="routing 'ragged'"):
        gc.masked_counts_of("ragged", experts, T)


def test_prepare_plans_both_layouts_in_both_dtypes(gc):
    plan = gc.module_plan()
    for layout in gc.LAYOUTS:
        for name, *_ in gc.SHAPES:
            for dtype in gc.DTYPES:
                assert any(p[0] == layout and p[1] == name and p[5] == dtype and not p[6] for p in plan)
    assert all(name in gc.MASKED_SHAPES for name, *_ in gc.SHAPES)
    assert gc.shape_name(256, 2048, 7168) == "deepseek_v3"
    # the decode batches: total tokens <= 256 on every model shape, and a larger one beside
    for name, (topk, batches) in gc.MASKED_SHAPES.items():
        if batches:
            assert min(batches) * topk <= 256 and max(batches) * topk > 256, name


def test_a_masked_row_names_its_peers_and_the_best(gc):
    times = {"ours": {"graph_ms": 1.0, "queued_ms": 1.0}, "grouped_mm": {"graph_ms": 1.5, "queued_ms": 1.5},
             "bmm": {"graph_ms": 1.1, "queued_ms": 2.0}, "expert_loop": {"graph_ms": 4.0, "queued_ms": 5.0}}
    r = gc.row({"experts": 8, "tokens": 64}, True, times, layout="masked", peers=gc.MASKED_PEERS)
    assert r["layout"] == "masked" and r["ratio_to_grouped_mm"] == pytest.approx(1.5)
    assert r["ratio_to_best_peer"] == pytest.approx(1.1)  # the bmm over max_tokens is the closest
    assert set(r["peer_ratios"]) == {f"{p}_{h}" for p in gc.MASKED_PEERS for h in ("graph", "queued")}
    summary = gc.summary_of([{**r, "kind": "timed", "variant": "default"},
                             {**r, "kind": "timed", "variant": "default", "tokens": 1024, "ratio_to_best_peer": 0.5}])
    assert summary["masked"]["decode_min_ratio_to_best_peer"] == pytest.approx(1.1)  # 1024 tokens: not decode
    assert summary["contiguous"]["geomean_ratio_to_grouped_mm"] is None


def test_module_rows_of_a_masked_module(gc):
    """A masked module's check and timing results become rows of the issue's format, its checked
    rows carrying the tokens the routing computed, a failure its own row."""
    m = {"file": "x.so", "layout": "masked", "shape": "mixtral", "experts": 8, "N": 14336, "K": 4096,
         "dtype": "bfloat16", "variant": "default"}
    check = {"status": "ok", "cases": [{"routing": "zipf", "ok": True, "rel_err": 1e-3, "torch_rel_err": 1e-3,
                                        "tokens": 77}]}
    times = {p: {"graph_ms": 1.0, "queued_ms": 1.0} for p in ("ours", "grouped_mm", "bmm", "expert_loop")}
    timing = {"status": "ok", "rows": [{"tokens": 64, "max_tokens": 32, "batch": 32, "topk": 2, "routing": "zipf",
                                        "active_experts": 8, "times": times}]}
    checked, timed = gc.module_rows(m, check, timing, True)
    assert checked["layout"] == timed["layout"] == "masked" and checked["tokens"] == 77 and checked["correct"]
    assert timed["kind"] == "timed" and timed["max_tokens"] == 32 and timed["ratio_to_best_peer"] == pytest.approx(1)
    assert "bmm_graph" in timed["peer_ratios"] and "cublas_loop_graph" not in timed["peer_ratios"]
    rows = gc.module_rows(m, {"status": "wrong", "cases": []}, None, False)
    assert [r["kind"] for r in rows] == ["failure"] and rows[0]["correct"] is False


def test_run_sends_each_layout_to_its_jobs_and_times_only_what_was_right(gc, tmp_path, monkeypatch):
    """``run``'s plumbing on the CPU, the GPU jobs replaced: contiguous modules go to check_job and
    time_job, masked ones to masked_check_job and, in a timed dtype and correct, masked_time_job;
    ``--layout masked`` leaves the contiguous modules out."""
    mods = [{"file": f"{name}.so", "layout": layout, "shape": "mixtral", "experts": 8, "N": 14336, "K": 4096,
             "dtype": dtype, "variant": "default"}
            for name, layout, dtype in (("c", "contiguous", "bfloat16"), ("m", "masked", "bfloat16"),
                                        ("m16", "masked", "float16"), ("bad", "masked", "bfloat16"))]
    mods.append({**mods[1], "file": "odd.so", "shape": "odd"})  # checked, not timed: no decode batches
    (tmp_path / gc.PLAN_FILE).write_text(__import__("json").dumps({"format": gc.FORMAT, "modules": mods}))
    calls = []
    times = {p: {"graph_ms": 1.0, "queued_ms": 1.0} for p in ("ours", "grouped_mm", "bmm", "expert_loop",
                                                                "cublas_loop")}

    def run_batch(job, paths, **kw):
        calls.append((job.split(":")[1], [Path(p).name for p in paths]))
        if job.endswith("check_job"):
            return [{"status": "wrong" if "bad" in p else "ok", "cases": []} for p in paths]
        return [{"status": "ok", "rows": [{"tokens": 64, "routing": "zipf", "times": times}]} for _ in paths]

    class Sampler:
        def stop(self):
            pass

        def between(self, *_):
            return {}

    monkeypatch.setattr(gc.device, "why_no_gpu", lambda index: None)
    monkeypatch.setattr(gc.isolate, "run_batch", run_batch)
    monkeypatch.setattr(gc, "Sampler", Sampler)
    monkeypatch.setattr(gc.harness, "gpu_info", lambda: {"name": "fake"})
    out = tmp_path / "grouped_run.json"
    assert gc.run(tmp_path, out) == 0
    assert calls == [("check_job", ["c.so"]), ("time_job", ["c.so"]),
                     ("masked_check_job", ["m.so", "m16.so", "bad.so", "odd.so"]), ("masked_time_job", ["m.so"])]
    result = __import__("json").loads(out.read_text())
    kinds = [(r["layout"], r["dtype"], r["kind"]) for r in result["rows"]]
    assert kinds == [("contiguous", "bfloat16", "timed"), ("masked", "bfloat16", "timed"),
                     ("masked", "bfloat16", "failure")]
    assert result["summary"]["correct_modules"] == 4 and result["summary"]["masked"]["decode_min_ratio_to_best_peer"]
    calls.clear()
    assert gc.main(["run", str(tmp_path), "--out", str(out), "--layout", "masked"]) == 0
    assert [c[0] for c in calls] == ["masked_check_job", "masked_time_job"]


def test_the_decode_plan_builds_every_variant_of_each_shape_in_both_layouts(gc):
    plan = gc.decode_plan()
    for layout in gc.LAYOUTS:
        for shape in gc.DECODE_SHAPES:
            assert {v for lay, name, *_, v in plan if (lay, name) == (layout, shape)} == set(gc.DECODE_VARIANTS)
    assert len(plan) == len(set(plan))
    # every module the plan names is one v12 builds (the validator refuses none)
    for layout, _, E, N, K, dtype, variant in plan:
        make_config("v12", gc.BUILD_M, N, K, experts=E, dtype=dtype, layout=layout,
                    spec=gc.spec_of_dtype(dtype).text(), **gc.DECODE_VARIANTS[variant])


def test_decode_groups_put_the_baseline_first_and_leave_the_odd_shape_out(gc):
    modules = [{"layout": lay, "shape": name, "variant": v, "file": f"{lay}_{name}_{v}.so"}
               for lay, name, *_, v in gc.decode_plan()]
    groups = gc.decode_groups(modules)
    assert len(groups) == len(gc.LAYOUTS) * len(gc.DECODE_SHAPES)
    assert all(g[0]["variant"] == gc.DECODE_BASELINE and len(g) == len(gc.DECODE_VARIANTS) for g in groups)
    assert all(m["shape"] != "odd" for g in groups for m in g)
    assert gc.variant_of("grouped_decode_mixtral_bfloat16_masked_narrow_scan") == "narrow_scan"
    assert gc.variant_of("grouped_decode_mixtral_bfloat16_masked_narrow") == "narrow"


def test_decode_sets_spill_the_l2_with_the_active_weights(gc):
    l2 = 50 << 20
    # Qwen-MoE-like, 8 active experts of 1408x2048 (46 MB): one set would stay in L2
    n = gc.decode_sets(64, 8, 1408, 2048, l2)
    assert n * 8 * 1408 * 2048 * 2 >= 3 * l2 and n >= 2
    assert gc.decode_sets(256, 200, 2048, 7168, l2) == 2


def test_decode_rows_carry_the_variant_and_its_ratio_to_the_baseline(gc):
    group = [{"layout": "masked", "shape": "mixtral", "experts": 8, "N": 14336, "K": 4096, "dtype": "bfloat16",
              "variant": v, "file": f"{v}.so"} for v in ("narrow", "swap16")]
    checks = {"narrow.so": {"status": "ok"}, "swap16.so": {"status": "ok"}}
    timing = {"rows": [{"tokens": 64, "max_tokens": 32, "batch": 32, "topk": 2, "routing": "zipf",
                        "active_experts": 8, "sets": 2,
                        "checks": {"narrow": {"ok": True}, "swap16": {"ok": False}},
                        "times": {"ours:narrow": {"graph_ms": 0.3}, "ours:swap16": {"graph_ms": 0.2},
                                  "grouped_mm": {"graph_ms": 0.33}, "bmm": {"graph_ms": 0.4},
                                  "expert_loop": {"graph_ms": 0.6}}}]}
    rows = gc.decode_rows(group, checks, timing)
    assert [r["variant"] for r in rows] == ["narrow", "swap16"]
    narrow, swap = rows
    assert narrow["correct"] and not swap["correct"]  # the step's own check failed
    assert swap["ratio_to_baseline"] == pytest.approx(1.5) and narrow["ratio_to_baseline"] == pytest.approx(1.0)
    assert swap["ratio_to_grouped_mm"] == pytest.approx(1.65)
    assert swap["ratio_to_best_peer"] == pytest.approx(1.65)  # grouped_mm was the fastest peer
    summary = gc.decode_summary(rows)
    assert summary["masked"]["swap16"]["to_baseline"]["geomean"] == pytest.approx(1.5)
    assert summary["masked"]["swap16"]["correct"] == 0
