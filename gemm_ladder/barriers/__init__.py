"""Barrier safety: a static check of every rung's mbarrier protocol, and a watchdog build.

Two tools, one package:

- **the protocol checker** (:mod:`.check`, CPU only): traces a rung, lowers it with TVM's tirx
  pipeline, and runs every thread of a CTA (or of a cluster) through the kernel's control flow
  against a model of mbarriers, TMA and the MMA engines (:mod:`.interp`, :mod:`.sim`). It prints
  a table per barrier (who arrives, how many bytes each phase expects and receives, who waits
  on which phase) and names every violation with its barrier, phase and role::

      python -m gemm_ladder.barriers                      # the ladder, both archs (what CI runs)
      python -m gemm_ladder.barriers v5 --shape 1000x1000x520 --knob pipe_depth=4

- **the watchdog build** (:mod:`.classes`, :mod:`.watchdog`): the ``watchdog=SECONDS`` knob
  bounds every mbarrier wait; a kernel that hangs reports which barrier, phase, CTA and role it
  waits on, as a Python exception. Off by default, and free when off (the same SASS).

The rungs take their barrier classes from here (``from ..barriers import TMABar``): TVM's
classes, recorded so that both tools can name them.
"""

from __future__ import annotations

__all__ = ["MBarrier", "TMABar", "TCGen05Bar", "Pipeline", "check_config", "check_kernel", "check_module"]


def __getattr__(name):
    # TVM is imported only when a barrier class or the checker is asked for: the watchdog's
    # runtime half (``.watchdog``) must load on a GPU box with the TVM runtime alone
    if name in ("MBarrier", "TMABar", "TCGen05Bar", "Pipeline"):
        from . import classes  # pylint: disable=import-outside-toplevel

        return getattr(classes, name)
    if name in ("check_config", "check_kernel", "check_module"):
        from . import check  # pylint: disable=import-outside-toplevel

        return getattr(check, name)
    raise AttributeError(name)
