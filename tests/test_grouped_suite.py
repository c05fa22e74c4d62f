"""``benchmarks/grouped_suite.py`` and its Triton peer on the CPU: the cases and the pack that serves
them, the routings' invariants, the rows and summary on made-up timings, and the Triton kernel
compiled for sm_90 (no GPU needed). (Running the suite is a GPU benchmark: ``grouped_suite.py run``.)"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemm_ladder.serve import kernel_pack

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def gs():
    return benchmark_script("grouped_suite")


@pytest.fixture(scope="module")
def entries(gs):
    """The pack ``prepare`` builds, as planned (its entries), without building it."""
    weights = [(E, N, K, "contiguous") for _, E, N, K in gs.FAMILIES]
    _, N, K = gs.family(gs.DENSE_FAMILY)
    items = kernel_pack.plan_pack([(t, N, K) for t in gs.DENSE_TOKENS], [gs.DTYPE], alternatives=False,
                                  grouped=weights)
    return [e for i in items for e in kernel_pack.entries_of(i)]


def test_the_cases_span_the_issues_families_and_token_range(gs):
    cs = gs.cases()
    assert {c["family"] for c in cs} == {"mixtral", "qwen_moe", "qwen3_moe", "deepseek_v3", "odd"}
    assert {(c["experts"], c["N"], c["K"]) for c in cs} >= {(8, 14336, 4096), (128, 768, 2048), (256, 2048, 7168)}
    assert min(c["tokens"] for c in cs) == 64 and max(c["tokens"] for c in cs) == 32768
    assert len({(c["family"], c["tokens"]) for c in cs}) == len(cs)
    assert all((c["family"], c["tokens"]) not in gs.SKIPPED for c in cs)
    with pytest.raises(ValueError, match="qwen3_moe"):
        gs.family("qwen3")


def test_every_case_is_served_by_a_module_of_the_pack(gs, entries):
    """strict=True fails a case the pack lacks: every (weight, tokens) must fall in one module's
    range, and the dense comparison's M too."""
    for c in gs.cases():
        want = gs.gpc.expected_module(entries, c["experts"], c["N"], c["K"], c["tokens"])
        assert want is not None, c
        assert want["tokens"][0] <= c["tokens"] <= want["tokens"][1]
    _, N, K = gs.family(gs.DENSE_FAMILY)
    for t in gs.DENSE_TOKENS:
        dense = [e for e in entries if not kernel_pack.is_grouped(e) and e["shape"][1:] == [N, K]
                 and e["m_range"][0] <= t <= e["m_range"][1]]
        assert dense, t
    # bf16 only: the fp16 modules would double DIR for no row of the suite
    assert {e["dtype"] for e in entries} == {gs.DTYPE}


@pytest.mark.parametrize("routing", ["balanced", "zipf"])
def test_the_routings_cover_every_row_once(gs, routing):
    for c in gs.cases():
        E, tokens = c["experts"], c["tokens"]
        counts = gs.gc.counts_of(routing, E, tokens, seed=tokens)
        assert len(counts) == E and min(counts) >= 0 and sum(counts) == tokens
        tail = gs.gc.counts_of(routing, E, tokens - gs.TAIL, seed=tokens + 1)
        assert gs.gc.offsets_of(tail)[-1] == tokens - gs.TAIL > 0  # rows past offs[-1] to leave NaN
    zipf = gs.gc.counts_of("zipf", 256, 32768, seed=1)
    assert max(zipf) > 4 * 32768 / 256  # skewed: the hot expert holds several times the mean


def test_items_round_trip_and_crashed_cases_retry_without_triton(gs):
    item = gs.case_item("/x/pack", "qwen3_moe", 2048, True)
    assert gs.parse_case_item(item) == ("/x/pack", "qwen3_moe", 2048, True)
    items = [item, gs.case_item("/x/pack", "odd", 64, True), gs.case_item("/x/pack", "odd", 128, False)]
    results = [{"status": "crash"}, {"status": "ok"}, {"status": "timeout"}]
    assert gs.retry_items(items, results) == [0]  # the third already ran without Triton
    assert gs.is_dense_case("mixtral", 8192, "balanced") and not gs.is_dense_case("mixtral", 8192, "zipf")
    assert gs.rounds_for(0.2) == gs.ROUNDS and gs.rounds_for(5.0) == gs.SLOW_ROUNDS


