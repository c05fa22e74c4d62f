# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Barrier safety: a protocol check before running, a watchdog while running
#
# From v4 on, every rung is a protocol between threads, TMA and the tensor cores, spoken through
# mbarriers. Its bugs are the hardest in this kind of kernel: an `expect_tx` byte count that does
# not match what TMA delivers, an arrival too few for the init count, a phase that flips on the
# wrong cadence, a stage released before the wgmma that reads it retired. On a GPU they show up
# as a hang with no message, or as a wrong answer on some shapes only. `gemm_ladder.barriers`
# gives two tools:
#
# | tool | where | what it says |
# | --- | --- | --- |
# | protocol check (`python -m gemm_ladder.barriers`) | CPU, every rung, in CI | per barrier: who arrives, how many bytes each phase expects and gets, who waits on which phase; every violation with its barrier, phase and role |
# | watchdog build (`watchdog=2` knob) | GPU | a hang becomes `BarrierTimeoutError`: which barrier, phase, CTA and role waits |
#
# **How the check works.** It traces the rung, lowers it with TVM's tirx pipeline (nothing is
# compiled) and runs *every thread of a CTA* through the kernel's control flow against a model
# of mbarriers (init count, pending arrivals, tx-count, phase), TMA copies (they count their full
# box, zero-filled edges included) and the MMA engines (a wgmma group reads its stage until
# `wgmma.wait_group` retires it; a tcgen05.mma until the `tcgen05.commit` barrier completes).
# Vector clocks track what happens before what, so "a stage is refilled only after its release"
# is a clock comparison. It runs a few schedules (threads in order, in reverse, in lockstep) and
# small shapes chosen for the edges: K with fewer slices than stages, as many, more with a
# partial slice; edge tiles; three tiles per persistent CTA.

# %%
import inspect
import sys
from pathlib import Path

import gemm_ladder
from gemm_ladder import teach
from gemm_ladder.barriers import ladder, picture
from gemm_ladder.protocol import check

# %% [markdown]
# ## The table of a healthy rung
#
# v5 at 1000×1000×520 (9 K slices over a 3-stage ring; edge tiles both ways): every barrier,
# who arrives on it (with `expect_tx` bytes), the boxes whose bytes complete it, who waits and on
# which parity, and what each phase got.

# %%
report = check.check_config(gemm_ladder.make_config("v5", 1000, 1000, 520, pipe_depth=3))
print(report.table())

# %% [markdown]
# The picture: one tick per completed phase, per slot, along the lockstep run of CTA 0. The
# full (`tma2mma`, blue) and empty (`mma2tma`, orange) barriers of each stage take turns; the
# last stages' empty barriers complete without a refill waiting on them.

# %%
teach.show(picture.plot_phases(report))

# %% [markdown]
# ## Every rung, both archs
#
# What CI runs (`tests/test_barriers.py`), here for v5 and v6 of both archs at their edge
# scenarios and one schedule (`python -m gemm_ladder.barriers` runs the whole ladder, three):

# %%
for cfg in ladder.ladder_configs(["v5", "v6"]):
    print(check.check_config(cfg, policies=("forward",)).summary())

# %% [markdown]
# ## A broken variant, caught
#
# `tests/barrier_faults.py` keeps deliberately broken variants of real rungs (never shipped). The
# first hands v5 a `TMABar` whose `arrive.expect_tx` counts one A box too many:

# %%
sys.path.insert(0, str(Path.cwd().parent))  # the repository root, for tests/
from tests import barrier_faults  # noqa: E402

print(inspect.getsource(barrier_faults._tma_bar_plus))
broken = barrier_faults.VARIANTS["expect_tx_one_box_over"]
bad = check.check_kernel(broken.prim_func(), policies=("forward", "lockstep"))
for finding in bad.findings[:2]:
    print(finding)

# %%
teach.show(picture.plot_phases(bad, title="v5 with expect_tx one box over: no phase completes"))

# %% [markdown]
# A bug that does not hang: the release moved above `wgmma.wait_group(1)` (a TIR edit of v5's K
# loop). On a GPU it computes a wrong answer now and then; here the clocks say that the stage is
# refilled while the group reading it is still in flight, and through which barrier the early
# release went:

# %%
race = check.check_kernel(barrier_faults.VARIANTS["release_before_wait_group"].prim_func(),
                          policies=("forward",))
print(race.findings[0])

# %% [markdown]
# All the variants and what the check says (the same assertions run in CI):

# %%
for name, variant in barrier_faults.VARIANTS.items():
    r = check.check_kernel(variant.prim_func(), policies=("forward", "lockstep"), which="first")
    cause = next((f for f in r.findings if not f.startswith("[deadlock]")), r.findings[0])
    print(f"{name} ({variant.rung} {variant.arch}): {variant.fault}\n    {cause}\n")

# %% [markdown]
# ## The watchdog build
#
# TVM's mbarrier wait spins forever. With `watchdog=SECONDS` the rungs' barrier classes
# (`gemm_ladder/sync/classes.py`, subclasses of TVM's) emit a *bounded* wait instead: it spins
# on `mbarrier.try_wait.parity` and `%globaltimer`; after the bound the first waiter writes
# (barrier, slot, parity, wait site, CTA, thread, time, the barrier's raw word) into a record in
# pinned host memory passed as the kernel's last argument, and every waiter leaves the kernel
# (`exit`, not `trap`, which would take the CUDA context and the record with it). The host reads
# the record while the kernel still runs, and `gemm_ladder.load(...)` raises
# `BarrierTimeoutError` in words. The manifest carries the table that decodes it: barrier names,
# and per wait site the role and unit the checker found.
#
# Off (the default) the classes emit TVM's own code: same CUDA source, same SASS (a CPU test
# compares them). The knob is part of the config, so the module's name and cache key differ.

# %%
off = gemm_ladder.build("v5", 1000, 1000, 520, pipe_depth=3)
on = gemm_ladder.build("v5", 1000, 1000, 520, pipe_depth=3, watchdog=2)
print(off.cfg.tag(), "->", on.cfg.tag())
for site in on.manifest()["watchdog"]["sites"]:
    print(site)
teach.source_excerpt(on, r"gemm_ladder_bounded_wait\(\(", context=0, max_matches=2)
counts = {"off": teach.sass_counts(off), "on": teach.sass_counts(on)}
print(f"{'SASS':10} {'off':>6} {'on':>6}")
for key in counts["off"]:
    if key in ("registers", "stack", "local") or counts["off"][key] or counts["on"][key]:
        print(f"{key:10} {counts['off'][key]:>6} {counts['on'][key]:>6}")

# %% [markdown]
# ## On a GPU (H100/H200)
#
# The broken variant built with the watchdog, checked the way `verify` checks (a child process
# with a deadline): it ends in seconds with the barrier named, instead of in the deadline.
# `verify` and the GPU test tier also do this by themselves for a module that times out: they run
# its watchdog twin (`gemm_ladder/barriers/explain.py`).

# %%
if teach.gpu_here("sm_90a"):
    from gemm_ladder.measure.isolate import run_isolated

    path = gemm_ladder.build(broken.prim_func(shape=(2048, 2048, 1024), watchdog=2)).export(
        Path("build") / "broken_expect_tx.so")
    res = run_isolated("check", path, 0, timeout=60)
    print(res["status"], "-", res.get("detail"))
else:
    print(teach.no_gpu_message("sm_90a", committed=False))
    log = sorted(Path("../benchmarks/results").glob("*watchdog*/watchdog_log.txt"))
    print(log[-1].read_text() if log else "(no committed watchdog log yet: benchmarks/barrier_watchdog.py)")
