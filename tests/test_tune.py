"""CPU tests of the tuner: space pruning, cache keys, the build cache, measuring (on canned
results), the tuning database, the build policy (tuned knobs one level above the pure builder),
the CLI and the plot.

Nothing here needs a GPU: measuring is tested with ``isolate.run_isolated`` replaced by canned
results, and the only real builds are two tiny v4 candidates (for the cache) and one v4 build
through the builder hook.
"""

import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from gemm_ladder import rungs
from gemm_ladder.core.budget import check_budget
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.provenance import tvm_version
from gemm_ladder.compile import identity
from gemm_ladder.tune import cache, measuring, run
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import merge as tune_merge
from gemm_ladder.tune import space as tune_space
from gemm_ladder.tune import report as tune_report

GPU = {"name": "NVIDIA H100 80GB HBM3", "sm_clock_mhz_now": "1980 MHz"}
TVM = tvm_version()


@pytest.fixture(autouse=True)
def private_db(tmp_path, monkeypatch):
    """Every test gets its own database: the repo's benchmarks/tuning is never touched."""
    path = tmp_path / "tuning_db.json"
    monkeypatch.setenv(db.DB_ENV, str(path))
    return path


# -- fake rungs with the knobs of v5/v6, so the space is tested whatever lands in sm90a ------
def _fake_check(cfg):
    if cfg.blk_m % (64 * cfg.num_warpgroups):
        raise ConfigError(f"blk_m={cfg.blk_m} does not split into {cfg.num_warpgroups} warpgroup(s) of whole "
                          "64-row wgmma atoms")
    stage = (cfg.blk_m + cfg.blk_n) * cfg.blk_k * 2
    check_budget(cfg, 1024 + cfg.pipe_depth * stage + cfg.blk_m * cfg.blk_n * 2)


def _fake_launch(cfg):
    return {"grid": list(cfg.grid_mn)}  # a CTA per tile (the validator checks it against CUDA's grid)


FAKE = {
    "v5": types.SimpleNamespace(KNOBS={"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2,
                                       "pipe_depth": 3}, check=_fake_check, launch=_fake_launch),
    "v6": types.SimpleNamespace(KNOBS={"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2,
                                       "pipe_depth": 3, "l2_group_size": 8, "tile_order": "grouped"},
                                check=_fake_check, launch=_fake_launch),
}


@pytest.fixture
def fake_rungs(monkeypatch):
    real = rungs.rung_module

    def rung_module(rung, arch="sm_90a"):
        return FAKE[rung] if rung in FAKE else real(rung, arch)

    monkeypatch.setattr(rungs, "rung_module", rung_module)


# -- the space ------------------------------------------------------------------------------
def test_space_records_pipe_depth_too_deep_for_shared_memory(fake_rungs):
    sp = tune_space.search_space("v5", (4096, 4096, 4096), space={"pipe_depth": [2, 3, 4, 8], "blk_m": [128],
                                                            "blk_n": [256], "num_warpgroups": [2]})
    assert sp.points == 4
    assert [c["pipe_depth"] for c in sp.candidates] == [2, 3]
    refused = {p["knobs"]["pipe_depth"]: p for p in sp.pruned}
    assert set(refused) == {4, 8}
    for p in refused.values():
        assert p["reason"] == "shared-memory"
        assert "shared memory" in p["detail"] and "pipe_depth" in p["detail"]
    assert sp.counts() == {"points": 4, "candidates": 2, "shared-memory": 2}


def test_space_v4_refusals_and_only_the_rungs_knobs():
    sp = tune_space.search_space("v4", (4096, 4096, 4096))
    assert set(sp.choices) == set(rungs.rung_module("v4").KNOBS)  # no pipe_depth, no l2_group_size
    reasons = {(p["knobs"]["blk_m"], p["knobs"]["blk_n"], p["knobs"]["num_warpgroups"]): p["reason"]
               for p in sp.pruned}
    assert reasons[(256, 256, 1)] == "registers"
    assert reasons[(64, 128, 2)] == "divisibility"
    for c in sp.candidates:  # what the tuner keeps builds: the validator agrees
        rungs.make_config("v4", 4096, 4096, 4096, **c)
    with pytest.raises(ConfigError, match="no knob pipe_depth"):
        tune_space.search_space("v4", (4096, 4096, 4096), space={"pipe_depth": [2, 3]})


