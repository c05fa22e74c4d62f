"""The GPU side of tuning over RPC: TVM's RPC servers that measure candidates, one per GPU, and a tracker.

    python -m gemm_ladder serve --key h200                       # tracker on :9190 + a server per visible GPU
    python -m gemm_ladder serve --key h200 --tracker HOST:9190   # this host's GPUs join a tracker elsewhere
    python -m gemm_ladder serve --status --tracker HOST:9190     # the tracker's servers and queues

The tracker and the servers are TVM's own (``tvm.rpc.tracker``, ``tvm.rpc.server``), run in
this package's processes instead of through ``tvm.rpc.Tracker`` / ``tvm.rpc.Server``, which
hop through a cloudpickle worker that neither box installs. A server registers with the
tracker under a key (the kind of GPU: ``h200``); the tracker hands each free server to one
client at a time; every client session runs in a process forked from the server, in a fresh
temp folder, ended by the server when the client's session timeout passes. A server whose
session process crashes stops serving (TVM's listen loop raises): :class:`Cluster` starts it
again.

Each server adds one function to TVM's (upload, load_module, ...): ``gemm_ladder.tune.measure``
takes ``{"files": [...], "reps", "timeout"}`` naming uploaded modules (each with its
``.so.json``), measures them with :func:`gemm_ladder.tune.measuring.time_paths` (the ``time``
job of ``gemm_ladder.measure.isolate`` in a watched child: checked, then timed against cuBLAS in the
same process, as ``bench`` does; a hang or crash costs only that module) and returns their
results with the sha256 of each file it measured and who it is (host, GPU). The server process
never touches CUDA itself (its GPU is read once, in a child): a forked session must not inherit
a CUDA context.

Runtime-only, like ``measuring``: the servers run from the runtime pack (``pack-runtime``),
torch and this project. ``tornado`` is needed for the tracker only (the pack carries it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from ..core import cli_types
from .measuring import time_paths

MEASURE_FN = "gemm_ladder.tune.measure"
TRACKER_PORT = 9190  # TVM's defaults: a tracker on 9190..9199, servers from 9090
SERVER_PORT = 9090
RESTARTS = 3  # per GPU, by Cluster.watch: a GPU whose server keeps dying is given up
_GPU_INFO = "import json; from gemm_ladder.measure import harness; print(json.dumps(harness.gpu_info(0)))"


def tracker_problem(tracker: tuple[str, int], timeout: float = 5.0) -> str | None:
    """Why nothing can be asked of a tracker at ``tracker`` (no such host, nothing listening), or
    None. TVM's own client retries a dead address for a minute, then raises: asked first, a
    mistyped ``--tracker`` is one line at once."""
    try:
        with socket.create_connection(tracker, timeout=timeout):
            return None
    except OSError as err:
        return (f"nothing answers at {tracker[0]}:{tracker[1]} ({err.strerror or err}): start a tracker there "
                f"with python -m gemm_ladder serve --key KEY, or name the one that runs")


def parse_address(text: str, default_port: int = TRACKER_PORT) -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``) -> ``(host, port)``."""
    host, sep, port = str(text).rpartition(":")
    if not sep:
        return str(text), default_port
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise ValueError(f"tracker address {text!r} is not HOST:PORT, e.g. 127.0.0.1:{default_port}") from None


# -- one server ---------------------------------------------------------------------------------
def sha256_of(path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def probe_gpu() -> dict:
    """``harness.gpu_info()`` of this server's GPU, read in a child process (see the docstring)."""
    out = subprocess.run([sys.executable, "-c", _GPU_INFO], capture_output=True, text=True, check=False,
                         timeout=300)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"name": "unknown", "error": " ".join(out.stderr.split())[-300:]}


