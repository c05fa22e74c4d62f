"""The producer's TMA loads of a v12 kernel, as the barrier checker runs it, for the tests that hold
the kernel's walk over (expert, tile) pairs to ``sm90a.grouped``'s model (contiguous, masked, swap
AB and the warp scan alike)."""

from __future__ import annotations

from gemm_ladder.protocol import check, interp, kernel_ir, sim
from gemm_ladder.rungs import kernel_of


def loads_of(monkeypatch, cfg, table, M, num_ctas=3):
    """``(cta, tensor map, coordinates)`` of every TMA load of every CTA (each run alone), with
    ``table`` as the int32 routing operand (offs or counts) and ``M`` rows at run time; asserts
    each run finds no protocol fault."""
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
    for cta in range(num_ctas):
        ran = sim.Sim(kir, program, [(cta, 0, 0)], params, "forward", 1, None).run()
        assert not ran.findings, ran.findings
    return loads
