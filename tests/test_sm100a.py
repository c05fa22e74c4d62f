"""CPU tests of the Blackwell (sm_100a) ladder: no Blackwell GPU anywhere, so every rung is
compiled to SASS and checked for the instructions its technique is about, its shared-memory
size, and the static barrier protocol of its generated CUDA source.

SASS names of the tcgen05 forms (cuobjdump 13): ``tcgen05.mma.cta_group::1.kind::f16`` is
``UTCHMMA`` (fp16 and bf16 alike), ``tcgen05.commit`` is ``UTCBAR``, ``tcgen05.ld`` is
``LDTM``; TMA loads and stores are ``UTMALDG`` / ``UTMASTG``; Hopper's wgmma is ``HGMMA``.

Each module is built once per file, when a test first asks for it (about 5 s each on two cores).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemm_ladder import ConfigError
from gemm_ladder.core.config import ARCHS
from tests.lowered import launch_of

ROOT = Path(__file__).resolve().parents[1]
ARCH = "sm_100a"

# one build per rung; v3 takes a shape that is not a multiple of the tile on purpose
# (knobs are explicit so that a tuning database cannot swap them)
CASES = {
    "v1": ((128, 128, 64), {"blk_n": 128}),
    "v2": ((128, 128, 512), {"blk_n": 128}),
    "v3": ((1000, 1000, 1000), {"blk_n": 128}),
    "v4": ((4096, 4096, 4096), {"blk_n": 128}),
    "v5": ((4096, 4096, 4096), {"blk_n": 128, "pipe_depth": 4}),
    "v6": ((4096, 4096, 4096), {"blk_n": 128, "pipe_depth": 4, "tile_order": "grouped",
                                "l2_group_size": 8}),
}
TMA_RUNGS = ("v4", "v5", "v6")
TYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _built(built, rung):
    """``CASES[rung]`` built for sm_100a (the conftest factory builds each once)."""
    shape, knobs = CASES[rung]
    return built(rung, shape, {**knobs, "arch": ARCH})


# -- parsing the generated code ------------------------------------------------------------
def tensormap_boxes(script: str) -> dict[str, int]:
    """tensor-map name -> bytes of one TMA box, from the host's ``tensormap_encode_tiled``.

    Arguments: map, pointer, rank dims, rank-1 strides, rank box dims, rank element strides.
    """
    boxes = {}
    pat = re.compile(
        r"T\.tensormap_encode_tiled\((\w+), T\.handle_add_byte_offset\([^)]*\), (.*?), "
        r'descriptor_dtype="(\w+)", rank=(\d+)'
    )
    for name, args, dtype, rank in pat.findall(script):
        rank = int(rank)
        ints = [int(x) for x in args.split(", ")]
        box = ints[2 * rank - 1:3 * rank - 1]
        n = 1
        for b in box:
            n *= b
        boxes[name] = n * TYPE_BYTES[dtype]
    return boxes


def _bracket(text: str, start: int) -> str:
    """The text inside the bracket that opens at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "["
        depth -= text[i] == "]"
        if depth == 0:
            return text[start + 1:i]
    raise ValueError("unbalanced brackets")


def _barrier_of(call: str, which: int = -1) -> str:
    """The mbarrier a call names: the index into the uint64 barrier array of the pool.

    From v8 on a CTA's TMA may complete on its pair leader's barrier: TVM maps the pool's
    barrier array into the leader's shared memory (``remote_mbar_ptr``, ``mapa``) and indexes
    that; the index is the same as the leader's own expect-tx arrive uses.
    """
    keys = ("((uint64_t*)pool_buf_ptr)[", "remote_mbar_ptr[")
    spots = sorted(m.end() - 1 for key in keys for m in re.finditer(re.escape(key), call))
    return re.sub(r"\s+", "", _bracket(call, spots[which]))


