"""What the tuner would try: the pruned search space, for a notebook."""

from __future__ import annotations

from ..rungs import rung_module
from ..tune.space import search_space


def tuning_space(rung: str, shape, space: dict, dtype: str = "float16", arch: str = "sm_90a") -> dict:
    """Which knob combinations survive the config validator and the L2 model
    (``gemm_ladder.tune.space.search_space``): ``{"candidates": [...], "pruned": [(knobs, reason)],
    "source": ...}``. Knobs ``space`` does not name keep the rung's default."""
    space = {**{k: [v] for k, v in rung_module(rung, arch).KNOBS.items()}, **space}
    sp = search_space(rung, tuple(shape), dtype, arch, space)
    return {"candidates": list(sp.candidates), "pruned": [(p["knobs"], p["detail"]) for p in sp.pruned],
            "source": "gemm_ladder.tune.space.search_space (config validator + L2 model)"}
