"""CPU tests of tuning over TVM's RPC tracker, and of plans (several shapes in one run).

A module-scoped :class:`gemm_ladder.tune.serve.Cluster` runs TVM's tracker (in this process)
and three RPC servers on 127.0.0.1 (``tests/rpc_stub.py``: the real server with a measure step
that reads stand-in modules). The runs upload stand-ins with real manifests, and go through
kernels that crash, hang or are wrong, a server killed from outside in the middle of a run,
a server that hangs, and replies that cannot be real. Ports are picked free; every loop has
a deadline; the cluster is torn down (process groups killed, tracker stopped) at the end.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gemm_ladder.measure import isolate
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import merge as tune_merge
from gemm_ladder.tune import jobs, measuring, rpc, serve
from gemm_ladder.tune import report as tune_report

ROOT = Path(__file__).resolve().parents[1]
KEY = "stand-in"
TIMEOUT = 3.0  # per candidate, in the server's watched child


@pytest.fixture(autouse=True)
def private_db(tmp_path, monkeypatch):
    path = tmp_path / "tuning_db.json"
    monkeypatch.setenv(db.DB_ENV, str(path))
    return path


@pytest.fixture(autouse=True)
def short_sessions(monkeypatch):
    """The stub's watched child starts in seconds (no torch): session timeouts to match."""
    monkeypatch.setattr(isolate, "STARTUP_SECONDS", 5.0)
    monkeypatch.setattr(rpc, "UPLOAD_SECONDS", 10.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("rpc_logs")
    c = serve.Cluster(KEY, gpus=["0", "1", "2"], host="127.0.0.1", port=_free_port(), server_port=_free_port(),
                      server_cmd=[sys.executable, "-m", "tests.rpc_stub"], log_dir=logs,
                      env={"TVM_USE_RUNTIME_LIB": "1"})
    try:
        found = c.start(wait=240)
        text = "\n".join(p.read_text() for p in sorted(logs.glob("*.log")))
        assert len(found) == 3, f"{len(found)} of 3 servers registered:\n{text[-3000:]}"
        yield c
    finally:
        c.stop()


def _standins(folder: Path, shape, words) -> Path:
    """A candidate folder of stand-in modules (see tests/rpc_stub.py) with real manifests."""
    folder.mkdir(parents=True)
    cands = []
    for i, word in enumerate(words):
        name = f"v6_{'x'.join(map(str, shape))}_float16_{i:012d}.so"
        data = word.encode()
        (folder / name).write_bytes(data)
        man = {"format": 2, "rung": "v6", "shape": list(shape), "dtype": "float16", "arch": "sm_90a",
               "knobs": {"pipe_depth": 3 + i % 3, "l2_group_size": 1 << i}, "tvm_version": "0.27.0.post1",
               "so_bytes": len(data), "so_sha256": hashlib.sha256(data).hexdigest()}
        (folder / f"{name}.json").write_text(json.dumps(man))
        cands.append({"id": f"c{i:03d}", "file": name, "knobs": man["knobs"], "cache_key": f"{i:064d}",
                      "status": "built"})
    (folder / measuring.CANDIDATES).write_text(json.dumps({
        "format": measuring.CANDIDATES_FORMAT, "version": 1, "rung": "v6", "shape": list(shape), "dtype": "float16",
        "arch": "sm_90a", "tvm_version": "0.27.0.post1", "compiler": "nvrtc 13.0", "sources": "s", "commit": "abc",
        "created": "2026-11-22T00:00:00+00:00", "space": {}, "candidates": cands, "failed": [], "pruned": []}))
    return folder


def _kill_when_slow(marker_dir: Path, killed: list, limit: float = 180.0) -> threading.Thread:
    """Kill the process group of the server that writes ``slow.pgid``: a server killed in the middle."""
    def run():
        deadline = time.monotonic() + limit
        marker = marker_dir / "slow.pgid"
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                pgid = int(marker.read_text())
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
                return
            time.sleep(0.1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _statuses(report) -> list[str]:
    return [r["status"] for r in report["results"]]


@pytest.mark.timeout(600)
def test_a_run_over_rpc_survives_a_killed_server_and_bad_candidates(cluster, tmp_path, private_db):
    marks = tmp_path / "marks"
    marks.mkdir()
    a = _standins(tmp_path / "a", (256, 256, 256), ["ok 300", "ok 450", "wrong", "crash", f"slow {marks}", "ok 350"])
    b = _standins(tmp_path / "b", (512, 256, 256), ["ok 400", "hang", "server-hang", "lie", "garbage", "ok 420"])
    killed: list = []
    killer = _kill_when_slow(marks, killed)
    start = time.monotonic()
    run = rpc.measure_folders([a, b], cluster.tracker, KEY, reps=5, timeout=TIMEOUT, batch=1,
                              out=tmp_path / "run.json", progress=False, plot=False, server_wait=60)
    killer.join(1)
    assert time.monotonic() - start < 240
    assert killed, "the slow candidate never ran"
    ra, rb = run["reports"]
    assert _statuses(ra) == ["ok", "ok", "wrong", "crash", "server-lost", "ok"]
    assert _statuses(rb) == ["ok", "timeout", "server-lost", "bad-reply", "bad-reply", "ok"]
    lost = ra["results"][4]["detail"]
    assert "RPC session ended" in lost
    assert "RPCSessionTimeoutError" in rb["results"][2]["detail"] or "no reply" in rb["results"][2]["detail"]
    assert "above the 990 TFLOPS" in rb["results"][3]["detail"] and "not a result" in rb["results"][4]["detail"]
    assert ra["best"]["tflops"] == 450.0 and ra["best"]["id"] == "c001" and rb["best"]["tflops"] == 420.0
    # who measured what: every result names its server, the report its GPU
    assert all(r.get("server") for r in ra["results"] + rb["results"] if r["status"] not in ("server-lost",))
    assert ra["gpu"]["name"] == "Stand-in GPU" and ra["rpc"]["key"] == KEY
    assert run["measured"] == 12 and run["ok"] == 5 and len(run["servers"]) >= 2
    assert run["candidates_per_minute"] > 0
    # the killed server is gone; the others still serve
    dead = [g for g, p in cluster.servers.items() if p.poll() is not None]
    assert len(dead) == 1 and cluster.servers[dead[0]].pid == killed[0]
    assert len(serve.servers_of(cluster.tracker, KEY)) == 2
    # each folder has its measurements file; the run file merges into the one database
    assert Path(ra["path"]).parent == a and json.loads(Path(ra["path"]).read_text())["format"] == \
        measuring.MEASUREMENTS_FORMAT
    merged = tune_merge.merge([tmp_path / "run.json"])
    assert [m["action"] for m in merged] == ["added", "added"]
    assert sorted(e["tflops"] for e in db.TuningDB().entries) == [420.0, 450.0]
    table = tune_report.format_run(run)
    assert "candidates/min" in table and "450.0" in table and "server-lost:1" in table


@pytest.mark.timeout(600)
def test_a_batch_whose_server_dies_is_measured_again_alone(cluster, tmp_path, private_db, capsys):
    from gemm_ladder.cli import main

    cluster.restart_dead()
    assert len(cluster.wait_for(3, 240)) == 3
    marks = tmp_path / "marks"
    marks.mkdir()
    folder = _standins(tmp_path / "c", (256, 256, 256),
                       ["ok 300", "ok 310", f"slow {marks}", "ok 320", "ok 330", "ok 340"])
    killed: list = []
    killer = _kill_when_slow(marks, killed)
    run_path = tmp_path / "run.json"
    code = main(["tune", "--measure", str(folder), "--tracker", f"{cluster.tracker[0]}:{cluster.tracker[1]}",
                 "--key", KEY, "--rpc-batch", "3", "--timeout", str(TIMEOUT), "--reps", "5",
                 "--run-out", str(run_path)])
    killer.join(1)
    out = capsys.readouterr().out
    assert code == 0 and killed, out
    assert "candidates/min" in out and "tune --merge" in out
    results = json.loads(run_path.read_text())["reports"][0]["results"]
    assert _statuses({"results": results}) == ["ok"] * 6
    again = [r["id"] for r in results if "server-lost in a batch of 3" in r.get("first_try", "")]
    assert again == ["c000", "c001", "c002"]  # the killed batch, each measured alone elsewhere
    assert results[2]["tflops"] == 100.0
    assert main(["tune", "--merge", str(run_path), "--db", str(private_db)]) == 0
    assert db.TuningDB(private_db).entries[0]["tflops"] == 340.0


def test_no_server_for_the_key_is_an_error_not_a_wait(cluster, tmp_path):
    folder = _standins(tmp_path / "d", (256, 256, 256), ["ok 300"])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="no RPC server with key 'nobody'.*serve --key nobody"):
        rpc.measure_folders([folder], cluster.tracker, "nobody", progress=False, server_wait=1.0)
    assert time.monotonic() - start < 30


def test_servers_that_all_die_leave_the_rest_no_server(tmp_path, monkeypatch):
    """With no server at the tracker for server_wait, what is queued or under way is recorded, not
    waited on: a server was there when the run began, and its session never came."""
    from tvm import rpc as tvm_rpc

    folder = _standins(tmp_path / "d", (256, 256, 256), ["ok 300"] * 5)
    release, asked = threading.Event(), []

    def connect_tracker(*address):  # the session a dead server never gives
        asked.append(address)
        release.wait(60)
        raise ConnectionError("the test is over")

    there = iter([["the server"]])  # registered when the run starts, then gone
    monkeypatch.setattr(rpc, "servers_of", lambda tracker, key: next(there, []))
    monkeypatch.setattr(rpc, "SERVER_CHECK_EVERY", 0.0)
    monkeypatch.setattr(tvm_rpc, "connect_tracker", connect_tracker)
    try:
        run = rpc.measure_folders([folder], ("127.0.0.1", 1), KEY, batch=2, workers=1, progress=False, plot=False,
                                  server_wait=0.5)
    finally:
        release.set()
    assert len(asked) <= 1  # one worker: at most one batch under way, the rest queued
    results = run["reports"][0]["results"]
    assert [r["status"] for r in results] == ["no-server"] * 5 and run["measured"] == 0
    assert "no server with key" in results[4]["detail"]


def test_read_reply_refuses_what_cannot_be_results():
    items = [rpc.Item(0, 0, Path("a.so"), "aa" * 32), rpc.Item(0, 1, Path("b.so"), "bb" * 32)]
    ok = {"status": "ok", "ms": 1.0, "tflops": 400.0, "cublas_ms": 1.0, "cublas_tflops": 600.0,
          "ratio_to_cublas": 0.66}
    who = {"host": "h", "cuda_visible_devices": "1", "gpu": {"name": "G"}}
    reply = json.dumps({"results": [{**ok, "so_sha256": "aa" * 32}, {**ok, "so_sha256": "cc" * 32}], "server": who})
    results, server = rpc.read_reply(reply, items, ["sm_90a"] * 2)
    assert results[0]["status"] == "ok" and results[0]["server"] == "h/gpu1" and server == who
    assert results[1]["status"] == "bad-reply" and "b.so" in results[1]["detail"]
    for bad, words in (("nonsense", "not JSON"), (json.dumps({"results": [ok]}), "list of 2 results"),
                       (None, "not JSON")):
        with pytest.raises(rpc.BadReply, match=words):
            rpc.read_reply(bad, items, ["sm_90a"] * 2)
    nan = json.dumps({"results": [{**ok, "so_sha256": "aa" * 32, "ms": float("nan")},
                                  {**ok, "so_sha256": "bb" * 32, "cublas_tflops": -1}]})
    results, _ = rpc.read_reply(nan, items, ["sm_90a", "sm_100a"])
    assert [r["status"] for r in results] == ["bad-reply", "bad-reply"]


def test_session_timeout_covers_every_module_hanging():
    assert rpc.session_timeout(4, 300.0) == 4 * (300.0 + isolate.STARTUP_SECONDS) + rpc.UPLOAD_SECONDS


def test_parse_address():
    assert serve.parse_address("10.0.0.5:9191") == ("10.0.0.5", 9191)
    assert serve.parse_address("gpu-host") == ("gpu-host", serve.TRACKER_PORT)
    with pytest.raises(ValueError, match="HOST:PORT"):
        serve.parse_address("host:port")


# -- plans: several shapes in one run --------------------------------------------------------
def test_plan_lines():
    found = jobs.parse_plan("""
        # weight shapes at three token counts
        v6 M=128,4096 NK=4096x4096,11008x4096   # two M x two weights
        v9 4096x4096x4096 dtype=float16,bfloat16 pipe_depth=3,4
        v6 128x4096x4096                         # already listed: once
    """)
    assert [(j.rung, j.shape, j.dtype) for j in found] == [
        ("v6", (128, 4096, 4096), "float16"), ("v6", (128, 11008, 4096), "float16"),
        ("v6", (4096, 4096, 4096), "float16"), ("v6", (4096, 11008, 4096), "float16"),
        ("v9", (4096, 4096, 4096), "float16"), ("v9", (4096, 4096, 4096), "bfloat16")]
    assert found[4].space == {"pipe_depth": [3, 4]} and found[0].space == {}
    assert found[0].name("sm_90a") == "v6_128x4096x4096_float16_sm_90a"


@pytest.mark.parametrize("line, words", [
    ("4096x4096x4096", "starts with a rung"),
    ("v6 4096x4096", "neither MxNxK"),
    ("v6 M=128", "M= and NK= go together"),
    ("v6 M=a NK=4096x4096", "not a list of ints"),
    ("v6 M=128 NK=4096", "not NxK"),
    ("v6 4096x4096x4096 dtype=float8", "not one of"),
    ("v6 dtype=float16", "no shape"),
])
def test_plan_errors_name_the_line_and_a_fix(line, words):
    with pytest.raises(jobs.PlanError, match=words) as err:
        jobs.parse_plan(f"# header\n{line}\n", source="model.plan")
    assert "model.plan:2" in str(err.value)


def test_cli_plan_dry_run_and_usage(tmp_path, capsys):
    from gemm_ladder.cli import main

    path = tmp_path / "p.plan"
    path.write_text("v4 M=128,256 NK=128x64\n")
    assert main(["tune", "--plan", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "v4_128x128x64_float16_sm_90a" in out and "v4_256x128x64_float16_sm_90a" in out
    assert main(["tune", "--plan", str(path), "--rung", "v4", "--dry-run"]) == 2
    assert main(["tune", "--rung", "v4", "--shape", "128x128x64", "--tracker", "127.0.0.1:1"]) == 2
    assert "go together" in capsys.readouterr().err


def test_the_pack_serves_rpc_alone(tmp_path):
    """What a GPU box runs (tracker, servers, the client) imports from the runtime pack, with
    only what torch brings beside it (numpy, typing_extensions): no compiler, no site-packages."""
    from gemm_ladder.serve.pack import pack_runtime

    site = pack_runtime(tmp_path / "rt")
    assert (site / "tornado" / "__init__.py").exists() and not (site / "tornado" / "test").exists()
    assert (site / "tqdm" / "__init__.py").exists()  # the tuner's progress bars
    deps = tmp_path / "deps"
    deps.mkdir()
    import numpy
    import typing_extensions

    os.symlink(Path(numpy.__file__).parent, deps / "numpy")
    libs = Path(numpy.__file__).parent.with_name("numpy.libs")
    if libs.exists():
        os.symlink(libs, deps / "numpy.libs")
    os.symlink(typing_extensions.__file__, deps / "typing_extensions.py")
    code = ("import sys; import tvm.rpc.tracker, tvm.rpc.server, tvm.rpc.client; "
            "from gemm_ladder.tune import serve, rpc, measuring, jobs; "
            "s = serve.start_tracker('127.0.0.1', %d); serve.stop_tracker(s, ('127.0.0.1', s.port)); "
            "bad = [m for m in sys.modules if m in ('gemm_ladder.compile.builder', 'gemm_ladder.rungs', 'layouts')]; "
            "import gemm_ladder.cli; print('OK', tvm.__file__, bad)" % _free_port())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": f"{site}{os.pathsep}{deps}",
           "TVM_USE_RUNTIME_LIB": "1", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"OK {site}") and out.stdout.rstrip().endswith("[]"), out.stdout


def _run(best_by_shape, rate, servers=1):
    reports = []
    for shape, results in best_by_shape.items():
        rs = [{"knobs": {"pipe_depth": d}, "status": "ok", "tflops": t} for d, t in results]
        reports.append({"rung": "v6", "shape": list(shape), "dtype": "float16", "results": rs,
                        "best": max(rs, key=lambda r: r["tflops"])})
    return {"reports": reports, "candidates_per_minute": rate, "servers": {f"h/gpu{i}": {} for i in range(servers)}}


def test_compare_runs_agrees_on_the_same_best_or_a_tie_within_the_noise():
    one = _run({(4096, 4096, 4096): [(3, 600.0), (4, 620.0)], (8192, 8192, 8192): [(3, 650.0), (4, 640.0)],
                (4096, 11008, 4096): [(3, 500.0), (4, 600.0)]}, 20.0)
    many = _run({(4096, 4096, 4096): [(3, 601.0), (4, 622.0)], (8192, 8192, 8192): [(3, 640.0), (4, 645.0)],
                 (4096, 11008, 4096): [(3, 610.0), (4, 590.0)]}, 39.0, servers=2)
    out = tune_report.compare_runs(one, many)
    same, tie, differ = out["shapes"]
    assert same["same_knobs"] and same["agree"]
    assert not tie["same_knobs"] and tie["other_best_in_base"] == round(640 / 650, 4) and tie["agree"]
    assert not differ["agree"] and differ["other_best_in_base"] == round(500 / 600, 4)
    assert not out["agree"] and out["candidates_per_minute"]["speedup"] == 1.95 and out["gpus"] == {"base": 1,
                                                                                                     "other": 2}
