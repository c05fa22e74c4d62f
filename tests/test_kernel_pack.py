"""Kernel packs and the module cache, on the CPU: what a pack serves (and how well), every way a
pack can be damaged (a clear error before the loader sees a file), the cache shared by two
processes at once, and one real pack build."""

import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemm_ladder.core import files, manifest
from gemm_ladder.serve import first_use, front, kernel_pack, plan, runtime
from gemm_ladder.compile import module_cache
from gemm_ladder.compile.batch import BuildJob
from gemm_ladder.serve.kernel_pack import PACK_MANIFEST, KernelPack, PackError
from gemm_ladder.core.config import LARGEST_TILE, IndexRangeError, largest_m
from gemm_ladder.core.manifest import MANIFEST_VERSION

REPO = Path(__file__).resolve().parents[1]


def _module(folder: Path, name: str, rung="v9", shape=(64, 256, 512), dtype="float16", dynamic=False,
            payload: bytes | None = None) -> dict:
    """A stand-in module (bytes and a format-2 manifest), and its pack.json entry."""
    blob = payload or hashlib.sha256(name.encode()).digest() * 64
    so = folder / name
    so.write_bytes(blob)
    man = {"format": MANIFEST_VERSION, "rung": rung, "shape": list(shape), "dtype": dtype, "arch": "sm_90a",
           "knobs": {"dtype": dtype, "arch": "sm_90a"}, "tvm_version": "0.27.0.post1",
           "launch": {"dynamic_m": True} if dynamic else {}, "so_bytes": len(blob),
           "so_sha256": hashlib.sha256(blob).hexdigest()}
    Path(str(so) + ".json").write_text(json.dumps(man))
    return {"file": name, "rung": rung, "shape": list(shape), "dtype": dtype, "arch": "sm_90a", "knobs": man["knobs"],
            "dynamic_m": dynamic, "m_range": [1, 64] if dynamic else [shape[0], shape[0]],
            "so_bytes": len(blob), "so_sha256": man["so_sha256"], "choice": {"source": "rule", "rule": "r", "why": "w"}}


def _pack(folder: Path, entries) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    files.write_json(folder / PACK_MANIFEST, {"format": kernel_pack.PACK_FORMAT, "version": kernel_pack.PACK_VERSION,
                                              "arch": "sm_90a", "modules": entries})
    return folder


@pytest.fixture
def pack(tmp_path):
    folder = tmp_path / "pack"
    folder.mkdir()
    entries = [_module(folder, "small_any.so", shape=(1, 256, 512), dynamic=True),
               _module(folder, "m128.so", shape=(128, 256, 512)),
               _module(folder, "m2048.so", shape=(2048, 256, 512)),
               _module(folder, "bf16.so", shape=(128, 256, 512), dtype="bfloat16")]
    entries[0]["m_range"] = [1, 64]
    return _pack(folder, entries)


# -- what a pack serves -------------------------------------------------------------------------
@pytest.mark.parametrize("M, file, fit", [
    (128, "m128.so", "exact"),           # built for this M
    (16, "small_any.so", "tuned-range"),  # a runtime-M module whose knobs were chosen for 1..64
    (100, "small_any.so", "any-m"),       # nothing exact: the runtime-M module, outside its range
    (2048, "m2048.so", "exact"),
])
def test_find_ranks_what_a_pack_holds(pack, M, file, fit):
    found = KernelPack(pack).find(M, 256, 512, "float16", "sm_90a")
    assert (found.entry["file"], found.fit) == (file, fit)
    assert str(pack) in found.describe()


def test_find_pads_m_only_without_a_runtime_m_module(tmp_path):
    folder = tmp_path / "static"
    folder.mkdir()
    _pack(folder, [_module(folder, "m128.so", shape=(128, 256, 512)), _module(folder, "m2048.so", shape=(2048, 256, 512))])
    found = KernelPack(folder).find(100, 256, 512, "float16", "sm_90a")
    assert (found.entry["file"], found.fit) == ("m128.so", "pad-m") and "zero-padded rows" in found.describe()
    assert KernelPack(folder).find(4096, 256, 512, "float16", "sm_90a") is None  # no larger M to pad to


