"""The grouped GEMM's prefill modules side by side (v12, contiguous layout, issue 33): which tile,
ring and scan serve which token count at which expert count, against ``torch._grouped_mm``.

Why: the kernel pack served contiguous prefill with one module, v12 at its 128x256 defaults without
the warp scan, for every token count past 64 rows an expert (``plan.grouped_choices`` before this
check's run: ``benchmarks/results/2026-11-26_h100_grouped_prefill``); it measured
0.94-1.22x ``torch._grouped_mm`` (``benchmarks/results/2026-11-26_h100_grouped``), 0.96-0.98x on
the balanced DeepSeek-V3-like and Qwen-MoE-like layers and 0.74-0.80x on the odd shape at 512
tokens. At 512-8192 tokens over 64-256 experts an expert holds 2-128 rows, so a 128-row tile spends
most of its MMA work and A loads on rows it lacks, and few experts with a 256-wide tile leave most
SMs idle (the odd 5 x 1000x520 at 512 tokens: 20 work units for 132 SMs). This check times the
candidates over v12's existing knobs in the same rounds, one child process a (shape, tokens):

- ``default``: the pack's prefill module today (128x256, 4 stages, thread 0's serial scan);
- ``scan``: the same with the warp scan of the routing (32 lanes in chunks, ``warp_scan``);
- ``n128`` / ``n128_d6``: 128x128 tiles (twice the work units), 4 and 6 stages;
- ``m64``: 64x256 tiles, one consumer, 5 stages (half the rows of padding an expert's last tile);
- ``group16``: bands of 16 m-tiles (Mixtral's large experts: the L2 order);
- ``swap16`` / ``swap32`` / ``swap64``: swap AB (W's 128 rows in wgmma's 64-row slot over two
  consumers, ``blk_m`` tokens its N, 8 stages, the warp scan): the decode module of the pack is
  swap16 (more than 16 experts) or swap32; where does it stop winning?

Every module is first checked by ``grouped_check.check_job`` (six routings with D poisoned, rows past
``offs[-1]`` untouched, the front door and the op bit-identical, a CUDA graph replayed after ``offs``
changed); then every timed case checks each variant again on its own inputs (D poisoned, 37 rows past
``offs[-1]`` that must stay NaN) before the rounds: kernels in CUDA graphs cycling input sets that
spill L2, and queued calls (``grouped_check._rounds``). bf16 only (``torch._grouped_mm``'s dtype
here), plus two fp16 modules of the odd shape, checked only.

    PYTHONPATH=. .venv/bin/python benchmarks/grouped_prefill_check.py prepare build/gprefill     # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/grouped_prefill_check.py run build/gprefill --out out/grouped_prefill.json   # GPU box

``prepare DIR --bands`` builds instead the policy's swapped tiles beside the same tiles in bands of 64
token tiles (``l2_group_size``: a Zipf-hot expert's weight tile read by all its token tiles at once), at
the token counts the swapped tiers serve (:data:`BAND_VARIANTS`; 17 modules, 3.6 MiB, 30 s on an H100).

``prepare DIR --large`` builds instead the tiles for the grouped suite's case below 0.95x torch (the odd
shape at 8192-32768 tokens: :data:`LARGE_VARIANTS`): the defaults and 128-column epilogue chunks (``epi128``,
the best 1x1 tile there) beside v12 in clusters, ``c2x1`` (two m-tiles of an expert share W's tile by TMA
multicast, as ``torch._grouped_mm``'s ClusterShape 2x1x1 does), ``c2x1_epi128`` and ``c1x2`` (two n-tiles
share A's); ``c2x1`` also on the Mixtral-like, DeepSeek-V3-like and Qwen-like weights at 8192 and 32768 tokens, and
``c1x2`` on the Mixtral-like and DeepSeek-V3-like, beside the module that serves each, so that a rule for them
loses nowhere; plus one masked-layout ``c2x1`` module of the odd shape, checked only
(``grouped_check.masked_check_job``). A clustered contiguous module's check (:func:`cluster_check_job`) adds a
routing where every expert holds an odd number of m-tiles (a phantom partner in each expert's last pair).
15 modules, about 3.3 MiB; 50 s on an H100 with 13 of them (2026-11-26).

``prepare DIR --pack`` builds instead a kernel pack of the four weights (contiguous, bf16: the
policy's tiers, ``plan.grouped_choices``), and ``run`` then serves the same cases through
``gemm_ladder.grouped_mm`` with ``use_pack`` and ``strict=True``: the module that served must be the
pack's for that M, correct with D poisoned, timed against ``torch._grouped_mm`` (rows add ``rule``,
``expected`` and ``served_by``; 10 s on an H100, DIR 3.0 MiB).

Rows: the issue's results format plus ``variant``, ``knobs``, ``ratio_to_baseline`` (the default's
time over the variant's) and ``best`` (the fastest correct variant of its case); ``summary`` holds per
variant the geomean and least ratio to ``torch._grouped_mm``, per case the winner, and the geomean of
the per-case winners (what a policy picking the best variant by (E, tokens) would reach). 42 s on an
H100 (2026-11-26); DIR 7.0 MiB (33 modules). Results: ``benchmarks/results/2026-11-26_h100_grouped_prefill``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)
import check_cli  # noqa: E402  (a sibling script, not a package)
import grouped_check as gc  # noqa: E402  (a sibling script: the routings, the checks, the rounds)

import gemm_ladder  # noqa: E402
from gemm_ladder.core import device, files  # noqa: E402
from gemm_ladder.measure import harness, isolate  # noqa: E402
from gemm_ladder.serve import front, grouped as grouped_door, kernel_pack, plan as serve_plan, runtime  # noqa: E402
from gemm_ladder.serve.grouped import spec_of_dtype  # noqa: E402

FORMAT = "gemm_ladder.grouped_prefill_check"
PLAN_FILE = "grouped_prefill_check.json"
SWAP = {"swap_ab": True, "blk_n": 128, "num_warpgroups": 2, "pipe_depth": 8, "warp_scan": True}
VARIANTS = {
    "default": {},
    "scan": {"warp_scan": True},
    "n128": {"blk_n": 128, "warp_scan": True},
    "n128_d6": {"blk_n": 128, "pipe_depth": 6, "warp_scan": True},
    "m64": {"blk_m": 64, "num_warpgroups": 1, "pipe_depth": 5, "warp_scan": True},
    "group16": {"l2_group_size": 16, "warp_scan": True},
    "swap16": {**SWAP, "blk_m": 16},
    "swap32": {**SWAP, "blk_m": 32},
    "swap64": {**SWAP, "blk_m": 64},
    # the swapped tiles in bands of 64 token tiles (one band for an expert of up to 2048-4096 rows): a
    # Zipf-hot expert's W n-tile is read by all its token tiles side by side, not once a band of 8
    "swap32_g64": {**SWAP, "blk_m": 32, "l2_group_size": 64},
    "swap64_g64": {**SWAP, "blk_m": 64, "l2_group_size": 64},
    # --large: three consumers of 64 rows over 128 columns, and the epilogue in chunks of 128 columns
    "m192n128": {"blk_m": 192, "num_warpgroups": 3, "blk_n": 128, "warp_scan": True},
    "epi128": {"epi_n": 128, "pipe_depth": 3, "warp_scan": True},  # the wider output tile takes a stage
    # --large: a whole tile's chunks stored under the next tile's first K slices (v12's epi_under), alone and
    # with the 128-column chunks; and in the masked layout (checked only: not timed beside the contiguous ones)
    "epi_under": {"epi_under": True, "warp_scan": True},
    "epi_under_epi128": {"epi_under": True, "epi_n": 128, "pipe_depth": 3, "warp_scan": True},
    "epi_under_masked": {"epi_under": True, "warp_scan": True, "layout": "masked"},
    # the whole 128x256 tile as one chunk (one staging buffer, the same bytes as epi128's two): one pair of
    # named barriers and one store a tile; with epi_under, stored under the next tile's first slice
    "epi256": {"epi_n": 256, "pipe_depth": 3, "warp_scan": True},
    "epi_under_epi256": {"epi_under": True, "epi_n": 256, "pipe_depth": 3, "warp_scan": True},
    # --large: 2x1 clusters (two m-tiles of an expert share W's tile by multicast, half each: a third less
    # L2 -> SM traffic at 128x256, torch._grouped_mm's ClusterShape 2x1x1), alone (the defaults' serial
    # scan, beside them) and with 128-column chunks; 1x2 (two n-tiles share A's tile); and the 2x1 masked
    # module, checked only
    "c2x1": {"cluster_m": 2},
    "c2x1_epi128": {"cluster_m": 2, "epi_n": 128, "pipe_depth": 3, "warp_scan": True},
    "c1x2": {"cluster_n": 2},
    "c2x1_masked": {"cluster_m": 2, "layout": "masked"},
}
BASELINE = "default"
# the variants of each shape of grouped_check.SHAPES (bf16, timed), and the token counts timed: rows
# of A in all, balanced and Zipf (grouped_check.TIMED_ROUTINGS)
SHAPE_VARIANTS = {
    "mixtral": ("default", "scan", "n128", "n128_d6", "m64", "group16", "swap32", "swap64"),
    "qwen_moe": ("default", "scan", "n128", "n128_d6", "m64", "swap16", "swap32", "swap64"),
    "deepseek_v3": ("default", "scan", "n128", "n128_d6", "m64", "swap16", "swap32", "swap64"),
    "odd": ("default", "scan", "n128", "m64", "swap16", "swap32", "swap64"),
}
TOKENS = {"mixtral": (512, 2048, 8192, 16384), "qwen_moe": (512, 2048, 8192), "deepseek_v3": (512, 2048, 8192),
          "odd": (512, 2048)}
# prepare --bands: the policy's swapped tiers beside the same tiles in bands of 64 token tiles, where the
# policy's swapped tiles serve (up to 128 rows an expert); the defaults and 128x128 as the yardsticks
BAND_VARIANTS = {
    "mixtral": ("default", "swap32", "swap32_g64", "swap64", "swap64_g64"),
    "qwen_moe": ("default", "n128", "swap32", "swap32_g64", "swap64", "swap64_g64"),
    "deepseek_v3": ("default", "n128", "swap32", "swap32_g64", "swap64", "swap64_g64"),
}
BAND_TOKENS = {"mixtral": (512,), "qwen_moe": (512, 2048, 8192), "deepseek_v3": (512, 2048, 8192)}
# prepare --large: the case under 0.95x torch._grouped_mm in the grouped suite
# (benchmarks/results/2026-11-26_h100_grouped_merged_19edac2: the odd 5 x 1000x520 at 32768 tokens 0.905-0.937 with
# the 128x256 defaults; epi128 0.916-0.929, epi_under no better: benchmarks/results/2026-11-26_h100_grouped_epi_under):
# v12 in 2x1 and 1x2 clusters (TMA multicast of the shared tile) beside the defaults and epi128, and 2x1 on the
# Mixtral-like, DeepSeek-V3-like and Qwen-like weights (beside the module that serves each) so that a rule for it
# loses nowhere; plus the 2x1 masked module of the odd shape, checked only (grouped_check.masked_check_job)
# (the first run, benchmarks/results/2026-11-26_h100_grouped_clusters/grouped_clusters.*: c2x1 1.21-1.26x torch at the
# odd shape's 32768 tokens, 0.90-0.99x the defaults elsewhere; then 1x2 on the DeepSeek-V3-like weight, one m-tile an
# expert at 32768 tokens, where two n-tiles sharing A's 128x7168 tile is the sharing left, and on the Mixtral-like)
LARGE_VARIANTS = {
    "odd": ("default", "epi128", "c2x1", "c2x1_epi128", "c1x2", "c2x1_masked"),
    "mixtral": ("default", "c2x1", "c1x2"),
    "deepseek_v3": ("default", "swap64", "c2x1", "c1x2"),
    "qwen_moe": ("default", "c2x1"),
}
LARGE_TOKENS = {"odd": (8192, 32768), "mixtral": (8192, 32768), "deepseek_v3": (8192, 32768),
                "qwen_moe": (8192, 32768)}
ODD_FP16 = ("scan", "swap32")  # checked only: the other dtype's MMA over the new prologue
TAIL = 37  # rows of A past offs[-1] in a timed case's check: they must stay NaN in D
DTYPE = "bfloat16"


def module_plan(bands: bool = False, large: bool = False) -> list[tuple]:
    """(shape name, E, N, K, dtype, variant) of every module ``prepare`` builds (``bands``: ``--bands``',
    ``large``: ``--large``')."""
    shapes = {name: (E, N, K) for name, E, N, K in gc.SHAPES}
    chosen = LARGE_VARIANTS if large else BAND_VARIANTS if bands else SHAPE_VARIANTS
    plan = [(name, *shapes[name], DTYPE, v) for name, variants in chosen.items() for v in variants]
    return plan if bands or large else plan + [("odd", *shapes["odd"], "float16", v) for v in ODD_FP16]


def knobs_of(E: int, dtype: str, variant: str) -> dict:
    """The build knobs of a variant (``VARIANTS``) for a weight of E experts in ``dtype``."""
    return {"experts": E, "dtype": dtype, "spec": spec_of_dtype(dtype).text(), **VARIANTS[variant]}


def prepare(out, bands: bool = False, large: bool = False) -> int:
    """Every module of :func:`module_plan` through the module cache into DIR, and the plan ``run``
    follows."""
    from gemm_ladder.compile.batch import BuildJob  # pylint: disable=import-outside-toplevel  (the build box's)

    folder = files.open_folder(out)
    modules = []
    for name, E, N, K, dtype, variant in module_plan(bands, large):
        stem = _built_into(folder, BuildJob("v12", (gc.BUILD_M, N, K), knobs_of(E, dtype, variant)),
                           f"gprefill_{name}_{dtype}_{variant}")
        modules.append({"file": f"{stem}.so", "shape": name, "experts": E, "N": N, "K": K, "dtype": dtype,
                        "variant": variant, "knobs": VARIANTS[variant]})
    return _write_plan(folder, modules, LARGE_TOKENS if large else BAND_TOKENS if bands else TOKENS)


def _built_into(folder: Path, job, stem: str) -> str:
    """``job`` through the module cache, its .so and manifest copied into ``folder`` as ``stem``."""
    # optional: the build layer (TVM's compiler), on the build box only
    from gemm_ladder.compile import module_cache  # pylint: disable=import-outside-toplevel

    path, how = module_cache.get_or_build(job)
    for src in Path(path).parent.iterdir():
        if src.name.startswith(Path(path).name):  # the .so and its manifest (.so.json)
            shutil.copy(src, folder / src.name.replace(Path(path).stem, stem, 1))
    print(f"{stem}: {how}", flush=True)
    return stem


def _write_plan(folder: Path, modules: list[dict], tokens: dict) -> int:
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "modules": modules, "tokens": tokens})
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{len(modules)} modules, {size / 2**20:.1f} MiB in {folder}")
    return 0


