"""``python -m gemm_ladder``: build, export, verify, bench and inspect the ladder.

    python -m gemm_ladder build v4 --shape 4096x4096x4096 --out build/
    python -m gemm_ladder export --rungs v4 --shapes 4096x4096x4096,8192x8192x8192 --out build/ladder
    python -m gemm_ladder info build/ladder                 # grid, threads, smem, regs, SASS counts
    python -m gemm_ladder pack-runtime build/runtime --python 3.12
    python -m gemm_ladder verify build/ladder               # GPU box, runtime-only TVM
    python -m gemm_ladder bench build/ladder --out benchmarks/results/run.json
    python -m gemm_ladder main --out build/main             # the README's main job
    python -m gemm_ladder check v5 v6 --arch sm_90a         # mbarrier protocol check (gemm_ladder.barriers)

``build``/``export``/``info`` need TVM's compiler (a build box, no GPU needed); ``verify`` and
``bench`` need a GPU and only TVM's runtime. Each GPU job runs in a child process with a
timeout, so a kernel that deadlocks is reported, not waited on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .tune import add_tune_parser

DEFAULT_SHAPES = ("4096x4096x4096", "8192x8192x8192")
DEFAULT_DTYPES = ("float16", "bfloat16")
MANIFEST = "manifest.json"


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxNxK, e.g. 4096x4096x4096") from None
    return M, N, K


def parse_knob(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"knob {text!r} is not name=value, e.g. pipe_depth=4")
    name, value = text.split("=", 1)
    try:
        value = int(value)
    except ValueError:
        pass
    return name, value


def _progress(iterable, total, desc):
    try:
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel

        return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        return iterable if iterable is not None else None


# -- building ---------------------------------------------------------------------------------
def _build_one(job) -> dict:
    """Build and export one module (runs in a worker process)."""
    rung, shape, knobs, out_dir = job
    from .builder import build  # pylint: disable=import-outside-toplevel
    from .config import ConfigError  # pylint: disable=import-outside-toplevel

    M, N, K = shape
    try:
        mod = build(rung, M, N, K, **knobs)
    except ConfigError as err:
        return {"rung": rung, "shape": list(shape), "knobs": knobs, "status": "refused", "detail": str(err)}
    path = Path(out_dir) / f"{mod.cfg.tag()}.so"
    mod.export(path)
    return {"file": path.name, "status": "built", **mod.manifest()}


def build_many(jobs, out_dir, workers: int | None = None, desc="build") -> list[dict]:
    """Build jobs in parallel processes (building is CPU-bound; each process imports TVM once)."""
    from .procs import map_in_processes  # pylint: disable=import-outside-toplevel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(r, tuple(s), dict(k), str(out_dir)) for r, s, k in jobs]
    bar = _progress(None, len(jobs), desc)
    tick = (lambda i, res: bar.update(1)) if hasattr(bar, "update") else None
    try:
        results = map_in_processes(_build_one, jobs, workers, on_done=tick)
    finally:
        if hasattr(bar, "close"):
            bar.close()
    for res in results:
        if isinstance(res, Exception):
            raise res
    return results


def write_folder_manifest(out_dir, results) -> Path:
    """The folder's manifest.json; modules exported into the folder earlier stay listed."""
    path = Path(out_dir) / MANIFEST
    old = json.loads(path.read_text()).get("modules", []) if path.exists() else []
    built = [r for r in results if r["status"] == "built"]
    names = {r["file"] for r in built}
    built = [m for m in old if m["file"] not in names and (Path(out_dir) / m["file"]).exists()] + built
    refused = [r for r in results if r["status"] != "built"]
    path.write_text(json.dumps({"modules": built, "refused": refused}, indent=2) + "\n")
    return path


