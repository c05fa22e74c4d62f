"""The watchdog's runtime half: the bounded wait's CUDA code, the record, and its words.

A module built with the ``watchdog`` knob (seconds) takes one more kernel argument: the address
of a record in pinned host memory. Every mbarrier wait of the kernel is bounded
(:mod:`gemm_ladder.sync.classes` emits :data:`WAIT_SOURCE`); when one gives up, the first
waiter to do so fills the record and every waiter leaves the kernel. :func:`launch` launches
such a module, watches the record *while the kernel runs* (pinned host memory needs no copy,
so a kernel that does not stop still tells us what it waits on) and raises
:class:`BarrierTimeoutError` in words::

    v6: consumer warpgroup 1 of CTA 17 waits on tma2mma[2] (phase parity 1) for 2.0 s

This module imports neither TVM nor torch at import time: it runs on a GPU box with the TVM
runtime alone, and its decoding is tested on the CPU.
"""

from __future__ import annotations

import os
import time

WAIT_FN = "gemm_ladder_bounded_wait"
RECORD_WORDS = 16
# int64 words of the record
LAUNCH, DONE, BAR, STAGE, PARITY, SITE, CTA, THREAD, WAITED_NS, STATE, RANK = range(11)
POLL_SECONDS = 0.002
GRACE_SECONDS = 1.0  # after the record is written: time for the other waiters to leave

# The bounded wait. The fast path is one try_wait, as in TVM's wait; the slow path polls the
# same try_wait and reads %globaltimer, and only after a millisecond of waiting does it touch
# memory: the launch id in the record (pinned host memory, a PCIe read) and the claim word (a
# device global). Reading the record at every slow wait made v9's watchdog build about 1100x
# slower than its shipped build on an H100 (benchmarks/results/2026-11-22_h100_barrier_watchdog/).
# The first waiter of a launch past its limit (launch ids only grow) raises the claim word with
# atomicMax and writes the record; the others see it raised and leave once the record is out
# (a thread that leaves early can fault the kernel -- lanes gone from a warp that reaches an
# .aligned barrier -- before the claimer has written it: seen on an H100 with v5's phase fault).
WAIT_SOURCE = r"""
__device__ unsigned long long gemm_ladder_watchdog_claim = 0ull;
__forceinline__ __device__ void gemm_ladder_bounded_wait(void* bar, int phase, long long rec_addr,
                                                         int bar_id, int stage, int site,
                                                         long long limit_ns) {
    unsigned int addr = (unsigned int)__cvta_generic_to_shared(bar);
    unsigned int done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done) : "r"(addr), "r"(phase) : "memory");
    if (done) return;
    volatile long long* rec = (volatile long long*)rec_addr;
    unsigned long long launch = 0ull;
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (true) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(addr), "r"(phase) : "memory");
        if (done) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start < 1000000ull) continue;  // the first millisecond: the barrier only
        if (launch == 0ull) launch = (unsigned long long)rec[0];
        if (*(volatile unsigned long long*)&gemm_ladder_watchdog_claim >= launch) {
            // another waiter claimed this launch: leave only once its record is out, so that no
            // thread's exit (a warp at an .aligned barrier with lanes gone faults the kernel)
            // can end the kernel before the claimer has written it
            while ((unsigned long long)rec[1] != launch) { __nanosleep(1000); }
            asm volatile("exit;");
        }
        if (now - start >= (unsigned long long)limit_ns) {
            if (atomicMax(&gemm_ladder_watchdog_claim, launch) < launch) {
                unsigned long long state;
                unsigned int rank;
                asm volatile("ld.shared.b64 %0, [%1];" : "=l"(state) : "r"(addr) : "memory");
                asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
                rec[2] = bar_id;
                rec[3] = stage;
                rec[4] = phase;
                rec[5] = site;
                rec[6] = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
                rec[7] = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
                rec[8] = (long long)(now - start);
                rec[9] = (long long)state;
                rec[10] = rank;
                __threadfence_system();
                rec[1] = (long long)launch;
                __threadfence_system();
            }
            asm volatile("exit;");
        }
    }
}
"""


class BarrierTimeoutError(RuntimeError):
    """A bounded mbarrier wait gave up: the message says which barrier, phase, CTA and role.

    Attributes: ``record`` (the decoded fields), ``kernel_stopped`` (whether the kernel left
    the GPU; if not, the CUDA context is still busy and the process should end).
    """

    def __init__(self, message: str, record: dict, kernel_stopped: bool):
        super().__init__(message)
        self.record = record
        self.kernel_stopped = kernel_stopped


