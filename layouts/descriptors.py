"""wgmma / tcgen05 shared-memory matrix descriptors for K-major tiles, derived from the layout.

A descriptor tells the tensor core how to walk a tile of 8-row x 16-byte *core matrices*.
It holds 16-byte units (the low 4 address bits are dropped)::

    bits   0-13  start address >> 4          (the caller's pointer; see encode_*)
    bits  16-29  leading byte offset  (LBO)  K-direction distance between core matrices
    bits  32-45  stride byte offset   (SBO)  distance between 8-row groups
    bits  62-63  wgmma layout type           0 none, 1 128B, 2 64B, 3 32B
    bits  61-63  tcgen05 layout type         0 none, 2 128B, 4 64B, 6 32B  (+ version=1 at 46)

TVM's ``T.cuda.wgmma.encode_matrix_descriptor(&desc, ptr, ldo, sdo, swizzle)`` and
``T.cuda.tcgen05.encode_matrix_descriptor(...)`` take the *TVM/CUtensorMap* swizzle number
(``SwizzleMode.value``: 0 none, 1 32B, 2 64B, 3 128B) and translate it to the hardware field
themselves. So ``swizzle=3`` means 128B for both, even though wgmma stores 1 and tcgen05 2.

Fields follow from the layout (see :mod:`layouts.swizzle`), W = swizzle width in bytes::

    swizzled (32B/64B/128B)            none (packed 16-byte columns)
    ------------------------------     ------------------------------------
    one W-byte atom column per tile    columns of rows x 16 B, K-major
    LBO  = 1 (ignored by hardware)     LBO  = rows x 16 B / 16 = rows
    SBO  = 8 rows x W / 16             SBO  = 8 rows x 16 B / 16 = 8
    K step (32 B of K) = +2            K step = 2 columns = +2 x rows
    64 more rows = +64 x W / 16        64 more rows = +64

    128B fp16 (64 halves per row): LBO 1, SBO 64, k16 step +2, 64-row block +512 (8 KiB)

One MMA K step is always 32 bytes of K: k16 for fp16/bf16, k8 for tf32, k32 for fp8.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from .swizzle import (
    ATOM_ROWS,
    CHUNK_BYTES,
    SWIZZLE_MODES,
    check_tile,
    dtype_bytes,
    dtype_name,
    swizzle_alignment,
    swizzle_width,
    xor_swizzle,
)

K_STEP_BYTES = 32
FIELD_MAX = (1 << 14) - 1  # LBO, SBO and start address are 14-bit fields of 16-byte units

# TVM SwizzleMode.value == CUtensorMapSwizzle == the encoders' `swizzle` argument
SWIZZLE_CODE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
# what the encoders write into the descriptor's layout-type field
WGMMA_LAYOUT_TYPE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
TCGEN05_LAYOUT_TYPE = {"none": 0, "128B": 2, "64B": 4, "32B": 6}


@dataclass(frozen=True)
class WgmmaDesc:
    """Descriptor fields for one K-major tile; offsets in 16-byte units.

    Pass ``ldo, sdo, swizzle_code`` to TVM's ``encode_matrix_descriptor`` (wgmma or tcgen05:
    same arguments), then add :meth:`offset16` to the descriptor's low word to move inside
    the tile.
    """

    ldo: int
    sdo: int
    swizzle_code: int
    k_step: int  # per MMA K step (32 bytes of K)
    row_block_step: int  # per further 64 rows (a wgmma m64 block)
    mode: str = "128B"
    k_elems: int = 16  # elements of K per step
    k_steps: int = 4  # K steps the tile holds
    stage_step: int = 0  # per stage of a (stages, rows, cols) tile
    alignment: int = 1024  # bytes the tile base must be aligned to
    major: str = "K"  # "K": rows are M/N, K contiguous; "MN": rows are K, M/N contiguous

    @property
    def trans(self) -> int:
        """wgmma's imm-trans-a / imm-trans-b for this tile: 1 for an MN-major (transposed) one."""
        return 1 if self.major == "MN" else 0

    @property
    def wgmma_layout_type(self) -> int:
        return WGMMA_LAYOUT_TYPE[self.mode]

    @property
    def tcgen05_layout_type(self) -> int:
        return TCGEN05_LAYOUT_TYPE[self.mode]

    def offset16(self, k: int = 0, rows: int = 0, stage: int = 0) -> int:
        """16-byte units from the tile base to K step ``k``, row ``rows`` (multiple of 8) of M or
        N (for an MN-major tile: a multiple of 64, the next 64-row block of wgmma's operand)."""
        if self.major == "MN":
            if rows % 64:
                raise ValueError(f"an MN-major descriptor moves in whole 64-row blocks; rows={rows}")
            if not 0 <= k < self.k_steps:
                raise ValueError(f"K step {k} is outside this tile's {self.k_steps} steps")
            return k * self.k_step + rows // 64 * self.row_block_step + stage * self.stage_step
        if rows % ATOM_ROWS:
            raise ValueError(f"descriptors move in whole 8-row groups; rows={rows}")
        if not 0 <= k < self.k_steps:
            raise ValueError(f"K step {k} is outside this tile's {self.k_steps} steps")
        return k * self.k_step + rows // ATOM_ROWS * self.sdo + stage * self.stage_step

    def _check_address(self, smem_address: int) -> int:
        smem_address = operator.index(smem_address)
        if smem_address % self.alignment:
            raise ValueError(
                f"a {self.mode} tile must start {self.alignment}-byte aligned (the hardware "
                f"XORs absolute address bits); got address {smem_address:#x}. Align the "
                f"shared-memory allocation to {self.alignment}"
            )
        if not 0 <= smem_address >> 4 <= FIELD_MAX:
            raise ValueError(f"shared address {smem_address:#x} does not fit 14 bits of 16 B")
        return smem_address

    def encode_wgmma(self, smem_address: int) -> int:
        """The 64-bit wgmma descriptor for a tile at ``smem_address`` (shared-window bytes)."""
        addr = self._check_address(smem_address)
        return ((addr >> 4) | self.ldo << 16 | self.sdo << 32
                | self.wgmma_layout_type << 62)

    def encode_tcgen05(self, smem_address: int) -> int:
        """The 64-bit tcgen05 (sm_100) shared-memory descriptor; version field = 1."""
        addr = self._check_address(smem_address)
        return ((addr >> 4) | self.ldo << 16 | self.sdo << 32 | 1 << 46
                | self.tcgen05_layout_type << 61)


