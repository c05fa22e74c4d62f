"""fp8 in kernel packs (issue 32): what a pack request asks for, the policy's one fp8 kernel, a real
fp8 pack build through the module cache, and where ``scaled_mm`` finds its kernel (a pack's fp8
module, or torch with the fix when a pack has none). CPU only: the GPU side is stood in for."""

from __future__ import annotations

import argparse

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from gemm_ladder.compile import module_cache
from gemm_ladder.compile.batch import BuildJob
from gemm_ladder.core import files
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.manifest import MANIFEST_VERSION, read_manifest
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import front, kernel_pack, plan, scaled
from gemm_ladder.serve.front import KernelFallbackWarning, NoKernelError
from gemm_ladder.serve.kernel_pack import KernelPack

REPO = Path(__file__).resolve().parents[1]
E4M3 = kernel_pack.FP8_INPUT


# -- what a request asks for -------------------------------------------------------------------
def test_a_request_names_fp8_by_its_input_dtype_with_recipes_and_d():
    specs = kernel_pack.pack_specs(["float16", E4M3], ("none", "bias"), fp8_scales=("tensor", "row"),
                                   fp8_out=("bfloat16", "float16"))
    fp8 = [s for s in specs if s.is_fp8]
    assert [s for s in specs if not s.is_fp8] == [GemmSpec.default("float16"), GemmSpec.with_bias("float16")]
    assert len(fp8) == 8 and {(s.scales, s.d, s.bias) for s in fp8} == {
        (r, d, b) for r in ("tensor", "row") for d in ("bfloat16", "float16") for b in (None, d)}
    assert all(s.a == s.b == "float8_e4m3" for s in fp8)


@pytest.mark.parametrize("kw, words", [
    ({"layouts": (("K", "N"),)}, "K-major"),
    ({"epilogues": ("bias_relu",)}, "epilogue 'bias_relu' with float8_e4m3"),
    ({"fp8_scales": ("block128",)}, "fp8 scales 'block128': use tensor or row or block"),
    ({"fp8_out": ("float32",)}, "fp8 D dtype 'float32'"),
    ({"fp8_scales": ()}, "needs a recipe"),
])
def test_what_fp8_does_not_build_is_refused_by_name(kw, words):
    with pytest.raises(ConfigError, match=words):
        kernel_pack.pack_specs([E4M3], **kw)


def test_fp8_weights_must_be_multiples_of_16():
    with pytest.raises(ConfigError, match="N=4096, K=7160: N and K must be multiples of 16"):
        kernel_pack.plan_pack([], [E4M3], sms=132, weights=[(4096, 7160)])


# -- the policy: one fp8 kernel at every M -------------------------------------------------------
def _call(M=64, N=48, K=32, recipe="row", bias=None):
    return scaled.Call(M, N, K, recipe, GemmSpec.fp8("bfloat16", recipe, bias))