def _times(ours, **peers):
    t = {"ours": {"graph_ms": ours, "queued_ms": ours * 1.1, "stream_ms": ours * 1.3, "graph_round_ms": [ours] * 3}}
    t.update({p: {"graph_ms": ms, "queued_ms": ms, "stream_ms": ms * 1.2, "graph_round_ms": [ms * 0.9, ms, ms * 1.1]}
              for p, ms in peers.items()})
    return t


def _res(rows):
    return {"status": "ok", "source": "kernel pack", "rows": rows}


def _case_result(routing, times, ok=True, dense=None):
    checks = {"ours": {"ok": ok}, "ours_tail": {"ok": True}, "triton_grouped": {"ok": "triton_grouped" in times}}
    if dense is not None:
        checks["dense"] = {"ok": dense}
    return {"routing": routing, "sets": 2, "live_experts": 8, "checks": checks, "times": times,
            "dense_served_by": "kernel pack: kernel: v9 x.so" if dense is not None else None}


def test_rows_carry_the_issues_format_and_the_peers(gs, entries):
    want = gs.gpc.expected_module(entries, 8, 14336, 4096, 8192)
    item = gs.case_item("/x/pack", "mixtral", 8192, True)
    res = _res([_case_result("balanced", {**_times(2.0, grouped_mm=2.2, cublas_loop=2.4, triton_grouped=3.0),
                                          "dense": {"graph_ms": 1.9, "queued_ms": 1.9}}, dense=True),
                _case_result("zipf", _times(2.0, grouped_mm=2.1, cublas_loop=2.6))])
    res["kernel"] = f"kernel: v12 {want['file']}"
    rows = gs.rows_of(entries, item, res)
    grouped = [r for r in rows if r["op"] == "grouped_mm"]
    assert [r["routing"] for r in grouped] == ["balanced", "zipf"] and all(r["correct"] for r in grouped)
    b = grouped[0]
    for key in ("layout", "experts", "tokens", "N", "K", "dtype", "routing", "correct", "ratio_to_grouped_mm",
                "peer_ratios", "served_by", "kernel_us", "tflops", "tb_per_s"):
        assert key in b
    assert b["peer_ratios"] == pytest.approx({"grouped_mm": 1.1, "cublas_loop": 1.2, "triton_grouped": 1.5})
    assert b["ratio_to_best_peer"] == pytest.approx(1.1) and b["kernel_us"] == pytest.approx(2000)
    # a stream of calls (host included): torch's 2.2 x 1.2 over ours' 2.0 x 1.3
    assert b["peer_ratios_stream"]["grouped_mm"] == pytest.approx(2.2 * 1.2 / 2.6)
    # round by round: torch at 0.9, 1.0 and 1.1 of its median against ours steady
    assert b["peer_ratio_round_quartiles"]["grouped_mm"] == pytest.approx([0.99, 1.1, 1.21], abs=1e-3)
    assert b["tflops"] == pytest.approx(2 * 8192 * 14336 * 4096 / 2.0e-3 / 1e12)
    assert b["tb_per_s"] == pytest.approx((8192 * (4096 + 14336) * 2 + 8 * 14336 * 4096 * 2) / 2.0e-3 / 1e12)
    assert grouped[1]["peer_ratios"]["triton_grouped"] is None  # Triton failed its check there: not timed
    dense = [r for r in rows if r["op"] == "dense_compare"]
    assert len(dense) == 1 and dense[0]["correct"]
    assert dense[0]["ratio_grouped_to_dense"] == pytest.approx(1.9 / 2.0)
    # another module served (or not from the pack): not correct, whatever the timings
    assert not any(r["correct"] for r in gs.rows_of(entries, item, {**res, "kernel": "kernel: v12 other.so"})
                   if r["op"] == "grouped_mm")
    # the README's tables: the summary against the targets, a line a case, the dense comparison
    md = gs.markdown_of({"summary": gs.summary_of(rows), "rows": rows})
    assert "| mixtral | 8192 | balanced | grouped-prefill | 2000.0 |" in md and "| 1.100 | 1.200 | 1.500 |" in md
    assert "| 0.990-1.210 |" in md  # the rounds' spread of the ratio to torch
    assert "| 8192 tokens, dense 8192x14336x4096 |" in md and md.count("| 0.950 |") == 2
    # a child that crashed: one failure row for the case
    fail = gs.rows_of(entries, item, {"status": "crash", "detail": "boom"})
    assert len(fail) == 1 and not fail[0]["correct"] and "boom" in fail[0]["detail"]