def test_overlapping_ranges_go_to_the_module_chosen_nearest(tmp_path):
    """A rule can hold at M = 128 and 2048 but not at 512: the module chosen at 512 serves 512."""
    folder = tmp_path / "overlap"
    folder.mkdir()
    large = _module(folder, "large.so", shape=(128, 256, 512), dynamic=True)
    few = _module(folder, "few.so", shape=(512, 256, 512), dynamic=True)
    large.update(m_range=[128, 2048], m_values=[128, 2048])
    few.update(m_range=[512, 512], m_values=[512])
    pk = KernelPack(_pack(folder, [large, few]))
    assert [pk.find(M, 256, 512, "float16", "sm_90a").entry["file"] for M in (128, 512, 1024, 2048, 8192)] == \
        ["large.so", "few.so", "large.so", "large.so", "large.so"]


def test_find_matches_n_k_dtype_and_arch(pack):
    pk = KernelPack(pack)
    assert pk.find(128, 256, 512, "bfloat16", "sm_90a").entry["file"] == "bf16.so"
    for args in [(128, 512, 256, "float16", "sm_90a"), (128, 256, 512, "float16", "sm_100a")]:
        assert pk.find(*args) is None


def test_a_good_pack_checks(pack):
    pk = KernelPack(pack)
    for e in pk.modules:
        assert pk.check_entry(e) == pack / e["file"]


# -- a weight's whole M range (pack build --weights NxK) ---------------------------------------
def _cells_of(items) -> list[list[int]]:
    """The M ranges of the policy's choices (alternatives serve M some choice serves already)."""
    return sorted(run["m_range"] for i in items for run in i["served"] if not run.get("alternative"))


def _bucket_of(M: int) -> int:
    """The bucket that serves M: the least at or above it (kernel_pack.bucket_cells)."""
    return next(b for b, lo, hi in kernel_pack.bucket_cells() if lo <= M <= hi)


# one weight planned over its whole M range: its buckets at M = 96 and 128 are the row-tile rule's sub-wave grids,
# with alternatives (at 4096x4096 narrow-n's tiles fill the SMs at M = 128 since 2026-11-29)
WEIGHT = (4096, 8192)


@pytest.fixture(scope="module")
def weight_plan():
    """The plan of one weight for its whole M range (plan_pack: the policy, nothing built)."""
    return kernel_pack.plan_pack([], ["float16"], sms=132, weights=[WEIGHT])


def test_the_buckets_tile_the_whole_m_range():
    cells = kernel_pack.bucket_cells()
    assert [c[0] for c in cells] == list(kernel_pack.M_BUCKETS) and cells[0][1] == 1 and cells[-1][2] == 16384
    assert all(lo <= b == hi for b, lo, hi in cells)
    assert all(a[2] + 1 == b[1] for a, b in zip(cells, cells[1:]))  # no gap, no overlap


def test_a_weight_too_wide_for_16384_rows_stops_at_the_most_it_takes():
    """A 152k-row lm_head indexes at most 14080 rows in 32 bits: the ladder ends there, tiled."""
    most = largest_m(151936, 896, *LARGEST_TILE)
    assert 12288 < most < 16384 and kernel_pack.weight_buckets(151936, 896)[-2:] == (12288, most)
    assert kernel_pack.weight_buckets(4096, 4096) == kernel_pack.M_BUCKETS
    items = kernel_pack.plan_pack([], ["float16"], sms=132, weights=[(151936, 896)])
    cells = _cells_of(items)
    assert cells[0][0] == 1 and cells[-1][1] == most and all(a[1] + 1 == b[0] for a, b in zip(cells, cells[1:]))
    with pytest.raises(IndexRangeError, match="32-bit"):
        kernel_pack.weight_buckets(2**20, 2**12)  # N x K alone past the limit: said, not an empty plan


