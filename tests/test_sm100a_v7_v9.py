"""CPU tests of the Blackwell rungs v7-v9 (warp roles with register budgets, CTA-pair clusters,
several epilogue consumers). No Blackwell GPU anywhere: every case is compiled to SASS and its
binary, launch and generated CUDA are checked for what the technique implies.

SASS names (cuobjdump 13): ``setmaxnreg.dec/.inc`` is ``USETMAXREG.DEALLOC/.TRY_ALLOC``; a
``cta_group::2`` MMA is ``UTCHMMA.2CTA``, its commit ``UTCBAR.2CTA[.MULTICAST]``; a
``cta_group::2`` TMA load is ``UTMALDG.2D.2CTA``, multicast ``UTMALDG.2D.MULTICAST.2CTA``.

Each case is built once per module (about 12 s each on two cores): every rung at the two
benchmark shapes, at a shape that is no multiple of the tile and at one whose K is shorter
than the ring, both dtypes and a sample of the knobs spread over them.
"""

from __future__ import annotations

import re

import pytest

from gemm_ladder import ConfigError
from gemm_ladder.core.config import ARCHS
from tests.lowered import launch_of
from tests.test_sm100a import tensormap_boxes, tma_stage_loads

ARCH = "sm_100a"
B200_SMEM = 227 * 1024
B200_TMEM_COLS = 512

# case id -> (rung, shape, knobs); knobs are explicit so that a tuning database cannot swap them
CASES = {
    "v7-4096-f16": ("v7", (4096, 4096, 4096), {"dtype": "float16", "blk_n": 128, "pipe_depth": 4}),
    "v7-8192-bf16-n256": ("v7", (8192, 8192, 8192), {"dtype": "bfloat16", "blk_n": 256, "pipe_depth": 3,
                                                     "tile_order": "snake", "l2_group_size": 16}),
    "v7-odd-f16-n192": ("v7", (1000, 3000, 520), {"dtype": "float16", "blk_n": 192, "pipe_depth": 4}),
    "v7-shortk-bf16": ("v7", (1000, 3000, 128), {"dtype": "bfloat16", "blk_n": 64, "pipe_depth": 6}),
    "v8-4096-f16": ("v8", (4096, 4096, 4096), {"dtype": "float16", "blk_n": 256, "cluster_n": 2}),
    "v8-8192-bf16-c1": ("v8", (8192, 8192, 8192), {"dtype": "bfloat16", "blk_n": 128, "cluster_n": 1,
                                                   "pipe_depth": 6}),
    "v8-odd-bf16-c4": ("v8", (1000, 3000, 520), {"dtype": "bfloat16", "blk_n": 192, "cluster_n": 4,
                                                 "pipe_depth": 4}),
    "v8-shortk-f16": ("v8", (1000, 3000, 128), {"dtype": "float16", "blk_n": 256, "cluster_n": 2}),
    "v9-4096-bf16": ("v9", (4096, 4096, 4096), {"dtype": "bfloat16", "blk_n": 256, "cluster_n": 2,
                                                "epi_consumers": 2}),
    "v9-8192-f16": ("v9", (8192, 8192, 8192), {"dtype": "float16", "blk_n": 256, "cluster_n": 2,
                                               "epi_consumers": 2, "tile_order": "row"}),
    "v9-odd-f16-n128": ("v9", (1000, 3000, 520), {"dtype": "float16", "blk_n": 128, "cluster_n": 1,
                                                  "epi_consumers": 2, "pipe_depth": 6}),
    "v9-shortk-bf16-e1": ("v9", (1000, 3000, 128), {"dtype": "bfloat16", "blk_n": 256, "cluster_n": 4,
                                                    "epi_consumers": 1}),
}
IDS = list(CASES)


def _built(built, case):
    """``CASES[case]`` built for sm_100a (the conftest factory builds each once, when a test first
    asks for it, so ``-k v8`` builds only v8's)."""
    rung, shape, knobs = CASES[case]
    return built(rung, shape, {**knobs, "arch": ARCH})


