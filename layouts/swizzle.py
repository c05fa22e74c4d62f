"""Shared-memory swizzle modes as a pure-Python model: (row, col) -> byte offset -> bank.

A TMA tile in shared memory is K-major: ``cols`` (the last dim) is contiguous. The tile is
cut into *atoms*: 8 rows x W bytes, where W is the swizzle width (16 B for ``none``, 32 B,
64 B or 128 B). Atoms are stacked down the rows first, then the next W-byte column block
starts after all rows (this is how TVM's ``mma_shared_layout`` tiles them)::

    tile (rows, cols) fp16, 32B swizzle: W = 32 B = 16 halves per atom row

        cols 0..15     cols 16..31    cols 32..47    ...
      +------------+ +------------+ +------------+
      | atom  r0-7 | | atom  r0-7 | | atom  r0-7 |
      | atom r8-15 | | atom r8-15 | | atom r8-15 |    column block b starts at
      |    ...     | |    ...     | |    ...     |    b * rows * W bytes
      +------------+ +------------+ +------------+

Inside the tile the byte offset before swizzling is
``stage*rows*cols*e + block*rows*W + row*W + (col*e mod W)`` (e = element bytes). The
swizzle then permutes the 16-byte chunks of each W-byte row by XOR-ing the row-in-atom into
the chunk index; in address bits:

    128B: bits 4-6 ^= bits 7-9      64B: bits 4-5 ^= bits 7-8      32B: bit 4 ^= bit 7

The 128B atom as a table (entry = physical 16-byte chunk that holds logical chunk c of row r;
for fp16 a chunk is 8 columns)::

             logical chunk c ->
              0  1  2  3  4  5  6  7
      row 0   0  1  2  3  4  5  6  7
      row 1   1  0  3  2  5  4  7  6
      row 2   2  3  0  1  6  7  4  5
      row 3   3  2  1  0  7  6  5  4
      row 4   4  5  6  7  0  1  2  3
      row 5   5  4  7  6  1  0  3  2
      row 6   6  7  4  5  2  3  0  1
      row 7   7  6  5  4  3  2  1  0

Every row and every column of the table is a permutation, so 8 rows read at the same logical
chunk land in 8 different chunks = 8 different 4-bank groups: no bank conflict.

Layout names accepted here:

- ``"128B"``, ``"64B"``, ``"32B"``: the swizzled K-major layouts (TMA / wgmma / tcgen05).
- ``"none"``: TVM's *unswizzled MMA* layout. It is NOT row-major: it is the "packed 16-byte
  column" layout that wgmma's SWIZZLE_NONE descriptor reads (8x16-byte core matrices, columns
  of 16 bytes stacked after all rows). Like TVM, a tile whose rows are not a multiple of
  16 bytes falls back to plain row-major.
- ``"rowmajor"`` (:data:`ROW_MAJOR`): a plain row-major tile, what a naive kernel or a single
  unswizzled 2-D TMA box writes. Not a TMA/MMA mode; it is here to show the bank conflicts
  that the swizzles remove.

The hardware applies the XOR to absolute shared-memory address bits, so a swizzled tile must
start on a multiple of its pattern period (:func:`swizzle_alignment`: 8 x W bytes, 1024 B for
128B). Offsets here are relative to such an aligned base.
"""

from __future__ import annotations

import operator

SWIZZLE_MODES = ("none", "32B", "64B", "128B")
ROW_MAJOR = "rowmajor"
LAYOUT_NAMES = (ROW_MAJOR, *SWIZZLE_MODES)

NUM_BANKS = 32
BANK_BYTES = 4
CHUNK_BYTES = 16  # the unit the swizzle permutes, and one ldmatrix / wgmma core-matrix row
ATOM_ROWS = 8

# width of one atom row in bytes; "none" is the 16-byte packed column of the MMA layout
_WIDTH = {"none": 16, "32B": 32, "64B": 64, "128B": 128}
# number of chunk-index bits the XOR touches (log2(W / 16))
_XOR_BITS = {"none": 0, "32B": 1, "64B": 2, "128B": 3}

_DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "tfloat32": 4,
    "int32": 4,
    "uint32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "uint16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3": 1,
    "int8": 1,
    "uint8": 1,
}
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32",
                  "float": "float32", "tf32": "tfloat32", "double": "float64"}


def dtype_name(dtype) -> str:
    """Canonical name of ``dtype`` ("float16", ...); accepts torch/numpy dtypes and aliases."""
    name = str(dtype).removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _DTYPE_BYTES:
        raise ValueError(
            f"unknown dtype {dtype!r}: use one of {sorted(_DTYPE_BYTES)} "
            "(sub-byte types are not modelled)"
        )
    return name


def dtype_bytes(dtype) -> int:
    """Bytes per element of ``dtype``."""
    return _DTYPE_BYTES[dtype_name(dtype)]


def _check_mode(mode: str, allowed=LAYOUT_NAMES) -> str:
    if mode not in allowed:
        raise ValueError(f"unknown swizzle mode {mode!r}: use one of {allowed}")
    return mode


def swizzle_width(mode: str) -> int:
    """Bytes in one atom row: 16 (none), 32, 64 or 128."""
    _check_mode(mode, SWIZZLE_MODES)
    return _WIDTH[mode]


def swizzle_alignment(mode: str) -> int:
    """Byte alignment a tile base needs so the XOR pattern starts at row 0 of an atom."""
    if mode in ("none", ROW_MAJOR):
        return CHUNK_BYTES
    return ATOM_ROWS * swizzle_width(mode)


