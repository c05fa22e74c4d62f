"""The host's cost of a repeated ``scaled_mm`` call (issue 32), on the GPU box, against ``torch._scaled_mm``.

    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 \\
        python3 benchmarks/fp8_host.py build/fp8_suite_t build/fp8_suite_r --out out/fp8_host.json

Each folder is one ``fp8_pack_check.py prepare --suite`` made (its ``pack/`` and ``fp8_pack.json``, one
recipe). At each shape of :data:`SHAPES` its pack serves, in one process and in rounds whose order
rotates, a call of ``gemm_ladder.scaled_mm(..., strict=True)`` (our kernel) is timed four ways:

- ``checked``: every call through the checked path (``scaled._repeat`` and ``_remember`` switched off):
  the path every call took before repeated calls were remembered;
- ``python``: the repeated call's Python lookup (the C++ table switched off: ``front.use_native(False)``);
- ``native``: the C++ table's ``scaled_lookup`` (``fastpath.cpp``), built before the run
  (``python -m gemm_ladder native``);
- ``torch``: ``torch._scaled_mm`` on the same tensors.

Two numbers each, with and without ``out``: the host's microseconds a call (``host_us``: 2000 calls
queued back to back, the clock stopped before the GPU is waited for) and the call as users see it
(``call_us``: the median of CUDA-event pairs around each of 300 queued calls: the GPU's time where
the host keeps ahead, the host's where it does not). Every path's D must hold the checked path's
bits (``correct``). Rows carry the issue's fields (recipe, M, N, K, correct, ``ratio_to_scaled_mm``:
torch's call time over the native path's, with ``out``; ``peer_ratios``: the same for the other paths'
calls over torch's). A few seconds a shape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_cli  # noqa: E402  (a sibling script, not a package)
import fp8_check  # noqa: E402  (a sibling script: inputs)
from power_probe import Sampler  # noqa: E402  (a sibling script, not a package)

from gemm_ladder.core import device  # noqa: E402
from gemm_ladder.core.records import read_json  # noqa: E402

FORMAT = "gemm_ladder.fp8_host"
SHAPES = ((64, 2112, 7168), (64, 6144, 4096), (256, 4096, 14336), (256, 24576, 1536), (1024, 2112, 7168),
          (4096, 7168, 16384))  # small M (host-bound calls) up to a long kernel
PATHS = ("checked", "python", "native", "torch")
ROUNDS = 3
HOST_CALLS = 2000
EVENT_CALLS = 300


def _host_us(fn, calls: int = HOST_CALLS) -> float:
    import torch  # pylint: disable=import-outside-toplevel

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def _call_us(fn, calls: int = EVENT_CALLS) -> float:
    import torch  # pylint: disable=import-outside-toplevel

    pairs = []
    for _ in range(calls):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)


class Path4:
    """One of :data:`PATHS` switched on around its calls."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        from gemm_ladder.serve import front, scaled  # pylint: disable=import-outside-toplevel

        self._saved = scaled._repeat, scaled._remember  # pylint: disable=protected-access
        if self.name == "checked":  # nothing looked up, nothing remembered: every call as before
            scaled._repeat = lambda *a: None  # pylint: disable=protected-access
            scaled._remember = lambda *a: None  # pylint: disable=protected-access
        front.use_native(self.name == "native")
        return self

    def __exit__(self, *exc):
        from gemm_ladder.serve import scaled  # pylint: disable=import-outside-toplevel

        scaled._repeat, scaled._remember = self._saved  # pylint: disable=protected-access