def rung_of(case):
    from gemm_ladder.rungs import rung_module

    return rung_module(CASES[case][0], ARCH)


def knobs_of(mod) -> dict:
    return mod.cfg.knobs()


# -- reading SASS ------------------------------------------------------------------------------
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def instructions(sass_text: str) -> list[tuple[int, str, str]]:
    """(address, full opcode with modifiers, operands) of every instruction."""
    return [(int(a, 16), op, args.strip()) for a, _, op, args in _INSN.findall(sass_text)]


def opcodes(sass_text: str, name: str) -> list[str]:
    return [op for _, op, _ in instructions(sass_text) if op.split(".")[0] == name]


def loops(sass_text: str) -> list[tuple[int, int]]:
    """[start, end] address ranges of every loop: a branch back to a lower address.

    ptxas puts the retry paths of mbarrier waits after the kernel's last EXIT and branches
    from there back into the body; those back-branches are not loops and are skipped.
    """
    insns = instructions(sass_text)
    body_end = max(addr for addr, op, _ in insns if op == "EXIT")
    out = []
    for addr, op, args in insns:
        m = re.search(r"0x([0-9a-f]+)", args)
        if op.split(".")[0] == "BRA" and m and int(m.group(1), 16) < addr <= body_end:
            out.append((int(m.group(1), 16), addr))
    return out


def setmaxnreg(sass_text: str) -> dict[str, list[int]]:
    """``{"DEALLOC": [regs...], "TRY_ALLOC": [regs...]}`` of the USETMAXREG instructions."""
    out: dict[str, list[int]] = {"DEALLOC": [], "TRY_ALLOC": []}
    for _, op, args in instructions(sass_text):
        if op.startswith("USETMAXREG."):
            out[op.split(".")[1]].append(int(args.split(",")[-1].strip(), 16))
    return out


# -- the technique in the SASS -----------------------------------------------------------------
@pytest.mark.parametrize("case", IDS)
def test_sass_has_the_technique(built, case):
    from gemm_ladder.compile import sass

    b = _built(built, case)
    mod, text = b.module, b.sass
    rung = mod.cfg.rung
    counts = sass.instruction_counts(text)
    assert sass.sm_of(mod.binary) == ARCH
    assert counts["UTCHMMA"] > 0 and counts["UTCBAR"] > 0 and counts["LDTM"] > 0
    assert counts["UTMALDG"] > 0 and counts["UTMASTG"] > 0
    assert counts["HGMMA"] == 0 and counts["HMMA"] == 0, "Hopper/Ampere MMA on a Blackwell rung"
    regs = setmaxnreg(text)
    assert regs["DEALLOC"] and regs["TRY_ALLOC"], "no register reallocation (USETMAXREG)"
    mmas, commits, loads = opcodes(text, "UTCHMMA"), opcodes(text, "UTCBAR"), opcodes(text, "UTMALDG")
    if rung == "v7":
        assert not any("2CTA" in op for op in mmas + commits + loads), "a 2-CTA form before v8"
        assert not any("MULTICAST" in op for op in loads + commits)
    else:
        assert all(".2CTA" in op for op in mmas), f"an MMA that is not cta_group::2: {set(mmas)}"
        assert all(".2CTA" in op for op in commits) and any(".MULTICAST" in op for op in commits)
        assert all(".2CTA" in op for op in loads), f"a TMA load without cta_group::2: {set(loads)}"
        multicast = [op for op in loads if ".MULTICAST" in op]
        if knobs_of(mod)["cluster_n"] > 1:
            assert multicast, "cluster_n > 1 but no multicast TMA load (UTMALDG...MULTICAST)"
        else:
            assert not multicast, "a lone pair has nobody to multicast to"


