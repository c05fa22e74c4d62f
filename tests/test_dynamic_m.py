"""One module for every M: v6 and v9 with ``dynamic_m=True`` (M a runtime value, N and K fixed).

CPU tier (CI): the knob's validation (a bool; only the tile orders that cover any grid), the
schedulers with a runtime number of M tiles against the pure-Python orders (one host function
run at several M), building a sample once each (the kernel takes ``int M``, A and D have a
symbolic first dimension, the static build is unchanged), the manifest fields, and the runtime's
shape checks (any M >= 1 with the module's N and K). GPU tier (``gpu``): each module is checked
by ``harness.check`` at every M of ``harness.DYNAMIC_M_CHECKS`` (1, 7, 64, 1000, 8191) and at the
M it was built for, the same module each time, against a float64 reference.
"""

import json
from pathlib import Path

import pytest

from tests.gpu_cases import Case

import gemm_ladder
from gemm_ladder import ConfigError


# -- config validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rung, knobs, words",
    [
        ("v9", dict(dynamic_m=1), ["dynamic_m=1", "not a bool", "dynamic_m=False"]),
        ("v9", dict(dynamic_m=True, tile_order="column"), ["tile_order='column'", "runtime M", "grouped"]),
        ("v6", dict(dynamic_m=True, tile_order="row"), ["tile_order='row'", "('grouped', 'snake')"]),
        ("v7", dict(dynamic_m=True), ["no knob dynamic_m"]),
        ("v9", dict(dynamic_m=True, tile_order="grouped"), []),
        ("v6", dict(dynamic_m=True), []),
    ],
)
def test_dynamic_m_knob_is_validated(rung, knobs, words):
    if not words:
        cfg = gemm_ladder.make_config(rung, 1000, 3000, 520, **knobs)
        assert cfg.knobs()["dynamic_m"] is True
        return
    with pytest.raises(ConfigError) as err:
        gemm_ladder.make_config(rung, 1000, 3000, 520, **knobs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_dynamic_modules_have_their_own_tag():
    static = gemm_ladder.make_config("v9", 4096, 4096, 4096)
    dynamic = gemm_ladder.make_config("v9", 4096, 4096, 4096, dynamic_m=True)
    assert static.tag() != dynamic.tag() and "dynamicmTrue" in dynamic.tag()


# -- the schedulers with a runtime M -----------------------------------------------------------
@pytest.mark.parametrize("order", ["snake", "grouped"])
def test_runtime_m_schedulers_match_the_model(order):
    pytest.importorskip("tvm")
    import numpy as np

    from schedulers import tvm_bridge
    from schedulers.orders import tile_order

    ctas, num_n, g = 4, 5, 4
    traces = tvm_bridge.runtime_m_trace(order, [1, 3, 4, 7, 13], num_n, ctas, g)
    for num_m, trace in traces.items():
        assert [tuple(t) for t in trace[:, :2].tolist()] == tile_order(order, num_m, num_n, g), num_m
        assert (trace[:, 2] == np.arange(len(trace)) % ctas).all(), num_m


def test_runtime_m_scheduler_refuses_orders_that_need_the_rows():
    pytest.importorskip("tvm")
    from tvm import tirx

    import schedulers

    rows = tirx.Var("m_tiles", "int32")
    for order in ("column", "row", "serpentine"):
        with pytest.raises(ValueError, match="runtime number of M tiles"):
            schedulers.make_tirx_scheduler(order, "ts", rows, 8, 132)


# -- building (each module once) ---------------------------------------------------------------
CPU_BUILDS = {
    "v9_dyn": ("v9", (4096, 4096, 4096), dict(dynamic_m=True)),
    "v9_dyn_1x2_bf16": ("v9", (1000, 3000, 520), dict(dynamic_m=True, cluster_m=1, cluster_n=2,
                                                       tile_order="grouped", dtype="bfloat16")),
    "v6_dyn": ("v6", (1000, 3000, 520), dict(dynamic_m=True)),
}


@pytest.mark.parametrize("name", sorted(CPU_BUILDS))
def test_kernel_takes_m_at_run_time(built, name):
    b = built(*CPU_BUILDS[name])
    src = b.module.cuda_source()
    head = src[src.index("__global__ void"):].split("{", 1)[0]
    assert "int M, int num_ctas" in head, head  # M is a kernel argument, read off A by the host
    assert "(M + " in src  # the number of M tiles is computed from it
    counts, res = b.counts, b.resources
    for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM"):
        assert counts[op] > 0, (op, counts)
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.local == 0, (counts, res)


def test_prim_func_binds_m_from_a(built):
    from tvm import tirx

    from gemm_ladder.rungs import kernel_of

    func = kernel_of(built(*CPU_BUILDS["v9_dyn"]).module.cfg)
    a, _, d = func.params[:3]  # the buffers (TVM 0.27's PrimFunc takes them as parameters)
    assert isinstance(a.shape[0], tirx.Var) and a.shape[0].same_as(d.shape[0])  # one M for A and D
    assert [int(x) for x in a.shape[1:]] == [4096] and [int(x) for x in d.shape[1:]] == [4096]


def test_manifest_says_m_is_dynamic(built):
    for name, case in CPU_BUILDS.items():
        b = built(*case)
        mod, man = b.module, json.loads(Path(str(b.path) + ".json").read_text())
        assert man["launch"]["dynamic_m"] is True and man["launch"]["persistent"] is True
        assert man["knobs"]["dynamic_m"] is True
        assert man["dynamic_m"] == {"min_m": 1, "tuned_for_m": [mod.cfg.M, mod.cfg.M]}
        assert man["shape"] == list(mod.cfg.shape)


def test_a_static_module_says_nothing_of_a_runtime_m():
    mod = gemm_ladder.make_config("v9", 4096, 4096, 4096)
    from gemm_ladder.sm90a import hgemm_v9

    assert "dynamic_m" not in hgemm_v9.launch(mod)


# -- the runtime's checks (no GPU: a CPU tensor that passes the shape checks is refused for
# being on the CPU, the check after them) ----------------------------------------------------------
def _module(built, name="v9_dyn"):
    from gemm_ladder.serve.runtime import GemmModule

    path = built(*CPU_BUILDS[name]).path
    return GemmModule(path, json.loads(Path(str(path) + ".json").read_text()), rt_module=None)


@pytest.mark.parametrize("M", [1, 7, 64, 1000, 8191])
def test_runtime_takes_any_m(built, M):
    import torch

    from gemm_ladder.serve.runtime import ModuleInputError

    mod = _module(built)
    assert mod.dynamic_m and mod.rows_of(torch.empty(M, 4096)) == M
    A = torch.empty(M, 4096, dtype=torch.float16)
    B = torch.empty(4096, 4096, dtype=torch.float16)
    with pytest.raises(ModuleInputError, match="A is on cpu"):
        mod(A, B)
    with pytest.raises(ModuleInputError, match="A is on cpu"):
        mod(A, B, out=torch.empty(M, 4096, dtype=torch.float16))


def test_runtime_refuses_what_a_dynamic_module_cannot_take(built):
    import torch

    from gemm_ladder.serve.runtime import ModuleInputError

    mod = _module(built)
    f16 = torch.float16
    B = torch.empty(4096, 4096, dtype=f16)
    with pytest.raises(ModuleInputError, match=r"any M >= 1"):
        mod(torch.empty(0, 4096, dtype=f16), B)
    with pytest.raises(ModuleInputError, match=r"any M >= 1"):
        mod(torch.empty(2, 3, 4096, dtype=f16), B)
    with pytest.raises(ModuleInputError, match=r"wants \(7, 4096\).*any M >= 1 with N=4096, K=4096"):
        mod(torch.empty(7, 4000, dtype=f16), B)
    with pytest.raises(ModuleInputError, match=r"out has shape \(8, 4096\); this module wants \(7, 4096\)"):
        mod(torch.empty(7, 4096, dtype=f16), B, out=torch.empty(8, 4096, dtype=f16))
    assert "(any M)" in repr(mod)


def test_check_runs_a_dynamic_module_at_every_m(built):
    from gemm_ladder.measure import harness

    mod = _module(built, "v6_dyn")
    assert harness.check_ms(mod) == (1, 7, 64, 1000, 8191)  # 1000: also the M it was built for
    assert harness.check_ms(_module(built, "v9_dyn")) == (1, 7, 64, 1000, 4096, 8191)


# -- GPU tier: each module at M = 1, 7, 64, 1000, 8191 and its own M ----------------------------
CASES = [
    Case("v9", 4096, 4096, 4096, dynamic_m=True, dtype="float16"),
    Case("v9", 2048, 2048, 1024, dynamic_m=True, dtype="bfloat16"),
    Case("v9", 1000, 3000, 520, dynamic_m=True),  # N, K not multiples of the tile
    Case("v9", 1000, 3000, 520, dynamic_m=True, cluster_m=1, cluster_n=2, tile_order="grouped"),
    Case("v9", 1000, 3000, 520, dynamic_m=True, cluster_m=1, num_warpgroups=1, blk_n=128, pipe_depth=5),
    # the row-tiles rule's kernel: 64-row tiles paired over B, with the stream_b load hints
    Case("v9", 128, 3000, 520, dynamic_m=True, blk_m=64, blk_n=128, num_warpgroups=1, cluster_m=2, epi_n=64,
         pipe_depth=8, stream_b=True),
    Case("v6", 1000, 3000, 520, dynamic_m=True),
    Case("v6", 2048, 2048, 1024, dynamic_m=True, dtype="bfloat16", tile_order="grouped"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_dynamic_m_is_correct_at_every_m(case, gpu_result):
    assert gpu_result["status"] == "ok", gpu_result
    assert gpu_result["m_checked"] == sorted({case[1], 1, 7, 64, 1000, 8191}), gpu_result