def test_space_l2_model_and_ungrouped_orders(fake_rungs):
    space = {"pipe_depth": [3], "blk_m": [128], "blk_n": [128, 256], "num_warpgroups": [2],
             "l2_group_size": [1, 2, 4, 8, 16, 32], "tile_order": ["grouped", "snake", "row", "column"]}
    sp = tune_space.search_space("v6", (4096, 4096, 8192), space=space, l2_keep=2, num_sms=132, l2_bytes=50 << 20)
    assert sp.points == 2 * 6 * 4
    per_tile: dict = {}
    for c in sp.candidates:
        per_tile.setdefault((c["blk_n"], c["tile_order"]), []).append(c["l2_group_size"])
    for (blk_n, order), sizes in per_tile.items():
        if order in ("row", "column"):
            assert sizes == [8]  # one stand-in (the rung's default) for sizes the order ignores
        else:
            assert len(sizes) == 2
    assert len(sp.candidates) == 2 * (2 + 2 + 1 + 1)
    reasons = [p["reason"] for p in sp.pruned]
    assert reasons.count("redundant") == 2 * 2 * 5 and reasons.count("l2-model") == 2 * 2 * 4
    assert sp.l2_model["num_sms"] == 132 and sp.l2_model["keep"] == 2
    # without the model every group size stays
    full = tune_space.search_space("v6", (4096, 4096, 8192), space=space, l2_keep=0)
    assert len(full.candidates) == 2 * (6 + 6 + 1 + 1)


def test_pruning_cost_does_not_grow_with_the_grid(monkeypatch):
    """v6 at 32768 x 32768 x 4096 (and a 65535 x 1 tile grid): the validator checks the tile order
    without walking the grid, and the L2 model plays a bounded number of waves."""
    import schedulers.orders
    import schedulers.traffic

    walked = []
    real_first = schedulers.orders.first_tiles

    def no_full_walk(*args, **kwargs):
        raise AssertionError(f"the whole tile order was built: {args}")

    def counted_first(*args, **kwargs):
        walked.append(args[3])
        return real_first(*args, **kwargs)

    monkeypatch.setattr(schedulers.orders, "tile_order", no_full_walk)
    monkeypatch.setattr(schedulers.traffic, "waves", no_full_walk)
    monkeypatch.setattr(schedulers.traffic, "first_tiles", counted_first)
    import gemm_ladder

    assert gemm_ladder.make_config("v6", 2**23 - 128, 64, 64).grid_mn == (2**16 - 1, 1)
    sp = tune_space.search_space("v6", (32768, 32768, 4096), space={"pipe_depth": [3], "num_warpgroups": [2]},
                                 num_sms=132, l2_bytes=50 << 20)
    assert sp.candidates and sp.counts()["l2-model"] > 0
    assert walked and max(walked) <= tune_space.MODEL_WAVES * 132


@pytest.mark.parametrize("shape", [(16384, 16384, 4096), (8192, 8192, 8192), (32768, 8192, 8192)])
def test_the_l2_models_first_waves_rank_like_all_of_them(shape):
    from schedulers import rank_group_sizes

    args = (*shape, 128, 256, 132, 50 << 20)
    for order in ("grouped", "snake"):
        full = rank_group_sizes(*args, order=order, group_sizes=(1, 2, 4, 8, 16, 32))
        window = rank_group_sizes(*args, order=order, group_sizes=(1, 2, 4, 8, 16, 32),
                                  max_waves=tune_space.MODEL_WAVES)
        assert [g for g, _ in window[:3]] == [g for g, _ in full[:3]], (order, shape)


def test_parse_space():
    assert tune_space.parse_space(["pipe_depth=3,4,5", "blk_n=128,256;tile_order=grouped,snake"]) == {
        "pipe_depth": [3, 4, 5], "blk_n": [128, 256], "tile_order": ["grouped", "snake"]}
    # switches as --knob takes them (a string 'False' would be refused by every rung's validator)
    assert tune_space.parse_space(["stream_k=false,True;dynamic_m=FALSE"]) == {
        "stream_k": [False, True], "dynamic_m": [False]}
    with pytest.raises(ValueError, match="knob=v1,v2"):
        tune_space.parse_space(["pipe_depth"])


# -- the cache ------------------------------------------------------------------------------
def test_cache_key_changes_with_everything_that_changes_the_binary():
    base = dict(rung="v6", knobs={"pipe_depth": 4, "l2_group_size": 8}, shape=(4096, 4096, 4096),
                dtype="float16", arch="sm_90a", tvm_version="0.27.0.post1", compiler="nvrtc 13.0", sources="abc")
    key = identity.cache_key(**base)
    assert key == identity.cache_key(**{**base, "knobs": {"l2_group_size": 8, "pipe_depth": 4}})  # order-free
    changes = {"rung": "v5", "knobs": {"pipe_depth": 5, "l2_group_size": 8}, "shape": (4096, 4096, 8192),
               "dtype": "bfloat16", "arch": "sm_100a", "tvm_version": "0.28.0", "compiler": "nvcc 13.0",
               "sources": "abd"}
    keys = {identity.cache_key(**{**base, name: value}) for name, value in changes.items()}
    assert len(keys) == len(changes) and key not in keys


