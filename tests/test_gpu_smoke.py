"""The GPU smoke tier: every GPU-only command and library entry on one tiny shape (``gpu``).

See ``tests/gpu_smoke.py`` for what is built and how it travels. Each entry runs as a user runs
it, in its own process with a deadline (a kernel that deadlocks fails its test, it does not hang
the run), and each test asserts what the entry promises: every module checked correct, a bench
or suite result with its ratio to cuBLAS, a tuning report with a best candidate, the front door's
answer against torch's. Run it on the device after any change to host code.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import GPU_ARCH
from .gpu_smoke import INDEX, REPO, prepare

pytestmark = pytest.mark.gpu
SMOKE_DIR = os.environ.get("GEMM_LADDER_SMOKE")
DEADLINE = 420  # seconds for one command: a hang fails the test, it does not hang the run


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if SMOKE_DIR:
        root = Path(SMOKE_DIR).resolve()  # the commands run in their own temporary folders
        if not (root / INDEX).is_file():
            pytest.fail(f"{root} has no {INDEX}: build it with python -m tests.gpu_smoke {root} on a build box")
    elif GPU_ARCH is None:
        pytest.skip("no CUDA GPU here: the smoke tier runs on an H100/H200")
    else:
        root = prepare(tmp_path_factory.mktemp("smoke"))
    index = json.loads((root / INDEX).read_text())
    return {k: (root / v if k in ("ladder", "tune", "pack") else v) for k, v in index.items()}


def _run(args, cwd, env=None, timeout=DEADLINE):
    out = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                         env={**os.environ, "GEMM_LADDER_BUILD": "0", **(env or {})})
    print(out.stdout[-4000:], out.stderr[-4000:], sep="\n")
    return out


def _gemm_ladder(*args, cwd, env=None):
    return _run([sys.executable, "-m", "gemm_ladder", *map(str, args)], cwd, env)


def _modules(folder: Path) -> list[Path]:
    mods = sorted(folder.glob("*.so"))
    assert mods, f"no modules in {folder}"
    return mods


def test_verify(smoke, tmp_path):
    out = _gemm_ladder("verify", smoke["ladder"], "--seeds", "0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    mods = _modules(smoke["ladder"])
    rows = [line for line in out.stdout.splitlines() if any(m.name in line for m in mods)]
    assert len(rows) == len(mods) and all(" ok " in f" {r} " for r in rows), out.stdout


def test_bench(smoke, tmp_path):
    result = tmp_path / "bench.json"
    out = _gemm_ladder("bench", smoke["ladder"], "--reps", "5", "--out", result, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(result.read_text())
    assert doc["gpu"]["name"] and len(doc["results"]) == len(_modules(smoke["ladder"]))
    for r in doc["results"]:
        assert r["status"] == "ok" and r["tflops"] > 0 and r["ratio_to_cublas"] > 0, r


def test_suite_run(smoke, tmp_path):
    result = tmp_path / "suite.json"
    out = _gemm_ladder("suite", "run", "--pack", smoke["pack"], "--only", smoke["suite_case"], "--dtypes",
                       "float16", "--reps", "6", "--out", result, cwd=tmp_path)
    doc = json.loads(result.read_text())
    assert out.returncode == 0, (out.stderr, doc["results"])
    assert doc["summary"]["cases"] == 1 and doc["summary"]["ok"] == 1, doc["summary"]
    row = doc["results"][0]
    assert row["id"] == smoke["suite_case"] and row["check"]["ok"] and row["ratio_to_cublas"] > 0
    assert row["gbps"] > 0 and row["host_us"] > 0


def test_every_model_case(smoke, tmp_path):
    """The every-model suite's job on one case its pack serves: checked, then timed as a call and
    as a kernel in CUDA graphs."""
    out = _run([sys.executable, "-m", "gemm_ladder.measure.isolate", "gemm_ladder.measure.every_model:time_case", smoke["suite_case"],
                "--args", "6"], cwd=tmp_path, env={"GEMM_LADDER_PACK": str(smoke["pack"])})
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()
            if line.startswith("GEMM_LADDER_RESULT ")]
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["check"]["ok"], rows
    assert rows[0]["kernel_ratio"] > 0 and rows[0]["call_ratio"] > 0 and rows[0]["graph_calls"] >= 1


def test_tune_measure(smoke, tmp_path):
    report = tmp_path / "measurements.json"
    out = _gemm_ladder("tune", "--measure", smoke["tune"], "--reps", "5", "--confirm", "2",
                       "--measurements-out", report, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(report.read_text())
    ok = [r for r in doc["results"] if r["status"] == "ok"]
    assert len(ok) == len(doc["results"]) >= 2 and doc["best"] is not None


def test_rounds_job(smoke, tmp_path):
    mods = [m for m in _modules(smoke["tune"]) if "watchdog" not in m.name][:2]
    out = _run([sys.executable, "-m", "gemm_ladder.measure.isolate", "rounds", *map(str, mods), "--args", "3,4,0.2"],
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()
            if line.startswith("GEMM_LADDER_RESULT ")]
    assert len(rows) == len(mods)
    for r in rows:
        assert r["status"] == "ok" and r["ms"] > 0 and r["ratio_to_cublas"] > 0, r


FRONT = """
import torch, gemm_ladder, gemm_ladder.serve.ops
from gemm_ladder.serve.runtime import ModuleInputError
torch.manual_seed(0)
for shape in {shapes!r}:
    M, N, K = map(int, shape.split("x"))
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    W = torch.randn(N, K, device="cuda", dtype=torch.float16) / K ** 0.5
    ref = (A.double() @ W.double().T)
    for name, fn in (("matmul", lambda: gemm_ladder.matmul(A, W)),
                     ("out=", lambda: gemm_ladder.matmul(A, W, out=torch.full((M, N), float("nan"), device="cuda",
                                                                            dtype=torch.float16))),
                     ("op", lambda: torch.ops.gemm_ladder.mm(A, W))):
        D = fn()
        torch.cuda.synchronize()
        err = ((D.double() - ref).norm() / ref.norm()).item()
        theirs = (((A @ W.T).double() - ref).norm() / ref.norm()).item()
        assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, name, err, theirs)
        print("SMOKE", shape, name, "rel_err", err, "cublas", theirs)
