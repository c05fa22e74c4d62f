"""Files the project hands to the dynamic loader are checked first: loading a truncated shared
library kills the process with a bus error (exit 135) and no message.

- the driver stand-in (``toolchain.stub_driver``): its size and sha256 are recorded beside it;
  a truncated or changed copy is rebuilt (atomically) with a one-line warning, or refused in one
  line where no C compiler can rebuild it;
- a runtime pack's libraries (``pack.pack_runtime`` records them in ``site/RUNTIME_LIBS.json``):
  ``gemm_ladder.load`` refuses a pack whose library was cut short, naming it, before TVM loads.

Each case runs in a child process, which must end with an exit status (never a signal) and at
most one line on stderr.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemm_ladder.core import files
from gemm_ladder.serve import pack
from gemm_ladder.core.manifest import MANIFEST_VERSION

REPO = Path(__file__).resolve().parents[1]
HAS_CC = bool(shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc"))

LOAD_STUB = """
import sys
from gemm_ladder.compile import toolchain
try:
    toolchain.load_stub_driver()
except toolchain.ToolchainError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
print("loaded")
"""


def _run(code, env, *args, cwd=REPO):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd=cwd)


def _no_signal_one_line(proc):
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 1, proc.stderr[-2000:]
    return lines[0] if lines else ""


@pytest.mark.skipif(not HAS_CC, reason="no C compiler to build the driver stand-in")
def test_a_damaged_driver_stand_in_is_rebuilt_with_a_warning(tmp_path):
    env = {"GEMM_LADDER_CACHE": str(tmp_path)}
    first = _run(LOAD_STUB, env)
    assert first.returncode == 0 and first.stdout.split() == ["loaded"] and not first.stderr, first.stderr
    stub = tmp_path / "stub-driver" / "libcuda.so.1"
    good = stub.read_bytes()
    assert json.loads(Path(str(stub) + ".json").read_text()) == {"bytes": len(good),
                                                                 "sha256": hashlib.sha256(good).hexdigest()}
    for damage, words in ((good[:1000], "is 1000 bytes, not the"), (bytes(len(good)), "sha256 differs")):
        stub.write_bytes(damage)
        again = _run(LOAD_STUB, env)
        line = _no_signal_one_line(again)
        assert again.returncode == 0 and again.stdout.split() == ["loaded"], again.stderr
        assert line.startswith(f"warning: {stub}") and words in line and line.endswith("rebuilt it")
        assert stub.read_bytes() == good
    # installed atomically: nothing but the library, its record and the lock in the folder
    assert sorted(p.name for p in stub.parent.iterdir()) == [files.LOCK_NAME, "libcuda.so.1", "libcuda.so.1.json"]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler to build the driver stand-in")
def test_a_damaged_driver_stand_in_with_no_compiler_is_refused_in_one_line(tmp_path):
    env = {"GEMM_LADDER_CACHE": str(tmp_path)}
    assert _run(LOAD_STUB, env).returncode == 0
    stub = tmp_path / "stub-driver" / "libcuda.so.1"
    stub.write_bytes(stub.read_bytes()[:1000])
    refused = _run(LOAD_STUB, {**env, "CC": "/nonexistent/cc", "PATH": str(tmp_path / "empty")})
    line = _no_signal_one_line(refused)
    assert refused.returncode == 2 and line.startswith(f"error: {stub} is 1000 bytes")
    assert "cannot be rebuilt" in line and "install gcc" in line


def test_check_loadable_compares_size_and_hash(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x" * 100)
    record = files.file_record(lib)
    files.check_loadable(lib, record, "fix")
    for content, words in ((b"x" * 10, "is 10 bytes, not the 100 recorded when it was written (cut short): fix"),
                           (b"y" * 100, "sha256 differs): fix")):
        lib.write_bytes(content)
        with pytest.raises(files.DamagedFile, match=words.replace("(", r"\(").replace(")", r"\)")):
            files.check_loadable(lib, record, "fix")
    with pytest.raises(files.DamagedFile, match="no record of its size and sha256"):
        files.check_loadable(lib, None, "fix")
    lib.unlink()
    with pytest.raises(files.DamagedFile, match="does not exist: fix"):
        files.check_loadable(lib, record, "fix")


LOAD_MODULE = """
import sys
import gemm_ladder
try:
    gemm_ladder.load(sys.argv[1])
except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
"""


def _module(folder: Path) -> Path:
    """A stand-in module (bytes and a manifest that match): runtime.load gets past its own checks."""
    blob = b"\x7fELF" + bytes(4092)
    so = folder / "m.so"
    so.write_bytes(blob)
    Path(str(so) + ".json").write_text(json.dumps({
        "format": MANIFEST_VERSION, "rung": "v4", "shape": [128, 128, 64], "dtype": "float16", "arch": "sm_90a",
        "knobs": {}, "tvm_version": "0.27.0", "so_bytes": len(blob), "so_sha256": hashlib.sha256(blob).hexdigest()}))
    return so


def test_a_runtime_pack_with_a_library_cut_short_is_refused_before_tvm_loads(tmp_path):
    site = pack.pack_runtime(tmp_path / "rt")
    record = json.loads((site / pack.RUNTIME_LIBS).read_text())["files"]
    libs = {p.relative_to(site).as_posix() for p in site.rglob("*.so*") if p.is_file()}
    assert set(record) == libs and "tvm/lib/libtvm_runtime.so" in libs and "tvm/lib/libtvm_compiler.so" not in libs
    assert not list((tmp_path / "rt").glob(".site*"))  # the staging folder was renamed into place

    lib = site / "tvm" / "lib" / "libtvm_runtime.so"
    with open(lib, "r+b") as f:
        f.truncate(100_000)
    env = {"PYTHONPATH": str(site), "TVM_USE_RUNTIME_LIB": "1"}
    refused = _run(LOAD_MODULE, env, _module(tmp_path), cwd=tmp_path)
    line = _no_signal_one_line(refused)
    assert refused.returncode == 2 and line.startswith(f"error: {lib} is 100000 bytes"), refused.stderr
    assert "run pack-runtime again" in line