def test_sources_hash_covers_kernels_not_host_code():
    h = identity.sources_hash("sm_90a")
    assert len(h) == 64 and h != identity.sources_hash("sm_100a")
    names = {n for n, _ in identity.hashed_sources("sm_90a")}
    for kernel_side in ("gemm_ladder/sm90a/hgemm_v6.py", "gemm_ladder/sm90a/common.py", "gemm_ladder/core/budget.py",
                        "gemm_ladder/core/config.py", "gemm_ladder/compile/builder.py", "layouts/swizzle.py",
                        "schedulers/tirx_orders.py"):
        assert kernel_side in names, kernel_side
    for host_side in ("gemm_ladder/cli.py", "gemm_ladder/serve/tuning_db.py", "gemm_ladder/serve/plan.py",
                      "gemm_ladder/teach/plots.py",
                      "gemm_ladder/compile/batch.py", "gemm_ladder/sm100a/hgemm_v6.py", "schedulers/plots.py"):
        assert host_side not in names, host_side
    ident = identity.toolchain_identity("sm_90a")
    assert ident["tvm_version"] == TVM and ident["compiler"].startswith(("nvrtc", "nvcc"))


def test_second_identical_build_only_run_builds_nothing(tmp_path):
    space = {"blk_m": [64], "blk_n": [64, 128], "num_warpgroups": [1]}
    # the identity is read once: this tree may be edited by others while the test runs
    kw = dict(space=space, cache_dir=tmp_path / "cache", out=tmp_path / "cands", build_only=True,
              jobs=2, progress=False, identity=identity.toolchain_identity("sm_90a"))
    first = run.tune("v4", (128, 128, 64), **kw)
    assert first["counts"]["built"] == 2 and first["counts"]["cached"] == 0, first["failed"]
    assert len(first["candidates"]) == 2
    so = [tmp_path / "cands" / c["file"] for c in first["candidates"]]
    assert all(p.exists() and Path(str(p) + ".json").exists() for p in so)
    man = json.loads(Path(str(so[0]) + ".json").read_text())
    assert man["tuning"]["cache_key"] == first["candidates"][0]["cache_key"]
    stamps = [p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("*.so")]

    second = run.tune("v4", (128, 128, 64), **kw)
    assert second["counts"]["built"] == 0 and second["counts"]["cached"] == 2
    assert [p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("*.so")] == stamps
    on_disk = json.loads((tmp_path / "cands" / measuring.CANDIDATES).read_text())
    assert [c["knobs"]["blk_n"] for c in on_disk["candidates"]] == [64, 128]
    assert on_disk["tvm_version"] == TVM and on_disk["compiler"]


def test_two_runs_into_one_folder_do_not_mix(tmp_path):
    """A second tuning run into a folder in use is refused at once, with a message; nothing is built."""
    from gemm_ladder.core import files

    sp = tune_space.Space("v4", (128, 128, 64), "float16", "sm_90a", {}, candidates=[{"blk_n": 64}])
    with files.folder_lock(tmp_path / "cands"):
        with pytest.raises(files.FolderInUse, match="in use by another gemm_ladder run.*another folder"):
            cache.build_candidates(sp, tmp_path / "cands", cache_dir=tmp_path / "cache", show_progress=False,
                                   identity={"tvm_version": TVM, "compiler": "nvrtc 13.0", "sources": "s"})
    assert not list((tmp_path / "cands").glob("*.so")) and not (tmp_path / "cache").exists()


# -- measuring on canned results ------------------------------------------------------------
def _candidate_folder(folder: Path, knobs_list) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cands = []
    for i, knobs in enumerate(knobs_list):
        name = f"v4_256x256x256_float16_{i:012d}.so"
        (folder / name).write_bytes(b"not a real module")
        cands.append({"id": f"c{i:03d}", "file": name, "knobs": knobs, "cache_key": f"{i:064d}", "status": "built"})
    man = {"format": measuring.CANDIDATES_FORMAT, "version": 1, "rung": "v4", "shape": [256, 256, 256],
           "dtype": "float16", "arch": "sm_90a", "tvm_version": TVM, "compiler": "nvrtc 13.0", "sources": "s",
           "commit": "abc1234", "created": "2026-11-22T00:00:00+00:00", "space": {}, "candidates": cands,
           "failed": [], "pruned": []}
    (folder / measuring.CANDIDATES).write_text(json.dumps(man))
    return folder


def _timed(tflops, cublas=600.0):
    return {"status": "ok", "ms": 1.0, "tflops": tflops, "cublas_ms": 1.0, "cublas_tflops": cublas,
            "ratio_to_cublas": tflops / cublas, "rel_err": 1e-4}


CANNED = {
    0: _timed(300.0),
    1: _timed(450.0),
    2: {"status": "timeout", "detail": "no result after 5 s (a deadlock?)"},
    3: {"status": "wrong", "tflops": 9999.0, "detail": "4096 bad elements"},
    4: {"status": "crash", "returncode": -11, "detail": "Segmentation fault"},
    5: {"status": "error", "detail": "CUDA error: an illegal memory access was encountered"},
}
RETRIED = {5: _timed(350.0)}  # erred in the shared child (after a faulting kernel), fine alone
KNOBS = [{"blk_m": 128, "blk_n": n, "blk_k": 64, "num_warpgroups": w} for n, w in
         ((64, 1), (128, 2), (192, 1), (256, 2), (128, 1), (64, 2))]


