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
from gemm_ladder.serve import kernel_pack, runtime
from gemm_ladder.compile import module_cache
from gemm_ladder.compile.batch import BuildJob
from gemm_ladder.serve.kernel_pack import PACK_MANIFEST, KernelPack, PackError
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
    blob = b"module" * 1000
    so = Path(folder) / f"{job.name}.so"
    with files.replacing(so) as tmp:
        tmp.write_bytes(blob)
    files.write_json(Path(str(so) + ".json"), {
        "format": MANIFEST_VERSION, "rung": job.rung, "shape": list(job.shape), "dtype": "float16", "arch": "sm_90a",
        "knobs": job.knobs, "tvm_version": "0.27.0.post1", "so_bytes": len(blob),
        "so_sha256": hashlib.sha256(blob).hexdigest(), **(job.extra or {})})
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
    from gemm_ladder.serve import plan

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
