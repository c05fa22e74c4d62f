"""Kernel packs of grouped weights (issue 33): what a request plans (plan.grouped_choices, the
decode and prefill modules and their token ranges), pack.json's grouped fields, the grouped front
doors' lookup (by E, N, K, dtype, layout and the token count), the fallback and strict mode where
no pack serves, and the CLI's refusals. The GPU side is mocked; one test builds real modules."""

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gemm_ladder
from gemm_ladder.compile import module_cache
from gemm_ladder.core import cli_types, files
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.manifest import MANIFEST_VERSION, read_manifest
from gemm_ladder.serve import front, grouped, grouped_masked, kernel_pack, plan
from gemm_ladder.serve.front import KernelFallbackWarning, NoKernelError
from gemm_ladder.serve.kernel_pack import PACK_MANIFEST, KernelPack, PackError

REPO = Path(__file__).resolve().parents[1]
IDENT = {"tvm_version": "0.27.0.post1", "compiler": "nvrtc 13.0", "sources": "s"}
MIXTRAL = (8, 14336, 4096)


# -- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, top", [("contiguous", plan.GROUPED_PREFILL_SWAPS[0][1] * 8),
                                         ("masked", plan.GROUPED_DECODE_SLOT)])
def test_a_grouped_weight_gets_a_decode_and_a_prefill_module(layout, top):
    choices = plan.grouped_choices(*MIXTRAL, "bfloat16", layout)
    decode, prefill = choices[0], choices[-1]
    assert decode.tokens == (1, top) and prefill.tokens[1] == plan.GROUPED_MAX_TOKENS
    # the ranges tile every token count, fewest first
    assert [g.tokens[0] for g in choices[1:]] == [g.tokens[1] + 1 for g in choices[:-1]]
    # decode: swap AB, 32-token tiles for 8 experts (a quarter of a top-2 batch each), and the warp scan
    assert decode.choice.knobs["swap_ab"] and decode.choice.knobs["warp_scan"] and decode.choice.knobs["blk_m"] == 32
    # measured on an H100: its evidence is a committed results file
    assert decode.choice.rule == "grouped-decode-swap" and decode.choice.measured
    assert plan.GROUPED_DECODE in decode.choice.why and (REPO / plan.GROUPED_DECODE).is_file()
    assert "blk_m" not in prefill.choice.knobs and prefill.choice.measured  # v12's 128-row default
    for g in (decode, prefill):
        assert g.choice.rung == "v12" and g.choice.knobs["layout"] == layout and g.choice.knobs["experts"] == 8
        assert "grouped_true" in g.choice.knobs["spec"]
        # the evidence the rule cites is committed
        cited = [w.strip("[];:,") for w in g.choice.why.split() if w.startswith("[benchmarks/")]
        assert cited and all((REPO / c).exists() for c in cited), g.choice.why


def test_the_contiguous_split_follows_the_rows_an_expert_holds():
    """Contiguous prefill's tiers (issue 33, GROUPED_PREFILL): swap AB with 16-token tiles (more than
    16 experts) up to 1 row an expert on average, 32 up to 32, 64 up to 128, the 128x256 defaults past."""
    def tiers(E, N, K):
        return [(g.tokens, g.choice.rule, g.choice.knobs.get("blk_m"), g.choice.knobs.get("swap_ab", False))
                for g in plan.grouped_choices(E, N, K, "bfloat16")]
    top = plan.GROUPED_MAX_TOKENS
    assert tiers(256, 2048, 7168) == [((1, 256), "grouped-decode-swap", 16, True),
                                      ((257, 8192), "grouped-prefill-swap32", 32, True),
                                      ((8193, 32768), "grouped-prefill-swap64", 64, True),
                                      ((32769, top), "grouped-prefill", None, False)]
    # 8 experts: decode's tiles are 32 tokens already, one module up to 32 rows an expert
    assert tiers(8, 14336, 4096) == [((1, 256), "grouped-decode-swap", 32, True),
                                     ((257, 1024), "grouped-prefill-swap64", 64, True),
                                     ((1025, top), "grouped-prefill", None, False)]
    for g in plan.grouped_choices(64, 1408, 2048, "bfloat16"):
        cited = [w.strip("[];:,") for w in g.choice.why.split() if w.startswith("[benchmarks/")]
        assert g.choice.measured and plan.GROUPED_PREFILL in cited and (REPO / plan.GROUPED_PREFILL).is_file()