# prepare --promo: each tier of the policy (plan.grouped_choices of every grouped-suite weight, contiguous,
# bf16) as the policy builds it, beside its twin with v12's l2_promo on or off (both tensor maps fetching
# 256 bytes an L2 miss: producer.load_hints), each pair timed at the suite's token counts the tier serves
PROMO = "+promo"


def promo_plan() -> list[dict]:
    """The modules of ``prepare --promo``: per suite weight and policy tier serving some of the suite's
    token counts, the tier without ``l2_promo`` (named as the rule) and with it (``+promo``), each with
    the token counts it serves (``tokens_served``) and the twin it is compared with (``baseline``)."""
    out = []
    for name, E, N, K in gc.SUITE_FAMILIES:
        for g in serve_plan.grouped_choices(E, N, K, DTYPE, "contiguous"):
            served = [t for t in gc.SUITE_TOKENS if g.tokens[0] <= t <= g.tokens[1]]
            knobs = {k: v for k, v in g.choice.knobs.items() if k != "l2_promo"}
            for variant, extra in ((g.choice.rule, {}), (g.choice.rule + PROMO, {"l2_promo": True})):
                if served:
                    out.append({"shape": name, "experts": E, "N": N, "K": K, "dtype": DTYPE, "variant": variant,
                                "knobs": {**knobs, **extra}, "tokens_served": served, "baseline": g.choice.rule})
    return out