@pytest.fixture
def measured(tmp_path, monkeypatch):
    from gemm_ladder.measure import isolate

    folder = _candidate_folder(tmp_path / "cands", KNOBS)
    calls = []

    def index(path):
        return int(Path(path).stem.rsplit("_", 1)[1])

    def fake_run_batch(job, paths, args=(), timeout=120.0, on_result=None, explain=True):
        calls.append(("batch", job, [Path(p).name for p in paths], tuple(args), timeout))
        out = []
        for p in paths:
            res = {**CANNED[index(p)], "module": Path(p).name}
            out.append(res)
            if on_result:
                on_result(res)
        return out

    def fake_run_isolated(job, path, *args, timeout=120.0):
        calls.append(("alone", job, [Path(path).name], args, timeout))
        return dict(RETRIED[index(path)])

    monkeypatch.setattr(isolate, "run_batch", fake_run_batch)
    monkeypatch.setattr(isolate, "run_isolated", fake_run_isolated)
    report = measuring.measure(folder, reps=7, timeout=5.0, gpu=GPU, progress=True, confirm_top=0)
    return folder, report, calls


def test_measure_records_failures_and_picks_the_fastest_correct(measured):
    folder, report, calls = measured
    assert calls[0][:2] == ("batch", "time") and len(calls[0][2]) == 6
    assert calls[0][3] == (7,) and calls[0][4] == 5.0
    assert calls[1][:3] == ("alone", "time", [report["results"][5]["file"]])  # the erred one, again
    status = [r["status"] for r in report["results"]]
    assert status == ["ok", "ok", "timeout", "wrong", "crash", "ok"]
    assert "illegal memory access" in report["results"][5]["first_try"]
    assert report["best"]["id"] == "c001" and report["best"]["tflops"] == 450.0
    assert "deadlock" in report["results"][2]["detail"]
    written = json.loads(Path(report["path"]).read_text())
    assert written["format"] == measuring.MEASUREMENTS_FORMAT and written["gpu"]["name"] == GPU["name"]
    assert Path(report["path"]).parent == folder
    table = tune_report.format_table(report)
    assert "timeout" in table and "wrong" in table and "450.0" in table
    assert table.index("450.0") < table.index("350.0") < table.index("300.0")


# the second pass (measuring.confirm): the first pass's leaders timed again together
def _rounds(ratio, cublas=600.0):
    return {"status": "ok", "ms": 1.0 / ratio, "tflops": cublas * ratio, "cublas_tflops": cublas,
            "ratio_to_cublas": ratio, "round_ratio_to_cublas_quartiles": [ratio - 0.01, ratio, ratio + 0.01]}


@pytest.mark.parametrize("second, best, statuses", [
    # the first pass's runner-up (c005, 350 TFLOPS) is ahead when they take turns in the same rounds
    ({1: _rounds(0.55), 5: _rounds(0.62), 0: _rounds(0.50)}, "c005", ["ok", "ok", "timeout", "wrong", "crash", "ok"]),
    # the leader fails its second check: it is wrong, not the best
    ({1: {"status": "wrong", "rel_err": 0.3, "detail": "4096 bad elements"}, 5: _rounds(0.55), 0: _rounds(0.58)},
     "c000", ["ok", "wrong", "timeout", "wrong", "crash", "ok"]),
    # the second pass errs for one: it keeps its first pass, unconfirmed, below the confirmed ones
    ({1: {"status": "error", "detail": "RuntimeError: x"}, 5: _rounds(0.52), 0: _rounds(0.51)},
     "c005", ["ok", "ok", "timeout", "wrong", "crash", "ok"]),
])
def test_second_pass_ranks_the_leaders(tmp_path, monkeypatch, second, best, statuses):
    from gemm_ladder.measure import isolate

    folder = _candidate_folder(tmp_path / "cands", KNOBS)
    calls = []

    def index(path):
        return int(Path(path).stem.rsplit("_", 1)[1])

    def fake_run_batch(job, paths, args=(), timeout=120.0, on_result=None, explain=True):
        calls.append((job, [index(p) for p in paths], tuple(args), timeout, explain))
        table = second if job == "rounds" else CANNED
        return [{**table[index(p)], "module": Path(p).name} for p in paths]

    monkeypatch.setattr(isolate, "run_batch", fake_run_batch)
    monkeypatch.setattr(isolate, "run_isolated", lambda job, path, *a, timeout=120.0: dict(RETRIED[index(path)]))
    report = measuring.measure(folder, reps=7, timeout=5.0, gpu=GPU, progress=False, plot=False, confirm_top=3)
    job, group, args, timeout, explain = calls[-1]
    assert (job, group, explain) == ("rounds", [1, 5, 0], False)  # the three best of the first pass, best first
    assert args == (measuring.rounds.ROUNDS, measuring.rounds.PER_ROUND, measuring.rounds.WARM_S)
    assert timeout >= 3 * 5.0  # the group's deadline, not one module's
    assert [r["status"] for r in report["results"]] == statuses
    assert report["best"]["id"] == best and report["best"]["confirmed"] is True
    assert report["best"]["ratio_to_cublas"] == second[int(best[1:])]["ratio_to_cublas"]
    assert report["best"]["first_pass"]["tflops"] == {**CANNED, **RETRIED}[int(best[1:])]["tflops"]
    assert report["confirm"]["candidates"] == [report["results"][i]["file"] for i in (1, 5, 0)]
    erred = [r for r in report["results"] if "confirm_error" in r]
    assert all(not r.get("confirmed") for r in erred)
    entry = tune_merge.entry_from_measurements(report)
    assert entry["knobs"] == report["best"]["knobs"] and entry["confirmed"] is True