ODD = (5, 1000, 520)  # the grouped suite's short-K weight (issue 33's floor case)


def test_the_contiguous_swapped_tiers_take_the_l2_fills_and_no_other():
    """GROUPED_L2_PROMO: the contiguous layout's swapped tiers ask for 256-byte L2 fills (l2_promo); the
    128x256 defaults, the 2x1 clusters and the masked layout's modules (not measured with it) do not."""
    for weight in (MIXTRAL, (256, 2048, 7168), (64, 1408, 2048), ODD):
        for g in plan.grouped_choices(*weight, "bfloat16"):
            swapped = g.choice.knobs.get("swap_ab", False)
            assert g.choice.knobs.get("l2_promo", False) is swapped, (weight, g.choice.rule)
            if swapped:
                assert plan.GROUPED_L2_PROMO in g.choice.why
                gemm_ladder.make_config("v12", 4096, *weight[1:], **g.choice.knobs)  # the validator takes it
        assert all("l2_promo" not in g.choice.knobs for g in plan.grouped_choices(*weight, "bfloat16", "masked"))
    assert (REPO / plan.GROUPED_L2_PROMO).is_file()


def test_a_short_k_weight_takes_2x1_clusters_past_many_m_tiles_an_expert():
    """At K <= GROUPED_CLUSTER_K the defaults' tier ends at GROUPED_CLUSTER_ROWS rows an expert on average
    (4096 for 5 experts: 20480 rows), and the 2x1 cluster module serves past it: the measured win (32768
    tokens, 51 m-tiles an expert) is inside, the measured loss (8192 tokens, 13 m-tiles) outside; no other
    tier moves. The long-K weights of the suite keep the defaults to the top (they lost in clusters)."""
    choices = plan.grouped_choices(*ODD, "bfloat16")
    *rest, defaults, clustered = choices
    cluster_from = plan.GROUPED_CLUSTER_ROWS * ODD[0]
    assert defaults.choice.rule == "grouped-prefill" and defaults.tokens[1] == cluster_from
    assert clustered.choice.rule == "grouped-prefill-c2x1" and clustered.tokens == (cluster_from + 1,
                                                                                     plan.GROUPED_MAX_TOKENS)
    assert clustered.tokens[0] <= 32768 and not clustered.tokens[0] <= 8192
    assert clustered.choice.knobs == {**defaults.choice.knobs, "cluster_m": 2} and clustered.choice.measured
    assert plan.GROUPED_CLUSTER in clustered.choice.why and "K = 520" in clustered.choice.why
    assert (REPO / plan.GROUPED_CLUSTER).is_file()
    assert [g.choice.rule for g in rest] == ["grouped-decode-swap", "grouped-prefill-swap64"]
    # the cluster knob builds: the validator takes the tier's knobs at the pack's build M
    gemm_ladder.make_config("v12", 4096, 1000, 520, **clustered.choice.knobs)
    for weight in (MIXTRAL, (256, 2048, 7168), (64, 1408, 2048)):
        assert all("cluster_m" not in g.choice.knobs for g in plan.grouped_choices(*weight, "bfloat16")), weight
    # the rule's edges: K just past the bound keeps the defaults; more experts move the tier up with them
    assert "grouped-prefill-c2x1" not in [g.choice.rule for g in plan.grouped_choices(5, 1000, 1032, "bfloat16")]
    assert plan.grouped_choices(64, 1000, 520, "bfloat16")[-1].tokens[0] == 64 * plan.GROUPED_CLUSTER_ROWS + 1
    # the masked layout knows the slot, not the counts: no cluster tier there
    assert all("cluster_m" not in g.choice.knobs for g in plan.grouped_choices(*ODD, "bfloat16", "masked"))


