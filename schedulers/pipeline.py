"""A timing model of one tile's K loop through a ``pipe_depth``-stage ring of TMA loads.

Pure Python, no TVM, no matplotlib: ``gemm_ladder.teach.plot_pipeline_timeline`` draws it, and
tutorial 05 uses it to show why a deeper ring keeps the tensor cores busier.
"""

from __future__ import annotations


def pipeline_schedule(pipe_depth: int, k_tiles: int = 8, mma: float = 1.0, latency: float = 1.5,
                      transfer: float = 0.5) -> dict:
    """A model of one tile's K loop with a ``pipe_depth``-stage ring (``pipe_depth=1`` is v4).

    Time is in units of one K slice's wgmmas (``mma``). A TMA load waits ``latency`` and then
    occupies the memory path for ``transfer`` (loads overlap their latencies but not their
    transfers). Rules, as v4 and v5 are written:

    - one thread issues the loads in slice order; load j goes into stage j % S once slice
      j - S has been released;
    - wgmma of slice j runs when its bytes have landed and the tensor cores are done with j-1;
    - v4 (S=1): slice j is released when its wgmmas finish (``wait_group(0)``, CTA barrier);
    - v5 (S>=2): slice j is released in the next iteration after ``wait_group(1)``: when its
      wgmmas are done AND slice j+1 has landed (the warps wait for it before they get there).

    Returns ``{"loads": [(issue, arrive)], "mmas": [(start, end)], "release": [...],
    "busy": fraction of the time the tensor cores work, "time": total}``.
    """
    S = pipe_depth
    loads, mmas, release = [], [], [None] * k_tiles
    bus_free = 0.0
    for j in range(k_tiles):
        ready = 0.0 if j < S else release[j - S]  # set by iteration j-S+1 <= j-1 (S >= 2) or j-1 (S = 1)
        issue = max(ready, loads[-1][0] if loads else 0.0)
        start_xfer = max(issue + latency, bus_free)
        bus_free = start_xfer + transfer
        loads.append((issue, bus_free))
        start = max(bus_free, mmas[-1][1] if mmas else 0.0)
        mmas.append((start, start + mma))
        # release of slice j-1 (S >= 2) needs slice j landed; of slice j (S == 1) only its MMA
        if S == 1:
            release[j] = mmas[j][1]
        elif j >= 1:
            release[j - 1] = max(mmas[j - 1][1], loads[j][1])
        if S >= 2 and j == k_tiles - 1:
            release[j] = mmas[j][1]
    total = mmas[-1][1]
    return {"loads": loads, "mmas": mmas, "release": release, "busy": k_tiles * mma / total, "time": total}