def _destinations(call: str) -> int:
    """CTAs one TMA load writes: the set bits of its multicast ``cta_mask`` (1 if unicast).

    A mask that depends on the CTA's rank is written ``(base << shift)``: the count is base's.
    """
    if "multicast" not in call:
        return 1
    m = re.search(r"\(\(ushort\)\((\d+) <<[^;]*\)\)\)\s*;\s*$", call) or re.search(
        r"\(ushort\)(\d+)\)\s*;\s*$", call)
    assert m, f"multicast TMA with a mask this parser cannot read: {call[-200:]}"
    return bin(int(m.group(1))).count("1")


def tma_stage_loads(source: str) -> list[tuple[str, int, list[tuple[str, int]]]]:
    """Every TMA issue in the CUDA source.

    Walks the calls in source order; the loads that complete on a barrier are collected until
    the thread arrives on that barrier with ``expect_tx``. Returns one entry per expect-tx
    arrive: (barrier index expression, expected bytes, [(tensor map, CTAs written)] of its
    loads).
    """
    pending: dict[str, list[tuple[str, int]]] = {}
    stages = []
    for line in source.splitlines():
        if "__forceinline__" in line or "pool_buf_ptr" not in line:
            continue
        if "cp_async_bulk_tensor_g2s" in line:
            tmap = re.search(r"&\((\w+_tensormap)\)", line).group(1)
            pending.setdefault(_barrier_of(line), []).append((tmap, _destinations(line)))
        elif "mbarrier_arrive_expect_tx" in line:
            bar = _barrier_of(line)
            nbytes = int(re.search(r"\(uint\)(\d+)\)\s*;", line).group(1))
            stages.append((bar, nbytes, pending.pop(bar, [])))
    assert not pending, f"TMA loads whose barrier never gets an expect_tx: {pending}"
    return stages


def tma_stages(source: str) -> list[tuple[str, int, list[str]]]:
    """:func:`tma_stage_loads` with the tensor maps only (v4-v6 load into their own CTA)."""
    return [(bar, n, [tmap for tmap, _ in loads]) for bar, n, loads in tma_stage_loads(source)]


# -- the SASS of every rung ----------------------------------------------------------------
@pytest.mark.parametrize("rung", list(CASES))
def test_sass_has_the_technique(built, rung):
    from gemm_ladder.compile import sass

    b = _built(built, rung)
    mod, counts = b.module, b.counts
    assert sass.sm_of(mod.binary) == ARCH
    assert counts["UTCHMMA"] > 0, "no tcgen05.mma (UTCHMMA) in the SASS"
    assert counts["UTCBAR"] > 0, "no tcgen05.commit (UTCBAR) in the SASS"
    assert counts["LDTM"] > 0, "no TMEM load (LDTM) in the SASS"
    assert counts["HGMMA"] == 0 and counts["HMMA"] == 0, "Hopper/Ampere MMA on a Blackwell rung"
    if rung in TMA_RUNGS:
        assert counts["UTMALDG"] > 0, "TMA rung without TMA loads"
        assert counts["UTMASTG"] > 0, "TMA-store epilogue without TMA stores"
    else:
        assert counts["UTMALDG"] == 0 and counts["UTMASTG"] == 0, "TMA before v4"
        assert counts["LDG"] > 0 and counts["STG"] > 0, "v1-v3 copy and store with the threads"
    assert counts["LDL"] == 0 and counts["STL"] == 0, "register spills"


@pytest.mark.parametrize("rung", list(CASES))
def test_smem_bytes_match_the_launch(built, rung):
    """The manifest's smem_bytes is what the host asks cuLaunchKernel for, and it fits."""
    b = _built(built, rung)
    mod, script = b.module, b.lowered
    launch = mod.manifest()["launch"]
    assert int(launch_of(script)["tirx.use_dyn_shared_memory"]) == launch["smem_bytes"]
    assert launch["smem_bytes"] <= ARCHS[ARCH].smem_per_block