def test_a_weight_without_m_is_planned_at_every_bucket(weight_plan):
    """Every bucket is served by the module of the policy's choice there; the modules' ranges
    tile 1..16384; one file a module (a choice that wins two runs of buckets gets two entries)."""
    cells = _cells_of(weight_plan)
    assert cells[0][0] == 1 and cells[-1][1] == 16384
    assert all(a[1] + 1 == b[0] for a, b in zip(cells, cells[1:])), cells
    assert len({i["file"] for i in weight_plan}) == len(weight_plan)
    assert all(i["dynamic_m"] and "_anyMx4096x8192_" in i["file"] for i in weight_plan)
    for b in kernel_pack.M_BUCKETS:
        item, run = next((i, r) for i in weight_plan for r in i["served"]
                         if b in r["m_values"] and not r.get("alternative"))
        choice = plan.choose(plan.Problem(b, *WEIGHT, "float16", "sm_90a", 132))
        job = BuildJob(choice.rung, (b, *WEIGHT), {**choice.knobs, "dynamic_m": True})
        assert item["file"] == kernel_pack._name(job, True) + ".so", b
        assert run["m_range"][0] <= b <= run["m_range"][1]


def test_a_module_that_wins_two_runs_of_buckets_gets_two_ranges():
    """Chosen at 1024, 3072 and 4096 but not 1536 and 2048: two entries, no overlap."""
    asks = [(b, lo, hi, True) for b, lo, hi in kernel_pack.bucket_cells() if b in (1024, 3072, 4096)]
    assert kernel_pack._runs(asks) == [{"m_range": [769, 1024], "m_values": [1024]},
                                       {"m_range": [2049, 4096], "m_values": [3072, 4096]}]
    # requested M alone (--shapes) keep one range from the least to the largest, as before
    assert kernel_pack._runs([(16, 16, 16, False), (128, 128, 128, False)]) == \
        [{"m_range": [16, 128], "m_values": [16, 128]}]


def _planned_pack(folder: Path, items) -> KernelPack:
    """A pack of ``items`` (plan_pack's) with stand-in modules, one entry a range served."""
    folder.mkdir()
    entries = []
    for item in items:
        entry = _module(folder, item["file"], item["job"].rung, item["job"].shape, dynamic=True)
        entries += [{**entry, **run} for run in item["served"]]
    return KernelPack(_pack(folder, entries))


@pytest.mark.parametrize("M", [1, 3, 100, 5000, 16384])
def test_find_serves_any_m_of_a_weight_from_its_bucket(weight_plan, tmp_path, M):
    found = _planned_pack(tmp_path / "pack", weight_plan).find(M, *WEIGHT, "float16", "sm_90a")
    assert found.fit == "tuned-range" and _bucket_of(M) in found.entry["m_values"], (M, found.entry)
    assert f"M in {found.entry['m_range'][0]}..{found.entry['m_range'][1]}" in found.describe()


def test_every_m_up_to_16384_is_a_tuned_range_fit_and_none_past_it(weight_plan, tmp_path):
    pk = _planned_pack(tmp_path / "pack", weight_plan)
    for M in range(1, 16385):
        found = pk.find(M, *WEIGHT, "float16", "sm_90a")
        assert found.fit == "tuned-range" and _bucket_of(M) in found.entry["m_values"], M
    top = pk.find(16384, *WEIGHT, "float16", "sm_90a").entry
    for M, far in ((16385, False), (65536, False), (65537, True)):
        found = pk.find(M, *WEIGHT, "float16", "sm_90a")
        assert (found.fit, found.entry) == ("any-m", top)
        assert (front._far(found.entry, found.fit, M) is not None) == far, M


def test_pack_show_says_which_m_each_module_serves(weight_plan, tmp_path):
    _planned_pack(tmp_path / "pack", weight_plan)
    out = subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", "show", str(tmp_path / "pack")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "M served" in lines[0] and "chosen at M" in lines[0]
    assert "role" in lines[0]
    served = [line.split()[4] for line in lines[2:] if line.split()[-2] == "choice"]
    assert served == [f"{r[0]}..{r[1]}" for r in _cells_of(weight_plan)]  # in M order
    alts = [line for line in lines[2:] if line.split()[-2] == "alternative"]
    assert len(alts) == sum(bool(r.get("alternative")) for i in weight_plan for r in i["served"]) > 0
    assert all("v10_anyM" in line or "v9_anyM" in line for line in alts)  # splits and small tiles, runtime M


