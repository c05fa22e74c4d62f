"""The host path of ``gemm_ladder.nn.Linear``'s eager forward and backward, on the CPU, without a
GPU (issue 31): what a training step's linear layer costs the host in Python, against ``nn.Linear``.

The 125M training step is host-bound (``benchmarks/results/2026-11-26_h100_e2e_train_timing``):
~100 us more host time a layer than torch's. This measures that host path where there is no GPU.
The layers run on CPU tensors under bf16 autocast, as the training step runs them on the GPU (fp32
master weights, x cast to bf16): ``gnn.uses_kernel`` says yes to CPU tensors, and every GEMM takes
the front door's real fast path (key, lookup, checks, D's allocation, the launcher's wrappers) down
to the launch, which is a stub that does nothing (the TVM FFI call into the module, ~5-10 us on the
GPU box, is what is left out). The fast path's entries are seeded by the first call of each GEMM
(:func:`stubbed`), as the checked path would leave them. Shapes are tiny (the CPU's own arithmetic
must not hide the host path's cost; the path does not depend on the sizes).

    PYTHONPATH=. .venv/bin/python benchmarks/host_path_profile.py [--calls 10000] [--profile]

prints host microseconds per layer (forward + backward) of ``nn.Linear`` and ours, and with
``--profile`` the top of cProfile's table for ours. CPU-only numbers, of this box: compare the two
columns of one run, not runs on different boxes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import pstats
import sys
import time

import torch
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import front

SHAPE = (1, 8, 16, 32)  # batch, sequence, in features, out features: tiny (see the module docstring)


class _StubModule:
    """What the fast path's launcher wrappers ask of a module: its operand spec (None: K-major both)."""

    def __init__(self, spec):
        self.spec = spec


def _noop(*_args) -> None:
    """The stub launch: the GEMM's launch costs nothing here."""


def _route(spec) -> front.Route:
    """A route whose launch is :func:`_noop` (on the CPU: ``device.index`` None)."""
    return front.Route(_StubModule(spec), None, "stub", "stub", {}, launchers={None: _noop})


def _seed(A, B, out, bias) -> None:
    """A fast-path entry for a call like this one, as the checked path would remember it: a route
    whose launch is :func:`_noop`, behind the wrappers a module of its layout gets."""
    a_major, b_major = front.operand_majors(A.reshape(-1, A.shape[-1]) if A.dim() > 2 else A, B)
    dtype = front._dtype_name(A.dtype)  # pylint: disable=protected-access
    spec = None if (a_major, b_major) == ("K", "K") else GemmSpec(a=dtype, b=dtype, d=dtype, a_major=a_major,
                                                                   b_major=b_major)
    route = _route(spec)
    N, K = B.shape
    M = A.numel() // K
    key = front._fast_key(A, B, out, bias)  # pylint: disable=protected-access
    front._FAST[key] = (route, front.stored_launch(route, A.device.index), M, N, K,  # pylint: disable=protected-access
                        (*A.shape[:-1], N), (A.nbytes, B.nbytes, M * N * A.element_size()), False)


def _seed_swiglu(key, x, W_gu) -> None:
    """The gated kernel's fast-path entry for a call like this one (``front.swiglu``'s)."""
    N, M = W_gu.shape[0] // 2, x.numel() // x.shape[-1]
    front._FAST[key] = (_route(None), _noop, M, N, (*x.shape[:-1], N),  # pylint: disable=protected-access
                        (x.nbytes, W_gu.nbytes, M * N * x.element_size()))


