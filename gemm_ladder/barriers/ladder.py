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
from pathlib import Path

from ..core import cli_types
from ..core.config import ARCHS as ARCH_LIMITS, DEFAULT_DTYPE, DTYPES, ConfigError
from ..protocol import check
from ..rungs import RUNGS, available, make_config, rung_module
from . import explain

ARCHS = tuple(ARCH_LIMITS)  # the check runs both by default


def scenarios(rung: str, arch: str, knobs: dict | None = None) -> list:
    """The configs the check runs ``rung`` at (explicit knobs: a tuning database cannot swap them).
    Raises the last :class:`ConfigError` met when the rung takes none of them (a knob it does not
    have, a ring too deep for shared memory)."""
    mod = rung_module(rung, arch)
    knobs = {**mod.KNOBS, **(knobs or {})}
    blk_m, blk_n = knobs.get("blk_m", 128), knobs.get("blk_n", 128)
    stages = knobs.get("pipe_depth", 1)
    persistent = "l2_group_size" in mod.KNOBS or "tile_order" in mod.KNOBS
    m_tiles = 3 if persistent else 2
    shape_mn = (m_tiles * blk_m - 24, blk_n + 64)
    # K slices: fewer than the stages, as many, more (with a partial last slice if the rung takes one)
    k_choices = ([64 * max(1, stages - 1)], [64 * stages], [64 * (stages + 2) - 8, 64 * (stages + 2)])
    out, seen, refused = [], set(), None
    for choices in k_choices:
        for K in choices:
            cfg = None
            for M, N in (shape_mn, (blk_m, blk_n)):  # one-tile rungs (v1, v2) take only the second
                try:
                    cfg = make_config(rung, M, N, K, arch=arch, **knobs)
                    break
                except ConfigError as err:
                    refused = err
            if cfg is not None:
                if cfg not in seen:
                    seen.add(cfg)
                    out.append(cfg)
                break
    if not out and refused is not None:
        raise refused
    return out


def ladder_configs(rungs=None, archs=ARCHS, knobs=None) -> list:
    out = []
    for arch in archs:
        for rung in rungs or RUNGS:
            if available(rung, arch):
                out.extend(scenarios(rung, arch, knobs))
    return out


def twins_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.barriers twins",
                                description="Build the watchdog twin of every module in a folder "
                                            "(into FOLDER/watchdog/), for explaining timeouts on a GPU box.")
    p.add_argument("folder")
    p.add_argument("--seconds", type=cli_types.positive, default=2.0, help="the bound of each wait")
    a = p.parse_args(cli_types.glue_values(argv))
    if not Path(a.folder).is_dir():
        p.error(f"argument folder: {a.folder} is not a folder of exported modules")

    for path in explain.twins(a.folder, a.seconds):
        print(path)
    return 0


def _schedules(text: str) -> list[str]:
    """``--schedules``: the checker's schedule names."""
    return cli_types.names(check.POLICIES, "schedule")(text)


def make_parser() -> argparse.ArgumentParser:
    """The options of ``python -m gemm_ladder.barriers`` (and ``python -m gemm_ladder check``); no TVM
    is imported to read them, so a mistyped option costs no compiler start."""
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.barriers",
                                description="Check the mbarrier protocol of the ladder's rungs (CPU).")
    p.add_argument("rungs", nargs="*", type=cli_types.one_of(RUNGS, "rung"), metavar="RUNG",
                   help="rungs to check (default: all)")
    p.add_argument("--arch", type=cli_types.names(ARCHS, "arch"), default=list(ARCHS),
                   help="sm_90a, sm_100a or both (comma-separated)")
    p.add_argument("--shape", type=cli_types.shape, default=None, help="one shape MxNxK instead of the edge scenarios")
    p.add_argument("--knob", action=cli_types.AppendOnce, type=cli_types.knob, default=[], metavar="NAME=VALUE")
    p.add_argument("--dtype", default=None, choices=DTYPES, help=f"default {DEFAULT_DTYPE}")
    p.add_argument("--schedules", type=_schedules, default=None,
                   help="comma-separated: forward, reverse, lockstep (default: all three)")
    p.add_argument("--quiet", action="store_true", help="one line per config; the findings in full")
    return p


def configs_to_check(rungs, archs, knobs: dict, shape=None) -> tuple[list, list[str]]:
    """The configs ``check`` runs, and the rungs it passed over with why.

    Named rungs must each be checked on some arch: one that has no form there, or that these
    knobs or this shape do not fit, raises :class:`ConfigError`. Of the whole ladder (no rung
    named), a rung the knobs do not fit is passed over and said; none left is an error too: a
    check that checked nothing must not pass.
    """
    named = list(dict.fromkeys(rungs or (["v5"] if shape else [])))
    for rung in named:
        if not any(available(rung, arch) for arch in archs):
            have = [arch for arch in ARCHS if available(rung, arch)]
            raise ConfigError(f"rung {rung} has no form for {','.join(archs)}; it has forms for {','.join(have)}")
    configs, passed = [], []
    for arch in archs:
        for rung in named or RUNGS:
            if not available(rung, arch):
                continue
            try:
                configs += [make_config(rung, *shape, arch=arch, **knobs)] if shape else scenarios(rung, arch, knobs)
            except ConfigError as err:
                if named:
                    raise ConfigError(f"cannot check {rung} on {arch}: {err}") from None
                passed.append(f"{rung} ({arch}): {err}")
    if not configs:
        raise ConfigError(f"nothing to check: no rung takes these knobs ({passed[0] if passed else 'no rung'})")
    return configs, passed


def main(argv=None) -> int:
    argv = cli_types.glue_values(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["twins"]:
        return twins_main(argv[1:])
    p = make_parser()
    a = p.parse_args(argv)

    knobs = dict(a.knob)
    if "arch" in knobs:
        p.error("argument --knob: give the arch with --arch, e.g. --arch sm_100a")
    if a.dtype and knobs.get("dtype", a.dtype) != a.dtype:
        p.error(f"argument --knob: dtype={knobs['dtype']} conflicts with --dtype {a.dtype}; give it once")
    knobs["dtype"] = knobs.get("dtype") or a.dtype or DEFAULT_DTYPE
    try:
        configs, passed = configs_to_check(a.rungs, a.arch, knobs, a.shape)
    except ConfigError as err:
        p.error(str(err))
    for line in passed:
        print(f"not checked: {line}", file=sys.stderr)
    bad = 0
    for cfg in configs:
        report = check.check_config(cfg, policies=tuple(a.schedules or check.POLICIES))
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
