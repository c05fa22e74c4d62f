"""``python -m gemm_ladder``: build, export, verify, bench, inspect and tune the ladder.

    python -m gemm_ladder build v4 --shape 4096x4096x4096 --out build/
    python -m gemm_ladder export --rungs v4 --shapes 4096x4096x4096,8192x8192x8192 --out build/ladder
    python -m gemm_ladder info build/ladder                 # grid, threads, smem, regs, SASS counts
    python -m gemm_ladder pack-runtime build/runtime --python 3.12
    python -m gemm_ladder verify build/ladder               # GPU box, runtime-only TVM
    python -m gemm_ladder bench build/ladder --out benchmarks/results/run.json
    python -m gemm_ladder main --out build/main             # the README's main job
    python -m gemm_ladder tune --rung v6 --shape 4096x4096x4096   # see gemm_ladder.tune
    python -m gemm_ladder pack build --model llama-8b --out build/pack   # kernels for the front door
    python -m gemm_ladder suite run --pack build/pack --out suite.json   # matmul vs cuBLAS, the shape suite
    python -m gemm_ladder check v5 v6 --arch sm_90a         # mbarrier protocol check (gemm_ladder.barriers)
    python -m gemm_ladder serve --key h200                 # a tracker + one RPC server per GPU
    python -m gemm_ladder tune --plan model.plan --tracker HOST:9190 --key h200

``build``/``export``/``info`` need TVM's compiler (a build box, no GPU needed); ``verify`` and
``bench`` need a GPU and only TVM's runtime. Each GPU job runs in a child process with a
timeout, so a kernel that deadlocks is reported, not waited on.

This module parses arguments and calls the library (``batch``, ``report``, ``tune``); nothing
imports it. ``build``, ``export`` and ``main`` give a job with no rung knobs the tuning
database's best (``serve.tuning_db.tuned_jobs``, which says what it chose).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import schedulers

from . import cli_front
from .compile import batch
from .compile.toolchain import ToolchainError
from .core import cli_types, device, files
from .core.config import ARCHS, DEFAULT_ARCH, DEFAULT_DTYPE, DTYPES, ConfigError
from .core.files import DamagedFile, FolderError, FolderInUse
from .core.manifest import read_manifest
from .core.records import RecordError
from .core.spec import FP8_SCALES, GemmSpec
from .measure import modules, report
from .rungs import RUNGS
from .serve import pack, tuning_db as db
from .tune import merge as tune_merge, report as tune_report, rpc, serve, space
from .tune.jobs import FP8, TUNE_DTYPES, PlanError, from_args as jobs_from_args
from .tune.measuring import CONFIRM_TOP, confirm_count, read_candidates
from .tune.run import measure_local, tune_many

DEFAULT_SHAPES = ("4096x4096x4096", "8192x8192x8192")


class UsageError(Exception):
    """Arguments that contradict each other or name nothing: printed, exit status 2."""


parse_knob = cli_types.knob  # --knob name=value: the one parser, check's too


def _take(knobs: dict, name: str, flag: str, given, as_list: bool = False):
    """dtype or arch from its flag or from ``--knob name=...``: both, disagreeing, is an error
    (for ``build`` and ``export`` alike). None when neither gives it."""
    via_knob = knobs.pop(name, None)
    if via_knob is None:
        return given
    if as_list:
        via_knob = [via_knob]
    if given is not None and given != via_knob:
        shown = ",".join(given) if isinstance(given, list) else given
        raise UsageError(f"--knob {name}={_text(via_knob)} conflicts with {flag} {shown}: "
                         f"give {name} once, with {flag}")
    return via_knob


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _build_args(a, plural: bool) -> tuple[dict, object, str]:
    """The rung knobs of ``--knob``, the dtype (``build``) or dtypes (``export``), and the arch."""
    knobs = dict(a.knob or [])
    if plural:
        dtypes = _take(knobs, "dtype", "--dtypes", a.dtypes, as_list=True) or list(DTYPES)
    else:
        dtypes = _take(knobs, "dtype", "--dtype", a.dtype) or DEFAULT_DTYPE
    arch = _take(knobs, "arch", "--arch", a.arch) or DEFAULT_ARCH
    return knobs, dtypes, arch


def _print_problems(problems) -> None:
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)


def _no_gpu(what: str) -> int:
    print(f"error: {what} needs a CUDA GPU ({device.why_no_gpu()})", file=sys.stderr)
    return 2


def _modules(paths) -> list[Path]:
    try:
        found, problems = batch.modules_in(paths)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    _print_problems(problems)
    return found


# -- commands ---------------------------------------------------------------------------------
def cmd_build(a) -> int:
    knobs, dtype, arch = _build_args(a, plural=False)
    jobs = db.tuned_jobs([(a.rung, a.shape, {**knobs, "dtype": dtype, "arch": arch})])
    r = batch.build_many(jobs, a.out, workers=1)[0]
    if r["status"] != "built":
        print(f"error: {r['detail']}", file=sys.stderr)
        return 2
    print(Path(a.out) / r["file"])
    return 0


def cmd_export(a) -> int:
    knobs, dtypes, arch = _build_args(a, plural=True)
    jobs = db.tuned_jobs(batch.ladder_jobs(a.rungs, a.shapes, dtypes, arch, knobs))
    results = batch.build_many(jobs, a.out, workers=a.jobs, desc="export")
    man, problems = batch.write_folder_manifest(a.out, results)
    _print_problems(problems)
    for r in results:
        if r["status"] != "built":
            print(f"refused: {r['rung']} {r['shape']} {r['knobs']}: {r['detail']}", file=sys.stderr)
    print(f"{sum(r['status'] == 'built' for r in results)} modules in {a.out} ({man.name})")
    return 0 if all(r["status"] == "built" for r in results) else 1


def cmd_info(a) -> int:
    rows, problems = report.info_rows(_modules(a.paths))
    if rows:
        print(report.table(rows, report.INFO_COLS))
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


def cmd_verify(a) -> int:
    paths = _modules(a.paths)  # a mistyped path is found here, not on the GPU box
    if not device.present():
        return _no_gpu("verify")
    rows = modules.verify(paths, seeds=a.seeds, timeout=a.timeout)
    print(report.table(report.verify_rows(rows), report.VERIFY_COLS))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def cmd_bench(a) -> int:
    paths = _modules(a.paths)
    if not device.present():
        return _no_gpu("bench")
    result = modules.bench(paths, reps=a.reps, timeout=a.timeout, timer=a.timer)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(report.gpu_line(result["gpu"]))
    print(report.table(report.bench_rows(result), report.BENCH_COLS))
    return 0 if all(r["status"] == "ok" for r in result["results"]) else 1


def cmd_pack_runtime(a) -> int:
    print(pack.pack_runtime(a.dest, python=a.python))
    return 0


def cmd_pictures(a) -> int:
    # optional: layouts/ (not in the runtime pack a GPU box runs the CLI from)
    import layouts  # pylint: disable=import-outside-toplevel

    out = files.open_folder(a.dest, "pictures folder")
    written = list(layouts.write_all(out / "layouts") or []) + list(schedulers.write_all(out / "schedulers") or [])
    for w in written:
        print(w)
    return 0


def cmd_main(a) -> int:
    """The README's main job: export the ladder and print its info table; with a GPU, verify and
    bench the modules of the GPU's arch."""
    jobs = db.tuned_jobs(batch.main_jobs(a.shapes, a.dtypes or list(DTYPES), a.archs))
    results = batch.build_many(jobs, a.out, workers=a.jobs, desc="export")
    _, problems = batch.write_folder_manifest(a.out, results)
    _print_problems(problems)
    failed = [r for r in results if r["status"] != "built"]
    for r in failed:
        print(f"refused: {r['rung']} {r['shape']}: {r['detail']}", file=sys.stderr)
    paths = _modules([a.out])
    rows, bad = report.info_rows(paths)
    if rows:
        print(report.table(rows, report.INFO_COLS))
    for p in bad:
        print(f"error: {p}", file=sys.stderr)
    if not device.present():
        print(f"\n{len(paths)} modules in {a.out}. No GPU here: built and exported only. To verify and "
              "bench on a GPU box with no TVM: python -m gemm_ladder pack-runtime build/runtime --python X.Y, "
              "carry both folders, then PYTHONPATH=build/runtime/site python -m gemm_ladder verify " + str(a.out))
        return 1 if failed or bad else 0
    here, good = device.arch_of(0), {r["module"] for r in rows}
    mine = [p for p in paths if p.name in good and read_manifest(p)["arch"] == here]
    vrows = modules.verify(mine)
    print(report.table(report.verify_rows(vrows), report.VERIFY_COLS))
    result = modules.bench(mine)
    (Path(a.out) / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(report.table(report.bench_rows(result), report.BENCH_COLS))
    return int(bool(failed or bad) or any(r["status"] != "ok" for r in vrows))


def _db_arg(a):
    """``--db``, else None: the default database (``serve.tuning_db.db_files``), refused when it is off."""
    if not a.db and db.default_db_path() is None:
        raise UsageError(f"${db.DB_ENV} is off; pass --db PATH")
    return a.db or None


def _print_merged(merged) -> None:
    for m in merged:
        e = m.get("entry")
        if e:
            spec, peer = (f" {e['spec']}", "torch._scaled_mm") if e.get("spec") else ("", "cuBLAS")
            print(f"{m['action']}: {e['rung']} {'x'.join(map(str, e['shape']))} {e['dtype']}{spec} on {e['gpu']}: "
                  f"{e['knobs']} {e['tflops']:.1f} TFLOPS ({(e.get('ratio_to_cublas') or 0):.3f}x {peer})")
        else:
            print(f"{m['action']}: {m['file']}")


def _tune_show(a) -> int:
    """``--merge FILE...`` (every file checked before the database is written), then ``--show``;
    a file that cannot be read or written is a usage error, not a traceback or "0 entries"."""
    try:
        if a.merge:
            tdb = db.TuningDB(_db_arg(a))
            _print_merged(tune_merge.merge(a.merge, tdb))
            print(f"merged into {tdb.path}")
        if not a.show:
            return 0
        tdb = db.TuningDB(_db_arg(a), strict=True)  # strict: a --db that is not there is an error
    except RecordError as err:
        raise UsageError(str(err)) from None
    rows = [{"rung": e["rung"], "shape": "x".join(map(str, e["shape"])),
             "dtype": e["dtype"] + (f" ({GemmSpec.parse(e['spec']).scales} fp8)" if e.get("spec") else ""),
             "arch": e["arch"], "gpu": e["gpu"], "tvm": e["tvm_version"], "tflops": f"{e['tflops']:.1f}",
             "ratio": f"{(e.get('ratio_to_cublas') or 0):.3f}", "knobs": tune_report.knob_label(e["knobs"]),
             "date": str(e.get("date", ""))[:10]} for e in tdb.entries]
    print(f"{tdb.describe()}: {len(rows)} entries shown")
    if rows:
        print(report.table(rows, list(rows[0])))
    return 0


def _tracker(a):
    """The tracker of ``--tracker`` (checked: something answers there), or None."""
    if a.tracker and getattr(a, "timer", None):
        raise UsageError("--timer is for measuring on this GPU: RPC servers time queued launches (drop --timer)")
    if bool(a.tracker) != bool(a.key):
        raise UsageError("--tracker HOST:PORT and --key KEY go together: the servers that key registered there")
    if a.tracker and (problem := serve.tracker_problem(a.tracker)):
        raise UsageError(f"--tracker: {problem}")
    return a.tracker


def _candidate_folders(folders) -> None:
    """``tune --measure``'s folders each hold a candidate list (checked before looking for a GPU)."""
    for folder in folders:
        try:
            read_candidates(folder)
        except (OSError, ValueError) as err:
            raise UsageError(f"--measure: {err}") from None


def _jobs(a) -> list:
    try:
        return jobs_from_args(a.rung, ([a.shape] if a.shape else []) + list(a.shapes or []), a.plan, a.dtype,
                              a.fp8_scales or (), a.fp8_out or ())
    except (OSError, PlanError) as err:
        raise UsageError(str(err)) from None


def _measured(a, run: dict) -> int:
    if len(run["reports"]) == 1:
        rep = run["reports"][0]
        print(tune_report.format_table(rep, a.top))
        print(f"measurements: {rep['path']}" + (f"\nplot: {rep['plot']}" if rep.get("plot") else ""))
    print(tune_report.format_run(run) + (f"\nrun: {run['path']}" if run.get("path") else ""))
    if "merged" in run:
        _print_merged(run["merged"])
    else:
        print(f"next: python -m gemm_ladder tune --merge {run.get('path') or run['reports'][0]['path']}")
    return 0 if all(r["best"] for r in run["reports"]) else 1


def _space_of(a, job):
    return space.search_space(job.rung, job.shape, job.dtype, a.arch, {**space.parse_space(a.space), **job.space},
                              a.l2_keep, a.sms, int(a.l2_mb * 2**20) if a.l2_mb else None, spec=job.spec)


def cmd_tune(a) -> int:
    if a.show:
        return _tune_show(a)
    if a.merge:
        return _tune_show(a)
    if a.measure:
        _candidate_folders(a.measure)
    tracker = _tracker(a)
    if a.measure:
        if tracker is None and not device.present():
            return _no_gpu("--measure")
        try:
            run = (rpc.measure_folders(a.measure, tracker, a.key, a.reps, a.timeout, a.rpc_batch, a.run_out)
                   if tracker else measure_local(a.measure, a.reps, a.timeout, out=a.run_out, plot=a.plot or True,
                                                 measurements_out=a.measurements_out, confirm_top=a.confirm,
                                                 timer=a.timer))
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return _measured(a, run)
    jobs = _jobs(a)
    if not jobs:
        print("error: tune needs --rung with --shape/--shapes, or --plan FILE (or --measure DIR, --merge FILE, "
              "--show)", file=sys.stderr)
        return 2
    if a.dry_run:
        try:
            spaces = [_space_of(a, job) for job in jobs]
        except (ConfigError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        for job, sp in zip(jobs, spaces):
            print(f"{job.name(a.arch)}: {sp.counts()}")
            # one job: every point; several: each reason once, with an example (a refusal always says why)
            shown = sp.pruned if len(jobs) == 1 else list({p["reason"]: p for p in sp.pruned}.values())
            for p in shown:
                print(f"pruned ({p['reason']}): {tune_report.knob_label(p['knobs'])}: {p['detail']}")
            for c in sp.candidates if len(jobs) == 1 else ():
                print(f"candidate: {tune_report.knob_label(c)}")
        return 0
    if not a.build_only and tracker is None and not device.present():
        print("error: no GPU here: use --build-only --out DIR, then tune --measure DIR on a GPU box (or "
              "--tracker HOST:PORT --key KEY to measure on RPC servers)", file=sys.stderr)
        return 2
    try:
        result = tune_many(jobs, a.arch, space.parse_space(a.space), out=a.out, l2_keep=a.l2_keep, num_sms=a.sms,
                           l2_bytes=int(a.l2_mb * 2**20) if a.l2_mb else None, build_jobs=a.jobs, cache_dir=a.cache,
                           build_only=a.build_only, tracker=tracker, key=a.key, batch=a.rpc_batch, reps=a.reps,
                           timeout=a.timeout, db=None if a.build_only else _db_arg(a), plot=a.plot or True,
                           run_out=a.run_out, measurements_out=a.measurements_out, confirm_top=a.confirm,
                           timer=a.timer)
    except (ConfigError, ValueError, FolderInUse, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for folder, man in zip(result["folders"], result["manifests"]):
        c = man["counts"]
        print(f"{len(man['candidates'])} candidates in {folder} ({c['built']} built, {c['cached']} from the cache, "
              f"{c['failed']} failed to build; {len(man['pruned'])} pruned)")
        for f in man["failed"]:
            print(f"build failed: {tune_report.knob_label(f['knobs'])}: "
                  f"{f.get('detail', '').splitlines()[0] if f.get('detail') else ''}", file=sys.stderr)
    if a.build_only:
        print(f"next, on a GPU box: python -m gemm_ladder tune --measure {' '.join(result['folders'])}")
        return 0 if all(m["candidates"] for m in result["manifests"]) else 1
    return _measured(a, result)


# -- the parser -------------------------------------------------------------------------------
def _add_build_args(sp) -> None:
    sp.add_argument("--arch", default=None, choices=sorted(ARCHS), help="sm_90a (Hopper, the default) or sm_100a (Blackwell)")
    sp.add_argument("--knob", action=cli_types.AppendOnce, type=parse_knob, metavar="NAME=VALUE",
                    help="a rung knob, e.g. pipe_depth=4 (repeatable, each knob once); with no rung knob, the "
                         "tuning database's best is used (and printed)")


def _add_ladder_args(sp, out_default: str) -> None:
    sp.add_argument("--shapes", type=cli_types.shapes, default=cli_types.shapes(",".join(DEFAULT_SHAPES)))
    sp.add_argument("--dtypes", type=cli_types.names(DTYPES, "dtype"), default=None,
                    help=f"comma-separated, default {','.join(DTYPES)}")
    sp.add_argument("--out", default=out_default)
    sp.add_argument("--jobs", type=cli_types.count, default=None, help="parallel build processes (default: cores)")


def _add_tune_parser(sub) -> None:
    t = sub.add_parser(
        "tune", help="search a rung's knobs for a shape: build in parallel, time on the GPU, remember the best",
        description="Tune a rung's knobs for one shape (see gemm_ladder/tune/__init__.py).",
        epilog="modes: (default) build + measure + merge on a GPU box with TVM's compiler; --build-only "
               "--out DIR on a build box; --measure DIR on a GPU box (runtime-only TVM is enough); "
               "--merge FILE...; --show",
    )
    t.add_argument("--rung", choices=RUNGS, metavar="RUNG", help="the rung to tune, e.g. v6")
    t.add_argument("--shape", type=cli_types.shape, help="MxNxK, e.g. 4096x4096x4096")
    t.add_argument("--shapes", type=cli_types.shapes, default=None,
                   help="several shapes in one run, comma-separated")
    t.add_argument("--plan", metavar="FILE", help="rungs and shapes, one rung a line (see gemm_ladder/tune/jobs.py)")
    t.add_argument("--dtype", default=DEFAULT_DTYPE, choices=TUNE_DTYPES,
                   help=f"the kernel's dtype; {FP8}: scaled_mm's fp8 kernel (A and B e4m3), timed against "
                        "torch._scaled_mm, one job per --fp8-scales recipe and --fp8-out dtype")
    t.add_argument("--fp8-scales", type=cli_types.names(FP8_SCALES, "fp8 scale recipe"), default=None,
                   help=f"with --dtype {FP8}: the scale recipes, comma-separated (default tensor)")
    t.add_argument("--fp8-out", type=cli_types.names(DTYPES, "fp8 D dtype"), default=None,
                   help=f"with --dtype {FP8}: D's dtypes, comma-separated (default bfloat16)")
    t.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(ARCHS))
    t.add_argument("--space", action="append", metavar="KNOB=V1,V2",
                   help="values to try for a knob, e.g. pipe_depth=3,4,5 (repeatable; ';' separates knobs)")
    t.add_argument("--l2-keep", type=cli_types.count_or_zero, default=3,
                   help="keep the best N l2_group_size values per tile shape by the L2 model (0: all)")
    t.add_argument("--sms", type=cli_types.count, default=None,
                   help="SM count for the L2 model (default: the GPU, or H100/B200)")
    t.add_argument("--l2-mb", type=cli_types.positive, default=None, help="L2 size in MiB for the L2 model")
    t.add_argument("--jobs", type=cli_types.count, default=None, help="parallel build processes (default: cores)")
    t.add_argument("--cache", default=None, help="build cache folder (default: user cache /tune)")
    t.add_argument("--out", default=None, help="the candidate folder (default: build/tune/<rung>_<shape>_...); of "
                                               "several shapes, the folder of their folders (default: build/tune)")
    t.add_argument("--build-only", action="store_true", help="build and export the candidates, measure nothing")
    t.add_argument("--measure", metavar="DIR", nargs="+", help="measure candidate folders made by --build-only")
    t.add_argument("--tracker", metavar="HOST:PORT", type=cli_types.address,
                   help="measure on the RPC servers of this TVM tracker (serve)")
    t.add_argument("--key", type=cli_types.word, help="the servers' key at the tracker (serve --key), e.g. h200")
    t.add_argument("--rpc-batch", type=cli_types.count, default=4,
                   help="candidates per RPC session (see gemm_ladder/tune/rpc.py)")
    t.add_argument("--run-out", type=cli_types.out_file, help="write the run (its reports, candidates/min) here")
    t.add_argument("--merge", nargs="+", metavar="FILE", help="merge measurements files into the database")
    t.add_argument("--show", action="store_true", help="print the tuning database")
    t.add_argument("--dry-run", action="store_true", help="print the pruned space, build nothing")
    t.add_argument("--db", default=None, help=f"tuning database file (default: ${db.DB_ENV}, else the user cache's "
                                              "over the packaged gemm_ladder/serve/tuning_db.json; see serve/tuning_db.py)")
    t.add_argument("--reps", type=cli_types.count, default=50)
    t.add_argument("--confirm", type=confirm_count, default=CONFIRM_TOP, metavar="N",
                   help=f"time the N best candidates of the first pass again, together with cuBLAS in the same "
                        f"rounds at the power limit, and rank by that (default {CONFIRM_TOP}; 0: first pass only; "
                        f"local measuring only)")
    t.add_argument("--timer", choices=("queued", "graph"), default=None,
                   help="how candidates are timed, both passes: queued launches, or the kernels replayed in CUDA "
                        "graphs (default: graph for an fp8 folder, whose short kernels would time the host path; "
                        "queued for a 16-bit one, as its database entries were; local measuring only)")
    t.add_argument("--timeout", type=cli_types.positive, default=300.0,
                   help="seconds per candidate before it counts as hung")
    t.add_argument("--measurements-out", type=cli_types.out_file, default=None,
                   help="measurements JSON path (default: in the folder)")
    t.add_argument("--plot", type=cli_types.out_file, default=None, help="PNG path (default: beside the measurements)")
    t.add_argument("--top", type=cli_types.count, default=20, help="rows of the final table")
    t.set_defaults(fn=cmd_tune)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gemm_ladder", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="build one rung for one shape into an exported .so")
    b.add_argument("rung", choices=RUNGS, metavar="RUNG")
    b.add_argument("--shape", type=cli_types.shape, required=True)
    b.add_argument("--dtype", default=None, choices=DTYPES, help=f"default {DEFAULT_DTYPE}")
    b.add_argument("--out", default="build")
    _add_build_args(b)
    b.set_defaults(fn=cmd_build)

    e = sub.add_parser("export", help="build a set of rungs and shapes into a folder with a manifest")
    e.add_argument("--rungs", type=cli_types.names(RUNGS, "rung"), default=None)
    _add_ladder_args(e, "build/ladder")
    _add_build_args(e)
    e.set_defaults(fn=cmd_export)

    i = sub.add_parser("info", help="grid, threads, shared memory, registers, spills and SASS counts")
    i.add_argument("paths", nargs="+")
    i.set_defaults(fn=cmd_info)

    v = sub.add_parser("verify", help="run exported modules on random inputs against torch (GPU)")
    v.add_argument("paths", nargs="+")
    v.add_argument("--seeds", type=cli_types.whole_numbers(0, "0,1"), default=[0, 1])
    v.add_argument("--timeout", type=cli_types.positive, default=180.0)
    v.set_defaults(fn=cmd_verify)

    be = sub.add_parser("bench", help="time exported modules against cuBLAS in one process (GPU)")
    be.add_argument("paths", nargs="+")
    be.add_argument("--reps", type=cli_types.count, default=50)
    be.add_argument("--timer", choices=("queued", "graph"), default="queued",
                    help="queued launches between CUDA events (default), or replays of a CUDA graph of "
                         "20 launches (the launch gaps of a captured model; cuBLAS may pick other kernels "
                         "when captured, so the ratio is not the queued one)")
    be.add_argument("--timeout", type=cli_types.positive, default=300.0)
    be.add_argument("--out", type=cli_types.out_file, default=None, help="write the JSON report here")
    be.set_defaults(fn=cmd_bench)

    pr = sub.add_parser("pack-runtime", help="write a runtime-only TVM + gemm_ladder for a GPU box")
    pr.add_argument("dest")
    pr.add_argument("--python", type=cli_types.python_version, default=None, help="the GPU box's Python, e.g. 3.12")
    pr.set_defaults(fn=cmd_pack_runtime)

    pc = sub.add_parser("pictures", help="write the layout and scheduler pictures")
    pc.add_argument("dest")
    pc.set_defaults(fn=cmd_pictures)

    # everything after "check" goes to gemm_ladder.barriers (its own options, --help included)
    ck = sub.add_parser("check", add_help=False, prefix_chars="\0",
                        help="check the mbarrier protocol of the rungs (CPU); see check --help")
    ck.add_argument("args", nargs="*")
    ck.set_defaults(fn=lambda a: __import__("gemm_ladder.barriers.ladder", fromlist=["main"]).main(a.args))

    m = sub.add_parser("main", help="export the ladder and print its info table; verify and bench with a GPU")
    _add_ladder_args(m, "build/main")
    m.add_argument("--archs", type=cli_types.names(ARCHS, "arch"), default=list(ARCHS))
    m.set_defaults(fn=cmd_main)
    _add_tune_parser(sub)
    cli_front.add_parsers(sub)

    # its options are the launcher's own (gemm_ladder.tune.serve): main() hands them over unparsed
    sub.add_parser("serve", add_help=False, help="a TVM RPC tracker and one RPC server per GPU here, for "
                                                 "tune --tracker (serve --help)")
    return p


def main(argv=None) -> int:
    argv = cli_types.glue_values(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return serve.main(argv[1:])
    args = make_parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning
    try:
        return args.fn(args)
    except USER_ERRORS as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a reader that stopped early (| head): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


# what a user can mend, each with a one-line message that says how: printed, exit status 2.
# (FolderError: an output folder or cache that is no folder; RecordError: a file the project
# reads; DamagedFile: a library the loader would map, cut short; ToolchainError: no compiler for
# the driver stand-in; ConfigError: knobs or a shape no kernel takes.)
USER_ERRORS = (UsageError, cli_front.UsageError, FolderError, RecordError, DamagedFile, ToolchainError, ConfigError)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # pylint: disable=unused-argument
    return f"warning: {' '.join(str(message).split())}\n"
