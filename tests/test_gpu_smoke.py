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
    return {"root": root, **{k: (root / v if k in ("ladder", "tune", "pack") else v) for k, v in index.items()}}


def _run(args, cwd, env=None, timeout=DEADLINE):
    out = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                         env={**os.environ, "GEMM_LADDER_BUILD": "0", **(env or {})})
    print(out.stdout[-4000:], out.stderr[-4000:], sep="\n")
    return out


def _gemm_ladder(*args, cwd, env=None):
    return _run([sys.executable, "-m", "gemm_ladder", *map(str, args)], cwd, env)


def _script(tmp_path, name: str, text: str, pack, strict: bool):
    """Run ``text`` (a Python script, dedented) as a user's program on ``pack`` (strict: no torch
    fallback), with this repo importable."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    env = {"GEMM_LADDER_PACK": str(pack), "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                                                    str(REPO)]))}
    if strict:
        env["GEMM_LADDER_STRICT"] = "1"
    return _run([sys.executable, str(script)], cwd=tmp_path, env=env)


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


def test_tune_measure_fp8(smoke, tmp_path):
    """scaled_mm's fp8 kernel tuned, each recipe's folder: every candidate checked against the float64 product
    of the dequantized inputs and timed against torch._scaled_mm on the same fp8 inputs (the second pass too:
    the rounds job), then merged into a database as an entry of its operand spec, past the 16-bit peak's
    bound where it is faster."""
    tdb = tmp_path / "tuning_db.json"
    for recipe, folder in smoke["tune_fp8"].items():
        report = tmp_path / f"measurements_{recipe}.json"
        out = _gemm_ladder("tune", "--measure", smoke["root"] / folder, "--reps", "5",
                           "--confirm", "2", "--measurements-out", report, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        doc = json.loads(report.read_text())
        assert "scales_" + recipe in doc["spec"]
        ok = [r for r in doc["results"] if r["status"] == "ok"]
        assert len(ok) == len(doc["results"]) >= 2, doc["results"]
        assert all(r["cublas_path"].startswith("torch._scaled_mm") and r["rel_err"] < 0.02 for r in ok), ok
        assert sum(r.get("confirmed") is True for r in ok) == 2 and doc["best"]["confirmed"] is True
        merged = _gemm_ladder("tune", "--merge", report, "--db", tdb, cwd=tmp_path)
        assert merged.returncode == 0, merged.stderr
    entries = json.loads(tdb.read_text())["entries"]
    assert sorted(e["spec"].rpartition("scales_")[2] for e in entries) == sorted(smoke["tune_fp8"])
    shown = _gemm_ladder("tune", "--show", "--db", tdb, cwd=tmp_path)
    assert shown.returncode == 0 and "block fp8" in shown.stdout and "tensor fp8" in shown.stdout


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
    out = _script(tmp_path, "front.py", FRONT.format(shapes=smoke["front_shapes"]), smoke["pack"], strict=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE refused:") == 2 and "SMOKE done" in out.stdout


SPLIT = """
import contextlib, io, torch, gemm_ladder
from gemm_ladder.serve import front
torch.manual_seed(0)
for shape in {shapes!r}:
    M, N, K = map(int, shape.split("x"))
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    W = torch.randn(N, K, device="cuda", dtype=torch.float16) / K ** 0.5
    ref = lambda: A.double() @ W.double().T
    theirs = (((A @ W.T).double() - ref()).norm() / ref().norm()).item()

    def check(D, name):
        torch.cuda.synchronize()
        err = ((D.double() - ref()).norm() / ref().norm()).item()
        assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, name, err, theirs)
        print("SMOKE split", shape, name, "rel_err", err, "cublas", theirs)

    poisoned = lambda: torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    check(gemm_ladder.matmul(A, W, strict=True), "matmul")
    for _ in range(2):  # the fast path's launch, into a fresh and into the caller's D
        check(gemm_ladder.matmul(A, W, strict=True), "again")
        check(gemm_ladder.matmul(A, W, out=poisoned(), strict=True), "again out=")
    route = front.route_of(M, N, K, strict=True)  # a module of the pack (first use picks among them)
    assert route.rung in ("v9", "v11") and route.source == "kernel pack", route.lines
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        gemm_ladder.matmul(A, W, explain=True, strict=True)
    assert "columns from B as it lies" in said.getvalue() and "source: kernel pack" in said.getvalue(), said.getvalue()
    # in a CUDA graph (ours: no weight copy is made on a replay), replayed after A and W were
    # written in place: the graph reads the weight as it is now
    out = poisoned()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm_ladder.matmul(A, W, out=out, strict=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemm_ladder.matmul(A, W, out=out, strict=True)
    for step in range(2):
        A.copy_(torch.randn_like(A))
        W.mul_(-1)
        out.fill_(float("nan"))
        g.replay()
        check(out, f"graph replay {{step}}")
    # repeated calls without strict= (GEMM_LADDER_STRICT=1 keeps ours): the fast path's launch, which
    # replays the kernel and torch's matmul as one CUDA graph per weight on a kept copy of A: a new A
    # each call, two weights in turn, one of them written in place after its graph was captured
    W2 = torch.randn(N, K, device="cuda", dtype=torch.float16) / K ** 0.5
    for step in range(3):
        A = torch.randn(M, K, device="cuda", dtype=torch.float16)
        if step == 2:
            W.mul_(-1)
        for weight, name in ((W, "W"), (W2, "W2")):
            want = A.double() @ weight.double().T
            theirs = (((A @ weight.T).double() - want).norm() / want.norm()).item()
            for D in (gemm_ladder.matmul(A, weight), gemm_ladder.matmul(A, weight, out=poisoned())):
                torch.cuda.synchronize()
                err = ((D.double() - want).norm() / want.norm()).item()
                assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, name, step, err, theirs)
    launches = [hit[1] for hit in front._FAST.values() if isinstance(hit[1], front.PaddedLaunch)]
    graphs = [g for launch in launches for kept in launch.scratch.values() for g in kept[4].values()]
    assert len(graphs) >= 2 and all(g[2] is not None for g in graphs), graphs
    print("SMOKE split graphs", shape, len(graphs))
    print("SMOKE split route", shape, route.lines[0])