def xor_swizzle(offset: int, mode: str) -> int:
    """Apply the hardware swizzle to a byte offset (bits 4.. ^= bits 7..)."""
    _check_mode(mode)
    bits = _XOR_BITS.get(mode, 0)
    if bits == 0:
        return offset
    # bits [7, 7+bits) are the row inside the atom; XOR them into the chunk bits [4, 4+bits)
    row_in_atom = (offset >> 7) & ((1 << bits) - 1)
    return offset ^ (row_in_atom << 4)


def check_tile(dtype, shape, mode: str) -> tuple[int, int, int]:
    """Validate a tile for a layout; return (rows, cols, element bytes).

    ``shape`` is (rows, cols) or (*stages, rows, cols); cols is contiguous (K-major).
    Raises ValueError naming the problem and a shape that would work.
    """
    _check_mode(mode)
    esize = dtype_bytes(dtype)
    shape = tuple(operator.index(s) for s in shape)
    if len(shape) < 2 or any(s <= 0 for s in shape):
        raise ValueError(f"tile shape must be (rows, cols) or (stages, rows, cols) of positive "
                         f"ints; got {shape}")
    rows, cols = shape[-2], shape[-1]
    if mode in ("none", ROW_MAJOR):
        return rows, cols, esize
    width = _WIDTH[mode]
    per_row = width // esize
    if (cols * esize) % width:
        raise ValueError(
            f"a {mode}-swizzled tile needs rows of a multiple of {width} bytes "
            f"({per_row} {dtype_name(dtype)} columns); got {cols} columns = {cols * esize} "
            f"bytes. Use cols={max(per_row, cols // per_row * per_row)} or a narrower swizzle"
            + _narrower_hint(cols * esize)
        )
    if rows % ATOM_ROWS:
        raise ValueError(
            f"a {mode}-swizzled tile needs a multiple of {ATOM_ROWS} rows (one atom is "
            f"{ATOM_ROWS} rows x {width} B); got {rows}. Pad the tile to rows="
            f"{-(-rows // ATOM_ROWS) * ATOM_ROWS}"
        )
    return rows, cols, esize


def _narrower_hint(row_bytes: int) -> str:
    fits = [m for m in ("128B", "64B", "32B") if row_bytes % _WIDTH[m] == 0]
    return f" (rows of {row_bytes} B fit swizzle {fits[0]!r})" if fits else ""


def _flat_stage(shape, stage) -> int:
    lead = 1
    for s in shape[:-2]:
        lead *= s
    if not 0 <= stage < lead:
        raise ValueError(f"stage {stage} out of range for tile shape {tuple(shape)}")
    return stage


def linear_offset(dtype, shape, mode: str, row: int, col: int, stage: int = 0) -> int:
    """Byte offset of element (row, col) before the XOR (atoms stacked, see module doc)."""
    rows, cols, esize = check_tile(dtype, shape, mode)
    row, col, stage = operator.index(row), operator.index(col), operator.index(stage)
    if not (0 <= row < rows and 0 <= col < cols):
        raise ValueError(f"(row, col) = ({row}, {col}) is outside a {rows}x{cols} tile")
    base = _flat_stage(shape, stage) * rows * cols * esize
    if mode == ROW_MAJOR or (mode == "none" and (cols * esize) % CHUNK_BYTES):
        return base + (row * cols + col) * esize
    width = _WIDTH[mode]
    block, within = divmod(col * esize, width)
    return base + block * rows * width + row * width + within


def swizzle_offset(dtype, shape, mode: str, row: int, col: int, stage: int = 0) -> int:
    """Byte offset of element (row, col) [of stage ``stage``] in a tile stored with ``mode``.

    ``stage`` indexes the flattened leading dims of a (stages, rows, cols) shape.
    """
    return xor_swizzle(linear_offset(dtype, shape, mode, row, col, stage), mode)


def bank_of(dtype, shape, mode: str, row: int, col: int, stage: int = 0) -> int:
    """Shared-memory bank (0..31) holding the first byte of element (row, col)."""
    return bank_of_address(swizzle_offset(dtype, shape, mode, row, col, stage))


def bank_of_address(byte_address: int) -> int:
    """Bank of a byte address: 32 banks of 4 bytes."""
    return (byte_address // BANK_BYTES) % NUM_BANKS


def atom_table(mode: str) -> list[list[int]]:
    """The chunk permutation of one atom: ``table[r][c]`` = physical chunk of logical chunk c."""
    width = swizzle_width(mode)
    chunks = width // CHUNK_BYTES
    return [[xor_swizzle(r * width + c * CHUNK_BYTES, mode) % width // CHUNK_BYTES
             for c in range(chunks)] for r in range(ATOM_ROWS)]


def tile_offsets(dtype, shape, mode: str):
    """numpy int64 array of ``shape`` holding every element's byte offset (for plots/tests)."""
    import numpy as np

    rows, cols, _ = check_tile(dtype, shape, mode)
    lead = 1
    for s in shape[:-2]:
        lead *= s
    out = np.empty((lead, rows, cols), dtype=np.int64)
    for s in range(lead):
        for r in range(rows):
            for c in range(cols):
                out[s, r, c] = swizzle_offset(dtype, shape, mode, r, c, s)
    return out.reshape(tuple(shape))
