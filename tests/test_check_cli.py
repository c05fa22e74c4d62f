"""``benchmarks/check_cli.py``: the two-step command line the GPU checks share, the results
file's name rule, and how a run writes its JSON."""

import json

import pytest

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def cli():
    return benchmark_script("check_cli")


def test_prepare_and_run_parse_with_a_scripts_own_options(cli):
    p, pr, r, _ = cli.subcommands("A check.\n\nMore text.", "build box", "GPU box", "x_check.json")
    pr.add_argument("--sms", type=int, default=132)
    assert p.description == "A check."
    a = p.parse_args(["prepare", "build/x", "--sms", "114"])
    assert (a.cmd, a.out, a.sms) == ("prepare", "build/x", 114)
    a = p.parse_args(["run", "build/x"])
    assert (a.cmd, a.folder, a.out) == ("run", "build/x", "x_check.json")
    with pytest.raises(SystemExit):
        p.parse_args(["run"])  # the folder is required
    with pytest.raises(SystemExit):
        p.parse_args(["run", "build/x", "--sms", "1"])  # prepare's option, not run's


def test_the_results_name_rule_names_the_word_and_the_issue(cli, capsys):
    p, *_ = cli.subcommands("A check.", "b", "g", "grouped_check.json")
    cli.require_in_name(p, "out/grouped_decode.json", "grouped", 33)  # passes: no exit
    with pytest.raises(SystemExit):
        cli.require_in_name(p, "out/decode.json", "grouped", 33)
    err = capsys.readouterr().err
    assert "'grouped'" in err and "issue 33" in err and "out/decode.json" in err


def test_write_result_makes_the_folder_and_writes_json(cli, tmp_path):
    out = tmp_path / "new" / "deeper" / "r.json"
    cli.write_result(out, {"rows": [1, 2]})
    assert json.loads(out.read_text()) == {"rows": [1, 2]}


def test_head_holds_the_gpu_the_run_and_the_clocks_since_start(cli):
    class Harness:
        @staticmethod
        def gpu_info():
            return {"name": "stub GPU"}

        @staticmethod
        def run_info():
            return {"date": "d", "commit": "c"}

    class Sampler:
        def between(self, t0, t1):
            assert t1 >= t0
            return {"sm_mhz": 1980, "since": t0}

    got = cli.head("fmt", Harness, Sampler(), 123.0)
    assert got["format"] == "fmt" and got["version"] == 1 and got["gpu"] == {"name": "stub GPU"}
    assert (got["date"], got["commit"]) == ("d", "c") and got["clocks"] == {"sm_mhz": 1980, "since": 123.0}
    assert got["seconds"] > 0  # since 123 s after the epoch


def test_launch_cost_has_no_prepare_of_its_own_and_says_which_builds_its_pack(capsys):
    """``launch_cost.py`` times the smoke tier's pack: its ``prepare`` stops with the command that builds it."""
    script = benchmark_script("launch_cost")
    with pytest.raises(SystemExit) as stop:
        script.main(["prepare", "build/x"])
    assert stop.value.code == 2
    assert "python -m tests.gpu_smoke" in capsys.readouterr().err
