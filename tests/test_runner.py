"""The C++ runner builds against the installed TVM runtime and refuses clearly without a driver."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("cmake and a C++ compiler are needed to build the runner")
    out = tmp_path_factory.mktemp("runner")
    cfg = subprocess.run(["cmake", "-S", str(REPO), "-B", str(out), f"-DPython3_EXECUTABLE={sys.executable}"],
                         capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout[-2000:] + cfg.stderr[-2000:]
    b = subprocess.run(["cmake", "--build", str(out), "-j", "2"], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-2000:]
    return out / "gemm_runner"


def test_runner_builds_and_needs_a_manifest(runner, tmp_path):
    assert runner.exists()
    lonely = tmp_path / "x.so"
    lonely.write_bytes(b"")
    out = subprocess.run([str(runner), str(lonely)], capture_output=True, text=True)
    assert out.returncode == 2 and "x.so.json is missing" in out.stderr


def test_runner_usage(runner):
    out = subprocess.run([str(runner)], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr


def test_runner_without_a_driver_says_what_is_missing(runner, tmp_path):
    import gemm_ladder

    from tests.conftest import GPU_ARCH

    if GPU_ARCH is not None:
        pytest.skip("a GPU driver is present")
    path = gemm_ladder.build("v4", 128, 128, 64).export(tmp_path / "v4.so")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([str(runner), str(path)], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "libtvm_runtime_cuda.so" in out.stderr