@pytest.mark.parametrize("rung", TMA_RUNGS)
def test_expect_tx_equals_the_bytes_tma_moves(built, rung):
    b = _built(built, rung)
    mod, script = b.module, b.lowered
    boxes = tensormap_boxes(script)
    assert set(boxes) == {"A_tensormap", "B_tensormap", "D_tensormap"}
    stages = tma_stages(mod.source)
    assert stages, "no expect_tx arrive in the source"
    for bar, nbytes, maps in stages:
        assert sorted(maps) == ["A_tensormap", "B_tensormap"], (bar, maps)
        moved = sum(boxes[m] for m in maps)
        assert nbytes == moved, f"barrier [{bar}] expects {nbytes} bytes, its loads move {moved}"
    c = mod.cfg
    assert stages[0][1] == (c.blk_m + c.blk_n) * c.blk_k * c.elem_bytes


@pytest.mark.parametrize("rung", TMA_RUNGS)
def test_every_phase_of_the_ring_gets_its_boxes_bytes(built, rung):
    """The protocol check (gemm_ladder.barriers) runs the threads of the built config: every phase
    of tma2mma expects exactly the bytes of the two boxes (A, B) that complete on it, edge boxes
    counted in full, and the ring has a barrier per stage."""
    from gemm_ladder.protocol.check import check_module

    mod = _built(built, rung).module
    report = check_module(mod, policies=("forward",), which="first")
    assert report.ok, report.table()
    c = mod.cfg
    stage_bytes = (c.blk_m + c.blk_n) * c.blk_k * c.elem_bytes
    ring = next(b for b in report.kir.barriers if b.name == "tma2mma")
    assert ring.depth == c.pipe_depth  # a barrier per stage of the ring (v4: one stage)
    phases = [h for cta in report.sims[0].ctas for b in cta.bars.values()
              if b.label.startswith("tma2mma[") for h in b.history]
    assert len(phases) >= c.k_tiles
    for h in phases:
        assert sorted(x.tmap for x in h.copies) == ["A_tensormap", "B_tensormap"]
        assert h.expected == sum(x.box_bytes for x in h.copies) == stage_bytes


def test_expect_tx_parser_catches_a_wrong_count(built):
    b = _built(built, "v4")
    mod, script = b.module, b.lowered
    bad = re.sub(r"(mbarrier_arrive_expect_tx\w*\(.*\(uint\))(\d+)", lambda m: m.group(1) + "16", mod.source)
    boxes = tensormap_boxes(script)
    assert any(n != sum(boxes[m] for m in maps) for _, n, maps in tma_stages(bad))


def test_v5_ring_has_a_barrier_per_stage(built):
    mod = _built(built, "v5").module
    bars = {bar for bar, _, _ in tma_stages(mod.source)}
    assert len(bars) == 1 and "stage" in next(iter(bars)), bars  # indexed by the ring stage


# -- v6: persistent launch -----------------------------------------------------------------
def test_v6_is_persistent(built, monkeypatch):
    b = _built(built, "v6")
    mod, script = b.module, b.lowered
    launch = mod.manifest()["launch"]
    assert launch["persistent"] is True and launch["threads"] == 256
    assert re.search(r"hgemm_kernel\([^)]*, int num_ctas\)", mod.source), "no trailing num_ctas"
    assert launch_of(script)["blockIdx.x"] == "num_ctas"
    from gemm_ladder.rungs import kernel_of

    func = kernel_of(mod.cfg)
    assert func.params[-1].name == "num_ctas" and str(func.params[-1].ty.dtype) == "int32"

    import torch

    from gemm_ladder.serve.runtime import GemmModule

    class Props:
        multi_processor_count = 148

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    gm = GemmModule("v6.so", mod.manifest(), None)
    assert gm.launch_args(torch.device("cuda", 0)) == [148]


def test_non_persistent_rungs_take_no_extra_argument(built):
    for rung in ("v4", "v5"):
        b = _built(built, rung)
        mod, script = b.module, b.lowered
        assert "persistent" not in mod.manifest()["launch"]
        assert launch_of(script)["blockIdx.x"] == str(mod.cfg.grid_mn[0])


