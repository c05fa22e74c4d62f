"""Why first use times torch's route slower than a caller sees it (issue 30's call floor).

At first use the front door times each candidate as queued calls; torch's candidate is
``F.linear(a, b, out=d)`` (``front.torch_linear``, what its fast path runs when the caller passes
``out``). In the every-model runs that time came out 20-65% above what the same process measured
for ``F.linear(a, b)`` a moment later (e.g. 333x1280x5120: 26.5 us at first use, 16.1 us in the
benchmark; 1536x3072x3072: 69.6 against 44.9), while our kernels' first-use times matched the
benchmark's: first use then keeps a kernel of ours that is slower than torch's call. This probe
times torch's ways of making the same product, queued, on the caller's thread and on a helper
thread (first use measures on one: ``runtime.outside_graph_pools``), with :mod:`first_use`'s own
sampler, and lists the kernels each way launches (``torch.profiler``):

    python3 benchmarks/torch_route_probe.py --out probe.json     # GPU box, torch only

It needs no TVM and no kernel of ours.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.serve import first_use  # noqa: E402
from gemm_ladder.core import files  # noqa: E402

SHAPES = ((333, 1280, 5120), (1536, 3072, 3072), (128, 4096, 4096), (2048, 1280, 1280), (16, 4544, 4544))


def ways():
    import torch
    import torch.nn.functional as F

    return {
        "linear": lambda a, b, d: F.linear(a, b),
        "linear_out": lambda a, b, d: F.linear(a, b, None, out=d),
        "mm_out": lambda a, b, d: torch.mm(a, b.t(), out=d),
        "mm": lambda a, b, d: torch.mm(a, b.t()),
        "matmul_out": lambda a, b, d: torch.matmul(a, b.t(), out=d),
    }


def on_helper_thread(fn):
    """``fn()`` on a new thread with the device set and gradients off, as first use runs."""
    import torch

    got = {}

    def run():
        with torch.cuda.device(0), torch.no_grad():
            got["v"] = fn()
            torch.cuda.current_stream().synchronize()
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return got["v"]


def kernels_of(call, sets) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    call(*sets[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(*sets[0])
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def probe(M: int, N: int, K: int) -> dict:
    import torch

    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    d = torch.empty(M, N, device="cuda", dtype=torch.float16)
    sets = first_use.input_sets(a, b, d, torch.cuda.get_device_properties(0).L2_cache_size)
    calls = ways()
    main = first_use.time_launches(calls, sets)
    helper = on_helper_thread(lambda: first_use.time_launches(calls, sets))
    main_again = first_use.time_launches(calls, sets)
    graphs = first_use.time_graphs({n: c for n, c in calls.items() if n.endswith("_out")}, sets, main)
    return {"M": M, "N": N, "K": K, "queued_us_main": main, "queued_us_helper_thread": helper,
            "queued_us_main_again": main_again, "graph_us": graphs,
            "kernels": {n: kernels_of(c, sets) for n, c in calls.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = []
    for M, N, K in SHAPES:
        r = probe(M, N, K)
        rows.append(r)
        q, h = r["queued_us_main"], r["queued_us_helper_thread"]
        print(f"{M}x{N}x{K}: " + "  ".join(f"{n} {q[n]:.1f}/{h[n]:.1f}" for n in q) + "  (us, main/helper thread); graphs "
              + "  ".join(f"{n} {v:.1f}" for n, v in r["graph_us"].items()), flush=True)
        for n, ks in r["kernels"].items():
            print(f"    {n}: {ks}")
    doc = {"gpu": harness.gpu_info(), **harness.run_info(), "rows": rows}
    files.write_record(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
