"""The ``pack`` and ``suite`` commands of ``python -m gemm_ladder``: kernel packs for the front door
and the shape suite. Argument parsing only (the library: ``kernel_pack``, ``suite``); only
``gemm_ladder.cli`` imports this module.

    python -m gemm_ladder pack build --model llama-8b --dtypes float16,bfloat16 --out build/pack
    python -m gemm_ladder pack build --weights 4096x4096 --dry-run    # the modules, by M bucket
    python -m gemm_ladder pack build --shapes 16x4096x4096,2048x6144x4096 --out build/pack
    python -m gemm_ladder pack build --suite --out build/suite_pack
    python -m gemm_ladder pack build --weights 4096x4096 --dtypes float8_e4m3 --fp8-scales row   # scaled_mm's
    python -m gemm_ladder pack build --grouped 8,14336,4096 --grouped 64,1408,2048,masked --dtypes bfloat16  # MoE
    python -m gemm_ladder pack show build/pack           # what the pack holds, and which rule chose it
    python -m gemm_ladder pack check build/pack          # every module against pack.json
    python -m gemm_ladder suite run --pack build/suite_pack --out suite.json   # GPU box
    python -m gemm_ladder suite plot suite.json --out suite.png
    python -m gemm_ladder native                          # the front door's C++ call lookup, built ahead
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .core import cli_types, device
from .core.config import ARCHS, DEFAULT_ARCH, DTYPES, ConfigError
from .core.files import FolderError
from .core.spec import FP8_SCALES, OPERAND_LAYOUTS, epilogue_names, spec_of_manifest
from .measure import report, suite
from .serve import kernel_pack, native, tuning_db as tune_db


class UsageError(Exception):
    """Arguments that name nothing: printed, exit status 2 (``cli.main`` catches it)."""


def _no_gpu(what: str) -> int:
    print(f"error: {what} needs a CUDA GPU ({device.why_no_gpu()})", file=sys.stderr)
    return 2


def _pack_request(a) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The shapes (their M only) and the weights (every M: ``kernel_pack.M_BUCKETS``) to build."""
    shapes, weights = list(a.shapes or []), list(a.weights or [])
    if a.model and a.m:
        shapes += [(M, N, K) for N, K in kernel_pack.MODELS[a.model].values() for M in a.m]
    elif a.model:
        weights += list(kernel_pack.MODELS[a.model].values())
    elif a.m:
        raise UsageError("--m narrows --model to these M; for a weight at given M use --shapes MxNxK")
    if a.suite:
        shapes += suite.shapes()
    if not shapes and not weights and not a.grouped:
        raise UsageError("pack build needs --weights, --shapes, --model, --suite or --grouped")
    return sorted(set(shapes)), sorted(set(weights))


def _in_m_order(entries) -> list[dict]:
    """Pack entries by dtype and weight, each weight's in M order."""
    return sorted(entries, key=lambda e: (kernel_pack.is_grouped(e), e.get("layout") or "", e["dtype"], e["shape"][1],
                                          e["shape"][2], e.get("experts") or 0, e["m_range"][0]))


def _dtype_text(e: dict) -> str:
    """An entry's dtype as ``pack show`` prints it: an fp8 module's inputs, recipe and D (its
    ``dtype`` field is D's alone)."""
    spec = spec_of_manifest(e)
    return f"{spec.a} {spec.scales} -> {spec.d}" if spec.is_fp8 else e["dtype"]


def _row(e: dict) -> dict:
    """``pack show``'s row of an entry: the module, the M it serves and the M its knobs were chosen at."""
    lo, hi = e["m_range"]
    served = f"{lo}..{hi}" if e["dynamic_m"] else f"{hi} (less: padded)"
    if kernel_pack.is_grouped(e):  # the token count the grouped front door looks up by
        t_lo, t_hi = e["tokens"]
        served = f"{t_lo}..{t_hi} " + ("rows" if e["layout"] == "contiguous" else "max_tokens")
        return {"file": e["file"], "rung": e["rung"], "N x K": f"{e['experts']}x{e['shape'][1]}x{e['shape'][2]} "
                f"{e['layout']}", "dtype": _dtype_text(e), "M served": served, "chosen at M": "",
                "rule": (e.get("choice") or {}).get("rule", ""), "role": "choice"}
    return {"file": e["file"], "rung": e["rung"], "N x K": f"{e['shape'][1]}x{e['shape'][2]}", "dtype": _dtype_text(e),
            "M served": served, "chosen at M": ",".join(map(str, e.get("m_values") or [])),
            "rule": (e.get("choice") or {}).get("rule", ""),
            "role": "alternative" if kernel_pack.is_alternative(e) else "choice"}