print("SMOKE split done")
"""


def test_matmul_with_a_split_n(smoke, tmp_path):
    """N = 1001 with K a multiple of 8: the pack's modules on the weight's first 1000 rows as they
    lie and torch's matmul on the last (strict: ours must serve), eager, through the fast path (its
    CUDA graph per weight, two weights in turn, one written in place), and in a CUDA graph replayed
    after the weight was written in place, against an fp64 reference with the output poisoned first."""
    out = _script(tmp_path, "split.py", SPLIT.format(shapes=smoke["split_shapes"]), smoke["pack"], strict=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE split route") == len(smoke["split_shapes"]) and "SMOKE split done" in out.stdout
    assert out.stdout.count("SMOKE split graphs") == len(smoke["split_shapes"]), out.stdout


BIAS = """
import torch, gemm_ladder, gemm_ladder.serve.ops
from gemm_ladder.serve import front
from gemm_ladder.core.spec import GemmSpec
torch.manual_seed(0)
for shape in {shapes!r}:
    M, N, K = map(int, shape.split("x"))
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    W = torch.randn(N, K, device="cuda", dtype=torch.float16) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=torch.float16)
    ref = A.double() @ W.double().T + b.double()
    theirs = ((torch.nn.functional.linear(A, W, b).double() - ref).norm() / ref.norm()).item()
    for name, fn in (("matmul", lambda: gemm_ladder.matmul(A, W, bias=b, strict=True)),
                     ("out=", lambda: gemm_ladder.matmul(A, W, bias=b, strict=True, out=torch.full(
                         (M, N), float("nan"), device="cuda", dtype=torch.float16))),
                     ("op", lambda: torch.ops.gemm_ladder.mm(A, W, b))):
        D = fn()
        torch.cuda.synchronize()
        err = ((D.double() - ref).norm() / ref.norm()).item()
        worst = ((D.double() - ref).abs().max()).item()
        assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, name, err, theirs)
        print("SMOKE bias", shape, name, "rel_err", err, "max_abs", worst, "F.linear", theirs)
    # the bias reached the kernel, not a silent torch fallback: the route is a bias module of the pack (v9's,
    # swap AB's at M = 16 and 37, or the small-M split's v10 at M = 100)
    route = front.route_of(M, N, K, spec=GemmSpec.with_bias())  # the one the calls took (remembered)
    assert route.rung in ("v9", "v10", "v11") and route.source == "kernel pack", (route.rung, route.source, route.lines)
    print("SMOKE bias route", shape, route.lines[0], "|", route.lines[2])