def test_a_refused_cluster_tier_leaves_the_defaults_to_the_top_by_name(monkeypatch):
    real = plan._validate  # pylint: disable=protected-access

    def refuse_clusters(rung, p, knobs):
        return "cluster_m=2: refused here" if knobs.get("cluster_m") == 2 else real(rung, p, knobs)

    monkeypatch.setattr(plan, "_validate", refuse_clusters)
    last = plan.grouped_choices(*ODD, "bfloat16")[-1]
    assert last.choice.rule == "grouped-prefill" and last.tokens[1] == plan.GROUPED_MAX_TOKENS
    assert any("grouped-prefill-c2x1" in s and "refused here" in s for s in last.choice.skipped)


def test_a_refused_prefill_swap_tier_is_passed_over_by_name(monkeypatch):
    """Where the validator refuses the 32-token swap tile, the 64-token tier reaches down to the decode
    module's range, and the refusal is named on the tier that took its place."""
    real = plan._validate  # pylint: disable=protected-access

    def refuse_32(rung, p, knobs):
        if knobs.get("swap_ab") and knobs.get("blk_m") == 32:
            return "blk_m=32: refused here"
        return real(rung, p, knobs)

    monkeypatch.setattr(plan, "_validate", refuse_32)
    choices = plan.grouped_choices(256, 2048, 7168, "bfloat16")
    assert [(g.tokens, g.choice.knobs.get("blk_m")) for g in choices] == [
        ((1, 256), 16), ((257, 32768), 64), ((32769, plan.GROUPED_MAX_TOKENS), None)]
    assert any("grouped-prefill-swap32" in s and "refused here" in s for s in choices[1].choice.skipped)


def test_many_experts_get_16_token_swap_tiles_and_a_refused_swap_falls_back_to_64x128(monkeypatch):
    decode = plan.grouped_choices(256, 2048, 7168, "bfloat16", "masked")[0].choice
    assert decode.knobs["swap_ab"] and decode.knobs["blk_m"] == 16 and "256 experts: 16-token tiles" in decode.why
    monkeypatch.setattr(plan, "GROUPED_SWAP_KNOBS", {**plan.GROUPED_SWAP_KNOBS, "num_warpgroups": 3})
    decode = plan.grouped_choices(*MIXTRAL, "bfloat16", "masked")[0].choice
    assert decode.rule == "grouped-decode" and decode.knobs["blk_m"] == 64 and "swap_ab" not in decode.knobs
    assert any("grouped-decode-swap" in s and "num_warpgroups=3" in s for s in decode.skipped), decode.skipped


def test_a_weight_v12_refuses_is_refused_by_name():
    with pytest.raises(ConfigError, match="multiple of 16"):
        plan.grouped_choices(8, 14336, 4095, "float16")
    with pytest.raises(ConfigError, match="experts=2000"):
        plan.grouped_choices(2000, 256, 256, "float16")
    with pytest.raises(ConfigError, match="'contiguous' .* or 'masked'"):
        plan.grouped_choices(8, 256, 256, "float16", "sideways")
    with pytest.raises(ConfigError, match="the grouped GEMM builds float16, bfloat16, float8_e4m3"):
        kernel_pack.plan_grouped([(8, 256, 256, None)], ["float8_e5m2"])  # e4m3 grouped fp8: test_grouped_fp8.py