def test_the_policy_gives_fp8_one_kernel_a_range_of_m_and_asks_no_tuning_database():
    """M up to FP8_SMALL_M (one row of tiles) takes the small-M knobs, split on v10 where they fill at most half
    the SMs over a long K (32 cluster tiles up to M = 64 here); past it, where 128x128 fills at most half the
    SMs, 64x128 tiles that come to one wave (fp8-fill: 4 x 32 at M = 129-256 here), then the tile whose waves
    fill best: at M = 333 v11's swapped 176x64 over two consumers on halves of M (fp8-swap: 2 x 64 = 128 tiles where
    v9's 128x112 come to 111), 128x144 at M = 1100 (fp8-width: 9 x 29 = 261 tiles, two waves), the wide tiles
    (fp8-wide), many waves 128x256 in halves (fp8-halves); block scales their own ranges."""
    spec = GemmSpec.fp8("bfloat16", "row")
    choices = {M: plan.choose(plan.Problem(M, 4096, 7168, "bfloat16", "sm_90a", 132, spec))
               for M in (1, 64, 128, 129, 333, 1100, 1536, 8192)}
    assert {M: c.rule for M, c in choices.items()} == {1: "fp8-split-k", 64: "fp8-split-k", 128: "fp8-small-m",
                                                       129: "fp8-fill", 333: "fp8-swap", 1100: "fp8-width",
                                                       1536: "fp8-wide", 8192: "fp8-halves"}
    assert choices[129].rung == "v9" and (choices[129].knobs["blk_m"], choices[129].knobs["blk_n"]) == (64, 128)
    assert choices[129].knobs["overlap"] == 4 and "split_k" not in choices[129].knobs
    # where no 64-row tiles come to one wave (N = 3072: 96 of 64x128, 192 of 64x64), v10's split K
    wider = plan.choose(plan.Problem(129, 3072, 7168, "bfloat16", "sm_90a", 132, spec))
    assert wider.rule == "fp8-split-k" and wider.rung == "v10" and "overlap" not in wider.knobs
    # the small-M tiles split with the overlapped promotion
    assert choices[64].rung == "v10" and choices[64].knobs["split_k"] == 2 and choices[64].knobs["blk_n"] == 64
    assert choices[64].knobs["overlap"] == 4 and choices[64].knobs == choices[1].knobs and choices[128].knobs["overlap"] == 4
    assert len({json.dumps(c.knobs, sort_keys=True) for c in choices.values()}) == 7
    assert choices[333].rung == "v11" and choices[333].knobs["split_m"] and choices[333].knobs["overlap"] == 4
    assert choices[1100].knobs["blk_n"] == 144 and choices[128].knobs["blk_n"] == 64
    assert choices[1536].knobs["blk_m"] == 192 and choices[1536].knobs["num_warpgroups"] == 3
    assert choices[8192].knobs["blk_n"] == 256 and choices[8192].knobs["halves"] is True
    assert all(c.source == "rule" for c in choices.values())  # the packaged database holds no fp8 entry here
    block = GemmSpec.fp8("bfloat16", "block")
    # block scales: their own knobs (overlap=2 at small M, 4 on 128x128 past it, 128x256 in halves where its
    # waves fill best)
    for M, rule, overlap in ((1, "fp8-block-small-m", 2), (129, "fp8-block", 4), (8192, "fp8-block-halves", None)):
        c = plan.choose(plan.Problem(M, 4096, 7168, "bfloat16", "sm_90a", 132, block))
        assert c.rule == rule and c.knobs.get("overlap") == overlap and c.source == "rule"
    # 16-bit problems keep their rules (the small-M one here)
    assert plan.choose(plan.Problem(64, 4096, 7168, "bfloat16", "sm_90a", 132), use_db=False).rule not in \
        {r.name for r in plan.FP8_RULES}


def test_a_weights_fp8_pack_is_the_modules_scaled_mm_would_build():
    """A weight's M buckets get one runtime-M module a knob set (small M split and whole, the fill tiles, v11's
    swapped 80x128 and 160x128 at the mid buckets, 128x112 (the width rule), 128x128, the wide tiles, 128x256 in
    halves), each with the knobs scaled_mm builds with at an M of its range: a pack and a build here share entries of
    the module cache."""
    items = kernel_pack.plan_pack([], [E4M3], sms=132, weights=[(4096, 7168)], fp8_scales=("row",))
    assert len(items) == 9 and all(i["dynamic_m"] for i in items)
    assert sorted(i["job"].knobs.get("blk_n", 128) for i in items) == [64, 64, 112, 128, 128, 128, 128, 128, 256]
    assert sorted(i["job"].knobs["blk_m"] for i in items if i["job"].rung == "v11") == [80, 160]
    ranges = sorted(run["m_range"] for i in items for run in i["served"])
    # the small-M tiles split up to M = 64 (32 cluster tiles), whole to FP8_SMALL_M, then the others
    assert ranges[0] == [1, 64] and ranges[1][1] <= plan.FP8_SMALL_M < ranges[2][0] and ranges[-1][1] == 16384
    ident = {"tvm_version": "0.27.0.post1", "compiler": "nvrtc 13.0", "sources": "s"}
    for item in items:
        M = item["served"][0]["m_range"][1]
        call = _call(M, 4096, 7168)
        rung, _, knobs = scaled.build_job(call, "sm_90a")
        ours = BuildJob(rung, (64, 4096, 7168), knobs)
        assert module_cache.module_key(item["job"], ident) == module_cache.module_key(ours, ident)