# -- damaged packs: a clear error, naming the file and the fix -----------------------------------
def _damage(pack: Path, how: str):
    man = json.loads((pack / PACK_MANIFEST).read_text())
    so = pack / "m128.so"
    if how == "no_manifest":
        (pack / PACK_MANIFEST).unlink()
    elif how == "cut_manifest":
        text = (pack / PACK_MANIFEST).read_text()
        (pack / PACK_MANIFEST).write_text(text[: len(text) // 2])
    elif how == "other_format":
        (pack / PACK_MANIFEST).write_text(json.dumps({**man, "format": "something"}))
    elif how == "new_version":
        (pack / PACK_MANIFEST).write_text(json.dumps({**man, "version": 99}))
    elif how == "entry_without_field":
        del man["modules"][1]["so_sha256"]
        (pack / PACK_MANIFEST).write_text(json.dumps(man))
    elif how == "missing_file":
        so.unlink()
    elif how == "truncated_file":
        so.write_bytes(so.read_bytes()[:100])
    elif how == "changed_file":  # same size, other bytes: the module's own manifest catches it
        blob = bytearray(so.read_bytes())
        blob[-1] ^= 0xFF
        so.write_bytes(bytes(blob))
    elif how == "mismatched_module":  # a whole other module (with its own manifest) under this name
        other = _module(pack, "m128.so", rung="v6", shape=(128, 256, 512))
        man["modules"][1].update(so_bytes=other["so_bytes"])
        (pack / PACK_MANIFEST).write_text(json.dumps(man))
    elif how == "swapped_module":  # another module of the same kernel: the sha256 pack.json holds differs
        _module(pack, "m128.so", shape=(128, 256, 512), payload=b"x" * 4096)
        man["modules"][1].update(so_bytes=4096)
        (pack / PACK_MANIFEST).write_text(json.dumps(man))


DAMAGE = {
    "no_manifest": ["pack.json is missing", "not a kernel pack", "pack build"],
    "cut_manifest": ["not valid JSON", "cut short", "rebuild"],
    "other_format": ["not a gemm_ladder.kernel_pack manifest"],
    "new_version": ["version 99", "reads version 1"],
    "entry_without_field": ["field 'modules[1].so_sha256' is missing"],
    "missing_file": ["lists m128.so", "not in", "copy the whole pack folder"],
    "truncated_file": ["m128.so is 100 bytes", "cut short"],
    "changed_file": ["m128.so", "sha256 differs"],
    "mismatched_module": ["holds v6", "lists v9"],
    "swapped_module": ["not the module pack.json lists", "sha256 differs"],
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_pack_gives_a_clear_error(pack, how):
    _damage(pack, how)
    with pytest.raises(PackError) as err:
        pk = KernelPack(pack)
        for e in pk.modules:
            pk.check_entry(e)
    for words in DAMAGE[how]:
        assert words in str(err.value), (how, str(err.value))


def test_the_cli_checks_a_pack(pack):
    run = lambda *a: subprocess.run([sys.executable, "-m", "gemm_ladder", "pack", *a], capture_output=True, text=True,
                                    cwd=REPO, timeout=120)
    good = run("check", str(pack))
    assert good.returncode == 0 and good.stdout.count(" ok") == 4, good.stdout + good.stderr
    _damage(pack, "truncated_file")
    bad = run("check", str(pack))
    assert bad.returncode == 1 and "cut short" in bad.stdout
    (pack / PACK_MANIFEST).unlink()
    assert run("show", str(pack)).returncode == 2


# -- the module cache -------------------------------------------------------------------------
IDENT = {"tvm_version": "0.27.0.post1", "compiler": "nvrtc 13.0", "sources": "s"}
JOB = BuildJob("v4", (256, 256, 128), {"dtype": "float16", "arch": "sm_90a"})


def fake_build(job, folder):
    """Stands in for a build: slow enough for two processes to meet at the lock; counts itself."""
    time.sleep(1.0)
    with open(Path(folder).parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    return stand_in_build(job, folder)


def stand_in_build(job, folder):
    """A module's bytes and its manifest, at once (what module_cache keeps of a build)."""
    blob = f"module {job.name}".encode() * 100
    so = Path(folder) / f"{job.name}.so"
    with files.replacing(so) as tmp:
        tmp.write_bytes(blob)
    files.write_json(Path(str(so) + ".json"), {
        "format": MANIFEST_VERSION, "rung": job.rung, "shape": list(job.shape), "dtype": "float16", "arch": "sm_90a",
        "knobs": job.knobs, "tvm_version": "0.27.0.post1", "so_bytes": len(blob),
        "so_sha256": hashlib.sha256(blob).hexdigest(), **(job.extra or {}),
        **({"launch": {"dynamic_m": True}} if job.knobs.get("dynamic_m") else {})})
    return so


def _get(root):
    path, how = module_cache.get_or_build(JOB, root, build=fake_build, ident=IDENT)
    return str(path), how


def test_two_processes_share_the_cache_and_build_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.map(_get, [str(tmp_path)] * 2)
    assert got[0][0] == got[1][0]
    assert sorted(how for _, how in got) == ["built", "cache"]
    assert len((tmp_path / "builds.log").read_text().split()) == 1
    assert _get(tmp_path)[1] == "cache"


def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    path, _ = _get(tmp_path)
    Path(path).write_bytes(b"cut")
    assert _get(tmp_path) == (path, "built")


def test_the_cache_key_leaves_m_out_of_runtime_m_modules():
    static = [module_cache.module_key(BuildJob("v9", (M, 4096, 4096), {}), IDENT) for M in (16, 64)]
    dynamic = [module_cache.module_key(BuildJob("v9", (M, 4096, 4096), {"dynamic_m": True}), IDENT) for M in (16, 64)]
    assert static[0] != static[1] and dynamic[0] == dynamic[1]
    # defaults filled in: naming a default knob is the same module
    assert module_cache.module_key(BuildJob("v9", (16, 4096, 4096), {"blk_m": 128}), IDENT) == static[0]


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "c"))
    assert module_cache.cache_root() == tmp_path / "c" / "modules"
    monkeypatch.delenv("GEMM_LADDER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert module_cache.cache_root() == tmp_path / "xdg" / "gemm_ladder" / "modules"


def test_why_a_box_cannot_build(monkeypatch):
    assert module_cache.why_cannot_build() is None  # this box has TVM's compiler and NVRTC
    monkeypatch.setenv(module_cache.BUILD_ENV, "0")
    assert "switched off" in module_cache.why_cannot_build()
    monkeypatch.delenv(module_cache.BUILD_ENV)
    monkeypatch.setenv("TVM_USE_RUNTIME_LIB", "1")
    assert "runtime-only" in module_cache.why_cannot_build()


def test_a_pack_built_for_a_weight_tiles_its_m_range(tmp_path, monkeypatch):
    """build_pack of a weight (stand-in builds): one file a module, one entry a range it serves,
    and the entries tile 1..16384; the folder checks."""
    real = module_cache.get_or_build
    monkeypatch.setattr(module_cache, "get_or_build",
                        lambda job, root=None: real(job, root, build=stand_in_build, ident=IDENT))
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["float16"], sms=132, workers=1,
                                 cache_root=tmp_path / "cache", weights=[WEIGHT])
    assert {r["status"] for r in man["results"]} == {"built"}
    pk = KernelPack(tmp_path / "pack")
    ranges = sorted(e["m_range"] for e in pk.modules if not kernel_pack.is_alternative(e))
    assert ranges[0][0] == 1 and ranges[-1][1] == 16384 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    alts = [e for e in pk.modules if kernel_pack.is_alternative(e)]  # built, marked, within the choices' M
    assert alts and all(any(r[0] <= e["m_range"][0] and e["m_range"][1] <= r[1] for r in ranges) for e in alts)
    assert len({e["file"] for e in pk.modules}) == len(man["results"]) == len(list((tmp_path / "pack").glob("*.so")))
    assert all(pk.check_entry(e) for e in pk.modules)


# -- a real pack --------------------------------------------------------------------------------
@pytest.mark.slow
def test_build_a_pack_and_find_its_modules(tmp_path, monkeypatch):
    """Two M of one rule share a module where the rung takes M at run time; the pack records
    which rule chose it; a second build of the same shapes takes everything from the cache."""
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMM_LADDER_TUNING_DB", "off")
    shapes = [(12, 256, 512), (16, 256, 512), (300, 256, 520)]
    man = kernel_pack.build_pack(tmp_path / "pack", shapes, ["float16"], sms=132, workers=2)
    assert all(r["status"] == "built" for r in man["results"]), man["results"]
    pk = KernelPack(tmp_path / "pack")
    small = pk.find(16, 256, 512, "float16", "sm_90a")
    assert small.entry["choice"]["rule"] == plan.rule_choice(plan.Problem(16, 256, 512)).rule
    if small.entry["dynamic_m"]:
        assert small.fit == "tuned-range" and small.entry["m_range"] == [12, 16]
        assert pk.find(12, 256, 512, "float16", "sm_90a").entry == small.entry
    odd = pk.find(300, 256, 520, "float16", "sm_90a")  # K=520 is a multiple of 8: no padding
    assert odd is not None and pk.check_entry(odd.entry)
    again = kernel_pack.build_pack(tmp_path / "pack2", shapes, ["float16"], sms=132, workers=2)
    assert {r["status"] for r in again["results"]} == {"cache"}
    assert kernel_pack.pack_bytes(tmp_path / "pack") < 2 * 2**20


@pytest.mark.slow
def test_build_a_pack_for_a_weight(tmp_path, monkeypatch):
    """A small weight built for its whole M range: every entry checks against its real module, and
    M = 1, 100 and 16384 each find the module chosen at their bucket."""
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMM_LADDER_TUNING_DB", "off")
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["float16"], sms=132, workers=2, weights=[(256, 512)])
    assert all(r["status"] == "built" for r in man["results"]), man["results"]
    pk = KernelPack(tmp_path / "pack")
    assert all(pk.check_entry(e) for e in pk.modules)
    for M in (1, 100, 16384):
        found = pk.find(M, 256, 512, "float16", "sm_90a")
        assert found.fit == "tuned-range" and _bucket_of(M) in found.entry["m_values"], (M, found.entry)


# -- packs built before a knob was retired (v9's pingpong) ---------------------------------------
def _with_knobs(folder: Path, knobs: dict, in_module: bool = True) -> Path:
    """A one-module pack whose pack.json entry (and the module's own manifest) carry ``knobs``."""
    folder.mkdir(parents=True)
    entry = _module(folder, "old.so", shape=(128, 256, 512))
    entry["knobs"] = {**entry["knobs"], **knobs}
    if in_module:
        man_path = folder / "old.so.json"
        man_path.write_text(json.dumps({**json.loads(man_path.read_text()), "knobs": entry["knobs"]}))
    return _pack(folder, [entry])


def test_a_pack_built_with_a_retired_knob_at_its_default_loads(tmp_path):
    pack = _with_knobs(tmp_path / "old", {"pingpong": False, "epi_n": 64})
    pk = KernelPack(pack)
    found = pk.find(128, 256, 512, "float16", "sm_90a")
    assert found.entry["knobs"] == {"dtype": "float16", "arch": "sm_90a", "epi_n": 64}  # ignored, the rest kept
    assert pk.check_entry(found.entry) == pack / "old.so"
    assert "pingpong" not in manifest.read_manifest(pack / "old.so")["knobs"]


def test_a_pack_built_with_a_retired_knob_set_is_refused(tmp_path):
    pack = _with_knobs(tmp_path / "old", {"pingpong": True})
    with pytest.raises(PackError) as err:
        KernelPack(pack)
    msg = str(err.value)
    assert all(w in msg for w in ["pack.json", "modules[0]", "pingpong=True", "rebuild this pack", "pack build"]), msg
    with pytest.raises(manifest.ManifestError, match=r"pingpong=True.*rebuild this module"):
        manifest.read_manifest(pack / "old.so")


# -- alternatives beside a sub-wave choice (issue 30) -------------------------------------------
SUB_WAVE = (128, *WEIGHT)  # and M = 96 of the same weight: one module of each kind serves both


@pytest.fixture(scope="module")
def sub_wave_plan():
    """128x4096x8192: the policy's v9 choice (row-tiles) runs 64 tiles on 132 SMs; plan.alternatives offers split K."""
    return kernel_pack.plan_pack([(96, *SUB_WAVE[1:]), SUB_WAVE], ["float16"], sms=132)


def test_plan_pack_lists_the_alternatives_of_a_sub_wave_choice(sub_wave_plan):
    p = plan.Problem(*SUB_WAVE, "float16", "sm_90a", 132)
    offered = plan.alternatives(p, plan.choose(p))
    entries = [e for i in sub_wave_plan for e in kernel_pack.entries_of(i)]
    main = [e for e in entries if not kernel_pack.is_alternative(e)]
    alts = [e for e in entries if kernel_pack.is_alternative(e)]
    assert len(main) == 1 and main[0]["rung"] == "v9" and main[0]["choice"]["rule"] == "row-tiles"
    assert len(alts) == len(offered) >= 1
    for e, c in zip(alts, offered):
        assert e["rung"] == c.rung and e["dynamic_m"] and e["knobs"].get("split_k", 1) == c.knobs.get("split_k", 1)
        assert e["choice"]["rule"] == c.rule in (plan.ALT_RULE, plan.ALT_SMALL_RULE)
        assert "64 of 132 SMs" in e["choice"]["why"]
        assert (e["m_range"], e["m_values"]) == (main[0]["m_range"], main[0]["m_values"])  # the same M served
    assert kernel_pack.plan_pack([(96, *SUB_WAVE[1:]), SUB_WAVE], ["float16"], sms=132, alternatives=False) == \
        [i for i in sub_wave_plan if not any(r.get("alternative") for r in i["served"])]
    # a shape whose choice fills the SMs gets none
    assert not any(r.get("alternative") for i in kernel_pack.plan_pack([(4096, 4096, 4096)], ["float16"], sms=132)
                   for r in i["served"])


def test_find_keeps_the_choice_and_serving_offers_the_alternatives(sub_wave_plan, tmp_path):
    """Without the measurement the policy's choice serves; the first use times it and the
    alternatives, the choice first (front._with_candidates keeps the first MAX_CANDIDATES)."""
    pk = _planned_pack(tmp_path / "pack", sub_wave_plan)
    _, N, K = SUB_WAVE
    for M in (128, 111, 96):
        found = pk.find(M, N, K, "float16", "sm_90a")
        assert not kernel_pack.is_alternative(found.entry) and found.entry["rung"] == "v9"
        assert "alternative" not in found.describe()
        serving = pk.serving(M, N, K, "float16", "sm_90a")
        assert serving[0].entry is found.entry
        alts = [f for f in serving[1:first_use.MAX_CANDIDATES] if kernel_pack.is_alternative(f.entry)]
        assert len(alts) == sum(kernel_pack.is_alternative(e) for e in pk.modules) >= 1
        assert all("an alternative to the policy's choice" in f.describe() for f in alts)


def test_an_alternative_serves_where_nothing_else_does(tmp_path):
    folder = tmp_path / "pack"
    folder.mkdir()
    alt = {**_module(folder, "alt.so", rung="v10", shape=(1, 256, 512), dynamic=True), "alternative": True}
    pk = KernelPack(_pack(folder, [alt]))
    assert pk.find(16, 256, 512, "float16", "sm_90a").entry["file"] == "alt.so"


def test_an_old_pack_without_the_field_loads_and_a_bad_field_is_refused(pack):
    pk = KernelPack(pack)
    assert "alternative" not in json.loads((pack / PACK_MANIFEST).read_text())["modules"][0]
    assert not any(kernel_pack.is_alternative(e) for e in pk.modules)
    assert pk.find(16, 256, 512, "float16", "sm_90a").entry["file"] == "small_any.so"
    man = json.loads((pack / PACK_MANIFEST).read_text())
    man["modules"][0]["alternative"] = "yes"
    (pack / PACK_MANIFEST).write_text(json.dumps(man))
    with pytest.raises(PackError, match=r"modules\[0\]\.alternative"):
        KernelPack(pack)


def test_pack_build_dry_run_without_alternatives():
    args = [sys.executable, "-m", "gemm_ladder", "pack", "build", "--shapes", "x".join(map(str, SUB_WAVE)),
            "--dtypes", "float16", "--sms", "132", "--dry-run"]
    with_alts, without = (subprocess.run(args + extra, capture_output=True, text=True, cwd=REPO, timeout=120)
                          for extra in ([], ["--no-alternatives"]))
    assert with_alts.returncode == 0 and without.returncode == 0, with_alts.stderr + without.stderr
    roles = [[line.split()[-1] for line in out.stdout.splitlines()[2:-1]] for out in (with_alts, without)]
    assert roles[0][0] == "choice" and roles[0].count("alternative") >= 1 and "v10_anyM" in with_alts.stdout
    assert roles[1] == ["choice"] and "1 modules" in without.stdout
