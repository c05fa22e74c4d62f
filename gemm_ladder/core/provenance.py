"""Where a result or a module came from: the time, the commit, the TVM version.

One place for the facts every manifest, pack, result file and tuning entry records (the
builder, kernel packs, the harness and the tuner read them here).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import subprocess


def utc_now() -> str:
    """Now, UTC, to the second (ISO 8601): the date every result file records."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def tvm_version() -> str:
    """The installed TVM's version, read without importing TVM."""
    for dist in ("apache-tvm", "tvm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import tvm  # pylint: disable=import-outside-toplevel  (optional: a source build of TVM has no package metadata)

    return tvm.__version__
