"""The producer's TMA loads of a v12 kernel, as the barrier checker runs it, for the tests that hold
the kernel's walk over (expert, tile) pairs to ``sm90a.grouped``'s model (contiguous, masked, swap
AB and the warp scan alike)."""

from __future__ import annotations

from gemm_ladder.protocol import check, interp, kernel_ir, sim
from gemm_ladder.rungs import kernel_of

# (M, N, K, experts) the barrier checker runs v12's presets over: the suite's odd weight, and N and
# the expert count of a DeepSeek-V3-like and a Mixtral-like layer. K is 1024 for those two, not their
# 7168 and 4096: each tile's K loop repeats one protocol step per slice, and 16 slices already wrap
# every ring (pipe_depth <= 8) twice, while the checker's time grows with the slices (a K of 7168
# took two minutes a case on a CI core, against 20 s at 1024).
CHECKED_WEIGHTS = [(600, 1000, 520, 5), (600, 2048, 1024, 256), (600, 14336, 1024, 8)]


def cumulative(counts):
    """The running sums of ``counts``: an ``offs`` (each expert's end row)."""
    out, run = [], 0
    for c in counts:
        run += c
        out.append(run)
    return out


def loads_of(monkeypatch, cfg, table, M, num_ctas=3, cluster=1):
    """``(cta, tensor map, coordinates)`` of every TMA load of every CTA, with ``table`` as the
    int32 routing operand (offs or counts) and ``M`` rows at run time: each run of ``cluster`` CTAs
    (a whole cluster: its multicast and remote releases) by the barrier checker; asserts each run
    finds no protocol fault and finishes."""
    kir = kernel_ir.load(kernel_of(cfg))
    program = interp.Program(kir.device, kir.operand_buffers)
    loads = []
    real = sim.Sim.tma_load

    def record(self, th, dst, tmap, coords, *args, **kw):
        loads.append((th.cta.block[0], tmap.name, tuple(coords)))
        return real(self, th, dst, tmap, coords, *args, **kw)

    monkeypatch.setattr(sim.Sim, "tma_load", record)
    params = {**check._param_values(kir, program, num_ctas), "M": M,  # pylint: disable=protected-access
              "offsets_ptr": list(table)}
    for first in range(0, num_ctas, cluster):
        ctas = [(first + c, 0, 0) for c in range(cluster)]
        ran = sim.Sim(kir, program, ctas, params, "forward", cluster, None).run()
        assert not ran.findings, ran.findings
        assert ran.finished
    return loads