def _pack_build(a) -> int:
    shapes, weights = _pack_request(a)
    grouped = list(dict.fromkeys(a.grouped or ()))
    dtypes = a.dtypes or list(DTYPES)
    layouts = tuple(OPERAND_LAYOUTS[name] for name in a.layouts)
    if (a.fp8_scales or a.fp8_out) and kernel_pack.FP8_INPUT not in dtypes:
        raise UsageError(f"--fp8-scales and --fp8-out choose fp8 modules: add --dtypes {kernel_pack.FP8_INPUT}")
    fp8 = {"fp8_scales": tuple(a.fp8_scales or kernel_pack.FP8_DEFAULT_SCALES), "fp8_out": tuple(a.fp8_out or ["bfloat16"])}
    try:
        if a.dry_run:
            items = kernel_pack.plan_pack(shapes, dtypes, a.arch, a.sms, not a.static, tuple(a.epilogue), weights,
                                          layouts, **fp8, alternatives=not a.no_alternatives, grouped=grouped)
            rows = [_row(e) for e in _in_m_order(e for i in items for e in kernel_pack.entries_of(i))]
            print(report.table(rows, list(rows[0])))
            print(f"{len(items)} modules (dry run: nothing built)")
            return 0
        man = kernel_pack.build_pack(a.out, shapes, dtypes, a.arch, a.sms, not a.static, a.jobs,
                                     request={"shapes": ["x".join(map(str, s)) for s in shapes],
                                              "weights": ["x".join(map(str, w)) for w in weights],
                                              "m_buckets": list(kernel_pack.M_BUCKETS) if weights else [],
                                              "model": a.model, "suite": a.suite, "m": list(a.m or []),
                                              "epilogues": list(a.epilogue), "layouts": list(a.layouts),
                                              "alternatives": not a.no_alternatives,
                                              "grouped": [",".join(map(str, g if g[3] else g[:3])) for g in grouped],
                                              **({k: list(v) for k, v in fp8.items()}
                                                 if kernel_pack.FP8_INPUT in dtypes else {})},
                                     epilogues=tuple(a.epilogue), weights=weights, layouts=layouts, **fp8,
                                     alternatives=not a.no_alternatives, grouped=grouped)
    except (ConfigError, LookupError, FolderError) as err:  # a shape no kernel takes, an --out that is no folder
        raise UsageError(str(err)) from None
    for r in man["results"]:
        if r["status"] == "failed":
            print(f"failed: {r['file']}: {r['detail']}", file=sys.stderr)
    print(f"the policy's choices: {tune_db.TuningDB().describe()}")
    print(f"{len({e['file'] for e in man['modules']})} modules in {a.out} "
          f"({kernel_pack.pack_bytes(a.out) / 2**20:.1f} MiB): "
          + ", ".join(f"{sum(r['status'] == k for r in man['results'])} {k}" for k in ("built", "cache", "failed")))
    return 0 if all(r["status"] != "failed" for r in man["results"]) else 1


def cmd_pack(a) -> int:
    if a.pack_cmd == "build":
        return _pack_build(a)
    try:
        pk = kernel_pack.KernelPack(a.folder)
    except kernel_pack.PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows, bad = [], 0
    for e in _in_m_order(pk.modules):
        status = "listed"
        if a.pack_cmd == "check":
            try:
                pk.check_entry(e)
                status = "ok"
            except kernel_pack.PackError as err:
                status, bad = f"error: {err}", bad + 1
        rows.append({**_row(e), "status": status})
    print(report.table(rows, list(rows[0])) if rows else f"{a.folder}: no modules")
    return 1 if bad else 0


