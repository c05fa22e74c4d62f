"""Knobs of a rung, held in one frozen dataclass, and the rules every rung shares.

Every rung takes ``hgemm_vN(M, N, K, **knobs)``. The knobs become a :class:`GemmConfig`, and
:func:`gemm_ladder.rungs.make_config` (the one validator) checks it: the knobs' types against the
rung's declared defaults (:func:`check_knob_types`), the rules below (:func:`check_common`),
then the rung's own ``check`` with the shared-memory and register budget of
:mod:`gemm_ladder.core.budget`. It raises :class:`ConfigError` *before anything is compiled*, with a
message that names the limit and a value that would work. The tuner prunes its space with the
same function, so a config the tuner keeps is a config that builds.

**32-bit indices.** The kernels index with signed 32-bit ints: TVM's loop variables and buffer
offsets, TMA's coordinates, the thread offsets of the early rungs, the split-K workspace. So
every extent (M, N, K), every matrix (A = M x K, B = N x K, D = M x N elements) and the split-K
workspace (``split_k`` fp32 partials per element of D), each padded to whole tiles, must hold
fewer than :data:`INDEX_LIMIT` = 2^31 elements (:func:`check_index_range`, part of
:func:`check_common`). For N = K = 4096 and 128-row tiles that is M <= 524160; :func:`max_m`
gives the largest M a config takes. A module built with ``dynamic_m=True`` reads M at run time
as an int32: it serves M from 1 to ``max_m(cfg)`` (:func:`max_m_of` its manifest's knobs), and
the caller refuses a larger M.

This module imports no TVM: it is used on build boxes, by the tuner and by the runtime alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DTYPES = ("float16", "bfloat16")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2}
DEFAULT_DTYPE = "float16"
DEFAULT_ARCH = "sm_90a"
# dtype and arch: every rung takes them; they are part of the question, not knobs to tune
COMMON_KNOBS = {"dtype": DEFAULT_DTYPE, "arch": DEFAULT_ARCH}
# options every rung takes that change the binary but not the kernel's technique (checked by
# check_common): ``watchdog`` bounds every mbarrier wait (gemm_ladder.barriers)
BUILD_OPTIONS = ("watchdog",)
# Tile orders a persistent rung takes (``schedulers.orders`` draws them), on either arch: those
# the GPU tier has run. Snake is the default: on an H100 it beat grouped at 8192^3 and matched it
# at 4096^3 (benchmarks/results/2026-11-22_h100_v6_tile_order_sweep.json, benchmarks/tuning/).
TILE_ORDERS = ("grouped", "snake", "row", "column")
DEFAULT_TILE_ORDER = "snake"


class ConfigError(ValueError):
    """A rung cannot take this shape or these knobs; the message says what would work."""


class IndexRangeError(ConfigError):
    """A shape too large for the kernels' signed 32-bit indices (:func:`check_extents`)."""


class RetiredKnobError(ConfigError):
    """A module, pack or record names a knob at a value no kernel of this gemm_ladder builds."""


# Knobs a rung had and no longer has, with the value every module, pack and tuning record made
# before carries: that value is accepted and ignored (:func:`drop_retired_knobs`, the one place
# that reads this), any other refused.
RETIRED_KNOBS = {
    "v9": {"pingpong": (False, "v9's ping-pong consumers were removed: they measured slower on every shape "
                               "(benchmarks/results/2026-11-22_h100_v9_pingpong/)")},
}


def drop_retired_knobs(rung: str, knobs: dict) -> dict:
    """``knobs`` without ``rung``'s retired knobs where they hold their old default; a retired
    knob at another value raises :class:`RetiredKnobError` (what built it is gone)."""
    retired = RETIRED_KNOBS.get(rung, {})
    for name in retired.keys() & knobs.keys():
        old, why = retired[name]
        if knobs[name] != old or type(knobs[name]) is not type(old):
            raise RetiredKnobError(f"{rung} was built with {name}={knobs[name]!r}, which this gemm_ladder no longer "
                                   f"builds ({why}); rebuild it without {name}")
    return {k: v for k, v in knobs.items() if k not in retired}


