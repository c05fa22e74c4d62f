"""The residual's C loaded ahead (issue 31, v9's ``c_prefetch``) and a residual with a float32 D, on
the CPU: the knob (residual specs only, on by default, checked), where the generated CUDA source
issues C's loads and waits for them, the barrier checker on the new kernels and on a broken phase,
and the float32 residual's kernel."""

import re

import pytest

from gemm_ladder.compile import builder, sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, spec_for
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.sm90a import epilogue

RESIDUAL = spec_for("float16", "alpha_bias_relu+residual")
FP32_RESIDUAL = GemmSpec(a="bfloat16", b="bfloat16", d="float32", bias="float32", act="relu", alpha=True,
                         residual="float32")
C_LOAD = re.compile(r"cp_async_bulk_tensor_g2s\w*\(.*C_tensormap")
WGMMA = "mma_async_sync_aligned_m64n"


# -- the knob ----------------------------------------------------------------------------------------
def test_c_prefetch_is_on_by_default_for_a_residual_and_absent_elsewhere():
    cfg = make_config("v9", 512, 512, 512, spec=RESIDUAL)
    assert dict(cfg.extra)["c_prefetch"] is True and epilogue.c_prefetch(cfg)
    assert not epilogue.c_prefetch(make_config("v9", 512, 512, 512, spec=RESIDUAL, c_prefetch=False))
    plain = make_config("v9", 512, 512, 512)  # the knobs (tags, cache keys) of other modules stay as they were
    assert "c_prefetch" not in dict(plain.extra) and not epilogue.c_prefetch(plain)


@pytest.mark.parametrize("knobs, words", [
    ({"spec": spec_for("float16", "bias"), "c_prefetch": True}, "c_prefetch: specs with a residual only"),
    ({"spec": RESIDUAL, "c_prefetch": "yes"}, "c_prefetch"),
])
def test_a_bad_c_prefetch_is_refused_with_the_fix(knobs, words):
    with pytest.raises(ConfigError, match=words):
        make_config("v9", 512, 512, 512, **knobs)


# -- the kernel's source -------------------------------------------------------------------------------
def _consumer_source(prefetch: bool, spec=RESIDUAL, dtype="float16") -> list[str]:
    cfg = make_config("v9", 200, 264, 320, spec=spec, cluster_m=1, dtype=dtype, c_prefetch=prefetch)
    body = builder.build(kernel_of(cfg)).cuda_source().split("__global__")[-1].splitlines()
    return body


@pytest.fixture(scope="module", params=[True, False], ids=["prefetch", "at_the_chunk"])
def residual_source(request):
    return request.param, _consumer_source(request.param)


def test_the_first_c_load_is_issued_before_the_first_wgmma_only_with_the_prefetch(residual_source):
    """With ``c_prefetch`` one C load (the tile's first chunk) comes before the K loop's first wgmma,
    the other three (a 128x256 tile, 64-column chunks: four a consumer) after it; without, all four
    after the K loop."""
    prefetch, lines = residual_source
    loads = [i for i, line in enumerate(lines) if C_LOAD.search(line)]
    first_mma = next(i for i, line in enumerate(lines) if WGMMA in line and "(" in line)
    assert len(loads) == 4
    assert sum(i < first_mma for i in loads) == (1 if prefetch else 0)


def test_every_c_wait_is_in_the_epilogue_after_the_last_wgmma(residual_source):
    """The consumers wait for C (one mbarrier wait a chunk, after the K loop's last
    ``wgmma.wait_group 0``), never inside the K loop: the prefetched load lands under it."""
    _, lines = residual_source
    last_retire = max(i for i, line in enumerate(lines) if "wgmma_wait_group_wait_group_sync_aligned_0(" in line)
    first_load = min(i for i, line in enumerate(lines) if C_LOAD.search(line))
    waits = [i for i, line in enumerate(lines) if "mbarrier_wait(" in line]
    c_waits = [i for i in waits if i > last_retire]
    assert len(c_waits) == 4  # one a chunk
    # between the first C load and the last retirement only the ring's waits (one, in the K loop)
    assert len([i for i in waits if first_load < i < last_retire]) <= 1