def test_second_pass_needs_two_correct_leaders():
    ok, bad = _timed(400.0), {"status": "wrong"}
    assert measuring.confirm_pick([ok, bad, _timed(300.0)], 4) == [0, 2]
    assert measuring.confirm_pick([ok, bad], 4) == []          # one correct: nothing to compare
    assert measuring.confirm_pick([ok, _timed(500.0)], 1) == []  # --confirm 1: first pass only
    assert measuring.confirm_pick([ok, _timed(500.0), _timed(450.0)], 2) == [1, 2]


def test_a_confirmed_entry_outranks_a_first_pass_one():
    """A first pass on a cool GPU reads ratios several percent high: a confirmed entry (same rounds,
    power limit) wins over an unconfirmed one whatever their ratios."""
    first_pass = {"ratio_to_cublas": 1.07, "tflops": 750.0}
    confirmed = {"ratio_to_cublas": 1.02, "tflops": 700.0, "confirmed": True}
    assert max([first_pass, confirmed], key=tune_report.speed_rank) is confirmed
    assert max([{**confirmed, "ratio_to_cublas": 1.03}, confirmed], key=tune_report.speed_rank)["ratio_to_cublas"] == 1.03


def test_plot_is_written(measured, tmp_path):
    _, report, _ = measured
    assert report["plot"] and Path(report["plot"]).stat().st_size > 1000
    png = tmp_path / "plots" / "heat.png"
    assert tune_report.plot_measurements(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_then_best_knobs_and_load_best(measured, private_db, monkeypatch):
    folder, report, _ = measured
    merged = tune_merge.merge([report["path"]])
    assert merged[0]["action"] == "added"
    saved = json.loads(private_db.read_text())
    assert saved["format"] == db.DB_FORMAT and len(saved["entries"]) == 1
    e = saved["entries"][0]
    assert e["knobs"] == KNOBS[1] and e["tflops"] == 450.0 and e["cublas_tflops"] == 600.0
    assert e["gpu"] == GPU["name"] and e["tvm_version"] == TVM and e["commit"] == "abc1234"
    assert e["bucket"] == [256, 256, 256] and e["date"]
    assert tune_merge.merge([report["path"]])[0]["action"] == "kept"  # merging twice changes nothing

    knobs, entry = db.best_knobs("v4", 256, 256, 256, gpu=None)
    assert knobs == KNOBS[1] and entry["tflops"] == 450.0

    loaded = {}
    monkeypatch.setattr("gemm_ladder.serve.runtime.load", lambda p: loaded.setdefault("mod", types.SimpleNamespace(path=p)))
    mod = measuring.load_best(folder, 256, 256, 256, "float16")
    assert Path(mod.path).name == report["best"]["file"]
    assert mod.tuned_from["tflops"] == 450.0
    with pytest.raises(FileNotFoundError):
        measuring.load_best(folder, 512, 512, 512)


# -- the database ---------------------------------------------------------------------------
def _entry(shape=(4096, 4096, 4096), tflops=500.0, gpu="NVIDIA H100 80GB HBM3", tvm=TVM, knobs=None, ratio=None):
    return {"rung": "v4", "shape": list(shape), "bucket": db.shape_bucket(shape), "dtype": "float16",
            "arch": "sm_90a", "gpu": gpu, "tvm_version": tvm,
            "knobs": knobs or {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1},
            "tflops": tflops, "cublas_tflops": 650.0, "ratio_to_cublas": ratio or tflops / 650.0,
            "date": "2026-11-22T00:00:00+00:00", "commit": "abc", "sources": "s"}


def _write_db(path, entries):
    path.write_text(json.dumps({"format": db.DB_FORMAT, "version": db.DB_VERSION, "entries": entries}))


def test_the_ratio_to_cublas_ranks_candidates_before_tflops():
    """A candidate timed on a hotter GPU shows fewer TFLOPS but keeps its ratio to cuBLAS timed
    beside it: the report's best, the database entry and the lookup all take the higher ratio;
    without ratios the TFLOPS decide."""
    fast_clock = {"id": "c000", "status": "ok", "tflops": 760.0, "ratio_to_cublas": 1.004,
                  "knobs": {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}}
    better = {"id": "c001", "status": "ok", "tflops": 731.0, "ratio_to_cublas": 1.024,
              "knobs": {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2}}
    assert max([fast_clock, better], key=tune_report.speed_rank)["id"] == "c001"
    no_ratio = [{**fast_clock, "ratio_to_cublas": None}, {**better, "ratio_to_cublas": None}]
    assert max(no_ratio, key=tune_report.speed_rank)["id"] == "c000"
    report = {"rung": "v4", "shape": [4096, 4096, 4096], "dtype": "float16", "arch": "sm_90a",
              "tvm_version": TVM, "gpu": {"name": "NVIDIA H100 80GB HBM3"}, "results": [fast_clock, better]}
    entry = tune_merge.entry_from_measurements(report)
    assert entry["knobs"] == better["knobs"] and entry["tflops"] == 731.0


def test_db_lookup_prefers_the_higher_ratio_of_one_shape(private_db):
    slow_ratio = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
    high_ratio = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2}
    _write_db(private_db, [_entry(tflops=760.0, ratio=1.004, knobs=slow_ratio),
                           {**_entry(tflops=731.0, ratio=1.024, knobs=high_ratio), "commit": "def"}])
    tdb = db.TuningDB()
    assert len(tdb.entries) == 2
    assert db.best_knobs("v4", 4096, 4096, 4096, gpu=None)[0] == high_ratio


