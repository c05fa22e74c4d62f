"""The foundation: config validation, build -> export -> load, runtime-only loading, the CLI, v4.

CPU tier (CI): everything up to the launch. GPU tier (``gpu``): v4 on random inputs, in a child
process with a timeout.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.config import limits_for

REPO = Path(__file__).resolve().parents[1]


def run_py(code: str, env=None, cwd=REPO, timeout=300):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(M=0, N=128, K=64), ["M=0", "positive"]),
        (dict(M=128, N=128, K=60), ["K=60", "multiple of 16", "e.g. 64"]),
        (dict(M=128, N=100, K=64), ["N=100", "pad N", "e.g. 104"]),
        (dict(M=128, N=128, K=64, dtype="float32"), ["dtype='float32'", "float16"]),
        (dict(M=128, N=128, K=64, arch="sm_80"), ["sm_80", "sm_90a"]),
        (dict(M=128, N=128, K=64, blk_n=96), ["blk_n=96", "64, 128, 192 or 256"]),
        (dict(M=128, N=128, K=64, blk_m=96), ["blk_m=96", "64, 128, 192, 256"]),
        (dict(M=128, N=128, K=64, pipe_depth=3), ["no knob pipe_depth", "blk_n"]),
        (dict(M=256, N=256, K=64, blk_m=256, blk_n=256), ["512", "registers", "num_warpgroups"]),
        (dict(M=256, N=256, K=64, blk_m=64, num_warpgroups=2), ["blk_m=64", "warpgroup", "blk_m=128"]),
    ],
)
def test_v4_refuses_bad_config_with_a_fix(kwargs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config("v4", **kwargs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_config_is_frozen_and_round_trips():
    cfg = gemm_ladder.make_config("v4", 1000, 3000, 520, dtype="bfloat16", blk_n=64)
    with pytest.raises(Exception):
        cfg.M = 1  # frozen
    from gemm_ladder.rungs import from_dict

    assert from_dict(cfg.to_dict()) == cfg
    assert cfg.grid_mn == (8, 47) and cfg.k_tiles == 9


def test_unknown_rung_and_missing_arch_form():
    with pytest.raises(ConfigError, match="unknown rung 'v10'"):
        gemm_ladder.make_config("v10", 128, 128, 64)
    from gemm_ladder.rungs import rung_module

    with pytest.raises(ConfigError, match="sm_90a"):
        rung_module("v4", "sm_75")


def test_shared_memory_limit_comes_from_the_arch_table_without_a_gpu():
    lim = limits_for("sm_90a")
    assert lim.smem_per_block == 227 * 1024
    from gemm_ladder.config import check_budget

    cfg = gemm_ladder.make_config("v4", 128, 128, 64)
    with pytest.raises(ConfigError, match="shared memory"):
        check_budget(cfg, lim.smem_per_block + 1, lim)


def test_importing_the_package_imports_no_tvm():
    out = run_py("import sys, gemm_ladder; f = gemm_ladder.hgemm_v4; print('tvm' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# -- build and export --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def v4_module(build_dir):
    f = gemm_ladder.hgemm_v4(1000, 3000, 520)
    mod = gemm_ladder.build(f)
    path = mod.export(build_dir / "v4_edge.so")
    return mod, path


def test_prim_func_knows_its_config_and_builds(v4_module):
    mod, path = v4_module
    assert mod.cfg.shape == (1000, 3000, 520) and mod.cfg.rung == "v4"
    man = json.loads(Path(str(path) + ".json").read_text())
    assert man["rung"] == "v4" and man["shape"] == [1000, 3000, 520] and man["arch"] == "sm_90a"
    assert man["tvm_version"] == "0.27.0.post1"
    assert man["compiler"].split()[0] in ("nvrtc", "nvcc")
    assert man["launch"] == {"grid": [8, 24], "threads": 128, "smem_bytes": mod.extra["launch"]["smem_bytes"]}


def test_build_refuses_a_foreign_prim_func():
    from tvm.script import tirx as T

    @T.prim_func
    def not_a_rung(A: T.Buffer((4,), "float32")):
        A[0] = T.float32(1)

    with pytest.raises(TypeError, match="not made by a gemm_ladder rung"):
        gemm_ladder.build(not_a_rung)


def test_export_carries_a_device_binary_not_source(v4_module):
    from gemm_ladder import sass

    _, path = v4_module
    blob = path.read_bytes()
    assert b"__global__" not in blob and b"extern \"C\"" not in blob
    kinds = [k for k, _ in sass.device_binaries(blob)]
    assert kinds and set(kinds) <= {"cubin", "fatbin"}
    assert sass.sm_of(blob) == "sm_90a"


def test_v4_sass_has_tma_and_wgmma_and_no_spills(v4_module):
    from gemm_ladder import sass

    _, path = v4_module
    counts = sass.instruction_counts(sass.disassemble(path.read_bytes()))
    assert counts["UTMALDG"] >= 2 and counts["UTMASTG"] >= 2  # 128 columns = two 64-column boxes
    assert counts["HGMMA"] >= 8
    assert counts["LDL"] == 0 and counts["STL"] == 0
    res = sass.resource_usage(path.read_bytes())
    assert 64 < res.registers <= 255 and res.stack == 0


def test_cuda_source_shows_the_epilogue_fence(v4_module):
    mod, _ = v4_module
    src = mod.cuda_source()
    assert "fence.proxy.async.shared::cta" in src
    assert "mbarrier.arrive.expect_tx" in src and "wgmma.mma_async" in src
    # the TMA store is waited for (v4 stores once per CTA) after it was committed
    assert src.rindex("bulk_wait_group") > src.rindex("bulk_commit_group")


# -- loading -----------------------------------------------------------------------------------
def test_load_needs_the_manifest(tmp_path, v4_module):
    _, path = v4_module
    lonely = tmp_path / "lonely.so"
    lonely.write_bytes(path.read_bytes())
    with pytest.raises(FileNotFoundError, match="manifest"):
        gemm_ladder.load(lonely)


RUNTIME_ONLY_CHECK = r"""
import ctypes, sys, os
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the build stub stands in for the driver
import torch, gemm_ladder
from gemm_ladder.runtime import ModuleInputError, ArchMismatchError
m = gemm_ladder.load(sys.argv[2])
import tvm
assert tvm.base._RUNTIME_ONLY, "compiler library was loaded"
assert "tvm_compiler" not in tvm.base._LOADED_LIBS
assert not any(k.startswith("tvm.relax") for k in sys.modules)
assert "layouts" not in sys.modules and "schedulers" not in sys.modules
errs = []
A = torch.zeros((1000, 520), dtype=torch.float16); B = torch.zeros((3000, 520), dtype=torch.float16)
for args in [(A.float(), B), (A, B[:, :512]), (A, B), (A.t().contiguous().t(), B)]:
    try:
        m(*args)
    except ModuleInputError as e:
        errs.append(str(e))
