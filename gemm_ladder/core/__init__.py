"""The core: what every layer above stands on, and nothing of theirs.

``config`` (knobs, the arch table, the rules every rung shares), ``device`` (the GPU's
properties), ``budget`` (shared memory and registers), ``launch`` (a launch and a persistent
schedule), ``records`` and ``files`` (the one typed reader, the one checked writer), ``manifest``
(the format of an exported module's manifest: the builder writes it, the runtime reads it),
``provenance`` (version, commit, time), ``procs`` (work in processes, and its progress bar) and
``cli_types`` (the argument types every command line shares). Imports no TVM and no torch.
"""