# -- a real fp8 pack ----------------------------------------------------------------------------
def test_an_fp8_pack_builds_through_the_cache_and_says_e4m3_and_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    man = kernel_pack.build_pack(tmp_path / "pack", [(256, 256, 512)], [E4M3], sms=132, workers=1,
                                 fp8_scales=("row",))
    assert [r["status"] for r in man["results"]] == ["built"], man["results"]
    pk = KernelPack(tmp_path / "pack")
    (entry,) = pk.modules
    spec = GemmSpec.fp8("bfloat16", "row")
    for where in (entry["spec"], read_manifest(tmp_path / "pack" / entry["file"])["spec"]):
        assert (where["a"], where["b"], where["d"], where["scales"]) == ("float8_e4m3", "float8_e4m3", "bfloat16", "row")
    assert pk.check_entry(entry) == tmp_path / "pack" / entry["file"]
    found = pk.find(1000, 256, 512, "bfloat16", "sm_90a", spec)  # a runtime-M module: any M
    assert found.entry["file"] == entry["file"] and entry["choice"]["rule"] == "fp8"
    assert pk.find(256, 256, 512, "bfloat16", "sm_90a", GemmSpec.fp8("bfloat16", "tensor")) is None
    assert pk.find(256, 256, 512, "bfloat16", "sm_90a") is None  # a bf16 call is not served by fp8
    again = kernel_pack.build_pack(tmp_path / "pack2", [(256, 256, 512)], [E4M3], sms=132, workers=1,
                                   fp8_scales=("row",))
    assert [r["status"] for r in again["results"]] == ["cache"]


# -- where scaled_mm finds its kernel -----------------------------------------------------------
def _module(folder: Path, name: str, spec: GemmSpec, shape=(1, 48, 32)) -> dict:
    """A stand-in runtime-M module (bytes and a manifest with its spec) and its pack.json entry."""
    blob = hashlib.sha256(name.encode()).digest() * 64
    (folder / name).write_bytes(blob)
    knobs = {"dtype": spec.d, "arch": "sm_90a", "dynamic_m": True}
    if not spec.is_default():
        knobs["spec"] = spec.text()
    man = {"format": MANIFEST_VERSION, "rung": "v9", "shape": list(shape), "dtype": spec.d, "arch": "sm_90a",
           "knobs": knobs, "tvm_version": "0.27.0.post1", "launch": {"dynamic_m": True}, "so_bytes": len(blob),
           "so_sha256": hashlib.sha256(blob).hexdigest(), "spec": spec.to_dict()}
    (folder / f"{name}.json").write_text(json.dumps(man))
    return {"file": name, "rung": "v9", "shape": list(shape), "dtype": spec.d, "arch": "sm_90a", "knobs": knobs,
            "dynamic_m": True, "m_range": [1, 64], "m_values": [64], "so_bytes": len(blob),
            "so_sha256": man["so_sha256"], "spec": spec.to_dict(),
            "choice": {"source": "rule", "rule": "fp8", "why": "v9 at its fp8 defaults"}}


def _pack(folder: Path, entries) -> Path:
    files.write_json(folder / kernel_pack.PACK_MANIFEST, {"format": kernel_pack.PACK_FORMAT,
                                                          "version": kernel_pack.PACK_VERSION, "arch": "sm_90a",
                                                          "modules": entries})
    return folder


def test_scaled_mm_takes_a_packs_fp8_module_and_explains_it(tmp_path, no_gpu):
    folder = tmp_path / "pack"
    folder.mkdir()
    row = _module(folder, "fp8_row.so", GemmSpec.fp8("bfloat16", "row"))
    _pack(folder, [_module(folder, "bf16.so", GemmSpec.default("bfloat16")), row])
    front.use_pack(folder)
    route = scaled._resolve(_call(M=1000), 0, True, torch.bfloat16)  # any M: the module takes M at run time
    assert route.module == "loaded fp8_row.so" and route.source == "kernel pack" and route.module_M is None
    text = "\n".join(route.lines)
    assert route.lines[0].startswith("kernel: v9 fp8 (d_bfloat16.a_float8_e4m3.b_float8_e4m3.scales_row)")
    assert "chosen by: rule 'fp8'" in text and f"kernel pack {folder}: fp8_row.so" in text
    # the tensor recipe is another spec: the pack has none, and the fallback says which build serves it
    with pytest.warns(KernelFallbackWarning, match=r"--dtypes float8_e4m3 --fp8-scales tensor --fp8-out bfloat16"):
        other = scaled._resolve(_call(recipe="tensor"), 0, False, torch.bfloat16)
    assert isinstance(other.module, scaled.TorchScaledMM) and other.lines[-1].startswith("how: on a box with")


