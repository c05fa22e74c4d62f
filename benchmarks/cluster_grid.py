"""How many clusters a persistent launch should have: the SM count over the cluster size, or what
the GPU can hold at once.

    PYTHONPATH=. .venv/bin/python benchmarks/cluster_grid.py prepare build/cluster_grid   # build box
    python3 benchmarks/cluster_grid.py run build/cluster_grid --out out/cluster_grid.json  # GPU box
    python3 benchmarks/cluster_grid.py run build/cluster_grid --out out/grid128.json --grids 132,128

A persistent rung launches one CTA per SM, in whole clusters. A cluster's CTAs must run on one
GPC at once, and an H100 SXM's 132 SMs do not all sit in GPCs that hold whole 4-CTA clusters:
the driver (``cuOccupancyMaxActiveClusters``, ``gemm_ladder.core.device.max_active_clusters``) may
answer fewer clusters than ``132 // 4 = 33``. A launch of more clusters than fit runs the extra
ones after the first finish: a second pass for their tiles.

``prepare`` builds v9 at issue 11's shapes in 2x1 and 2x2 clusters (and 1x1 at 4096^3, the
tuning database's pick there). ``run`` asks the driver what fits for cluster sizes 1, 2 and 4,
checks every module against a float reference, and times each module on several CTA counts in
one process, alternating with cuBLAS: the runtime's grid, the SM count in whole clusters, and
(2x1) the grid of a 2x2 cluster's fit. ``--grids 132,128``: the 2x1 modules only, at exactly
those CTA counts, in two passes (the order reversed in the second): does a launch on 128 SMs (64
clusters, whole waves at issue 11's shapes, 4 SMs idle and drawing no power) gain clock?
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SQUARES = ((4096, 4096, 4096), (8192, 8192, 8192))
BASE = {"pipe_depth": 4, "tile_order": "snake", "l2_group_size": 4, "blk_m": 128, "blk_n": 256,
        "num_warpgroups": 2, "epi_n": 64}


def jobs():
    from gemm_ladder.compile.batch import BuildJob  # pylint: disable=import-outside-toplevel

    out = []
    for shape in SQUARES:
        for dtype in ("float16", "bfloat16"):
            for cm, cn in ((2, 1), (2, 2)):
                out.append(BuildJob("v9", shape, {**BASE, "dtype": dtype, "cluster_m": cm, "cluster_n": cn}))
    out.append(BuildJob("v9", (4096,) * 3, {**BASE, "dtype": "float16", "cluster_m": 1, "cluster_n": 1}))
    out.append(BuildJob("v9", (4096,) * 3, {**BASE, "dtype": "float16", "cluster_m": 2, "cluster_n": 2,
                                             "l2_group_size": 8}))
    for shape in ((6144, 6144, 6144), (3072, 8192, 1536)):
        for cm, cn in ((2, 1), (2, 2)):
            out.append(BuildJob("v9", shape, {**BASE, "dtype": "float16", "cluster_m": cm, "cluster_n": cn}))
    return out


def prepare(out_dir: Path) -> int:
    from gemm_ladder.compile.batch import build_many, write_folder_manifest  # pylint: disable=import-outside-toplevel

    results = build_many(jobs(), out_dir, desc="cluster grid")
    _, problems = write_folder_manifest(out_dir, results)
    bad = [r for r in results if r["status"] != "built"]
    print(f"{len(results) - len(bad)} built into {out_dir}; failed: {len(bad) + len(problems)}")
    return 1 if bad or problems else 0


def _time_at(harness, mod, path, n: int, **extra) -> dict:
    """``mod`` checked and timed against cuBLAS with its launch set to ``n`` CTAs: a result row."""
    mod.launch_args = lambda where: [n]
    chk = harness.check(mod)
    t = harness.time_module(mod, reps=60)
    row = {**extra, "module": path.name, "rung": mod.rung, "shape": [mod.M, mod.N, mod.K], "dtype": mod.dtype,
           "knobs": mod.manifest["knobs"], "cluster": int(mod.manifest["launch"].get("cluster", 1)), "num_ctas": n,
           "status": "ok" if chk.ok else "wrong", "rel_err": chk.rel_err, **t}
    print(f"{path.name[:60]:60s} ctas {n:4d}  {t['ms']:.4f} ms  {t['tflops']:.0f} TFLOPS  "
          f"{t['ratio_to_cublas']:.3f}x  {row['status']}", flush=True)
    return row


def _write(out: Path, report: dict) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return 0


def run_grids(folder: Path, out: Path, grids: list[int]) -> int:
    from gemm_ladder.measure import harness
    from gemm_ladder.serve import runtime  # pylint: disable=import-outside-toplevel

    report = {**harness.run_info(), "gpu": harness.gpu_info(0),
              "method": "time_module per grid (queued, alternating with cuBLAS), two passes, the grids' order "
                        "reversed in the second", "results": []}
    mods = sorted(p for p in folder.glob("*.so") if "clusterm2clustern1" in p.name)
    for n_pass, order in enumerate((grids, grids[::-1]), start=1):
        for path in mods:
            mod = runtime.load(path)
            report["results"] += [_time_at(harness, mod, path, n, **{"pass": n_pass}) for n in order]
    return _write(out, report)


def run(folder: Path, out: Path) -> int:
    import torch  # pylint: disable=import-outside-toplevel

    from gemm_ladder.core import device
    from gemm_ladder.measure import harness
    from gemm_ladder.serve import runtime  # pylint: disable=import-outside-toplevel

    idx = torch.cuda.current_device()
    sms = device.sm_count(idx)
    mods = sorted(folder.glob("*.so"))
    launch = runtime.load(mods[0]).manifest["launch"]
    fit = {c: device.max_active_clusters(idx, c, launch["threads"], launch["smem_bytes"]) for c in (1, 2, 4, 8)}
    print(f"SMs {sms}; clusters that fit at once ({launch['threads']} threads, {launch['smem_bytes']} B): {fit}",
          flush=True)
    report = {**harness.run_info(), "gpu": harness.gpu_info(idx), "sm_count": sms, "max_active_clusters": fit,
              "method": "time_module (queued, rounds alternating with cuBLAS), one process; a module per "
                        "grid by overriding the CTA count of its launch", "results": []}
    for path in mods:
        mod = runtime.load(path)
        cs = int(mod.manifest["launch"].get("cluster", 1))
        grids = {mod.launch_args(torch.device("cuda", idx))[0], sms // cs * cs}
        if cs == 2:
            grids.add(fit[4] * 4)
        report["results"] += [_time_at(harness, mod, path, n) for n in sorted(grids)]
    return _write(out, report)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "prepare":
        return prepare(Path(argv[1]))
    if len(argv) == 4 and argv[0] == "run" and argv[2] == "--out":
        return run(Path(argv[1]), Path(argv[3]))
    if len(argv) == 6 and argv[0] == "run" and argv[2] == "--out" and argv[4] == "--grids":
        return run_grids(Path(argv[1]), Path(argv[3]), [int(g) for g in argv[5].split(",")])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