def test_a_c_load_ahead_waits_for_the_newest_store_to_leave_its_buffer(residual_source):
    """Chunk j + 1's C goes into the buffer chunk j - 1's store (the newest) reads: the storing thread
    waits for every store to have left (``wait_group.read 0``) before each load in the epilogue."""
    prefetch, lines = residual_source
    loads = [i for i, line in enumerate(lines) if C_LOAD.search(line)]
    waits_before = ["wait_group_read_0" in "".join(lines[i - 3:i]) for i in loads]
    # ahead: the three epilogue loads after read 0 (the prefetch after read 1: the other buffer may
    # still drain); at the chunk: read 1 (buffers - 1) as before
    assert waits_before == ([False, True, True, True] if prefetch else [False] * 4)


# -- the barrier checker ------------------------------------------------------------------------------
@pytest.mark.parametrize("knobs", [{}, {"cluster_m": 1, "epi_n": 256, "pipe_depth": 3},
                                   {"num_warpgroups": 1, "blk_m": 64, "cluster_m": 1}])
def test_the_barrier_checker_passes_the_prefetching_kernels(knobs):
    """Two buffers (each its own c_ready and phase), one buffer a consumer (a chunk the whole row),
    one consumer."""
    report = check_config(make_config("v9", 512, 512, 512, spec=spec_for("float16", "residual"), **knobs))
    assert report.ok, report.findings


def test_the_checker_catches_the_single_barrier_phase(monkeypatch):
    """A load a chunk ahead needs a barrier per buffer: with the old per-consumer parity (one load a
    chunk on one barrier) the consumers wait for a phase that never completes."""
    monkeypatch.setattr(epilogue.ResidualRead, "phase", staticmethod(lambda chunk, buffers: chunk % 2))
    report = check_config(make_config("v9", 256, 256, 512, spec=spec_for("float16", "residual"), cluster_m=1))
    assert not report.ok and "c_ready" in " ".join(report.findings)


