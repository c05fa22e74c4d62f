"""Measure candidate folders on many GPUs through TVM's RPC tracker.

    python -m gemm_ladder tune --rung v6 --shapes 4096x4096x4096,8192x8192x8192 --tracker HOST:9190 --key h200
    python -m gemm_ladder tune --measure build/tune/* --tracker HOST:9190 --key h200

    from gemm_ladder.tune.rpc import measure_folders
    run = measure_folders(["build/tune/v6_4096x4096x4096_float16_sm_90a"], ("127.0.0.1", 9190), "h200")

The candidates of every folder go in batches of ``batch`` to the servers registered under
``key`` (``gemm_ladder.tune.serve``; one per GPU), as many batches at once as there are
servers. A batch is one RPC session from the tracker: its modules and manifests are uploaded,
the server measures them the way ``tune --measure`` does (``measuring.time_paths``: checked,
then timed against cuBLAS in the same process, each module in a watched child) and replies.
Each reply is checked: the sha256 of every file the server measured, the statuses it may
report, speeds a GPU can reach (``device.speed_problem``).

What a failure costs:

=====================================  ==================================================
a kernel that hangs, crashes, errs     that candidate (``timeout``, ``crash``, ``error``
or is wrong                            from the server's watched child; ``wrong``)
a server that dies, hangs (its         a batch of one: that candidate, ``server-lost``
session timeout passes) or replies     (``bad-reply`` for a reply that does not parse);
what cannot be read                    a larger batch: each of its candidates is sent
                                       again alone, to whichever server is free
a result that cannot be real           that candidate, ``bad-reply``
(another file's hash, a speed no GPU
reaches)
no server left for ``server_wait`` s   the candidates not yet measured, ``no-server``
=====================================  ==================================================

Every folder gets its measurements file (the format of ``measuring.measure``: ``tune
--merge`` takes it), with the server of each result; :func:`measure_folders` returns the run:
all reports, the wall time and candidates per minute, per server what it measured.

Runtime-only, like ``measuring``: TVM's RPC client is part of its runtime.
"""

from __future__ import annotations

import collections
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import files, records
from ..core.device import speed_problem
from ..core.manifest import manifest_path
from ..core.spec import text_is_fp8
from ..core.procs import progress as progress_bar
from ..core.provenance import utc_now
from ..measure import isolate
from .measuring import RUN_FORMAT, make_report, read_candidates, write_report
from .serve import MEASURE_FN, servers_of

# what a server's watched child reports (gemm_ladder.measure.isolate), and what this side adds
CHILD_STATUSES = ("ok", "wrong", "error", "timeout", "crash")
RPC_STATUSES = ("server-lost", "bad-reply", "no-server")
UPLOAD_SECONDS = 120.0  # a session's slack beyond its modules' deadlines: upload, fork, reply
REPLY_GRACE = 30.0  # past the session timeout with no reply, this side gives the session up
POLL = 0.2
SERVER_CHECK_EVERY = 5.0


def session_timeout(n: int, timeout: float) -> float:
    """The session timeout the server enforces for a batch of ``n``: every module may hang
    (``timeout``) and cost a fresh child (``isolate.STARTUP_SECONDS``)."""
    return n * (timeout + isolate.STARTUP_SECONDS) + UPLOAD_SECONDS


@dataclass
class Item:
    """One candidate to measure: its folder (index), its index there, file and hash (what
    :func:`read_reply` checks a server's results against)."""

    folder: int
    index: int
    path: Path
    sha256: str
    first_try: str | None = None


@dataclass
class _Attempt:
    """One batch on one server: an RPC session from the tracker, in a thread of its own (a
    server that never answers holds that thread, not the run)."""

    items: list
    tracker: tuple
    key: str
    reps: int
    timeout: float
    phase: str = "request"
    since: float = field(default_factory=time.monotonic)
    reply: str | None = None
    error: str | None = None
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def session_timeout(self) -> float:
        return session_timeout(len(self.items), self.timeout)

    def start(self) -> "_Attempt":
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()

    def _run(self) -> None:
        from tvm import rpc  # pylint: disable=import-outside-toplevel

        try:
            tracker = rpc.connect_tracker(*self.tracker)
            try:
                session = tracker.request(self.key, session_timeout=math.ceil(self.session_timeout), max_retry=2)
            finally:
                tracker.close()
            if self.cancelled:
                return
            self._enter("upload")
            for it in self.items:
                session.upload(str(it.path), it.path.name)
                session.upload(str(manifest_path(it.path)), manifest_path(it.path).name)
            self._enter("measure")
            request = {"files": [it.path.name for it in self.items], "reps": self.reps, "timeout": self.timeout}
            self.reply = session.get_function(MEASURE_FN)(json.dumps(request))
        except Exception as err:  # pylint: disable=broad-except  (any failure of the session is a result)
            self.error = f"{type(err).__name__}: {' '.join(str(err).split())[:600]}"
        finally:
            self.done.set()


