"""What the rungs build with: the barrier classes and the watchdog's bounded wait.

``classes``: TVM's ``MBarrier``, ``TMABar``, ``TCGen05Bar`` and ``Pipeline``, recorded so that the
protocol checker and the watchdog can name each barrier (imports TVM's compiler: the rungs import
it from here, ``from ..sync.classes import TMABar``). ``watchdog``: the bounded wait's CUDA code
and the record it writes, with the runtime half that launches a watchdog build and reads the
record (no TVM: it runs on a GPU box with TVM's runtime alone).

This package imports nothing itself, so that ``gemm_ladder.sync.watchdog`` stays runtime-only.
"""
