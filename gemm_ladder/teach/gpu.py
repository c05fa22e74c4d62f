"""The tutorials' GPU cells: whether there is a GPU of the arch, and check-and-time in a child process."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..core import device, files
from ..measure import isolate


def gpu_here(arch: str = "sm_90a") -> bool:
    """Whether torch sees a CUDA GPU of ``arch`` (the tutorials' GPU cells run only then)."""
    return device.present(arch)


def no_gpu_message(arch: str = "sm_90a", committed: bool = True) -> str:
    """What a tutorial prints instead of checking and timing."""
    return (f"No {arch} GPU here ({device.why_no_gpu(arch) or 'none'}): skipping the check and the timing."
            + (" The committed measurements (benchmarks/results/*.json) follow." if committed else ""))


def check_and_time(built, reps: int = 50, seeds=(0, 1), timeout: float = 300.0, folder=None,
                   strict: bool = True) -> dict:
    """Export ``built``, check it on random inputs and time it against cuBLAS, each in a child
    process (``isolate.run_isolated``); print one line per job and return both results.
    ``strict``: a wrong, crashing or hanging kernel raises AssertionError (the notebook stops)."""
    folder = Path(folder or tempfile.mkdtemp(prefix="gemm_ladder_teach_"))
    path = built.export(folder / f"{files.module_stem(built.cfg.tag())}.so")
    check = isolate.run_isolated("check", path, *seeds, timeout=timeout)
    print(f"check {built.cfg.tag()}: {check['status']}"
          + (f"  rel_err {check['rel_err']:.2e} (cuBLAS {check['torch_rel_err']:.2e})" if "rel_err" in check else "")
          + (f"  {check.get('detail', '')}" if check.get("detail") else ""))
    if strict and check["status"] != "ok":
        raise AssertionError(f"{built.cfg.tag()} failed its check on this GPU: {check}")
    timed = {"status": "skipped", "detail": "the check failed"}
    if check["status"] == "ok":
        timed = isolate.run_isolated("time", path, reps, timeout=timeout)
        if timed["status"] == "ok":
            print(f"time  {built.cfg.tag()}: {timed['ms']:.3f} ms  {timed['tflops']:.1f} TFLOPS  "
                  f"cuBLAS {timed['cublas_tflops']:.1f} TFLOPS  ratio {timed['ratio_to_cublas']:.3f}")
        else:
            print(f"time  {built.cfg.tag()}: {timed['status']} {timed.get('detail', '')}")
            if strict:
                raise AssertionError(f"{built.cfg.tag()} could not be timed on this GPU: {timed}")
    return {"check": check, "time": timed}
