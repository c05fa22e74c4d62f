"""The tuner, fp8-aware (issue 32): ``tune --dtype float8_e4m3`` builds scaled_mm's kernel around the
policy's knobs, its measurements merge as entries of their own operand spec, and the fp8 policy
(``plan.choose``, ``plan.fp8_policy``, ``scaled.build_job``) reads those entries and no 16-bit one.

CPU only: the GPU side (``harness.check`` and ``time_module`` on fp8 modules against
``torch._scaled_mm``) runs in the GPU smoke tier (``test_gpu_smoke.test_tune_measure_fp8``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.device import peak_tflops, speed_problem
from gemm_ladder.core.provenance import tvm_version
from gemm_ladder.core.spec import GemmSpec, text_is_fp8
from gemm_ladder.serve import plan, scaled
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import jobs, rpc
from gemm_ladder.tune import merge as tune_merge
from gemm_ladder.tune import space as tune_space
from gemm_ladder.tune.cache import _todo
from gemm_ladder.tune.measuring import MEASUREMENTS_FORMAT

REPO = Path(__file__).resolve().parent.parent
TVM = tvm_version()
TENSOR = GemmSpec.fp8("bfloat16", "tensor").text()
BLOCK = GemmSpec.fp8("bfloat16", "block").text()
SHAPE = (4096, 7168, 16384)


@pytest.fixture(autouse=True)
def private_db(tmp_path, monkeypatch):
    """Every test gets its own database (the packaged one is never read or touched)."""
    path = tmp_path / "tuning_db.json"
    monkeypatch.setenv(db.DB_ENV, str(path))
    return path


def _entry(spec=BLOCK, shape=SHAPE, tflops=1250.0, knobs=None, dtype="bfloat16"):
    e = {"rung": "v9", "shape": list(shape), "bucket": db.shape_bucket(shape), "dtype": dtype, "arch": "sm_90a",
         "gpu": "NVIDIA H200", "tvm_version": TVM,
         "knobs": knobs if knobs is not None else plan.fp8_module(*shape, "block")[1] | {"pipe_depth": 3,
                                                                                         "tile_order": "grouped"},
         "tflops": tflops, "cublas_tflops": 1150.0, "ratio_to_cublas": tflops / 1150.0,
         "date": "2026-11-29T00:00:00+00:00", "commit": "abc", "sources": "s"}
    if spec is not None:
        e["spec"] = spec
    return e


def _write_db(path, entries):
    path.write_text(json.dumps({"format": db.DB_FORMAT, "version": db.DB_VERSION, "entries": entries}))


def test_fp8_speeds_may_reach_twice_the_16_bit_peak_and_no_further():
    assert peak_tflops("sm_90a", fp8=True) == 2 * peak_tflops("sm_90a")
    assert speed_problem(1300.0, "sm_90a") is not None  # past the 16-bit peak: not a 16-bit kernel's
    assert speed_problem(1300.0, "sm_90a", fp8=True) is None
    assert "in fp8" in speed_problem(2500.0, "sm_90a", fp8=True)
    assert text_is_fp8(BLOCK) and not text_is_fp8(None) and not text_is_fp8("d_float16.bias_float16")


def test_an_fp8_entry_is_trusted_by_its_spec_and_keyed_apart_from_a_16_bit_one(private_db):
    sixteen = _entry(spec=None, tflops=700.0, knobs={"pipe_depth": 4})
    _write_db(private_db, [_entry(), sixteen, _entry(spec=TENSOR, tflops=1400.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tdb = db.TuningDB()
    assert len(tdb.entries) == 3  # one key each: the spec is part of it
    # an fp8 speed without the spec that allows it, a spec among the knobs, a spec that does not parse or is
    # not written as GemmSpec.text writes it: each ignored with its reason
    bad = [(_entry(spec=None), "above the 990"), (_entry(knobs={"spec": BLOCK}), "own field, spec"),
           (_entry(spec="scales_sideways"), "does not parse"),
           (_entry(spec="a_float8_e4m3.b_float8_e4m3.scales_block.d_bfloat16"), "not written as")]
    for e, why in bad:
        _write_db(private_db, [e])
        with pytest.warns(UserWarning, match=why):
            assert db.TuningDB().entries == []
    _write_db(private_db, [])
    tdb = db.TuningDB()
    assert tdb.upsert(_entry()) == "added" and tdb.upsert(_entry(spec=None, tflops=700.0)) == "added"
    assert tdb.upsert(_entry(tflops=1100.0)) == "kept" and tdb.upsert(_entry(tflops=1300.0)) == "replaced"
    tdb.save()
    assert {e.get("spec") for e in json.loads(private_db.read_text())["entries"]} == {BLOCK, None}


def test_best_knobs_and_the_build_policy_take_only_entries_of_the_asked_spec(private_db, capsys):
    tuned = _entry()
    _write_db(private_db, [tuned, _entry(spec=None, tflops=700.0, knobs={"pipe_depth": 3})])
    found = db.best_knobs("v9", *SHAPE, "bfloat16", gpu=None, spec=BLOCK)
    assert found is not None and found[0] == tuned["knobs"] and found[1]["spec"] == BLOCK
    assert db.best_knobs("v9", *SHAPE, "bfloat16", gpu=None)[0] == {"pipe_depth": 3}  # 16-bit: its own
    assert db.best_knobs("v9", *SHAPE, "bfloat16", gpu=None, spec=TENSOR) is None  # another recipe: none
    knobs, tuned_from = db.tuned_knobs("v9", *SHAPE, {"dtype": "bfloat16", "spec": BLOCK})
    assert knobs == {"dtype": "bfloat16", "spec": BLOCK, **tuned["knobs"]} and tuned_from["tflops"] == 1250.0
    assert "scales_block" in capsys.readouterr().err
    # a knob given by hand: the database is not asked
    assert db.tuned_knobs("v9", *SHAPE, {"spec": BLOCK, "pipe_depth": 4}) == ({"spec": BLOCK, "pipe_depth": 4}, None)


def test_the_fp8_policy_asks_the_database_for_its_spec(private_db):
    block = plan.Problem(*SHAPE, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "block"))
    ruled = plan.choose(block)
    assert ruled.source == "rule" and "tuning database" in ruled.database
    rule_rung, rule_knobs, by = plan.fp8_policy(*SHAPE, "block")
    assert (rule_rung, rule_knobs) == plan.fp8_module(*SHAPE, "block") and by.startswith("plan.FP8_RULES")
    tuned = _entry()
    _write_db(private_db, [tuned, _entry(spec=None, tflops=700.0, knobs={"pipe_depth": 3})])
    chosen = plan.choose(block)
    assert chosen.source == "db" and chosen.knobs["tile_order"] == "grouped" and chosen.knobs["spec"] == BLOCK
    assert "torch._scaled_mm" in chosen.why and any(ruled.rule in s for s in chosen.skipped)
    rung, knobs, by = plan.fp8_policy(*SHAPE, "block")
    assert rung == "v9" and knobs == tuned["knobs"] and by.startswith("tuning database")
    # scaled_mm's own build of the call: the tuned knobs, its spec and a runtime M
    call = scaled.Call(*SHAPE, "block", GemmSpec.fp8("bfloat16", "block"))
    rung, _, build = scaled.build_job(call, "sm_90a")
    assert build["tile_order"] == "grouped" and build["dynamic_m"] is True and build["spec"] == BLOCK
    # other recipes, and 16-bit problems of the bucket, keep their own
    tensor = plan.Problem(*SHAPE, "bfloat16", "sm_90a", 132, GemmSpec.fp8("bfloat16", "tensor"))
    assert plan.choose(tensor).source == "rule"
    sixteen = plan.choose(plan.Problem(*SHAPE, "bfloat16", "sm_90a", 132))
    assert sixteen.source != "db" or sixteen.knobs.get("pipe_depth") == 3


def test_plan_lines_and_arguments_ask_for_fp8_jobs():
    line = "v9 4096x4096x4096 dtype=float8_e4m3 fp8_scales=tensor,block fp8_out=bfloat16,float16 pipe_depth=3,4"
    found = jobs.parse_line(line)
    assert len(found) == 4 and {j.dtype for j in found} == {"bfloat16", "float16"}
    assert {GemmSpec.parse(j.spec).scales for j in found} == {"tensor", "block"}
    assert all(j.space == {"pipe_depth": [3, 4]} for j in found)
    names = {j.name("sm_90a") for j in found}
    assert len(names) == 4 and sum("scales_block" in n for n in names) == 2
    assert sum("d_float16" in n for n in names) == 2
    plain = jobs.parse_line("v9 4096x4096x4096 dtype=float8_e4m3,bfloat16")
    assert [(j.dtype, j.spec) for j in plain] == [("bfloat16", jobs.fp8_spec()), ("bfloat16", None)]
    assert plain[1].name("sm_90a") == "v9_4096x4096x4096_bfloat16_sm_90a"  # 16-bit names as before
    for bad, why in (("v9 64x64x64 fp8_scales=row", "add dtype=float8_e4m3"),
                     ("v9 64x64x64 dtype=float8_e4m3 fp8_scales=diagonal", "fp8_scales= takes"),
                     ("v9 64x64x64 dtype=float8_e4m3 fp8_out=float32", "fp8_out= float16")):
        with pytest.raises(jobs.PlanError, match=why):
            jobs.parse_line(bad)
    assert [j.spec for j in jobs.from_args("v9", [(64, 64, 64)], dtype="float8_e4m3", fp8_scales=["row"])] == \
        [jobs.fp8_spec("row")]
    with pytest.raises(jobs.PlanError, match="add --dtype float8_e4m3"):
        jobs.from_args("v9", [(64, 64, 64)], fp8_scales=["row"])


def test_the_fp8_space_is_around_the_policy_and_every_candidate_builds_the_spec():
    sp = tune_space.search_space("v9", (256, 2112, 7168), "bfloat16", progress=False, spec=jobs.fp8_spec(),
                                 space={"cluster_n": [1], "l2_group_size": [8], "tile_order": ["snake"]})
    _, policy = plan.fp8_module(256, 2112, 7168, "tensor")
    assert sp.spec == jobs.fp8_spec() and sp.candidates
    # the knobs it does not vary are the policy's (not the rung's bare fp8 defaults), and the policy's own
    # kernel is a candidate (its 12-deep ring is beyond FP8_CHOICES)
    fixed = {k: v for k, v in policy.items() if k not in tune_space.FP8_CHOICES}
    assert all(all(c[k] == v for k, v in fixed.items()) for c in sp.candidates)
    assert any(all(c[k] == v for k, v in policy.items()) for c in sp.candidates)
    assert {c["pipe_depth"] for c in sp.candidates} == {policy["pipe_depth"], *tune_space.FP8_CHOICES["pipe_depth"]}
    assert all("spec" not in c for c in sp.candidates)
    assert all(c["dynamic_m"] is True for c in sp.candidates)  # M at run time, as the front door's modules
    # the spec keys the cache: the same knobs in 16 bits are another binary
    ident = {"tvm_version": TVM, "compiler": "nvrtc", "sources": "s"}
    fp8_entries, _ = _todo(sp, Path("/nonexistent"), ident)
    sixteen = tune_space.Space(sp.rung, sp.shape, sp.dtype, sp.arch, sp.choices, candidates=sp.candidates[:1])
    assert fp8_entries[0]["cache_key"] != _todo(sixteen, Path("/nonexistent"), ident)[0][0]["cache_key"]
    with pytest.raises(ConfigError, match="no knob"):
        tune_space.search_space("v9", (256, 2112, 7168), "bfloat16", progress=False, spec=jobs.fp8_spec(),
                                space={"warp_speed": [1]})


def _report(spec, tflops):
    return {"format": MEASUREMENTS_FORMAT, "version": 1, "rung": "v9", "shape": list(SHAPE), "dtype": "bfloat16",
            "arch": "sm_90a", "tvm_version": TVM, "gpu": {"name": "NVIDIA H200"}, "date": "2026-11-29",
            **({"spec": spec} if spec else {}),
            "results": [{"id": "c000", "status": "ok", "tflops": tflops, "ratio_to_cublas": 1.05, "ms": 1.0,
                         "knobs": {"pipe_depth": 3}}]}


def test_merging_fp8_measurements_keeps_their_spec(tmp_path, private_db):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(_report(BLOCK, 1250.0)))
    merged = tune_merge.merge([path])
    assert merged[0]["action"] == "added" and merged[0]["entry"]["spec"] == BLOCK
    assert json.loads(private_db.read_text())["entries"][0]["spec"] == BLOCK
    path.write_text(json.dumps(_report(None, 1250.0)))  # the same speed from a 16-bit report cannot be real
    with pytest.warns(UserWarning) as record:
        assert tune_merge.merge([path])[0]["action"] == "nothing"
    assert any("above the 990" in str(w.message) for w in record)


def test_an_rpc_reply_is_bounded_by_its_folders_spec():
    item = rpc.Item(0, 0, Path("c.so"), "h" * 64)
    reply = json.dumps({"results": [{"status": "ok", "so_sha256": "h" * 64, "tflops": 1250.0, "cublas_tflops": 1100.0,
                                     "ms": 1.0, "cublas_ms": 1.1, "ratio_to_cublas": 1.1}], "server": {}})
    assert rpc.read_reply(reply, [item], [("sm_90a", True)])[0][0]["status"] == "ok"
    assert rpc.read_reply(reply, [item], ["sm_90a"])[0][0]["status"] == "bad-reply"
    assert rpc._speed_of({"arch": "sm_90a", "spec": BLOCK}) == ("sm_90a", True)  # pylint: disable=protected-access


def test_the_cli_tunes_fp8_and_refuses_recipes_without_it(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gemm_ladder", "tune", *args], capture_output=True, text=True,
                              cwd=REPO, env={**os.environ, db.DB_ENV: str(tmp_path / "db.json")})

    out = cli("--rung", "v9", "--shape", "256x2112x7168", "--dtype", "float8_e4m3", "--fp8-scales", "row",
              "--space", "cluster_n=1;l2_group_size=8;tile_order=snake;cluster_m=2", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "scales_row" in out.stdout and out.stdout.count("candidate: ") == 5  # the policy's depth and 3..6
    out = cli("--rung", "v9", "--shape", "256x2112x7168", "--fp8-out", "float16", "--dry-run")
    assert out.returncode == 2
    assert "--fp8-scales and --fp8-out choose fp8 kernels: add --dtype float8_e4m3" in out.stderr


def _folder(root: Path, spec: str | None) -> Path:
    root.mkdir(parents=True)
    cands = []
    for i in range(3):
        (root / f"c{i}.so").write_bytes(b"not a real module")
        cands.append({"id": f"c{i:03d}", "file": f"c{i}.so", "knobs": {"pipe_depth": 3 + i}, "cache_key": f"{i:064d}"})
    man = {"format": "gemm_ladder.tune.candidates", "version": 1, "rung": "v9", "shape": list(SHAPE),
           "dtype": "bfloat16", "arch": "sm_90a", "tvm_version": TVM, "compiler": "nvrtc", "candidates": cands,
           **({"spec": spec} if spec else {})}
    (root / "candidates.json").write_text(json.dumps(man))
    return root


@pytest.mark.parametrize("spec, given, want", [(BLOCK, None, "graph"), (None, None, "queued"),
                                               (BLOCK, "queued", "queued"), (None, "graph", "graph")])
def test_the_timer_reaches_both_passes_and_an_fp8_folder_times_kernels_in_graphs(tmp_path, monkeypatch, spec, given,
                                                                                   want):
    """An fp8 folder's candidates are timed as kernels replayed in CUDA graphs unless told otherwise (queued
    calls would time the Python host path of its short kernels); a 16-bit folder's queued, as the database's
    entries were. The first pass (the time job) and the second (the rounds job) get the same timer, and the
    report and its second pass's record say which."""
    from gemm_ladder.measure import isolate
    from gemm_ladder.tune import measuring

    calls = []

    def fake_run_batch(job, paths, args=(), timeout=120.0, on_result=None, explain=True):
        calls.append((job, tuple(args)))
        out = [{"status": "ok", "ms": 1.0, "tflops": 1000.0 + i, "cublas_ms": 1.0, "cublas_tflops": 1000.0,
                "ratio_to_cublas": 1.0 + i / 100, "rel_err": 1e-3, "module": Path(p).name} for i, p in enumerate(paths)]
        for res in out:
            if on_result:
                on_result(res)
        return out

    monkeypatch.setattr(isolate, "run_batch", fake_run_batch)
    folder = _folder(tmp_path / "cands", spec)
    report = measuring.measure(folder, reps=7, timeout=5.0, gpu={"name": "NVIDIA H200"}, progress=False, plot=False,
                               confirm_top=2, timer=given)
    (time_job, time_args), (rounds_job, rounds_args) = calls
    assert time_job == "time" and rounds_job == "rounds"
    assert time_args == ((7,) if want == "queued" else (7, "graph"))
    assert rounds_args[3:] == (() if want == "queued" else ("graph",))
    assert report["timer"] == want and report["confirm"]["timer"] == want
    assert report.get("spec") == spec


