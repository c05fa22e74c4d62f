"""The front door on the GPU (``gpu`` tier): ``gemm_ladder.matmul`` over shapes that need every
path (runtime-M modules at many M, padded copies, misaligned views, batch dims, ``out``, empty
shapes), ``explain``, and the torch op (``opcheck``, ``torch.compile(fullgraph=True)``, CUDA-graph
capture, torch's current stream).

Every check runs in a child process with a deadline (``tests/front_door_jobs.py`` through
``gemm_ladder.measure.isolate``), from a kernel pack with building switched off, so this is what a GPU
box with the TVM runtime alone runs. The pack comes from:

- ``GEMM_LADDER_PREBUILT=DIR``: ``DIR/front_pack`` (made on a build box, see below);
- ``GEMM_LADDER_GPU_EXPORT=DIR`` on a build box: built into ``DIR/front_pack``, tests skipped;
- else (a GPU box with TVM's compiler): built into the session's temporary folder.
"""

from pathlib import Path

import pytest

from gemm_ladder.serve import front, kernel_pack
from gemm_ladder.measure import isolate

from .conftest import EXPORT_DIR, GPU_ARCH, GPU_TIMEOUT, PREBUILT_DIR

pytestmark = pytest.mark.gpu

# dtype:MxNxK:variant (see tests/front_door_jobs.py)
CASES = [
    # one (N, K), every M of the issue: the small-M and the large-M modules take M at run time
    *[f"float16:{M}x6144x4096:plain" for M in (1, 7, 64, 1000, 8191)],
    *[f"bfloat16:{M}x6144x4096:plain" for M in (1, 7, 1000)],
    "float16:128x4096x4096:out",
    "float16:10x4096x4096:batch",
    "float16:64x4096x4096:views",                 # cloned A and B, staged out
    "float16:64x6144x4096:again",                 # the fast path of a shape seen before
    "bfloat16:1000x6144x4096:again",
    "float16:33x1001x100:plain",                  # N and K padded to 1008 and 104
    "bfloat16:33x1001x100:out",
    "float16:2048x4096x4096:plain",               # the large rule with epi_under (256 tiles on 132 SMs)
    "bfloat16:3000x4096x4096:again",              # the same module at a ragged runtime M (3000 = 23.4 tiles), again
    "float16:0x4096x4096:plain",                  # empty: nothing launched
    "float16:16x4096x0:plain",                    # K = 0: zeros, as cuBLAS gives
]
# the kernel shapes (M, N, K) the pack must serve: the cases (N and K padded) and the torch op's
OP_SHAPES = [(15, 256, 512), (15, 512, 256), (256, 512, 16),   # opcheck: forward, dA, dB (K=15 padded)
             (10, 128, 64), (10, 64, 128),                     # torch.compile of a two-layer model
             (32, 1024, 512), (64, 1024, 512)]                 # CUDA graph, current stream


def _kernel_shapes():
    from gemm_ladder.serve.tma_layout import Layout, layout_fixes

    out = {"float16": set(OP_SHAPES), "bfloat16": set()}
    for case in CASES:
        dtype, shape, _ = case.split(":")
        M, N, K = (int(x) for x in shape.split("x"))
        if M and K:
            f = layout_fixes(Layout(M, N, K, dtype))
            out[dtype].add((M, f.N, f.K))
    return out


@pytest.fixture(scope="module")
def front_pack(tmp_path_factory):
    if PREBUILT_DIR:
        folder = Path(PREBUILT_DIR) / "front_pack"
        if not (folder / kernel_pack.PACK_MANIFEST).exists():
            pytest.fail(f"no front_pack in {PREBUILT_DIR}: build it with GEMM_LADDER_GPU_EXPORT on a build box")
        return folder
    folder = (Path(EXPORT_DIR) if EXPORT_DIR else tmp_path_factory.mktemp("front")) / "front_pack"
    for dtype, shapes in _kernel_shapes().items():
        man = kernel_pack.build_pack(folder, sorted(shapes), [dtype])
        failed = [r for r in man["results"] if r["status"] == "failed"]
        assert not failed, failed
    if EXPORT_DIR and GPU_ARCH is None:
        pytest.skip(f"front-door pack exported for the GPU box: {folder}")
    return folder


@pytest.fixture
def from_pack(front_pack, monkeypatch):
    """The child processes take kernels from the pack only."""
    monkeypatch.setenv(kernel_pack.PACK_ENV, str(front_pack))
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    monkeypatch.setenv(front.STRICT_ENV, "1")  # our kernels at every shape, tiny ones too: no torch


@pytest.fixture(scope="module")
def case_results(front_pack):
    mp = pytest.MonkeyPatch()
    mp.setenv(kernel_pack.PACK_ENV, str(front_pack))
    mp.setenv("GEMM_LADDER_BUILD", "0")
    mp.setenv(front.STRICT_ENV, "1")
    try:
        got = isolate.run_batch("tests.front_door_jobs:check_case", CASES, timeout=GPU_TIMEOUT)
    finally:
        mp.undo()
    return dict(zip(CASES, got))


@pytest.mark.parametrize("case", CASES)
def test_matmul_is_correct(case, case_results):
    assert case_results[case]["status"] == "ok", case_results[case]


def _job(name: str, item: str = "-") -> dict:
    return isolate.run_isolated(f"tests.front_door_jobs:{name}", item, timeout=GPU_TIMEOUT)


@pytest.mark.parametrize("shape", ["16x6144x4096", "33x1001x100"])
def test_explain_names_rung_rule_source_and_copies(shape, from_pack):
    res = _job("explain", shape)
    assert res["status"] == "ok", res


def test_opcheck(from_pack):
    res = _job("opcheck")
    assert res["status"] == "ok", res


def test_torch_compile_fullgraph(from_pack):
    res = _job("compile_fullgraph")
    assert res["status"] == "ok", res


def test_cuda_graph_capture(from_pack):
    res = _job("cuda_graph")
    assert res["status"] == "ok", res


def test_runs_on_torchs_current_stream(from_pack):
    res = _job("current_stream")
    assert res["status"] == "ok", res


def test_the_first_call_measures_and_a_later_process_remembers(from_pack, tmp_path):
    choices = str(tmp_path / "choices.json")
    first = _job("first_use", choices)
    assert first["status"] == "ok" and "measured at first use" in first["text"], first
    again = _job("first_use", choices)
    assert again["status"] == "ok" and "chosen at an earlier first use" in again["text"], again


def test_a_compiled_graph_replayed_model_runs_with_a_layer_no_pack_serves(from_pack):
    res = _job("compile_fallback")
    assert res["status"] == "ok", res