def test_the_summary_reads_the_targets(gs):
    def row(family, E, N, K, tokens, to_torch, to_loop, to_triton, correct=True):
        case = {"family": family, "experts": E, "N": N, "K": K, "tokens": tokens, "routing": "balanced"}
        times = _times(1.0, grouped_mm=to_torch, cublas_loop=to_loop, **({"triton_grouped": to_triton}
                                                                           if to_triton else {}))
        return gs.case_row(case, correct, times, 10**9)

    rows = [row("qwen3_moe", 128, 768, 2048, 64, 1.2, 3.0, 2.0),
            row("qwen_moe", 64, 1408, 2048, 8192, 0.9, 1.5, None),
            row("deepseek_v3", 256, 2048, 7168, 256, 1.0, 4.0, 1.3),
            row("odd", 5, 1000, 520, 512, 5.0, 5.0, 5.0, correct=False),  # wrong: a failure, not a ratio
            {"op": "dense_compare", "tokens": 8192, "ratio_grouped_to_dense": 0.95}]
    s = gs.summary_of(rows)
    assert (s["cases"], s["correct"]) == (4, 3)
    assert s["to_grouped_mm"]["geomean"] == pytest.approx((1.2 * 0.9 * 1.0) ** (1 / 3))
    assert s["to_grouped_mm"]["min"] == pytest.approx(0.9)
    assert s["to_grouped_mm_stream"]["geomean"] == pytest.approx((1.2 * 0.9 * 1.0) ** (1 / 3) * 1.2 / 1.3)
    assert s["to_grouped_mm_decode"]["geomean"] == pytest.approx(math.sqrt(1.2 * 1.0))  # 64 and 256 tokens
    assert s["to_best_peer"]["min"] == pytest.approx(0.9)
    assert s["per_peer"]["triton_grouped"]["cases"] == 2
    # many and small: 128 x 768x2048 and 64 x 1408x2048, not 256 x 2048x7168
    assert s["to_cublas_loop_many_small"]["geomean"] == pytest.approx(math.sqrt(3.0 * 1.5))
    assert s["dense_compare"] == [{"tokens": 8192, "ratio_grouped_to_dense": 0.95}]


