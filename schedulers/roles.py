"""Timing models of the upper rungs (v7-v9): which role does what when, and who loads which part
of a cluster's tiles.

Pure Python, no TVM, no matplotlib: ``gemm_ladder.teach.plot_roles``,
``plot_epilogue_overlap`` and ``plot_cluster_multicast`` draw them for tutorials 08-10. The time
lines are models in units of one K slice's wgmmas whose rules are the rungs' barrier protocols;
their numbers illustrate, the measured ones are in ``benchmarks/results``.
"""

from __future__ import annotations


def role_schedule(rung: str, tiles: int = 3, k_tiles: int = 6, pipe_depth: int = 3, latency: float = 1.6,
                  transfer: float = 0.45, epilogue: float = 2.0, issue: float = 0.25, chunks: int = 4) -> dict:
    """When each load, wgmma and epilogue of one CTA happens, as ``rung`` is written.

    Time is in units of one K slice's wgmmas. A TMA load waits ``latency`` after its issue, then
    takes ``transfer`` on the memory path (loads overlap their latencies, not their transfers);
    a slice's wgmmas start once its bytes landed and the previous slice's are done.

    - ``v6``: thread 0 loads *and* is an MMA thread. It refills the stage of slice j with slice
      j+S in its loop iteration j+1: after issuing slice j+1's wgmmas (``issue``) and waiting
      for slice j's to retire; its warpgroup issues slice j+2's wgmmas only after that load is
      issued. The epilogue runs on every thread.
    - ``v7`` / ``v8``: a producer warpgroup refills a stage as soon as it is released, in its own
      program order; the consumers only wait for bytes. The consumers end a tile together: one
      epilogue of ``epilogue`` units before the next tile's first wgmma.
    - ``v9``: as v7, and each consumer's epilogue is ``chunks`` column chunks: it writes a chunk
      into shared memory (half of the chunk's share of ``epilogue``) and hands it to TMA, whose
      store drains (``stores``) while the consumer goes on to the next chunk and the next tile.

    Returns ``{"loads", "mmas", "epilogues", "stores", "busy", "time", "rung"}``; each interval
    is ``(start, end, "tile.slice")``.
    """
    S = pipe_depth
    n = tiles * k_tiles
    loads, mmas, epis, stores = [], [], [], []
    issue_at = [0.0 if j < S else None for j in range(n)]  # when slice j's load is issued
    bus_free = ready_next = 0.0  # ready_next: earliest start of the next slice's wgmmas
    for j in range(n):
        t, k = divmod(j, k_tiles)
        bus_free = max(issue_at[j] + latency, bus_free) + transfer
        loads.append((issue_at[j], bus_free, f"{t}.{k}"))
        start = max(bus_free, ready_next)
        mmas.append((start, start + 1.0, f"{t}.{k}"))
        ready_next = start + 1.0
        if k >= 1 and j - 1 + S < n:  # slice j-1 is released in this iteration
            if rung == "v6":
                # thread 0 loads slice j-1+S after issuing slice j's wgmmas and seeing j-1
                # retire; its warpgroup reaches slice j+1 only after that
                issue_at[j - 1 + S] = max(start + issue, mmas[j - 1][1])
                ready_next = max(ready_next, issue_at[j - 1 + S] + issue)
            else:
                issue_at[j - 1 + S] = mmas[j - 1][1]  # the producer refills on the release
        if k == k_tiles - 1:
            if j + S < n:  # the last slice is released after wait_group(0), before the epilogue
                issue_at[j + S] = mmas[j][1]
            e0 = start + 1.0
            if rung == "v9":
                write = epilogue / chunks / 2
                for c in range(chunks):
                    epis.append((e0 + c * write, e0 + (c + 1) * write, f"{t}"))
                    stores.append((e0 + (c + 1) * write, e0 + (c + 3) * write, f"{t}"))
                ready_next = e0 + chunks * write
            else:
                epis.append((e0, e0 + epilogue, f"{t}"))
                ready_next = e0 + epilogue
    total = ready_next
    return {"loads": loads, "mmas": mmas, "epilogues": epis, "stores": stores,
            "busy": n / total, "time": total, "rung": rung}


def epilogue_schedule(rung: str, k_tiles: int = 4, tiles: int = 2, write: float = 1.6, drain: float = 1.2,
                      skew: float = 0.5, chunks: int = 4) -> dict:
    """Two consumer warpgroups over ``tiles`` tiles, v8's epilogue against v9's (a model).

    The consumers share the tensor cores: their wgmmas of a slice run one after the other, so
    consumer 1 finishes a tile ``skew`` after consumer 0. ``write``: registers -> shared memory
    of one consumer's rows; ``drain``: the TMA store of them.

    - ``v8``: one epilogue for the CTA: both consumers meet at a named barrier (consumer 0 waits
      for consumer 1), write, meet again; one thread stores the whole tile, which drains while
      the next tile runs. Both start the next tile when the slower one is done.
    - ``v9``: each consumer on its own: it writes its rows in ``chunks`` column chunks, each
      stored as soon as it is written (two buffers: a chunk's buffer waits for the store before
      last); it starts the next tile as soon as its own last chunk is written.

    Returns per consumer ``{"mma", "wait", "write", "store"}`` intervals and the total time.
    """
    rows = {c: {"mma": [], "wait": [], "write": [], "store": []} for c in (0, 1)}
    start = [0.0, 0.0]
    for t in range(tiles):
        ends = []
        for c in (0, 1):
            s = start[c]
            e = s + k_tiles + (skew if c == 1 else 0.0)
            rows[c]["mma"].append((s, e, f"tile {t}"))
            ends.append(e)
        if rung == "v8":
            e0 = max(ends)
            for c in (0, 1):
                if ends[c] < e0:
                    rows[c]["wait"].append((ends[c], e0, ""))
                rows[c]["write"].append((e0, e0 + write, ""))
            rows[0]["store"].append((e0 + write, e0 + write + drain, ""))
            start = [e0 + write, e0 + write]
        else:
            w = write / chunks
            for c in (0, 1):
                for j in range(chunks):
                    a = ends[c] + j * w
                    rows[c]["write"].append((a, a + w, ""))
                    rows[c]["store"].append((a + w, a + w + drain / chunks * 2, ""))
                start[c] = ends[c] + write
    return {"rows": rows, "time": max(start), "rung": rung}


def multicast_plan(cluster_m: int, cluster_n: int, blk_m: int = 128, blk_n: int = 256) -> list[dict]:
    """Who loads what in a cluster: per CTA rank, its tile, the A and B rows it loads and the
    CTA ranks its copy lands in (rank = rank_m + cluster_m * rank_n)."""
    out = []
    for rank in range(cluster_m * cluster_n):
        rm, rn = rank % cluster_m, rank // cluster_m
        a_rows = blk_m // cluster_n
        b_rows = blk_n // cluster_m
        out.append({
            "rank": rank, "tile": (rm, rn),
            "A rows": (rn * a_rows, (rn + 1) * a_rows) if cluster_n > 1 else (0, blk_m),
            "A to": sorted(r for r in range(cluster_m * cluster_n) if r % cluster_m == rm),
            "B rows": (rm * b_rows, (rm + 1) * b_rows) if cluster_m > 1 else (0, blk_n),
            "B to": sorted(r for r in range(cluster_m * cluster_n) if r // cluster_m == rn),
        })
    return out
