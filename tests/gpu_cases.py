"""GPU-tier cases: one (rung, shape, knobs) each, checked in one batch per session.

A GPU test module lists its cases and one parametrized test::

    CASES = [Case("v4", 4096, 4096, 4096, dtype="float16"), ...]

    @pytest.mark.gpu
    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_correct(case, gpu_result):
        assert gpu_result["status"] == "ok", gpu_result

The conftest gathers every case of the session, gets a module for each, and checks them all in
one child process with a per-module deadline (``gemm_ladder.measure.isolate.run_batch``): torch and TVM
load once, and a deadlocked kernel costs its own deadline only.

Where the modules come from:
- a box with TVM's compiler builds and exports them (into the session's build folder);
- ``GEMM_LADDER_PREBUILT=DIR`` (a GPU box with the runtime only) loads them from ``DIR``;
- ``GEMM_LADDER_GPU_EXPORT=DIR pytest -m gpu`` on a build box exports every case into ``DIR``
  (with ``cases.json``) and skips the run: carry ``DIR`` to the GPU box.
"""

import json


class Case(tuple):
    def __new__(cls, rung, M, N, K, **knobs):
        return super().__new__(cls, (rung, M, N, K, tuple(sorted(knobs.items()))))

    @property
    def key(self) -> str:
        rung, M, N, K, knobs = self
        return json.dumps([rung, M, N, K, dict(knobs)], sort_keys=True)

    def build_args(self):
        rung, M, N, K, knobs = self
        return rung, M, N, K, dict(knobs)

    def __str__(self):
        rung, M, N, K, knobs = self
        extra = ",".join(f"{k}={v}" for k, v in knobs)
        return f"{rung}-{M}x{N}x{K}" + (f"-{extra}" if extra else "")
