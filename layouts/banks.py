"""Bank-conflict analysis: shared-memory wavefronts per warp request under each layout.

Model (the one Nsight Compute's "shared wavefronts" counts): shared memory has 32 banks of 4
bytes and serves one 128-byte *wavefront* per cycle. A warp request of v-byte vectors is cut
into phases of 128 / v threads (8 threads for 16-byte vectors, 16 for 8-byte, 32 for <= 4-byte);
inside a phase, each bank delivers one 4-byte word per wavefront (threads reading the same word
share it), so a phase costs ``max over banks of distinct words in that bank`` wavefronts::

    16-byte vectors, 32 threads = 512 B = at least 4 wavefronts

    phase 0: threads 0-7    phase 1: threads 8-15    phase 2: 16-23    phase 3: 24-31
    each phase: 8 x 16 B = 32 banks x 4 B when the 8 chunks hit 8 different 4-bank groups

Access patterns modelled (coordinates in elements, every thread moves one 16-byte chunk):

- ``"ldmatrix"``: ldmatrix.x4 / the wgmma core-matrix read. Each phase reads one 8x16-byte
  core matrix: 8 consecutive rows at the same 16-byte column chunk. 4 core matrices per warp:
  (rows 0-7, chunk c), (rows 8-15, c), (rows 0-7, c+1), (rows 8-15, c+1).
- ``"row_store"``: an epilogue where thread t stores a 16-byte vector of row r0 + t, all
  threads at the same column chunk.
- ``"tma_box"``: a TMA box write, modelled as 16-byte chunks in global (row-major) order,
  32 chunks per request. The box's inner extent is one atom row (the hardware caps a swizzled
  box's inner dim at the swizzle width; TVM's "none" layout takes 16-byte-wide boxes).

Under ``rowmajor`` 128-byte rows, the 8 rows of an ldmatrix phase all hit the same 4 banks
(8-way conflict, 32 wavefronts instead of 4); under ``128B`` the XOR spreads them over all 32.
"""

from __future__ import annotations

from dataclasses import dataclass

from .swizzle import (
    BANK_BYTES,
    CHUNK_BYTES,
    NUM_BANKS,
    ROW_MAJOR,
    check_tile,
    swizzle_offset,
    swizzle_width,
)

WAVEFRONT_BYTES = NUM_BANKS * BANK_BYTES  # 128
WARP = 32
PATTERNS = ("ldmatrix", "row_store", "tma_box")


def phase_threads(nbytes: int) -> int:
    """Threads served together in one phase for ``nbytes``-wide per-thread accesses."""
    if nbytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"per-thread access must be 1, 2, 4, 8 or 16 bytes; got {nbytes}")
    return min(WARP, WAVEFRONT_BYTES // nbytes)


def wavefronts(addresses, nbytes: int = CHUNK_BYTES) -> int:
    """Wavefronts one warp request costs; ``addresses[t]`` is thread t's byte address.

    ``None`` entries are inactive threads. Addresses must be ``nbytes``-aligned.
    """
    addresses = list(addresses)
    if len(addresses) > WARP:
        raise ValueError(f"a warp request has at most {WARP} threads; got {len(addresses)}")
    step = phase_threads(nbytes)
    total = 0
    for p in range(0, len(addresses), step):
        words_per_bank: dict[int, set[int]] = {}
        for addr in addresses[p:p + step]:
            if addr is None:
                continue
            if addr % nbytes:
                raise ValueError(f"address {addr} is not {nbytes}-byte aligned")
            for word in range(addr // BANK_BYTES, (addr + max(nbytes, BANK_BYTES)) // BANK_BYTES):
                words_per_bank.setdefault(word % NUM_BANKS, set()).add(word)
        if words_per_bank:
            total += max(len(w) for w in words_per_bank.values())
    return total


def min_wavefronts(active_threads: int, nbytes: int = CHUNK_BYTES) -> int:
    """Lower bound: one wavefront per phase."""
    return -(-active_threads // phase_threads(nbytes))


def _core_matrices(rows, chunks):
    """Core matrices (row0, chunk) in ldmatrix.x4 order: row pairs inner, chunk pairs outer."""
    order = []
    for r16 in range(0, rows, 16):
        for c2 in range(0, chunks, 2):
            for dc in (0, 1):
                for dr in (0, 8):
                    if r16 + dr < rows and c2 + dc < chunks:
                        order.append((r16 + dr, c2 + dc))
    return order


def _box_chunks(mode):
    """16-byte chunks across one TMA box row for this layout (None = whole tile row)."""
    if mode == ROW_MAJOR:
        return None
    return swizzle_width(mode) // CHUNK_BYTES


def pattern_requests(dtype, shape, mode: str, pattern: str) -> list[list[tuple[int, int] | None]]:
    """Warp requests of ``pattern`` covering a 2-D tile once: [(row, col) or None per thread]."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown access pattern {pattern!r}: use one of {PATTERNS}")
    rows, cols, esize = check_tile(dtype, shape, mode)
    if (cols * esize) % CHUNK_BYTES:
        raise ValueError(f"16-byte accesses need rows of a multiple of 16 bytes; got {cols} "
                         f"columns = {cols * esize} bytes")
    per_chunk = CHUNK_BYTES // esize
    chunks = cols // per_chunk
    flat: list[tuple[int, int]] = []
    if pattern == "ldmatrix":
        if rows % 8:
            raise ValueError(f"ldmatrix reads 8-row core matrices; rows={rows} is not a "
                             f"multiple of 8")
        for r0, c in _core_matrices(rows, chunks):
            flat += [(r0 + i, c * per_chunk) for i in range(8)]
    elif pattern == "row_store":
        for c in range(chunks):
            for r0 in range(0, rows, WARP):
                flat_req = [(r, c * per_chunk) for r in range(r0, min(rows, r0 + WARP))]
                flat += flat_req + [None] * (WARP - len(flat_req))
    else:  # tma_box
        box = _box_chunks(mode) or chunks
        for b0 in range(0, chunks, box):
            for r in range(rows):
                flat += [(r, c * per_chunk) for c in range(b0, min(chunks, b0 + box))]
    return [flat[i:i + WARP] for i in range(0, len(flat), WARP)]


@dataclass(frozen=True)
class ConflictReport:
    """Wavefront totals of one pattern over a whole tile under one layout."""

    pattern: str
    mode: str
    requests: int
    wavefronts: int
    ideal: int  # one wavefront per 128 bytes (per phase)
    worst: int  # wavefronts of the most conflicted request

    @property
    def conflict_free(self) -> bool:
        return self.wavefronts == self.ideal

    @property
    def ways(self) -> float:
        """Average conflict degree: 1.0 is conflict-free, 8.0 means 8x the ideal cycles."""
        return self.wavefronts / self.ideal


def conflict_report(dtype, shape, mode: str, pattern: str) -> ConflictReport:
    """Count wavefronts of ``pattern`` over the first stage of a tile stored with ``mode``."""
    shape2 = tuple(shape)[-2:]
    total = ideal = worst = 0
    requests = pattern_requests(dtype, shape2, mode, pattern)
    for req in requests:
        addrs = [None if rc is None else swizzle_offset(dtype, shape2, mode, *rc) for rc in req]
        w = wavefronts(addrs)
        total += w
        worst = max(worst, w)
        ideal += min_wavefronts(sum(a is not None for a in addrs))
    return ConflictReport(pattern, mode, len(requests), total, ideal, worst)