def prepare_promo(out) -> int:
    """:func:`promo_plan`'s modules through the module cache into DIR, and the plan ``run`` follows."""
    from gemm_ladder.compile.batch import BuildJob  # pylint: disable=import-outside-toplevel  (the build box's)

    folder = files.open_folder(out)
    modules = []
    for m in promo_plan():
        stem = _built_into(folder, BuildJob("v12", (gc.BUILD_M, m["N"], m["K"]), m["knobs"]),
                           f"gprefill_{m['shape']}_{m['dtype']}_{m['variant']}")
        modules.append({"file": f"{stem}.so", **m})
    tokens: dict = {}
    for m in modules:
        tokens[m["shape"]] = sorted(set(tokens.get(m["shape"], [])) | set(m["tokens_served"]))
    return _write_plan(folder, modules, tokens)


# -- the timed groups (pure Python: the CPU tests check them) -----------------------------------------
def time_items(folder, modules: list[dict], checks: dict, tokens: dict) -> list[str]:
    """One child job a (shape, tokens): ``tokens#path#path...`` over the shape's timed-dtype modules
    that passed their check, baseline first."""
    items = []
    for name, counts in tokens.items():
        mine = [m for m in modules if m["shape"] == name and m["dtype"] == DTYPE and not is_masked(m)
                and checks.get(m["file"], {}).get("status") == "ok"]
        mine.sort(key=lambda m: m["variant"] != BASELINE)
        for t in counts:
            # --promo's modules serve some token counts of their shape (tokens_served), the others all
            here = [m for m in mine if t in m.get("tokens_served", [t])]
            if here:
                items.append("#".join([str(t)] + [str(Path(folder) / m["file"]) for m in here]))
    return items


