"""Random command lines at every reader of the command line (hypothesis).

The argument lists are made from the real parsers (``cli.make_parser``'s commands, ``check``'s
and ``serve``'s own): a command, some of its options, and values drawn from junk (negative and
zero counts, unknown names, shapes of two sizes, ports out of range, paths that do not exist)
and from what the option takes. Each runs through ``gemm_ladder.cli.main`` in this process with
the real work stubbed out (``tests/cli_guard.py``). Whatever the line, the CLI either takes it
(reaches the work) or exits 0, 1 or 2, and an exit 2 is one ``error:`` line (after argparse's
usage), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gemm_ladder import cli
from gemm_ladder.barriers import ladder
from gemm_ladder.core.config import ARCHS, DTYPES
from gemm_ladder.rungs import RUNGS
from gemm_ladder.tune import serve
from tests import cli_guard

JUNK = ["-1", "0", "1", "-5", "99999", "1.5", "nan", "inf", "", " ", ",", "x", "abc", "v99", "sm_80", "float32",
        "0x128x64", "-1x4096x4096", "128x128x64", "256x256x128", "4096x4096", "1x1x1", "128x128x100",
        "pipe_depth=3", "pipe_depth=99", "pipedepth=3", "blk_n=64", "a=b", "=", "dtype=float32", "arch=sm_100a",
        "127.0.0.1:1", "foo", "foo:99999", ":", "/nonexistent/x", ".", "3.12", "forward", "bogus", "h200",
        "llama-8b", *RUNGS, *DTYPES, *ARCHS]
# values each type takes, by the type's name: a clean line reaches the work, and then the checks
# after the parser (knobs against the rung, paths, the tracker) run too
GOOD = {"count": ["1", "4", "132"], "count_or_zero": ["0", "3"], "positive": ["0.5", "300"],
        "shape": ["128x128x64", "256x256x128", "1x4096x4096"], "shapes": ["128x128x64,256x256x128"],
        "port": ["9190"], "address": ["127.0.0.1:1"], "python_version": ["3.12"], "word": ["h200"], "words": ["0,1"],
        "knob": ["pipe_depth=3", "blk_n=64", "tile_order=snake", "stream_k=true", "num_warpgroups=2"],
        "rung": list(RUNGS), "rung list": ["v4,v5", *RUNGS], "dtype list": ["float16,bfloat16", *DTYPES],
        "arch list": ["sm_90a,sm_100a", *ARCHS], "_schedules": ["forward", "forward,lockstep"],
        "whole numbers": ["0,1", "16,128"], "confirm_count": ["0", "4"], "out_file": ["r.json", "sub/r.json"]}
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=10)
# lines an exit 2 may print besides its one error: argparse's usage, and notes
ALLOWED = ("usage:", " ", "warning:", "not checked:")


def _leaves(parser, path=()):
    """``(command words, parser)`` of every command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # pylint: disable=W0212
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, path + (name,))


LEAVES = dict(_leaves(cli.make_parser()))
LEAVES[("check",)] = ladder.make_parser()  # these two read their own options
LEAVES[("serve",)] = serve.make_parser()


def _value(action, clean: bool):
    good = list(action.choices or ()) + GOOD.get(getattr(action.type, "__name__", ""), [])
    if clean and good:
        return st.sampled_from(good)
    return st.one_of(st.sampled_from(JUNK), TEXT, *([st.sampled_from(good)] if good else []))


@st.composite
def command_lines(draw):
    clean = draw(st.booleans())  # values an option takes (where the test knows them), or anything
    path = draw(st.sampled_from(sorted(LEAVES)))
    actions = [a for a in LEAVES[path]._actions if not isinstance(a, argparse._HelpAction)]  # pylint: disable=W0212
    words = list(path)
    for a in (a for a in actions if not a.option_strings):
        words += draw(st.lists(_value(a, clean), min_size=0, max_size=2))
    options = [a for a in actions if a.option_strings]
    for a in draw(st.lists(st.sampled_from(options), max_size=5)) if options else ():
        words.append(draw(st.sampled_from(a.option_strings)))
        if a.nargs != 0:
            words += draw(st.lists(_value(a, clean), min_size=1, max_size=2 if a.nargs in ("+", "*") else 1))
    if not clean and draw(st.booleans()):
        words.insert(draw(st.integers(1, len(words))), draw(st.sampled_from(JUNK)))
    return words


def check_outcome(argv, outcome) -> None:
    """What every command line may end in (see the module docstring)."""
    said = f"{argv}:\n{outcome.err}"
    assert "Traceback" not in outcome.err, said
    if outcome.code is None:  # accepted: it reached the work
        return
    assert outcome.code in (0, 1, 2), said
    if outcome.code == 2:
        lines = outcome.err.rstrip("\n").splitlines()
        assert len(outcome.error_lines) == 1, said
        assert lines[-1] == outcome.error_lines[0], said
        assert all(line.startswith(ALLOWED) for line in lines[:-1]), said


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Where the commands run: a relative default (``build/``, ``suite.json``) lands here."""
    return tmp_path_factory.mktemp("cli_fuzz")


def test_every_command_is_drawn():
    assert {"build", "export", "verify", "bench", "tune", "check", "serve", "main"} <= {p[0] for p in LEAVES}
    assert ("pack", "build") in LEAVES and ("suite", "run") in LEAVES


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=command_lines())
def test_any_command_line_is_taken_or_refused_in_one_line(argv, workdir):
    with contextlib.chdir(workdir):
        check_outcome(argv, cli_guard.run(argv))
