"""Where a training step's GPU time goes, kernel by kernel (issue 31): torch's model against ours
(``gemm_ladder.nn.patch``, ``--fuse`` for ``fuse=True``: the SwiGLU MLPs and the q/k/v groups), on the
plan and pack of ``e2e_check``;
with ``--prefill MODEL BxS`` an inference prefill's instead (the front door measured, as a user
gets it), with each forward's wall time beside its GPU time (a host-bound prefill shows a wall
time well over its kernels').

The GPU-bound 350M step runs at 1.00x torch unfused and 0.98x fused although every fused GEMM is
faster than torch's (``benchmarks/results/2026-11-26_h100_e2e_train_350/``): the difference is in
kernels outside the GEMMs. This runs ``e2e_check``'s training step (the same model, batches,
AdamW, bf16 autocast) for :data:`WARMUP` steps, then :data:`STEPS` steps under ``torch.profiler``
for each model, and writes the GPU time per step of every kernel name (calls and milliseconds a
step), the total, and a breakdown by :func:`category` -- GEMMs of ours (TVM's kernels) and of
cuBLAS, attention, elementwise, reductions, the optimizer, copies -- so two runs compare by
category. The phase runs in a child with a deadline (``measure.isolate``).

    PYTHONPATH=. .venv/bin/python benchmarks/e2e_check.py prepare build/e2e_350 --train llama-350m --phase train --fuse
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/train_profile.py run build/e2e_350 [--fuse] --out out/train_profile.json   # GPU box
        python3 benchmarks/train_profile.py run build/e2e_fuse2 --fuse --prefill llama-8b-2l 1x512 --out ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_check  # noqa: E402  (a sibling script: the model, its plan, its batches)
import phase_runs  # noqa: E402
from power_probe import Sampler  # noqa: E402

from gemm_ladder.core import device  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402
from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.measure.report import table as fmt  # noqa: E402
from gemm_ladder.serve.kernel_pack import KernelPack  # noqa: E402

FORMAT = "gemm_ladder.train_profile"
WARMUP, STEPS = 8, 4
DEADLINE = 240.0  # seconds the phase's child may take
TOP = 30  # kernel names kept per model
# (category, substrings of a kernel's name, lower case), first match wins
CATEGORIES = (
    ("gemm cublas", ("gemm", "xmma", "cutlass", "gemv", "nvjet")),  # nvjet: cuBLAS 12.8+ on Hopper
    ("attention", ("flash", "fmha", "attention")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("reduction", ("reduce", "norm", "softmax", "cross_entropy", "nll")),
    ("copy", ("copy", "cat", "memcpy", "memset", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "silu", "mul", "add", "index")),
)


OURS = "hgemm_kernel"  # the kernels of our modules (the builder's name for every rung's entry)


def category(name: str) -> str:
    """A kernel's category by its name: ``gemm ours`` for our modules' (:data:`OURS`), else the
    first of :data:`CATEGORIES` whose marker it holds, else ``other``."""
    low = name.lower()
    if low.startswith(OURS):
        return "gemm ours"
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def summarize_kernels(events, steps: int, attr: str = "device_time_total") -> dict:
    """From ``torch.profiler``'s ``key_averages()`` (objects with ``key``, ``count`` and the time
    ``attr`` in us: the GPU's, or ``self_cpu_time_total`` for a CPU dry run): per kernel name its
    calls and ms a step, the total, and ms a step by category."""
    kernels = []
    for e in events:
        us = getattr(e, attr, 0.0)
        if us and us > 0:
            kernels.append({"name": e.key, "calls": e.count / steps, "ms": us / 1e3 / steps,
                            "category": category(e.key)})
    kernels.sort(key=lambda k: -k["ms"])
    by_cat: dict = {}
    for k in kernels:
        by_cat[k["category"]] = by_cat.get(k["category"], 0.0) + k["ms"]
    by_cat = dict(sorted(by_cat.items(), key=lambda kv: -kv[1]))
    return {"total_ms": sum(k["ms"] for k in kernels), "by_category": by_cat, "top": kernels[:TOP]}


def profile_job(doc: dict, dev: str = "cuda", fuse: bool = False, warmup: int = WARMUP, steps: int = STEPS) -> dict:
    """torch and ours from the same weights: ``warmup`` steps each, then ``steps`` under the
    profiler each; ``dev`` other than cuda: a dry run (tests: the CPU's kernels)."""
    tr = doc["train"]
    dev = torch.device(dev)
    cfg, models, swapped, opts = e2e_check.training_pair(doc, dev, fuse)

    def step(name, i):
        x, y = e2e_check.train_batch(cfg, tr["batch"], tr["seq"], i, tr["seed"], device=dev)
        e2e_check.train_step(models[name], opts[name], x, y, cfg.vocab, dev)

    activity = torch.profiler.ProfilerActivity.CUDA if dev.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    out: dict = {"status": "ok", "swapped": len(swapped), "fused": len(swapped.fused), "rows": []}
    for name in models:
        for i in range(warmup):
            step(name, i)
        e2e_check._sync(dev)  # pylint: disable=protected-access
        t0 = time.time()
        with torch.profiler.profile(activities=[activity]) as prof:
            for i in range(steps):
                step(name, warmup + i)
            e2e_check._sync(dev)  # pylint: disable=protected-access
        got = summarize_kernels(prof.key_averages(), steps,
                                "device_time_total" if dev.type == "cuda" else "self_cpu_time_total")
        out["rows"].append({"t0": t0, "t1": time.time(), "phase": "profile", "model": cfg.name, "who": name,
                            "batch": tr["batch"], "tokens": tr["batch"] * tr["seq"], "fused": fuse, **got})
    return out


def prefill_job(doc: dict, model: str, batch: int, seq: int, dev: str = "cuda", fuse: bool = False,
                warmup: int = 3, steps: int = STEPS, timed: int = 10) -> dict:
    """An inference prefill (``model(tokens, last_only=True)``, as ``e2e_check`` times it) of torch's
    model and ours: ``warmup`` forwards each (the front door's first use among them), ``steps``
    under the profiler each, then ``timed`` forwards each, alternating, for the wall time."""
    dev = torch.device(dev)
    cfg, models, swapped = e2e_check.inference_pair(doc, model, dev, fuse)
    tokens = torch.randint(cfg.vocab, (batch, seq), generator=torch.Generator(device=dev).manual_seed(5), device=dev)
    activity = torch.profiler.ProfilerActivity.CUDA if dev.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    out: dict = {"status": "ok", "swapped": len(swapped), "fused": len(swapped.fused), "rows": []}
    with torch.inference_mode():
        for name, m in models.items():
            for _ in range(warmup):
                m(tokens, last_only=True)
            e2e_check._sync(dev)  # pylint: disable=protected-access
            t0 = time.time()
            with torch.profiler.profile(activities=[activity]) as prof:
                for _ in range(steps):
                    m(tokens, last_only=True)
                e2e_check._sync(dev)  # pylint: disable=protected-access
            got = summarize_kernels(prof.key_averages(), steps,
                                    "device_time_total" if dev.type == "cuda" else "self_cpu_time_total")
            out["rows"].append({"t0": t0, "t1": time.time(), "phase": "prefill profile", "model": cfg.name,
                                "who": name, "batch": batch, "tokens": batch * seq, "fused": fuse, **got})
        fns = {n: (lambda m=m: m(tokens, last_only=True)) for n, m in models.items()}
        wall = e2e_check._alternate(fns, e2e_check.ROUNDS, timed, dev)  # pylint: disable=protected-access
    for row in out["rows"]:
        row["wall_ms"] = wall[row["who"]]
    return out


def phase_job(item: str, args) -> dict:
    """The isolated job: ``item`` is ``profile`` (a training step) or ``prefill:MODEL:BxS``;
    ``args``: the folder and ``fuse`` where ours is patched with ``fuse=True``."""
    kind, *what = item.split(":")
    if kind not in ("profile", "prefill") or (kind == "prefill" and len(what) != 2):
        raise ValueError(f"unknown phase {item!r}: profile or prefill:MODEL:BxS")
    folder = args[0]
    fuse = len(args) > 1 and args[1] == "fuse"
    doc = read_json(Path(folder) / e2e_check.PLAN_FILE, "e2e_check plan", "run e2e_check.py prepare again",
                    e2e_check.PLAN_SCHEMA)
    if kind == "prefill":
        e2e_check._use_front(folder, "measured")  # pylint: disable=protected-access
        batch, seq = parse_shape(what[1])
        return prefill_job(doc, what[0], batch, seq, fuse=fuse)
    e2e_check._use_front(folder, "strict")  # pylint: disable=protected-access
    return profile_job(doc, fuse=fuse)


def parse_shape(text: str) -> tuple[int, int]:
    """``"BxS"`` (batch x sequence, e.g. ``1x512``) -> (B, S), both positive."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"prefill shape {text!r}: batch x sequence as BxS, e.g. 1x512")
    return int(parts[0]), int(parts[1])


def table(rows: list[dict]) -> str:
    cats = sorted({c for r in rows for c in r["by_category"]})
    out = [{"who": r["who"], "fused": "yes" if r["fused"] else "", "total ms": f"{r['total_ms']:.2f}",
            **({"wall ms": f"{r['wall_ms']:.2f}"} if "wall_ms" in r else {}),
            **{c: f"{r['by_category'].get(c, 0.0):.2f}" for c in cats}} for r in rows]
    return fmt(out, list(out[0])) if out else "no rows"


def run(folder, out, fuse: bool = False, prefill: tuple | None = None) -> int:
    doc = phase_runs.checked_plan(
        "train_profile", folder,
        lambda fix: read_json(Path(folder) / e2e_check.PLAN_FILE, "e2e_check plan", fix, e2e_check.PLAN_SCHEMA),
        lambda doc: e2e_check.unserved(KernelPack(folder), doc, device.arch_of(0)))
    if doc is None:
        return 2
    if fuse and not doc.get("fuse"):
        print(f"train_profile run: the plan in {folder} has no fused-MLP GEMMs: prepare it with --fuse",
              file=sys.stderr)
        return 2
    if prefill is not None:
        model, shape = prefill
        inf = doc.get("inference", {})
        if model not in inf.get("models", []):
            print(f"train_profile run: no inference model {model!r} in {folder}'s plan (it has "
                  f"{inf.get('models', [])}); prepare it with the inference phase", file=sys.stderr)
            return 2
        try:
            _, seq = parse_shape(shape)
        except ValueError as err:
            print(f"train_profile run: {err}", file=sys.stderr)
            return 2
        longest = max([s for _, s in inf["prefill"]] + [inf["decode_context"]])
        if seq > longest:
            print(f"train_profile run: sequence {seq} is past the plan's longest ({longest}): the model's rotary "
                  f"tables stop there; use a sequence up to {longest}", file=sys.stderr)
            return 2
    phase = "profile" if prefill is None else f"prefill:{prefill[0]}:{prefill[1]}"
    start, gpu = time.time(), harness.gpu_info()
    results, rows = phase_runs.run_phases(
        phase_runs.job_of(__name__, "train_profile"), [phase], [str(folder)] + (["fuse"] if fuse else []),
        lambda phase: DEADLINE, lambda phase, res: f"{phase}: {res.get('status')} {str(res.get('detail', ''))[-300:]}",
        Sampler())
    phase_runs.write_results(out, FORMAT, gpu, start, __doc__.split("\n\n")[1].strip(), {"mode": "strict"},
                             {}, results, rows, table, fuse=fuse)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="GPU box: one training step's kernels, torch against ours")
    r.add_argument("folder", help="the folder benchmarks/e2e_check.py prepare built")
    r.add_argument("--out", default="train_profile.json")
    r.add_argument("--fuse", action="store_true", help="ours patched with fuse=True (a folder from prepare --fuse)")
    r.add_argument("--prefill", nargs=2, metavar=("MODEL", "BxS"),
                   help="an inference prefill of the plan's MODEL at batch x sequence instead of a training step")
    a = p.parse_args(argv)
    return run(a.folder, a.out, a.fuse, tuple(a.prefill) if a.prefill else None)


if __name__ == "__main__":
    sys.exit(main())