# -- planning a pack (dry run) -------------------------------------------------------------------
def test_a_grouped_request_plans_each_layout_and_dtype():
    items = kernel_pack.plan_grouped([(*MIXTRAL, None), (64, 1408, 2048, "masked")], ["float16", "bfloat16"])
    entries = [e for i in items for e in kernel_pack.entries_of(i)]
    # Mixtral in both layouts, Qwen-MoE masked only: masked, a decode and a prefill module; contiguous
    # (8 experts), swap AB 32 and 64 and the defaults; in both dtypes
    assert len(items) == len(entries) == (3 + 2 + 2) * 2
    assert {(e["experts"], e["layout"]) for e in entries} == {(8, "contiguous"), (8, "masked"), (64, "masked")}
    assert all(e["rung"] == "v12" and e["dynamic_m"] and kernel_pack.is_grouped(e) for e in entries)
    for e in entries:  # m_range: the rows of A (masked: A viewed [E * max_tokens, K])
        factor = e["experts"] if e["layout"] == "masked" else 1
        assert e["m_range"] == [factor * t for t in e["tokens"]]
    assert len({e["file"] for e in entries}) == len(entries)  # the file names the layout and the tiles


# -- a pack of stand-in modules, and the front doors' lookup --------------------------------------
def stand_in_build(job, folder):
    """A grouped module's bytes and manifest (what module_cache keeps of a build), at once."""
    blob = f"module {job.name}".encode() * 50
    so = Path(folder) / f"{job.name}.so"
    with files.replacing(so) as tmp:
        tmp.write_bytes(blob)
    files.write_json(Path(str(so) + ".json"), {
        "format": MANIFEST_VERSION, "rung": job.rung, "shape": list(job.shape), "dtype": job.knobs["dtype"],
        "arch": "sm_90a", "knobs": job.knobs, "tvm_version": "0.27.0.post1", "so_bytes": len(blob),
        "so_sha256": hashlib.sha256(blob).hexdigest(), **(job.extra or {}),
        "launch": {"dynamic_m": True, "experts": job.knobs["experts"], "layout": job.knobs["layout"]}})
    return so


@pytest.fixture
def moe_pack(tmp_path, monkeypatch):
    real = module_cache.get_or_build
    monkeypatch.setattr(module_cache, "get_or_build",
                        lambda job, root=None: real(job, root, build=stand_in_build, ident=IDENT))
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["bfloat16"], workers=1, cache_root=tmp_path / "cache",
                                 grouped=[(*MIXTRAL, None)])
    assert [r["status"] for r in man["results"]] == ["built"] * 5
    return tmp_path / "pack"


def test_a_built_pack_checks_and_finds_by_token_count(moe_pack):
    pk = KernelPack(moe_pack)
    assert all(pk.check_entry(e) for e in pk.modules)
    small = pk.find_grouped("contiguous", *MIXTRAL, "bfloat16", "sm_90a", 64)
    large = pk.find_grouped("contiguous", *MIXTRAL, "bfloat16", "sm_90a", 8192)
    assert small.fit == large.fit == "tuned-range"
    assert small.entry["choice"]["rule"] == "grouped-decode-swap" and large.entry["choice"]["rule"] == "grouped-prefill"
    # masked: the slot (max_tokens) picks; slots past 64 may hold many tokens an expert
    assert pk.find_grouped("masked", *MIXTRAL, "bfloat16", "sm_90a", 256).entry["choice"]["rule"] == "grouped-prefill"
    assert pk.find_grouped("masked", *MIXTRAL, "bfloat16", "sm_90a", 64).entry["choice"]["rule"] == \
        "grouped-decode-swap"
    assert pk.find_grouped("contiguous", *MIXTRAL, "float16", "sm_90a", 64) is None  # another dtype
    assert pk.find_grouped("contiguous", 16, 14336, 4096, "bfloat16", "sm_90a", 64) is None  # another E
    # a dense lookup of the same N and K never gets a grouped module
    assert pk.find(64, 14336, 4096, "bfloat16", "sm_90a") is None
    shown = subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", "show", str(moe_pack)], capture_output=True,
                           text=True, cwd=REPO, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "1..256 rows" in shown.stdout and "65..1048576 max_tokens" in shown.stdout
    assert shown.stdout.count("grouped-decode") == 2


