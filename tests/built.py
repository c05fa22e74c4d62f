"""One build per kernel config in a test process (``functools.lru_cache`` on the config, which is
hashable and equal for equal knobs): tests that read one kernel's CUDA source and its SASS, or
compare it with a config that fills in to the same knobs, share the build (an fp8 kernel takes
30-70 s to build on a CI core, and ``--dist loadfile`` keeps a file's tests in one process).
Only for builds made without monkeypatching what a kernel is made of."""

from __future__ import annotations

import functools

from gemm_ladder.compile import builder
from gemm_ladder.rungs import kernel_of


@functools.lru_cache(maxsize=None)
def built(cfg):
    """``builder.build(kernel_of(cfg))``, once per config."""
    return builder.build(kernel_of(cfg))