def test_db_round_trip(private_db):
    tdb = db.TuningDB()
    assert tdb.path == private_db and tdb.entries == []
    assert tdb.upsert(_entry()) == "added"
    assert tdb.upsert(_entry(tflops=400.0)) == "kept"
    assert tdb.upsert(_entry(tflops=550.0)) == "replaced"
    assert tdb.upsert(_entry(gpu="NVIDIA H200")) == "added"
    tdb.save()
    again = db.TuningDB()
    assert len(again.entries) == 2
    assert {e["gpu"]: e["tflops"] for e in again.entries} == {"NVIDIA H100 80GB HBM3": 550.0, "NVIDIA H200": 500.0}


def test_corrupted_db_is_ignored_with_a_warning(private_db):
    private_db.write_text('{"format": "gemm_ladder.tuning_db", "entr')
    with pytest.warns(UserWarning, match="unreadable"):
        tdb = db.TuningDB()
    assert tdb.entries == []
    with pytest.warns(UserWarning, match="unreadable"):
        assert db.best_knobs("v4", 4096, 4096, 4096) is None
    with pytest.warns(UserWarning, match="moved to"):
        tdb.upsert(_entry())
        tdb.save()
    assert len(db.TuningDB().entries) == 1
    assert list(private_db.parent.glob("tuning_db.json.corrupt-*"))


def test_foreign_and_refused_entries_are_ignored_with_a_warning(private_db):
    _write_db(private_db, [
        _entry(tflops=900.0, tvm="0.26.0"),                                             # other TVM
        _entry(tflops=800.0, knobs={"blk_m": 128, "blk_n": 128, "pipe_depth": 4}),       # v4 has no pipe_depth
        _entry(tflops=700.0, knobs={"blk_m": 256, "blk_n": 256, "num_warpgroups": 1}),   # refused: registers
        {**_entry(tflops=650.0), "rung": "v99"},                                       # unknown rung
        _entry(tflops=400.0),
    ])
    with pytest.warns(UserWarning) as record:
        knobs, entry = db.best_knobs("v4", 4096, 4096, 4096, gpu=None)
    assert entry["tflops"] == 400.0
    text = "\n".join(str(w.message) for w in record)
    assert "TVM 0.26.0" in text and "pipe_depth" in text and "refused now" in text and "v99" in text


@pytest.mark.parametrize("bad, words", [
    ({"tflops": -5.0}, "not a positive finite number"),
    ({"tflops": float("nan")}, "not a positive finite number"),
    ({"tflops": float("inf")}, "not a positive finite number"),
    ({"tflops": 5000.0}, "above the 990 TFLOPS"),
    ({"tflops": True}, "tflops True is not a number"),
    ({"ratio_to_cublas": float("nan")}, "ratio_to_cublas"),
    ({"knobs": {"blk_m": 128.0, "blk_n": 128}}, "blk_m=128.0 is float"),
    ({"knobs": {"blk_m": [128]}}, "blk_m=[128] is list"),
])
def test_db_ignores_speeds_and_knobs_no_gpu_can_have(private_db, bad, words):
    _write_db(private_db, [_entry(tflops=400.0), {**_entry(tflops=450.0, gpu="NVIDIA H200"), **bad}])
    with pytest.warns(UserWarning, match="entry ignored") as record:
        tdb = db.TuningDB()
    assert [e["tflops"] for e in tdb.entries] == [400.0]
    assert words in str(record[0].message)
    with pytest.warns(UserWarning):
        assert db.best_knobs("v4", 4096, 4096, 4096, gpu=None)[1]["tflops"] == 400.0


