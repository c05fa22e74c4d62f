"""Folders and files the project writes, and files it hands to the dynamic loader.

One opener for every folder written into, and atomic writes:

- :func:`open_folder` creates a folder (parents too) and checks that it is one and that this
  process can write in it (``os.access`` *and* a probe file: root passes ``os.access`` on a
  read-only mount or ``/proc``). Every problem is one :class:`FolderError` (a ``ValueError``)
  with a one-line message naming the folder, the problem and the fix; a symlink loop is called
  one, not "does not exist". Commands call it (through :func:`open_build_folders` on a build
  path) before anything compiles;
- :func:`cache_dir` is the user cache (``$GEMM_LADDER_CACHE``, else
  ``$XDG_CACHE_HOME/gemm_ladder``, else ``~/.cache/gemm_ladder``), opened the same way; its
  errors name the variable that chose it;
- :func:`write_json` and :func:`replacing` write beside the target under a hidden temporary
  name and ``os.replace`` it into place, so a reader sees the old file or the new one;
- :func:`folder_lock` opens the folder and takes an exclusive ``flock`` on
  ``<folder>/.gemm_ladder.lock`` around a read-modify-write (a folder manifest), or refuses a
  folder another run is using (``wait=False``) with :class:`FolderInUse`. The kernel drops the
  lock when its holder exits, however it exits: a crashed run leaves no stale lock.

A shared library mapped from a truncated file kills the process with a bus error and no
message, so whatever the project loads with the dynamic loader (the driver stand-in, exported
modules, a runtime pack's libraries) has its size and sha256 recorded when it is written
(:func:`file_record`) and is checked against them before it is loaded (:func:`check_loadable`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

LOCK_NAME = ".gemm_ladder.lock"
CACHE_ENV = "GEMM_LADDER_CACHE"


class FolderError(ValueError):
    """A folder to write into cannot be used; the one-line message names it, why, and the fix."""


class FolderInUse(FolderError, RuntimeError):
    """Another process holds the folder's lock; the message says which and what to do."""


class DamagedFile(ValueError):
    """A file to be loaded does not match the size and sha256 recorded when it was written."""


# -- opening folders --------------------------------------------------------------------------
def _first_ancestor(path: Path, bad) -> Path:
    """The shortest leading part of ``path`` for which ``bad(part)`` holds (``path`` if none)."""
    for part in reversed([path, *path.parents]):
        if bad(part):
            return part
    return path


def _stat_errno(path: Path) -> int:
    try:
        os.stat(path)
    except OSError as err:
        return err.errno
    return 0


def _folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a folder this process writes into (creating it if it is missing)."""
    code = _stat_errno(path)
    if code == errno.ELOOP:
        loop = _first_ancestor(path, lambda p: _stat_errno(p) == errno.ELOOP)
        return "is a symlink loop" if loop == path else f"lies under {loop}, a symlink loop"
    if code == errno.ENOTDIR:
        blocker = _first_ancestor(path, lambda p: p.exists() and not p.is_dir())
        return f"cannot be created ({blocker} is a file, not a folder)"
    if code == errno.ENOENT and path.is_symlink():
        return f"is a symlink to {os.readlink(path)}, which does not exist"
    if code not in (0, errno.ENOENT):
        return f"cannot be reached ({os.strerror(code)})"
    if code == errno.ENOENT:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            near = _first_ancestor(path, lambda p: not p.exists()).parent
            return f"cannot be created under {near} ({err.strerror})"
    mode = os.stat(path).st_mode
    if not stat.S_ISDIR(mode):
        return "is a file, not a folder" if stat.S_ISREG(mode) else "is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return "is not writable (no write permission)"
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".gemm_ladder.probe")
    except OSError as err:
        return f"is not writable (creating a file there fails: {err.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None


def open_folder(path, role: str = "output folder", fix: str | None = None) -> Path:
    """``path`` as a folder this process can write in, created if missing; else :class:`FolderError`
    (``"<role> <path> <problem>: <fix>"``, default fix: choose another ``role``)."""
    path = Path(path)
    problem = _folder_problem(path)
    if problem:
        raise FolderError(f"{role} {path} {problem}: {fix or f'choose another {role}'}")
    return path


def cache_dir() -> Path:
    """The user cache folder (driver stand-in, module and tuning caches), opened and checked;
    an unusable one names the variable that chose it."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return open_folder(env, f"the cache folder (${CACHE_ENV})",
                           f"point ${CACHE_ENV} at a writable folder, or unset it")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = (xdg, "$XDG_CACHE_HOME/gemm_ladder") if xdg else (os.path.expanduser("~/.cache"), "~/.cache/gemm_ladder")
    return open_folder(Path(base[0]) / "gemm_ladder", f"the cache folder ({base[1]})",
                       f"set ${CACHE_ENV} to a writable folder")