def is_masked(module: dict) -> bool:
    """A module of the masked layout (``--large``'s epi_under_masked): checked by the masked check, not timed."""
    return module.get("knobs", {}).get("layout") == "masked"


def is_clustered(module: dict) -> bool:
    """A module of 2x1 or 1x2 clusters (``--large``'s c2x1, c1x2)."""
    knobs = module.get("knobs", {})
    return knobs.get("cluster_m", 1) * knobs.get("cluster_n", 1) > 1


CHECK_JOBS = {"masked": "benchmarks.grouped_check:masked_check_job", "plain": "benchmarks.grouped_check:check_job",
              "cluster": "benchmarks.grouped_prefill_check:cluster_check_job"}


def check_items(folder, modules: list[dict]) -> dict[str, list[str]]:
    """The check jobs (``module:function``: ``grouped_check``'s by the module's layout; a contiguous
    clustered module's :func:`cluster_check_job`) and the modules each checks."""
    out: dict[str, list[str]] = {}
    for m in modules:
        kind = "masked" if is_masked(m) else "cluster" if is_clustered(m) else "plain"
        out.setdefault(CHECK_JOBS[kind], []).append(str(Path(folder) / m["file"]))
    return out


def odd_tile_counts(experts: int, blk_m: int = 128, live: int = 16) -> list[int]:
    """Rows per expert with an ODD number of ``blk_m``-row tiles each (1, 3, 5, ...: a 2x1 cluster's
    last pair of every expert has a phantom partner), every fourth expert empty, experts past ``live``
    empty (E = 256 stays a few thousand rows), rows not multiples of the tile."""
    counts = [0] * experts
    for e in range(min(experts, live)):
        if e % 4 != 3:
            counts[e] = (2 * (e % 3) + 1) * blk_m - (e * 7) % min(50, blk_m // 2)
    return counts


def cluster_check_job(path, args) -> dict:
    """``grouped_check.check_job`` (six routings, the front door and the op, the graph replayed with new
    offs), then :func:`odd_tile_counts` with D poisoned and TAIL rows past ``offs[-1]`` that must stay
    NaN: every expert's last 2x1 pair holds a phantom m-tile, which loads, multiplies and writes nothing."""
    res = gc.check_job(path, args)
    mod = grouped_door.GroupedModule(runtime.load(path))
    E, N, K, dtype = mod.experts, mod.N, mod.K, mod.dtype
    counts = odd_tile_counts(E, blk_m=int(mod.module.knobs.get("blk_m", 128)))
    rows = sum(counts) + TAIL
    A, W, offs = gc._inputs(E, N, K, dtype, counts, rows, seed=7)  # pylint: disable=protected-access
    D = torch.full((rows, N), float("nan"), dtype=A.dtype, device="cuda")
    mod.launch(A, W, offs, D)
    torch.cuda.synchronize()
    rel, trel, nan, past = gc._errors(A, W, gc.offsets_of(counts), D, rows)  # pylint: disable=protected-access
    ok = nan == 0 and past == 0 and rel <= 2 * trel + gc.ERROR_FLOOR[dtype]
    res["odd_tiles"] = {"ok": ok, "rel_err": rel, "torch_rel_err": trel, "nan": nan, "rows_past_offs_written": past,
                        "counts_head": counts[:8]}
    if not ok:
        res["status"] = "wrong"
    return res


def parse_item(item: str) -> tuple[int, list[str]]:
    tokens, *paths = item.split("#")
    return int(tokens), paths


def variant_of(path: str) -> str:
    """The variant a module's file name ends with (``prepare``'s names: ``gprefill_{shape}_{dtype}_{variant}``)."""
    found = re.fullmatch(r"gprefill_.+?_(?:bfloat16|float16)_(.+)", Path(path).stem)
    if found is None:
        raise ValueError(f"{Path(path).name} is not named gprefill_<shape>_<dtype>_<variant>.so (prepare's names)")
    return found.group(1)


def prefill_time_job(item, args) -> dict:
    """One shape's variants and ``torch._grouped_mm`` in the same rotating rounds at one token
    count, balanced and Zipf; each variant first checked on the case's inputs (D poisoned, TAIL
    rows past offs[-1] that must stay NaN)."""
    tokens, paths = parse_item(item)
    mods = [grouped_door.GroupedModule(runtime.load(p)) for p in paths]
    names = [variant_of(p) for p in paths]
    E, N, K, dtype = mods[0].experts, mods[0].N, mods[0].K, mods[0].dtype
    l2 = device.probe(0).l2_bytes or (50 << 20)
    W = torch.randn(E, N, K, device="cuda", dtype=getattr(torch, dtype)).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    rows = tokens + TAIL
    results = []
    for routing in gc.TIMED_ROUTINGS:
        counts = gc.counts_of(routing, E, tokens, seed=tokens)
        offs_list = gc.offsets_of(counts)
        per_set = 2 * rows * (K + N)  # A and D: W is shared (read every call)
        n_sets = max(2, math.ceil(2 * l2 / max(per_set + W.numel() * W.element_size(), 1)))
        sets = []
        for _ in range(n_sets):
            A = torch.randn(rows, K, device="cuda").to(W.dtype)
            sets.append((A, torch.tensor(offs_list, dtype=torch.int32, device="cuda"),
                         torch.empty(rows, N, dtype=W.dtype, device="cuda")))

        def ours_of(mod):
            def ours(A, offs, D):
                mod.launch(A, W, offs, D)
            return ours

        def grouped_mm(A, offs, D):  # pylint: disable=unused-argument  (torch allocates its D)
            torch._grouped_mm(A[:tokens], Wt, offs=offs)  # pylint: disable=protected-access

        checks = {}
        A, offs, D = sets[0]
        for name, mod in zip(names, mods):
            D.fill_(float("nan"))
            mod.launch(A, W, offs, D)
            torch.cuda.synchronize()
            rel, trel, nan, past = gc._errors(A, W, offs_list, D, rows)  # pylint: disable=protected-access
            checks[name] = {"ok": nan == 0 and past == 0 and rel <= 2 * trel + gc.ERROR_FLOOR[dtype],
                            "rel_err": rel, "torch_rel_err": trel, "nan": nan, "rows_past_written": past}
        parties = {f"ours:{name}": ours_of(mod) for name, mod in zip(names, mods) if checks[name]["ok"]}
        if gc._grouped_mm_works(sets[0][0][:tokens], W, sets[0][1]):  # pylint: disable=protected-access
            parties["grouped_mm"] = grouped_mm
        times = gc._rounds(parties, sets, 2.0 * tokens * N * K)  # pylint: disable=protected-access
        results.append({"tokens": tokens, "routing": routing, "sets": n_sets, "checks": checks, "times": times})
        del sets
    return {"status": "ok", "rows": results}


# -- rows and summary (pure Python: the CPU tests check them) -----------------------------------------
def case_rows(group: list[dict], checks: dict, timing: dict | None) -> list[dict]:
    """A (shape, tokens)'s rows in the issue's format: per routing, one row per variant with its
    time as ``ours`` beside torch's of the same rounds, ``ratio_to_baseline`` and ``best``."""
    rows = []
    for r in (timing or {}).get("rows", []):
        timed = {m["variant"]: r["times"].get(f"ours:{m['variant']}", {}).get("graph_ms") for m in group}
        fastest = min((v for v, ms in timed.items() if ms), key=lambda v: timed[v], default=None)
        for m in group:
            v = m["variant"]
            mine = r["times"].get(f"ours:{v}", {})
            base_ms = r["times"].get(f"ours:{m.get('baseline', BASELINE)}", {}).get("graph_ms")
            times = {"ours": mine, **({"grouped_mm": r["times"]["grouped_mm"]} if "grouped_mm" in r["times"] else {})}
            correct = checks.get(m["file"], {}).get("status") == "ok" and r["checks"].get(v, {}).get("ok", False)
            case = {"experts": m["experts"], "N": m["N"], "K": m["K"], "dtype": m["dtype"], "shape": m["shape"],
                    "variant": v, "knobs": m["knobs"], "tokens": r["tokens"], "routing": r["routing"],
                    "kind": "prefill", "sets": r["sets"], "step_check": r["checks"].get(v), "best": v == fastest,
                    "ratio_to_baseline": base_ms / mine["graph_ms"] if base_ms and mine.get("graph_ms") else None}
            rows.append(gc.row(case, correct, times, "contiguous", ("grouped_mm",)))
    return rows


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(statistics.fmean(map(math.log, values))) if values else None


def summary_of(rows: list[dict]) -> dict:
    """Per variant: cases, correct, geomean and least ratio to torch._grouped_mm and to the
    default; per case (shape, tokens, routing) the winner and its ratio; the geomean of the
    winners (a policy choosing by shape and tokens) and of the default (today's)."""
    timed = [r for r in rows if r["kind"] == "prefill"]
    by_variant: dict = {}
    for r in timed:
        by_variant.setdefault(r["variant"], []).append(r)
    variants = {v: {"cases": len(rs), "correct": sum(r["correct"] for r in rs),
                    "to_grouped_mm": geomean(r["ratio_to_grouped_mm"] for r in rs),
                    "min_to_grouped_mm": min((r["ratio_to_grouped_mm"] for r in rs if r["ratio_to_grouped_mm"]),
                                             default=None),
                    "to_baseline": geomean(r["ratio_to_baseline"] for r in rs)} for v, rs in by_variant.items()}
    winners = [{"shape": r["shape"], "experts": r["experts"], "tokens": r["tokens"], "routing": r["routing"],
                "variant": r["variant"], "ratio_to_grouped_mm": r["ratio_to_grouped_mm"],
                "ratio_to_baseline": r["ratio_to_baseline"]} for r in timed if r["best"] and r["correct"]]
    return {"variants": variants, "winners": winners,
            "winners_to_grouped_mm": geomean(w["ratio_to_grouped_mm"] for w in winners),
            "winners_min_to_grouped_mm": min((w["ratio_to_grouped_mm"] for w in winners if w["ratio_to_grouped_mm"]),
                                             default=None),
            "baseline_to_grouped_mm": (variants.get(BASELINE) or {}).get("to_grouped_mm")}


# -- the rule through the front door (prepare --pack) --------------------------------------------------
# A kernel pack of the SHAPES' weights (contiguous, bf16: plan.grouped_choices' tiers), served through
# gemm_ladder.grouped_mm with use_pack and strict=True at the same (shape, tokens, routing) cases as the
# variants: which module served (it must be the one whose range holds M), correct with D poisoned, timed
# against torch._grouped_mm in the same rounds. A holds the routed tokens only (no TAIL: the front door
# picks by M, and a tail would move the cases at a tier's edge, 2048 tokens of Qwen-MoE's 64 experts, into
# the next tier; grouped_check's checks cover the rows past offs[-1]).
PACK_FOLDER = "pack"


def prepare_pack(out) -> int:
    """The SHAPES' weights as a kernel pack (contiguous, bf16) into DIR/pack, and the plan ``run`` follows."""
    folder = files.open_folder(out)
    weights = [(E, N, K, "contiguous") for _, E, N, K in gc.SHAPES]
    man = kernel_pack.build_pack(folder / PACK_FOLDER, [], [DTYPE], grouped=weights,
                                 request={"grouped": [f"{E},{N},{K},contiguous" for E, N, K, _ in weights]})
    failed = [r for r in man["results"] if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r['detail']}", file=sys.stderr)
    files.write_json(folder / PLAN_FILE, {"format": FORMAT, "pack": PACK_FOLDER, "tokens": TOKENS})
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{len(man['results'])} modules in a pack, {size / 2**20:.1f} MiB in {folder}")
    return 1 if failed else 0


def pack_items(folder, tokens: dict) -> list[str]:
    """One child job a (shape, tokens): ``pack folder#shape#tokens``."""
    return [f"{Path(folder) / PACK_FOLDER}#{name}#{t}" for name, counts in tokens.items() for t in counts]


def expected_module(entries: list[dict], E: int, N: int, K: int, rows: int) -> dict | None:
    """The pack's contiguous bf16 entry of (E, N, K) whose token range holds ``rows`` rows of A."""
    return next((e for e in entries if kernel_pack.is_grouped(e) and e["layout"] == "contiguous"
                 and e["experts"] == E and e["shape"][1:] == [N, K] and e["tokens"][0] <= rows <= e["tokens"][1]), None)


def pack_time_job(item, args) -> dict:
    """One (shape, tokens) through the front door with the pack (strict), balanced and Zipf: the
    module that served, a check with D poisoned, then rounds against torch._grouped_mm."""
    folder, name, tokens = item.split("#")
    tokens = int(tokens)
    if not any(p.folder == Path(folder) for p in front.packs()):  # once a child (its jobs run one after another)
        gemm_ladder.use_pack(folder)
    E, N, K = next((E, N, K) for n, E, N, K in gc.SHAPES if n == name)
    rows = tokens
    source, kernel = gc._served("contiguous", E, N, K, DTYPE, rows)  # pylint: disable=protected-access
    l2 = device.probe(0).l2_bytes or (50 << 20)
    W = torch.randn(E, N, K, device="cuda", dtype=getattr(torch, DTYPE)).div_(math.sqrt(K))
    Wt = W.transpose(1, 2)
    results = []
    for routing in gc.TIMED_ROUTINGS:
        counts = gc.counts_of(routing, E, tokens, seed=tokens)
        offs_list = gc.offsets_of(counts)
        n_sets = max(2, math.ceil(2 * l2 / max(2 * rows * (K + N) + W.numel() * W.element_size(), 1)))
        sets = [(torch.randn(rows, K, device="cuda").to(W.dtype), torch.tensor(offs_list, dtype=torch.int32,
                 device="cuda"), torch.empty(rows, N, dtype=W.dtype, device="cuda")) for _ in range(n_sets)]

        def ours(A, offs, D):
            gemm_ladder.grouped_mm(A, W, offs, out=D, strict=True)

        def grouped_mm(A, offs, D):  # pylint: disable=unused-argument  (torch allocates its D)
            torch._grouped_mm(A, Wt, offs=offs)  # pylint: disable=protected-access

        A, offs, D = sets[0]
        D.fill_(float("nan"))
        ours(A, offs, D)
        torch.cuda.synchronize()
        rel, trel, nan, past = gc._errors(A, W, offs_list, D, rows)  # pylint: disable=protected-access
        check = {"ok": nan == 0 and past == 0 and rel <= 2 * trel + gc.ERROR_FLOOR[DTYPE], "rel_err": rel,
                 "torch_rel_err": trel, "nan": nan, "rows_past_written": past}
        parties = {"ours": ours} if check["ok"] else {}
        if gc._grouped_mm_works(A, W, offs):  # pylint: disable=protected-access
            parties["grouped_mm"] = grouped_mm
        times = gc._rounds(parties, sets, 2.0 * tokens * N * K)  # pylint: disable=protected-access
        results.append({"tokens": tokens, "routing": routing, "sets": n_sets, "check": check, "times": times})
        del sets
    return {"status": "ok", "source": source, "kernel": kernel, "rows": results}


def pack_rows(entries: list[dict], item: str, res: dict) -> list[dict]:
    """A (shape, tokens)'s rows through the front door: correct only where the pack's module for
    that M served and its check passed; ``rule`` and ``served_by`` beside the issue's fields."""
    _, name, tokens = item.split("#")
    E, N, K = next((E, N, K) for n, E, N, K in gc.SHAPES if n == name)
    want = expected_module(entries, E, N, K, int(tokens))
    served = bool(want) and res.get("source") == "kernel pack" and want["file"] in (res.get("kernel") or "")
    base = {"experts": E, "N": N, "K": K, "dtype": DTYPE, "shape": name, "kind": "pack",
            "rule": (want or {}).get("choice", {}).get("rule"), "expected": (want or {}).get("file"),
            "served_by": res.get("kernel")}
    if res.get("status") != "ok":
        return [gc.row({**base, "tokens": int(tokens), "routing": None, "detail": json.dumps(res)[:4000]}, False, {},
                       "contiguous", ("grouped_mm",))]
    return [gc.row({**base, "tokens": r["tokens"], "routing": r["routing"], "check": r["check"], "sets": r["sets"]},
                   served and r["check"]["ok"], r["times"], "contiguous", ("grouped_mm",)) for r in res["rows"]]


def run_pack(folder, out, plan: dict) -> int:
    """run for a DIR of prepare --pack: every (shape, tokens) in a child, rows in the issue's format."""
    entries = kernel_pack.KernelPack(folder / plan["pack"]).modules
    items = pack_items(folder, plan["tokens"])
    sampler, start = Sampler(), time.time()
    try:
        results = isolate.run_batch("benchmarks.grouped_prefill_check:pack_time_job", items, timeout=gc.TIME_TIMEOUT,
                                    explain=False)
    finally:
        sampler.stop()
    rows = [r for item, res in zip(items, results) for r in pack_rows(entries, item, res)]
    ratios = [r["ratio_to_grouped_mm"] for r in rows]
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"cases": len(rows), "correct": sum(r["correct"] for r in rows),
                          "geomean_ratio_to_grouped_mm": geomean(ratios),
                          "min_ratio_to_grouped_mm": min((x for x in ratios if x), default=None)},
              "rows": rows}
    files.write_record(out, result)
    for r in rows:
        print(f"{r['shape']:11s} tokens={r['tokens']:6d} {r['routing'] or '-':8s} {r['rule'] or '-':22s} "
              f"correct={r['correct']} x grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f}")
    print(json.dumps(result["summary"]), f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def run(folder, out) -> int:
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"grouped_prefill_check run: no GPU here ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        print(f"grouped_prefill_check run: {folder / PLAN_FILE} is not a {FORMAT} plan: run prepare again",
              file=sys.stderr)
        return 2
    if "pack" in plan:
        return run_pack(folder, out, plan)
    modules, tokens = plan["modules"], plan["tokens"]
    sampler, start = Sampler(), time.time()
    timed: list = []
    items: list = []
    try:
        checks = {}
        for job, paths in check_items(folder, modules).items():
            results = isolate.run_batch(job, paths, timeout=gc.CHECK_TIMEOUT,
                                        explain=False)
            checks.update({Path(p).name: r for p, r in zip(paths, results)})
        items = time_items(folder, modules, checks, tokens)
        timed = isolate.run_batch("benchmarks.grouped_prefill_check:prefill_time_job", items,
                                  timeout=gc.TIME_TIMEOUT, explain=False)
    finally:
        sampler.stop()
    rows = []
    for item, t in zip(items, timed):
        paths = parse_item(item)[1]
        group = [next(m for m in modules if m["file"] == Path(p).name) for p in paths]
        rows += case_rows(group, checks, t)
        if t.get("status") != "ok":
            rows.append(gc.row({"experts": group[0]["experts"], "N": group[0]["N"], "K": group[0]["K"],
                                "dtype": DTYPE, "shape": group[0]["shape"], "variant": None, "tokens": parse_item(item)[0],
                                "routing": None, "kind": "failure", "detail": json.dumps(t)[:4000]}, False, {},
                               "contiguous", ("grouped_mm",)))
    for m in modules:
        if checks[m["file"]].get("status") != "ok":
            rows.append(gc.row({k: m[k] for k in ("experts", "N", "K", "dtype", "shape", "variant", "knobs")}
                               | {"tokens": gc.CHECK_TOKENS, "routing": None, "kind": "failure",
                                  "detail": json.dumps(checks[m["file"]])[:4000]}, False, {},
                               "masked" if is_masked(m) else "contiguous", ("grouped_mm",)))
    result = {"format": FORMAT, "gpu": harness.gpu_info(), **harness.run_info(),
              "clocks": sampler.between(start, time.time()), "seconds": round(time.time() - start, 1),
              "summary": {"modules": len(modules),
                          "correct_modules": sum(c.get("status") == "ok" for c in checks.values()), **summary_of(rows)},
              "checks": checks, "rows": rows}
    files.write_record(out, result)
    for r in rows:
        if r["kind"] == "prefill":
            print(f"{r['shape']:11s} {r['variant']:16s} tokens={r['tokens']:6d} {r['routing']:8s} "
                  f"correct={r['correct']} "
                  f"x grouped_mm {r['ratio_to_grouped_mm'] or 0:.3f} x default {r['ratio_to_baseline'] or 0:.3f}"
                  f"{'  best' if r['best'] else ''}")
    s = result["summary"]
    print(json.dumps({k: s[k] for k in ("modules", "correct_modules", "winners_to_grouped_mm",
                                         "winners_min_to_grouped_mm", "baseline_to_grouped_mm")}),
          f"{result['seconds']:.0f} s; wrote {out}")
    return 0


