"""Which shapes the protocol check runs a rung at, and the command that runs it over the ladder.

A barrier protocol goes wrong at its edges, so each rung is checked at small shapes chosen for
them (the kernel is traced and lowered per shape; nothing is compiled):

- K with fewer slices than the ring has stages, exactly as many, and more (with a partial last
  slice where the rung takes one: a tail TMA zero-fills past K but still counts its full box);
- M and N one tile and a bit: edge tiles in both directions;
- persistent rungs: three tiles per CTA, so every CTA's ring runs across tile borders.

    python -m gemm_ladder.barriers                       # every rung, both archs
    python -m gemm_ladder.barriers v5 v6 --arch sm_90a --knob pipe_depth=2
    python -m gemm_ladder.barriers v6 --shape 1000x1000x520 --arch sm_100a   # one shape, full table
    python -m gemm_ladder check ...                      # the same, through the main CLI
    python -m gemm_ladder.barriers twins build/ladder    # watchdog twins, for explaining timeouts
"""

from __future__ import annotations

import argparse
import sys

ARCHS = ("sm_90a", "sm_100a")


def scenarios(rung: str, arch: str, knobs: dict | None = None) -> list:
    """The configs the check runs ``rung`` at (explicit knobs: a tuning database cannot swap them)."""
    from ..config import ConfigError  # pylint: disable=import-outside-toplevel
    from ..rungs import make_config, rung_module  # pylint: disable=import-outside-toplevel

    mod = rung_module(rung, arch)
    knobs = {**mod.KNOBS, **(knobs or {})}
    blk_m, blk_n = knobs.get("blk_m", 128), knobs.get("blk_n", 128)
    stages = knobs.get("pipe_depth", 1)
    persistent = "l2_group_size" in mod.KNOBS or "tile_order" in mod.KNOBS
    m_tiles = 3 if persistent else 2
    shape_mn = (m_tiles * blk_m - 24, blk_n + 64)
    # K slices: fewer than the stages, as many, more (with a partial last slice if the rung takes one)
    k_choices = ([64 * max(1, stages - 1)], [64 * stages], [64 * (stages + 2) - 8, 64 * (stages + 2)])
    out, seen = [], set()
    for choices in k_choices:
        for K in choices:
            cfg = None
            for M, N in (shape_mn, (blk_m, blk_n)):  # one-tile rungs (v1, v2) take only the second
                try:
                    cfg = make_config(rung, M, N, K, arch=arch, **knobs)
                    break
                except ConfigError:
                    continue
            if cfg is not None:
                if cfg not in seen:
                    seen.add(cfg)
                    out.append(cfg)
                break
    return out


def ladder_configs(rungs=None, archs=ARCHS, knobs=None) -> list:
    from ..rungs import RUNGS, available  # pylint: disable=import-outside-toplevel

    out = []
    for arch in archs:
        for rung in rungs or RUNGS:
            if available(rung, arch):
                out.extend(scenarios(rung, arch, knobs))
    return out


def _parse_knob(text):
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, value


def twins_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.barriers twins",
                                description="Build the watchdog twin of every module in a folder "
                                            "(into FOLDER/watchdog/), for explaining timeouts on a GPU box.")
    p.add_argument("folder")
    p.add_argument("--seconds", type=float, default=2.0, help="the bound of each wait")
    a = p.parse_args(argv)
    from .explain import twins  # pylint: disable=import-outside-toplevel

    for path in twins(a.folder, a.seconds):
        print(path)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["twins"]:
        return twins_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.barriers",
                                description="Check the mbarrier protocol of the ladder's rungs (CPU).")
    p.add_argument("rungs", nargs="*", help="rungs to check (default: all)")
    p.add_argument("--arch", default=",".join(ARCHS), help="sm_90a, sm_100a or both (comma-separated)")
    p.add_argument("--shape", default=None, help="one shape MxNxK instead of the edge scenarios")
    p.add_argument("--knob", action="append", type=_parse_knob, default=[], metavar="NAME=VALUE")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--schedules", default=None, help="comma-separated: forward, reverse, lockstep")
    p.add_argument("--quiet", action="store_true", help="one line per config; the findings in full")
    a = p.parse_args(argv)
    from ..rungs import make_config  # pylint: disable=import-outside-toplevel
    from .check import POLICIES, check_config  # pylint: disable=import-outside-toplevel

    knobs = dict(a.knob, dtype=a.dtype)
    archs = a.arch.split(",")
    if a.shape:
        M, N, K = (int(x) for x in a.shape.lower().split("x"))
        configs = [make_config(r, M, N, K, arch=arch, **knobs) for arch in archs for r in a.rungs or ["v5"]]
    else:
        configs = ladder_configs(a.rungs or None, archs, knobs)
    policies = tuple(a.schedules.split(",")) if a.schedules else POLICIES
    bad = 0
    for cfg in configs:
        report = check_config(cfg, policies=policies)
        bad += not report.ok
        if a.quiet:
            print(report.summary())
            for f in report.findings:
                print(f"  {f}")
        else:
            print(report.table() + "\n")
        sys.stdout.flush()
    print(f"{len(configs) - bad} of {len(configs)} configs pass the barrier protocol check")
    return 1 if bad else 0
