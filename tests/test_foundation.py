"""The foundation: config validation, build -> export -> load, runtime-only loading, the CLI, v4.

CPU tier (CI): everything up to the launch. GPU tier (``gpu``): v4 on random inputs, in a child
process with a timeout.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemm_ladder
from gemm_ladder import ConfigError
from gemm_ladder.core.budget import limits_for
from gemm_ladder.measure import modules

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
        # knobs of the wrong type: refused by the validator with a fix, before anything is traced
        (dict(M=128, N=128, K=64, blk_n=128.0), ["blk_n=128.0 is a float, not an int", "pass blk_n=128"]),
        (dict(M=128, N=128, K=64, blk_n="128"), ["blk_n='128' is a string", "pass blk_n=128 (an int"]),
        (dict(M=128, N=128, K=64, num_warpgroups=True), ["num_warpgroups=True is a bool", "e.g. num_warpgroups=1"]),
        (dict(M=128, N=128, K=64, blk_m=1.5), ["blk_m=1.5 is a float", "pass an int"]),
        (dict(M=128, N=128, K=64, dtype=2), ["dtype=2 is an int, not a string", "dtype='float16'"]),
    ],
)
def test_v4_refuses_bad_config_with_a_fix(kwargs, words):
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config("v4", **kwargs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_config_is_frozen_and_round_trips():
    cfg = gemm_ladder.make_config("v4", 1000, 3000, 520, dtype="bfloat16", blk_n=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.M = 1
    from gemm_ladder.rungs import from_dict

    assert from_dict(cfg.to_dict()) == cfg
    assert cfg.grid_mn == (8, 47) and cfg.k_tiles == 9


def test_unknown_rung_and_missing_arch_form():
    with pytest.raises(ConfigError, match="unknown rung 'v99'"):
        gemm_ladder.make_config("v99", 128, 128, 64)
    from gemm_ladder.rungs import rung_module

    with pytest.raises(ConfigError, match="sm_90a"):
        rung_module("v4", "sm_75")


def test_shared_memory_limit_comes_from_the_arch_table_without_a_gpu():
    lim = limits_for("sm_90a")
    assert lim.smem_per_block == 227 * 1024
    from gemm_ladder.core.budget import check_budget

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
    # 1 KiB of barriers, a 128x64 A and B tile (32 KiB) and the 128x128 output tile (32 KiB)
    assert man["launch"] == {"grid": [8, 24], "threads": 128, "smem_bytes": 66560}
    assert man["so_bytes"] == path.stat().st_size and len(man["so_sha256"]) == 64


def test_build_refuses_a_foreign_prim_func():
    from tvm.script import tirx as T

    @T.prim_func
    def not_a_rung(A: T.Buffer((4,), "float32")):
        A[0] = T.float32(1)

    with pytest.raises(TypeError, match="not made by a gemm_ladder rung"):
        gemm_ladder.build(not_a_rung)


def test_export_carries_a_device_binary_not_source(v4_module):
    from gemm_ladder.compile import sass

    _, path = v4_module
    blob = path.read_bytes()
    assert b"__global__" not in blob and b"extern \"C\"" not in blob
    kinds = [k for k, _ in sass.device_binaries(blob)]
    assert kinds and set(kinds) <= {"cubin", "fatbin"}
    assert sass.sm_of(blob) == "sm_90a"


def test_v4_sass_has_tma_and_wgmma_and_no_spills(v4_module):
    from gemm_ladder.compile import sass

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


DAMAGED_LOAD = r"""
import sys
import gemm_ladder
for path in sys.argv[1:]:
    try:
        gemm_ladder.load(path)
        print("LOADED", path)
    except Exception as err:
        print(type(err).__name__, "|", path, "|", " ".join(str(err).split()))
