"""What a tensor needs before TMA can read it, and what the front door copies when it is not so.

TMA describes a tensor whose row stride is a multiple of 16 bytes and whose start is 16-byte
aligned (``config.check_common``). :data:`LAYOUT_RULES` says what the front door copies when a
tensor is not so: K or N padded with zeros to a multiple of 8, or a wide N split (the kernel on its
first columns, reading the weight in place, torch's matmul on the last few), a misaligned view
cloned, an output that TMA cannot write staged. Each fix is correct and slower, and ``explain`` says so.
:func:`layout_fixes` is a pure function of the shape and alignment: it imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.config import DEFAULT_DTYPE, DTYPE_BYTES

TMA_ALIGN_BYTES = 16


@dataclass(frozen=True)
class Layout:
    """The shape and alignment of one call: each ``*_aligned`` says the tensor starts on a
    16-byte boundary; ``out_given`` whether the caller passed ``out``."""

    M: int
    N: int
    K: int
    dtype: str = DEFAULT_DTYPE
    a_aligned: bool = True
    b_aligned: bool = True
    out_aligned: bool = True
    out_given: bool = False

    @property
    def per16(self) -> int:
        return TMA_ALIGN_BYTES // DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class LayoutRule:
    name: str
    when: Callable[[Layout], bool]
    fix: str  # what the front door does
    why: str


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


# An N that is not a multiple of 8 with K that is: B's rows are TMA-readable as they lie, only D's
# are not. From this N up the kernel computes the first N - N % 8 columns straight from B (a view
# of its first rows) and torch's matmul the last N % 8, where padding N would keep a zero-padded
# copy of the whole weight: GPT-2's 50257-row LM head is a 77 MB copy, and inside a CUDA graph
# the copy is made on every replay (so the front door ran torch's 101 us kernel there, where
# ours reads 77 MB in ~35 us: benchmarks/results/2026-11-27_h100_every_model_same_bytes/). Below
# it the weight is small and its padded copy costs less than a second launch.
SPLIT_N_MIN = 128


def _splits_n(l: "Layout") -> bool:
    return l.N % l.per16 != 0 and l.K % l.per16 == 0 and l.N >= SPLIT_N_MIN


LAYOUT_RULES: list[LayoutRule] = [
    LayoutRule("pad-k", lambda l: l.K % l.per16 != 0, "copy A and B into zero-padded K",
               "a row of K elements is not a multiple of 16 bytes, which TMA strides must be"),
    LayoutRule("split-n", _splits_n, "compute the first N - N % 8 columns from B as it lies and the last "
               "N % 8 with torch's matmul, into a staged D copied into out",
               "a row of D (N elements) is not a multiple of 16 bytes"),
    LayoutRule("pad-n", lambda l: l.N % l.per16 != 0 and not _splits_n(l),
               "copy B into zero-padded N rows and compute into a padded D",
               "a row of D (N elements) is not a multiple of 16 bytes"),
    LayoutRule("copy-a", lambda l: not l.a_aligned and l.K % l.per16 == 0, "clone A",
               "A does not start on a 16-byte boundary (a view into a larger tensor)"),
    LayoutRule("copy-b", lambda l: not l.b_aligned and l.K % l.per16 == 0, "clone B",
               "B does not start on a 16-byte boundary (a view into a larger tensor)"),
    LayoutRule("stage-out", lambda l: l.out_given and not l.out_aligned and l.N % l.per16 == 0,
               "compute into a fresh D and copy it into out", "out does not start on a 16-byte boundary"),
]


@dataclass(frozen=True)
class Fixes:
    """The copies one call needs and the shape the kernel then sees (``N``/``K`` padded)."""

    names: tuple
    N: int
    K: int

    @property
    def pad_k(self) -> bool:
        return "pad-k" in self.names

    @property
    def pad_n(self) -> bool:
        return "pad-n" in self.names

    @property
    def split_n(self) -> bool:
        """The kernel computes D's first :attr:`N` columns (N rounded down), torch's matmul the rest."""
        return "split-n" in self.names

    @property
    def copies_weight(self) -> bool:
        """B is read through a copy (padded or realigned): inside a CUDA graph, one per replay."""
        return bool({"pad-k", "pad-n", "copy-b"} & set(self.names))

    def copies(self, name: str) -> bool:
        return name in self.names

    def lines(self) -> list[str]:
        by_name = {r.name: r for r in LAYOUT_RULES}
        return [f"{by_name[n].fix} ({by_name[n].why}): correct, slower" for n in self.names]


def layout_fixes(layout: Layout) -> Fixes:
    """Which :data:`LAYOUT_RULES` apply, and the ``N``, ``K`` the kernel is built for (N rounded
    up where it is padded, down where it is split)."""
    names = tuple(r.name for r in LAYOUT_RULES if r.when(layout))
    N = layout.N
    if "pad-n" in names:
        N = _up(layout.N, layout.per16)
    elif "split-n" in names:
        N = layout.N - layout.N % layout.per16
    K = _up(layout.K, layout.per16) if "pad-k" in names else layout.K
    return Fixes(names, N, K)