def time_shape(recipe: str, M: int, N: int, K: int) -> dict:
    import torch  # pylint: disable=import-outside-toplevel
    import gemm_ladder  # pylint: disable=import-outside-toplevel

    aq, wq, sa, sb, _ = fp8_check.inputs(M, N, K, recipe, None, seed=7)
    B = wq.t()
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    want = gemm_ladder.scaled_mm(aq, B, sa, sb, strict=True)  # the checked call (remembered for the others)
    fns = {}
    for name in PATHS:
        if name == "torch":
            scaled_mm = torch._scaled_mm  # pylint: disable=protected-access  (the peer: cuBLASLt's fp8)
            fns[name] = (lambda: scaled_mm(aq, B, sa, sb, out_dtype=torch.bfloat16, out=out),
                         lambda: scaled_mm(aq, B, sa, sb, out_dtype=torch.bfloat16))
        else:
            fns[name] = (lambda: gemm_ladder.scaled_mm(aq, B, sa, sb, out=out, strict=True),
                         lambda: gemm_ladder.scaled_mm(aq, B, sa, sb, strict=True))
    correct = {}
    for name in PATHS[:3]:
        with Path4(name):
            fns[name][0]()  # each key is remembered at its first call (the checked path)
            fns[name][1]()
            out.fill_(float("nan"))
            fns[name][0]()
            fresh = fns[name][1]()
            correct[name] = bool(torch.equal(out, want) and torch.equal(fresh, want))
    samples = {n: {"host_us": [], "host_us_new_d": [], "call_us": [], "call_us_new_d": []} for n in PATHS}
    for r in range(ROUNDS):
        order = PATHS[r % 4:] + PATHS[:r % 4]
        for name in order if r % 2 == 0 else order[::-1]:
            with Path4(name):
                with_out, new_d = fns[name]
                samples[name]["host_us"].append(_host_us(with_out))
                samples[name]["host_us_new_d"].append(_host_us(new_d))
                samples[name]["call_us"].append(_call_us(with_out))
                samples[name]["call_us_new_d"].append(_call_us(new_d))
    times = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    torch_call = times["torch"]["call_us"]
    return {"recipe": recipe, "M": M, "N": N, "K": K, "correct": all(correct.values()), "correct_by_path": correct,
            "tflops": None, "ratio_to_scaled_mm": torch_call / times["native"]["call_us"],
            "peer_ratios": {f"{n}_over_torch": times[n]["call_us"] / torch_call for n in PATHS[:3]},
            "times_us": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("folders", nargs="+", help="folders fp8_pack_check.py prepare --suite made (one recipe each)")
    ap.add_argument("--out", required=True, help="the results JSON")
    args = ap.parse_args(argv)
    why = device.why_no_gpu(index=0)
    if why is not None:
        print(f"fp8_host: no GPU ({why}): run it on the GPU box", file=sys.stderr)
        return 2
    import gemm_ladder  # pylint: disable=import-outside-toplevel
    from gemm_ladder.measure import harness  # pylint: disable=import-outside-toplevel

    start, sampler, rows = time.time(), Sampler(), []
    try:
        for folder in map(Path, args.folders):
            plan = read_json(folder / "fp8_pack.json", "fp8 pack check plan",
                             f"run benchmarks/fp8_pack_check.py prepare {folder} --suite on the build box")
            weights = {(c["N"], c["K"]) for c in plan["cases"]}
            recipe = plan["cases"][0]["recipe"]
            gemm_ladder.use_pack(folder / "pack")
            for M, N, K in (s for s in SHAPES if s[1:] in weights):
                row = time_shape(recipe, M, N, K)
                rows.append(row)
                t = row["times_us"]
                print(f"{recipe} {M}x{N}x{K}: correct {row['correct']}; host us (out / new D) "
                      + "; ".join(f"{n} {t[n]['host_us']:.1f} / {t[n]['host_us_new_d']:.1f}" for n in PATHS)
                      + "; call us "
                      + "; ".join(f"{n} {t[n]['call_us']:.1f} / {t[n]['call_us_new_d']:.1f}" for n in PATHS),
                      flush=True)
    finally:
        sampler.stop()
    check_cli.write_result(args.out, {**check_cli.head(FORMAT, harness, sampler, start), "rows": rows})
    print(f"{sum(r['correct'] for r in rows)} of {len(rows)} rows correct; wrote {args.out}")
    return 0 if rows and all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