@pytest.mark.parametrize("case", IDS)
def test_register_budgets_fit_the_pool(built, case):
    """setmaxnreg.inc waits until the CTA's pool can serve it: the budgets must fit the
    registers ptxas gave every thread at launch, and be the ones the rung declares."""
    b = _built(built, case)
    mod, text, res = b.module, b.sass, b.resources
    from gemm_ladder.sm100a import common

    threads = mod.manifest()["launch"]["threads"]
    consumers = threads // common.THREADS_PER_WG - 1
    producer, epilogue = common.role_registers(consumers)
    regs = setmaxnreg(text)
    assert set(regs["DEALLOC"]) == {producer}
    assert set(regs["TRY_ALLOC"]) == {epilogue} and len(regs["TRY_ALLOC"]) == consumers
    pool = res.registers * threads
    assert (producer + consumers * epilogue) * common.THREADS_PER_WG <= pool, (producer, epilogue, pool)
    assert res.registers == common.entry_registers(1 + consumers)


@pytest.mark.parametrize("case", IDS)
def test_no_spills_in_loops(built, case):
    """No local memory in any loop. ptxas may keep the warp index in one stack slot across
    tcgen05.alloc's out-of-line trap call (it does when setmaxnreg is present): that slot is
    written once before the roles split and read at role entry, outside every loop."""
    b = _built(built, case)
    text, res = b.sass, b.resources
    assert res.local == 0 and res.stack <= 8, res
    spans = loops(text)
    for addr, op, _ in instructions(text):
        if op.split(".")[0] in ("LDL", "STL"):
            inside = [s for s in spans if s[0] <= addr <= s[1]]
            assert not inside, f"{op} at {addr:#x} inside the loop {[hex(x) for x in inside[0]]}"
    assert len(opcodes(text, "STL")) <= 1


# -- memory budgets ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", IDS)
def test_smem_and_launch(built, case):
    """The manifest's shared memory is what the host asks for and fits a B200 block; clustered
    rungs launch clusters of the size the manifest says."""
    b = _built(built, case)
    mod, script = b.module, b.lowered
    launch = mod.manifest()["launch"]
    host = launch_of(script)
    assert int(host["tirx.use_dyn_shared_memory"]) == launch["smem_bytes"] <= ARCHS[ARCH].smem_per_block
    assert launch["smem_bytes"] <= B200_SMEM
    assert host["blockIdx.x"] == "num_ctas" and launch["persistent"] is True
    assert int(host["threadIdx.x"]) == launch["threads"]
    if mod.cfg.rung == "v7":
        assert "cluster" not in launch and "clusterCtaIdx.x" not in host
    else:
        assert int(host["clusterCtaIdx.x"]) == launch["cluster"] == 2 * knobs_of(mod)["cluster_n"]


@pytest.mark.parametrize("case", IDS)
def test_tmem_use(built, case):
    """All 512 columns are allocated (cta_group::2 from v8 on) and the epilogue's tcgen05.ld
    cover exactly the two accumulators the MMAs write, inside the 512 columns."""
    mod = _built(built, case).module
    src = mod.source
    group = 1 if mod.cfg.rung == "v7" else 2
    allocs = re.findall(r"tcgen05_alloc_alloc_cta_group__(\d)\w*\(.*\(uint\)(\d+)\);", src)
    assert allocs == [(str(group), str(B200_TMEM_COLS))], allocs
    acc_stages = rung_of(case).ACC_STAGES
    cols = set()
    pat = re.compile(r"tcgen05_ld_ld_sync_aligned_32x32b_x(\d+)_b32_f32\(.*get_tmem_addr\(\(uint\)0, 0, (.*)\)\);")
    for width, expr in pat.findall(src):
        for stage in range(acc_stages):
            start = eval(re.sub(r"epi_ps_stage_ptr(_\d+)?\[0\]", str(stage), expr), {})  # pylint: disable=eval-used
            cols.update(range(start, start + int(width)))
    assert cols == set(range(acc_stages * mod.cfg.blk_n)), "the epilogue misses or overruns columns"
    assert max(cols) < B200_TMEM_COLS