def wgmma_desc_fields(dtype, tile_shape, swizzle: str = "128B") -> WgmmaDesc:
    """Descriptor fields of a K-major shared tile (rows, cols) or (stages, rows, cols).

    The same fields serve tcgen05 (Blackwell): only the encoded layout-type bits differ, and
    TVM's encoder does that translation. Raises ValueError, with a fix, for a tile the mode
    cannot describe.
    """
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(
            f"wgmma/tcgen05 descriptors support swizzle {SWIZZLE_MODES}; got {swizzle!r}. "
            "A plain row-major tile cannot be described: use 'none' (TVM's packed 16-byte "
            "column layout) or a swizzle"
        )
    if len(tile_shape) not in (2, 3):
        raise ValueError(f"tile_shape must be (rows, cols) or (stages, rows, cols); "
                         f"got {tuple(tile_shape)}")
    rows, cols, esize = check_tile(dtype, tile_shape, swizzle)
    row_bytes = cols * esize
    name = dtype_name(dtype)
    if rows % ATOM_ROWS:
        raise ValueError(f"descriptors walk 8-row core matrices; rows={rows} is not a multiple "
                         f"of 8. Pad the tile to rows={-(-rows // 8) * 8}")
    width = swizzle_width(swizzle)
    if swizzle == "none":
        if row_bytes % K_STEP_BYTES:
            raise ValueError(
                f"an MMA K step reads 32 bytes of K; a 'none' tile row of {row_bytes} bytes "
                f"({cols} {name}) is not a multiple. Use cols={-(-row_bytes // 32) * 32 // esize}"
            )
        ldo, sdo = rows * CHUNK_BYTES // 16, ATOM_ROWS * CHUNK_BYTES // 16
        k_step = K_STEP_BYTES // CHUNK_BYTES * ldo
        row_block = 64 * CHUNK_BYTES // 16
    else:
        if row_bytes != width:
            fits = [m for m in ("128B", "64B", "32B") if swizzle_width(m) == row_bytes]
            hint = (f"use swizzle={fits[0]!r} for {cols}-column rows, or " if fits else "")
            raise ValueError(
                f"a K-major {swizzle}-swizzled descriptor needs rows of exactly {width} bytes "
                f"({width // esize} {name}); got {cols} columns = {row_bytes} bytes. "
                f"Fix: {hint}split K into tiles of cols={width // esize}, one descriptor "
                f"(and one TMA box) each"
            )
        ldo = 1  # unused by swizzled K-major layouts; 1 is the conventional filler
        sdo = ATOM_ROWS * width // 16
        k_step = K_STEP_BYTES // 16
        row_block = 64 * width // 16
    stage_step = rows * cols * esize // 16 if len(tile_shape) == 3 else 0
    for field, value in (("LBO", ldo), ("SBO", sdo)):
        if value > FIELD_MAX:
            raise ValueError(f"{field}={value} does not fit the 14-bit field; use fewer rows")
    return WgmmaDesc(
        ldo=ldo,
        sdo=sdo,
        swizzle_code=SWIZZLE_CODE[swizzle],
        k_step=k_step,
        row_block_step=row_block,
        mode=swizzle,
        k_elems=K_STEP_BYTES // esize,
        k_steps=row_bytes // K_STEP_BYTES,
        stage_step=stage_step,
        alignment=max(swizzle_alignment(swizzle), CHUNK_BYTES),
    )


