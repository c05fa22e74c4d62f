"""Two consumers on one tile's rows, taking alternate K slices (v9's ``k_consumers``, issue 32).

A 64-row tile has one 64-row wgmma atom: one consumer warpgroup issues all of its wgmmas, waits
for each slice's to retire and promotes (fp8) alone, and nothing else feeds the SM's tensor cores
meanwhile. cuBLASLt's kernels at such tiles (``nvjet_sm90_qqtst_64x64_128x13_1x2``, fp8 at
256x2112x7168: 384 threads, a producer and two consumers on one 64x64 tile) keep two consumers'
wgmmas in flight. With ``k_consumers=2`` a tile's rows of each consumer (``num_warpgroups`` of
them, ``blk_m / num_warpgroups`` rows each, as without the knob) get a second consumer warpgroup:
lane 0 takes the tile's even K slices, lane 1 the odd ones, each into sums of its own, and at the
tile's end lane 1 hands its sums to lane 0 through shared memory; lane 0 adds them and runs the
epilogue alone, while lane 1 goes on to the next tile.

    ring position of a tile's slice k:   it + k           (the producer loads them in order)
    lane l's j-th slice of the tile:     it + 2j + l       (:meth:`ring.Ring.lane`: position 2p + l)

    lane 1, tile t:   K loop over its slices; sums -> Rsmem[r, thread]; bar.sync; bar.sync
    lane 0, tile t:   K loop over its slices; bar.sync; sums += Rsmem[r, thread]; bar.sync; epilogue

Both lanes hold the same fragment of the tile (the same rows and columns a thread), so the hand-over
is register r of thread t at ``Rsmem[r, t]``: 32 threads of a warp write 32 consecutive words, no
bank conflict, and no layout to describe (TVM's ``TileLayout`` describes tiles of a matrix; this
buffer is a register file's image, one of the few shared buffers here that is not one). The first
``bar.sync`` orders lane 1's writes before lane 0's reads, the second lane 0's reads before lane
1's next writes (a named barrier of both lanes' 256 threads, after the epilogues' ``1 .. W``).

The ring has an even number of stages: lane l then only ever reads the stages of its own parity
(slot ``(2p + l) % S``), each of them at every phase of its full barrier in turn. With an odd ring a
stage would go to the lanes in turn, a lane's parity wait would skip every other phase, and one
that found the stage's previous load still in flight would take its phase for the one it wants (the
barrier checker finds it: "it missed phase 1").

What it needs: v9's whole-tile K loop (no split K, no narrow tail, no ``epi_under``: the previous
tile's pairs would be lane 0's alone), an even number of K slices (each lane half of them), and
per-tensor or rowwise scales for fp8 (block scales are applied by K block at each promotion, and a
lane's j-th slice is K block 2j + l). A stage is read by one lane, so it is released by that lane's
warps alone (``releases``). The sums are added in another order than one consumer's: the same
fp32 total, rounded differently in its last bits. ``k_halves=True``: lane l adds the l-th contiguous half of
the tile's slices instead (the producer loads the halves in turn, ``producer.interleaved``).

Measured on an H100 (``benchmarks/results/2026-11-28_h100_fp8_kconsumers/``, fp8 per-tensor, each module
against ``torch._scaled_mm`` in the same rounds): slower than one consumer at every shape timed, 1-16%
(256x2112x7168's 64x64 fill tiles 0.80x against 0.83x; the 64x128 fill tiles, which lose two stages to the
hand-over's 32 KiB, 0.83x against 0.99x; the small-M tiles 1-5% slower), in alternate slices and in halves
alike. ncu found both kernels waiting on their loads' latency, not on the consumer; so the policy does not
take it, and it stays a knob to try (16-bit tiles too).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

from ..core.budget import limits_for, smem_bytes
from ..core.config import ConfigError, GemmConfig
from ..core.spec import spec_of
from .common import CONSUMER_BARRIER, THREADS_PER_WG, HopperPlan

CHOICES = (1, 2)  # consumer warpgroups a tile's rows: 2 take alternate K slices


def lanes(cfg: GemmConfig) -> int:
    """The knob ``k_consumers``: consumer warpgroups on each consumer's rows (1: off)."""
    return dict(cfg.extra).get("k_consumers", 1)


def halves(cfg: GemmConfig) -> bool:
    """The knob ``k_halves``: each lane adds a contiguous half of the tile's K slices (the halves
    loaded in turn, ``producer.interleaved``) instead of every other slice."""
    return bool(dict(cfg.extra).get("k_halves", False))