# -- config errors -------------------------------------------------------------------------
def test_rung_without_a_form_for_the_arch(monkeypatch):
    from gemm_ladder.core import config
    from gemm_ladder import rungs

    monkeypatch.setitem(config.ARCHS, "sm_103a", config.ArchLimits("sm_103a", "Blackwell Ultra", 227 * 1024))
    with pytest.raises(ConfigError, match="no form for arch sm_103a"):
        rungs.make_config("v4", 4096, 4096, 4096, arch="sm_103a")
    with pytest.raises(ConfigError, match="has no form"):
        rungs.make_config("v4", 4096, 4096, 4096, arch="sm_80")


@pytest.mark.parametrize(
    "rung, shape, knobs, match",
    [
        ("v4", (4096,) * 3, {"blk_m": 64}, "blk_m=128"),
        ("v4", (4096,) * 3, {"blk_m": 256}, "blk_m=128"),
        ("v4", (4096,) * 3, {"num_warpgroups": 2}, "takes no knob"),
        ("v1", (256, 128, 64), {}, "single 128x128 output tile"),
        ("v2", (128, 128, 96), {}, "K a multiple of 64"),
        ("v5", (4096,) * 3, {"pipe_depth": 1}, "at least 2"),
        ("v5", (4096,) * 3, {"pipe_depth": 9}, "use pipe_depth=6"),
        ("v6", (4096,) * 3, {"blk_n": 256, "pipe_depth": 4}, "use pipe_depth=3"),
        ("v6", (4096,) * 3, {"tile_order": "zigzag"}, "tile_order"),
        ("v3", (4096, 4100, 4096), {}, "multiple of 16"),
    ],
)
def test_bad_knobs_fail_before_compiling(rung, shape, knobs, match):
    import gemm_ladder

    with pytest.raises(ConfigError, match=match):
        gemm_ladder.make_config(rung, *shape, arch=ARCH, **knobs)


def test_every_sm100a_form_documents_itself():
    """v1-v9 have a Blackwell form (a rung may exist for one arch only, so the ladder's list
    is not the test); each says its technique, constraints and run command."""
    from gemm_ladder.rungs import RUNGS, available, rung_module

    assert {f"v{i}" for i in range(1, 10)} <= {r for r in RUNGS if available(r, ARCH)}
    for rung in (r for r in RUNGS if available(r, ARCH)):
        mod = rung_module(rung, ARCH)
        assert mod.TECHNIQUE and "Constraints:" in mod.__doc__ and "Run:" in mod.__doc__
        assert "--arch sm_100a" in mod.__doc__


# -- running: refuse the wrong GPU; export and load ------------------------------------------
def test_module_refuses_another_gpu(monkeypatch):
    import torch

    from gemm_ladder.serve.runtime import ArchMismatchError, GemmModule

    manifest = {"rung": "v4", "shape": [4096] * 3, "dtype": "float16", "arch": ARCH,
                "knobs": {}, "tvm_version": "0.27.0.post1"}
    gm = GemmModule("v4.so", manifest, None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: "fake H100")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ArchMismatchError, match="built for sm_100a but GPU 0 .fake H100. is sm_90a"):
        gm.check_device(torch.device("cuda", 0))
    # and the one it was built for passes
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (10, 0))
    gm.check_device(torch.device("cuda", 0))


_LOAD = """
import sys
from gemm_ladder.compile import toolchain
toolchain.prepare()   # the stub driver where there is no GPU driver
import gemm_ladder
m = gemm_ladder.load(sys.argv[1])
print(m.arch, m.rung)
"""


def test_export_and_load(tmp_path):
    from gemm_ladder.compile import sass

    out = tmp_path / "ladder"
    cmd = [sys.executable, "-m", "gemm_ladder", "export", "--arch", ARCH, "--rungs", "v4",
           "--shapes", "4096x4096x4096", "--dtypes", "float16", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (entry,) = json.loads((out / "manifest.json").read_text())["modules"]
    so = out / entry["file"]
    man = json.loads(Path(str(so) + ".json").read_text())
    assert man["arch"] == ARCH and man["launch"]["smem_bytes"] > 0
    blob = so.read_bytes()
    assert sass.has_device_binary(blob) and b"__global__" not in blob
    assert sass.sm_of(blob) == ARCH
    # loading happens in a child: a crash there must fail this test, not kill the run
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(so)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [ARCH, "v4"]