def identity(gpu: dict) -> dict:
    """Who a server is, returned with every reply: host, process, the GPU it was given."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "gpu": gpu}


def measure_request(request: str, measure, who: dict, workpath=None) -> str:
    """The body of ``gemm_ladder.tune.measure``: JSON in, JSON out (see the module docstring)."""
    req = json.loads(request)
    if workpath is None:
        import tvm_ffi  # pylint: disable=import-outside-toplevel

        workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath")
    paths = [Path(workpath(name)) for name in req["files"]]
    digests = [sha256_of(p) for p in paths]
    results = measure(paths, int(req.get("reps", 50)), float(req.get("timeout", 300.0)))
    return json.dumps({"results": [{**r, "so_sha256": d} for r, d in zip(results, digests)], "server": who})


def run_server(tracker: tuple[str, int], key: str, host: str = "0.0.0.0", port: int = SERVER_PORT,
               port_end: int | None = None, custom_addr: str | None = None, measure=None,
               gpu: dict | None = None) -> int:
    """Serve until TVM's listen loop ends (a session process that crashed). ``measure(paths,
    reps, timeout) -> results`` defaults to ``measuring.time_paths``; ``gpu`` to :func:`probe_gpu`."""
    import tvm_ffi  # pylint: disable=import-outside-toplevel
    from tvm.rpc.server import PopenRPCServerState  # pylint: disable=import-outside-toplevel

    if measure is None:
        measure = time_paths
    # sessions are forked: they inherit the function registered here (spawn would not)
    multiprocessing.set_start_method("fork", force=True)
    who = identity(gpu if gpu is not None else probe_gpu())
    tvm_ffi.register_global_func(MEASURE_FN, lambda request: measure_request(request, measure, who), override=True)
    state = PopenRPCServerState(host, port, port_end or port + 100, tracker_addr=tracker, key=key,
                                custom_addr=custom_addr, silent=True)
    print(f"gemm_ladder serve: server {key} (pid {os.getpid()}) on {host}:{state.port} "
          f"(GPU {who['cuda_visible_devices'] or 'all'}: "
          f"{who['gpu'].get('name')}), tracker {tracker[0]}:{tracker[1]}", flush=True)
    state.thread.join()
    print(f"gemm_ladder serve: server on port {state.port} stopped serving", file=sys.stderr, flush=True)
    return 1


def server_main(argv=None, measure=None, gpu: dict | None = None) -> int:
    """``python -m gemm_ladder.tune.serve server ...``: one server (what :class:`Cluster` starts)."""
    p = argparse.ArgumentParser(prog="python -m gemm_ladder.tune.serve server")
    p.add_argument("--tracker", type=cli_types.address, required=True)
    p.add_argument("--key", type=cli_types.word, required=True)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=cli_types.port, default=SERVER_PORT)
    p.add_argument("--port-end", type=cli_types.port, default=None)
    p.add_argument("--custom-addr", default=None)
    a = p.parse_args(cli_types.glue_values(argv if argv is not None else sys.argv[1:]))
    return run_server(a.tracker, a.key, a.host, a.port, a.port_end, a.custom_addr, measure, gpu)


# -- the tracker --------------------------------------------------------------------------------
def start_tracker(host: str = "0.0.0.0", port: int = TRACKER_PORT, port_end: int | None = None):
    """TVM's tracker in a thread of this process; ``.port`` is where it listens, :func:`stop_tracker` ends it."""
    from tvm.rpc.tracker import PopenTrackerServerState  # pylint: disable=import-outside-toplevel

    return PopenTrackerServerState(host, port, port_end or port + 10, silent=True)


def stop_tracker(state, address: tuple[str, int]) -> None:
    """The tracker's own STOP request (what ``tvm.rpc.Tracker.terminate`` sends), then join its thread."""
    from tvm.rpc import base  # pylint: disable=import-outside-toplevel

    try:
        with socket.create_connection(address, timeout=5) as sock:
            sock.settimeout(5)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            base.recvall(sock, 4)
            base.sendjson(sock, [base.TrackerCode.STOP, state.stop_key])
            base.recvjson(sock)
    except OSError:
        pass
    state.thread.join(timeout=10)


