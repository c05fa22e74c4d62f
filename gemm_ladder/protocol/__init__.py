"""The barrier protocol checker's model: trace a rung, lower it, and run every thread of a CTA
(or a cluster) through the kernel against a model of mbarriers, TMA and the MMA engines.

``kernel_ir`` (the lowered kernel), ``interp``/``calls``/``exprs``/``values`` (the interpreter),
``sim``/``engines``/``state``/``syncs``/``diagnose``/``words`` (the machine and its findings),
``check`` (the entry points: ``check_config``, ``check_kernel``, ``check_module``,
``watchdog_table``).

It sits below ``gemm_ladder.compile``: a watchdog build names each bounded wait's role with a
short run of it (``check.watchdog_table``). The tools over it that build modules, and the
command line, are ``gemm_ladder.barriers`` (``python -m gemm_ladder.barriers``).
"""
