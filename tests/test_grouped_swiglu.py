"""The grouped SwiGLU (issue 33: v12 with the gated epilogue, ``gemm_ladder.grouped_swiglu``) on the CPU:
the spec accepts grouped + gated on v12 only, the kernel loads each tile's gate rows and the matching
up rows of its expert (the barrier checker runs the traced kernel; its TMA loads are held to the
walk's model), the protocol check passes, the build for sm_90a stores silu(gate) * up, the front
door refuses bad inputs with the fix, the op's fake gives H of any token count, the torch fallback is
the per-expert reference, and packs plan and serve gated modules apart from grouped_mm's.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

import gemm_ladder
from gemm_ladder import ConfigError, make_config
from gemm_ladder.compile import module_cache
from gemm_ladder.core import cli_types
from gemm_ladder.core.spec import GemmSpec, check_built
from gemm_ladder.protocol.check import check_config
from gemm_ladder.serve import grouped, grouped_ops, grouped_swiglu, kernel_pack, plan
from gemm_ladder.serve.front import KernelFallbackWarning, NoKernelError
from gemm_ladder.serve.kernel_pack import KernelPack
from gemm_ladder.serve.runtime import ModuleInputError
from gemm_ladder.sm90a import grouped as kernel_grouped, hgemm_v12

from .grouped_loads import loads_of
from .test_grouped_pack import IDENT, stand_in_build

REPO = Path(__file__).resolve().parents[1]
SWIGLU = grouped_swiglu.spec_of_dtype("float16")
DECODE_TILE = dict(blk_m=64, blk_n=128, num_warpgroups=1, pipe_depth=8)  # the gated decode module's


# -- the spec and the knobs ----------------------------------------------------------------------------
def test_the_spec_is_built_on_v12_only_and_without_the_other_epilogues():
    check_built(SWIGLU, "v12", hgemm_v12.EPILOGUES)
    with pytest.raises(ConfigError, match="v12 only"):
        make_config("v9", 4096, 4096, 4096, spec=SWIGLU.text())
    with pytest.raises(ConfigError, match="bias or an activation"):
        check_built(GemmSpec(grouped=True, gated=True, act="silu", bias="float16"), "v12", hgemm_v12.EPILOGUES)
    with pytest.raises(ConfigError, match="bias or an activation"):  # a plain activation is not the gated epilogue
        check_built(GemmSpec(grouped=True, act="silu"), "v12", hgemm_v12.EPILOGUES)
    with pytest.raises(ConfigError, match="gated B .* not built for v13.*built for v12"):
        check_built(SWIGLU, "v13", ("grouped",))


def test_swap_ab_with_the_gated_epilogue_is_refused_by_name():
    with pytest.raises(ConfigError, match="swap_ab=True with a gated W_gu .* use swap_ab=False"):
        make_config("v12", 4096, 2816, 2048, experts=64, spec=SWIGLU.text(), swap_ab=True, blk_m=16, blk_n=128)


def test_a_gated_tile_needs_epi_n_inside_half_the_tile():
    with pytest.raises(ConfigError, match="epi_n dividing blk_n / 2 = 64"):
        make_config("v12", 4096, 2816, 2048, experts=64, spec=SWIGLU.text(), blk_n=128, epi_n=128)


# -- the kernel: its loads, its protocol, its build ------------------------------------------------
@pytest.mark.parametrize("counts, knobs", [((0, 129, 0, 0, 3, 0, 0, 228), {}),
                                           ((5, 0, 70, 0), DECODE_TILE),
                                           ((0,) * 40 + (9, 300), dict(DECODE_TILE, warp_scan=True))])
def test_a_tile_loads_its_experts_gate_rows_and_the_matching_up_rows(monkeypatch, counts, knobs):
    """Every work unit of the walk loads, per K slice, W_gu's gate rows ``e * 2I + n * blk_n / 2`` and
    the up rows of the same outputs ``I`` later, in the model's order (the barrier checker runs each
    CTA of the traced kernel: no protocol fault)."""
    E, I, M = len(counts), 160, sum(counts)
    cfg = make_config("v12", M, 2 * I, 128, experts=E, spec=SWIGLU.text(), **{"pipe_depth": 2, **knobs})
    offs = [sum(counts[: e + 1]) for e in range(E)]
    loads = loads_of(monkeypatch, cfg, offs, M)
    half = cfg.blk_n // 2
    want = kernel_grouped.walk(offs, M, cfg.blk_m, -(-2 * I // cfg.blk_n), cfg.l2_group_size, 3)
    assert sum(len(w) for w in want) > 0
    for cta in range(3):
        mine = [c for b, name, c in loads if b == cta and name.startswith("B")]
        per_tile = 2 * cfg.k_tiles  # a gate box and an up box each K slice
        rows = [c[1] for c in mine]
        assert len(rows) == per_tile * len(want[cta])
        for u, i in zip(want[cta], range(0, len(rows), per_tile)):
            gate = u.expert * 2 * I + u.n_tile * half
            assert rows[i:i + 2] == [gate, gate + I], (u, rows[i:i + 2])


def test_the_masked_layout_takes_the_gated_loads_unchanged(monkeypatch):
    """The kernel's masked layout (no front door serves it yet): each expert's slot of A, its gate
    and up rows, a count past max_tokens clamped, a negative one empty."""
    counts, I, slot = (0, 17, 70, -2), 160, 40
    cfg = make_config("v12", 4 * slot, 2 * I, 128, experts=4, spec=SWIGLU.text(), layout="masked", pipe_depth=2,
                      **{k: v for k, v in DECODE_TILE.items() if k != "pipe_depth"})
    loads = loads_of(monkeypatch, cfg, counts, 4 * slot)
    want = kernel_grouped.walk(list(counts), 4 * slot, cfg.blk_m, -(-2 * I // cfg.blk_n), cfg.l2_group_size, 3,
                               layout="masked")
    assert sum(len(w) for w in want) == 2 * -(-2 * I // cfg.blk_n)  # experts 1 and 2 (clamped to 40), one m-tile
    for cta in range(3):
        a_rows = [c[1] for b, name, c in loads if b == cta and name.startswith("A")][::cfg.k_tiles]
        b_rows = [c[1] for b, name, c in loads if b == cta and name.startswith("B")][::2 * cfg.k_tiles]
        assert a_rows == [u.row0 for u in want[cta]]
        assert b_rows == [u.expert * 2 * I + u.n_tile * cfg.blk_n // 2 for u in want[cta]]


@pytest.mark.parametrize("knobs", [{}, DECODE_TILE, dict(DECODE_TILE, layout="masked")])
def test_the_gated_presets_pass_the_protocol_check(knobs):
    cfg = make_config("v12", 1000, 1008, 520, experts=5, spec=SWIGLU.text(), **knobs)
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_builds_for_sm90a_with_silu_of_the_gate_times_up(built, dtype):
    """The whole tiles leave by TMA stores of half the tile's columns, the expert's last m-tile by
    guarded stores of silu(gate) * up (one exp a gate value), and nothing spills."""
    spec = grouped_swiglu.spec_of_dtype(dtype).text()
    b = built("v12", (1000, 1008, 520), dict(experts=5, dtype=dtype, spec=spec))
    text = b.sass
    count = {op: len(re.findall(rf"\b{op}\b", text)) for op in ("UTMALDG", "UTMASTG", "HGMMA", "STSM", "LDL", "STL")}
    assert count["UTMALDG"] and count["UTMASTG"] and count["HGMMA"] and count["STSM"], count
    assert count["LDL"] == 0 and count["STL"] == 0, count
    assert re.search(r"MUFU\.EX2", text), "no exp: silu is not computed"
    src = b.module.cuda_source()
    # D is [M, I]: the kernel's guarded stores index rows of I = 504 columns
    assert "* 504)" in src and "expf" in src
    assert b.module.extra["launch"]["experts"] == 5


# -- the front door and the op ----------------------------------------------------------------------
def h(*shape, dtype=torch.float16):
    return torch.zeros(shape, dtype=dtype)


def offs_of(*counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)


A, W, OFFS = h(10, 64), h(3, 32, 64), offs_of(4, 0, 6)


def refused(fn, *words, error=ModuleInputError):
    with pytest.raises(error) as err:
        fn()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


@pytest.mark.parametrize("args, kw, words", [
    ((A, h(3, 31, 64), OFFS), {}, ["an even number", "(3, 31, 64)", "cat([W_gate[e], W_up[e]])"]),
    ((A, h(3, 32, 64, dtype=torch.bfloat16), OFFS), {}, ["A is torch.float16 and W is torch.bfloat16"]),
    ((A, W, OFFS.long()), {}, ["offs has dtype torch.int64"]),
    ((A, W, offs_of(4, 6)), {}, ["offs has shape (2,)"]),
    ((A, W, OFFS), {"out": h(10, 32)}, ["out is (10, 32)", "H is (10, 16)", "half of W_gu's rows"]),
    ((A, W, OFFS), {"out": h(10, 16, dtype=torch.bfloat16)}, ["out is (10, 16) torch.bfloat16"]),
    ((A, W, OFFS), {"out": h(16, 10).t()}, ["out is not contiguous"]),
    ((A, W, OFFS), {}, ["A is on cpu", "move it to the GPU"]),
])
def test_bad_inputs_are_refused_with_the_fix(args, kw, words):
    refused(lambda: gemm_ladder.grouped_swiglu(*args, **kw), *words)


def test_a_weight_that_wants_grad_is_refused():
    refused(lambda: gemm_ladder.grouped_swiglu(A, h(3, 32, 64).requires_grad_(), OFFS), "require grad", "no backward")


def test_the_fake_op_gives_h_of_any_token_count():
    meta = dict(device="meta")
    got = grouped_ops.grouped_swiglu(torch.zeros(77, 64, **meta, dtype=torch.float16),
                                     torch.zeros(3, 32, 64, **meta, dtype=torch.float16),
                                     torch.zeros(3, dtype=torch.int32, **meta))
    assert got.shape == (77, 16) and got.dtype == torch.float16
    refused(lambda: grouped_ops.grouped_swiglu(torch.zeros(77, 64, **meta, dtype=torch.float16),
                                               torch.zeros(3, 31, 64, **meta, dtype=torch.float16),
                                               torch.zeros(3, dtype=torch.int32, **meta)),
            "an even number", error=(ModuleInputError, RuntimeError))


def reference(A, W_gu, offs):
    """Per expert in float64: silu(A_e Wg_e^T) * (A_e Wu_e^T); rows past offs[-1] zero."""
    I = W_gu.shape[1] // 2
    H = torch.zeros(A.shape[0], I, dtype=torch.float64)
    start = 0
    for e, end in enumerate(offs.tolist()):
        g = A[start:end].double() @ W_gu[e].double().T
        H[start:end] = torch.nn.functional.silu(g[:, :I]) * g[:, I:]
        start = end
    return H


def fallback(a, w, o):
    out = torch.empty(a.shape[0], w.shape[1] // 2, dtype=a.dtype)
    grouped_swiglu.torch_swiglu(a, w, o, out)
    return out


def test_the_fallback_is_the_per_expert_swiglu():
    gen = torch.Generator().manual_seed(3)
    Ar, Wr = torch.randn(20, 32, generator=gen).half(), torch.randn(3, 24, 32, generator=gen).half()
    for offs in (offs_of(7, 0, 13), offs_of(0, 20, 0)):
        torch.testing.assert_close(fallback(Ar, Wr, offs).double(), reference(Ar, Wr, offs), rtol=2e-2, atol=2e-2)


def test_the_op_compiles_with_a_dynamic_token_count(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_swiglu", fallback)
    torch._dynamo.reset()
    layer = torch.compile(lambda a, w, o: torch.ops.gemm_ladder.grouped_swiglu(a, w, o) * 2, fullgraph=True,
                          dynamic=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(0)
    Wr = torch.randn(4, 24, 32, generator=gen).half()
    for counts in ((5, 0, 7, 1), (0, 0, 30, 0), (9, 9, 9, 9)):
        offs = offs_of(*counts)
        Ar = torch.randn(int(offs[-1]), 32, generator=gen).half()
        torch.testing.assert_close(layer(Ar, Wr, offs).double(), 2 * reference(Ar, Wr, offs), rtol=3e-2, atol=3e-2)


def test_the_ops_fake_passes_opcheck(monkeypatch):
    monkeypatch.setattr(grouped_ops, "_grouped_swiglu", fallback)
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(12, 32, generator=gen).half(), torch.randn(3, 16, 32, generator=gen).half(), offs_of(5, 0, 7))
    result = torch.library.opcheck(torch.ops.gemm_ladder.grouped_swiglu.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


SLOTS, WS = h(3, 5, 64), h(3, 32, 64)
COUNTS = torch.tensor([2, 0, 5], dtype=torch.int32)


@pytest.mark.parametrize("args, kw, words", [
    ((SLOTS, h(3, 31, 64), COUNTS), {}, ["an even number", "(3, 31, 64)"]),
    ((h(15, 64), WS, COUNTS), {}, ["A must be [E, max_tokens, K]", "grouped_mm with offs"]),
    ((SLOTS, WS, COUNTS.long()), {}, ["counts has dtype torch.int64"]),
    ((SLOTS, WS, COUNTS), {"out": h(3, 5, 32)}, ["out is (3, 5, 32)", "H is (3, 5, 16)"]),
    ((SLOTS, WS, COUNTS), {}, ["A is on cpu", "move it to the GPU"]),
])
def test_bad_masked_inputs_are_refused_with_the_fix(args, kw, words):
    refused(lambda: gemm_ladder.grouped_swiglu_masked(*args, **kw), *words)


def test_the_masked_fallback_computes_the_valid_rows_and_keeps_the_rest():
    gen = torch.Generator().manual_seed(4)
    Ar, Wr = torch.randn(3, 6, 32, generator=gen).half(), torch.randn(3, 24, 32, generator=gen).half()
    counts = torch.tensor([2, -1, 9], dtype=torch.int32)  # a negative count is empty, one past the slot clamped
    out = torch.full((3, 6, 12), float("nan"), dtype=torch.float16)
    grouped_swiglu.torch_swiglu_masked(Ar, Wr, counts, out)
    for e, c in enumerate((2, 0, 6)):
        want = reference(Ar[e], Wr[e:e + 1], torch.tensor([c]))[:c]
        torch.testing.assert_close(out[e, :c].double(), want, rtol=2e-2, atol=2e-2)
        assert torch.isnan(out[e, c:]).all()


def test_the_masked_op_gives_zeros_past_the_counts_and_its_fake_any_slot(monkeypatch):
    def fallback_masked(a, w, c, out):
        grouped_swiglu.torch_swiglu_masked(a, w, c, out)
        return out

    monkeypatch.setattr(grouped_ops, "_grouped_swiglu_masked", fallback_masked)
    gen = torch.Generator().manual_seed(5)
    Ar, Wr = torch.randn(3, 6, 32, generator=gen).half(), torch.randn(3, 24, 32, generator=gen).half()
    got = torch.ops.gemm_ladder.grouped_swiglu_masked(Ar, Wr, torch.tensor([2, 0, 6], dtype=torch.int32))
    assert got.shape == (3, 6, 12) and (got[0, 2:] == 0).all() and (got[1] == 0).all()
    meta = dict(device="meta", dtype=torch.float16)
    fake = grouped_ops.grouped_swiglu_masked(torch.zeros(3, 77, 32, **meta), torch.zeros(3, 24, 32, **meta),
                                             torch.zeros(3, dtype=torch.int32, device="meta"))
    assert fake.shape == (3, 77, 12)
    result = torch.library.opcheck(torch.ops.gemm_ladder.grouped_swiglu_masked.default,
                                   (Ar, Wr, torch.tensor([2, 0, 6], dtype=torch.int32)))
    assert set(result.values()) == {"SUCCESS"}, result


# -- routes and packs ---------------------------------------------------------------------------------
QWEN_GU = (64, 2816, 2048)  # W_gu of Qwen-MoE-like experts: I = 1408


@pytest.fixture
def gpu_mocked(monkeypatch):
    monkeypatch.setattr(grouped.device, "arch_of", lambda index: "sm_90a")

    class FakeModule:
        def __init__(self, found):
            self.path, self.calls = found.path, []

        def launch(self, *args):
            self.calls.append(args)

    loaded = {}
    monkeypatch.setattr(grouped, "pack_module", lambda found: loaded.setdefault(found.path, FakeModule(found)))
    gemm_ladder.serve.front.reset()
    grouped.reset()
    yield loaded
    gemm_ladder.serve.front.reset()
    grouped.reset()


@pytest.fixture
def swiglu_pack(tmp_path, monkeypatch):
    """A pack of Qwen-MoE-like W_gu, gated and plain, of stand-in modules."""
    real = module_cache.get_or_build
    monkeypatch.setattr(module_cache, "get_or_build",
                        lambda job, root=None: real(job, root, build=stand_in_build, ident=IDENT))
    man = kernel_pack.build_pack(tmp_path / "pack", [], ["bfloat16"], workers=1, cache_root=tmp_path / "cache",
                                 grouped=[cli_types.grouped_weight("64,2816,2048,swiglu"), (*QWEN_GU, "contiguous")])
    assert {r["status"] for r in man["results"]} == {"built"}
    return tmp_path / "pack"


def test_gated_choices_are_the_64x128_module_then_the_defaults():
    """Swap AB is refused with the gated epilogue, so the tiers are the 64x128 one-consumer module up to
    64 rows an expert and the 128x256 defaults past it; measured contiguous (the committed run), not masked."""
    got = plan.grouped_choices(*QWEN_GU, "bfloat16", "contiguous", epilogue="swiglu")
    assert [g.tokens for g in got] == [(1, 64 * 64), (64 * 64 + 1, plan.GROUPED_MAX_TOKENS)]
    assert {k: got[0].choice.knobs[k] for k in DECODE_TILE} == DECODE_TILE
    assert all(g.choice.knobs["spec"] == grouped_swiglu.spec_of_dtype("bfloat16").text() for g in got)
    assert all(g.choice.measured and plan.GROUPED_SWIGLU in g.choice.why for g in got)
    assert (REPO / plan.GROUPED_SWIGLU).is_file()
    masked = plan.grouped_choices(*QWEN_GU, "bfloat16", "masked", epilogue="swiglu")
    assert [g.tokens[0] for g in masked][0] == 1 and not any(g.choice.measured for g in masked)
    assert "not measured" in masked[0].choice.why
    assert any("swap AB" in s and "gated" in s for s in got[0].choice.skipped)
    with pytest.raises(ConfigError, match="grouped epilogue 'geglu'"):
        plan.grouped_choices(*QWEN_GU, "bfloat16", "contiguous", epilogue="geglu")


def test_the_swiglu_argument_parses():
    assert cli_types.grouped_weight("64,2816,2048,swiglu") == (64, 2816, 2048, None, "swiglu")  # both layouts
    assert cli_types.grouped_weight("64,2816,2048,masked,swiglu") == (64, 2816, 2048, "masked", "swiglu")
    with pytest.raises(argparse.ArgumentTypeError, match="N=2815 is odd"):
        cli_types.grouped_weight("64,2815,2048,swiglu")
    with pytest.raises(argparse.ArgumentTypeError, match="layout 'swiglu2'"):
        cli_types.grouped_weight("64,2816,2048,swiglu2")


def test_the_pack_serves_gated_modules_to_grouped_swiglu_only(swiglu_pack, gpu_mocked):
    pk = KernelPack(swiglu_pack)
    gated = pk.grouped_entries("contiguous", *QWEN_GU, "bfloat16", "sm_90a", "swiglu")
    plain = pk.grouped_entries("contiguous", *QWEN_GU, "bfloat16", "sm_90a")
    assert [e["choice"]["rule"] for e in gated] == ["grouped-decode", "grouped-prefill"]
    assert all(e["spec"]["gated"] for e in gated) and not any(e["spec"].get("gated") for e in plain)
    assert {e["file"] for e in gated}.isdisjoint(e["file"] for e in plain)
    gemm_ladder.use_pack(swiglu_pack)
    small, large = (grouped_swiglu.route_of(*QWEN_GU, "bfloat16", 0, t) for t in (512, 8192))
    assert small.source == large.source == "kernel pack"
    assert "m64n128" in small.lines[0] and "m128n256" in large.lines[0] and "gated_true" in small.lines[0]
    mm = grouped.route_of(*QWEN_GU, "bfloat16", 0, 512)
    assert mm.source == "kernel pack" and "gated_true" not in mm.lines[0] and "swapabTrue" in mm.lines[0]
    # the masked gated modules serve grouped_swiglu_masked by the slot, and launch on [E * max_tokens, ...] views
    masked = grouped_swiglu.route_of_masked(*QWEN_GU, "bfloat16", 0, 32)
    assert masked.source == "kernel pack" and "layout=masked" in masked.lines[0] and "gated_true" in masked.lines[0]
    masked.run(torch.zeros(64, 32, 2048), torch.zeros(*QWEN_GU), torch.zeros(64, dtype=torch.int32),
               torch.zeros(64, 32, 1408))
    (module,) = [m for m in gpu_mocked.values() if m.calls]
    assert module.calls[0][0].shape == (64 * 32, 2048) and module.calls[0][3].shape == (64 * 32, 1408)
    with pytest.raises(NoKernelError, match="grouped_swiglu_masked .*pack build --grouped 64,2816,2048,masked,swiglu"):
        grouped_swiglu.route_of_masked(*QWEN_GU, "float16", 0, 32, strict=True)


def test_no_module_falls_back_unfused_and_strict_raises(gpu_mocked):
    with pytest.warns(KernelFallbackWarning, match="pack build --grouped 64,2816,2048,swiglu"):
        route = grouped_swiglu.route_of(*QWEN_GU, "bfloat16", 0, 512)
    assert route.run is grouped_swiglu.torch_swiglu
    with pytest.raises(NoKernelError, match="strict mode.*spec='d_bfloat16.act_silu.grouped_true.gated_true'"):
        grouped_swiglu.route_of(*QWEN_GU, "bfloat16", 0, 512, strict=True)


def test_a_registered_gated_module_serves_grouped_swiglu_and_not_grouped_mm(gpu_mocked, monkeypatch):
    class Module:
        path = type("P", (), {"name": "mine.so"})()

        def launch(self, *args):
            pass

    monkeypatch.setitem(grouped._REGISTERED, ("contiguous", *QWEN_GU, "bfloat16", "sm_90a", "swiglu"), Module())  # pylint: disable=protected-access
    assert grouped_swiglu.route_of(*QWEN_GU, "bfloat16", 0, 64).source == "registered"
    with pytest.raises(NoKernelError):
        grouped.route_of(*QWEN_GU, "bfloat16", 0, 64, strict=True)


# -- benchmarks/grouped_swiglu_check.py's pure parts -------------------------------------------------
@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("grouped_swiglu_check", REPO / "benchmarks" / "grouped_swiglu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grouped_swiglu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_check_builds_the_gated_tiers_and_the_grouped_mm_peers_it_times(check):
    modules = check.module_plan()
    gated = [m for m in modules if m["kind"] == "swiglu"]
    extra = [m for m in gated if m["tokens"] is None]
    assert len(gated) - len(extra) == len(check.SHAPES) * len(check.DTYPES) * 2  # the decode and the prefill module
    assert len(extra) == sum(map(len, check.EXTRA_VARIANTS.values())) and all(m["dtype"] == "bfloat16" for m in extra)
    assert all(m["knobs"]["blk_n"] == 128 and "num_warpgroups" not in m["knobs"] for m in extra)  # two consumers
    assert all(GemmSpec.parse(m["knobs"]["spec"]).gated for m in gated)
    for name, E, I, K in check.SHAPES[:3]:  # every timed count has a gated module and a grouped_mm peer
        mine = [m for m in modules if m["shape"] == name]
        for tokens in check.TOKENS:
            assert check.for_tokens(mine, "swiglu", tokens) is not None
            peer = check.for_tokens(mine, "mm", tokens)
            assert peer is not None and "spec" in peer["knobs"] and not GemmSpec.parse(peer["knobs"]["spec"]).gated
    masked = [m for m in modules if m["kind"] == "swiglu_masked"]
    assert {(m["shape"], m["dtype"]) for m in masked} == {(s, d) for s, ds in check.MASKED_DTYPES.items() for d in ds}
    assert all(m["knobs"]["layout"] == "masked" and m["tokens"][0] == 1 for m in masked)
    assert len({m["file"] for m in modules}) == len(modules)


def test_the_checks_rows_carry_the_results_format_and_the_policys_ratio(check):
    m = {"kind": "swiglu", "shape": "qwen_moe", "experts": 64, "I": 1408, "K": 2048, "dtype": "bfloat16",
         "tier": "decode", "tokens": [1, 4096], "file": "a.so"}
    other = dict(m, tier="prefill", tokens=[4097, 10**6], file="b.so")
    times = {"ours_decode": {"graph_ms": 1.0, "queued_ms": 1.1}, "ours_prefill": {"graph_ms": 2.0, "queued_ms": 2.0},
             "torch_unfused": {"graph_ms": 1.5, "queued_ms": 1.6}, "grouped_mm_then_torch": {"graph_ms": 1.2,
                                                                                            "queued_ms": 1.3}}
    checks = {"a.so": {"status": "ok", "cases": [{"routing": "zipf", "ok": True, "rel_err": 1e-3,
                                                  "torch_rel_err": 2e-3}], "graph_replays": []},
              "b.so": {"status": "wrong", "cases": [], "graph_replays": []}}
    timings = {"qwen_moe": {"status": "ok", "rows": [{"tokens": 512, "routing": "zipf", "times": times,
                                                      "policy_tier": "decode", "grouped_mm_tier": "prefill-swap32"}]}}
    rows = check.rows_of([m, other], checks, timings)
    for key in ("op", "layout", "experts", "tokens", "N", "K", "dtype", "routing", "correct", "ratio_to_grouped_mm",
                "peer_ratios"):
        assert all(key in r for r in rows), key
    timed = [r for r in rows if r["kind"] == "timed"]
    assert [(r["variant"], r["policy"], r["correct"]) for r in timed] == [("decode", True, True),
                                                                          ("prefill", False, False)]
    assert timed[0]["ratio_to_grouped_mm"] == pytest.approx(1.5)
    assert timed[0]["peer_ratios"]["grouped_mm_then_torch_graph"] == pytest.approx(1.2)
    assert [r["kind"] for r in rows if not r["correct"]] == ["failure", "timed"]  # b.so's check failed
    masked = dict(m, kind="swiglu_masked", file="c.so", experts=5)
    (masked_row,) = check.rows_of([masked], {"c.so": checks["a.so"]}, {})
    assert masked_row["layout"] == "masked" and masked_row["tokens"] == 300 and masked_row["correct"]
    summary = check.summary_of(rows)
    assert summary["timed_cases"] == 1 and summary["geomean_vs_torch_unfused"] == pytest.approx(1.5)
