"""``benchmarks/train_profile.py`` on the CPU: the kernel categories, the per-step summary of the
profiler's events, and a dry run of its phase (the CPU's ops in place of the GPU's kernels)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def tp():
    return benchmark_script("train_profile")


@pytest.mark.parametrize("name, want", [
    ("hgemm_kernel", "gemm ours"),  # every module of ours (a name with 'gemm' in it, not cuBLAS's)
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm cublas"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm cublas"),
    ("some_new_kernel", "other"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, NormTwoOps>>", "reduction"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
])
def test_kernels_fall_into_their_categories(tp, name, want):
    assert tp.category(name) == want


def test_the_summary_is_per_step_sorted_and_adds_up(tp):
    ev = [SimpleNamespace(key="hgemm_kernel", count=8, device_time_total=4000.0),
          SimpleNamespace(key="sm90_xmma_gemm_x", count=4, device_time_total=1000.0),
          SimpleNamespace(key="cudaLaunchKernel", count=99, device_time_total=0.0),  # host-side: no GPU time
          SimpleNamespace(key="vectorized_elementwise_kernel", count=20, device_time_total=2000.0)]
    got = tp.summarize_kernels(ev, steps=2)
    assert [k["name"] for k in got["top"]] == ["hgemm_kernel", "vectorized_elementwise_kernel", "sm90_xmma_gemm_x"]
    assert got["top"][0] == {"name": "hgemm_kernel", "calls": 4.0, "ms": 2.0, "category": "gemm ours"}
    assert got["total_ms"] == pytest.approx(3.5) and sum(got["by_category"].values()) == pytest.approx(3.5)
    assert list(got["by_category"]) == ["gemm ours", "elementwise", "gemm cublas"]


@pytest.mark.parametrize("fuse", [False, True])
def test_a_dry_run_profiles_torch_and_ours(tp, fuse):
    e2e = tp.e2e_check
    doc = e2e.plan(train_model="llama-125m", phases=("train",))
    doc["models"]["tiny"] = dataclasses.asdict(e2e.Config("tiny", hidden=64, layers=2, heads=4, kv_heads=2,
                                                          intermediate=96, vocab=101, rope_theta=10000.0))
    doc["train"].update(model="tiny", batch=2, seq=16, lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tp.profile_job(doc, dev="cpu", fuse=fuse, warmup=1, steps=1)
    finally:
        torch.set_num_threads(threads)
    assert out["status"] == "ok" and out["fused"] == (4 if fuse else 0)  # the MLPs and the q/k/v groups
    assert [r["who"] for r in out["rows"]] == ["torch", "ours"]
    for r in out["rows"]:
        assert r["phase"] == "profile" and r["model"] == "tiny" and r["fused"] is fuse and r["total_ms"] > 0
        assert sum(r["by_category"].values()) == pytest.approx(r["total_ms"])


def test_phase_job_refuses_an_unknown_phase(tp, tmp_path):
    with pytest.raises(ValueError, match="unknown phase 'train': profile"):
        tp.phase_job("train", [str(tmp_path)])
    with pytest.raises(ValueError, match="prefill:MODEL:BxS"):
        tp.phase_job("prefill:llama-125m", [str(tmp_path)])


@pytest.mark.parametrize("text, want", [("1x512", (1, 512)), ("8X4096", (8, 4096))])
def test_a_prefill_shape_reads_as_batch_by_sequence(tp, text, want):
    assert tp.parse_shape(text) == want


@pytest.mark.parametrize("text", ["512", "0x512", "1x", "axb", "1x2x3", "-1x4"])
def test_a_bad_prefill_shape_is_refused_with_the_form(tp, text):
    with pytest.raises(ValueError, match="BxS, e.g. 1x512"):
        tp.parse_shape(text)


def test_a_dry_run_profiles_a_prefill_with_its_wall_time(tp):
    e2e = tp.e2e_check
    doc = e2e.plan(phases=("inference",))
    doc["models"]["tiny"] = dataclasses.asdict(e2e.Config("tiny", hidden=64, layers=2, heads=4, kv_heads=2,
                                                          intermediate=96, vocab=101, rope_theta=10000.0))
    doc["inference"]["models"] = ["tiny"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tp.prefill_job(doc, "tiny", 2, 8, dev="cpu", warmup=1, steps=1, timed=1)
    finally:
        torch.set_num_threads(threads)
    assert out["status"] == "ok" and [r["who"] for r in out["rows"]] == ["torch", "ours"]
    for r in out["rows"]:
        assert r["phase"] == "prefill profile" and r["tokens"] == 16 and r["total_ms"] > 0 and r["wall_ms"] > 0
    assert "wall ms" in tp.table(out["rows"])


def test_run_without_a_gpu_says_so_in_one_line(tp, tmp_path, capsys):
    assert tp.main(["run", str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    assert "no GPU" in capsys.readouterr().err and not (tmp_path / "p.json").exists()