def main(argv=None) -> int:
    p, pr, _, _ = check_cli.subcommands(__doc__, "build box: the prefill variants' v12 modules into DIR",
                                        "GPU box: check every module, then time the variants side by side",
                                        "grouped_prefill.json")
    pr.add_argument("--pack", action="store_true", help="a kernel pack of the SHAPES' weights instead (the policy's "
                                                          "modules); run serves it through the front door")
    pr.add_argument("--bands", action="store_true", help="the swapped tiers beside the same tiles in bands of 64 "
                                                           "token tiles instead (BAND_VARIANTS)")
    pr.add_argument("--large", action="store_true", help="the tiles for the suite's cases under 0.95x torch instead "
                                                           "(LARGE_VARIANTS: the odd shape at 8192-32768 tokens, "
                                                           "DeepSeek-V3-like at 32768)")
    pr.add_argument("--promo", action="store_true", help="each tier of the policy beside its twin with the 256-byte "
                                                           "L2 promotion (l2_promo) toggled, at the suite's token "
                                                           "counts it serves (promo_plan)")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        if a.pack + a.bands + a.large + a.promo > 1:
            p.error("prepare: one of --pack, --bands, --large and --promo")
        if a.promo:
            return prepare_promo(a.out)
        return prepare_pack(a.out) if a.pack else prepare(a.out, a.bands, a.large)
    check_cli.require_in_name(p, a.out, "grouped", 33)
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