# -- the barrier protocol ----------------------------------------------------------------------
@pytest.mark.parametrize("case", IDS)
def test_expect_tx_equals_the_bytes_tma_lands(built, case):
    """Per ring stage the expect-tx of the barrier the MMA waits on equals the bytes every load
    that completes on it lands: box bytes times the CTAs its multicast mask writes, times the
    CTAs of the pair whose loads complete on the leader's barrier (v8 on)."""
    b = _built(built, case)
    mod, script = b.module, b.lowered
    boxes = tensormap_boxes(script)
    assert set(boxes) == {"A_tensormap", "B_tensormap", "D_tensormap"}
    stages = tma_stage_loads(mod.source)
    assert stages, "no expect_tx arrive in the source"
    pair = 1 if mod.cfg.rung == "v7" else 2
    for bar, nbytes, loads in stages:
        assert sorted(t for t, _ in loads) == ["A_tensormap", "B_tensormap"], (bar, loads)
        landed = pair * sum(boxes[t] * dests for t, dests in loads)
        assert nbytes == landed, f"barrier [{bar}] expects {nbytes} bytes, its loads land {landed}"
    c = mod.cfg
    assert stages[0][1] == pair * (c.blk_m + c.blk_n // pair) * c.blk_k * c.elem_bytes


def barrier_arrays(source: str) -> dict[int, tuple[int, int]]:
    """first barrier index -> (slots, arrival count), from the mbarrier inits (one guarded
    block per barrier object)."""
    out = {}
    for block in re.findall(r"if \(tvm_builtin_cuda_thread_rank\(\) == 0\) \{(.*?)\n  \}", source, re.S):
        inits = re.findall(r"mbarrier_init\w*\(.*pool_buf_ptr\)\[(\d+)\]\)\)\), \(uint\)(\d+)\);", block)
        if inits:
            counts = {int(c) for _, c in inits}
            assert len(counts) == 1
            out[int(inits[0][0])] = (len(inits), counts.pop())
    return out


def _first_slot(index_expr: str) -> int:
    m = re.search(r"\+ (\d+)\)?$", index_expr)
    return int(m.group(1)) if m else 0


def arrivals(source: str) -> dict[int, str]:
    """first barrier index -> how it is arrived on: "expect_tx", "commit/<CTAs in the mask>",
    "thread" (a local per-thread arrive) or "remote-thread" (a per-thread arrive on the pair
    leader's copy)."""
    out = {}
    for line in source.splitlines():
        if "__forceinline__" in line or "pool_buf_ptr" not in line:
            continue
        idx = re.search(r"\(\(uint64_t\*\)pool_buf_ptr\)\[([^\]]*\]?[^\]]*)\]", line)
        if not idx:
            continue
        first = _first_slot(idx.group(1).strip("()"))
        if "mbarrier_arrive_expect_tx" in line:
            out[first] = "expect_tx"
        elif "tcgen05_commit" in line:
            m = re.search(r"\(ushort\)\(?(\d+)", line)
            out[first] = f"commit/{bin(int(m.group(1))).count('1') if m and 'multicast' in line else 1}"
        elif "mapa_u32_shared__cluster" in line:
            out[first] = "remote-thread"
        elif "mbarrier_arrive_arrive_shared_b64" in line:
            out[first] = "thread"
    return out


@pytest.mark.parametrize("case", IDS)
def test_arrival_counts_match_the_arrivers(built, case):
    """Every barrier's arrival count is the number of arrivals one phase gets: one expect-tx
    arrive; one commit from every pair leader whose multicast mask covers the CTA; one arrive
    per epilogue thread of every consumer warpgroup (of both CTAs of the pair from v8 on)."""
    mod = _built(built, case).module
    from gemm_ladder.sm100a import common

    launch = mod.manifest()["launch"]
    cluster = launch.get("cluster", 1)
    consumers = launch["threads"] // common.THREADS_PER_WG - 1
    arrays, how = barrier_arrays(mod.source), arrivals(mod.source)
    assert set(how) == set(arrays), (how, arrays)
    expected = {
        "expect_tx": 1,
        "thread": consumers * common.THREADS_PER_WG,
        "remote-thread": common.CTA_PAIR * consumers * common.THREADS_PER_WG,
    }
    for first, kind in how.items():
        slots, count = arrays[first]
        if kind.startswith("commit/"):
            covered = int(kind.split("/")[1])
            # a mask over the whole cluster gets one commit from each pair's leader
            want = cluster // common.CTA_PAIR if covered == cluster > common.CTA_PAIR else 1
        else:
            want = expected[kind]
        assert count == want, f"barrier [{first}..{first + slots}) ({kind}) counts {count}, gets {want}"
    assert sum(1 for k in how.values() if k == "expect_tx") == 1


# -- config errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rung, shape, knobs, match",
    [
        ("v7", (4096,) * 3, {"blk_m": 256}, "blk_m=128"),
        ("v7", (4096,) * 3, {"pipe_depth": 1}, "at least 2"),
        ("v7", (4096,) * 3, {"blk_n": 256, "pipe_depth": 4}, "use pipe_depth=3"),
        ("v8", (4096,) * 3, {"cluster_n": 3}, r"cluster_n in \(1, 2, 4\)"),
        ("v8", (4096,) * 3, {"blk_n": 256, "pipe_depth": 6}, "use pipe_depth=5"),
        ("v8", (4096,) * 3, {"tile_order": "zigzag"}, "tile_order"),
        ("v9", (4096,) * 3, {"epi_consumers": 3}, "use 1 or 2"),
        ("v9", (4096,) * 3, {"blk_n": 192, "epi_consumers": 2}, "use epi_consumers=1 or blk_n=128"),
        ("v9", (4096,) * 3, {"blk_n": 64}, "multiple of 128"),
        ("v9", (4096, 4100, 4096), {}, "multiple of 16"),
    ],
)
def test_bad_knobs_fail_before_compiling(rung, shape, knobs, match):
    import gemm_ladder

    with pytest.raises(ConfigError, match=match):
        gemm_ladder.make_config(rung, *shape, arch=ARCH, **knobs)


