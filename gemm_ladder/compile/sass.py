"""Read the device binary out of a built or exported module: SASS, resources, key instructions.

An exported ``.so`` carries the kernel as a cubin (an ELF for ``EM_CUDA``) or a fatbin
(magic ``0xBA55ED50``). :func:`device_binaries` cuts them out; :func:`disassemble` and
:func:`resource_usage` run ``cuobjdump`` (from the ``nvidia-cuda-cuobjdump`` wheel or the
PATH) over them. The CPU tests use this to check that a rung really uses the instructions its
technique is about: ``UTMALDG`` (TMA load), ``UTMASTG`` (TMA store), ``HGMMA`` (wgmma),
``UTCHMMA``/``UTCQMMA`` (tcgen05 MMA), ``LDTM`` (TMEM load), ``LDL``/``STL`` (local memory, i.e.
spills).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
FATBIN_MAGIC = bytes.fromhex("50ed55ba")

KEY_INSTRUCTIONS = (
    "UTMALDG", "UTMASTG", "UBLKCP", "HGMMA", "HMMA", "UTCHMMA", "UTCQMMA", "UTCBAR", "LDTM",
    "STTM", "SYNCS", "LDGSTS", "LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDL", "STL", "BAR",
)


class SassToolError(RuntimeError):
    """cuobjdump is missing: the message says which wheel to install."""


def _elf_size(blob: bytes, at: int) -> int:
    shoff = struct.unpack_from("<Q", blob, at + 0x28)[0]
    phoff = struct.unpack_from("<Q", blob, at + 0x20)[0]
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
    return max(shoff + shentsize * shnum, phoff + phentsize * phnum)


def device_binaries(blob: bytes) -> list[tuple[str, bytes]]:
    """Every cubin and fatbin inside ``blob`` as ``(kind, bytes)``; the host ELF is skipped."""
    found = []
    for m in re.finditer(re.escape(ELF_MAGIC), blob):
        at = m.start()
        if at + 64 > len(blob) or blob[at + 4] != 2:  # 64-bit ELF only
            continue
        if struct.unpack_from("<H", blob, at + 0x12)[0] != EM_CUDA:
            continue
        found.append(("cubin", blob[at: at + _elf_size(blob, at)]))
    for m in re.finditer(re.escape(FATBIN_MAGIC), blob):
        at = m.start()
        header = struct.unpack_from("<H", blob, at + 6)[0]
        payload = struct.unpack_from("<Q", blob, at + 8)[0]
        found.append(("fatbin", blob[at: at + header + payload]))
    return found


def has_device_binary(blob: bytes) -> bool:
    return bool(device_binaries(blob))


def cuobjdump() -> str:
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    for base in sys.path:
        cand = Path(base) / "nvidia" / "cu13" / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    raise SassToolError(
        "cuobjdump is not installed: pip install 'nvidia-cuda-cuobjdump>=13.2' 'nvidia-cuda-nvdisasm>=13.2' (or add the CUDA "
        "toolkit's bin/ to the PATH)"
    )


def _run_on(binary: bytes, kind: str, *args: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"kernel.{kind}")
        Path(path).write_bytes(binary)
        exe = cuobjdump()
        # cuobjdump -sass runs nvdisasm; the wheels put both in one bin/ that is not on the PATH
        env = dict(os.environ, NVDISASM_PATH=os.environ.get("NVDISASM_PATH", os.path.dirname(exe)))
        proc = subprocess.run([exe, *args, path], capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SassToolError(f"cuobjdump {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _only_binary(blob_or_binary: bytes) -> tuple[str, bytes]:
    if blob_or_binary.startswith(ELF_MAGIC) and struct.unpack_from("<H", blob_or_binary, 0x12)[0] == EM_CUDA:
        return "cubin", blob_or_binary
    if blob_or_binary.startswith(FATBIN_MAGIC):
        return "fatbin", blob_or_binary
    found = device_binaries(blob_or_binary)
    if not found:
        raise ValueError("no cubin or fatbin in this file: it was not built with a device binary")
    return found[0]


def disassemble(blob_or_binary: bytes) -> str:
    """SASS text of the (first) device binary in a module file or a bare cubin/fatbin."""
    kind, binary = _only_binary(blob_or_binary)
    return _run_on(binary, kind, "-sass")


def instruction_counts(sass: str, names=KEY_INSTRUCTIONS) -> dict[str, int]:
    """How often each opcode in ``names`` appears (``HGMMA.64x128x16.F32`` counts as HGMMA)."""
    counts = collections.Counter()
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass):
        counts[m.group(1)] += 1
    return {n: counts.get(n, 0) for n in names}


@dataclass(frozen=True)
class Resources:
    registers: int
    shared_static: int
    stack: int
    local: int

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def resource_usage(blob_or_binary: bytes) -> Resources:
    """Registers, static shared memory, stack frame and local memory of the kernel (ptxas's numbers)."""
    kind, binary = _only_binary(blob_or_binary)
    out = _run_on(binary, kind, "-res-usage")
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", out)
    if not m:
        raise SassToolError(f"could not read cuobjdump -res-usage output: {out.strip()[:200]}")
    reg, stack, shared, local = (int(x) for x in m.groups())
    return Resources(registers=reg, shared_static=shared, stack=stack, local=local)


def sm_of(blob_or_binary: bytes) -> str:
    """The SASS arch a binary was built for (``sm_90a``, ``sm_100a``)."""
    kind, binary = _only_binary(blob_or_binary)
    out = _run_on(binary, kind, "-sass")
    m = re.search(r"code for (sm_\d+a?)", out)
    return m.group(1) if m else "unknown"
