"""Tune a rung's knobs for one shape or many: build candidates in parallel, time them on GPUs, remember the best.

    python -m gemm_ladder tune --rung v6 --shape 4096x4096x4096            # GPU box with TVM's compiler
    python -m gemm_ladder tune --plan model.plan --tracker HOST:9190 --key h200   # many shapes, many GPUs
    python -m gemm_ladder serve --key h200                                  # on each GPU host (see serve)
    python -m gemm_ladder tune --rung v6 --shape 4096x4096x4096 --build-only --out build/tune/v6
    python -m gemm_ladder tune --measure build/tune/v6                      # GPU box, runtime-only TVM
    python -m gemm_ladder tune --merge build/tune/v6/measurements_nvidia-h100-80gb-hbm3.json
    python -m gemm_ladder tune --show                                       # the database as a table
    python -m gemm_ladder tune --rung v9 --shape 4096x2112x7168 --dtype float8_e4m3 --fp8-scales block  # fp8

    from gemm_ladder.tune.run import tune
    tune("v6", (4096, 4096, 4096), space={"pipe_depth": [3, 4, 5]})

How a run goes, and the module of each step::

    space      every combination of the rung's knobs (only knobs the rung has: its KNOBS dict;    space
      |        the values to try: space.DEFAULT_CHOICES, or the rung's own TUNE_CHOICES)
      | pruned by rungs.make_config (shared memory, registers, divisibility: each refusal kept
      | with its reason), by dropping l2_group_size where the order ignores it (row, column),
      | and by the L2-reuse model (schedulers.rank_group_sizes over the first waves: the best
      v few l2_group_size values per tile shape and order)
    build      parallel processes; each binary lands in a cache keyed by all that changes it     cache
      |        (a second identical run builds nothing)
      v        --build-only: a folder of .so + .so.json and candidates.json
    measure    isolate's "time" job in a watched child, a deadline per candidate: checked on     measuring
      |        randn inputs, then timed against cuBLAS in the same process, as ``bench`` does; a
      |        wrong, crashing or hanging candidate is recorded and the search goes on
    confirm    the --confirm best (default 4) timed again together: isolate's "rounds" job, each  measuring,
      |        candidate and cuBLAS taking turns in the same rounds after a warm-up at the power  rounds
      v        limit; their numbers replace the first pass's (kept as first_pass), and they rank
               first (device.speed_rank). Local measuring only: RPC servers give the first pass
    (or rpc:   batches of candidates uploaded to TVM RPC servers, one per GPU, from a tracker;    rpc, serve
      |        each server measures them as above and replies; a server that dies or hangs
      v        costs the candidate it held, the run goes on with the others)
    merge      the fastest correct candidate goes into the tuning database                       db
    use        gemm_ladder.build(rung, M, N, K) with no knobs takes the database's best          db
               (db.tuned_knobs; builder.build itself never reads the database);
               measuring.load_best(folder) loads the fastest measured module of a folder

An fp8 job (``--dtype float8_e4m3``, ``--fp8-scales``, ``--fp8-out``; a plan line's ``dtype=float8_e4m3
fp8_scales=...``) tunes scaled_mm's kernel: its operand spec is built into every candidate and keys the
cache, the space varies the ring, the order, the L2 group and the clusters around the policy's knobs for the
shape (``space.FP8_CHOICES``), each candidate is checked and timed against ``torch._scaled_mm`` on the same
fp8 inputs (``measure.harness``), in CUDA graphs by default (``measuring.default_timer``; ``--timer``), and
the best merges as an entry of its spec, which ``plan.fp8_policy`` and ``pack build`` then read.

Tables and the plot of a measurement are in ``report``; ``run.tune`` is the whole run in one call,
``run.tune_many`` a run over a list of jobs (``jobs``: rungs x shapes x dtypes, e.g. a model's
weight shapes at a few M), with one progress bar over all and one table at the end.

Measuring needs only the TVM runtime: ``measuring``, ``report``, ``jobs``, ``rpc`` and ``serve``
import no TVM compiler, no rungs, no ``layouts`` or ``schedulers``, and this package's
``__init__`` imports nothing, so they run on a GPU box from the runtime pack.
"""
