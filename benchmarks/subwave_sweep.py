"""Sub-wave shapes (issues 30/31): a grid of existing configs against cuBLAS, as kernels, to find
which split, tile and schedule reach cuBLAS where the tile grid fills under half the SMs with a
long K (the measured gap: the policy's v9 0.52x cuBLAS, the best split-K alternative 0.65x,
``results/2026-11-26_h100_subwave``).

    PYTHONPATH=. .venv/bin/python benchmarks/subwave_sweep.py prepare build/subwave_sweep     # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/subwave_sweep.py run build/subwave_sweep --out out/subwave_sweep.json  # GPU box

The shapes: the 11 of ``subwave_check.CASES_2026_11_26`` (the policy's sub-wave grids of then, most of which the
mid-tiles rules now fill; ``policy`` is today's choice) and the backward's dW GEMMs of a 768-wide model
(issue 31: 768x768x4096, 768x3072x4096, 3072x768x4096, bf16; timed here in the forward's operand
layout, which the dW kernels' schedule shares). Per shape, modules of one M (:func:`grid`):

- ``policy``: what the front door builds for the shape (``front.plan_job``);
- ``v10 sS BMxBN``: split-K with ``split_k`` S in :data:`SPLITS` and tiles :data:`TILES`, kept
  where the work units (tiles x S) are at most :data:`MAX_WAVES` waves of :data:`SMS`;
- ``streamk``: v10 ``stream_k`` (128x128);
- ``v11 sS``: swap-AB split-K where M <= 256;
- and any extra variant :data:`VARIANTS` names (a new knob, measured beside the old path).

``prepare --grid small`` (issues 30/31: what cuBLAS runs at these shapes is one wave of small tiles,
deep rings and clusters, no split: ``benchmarks/results/2026-11-26_h100_cublas_kernels/``): the policy,
the split-K alternatives a pack carries beside it (``plan.alternatives``, labelled ``alt``) and v9 without a
split in 64x64 / 64x128 / 128x64 tiles at rings down to what shared memory holds, over the clusters
v9 validates (:func:`grid_small`), at the 14 shapes and the 350M training step's two dW GEMMs in
their own layout (both operands MN-major: :data:`TRAIN_DW_CASES`, where cuBLAS is timed on the
same memory, ``dY.t() @ X``)::

    PYTHONPATH=. .venv/bin/python benchmarks/subwave_sweep.py prepare build/subwave3 --grid small

``--grid dynm``: the alternative that campaign led to (``plan.ALT_SMALL_TILES``) with M fixed and at
run time, in both runtime-M tile orders (:func:`grid_dynm`). Results of both:
``results/2026-11-26_h100_subwave_small/``.

``prepare`` builds them through the module cache and packs the ``.so`` files with their manifests
into one ``modules.tar.xz`` (a module is ~200 KiB, ~30 KiB compressed: the grid fits the 8 MiB a
GPU run carries), with ``sweep.json`` listing shapes and configs. ``run`` (TVM runtime and torch
only) unpacks them into a temporary folder, checks every module in isolate children (random
inputs, D poisoned with NaN, a float64 reference with cuBLAS's error as the yardstick:
``suite.check_case``; a hang or crash costs that module only; a wrong one is not timed), then per
shape times the right modules and cuBLAS (``torch.matmul(A, W.T, out=D)``) in :data:`ROUNDS`
rounds whose order alternates, each sample one replay of a CUDA graph of calls cycling through
input sets that spill L2 (``harness.graph_times``). Rows: the shape, every config's us and ratio
(cuBLAS's time over its: above 1, faster), the best config; clocks and power per shape.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)
from subwave_check import CASES_2026_11_26, case_list  # noqa: E402  (the 11 sub-wave shapes)

from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.core.config import ConfigError  # noqa: E402
from gemm_ladder.core.records import Bool, Int, List, Obj, Str, ANY, read_json  # noqa: E402
from gemm_ladder.core.spec import OPERAND_LAYOUTS, GemmSpec, spec_knobs  # noqa: E402
from gemm_ladder.rungs import make_config  # noqa: E402

FORMAT = "gemm_ladder.subwave_sweep"
PLAN_FILE = "sweep.json"
ARCHIVE = "modules.tar.xz"
SMS = 132  # the H100 SXM the grid is planned for
ARCH = "sm_90a"
# the backward's dW GEMMs of a 768-wide model with a 3072-wide MLP over 4096 tokens (issue 31)
DW_CASES = ((768, 768, 4096), (768, 3072, 4096), (3072, 768, 4096))
# the dW GEMMs of the 350M training step that run under cuBLAS (0.717x and 0.943x as calls,
# /work/handoff/train3.txt): dY^T . X, both operands MN-major (layout ``MN``: A [K, M], B [K, N])
TRAIN_DW_CASES = ((512, 2048, 16384), (2048, 2048, 16384))
SPLITS = (2, 3, 4, 6, 8)
# (blk_m, blk_n, consumers, pipe_depth): the ring deepens where a stage is smaller
TILES = ((128, 128, 2, 4), (128, 256, 2, 4), (128, 64, 2, 6), (64, 128, 1, 6))
V11_SPLITS = (4, 8)
MAX_WAVES = 2.2  # a split-K grid of more units than this many waves gains nothing on a sub-wave shape
# extra v10 knobs measured beside the grid's v10 configs of some tiles: (label suffix, knobs, tiles):
# split-K's atomic reduction (splitk: every unit adds into one slot, the last reads one slot back)
VARIANTS = ((" atomic", {"reduce": "atomic"}, ((128, 128), (128, 256))),)
CHECK_TIMEOUT = 60.0
ROUNDS, PER_ROUND = 4, 3
GRAPH_US = 300.0  # a timed replay lasts at least this long
GRAPH_CALLS = 20
CUBLAS = "cublas"

CONFIG_SCHEMA = Obj({"label": Str(), "file": Str(), "rung": Str(), "knobs": ANY, "units": Int(lo=0)})
CASE_SCHEMA = Obj({"family": Str(), "layer": Str(), "held_out": Bool(), "M": Int(lo=1), "N": Int(lo=1),
                   "K": Int(lo=1), "dtype": Str(), "configs": List(CONFIG_SCHEMA, min_len=1)},
                  {"layout": Str(list(OPERAND_LAYOUTS))})  # absent in plans written before: KK
PLAN_SCHEMA = Obj({"format": Str([FORMAT]), "cases": List(CASE_SCHEMA, min_len=1)})


# -- the grid (no GPU, no compiler: the arithmetic) ----------------------------------------------------
def cases(train_dw: bool = False) -> list[dict]:
    """The 11 sub-wave shapes of 2026-11-26 and the dW shapes (family ``dW``, held out: no rule was fitted on them),
    all in the forward's layout (``KK``); with ``train_dw`` also :data:`TRAIN_DW_CASES` in theirs."""
    out = [{**c, "layout": "KK"} for c in case_list(CASES_2026_11_26)]
    out += [{"family": "dW", "layer": f"{M}x{N}", "held_out": True, "M": M, "N": N, "K": K, "dtype": "bfloat16",
             "layout": "KK"} for M, N, K in DW_CASES]
    if train_dw:
        out += [{"family": "dW-350M", "layer": f"{M}x{N}", "held_out": True, "M": M, "N": N, "K": K,
                 "dtype": "bfloat16", "layout": "MN"} for M, N, K in TRAIN_DW_CASES]
    return out