def test_the_phase_counts_the_loads_into_each_buffer():
    assert [int(epilogue.ResidualRead.phase(q, 2)) for q in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [int(epilogue.ResidualRead.phase(q, 1)) for q in range(4)] == [0, 1, 0, 1]


# -- a residual with a float32 D ----------------------------------------------------------------------
def test_a_residual_with_a_float32_d_reads_c_as_float32_words():
    """C in float32 through the float32 staging buffers: 32-column boxes (eight loads a consumer a
    256-column tile), each thread adding beta times the word it then overwrites; no ldmatrix."""
    lines = _consumer_source(True, FP32_RESIDUAL, "bfloat16")
    src = "\n".join(lines)
    assert len([line for line in lines if C_LOAD.search(line)]) == 8
    assert "(beta * ((float*)pool_buf_ptr)[" in src and "ldmatrix" not in src
    assert "float* __restrict__ bias_ptr" in src


def test_the_float32_residual_kernel_spills_nothing():
    """C's float32 words are read from the staging buffer one at a time, each added and written
    back: no local memory under the consumers' register budget, and no ldmatrix (16-bit only)."""
    cfg = make_config("v9", 200, 264, 320, spec=FP32_RESIDUAL, cluster_m=1, dtype="bfloat16")
    mod = builder.build(kernel_of(cfg))
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    counts = sass.instruction_counts(text)
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.local == 0, (counts, res)
    assert counts["UTMALDG"] > 0 and counts["LDSM"] == 0


def test_the_barrier_checker_passes_the_float32_residual_kernel():
    for prefetch in (True, False):
        cfg = make_config("v9", 512, 512, 512, spec=FP32_RESIDUAL, dtype="bfloat16", c_prefetch=prefetch)
        assert check_config(cfg).ok


# -- the GPU check's pure parts (benchmarks/epilogue_check.py) -----------------------------------------
def _epilogue_check():
    import importlib.util  # pylint: disable=import-outside-toplevel
    from pathlib import Path  # pylint: disable=import-outside-toplevel

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "epilogue_check.py"
    spec = importlib.util.spec_from_file_location("epilogue_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_gpu_check_times_each_residual_with_and_without_the_prefetch_in_one_group():
    """Every residual timing shape (the Llama weights at M = 128, 2048, 8192) is one group holding the
    at-chunk and the prefetching module (and at M = 128 the 64x64-tile one), so they take turns in
    the same rounds; the rows' ops are what issue 31's results name."""
    mod = _epilogue_check()
    groups = [g for g in mod.time_groups(mod.cases()) if g[0]["epilogue"] in mod.TIME_EPILOGUES and not g[0].get("d")]
    assert len(groups) == len(mod.TIME_EPILOGUES) * len(mod.LLAMA_WEIGHTS) * len(mod.TIME_MS)
    for group in groups:
        M = group[0]["shape"][0]
        assert [c["variant"] for c in group] == ["at_chunk", "prefetch"] + (["prefetch_64x64"] if M == 128 else [])
        assert [c["knobs"]["c_prefetch"] for c in group] == [False, True] + ([True] if M == 128 else [])
    ops = {mod.op_of(mod.spec_of_case(c), c.get("variant")) for g in groups for c in g}
    assert ops == {"residual", "residual_prefetch", "residual_prefetch_64x64", "alpha_bias_gelu_tanh+residual",
                   "alpha_bias_gelu_tanh+residual_prefetch", "alpha_bias_gelu_tanh+residual_prefetch_64x64"}


def test_the_gpu_check_covers_a_float32_residual_and_the_at_chunk_kernels():
    mod = _epilogue_check()
    cases = mod.cases()
    fp32_res = [c for c in cases if c.get("d") == "float32" and "residual" in c["epilogue"]]
    assert {c["purpose"] for c in fp32_res} == {"check", "time"}
    spec = mod.spec_of_case(fp32_res[0])
    assert (spec.d, spec.residual) == ("float32", "float32") and mod.op_of(spec) == "fp32_out+residual"
    assert mod.op_of(mod.spec_of_case({"dtype": "bfloat16", "epilogue": "none", "d": "float32"})) == "fp32_out"
    at_chunk = [c for c in cases if c["purpose"] == "check" and c.get("knobs", {}).get("c_prefetch") is False]
    assert {c["epilogue"] for c in at_chunk} == {"residual", "alpha_bias_gelu_tanh+residual"}
    # the 64x64-tile variant is a valid v9 config at the timed M = 128 shapes (make_config raises if not)
    for N, K in mod.LLAMA_WEIGHTS:
        make_config("v9", 128, N, K, spec=spec_for("bfloat16", "residual"), dtype="bfloat16", **mod.SMALL_TILES)


def test_the_policy_serves_a_float32_residual_with_v9_and_the_prefetch():
    """The front door's spec for ``matmul(..., residual=C, out_dtype=torch.float32)`` (C float32) is
    built now: the policy picks v9 without epi_under, and make_config adds c_prefetch."""
    from gemm_ladder.serve import plan  # pylint: disable=import-outside-toplevel

    spec = GemmSpec(a="bfloat16", b="bfloat16", d="float32", residual="float32")
    for M in (128, 8192):
        choice = plan.choose(plan.Problem(M, 4096, 4096, "bfloat16", "sm_90a", 132, spec), use_db=True)
        assert choice.rung == "v9" and not choice.knobs.get("epi_under")
        cfg = make_config("v9", M, 4096, 4096, **choice.knobs)
        assert epilogue.c_prefetch(cfg)


def test_the_gpu_checks_modules_travel_gzipped_and_unpack_beside_their_manifests(tmp_path):
    """``prepare`` gzips each module (71 exported .so files are 15 MiB, gzipped under 3) and ``run``
    unpacks them into a folder of its own (the GPU box's copy of DIR may be read-only)."""
    mod = _epilogue_check()
    built = tmp_path / "cache" / "abc" / "module.so"
    built.parent.mkdir(parents=True)
    blob = b"\x7fELF" + bytes(range(256)) * 64
    built.write_bytes(blob)
    (tmp_path / "cache" / "abc" / "module.so.json").write_text('{"rung": "v9"}')
    folder = tmp_path / "dir"
    folder.mkdir()
    mod.pack_module(built, folder, "abc.so")
    assert sorted(p.name for p in folder.iterdir()) == ["abc.so.gz", "abc.so.json"]
    assert (folder / "abc.so.gz").stat().st_size < len(blob) // 4
    out = mod.unpack_modules(folder, tmp_path / "run")
    assert (out / "abc.so").read_bytes() == blob and (out / "abc.so.json").read_text() == '{"rung": "v9"}'
