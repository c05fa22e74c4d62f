"""What the GPU check scripts of ``benchmarks/`` share: their two-step command line (``prepare OUT``
on the build box, ``run FOLDER --out FILE`` on the GPU box) and how a run writes its results.

Each script adds its own options to the parsers :func:`subcommands` returns and keeps its own
dispatch; this module holds only what was written out the same way in every one of them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gemm_ladder.core import cli_types, files


def subcommands(doc: str, prepare_help: str, run_help: str, default_out: str):
    """``(parser, prepare_parser, run_parser, subparsers)`` of a check script whose docstring is
    ``doc``: ``prepare OUT`` (the folder to build and carry to the GPU box) and ``run FOLDER --out
    FILE`` (``default_out``); ``subparsers`` takes a script's further commands."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help=prepare_help)
    pr.add_argument("out", help="the folder to build (and carry to the GPU box)")
    r = sub.add_parser("run", help=run_help)
    r.add_argument("folder", help="the folder prepare built")
    r.add_argument("--out", type=cli_types.out_file, default=default_out)
    return p, pr, r, sub


def require_in_name(parser: argparse.ArgumentParser, out, word: str, issue: int) -> None:
    """Stop with a usage error unless the results file ``out``'s name contains ``word`` (what the
    issue's "Results format" asks of a committed file's name)."""
    if word not in Path(out).name:
        parser.error(f"--out {out}: the results file's name must contain {word!r} (issue {issue}'s results format)")


def write_result(out, result: dict) -> None:
    """``result`` as JSON at ``out``, its folder made first."""
    files.open_folder(Path(out).parent)
    files.write_record(out, result)


def head(fmt: str, harness, sampler, start: float) -> dict:
    """The first fields of a run's results: ``fmt`` and version 1, the GPU and the run
    (``harness.gpu_info()``, ``harness.run_info()``: ``gemm_ladder.measure.harness``, imported by the
    caller on the GPU box), the clocks ``sampler`` saw since ``start`` and the seconds taken."""
    return {"format": fmt, "version": 1, "gpu": harness.gpu_info(), **harness.run_info(),
            "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1)}