def test_a_grouped_entry_that_lies_about_its_module_is_refused(moe_pack):
    man = json.loads((moe_pack / PACK_MANIFEST).read_text())
    man["modules"][0]["experts"] = 16
    (moe_pack / PACK_MANIFEST).write_text(json.dumps(man))
    pk = KernelPack(moe_pack)
    with pytest.raises(PackError, match="grouped module of 8 experts"):
        pk.check_entry(pk.modules[0])
    del man["modules"][0]["tokens"]
    (moe_pack / PACK_MANIFEST).write_text(json.dumps(man))
    with pytest.raises(PackError, match=r"modules\[0\]\.tokens|without tokens"):
        KernelPack(moe_pack)


class FakeModule:
    """Stands in for a loaded pack module (no GPU here): records the launches."""

    def __init__(self, found):
        self.path, self.calls = found.path, []

    def launch(self, *args):
        self.calls.append(args)


@pytest.fixture
def gpu_mocked(monkeypatch):
    monkeypatch.setattr(grouped.device, "arch_of", lambda index: "sm_90a")
    loaded = {}

    def load(found):
        return loaded.setdefault(found.path, FakeModule(found))

    monkeypatch.setattr(grouped, "pack_module", load)
    monkeypatch.setattr(grouped_masked, "pack_module", load)
    front.reset()
    grouped.reset()
    yield loaded
    front.reset()
    grouped.reset()


def test_the_front_doors_take_the_pack_module_for_the_token_count(moe_pack, gpu_mocked):
    with pytest.warns(KernelFallbackWarning, match="pack build --grouped 8,14336,4096,contiguous"):
        assert grouped.route_of(*MIXTRAL, "bfloat16", 0, 64).source == "torch fallback"  # no pack yet
    gemm_ladder.use_pack(moe_pack)  # the routes made without it are forgotten
    decode = grouped.route_of(*MIXTRAL, "bfloat16", 0, 64)
    prefill = grouped.route_of(*MIXTRAL, "bfloat16", 0, 4096)
    assert decode.source == prefill.source == "kernel pack"
    assert "m32n128" in decode.lines[0] and "swapabTrue" in decode.lines[0] and "m128n256" in prefill.lines[0]
    assert "layout=contiguous" in decode.lines[0]
    assert str(moe_pack) in decode.lines[1] and "rows of A in its range 1..256" in decode.lines[2]
    assert "swap AB" in decode.lines[2] and "swap AB" not in prefill.lines[2]
    masked = grouped_masked.route_of(*MIXTRAL, "bfloat16", 0, False, 32)
    assert masked.source == "kernel pack" and "layout=masked" in masked.lines[0] and "max_tokens in its" in masked.lines[2]
    # the masked route launches the pack's module with A and D viewed [E * max_tokens, ...]
    torch = pytest.importorskip("torch")
    A, W = torch.zeros(8, 32, 4096), torch.zeros(8, 14336, 4096)
    counts, D = torch.zeros(8, dtype=torch.int32), torch.zeros(8, 32, 14336)
    masked.run(A, W, counts, D)
    (module,) = [m for m in gpu_mocked.values() if m.calls]
    assert module.calls[0][0].shape == (256, 4096) and module.calls[0][3].shape == (256, 14336)


def test_a_pack_without_the_weight_falls_back_and_strict_raises(moe_pack, gpu_mocked):
    gemm_ladder.use_pack(moe_pack)
    with pytest.warns(KernelFallbackWarning, match="no kernel pack holds one"):
        route = grouped.route_of(64, 1408, 2048, "bfloat16", 0, 512)
    assert route.run is grouped.torch_grouped_mm
    with pytest.raises(NoKernelError, match="strict mode.*pack build --grouped 64,1408,2048,masked"):
        grouped_masked.route_of(64, 1408, 2048, "bfloat16", 0, True, 16)
    with pytest.raises(NoKernelError, match="strict mode"):
        grouped.route_of(*MIXTRAL, "float16", 0, 16, strict=True)  # the pack holds bf16 only