# -- benchmarks/fp8_tune.py's pure parts: which candidate is the policy's, and the rows ----------------------
sys.path.insert(0, str(REPO / "benchmarks"))
import fp8_tune  # noqa: E402  (a benchmark script: the A/B of the tuner's best against the policy)


def _ab_file(path: Path, shape, first: dict, second: dict) -> Path:
    path.write_text(json.dumps({"shape": list(shape), "clocks": {"sm_mhz": 1700, "watts": 690}, "timer": "graph",
                                "modules": [first, second]}))
    return path


def test_the_script_finds_the_policys_candidate_and_merges_only_what_beat_it(tmp_path):
    shape = (256, 2112, 7168)
    sp = tune_space.search_space("v9", shape, "bfloat16", progress=False, spec=jobs.fp8_spec(),
                                 space={"cluster_n": [1], "l2_group_size": [8], "tile_order": ["snake"]})
    results = [{"id": f"c{i:03d}", "file": f"c{i}.so", "knobs": k, "status": "ok", "tflops": 600.0 + i,
                "ratio_to_cublas": 0.9 + i / 1000} for i, k in enumerate(sp.candidates)]
    report = {"rung": "v9", "arch": "sm_90a", "shape": list(shape), "spec": jobs.fp8_spec(), "results": results,
              "best": results[-1], "candidates": str(tmp_path / "folder"), "path": "m.json", "date": "d",
              "gpu": {"name": "NVIDIA H200"}, "timer": "graph"}
    policy = fp8_tune.policy_candidate(report)
    want = tune_space.rung_knobs("v9", "sm_90a", jobs.fp8_spec(), shape)
    assert policy is not None and all(want[k] == v for k, v in policy["knobs"].items())
    assert sum(all(want.get(k) == v for k, v in r["knobs"].items()) for r in results) == 1
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"reports": [report]}))
    for ratio, merged in ((1.05, ["m.json"]), (1.005, [])):  # past MERGE_EDGE, or not
        ab = _ab_file(tmp_path / "ab.json", shape, {"module": policy["file"], "status": "ok", "ms": ratio},
                      {"module": results[-1]["file"], "status": "ok", "ms": 1.0})
        doc = fp8_tune.rows(run, [ab])
        assert doc["rows"][0]["ratio_to_policy"] == pytest.approx(ratio) and doc["merge"] == merged
        assert doc["rows"][0]["recipe"] == "tensor" and doc["rows"][0]["correct"] is True


def test_door_rows_leave_out_a_pair_timed_at_another_m_and_mark_held_out_shapes(tmp_path):
    def mod(name, ratio, first=None):
        return {"module": name, "rung": "v9", "knobs": {}, "check": {"ok": True}, "tflops": 900.0,
                "ratio_to_cublas": ratio, **({} if first is None else {"ratio_to_first": first,
                                                                      "round_ratio_to_first_quartiles": [1, 1, 1]})}

    files = [_ab_file(tmp_path / "door_tensor_256x4096x14336.json", (256, 4096, 14336), mod("r", 0.88),
                      mod("t", 0.90, 1.02)),
             _ab_file(tmp_path / "door_tensor_320x4096x14336.json", (320, 4096, 14336), mod("r", 0.36),
                      mod("t", 0.55, 1.51)),
             _ab_file(tmp_path / "door_block_96x7168x16384.json", (128, 7168, 16384), mod("r", 0.74),
                      mod("t", 0.73, 0.98))]
    rows = fp8_tune.door_rows(files, {("tensor", 256, 4096, 14336)})
    assert [(r["M"], r["held_out"], r["ratio_to_rules"]) for r in rows] == [(256, False, 1.02), (320, True, 1.51)]