def test_a_pack_without_fp8_makes_scaled_mm_fall_back_once_or_raise_in_strict_mode(tmp_path, no_gpu):
    folder = tmp_path / "pack"
    folder.mkdir()
    _pack(folder, [_module(folder, "bf16.so", GemmSpec.default("bfloat16"))])  # the same N and K, 16-bit
    front.use_pack(folder)
    call = _call()
    with pytest.warns(KernelFallbackWarning) as got:
        route = scaled._resolve(call, 0, False, torch.bfloat16)
    message = str(got[0].message)
    for words in (f"no kernel pack (packs: {folder}) serves it", "GEMM_LADDER_BUILD=0",
                  "pack build --weights 48x32 --dtypes float8_e4m3 --fp8-scales row --fp8-out bfloat16"):
        assert words in message, message
    assert isinstance(route.module, scaled.TorchScaledMM) and route.lines[0] == "kernel: torch._scaled_mm"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        scaled._resolve(call, 0, False, torch.bfloat16)
    with pytest.raises(NoKernelError, match=r"no kernel pack .* serves it.*pack build --weights 48x32"):
        scaled._resolve(call, 0, True, torch.bfloat16)


def test_a_pack_added_later_is_looked_in(tmp_path, no_gpu):
    """scaled_mm remembers a route per call and per packs: use_pack after a fallback is seen."""
    folder = tmp_path / "pack"
    folder.mkdir()
    _pack(folder, [_module(folder, "fp8_row.so", GemmSpec.fp8("bfloat16", "row"))])
    with pytest.warns(KernelFallbackWarning):
        assert scaled.route_of(_call(), 0, False, torch.bfloat16).source == "torch"
    assert scaled.route_of(_call(), 0, False, torch.bfloat16).source == "torch"  # remembered
    front.use_pack(folder)
    assert scaled.route_of(_call(), 0, False, torch.bfloat16).module == "loaded fp8_row.so"


def test_a_float32_bias_call_is_told_what_a_pack_can_serve():
    how = scaled.pack_command(scaled.Call(64, 48, 32, "row", GemmSpec.fp8("bfloat16", "row", "float32")))
    assert "bias.to(torch.bfloat16)" in how and "pack build --weights" not in how


# -- the CLI ---------------------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", "build", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env={**os.environ, "GEMM_LADDER_TUNING_DB": "off"})


def test_the_cli_plans_fp8_modules_and_refuses_fp8_knobs_without_fp8():
    out = _cli("--weights", "4096x7168", "--dtypes", f"bfloat16,{E4M3}", "--fp8-scales", "row", "--dry-run")
    assert out.returncode == 0, out.stderr
    fp8_rows = [line for line in out.stdout.splitlines() if "float8_e4m3 row -> bfloat16" in line]
    # the M ranges of the runtime-M modules: the small-M tiles split and whole, the split K's, the fill tiles', the
    # width rule's, the 128x128 one's, the wide tiles' and the 128x256 tiles in halves (plan.FP8_RULES; the last
    # four take turns as the waves fill), and the swapped operands' at the mid buckets
    rules = {r.split()[-2] for r in fp8_rows}
    assert rules == {"fp8-small-m", "fp8-split-k", "fp8-fill", "fp8-width", "fp8", "fp8-wide", "fp8-halves",
                     "fp8-swap"}, out.stdout
    # the small-M tiles split to M = 64 (32 cluster tiles of 4096), whole up to FP8_SMALL_M
    assert any(" 1..64 " in r and "fp8-split-k" in r for r in fp8_rows), out.stdout
    assert any(f" 65..{plan.FP8_SMALL_M} " in r and "fp8-small-m" in r for r in fp8_rows), out.stdout
    assert any("..16384" in r and "fp8-wide" in r for r in fp8_rows), out.stdout
    bad = _cli("--weights", "4096x7168", "--fp8-scales", "row", "--dry-run")
    assert bad.returncode == 2 and "add --dtypes float8_e4m3" in bad.stderr
    bad = _cli("--weights", "4096x7168", "--dtypes", E4M3, "--fp8-scales", "block128", "--dry-run")
    assert bad.returncode == 2 and "fp8 scale recipe" in bad.stderr


