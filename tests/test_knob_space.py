"""Every knob combination the validator accepts must build: a seeded sample of each rung's space.

The tuner enumerates the same space (``tune.space.search_space``) and prunes it with the validator;
here a random sample of what survives, for every Hopper and Blackwell rung that has knobs, is
compiled to a device binary. A config the validator accepts but the compiler rejects fails. The
presets of the production Hopper kernel (v9-v11) declare their knobs as one frozen dataclass each;
their ``KNOBS`` is derived from it and their space goes through the same validator.
"""

import dataclasses
import random
import typing

import pytest

from gemm_ladder.compile.builder import build
from gemm_ladder.core.config import ConfigError
from gemm_ladder.rungs import make_config, rung_module
from gemm_ladder.sm90a import gemm
from gemm_ladder.tune import space as tune_space

SAMPLES = 3
SHAPES = {"v1": (128, 128, 64), "v2": (128, 128, 256)}


def _sample(rung, arch):
    shape = SHAPES.get(rung) or PRESETS.get(rung, (1000, 3000, 520))
    M, N, K = shape
    if rung in SHAPES:  # one-tile rungs: the tile is the shape
        space = {"blk_m": [M], "blk_n": [N]}
    else:
        space = None
    sp = tune_space.search_space(rung, shape, arch=arch, space=space, l2_keep=0)
    assert sp.candidates, f"{rung} {arch}: the validator accepts nothing: {sp.counts()}"
    rng = random.Random(f"{rung}-{arch}")
    return shape, rng.sample(sp.candidates, min(SAMPLES, len(sp.candidates)))


PRESETS = {"v9": (1000, 3000, 520), "v10": (1000, 3000, 2048), "v11": (16, 4096, 2048)}
CASES = [(r, a) for a in ("sm_90a", "sm_100a") for r in ("v1", "v2", "v3", "v4", "v5", "v6")]
CASES += [(r, "sm_90a") for r in PRESETS]


@pytest.mark.parametrize("rung", sorted(PRESETS))
def test_a_preset_declares_its_knobs_once(rung):
    mod = rung_module(rung)
    knobs_class = getattr(mod, f"{rung.upper()}Knobs")
    assert dataclasses.is_dataclass(knobs_class) and knobs_class.__dataclass_params__.frozen
    assert mod.KNOBS == gemm.knob_defaults(knobs_class)
    assert mod.PRESET.name == rung and mod.kernel.__module__ == mod.__name__
    # the declared types are the ones the validator checks
    types = typing.get_type_hints(knobs_class)  # the annotations, resolved (some are strings)
    for f in dataclasses.fields(knobs_class):
        assert type(f.default) is types[f.name], f
        wrong = "x" if types[f.name] is not str else 1
        with pytest.raises(ConfigError, match=f.name):
            make_config(rung, *PRESETS[rung], **{f.name: wrong})
    assert set(mod.TUNE_CHOICES) <= set(mod.KNOBS)


@pytest.mark.parametrize("rung", sorted(PRESETS))
def test_a_preset_space_is_what_the_validator_accepts(rung):
    shape = PRESETS[rung]
    sp = tune_space.search_space(rung, shape, arch="sm_90a", l2_keep=0)
    assert sp.candidates, f"{rung}: the validator accepts nothing: {sp.counts()}"
    # the tuned knobs vary, and every candidate passes the one validator again
    varied = {k for c in sp.candidates for k, v in c.items() if v != rung_module(rung).KNOBS.get(k, v)}
    assert varied, f"{rung}: the search space tries nothing beyond the defaults"
    for knobs in random.Random(rung).sample(sp.candidates, min(20, len(sp.candidates))):
        assert make_config(rung, *shape, **knobs).rung == rung


@pytest.mark.slow
@pytest.mark.parametrize("rung, arch", CASES)
def test_accepted_knobs_build(rung, arch):
    shape, picks = _sample(rung, arch)
    for knobs in picks:
        mod = build(rung, *shape, arch=arch, **knobs)
        assert mod.binary, (rung, arch, knobs)
