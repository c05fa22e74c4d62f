"""A whole tuning run in one call: prune, build (cached, in parallel), measure, merge.

    from gemm_ladder.tune.run import tune
    report = tune("v6", (4096, 4096, 4096), space={"pipe_depth": [3, 4, 5]})

``python -m gemm_ladder tune`` runs the same steps (see ``gemm_ladder.cli``), or one of them at
a time for a build box and a GPU box (``--build-only``, ``--measure``, ``--merge``).
"""

from __future__ import annotations

from pathlib import Path

from .cache import build_candidates
from .db import merge
from .measuring import measure
from .space import search_space


def default_out(rung: str, shape, dtype: str, arch: str) -> Path:
    """Where a run puts its candidates when not told: ``build/tune/<rung>_<MxNxK>_<dtype>_<arch>``."""
    M, N, K = shape
    return Path("build") / "tune" / f"{rung}_{M}x{N}x{K}_{dtype}_{arch}"


def tune(rung: str, shape, dtype: str = "float16", arch: str = "sm_90a", space: dict | None = None, *,
         l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None,
         jobs: int | None = None, cache_dir=None, out=None, build_only: bool = False,
         reps: int = 50, timeout: float = 300.0, db=None, plot=True, progress: bool = True,
         identity: dict | None = None) -> dict:
    """Prune, build (cached, in parallel), and unless ``build_only`` measure and merge into ``db``.

    Returns the candidates manifest (``build_only``) or the measurements report (with
    ``"merged"``: what happened in the database).
    """
    M, N, K = (int(x) for x in shape)
    out = Path(out) if out else default_out(rung, (M, N, K), dtype, arch)
    sp = search_space(rung, (M, N, K), dtype, arch, space, l2_keep, num_sms, l2_bytes)
    man = build_candidates(sp, out, cache_dir, jobs, progress, identity)
    if build_only:
        return man
    report = measure(out, reps=reps, timeout=timeout, progress=progress, plot=plot)
    report["merged"] = merge([report["path"]], db)
    return report