def servers_of(tracker: tuple[str, int], key: str, timeout: float = 10.0) -> list[list]:
    """Addresses of the servers registered with the tracker under ``key`` ([] when it is unreachable)."""
    from tvm.rpc import base  # pylint: disable=import-outside-toplevel

    try:
        with socket.create_connection(tracker, timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            base.recvall(sock, 4)
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            code, summary = base.recvjson(sock)
    except (OSError, ValueError):
        return []
    if code != base.TrackerCode.SUCCESS:
        return []
    return [s["addr"] for s in summary.get("server_info", []) if s.get("key") == f"server:{key}"]


def status(tracker: tuple[str, int], timeout: float = 30.0) -> str:
    """The tracker's own text summary: servers, and per key the free and pending counts. A peer
    that accepts but does not answer raises ``TimeoutError`` after ``timeout`` s (TVM's client
    sockets take the default timeout, set here while it talks)."""
    from tvm import rpc  # pylint: disable=import-outside-toplevel

    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        session = rpc.connect_tracker(*tracker)
        try:
            return session.text_summary()
        finally:
            session.close()
    finally:
        socket.setdefaulttimeout(before)


# -- a host's servers ---------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """The GPUs a server can be given, as ``CUDA_VISIBLE_DEVICES`` entries: that variable's list
    when set, else one per GPU ``nvidia-smi -L`` (or torch) sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False, timeout=60)
        count = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        return [str(i) for i in range(count)]
    try:
        import torch  # pylint: disable=import-outside-toplevel

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def _child_env(gpu: str, extra: dict | None = None) -> dict:
    """A server's environment: its one GPU, and a PYTHONPATH that finds this project from any
    folder (a session runs in a temp folder, and its watched child is ``python -m``)."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        paths.append(root)
    return {**os.environ, **(extra or {}), "CUDA_VISIBLE_DEVICES": gpu, "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1"}


class Cluster:
    """A tracker (unless ``tracker`` names one elsewhere) and one server per GPU of this host.

    Each server is a child process in its own process group (``stop`` ends it with everything
    it started); ``server_cmd`` is the command before the server's options (default
    ``python -m gemm_ladder.tune.serve server``), ``env`` what its environment adds.
    """

    def __init__(self, key: str, gpus=None, tracker: tuple[str, int] | None = None, host: str = "0.0.0.0",
                 port: int = TRACKER_PORT, server_port: int = SERVER_PORT, custom_addr: str | None = None,
                 server_cmd=None, log_dir=None, env: dict | None = None):
        self.key = key
        self.gpus = list(gpus) if gpus is not None else visible_gpus()
        self.host, self.custom_addr = host, custom_addr
        self.server_port = server_port
        self.server_cmd = list(server_cmd or [sys.executable, "-m", "gemm_ladder.tune.serve", "server"])
        self.log_dir = Path(log_dir) if log_dir else None
        self.env = dict(env or {})
        self.tracker_state = None
        if tracker is None:
            self.tracker_state = start_tracker(host, port)
            tracker = ("127.0.0.1" if host in ("0.0.0.0", "") else host, self.tracker_state.port)
        self.tracker = tracker
        self.servers: dict[str, subprocess.Popen] = {}
        self.restarts = {g: 0 for g in self.gpus}

    def _start(self, gpu: str) -> None:
        port = self.server_port + 4 * self.gpus.index(gpu)  # neighbours, not the same first try
        cmd = [*self.server_cmd, "--tracker", f"{self.tracker[0]}:{self.tracker[1]}", "--key", self.key,
               "--host", self.host, "--port", str(port), "--port-end", str(port + 100)]
        if self.custom_addr:
            cmd += ["--custom-addr", self.custom_addr]
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            # the child keeps the file open; this process closes its copy below
            out = open(self.log_dir / f"server_gpu{gpu}.log", "a", encoding="utf-8")  # pylint: disable=R1732
        self.servers[gpu] = subprocess.Popen(cmd, env=_child_env(gpu, self.env), start_new_session=True, stdout=out,
                                             stderr=subprocess.STDOUT if out else None)
        if out is not None:
            out.close()

    def start(self, wait: float = 300.0) -> list[list]:
        """Start every server; wait (at most ``wait`` s) until all have registered. Returns their
        addresses. A host with no GPU runs the tracker alone."""
        if not self.gpus and self.tracker_state is None:
            raise RuntimeError("no GPU to serve: nvidia-smi and torch see none (or CUDA_VISIBLE_DEVICES is empty)")
        for gpu in self.gpus:
            self._start(gpu)
        return self.wait_for(len(self.gpus), wait)

    def wait_for(self, count: int, wait: float) -> list[list]:
        deadline = time.monotonic() + wait
        while True:
            found = servers_of(self.tracker, self.key)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            if all(p.poll() is not None for p in self.servers.values()):
                return found
            time.sleep(0.5)

    def restart_dead(self) -> list[str]:
        """Start again every server that exited (at most :data:`RESTARTS` times per GPU)."""
        again = []
        for gpu, proc in list(self.servers.items()):
            if proc.poll() is not None and self.restarts[gpu] < RESTARTS:
                self.restarts[gpu] += 1
                print(f"gemm_ladder serve: the server of GPU {gpu} exited ({proc.returncode}): starting it again",
                      file=sys.stderr, flush=True)
                self._start(gpu)
                again.append(gpu)
        return again

    def kill_server(self, gpu: str, sig=signal.SIGKILL) -> None:
        """Kill one server with its sessions and their children (its process group)."""
        proc = self.servers[gpu]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def watch(self, every: float = 2.0) -> None:
        """Keep the servers up until interrupted (SIGINT or SIGTERM)."""
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        try:
            while not stop:
                self.restart_dead()
                time.sleep(every)
        except KeyboardInterrupt:
            pass

    def stop(self) -> None:
        for gpu in list(self.servers):
            self.kill_server(gpu)
        self.servers.clear()
        if self.tracker_state is not None:
            stop_tracker(self.tracker_state, self.tracker)
            self.tracker_state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def make_parser() -> argparse.ArgumentParser:
    """The options of ``python -m gemm_ladder serve``."""
    p = argparse.ArgumentParser(
        prog="python -m gemm_ladder serve",
        description="Start TVM's RPC tracker (unless --tracker names one elsewhere) and one RPC server per visible "
                    "GPU, each with CUDA_VISIBLE_DEVICES set to its GPU; keep them up until Ctrl-C. TVM's RPC has "
                    "no authentication: serve on a trusted network only.")
    p.add_argument("--key", type=cli_types.word, help="the kind of GPU the servers offer, e.g. h200 (tune --key)")
    p.add_argument("--tracker", metavar="HOST:PORT", type=cli_types.address,
                   help="register with this tracker instead of starting one")
    p.add_argument("--host", default="0.0.0.0", help="the address the tracker and the servers listen on")
    p.add_argument("--port", type=cli_types.port, default=TRACKER_PORT, help="the tracker's port (the first tried)")
    p.add_argument("--server-port", type=cli_types.port, default=SERVER_PORT,
                   help="the first server's port (the first tried)")
    p.add_argument("--gpus", type=cli_types.words, default=None,
                   help="CUDA_VISIBLE_DEVICES entries to serve, e.g. 0,1 (default: all)")
    p.add_argument("--custom-addr", default=None, help="the address the servers give the tracker, where clients "
                                                       "on other hosts reach them")
    p.add_argument("--log-dir", default=None, help="one log per server here (default: this terminal)")
    p.add_argument("--status", action="store_true", help="print the tracker's servers and queues, start nothing")
    return p


def main(argv=None) -> int:
    """``python -m gemm_ladder serve ...`` (and ``python -m gemm_ladder.tune.serve``): a tracker and
    this host's servers until Ctrl-C, or ``--status``; ``server ...`` is one server (what they run)."""
    argv = cli_types.glue_values(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["server"]:
        return server_main(argv[1:])
    p = make_parser()
    a = p.parse_args(argv)
    if a.status:
        tracker = a.tracker or ("127.0.0.1", a.port)
        problem = tracker_problem(tracker)
        if problem:
            p.error(f"argument {'--tracker' if a.tracker else '--status'}: {problem}")
        try:
            print(status(tracker))
        except (OSError, RuntimeError) as err:  # something answers there, but not a TVM tracker
            p.error(f"argument {'--tracker' if a.tracker else '--status'}: {tracker[0]}:{tracker[1]} answers, but "
                    f"not as a TVM tracker ({' '.join(str(err).split())[:200]})")
        return 0
    if not a.key:
        p.error("--key is needed: the kind of GPU the servers offer, e.g. --key h200 (tune --key names it)")
    problem = tracker_problem(a.tracker) if a.tracker else None
    if problem:
        p.error(f"argument --tracker: {problem}")
    cluster = Cluster(a.key, a.gpus, a.tracker, host=a.host, port=a.port, server_port=a.server_port,
                      custom_addr=a.custom_addr, log_dir=a.log_dir)
    try:
        found = cluster.start()
        where = f"{cluster.tracker[0]}:{cluster.tracker[1]}"
        print(f"tracker {where}: {len(found)} of {len(cluster.gpus)} server(s) with key {a.key} registered "
              f"(GPUs {','.join(cluster.gpus)})\nmeasure there: python -m gemm_ladder tune ... --tracker {where} "
              f"--key {a.key}   (Ctrl-C stops)", flush=True)
        cluster.watch()
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