print("\n".join(errs))
"""


def test_runtime_only_loading(tmp_path, v4_module):
    """The exported module loads with a runtime-only TVM and refuses bad inputs before launch."""
    from gemm_ladder import toolchain
    from gemm_ladder.pack import pack_runtime

    _, path = v4_module
    site = pack_runtime(tmp_path / "rt")
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    stub = toolchain._stub_driver()
    env = {"PYTHONPATH": os.pathsep.join([str(site)] + [p for p in sys.path if p.endswith("site-packages")]),
           "TVM_USE_RUNTIME_LIB": "1"}
    out = subprocess.run([sys.executable, "-c", RUNTIME_ONLY_CHECK, str(stub), str(path)],
                         capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "dtype torch.float32" in lines[0] and "float16" in lines[0]
    assert "shape (3000, 512)" in lines[1] and "(3000, 520)" in lines[1]
    assert "is on cpu" in lines[2] and ".cuda()" in lines[2]
    assert "not contiguous" in lines[3]


def test_module_refuses_a_gpu_of_another_arch(monkeypatch, v4_module):
    import torch

    from gemm_ladder.runtime import ArchMismatchError, GemmModule

    _, path = v4_module
    man = json.loads(Path(str(path) + ".json").read_text())
    mod = GemmModule(path, man, rt_module=None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (10, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: "NVIDIA B200")
    with pytest.raises(ArchMismatchError, match="built for sm_90a.*is sm_100a.*arch='sm_100a'"):
        mod.check_device(torch.device("cuda", 0))


# -- the CLI -----------------------------------------------------------------------------------
def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "gemm_ladder", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def test_cli_build_info_and_refusals(tmp_path):
    out = cli("build", "v4", "--shape", "256x512x128", "--dtype", "bfloat16", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    so = Path(out.stdout.strip().splitlines()[-1])
    assert so.exists() and so.name == "v4_256x512x128_bfloat16_sm_90a_m128n128k64w1.so"
    info = cli("info", str(tmp_path))
    assert info.returncode == 0, info.stderr
    header, _, row = info.stdout.strip().splitlines()[:3]
    cells = dict(zip(header.split(), row.split()))
    assert cells["grid"] == "2x4" and cells["threads"] == "128" and int(cells["HGMMA"]) > 0
    bad = cli("build", "v4", "--shape", "256x512x100", "--out", str(tmp_path))
    assert bad.returncode == 2 and "K=100" in bad.stderr
    bad = cli("build", "v4", "--shape", "256x512", "--out", str(tmp_path))
    assert bad.returncode == 2 and "MxNxK" in bad.stderr


@pytest.mark.skipif(os.environ.get("CUDA_VISIBLE_DEVICES") is not None, reason="GPU may be present")
def test_cli_verify_without_a_gpu_says_so(tmp_path, v4_module):
    from tests.conftest import GPU_ARCH

    if GPU_ARCH is not None:
        pytest.skip("a GPU is present")
    out = cli("verify", str(v4_module[1]))
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr


def test_cli_export_writes_a_folder_manifest(tmp_path):
    out = cli("export", "--rungs", "v4", "--shapes", "128x128x64,256x128x64", "--dtypes", "float16",
              "--out", str(tmp_path), "--jobs", "2")
    assert out.returncode == 0, out.stderr
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(m["file"] for m in man["modules"]) == [
        "v4_128x128x64_float16_sm_90a_m128n128k64w1.so", "v4_256x128x64_float16_sm_90a_m128n128k64w1.so"]
    assert all((tmp_path / m["file"]).exists() for m in man["modules"])


# -- GPU tier ---------------------------------------------------------------------------------
from tests.gpu_cases import Case  # noqa: E402

V4_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192), (1000, 3000, 520),
             (128, 128, 64), (64, 64, 64), (256, 256, 128)]
CASES = [Case("v4", *s, dtype=d) for s in V4_SHAPES for d in ("float16", "bfloat16")]
CASES += [Case("v4", 1000, 3000, 520, blk_m=256, num_warpgroups=2), Case("v4", 512, 512, 256, blk_n=64)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_v4_is_correct_on_the_gpu(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result


ARCH_CASES = [Case("v4", 256, 256, 128, arch="sm_100a")]
# v7-v9 (persistent, v8/v9 launch clusters): the refusal must come before any launch attempt
ARCH_CASES += [Case(r, 1000, 3000, 520, arch="sm_100a") for r in ("v7", "v8", "v9")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ARCH_CASES, ids=str)
def test_a_blackwell_module_refuses_a_hopper_gpu(case, gpu_result):
    """Loading works; the call stops before launch with the arch error, and nothing crashes."""
    from tests.conftest import GPU_ARCH

    if GPU_ARCH == "sm_100a":
        pytest.skip("this GPU is a Blackwell")
    assert gpu_result["status"] == "error", gpu_result
    assert "ArchMismatchError" in gpu_result["detail"] and "built for sm_100a" in gpu_result["detail"]