def modules_in(paths) -> list[Path]:
    """Expand folders (their manifest, else every .so) into module paths."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            man = p / MANIFEST
            if man.exists():
                out += [p / m["file"] for m in json.loads(man.read_text())["modules"]]
            else:
                out += sorted(p.glob("*.so"))
        elif p.exists():
            out.append(p)
        else:
            raise SystemExit(f"{p} does not exist")
    if not out:
        raise SystemExit(f"no modules found in {', '.join(map(str, paths))}")
    return out


# -- reporting --------------------------------------------------------------------------------
def table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    line = "  ".join(c.ljust(widths[c]) for c in cols)
    sep = "  ".join("-" * widths[c] for c in cols)
    body = ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join([line, sep, *body])


def info_rows(paths) -> list[dict]:
    from . import sass  # pylint: disable=import-outside-toplevel
    from .runtime import read_manifest  # pylint: disable=import-outside-toplevel

    rows = []
    for p in paths:
        man = read_manifest(p)
        blob = Path(p).read_bytes()
        sass_text = sass.disassemble(blob)
        counts = sass.instruction_counts(sass_text)
        res = sass.resource_usage(blob)
        launch = man.get("launch", {})
        rows.append({
            "module": Path(p).name,
            "rung": man["rung"],
            "shape": "x".join(map(str, man["shape"])),
            "dtype": man["dtype"],
            "arch": man["arch"],
            "grid": "1/SM" if launch.get("persistent") else "x".join(map(str, launch.get("grid", []))),
            "threads": launch.get("threads", ""),
            "smem": launch.get("smem_bytes", ""),
            "regs": res.registers,
            "stack": res.stack,
            "spills(LDL/STL)": f"{counts['LDL']}/{counts['STL']}",
            "UTMALDG": counts["UTMALDG"],
            "UTMASTG": counts["UTMASTG"],
            "HGMMA": counts["HGMMA"],
            "UTCHMMA": counts["UTCHMMA"] + counts["UTCQMMA"],
            "LDTM": counts["LDTM"],
            "LDGSTS/LDG": f"{counts['LDGSTS']}/{counts['LDG']}",
        })
    return rows


INFO_COLS = ["module", "grid", "threads", "smem", "regs", "stack", "spills(LDL/STL)", "UTMALDG",
             "UTMASTG", "HGMMA", "UTCHMMA", "LDTM", "LDGSTS/LDG"]


def gpu_present() -> bool:
    try:
        import torch  # pylint: disable=import-outside-toplevel

        return torch.cuda.is_available()
    except ImportError:
        return False


def _batch(job, paths, args, timeout, desc):
    from .isolate import run_batch  # pylint: disable=import-outside-toplevel

    bar = _progress(None, len(paths), desc) if len(paths) > 1 else None
    tick = (lambda res: bar.update(1)) if hasattr(bar, "update") else None
    try:
        return run_batch(job, paths, args, timeout=timeout, on_result=tick)
    finally:
        if hasattr(bar, "close"):
            bar.close()


def verify(paths, seeds=(0, 1), timeout=180.0) -> list[dict]:
    """Check every module on fresh random inputs, each in a child process with a deadline."""
    from .runtime import read_manifest  # pylint: disable=import-outside-toplevel

    rows = []
    for p, res in zip(paths, _batch("check", paths, seeds, timeout, "verify")):
        man = read_manifest(p)
        rows.append({"module": Path(p).name, "rung": man["rung"], "status": res["status"],
                     "rel_err": _fmt(res.get("rel_err")), "cublas_rel_err": _fmt(res.get("torch_rel_err")),
                     "detail": res.get("detail", "")})
    return rows


def bench(paths, reps=50, timeout=300.0) -> dict:
    """Time every module against cuBLAS (same process, same method); one JSON report."""
    from . import harness  # pylint: disable=import-outside-toplevel
    from .runtime import read_manifest  # pylint: disable=import-outside-toplevel

    results = []
    for p, res in zip(paths, _batch("time", paths, [reps], timeout, "bench")):
        man = read_manifest(p)
        results.append({"module": Path(p).name, "rung": man["rung"], "shape": man["shape"],
                        "built_from_commit": man.get("commit"),
                        "dtype": man["dtype"], "arch": man["arch"], "knobs": man["knobs"],
                        "tvm_version": man["tvm_version"], "compiler": man.get("compiler"), **res})
    commits = {r.get("built_from_commit") for r in results} - {None}
    commit = commits.pop() if len(commits) == 1 else None
    return {"gpu": harness.gpu_info(), **harness.run_info(commit), "method": harness.__doc__.strip(),
            "results": results}


def _fmt(x):
    return "" if x is None else f"{x:.2e}"


BENCH_COLS = ["module", "status", "ms", "tflops", "cublas_tflops", "ratio_to_cublas"]


def bench_rows(report) -> list[dict]:
    rows = []
    for r in report["results"]:
        rows.append({**r, "ms": f"{r.get('ms', 0):.3f}" if "ms" in r else "",
                     "tflops": f"{r['tflops']:.1f}" if "tflops" in r else "",
                     "cublas_tflops": f"{r['cublas_tflops']:.1f}" if "cublas_tflops" in r else "",
                     "ratio_to_cublas": f"{r['ratio_to_cublas']:.3f}" if "ratio_to_cublas" in r else ""})
    return rows


# -- commands ---------------------------------------------------------------------------------
def cmd_build(a) -> int:
    M, N, K = a.shape
    knobs = dict(a.knob or [])
    knobs.update(dtype=a.dtype, arch=a.arch)
    res = build_many([(a.rung, (M, N, K), knobs)], a.out, workers=1)
    r = res[0]
    if r["status"] != "built":
        print(f"error: {r['detail']}", file=sys.stderr)
        return 2
    print(Path(a.out) / r["file"])
    return 0


def ladder_jobs(rungs, shapes, dtypes, arch, knobs=None):
    from .rungs import RUNGS, available  # pylint: disable=import-outside-toplevel

    rungs = rungs or [r for r in RUNGS if available(r, arch)]
    return [(r, s, {"dtype": d, "arch": arch, **(knobs or {})}) for r in rungs for s in shapes for d in dtypes]


def cmd_export(a) -> int:
    jobs = ladder_jobs(a.rungs, a.shapes, a.dtypes, a.arch, dict(a.knob or []))
    results = build_many(jobs, a.out, workers=a.jobs, desc="export")
    man = write_folder_manifest(a.out, results)
    for r in results:
        if r["status"] != "built":
            print(f"refused: {r['rung']} {r['shape']} {r['knobs']}: {r['detail']}", file=sys.stderr)
    print(f"{sum(r['status'] == 'built' for r in results)} modules in {a.out} ({man.name})")
    return 0 if all(r["status"] == "built" for r in results) else 1


def cmd_info(a) -> int:
    print(table(info_rows(modules_in(a.paths)), INFO_COLS))
    return 0


def cmd_verify(a) -> int:
    if not gpu_present():
        print("error: verify needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    rows = verify(modules_in(a.paths), seeds=a.seeds, timeout=a.timeout)
    print(table(rows, ["module", "status", "rel_err", "cublas_rel_err", "detail"]))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def cmd_bench(a) -> int:
    if not gpu_present():
        print("error: bench needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    report = bench(modules_in(a.paths), reps=a.reps, timeout=a.timeout)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"GPU: {report['gpu']['name']}  SM clock {report['gpu']['sm_clock_mhz_now']} "
          f"(max {report['gpu']['sm_clock_mhz_max']})  power limit {report['gpu']['power_limit']}")
    print(table(bench_rows(report), BENCH_COLS))
    return 0 if all(r["status"] == "ok" for r in report["results"]) else 1


def cmd_pack_runtime(a) -> int:
    from .pack import pack_runtime  # pylint: disable=import-outside-toplevel

    site = pack_runtime(a.dest, python=a.python)
    print(site)
    return 0


def cmd_pictures(a) -> int:
    import layouts  # pylint: disable=import-outside-toplevel
    import schedulers  # pylint: disable=import-outside-toplevel

    out = Path(a.dest)
    written = list(layouts.write_all(out / "layouts") or []) + list(schedulers.write_all(out / "schedulers") or [])
    for w in written:
        print(w)
    return 0


def main_jobs(shapes, dtypes, archs) -> list:
    """The ladder for the main job: every rung of every arch at the default shapes; a rung that
    cannot take a shape (v1 computes one tile, v2 one row of tiles) gets its own largest one."""
    from .config import ConfigError  # pylint: disable=import-outside-toplevel
    from .rungs import RUNGS, available, make_config  # pylint: disable=import-outside-toplevel

    jobs = []
    for arch in archs:
        for rung in (r for r in RUNGS if available(r, arch)):
            for dtype in dtypes:
                seen = set()
                for M, N, K in shapes:
                    knobs = {"dtype": dtype, "arch": arch}
                    for shape in _fallback_shapes(rung, (M, N, K), knobs):
                        try:
                            make_config(rung, *shape, **knobs)
                        except ConfigError:
                            continue
                        if shape not in seen:
                            seen.add(shape)
                            jobs.append((rung, shape, knobs))
                        break
    return jobs


def _fallback_shapes(rung, shape, knobs):
    from .rungs import make_config  # pylint: disable=import-outside-toplevel

    yield shape
    try:
        d = make_config("v4", *shape, **knobs)  # the default tile of the ladder
    except Exception:  # pylint: disable=broad-except
        return
    M, N, K = shape
    yield (d.blk_m, d.blk_n, K)
    yield (d.blk_m, d.blk_n, d.blk_k)


def cmd_main(a) -> int:
    """The README's main job: export the ladder and print its info table; with a GPU, verify and
    bench the modules of the GPU's arch."""
    jobs = main_jobs(a.shapes, a.dtypes, a.archs)
    results = build_many(jobs, a.out, workers=a.jobs, desc="export")
    write_folder_manifest(a.out, results)
    failed = [r for r in results if r["status"] != "built"]
    for r in failed:
        print(f"refused: {r['rung']} {r['shape']}: {r['detail']}", file=sys.stderr)
    paths = modules_in([a.out])
    print(table(info_rows(paths), INFO_COLS))
    if not gpu_present():
        print(f"\n{len(paths)} modules in {a.out}. No GPU here: built and exported only. To verify and "
              "bench on a GPU box with no TVM: python -m gemm_ladder pack-runtime build/runtime --python X.Y, "
              "carry both folders, then PYTHONPATH=build/runtime/site python -m gemm_ladder verify " + str(a.out))
        return 1 if failed else 0
    from .config import arch_of_capability  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel

    here = arch_of_capability(*torch.cuda.get_device_capability(0))
    from .runtime import read_manifest  # pylint: disable=import-outside-toplevel

    mine = [p for p in paths if read_manifest(p)["arch"] == here]
    vrows = verify(mine)
    print(table(vrows, ["module", "status", "rel_err", "cublas_rel_err", "detail"]))
    report = bench(mine)
    out = Path(a.out) / "bench.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(bench_rows(report), BENCH_COLS))
    return int(bool(failed) or any(r["status"] != "ok" for r in vrows))


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gemm_ladder", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common_build(sp):
        sp.add_argument("--arch", default="sm_90a", help="sm_90a (Hopper) or sm_100a (Blackwell)")
        sp.add_argument("--knob", action="append", type=parse_knob, metavar="NAME=VALUE",
                        help="a rung knob, e.g. pipe_depth=4 (repeatable)")

    b = sub.add_parser("build", help="build one rung for one shape into an exported .so")
    b.add_argument("rung")
    b.add_argument("--shape", type=parse_shape, required=True)
    b.add_argument("--dtype", default="float16", choices=DEFAULT_DTYPES)
    b.add_argument("--out", default="build")
    common_build(b)
    b.set_defaults(fn=cmd_build)

    def ladder_args(sp, out_default):
        sp.add_argument("--shapes", type=lambda s: [parse_shape(x) for x in s.split(",")],
                        default=[parse_shape(s) for s in DEFAULT_SHAPES])
        sp.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DEFAULT_DTYPES))
        sp.add_argument("--out", default=out_default)
        sp.add_argument("--jobs", type=int, default=None, help="parallel build processes (default: cores)")

    e = sub.add_parser("export", help="build a set of rungs and shapes into a folder with a manifest")
    e.add_argument("--rungs", type=lambda s: s.split(","), default=None)
    ladder_args(e, "build/ladder")
    common_build(e)
    e.set_defaults(fn=cmd_export)

    i = sub.add_parser("info", help="grid, threads, shared memory, registers, spills and SASS counts")
    i.add_argument("paths", nargs="+")
    i.set_defaults(fn=cmd_info)

    v = sub.add_parser("verify", help="run exported modules on random inputs against torch (GPU)")
    v.add_argument("paths", nargs="+")
    v.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    v.add_argument("--timeout", type=float, default=180.0)
    v.set_defaults(fn=cmd_verify)

    be = sub.add_parser("bench", help="time exported modules against cuBLAS in one process (GPU)")
    be.add_argument("paths", nargs="+")
    be.add_argument("--reps", type=int, default=50)
    be.add_argument("--timeout", type=float, default=300.0)
    be.add_argument("--out", default=None, help="write the JSON report here")
    be.set_defaults(fn=cmd_bench)

    pr = sub.add_parser("pack-runtime", help="write a runtime-only TVM + gemm_ladder for a GPU box")
    pr.add_argument("dest")
    pr.add_argument("--python", default=None, help="the GPU box's Python, e.g. 3.12")
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
    ladder_args(m, "build/main")
    m.add_argument("--archs", type=lambda s: s.split(","), default=["sm_90a", "sm_100a"])
    m.set_defaults(fn=cmd_main)
    add_tune_parser(sub)
    return p


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    return args.fn(args)
