"""Shared-memory and register layouts of the GEMM ladder, as small pure-Python models.

=====================  ===============================================================
module                 what it models
=====================  ===============================================================
``swizzle``            TMA/MMA shared tiles: (row, col) -> byte offset -> bank, per mode
``banks``              wavefronts per warp request (ldmatrix, row stores, TMA box writes)
``descriptors``        wgmma/tcgen05 matrix-descriptor fields derived from the layout
``fragments``          the wgmma m64nNk16 f32 accumulator: (thread, register) -> (row, col)
``plots``              pictures of all of the above (matplotlib, imported on use)
``tvm_bridge``         the one module that imports TVM: ``shared_layout``, ``tvm_swizzle_mode``
=====================  ===============================================================

``import layouts`` does not import TVM or matplotlib; ``shared_layout`` and
``tvm_swizzle_mode`` load :mod:`layouts.tvm_bridge` on first use. The tests check every model
here against TVM's own ``mma_shared_layout`` and the hardware XOR rule.

Quick look::

    >>> from layouts import swizzle_offset, conflict_report, wgmma_desc_fields
    >>> swizzle_offset("float16", (128, 64), "128B", row=1, col=0)   # chunk 0 -> chunk 1
    144
    >>> conflict_report("float16", (128, 64), "128B", "ldmatrix").conflict_free
    True
    >>> conflict_report("float16", (128, 64), "rowmajor", "ldmatrix").ways
    8.0
    >>> d = wgmma_desc_fields("float16", (128, 64), "128B")
    >>> (d.ldo, d.sdo, d.swizzle_code, d.k_step, d.row_block_step)
    (1, 64, 3, 2, 512)
"""

from .banks import (
    PATTERNS,
    ConflictReport,
    conflict_report,
    min_wavefronts,
    pattern_requests,
    wavefronts,
)
from .descriptors import (
    SWIZZLE_CODE,
    WgmmaDesc,
    desc_read_offset,
    operand_desc_fields,
    wgmma_desc_fields,
    wgmma_desc_fields_mn,
)
from .fragments import acc_fragment_coord, acc_fragment_map, acc_fragment_owner, stmatrix_trans_row
from .plots import plot_acc_fragment, plot_swizzle, plot_swizzle_atom, write_all
from .swizzle import (
    LAYOUT_NAMES,
    ROW_MAJOR,
    SWIZZLE_MODES,
    atom_table,
    bank_of,
    bank_of_address,
    dtype_bytes,
    swizzle_alignment,
    swizzle_offset,
    swizzle_width,
    tile_offsets,
    xor_swizzle,
)

_TVM_NAMES = ("shared_layout", "tvm_swizzle_mode")


def __getattr__(name):
    # keep `import layouts` free of TVM (1-4 s to import); load the bridge on first use
    if name in _TVM_NAMES:
        from . import tvm_bridge

        return getattr(tvm_bridge, name)
    raise AttributeError(f"module 'layouts' has no attribute {name!r}")


__all__ = [
    "LAYOUT_NAMES",
    "PATTERNS",
    "ROW_MAJOR",
    "SWIZZLE_CODE",
    "SWIZZLE_MODES",
    "ConflictReport",
    "WgmmaDesc",
    "acc_fragment_coord",
    "acc_fragment_map",
    "acc_fragment_owner",
    "atom_table",
    "bank_of",
    "bank_of_address",
    "conflict_report",
    "desc_read_offset",
    "dtype_bytes",
    "min_wavefronts",
    "operand_desc_fields",
    "pattern_requests",
    "plot_acc_fragment",
    "plot_swizzle",
    "plot_swizzle_atom",
    "shared_layout",
    "swizzle_alignment",
    "swizzle_offset",
    "swizzle_width",
    "tile_offsets",
    "tvm_swizzle_mode",
    "wavefronts",
    "wgmma_desc_fields",
    "wgmma_desc_fields_mn",
    "write_all",
    "xor_swizzle",
]