def test_a_registered_module_comes_before_the_pack(moe_pack, gpu_mocked, monkeypatch):
    gemm_ladder.use_pack(moe_pack)

    class Module:
        path = type("P", (), {"name": "mine.so"})()

        def launch(self, *args):
            pass

    monkeypatch.setitem(grouped._REGISTERED, ("contiguous", *MIXTRAL, "bfloat16", "sm_90a", "none"), Module())  # pylint: disable=protected-access
    assert grouped.route_of(*MIXTRAL, "bfloat16", 0, 64).source == "registered"


# -- old packs ------------------------------------------------------------------------------------
def test_an_old_pack_without_grouped_fields_loads(tmp_path):
    """A pack.json written before the grouped fields: its dense entries serve as before, and the
    grouped lookup finds nothing in it."""
    folder = tmp_path / "old"
    folder.mkdir()
    blob = b"x" * 256
    (folder / "m.so").write_bytes(blob)
    entry = {"file": "m.so", "rung": "v9", "shape": [1, 256, 512], "dtype": "float16", "arch": "sm_90a",
             "knobs": {"dtype": "float16", "arch": "sm_90a"}, "dynamic_m": True, "m_range": [1, 64],
             "so_bytes": len(blob), "so_sha256": hashlib.sha256(blob).hexdigest()}
    files.write_json(folder / PACK_MANIFEST, {"format": kernel_pack.PACK_FORMAT, "version": kernel_pack.PACK_VERSION,
                                              "modules": [entry]})
    pk = KernelPack(folder)
    assert not kernel_pack.is_grouped(pk.modules[0])
    assert pk.find(16, 256, 512, "float16", "sm_90a").entry["file"] == "m.so"
    assert pk.find_grouped("contiguous", 8, 256, 512, "float16", "sm_90a", 16) is None


# -- the command line -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("8,14336", "is not E,N,K or E,N,K,layout"),
    ("8,14336,4096,sideways", "layout 'sideways' is not contiguous or masked"),
    ("0,14336,4096", "must be positive"),
    ("8,14336,4k", "not a whole number"),
])
def test_a_bad_grouped_argument_is_refused_by_name(text, words):
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        cli_types.grouped_weight(text)


def test_grouped_arguments_parse():
    assert cli_types.grouped_weight("8, 14336, 4096") == (8, 14336, 4096, None)
    assert cli_types.grouped_weight("64,1408,2048,masked") == (64, 1408, 2048, "masked")


