"""Knobs of a rung, held in one frozen dataclass, and the one function that checks them.

Every rung takes ``hgemm_vN(M, N, K, **knobs)``. The knobs become a :class:`GemmConfig`;
:func:`validate` checks it against the rung's own rules and the limits of the arch (or of the
GPU at hand), and raises :class:`ConfigError` *before anything is compiled*, with a message
that names the limit and a value that would work. The tuner prunes its space with the same
function, so a config the tuner keeps is a config that builds.

This module imports no TVM: it is used on build boxes, by the tuner and by the runtime alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

DTYPES = ("float16", "bfloat16")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2}


class ConfigError(ValueError):
    """A rung cannot take this shape or these knobs; the message says what would work."""


@dataclass(frozen=True)
class ArchLimits:
    """What a rung may use on one GPU arch.

    The table below holds the documented per-block opt-in limits; when a GPU of the arch is
    present, :func:`limits_for` reads the real numbers off the device instead.
    """

    arch: str
    family: str
    smem_per_block: int  # bytes a block may opt in to
    regs_per_thread: int = 255
    sm_count: int | None = None  # known only when read off a device


ARCHS = {
    "sm_90a": ArchLimits("sm_90a", "Hopper", smem_per_block=227 * 1024),
    "sm_100a": ArchLimits("sm_100a", "Blackwell", smem_per_block=227 * 1024),
}


def arch_of_capability(major: int, minor: int) -> str:
    """The arch string a rung must be built for to run on a GPU of this compute capability."""
    return {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get((major, minor), f"sm_{major}{minor}")


def limits_for(arch: str, device: int | None = None) -> ArchLimits:
    """Limits for ``arch``; read off CUDA device ``device`` when it is that arch.

    ``device=None`` looks for device 0 through torch, if torch and a GPU are there; a build box
    without a GPU gets the table's numbers.
    """
    if arch not in ARCHS:
        raise ConfigError(f"unknown arch {arch!r}: gemm-ladder has forms for {sorted(ARCHS)}")
    base = ARCHS[arch]
    try:
        import torch  # pylint: disable=import-outside-toplevel

        if not torch.cuda.is_available():
            return base
        idx = 0 if device is None else device
        props = torch.cuda.get_device_properties(idx)
        if arch_of_capability(props.major, props.minor) != arch:
            return base
        smem = getattr(props, "shared_memory_per_block_optin", base.smem_per_block)
        return dataclasses.replace(base, smem_per_block=int(smem), sm_count=props.multi_processor_count)
    except Exception:  # pylint: disable=broad-except
        return base


@dataclass(frozen=True)
class GemmConfig:
    """Everything that changes a rung's binary: the shape, the types, the arch and the knobs.

    D[M, N] = A[M, K] . B[N, K]^T, row-major, ``dtype`` in and out, fp32 accumulate.
    """

    rung: str
    M: int
    N: int
    K: int
    dtype: str = "float16"
    arch: str = "sm_90a"
    blk_m: int = 128
    blk_n: int = 128
    blk_k: int = 64
    pipe_depth: int = 1
    num_warpgroups: int = 1
    l2_group_size: int = 8
    tile_order: str = "grouped"
    extra: tuple = field(default=())  # rung-specific knobs as sorted (name, value) pairs
    knob_names: tuple = field(default=())  # the knobs this rung takes (the rest keep defaults)

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def grid_mn(self) -> tuple[int, int]:
        return math.ceil(self.M / self.blk_m), math.ceil(self.N / self.blk_n)

    @property
    def k_tiles(self) -> int:
        return math.ceil(self.K / self.blk_k)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    def knobs(self) -> dict:
        """The knobs as a plain dict (for manifests, cache keys and messages)."""
        out = {"dtype": self.dtype, "arch": self.arch}
        out.update({k: getattr(self, k) for k in self.knob_names if k in self.__dataclass_fields__})
        out.update(dict(self.extra))
        return out

    def to_dict(self) -> dict:
        """rung, shape and knobs: what :func:`gemm_ladder.rungs.from_dict` takes back."""
        return {"rung": self.rung, "M": self.M, "N": self.N, "K": self.K, **self.knobs()}

    def tag(self) -> str:
        """A file-name-safe name that differs whenever the binary does: rung, shape, dtype, arch
        and the knobs, e.g. ``v5_4096x4096x4096_float16_sm_90a_m128n256k64w2p4``."""
        short = {"blk_m": "m", "blk_n": "n", "blk_k": "k", "num_warpgroups": "w", "pipe_depth": "p",
                 "l2_group_size": "g"}
        parts = []
        order = list(short)
        for name, value in sorted(self.knobs().items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])):
            if name in ("dtype", "arch"):
                continue
            key = short.get(name, name.replace("_", ""))
            parts.append(f"{key}{value}")
        knobs = "".join(parts)
        return f"{self.rung}_{self.M}x{self.N}x{self.K}_{self.dtype}_{self.arch}" + (f"_{knobs}" if knobs else "")


def _fix(msg: str, fix: str) -> ConfigError:
    return ConfigError(f"{msg}; {fix}")


def check_common(cfg: GemmConfig) -> None:
    """Rules every rung shares: shape, dtype, arch, and what TMA can describe."""
    for name, v in (("M", cfg.M), ("N", cfg.N), ("K", cfg.K)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise _fix(f"{name}={v!r} is not a positive int", f"pass a positive Python int for {name}")
    if cfg.dtype not in DTYPES:
        raise _fix(f"dtype={cfg.dtype!r} is not supported", f"use one of {DTYPES}")
    if cfg.arch not in ARCHS:
        raise _fix(f"arch={cfg.arch!r} has no form in gemm-ladder", f"use one of {sorted(ARCHS)}")
    # TMA (and the 16-byte vector copies of the early rungs) need every row stride to be a
    # multiple of 16 bytes: K for A and B, N for D.
    per16 = 16 // cfg.elem_bytes
    for name, v in (("K", cfg.K), ("N", cfg.N)):
        if v % per16:
            up = (v + per16 - 1) // per16 * per16
            raise _fix(
                f"{name}={v} gives a row stride of {v * cfg.elem_bytes} bytes, not a multiple of 16 "
                f"that TMA needs",
                f"pad {name} to a multiple of {per16} (e.g. {up}) and zero the padding",
            )
    watchdog = dict(cfg.extra).get("watchdog")
    if watchdog is not None and (isinstance(watchdog, bool) or not isinstance(watchdog, (int, float))
                                 or not 0 < watchdog <= 3600):
        raise _fix(f"watchdog={watchdog!r} is not a number of seconds in (0, 3600]",
                   "use e.g. watchdog=2 (bound every mbarrier wait by 2 s), or leave it out")
    if cfg.blk_k != 64:
        raise _fix(f"blk_k={cfg.blk_k} is not supported", "use blk_k=64 (one 128-byte swizzle row of 16-bit data)")
    if cfg.blk_m not in (64, 128, 256):
        raise _fix(f"blk_m={cfg.blk_m} is not supported", "use blk_m in (64, 128, 256)")
    if cfg.blk_n % 64 or not 64 <= cfg.blk_n <= 256:
        # the output tile leaves through 128-byte-wide (64-column) swizzled TMA boxes
        raise _fix(f"blk_n={cfg.blk_n} is not supported", "use 64, 128, 192 or 256")


def acc_regs_per_thread(cfg: GemmConfig) -> int:
    """fp32 accumulator registers each MMA thread holds (Hopper: accumulators live in registers)."""
    return cfg.blk_m * cfg.blk_n // (128 * cfg.num_warpgroups)


def check_budget(cfg: GemmConfig, smem_bytes: int, limits: ArchLimits | None = None) -> None:
    """Shared memory and registers against the arch (or device) limits."""
    limits = limits or limits_for(cfg.arch)
    if smem_bytes > limits.smem_per_block:
        raise _fix(
            f"{cfg.rung} with blk_m={cfg.blk_m}, blk_n={cfg.blk_n}, pipe_depth={cfg.pipe_depth} needs "
            f"{smem_bytes} bytes of shared memory, over the {limits.smem_per_block} a block may use on "
            f"{cfg.arch}",
            "lower pipe_depth or the tile size",
        )
    if cfg.arch == "sm_90a":
        regs = acc_regs_per_thread(cfg)
        # The accumulators share the 255-register file with addresses, descriptors and loop state.
        if regs > 128 * 1.5:
            raise _fix(
                f"a {cfg.blk_m}x{cfg.blk_n} tile over {cfg.num_warpgroups} warpgroup(s) needs {regs} "
                f"fp32 accumulator registers per thread, over the {int(128 * 1.5)} that leave room in "
                f"the {limits.regs_per_thread}-register file",
                "use a smaller tile or more warpgroups (num_warpgroups)",
            )


def replace(cfg: GemmConfig, **changes) -> GemmConfig:
    return dataclasses.replace(cfg, **changes)