def spec_knobs_of(case: dict) -> dict:
    """The ``spec`` knob of a case's operand layout (none for the forward's ``KK``)."""
    a_major, b_major = OPERAND_LAYOUTS[case.get("layout", "KK")]
    dtype = case["dtype"]
    return spec_knobs(GemmSpec(a=dtype, b=dtype, d=dtype, a_major=a_major, b_major=b_major))


def units_of(M: int, N: int, blk_m: int, blk_n: int, split: int, cluster=(1, 1)) -> int:
    """Work units of a split-K grid: output tiles (whole clusters of them) times the split."""
    cm, cn = cluster
    return math.ceil(M / (blk_m * cm)) * cm * math.ceil(N / (blk_n * cn)) * cn * split


def _clusters(rows: int, cols: int) -> list[tuple[int, int]]:
    """Cluster shapes to try, best first: a pair of CTAs shares a B tile along M, else an A tile
    along N, only where the tiles pair up whole (3 rows of tiles in pairs along M would run a fourth
    row of nothing, a third more units), else none."""
    out = [(2, 1)] if rows % 2 == 0 else []
    return out + ([(1, 2)] if cols % 2 == 0 else []) + [(1, 1)]


def _valid(rung: str, M: int, N: int, K: int, knobs: dict) -> dict | None:
    """``knobs`` with the first cluster shape the rung accepts for this problem, or None."""
    rows, cols = math.ceil(M / knobs["blk_m"]), math.ceil(N / knobs["blk_n"])  # D's tiles (v11's too)
    for cm, cn in _clusters(rows, cols):
        k = {**knobs, "cluster_m": cm, "cluster_n": cn}
        try:
            make_config(rung, M, N, K, **k)
        except ConfigError:
            continue
        return k
    return None


