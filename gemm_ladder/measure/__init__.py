"""The measuring layer: check and time on a GPU.

``harness`` (inputs, the check against torch, timers), ``rounds`` (alternating rounds against
cuBLAS), ``isolate`` (each kernel in a watched child process), ``modules`` (verify and time a
folder of exported modules), ``report`` (the tables), ``suite`` (the shape suite),
``every_model`` (every GEMM of a model's layers). It stands on serve, build and the core; the
tuner and the CLI stand on it.
"""
