"""The only module of ``layouts`` that imports TVM (pinned: apache-tvm 0.27).

Everything TVM-specific the layouts need lives here, so a TVM rename touches one file:

- ``SwizzleMode`` and ``mma_shared_layout`` moved to ``tvm.backend.cuda.tile_primitive.
  tma_utils`` in 0.27 (they were under ``tvm.tirx.cuda.operator`` before).
- Evaluating a layout on concrete coordinates: ``layout.apply(*coord, shape=shape)`` returns
  ``{"m": PrimExpr}`` (the memory axis, in elements). Constant coordinates fold to an
  ``IntImm`` already; ``tvm.sym.Analyzer().simplify`` (0.27 has no ``tvm.arith``) covers the
  rest. ``shape=`` is needed because ``mma_shared_layout`` returns a *canonicalized* layout
  whose shard is often 1-D (e.g. ``ComposeLayout(3, 3, 3, S[8192:1])`` for 128x64 fp16).
"""

from __future__ import annotations

import tvm
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode, mma_shared_layout
from tvm.sym import Analyzer

from .swizzle import SWIZZLE_MODES, ROW_MAJOR, check_tile, dtype_bytes, dtype_name

_MODE_TO_TVM = {
    "none": SwizzleMode.SWIZZLE_NONE,
    "32B": SwizzleMode.SWIZZLE_32B_ATOM,
    "64B": SwizzleMode.SWIZZLE_64B_ATOM,
    "128B": SwizzleMode.SWIZZLE_128B_ATOM,
}


def tvm_swizzle_mode(mode: str) -> SwizzleMode:
    """TVM's SwizzleMode for a mode name; ``.value`` is the descriptor encoders' argument."""
    if mode not in _MODE_TO_TVM:
        raise ValueError(f"unknown swizzle mode {mode!r}: use one of {SWIZZLE_MODES}")
    return _MODE_TO_TVM[mode]


def shared_layout(dtype, shape, mode: str = "128B"):
    """TVM's layout for a K-major shared tile (``mma_shared_layout``), validated first.

    TVM itself does not validate: a 128B (64, 96) fp16 tile silently gets a 64x64 layout and
    (64, 32) dies with "Divide by zero". ``mode="rowmajor"`` gives a plain TileLayout.
    """
    check_tile(dtype, shape, mode)
    shape = [int(s) for s in shape]
    if mode == ROW_MAJOR:
        from tvm.tirx.layout import S, TileLayout

        return TileLayout(S[tuple(shape)])
    return mma_shared_layout(dtype_name(dtype), tvm_swizzle_mode(mode), shape)


def layout_apply(layout, shape, coord) -> int:
    """Evaluate a TVM layout at one concrete coordinate; the memory offset in elements."""
    out = layout.apply(*[int(c) for c in coord], shape=[int(s) for s in shape])
    value = out["m"]
    if not isinstance(value, tvm.tirx.IntImm):
        value = Analyzer().simplify(value)
    return int(value)


def tvm_byte_offset(dtype, shape, mode: str, coord) -> int:
    """Byte offset TVM's own layout assigns to ``coord`` (builds the layout every call)."""
    return layout_apply(shared_layout(dtype, shape, mode), shape, coord) * dtype_bytes(dtype)


def tvm_dtype_bytes(dtype) -> int:
    return tvm.DataType(dtype_name(dtype)).bits // 8


def tcgen05_desc_base(ldo: int, sdo: int, swizzle_code: int) -> int:
    """TVM's compile-time tcgen05 descriptor (address bits 0) for these fields."""
    from tvm.backend.cuda.cpp.descriptors import encode_smem_descriptor_base_uint64

    return int(encode_smem_descriptor_base_uint64(ldo, sdo, swizzle_code))


def wgmma_encoder_cpp() -> str:
    """Host-compilable C++ of TVM's wgmma descriptor encoder (its real bitfield + body).

    Defines ``uint64_t encode(uint32_t addr, int ldo, int sdo, int swizzle)``; used by the
    tests to check what the ``swizzle`` argument really writes.
    """
    import inspect

    from tvm.backend.cuda.codegen.header import header_generator
    from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY

    header = header_generator(["gmma_descriptor"])
    start = header.index("union GmmaDescriptor")
    end = header.index("};", header.index("operator uint64_t", start)) + 2
    union = header[start:end]
    wrapper = CODEGEN_REGISTRY["tirx.cuda.wgmma_encode_matrix_descriptor"]
    body = inspect.getclosurevars(inspect.unwrap(wrapper)).nonlocals["body"]
    return (
        "#include <cstdint>\n#include <cstdio>\n#include <cstdlib>\n"
        "#define HOST_DEVICE inline\n"
        "static inline uint32_t __cvta_generic_to_shared(void* p) {"
        " return (uint32_t)(uintptr_t)p; }\n"
        f"{union}\n"
        "static void tvm_encoder(uint64_t* desc, void* addr, int ldo, int sdo, int swizzle) {\n"
        f"{body}\n}}\n"
        "int main(int argc, char** argv) {\n"
        "  for (int i = 1; i + 3 < argc; i += 4) {\n"
        "    uint64_t d;\n"
        "    tvm_encoder(&d, (void*)(uintptr_t)strtoul(argv[i], 0, 0), atoi(argv[i + 1]),\n"
        "                atoi(argv[i + 2]), atoi(argv[i + 3]));\n"
        "    printf(\"%llu\\n\", (unsigned long long)d);\n"
        "  }\n"
        "}\n"
    )
