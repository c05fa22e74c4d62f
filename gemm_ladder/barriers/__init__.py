"""Barrier safety, the tools: the protocol checker's ladder and the watchdog's explanations.

- **the protocol checker** (:mod:`gemm_ladder.protocol`, CPU only): traces a rung, lowers it with
  TVM's tirx pipeline, and runs every thread of a CTA (or of a cluster) through the kernel's
  control flow against a model of mbarriers, TMA and the MMA engines. It prints a table per
  barrier (who arrives, how many bytes each phase expects and receives, who waits on which
  phase) and names every violation with its barrier, phase and role::

      python -m gemm_ladder.barriers                      # the ladder, both archs (what CI runs)
      python -m gemm_ladder.barriers v5 --shape 1000x1000x520 --knob pipe_depth=4

  :mod:`.ladder` is that command; :mod:`.explain` builds a timed-out kernel's watchdog twin and
  says which barrier it waits on; :mod:`.picture` draws a report.
- **the watchdog build** (:mod:`gemm_ladder.sync.classes`, :mod:`gemm_ladder.sync.watchdog`): the
  ``watchdog=SECONDS`` knob bounds every mbarrier wait; a kernel that hangs reports which barrier,
  phase, CTA and role it waits on, as a Python exception. Off by default, and free when off (the
  same SASS).

The layers: the rungs take their barrier classes from :mod:`gemm_ladder.sync` (below them); the
checker's model (:mod:`gemm_ladder.protocol`) sits below the builder, which uses it to name a
watchdog build's waits; these tools sit above the builder. This package imports nothing itself:
``gemm_ladder.measure.isolate`` imports :mod:`.explain` on a runtime-only GPU box.
"""
