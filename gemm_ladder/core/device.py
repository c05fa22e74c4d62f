"""The one place that asks the GPU about itself: arch, name, SM count, L2 and shared memory.

Everything that depends on the device at hand (the shared-memory limit of the validator, the
SM count a persistent module is launched with, the L2 size the timing harness spills, the
machine of the tuner's L2 model, whether the tutorials' GPU cells run) reads it here, through
torch, when the question is asked: nothing is cached, so a test can stand in for a GPU by
replacing ``torch.cuda`` functions.

Runtime-only: this module imports no TVM and imports torch only when a question is asked (a
build box without torch gets "no GPU").
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

# compute capability -> the arch a module must be built for to run there
_ARCH_OF = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def arch_of_capability(major: int, minor: int) -> str:
    """The arch string a rung must be built for to run on a GPU of this compute capability."""
    return _ARCH_OF.get((major, minor), f"sm_{major}{minor}")


@dataclass(frozen=True)
class GPU:
    """What the project needs to know about one CUDA device."""

    index: int
    name: str
    arch: str
    sm_count: int
    l2_bytes: int
    smem_per_block_optin: int | None


def _torch_cuda():
    """``torch.cuda`` when torch is installed and sees a GPU, else None."""
    try:
        import torch  # pylint: disable=import-outside-toplevel  (optional, heavy: only when asked)
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:  # pylint: disable=broad-except  (a broken driver is "no GPU" here)
        return None


def why_no_gpu(arch: str | None = None, index: int = 0) -> str | None:
    """None when GPU ``index`` is there (and of ``arch``, if given); else the reason, in words."""
    try:
        import torch  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return "torch is not installed"
    cuda = _torch_cuda()
    if cuda is None:
        return "torch sees no CUDA GPU"
    have = arch_of(index)
    if arch is not None and have != arch:
        return f"GPU {index} ({cuda.get_device_name(index)}) is {have}, not {arch}"
    return None


def present(arch: str | None = None) -> bool:
    """Whether torch sees a CUDA GPU (of ``arch``, if given)."""
    return why_no_gpu(arch) is None


def arch_of(index: int) -> str:
    """The arch of CUDA device ``index`` (torch must see a GPU)."""
    import torch  # pylint: disable=import-outside-toplevel

    return arch_of_capability(*torch.cuda.get_device_capability(index))


def name_of(index: int) -> str:
    import torch  # pylint: disable=import-outside-toplevel

    return torch.cuda.get_device_name(index)


def sm_count(index: int) -> int:
    """SMs of CUDA device ``index``: the grid of a persistent module launched there."""
    import torch  # pylint: disable=import-outside-toplevel

    return torch.cuda.get_device_properties(index).multi_processor_count


def probe(index: int = 0, arch: str | None = None) -> GPU | None:
    """GPU ``index`` as torch sees it; None without one (or when it is not of ``arch``)."""
    cuda = _torch_cuda()
    if cuda is None:
        return None
    try:
        props = cuda.get_device_properties(index)
        have = arch_of_capability(props.major, props.minor)
        if arch is not None and have != arch:
            return None
        optin = getattr(props, "shared_memory_per_block_optin", None)
        return GPU(index=index, name=cuda.get_device_name(index), arch=have,
                   sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                   smem_per_block_optin=int(optin) if optin else None)
    except Exception:  # pylint: disable=broad-except  (a device that cannot answer is not there)
        return None


# -- clusters: how many run at once -------------------------------------------------------------
# The driver answers "how many clusters of this launch fit on the GPU at once" only for a
# function (cuOccupancyMaxActiveClusters). A TVM module does not hand out its CUfunction, so the
# question is asked of a kernel with nothing in it, loaded from PTX (the driver compiles it for
# the GPU at hand; sm_90 PTX runs on every arch with clusters), launched like the module: the same
# threads and shared memory per CTA. What limits a cluster's placement is that its CTAs must sit on
# one GPC at once, one per SM where the shared memory allows only one; registers cannot lower the
# answer, since ptxas fitted the module's registers to its CTA. The CUDA runtime has the same
# query; TVM has none, so this one is written here, on the driver library every GPU machine has.
_PROBE_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry gemm_ladder_cluster_probe()
{
    ret;
}
"""
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


def driver_types():
    """The ctypes structures of ``cuLaunchKernelEx``'s arguments (CUlaunchAttribute, CUlaunchConfig),
    laid out as the driver's C headers lay them out (``tests/test_cluster_grid.py`` checks it)."""
    class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte union at offset 8
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]

    class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
        _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)),
                    ("num_attrs", ctypes.c_uint)]

    return LaunchAttribute, LaunchConfig


