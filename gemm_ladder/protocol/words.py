"""Words for sets of threads: ``warpgroups 0-1``, ``lane 0 of warps 0-7``, ``thread 0``."""

from __future__ import annotations


def ranges(xs) -> str:
    xs = sorted(set(xs))
    out, start, prev = [], None, None
    for x in xs + [None]:
        if start is None:
            start = prev = x
        elif x is not None and x == prev + 1:
            prev = x
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = x
    return ", ".join(out)


def plural(word, xs):
    return f"{word}{'s' if len(set(xs)) > 1 else ''} {ranges(xs)}"


def describe(threads, n_threads: int) -> str:
    """``warpgroups 0-1``, ``lane 0 of warps 0-7``, ``thread 0``... for a set of (rank, tid)."""
    tids = sorted({t for _, t in threads})
    if not tids:
        return "no thread"
    if len(tids) == 1:
        t = tids[0]
        return f"thread {t}" + (f" (warp {t // 32} lane {t % 32})" if t else "")
    if len(tids) == n_threads:
        return f"all {n_threads} threads"
    warps: dict[int, list] = {}
    for t in tids:
        warps.setdefault(t // 32, []).append(t)
    full = [w for w, ts in warps.items() if len(ts) == 32]
    if len(full) == len(warps):
        wgs = {w // 4 for w in full}
        if all(all(g * 4 + i in warps for i in range(4)) for g in wgs) and len(full) == 4 * len(wgs):
            return f"{plural('warpgroup', wgs)} ({len(tids)} threads)"
        return f"{plural('warp', full)} ({len(tids)} threads)"
    if all(len(ts) == 1 for ts in warps.values()):
        lanes = {t % 32 for t in tids}
        lane = f"lane {lanes.pop()}" if len(lanes) == 1 else "one lane"
        return f"{lane} of {plural('warp', warps)}"
    return f"{len(tids)} threads of {plural('warp', warps)}"


def unit_of(threads, n_threads: int) -> str:
    """warpgroup, warp or thread: what the watchdog names for a waiter at this site."""
    tids = sorted({t for _, t in threads})
    if len(tids) <= 1:
        return "thread"
    text = describe(threads, n_threads)
    if text.startswith("warpgroup") or text.startswith("all"):
        return "warpgroup"
    if text.startswith("warp") or " of warp" in text:
        return "warp"
    return "thread"
