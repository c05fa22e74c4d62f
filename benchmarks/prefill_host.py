"""Where a host-bound prefill's wall time goes (issue 31): the host's time to issue one forward
while the GPU is busy, whether the forward waits for the GPU anywhere, and its wall time idle.

A 1x512 prefill of ``e2e_check``'s llama-8b-2l runs its kernels in ~1.3 ms and takes ~2-3 ms of
wall time, on torch's matmul and on ours (``benchmarks/results/2026-11-28_h200_e2e_qkv/``). Two
things make a wall time longer than the kernels: the host issuing slower than the GPU runs, and a
call that waits for the GPU (a synchronising allocation or copy) so the host cannot run ahead.
This tells them apart, for torch's model, ours patched with ``fuse=True`` and ours without the
q/k/v groups (``e2e_check.NO_QKV``), taking turns:

- ``issue_ms``: a forward's host time with :data:`BUSY_MS` of GPU work queued before it (a
  ``torch.cuda._sleep``): the host's own cost, the GPU never waiting on it; ``waited`` where the
  forward returned later than the queued work ends (it waited for the GPU);
- ``gpu_ms``: the forward's GPU time between two events after the queued work (the host far
  ahead, so no gaps);
- ``wall_ms``: a forward from an idle GPU to its end, as ``e2e_check`` times a prefill.

    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/prefill_host.py build/e2e_qkv --model llama-8b-2l --shape 1x512 --out prefill_host.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_check as e2e  # noqa: E402  (sibling script: the model, its plan and pack)

import gemm_ladder.nn as gnn  # noqa: E402
from gemm_ladder.core import device  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402
from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.core import files  # noqa: E402

BUSY_MS, ROUNDS, WARM = 30.0, 15, 3


def _sleep_cycles(ms: float) -> int:
    """``torch.cuda._sleep``'s cycles for at least ``ms`` (at 1980 MHz, the H100's and H200's
    boost clock: longer at lower clocks, which only makes the queue longer)."""
    return int(ms * 1_980_000)


def probe(fn, dev) -> dict:
    """One forward of ``fn``: its issue time behind queued work, whether it waited, its GPU time."""
    start, end, busy_end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    torch.cuda._sleep(_sleep_cycles(BUSY_MS))  # pylint: disable=protected-access
    busy_end.record()
    start.record()
    fn()
    end.record()
    issued = time.perf_counter()
    waited = busy_end.query()  # the queued work already over when the forward returned
    torch.cuda.synchronize(dev)
    return {"issue_ms": (issued - t0) * 1e3, "waited": bool(waited), "gpu_ms": start.elapsed_time(end)}


def wall(fn, dev) -> float:
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - t0) * 1e3


PROFILED, TOP = 20, 25


def host_profile(fn) -> list[dict]:
    """The :data:`TOP` functions by own host time over :data:`PROFILED` forwards under cProfile (a
    profiler slows Python: compare the entries, not the totals with the timings)."""
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(PROFILED):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (prim calls, calls, tottime, cumtime, callers)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:TOP]
    return [{"where": f"{Path(f).name}:{line} {name}", "calls": c / PROFILED, "tottime_ms": tt / PROFILED * 1e3,
             "cumtime_ms": ct / PROFILED * 1e3} for (f, line, name), (_, c, tt, ct, _) in top]


def batch_seq(text: str) -> tuple[int, int]:
    """``--shape``: ``BxS`` -> (batch, sequence), both positive."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--shape {text!r}: batch x sequence as BxS, e.g. 1x512")
    return int(parts[0]), int(parts[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a folder benchmarks/e2e_check.py prepare --fuse built")
    p.add_argument("--model", default="llama-8b-2l", choices=list(e2e.INFER_MODELS))
    p.add_argument("--shape", type=batch_seq, default=(1, 512), help="batch x sequence, e.g. 1x512")
    p.add_argument("--out", default="prefill_host.json")
    a = p.parse_args(argv)
    b, s = a.shape
    why = device.why_no_gpu()
    if why:
        print(f"prefill_host: {why}", file=sys.stderr)
        return 2
    doc = read_json(Path(a.folder) / e2e.PLAN_FILE, "e2e_check plan", "run e2e_check.py prepare --fuse", e2e.PLAN_SCHEMA)
    e2e._use_front(a.folder, "measured")  # pylint: disable=protected-access
    dev = torch.device("cuda")
    cfg, models, _ = e2e.inference_pair(doc, a.model, dev, fuse=True)
    models[e2e.NO_QKV] = copy.deepcopy(models["torch"])
    gnn.patch(models[e2e.NO_QKV], verbose=False, fuse=tuple(k for k in gnn.FUSIONS if k != "qkv"))
    tokens = torch.randint(cfg.vocab, (b, s), device=dev, generator=torch.Generator(device=dev).manual_seed(3))
    got: dict = {n: {"issue_ms": [], "gpu_ms": [], "wall_ms": [], "waited": 0} for n in models}
    with torch.inference_mode():
        fns = {n: (lambda m=m: m(tokens, last_only=True)) for n, m in models.items()}
        for fn in fns.values():
            for _ in range(WARM):
                fn()
        names = list(fns)
        for r in range(ROUNDS):
            for n in names if r % 2 == 0 else names[::-1]:
                one = probe(fns[n], dev)
                got[n]["issue_ms"].append(one["issue_ms"])
                got[n]["gpu_ms"].append(one["gpu_ms"])
                got[n]["waited"] += one["waited"]
                got[n]["wall_ms"].append(wall(fns[n], dev))
        profiles = {n: host_profile(fn) for n, fn in fns.items()}
    rows = [{"who": n, "model": a.model, "batch": b, "seq": s, "rounds": ROUNDS, "waited_rounds": v["waited"],
             **{k: statistics.median(v[k]) for k in ("issue_ms", "gpu_ms", "wall_ms")}} for n, v in got.items()]
    doc_out = {"format": "gemm_ladder.prefill_host", "gpu": harness.gpu_info(), **harness.run_info(),
               "busy_ms": BUSY_MS, "method": __doc__.split("\n\n")[2].strip(), "rows": rows,
               "profile": profiles}
    files.write_record(Path(a.out), doc_out)
    for r in rows:
        print(f"{r['who']:12s} issue {r['issue_ms']:.3f} ms (waited {r['waited_rounds']}/{ROUNDS})  "
              f"gpu {r['gpu_ms']:.3f} ms  wall {r['wall_ms']:.3f} ms")
    for n, top in doc_out.get("profile", {}).items():
        print(f"-- {n}: the host's time by function (cProfile, {PROFILED} forwards; tottime ms a forward)")
        for line in top[:12]:
            print(f"   {line['tottime_ms']:7.3f} {line['calls']:6.1f}x  {line['where']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
