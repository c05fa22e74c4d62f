"""Build the kernels of issue 12 (v10 split-K, v11 swap AB, runtime-M modules) at the shapes they are
for, each with the knobs ``schedulers.wave_model`` picks, beside the baselines they must beat.

    PYTHONPATH=. .venv/bin/python benchmarks/every_shape_kernels.py build/every_shape     # build box
    python3 -m gemm_ladder bench build/every_shape --out out/bench_every_shape.json        # GPU box

``bench`` checks each module against a float64 reference first, then times it against cuBLAS in the
same process; its JSON has ``gbps`` / ``cublas_gbps`` (A, B and D moved once, over the time: the
figure of merit of the weight-streaming shapes, against the HBM's ~3.0 TB/s copy rate) next to
TFLOPS. Every module's manifest carries the wave model's prediction (``model``: its time, bound
and reasoning), so a result can be read against it.

The list (fp16):
  - decode, M = 1, 16, 64 at N x K = 4096x4096, 28672x4096, 4096x14336, 128256x4096 (Llama-3-8B's
    weights): v11 with the model's tile and split_k; the same tile with split_k = 1 (what split-K
    buys); and one runtime-M v11 module per N x K (blk_m = 64) timed at each M;
  - middle shapes with few tiles (the issue's table): v9 at its defaults (the baseline), v10 with
    the model's tile and split_k (where it splits), and v11 where M <= 256 (one tile of M rounded
    up to 8).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gemm_ladder.core import budget
from gemm_ladder import make_config
from gemm_ladder.compile.batch import BuildJob, build_many, write_folder_manifest
from gemm_ladder.core.config import ConfigError
from schedulers import wave_model

DECODE_M = (1, 16, 64)
WEIGHTS = ((4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096))
MIDDLE = ((135, 3688, 6200), (292, 5136, 3152), (978, 2640, 3336), (32, 1408, 3584), (64, 64, 8192),
          (8192, 128, 4096), (4162, 2760, 1128))
MAX_DEPTH = 8  # more stages hide no more latency
SPLIT_KS = (1, 2, 3, 4, 6, 8, 16)


def _deepest(rung, shape, knobs) -> int:
    cfg = make_config(rung, *shape, **{**knobs, "pipe_depth": 2})
    return min(MAX_DEPTH, budget.max_pipe_depth(cfg))


def _model(p: wave_model.WavePlan) -> dict:
    return {"time_us": round(p.time_s * 1e6, 2), "bound": p.bound, "gbps": round(p.gbps), "why": p.why()}


def _swap_job(shape, blk_m, tiles_n, split_ks=SPLIT_KS, **extra_knobs):
    """v11 at the model's best (blk_n, split_k) among those that build, as (job, plan)."""
    M, N, K = shape
    best = None
    for p in wave_model.rank(M, N, K, [(blk_m, bn) for bn in tiles_n], split_ks, pipe_depth=6):
        knobs = {"blk_m": blk_m, "blk_n": p.blk_n, "split_k": p.split_k, **extra_knobs}
        try:
            knobs["pipe_depth"] = _deepest("v11", shape, knobs)
            make_config("v11", *shape, **knobs)
        except ConfigError:
            continue
        best = (knobs, p)
        break
    knobs, p = best
    return BuildJob("v11", shape, knobs, extra={"model": _model(p)}), p


def jobs() -> list[BuildJob]:
    out = []
    for N, K in WEIGHTS:
        for M in DECODE_M:
            job, p = _swap_job((M, N, K), wave_model.swap_blk_m(M), (128, 256))
            out.append(job)
            if p.split_k > 1:  # the same tile without split-K
                one = wave_model.plan(M, N, K, p.blk_m, p.blk_n, 1, pipe_depth=6)
                out.append(BuildJob("v11", (M, N, K), {**job.knobs, "split_k": 1}, extra={"model": _model(one)}))
        # one runtime-M module per weight shape, knobs chosen at M = 64; timed at each M
        dyn, _ = _swap_job((64, N, K), 64, (128, 256), dynamic_m=True, tile_order="grouped")
        for M in DECODE_M:
            p = wave_model.plan(M, N, K, 64, dyn.knobs["blk_n"], dyn.knobs["split_k"], pipe_depth=6)
            out.append(BuildJob("v11", (M, N, K), dyn.knobs, extra={
                "model": _model(p), "dynamic_m": {"min_m": 1, "tuned_for_m": [1, 64]}}))
    for M, N, K in MIDDLE:
        out.append(BuildJob("v9", (M, N, K), {}, extra={"model": _model(wave_model.plan(M, N, K, 128, 256))}))
        for p in wave_model.rank(M, N, K, [(128, 256), (128, 128)], SPLIT_KS):
            knobs = {"blk_n": p.blk_n, "split_k": p.split_k}
            if -(-M // 128) < 2:
                knobs["cluster_m"] = 1  # one row of tiles: nobody to share B with
            try:
                make_config("v10", M, N, K, **knobs)
            except ConfigError:
                continue
            if p.split_k > 1:  # split_k = 1 is v9 with these tiles
                out.append(BuildJob("v10", (M, N, K), knobs, extra={"model": _model(p)}))
            break
        if M <= 256:
            out.append(_swap_job((M, N, K), wave_model.swap_blk_m(M, 256), (128, 256))[0])
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0] if argv else "build/every_shape")
    todo = jobs()
    for j in todo:
        print(j.rung, "x".join(map(str, j.shape)), j.knobs, "|", j.extra["model"]["why"])
    results = build_many(todo, out_dir, desc="every-shape kernels")
    path, problems = write_folder_manifest(out_dir, results)
    refused = [r for r in results if r["status"] != "built"]
    for r in refused:
        print("refused:", r["rung"], r["shape"], r["knobs"], r["detail"], file=sys.stderr)
    print(f"{len(results) - len(refused)} modules in {path.parent}", *problems, sep="\n")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
