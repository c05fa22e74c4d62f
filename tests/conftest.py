"""Shared fixtures: a build folder per session, and the GPU tier's skip rule.

GPU tests are marked ``gpu`` and skip themselves where torch sees no CUDA GPU (CI, build
boxes). They never run a kernel in the test process: every launch goes through
``gemm_ladder.isolate.run_isolated`` (a child process with a timeout), so a deadlocked kernel
fails its test instead of hanging the run.
"""

import pytest


def _gpu_arch():
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from gemm_ladder.config import arch_of_capability

        return arch_of_capability(*torch.cuda.get_device_capability(0))
    except Exception:  # pylint: disable=broad-except
        return None


GPU_ARCH = _gpu_arch()


def pytest_collection_modifyitems(config, items):
    if GPU_ARCH is not None:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here: the gpu tier runs on an H100/H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")