KNOB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")  # a knob's name, and a value that is a name
_INT = re.compile(r"[+-]?\d{1,30}")


def parse_knob_value(text: str, name: str = "knob"):
    """The value of knob ``name`` written as text: an int (``4``), a switch (``true``/``false``,
    any case) or a name (``snake``). The one parser of knob values: ``--knob``, ``tune --space``
    and plan files all read through it, so ``stream_b=true`` means the same everywhere (a bool:
    the string ``'true'`` would be refused by every rung's validator)."""
    value = str(text).strip()
    if _INT.fullmatch(value):
        return int(value)
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if KNOB_NAME.fullmatch(value):
        return value
    raise ConfigError(f"knob {name}={str(text).strip()}: {value!r} is neither an int, true/false nor a name; "
                      "knobs take ints (pipe_depth=4), switches (stream_k=true) or names (tile_order=snake)")


@dataclass(frozen=True)
class ArchLimits:
    """What a rung may use on one GPU arch.

    The table below holds the documented per-block opt-in limits; when a GPU of the arch is
    present, :func:`gemm_ladder.core.budget.limits_for` reads the real numbers off the device instead.
    """

    arch: str
    family: str
    smem_per_block: int  # bytes a block may opt in to
    regs_per_thread: int = 255
    sm_count: int | None = None  # known only when read off a device
    acc_in_registers: bool = True  # Hopper's wgmma accumulates in registers, Blackwell in TMEM


ARCHS = {
    "sm_90a": ArchLimits("sm_90a", "Hopper", smem_per_block=227 * 1024),
    "sm_100a": ArchLimits("sm_100a", "Blackwell", smem_per_block=227 * 1024, acc_in_registers=False),
}


@dataclass(frozen=True)
class GemmConfig:
    """Everything that changes a rung's binary: the shape, the types, the arch and the knobs.

    D[M, N] = A[M, K] . B[N, K]^T, row-major, ``dtype`` in and out, fp32 accumulate. Any other
    operands (a bias, ...) are the ``spec`` knob in ``extra``, present only where it is not that
    default: ``gemm_ladder.core.spec.spec_of(cfg)`` reads it.
    """

    rung: str
    M: int
    N: int
    K: int
    dtype: str = DEFAULT_DTYPE
    arch: str = DEFAULT_ARCH
    blk_m: int = 128
    blk_n: int = 128
    blk_k: int = 64
    pipe_depth: int = 1
    num_warpgroups: int = 1
    l2_group_size: int = 8
    tile_order: str = DEFAULT_TILE_ORDER
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
            if name in ("dtype", "arch", "spec"):
                continue
            key = short.get(name, name.replace("_", ""))
            parts.append(f"{key}{value}")
        knobs = "".join(parts)
        # a non-default operand spec (gemm_ladder.core.spec), less D's dtype: e.g. _bias_float16
        spec = ".".join(p for p in str(dict(self.extra).get("spec", "")).split(".") if p and p != f"d_{self.dtype}")
        return (f"{self.rung}_{self.M}x{self.N}x{self.K}_{self.dtype}_{self.arch}" + (f"_{knobs}" if knobs else "")
                + (f"_{spec.replace('.', '-')}" if spec else ""))


def _fix(msg: str, fix: str, error: type = ConfigError) -> ConfigError:
    return error(f"{msg}; {fix}")


