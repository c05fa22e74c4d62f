"""Every knob combination the validator accepts must build: a seeded sample of each rung's space.

The tuner enumerates the same space (``tune.space.search_space``) and prunes it with the validator;
here a random sample of what survives, for every Hopper and Blackwell rung that has knobs, is
compiled to a device binary. A config the validator accepts but the compiler rejects fails.
"""

import random

import pytest

from gemm_ladder.tune import space as tune_space
from gemm_ladder.compile.builder import build

SAMPLES = 3
SHAPES = {"v1": (128, 128, 64), "v2": (128, 128, 256)}


def _sample(rung, arch):
    shape = SHAPES.get(rung, (1000, 3000, 520))
    M, N, K = shape
    if rung in SHAPES:  # one-tile rungs: the tile is the shape
        space = {"blk_m": [M], "blk_n": [N]}
    else:
        space = None
    sp = tune_space.search_space(rung, shape, arch=arch, space=space, l2_keep=0)
    assert sp.candidates, f"{rung} {arch}: the validator accepts nothing: {sp.counts()}"
    rng = random.Random(f"{rung}-{arch}")
    return shape, rng.sample(sp.candidates, min(SAMPLES, len(sp.candidates)))


CASES = [(r, a) for a in ("sm_90a", "sm_100a") for r in ("v1", "v2", "v3", "v4", "v5", "v6")]


@pytest.mark.slow
@pytest.mark.parametrize("rung, arch", CASES)
def test_accepted_knobs_build(rung, arch):
    shape, picks = _sample(rung, arch)
    for knobs in picks:
        mod = build(rung, *shape, arch=arch, **knobs)
        assert mod.binary, (rung, arch, knobs)
