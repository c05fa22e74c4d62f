"""The build layer: a rung's prim_func into an exported module (``gemm_ladder.build`` is the API
function over it, so this package is named for what it does).

``builder`` (the pure primitive: trace, compile, export with a manifest), ``toolchain`` (the
device compiler and its cache folder), ``sass`` (the device binary's SASS), ``batch`` (build many
jobs in processes; a folder's manifest), ``module_cache`` (modules built on first use, shared
safely by processes, keyed by what identifies a build). It stands on the core, the rungs and the
protocol checker's model; it imports nothing of serve, measure, tune or the CLI.
"""