class BadReply(ValueError):
    """A server's reply that cannot be read as results for the batch it was sent."""


def server_name(who: dict) -> str:
    gpu = who.get("cuda_visible_devices") or "all"
    return f"{who.get('host', '?')}/gpu{gpu}"


def _speed_of(man: dict) -> tuple[str, bool]:
    """What bounds a candidate folder's speeds: its arch, and whether its spec is fp8 (twice the peak)."""
    return man["arch"], text_is_fp8(man.get("spec"))


def _result_problem(res: dict, item: Item, arch: str, fp8: bool = False) -> str | None:
    if res.get("so_sha256") != item.sha256:
        return (f"the server measured a file with sha256 {str(res.get('so_sha256'))[:12]}..., not "
                f"{item.path.name} ({item.sha256[:12]}...)")
    if res["status"] != "ok":
        return None
    for name in ("tflops", "cublas_tflops"):
        problem = speed_problem(res.get(name), arch, name, fp8)
        if problem:
            return problem
    for name in ("ms", "cublas_ms", "ratio_to_cublas"):
        v = res.get(name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            return f"{name} {v!r} is not a positive finite number"
    return None


def read_reply(reply, items: list, archs: list) -> tuple[list[dict], dict]:
    """``(one result per item, the server's identity)``; :class:`BadReply` when the reply as a
    whole cannot be read. A result that cannot be real (on its item's arch: ``archs`` holds an arch, or
    :func:`_speed_of`'s ``(arch, fp8)``) becomes ``bad-reply``."""
    try:
        if isinstance(reply, str) and records.depth(reply) > records.MAX_DEPTH:
            raise ValueError(f"it nests deeper than {records.MAX_DEPTH} levels")  # json.loads would recurse out
        data = json.loads(reply)
    except (TypeError, ValueError) as err:
        raise BadReply(f"the reply is not JSON ({err}): {str(reply)[:120]!r}") from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or len(results) != len(items):
        raise BadReply(f"the reply has no list of {len(items)} results: {str(reply)[:120]!r}")
    who = data.get("server") if isinstance(data.get("server"), dict) else {}
    out = []
    for res, item, speed in zip(results, items, archs):
        arch, fp8 = speed if isinstance(speed, tuple) else (speed, False)
        if not isinstance(res, dict) or res.get("status") not in CHILD_STATUSES:
            res = {"status": "bad-reply", "detail": f"not a result: {str(res)[:120]!r}"}
        else:
            problem = _result_problem(res, item, arch, fp8)
            if problem:
                res = {"status": "bad-reply", "detail": problem, "reported": res}
        out.append({**{k: v for k, v in res.items() if k != "module"}, "server": server_name(who)})
    return out, who


class _Run:
    """The state of one run over all folders: the queue of batches, the attempts under way."""

    def __init__(self, items, mans, tracker, key, reps, timeout, batch, workers, bar):
        self.tracker, self.key, self.reps, self.timeout = tracker, key, reps, timeout
        self.mans, self.workers, self.bar = mans, workers, bar
        self.queue = collections.deque(items[i:i + batch] for i in range(0, len(items), batch))
        self.running: list[_Attempt] = []
        self.results: dict[tuple[int, int], dict] = {}
        self.servers: dict[str, dict] = {}
        self.counts = collections.Counter()

    def record(self, item: Item, res: dict) -> None:
        if item.first_try and "first_try" not in res:
            res = {**res, "first_try": item.first_try}
        self.results[(item.folder, item.index)] = res
        self.counts["ok" if res["status"] == "ok" else "failed"] += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(ok=self.counts["ok"], failed=self.counts["failed"], busy=len(self.running))

    def failed(self, att: _Attempt, status: str, detail: str) -> None:
        """A session that ended without results: a batch of one is recorded, a larger one is
        sent again candidate by candidate."""
        if len(att.items) == 1:
            self.record(att.items[0], {"status": status, "detail": detail})
            return
        for it in reversed(att.items):
            it.first_try = f"{status} in a batch of {len(att.items)}: {detail}"
            self.queue.appendleft([it])

    def finish(self, att: _Attempt) -> None:
        if att.error is not None:
            self.failed(att, "server-lost", f"the RPC session ended ({att.phase}): {att.error}")
            return
        try:
            results, who = read_reply(att.reply, att.items, [_speed_of(self.mans[it.folder]) for it in att.items])
        except BadReply as err:
            self.failed(att, "bad-reply", str(err))
            return
        name = server_name(who)
        info = self.servers.setdefault(name, {"gpu": who.get("gpu") or {}, "candidates": 0, "ok": 0})
        for it, res in zip(att.items, results):
            info["candidates"] += 1
            info["ok"] += res["status"] == "ok"
            self.record(it, res)

    def drive(self, server_wait: float) -> None:
        seen_server, checked = time.monotonic(), 0.0
        while self.queue or self.running:
            while self.queue and len(self.running) < self.workers:
                self.running.append(_Attempt(self.queue.popleft(), self.tracker, self.key, self.reps,
                                             self.timeout).start())
            time.sleep(POLL)
            now = time.monotonic()
            for att in list(self.running):
                if att.done.is_set():
                    self.running.remove(att)
                    self.finish(att)
                elif att.phase != "request" and now - att.since > att.session_timeout + REPLY_GRACE:
                    att.cancelled = True
                    self.running.remove(att)
                    self.failed(att, "server-lost", f"no reply {att.session_timeout + REPLY_GRACE:.0f} s into "
                                                    f"the session ({att.phase}): the server hangs or is unreachable")
            if now - checked > SERVER_CHECK_EVERY:
                checked = now
                if servers_of(self.tracker, self.key):
                    seen_server = now
                elif now - seen_server > server_wait:
                    self.give_up(f"no server with key {self.key!r} at the tracker "
                                 f"{self.tracker[0]}:{self.tracker[1]} for {server_wait:.0f} s")

    def give_up(self, why: str) -> None:
        for att in self.running:
            att.cancelled = True
            for it in att.items:
                self.record(it, {"status": "no-server", "detail": why})
        self.running.clear()
        while self.queue:
            for it in self.queue.popleft():
                self.record(it, {"status": "no-server", "detail": why})


def _items(folders, mans) -> list[Item]:
    items = []
    for f, (folder, man) in enumerate(zip(folders, mans)):
        for i, cand in enumerate(man["candidates"]):
            path = folder / cand["file"]
            if not path.exists():
                continue
            try:
                sha = records.read_json(manifest_path(path), "module manifest", "build the candidates again",
                                        records.Obj({"so_sha256": records.Str()}))["so_sha256"]
            except records.RecordError:
                sha = ""
            items.append(Item(f, i, path, sha))
    return items


def measure_folders(folders, tracker: tuple[str, int], key: str, reps: int = 50, timeout: float = 300.0,
                    batch: int = 4, out=None, progress: bool = True, plot=True, server_wait: float = 120.0,
                    workers: int | None = None) -> dict:
    """Measure every candidate of ``folders`` on the tracker's ``key`` servers (see the module
    docstring); write each folder's measurements and, when ``out`` is given, the run there.

    ``workers``: batches under way at once (default: the servers registered now). Returns the
    run: ``reports`` (one per folder), ``wall_s``, ``candidates_per_minute``, ``servers``.
    """
    folders = [Path(f) for f in folders]
    mans = [read_candidates(f) for f in folders]
    registered = servers_of(tracker, key)
    deadline = time.monotonic() + server_wait
    while not registered and time.monotonic() < deadline:
        time.sleep(1.0)
        registered = servers_of(tracker, key)
    if not registered:
        raise RuntimeError(f"no RPC server with key {key!r} at the tracker {tracker[0]}:{tracker[1]} after "
                           f"{server_wait:.0f} s: start them with python -m gemm_ladder serve --key {key}")
    items = _items(folders, mans)
    bar = progress_bar(len(items), f"measure on {len(registered)} server(s)") if progress and items else None
    run = _Run(items, mans, tracker, key, reps, timeout, max(1, batch), workers or len(registered), bar)
    start = time.monotonic()
    try:
        run.drive(server_wait)
    finally:
        if bar is not None:
            bar.close()
    wall = time.monotonic() - start
    reports = []
    for f, (folder, man) in enumerate(zip(folders, mans)):
        by_index = {i: res for (g, i), res in run.results.items() if g == f}
        mine = collections.Counter(r.get("server") for r in by_index.values() if r.get("server"))
        gpu = run.servers[mine.most_common(1)[0][0]]["gpu"] if mine else {"name": "unknown"}
        report = make_report(folder, man, by_index, gpu, reps, timeout,
                             rpc={"tracker": f"{tracker[0]}:{tracker[1]}", "key": key, "batch": batch,
                                  "servers": dict(mine)})
        reports.append(write_report(report, None, plot))
    measured = sum(r["status"] != "no-server" for r in run.results.values())
    result = {
        "format": RUN_FORMAT, "version": 1, "date": utc_now(),
        "tracker": f"{tracker[0]}:{tracker[1]}", "key": key, "batch": batch, "reps": reps, "timeout_s": timeout,
        "workers": run.workers, "servers": run.servers, "wall_s": round(wall, 2), "candidates": len(items),
        "measured": measured, "ok": run.counts["ok"],
        "candidates_per_minute": round(measured / wall * 60, 2) if wall > 0 else None,
        "reports": reports,
    }
    if out:
        files.write_json(Path(out), result)
        result["path"] = str(out)
    return result
