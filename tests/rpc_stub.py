"""A tuning RPC server for the CPU tests: ``gemm_ladder.tune.serve``'s server (TVM's, with the
measure function) whose measure step reads stand-in modules instead of timing kernels.

    python -m tests.rpc_stub --tracker 127.0.0.1:PORT --key KEY [--port P]

A stand-in module is a text file (with a real ``.so.json`` manifest: size and sha256 are
checked after the upload, as ``runtime.load`` does) whose first word says what measuring it
does:

- ``ok T``: correct, T TFLOPS (cuBLAS 600);
- ``wrong``: a wrong result;
- ``crash`` / ``hang``: the kernel crashes / deadlocks, in a watched child of
  ``gemm_ladder.measure.isolate`` (its ``selftest`` job): recorded as ``crash`` / ``timeout``;
- ``slow DIR``: the first time, writes ``DIR/slow.pgid`` (this server's process group) and
  waits to be killed; once that file exists, ``ok 100``;
- ``server-hang``: the server itself stops answering (the session timeout ends it);
- ``lie``: claims a speed no GPU reaches;
- ``garbage``: replies something that is not a result.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gemm_ladder.measure import isolate
from gemm_ladder.core.manifest import ManifestError, check_file, read_manifest
from gemm_ladder.tune import serve

GPU = {"name": "Stand-in GPU", "sm_count": 132, "sm_clock_mhz_now": "0 MHz"}
STARTUP_SECONDS = 5.0  # the watched child's start (python -m gemm_ladder.measure.isolate, no torch)


def _timed(tflops: float) -> dict:
    ms = 1.0 / tflops
    return {"status": "ok", "ms": ms, "tflops": tflops, "cublas_ms": 1.0 / 600.0, "cublas_tflops": 600.0,
            "ratio_to_cublas": tflops / 600.0, "rel_err": 1e-4}


def _one(path: Path, timeout: float) -> dict:
    try:
        check_file(path, read_manifest(path))
    except (OSError, ManifestError) as err:
        return {"status": "error", "detail": str(err)}
    word, *rest = path.read_text().split() or ["?"]
    if word == "ok":
        return _timed(float(rest[0]))
    if word == "wrong":
        return {"status": "wrong", "detail": "4096 bad elements"}
    if word in ("crash", "hang"):
        return isolate.run_batch("selftest", [word], timeout=timeout)[0]
    if word == "slow":
        marker = Path(rest[0]) / "slow.pgid"
        if marker.exists():
            return _timed(100.0)
        marker.write_text(str(os.getpgid(0)))
        time.sleep(600)
    if word == "server-hang":
        time.sleep(3600)
    if word == "lie":
        return _timed(5000.0)
    if word == "garbage":
        return {"status": "fast", "tflops": "lots"}
    return {"status": "error", "detail": f"stand-in {word!r} is not one this stub knows"}


def measure(paths, reps, timeout):
    del reps
    return [_one(Path(p), timeout) for p in paths]


if __name__ == "__main__":
    isolate.STARTUP_SECONDS = STARTUP_SECONDS
    sys.exit(serve.server_main(sys.argv[1:], measure=measure, gpu=GPU))