def test_run_wants_a_results_name_with_grouped(gs, tmp_path, capsys):
    with pytest.raises(SystemExit):
        gs.main(["run", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert "must contain 'grouped'" in capsys.readouterr().err


# -- the Triton peer ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tg():
    pytest.importorskip("triton")
    return benchmark_script("triton_grouped")


def test_the_triton_peer_refuses_what_it_does_not_take(tg):
    torch = pytest.importorskip("torch")
    A = torch.zeros(10, 64, dtype=torch.bfloat16)
    W = torch.zeros(4, 32, 64, dtype=torch.bfloat16)
    offs = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="must agree"):
        tg.check_operands(A[:, :32], W, offs)
    with pytest.raises(ValueError, match="both float16 or both bfloat16"):
        tg.check_operands(A.float(), W.float(), offs)
    with pytest.raises(ValueError, match="unit stride"):
        tg.check_operands(A, W.transpose(1, 2).contiguous().transpose(1, 2), offs)
    with pytest.raises(ValueError, match="one int32 per expert"):
        tg.check_operands(A, W, offs[:3])
    with pytest.raises(ValueError, match="on the GPU"):
        tg.check_operands(A, W, offs)
    assert [tg.token_bucket(r) for r in (1, 64, 65, 32768)] == [16, 64, 128, 32768]


def test_the_triton_kernel_compiles_for_sm90_with_wgmma(tg):
    """Every config JITs to PTX for an H100 here (no GPU): the 128-row tiles through wgmma, the
    loads through cp.async rings (aligned strides), the odd K through its masked path."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit = tg._grouped_kernel.fn.fn  # autotune -> heuristics -> the jitted kernel
    sig = {name: "constexpr" if name.isupper() and name not in ("N", "K", "E", "M_BUCKET") else "i32"
           for name in jit.arg_names}
    sig.update(g_a="*bf16", g_w="*bf16", g_d="*bf16", g_offs="*i32")
    aligned = [i for i, name in enumerate(jit.arg_names) if name.startswith(("g_", "stride_", "N", "K"))]
    for config, even_k in ((tg.CONFIGS[0], True), (tg.CONFIGS[-1], False)):
        consts = {"SMS": 132, "E_POW2": 256, "EVEN_K": even_k, **config.kwargs}
        src = ASTSource(fn=jit, signature=sig, constexprs={(jit.arg_names.index(k),): v for k, v in consts.items()},
                        attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 128),
                                options={"num_warps": config.num_warps, "num_stages": config.num_stages})
        ptx = kernel.asm["ptx"]
        assert "cp.async" in ptx
        assert ("wgmma" in ptx) == (config.kwargs["BLOCK_M"] >= 64)
        assert kernel.metadata.shared * config.kwargs["PROGS_PER_SM"] <= 228 * 1024


INTERPRET = """
import sys
import torch
sys.path.insert(0, "benchmarks")
import triton_grouped as tg

g = torch.Generator().manual_seed(0)
E, N, K, M = 4, 40, 40, 50  # N a partial n-tile; K past the k-tile in the masked path
A = torch.randn(M, K, dtype=torch.float16, generator=g)
W = torch.randn(E, N, K, dtype=torch.float16, generator=g)
offs = torch.tensor([7, 7, 27, 43], dtype=torch.int32)  # an empty expert, two m-tiles, 7 rows past offs[-1]
D = torch.empty(M, N, dtype=torch.float16)
# both K paths; then 3 experts in a scan of 4 lanes (E not a power of two: the last lane masked)
for experts, even_k, block_k in ((4, False, 16), (4, True, 8), (3, False, 16)):
    D.fill_(float("nan"))
    tg._grouped_kernel.fn.fn[(3,)](A, W, D, offs, N, K, experts, 64, A.stride(0), W.stride(0), W.stride(1),
                                   D.stride(0), SMS=3, PROGS_PER_SM=1, E_POW2=4, BLOCK_M=16, BLOCK_N=16,
                                   BLOCK_K=block_k, EVEN_K=even_k)
    start = 0
    for e, end in enumerate(offs.tolist()[:experts]):
        ref = A[start:end].float() @ W[e].float().T
        err = (D[start:end].float() - ref).abs().max().item() if end > start else 0.0
        assert err < 2e-2, (even_k, e, err)
        start = end
    assert torch.isnan(D[start:]).all(), "rows past offs[-1] written"
print("interpreted ok")
"""


def test_the_triton_kernel_computes_each_experts_rows_in_the_interpreter(tg):
    """Triton's interpreter (numpy on the CPU) runs the kernel's walk over (expert, tile): every
    expert's rows match a float reference, an empty expert costs nothing, rows past offs[-1] stay
    NaN, with fewer programs than tiles (the persistent stride) and both K paths."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", INTERPRET], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "interpreted ok" in out.stdout, out.stderr[-2000:]