def test_pack_build_grouped_dry_run_and_its_refusals():
    base = [sys.executable, "-m", "gemm_ladder", "pack", "build", "--dry-run", "--dtypes", "bfloat16"]
    ok = subprocess.run(base + ["--grouped", "64,1408,2048,masked"], capture_output=True, text=True, cwd=REPO,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "2 modules" in ok.stdout and "1..64 max_tokens" in ok.stdout and "64x1408x2048 masked" in ok.stdout
    bad = subprocess.run(base + ["--grouped", "8,14336,4095"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "K=4095" in bad.stderr and "multiple of 8" in bad.stderr


# -- a real build ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_build_a_small_grouped_pack(tmp_path, monkeypatch):
    """Through the module cache: each module's own manifest says v12, its experts and layout, and
    the lookup picks the decode module for a few tokens and the prefill one for many."""
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["float16"], workers=2, grouped=[(4, 256, 128, "masked")])
    assert [r["status"] for r in man["results"]] == ["built", "built"], man["results"]
    pk = KernelPack(tmp_path / "pack")
    for e in pk.modules:
        own = read_manifest(pk.check_entry(e))
        assert own["rung"] == "v12" and own["launch"]["layout"] == "masked" and own["launch"]["experts"] == 4
    few = pk.find_grouped("masked", 4, 256, 128, "float16", "sm_90a", 8)
    many = pk.find_grouped("masked", 4, 256, 128, "float16", "sm_90a", 1000)
    assert read_manifest(few.path)["knobs"]["blk_m"] == 32 and read_manifest(many.path)["knobs"]["blk_m"] == 128
    assert read_manifest(few.path)["launch"]["swap_ab"] is True and "swap_ab" not in read_manifest(many.path)["launch"]


# -- benchmarks/grouped_check.py's pack mode (the pure parts; run is the GPU's) ------------------------
@pytest.fixture(scope="module")
def gc():
    import importlib.util  # pylint: disable=import-outside-toplevel  (a script, not a package)

    path = REPO / "benchmarks" / "grouped_check.py"
    spec = importlib.util.spec_from_file_location("grouped_check_pack", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grouped_check_pack"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_gpu_check_gives_every_pack_module_a_count_it_serves(gc):
    """pack_cases picks a token count inside each module's range, so that the front door must take
    each module of the pack once; the case survives the trip to the child job."""
    items = kernel_pack.plan_grouped([(E, N, K, None) for _, E, N, K in gc.SHAPES], ["bfloat16"])
    entries = [e for i in items for e in kernel_pack.entries_of(i)]
    cases = gc.pack_cases(entries)
    contiguous = sum(len(plan.grouped_choices(E, N, K, "bfloat16")) for _, E, N, K in gc.SHAPES)
    assert len(cases) == len(entries) == contiguous + len(gc.SHAPES) * 2
    for c in cases:
        pk_entry = next(e for e in entries if e["file"] == c["file"])
        assert pk_entry["tokens"][0] <= c["tokens"] <= pk_entry["tokens"][1]
        folder, back = gc.parse_case_item(gc.case_item("/x/pack", c))
        assert folder == "/x/pack" and back == {k: c[k] for k in back}
    # the cases of one weight and layout land on different modules
    mixtral = [c for c in cases if c["experts"] == 8 and c["layout"] == "contiguous"]
    assert sorted(c["rule"] for c in mixtral) == ["grouped-decode-swap", "grouped-prefill", "grouped-prefill-swap64"]
    assert len({c["file"] for c in mixtral}) == 3


def test_the_gpu_checks_rows_say_which_module_served_and_refuse_another(gc, monkeypatch, tmp_path):
    """run_pack on made-up child results: a case is correct only where the front door served the
    module the plan expected; ratios are torch's time over ours; the file is written."""
    cases = gc.pack_cases([e for i in kernel_pack.plan_grouped([(8, 14336, 4096, "contiguous")], ["bfloat16"])
                           for e in kernel_pack.entries_of(i)])
    times = {"ours": {"graph_ms": 1.0, "queued_ms": 1.2}, "grouped_mm": {"graph_ms": 1.1, "queued_ms": 1.3}}
    fake = [{"status": "ok", "kernel": f"kernel: v12 layout=contiguous {cases[0]['file']}", "cases": [], "times": times},
            {"status": "ok", "kernel": f"kernel: v12 layout=contiguous {cases[0]['file']}", "cases": []}]  # wrong one

    class Sampler:
        def stop(self):
            pass

        def between(self, *_):
            return {}

    monkeypatch.setattr(gc.isolate, "run_batch", lambda job, items, **kw: fake[:len(items)])
    monkeypatch.setattr(gc.harness, "gpu_info", lambda: {"name": "stand-in"})
    monkeypatch.setattr(gc, "Sampler", Sampler)
    out = tmp_path / "grouped_pack.json"
    assert gc.run_pack(tmp_path, out, {"pack": "pack", "cases": cases}) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["correct"] for r in rows] == [True, False]
    assert rows[0]["ratio_to_grouped_mm"] == pytest.approx(1.1) and rows[0]["layout"] == "contiguous"
    assert rows[1]["detail"] and rows[1]["expected"] == cases[1]["file"]
    assert {"layout", "experts", "tokens", "N", "K", "dtype", "routing", "correct", "ratio_to_grouped_mm",
            "peer_ratios"} <= set(rows[0])