def test_v7_to_v9_exist_for_sm100a_only_so_far():
    """A rung may exist for one arch: asking for a form that is not there names the ones that
    are (the Hopper v7-v9 are written separately)."""
    import gemm_ladder
    from gemm_ladder.rungs import available

    for rung in ("v7", "v8", "v9"):
        assert available(rung, ARCH)
        assert callable(getattr(gemm_ladder, f"hgemm_{rung}"))
        if not available(rung, "sm_90a"):
            with pytest.raises(ConfigError, match=f"rung {rung} has no form for arch sm_90a.*sm_100a"):
                gemm_ladder.make_config(rung, 4096, 4096, 4096, arch="sm_90a")


def test_persistent_cluster_grid_is_whole_clusters(monkeypatch):
    """The runtime launches one CTA per SM, rounded down to whole clusters (all of which fit here)."""
    import torch

    from gemm_ladder.core import device

    from gemm_ladder.serve.runtime import GemmModule

    class Props:
        multi_processor_count = 150

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(device, "max_active_clusters", lambda index, cluster, threads, smem: 150 // cluster)
    man = {"rung": "v8", "shape": [4096] * 3, "dtype": "float16", "arch": ARCH, "knobs": {},
           "tvm_version": "0.27.0.post1",
           "launch": {"persistent": True, "cluster": 4, "threads": 384, "smem_bytes": 200000}}
    assert GemmModule("v8.so", man, None).launch_args(torch.device("cuda", 0)) == [148]
    man["launch"] = {"persistent": True}
    assert GemmModule("v7.so", man, None).launch_args(torch.device("cuda", 0)) == [150]