# the op's backward: dbias is the sum of dD over the rows (A and W want none: their products' K = 38
# is a shape the pack does not hold, and strict mode would refuse it)
A = torch.randn(2, 19, 4096, device="cuda", dtype=torch.float16)
W = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64
b = torch.randn(4096, device="cuda", dtype=torch.float16, requires_grad=True)
g = torch.randn(2, 19, 4096, device="cuda", dtype=torch.float16)
torch.ops.gemm_ladder.mm(A, W, b).backward(g)
torch.testing.assert_close(b.grad.float(), g.float().sum((0, 1)), rtol=1e-2, atol=1e-1)
# a bias that does not fit is refused on the GPU too
try:
    gemm_ladder.matmul(A, W, bias=b.detach()[:100])
except ValueError as err:
    print("SMOKE bias refused:", str(err).splitlines()[0])
else:
    raise AssertionError("a bias of the wrong length ran")
print("SMOKE bias done")
"""


def test_matmul_with_a_bias(smoke, tmp_path):
    """``matmul(A, W, bias=b)`` and ``mm(A, W, b)`` on the pack's bias modules (v9, v11 at M = 16, 37 and 333, v10 at 100; strict: no
    torch fallback), against torch's fp64 reference with the output poisoned first; the op's bias
    gradient."""
    out = _script(tmp_path, "bias.py", BIAS.format(shapes=smoke["bias_shapes"]), smoke["pack"], strict=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE bias route") == len(smoke["bias_shapes"]) and "SMOKE bias done" in out.stdout


def test_verify_checks_the_bias_modules(smoke, tmp_path):
    """``verify`` on the pack's bias modules: the harness adds a random bias (their spec says so) and
    checks each at its M and, M being a runtime value, at M = 1, 7, 64, 1000, 8191 (v9's, swap AB's and the
    small-M split's)."""
    mods = sorted(smoke["pack"].glob("v*_bias_float16.so"))
    assert {m.name.split("_")[0] for m in mods} == {"v9", "v10", "v11"}, mods
    assert mods, f"no bias module in {smoke['pack']}"
    out = _gemm_ladder("verify", *mods, "--seeds", "0", cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    rows = [line for line in out.stdout.splitlines() if any(m.name in line for m in mods)]
    assert len(rows) == len(mods) and all(" ok " in f" {r} " for r in rows), out.stdout


def test_the_cpp_runner_takes_a_bias_module(smoke, tmp_path):
    """The C++ runner (``build/runner``, carried from the build box) runs a bias module of the
    pack: the spec in its manifest makes it pass a bias after the launch scalars and add it to its
    reference."""
    runner = REPO / "build" / "runner" / "gemm_runner"
    if not runner.is_file():
        pytest.skip(f"{runner} is not here: build it with cmake -S . -B build/runner on the build box")
    mods = sorted(smoke["pack"].glob("v9_*_bias_float16.so"))
    assert mods, f"no bias module in {smoke['pack']}"
    site = REPO / "build" / "runtime" / "site"
    try:
        import nvidia  # the CUDA runtime torch's wheels carry (libcudart.so.13)

        cudart = [str(Path(p) / "cu13" / "lib") for p in nvidia.__path__]
    except ImportError:
        cudart = []
    libs = os.pathsep.join([str(site / "tvm" / "lib"), str(site / "tvm_ffi" / "lib"), *cudart,
                            os.environ.get("LD_LIBRARY_PATH", "")])
    for so in mods:
        out = _run([str(runner), str(so), "--reps", "5"], cwd=tmp_path, env={"LD_LIBRARY_PATH": libs})
        assert out.returncode == 0 and " OK" in out.stdout, (out.stdout, out.stderr)


ACT = """
import torch, gemm_ladder, gemm_ladder.serve.ops
from gemm_ladder.serve import front, ops
from gemm_ladder.core.spec import GemmSpec, spec_for, torch_activation
torch.manual_seed(0)
cases = [(s, d, e) for s in {shapes!r} for d in ("float16", "bfloat16") for e in {epilogues!r}] + [{alone!r}[::-1]]
for shape, dtype, epilogue in cases:
    spec = spec_for(dtype, epilogue)
    M, N, K = map(int, shape.split("x"))
    dt = getattr(torch, dtype)
    A = torch.randn(M, K, device="cuda", dtype=dt)
    W = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dt) if spec.bias else None
    ref = torch_activation(A.double() @ W.double().T + (0 if b is None else b.double()), spec.act)
    # torch's own error: its unfused path, F.linear and then the activation, in the dtype
    theirs = ((torch_activation(torch.nn.functional.linear(A, W, b), spec.act).double() - ref).norm()
              / ref.norm()).item()
    poisoned = lambda: torch.full((M, N), float("nan"), device="cuda", dtype=dt)
    for name, fn in (("matmul", lambda: gemm_ladder.matmul(A, W, bias=b, activation=spec.act, strict=True)),
                     ("out=", lambda: gemm_ladder.matmul(A, W, bias=b, activation=spec.act, strict=True,
                                                         out=poisoned())),
                     ("op", lambda: torch.ops.gemm_ladder.mm(A, W, b, spec.act))):
        D = fn()
        torch.cuda.synchronize()
        err = ((D.double() - ref).norm() / ref.norm()).item()
        worst = ((D.double() - ref).abs().max()).item()
        assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, dtype, epilogue, name, err, theirs)
        print("SMOKE act", shape, dtype, epilogue, name, "rel_err", err, "max_abs", worst, "torch", theirs)
    # the activation ran in the kernel, not a silent torch fallback: a v9 module of the pack
    route = front.route_of(M, N, K, dtype, spec=spec)
    assert route.rung == "v9" and route.source == "kernel pack", (route.rung, route.source, route.lines)
    print("SMOKE act route", shape, dtype, epilogue, route.lines[0], "|", route.lines[2])
    # torch's fallback (and first use's torch candidate) for the same call: cuBLASLt's fused bias+ReLU or
    # bias+GELU(tanh) where it fuses them, alpha too, within 2x of torch's own unfused error
    if b is not None and spec.act in front.LT_ACTIVATIONS:
        for alpha in (1.0, 0.5):
            D = poisoned()
            front.TorchMatmul(spec.act)(A, W, D, bias=b, alpha=alpha)
            torch.cuda.synchronize()
            ref_a = torch_activation(alpha * (A.double() @ W.double().T) + b.double(), spec.act)
            err = ((D.double() - ref_a).norm() / ref_a.norm()).item()
            assert not D.isnan().any() and err <= 2 * theirs + 1e-3, (shape, dtype, epilogue, alpha, err, theirs)
            print("SMOKE act torch fallback", shape, dtype, epilogue, alpha, "rel_err", err)
# the op's backward through the activation: dbias = the rows' sum of act'(Z) * dD, Z recomputed on
# the pack's bias module (A and W want no grad: strict mode has no module for their products)
M, N, K = map(int, {shapes!r}[0].split("x"))
A = torch.randn(M, K, device="cuda", dtype=torch.float16)
W = torch.randn(N, K, device="cuda", dtype=torch.float16) / K ** 0.5
g = torch.randn(M, N, device="cuda", dtype=torch.float16)
for epilogue in {epilogues!r}:
    act = spec_for("float16", epilogue).act
    b = torch.randn(N, device="cuda", dtype=torch.float16, requires_grad=True)
    torch.ops.gemm_ladder.mm(A, W, b, act).backward(g)
    z = (A.double() @ W.double().T + b.detach().double()).requires_grad_()
    torch_activation(z, act).backward(g.double())
    err = ((b.grad.double() - z.grad.sum(0)).norm() / z.grad.sum(0).norm()).item()
    assert err < 2e-2, (epilogue, err)
    print("SMOKE act grad", epilogue, "dbias rel_err", err)
try:
    gemm_ladder.matmul(A, W, activation="gelu")
except ValueError as err:
    print("SMOKE act refused:", str(err).splitlines()[0])
else:
    raise AssertionError("an unknown activation ran")
print("SMOKE act done")
"""


def test_matmul_with_a_bias_and_an_activation(smoke, tmp_path):
    """``matmul(A, W, bias=b, activation=a)`` and ``mm(A, W, b, a)`` for every activation in both
    dtypes at two odd shapes, on the pack's v9 modules (strict: no torch fallback), against
    torch's fp64 reference of act(A . W^T + b) with the output poisoned first, within 2x of
    torch's own unfused path's error; one activation without a bias; the op's bias gradient
    through the activation; torch's fallback for the same calls (cuBLASLt's fused epilogue where it
    applies) against the same reference."""
    out = _script(tmp_path, "act.py", ACT.format(shapes=smoke["act_shapes"], epilogues=smoke["act_epilogues"],
                                                 alone=smoke["act_alone"]), smoke["pack"], strict=True)
    assert out.returncode == 0, out.stderr
    cases = len(smoke["act_shapes"]) * 2 * len(smoke["act_epilogues"]) + 1
    assert out.stdout.count("SMOKE act route") == cases and "SMOKE act done" in out.stdout
    lt = sum(e in ("bias_relu", "bias_gelu_tanh") for e in smoke["act_epilogues"])  # cuBLASLt fuses these
    assert out.stdout.count("SMOKE act torch fallback") == len(smoke["act_shapes"]) * 2 * lt * 2


def _act_modules(smoke) -> list[Path]:
    """The pack's modules built for the activation shapes (the SwiGLU case's modules share the pack)."""
    weights = tuple("x{}x{}_".format(*shape.split("x")[1:]) for shape in smoke["act_shapes"])
    mods = sorted(m for m in smoke["pack"].glob("v9_*act_*.so") if any(w in m.name for w in weights))
    assert len(mods) == len(smoke["act_shapes"]) * 2 * len(smoke["act_epilogues"]) + 1, mods
    return mods


def test_verify_checks_the_activation_modules(smoke, tmp_path):
    """``verify`` on the pack's activation modules: the harness's reference applies their spec's
    activation (and adds a random bias where they have one)."""
    mods = _act_modules(smoke)
    out = _gemm_ladder("verify", *mods, "--seeds", "0", cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    rows = [line for line in out.stdout.splitlines() if any(m.name in line for m in mods)]
    assert len(rows) == len(mods) and all(" ok " in f" {r} " for r in rows), out.stdout


def test_the_cpp_runner_takes_an_activation_module(smoke, tmp_path):
    """The C++ runner applies the manifest's activation to its reference (one module of each)."""
    runner = REPO / "build" / "runner" / "gemm_runner"
    if not runner.is_file():
        pytest.skip(f"{runner} is not here: build it with cmake -S . -B build/runner on the build box")
    site = REPO / "build" / "runtime" / "site"
    try:
        import nvidia  # the CUDA runtime torch's wheels carry (libcudart.so.13)

        cudart = [str(Path(p) / "cu13" / "lib") for p in nvidia.__path__]
    except ImportError:
        cudart = []
    libs = os.pathsep.join([str(site / "tvm" / "lib"), str(site / "tvm_ffi" / "lib"), *cudart,
                            os.environ.get("LD_LIBRARY_PATH", "")])
    mods = [m for m in _act_modules(smoke) if "float16" in m.name and "bfloat16" not in m.name]
    for so in mods:
        out = _run([str(runner), str(so), "--reps", "5"], cwd=tmp_path, env={"LD_LIBRARY_PATH": libs})
        assert out.returncode == 0 and " OK" in out.stdout, (out.stdout, out.stderr)


SWIGLU_GRAD = """
import copy, torch, gemm_ladder.nn
from torch import nn
torch.manual_seed(0)
rows, H, I = {rows}, {hidden}, {intermediate}


class MLP(nn.Module):  # HF's LlamaMLP forward
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down_proj, self.act_fn = nn.Linear(I, H, bias=False), nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):  # patch fuses the MLPs inside a model, not the model itself
    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        return self.mlp(x)


base = Block().to("cuda", torch.bfloat16)
x0 = torch.randn(2, rows // 2, H, device="cuda", dtype=torch.bfloat16)
g = torch.randn(2, rows // 2, H, device="cuda", dtype=torch.bfloat16)


def grads(model, run=None, dtype=torch.bfloat16):
    x = x0.to(dtype, copy=True).requires_grad_()  # a leaf of its own each run
    (model if run is None else run)(x).backward(g.to(dtype))
    m = model.mlp
    return {{"x": x.grad, "gate": m.gate_proj.weight.grad, "up": m.up_proj.weight.grad, "down": m.down_proj.weight.grad}}


want = grads(copy.deepcopy(base).double(), dtype=torch.float64)
theirs = grads(copy.deepcopy(base))
for path in ("eager", "compiled"):
    model = copy.deepcopy(base)
    report = gemm_ladder.nn.patch(model, fuse=True, verbose=False)
    assert [n for n, _ in report.fused] == ["mlp"], (report.fused, report.left)
    model.mlp.fused_training = True  # eager: SwiGLUFunction (its default trains the MLP's own formula)
    ours = grads(model, torch.compile(model, fullgraph=True) if path == "compiled" else None)
    for name, w in want.items():
        err = ((ours[name].double() - w).norm() / w.norm()).item()
        ref = ((theirs[name].double() - w).norm() / w.norm()).item()
        assert ours[name].dtype == torch.bfloat16 and not ours[name].isnan().any(), (path, name)
        assert err <= 2 * ref + 1e-3, (path, name, err, ref)
        print("SMOKE swiglu grad", path, name, "rel_err", err, "torch", ref)
# inference (no grad): the layers' fast lane after a first checked call, the same numbers each call
hits = {{"mm": 0, "swiglu": 0}}


def counted(kind, fn):
    def wrapped(*args):
        y = fn(*args)
        hits[kind] += y is not None
        return y
    return wrapped


gemm_ladder.nn.fast_mm = counted("mm", gemm_ladder.nn.fast_mm)
gemm_ladder.nn.fast_swiglu = counted("swiglu", gemm_ladder.nn.fast_swiglu)
model = copy.deepcopy(base)
gemm_ladder.nn.patch(model, fuse=True, verbose=False)
with torch.inference_mode():
    ys = [model(x0) for _ in range(3)]
    want_y, their_y = copy.deepcopy(base).double()(x0.double()), base(x0)
err = ((ys[0].double() - want_y).norm() / want_y.norm()).item()
ref = ((their_y.double() - want_y).norm() / want_y.norm()).item()
assert torch.equal(ys[1], ys[0]) and torch.equal(ys[2], ys[0]) and err <= 2 * ref + 1e-3, (err, ref)
assert hits["swiglu"] == 2 and hits["mm"] >= 2, hits  # the 2nd and 3rd calls went straight to the kernels
print("SMOKE swiglu inference", hits, "rel_err", err, "torch", ref)
print("SMOKE swiglu done")
"""


def test_fused_swiglu_gradients(smoke, tmp_path):
    """A LLaMA-style MLP fused by ``nn.patch(fuse=True)`` (one gated kernel for gate, up and silu):
    the gradients of x and of the three weights, eager (``SwiGLUFunction``) and compiled
    (``torch.compile(fullgraph=True)``: the op ``gemm_ladder::swiglu``'s registered backward),
    within 2x of torch's own bf16 error against a float64 model. Strict: every GEMM of the forward
    and the backward (dX in the KN layout, dW in MN) runs on a module of the pack, none on torch."""
    out = _script(tmp_path, "swiglu_grad.py", SWIGLU_GRAD.format(**smoke["swiglu_mlp"]), smoke["pack"], strict=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE swiglu grad") == 8 and "SMOKE swiglu inference" in out.stdout
    assert "SMOKE swiglu done" in out.stdout


GROUPED = """
import torch, torch.nn.functional as F, gemm_ladder
torch.manual_seed(0)
NAN = float("nan")


def routings(E, M):
    \"\"\"Token counts per expert summing to M: balanced, all in one expert, half the experts empty,
    Zipf-skewed, and counts that are no multiple of a tile.\"\"\"
    out = {{"balanced": [M // E + (e < M % E) for e in range(E)], "one": [M if e == E // 2 else 0 for e in range(E)]}}
    half = [M // ((E + 1) // 2) if e % 2 == 0 else 0 for e in range(E)]
    half[0] += M - sum(half)
    out["half_empty"] = half
    w = torch.tensor([1.0 / (e + 1) ** 1.2 for e in range(E)])
    z = (w / w.sum() * M).floor().long().tolist()
    z[0] += M - sum(z)
    out["zipf"] = z
    odd = [(37 * e + 11) % 101 for e in range(E)]
    scale = M / max(1, sum(odd))
    odd = [int(c * scale) for c in odd]
    odd[-1] += M - sum(odd)
    out["odd"] = odd
    return out


def ref_of(A, W, counts, gated):
    D, r = [], 0
    for e, c in enumerate(counts):
        y = A[r:r + c].double() @ W[e].double().T
        if gated:
            g, u = y.chunk(2, dim=-1)
            y = F.silu(g) * u
        D.append(y)
        r += c
    return torch.cat(D)


def close(D, ref, torch_D):
    err = ((D.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    theirs = ((torch_D.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return err <= 2 * theirs + 1e-3, err, theirs


checks = 0
for weight, dtypes in {grouped!r}:
    E, N, K = map(int, weight.split(",")[:3])
    gated = weight.endswith("swiglu")
    contiguous_only = "contiguous" in weight
    for dtype in (getattr(torch, d) for d in dtypes.split(",")):
        W = (torch.randn(E, N, K, device="cuda") / K ** 0.5).to(dtype)
        front = gemm_ladder.grouped_swiglu if gated else gemm_ladder.grouped_mm
        masked = gemm_ladder.grouped_swiglu_masked if gated else gemm_ladder.grouped_mm_masked
        Nout = N // 2 if gated else N
        # 33000 rows over 8 experts: past 4096 an expert, where the policy runs v12 in 2x1 clusters at K <= 1024
        for M in (1, 9, 300, 4100) + ((33000,) if E <= 8 else ()):
            A = torch.randn(M + 13, K, device="cuda", dtype=dtype)  # 13 rows past offs[-1]: never written
            for name, counts in routings(E, M).items():
                offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
                D = torch.full((M + 13, Nout), NAN, device="cuda", dtype=dtype)
                front(A, W, offs, out=D, strict=True)
                ref = ref_of(A, W, counts, gated)
                ok, err, theirs = close(D[:M], ref, ref.to(dtype))  # the yardstick: the exact sums rounded
                assert ok and not D[:M].isnan().any() and D[M:].isnan().all(), (weight, dtype, M, name, err, theirs)
                checks += 1
        # a CUDA graph captured once serves every later routing (offs changed in place)
        M = 2000
        A = torch.randn(M, K, device="cuda", dtype=dtype)
        offs = torch.zeros(E, device="cuda", dtype=torch.int32)
        D = torch.empty((M, Nout), device="cuda", dtype=dtype)
        front(A, W, offs, out=D, strict=True)  # loads the module outside capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            front(A, W, offs, out=D, strict=True)
        for name, counts in routings(E, M).items():
            offs.copy_(torch.tensor(counts, device="cuda").cumsum(0))
            D.fill_(NAN)
            g.replay()
            ref = ref_of(A, W, counts, gated)
            ok, err, _ = close(D, ref, ref.to(dtype))
            assert ok and not D.isnan().any(), (weight, dtype, "graph", name, err)
            checks += 1
        if contiguous_only:
            continue
        # the masked layout: slots of max_tokens rows, counts on the GPU, rows past each count kept
        for T in (4, 64):
            A3 = torch.randn(E, T, K, device="cuda", dtype=dtype)
            for counts in ([T] * E, [0] * E, [(5 * e + 3) % (T + 1) for e in range(E)]):
                c = torch.tensor(counts, device="cuda", dtype=torch.int32)
                D3 = torch.full((E, T, Nout), NAN, device="cuda", dtype=dtype)
                masked(A3, W, c, out=D3, strict=True)
                for e, n in enumerate(counts):
                    if n:
                        ref = ref_of(A3[e, :n], W[e:e + 1], [n], gated)
                        ok, err, _ = close(D3[e, :n], ref, ref.to(dtype))
                        assert ok and not D3[e, :n].isnan().any(), (weight, dtype, "masked", T, e, err)
                    assert D3[e, n:].isnan().all(), (weight, dtype, "masked rows past the count were written")
                checks += 1
    print("SMOKE grouped", weight, dtypes)
print("SMOKE grouped done", checks, "checks")
"""


def test_grouped_front_doors(smoke, tmp_path):
    """The grouped front doors (v12 modules of the pack, strict: no torch fallback) under every
    routing issue 33 names -- balanced, all tokens in one expert, half the experts empty, Zipf,
    counts no multiple of a tile; 1 to 33000 tokens (past 4096 an expert, at K <= 1024: the 2x1-cluster
    tier), E = 8 and 256, both dtypes -- with D poisoned
    and rows past ``offs[-1]`` left untouched; a CUDA graph captured once and replayed as ``offs``
    changes; the masked layout (rows past each count untouched); the gated SwiGLU form of each.
    Against a float64 reference, within 2x of the error of rounding it to the dtype (plus 1e-3)."""
    out = _script(tmp_path, "grouped.py", GROUPED.format(grouped=smoke["grouped"]), smoke["pack"], strict=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SMOKE grouped ") == len(smoke["grouped"]) + 1 and "SMOKE grouped done" in out.stdout
