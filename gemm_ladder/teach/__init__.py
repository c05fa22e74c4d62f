"""Helpers for the tutorials (``tutorials/NN_*.py``): show what a rung changed, what it compiled to,
and what it measured, without pasting code into the notebooks.

    from gemm_ladder import teach
    teach.rung_diff("v3", "v4")                   # unified diff of the two rung files
    built = gemm_ladder.build("v4", 256, 256, 256)
    teach.describe(built)                          # shape, knobs, grid, threads, shared memory
    teach.source_excerpt(built, r"expect_tx")      # the generated CUDA around a pattern
    teach.show_sass_counts(built)                  # key SASS instructions, registers, spills
    teach.committed_results("v4")                  # benchmarks/results/*.json rows of v4
    teach.show(teach.plot_pipeline_timeline())     # a picture, as a PNG in the notebook

Modules: ``sources`` (rung files, diffs), ``built`` (a built module's source, SASS, counts),
``gpu`` (the GPU cells), ``results`` (committed measurements), ``plots`` (pictures; ``roles``
for the pictures of v7-v9), ``tuning`` (the tuner's pruned space), ``shapes`` (tutorial 11: waves,
weight streaming, swap-AB and split-K pictures, the front door's policy; ``from gemm_ladder.teach
import shapes``), ``fp8`` (tutorial 16: the wgmma a module issues, a model of fp8 accumulation
and the promotion, the committed fp8 measurements; ``from gemm_ladder.teach import fp8``),
``fusion`` (tutorial 14: the bytes a fused epilogue saves, its generated lines), ``operands``
(tutorial 15: operand layouts, TMA boxes and descriptors, the op's autograd calls; imports TVM and
torch: ``from gemm_ladder.teach import operands``); :func:`committed_run` reads one committed run
of a check script (GPU, clocks, commit, rows). The models the pictures draw live with the other
models: ``schedulers.pipeline`` (the K-loop pipeline), ``schedulers.roles`` (producer/consumer
roles, epilogues, cluster multicast), ``schedulers.orders``/``traffic`` (tile orders),
``gemm_ladder.core.budget`` (shared memory).

Pictures are drawn on matplotlib's Agg canvas (no display needed) and handed to the notebook as
PNG data by :func:`show`, so they appear the same under Jupyter, nbclient and GitHub's viewer.

GPU work goes through :func:`check_and_time`, which exports the module and runs
``gemm_ladder.measure.isolate.run_isolated("check" / "time")`` in a child process: a kernel that
deadlocks is reported, not waited on. :func:`gpu_here` says whether there is a GPU of the arch.

Importing this package imports neither TVM nor matplotlib.
"""

from schedulers.pipeline import pipeline_schedule

from .built import config_of, describe, sass_counts, sass_text, show_sass_counts, source_excerpt
from .gpu import check_and_time, gpu_here, no_gpu_message
from .plots import (plot_cta_grid, plot_grouped_walk, plot_k_loop, plot_pipeline_timeline, plot_smem_budget, plot_tma_box,
                    show)
from .results import (RESULTS_DIR, CommittedRun, ResultTable, committed_results, committed_run, geomean, ratio_summary,
                      sampled_clocks)
from .roles import plot_cluster_multicast, plot_epilogue_overlap, plot_roles
from .sources import REPO, diff_text, function_source, rung_diff, rung_source, rung_source_path, show_source
from .tuning import tuning_space

__all__ = [
    "REPO", "RESULTS_DIR", "ResultTable", "check_and_time", "committed_results", "config_of", "describe",
    "diff_text", "function_source", "gpu_here", "no_gpu_message", "pipeline_schedule", "plot_cluster_multicast",
    "plot_cta_grid", "plot_epilogue_overlap", "plot_grouped_walk", "plot_k_loop", "plot_pipeline_timeline", "plot_roles",
    "plot_smem_budget", "plot_tma_box", "rung_diff", "rung_source",
    "rung_source_path", "sass_counts", "sass_text", "show", "show_sass_counts", "show_source",
    "source_excerpt", "tuning_space",
    "CommittedRun", "committed_run", "geomean", "ratio_summary", "sampled_clocks",
]