def _suite_result(path) -> dict:
    """A result of ``suite run`` (what ``suite plot`` draws)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeError, ValueError) as err:
        raise UsageError(f"{path}: not a suite result ({err}); make one with suite run --out {path}") from None
    if not isinstance(doc, dict) or doc.get("format") != suite.SUITE_FORMAT or not isinstance(doc.get("results"), list):
        raise UsageError(f"{path} is not a suite result ({suite.SUITE_FORMAT}); make one with suite run --out {path}")
    return doc


def _suite_packs(a) -> None:
    """``suite run``'s packs are kernel packs, and ``--only`` picks a case (checked before the GPU)."""
    for folder in a.pack or ():
        try:
            kernel_pack.read_pack_manifest(folder)
        except kernel_pack.PackError as err:
            raise UsageError(f"--pack: {err}") from None
    if not suite.select(a.dtypes or suite.SUITE_DTYPES, a.only):
        raise UsageError(f"--only {' '.join(a.only)} matches no case of the suite; see suite list")


def cmd_suite(a) -> int:
    if a.suite_cmd == "list":
        for c in suite.cases(a.dtypes or suite.SUITE_DTYPES):
            print(c["id"], c["group"])
        return 0
    if a.suite_cmd == "plot":
        print(suite.plot_result(_suite_result(a.result), a.out))
        return 0
    _suite_packs(a)
    if not device.present():
        return _no_gpu("suite run")
    if a.pack:
        os.environ[kernel_pack.PACK_ENV] = os.pathsep.join(a.pack)  # the child process reads it
    doc = suite.run(a.out, a.dtypes or suite.SUITE_DTYPES, a.only, a.reps, a.timeout, a.plot)
    print(report.table(suite.table_rows(doc), ["case", "group", "status", "rung", "source", "ratio", "tflops",
                                                "GB/s", "host_us"]))
    print(json.dumps(doc["summary"], indent=1))
    return 0 if doc["summary"]["ok"] == doc["summary"]["cases"] else 1


def cmd_native(a) -> int:
    """Build (or find) the C++ call lookup and load it once; prints where it is."""
    try:
        path = native.build(force=a.force)
        native.load(path)
    except native.NativeBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"the C++ call lookup: {path}")
    return 0