def open_build_folders(out, role: str = "output folder") -> Path:
    """What every build checks before it compiles: the cache (:func:`cache_dir`) and ``out``."""
    cache_dir()
    return open_folder(out, role)


def missing(path) -> str:
    """What to say of an input ``path`` that cannot be found: a symlink loop, a broken symlink or
    a file where a folder should be is said to be one, not just "does not exist"."""
    path = Path(path)
    code = _stat_errno(path)
    if code == errno.ELOOP:
        loop = _first_ancestor(path, lambda p: _stat_errno(p) == errno.ELOOP)
        return f"{path} is a symlink loop" if loop == path else f"{path} lies under {loop}, a symlink loop"
    if code == errno.ENOENT and path.is_symlink():
        return f"{path} is a symlink to {os.readlink(path)}, which does not exist"
    if code == errno.ENOTDIR:
        blocker = _first_ancestor(path, lambda p: p.exists() and not p.is_dir())
        return f"{path} does not exist ({blocker} is a file, not a folder)"
    if code == errno.ENOENT:
        return f"{path} does not exist"
    return f"{path} cannot be read ({os.strerror(code) if code else 'it changed while being read'})"


# -- writing files ----------------------------------------------------------------------------
NAME_MAX = 255  # bytes of one file name on Linux's file systems


STEM_MOST = 200  # characters of a module's file stem: "<stem>.so.json" (its manifest) stays within NAME_MAX


def module_stem(tag: str) -> str:
    """A module's file stem from its config tag (every knob spelt out): the tag itself, or, past
    :data:`STEM_MOST` characters (an fp8 128x256 module with a bias and the promotion in halves spells
    out to ~270, over the 255 bytes of a file name), its first characters and a digest of the whole, so
    distinct configs keep distinct names."""
    if len(tag.encode()) <= STEM_MOST:
        return tag
    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    return f"{tag.encode()[:STEM_MOST - 17].decode(errors='ignore')}_{digest}"


def _temp_beside(path: Path) -> Path:
    # hidden (tools skip dotfiles), unique per process, same suffix (TVM picks the format by it); a
    # name that would pass NAME_MAX (a module's, its knobs spelt out, is up to ~245 bytes) by a hash of it
    name = f".{path.stem}.tmp{os.getpid()}{path.suffix}"
    if len(name.encode()) > NAME_MAX:
        name = f".{hashlib.sha256(path.name.encode()).hexdigest()[:20]}.tmp{os.getpid()}{path.suffix}"
    return path.with_name(name)


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


def write_record(path, data) -> Path:
    """Write a results record, ``data``, as compact JSON (one line) to ``path`` atomically. Records are committed
    under benchmarks/results/, and the tracked tree travels to the GPU box within its 64 MiB: indentation cost a
    fifth of their bytes. ``python -m json.tool`` shows one indented."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(data, separators=(",", ":"), default=str) + "\n")
    return path


@contextlib.contextmanager
def folder_lock(folder, wait: bool = True, what: str = "this run", role: str = "folder"):
    """Open ``folder`` (:func:`open_folder`, as ``role``) and hold its lock for the block.
    ``wait=False``: raise :class:`FolderInUse` at once when another process holds it."""
    folder = open_folder(folder, role, f"give {what} another folder")
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


# -- files for the dynamic loader -------------------------------------------------------------
def sha256_of(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path) -> dict:
    """``{"bytes", "sha256"}`` of ``path``: what :func:`check_loadable` checks it against later."""
    return {"bytes": Path(path).stat().st_size, "sha256": sha256_of(path)}


def check_loadable(path, recorded, fix: str | None = None) -> None:
    """Raise :class:`DamagedFile` (``"<path> <problem>: <fix>"``) unless ``path`` has the size and
    sha256 of ``recorded`` (a :func:`file_record`). Run it before the dynamic loader maps the file."""
    path = Path(path)
    tail = f": {fix}" if fix else ""
    if not (isinstance(recorded, dict) and isinstance(recorded.get("bytes"), int)
            and isinstance(recorded.get("sha256"), str)):
        raise DamagedFile(f"{path} has no record of its size and sha256 to check it against{tail}")
    try:
        have = path.stat().st_size
    except OSError:
        raise DamagedFile(f"{missing(path)}{tail}") from None
    if have != recorded["bytes"]:
        cut = " (cut short)" if have < recorded["bytes"] else ""
        raise DamagedFile(f"{path} is {have} bytes, not the {recorded['bytes']} recorded when it was written{cut}{tail}")
    if sha256_of(path) != recorded["sha256"]:
        raise DamagedFile(f"{path} is not the file recorded when it was written (sha256 differs){tail}")