# -- the GPU check's pure parts (benchmarks/fp8_pack_check.py) --------------------------------------
sys.path.insert(0, str(REPO / "benchmarks"))
import fp8_pack_check  # noqa: E402  (the GPU check of scaled_mm from a pack)


def test_the_pack_check_plans_odd_m_for_every_module_and_times_one_m_a_weight():
    cases = fp8_pack_check.cases()
    assert len({(c["name"], c["M"]) for c in cases}) == len(cases) == 4 * len(fp8_pack_check.CHECK_MS) * len(fp8_pack_check.WEIGHTS)
    assert {c["name"] for c in cases} == {fp8_pack_check.case_name(N, K, r, b) for N, K in fp8_pack_check.WEIGHTS
                                          for r in fp8_pack_check.RECIPES for b in fp8_pack_check.BIASES}
    timed = [c for c in cases if c["timed"]]
    assert len(timed) == 2 * len(fp8_pack_check.WEIGHTS) and all(c["bias"] is None for c in timed)
    for c in cases:  # every case's module is one the pack request plans (what pack_specs builds)
        assert GemmSpec.fp8("bfloat16", c["recipe"], c["bias"]) in kernel_pack.pack_specs(
            [E4M3], ("none", "bias"), fp8_scales=fp8_pack_check.RECIPES)
    name, _, M = fp8_pack_check.item(cases[1]).rpartition("@")
    assert (name, int(M)) == (cases[1]["name"], cases[1]["M"]) and "/" not in name and "," not in name


def test_the_pack_check_takes_block_scales_where_asked_and_refuses_an_unknown_recipe():
    """``prepare --recipes block``: the block modules' cases (their odd M and timed M) with the pack
    request that builds them; a recipe the check does not know is refused with the list."""
    recipes = fp8_pack_check.recipe_arg("block")
    cases = fp8_pack_check.cases(((3008, 1024),), recipes)
    assert {(c["recipe"], c["M"]) for c in cases} == {("block", M) for M in fp8_pack_check.CHECK_MS}
    assert [c["M"] for c in cases if c["timed"]] == [fp8_pack_check.TIMED_MS[(3008, 1024)]]
    for c in cases:
        assert GemmSpec.fp8("bfloat16", "block", c["bias"]) in kernel_pack.pack_specs([E4M3], ("none", "bias"),
                                                                                      fp8_scales=recipes)
    for bad in ("blocks", "tensor,", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="the recipes are tensor, row, block"):
            fp8_pack_check.recipe_arg(bad)


def test_the_fp8_suite_times_every_m_of_each_weight_and_recipe_without_a_bias():
    cases = fp8_pack_check.cases(recipes=("tensor", "block"), suite=True)
    assert {(c["N"], c["K"]) for c in cases} == set(fp8_pack_check.SUITE_WEIGHTS)
    assert all(c["bias"] is None for c in cases)
    timed = {(c["N"], c["K"], c["recipe"], c["M"]) for c in cases if c["timed"]}
    assert timed == {(N, K, r, M) for N, K in fp8_pack_check.SUITE_WEIGHTS for r in ("tensor", "block")
                     for M in fp8_pack_check.SUITE_MS}
    assert {c["M"] for c in cases if not c["timed"]} == {1, 200, 333}


