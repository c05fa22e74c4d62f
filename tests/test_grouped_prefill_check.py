"""``benchmarks/grouped_prefill_check.py`` on the CPU: every module it plans is one v12 takes, the
timed groups it hands the children, and the rows and summary on made-up timings. (Running it is a
GPU benchmark: ``grouped_prefill_check.py run``.)"""

from pathlib import Path

import pytest

from gemm_ladder import make_config
from gemm_ladder.serve import kernel_pack
from gemm_ladder.sm90a import grouped

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def gp():
    return benchmark_script("grouped_prefill_check")


@pytest.mark.parametrize("bands", [False, True])
def test_every_planned_module_is_one_v12_takes(gp, bands):
    plan = gp.module_plan(bands)
    assert len({(p[0], p[4], p[5]) for p in plan}) == len(plan)  # no module twice
    for name, E, N, K, dtype, variant in plan:
        cfg = make_config("v12", 4096, N, K, **gp.knobs_of(E, dtype, variant))
        assert cfg.dtype == dtype
    # --bands: every swapped tile beside its banded twin, at token counts of each shape
    if bands:
        for name, variants in gp.BAND_VARIANTS.items():
            assert all(f"{v}_g64" in variants for v in variants if v.startswith("swap") and "_g" not in v)
            assert name in gp.BAND_TOKENS
    # the pack's prefill module (the baseline) and its decode module (swap16 past 16 experts) are timed
    for name, variants in gp.SHAPE_VARIANTS.items():
        assert variants[0] == gp.BASELINE and name in gp.TOKENS
        assert ("swap16" if dict((s[0], s[1]) for s in gp.gc.SHAPES)[name] > 16 else "swap32") in variants


def test_the_large_plan_times_the_suites_losing_cases_beside_todays_module(gp):
    """--large: the odd shape at 32768 tokens (the 128x256 defaults serve it) and DeepSeek-V3-like at
    32768 (swap64 serves it), each beside the other tiles, every one a module v12 takes."""
    plan = gp.module_plan(large=True)
    assert len({(p[0], p[5]) for p in plan}) == len(plan) and {p[4] for p in plan} == {gp.DTYPE}
    for name, E, N, K, dtype, variant in plan:
        make_config("v12", 4096, N, K, **gp.knobs_of(E, dtype, variant))
    assert 32768 in gp.LARGE_TOKENS["odd"] and 32768 in gp.LARGE_TOKENS["deepseek_v3"]
    assert {"default", "swap64"} <= set(gp.LARGE_VARIANTS["deepseek_v3"]) and gp.LARGE_VARIANTS["odd"][0] == gp.BASELINE


def test_the_large_plan_times_clusters_beside_the_default_and_epi128(gp, tmp_path):
    """--large (issue 33's floor case): the odd shape's 2x1 and 1x2 clusters beside the default and
    epi128 at 8192 and 32768 tokens, 2x1 on the Mixtral-like, DeepSeek-V3-like and Qwen-like weights too;
    a contiguous clustered module goes to the cluster check (an odd m-tile count in every expert), the
    masked one to the masked check and is never timed."""
    plan = gp.module_plan(large=True)
    variants = {(p[0], p[5]) for p in plan}
    assert {("odd", v) for v in ("default", "epi128", "c2x1", "c2x1_epi128", "c1x2")} <= variants
    assert {(s, "c2x1") for s in ("mixtral", "deepseek_v3", "qwen_moe")} <= variants
    assert gp.LARGE_TOKENS["odd"] == (8192, 32768) and gp.LARGE_TOKENS["mixtral"] == (8192, 32768)
    modules = [{"file": f"gprefill_{name}_bfloat16_{v}.so", "shape": name, "dtype": "bfloat16", "variant": v,
                "knobs": gp.VARIANTS[v]} for name, _, _, _, _, v in plan]
    jobs = gp.check_items(tmp_path, modules)
    names = {job: [p.rsplit("/", 1)[1] for p in paths] for job, paths in jobs.items()}
    assert names[gp.CHECK_JOBS["masked"]] == ["gprefill_odd_bfloat16_c2x1_masked.so"]
    assert sorted(names[gp.CHECK_JOBS["cluster"]]) == sorted(
        f"gprefill_{s}_bfloat16_{v}.so" for s, v in variants if v in ("c2x1", "c2x1_epi128", "c1x2"))
    assert sum(map(len, jobs.values())) == len(modules)
    items = gp.time_items(tmp_path, modules, {m["file"]: {"status": "ok"} for m in modules}, gp.LARGE_TOKENS)
    assert len(items) == 8 and not any("masked" in i for i in items)
    assert {("deepseek_v3", "c1x2"), ("mixtral", "c1x2")} <= variants and 32768 in gp.LARGE_TOKENS["qwen_moe"]
    assert all(gp.variant_of(gp.parse_item(i)[1][0]) == gp.BASELINE for i in items)
    assert {gp.variant_of(p) for i in items for p in gp.parse_item(i)[1]} >= {"c2x1", "c2x1_epi128", "c1x2", "epi128"}


