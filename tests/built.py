"""One build per kernel config in a test process (``functools.lru_cache`` on the config, which is
hashable and equal for equal knobs): tests that read one kernel's CUDA source and its SASS, or
compare it with a config that fills in to the same knobs, share the build (an fp8 kernel takes
30-70 s to build on a CI core, and ``--dist loadfile`` keeps a file's tests in one process).
Only for builds made without monkeypatching what a kernel is made of."""

from __future__ import annotations

import functools

import pytest

from gemm_ladder.compile import builder, sass
from gemm_ladder.rungs import kernel_of


@functools.lru_cache(maxsize=None)
def built(cfg):
    """``builder.build(kernel_of(cfg))``, once per config."""
    return builder.build(kernel_of(cfg))


def built_sass(cfg):
    """``(SASS text, resources)`` of :func:`built`'s kernel for ``cfg``; the test skips where this box
    has no SASS tool (cuobjdump is optional: TIRX_NOTES.md)."""
    mod = built(cfg)
    try:
        return sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:
        pytest.skip(f"no SASS here: {err}")
