"""Register fragment of the wgmma m64nNk16 f32 accumulator (one warpgroup = 4 warps).

Each of the 128 threads holds N/2 f32 registers. Register r of thread (warp w, lane l)::

    i = r // 4        which 8-column group        (N/8 groups)
    j = r % 4         which of the 4 values the thread holds in that group
    row = 16*w + l//4 + 8*(j//2)
    col = 8*i + 2*(l%4) + j%2

One 8-column group of warp 0 (rows 0-15); entries are "lane:reg" for i = 0::

           col 0   col 1   col 2   col 3  ...  col 6   col 7
    row 0   0:0     0:1     1:0     1:1   ...   3:0     3:1
    row 1   4:0     4:1     5:0     5:1   ...   7:0     7:1
    ...
    row 7  28:0    28:1    29:0    29:1   ...  31:0    31:1
    row 8   0:2     0:3     1:2     1:3   ...   3:2     3:3
    ...
    row 15 28:2    28:3    29:2    29:3   ...  31:2    31:3

Warp w owns rows 16w..16w+15, so an epilogue can store each warp's rows independently; each
thread owns pairs of adjacent columns (j%2), which is why 2-element (4-byte) stores are natural.
The arithmetic uses only ``// % * +`` so the same function builds TIR index expressions.
"""

from __future__ import annotations

WARPGROUP_THREADS = 128
M_PER_WARPGROUP = 64


def acc_fragment_coord(r, warp, lane):
    """(row, col) in the 64xN accumulator tile of register ``r`` of thread (warp, lane).

    Works on Python ints and on TVM PrimExprs alike.
    """
    i = r // 4
    j = r % 4
    row = 16 * warp + lane // 4 + 8 * (j // 2)
    col = 8 * i + 2 * (lane % 4) + j % 2
    return row, col


def check_n(n: int) -> int:
    """wgmma m64nNk16 allows N = 8..256 in steps of 8."""
    if not (isinstance(n, int) and 8 <= n <= 256 and n % 8 == 0):
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256; got {n!r}")
    return n


def acc_fragment_map(n: int):
    """int array [thread, reg, 2]: the (row, col) each of 128 threads' N/2 registers holds."""
    import numpy as np

    check_n(n)
    out = np.empty((WARPGROUP_THREADS, n // 2, 2), dtype=np.int64)
    for t in range(WARPGROUP_THREADS):
        for r in range(n // 2):
            out[t, r] = acc_fragment_coord(r, t // 32, t % 32)
    return out


def acc_fragment_owner(n: int):
    """Inverse map, int array [row, col, 2]: (thread, reg) that holds each accumulator."""
    import numpy as np

    fmap = acc_fragment_map(n)
    owner = np.full((M_PER_WARPGROUP, n, 2), -1, dtype=np.int64)
    for t in range(WARPGROUP_THREADS):
        for r in range(n // 2):
            row, col = fmap[t, r]
            owner[row, col] = (t, r)
    return owner


def stmatrix_trans_row(block, half, warp, q):
    """Where ``stmatrix ... .trans`` puts row ``q`` of the 8x8 matrix (``block``, ``half``) of a
    warp's m64nNk16 fragment: ``(row, col)`` of its first element in the *transposed* tile.

    The fragment's 8-column group ``block`` of warp ``warp`` holds two 8x8 matrices, its rows
    ``16*warp + 8*half .. +8`` (registers ``4*block + 2*half`` and ``+1``, one 32-bit pair per
    lane in the layout ``stmatrix`` takes). ``.trans`` stores the transpose, so stored row ``q``
    is the fragment's column ``8*block + q``: row ``8*block + q`` of the transposed tile, its 8
    elements the fragment rows ``16*warp + 8*half .. +8``, which are columns there. Swap AB
    (Hopper v11) writes D this way from accumulators that hold D^T. Works on ints and PrimExprs.
    """
    return 8 * block + q, 16 * warp + 8 * half
