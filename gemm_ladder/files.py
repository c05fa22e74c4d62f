"""Files that several processes may write at once: atomic replacement and a folder lock.

Two ``export`` or ``tune`` runs into one folder must not leave a half-written file where a
reader (``load``, ``info``, the other run) can see it, nor lose what the other wrote:

- :func:`write_json` and :func:`replacing` write beside the target under a hidden temporary
  name and ``os.replace`` it into place, so a reader sees the old file or the new one;
- :func:`folder_lock` takes an exclusive ``flock`` on ``<folder>/.gemm_ladder.lock`` around a
  read-modify-write (a folder manifest), or refuses a folder another run is using
  (``wait=False``) with :class:`FolderInUse`. The kernel drops the lock when its holder exits,
  however it exits: a crashed run leaves no stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path

LOCK_NAME = ".gemm_ladder.lock"


class FolderInUse(RuntimeError):
    """Another process holds the folder's lock; the message says which and what to do."""


def _temp_beside(path: Path) -> Path:
    # hidden (tools skip dotfiles), unique per process, same suffix (TVM picks the format by it)
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


@contextlib.contextmanager
def replacing(path):
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically, on an
    error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path, data) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    return path


@contextlib.contextmanager
def folder_lock(folder, wait: bool = True, what: str = "this run"):
    """Hold ``folder``'s lock for the block. ``wait=False``: raise :class:`FolderInUse` at once
    when another process holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = lock.read_text(errors="replace").strip() or "another process"
            raise FolderInUse(
                f"{folder} is in use by another gemm_ladder run ({holder}): wait for it to finish, "
                f"or give {what} another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}".encode())
        yield folder
    finally:
        os.close(fd)  # closing drops the flock