"""


def _damaged_copies(folder: Path, path: Path) -> dict:
    """Copies of an exported module, each damaged one way: name -> .so path."""
    blob, man = path.read_bytes(), json.loads(Path(str(path) + ".json").read_text())
    text = json.dumps(man)
    cases = {
        "truncated": (blob[: len(blob) // 2], text),
        "changed": (blob[:-1] + bytes([blob[-1] ^ 0xFF]), text),  # same size, other bytes
        "other_manifest": (blob, json.dumps({**man, "so_bytes": man["so_bytes"] + 4096,
                                             "so_sha256": "0" * 64})),
        "empty_manifest": (blob, ""),
        "cut_manifest": (blob, text[: len(text) // 2]),
        "list_manifest": (blob, json.dumps([man])),
        "old_format": (blob, json.dumps({**man, "format": 1})),
        "no_rung": (blob, json.dumps({k: v for k, v in man.items() if k != "rung"})),
    }
    out = {}
    for name, (so, manifest) in cases.items():
        p = folder / f"{name}.so"
        p.write_bytes(so)
        Path(str(p) + ".json").write_text(manifest)
        out[name] = p
    return out


def test_load_refuses_a_damaged_module_before_the_loader_sees_it(tmp_path, v4_module):
    """A truncated .so kills Python inside the dynamic loader: load checks it first. A manifest
    that is damaged, or belongs to another module, gives one clear error naming the file."""
    _, path = v4_module
    damaged = _damaged_copies(tmp_path, path)
    out = subprocess.run([sys.executable, "-c", DAMAGED_LOAD, *map(str, damaged.values())], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]  # the child survived every one
    lines = dict(zip(damaged, out.stdout.strip().splitlines()))
    words = {
        "truncated": ["bytes but its manifest", "cut short", "copy the .so again"],
        "changed": ["sha256 differs", "re-export"],
        "other_manifest": ["bytes but its manifest", "says"],
        "empty_manifest": ["is empty", "re-export"],
        "cut_manifest": ["not valid JSON", "truncated"],
        "list_manifest": ["JSON list", "not the object"],
        "old_format": ["format 1", "re-export"],
        "no_rung": ["field 'rung'"],
    }
    for name, expected in words.items():
        kind, where, message = lines[name].split(" | ")
        assert kind == "ManifestError", lines[name]
        assert Path(where).name == f"{name}.so" and f"{name}.so" in message, lines[name]
        for w in expected:
            assert w in message, (name, w, message)


def test_info_reports_a_damaged_module_and_lists_the_rest(tmp_path, v4_module):
    _, path = v4_module
    good = tmp_path / path.name
    good.write_bytes(path.read_bytes())
    Path(str(good) + ".json").write_text(Path(str(path) + ".json").read_text())
    _damaged_copies(tmp_path, path)
    out = cli("info", str(tmp_path))
    assert out.returncode == 1
    rows = out.stdout.strip().splitlines()[2:]
    assert [r.split()[0] for r in rows] == [good.name]  # the good module, whatever the others are
    assert out.stderr.count("error: ") == 8 and "truncated.so" in out.stderr


RUNTIME_ONLY_CHECK = r"""
import ctypes, sys, os
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the build stub stands in for the driver
import torch, gemm_ladder
from gemm_ladder.serve.runtime import ModuleInputError, ArchMismatchError
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
    from tests.conftest import GPU_ARCH

    from gemm_ladder.compile import toolchain
    from gemm_ladder.serve.pack import pack_runtime

    _, path = v4_module
    site = pack_runtime(tmp_path / "rt")
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    stub = toolchain.stub_driver()
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
    # the CLI runs from the pack alone (what it imports is in the pack)
    where = subprocess.run([sys.executable, "-c", "import gemm_ladder.cli, schedulers; print(schedulers.__file__)"],
                           capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=300)
    assert where.returncode == 0 and where.stdout.startswith(str(site)), where.stderr[-2000:]
    verify = subprocess.run([sys.executable, "-m", "gemm_ladder", "verify", str(path)], capture_output=True,
                            text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=300)
    if GPU_ARCH is None:
        assert verify.returncode == 2 and "needs a CUDA GPU" in verify.stderr, verify.stderr[-2000:]


def test_module_refuses_a_gpu_of_another_arch(monkeypatch, v4_module):
    import torch

    from gemm_ladder.serve.runtime import ArchMismatchError, GemmModule

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


def test_timers_refuse_what_they_cannot_time():
    """An unknown timer, or a watchdog build in a CUDA graph (its launches wait on their record),
    fail before any input is made; the CLI offers the two timers."""
    from gemm_ladder.compile import batch
    from gemm_ladder.measure import harness

    class WatchdogModule:
        M = N = K = 64
        dtype = "float16"
        manifest = {"watchdog": {"seconds": 2}}

    with pytest.raises(ValueError, match="timer='sundial': use one of queued, graph"):
        harness.time_module(WatchdogModule(), timer="sundial")
    with pytest.raises(ValueError, match="cannot be timed in a CUDA graph"):
        harness.time_module(WatchdogModule(), timer="graph")
    with pytest.raises(ValueError, match="timer='wall'"):
        modules.bench([], timer="wall")
    bad = cli("bench", "x.so", "--timer", "sundial")
    assert bad.returncode == 2 and "invalid choice: 'sundial'" in bad.stderr


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


