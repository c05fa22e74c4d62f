"""The serving layer: run exported modules for a caller.

``runtime`` (load and run with TVM's runtime alone), ``pack`` (the runtime-only site for a GPU
box), ``tma_layout`` (what TMA needs copied), ``kernel_pack`` (packs of exported modules),
``plan`` (which kernel for a shape: the tuning database, else the rules), ``front`` (the front
door, ``gemm_ladder.matmul``), ``ops`` (``torch.ops.gemm_ladder.mm``). It stands on the core and,
on a build box, the build layer; it never imports the tuner, measure or the CLI.
"""
