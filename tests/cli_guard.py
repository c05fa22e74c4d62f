"""Run ``gemm_ladder.cli.main(argv)`` in this process with every real job stubbed out.

The commands end in a handful of library calls that build, touch a GPU, reach the network or
write folders (``batch.build_many``, ``tune_many``, ``measure_local``, ``rpc``, ``serve``'s
cluster, ``kernel_pack.build_pack``, ``suite.run``, ``check_config``, ...). :func:`guarded`
replaces each with a stub that raises :class:`Accepted`: a command that reaches one has taken
its arguments. Everything before (argument types, path and knob checks, the validator) runs for
real. ``device.present`` is one of them, so no command runs on a GPU even where one is.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import pytest

import layouts
import schedulers
from gemm_ladder.compile import batch
from gemm_ladder import cli
from gemm_ladder.core import device
from gemm_ladder.serve import kernel_pack, pack
from gemm_ladder.measure import report, suite
from gemm_ladder.protocol import check as barrier_check
from gemm_ladder.barriers import explain
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import rpc, serve, space


class Accepted(Exception):
    """A command got past its arguments to the work itself."""


GUARDS = [
    (batch, "build_many"), (batch, "verify"), (batch, "bench"), (device, "present"), (report, "info_rows"),
    (pack, "pack_runtime"), (kernel_pack, "build_pack"), (suite, "run"), (suite, "plot_result"),
    (space, "search_space"), (db, "merge"), (db, "TuningDB"), (rpc, "measure_folders"),
    (cli, "measure_local"), (cli, "tune_many"), (serve, "Cluster"), (serve, "status"), (serve, "tracker_problem"),
    (barrier_check, "check_config"), (explain, "twins"), (layouts, "write_all"), (schedulers, "write_all"),
]


def _stop(*args, **kwargs):
    raise Accepted


class _Stopped:
    """Stands in for a class (``db.TuningDB``, ``serve.Cluster``): ``isinstance`` still works."""

    def __init__(self, *args, **kwargs):
        raise Accepted


@dataclass
class Outcome:
    code: object  # the exit status (None: the command was accepted)
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if "error:" in line]


@contextlib.contextmanager
def guarded():
    """Within: the library calls of :data:`GUARDS` raise :class:`Accepted`."""
    with pytest.MonkeyPatch.context() as mp:
        for module, name in GUARDS:
            stub = _Stopped if isinstance(getattr(module, name, None), type) else _stop
            mp.setattr(module, name, stub, raising=False)
        yield


def run(argv) -> Outcome:
    """``cli.main(argv)`` under :func:`guarded`; argparse's exit is an exit status like any other."""
    out, err = io.StringIO(), io.StringIO()
    with guarded(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code  # argparse: 0 (--help) or 2
        except Accepted:
            code = None
    return Outcome(code, out.getvalue(), err.getvalue())