def test_a_corrupt_folder_manifest_blocks_neither_export_nor_info(tmp_path, v4_module):
    """The modules' own manifests are the truth: a damaged folder list is reported and rebuilt."""
    from gemm_ladder.compile import batch

    _, path = v4_module
    for name in ("a.so", "b.so"):
        (tmp_path / name).write_bytes(path.read_bytes())
        (tmp_path / f"{name}.json").write_text(Path(str(path) + ".json").read_text())
    (tmp_path / "manifest.json").write_text('{"modules": [{"file": "a.so"}, ')  # cut short
    out = cli("info", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "manifest.json is unreadable" in out.stderr
    assert [r.split()[0] for r in out.stdout.strip().splitlines()[2:]] == ["a.so", "b.so"]
    # a later export into the folder goes on, and the list is whole again
    new = {"file": "c.so", "status": "built", "rung": "v4"}
    (tmp_path / "c.so").write_bytes(b"")
    man, problems = batch.write_folder_manifest(tmp_path, [new])
    assert any("unreadable" in p for p in problems)
    assert [m["file"] for m in json.loads(man.read_text())["modules"]] == ["a.so", "b.so", "c.so"]
    # entries that name no file, or a file that is gone, are reported and left out
    man.write_text(json.dumps({"modules": [{"file": "a.so"}, {"nofile": 1}, {"file": "gone.so"}, "x"]}))
    entries, problems = batch.read_folder_manifest(tmp_path)
    assert [e["file"] for e in entries] == ["a.so"] and len(problems) == 3


EXPORT_ONE = r"""
import sys
from gemm_ladder.compile import batch
results = [{"file": sys.argv[2], "status": "built", "rung": "v4"}]
open(sys.argv[1] + "/" + sys.argv[2], "wb").close()
for _ in range(20):
    batch.write_folder_manifest(sys.argv[1], results)
"""


def test_exports_into_one_folder_at_once_lose_nothing(tmp_path):
    """Each export merges its modules into the folder list under the folder's lock."""
    procs = [subprocess.Popen([sys.executable, "-c", EXPORT_ONE, str(tmp_path), f"m{i}.so"], cwd=REPO)
             for i in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    listed = sorted(m["file"] for m in json.loads((tmp_path / "manifest.json").read_text())["modules"])
    assert listed == ["m0.so", "m1.so", "m2.so", "m3.so"]
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]  # no temp file left behind


@pytest.mark.parametrize("args, words", [
    (["build", "v4", "--shape", "256x256x64", "--knob", "dtype=bfloat16", "--dtype", "float16"],
     ["--knob dtype=bfloat16 conflicts with --dtype float16"]),
    (["build", "v4", "--shape", "256x256x64", "--knob", "arch=sm_100a", "--arch", "sm_90a"],
     ["--knob arch=sm_100a conflicts with --arch sm_90a"]),
    (["export", "--rungs", "v4", "--knob", "dtype=bfloat16", "--dtypes", "float16"],
     ["--knob dtype=bfloat16 conflicts with --dtypes float16"]),
    (["export", "--rungs", "v4", "--knob", "arch=sm_100a", "--arch", "sm_90a"],
     ["--knob arch=sm_100a conflicts with --arch sm_90a"]),
    (["build", "v5", "--shape", "256x256x64", "--knob", "pipe_depth=4.0"],
     ["pipe_depth=4.0", "neither an int, true/false nor a name"]),
    (["build", "v5", "--shape", "256x256x64", "--knob", "pipe_depth"], ["not name=value"]),
    (["build", "v5", "--shape", "256x256x64", "--knob", "pipe_depth=four"],
     ["pipe_depth='four' is a string, not an int", "pass an int"]),
])
def test_cli_refuses_conflicting_or_unparseable_knobs(args, words, tmp_path):
    out = cli(*args, "--out", str(tmp_path))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in out.stderr, (w, out.stderr)
    assert not list(tmp_path.glob("*.so"))


def test_build_and_export_resolve_dtype_and_arch_alike(monkeypatch, tmp_path):
    """``--knob dtype=`` and ``--knob arch=`` reach the builder as ``--dtype(s)`` and ``--arch`` would,
    in ``build`` and ``export`` alike (what the CLI asks ``batch.build_many`` for, stopped there)."""
    from gemm_ladder.compile import batch
    from gemm_ladder import cli as cli_module

    class Asked(Exception):
        pass

    def build_many(jobs, *args, **kwargs):
        raise Asked([(job.rung, job.knobs) for job in jobs])

    monkeypatch.setattr(batch, "build_many", build_many)
    monkeypatch.setenv("GEMM_LADDER_TUNING_DB", "off")  # no tuned knobs join the asked ones

    def asked(*argv):
        with pytest.raises(Asked) as caught:
            cli_module.main([*argv, "--out", str(tmp_path)])
        return caught.value.args[0]

    knobs = ["--knob", "dtype=bfloat16", "--knob", "arch=sm_100a", "--knob", "blk_n=64"]
    assert asked("build", "v4", "--shape", "128x128x64", *knobs) == [
        ("v4", {"blk_n": 64, "dtype": "bfloat16", "arch": "sm_100a"})]
    exported = asked("export", "--rungs", "v4", *knobs)
    assert exported and {(r, tuple(sorted(k.items()))) for r, k in exported} == {
        ("v4", (("arch", "sm_100a"), ("blk_n", 64), ("dtype", "bfloat16")))}
    plain = asked("export", "--rungs", "v4")
    assert {(k["dtype"], k["arch"]) for _, k in plain} == {("float16", "sm_90a"), ("bfloat16", "sm_90a")}


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


@pytest.mark.parametrize("shape, l2, sets", [
    ((4096, 4096, 4096), 50 * 2**20, 2),     # 96 MiB a set: two spill 50 MiB three times
    ((256, 256, 256), 50 * 2**20, 8),        # a tiny set: capped at 8
    ((8192, 8192, 8192), 50 * 2**20, 1),     # one set is already 384 MiB
])
def test_timers_rotate_through_enough_inputs_to_spill_l2(shape, l2, sets):
    from gemm_ladder.measure import harness

    assert harness.sets_to_spill_l2(*shape, l2) == sets
