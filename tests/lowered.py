"""The host half of a rung's module after TVM's tirx pipeline, for tests that check the launch.

The CUDA source has the device half only; the tensor maps with their box sizes and the kernel
launch with its grid and dynamic shared memory are in the lowered host code.
"""

from __future__ import annotations

import re

from gemm_ladder.compile import builder
from gemm_ladder.rungs import kernel_of


def lowered_script(mod) -> str:
    """The module after TVM's tirx pipeline, host side included (as ``tvm.compile`` runs it).

    The CUDA source has the device half of TMA only; the host half (the tensor maps with
    their box sizes, and the launch with its dynamic shared memory) is in this script.
    """
    import tvm

    from gemm_ladder.rungs import kernel_of

    target = tvm.target.Target({"kind": "cuda", "arch": mod.cfg.arch})
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    with target:
        irmod = tvm.IRModule.from_expr(kernel_of(mod.cfg))
        irmod = tvm.tirx.transform.BindTarget(target.with_host(host))(irmod)
        pipeline, _, _ = tvm.tirx.get_tir_pipeline("tirx")
        irmod = pipeline(irmod)
    return irmod.script()


def launch_of(script: str) -> dict[str, str]:
    """launch param -> the argument the host passes (``blockIdx.x``, dynamic smem, ...)."""
    m = re.search(r'T\.call_ffi_kernel\("[^"]+", (.*?), launch_params=\[(.*?)\]', script)
    assert m, "no kernel launch in the lowered host code"
    args = [a.strip() for a in m.group(1).split(", ")]
    params = [p.strip().strip('"') for p in m.group(2).split(", ")]
    return dict(zip(params, args[-len(params):]))


def tma_specs(cfg):
    """``(specs, module)``: TVM's TensorMap spec of every TMA copy ``tma_auto`` lowers while ``cfg``'s kernel
    builds (descriptor name, coordinates, box, swizzle, element bytes), recorded at TVM's descriptor encode,
    and the built module."""
    # TVM's compiler side, here and not at the top: conftest imports this file on the runtime-only GPU box too
    from tvm.backend.cuda.tile_primitive.copy_async import tma  # pylint: disable=import-outside-toplevel

    seen, original = [], tma._get_or_encode_descriptor  # pylint: disable=protected-access

    def recording(spec, sctx):
        seen.append(spec)
        return original(spec, sctx)

    tma._get_or_encode_descriptor = recording  # pylint: disable=protected-access
    try:
        mod = builder.build(kernel_of(cfg))
    finally:
        tma._get_or_encode_descriptor = original  # pylint: disable=protected-access
    return seen, mod
