"""Output folders and caches go through one opener (``files.open_folder``): a file, a folder
that cannot be written, a path under ``/proc``, a broken symlink or a symlink loop is one
``files.FolderError`` with a one-line message naming the folder and the fix, raised before
anything compiles, on every build path (``build_many``, ``build_pack``, the tuner, ``pack_runtime``).
An unusable ``$GEMM_LADDER_CACHE`` is named as that variable.

We run as root in CI, where ``chmod`` cannot make a folder read-only: unwritable folders are a
path under ``/proc`` (a file cannot be created there, even by root) and a file as a parent.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemm_ladder.compile import batch
from gemm_ladder.core import files, procs
from gemm_ladder.serve import kernel_pack, pack
from gemm_ladder.compile.batch import BuildJob
from gemm_ladder.tune import cache as tune_cache
from gemm_ladder.tune import space as tune_space

REPO = Path(__file__).resolve().parents[1]
HAS_PROC = Path("/proc/self").is_dir()


@pytest.fixture
def bad(tmp_path):
    """Paths that cannot be an output folder, by kind, and the words the message must hold."""
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    cases = {
        "a file": (tmp_path / "file", "is a file, not a folder"),
        "under a file": (tmp_path / "file" / "out", f"({tmp_path / 'file'} is a file, not a folder)"),
        "a symlink loop": (tmp_path / "loop", "is a symlink loop"),
        "under a symlink loop": (tmp_path / "loop" / "out", f"lies under {tmp_path / 'loop'}, a symlink loop"),
        "a broken symlink": (tmp_path / "dangling", f"symlink to {tmp_path / 'nowhere'}, which does not exist"),
    }
    if HAS_PROC:
        cases["under /proc"] = (Path("/proc/gemm_ladder_out"), "cannot be created under /proc")
        cases["/proc itself"] = (Path("/proc"), "is not writable")
    return cases


KINDS = ["a file", "under a file", "a symlink loop", "under a symlink loop", "a broken symlink", "under /proc",
         "/proc itself"]


def _case(bad, kind):
    if kind not in bad:
        pytest.skip("no /proc here")
    return bad[kind]


def _one_line(err) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize("kind", KINDS)
def test_the_opener_names_the_folder_the_problem_and_a_fix(bad, kind):
    path, words = _case(bad, kind)
    with pytest.raises(files.FolderError) as err:
        files.open_folder(path, "output folder")
    text = _one_line(err.value)
    assert text.startswith(f"output folder {path} ") and words in text and "choose another output folder" in text


def test_the_opener_creates_a_missing_folder_and_leaves_no_probe(tmp_path):
    out = files.open_folder(tmp_path / "a" / "b")
    assert out.is_dir() and not list(out.iterdir())
    assert files.open_folder(out) == out  # an existing, writable folder opens again


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(files.FolderError, match="is not writable"):
            files.open_folder(ro)
    finally:
        ro.chmod(0o755)


def test_a_missing_input_says_symlink_loop_not_does_not_exist(bad):
    assert files.missing(bad["a symlink loop"][0]).endswith("is a symlink loop")
    assert "does not exist" not in files.missing(bad["a symlink loop"][0])
    assert "which does not exist" in files.missing(bad["a broken symlink"][0])
    assert files.missing(bad["a file"][0].parent / "nothing") == f"{bad['a file'][0].parent / 'nothing'} does not exist"


@pytest.mark.parametrize("kind", ["a file", "a symlink loop", "under /proc"])
def test_an_unusable_cache_names_the_variable(bad, kind, monkeypatch):
    path, words = _case(bad, kind)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(path))
    with pytest.raises(files.FolderError) as err:
        files.cache_dir()
    text = _one_line(err.value)
    assert "$GEMM_LADDER_CACHE" in text and str(path) in text and words in text
    assert "point $GEMM_LADDER_CACHE at a writable folder, or unset it" in text


def test_an_unusable_default_cache_says_how_to_choose_another(bad, monkeypatch):
    monkeypatch.delenv("GEMM_LADDER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(bad["a file"][0]))
    with pytest.raises(files.FolderError, match=r"\$XDG_CACHE_HOME/gemm_ladder.*set \$GEMM_LADDER_CACHE"):
        files.cache_dir()


# -- every build path checks its folders before it compiles --------------------------------------
@pytest.fixture
def no_compiling(monkeypatch):
    """Fail the test if a build path gets as far as starting its builds."""
    def refuse(*a, **k):
        raise AssertionError("a build started before its folders were checked")

    monkeypatch.setattr(batch, "map_in_processes", refuse)
    monkeypatch.setattr(procs, "map_in_processes", refuse)
    monkeypatch.setattr(tune_cache, "map_in_processes", refuse)


JOB = BuildJob("v4", (128, 128, 64), {"dtype": "float16", "arch": "sm_90a"})


@pytest.mark.parametrize("kind", ["a file", "under a file", "a symlink loop", "under /proc"])
def test_build_many_refuses_a_bad_out_before_compiling(bad, kind, tmp_path, monkeypatch, no_compiling):
    path, words = _case(bad, kind)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(files.FolderError, match="output folder") as err:
        batch.build_many([JOB], path)
    assert words in _one_line(err.value)


def test_every_build_path_refuses_an_unusable_cache_first(bad, tmp_path, monkeypatch, no_compiling):
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(bad["a file"][0]))
    sp = tune_space.Space("v4", (128, 128, 64), "float16", "sm_90a", {}, candidates=[{"blk_n": 64}])
    ident = {"tvm_version": "t", "compiler": "c", "sources": "s"}
    for build in (lambda: batch.build_many([JOB], tmp_path / "out"),
                  lambda: kernel_pack.build_pack(tmp_path / "pack", [(64, 256, 512)], ["float16"]),
                  lambda: tune_cache.build_candidates(sp, tmp_path / "cands", show_progress=False, identity=ident)):
        with pytest.raises(files.FolderError, match=r"\$GEMM_LADDER_CACHE"):
            build()


def test_build_pack_and_the_tuner_refuse_a_bad_out(bad, tmp_path, monkeypatch, no_compiling):
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    path = bad["a file"][0]
    with pytest.raises(files.FolderError, match="is a file, not a folder"):
        kernel_pack.build_pack(path, [(64, 256, 512)], ["float16"])
    sp = tune_space.Space("v4", (128, 128, 64), "float16", "sm_90a", {}, candidates=[{"blk_n": 64}])
    ident = {"tvm_version": "t", "compiler": "c", "sources": "s"}
    with pytest.raises(files.FolderError, match="is a file, not a folder"):
        tune_cache.build_candidates(sp, path, show_progress=False, identity=ident)
    with pytest.raises(files.FolderError, match="tuning cache .* is a file, not a folder"):
        tune_cache.build_candidates(sp, tmp_path / "cands", cache_dir=path, show_progress=False, identity=ident)


def test_pack_runtime_refuses_a_file_and_a_folder_in_use(bad, tmp_path):
    with pytest.raises(files.FolderError, match="runtime pack folder .* is a file, not a folder"):
        pack.pack_runtime(bad["a file"][0])
    with files.folder_lock(tmp_path / "rt"):
        with pytest.raises(files.FolderInUse, match="in use by another gemm_ladder run"):
            pack.pack_runtime(tmp_path / "rt")
    assert not (tmp_path / "rt" / "site").exists()


# -- the commands: one line, exit 2, nothing compiled --------------------------------------------
def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gemm_ladder", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, **(env or {})})


def test_the_commands_report_a_bad_folder_in_one_line(bad, tmp_path):
    cache = {"GEMM_LADDER_CACHE": str(tmp_path / "cache")}
    runs = [
        (_cli("build", "v4", "--shape", "128x128x64", "--out", str(bad["a file"][0]), env=cache), "is a file"),
        (_cli("build", "v4", "--shape", "128x128x64", "--out", str(bad["a symlink loop"][0]), env=cache),
         "symlink loop"),
        (_cli("export", "--rungs", "v4", "--shapes", "128x128x64", "--out", str(tmp_path / "o"),
              env={"GEMM_LADDER_CACHE": str(bad["a file"][0])}), "$GEMM_LADDER_CACHE"),
        (_cli("pack-runtime", str(bad["a file"][0])), "is a file"),
        (_cli("pictures", str(bad["a file"][0])), "is a file"),
    ]
    for run, words in runs:
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and words in lines[0], run.stderr[-2000:]


def test_a_file_whose_name_is_near_the_limit_is_written_atomically(tmp_path, monkeypatch):
    """A module's name spells out its knobs (up to ~245 bytes): its sidecar's temporary name beside it
    (dot, name, ``.tmp`` and the pid) would pass the file system's 255 bytes, so it is a hash of the name."""
    monkeypatch.setattr(os, "getpid", lambda: 4194304)  # Linux's largest pid: seven digits
    path = tmp_path / ("v9_" + "x" * 236 + ".so.json")
    assert len(path.name) == 247
    files.write_json(path, {"ok": 1})
    assert path.read_text().strip().startswith("{") and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    short = tmp_path / "m.json"
    assert files._temp_beside(short).name == ".m.tmp4194304.json"  # pylint: disable=protected-access