def max_active_clusters(index: int, cluster: int, threads: int, smem_bytes: int) -> int:
    """Clusters of ``cluster`` CTAs (``threads`` threads and ``smem_bytes`` of dynamic shared
    memory each) that CUDA device ``index`` runs at once, as its driver answers.

    On an H100 SXM (132 SMs) the answer for clusters of 4 is below 132 // 4: a persistent launch of
    ``sm_count // cluster`` clusters would run its last ones only after others finished. Raises
    RuntimeError when the driver cannot be asked (no libcuda, or it refuses the launch)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise RuntimeError(f"the CUDA driver library cannot be loaded ({err})") from None

    def ok(name, *args):
        res = getattr(cu, name)(*args)
        if res != 0:
            msg = ctypes.c_char_p()
            cu.cuGetErrorString(res, ctypes.byref(msg))
            raise RuntimeError(f"{name} failed: {(msg.value or b'').decode() or res}")

    LaunchAttribute, LaunchConfig = driver_types()
    dev, ctx, old = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    mod, fn, count = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    ok("cuInit", 0)
    ok("cuDeviceGet", ctypes.byref(dev), index)
    ok("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    try:
        ok("cuCtxPushCurrent_v2", ctx)
        try:
            ok("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(_PROBE_PTX))
            try:
                ok("cuModuleGetFunction", ctypes.byref(fn), mod, b"gemm_ladder_cluster_probe")
                ok("cuFuncSetAttribute", fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem_bytes))
                attr = LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
                attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
                cfg = LaunchConfig(shared_mem_bytes=int(smem_bytes), attrs=ctypes.pointer(attr), num_attrs=1)
                cfg.grid[:] = [cluster, 1, 1]
                cfg.block[:] = [int(threads), 1, 1]
                ok("cuOccupancyMaxActiveClusters", ctypes.byref(count), fn, ctypes.byref(cfg))
            finally:
                if mod.value:
                    cu.cuModuleUnload(mod)
        finally:
            cu.cuCtxPopCurrent_v2(ctypes.byref(old))
    finally:
        cu.cuDevicePrimaryCtxRelease_v2(dev)
    return int(count.value)


# The machine the tuner's models assume for an arch when no GPU of it is here (the SM count the
# policy plans for, the L2 the tile-order model fills)
MODEL_MACHINE = {
    "sm_90a": {"num_sms": 132, "l2_bytes": 50 * 1024 * 1024, "assumed": "H100 SXM"},
    "sm_100a": {"num_sms": 148, "l2_bytes": 126 * 1024 * 1024, "assumed": "B200"},
}
# no GPU of an arch exceeds this (dense fp16/bf16 with fp32 accumulate): a faster "measurement" is wrong
PEAK_TFLOPS = {"sm_90a": 990.0, "sm_100a": 2500.0}
FP8_PEAK_FACTOR = 2  # fp8 tensor cores run twice the 16-bit rate on both archs (H100: 1979 dense TFLOPS)


def peak_tflops(arch: str, fp8: bool = False) -> float | None:
    """The dense tensor-core peak no GPU of ``arch`` exceeds: 16-bit, or fp8 (``fp8``); None for an
    arch with no figure."""
    peak = PEAK_TFLOPS.get(arch)
    return None if peak is None else peak * (FP8_PEAK_FACTOR if fp8 else 1)


def speed_problem(tflops, arch: str, name: str = "tflops", fp8: bool = False) -> str | None:
    """Why ``tflops`` cannot be a real measurement on ``arch`` (of an fp8 kernel where ``fp8``), or None."""
    if not isinstance(tflops, (int, float)) or isinstance(tflops, bool):
        return f"{name} {tflops!r} is not a number"
    if not math.isfinite(tflops) or tflops <= 0:
        return f"{name} {tflops!r} is not a positive finite number"
    peak = peak_tflops(arch, fp8)
    if peak is not None and tflops > peak:
        return f"{name} {tflops} is above the {peak:.0f} TFLOPS no {arch} GPU exceeds{' in fp8' if fp8 else ''}"
    return None


def speed_rank(result: dict) -> tuple:
    """The order of measured candidates and database entries, fastest last (``max`` picks it):
    the ratio to cuBLAS timed in the same rounds, then TFLOPS. On a GPU held at its power limit
    the clock drifts by several percent from one candidate's turn to the next (the first of a
    folder run on a cooler GPU, and two sessions never run at the same clock); cuBLAS, timed
    beside each candidate, drifts with it, so the ratio compares candidates where TFLOPS would
    reward the order of the run. A result without a ratio ranks by TFLOPS, after those with one.

    Before all that, a result the tuner's second pass confirmed (``confirmed``: timed again with
    the other leaders in the same rounds, at the power limit; ``measuring.confirm``) ranks before
    any that it did not: a first pass reads a cooler clock, and its ratios run several percent
    high and spread from one candidate to the next."""
    ratio = result.get("ratio_to_cublas")
    has = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio) and ratio > 0
    return (1 if result.get("confirmed") is True else 0, 1 if has else 0, ratio if has else 0.0,
            result.get("tflops") or 0.0)