def buffer_shape(cfg: GemmConfig) -> tuple:
    """The hand-over buffer: one image of the sums' registers a row owner, [owners, regs, threads]."""
    return (cfg.num_warpgroups, HopperPlan(cfg).acc_regs, THREADS_PER_WG)


def smem_bytes_more(cfg: GemmConfig) -> int:
    """Shared memory the hand-over takes beside the ring and the staging (0 without the knob)."""
    if lanes(cfg) == 1:
        return 0
    owners, regs, threads = buffer_shape(cfg)
    return owners * regs * threads * 4


def check(cfg: GemmConfig) -> None:
    """``k_consumers`` is 1 or 2, and with 2 the kernel is one this file builds (module docstring)."""
    want = lanes(cfg)
    if not isinstance(want, int) or isinstance(want, bool) or want not in CHOICES:
        raise ConfigError(f"k_consumers={want!r}: the consumer warpgroups on one tile's rows are 1 or 2 (two take "
                          "alternate K slices); use k_consumers=1 or k_consumers=2")
    if halves(cfg) and want == 1:
        raise ConfigError("k_halves=True with k_consumers=1: it says which K slices each of two consumers on a "
                          "tile's rows adds; use k_consumers=2, or k_halves=False")
    if want == 1:
        return
    extra = dict(cfg.extra)
    fix = "use k_consumers=1"
    if extra.get("epi_under") or extra.get("tail_n", 0) or extra.get("halves") or extra.get("stagger"):
        raise ConfigError("k_consumers=2 with epi_under, tail_n, halves or stagger: the second consumer's sums are "
                          "handed over at the end of a whole tile's plain K loop, built without those; turn them "
                          f"off, or {fix}")
    if cfg.k_tiles % 2:
        raise ConfigError(f"k_consumers=2 with K={cfg.K}: {cfg.k_tiles} slices of {cfg.blk_k} do not split evenly "
                          f"between two consumers taking alternate slices; {fix}, or a K that is a multiple of "
                          f"{2 * cfg.blk_k}")
    if cfg.pipe_depth % 2:
        raise ConfigError(f"k_consumers=2 with pipe_depth={cfg.pipe_depth}: with an odd ring a stage goes to each "
                          "consumer in turn, and a consumer that waits on every second phase of a full barrier "
                          "cannot tell the phase it wants from the one before it (a parity wait); use an even "
                          f"pipe_depth ({cfg.pipe_depth - 1} or {cfg.pipe_depth + 1}), or {fix}")
    spec = spec_of(cfg)
    if spec.is_fp8 and spec.scales == "block":
        raise ConfigError("k_consumers=2 with block scales: a K block's scales are applied as its slice is "
                          f"promoted, and the lanes' slices are every other K block; {fix}, or per-tensor or "
                          "rowwise scales")
    need = smem_bytes(cfg, cfg.pipe_depth) + smem_bytes_more(cfg)
    most = limits_for(cfg.arch).smem_per_block
    if need > most:
        raise ConfigError(f"k_consumers=2 with pipe_depth={cfg.pipe_depth}: the ring, the staging and the hand-over "
                          f"of the second consumer's sums ({smem_bytes_more(cfg)} bytes) take {need} bytes of shared "
                          f"memory, over the {most} a block may use; use a smaller pipe_depth")


@dataclass(frozen=True)
class HandOver:
    """Lane 1's sums to lane 0 at a tile's end (module docstring): the buffer, this thread's index in
    its warpgroup, the row owner's index and the named barrier's id."""

    buf: object  # float32[owners, acc_regs, 128] shared
    regs: int  # the sums' registers a thread
    thread: object  # this thread's index in its warpgroup
    owner: object  # the consumer whose rows these lanes take
    owners: int  # num_warpgroups: the epilogues' named barriers come first

    @property
    def bar(self):
        return CONSUMER_BARRIER + self.owners + self.owner

    def meet(self, sums, lane) -> None:
        """Lane 1 hands ``sums`` over, lane 0 adds them into its own (both lanes call it)."""
        _meet(self, sums, lane)


@T.inline
def _meet(h, sums, lane):
    if lane > 0:
        for r in T.unroll(h.regs):
            h.buf[h.owner, r, h.thread] = sums[r]
    T.ptx.bar.sync(T.Cast("uint32", h.bar), 2 * THREADS_PER_WG)
    if lane == 0:
        for r in T.unroll(h.regs):
            sums[r] = sums[r] + h.buf[h.owner, r, h.thread]
    T.ptx.bar.sync(T.Cast("uint32", h.bar), 2 * THREADS_PER_WG)