# an out that is A itself, and an input that requires grad, are refused on the GPU too
A = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
W = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for bad in (lambda: gemm_ladder.matmul(A, W, out=A), lambda: gemm_ladder.matmul(A.requires_grad_(), W)):
    try:
        bad()
    except (ModuleInputError, RuntimeError, ValueError, TypeError) as err:
        print("SMOKE refused:", str(err).splitlines()[0])
    else:
        raise AssertionError("a call that must be refused ran")
# a layer no pack serves: torch's matmul computes it, with one warning, also in a compiled model
# replayed from a CUDA graph (the other layer comes from the pack)
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    X = torch.randn(16, 4096, device="cuda", dtype=torch.float16)
    W2 = torch.randn(1024, 4096, device="cuda", dtype=torch.float16) / 64
    W1 = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64
    f = torch.compile(lambda x: torch.ops.gemm_ladder.mm(torch.ops.gemm_ladder.mm(x, W1), W2), fullgraph=True)
    want = (X.double() @ W1.double().T) @ W2.double().T
    got = f(X)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = f(X)
    g.replay()
    torch.cuda.synchronize()
    for D in (got, static):
        err = ((D.double() - want).norm() / want.norm()).item()
        assert err < 5e-3, err
fell = [w for w in caught if w.category.__name__ == "KernelFallbackWarning"]
assert len(fell) == 1 and "M=16 N=1024 K=4096" in str(fell[0].message), [str(w.message) for w in caught]
print("SMOKE fallback:", str(fell[0].message)[:160])
print("SMOKE done")
"""


def test_matmul_and_op(smoke, tmp_path):
    script = tmp_path / "front.py"
    script.write_text(textwrap.dedent(FRONT.format(shapes=smoke["front_shapes"])))
    out = _run([sys.executable, str(script)], cwd=tmp_path, env={"GEMM_LADDER_PACK": str(smoke["pack"]),
                                                                 "PYTHONPATH": os.pathsep.join(
                                                                     filter(None, [os.environ.get("PYTHONPATH"),
                                                                                   str(REPO)]))})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE refused:") == 2 and "SMOKE done" in out.stdout