def add_parsers(sub) -> None:
    pk = sub.add_parser("pack", help="kernel packs for the front door (gemm_ladder.matmul): build, show, check")
    pks = pk.add_subparsers(dest="pack_cmd", required=True)
    b = pks.add_parser("build", help="build the modules a list of weights or shapes, a model or the suite needs")
    b.add_argument("--weights", type=cli_types.weights, default=None,
                   help="weights NxK (4096x4096,6144x4096), each for its whole M range: the policy's choice at "
                        f"every M bucket ({','.join(map(str, kernel_pack.M_BUCKETS))}), one module per choice")
    b.add_argument("--shapes", type=cli_types.shapes, default=None,
                   help="shapes MxNxK (16x4096x4096): exactly these M (another M of the weight is served by the "
                        "nearest, or built where TVM's compiler is)")
    b.add_argument("--model", default=None, choices=kernel_pack.MODELS,
                   help="a model's weights, for their whole M range (as --weights) unless --m is given")
    b.add_argument("--m", type=cli_types.whole_numbers(1, "16,128"), default=None,
                   help="build --model for these M only (as --shapes)")
    b.add_argument("--suite", action="store_true", help="every shape of the shape suite")
    b.add_argument("--grouped", action="append", type=cli_types.grouped_weight, default=None, metavar="E,N,K[,LAYOUT][,swiglu]",
                   help="an expert weight [E, N, K] for grouped_mm (contiguous) and grouped_mm_masked (masked), or "
                        "the layout named: a module per range of token counts (decode, prefill tiers) "
                        "(plan.grouped_choices); ending in swiglu, a gated W_gu [E, 2I, K] (each expert's "
                        "cat([W_gate, W_up])) for grouped_swiglu and grouped_swiglu_masked; repeat the flag for more weights")
    b.add_argument("--dtypes", type=cli_types.names(kernel_pack.PACK_DTYPES, "dtype"), default=None,
                   help=f"the input dtypes (default {','.join(DTYPES)}); {kernel_pack.FP8_INPUT}: scaled_mm's fp8 "
                        "modules, of each recipe of --fp8-scales and D of --fp8-out")
    b.add_argument("--fp8-scales", type=cli_types.names(FP8_SCALES, "fp8 scale recipe"), default=None,
                   help=f"the fp8 modules' scale recipes (default {','.join(kernel_pack.FP8_DEFAULT_SCALES)}): tensor "
                        "(one scale each), row (scale_a [M, 1], scale_b [1, N]), block (scale_a [M, K/128] M-major, "
                        "scale_b [K/128, N/128]: DeepSeek-V3's 1x128 and 128x128 blocks)")
    b.add_argument("--fp8-out", type=cli_types.names(DTYPES, "fp8 D dtype"), default=None,
                   help="the fp8 modules' D dtypes (default bfloat16)")
    b.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(ARCHS))
    b.add_argument("--sms", type=cli_types.count, default=None,
                   help="SM count the heuristic plans for (default: the GPU, or H100)")
    b.add_argument("--static", action="store_true", help="one module per M even where a rung takes M at run time")
    b.add_argument("--no-alternatives", action="store_true",
                   help="only the policy's choices: no small-tile or split-K alternatives beside a choice that "
                        "leaves most SMs idle (plan.alternatives; the front door times them at first use)")
    b.add_argument("--epilogue", type=cli_types.names(epilogue_names(), "epilogue"), default=["none"],
                   help="the epilogues to build each shape with (gemm_ladder.core.spec.spec_for): none, bias, an "
                        "activation (relu, gelu_tanh, gelu_erf, silu), or bias_ and one (bias_gelu_tanh); "
                        "comma-separated, e.g. none,bias,bias_silu")
    b.add_argument("--layouts", type=cli_types.names(OPERAND_LAYOUTS, "operand layout"), default=["KK"],
                   help="the operand layouts to build each shape in (a_major, b_major: gemm_ladder.core.spec."
                        "OPERAND_LAYOUTS): KK the forward, KN a B stored [K, N] (a backward's dX = dY . W), MN A "
                        "and B stored [K, M], [K, N] (dW = dY^T . X), MK; comma-separated, e.g. KK,KN,MN")
    b.add_argument("--out", default="build/pack")
    b.add_argument("--jobs", type=cli_types.count, default=None)
    b.add_argument("--dry-run", action="store_true", help="print the modules it would build, and the M each "
                                                           "serves; build nothing")
    for name in ("show", "check"):
        s = pks.add_parser(name, help="list the modules" if name == "show" else "check every module against pack.json")
        s.add_argument("folder")
    pk.set_defaults(fn=cmd_pack)
    su = sub.add_parser("suite", help="the shape suite: gemm_ladder.matmul against cuBLAS (GPU), its plot")
    sus = su.add_subparsers(dest="suite_cmd", required=True)
    r = sus.add_parser("run", help="time every case on this GPU; JSON and plot")
    r.add_argument("--pack", action="append", metavar="FOLDER",
                   help="kernel pack folder (repeatable; else $GEMM_LADDER_PACK)")
    r.add_argument("--out", type=cli_types.out_file, default="suite.json")
    r.add_argument("--plot", type=cli_types.out_file, default=None, help="PNG path (default: beside --out)")
    r.add_argument("--only", action="append", help="run the cases whose id or group holds this text")
    r.add_argument("--dtypes", type=cli_types.names(suite.SUITE_DTYPES, "dtype"), default=None)
    r.add_argument("--reps", type=cli_types.count, default=60)
    r.add_argument("--timeout", type=cli_types.positive, default=240.0)
    p = sus.add_parser("plot", help="plot a suite result")
    p.add_argument("result")
    p.add_argument("--out", type=cli_types.out_file, default="suite.png")
    ls = sus.add_parser("list", help="print the cases")
    ls.add_argument("--dtypes", type=cli_types.names(suite.SUITE_DTYPES, "dtype"), default=None)
    su.set_defaults(fn=cmd_suite)
    nat = sub.add_parser("native", help="build the front door's C++ call lookup for this torch and Python "
                                        "(gemm_ladder.serve.native); it is built on first use otherwise")
    nat.add_argument("--force", action="store_true", help="build again even where it is built")
    nat.set_defaults(fn=cmd_native)