def test_db_takes_switch_knobs_and_the_validator_refuses_a_bool_for_an_int(private_db):
    """A knob may be a bool (v10's stream_k, v9's dynamic_m): the database keeps such entries; a
    bool where the rung wants an int is left to the rung's validator, which refuses it at use."""
    switch = {**_entry(tflops=450.0), "rung": "v10", "shape": [1792, 2560, 8192], "bucket": db.shape_bucket((1792, 2560, 8192)),
              "knobs": {"split_k": 1, "stream_k": True, "dynamic_m": False}}
    _write_db(private_db, [switch, _entry(tflops=500.0, knobs={"blk_m": True, "blk_n": 128})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tdb = db.TuningDB()
    assert len(tdb.entries) == 2
    knobs, entry = db.best_knobs("v10", 1792, 2560, 8192, gpu=None)
    assert (knobs["stream_k"], knobs["dynamic_m"], entry["tflops"]) == (True, False, 450.0)
    with pytest.warns(UserWarning, match="refused now.*blk_m=True"):
        assert db.best_knobs("v4", 4096, 4096, 4096, gpu=None) is None


def test_merge_ignores_impossible_measurements(measured, private_db):
    _, report, _ = measured
    fake = dict(report, results=[dict(r) for r in report["results"]])
    fake["results"][1]["tflops"] = float("nan")  # the fastest correct one, broken
    fake["results"][0]["tflops"] = 1e6
    path = Path(report["path"]).with_name("measurements_broken.json")
    path.write_text(json.dumps(fake))
    with pytest.warns(UserWarning, match="ignored"):
        merged = tune_merge.merge([path])
    assert merged[0]["entry"]["tflops"] == 350.0  # the next correct one; NaN and 1e6 left out
    everything_broken = dict(fake, results=[dict(r, tflops=-1.0) for r in fake["results"]])
    path.write_text(json.dumps(everything_broken))
    with pytest.warns(UserWarning) as record:
        assert tune_merge.merge([path])[0]["action"] == "nothing"
    assert any("nothing merged" in str(w.message) for w in record)


def test_best_knobs_picks_the_fastest_and_prefers_this_gpu(private_db):
    fast = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2}
    slow = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
    _write_db(private_db, [_entry(tflops=500.0, gpu="NVIDIA H100 80GB HBM3", knobs=slow),
                           _entry(tflops=600.0, gpu="NVIDIA H200", knobs=fast)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert db.best_knobs("v4", 4096, 4096, 4096, gpu=None)[0] == fast  # build box: any GPU
        assert db.best_knobs("v4", 4096, 4096, 4096, gpu="NVIDIA H100 80GB HBM3")[0] == slow
        assert db.best_knobs("v4", 4096, 4096, 4096, dtype="bfloat16", gpu=None) is None
        assert db.best_knobs("v4", 4096, 4096, 4096, arch="sm_100a", gpu=None) is None


def test_shape_buckets(private_db):
    assert db.shape_bucket((4096, 4096, 4096)) == [4096] * 3
    assert db.shape_bucket((3900, 4500, 5000)) == [4096, 4096, 4096]
    assert db.shape_bucket((6000, 3000, 1000)) == [4096, 2048, 1024]
    assert db.shape_bucket((1, 3, 8)) == [1, 4, 8]
    a = {"blk_m": 128, "blk_n": 256, "blk_k": 64, "num_warpgroups": 2}
    b = {"blk_m": 128, "blk_n": 128, "blk_k": 64, "num_warpgroups": 1}
    c = {"blk_m": 256, "blk_n": 128, "blk_k": 64, "num_warpgroups": 2}
    _write_db(private_db, [_entry((4096, 4096, 4096), 600.0, knobs=a, ratio=0.80),
                           _entry((4000, 4096, 4096), 500.0, knobs=b, ratio=0.90),
                           _entry((8192, 8192, 8192), 650.0, knobs=c)])
    assert db.best_knobs("v4", 4096, 4096, 4096, gpu=None)[0] == a       # exact shape first
    assert db.best_knobs("v4", 4100, 4096, 4096, gpu=None)[0] == b       # bucket: best ratio to cuBLAS
    assert db.best_knobs("v4", 8000, 8192, 8192, gpu=None)[0] == c
    assert db.best_knobs("v4", 1024, 1024, 1024, gpu=None) is None


def test_db_location(monkeypatch, tmp_path):
    """One documented place whatever the working directory: the user overlay over the packaged
    database (the repo's own file is no longer picked from inside the checkout only)."""
    monkeypatch.setenv(db.DB_ENV, "off")
    assert db.default_db_path() is None and db.db_files() == (None, [])
    assert db.best_knobs("v4", 4096, 4096, 4096) is None
    monkeypatch.delenv(db.DB_ENV)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    seen = []
    for where in (Path(db.__file__).resolve().parents[2], tmp_path):
        monkeypatch.chdir(where)
        tdb = db.TuningDB()
        seen.append((tdb.path, tdb.files, [e["knobs"] for e in tdb.entries], tdb.describe()))
    assert seen[0] == seen[1]
    user = tmp_path / "cache" / "tuning_db.json"
    assert seen[0][:2] == (user, [user, db.PACKAGED_DB]) and seen[0][2]  # the packaged entries
    assert f"{user} (user overlay: absent) over {db.PACKAGED_DB} (packaged: " in seen[0][3]


# -- the builder hook -----------------------------------------------------------------------
def test_explicit_knobs_always_win(private_db):
    _write_db(private_db, [_entry()])
    knobs = {"blk_n": 64, "dtype": "float16"}
    assert db.tuned_knobs("v4", 4096, 4096, 4096, knobs) == (knobs, None)
    got, tuned_from = db.tuned_knobs("v4", 4096, 4096, 4096, {"dtype": "float16"})
    assert got == {"dtype": "float16", **_entry()["knobs"]} and tuned_from["tflops"] == 500.0


def test_build_without_knobs_uses_the_database(private_db, capsys):
    """gemm_ladder.build (the public API) takes the database's knobs and says so; the builder
    underneath is pure: the same call builds the rung's defaults whatever the database holds."""
    import gemm_ladder
    from gemm_ladder.compile import builder

    tuned = {"blk_m": 64, "blk_n": 64, "blk_k": 64, "num_warpgroups": 1}
    _write_db(private_db, [_entry((128, 128, 64), 321.0, knobs=tuned)])
    mod = gemm_ladder.build("v4", 128, 128, 64)
    assert mod.cfg.blk_m == 64 and mod.cfg.blk_n == 64
    man = mod.manifest()
    assert man["tuned_from"]["tflops"] == 321.0 and man["tuned_from"]["db"] == str(private_db)
    assert "tuned knobs" in capsys.readouterr().err
    assert gemm_ladder.build("v4", 128, 128, 64, blk_n=128).cfg.blk_n == 128  # explicit knobs win
    pure = builder.build("v4", 128, 128, 64)
    assert (pure.cfg.blk_m, pure.cfg.blk_n) == (128, 128) and "tuned_from" not in pure.manifest()
    assert "tuned knobs" not in capsys.readouterr().err


def test_the_cli_build_takes_tuned_knobs_and_says_so(private_db, tmp_path):
    tuned = {"blk_m": 64, "blk_n": 64, "blk_k": 64, "num_warpgroups": 1}
    _write_db(private_db, [_entry((128, 128, 64), 321.0, knobs=tuned)])
    out = subprocess.run([sys.executable, "-m", "gemm_ladder", "build", "v4", "--shape", "128x128x64",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                         cwd=Path(db.__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "tuned knobs" in out.stderr and Path(out.stdout.strip()).name.endswith("m64n64k64w1.so")
    man = json.loads(Path(out.stdout.strip() + ".json").read_text())
    assert man["tuned_from"]["tflops"] == 321.0 and man["knobs"]["blk_m"] == 64


def test_cli_merge_and_show(measured, private_db, capsys):
    from gemm_ladder.cli import main

    _, report, _ = measured
    assert main(["tune", "--merge", report["path"], "--db", str(private_db)]) == 0
    assert main(["tune", "--show", "--db", str(private_db)]) == 0
    out = capsys.readouterr().out
    assert "added" in out and "450.0" in out


def test_measure_path_needs_only_the_runtime(tmp_path):
    """--measure runs where TVM's compiler is absent: it imports no TVM, no rungs, no layouts/schedulers."""
    folder = _candidate_folder(tmp_path / "cands", KNOBS[:2])
    code = f"""
import sys
from gemm_ladder.measure import isolate
from gemm_ladder.tune import measuring
isolate.run_batch = lambda job, paths, args=(), timeout=0, on_result=None, explain=True: [{_timed(400.0)!r} for p in paths]
r = measuring.measure({str(folder)!r}, gpu={GPU!r}, progress=False)
assert r["best"]["tflops"] == 400.0
bad = [m for m in sys.modules if m.split(".")[0] in ("tvm", "tvm_ffi", "layouts", "schedulers")
       or m in ("gemm_ladder.compile.builder", "gemm_ladder.rungs", "gemm_ladder.compile.toolchain")]
print("BAD", bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(db.__file__).resolve().parents[2], check=False)
    assert out.returncode == 0, out.stderr
    assert "BAD []" in out.stdout


@pytest.mark.parametrize("value, words", [("x", "not a whole number"), ("-1", "negative"), ("2.5", "not a whole")])
def test_confirm_refuses_what_is_not_a_count(value, words, capsys):
    from gemm_ladder.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["tune", "--measure", "somewhere", "--confirm", value])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err