def _type_ok(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _kind(value) -> str:
    name = type(value).__name__
    return {"int": "an int", "str": "a string"}.get(name, f"a {name}")


def check_knob_types(rung: str, knobs: dict, defaults: dict) -> None:
    """Each knob has the type of its declared default: an int knob takes an int (not a float, a
    bool or a string of digits), a name knob a string. A rung declares its knobs and defaults in
    its ``KNOBS`` dict; new knobs are checked by declaring them."""
    for name, value in knobs.items():
        if name not in defaults or _type_ok(value, defaults[name]):
            continue
        default = defaults[name]
        if isinstance(default, int) and not isinstance(default, bool):
            if isinstance(value, float) and value.is_integer():
                fix = f"pass {name}={int(value)}"
            elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
                fix = f"pass {name}={int(value)} (an int, not a string)"
            else:
                fix = f"pass an int, e.g. {name}={default}"
        else:
            fix = f"pass {_kind(default)}, e.g. {name}={default!r}"
        raise _fix(f"{rung}: {name}={value!r} is {_kind(value)}, not {_kind(default)}", fix)


BLK_M_CHOICES = (64, 128, 192, 256)  # whole 64-row wgmma atoms (192: three, for three MMA warpgroups)
# the output tile widths most rungs take: whole 64-column (128-byte) swizzled store boxes of 16-bit D
BLK_N_CHOICES = (64, 128, 192, 256)
# v9's widths (its chunked epilogue stores 16-, 32- or 64-column boxes: ``epilogue.box_cols``): any whole
# 16 columns from 32 to 256, as cuBLASLt's 96-, 112- and 144-wide tiles and cuBLAS's 32-wide tiles at small M
# (plan's narrow-n: one row of tiles 32 or 48 wide, as many CTAs as SMs)
BLK_N_16 = tuple(range(32, 257, 16))


def check_common(cfg: GemmConfig, blk_m_choices: tuple = BLK_M_CHOICES, operand_bytes: int | None = None,
                 blk_n_choices: tuple = BLK_N_CHOICES) -> None:
    """Rules every rung shares: shape, dtype, arch, and what TMA can describe. ``blk_m_choices``:
    the output tile heights the rung takes (a swap-AB rung puts M in wgmma's N: multiples of 8);
    ``blk_n_choices``: its widths (the store boxes its epilogue can make); ``operand_bytes``: bytes of an
    element of A and B (default D's; 1 for fp8, whose 128-byte swizzle rows hold blk_k = 128)."""
    in_bytes = operand_bytes or cfg.elem_bytes
    for name, v in (("M", cfg.M), ("N", cfg.N), ("K", cfg.K)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise _fix(f"{name}={v!r} is not a positive int", f"pass a positive Python int for {name}")
    if cfg.dtype not in DTYPES:
        raise _fix(f"dtype={cfg.dtype!r} is not supported", f"use one of {DTYPES}")
    if cfg.arch not in ARCHS:
        raise _fix(f"arch={cfg.arch!r} has no form in gemm-ladder", f"use one of {sorted(ARCHS)}")
    # TMA (and the 16-byte vector copies of the early rungs) need every row stride to be a
    # multiple of 16 bytes: K for A and B, N for D.
    for name, v, nbytes in (("K", cfg.K, in_bytes), ("N", cfg.N, cfg.elem_bytes)):
        per16 = 16 // nbytes
        if v % per16:
            up = (v + per16 - 1) // per16 * per16
            raise _fix(
                f"{name}={v} gives a row stride of {v * nbytes} bytes, not a multiple of 16 "
                f"that TMA needs",
                f"pad {name} to a multiple of {per16} (e.g. {up}) and zero the padding",
            )
    watchdog = dict(cfg.extra).get("watchdog")
    if watchdog is not None and (isinstance(watchdog, bool) or not isinstance(watchdog, (int, float))
                                 or not 0 < watchdog <= 3600):
        raise _fix(f"watchdog={watchdog!r} is not a number of seconds in (0, 3600]",
                   "use e.g. watchdog=2 (bound every mbarrier wait by 2 s), or leave it out")
    if in_bytes == 1 and cfg.blk_k != 128:
        raise _fix(f"blk_k={cfg.blk_k} is not supported for fp8", "use blk_k=128 (one 128-byte swizzle row of fp8)")
    if in_bytes != 1 and cfg.blk_k != 64:
        raise _fix(f"blk_k={cfg.blk_k} is not supported", "use blk_k=64 (one 128-byte swizzle row of 16-bit data)")
    if cfg.blk_m not in blk_m_choices:
        choices = blk_m_choices if len(blk_m_choices) <= 8 else f"multiples of 8 from {blk_m_choices[0]} to {blk_m_choices[-1]}"
        raise _fix(f"blk_m={cfg.blk_m} is not supported by {cfg.rung}", f"use blk_m in {choices}")
    if cfg.blk_n not in blk_n_choices:
        # the output tile leaves through swizzled TMA boxes of whole 64 (most rungs) or 16 columns (v9)
        choices = f"{', '.join(map(str, blk_n_choices[:-1]))} or {blk_n_choices[-1]}" if len(blk_n_choices) <= 4 else (
            f"a multiple of {blk_n_choices[1] - blk_n_choices[0]} from {blk_n_choices[0]} to {blk_n_choices[-1]}")
        raise _fix(f"blk_n={cfg.blk_n} is not supported by {cfg.rung}", f"use {choices}")
    check_index_range(cfg)


# -- 32-bit indices (see the module docstring) ------------------------------------------------------
INDEX_LIMIT = 2**31  # elements a signed 32-bit index reaches, one past the largest offset
# the largest tile any rung takes (blk_m, blk_n, blk_k; check_common): a shape within 32-bit indices
# at this tile is within them at every tile (a split-K workspace aside), so the M that the policy's
# refusal (plan.rule_choice) offers is one every rule can take
LARGEST_TILE = (max(BLK_M_CHOICES), 256, 64)


def _whole(extent: int, tile: int) -> int:
    return -(-extent // tile) * tile


def index_counts(M: int, N: int, K: int, blk_m: int = 1, blk_n: int = 1, blk_k: int = 1,
                 split_k: int = 1) -> dict[str, int]:
    """What a kernel of this shape and tile indexes with 32-bit ints, in elements, each extent
    padded to whole tiles (a CTA computes the offsets of a whole tile, also past the edge where
    a guard then skips them). The split-K workspace is there only with ``split_k`` > 1."""
    m, n, k = _whole(M, blk_m), _whole(N, blk_n), _whole(K, blk_k)
    counts = {"M": m, "N": n, "K": k, "A (M x K)": m * k, "B (N x K)": n * k, "D (M x N)": m * n}
    if split_k > 1:
        counts[f"the split-K workspace (M x N x split_k={split_k})"] = m * n * split_k
    return counts


def largest_m(N: int, K: int, blk_m: int = 1, blk_n: int = 1, blk_k: int = 1, split_k: int = 1) -> int:
    """The largest M (a multiple of ``blk_m``) that keeps every count of :func:`index_counts`
    below :data:`INDEX_LIMIT`; 0 when N and K alone reach it."""
    if max(index_counts(1, N, K, blk_m, blk_n, blk_k, split_k).values()) >= INDEX_LIMIT:
        return 0
    per_row = max(1, _whole(K, blk_k), _whole(N, blk_n) * max(split_k, 1))
    return (INDEX_LIMIT - 1) // per_row // blk_m * blk_m


def _split_k_of(knobs: dict) -> int:
    s = knobs.get("split_k", 1)
    return s if isinstance(s, int) and not isinstance(s, bool) and s > 1 else 1


def max_m_of(N: int, K: int, knobs: dict) -> int:
    """The largest M a kernel of this N and K with these knobs (``GemmConfig.knobs()``, or the
    ``knobs`` of a module's manifest: the runtime has no rung to make a config with) takes: what
    a module built with ``dynamic_m=True`` (M read at run time, an int32) serves at most; 0 when
    N and K alone are too large."""
    tile = [knobs.get(name, getattr(GemmConfig, name)) for name in ("blk_m", "blk_n", "blk_k")]
    return largest_m(N, K, *tile, _split_k_of(knobs))


def max_m(cfg: GemmConfig) -> int:
    """:func:`max_m_of` for a config."""
    return max_m_of(cfg.N, cfg.K, cfg.knobs())


def _over(counts: dict[str, int]) -> tuple[str, int] | None:
    return next(((n, c) for n, c in counts.items() if c >= INDEX_LIMIT), None)


def _fitting_nk(N: int, K: int, blk_m: int, blk_n: int, blk_k: int, split_k: int) -> tuple[int, int, str]:
    """An (N, K) of parts that some M fits beside, and how to say it."""
    n_pad, k_pad = _whole(N, blk_n), _whole(K, blk_k)
    most_k = (INDEX_LIMIT - 1) // max(n_pad, blk_m) // blk_k * blk_k  # a K beside this N
    most_n = (INDEX_LIMIT - 1) // max(k_pad, blk_m * split_k) // blk_n * blk_n  # an N beside this K
    if most_k >= blk_k and blk_m * n_pad * split_k < INDEX_LIMIT:
        return N, most_k, f"split K into parts of at most {most_k} and add the products"
    if most_n >= blk_n:
        return most_n, K, f"split N into parts of at most {most_n} columns"
    return 32768, 32768, "split N and K into parts of at most 32768 each"


def check_extents(who: str, M: int, N: int, K: int, blk_m: int = 1, blk_n: int = 1, blk_k: int = 1,
                  split_k: int = 1) -> None:
    """Refuse a shape whose 32-bit indices would overflow (:func:`index_counts`), in one line that
    names the count, the limit and the sizes that fit (an M, else parts of K or N, and of M beside
    them). ``who`` starts the message (a rung, or the policy). Constant time, whatever the shape."""
    over = _over(index_counts(M, N, K, blk_m, blk_n, blk_k, split_k))
    if over is None:
        return
    most_m = largest_m(N, K, blk_m, blk_n, blk_k, split_k)
    if most_m < 1:  # N and K alone reach the limit: name that count, whatever M is
        over = _over(index_counts(1, N, K, blk_m, blk_n, blk_k, split_k))
    name, count = over
    padded = f" (padded to whole {blk_m}x{blk_n}x{blk_k} tiles)" if (blk_m, blk_n, blk_k) != (1, 1, 1) else ""
    what = f"{name} = {count}" if name in ("M", "N", "K") else f"{name} has {count} elements"
    msg = f"{who}: {M}x{N}x{K}: {what}{padded}, over the {INDEX_LIMIT - 1} a signed 32-bit index reaches"
    if split_k > 1 and _over(index_counts(M, N, K, blk_m, blk_n, blk_k)) is None:  # the workspace alone
        fewer = (INDEX_LIMIT - 1) // (_whole(M, blk_m) * _whole(N, blk_n))
        fix = "use split_k=1" if fewer == 1 else f"use split_k <= {fewer}"
        raise _fix(msg, fix + (f", or M <= {most_m}" if most_m >= 1 else ""), IndexRangeError)
    if most_m >= 1:
        raise _fix(msg, f"use M <= {most_m} (split the rows into calls of at most {most_m})", IndexRangeError)
    part_n, part_k, fix = _fitting_nk(N, K, blk_m, blk_n, blk_k, split_k)
    rows = largest_m(part_n, part_k, blk_m, blk_n, blk_k, split_k)
    raise _fix(msg, fix + (f", and the rows into calls of at most {rows}" if M > rows else ""),
               IndexRangeError)


def check_index_range(cfg: GemmConfig) -> None:
    """``cfg``'s shape with its tiles (and split-K workspace) within 32-bit indices: every rung of
    both archs goes through this (:func:`check_common`)."""
    check_extents(cfg.rung, cfg.M, cfg.N, cfg.K, cfg.blk_m, cfg.blk_n, cfg.blk_k, _split_k_of(dict(cfg.extra)))
