"""Where a short call's host time goes (issue 30's call floor): the host microseconds of one call,
ours at each layer of the front door against torch's own calls, on an H100 with the runtime only.

The every-model suite's call floor (0.88-0.92x ``F.linear`` at 15-25 us calls, where the host path
is about as long as the kernel) is host time. This splits it, for one pack module of
``tests.gpu_smoke``'s pack (``build/smoke``, the 4096x4096 fp16 runtime-M module) at M = 16:

- ``raw``: the TVM function itself, ``fn(A, B, D, *tail)`` (argument checks, TMA descriptors, launch);
- ``launcher``: ``GemmModule.launcher``'s bound launch (the front door's fast path calls this);
- ``front``: ``gemm_ladder.matmul(A, W, out=D)`` on its cached fast path (lookup, checks, launch);
- ``front_python``: the front door's lookup and checks with a no-op in place of the launch;
- torch's: ``F.linear(A, W)``, ``F.linear(A, W, out=D)``, ``torch.mm(A, W.t(), out=D)``.

Each is timed as ``host_check._host_us`` does (a sleep kernel queued first, so the host never waits
for the GPU), in :data:`ROUNDS` rounds whose order rotates, median; a cProfile of ``front`` lists
its ten costliest functions. The product of each call is checked against torch's first.

    PYTHONPATH=. .venv/bin/python -m tests.gpu_smoke build/smoke                      # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/launch_cost.py run build/smoke --out out/launch_cost.json   # GPU box

Under a minute on an H100.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_cli  # noqa: E402  (sibling scripts, not a package)
from host_check import _host_us  # noqa: E402  pylint: disable=protected-access
from power_probe import Sampler  # noqa: E402

import gemm_ladder  # noqa: E402
from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.serve import front  # noqa: E402

FORMAT = "gemm_ladder.launch_cost"
M, N, K = 16, 4096, 4096
ROUNDS = 7
REPS = 400  # calls a sample: under the launch queue's depth, so the host never blocks on it


def _calls(pack_dir: Path) -> dict:
    """Each way of making the call (module docstring), after its product was checked. The pack's
    own choice serves (nothing timed at first use, no choices file): the module is ours."""
    os.environ["GEMM_LADDER_MEASURE"] = "0"
    os.environ["GEMM_LADDER_CHOICES"] = "off"
    gemm_ladder.use_pack(pack_dir)
    g = torch.Generator(device="cuda").manual_seed(30)
    A = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    W = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
    D = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    ref = F.linear(A, W).float()
    gemm_ladder.matmul(A, W, out=D, strict=True)  # checked path once: the fast path's entry
    gemm_ladder.matmul(A, W, out=D)
    err = ((D.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise SystemExit(f"the pack module's product is wrong: relative error {err}")
    key = front._fast_key(A, W, D)  # pylint: disable=protected-access
    hit = front._FAST.get(key)  # pylint: disable=protected-access
    if hit is None:
        raise SystemExit("the repeated call did not take the front door's fast path")
    route = hit[0]
    module = getattr(route.module, "eager", route.module)  # a ByCapture: its eager module
    if not hasattr(module, "_function"):
        raise SystemExit(f"the pack's choice is not a module of ours here: {route.module!r}")
    raw_fn = module._function()  # pylint: disable=protected-access
    tail = [*module.workspace_args(M, A.device), *module.launch_args(A.device)]
    bound = module.launcher(A, W, D)

    def front_python():
        front._FAST[key] = (route, lambda *a: None, *hit[2:])  # pylint: disable=protected-access
        try:
            gemm_ladder.matmul(A, W, out=D)
        finally:
            front._FAST[key] = hit  # pylint: disable=protected-access

    calls = {
        "raw": lambda: raw_fn(A, W, D, *tail),
        "launcher": lambda: bound(A, W, D),
        "front": lambda: gemm_ladder.matmul(A, W, out=D),
        "front_python": front_python,
        "F.linear": lambda: F.linear(A, W),
        "F.linear(out=)": lambda: F.linear(A, W, out=D),
        "torch.mm(out=)": lambda: torch.mm(A, W.t(), out=D),
    }
    for name in ("raw", "launcher"):
        D.fill_(float("nan"))
        calls[name]()
        torch.cuda.synchronize()
        if not ((D.float() - ref).norm() / ref.norm()).item() < 1e-2:
            raise SystemExit(f"{name}: wrong product")
    return calls, {"module": Path(module.path).name if hasattr(module, "path") else str(module),
                   "rel_err": err}


def run(pack_dir: Path) -> dict:
    start = time.time()
    sampler = Sampler()
    try:
        return _run(pack_dir, sampler, start)
    finally:
        sampler.stop()


def _run(pack_dir: Path, sampler, start: float) -> dict:
    calls, meta = _calls(pack_dir)
    names = list(calls)
    for n in names:  # warm-up
        _host_us(calls[n], reps=50)
    samples = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples[n].append(_host_us(calls[n], reps=REPS))
    prof = cProfile.Profile()
    torch.cuda._sleep(200_000_000)  # pylint: disable=protected-access
    prof.enable()
    for _ in range(REPS):
        calls["front"]()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(10)
    rows = [{"call": n, "host_us": statistics.median(s), "samples_us": [round(x, 3) for x in s]} for n, s in samples.items()]
    return {**check_cli.head(FORMAT, harness, sampler, start), "shape": [M, N, K], "dtype": "float16", **meta, "rows": rows,
            "profile_front": text.getvalue()}


def main(argv=None) -> int:
    p, _, _, _ = check_cli.subcommands(__doc__, "build box: python -m tests.gpu_smoke OUT builds the pack this uses",
                                       "GPU box: host us of one call, each way", "launch_cost.json")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        p.error("prepare: run `python -m tests.gpu_smoke OUT` (this check uses the smoke tier's pack, OUT/pack)")
    doc = run(Path(a.folder) / "pack")
    for r in doc["rows"]:
        print(f"{r['call']:16s} {r['host_us']:7.2f} us")
    print(doc["profile_front"])
    check_cli.write_result(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
