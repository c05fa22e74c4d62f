"""The device compiler: NVRTC from the wheels by default, nvcc from the PATH on request."""

import os
import shutil
import subprocess
import sys

import pytest

from gemm_ladder.compile import toolchain

BUILD_WITH = r"""
import sys, gemm_ladder
from gemm_ladder.compile import sass
mod = gemm_ladder.build("v4", 256, 256, 128)
blob = open(mod.export(sys.argv[1]), "rb").read()
print(mod.compiler.name, sass.sm_of(blob), sass.instruction_counts(sass.disassemble(blob))["HGMMA"] > 0)
"""


def test_default_compiler_is_nvrtc_from_the_wheels(monkeypatch):
    monkeypatch.delenv("GEMM_LADDER_COMPILER", raising=False)
    c = toolchain.choose_compiler()
    assert c.name == "nvrtc" and c.version.startswith("13.")
    assert os.path.exists(os.path.join(c.cuda_path, "include", "cuda_runtime.h"))


def test_a_bad_compiler_choice_says_what_works(monkeypatch):
    monkeypatch.setenv("GEMM_LADDER_COMPILER", "clang")
    with pytest.raises(toolchain.ToolchainError, match="'nvrtc' or 'nvcc'"):
        toolchain.choose_compiler()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_fallback_builds_a_binary(tmp_path):
    env = dict(os.environ, GEMM_LADDER_COMPILER="nvcc")
    out = subprocess.run([sys.executable, "-c", BUILD_WITH, str(tmp_path / "v4.so")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["nvcc", "sm_90a", "True"]
