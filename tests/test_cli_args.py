"""Every argument of the command line refuses what its command cannot use, before any work, in
one line that names the argument (issue 28): negative and zero counts, unknown names, shapes
that are not three positive sizes, ports out of range, a tracker that does not answer, paths
that hold nothing; and a check that would check nothing fails and says why.

The exact commands of the issue run as users run them (``python -m gemm_ladder ...``, exit
status 2, one ``error:`` line); the rest run in this process with the real work stubbed out
(``tests/cli_guard.py``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gemm_ladder.core import cli_types
from gemm_ladder.barriers.ladder import scenarios
from gemm_ladder.core.config import ConfigError
from tests import cli_guard

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gemm_ladder", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=60)


def _one_error_line(err: str) -> str:
    """The one ``error:`` line of stderr (the last line; argparse's usage may come before it)."""
    lines = err.rstrip("\n").splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err, err
    return errors[0]


# -- the issue's commands, as a user runs them --------------------------------------------------
MISSING = "no/such/folder"
REFUSED = [
    # a check that checks nothing (these stop before TVM is imported)
    (["check", "v99"], ["RUNG", "v99", "v1"]),
    (["check", "v5", "--arch", "sm_80"], ["--arch", "sm_80", "sm_90a"]),
    (["check", "v5", "--dtype", "float32"], ["--dtype", "float32"]),
    (["check", "v1", "--schedules", "bogus"], ["--schedules", "bogus", "forward"]),
    (["check", "v5", "--shape", "0x128x64"], ["--shape", "sizes must be positive"]),
    (["check", "v5", "--shape", "4096x4096"], ["--shape", "MxNxK"]),
    (["check", "v5", "--shape", "-1x4096x4096"], ["--shape", "sizes must be positive"]),
    # machine sizes and counts
    (["pack", "build", "--sms", "-4", "--shapes", "128x128x64"], ["--sms", "-4", "1 or more"]),
    (["tune", "--rung", "v4", "--shape", "128x128x64", "--sms", "-5"], ["--sms", "-5"]),
    (["tune", "--rung", "v4", "--shape", "128x128x64", "--l2-mb", "-1"], ["--l2-mb", "positive"]),
    (["export", "--jobs", "-2"], ["--jobs", "-2"]),
    (["export", "--knob", "pipe_depth=3", "--knob", "pipe_depth=4"], ["--knob", "pipe_depth", "twice"]),
    # names
    (["suite", "list", "--dtypes", "float32"], ["--dtypes", "float32", "float16"]),
    (["pack", "build", "--dtypes", "float32", "--shapes", "128x128x64"], ["--dtypes", "float32"]),
    (["pack", "build", "--shapes", "0x4096x4096"], ["--shapes", "sizes must be positive"]),
    (["pack", "build", "--model", "llama-8b", "--m", "0"], ["--m", "0"]),
    (["pack", "build", "--weights", "4096"], ["--weights", "'4096'", "NxK", "4096x4096"]),
    (["pack", "build", "--weights", "0x4096"], ["--weights", "0x4096", "N and K must be positive"]),
    (["pack", "build", "--weights", "4096x4095x1"], ["--weights", "4096x4095x1", "NxK", "--shapes"]),
    (["pack", "build", "--m", "16"], ["--m", "--model", "--shapes"]),
    (["pack", "build"], ["--weights", "--shapes", "--model"]),
    (["pack", "build", "--shapes", "333x3000x520", "--epilogue", "bias_gelu"],
     ["--epilogue", "'bias_gelu'", "bias_gelu_tanh"]),
    (["pack", "build", "--shapes", "333x3000x520", "--epilogue", "relu,relu"], ["--epilogue", "twice"]),
    (["main", "--archs", "sm_80"], ["--archs", "sm_80", "sm_90a"]),
    (["main", "--dtypes", "float32"], ["--dtypes", "float32"]),
    (["build", "v4", "--shape", "-1x4096x4096"], ["--shape", "sizes must be positive"]),
    (["build", "v4", "--shape", "4096x4096"], ["--shape", "MxNxK"]),
    # the RPC launcher
    (["serve", "--tracker", "foo", "--key", "h200"], ["--tracker", "HOST:PORT"]),
    (["serve", "--port", "99999", "--status"], ["--port", "99999", "65535"]),
    # paths are checked before the GPU is looked for
    (["verify", MISSING], [MISSING, "does not exist"]),
    (["bench", MISSING], [MISSING, "does not exist"]),
    (["suite", "run", "--pack", MISSING], ["--pack", MISSING]),
    (["tune", "--measure", MISSING], ["--measure", MISSING, "candidates.json"]),
]


@pytest.mark.parametrize("args, words", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_the_issues_commands_are_refused_in_one_line(args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = cli_guard.run(args)  # device.present is stubbed: no command may get as far as asking
    assert got.code == 2, got
    line = _one_error_line(got.err)
    for w in words:
        assert w in line, (w, line)
    assert not list(tmp_path.iterdir())  # nothing was written


# a few as a user runs them: the process ends with status 2 and one line, not a signal or a traceback
AS_RUN = [(a, w) for a, w in REFUSED if " ".join(a) in (
    "check v99", "check v5 --shape -1x4096x4096", "pack build --sms -4 --shapes 128x128x64",
    "pack build --weights 4096x4095x1",
    "suite list --dtypes float32", "serve --port 99999 --status", f"verify {MISSING}")]


@pytest.mark.parametrize("args, words", AS_RUN, ids=[" ".join(a) for a, _ in AS_RUN])
def test_the_issues_commands_as_run(args, words, tmp_path):
    out = _cli(args, tmp_path)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    line = _one_error_line(out.stderr)
    assert all(w in line for w in words), line


def test_a_dead_tracker_is_said_at_once(tmp_path):
    """``serve --status`` and ``tune --tracker`` at an address where nothing listens: one line,
    in a second, instead of TVM's minute of retries and its traceback."""
    dead = f"127.0.0.1:{_free_port()}"
    for args in (["serve", "--status", "--tracker", dead],
                 ["tune", "--rung", "v4", "--shape", "128x128x64", "--tracker", dead, "--key", "h200"]):
        start = time.monotonic()
        out = _cli(args, tmp_path)
        assert out.returncode == 2 and time.monotonic() - start < 20, out.stderr
        line = _one_error_line(out.stderr)
        assert "--tracker" in line and "nothing answers" in line and dead in line, line


def test_a_listener_that_is_no_tracker_is_said(tmp_path):
    """Something answers at ``--tracker`` but speaks no TVM RPC: one line, not TVM's traceback."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer():  # the CLI's probe, then TVM's client
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        out = _cli(["serve", "--status", "--tracker", f"127.0.0.1:{port}"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "not as a TVM tracker" in _one_error_line(out.stderr)


def test_a_pack_of_a_shape_no_kernel_takes_is_refused(tmp_path):
    """M past the kernels' 32-bit indices: the planner's refusal, as one line (was a traceback)."""
    out = _cli(["pack", "build", "--shapes", "10000000x4096x4096", "--out", str(tmp_path / "pack")], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "use M <=" in _one_error_line(out.stderr)
    assert not list((tmp_path / "pack").glob("*.so"))


# -- counts, in this process ---------------------------------------------------------------------
COUNTS = [
    ["verify", ".", "--timeout", "0"], ["verify", ".", "--seeds", "-1,2"], ["bench", ".", "--reps", "0"],
    ["bench", ".", "--timeout", "-3"], ["suite", "run", "--reps", "0"], ["suite", "run", "--timeout", "0"],
    ["pack", "build", "--suite", "--jobs", "0"], ["pack", "build", "--model", "llama-8b", "--m", "16,-1"],
    *([*["tune", "--rung", "v4", "--shape", "128x128x64"], flag, value] for flag, value in
      [("--jobs", "0"), ("--reps", "0"), ("--timeout", "0"), ("--timeout", "nan"), ("--top", "0"),
       ("--rpc-batch", "0"), ("--l2-keep", "-1"), ("--confirm", "-1"), ("--l2-mb", "inf")]),
    ["serve", "--server-port", "0"], ["export", "--rungs", "v4,v4"], ["export", "--shapes", "128x128x64,"],
]


@pytest.mark.parametrize("argv", COUNTS, ids=" ".join)
def test_every_count_refuses_what_is_not_one(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = cli_guard.run(argv)
    assert got.code == 2, (argv, got)
    flag, value = argv[-2:]
    line = _one_error_line(got.err)
    assert f"argument {flag}:" in line and value in line, line  # the argument, and what it was given


def test_paths_are_checked_before_the_gpu(tmp_path, monkeypatch):
    """``device.present`` is stubbed to count as reaching the work: a missing path must be said first."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    for argv, words in ((["verify", "empty"], "no modules found in empty"), (["bench", "nope.so"], "does not exist"),
                        (["tune", "--measure", "empty"], "--measure: candidate list empty/candidates.json does not exist"),
                        (["suite", "run", "--pack", "empty"], "--pack:"),
                        (["suite", "run", "--only", "no-such-case"], "--only no-such-case matches no case")):
        got = cli_guard.run(argv)
        assert got.code == 2, (argv, got)
        assert words in _one_error_line(got.err), (argv, got.err)
    assert cli_guard.run(["suite", "run"]).code is None  # no path given: on to the GPU


def test_outputs_that_cannot_be_written_are_refused_first(tmp_path, monkeypatch):
    """A result file under a file, or a folder given for a file: said before the run, not after it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "empty").mkdir()
    for argv, flag in ((["bench", "x.so", "--out", "afile/r.json"], "--out"),
                       (["suite", "run", "--out", "empty"], "--out"),
                       (["tune", "--measure", "c", "--run-out", "afile/run.json"], "--run-out"),
                       (["suite", "plot", "r.json", "--out", "afile/x/p.png"], "--out")):
        got = cli_guard.run(argv)
        assert got.code == 2, (argv, got)
        assert f"argument {flag}:" in _one_error_line(got.err), got.err
    got = cli_guard.run(["pictures", "afile"])  # an output folder that is a file
    assert got.code == 2 and "pictures folder afile is a file" in _one_error_line(got.err), got.err
    out = _cli(["pack-runtime", "afile"], tmp_path)
    assert out.returncode == 2 and "afile is a file" in _one_error_line(out.stderr), out.stderr


def test_suite_plot_reads_a_suite_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    for name in ("missing.json", "bad.json"):
        got = cli_guard.run(["suite", "plot", name])
        assert got.code == 2 and "not a suite result" in _one_error_line(got.err), got


# -- check: a check that checked nothing fails, and says why (TVM: the rungs are imported) ---------
@pytest.mark.parametrize("argv, words", [
    (["check", "v5", "--knob", "pipedepth=3"], ["v5", "takes no knob pipedepth"]),
    (["check", "v5", "--knob", "pipe_depth=99"], ["v5", "pipe_depth=99", "shared memory"]),
    (["check", "v1", "v5", "--knob", "pipe_depth=2"], ["v1", "takes no knob pipe_depth"]),
    (["check", "--knob", "pipedepth=3"], ["nothing to check", "pipedepth"]),
    (["check", "v10", "--arch", "sm_100a"], ["v10", "no form for sm_100a", "sm_90a"]),
    (["check", "v5", "--shape", "128x128x100"], ["v5", "K=100"]),
    (["check", "v5", "--knob", "arch=sm_100a"], ["--knob", "--arch"]),
    (["check", "v5", "--knob", "dtype=bfloat16", "--dtype", "float16"], ["--knob", "conflicts with --dtype"]),
])
def test_check_refuses_what_it_cannot_check(argv, words):
    got = cli_guard.run(argv)
    assert got.code == 2, got
    line = _one_error_line(got.err)
    for w in words:
        assert w in line, (w, line)


def test_check_of_the_ladder_says_which_rungs_the_knobs_do_not_fit():
    got = cli_guard.run(["check", "--arch", "sm_90a", "--knob", "pipe_depth=2"])
    assert got.code is None, got  # v5 and up take it: on to the check
    assert "not checked: v1 (sm_90a): rung v1 (sm_90a) takes no knob pipe_depth" in got.err
    assert cli_guard.run(["check", "v5", "--arch", "sm_90a", "--knob", "pipe_depth=2"]).code is None


def test_scenarios_say_why_a_rung_has_none():
    with pytest.raises(ConfigError, match="pipe_depth=99"):
        scenarios("v5", "sm_90a", {"pipe_depth": 99})
    with pytest.raises(ConfigError, match="takes no knob"):
        scenarios("v1", "sm_90a", {"pipe_depth": 2})


# -- the types themselves ---------------------------------------------------------------------------
def test_glue_values_hands_a_dashed_value_to_its_option():
    assert cli_types.glue_values(["build", "--shape", "-1x2x3", "--jobs", "-2"]) == \
        ["build", "--shape=-1x2x3", "--jobs=-2"]
    # not after a value, an option already given its value, or the end of the options
    assert cli_types.glue_values(["a", "-1x2", "--out=x", "-1", "--", "-5"]) == ["a", "-1x2", "--out=x", "-1", "--",
                                                                                  "-5"]


@pytest.mark.parametrize("parse, text, words", [
    (cli_types.shape, "4096x4096", "MxNxK"), (cli_types.shape, "1x0x8", "positive"),
    (cli_types.shapes, "8x8x8,", "MxNxK"), (cli_types.count, "0", "1 or more"), (cli_types.count, "2.5", "whole"),
    (cli_types.count_or_zero, "-1", "negative"), (cli_types.positive, "nan", "positive finite"),
    (cli_types.port, "0", "1 to 65535"), (cli_types.address, "host", "HOST:PORT"), (cli_types.address, ":1", "HOST"),
    (cli_types.names(("a", "b"), "dtype"), "a,a", "twice"), (cli_types.names(("a", "b"), "dtype"), "c", "a,b"),
    (cli_types.python_version, "312", "X.Y"), (cli_types.out_file, "/", "is a folder"),
    (cli_types.out_file, "/proc/version/x", "is a file"), (cli_types.word, "a b", "name"),
    (cli_types.knob, "x", "name=value"), (cli_types.weight, "4096", "NxK"), (cli_types.weight, "4096x0", "positive"),
    (cli_types.weights, "8x8,8x8x8", "--shapes"),
])
def test_a_type_refuses_with_what_would_work(parse, text, words):
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        parse(text)


def test_the_types_take_what_they_should():
    assert cli_types.shapes("1x2x3, 4X5X6") == [(1, 2, 3), (4, 5, 6)]
    assert cli_types.weights("4096x4096, 6144X4096") == [(4096, 4096), (6144, 4096)]
    assert cli_types.address("gpu-host:9191") == ("gpu-host", 9191)
    assert cli_types.count_or_zero("0") == 0 and cli_types.positive("0.5") == 0.5
    assert cli_types.knob("stream_k=True") == ("stream_k", True)
    assert cli_types.whole_numbers(0, "0,1")("0,1") == [0, 1]