def test_the_suite_summary_takes_geomeans_and_minima_per_recipe_leaving_out_rows_without_a_ratio():
    rows = [{"recipe": "tensor", "correct": True, "ratio_to_scaled_mm": 2.0, "call_ratio_to_scaled_mm": 1.0},
            {"recipe": "tensor", "correct": True, "ratio_to_scaled_mm": 0.5, "call_ratio_to_scaled_mm": 4.0},
            {"recipe": "block", "correct": False, "ratio_to_scaled_mm": None},
            {"recipe": "block", "correct": True, "ratio_to_scaled_mm": 0.9, "call_ratio_to_scaled_mm": 1.1}]
    rows[0]["front_door"] = {"kernel_ratio": 1.0, "call_ratio": 1.2}  # first use kept torch's kernel here
    rows[1]["front_door"] = {"kernel_ratio": 4.0, "call_ratio": 0.8}
    got = fp8_pack_check.summary(rows)
    assert got["tensor"]["rows"] == 2 and got["tensor"]["correct"] == 2
    assert got["tensor"]["kernel_geomean"] == pytest.approx(1.0) and got["tensor"]["kernel_min"] == 0.5
    assert got["tensor"]["call_geomean"] == pytest.approx(2.0) and got["tensor"]["call_min"] == 1.0
    assert got["tensor"]["front_door_kernel_geomean"] == pytest.approx(2.0) and got["tensor"]["front_door_kernel_min"] == 1.0
    assert got["tensor"]["front_door_call_geomean"] == pytest.approx(0.96 ** 0.5) and got["tensor"]["front_door_call_min"] == 0.8
    assert got["block"] == {"rows": 2, "correct": 1, "kernel_geomean": pytest.approx(0.9), "kernel_min": 0.9,
                            "call_geomean": pytest.approx(1.1), "call_min": 1.1, "front_door_kernel_geomean": None,
                            "front_door_kernel_min": None, "front_door_call_geomean": None, "front_door_call_min": None}


def test_the_pack_check_passes_only_what_the_pack_served_within_twice_torchs_error():
    good = {"status": "ok", "rel_err": 3e-3, "torch_rel_err": 3e-3, "nan": False, "from_pack": True,
            "repeat": {"same_bits": True}}
    assert fp8_pack_check.passes_case(good)
    for change in ({"from_pack": False}, {"nan": True}, {"rel_err": 7e-3}, {"status": "timeout"},
                   {"repeat": {"same_bits": False}}, {"repeat": {}}):
        assert not fp8_pack_check.passes_case({**good, **change}), change
    case = next(c for c in fp8_pack_check.cases() if c["timed"])
    checks = [{"name": case["name"], "correct": True}, {"name": case["name"], "correct": False}]
    assert fp8_pack_check.make_row(case, None, checks)["correct"] is False  # one of its checks failed
    times = {"ours": {"kernel_ms": 0.2, "call_ms": 0.25}, "torch_scaled_mm": {"kernel_ms": 0.1, "call_ms": 0.1}}
    row = fp8_pack_check.make_row(case, times, checks[:1])
    assert row["correct"] and row["ratio_to_scaled_mm"] == 0.5 and row["peer_ratios"] == {"torch_scaled_mm": 0.5}
    with_bf16 = {**times, "ours_bf16": {"kernel_ms": 0.36, "call_ms": 0.4}}  # prepare --bf16's peer: bf16 over fp8
    assert fp8_pack_check.make_row(case, with_bf16, checks[:1])["peer_ratios"] == {"torch_scaled_mm": 0.5,
                                                                                     "ours_bf16": pytest.approx(1.8)}
    assert row["tflops"] == pytest.approx(2 * case["M"] * case["N"] * case["K"] / 0.2e-3 / 1e12)
    assert {"recipe", "M", "N", "K", "correct", "tflops", "ratio_to_scaled_mm", "peer_ratios"} <= set(row)
    assert "front_door" not in row
    door = fp8_pack_check.make_row(case, {**times, "front_door": {"kernel_ms": 0.1, "call_ms": 0.125}}, checks[:1])
    assert door["front_door"] == {"kernel_ratio": 1.0, "call_ratio": 0.8} and door["ratio_to_scaled_mm"] == 0.5


def test_the_pack_checks_children_run_the_script_and_record_a_broken_case(tmp_path, monkeypatch):
    """The isolate child imports the script by name and runs a case; a folder without its pack
    costs each case a recorded error (no hang, no crash of the parent)."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # check_all prepends benchmarks/
    few = fp8_pack_check.cases()[:2]
    monkeypatch.setattr(fp8_pack_check, "cases", lambda: few)
    files.write_json(tmp_path / fp8_pack_check.PLAN_FILE, {"format": fp8_pack_check.FORMAT, "cases": few})
    results = fp8_pack_check.check_all(tmp_path)
    assert [(r["name"], r["M"], r["correct"]) for r in results] == [(c["name"], c["M"], False) for c in few]
    assert all("PackError" in r["detail"] and "pack is not a folder" in r["detail"] for r in results), results