@contextlib.contextmanager
def stubbed(warm):
    """While open: the layers take the kernel's path on CPU tensors (``gnn.uses_kernel``,
    ``gnn.swiglu_uses_kernel``), and every GEMM the front door sees has a fast-path entry whose
    launch does nothing. ``warm()`` runs first with each miss seeding its entry (:func:`_seed`,
    :func:`_seed_swiglu`), then the front door's own fast path is back, unwrapped, for the timing.
    On exit everything is restored and the entries dropped."""
    # pylint: disable=protected-access
    real = (gnn.uses_kernel, gnn.swiglu_uses_kernel, front._fast, front._fast_swiglu)

    def fast(A, B, out, bias=None):
        got = real[2](A, B, out, bias)
        if got is None:
            _seed(A, B, out, bias)
            got = real[2](A, B, out, bias)
        return got

    def fast_swiglu(key, x, W_gu, out):
        got = real[3](key, x, W_gu, out)
        if got is None:
            _seed_swiglu(key, x, W_gu)
            got = real[3](key, x, W_gu, out)
        return got

    half = (torch.float16, torch.bfloat16)
    gnn.uses_kernel = lambda x, w: x.dtype == w.dtype and x.dtype in half
    gnn.swiglu_uses_kernel = lambda x, wg, wu, dtype, autocast: dtype in half and (autocast or x.dtype == dtype)
    front._fast, front._fast_swiglu = fast, fast_swiglu
    try:
        warm()
        front._fast, front._fast_swiglu = real[2], real[3]
        yield
    finally:
        gnn.uses_kernel, gnn.swiglu_uses_kernel, front._fast, front._fast_swiglu = real
        front._FAST.clear()


class MLP(nn.Module):
    """A Llama MLP of plain ``nn.Linear`` (``benchmarks/e2e_check.MLP``'s formula)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def layers(shape=SHAPE, fused: bool = False, seed: int = 0) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """torch's module and ours over the same fp32 weights, an fp32 input that wants grad, and
    dL/dY in bf16: one ``nn.Linear`` (in -> out features), or with ``fused`` a Llama MLP (hidden =
    in, intermediate = out) against ``patch(mlp, fuse=True)``'s gated one, on its fused training path
    (``fused_training``)."""
    batch, seq, k, n = shape
    torch.manual_seed(seed)
    ref = MLP(k, n) if fused else nn.Linear(k, n, bias=False)
    if fused:  # patch fuses the MLPs inside a model: hold it in one
        holder = nn.ModuleDict({"mlp": copy.deepcopy(ref)})
        if [n for n, _ in gnn.patch(holder, verbose=False, fuse=True).fused] != ["mlp"]:
            raise RuntimeError("host_path_profile: patch(fuse=True) did not fuse the Llama MLP")
        ours = holder["mlp"]
        ours.fused_training = True  # the gated MLP's training path (its default trains the MLP's own formula)
    else:
        ours = gnn.Linear.from_linear(copy.deepcopy(ref))
    d_out = k if fused else n
    return ref, ours, torch.randn(batch, seq, k, requires_grad=True), torch.randn(batch, seq, d_out).bfloat16()


def step(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> None:
    """One forward under bf16 autocast and its backward, as a training step runs a layer."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.backward(grad)


def host_us(layers_: dict, x, grad, calls: int, blocks: int = 5) -> dict:
    """Microseconds per :func:`step` of each layer, the median over ``blocks`` blocks of
    ``calls // blocks`` steps, the layers taking turns by block (a shared box's load hits both)."""
    per = max(1, calls // blocks)
    times: dict = {n: [] for n in layers_}
    for _ in range(blocks):
        for name, layer in layers_.items():
            t0 = time.perf_counter_ns()
            for _ in range(per):
                step(layer, x, grad)
            times[name].append((time.perf_counter_ns() - t0) / per / 1e3)
    return {n: sorted(v)[len(v) // 2] for n, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=10000, help="forward+backward steps per layer timed")
    p.add_argument("--fused", action="store_true",
                   help="a Llama MLP against patch(mlp, fuse=True)'s gated kernel, not one Linear")
    p.add_argument("--profile", action="store_true", help="also cProfile ours, top 25 by own time")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    ref, ours, x, grad = layers(fused=a.fused)
    with stubbed(lambda: [step(m, x, grad) for m in (ref, ours, ref, ours)]):
        got = host_us({"torch": ref, "ours": ours}, x, grad, a.calls)
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls // 5):
                step(ours, x, grad)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    what = "SwiGLU MLP" if a.fused else "layer"
    print(f"host us per {what} (forward + backward, bf16 autocast, CPU-only, launches stubbed): "
          f"torch {got['torch']:.1f}, ours {got['ours']:.1f} ({got['ours'] - got['torch']:+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
