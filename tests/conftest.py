"""Shared fixtures: a build folder per session, the ``built`` factory of CPU-tier modules, the GPU
tier's skip rule and its batch runner.

GPU tests are marked ``gpu`` and skip themselves where torch sees no CUDA GPU (CI, build
boxes), unless ``GEMM_LADDER_GPU_EXPORT`` asks to export their modules for a GPU box. They
never run a kernel in the test process: every launch goes through ``gemm_ladder.measure.isolate``
(a child process with a per-module deadline), so a deadlocked kernel fails its test instead of
hanging the run. See ``tests/gpu_cases.py``.
"""

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from gemm_ladder.compile import builder, sass
from gemm_ladder.serve import front, kernel_pack, scaled

from .lowered import lowered_script


def _gpu_arch():
    from gemm_ladder.core import device

    gpu = device.probe(0)
    return gpu.arch if gpu is not None else None


GPU_ARCH = _gpu_arch()
# the C++ call lookup (gemm_ladder.serve.native) only where a test asks for it: in "auto" every
# remembered call would start a compiler on a helper thread (tests/test_native_lookup.py builds it)
os.environ.setdefault("GEMM_LADDER_NATIVE", "0")
EXPORT_DIR = os.environ.get("GEMM_LADDER_GPU_EXPORT")
PREBUILT_DIR = os.environ.get("GEMM_LADDER_PREBUILT")
# seconds a module may run before its case counts as hung (a deadlocked barrier protocol)
GPU_TIMEOUT = float(os.environ.get("GEMM_LADDER_GPU_TIMEOUT", "180"))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: a subset exports only its own cases
def pytest_collection_modifyitems(config, items):
    cases = []
    for item in items:
        case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
        if case is not None and "gpu_result" in getattr(item, "fixturenames", ()):
            cases.append(case)
    config._gpu_cases = list(dict.fromkeys(cases))
    if GPU_ARCH is not None or EXPORT_DIR:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here: the gpu tier runs on an H100/H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")


class Built:
    """One module the CPU tier builds, and what its tests read off it, each worked out once."""

    def __init__(self, module: builder.BuiltModule, folder, name: str):
        self.module = module
        self._folder = folder  # a callable: the export folder, made when first asked for
        self._name = name

    @functools.cached_property
    def sass(self) -> str:
        return sass.disassemble(self.module.binary)

    @functools.cached_property
    def counts(self):
        return sass.instruction_counts(self.sass)

    @functools.cached_property
    def resources(self):
        return sass.resource_usage(self.module.binary)

    @functools.cached_property
    def lowered(self) -> str:
        """The module after TVM's tirx pipeline, host side included (``tests/lowered.py``)."""
        return lowered_script(self.module)

    @functools.cached_property
    def path(self) -> Path:
        """The module exported (``.so`` with its manifest beside it) to a temporary folder."""
        return self.module.export(self._folder() / f"{self._name}.so")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(rung, (M, N, K), knobs)`` -> :class:`Built`: ``gemm_ladder.compile.builder.build`` (the pure
    build: no tuning database picks knobs), each distinct build once per test file and only when
    a test first asks for it, so ``-k v8`` builds only v8's modules."""
    cache: dict[str, Built] = {}
    folder = functools.cache(lambda: tmp_path_factory.mktemp("built"))

    def get(rung: str, shape: tuple[int, int, int], knobs: dict | None = None) -> Built:
        key = repr((rung, tuple(shape), sorted((knobs or {}).items())))
        if key not in cache:
            module = builder.build(rung, *shape, **(knobs or {}))
            cache[key] = Built(module, folder, f"{rung}_{len(cache)}")
        return cache[key]

    return get


def _module_paths(cases, out: Path) -> dict:
    """A module for every case: prebuilt, or built and exported here (in parallel)."""
    if PREBUILT_DIR:
        index = json.loads((Path(PREBUILT_DIR) / "cases.json").read_text())
        return {c.key: Path(PREBUILT_DIR) / index[c.key] for c in cases if c.key in index}
    from gemm_ladder.compile.batch import build_many

    jobs = [(rung, (M, N, K), knobs) for rung, M, N, K, knobs in (c.build_args() for c in cases)]
    results = build_many(jobs, out, desc="gpu cases")
    paths = {}
    for case, res in zip(cases, results):
        assert res["status"] == "built", (str(case), res.get("detail"))
        paths[case.key] = out / res["file"]
    index_file = out / "cases.json"
    index = json.loads(index_file.read_text()) if index_file.exists() else {}
    index.update({k: p.name for k, p in paths.items()})  # several exports may share one folder
    index_file.write_text(json.dumps(index, indent=1))
    return paths


@pytest.fixture(scope="session")
def _gpu_batch(request, tmp_path_factory):
    cases = request.config._gpu_cases
    out = Path(EXPORT_DIR) if EXPORT_DIR else tmp_path_factory.mktemp("gpu_cases")
    out.mkdir(parents=True, exist_ok=True)
    paths = _module_paths(cases, out)
    if EXPORT_DIR and GPU_ARCH is None:
        return {"exported": paths}
    from gemm_ladder.measure.isolate import run_batch

    keys = [c.key for c in cases if c.key in paths]
    results = run_batch("check", [paths[k] for k in keys], (0, 1), timeout=GPU_TIMEOUT)
    return {"results": dict(zip(keys, results)), "paths": paths}


@pytest.fixture
def gpu_result(request, _gpu_batch):
    case = request.node.callspec.params["case"]
    if "exported" in _gpu_batch:
        pytest.skip(f"exported for the GPU box: {_gpu_batch['exported'][case.key].name}")
    if case.key not in _gpu_batch["results"]:
        pytest.fail(f"no module for {case} in {PREBUILT_DIR}: export it with GEMM_LADDER_GPU_EXPORT")
    return _gpu_batch["results"][case.key]


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as a module (the checks are scripts, not a package), registered under
    ``name`` so its own sibling imports and isolate children find it."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def no_gpu(monkeypatch):
    """For ``scaled_mm``'s routes: an H100 that cannot build (a runtime-only box), modules 'loaded' as
    their paths, no pack from the environment."""
    monkeypatch.setattr(scaled.device, "arch_of", lambda index: "sm_90a")
    monkeypatch.setattr(scaled, "why_no_build", lambda: "GEMM_LADDER_BUILD=0")
    monkeypatch.setattr(scaled, "load", lambda path: f"loaded {Path(path).name}")
    monkeypatch.delenv(kernel_pack.PACK_ENV, raising=False)
    front.reset()
    scaled.reset()
    yield
    front.reset()
    scaled.reset()