def grid(case: dict, variants=VARIANTS) -> list[tuple[str, str, dict]]:
    """``(label, rung, knobs)`` of every config the sweep times for ``case`` (the policy's choice
    apart: :func:`jobs` adds it), each valid for the problem (``make_config``)."""
    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    base = {"dtype": dtype, "arch": ARCH}
    out = []
    for bm, bn, w, depth in TILES:
        for s in SPLITS:
            if units_of(M, N, bm, bn, s) > MAX_WAVES * SMS or math.ceil(K / 64) < 2 * s:
                continue
            for suffix, extra, tiles in (("", {}, ((bm, bn),)), *variants):
                if (bm, bn) not in tiles:
                    continue
                knobs = _valid("v10", M, N, K, {**base, "blk_m": bm, "blk_n": bn, "num_warpgroups": w,
                                                "pipe_depth": depth, "split_k": s, **extra})
                if knobs:
                    out.append((f"v10 s{s} {bm}x{bn}{suffix}", "v10", knobs))
    sk = _valid("v10", M, N, K, {**base, "blk_m": 128, "blk_n": 128, "split_k": 1, "stream_k": True})
    if sk:
        out.append(("streamk 128x128", "v10", sk))
    if M <= 256:
        for s in V11_SPLITS:
            # M in one tile where the accumulators fit, else tiles of 128 rows
            for bm in dict.fromkeys((min(256, -(-M // 8) * 8), 128)):
                knobs = _valid("v11", M, N, K, {**base, "blk_m": bm, "blk_n": 128, "split_k": s})
                if knobs and units_of(M, N, bm, 128, s) <= MAX_WAVES * SMS:
                    out.append((f"v11 s{s} {bm}x128", "v11", knobs))
                    break
    return out


# ``--grid depth``: the one-wave splits of the two winning tiles at two ring depths each (the full grid
# ran 128x128 at v10's 4 stages only; v9 runs it at 6)
DEPTH_TILES = ((128, 128, 2, 4), (128, 128, 2, 6), (64, 128, 1, 6), (64, 128, 1, 8))


def grid_depth(case: dict) -> list[tuple[str, str, dict]]:
    """``(label, rung, knobs)`` for ``--grid depth``: :data:`DEPTH_TILES` at every split of
    :data:`SPLITS` whose units fit one wave (the sweep's winners all did), labels with the depth."""
    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    out = []
    for bm, bn, w, depth in DEPTH_TILES:
        for s in SPLITS:
            if units_of(M, N, bm, bn, s) > SMS or math.ceil(K / 64) < 2 * s:
                continue
            knobs = _valid("v10", M, N, K, {"dtype": dtype, "arch": ARCH, "blk_m": bm, "blk_n": bn,
                                            "num_warpgroups": w, "pipe_depth": depth, "split_k": s})
            if knobs:
                out.append((f"v10 s{s} {bm}x{bn} p{depth}", "v10", knobs))
    return out


# ``--grid small`` (issues 30/31): v9 without split-K in the small tiles and deep rings cuBLAS runs at
# these shapes (torch's profiler, benchmarks/results/2026-11-26_h100_cublas_kernels/: nvjet 64x64 at 13
# stages in 2x1 and 4x2 clusters, 64x56 at 14, 128x64 at 8 in 1x2, 256x128 at 4 in 1x2 for the 2048-wide dW), one
# wave of small tiles instead of a split. (blk_m, blk_n, consumers, ring depths, clusters): ``all``
# times every cluster of whole tiles at the deepest ring, ``pair`` the first of :func:`_clusters`
# (a pair along M, else along N, else none) at each depth. Depths stop at what shared memory holds
# beside v9's staging buffers (``budget.max_pipe_depth``: 13 stages of 64x64, 8 of 64x128 or 128x64,
# 6 of 128x128, 4 of 128x256, 3 of 256x128 on an H100).
SMALL_TILES = ((64, 64, 1, (8, 10, 12), "all"), (64, 128, 1, (8,), "all"), (128, 64, 1, (8,), "pair"),
               (128, 64, 2, (8,), "pair"))
# and at the training dW shapes (MN-major, K = 16384, two to eight waves of 128x128): the larger
# tiles at their deepest rings, with the cluster cuBLAS takes (1x2)
DW_TILES = ((128, 128, 2, (6,), "all"), (128, 256, 2, (4,), "pair"), (256, 128, 2, (3,), "all"))
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2))


def grid_small(case: dict) -> list[tuple[str, str, dict]]:
    """``(label, rung, knobs)`` for ``--grid small``: v9 (no split) in :data:`SMALL_TILES` (and
    :data:`DW_TILES` where the operands are MN-major), each valid for the case's problem and layout,
    labelled ``v9 BMxBN wW pD CMxCN``."""
    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    base = {"dtype": dtype, "arch": ARCH, **spec_knobs_of(case)}
    out = []
    for bm, bn, w, depths, which in SMALL_TILES + (DW_TILES if case.get("layout", "KK") == "MN" else ()):
        rows, cols = math.ceil(M / bm), math.ceil(N / bn)
        whole = [c for c in CLUSTERS if rows % c[0] == 0 and cols % c[1] == 0]  # no cluster runs a tile of nothing
        for d in depths:
            every = which == "all" and d == depths[-1]
            for cm, cn in (whole if every else _clusters(rows, cols)):
                knobs = {**base, "blk_m": bm, "blk_n": bn, "num_warpgroups": w, "pipe_depth": d,
                         "cluster_m": cm, "cluster_n": cn}
                try:  # the depth too: check_pipe_depth counts the ring beside v9's staging buffers
                    make_config("v9", M, N, K, **knobs)
                except ConfigError:  # e.g. an MN-major operand's 64-row tile cannot be multicast in halves
                    continue
                out.append((f"v9 {bm}x{bn} w{w} p{d} {cm}x{cn}", "v9", knobs))
                if not every:
                    break
    return out


# ``--grid dynm``: the small-tile alternative plan.alternatives offers (v9 64x128, one consumer, 8
# stages, a pair of whole tiles) with M fixed and at run time (what a pack builds), in both tile orders
# a runtime M takes: its runtime-M module ran 10-20% slower than the fixed-M one at three shapes
# (results/2026-11-26_h100_subwave_small/)
DYNM_ORDERS = ("snake", "grouped")


def grid_dynm(case: dict) -> list[tuple[str, str, dict]]:
    """``(label, rung, knobs)`` for ``--grid dynm``: v9 64x128 p8 in the first cluster of whole
    tiles v9 validates, fixed and runtime M (``dynamic_m``), in :data:`DYNM_ORDERS`; labelled
    ``v9 64x128 p8 CMxCN ORDER fixed|anyM``."""
    M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
    base = {"dtype": dtype, "arch": ARCH, **spec_knobs_of(case), "blk_m": 64, "blk_n": 128, "num_warpgroups": 1,
            "pipe_depth": 8}
    out = []
    for order in DYNM_ORDERS:
        for dyn in (False, True):
            for cm, cn in _clusters(math.ceil(M / 64), math.ceil(N / 128)):
                knobs = {**base, "cluster_m": cm, "cluster_n": cn, "tile_order": order, "dynamic_m": dyn}
                try:
                    make_config("v9", M, N, K, **knobs)
                except ConfigError:  # e.g. no runtime M with an MN-major A
                    continue
                out.append((f"v9 64x128 p8 {cm}x{cn} {order} {'anyM' if dyn else 'fixed'}", "v9", knobs))
                break
    return out


GRIDS = {"full": grid, "depth": grid_depth, "small": grid_small, "dynm": grid_dynm}


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def make_row(case: dict, checks: dict, times: dict | None) -> dict:
    """One shape's row: every config's check and kernel time, cuBLAS's, the ratios (cuBLAS's time
    over the config's), the best config and the policy's ratio. ``checks``: file -> the check's
    result; ``times``: label -> ms per kernel (None where it was not timed)."""
    times = times or {}
    cub = times.get(CUBLAS)
    configs = []
    for c in case["configs"]:
        ms = times.get(c["label"])
        chk = checks.get(c["file"], {})
        configs.append({**c, "correct": bool(chk.get("ok")), "rel_err": chk.get("rel_err"),
                        "cublas_rel_err": chk.get("cublas_rel_err"), "detail": chk.get("detail"),
                        "us": ms * 1e3 if ms else None, "ratio": cub / ms if cub and ms else None})
    timed = [c for c in configs if c["ratio"]]
    best = max(timed, key=lambda c: c["ratio"]) if timed else None
    policy = next((c for c in configs if c["label"] == "policy"), None)
    row = {k: case[k] for k in ("family", "layer", "held_out", "M", "N", "K", "dtype")}
    row["layout"] = case.get("layout", "KK")
    row.update(correct=all(c["correct"] for c in configs), cublas_us=cub * 1e3 if cub else None,
               best=best["label"] if best else None, best_ratio=best["ratio"] if best else None,
               policy_ratio=policy["ratio"] if policy else None,
               kernel_ratio=best["ratio"] if best else None, configs=configs)
    return row


def summary(rows: list[dict]) -> dict:
    """Geomeans over the shapes of the policy's ratio and the best config's, and per config family
    (the label without its shape-dependent parts) the geomean of its best member per shape."""
    fams: dict = {}
    for r in rows:
        per: dict = {}
        for c in r["configs"]:
            if c["ratio"]:
                fam = " ".join(w for w in c["label"].split() if not w.startswith("s") or not w[1:].isdigit())
                per[fam] = max(per.get(fam, 0), c["ratio"])
        for fam, x in per.items():
            fams.setdefault(fam, []).append(x)
    return {"shapes": len(rows), "correct": sum(r["correct"] for r in rows),
            "geomean_policy_ratio": geomean(r["policy_ratio"] for r in rows),
            "geomean_best_ratio": geomean(r["best_ratio"] for r in rows),
            "best_over_cublas": sum((r["best_ratio"] or 0) >= 1 for r in rows),
            "by_family": {f: {"shapes": len(xs), "geomean_ratio": geomean(xs)} for f, xs in sorted(fams.items())}}


def table(rows: list[dict]) -> str:
    from gemm_ladder.measure.report import table as fmt  # pylint: disable=import-outside-toplevel

    def f3(x):
        return f"{x:.3f}" if x is not None else "-"

    out = [{"shape": f"{r['M']}x{r['N']}x{r['K']} {r['dtype'][:4]} {r.get('layout', 'KK')}",
            "ok": "yes" if r["correct"] else "NO",
            "cuBLAS us": f"{r['cublas_us']:.1f}" if r["cublas_us"] else "-", "policy": f3(r["policy_ratio"]),
            "best": f3(r["best_ratio"]), "best config": r["best"] or "-"} for r in rows]
    return fmt(out, list(out[0])) if out else "no rows"


def winners(rows: list[dict], within: float = 0.03) -> list[dict]:
    """Per shape, what a rule needs from the result: the tiles a 128x128 and a 128x256 grid has (per
    SM), K, the best config, and every config within ``within`` of it (the rule may pick any of
    them), each with its split, tile, reduction and units per SM."""
    out = []
    for r in rows:
        good = sorted((c for c in r["configs"] if c["ratio"]), key=lambda c: -c["ratio"])
        if not good:
            continue
        near = [c for c in good if c["ratio"] >= good[0]["ratio"] * (1 - within)]
        out.append({"shape": f"{r['M']}x{r['N']}x{r['K']}", "dtype": r["dtype"], "K": r["K"],
                    "tiles_128x128_per_sm": math.ceil(r["M"] / 128) * math.ceil(r["N"] / 128) / SMS,
                    "tiles_128x256_per_sm": math.ceil(r["M"] / 128) * math.ceil(r["N"] / 256) / SMS,
                    "best": good[0]["label"], "best_ratio": good[0]["ratio"], "policy_ratio": r["policy_ratio"],
                    "near": [{"label": c["label"], "ratio": round(c["ratio"], 3), "split": c["knobs"].get("split_k", 1),
                              "tile": f"{c['knobs'].get('blk_m')}x{c['knobs'].get('blk_n')}",
                              "reduce": c["knobs"].get("reduce", "slots"), "units_per_sm": round(c["units"] / SMS, 2)}
                             for c in near]})
    return out


# -- prepare (build box) -------------------------------------------------------------------------
def jobs(case_rows: list[dict], variants=VARIANTS, which: str = "full") -> list[tuple[dict, list]]:
    """Per case, its configs with their build jobs: the policy's choice (``front.plan_job``, at
    the case's M) and :func:`grid`'s."""
    # the build layer (TVM's compiler and the policy): this box only
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile.batch import BuildJob
    from gemm_ladder.serve import plan
    from gemm_ladder.serve.front import plan_job

    out = []
    for case in case_rows:
        M, N, K, dtype = case["M"], case["N"], case["K"], case["dtype"]
        a_major, b_major = OPERAND_LAYOUTS[case.get("layout", "KK")]
        spec = GemmSpec(a=dtype, b=dtype, d=dtype, a_major=a_major, b_major=b_major)
        p = plan.Problem(M, N, K, dtype, ARCH, SMS, None if spec.is_default() else spec)
        choice, job = plan_job(p)
        knobs = {**job.knobs, "dynamic_m": False}
        configs = [("policy", choice.rung, knobs)]
        if which == "small":  # the baselines: the split-K alternatives a pack carries beside the choice
            configs += [(f"alt {a.rung} s{a.knobs.get('split_k', 1)} {a.knobs['blk_m']}x{a.knobs['blk_n']}", a.rung,
                         {**a.knobs, "dynamic_m": False}) for a in plan.alternatives(p, choice)]
        configs += grid(case, variants) if which == "full" else GRIDS[which](case)
        out.append((case, [(label, BuildJob(rung, (M, N, K), k)) for label, rung, k in configs]))
    return out


def _key(job) -> str:
    return f"{job.rung} {job.shape} {sorted(job.knobs.items())}"


def _build(job):
    """One module from the module cache (built into it if missing): its path, or the error."""
    from gemm_ladder.compile.module_cache import get_or_build  # pylint: disable=import-outside-toplevel

    try:
        return str(get_or_build(job)[0])
    except Exception as err:  # pylint: disable=broad-except  (a failed module is reported, the rest go on)
        return err


def prepare(out, only: str | None = None, which: str = "full") -> int:
    # the build layer: this box's TVM compiler
    # pylint: disable=import-outside-toplevel
    from gemm_ladder.compile.sass import has_device_binary
    from gemm_ladder.core.procs import map_in_processes

    out = Path(out)
    files.open_folder(out)
    planned = jobs([c for c in cases(train_dw=which == "small") if not only or only in f"{c['M']}x{c['N']}x{c['K']}"],
                   which=which)
    todo = list({_key(j): j for _, cfgs in planned for _, j in cfgs}.values())
    print(f"{len(planned)} shapes, {len(todo)} modules to build or find in the cache", flush=True)
    paths = {_key(j): p for j, p in zip(todo, map_in_processes(_build, todo, None))}
    failed = [(j, paths[_key(j)]) for j in todo if not isinstance(paths[_key(j)], str)]
    for j, err in failed:
        print(f"failed: {j.rung} {j.shape} {j.knobs}: {err}", file=sys.stderr)
    names, doc_cases = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for case, cfgs in planned:
            kept = []
            for label, j in cfgs:
                src = paths[_key(j)]
                if not isinstance(src, str):
                    continue
                so = Path(src)
                if not has_device_binary(so.read_bytes()):
                    print(f"{label} {j.shape}: no device binary in the exported module", file=sys.stderr)
                    failed.append((j, "no device binary"))
                    continue
                cfg = make_config(j.rung, *j.shape, **j.knobs)
                name = names.setdefault(src, f"m{len(names):03d}.so")
                if not (Path(tmp) / name).exists():
                    shutil.copyfile(so, Path(tmp) / name)
                    shutil.copyfile(str(so) + ".json", Path(tmp) / (name + ".json"))
                kept.append({"label": label, "file": name, "rung": j.rung, "knobs": j.knobs,
                             "units": units_of(case["M"], case["N"], cfg.blk_m, cfg.blk_n, j.knobs.get("split_k", 1),
                                               (cfg.knobs().get("cluster_m", 1), cfg.knobs().get("cluster_n", 1)))})
            doc_cases.append({**case, "configs": kept})
        with tarfile.open(out / ARCHIVE, "w:xz", preset=9) as tar:
            for p in sorted(Path(tmp).iterdir()):
                tar.add(p, arcname=p.name)
    files.write_json(out / PLAN_FILE, {"format": FORMAT, "sms": SMS, "cases": doc_cases})
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{len(names)} modules, {size / 2**20:.2f} MiB in {out}; "
          f"{sum(len(c['configs']) for c in doc_cases)} (shape, config) pairs")
    return 1 if failed else 0


# -- run (GPU box) -------------------------------------------------------------------------------
def stored(A, B, layout: str = "KK"):
    """Logical A [M, K] and B [N, K] as the layout keeps them in memory, the tensors a module of that
    layout takes: an MN-major operand transposed into a contiguous [K, M] / [K, N] tensor."""
    a_major, b_major = OPERAND_LAYOUTS[layout]
    return (A.t().contiguous() if a_major == "M" else A), (B.t().contiguous() if b_major == "N" else B)


def cublas_peer(layout: str = "KK"):
    """``torch.matmul`` on the same memory a module of ``layout`` reads: ``fn(a, b, d)`` with ``a``,
    ``b`` the stored tensors (:func:`stored`) and D = A . B^T into ``d`` (cuBLAS picks its kernel
    for the transposes as a training step's ``dY.t() @ X`` does)."""
    import torch  # pylint: disable=import-outside-toplevel  (the GPU side)

    a_major, b_major = OPERAND_LAYOUTS[layout]

    def peer(a, b, d):
        return torch.matmul(a.t() if a_major == "M" else a, b if b_major == "N" else b.T, out=d)
    return peer


def item_of(file: str, M: int, layout: str = "KK") -> str:
    """A module check as an isolate item (``check_module`` parses it back)."""
    return f"{file}@{M}@{layout}"


def parse_item(item: str) -> tuple[str, int, str]:
    file, M, *layout = item.split("@")
    return file, int(M), (layout[0] if layout else "KK")


def check_module(item: str, args) -> dict:
    """One module at its M in an isolate child (``measure.isolate``'s ``module:function`` job), its
    operands in the case's layout (``item_of``)."""
    # the GPU side (TVM runtime, torch): imported where it runs
    # pylint: disable=import-outside-toplevel
    import torch
    from gemm_ladder.measure import harness, suite
    from gemm_ladder.serve.runtime import load

    file, M, layout = parse_item(item)
    mod = load(Path(args[0]) / file)
    A, B = harness.random_inputs(M, mod.N, mod.K, mod.dtype, seed=M + mod.N + mod.K)
    a, b = stored(A, B, layout)
    D = torch.full((M, mod.N), float("nan"), dtype=A.dtype, device=A.device)
    mod(a, b, out=D)
    torch.cuda.synchronize()
    D2 = torch.full_like(D, float("nan"))  # a second call: the workspace counters must be back at zero
    mod(a, b, out=D2)
    torch.cuda.synchronize()
    res = suite.check_case(A, B, D, mod.dtype)
    again = bool(torch.equal(D, D2))
    if mod.manifest.get("knobs", {}).get("reduce") == "atomic":  # its sum's order varies: the second
        res2 = suite.check_case(A, B, D2, mod.dtype)             # call must be right, not the same bits
        if not res2["ok"]:
            res.update(ok=False, detail=f"the second call is wrong (slot or counter left non-zero?): {res2}")
    elif not again:
        res.update(ok=False, detail="a second call gave other bits (counters left non-zero?)")
    return {"status": "ok", **res, "same_bits_twice": again}


def unpack(archive, into) -> list[str]:
    """The modules of ``archive`` into the folder ``into`` (plain files only: names without a
    path); the names unpacked."""
    with tarfile.open(archive, "r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name == m.name]
        for m in members:
            with tar.extractfile(m) as src, open(Path(into) / m.name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return [m.name for m in members]


def check_all(folder, case_rows: list[dict]) -> dict:
    """file -> the check's result, every module at every M of the cases it serves (a runtime-M module
    may serve several), in isolate children; a module wrong at any M keeps that M's result."""
    from gemm_ladder.measure import isolate  # pylint: disable=import-outside-toplevel

    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])  # the child imports us
    todo = list(dict.fromkeys(item_of(c["file"], case["M"], case.get("layout", "KK"))
                              for case in case_rows for c in case["configs"]))
    results = isolate.run_batch("subwave_sweep:check_module", todo, [str(folder)], timeout=CHECK_TIMEOUT,
                                explain=False)
    out, right = {}, 0
    for it, res in zip(todo, results):
        res = {**res, "ok": res.get("status") == "ok" and bool(res.get("ok"))}
        file = parse_item(it)[0]
        right += res["ok"]
        if out.get(file, {"ok": True})["ok"]:  # the first wrong M stays
            out[file] = res
        if not res["ok"]:
            print(f"check {it}: FAIL {res.get('status')} err {res.get('rel_err')} (cuBLAS "
                  f"{res.get('cublas_rel_err')}) {str(res.get('detail', ''))[:300]}", flush=True)
    print(f"checked {len(todo)} (module, M) pairs of {len(out)} modules: {right} right", flush=True)
    return out


def time_case(case: dict, folder, checks: dict) -> dict:
    """label -> ms per kernel for the case's right configs and cuBLAS, in rounds whose order
    alternates, each sample a CUDA-graph replay cycling input sets that spill L2."""
    # pylint: disable=import-outside-toplevel
    import torch
    from gemm_ladder.measure import harness
    from gemm_ladder.serve.runtime import load

    M, N, K, dtype, layout = case["M"], case["N"], case["K"], case["dtype"], case.get("layout", "KK")
    sets = [(*stored(A, B, layout), D) for A, B, D in
            harness.input_sets(M, N, K, dtype, l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)]
    kernels = {}
    for c in case["configs"]:
        if checks.get(c["file"], {}).get("ok"):
            fn = load(Path(folder) / c["file"]).launcher(*sets[0])
            kernels[c["label"]] = lambda a, b, d, fn=fn: fn(a, b, d)
    kernels[CUBLAS] = cublas_peer(layout)
    calls = {}
    for n, fn in kernels.items():
        fn(*sets[0])
        ms = statistics.median(harness.event_times(fn, sets, 3))
        calls[n] = max(len(sets), min(GRAPH_CALLS, math.ceil(GRAPH_US / 1e3 / max(ms, 1e-6))))
    names = list(kernels)
    samples: dict = {n: [] for n in names}
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in (order if r % 2 == 0 else order[::-1]):
            samples[n] += harness.graph_times(kernels[n], sets, PER_ROUND, calls[n])
    del sets, kernels
    torch.cuda.empty_cache()
    return {n: statistics.median(s) for n, s in samples.items()}


def run(folder, out, only: str | None = None) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"subwave_sweep run: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    folder = Path(folder)
    fix = f"run benchmarks/subwave_sweep.py prepare {folder} on the build box and carry the folder here"
    doc = read_json(folder / PLAN_FILE, "subwave sweep plan", fix, PLAN_SCHEMA)
    case_rows = [c for c in doc["cases"] if not only or only in f"{c['M']}x{c['N']}x{c['K']}"]
    start, sampler = time.time(), Sampler()
    rows = []
    with tempfile.TemporaryDirectory() as mods:
        unpack(folder / ARCHIVE, mods)
        try:
            checks = check_all(mods, case_rows)
            for case in case_rows:
                t0 = time.time()
                times = time_case(case, mods, checks)
                row = make_row(case, checks, times)
                row["clocks"] = sampler.between(t0, time.time())
                rows.append(row)
                print(f"{case['M']}x{case['N']}x{case['K']} {case['dtype']}: cuBLAS {row['cublas_us'] or 0:.1f} us, "
                      f"policy {row['policy_ratio'] or 0:.3f}, best {row['best']} {row['best_ratio'] or 0:.3f} "
                      f"({time.time() - t0:.0f} s)", flush=True)
        finally:
            sampler.stop()
    result = {**check_cli.head(FORMAT, harness, sampler, start),
              "rounds": ROUNDS, "per_round": PER_ROUND, "summary": summary(rows), "rows": rows}
    check_cli.write_result(out, result)
    print(table(rows))
    print(f"{sum(r['correct'] for r in rows)} of {len(rows)} shapes all correct; {result['seconds']:.0f} s; wrote {out}")
    return 0 if all(r["correct"] for r in rows) else 1


def main(argv=None) -> int:
    p, pr, r, sub = check_cli.subcommands(__doc__, "build box: every config of every shape, packed into DIR",
                                          "GPU box: check every module, then time the grid against cuBLAS",
                                          "subwave_sweep.json")
    pr.add_argument("--only", help="only the shapes whose MxNxK contains this")
    pr.add_argument("--grid", choices=sorted(GRIDS), default="full",
                    help="full: every config; depth: the winning tiles' one-wave splits at two ring depths; "
                         "small: v9 without split-K in small tiles, deep rings and clusters (and the 350M dW, "
                         "MN-major); dynm: the small-tile alternative at a fixed and a runtime M")
    r.add_argument("--only", help="only the shapes whose MxNxK contains this")
    t = sub.add_parser("table", help="a result's rows: per shape the best config and those near it")
    t.add_argument("result")
    a = p.parse_args(argv)
    if a.cmd == "table":
        rows = read_json(a.result, "subwave sweep result", "pass the file run wrote", Obj({"rows": List()}))["rows"]
        print(table(rows))
        for w in winners(rows):
            print(f"{w['shape']} {w['dtype']}: tiles/SM {w['tiles_128x128_per_sm']:.2f} (128x128) "
                  f"{w['tiles_128x256_per_sm']:.2f} (128x256); policy {w['policy_ratio'] or 0:.3f}; near the best: "
                  + ", ".join(f"{n['label']} {n['ratio']}" for n in w["near"]))
        return 0
    return prepare(a.out, a.only, a.grid) if a.cmd == "prepare" else run(a.folder, a.out, a.only)


if __name__ == "__main__":
    sys.exit(main())
