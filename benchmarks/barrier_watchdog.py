"""Barrier safety on a GPU: the broken variants under the watchdog, and what the watchdog costs.

Build box (TVM's compiler, no GPU) -- builds and exports every module into DIR:

    PY=.venv/bin/python $PY benchmarks/barrier_watchdog.py prepare build/barriers

GPU box (runtime-only TVM, the repo and DIR; see benchmarks/README.md):

    PYTHONPATH=$PWD:build/runtime/site TVM_USE_RUNTIME_LIB=1 \\
        python3 benchmarks/barrier_watchdog.py run build/barriers --out out/barriers

``run`` writes ``OUT/watchdog_log.txt`` and ``OUT/watchdog.json``:

- every Hopper broken variant of ``tests/barrier_faults.py``, built with ``watchdog=2``, checked
  through ``gemm_ladder.measure.isolate`` as ``verify`` does: the ones that hang must end in a named
  ``BarrierTimeoutError`` (status ``hang``) within seconds, not in the isolate's timeout (a race
  such as a release before ``wgmma.wait_group`` may end ``wrong`` or even ``ok``: the checker,
  not the GPU, is the tool for those);
- the 2-CTA multicast test kernel, correct, with the watchdog: it must pass the check;
- v4, v5, v6 and v9 at 4096^3 and 8192^3 (fp16) with the watchdog off and on, timed in one process,
  alternating, from raw launches (the record is passed, nothing polls it): the cost of the
  bounded waits. Off is the shipped build (its SASS is that of TVM's own waits; a CPU test
  compares them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_SHAPE = (2048, 2048, 1024)  # broken variants: big enough to keep every CTA busy
CLUSTER_SHAPE = (2048, 2048, 1024)
TIMED = [("v4", (4096, 4096, 4096)), ("v5", (4096, 4096, 4096)), ("v6", (4096, 4096, 4096)),
         ("v5", (8192, 8192, 8192)), ("v6", (8192, 8192, 8192)), ("v9", (4096, 4096, 4096)),
         ("v9", (8192, 8192, 8192))]
WATCHDOG = 2
CHECK_TIMEOUT = 60.0


# -- build box -------------------------------------------------------------------------------
def prepare(out: Path) -> None:
    import gemm_ladder
    from gemm_ladder.protocol.check import check_kernel
    from tests.barrier_faults import VARIANTS, cluster_prim_func

    out.mkdir(parents=True, exist_ok=True)
    index = []

    def export(func, name, **info):
        t0 = time.perf_counter()
        mod = gemm_ladder.build(func)
        mod.extra.update(info)
        path = mod.export(out / f"{name}.so")
        index.append({"file": path.name, **info})
        print(f"{path.name}: built in {time.perf_counter() - t0:.0f} s", flush=True)

    for v in VARIANTS.values():
        if v.arch != "sm_90a":
            continue  # Blackwell variants are checked on the CPU only (no sm_100a GPU here)
        shape = GPU_SHAPE if v.name != "multicast_missing_cta" else CLUSTER_SHAPE
        func = v.prim_func(shape=shape, watchdog=WATCHDOG)
        report = check_kernel(v.prim_func(shape=shape), policies=("forward",), which="first")
        export(func, f"broken_{v.name}", kind="broken", variant=v.name, fault=v.fault, gpu=list(v.gpu),
               checker=report.findings[:3])
    cfg = gemm_ladder.make_config("v5", *CLUSTER_SHAPE, pipe_depth=3, num_warpgroups=1, blk_n=128,
                                  watchdog=WATCHDOG)
    export(cluster_prim_func(cfg), "cluster_multicast_ok", kind="correct", variant="cluster_multicast")
    for rung, shape in TIMED:
        for wd in (None, WATCHDOG):
            knobs = {"dtype": "float16"} | ({"watchdog": wd} if wd else {})
            mod = gemm_ladder.build(rung, *shape, **dict(gemm_ladder.make_config(rung, *shape).knobs(), **knobs))
            name = f"timed_{rung}_{'x'.join(map(str, shape))}_{'wd' if wd else 'off'}"
            path = mod.export(out / f"{name}.so")
            index.append({"file": path.name, "kind": "timed", "rung": rung, "shape": list(shape),
                          "watchdog": wd})
            print(f"{path.name}: built", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"{len(index)} modules in {out}")


# -- GPU box ---------------------------------------------------------------------------------
def _time_pair(off: str, on: str, rounds: int = 5, reps: int = 30) -> dict:
    """Median kernel time of two builds of one config, alternating, raw launches."""
    import torch

    from gemm_ladder.measure import harness
    from gemm_ladder import load
    from gemm_ladder.sync.watchdog import RECORD_WORDS

    mods = [load(off), load(on)]
    m = mods[0]
    dev = torch.device("cuda", 0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    per_set = (m.M * m.K + m.N * m.K + m.M * m.N) * 2
    sets = []
    for i in range(max(1, min(8, -(-3 * l2 // per_set)))):
        A, B = harness.random_inputs(m.M, m.N, m.K, m.dtype, seed=100 + i)
        sets.append((A, B, torch.empty((m.M, m.N), dtype=A.dtype, device=dev)))
    rec = torch.zeros(RECORD_WORDS, dtype=torch.int64, pin_memory=True)
    rec[0] = 1 << 62  # a launch id no claim reaches: nothing is reported while timing

    def launcher(mod, bounded):
        fn = mod._function()  # pylint: disable=protected-access
        extra = mod.launch_args(dev)
        if bounded:
            return lambda a, b, o: fn(a, b, o, *extra, rec.data_ptr())
        return lambda a, b, o: fn(a, b, o, *extra)

    runs = [launcher(mods[0], False), launcher(mods[1], True)]
    for run in runs:  # correctness of both, then warm-up
        A, B, D = sets[0]
        run(A, B, D)
        torch.cuda.synchronize()
        ref = (A.double() @ B.double().T)
        assert (D.double() - ref).norm() / ref.norm() < 1e-2, "wrong result"
    times = [[], []]
    for _ in range(rounds):
        for k, run in enumerate(runs):
            for i in range(reps):
                A, B, D = sets[i % len(sets)]
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                run(A, B, D)
                e.record()
                e.synchronize()
                times[k].append(s.elapsed_time(e))
    flops = 2.0 * m.M * m.N * m.K
    med = [statistics.median(t) for t in times]
    return {"off_ms": med[0], "on_ms": med[1], "off_tflops": flops / med[0] / 1e9,
            "on_tflops": flops / med[1] / 1e9, "on_over_off": med[1] / med[0],
            "reps": rounds * reps, "input_sets": len(sets)}


def run(folder: Path, out: Path) -> int:
    from gemm_ladder.measure import harness
    from gemm_ladder.measure.isolate import run_isolated

    out.mkdir(parents=True, exist_ok=True)
    index = json.loads((folder / "index.json").read_text())
    report = {"gpu": harness.gpu_info(), **harness.run_info(), "broken": [], "correct": [], "timed": []}
    lines = [f"GPU: {report['gpu']['name']}  SM clock {report['gpu']['sm_clock_mhz_now']} "
             f"(max {report['gpu']['sm_clock_mhz_max']})  driver {report['gpu']['driver']}  "
             f"date {report['date']}  commit {report['commit']}", ""]
    bad = 0
    for entry in (e for e in index if e["kind"] in ("broken", "correct")):
        t0 = time.monotonic()
        res = run_isolated("check", folder / entry["file"], 0, timeout=CHECK_TIMEOUT)
        res["seconds"] = round(time.monotonic() - t0, 1)
        res.update({k: entry[k] for k in ("variant", "kind") if k in entry})
        want = ["ok"] if entry["kind"] == "correct" else entry.get("gpu", ["hang"])
        ok = res["status"] in want
        bad += not ok
        report["broken" if entry["kind"] == "broken" else "correct"].append(res)
        lines.append(f"{entry['file']}: {res['status']} after {res['seconds']} s "
                     f"({'as expected' if ok else 'EXPECTED ' + ' or '.join(want)})")
        if entry.get("fault"):
            lines.append(f"  fault:    {entry['fault']}")
        if res.get("detail"):
            lines.append(f"  says:     {res['detail']}")
        for f in entry.get("checker", [])[:1]:
            lines.append(f"  checker:  {f}")
        lines.append("")
        print("\n".join(lines[-4:]), flush=True)
    timed = [e for e in index if e["kind"] == "timed"]
    pairs: dict = {}
    for e in timed:
        pairs.setdefault((e["rung"], tuple(e["shape"])), {})["on" if e["watchdog"] else "off"] = e["file"]
    lines.append("watchdog off vs on (raw launches, median, alternating rounds):")
    for (rung, shape), files in pairs.items():
        cmd = [sys.executable, __file__, "time-pair", str(folder / files["off"]), str(folder / files["on"])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        try:
            res = json.loads(last)
        except ValueError:
            res = {"error": (proc.stderr or proc.stdout)[-800:]}
        res.update(rung=rung, shape=list(shape))
        report["timed"].append(res)
        if "error" in res:
            lines.append(f"  {rung} {'x'.join(map(str, shape))}: ERROR {res['error']}")
            bad += 1
        else:
            lines.append(f"  {rung} {'x'.join(map(str, shape))}: off {res['off_ms']:.3f} ms "
                         f"({res['off_tflops']:.0f} TFLOPS), on {res['on_ms']:.3f} ms "
                         f"({res['on_tflops']:.0f} TFLOPS): on/off {res['on_over_off']:.3f}")
        print(lines[-1], flush=True)
    (out / "watchdog_log.txt").write_text("\n".join(lines) + "\n")
    (out / "watchdog.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / 'watchdog_log.txt'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare")
    pp.add_argument("dir", type=Path)
    pr = sub.add_parser("run")
    pr.add_argument("dir", type=Path)
    pr.add_argument("--out", type=Path, default=Path("out/barriers"))
    pt = sub.add_parser("time-pair")
    pt.add_argument("off")
    pt.add_argument("on")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.dir)
        return 0
    if a.cmd == "run":
        return run(a.dir, a.out)
    print(json.dumps(_time_pair(a.off, a.on)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