@pytest.mark.parametrize("experts", [5, 8, 64, 256])
def test_the_cluster_checks_routing_gives_every_live_expert_an_odd_tile_count(gp, experts):
    counts = gp.odd_tile_counts(experts)
    live = [c for c in counts if c]
    assert len(counts) == experts and live and sum(counts) < 8192
    assert all(-(-c // 128) % 2 == 1 for c in live) and any(c % 128 for c in live)
    assert 0 in counts[:4] or experts < 4  # an empty expert among them
    # in 2x1 clusters each live expert's last pair holds a phantom partner
    units = grouped.walk(gp.gc.offsets_of(counts), sum(counts), 128, 4, 8, 8, cluster_m=2)
    phantoms = {u.expert for w in units for u in w if u.row0 >= u.row_end}
    assert phantoms == {e for e, c in enumerate(counts) if c}


def test_the_warp_scan_fits_the_default_tile_at_256_experts(gp):
    """The scan's partial results sit in the barriers' padding: at 256 experts the 128x256 tile
    fills the block to its last byte, and the warp scan must not need more."""
    serial = make_config("v12", 4096, 2048, 7168, **gp.knobs_of(256, "bfloat16", "default"))
    scan = make_config("v12", 4096, 2048, 7168, **gp.knobs_of(256, "bfloat16", "scan"))
    assert grouped.launch(scan)["smem_bytes"] == grouped.launch(serial)["smem_bytes"]


def test_the_timed_items_hold_one_shape_at_one_token_count_baseline_first(gp, tmp_path):
    modules = [{"file": f"gprefill_odd_bfloat16_{v}.so", "shape": "odd", "dtype": "bfloat16", "variant": v}
               for v in ("swap32", "default", "m64")]
    modules.append({"file": "gprefill_odd_float16_scan.so", "shape": "odd", "dtype": "float16", "variant": "scan"})
    checks = {m["file"]: {"status": "ok"} for m in modules}
    checks["gprefill_odd_bfloat16_m64.so"] = {"status": "wrong"}
    items = gp.time_items(tmp_path, modules, checks, {"odd": (512, 2048), "mixtral": (512,)})
    assert len(items) == 2  # no mixtral module: no item
    tokens, paths = gp.parse_item(items[1])
    assert tokens == 2048
    assert [gp.variant_of(p) for p in paths] == ["default", "swap32"]  # the wrong one and the fp16 one left out
    assert gp.variant_of("x/gprefill_qwen_moe_bfloat16_n128_d6.so") == "n128_d6"


def _timing(ms: dict, routing="balanced", bad=()):
    times = {f"ours:{v}": {"graph_ms": t, "queued_ms": t} for v, t in ms.items() if v != "grouped_mm"}
    times["grouped_mm"] = {"graph_ms": ms["grouped_mm"], "queued_ms": ms["grouped_mm"]}
    checks = {v: {"ok": v not in bad} for v in ms if v != "grouped_mm"}
    return {"tokens": 512, "routing": routing, "sets": 2, "checks": checks, "times": times}


def test_rows_and_summary_name_the_winner_and_the_ratios(gp):
    group = [{"file": f"{v}.so", "experts": 5, "N": 1000, "K": 520, "dtype": "bfloat16", "shape": "odd", "variant": v,
              "knobs": gp.VARIANTS[v]} for v in ("default", "n128", "swap32")]
    checks = {m["file"]: {"status": "ok"} for m in group}
    timing = {"status": "ok", "rows": [_timing({"default": 2.0, "n128": 1.0, "swap32": 1.6, "grouped_mm": 1.5}),
                                       _timing({"default": 1.0, "n128": 1.25, "swap32": 1.1, "grouped_mm": 1.2},
                                               "zipf")]}
    rows = gp.case_rows(group, checks, timing)
    assert len(rows) == 6 and all(r["correct"] and r["layout"] == "contiguous" for r in rows)
    n128 = next(r for r in rows if r["variant"] == "n128" and r["routing"] == "balanced")
    assert n128["best"] and n128["ratio_to_grouped_mm"] == pytest.approx(1.5)
    assert n128["ratio_to_baseline"] == pytest.approx(2.0)
    for key in ("experts", "tokens", "N", "K", "dtype", "routing", "correct", "peer_ratios"):
        assert key in n128
    s = gp.summary_of(rows)
    assert [(w["routing"], w["variant"]) for w in s["winners"]] == [("balanced", "n128"), ("zipf", "default")]
    assert s["winners_to_grouped_mm"] == pytest.approx((1.5 * 1.2) ** 0.5)
    assert s["baseline_to_grouped_mm"] == pytest.approx((0.75 * 1.2) ** 0.5)
    assert s["variants"]["swap32"]["min_to_grouped_mm"] == pytest.approx(1.5 / 1.6)


def test_a_variant_wrong_at_its_case_is_not_correct(gp):
    group = [{"file": f"{v}.so", "experts": 5, "N": 1000, "K": 520, "dtype": "bfloat16", "shape": "odd", "variant": v,
              "knobs": {}} for v in ("default", "n128")]
    t = _timing({"default": 2.0, "n128": 1.0, "grouped_mm": 1.5}, bad=("n128",))
    del t["times"]["ours:n128"]  # a variant that failed its step check is not timed
    rows = gp.case_rows(group, {m["file"]: {"status": "ok"} for m in group}, {"rows": [t]})
    n128 = next(r for r in rows if r["variant"] == "n128")
    assert not n128["correct"] and n128["ratio_to_grouped_mm"] is None and not n128["best"]
    assert gp.summary_of(rows)["winners"][0]["variant"] == "default"


def test_run_wants_a_results_name_with_grouped(gp, tmp_path, capsys):
    with pytest.raises(SystemExit):
        gp.main(["run", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert "must contain 'grouped'" in capsys.readouterr().err


# -- the rule through the front door (prepare --pack) ---------------------------------------------------
def _pack_entries(gp):
    items = kernel_pack.plan_grouped([(E, N, K, "contiguous") for _, E, N, K in gp.gc.SHAPES], [gp.DTYPE])
    return [e for i in items for e in kernel_pack.entries_of(i)]


def test_every_pack_case_has_the_module_whose_range_holds_its_rows(gp, tmp_path):
    entries = _pack_entries(gp)
    items = gp.pack_items(tmp_path, gp.TOKENS)
    assert len(items) == sum(len(t) for t in gp.TOKENS.values())
    for item in items:
        folder, name, tokens = item.split("#")
        assert folder == str(tmp_path / gp.PACK_FOLDER)
        E, N, K = next((E, N, K) for n, E, N, K in gp.gc.SHAPES if n == name)
        want = gp.expected_module(entries, E, N, K, int(tokens))
        assert want["tokens"][0] <= int(tokens) <= want["tokens"][1]
    # the odd shape at 512 tokens (102 rows an expert) takes the 64-token swap tile, at 2048 the defaults
    odd = [gp.expected_module(entries, 5, 1000, 520, t)["choice"]["rule"] for t in (512, 2048)]
    assert odd == ["grouped-prefill-swap64", "grouped-prefill"]
    # a tier's edge is the variants' measured case: Qwen-MoE's 64 experts at 2048 tokens, 32 an expert
    assert gp.expected_module(entries, 64, 1408, 2048, 2048)["choice"]["rule"] == "grouped-prefill-swap32"


def test_a_pack_row_is_correct_only_where_the_expected_module_served(gp, tmp_path):
    entries = _pack_entries(gp)
    item = gp.pack_items(tmp_path, {"deepseek_v3": (2048,)})[0]
    want = gp.expected_module(entries, 256, 2048, 7168, 2048)
    times = {"ours": {"graph_ms": 1.0, "queued_ms": 1.1}, "grouped_mm": {"graph_ms": 1.05, "queued_ms": 1.2}}
    ok = {"ok": True}
    res = {"status": "ok", "source": "kernel pack", "kernel": f"kernel: v12 {want['file']}",
           "rows": [{"tokens": 2048, "routing": "balanced", "sets": 2, "check": ok, "times": times},
                    {"tokens": 2048, "routing": "zipf", "sets": 2, "check": {"ok": False}, "times": {}}]}
    rows = gp.pack_rows(entries, item, res)
    assert [r["correct"] for r in rows] == [True, False]
    assert rows[0]["rule"] == "grouped-prefill-swap32" and rows[0]["ratio_to_grouped_mm"] == pytest.approx(1.05)
    other = dict(res, kernel="kernel: v12 some_other_module.so")
    assert not any(r["correct"] for r in gp.pack_rows(entries, item, other))
    crashed = gp.pack_rows(entries, item, {"status": "crash", "detail": "boom"})
    assert len(crashed) == 1 and not crashed[0]["correct"] and "boom" in crashed[0]["detail"]


def test_the_promo_plan_pairs_every_tier_with_its_l2_twin(gp, tmp_path):
    """--promo: each tier of the policy for the suite's weights beside the same knobs with l2_promo
    toggled, each pair only at the suite's token counts the tier serves (every count of a weight served
    once), the twin's baseline the tier; the timed groups hold a pair and nothing else."""
    plan = gp.promo_plan()
    assert {m["shape"] for m in plan} == {f[0] for f in gp.gc.SUITE_FAMILIES}
    tiers = [m for m in plan if not m["variant"].endswith(gp.PROMO)]
    for tier in tiers:
        twin = next(m for m in plan if m["variant"] == tier["variant"] + gp.PROMO and m["shape"] == tier["shape"])
        assert twin["knobs"] == {**tier["knobs"], "l2_promo": True} and "l2_promo" not in tier["knobs"]
        assert twin["baseline"] == tier["baseline"] == tier["variant"] and twin["tokens_served"] == tier["tokens_served"]
        make_config("v12", 4096, tier["N"], tier["K"], **twin["knobs"])
    for name, *_ in gp.gc.SUITE_FAMILIES:
        served = sorted(t for m in tiers if m["shape"] == name for t in m["tokens_served"])
        assert served == sorted(gp.gc.SUITE_TOKENS), name
    modules = [{**m, "file": f"gprefill_{m['shape']}_bfloat16_{m['variant']}.so"} for m in plan]
    tokens = {name: list(gp.gc.SUITE_TOKENS) for name, *_ in gp.gc.SUITE_FAMILIES}
    items = gp.time_items(tmp_path, modules, {m["file"]: {"status": "ok"} for m in modules}, tokens)
    assert len(items) == len(gp.gc.SUITE_FAMILIES) * len(gp.gc.SUITE_TOKENS)
    for item in items:
        t, paths = gp.parse_item(item)
        names = [gp.variant_of(p) for p in paths]
        assert len(names) == 2 and names[1] == names[0] + gp.PROMO, names
        files = {Path(p).name for p in paths}
        assert all(t in m["tokens_served"] for m in modules if m["file"] in files)


def test_variant_of_reads_any_prepared_name(gp):
    assert gp.variant_of("/x/gprefill_deepseek_v3_bfloat16_swap64.so") == "swap64"
    assert gp.variant_of("gprefill_odd_float16_scan.so") == "scan"
    assert gp.variant_of("gprefill_qwen3_moe_bfloat16_grouped-prefill-swap32+promo.so") == "grouped-prefill-swap32+promo"
    with pytest.raises(ValueError, match="gprefill_<shape>_<dtype>_<variant>"):
        gp.variant_of("other.so")