def wgmma_desc_fields_mn(dtype, tile_shape, swizzle: str = "128B") -> WgmmaDesc:
    """Descriptor fields of an MN-major shared tile ``(k_rows, mn_cols)`` or ``(stages, k_rows,
    mn_cols)``: what TMA writes from a ``[K, M]`` (or ``[K, N]``) row-major operand, M (or N)
    contiguous, in the same atoms as a K-major tile (:func:`layouts.swizzle.swizzle_offset` on
    that shape). wgmma reads it with imm-trans = 1 (16-bit types only).

    The PTX ISA's canonical MN-major layout (elements; T = 16 B of elements, W = swizzle bytes)::

        128B:  ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))

    along M/N: 8 chunks of T fill one W-byte atom row, the next W / e elements are LBO further;
    along K: 8 rows of W bytes make an atom, the next 8 rows are SBO further. In the tile,
    column block ``b`` (W / e elements of M/N) starts after all the rows of block ``b - 1``::

        LBO = k_rows x W / 16          (the next 64 M/N elements for 16-bit 128B)
        SBO = 8 x W / 16               (the next 8 rows of K: 1024 B)
        K step (16 rows of K) = +16 x W / 16 = +128;   64 more M/N = +LBO per W / e elements

    Raises ValueError, with a fix, for a tile the mode cannot describe.
    """
    if swizzle not in SWIZZLE_MODES or swizzle == "none":
        raise ValueError(f"MN-major descriptors are modelled for swizzled tiles ('32B', '64B', '128B'); "
                         f"got {swizzle!r}. Use swizzle='128B'")
    if len(tile_shape) not in (2, 3):
        raise ValueError(f"tile_shape must be (k_rows, mn_cols) or (stages, k_rows, mn_cols); got {tuple(tile_shape)}")
    rows, cols, esize = check_tile(dtype, tile_shape, swizzle)
    if esize != 2:
        raise ValueError(f"wgmma reads MN-major (transposed) shared operands of 16-bit types only; got "
                         f"{dtype_name(dtype)}. Store the operand K-major")
    width = swizzle_width(swizzle)
    k_rows_per_step = K_STEP_BYTES // esize  # 16 rows of K per MMA K step
    if rows % k_rows_per_step:
        raise ValueError(f"an MN-major tile holds whole MMA K steps of {k_rows_per_step} rows; got {rows} rows. "
                         f"Use k_rows={-(-rows // k_rows_per_step) * k_rows_per_step}")
    block_elems = width // esize
    if 64 % block_elems and block_elems % 64:
        raise ValueError(f"a {swizzle} MN-major block of {block_elems} elements does not tile wgmma's 64 rows")
    ldo = rows * width // 16
    sdo = ATOM_ROWS * width // 16
    stage_step = rows * cols * esize // 16 if len(tile_shape) == 3 else 0
    for field, value in (("LBO", ldo), ("SBO", sdo)):
        if value > FIELD_MAX:
            raise ValueError(f"{field}={value} does not fit the 14-bit field; use fewer K rows")
    return WgmmaDesc(
        ldo=ldo,
        sdo=sdo,
        swizzle_code=SWIZZLE_CODE[swizzle],
        k_step=k_rows_per_step * width // 16,
        row_block_step=max(1, 64 // block_elems) * ldo,
        mode=swizzle,
        k_elems=k_rows_per_step,
        k_steps=rows // k_rows_per_step,
        stage_step=stage_step,
        alignment=max(swizzle_alignment(swizzle), CHUNK_BYTES),
        major="MN",
    )


def operand_desc_fields(dtype, tile_shape, major: str, swizzle: str = "128B") -> WgmmaDesc:
    """The descriptor fields of a wgmma operand tile stored ``major`` ("K" or "MN")."""
    if major == "K":
        return wgmma_desc_fields(dtype, tile_shape, swizzle)
    if major == "MN":
        return wgmma_desc_fields_mn(dtype, tile_shape, swizzle)
    raise ValueError(f"major={major!r}: use 'K' or 'MN'")


def desc_read_offset(desc: WgmmaDesc, dtype, start: int, mn: int, k: int) -> int:
    """The shared byte offset a wgmma reads element (``mn``, ``k``) of its operand at, from a
    descriptor whose address field is ``start`` bytes past a swizzle-aligned base, per the PTX
    ISA's canonical layouts (swizzled K-major and MN-major); the swizzle XOR is applied to the
    whole address, as the hardware does. The model the tests hold the TMA box placement to."""
    esize = dtype_bytes(dtype)
    width = swizzle_width(desc.mode)
    if desc.mode == "none":
        raise ValueError("desc_read_offset models the swizzled layouts; 'none' is not modelled")
    if desc.major == "K":  # ((8, m), (T, 2k)) : ((8T, SBO), (1, T)), K contiguous within a W-byte row
        offset = (mn % ATOM_ROWS) * width + (mn // ATOM_ROWS) * desc.sdo * 16 + k * esize
    else:  # ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))
        block = width // esize
        offset = (mn % block) * esize + (mn // block) * desc.ldo * 16 + (k % ATOM_ROWS) * width \
            + (k // ATOM_ROWS) * desc.sdo * 16
    return xor_swizzle(start + offset, desc.mode)