class KernelHangError(RuntimeError):
    """The kernel did not finish and no bounded wait gave up (a named barrier, a spin?)."""


def decode(words, table: dict) -> dict:
    """The record's words as named fields, with the barrier's and the wait site's names."""
    words = [int(w) for w in words]
    bars = table.get("barriers", [])
    sites = table.get("sites", [])
    bar_id, site_id = words[BAR], words[SITE]
    bar = bars[bar_id] if 0 <= bar_id < len(bars) else {"name": f"barrier{bar_id}"}
    site = sites[site_id] if 0 <= site_id < len(sites) else {}
    return {
        "barrier": bar.get("name"), "slot": words[STAGE], "parity": words[PARITY],
        "site": site_id, "role": site.get("role"), "unit": site.get("unit"),
        "cta": words[CTA], "cluster_rank": words[RANK], "thread": words[THREAD],
        "waited_s": words[WAITED_NS] / 1e9, "state_word": words[STATE] & (2**64 - 1),
    }


def describe_waiter(rec: dict) -> str:
    """``consumer warpgroup 1 of CTA 17`` from a decoded record (unit from the wait site)."""
    t = rec["thread"]
    unit = rec.get("unit") or "thread"
    who = {"warpgroup": f"warpgroup {t // 128}", "warp": f"warp {t // 32}"}.get(unit, f"thread {t}")
    role = rec.get("role")
    where = f"CTA {rec['cta']}" + (f" (rank {rec['cluster_rank']} of its cluster)" if rec.get("cluster_rank") else "")
    return f"{role + ' ' if role else ''}{who} of {where}"


def message(label: str, rec: dict) -> str:
    return (f"{label}: {describe_waiter(rec)} waits on {rec['barrier']}[{rec['slot']}] "
            f"(phase parity {rec['parity']}) for {rec['waited_s']:.1f} s "
            f"[wait site {rec['site']}, thread {rec['thread']}, barrier word 0x{rec['state_word']:016x}]")


_LAUNCH_ID = [0]


def _next_launch_id() -> int:
    # grows within a process and across the processes that share a loaded module's lifetime
    _LAUNCH_ID[0] = max(_LAUNCH_ID[0] + 1, time.time_ns() // 1000)
    return _LAUNCH_ID[0]


def launch(fn, args, table: dict, label: str, hang_seconds: float | None = None):
    """Run ``fn(*args, record_address)`` and raise :class:`BarrierTimeoutError` if a wait gave up.

    The kernel is watched from the host: the record lives in pinned host memory, so it can be
    read while the kernel still runs. ``hang_seconds`` (default: ten bounds, at least 30 s)
    raises :class:`KernelHangError` if the kernel neither ends nor reports.
    """
    import torch  # pylint: disable=import-outside-toplevel

    rec = torch.zeros(RECORD_WORDS, dtype=torch.int64, pin_memory=True)
    lid = _next_launch_id()
    rec[LAUNCH] = lid
    fn(*args, rec.data_ptr())
    done = torch.cuda.Event()
    done.record()
    bound = float(table.get("seconds") or 1.0)
    limit = hang_seconds if hang_seconds is not None else max(30.0, 10 * bound)
    give_up = time.monotonic() + limit
    reported_at = None
    while not finished(done, rec, lid):
        if int(rec[DONE]) == lid:
            reported_at = reported_at or time.monotonic()
            if time.monotonic() - reported_at > GRACE_SECONDS:
                break
        elif time.monotonic() > give_up:
            raise KernelHangError(
                f"{label}: the kernel neither finished nor reported a barrier wait within "
                f"{limit:.0f} s: "
                "a hang outside the mbarrier waits (a named barrier, a spin loop?)")
        time.sleep(POLL_SECONDS)
    if int(rec[DONE]) != lid:
        return
    stopped = finished(done, rec, lid)
    fields = decode(rec.tolist(), table)
    raise BarrierTimeoutError(message(label, fields), fields, stopped)


def finished(done, rec, lid: int) -> bool:
    """Whether the kernel has left the GPU. A kernel whose waiters gave up may end in a fault
    (threads leave the kernel mid-protocol): once the record is out, that fault is the
    watchdog's stop, and the record, not the fault, is the report; before, the fault is raised."""
    try:
        return bool(done.query())
    except RuntimeError:
        if int(rec[DONE]) == lid:
            return True
        raise


def enabled(manifest: dict) -> dict | None:
    """The decode table of a module built with the watchdog, else None."""
    return manifest.get("watchdog") or None


def env_hang_seconds() -> float | None:
    value = os.environ.get("GEMM_LADDER_WATCHDOG_HANG_S")
    return float(value) if value else None
