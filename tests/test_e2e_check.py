"""``benchmarks/e2e_check.py`` on the CPU: its Llama-style model (shapes, a forward in fp32, a
decode step with the static KV cache against the prefill), the GEMMs its plan builds against the
GEMMs the model runs, ``gemm_ladder.nn.patch`` on it, the loss rule of its training check, and
``run``'s refusal without a GPU. (Running it is a GPU benchmark: ``e2e_check.py run``.)"""

import copy
import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import gemm_ladder.nn as gnn
from gemm_ladder.measure import isolate

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e_check.py"


@pytest.fixture(scope="module")
def e2e():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared box
    spec = importlib.util.spec_from_file_location("e2e_check", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["e2e_check"] = mod
    spec.loader.exec_module(mod)
    yield mod
    torch.set_num_threads(threads)


def _tiny(e2e, tie=False):
    return e2e.Config("tiny", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=101, tie=tie,
                      rope_theta=10000.0)


def _model(e2e, cfg, seed=0):
    torch.manual_seed(seed)
    return e2e.Llama(cfg, max_positions=64).init_weights(seed=seed, std=0.1).eval()


@pytest.mark.parametrize("tie", [False, True])
def test_the_model_has_the_configs_parameters_and_shapes(e2e, tie):
    cfg = _tiny(e2e, tie)
    m = _model(e2e, cfg)
    assert sum(p.numel() for p in m.parameters()) == cfg.params()  # shared parameters counted once
    assert (m.lm_head.weight is m.embed.weight) == tie
    tokens = torch.randint(cfg.vocab, (3, 17))
    with torch.no_grad():
        assert m(tokens).shape == (3, 17, cfg.vocab)
        assert m(tokens, last_only=True).shape == (3, cfg.vocab)
        assert m.hidden(tokens).shape == (3, 17, cfg.hidden)
    assert m.layers[0].attn.k_proj.weight.shape == (cfg.kv_heads * cfg.head_dim, cfg.hidden)  # GQA: fewer KV heads


def test_the_real_configs_are_the_sizes_the_issue_asks_for(e2e):
    big, small = e2e.CONFIGS["llama-8b-2l"], e2e.CONFIGS["llama-125m"]
    assert (big.hidden, big.heads, big.kv_heads, big.intermediate, big.vocab) == (4096, 32, 8, 14336, 128256)
    assert 100e6 <= small.params() <= 400e6  # issue 31: a 100-400M model to train
    with pytest.raises(ValueError, match="kv_heads"):
        e2e.Config("bad", hidden=768, layers=1, heads=12, kv_heads=5, intermediate=2048, vocab=100)


def test_a_decode_step_on_the_static_cache_is_the_prefills_last_position(e2e):
    """Token by token through the KV cache (rotary at each position, the mask hiding the empty
    slots, GQA on the cache) gives the logits the causal prefill gives at every position."""
    cfg = _tiny(e2e)
    m = _model(e2e, cfg, seed=1)
    B, S = 2, 9
    tokens = torch.randint(cfg.vocab, (B, S))
    with torch.no_grad():
        full = m(tokens)
        cache = m.new_cache(B, S + 3)  # longer than needed: the mask must hide the slots not yet written
        for t in range(S):
            pos = torch.tensor([t])
            mask = (torch.arange(S + 3) <= pos).view(1, 1, 1, -1)
            step = m.decode(tokens[:, t:t + 1], pos, cache, mask)
            torch.testing.assert_close(step, full[:, t], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(full[:, 0], full[:, -1])  # positions differ: the test compares something


def _gemms_run(model, run):
    """(M, N, K) of every nn.Linear call ``run`` makes: forward hooks on the layers."""
    seen = set()

    def hook(mod, args, out):
        x = args[0]
        seen.add((x.numel() // x.shape[-1], mod.weight.shape[0], mod.weight.shape[1]))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    run()
    for h in handles:
        h.remove()
    return seen


def test_the_plan_builds_every_forward_gemm_the_runs_make(e2e):
    """On the meta device at the real widths: the GEMMs of each prefill (logits of the last
    position), each decode step and the training forward are in the plan, in the forward layout."""
    doc = e2e.plan()
    planned = {(g["M"], g["N"], g["K"]) for g in doc["gemms"] if g["layout"] == "KK"}
    assert doc["inference"]["models"] == ["llama-8b-2l", "llama-125m"]
    for name in doc["inference"]["models"]:
        cfg = e2e.CONFIGS[name]
        with torch.device("meta"):
            m = e2e.Llama(cfg, max_positions=16)
            for b, s in e2e.PREFILL:
                tokens = torch.zeros((b, s), dtype=torch.long)
                # meta tensors: shapes only; rotary tables would need s positions, so stub them
                m.cos, m.sin = torch.zeros(s, cfg.head_dim), torch.zeros(s, cfg.head_dim)
                got = _gemms_run(m, lambda: m(tokens, last_only=True))
                assert got <= planned and {M for M, N, _ in got if N == cfg.vocab} == {b}
            for b in e2e.DECODE:
                cache = m.new_cache(b, 8)
                pos, mask = torch.zeros(1, dtype=torch.long), torch.ones(1, 1, 1, 8, dtype=torch.bool)
                got = _gemms_run(m, lambda: m.decode(torch.zeros((b, 1), dtype=torch.long), pos, cache, mask))
                assert got <= planned and {M for M, _, _ in got} == {b}
    with torch.device("meta"):
        tr = e2e.CONFIGS[e2e.TRAIN["model"]]
        t = e2e.Llama(tr, max_positions=e2e.TRAIN["seq"])
        tokens = torch.zeros((e2e.TRAIN["batch"], e2e.TRAIN["seq"]), dtype=torch.long)
        got = _gemms_run(t, lambda: t(tokens))
        assert got <= planned and len(got) == len(set(tr.linears().values()))


def test_the_backward_gemms_make_the_gradients_of_every_linear(e2e):
    """dX's (M, N) is the shape of each layer input's gradient, dW's the weight gradient's, each
    reduced over what the two share: the GEMMs the op's backward asks the pack for."""
    cfg = _tiny(e2e)
    m = _model(e2e, cfg)
    B, S = 2, 5
    inputs = {}
    for name, lin in m.named_modules():
        if isinstance(lin, nn.Linear):
            lin.register_forward_hook(lambda mod, args, out, name=name: inputs.__setitem__(name, args[0]))
            lin.register_forward_pre_hook(lambda mod, args: (args[0].retain_grad(), None)[1])
    m(torch.randint(cfg.vocab, (B, S))).sum().backward()
    plan = e2e.backward_gemms(cfg, B * S)
    for name, x in inputs.items():
        w = m.get_submodule(name).weight
        dx = (x.grad.numel() // x.shape[-1], x.shape[-1], w.shape[0])
        dw = (*w.grad.shape, B * S)
        assert dx in plan["KN"] and dw in plan["MN"], name
    assert len(plan["KN"]) == len(plan["MN"]) == len(set(cfg.linears().values()))


def test_the_pack_requests_cover_the_plan_in_each_layout(e2e):
    doc = e2e.plan()
    built = {(tuple(r["layouts"][0]), s) for r in e2e.pack_requests(doc) for s in r["shapes"]}
    assert all(r["dtypes"] == ["bfloat16"] and r["epilogues"] == ["none"] for r in e2e.pack_requests(doc))
    for g in doc["gemms"]:
        assert (e2e.LAYOUTS[g["layout"]], (g["M"], g["N"], g["K"])) in built
    e2e.PLAN_SCHEMA.check(doc)  # what run reads back
    assert e2e.config_of(doc, "llama-125m") == e2e.CONFIGS["llama-125m"]
    with pytest.raises(ValueError, match="holds only llama-8b-2l, llama-125m"):
        e2e.config_of(doc, "gpt2")


def test_patch_swaps_every_linear_of_the_model_over_its_parameters(e2e):
    cfg = _tiny(e2e, tie=True)
    m = _model(e2e, cfg)
    names = e2e.linear_names(m)
    assert len(names) == 7 * cfg.layers + 1
    ours = copy.deepcopy(m)
    params = {n: p for n, p in ours.named_parameters()}
    swapped = gnn.patch(ours, verbose=False)
    assert sorted(swapped) == sorted(names) and e2e.linear_names(ours) == []
    assert all(type(ours.get_submodule(n)) is gnn.Linear for n in names)  # pylint: disable=unidiomatic-typecheck
    assert all(p is params[n] for n, p in ours.named_parameters())  # the same Parameters: optimizers stay valid
    assert ours.lm_head.weight is ours.embed.weight  # still tied
    tokens = torch.randint(cfg.vocab, (2, 7))
    with torch.no_grad():  # off the GPU the patched layers are F.linear: the same logits
        torch.testing.assert_close(ours(tokens), m(tokens), rtol=0, atol=0)


def test_smooth_and_drift(e2e):
    assert e2e.smooth([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    ref = [2.0] * 60
    assert e2e.drift([2.2] * 60, ref) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="same length"):
        e2e.drift([1.0] * 59, ref)


def _curve(n=150, start=10.0, end=3.0, wiggle=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [end + (start - end) * math.exp(-i / 30) + wiggle * float(torch.randn(1, generator=g)) for i in range(n)]


def test_loss_ok_accepts_a_curve_that_tracks_and_refuses_one_that_does_not(e2e):
    torch_losses = _curve(wiggle=0.05, seed=1)
    assert e2e.loss_ok(_curve(wiggle=0.05, seed=2), torch_losses)["ok"]  # rounding-size noise
    off = e2e.loss_ok([x * 1.06 for x in torch_losses], torch_losses)  # 6% higher at the end
    assert not off["ok"] and off["fell"] and "drifts" in off["why"]
    flat = e2e.loss_ok([10.0] * 150, torch_losses)  # a model that does not learn
    assert not flat["ok"] and not flat["fell"]
    assert not e2e.loss_ok(torch_losses[:-1] + [float("nan")], torch_losses)["ok"]


def test_loss_ok_widens_to_the_yardstick_runs_drift(e2e):
    torch_losses = _curve()
    ours = [x * 1.04 for x in torch_losses]  # 4%: above LOSS_TOL alone
    assert not e2e.loss_ok(ours, torch_losses)["ok"]
    wide = e2e.loss_ok(ours, torch_losses, yardstick=[x * 1.02 for x in torch_losses])
    assert wide["ok"] and wide["tolerance"] == pytest.approx(3 * 0.02)


def test_train_batches_are_seeded_and_shifted(e2e):
    cfg = e2e.CONFIGS["llama-125m"]
    x, y = e2e.train_batch(cfg, 4, 16, step=3, seed=31)
    x2, _ = e2e.train_batch(cfg, 4, 16, step=3, seed=31)
    assert torch.equal(x, x2) and not torch.equal(x, e2e.train_batch(cfg, 4, 16, step=4, seed=31)[0])
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (4, 16)  # next-token targets
    assert int(x.max()) < cfg.vocab


def test_error_ok_is_relative_to_torchs_own_error(e2e):
    assert e2e.error_ok(0.01, 0.006) and not e2e.error_ok(0.02, 0.006) and not e2e.error_ok(float("nan"), 0.01)


def test_run_without_a_gpu_says_so_in_one_line(e2e, tmp_path, capsys):
    out = tmp_path / "e2e_check.json"
    assert e2e.main(["run", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no GPU" in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_run_names_its_results_file_for_the_issue(e2e, tmp_path):
    with pytest.raises(SystemExit):
        e2e.main(["run", str(tmp_path), "--out", str(tmp_path / "results.json")])


def _tiny_doc(e2e):
    """The plan with the tiny model in both runs, and small runs (a dry run on the CPU)."""
    doc = e2e.plan()
    doc["models"]["tiny"] = dataclasses.asdict(_tiny(e2e))
    doc["inference"].update(models=["tiny"], prefill=[[1, 8], [2, 16]], decode=[2], decode_context=16,
                            check_prefill=[1, 8], check_decode=2)
    doc["train"].update(model="tiny", batch=2, seq=16, steps=e2e.LOSS_LAST + e2e.LOSS_WINDOW, warmup=5, lr=3e-3)
    return doc


def test_the_checks_run_on_shapes_the_pack_serves(e2e):
    inf = e2e.plan()["inference"]
    assert inf["check_prefill"] in inf["prefill"] and inf["check_decode"] in inf["decode"]


def test_inference_dry_run_checks_then_times_every_case(e2e):
    """The inference phase on the CPU (patched layers are F.linear there): the checks pass with
    ours equal to torch, and a row per prefill and decode case in the results format."""
    doc = _tiny_doc(e2e)
    out = e2e.inference(doc, "tiny", dev="cpu")
    assert out["status"] == "ok" and out["swapped"] == 7 * 2 + 1
    for what in ("hidden", "logits", "decode"):
        c = out["check"][what]
        assert c["ok"] and c["rel_err"] == c["torch_rel_err"] > 0  # bf16 against fp32: some error, the same
    rows = out["rows"]
    assert [(r["phase"], r["batch"], r["tokens"]) for r in rows] == [("prefill", 1, 8), ("prefill", 2, 32),
                                                                      ("decode", 2, 2)]
    assert all(r["ratio_to_torch"] > 0 and r["model"] == "tiny" for r in rows)


def test_train_dry_run_gives_torchs_curve_where_the_layers_are_torchs(e2e):
    """The training phase on the CPU: same initial weights and batches, so the patched model (on
    F.linear there) follows torch's curve exactly; the yardstick run does not; the loss falls."""
    doc = _tiny_doc(e2e)
    out = e2e.train(doc, dev="cpu")
    (row,) = out["rows"]
    assert row["phase"] == "train" and row["tokens"] == 32 and row["loss_ok"] is True
    assert row["losses"]["ours"] == row["losses"]["torch"] and row["losses"]["yardstick"] != row["losses"]["torch"]
    assert row["loss_rule"]["drift"] == 0.0 and row["final_loss_torch"] < row["first_loss"]
    # step times from the blocks after warm-up, each between synchronisations: finite for every model
    assert row["timing"] == e2e.TRAIN_TIMING and doc["train"]["steps"] - doc["train"]["warmup"] >= e2e.TRAIN_BLOCK
    assert all(0 < row[f"{n}_step_ms"] < float("inf") for n in ("torch", "ours", "yardstick"))


class _StubPack:
    """A pack that serves what ``fits`` says: (layout majors, M, N, K) -> fit."""

    def __init__(self, fits):
        self.fits = fits

    def find(self, M, N, K, dtype, arch, spec):
        fit = self.fits.get(((spec.a_major, spec.b_major), M, N, K))
        return None if fit is None else type("Found", (), {"fit": fit})()


def test_unserved_names_the_gemms_no_module_serves_as_planned(e2e):
    doc = e2e.plan()
    fits = {(e2e.LAYOUTS[g["layout"]], g["M"], g["N"], g["K"]): "exact" for g in doc["gemms"]}
    assert e2e.unserved(_StubPack(fits), doc, "sm_90a") == []
    dw = next(g for g in doc["gemms"] if g["layout"] == "MN")
    del fits[(("M", "N"), dw["M"], dw["N"], dw["K"])]
    kn = next(g for g in doc["gemms"] if g["layout"] == "KN")
    fits[(("K", "N"), kn["M"], kn["N"], kn["K"])] = "pad-m"  # a module made for more rows: not as planned
    got = e2e.unserved(_StubPack(fits), doc, "sm_90a")
    assert len(got) == 2 and any("no module" in m and "dW" in m for m in got) and any("pad-m" in m for m in got)


def test_phases_are_one_child_per_inference_model_and_training(e2e, tmp_path):
    doc = e2e.plan()
    assert e2e.phases_of(doc) == ["inference:llama-8b-2l", "inference:llama-125m", "train"]
    assert e2e.phases_of(doc, only=("train",)) == ["train"]
    e2e.files.write_json(tmp_path / e2e.PLAN_FILE, doc)  # phase_job reads the plan first
    with pytest.raises(ValueError, match="unknown phase 'inference:gpt2'"):
        e2e.phase_job("inference:gpt2", [str(tmp_path)])
    with pytest.raises(ValueError, match="unknown front-door mode 'fast': strict, measured"):
        e2e.phase_job("train", [str(tmp_path), "fast"])


def test_the_summary_groups_rows_by_phase_and_model(e2e):
    rows = [{"phase": "prefill", "model": "a", "ratio_to_torch": 1.2}, {"phase": "prefill", "model": "a",
                                                                        "ratio_to_torch": 0.8},
            {"phase": "decode", "model": "a", "ratio_to_torch": 1.1},
            {"phase": "train", "model": "b", "ratio_to_torch": 0.9, "loss_ok": False}]
    got = e2e.summarize({"inference:a": {"status": "ok"}, "train": {"status": "wrong"}}, rows)
    assert got["status"] == {"inference:a": "ok", "train": "wrong"}
    assert got["prefill a"]["geomean_ratio"] == pytest.approx((1.2 * 0.8) ** 0.5)
    assert got["prefill a"]["min_ratio"] == 0.8
    assert got["decode a"]["rows"] == 1 and got["train b"]["loss_ok"] is False


def test_a_phase_line_says_the_checks_or_what_went_wrong(e2e):
    ok = {"status": "ok", "check": {"prefill": [1, 512], "hidden": {"rel_err": 0.011, "torch_rel_err": 0.01},
                                    "decode": {"batch": 8, "rel_err": 0.02, "torch_rel_err": 0.019}}}
    line = e2e.phase_line("inference:llama-8b-2l", ok)
    assert line.startswith("inference:llama-8b-2l: ok") and "hidden rel err 1.10e-02 (torch 1.00e-02)" in line
    assert "decode rel err 2.00e-02" in line
    assert e2e.phase_line("train", {"status": "timeout", "detail": "no result after 90 s"}) == \
        "train: timeout no result after 90 s"


class _Clocks:
    def between(self, t0, t1):
        return {"sm_mhz": 1980, "watts": 500, "samples": 1 if t0 <= t1 else 0}

    def stop(self):
        pass


def test_run_writes_the_results_format_from_its_phases(e2e, tmp_path, monkeypatch, capsys):
    """``run``'s side of a GPU run (the phases done as CPU dry runs in this process): every row of
    the issue's results format, the clocks of each row, the summary, the table; nothing lost
    after the phases have run."""
    doc = _tiny_doc(e2e)
    e2e.files.write_json(tmp_path / e2e.PLAN_FILE, doc)
    monkeypatch.setattr(e2e.device, "why_no_gpu", lambda index=0: None)
    monkeypatch.setattr(e2e.device, "arch_of", lambda index: "sm_90a")
    monkeypatch.setattr(e2e, "KernelPack", lambda folder: None)
    monkeypatch.setattr(e2e, "unserved", lambda pack, doc, arch: [])
    monkeypatch.setattr(e2e.harness, "gpu_info", lambda index=0: {"name": "stub"})
    monkeypatch.setattr(e2e, "Sampler", _Clocks)
    asked = []

    def run_batch(job, items, args, timeout, explain):
        asked.append((job.rpartition(":")[2], items, list(args)))
        (item,) = items
        return [e2e.train(doc, dev="cpu") if item == "train" else e2e.inference(doc, "tiny", dev="cpu")]

    monkeypatch.setattr(isolate, "run_batch", run_batch)  # phase_runs runs the phases
    out = tmp_path / "e2e_check.json"
    assert e2e.main(["run", str(tmp_path), "--out", str(out), "--front", "measured"]) == 0
    assert asked == [("phase_job", ["inference:tiny"], [str(tmp_path), "measured"]),
                     ("phase_job", ["train"], [str(tmp_path), "measured"])]
    got = json.loads(out.read_text())
    assert [r["phase"] for r in got["rows"]] == ["prefill", "prefill", "decode", "train"]
    for r in got["rows"]:
        assert {"phase", "model", "batch", "tokens", "ratio_to_torch"} <= set(r) and r["clocks"]["samples"] == 1
    assert got["rows"][-1]["loss_ok"] is True and got["front_door"]["mode"] == "measured"
    assert got["summary"]["status"] == {"inference:tiny": "ok", "train": "ok"}
    assert got["summary"]["train tiny"]["loss_ok"] is True and got["gpu"] == {"name": "stub"}
    assert "inference:tiny: ok hidden rel err" in capsys.readouterr().err


# -- --fuse: the fused model's GEMMs (gemm_ladder.nn.patch(model, fuse=True)) ---------------------
def test_the_default_plan_has_no_fused_gemms_and_the_fused_plan_adds_them(e2e):
    plain, fused = e2e.plan(), e2e.plan(fuse=True)
    assert "fuse" not in plain and all("epilogue" not in g for g in plain["gemms"])
    assert fused["fuse"] is True and all(g in fused["gemms"] for g in plain["gemms"])  # one folder runs both ways
    e2e.PLAN_SCHEMA.check(fused)
    requests = e2e.pack_requests(fused)
    built = {(tuple(r["layouts"][0]), r["epilogues"][0], s) for r in requests for s in r["shapes"]}
    for g in fused["gemms"]:
        assert (e2e.LAYOUTS[g["layout"]], g.get("epilogue", "none"), (g["M"], g["N"], g["K"])) in built
    assert {r["epilogues"][0] for r in requests} == {"none", "swiglu"}


def test_the_fused_plan_holds_every_swiglu_the_fused_models_run(e2e):
    """On the meta device at the real widths: each fused MLP's call at each prefill and decode
    (M tokens, N = 2I rows of W_gu, K = hidden) is a swiglu GEMM of the plan, and each attention's
    q/k/v group's (N = the three widths) a plain one."""
    doc = e2e.plan(fuse=True)
    planned = {(g["M"], g["N"], g["K"], g.get("epilogue", "none")) for g in doc["gemms"] if g["layout"] == "KK"}
    for name in doc["inference"]["models"]:
        cfg = e2e.CONFIGS[name]
        with torch.device("meta"):
            m = e2e.Llama(cfg, max_positions=16)
        report = gnn.patch(m, verbose=False, fuse=True)
        assert sorted(n for n, _ in report.fused) == sorted(f"layers.{i}.{p}" for i in range(cfg.layers)
                                                            for p in ("mlp", "attn"))
        seen = set()

        def rows(x):
            return x.numel() // x.shape[-1]
        for mlp in (mod for mod in m.modules() if isinstance(mod, gnn.SwiGLUMLP)):
            mlp.register_forward_pre_hook(
                lambda mod, args: seen.add((rows(args[0]), 2 * mod.gate_proj.out_features,
                                            mod.gate_proj.in_features, "swiglu")))
        for attn in (mod for mod in m.modules() if isinstance(mod, e2e.Attention)):
            attn.q_proj.register_forward_pre_hook(
                lambda mod, args: seen.add((rows(args[0]), sum(mod.shared.widths), mod.in_features, "none")))
        for b, s in e2e.PREFILL:
            m.cos, m.sin = torch.zeros(s, cfg.head_dim, device="meta"), torch.zeros(s, cfg.head_dim, device="meta")
            m(torch.zeros((b, s), dtype=torch.long, device="meta"), last_only=True)
        for b in e2e.DECODE:
            cache = m.new_cache(b, 8)
            pos, mask = torch.zeros(1, dtype=torch.long, device="meta"), torch.ones(1, 1, 1, 8, dtype=torch.bool,
                                                                                   device="meta")
            m.decode(torch.zeros((b, 1), dtype=torch.long, device="meta"), pos, cache, mask)
        assert seen and seen <= planned, seen - planned


def test_fused_gemms_are_the_fused_backwards_gemms(e2e):
    """``ops.swiglu_grads`` (the fused MLP's backward) on a recording CPU product: its GEMMs, with
    the layouts they read, are the ones :func:`fused_gemms` plans."""
    from gemm_ladder.serve import front, ops  # pylint: disable=import-outside-toplevel

    cfg = _tiny(e2e)
    rows, calls = 10, set()

    def gemm(A, B):
        a2 = A.reshape(-1, A.shape[-1])
        calls.add((front.operand_majors(a2, B), a2.shape[0], B.shape[0], a2.shape[1]))
        return A.float() @ B.float().T

    x = torch.randn(2, 5, cfg.hidden)
    W_gu = torch.randn(2 * cfg.intermediate, cfg.hidden)
    ops.swiglu_grads(torch.randn(2, 5, cfg.intermediate), x, W_gu, (True, True), gemm)
    want = {(e2e.LAYOUTS[lay], *s) for (lay, ep), shapes in e2e.fused_gemms(cfg, rows, backward=True).items()
            if ep == "none" for s in shapes}
    assert calls == want


def test_fused_dry_runs_fuse_every_mlp_and_match_torch_off_the_gpu(e2e):
    doc = _tiny_doc(e2e)
    out = e2e.inference(doc, "tiny", dev="cpu", fuse=True)
    assert out["status"] == "ok" and out["fused"] == 4 and all(r["fused"] and "no_qkv_ms" in r for r in out["rows"])
    assert out["check"]["hidden"]["rel_err"] == out["check"]["hidden"]["torch_rel_err"]  # the MLP's own formula
    doc["train"].update(steps=e2e.LOSS_LAST + e2e.LOSS_WINDOW)
    tr = e2e.train(doc, dev="cpu", fuse=True)
    (row,) = tr["rows"]
    assert tr["fused"] == 4 and row["fused"] is True and row["losses"]["ours"] == row["losses"]["torch"]


def test_run_fuse_refuses_a_plan_prepared_without_it(e2e, tmp_path, monkeypatch, capsys):
    e2e.files.write_json(tmp_path / e2e.PLAN_FILE, e2e.plan())
    monkeypatch.setattr(e2e.device, "why_no_gpu", lambda index=0: None)
    assert e2e.main(["run", str(tmp_path), "--out", str(tmp_path / "e2e_check.json"), "--fuse"]) == 2
    assert "--fuse" in capsys.readouterr().err and not (tmp_path / "e2e_check.json").exists()


def test_unserved_asks_the_pack_for_the_gated_spec_of_a_swiglu_gemm(e2e):
    doc = e2e.plan(fuse=True)
    asked = {}

    class Pack:
        def find(self, M, N, K, dtype, arch, spec):  # pylint: disable=unused-argument
            asked[(M, N, K, spec.gated)] = spec
            return None

    got = e2e.unserved(Pack(), doc, "sm_90a")
    swiglus = [g for g in doc["gemms"] if g.get("epilogue") == "swiglu"]
    assert swiglus and all(asked[(g["M"], g["N"], g["K"], True)].act == "silu" for g in swiglus)
    assert sum(" swiglu " in m for m in got) == len(swiglus) and len(got) == len(doc["gemms"])


# -- --train MODEL: the GPU-bound training run beside the host-bound one ---------------------------
def test_the_gpu_bound_training_run_is_a_350m_model_with_fewer_layers_and_more_work_a_layer(e2e):
    """llama-350m is in the issue's 100-400M range, and against llama-125m it has fewer linears
    (the host's cost a step) for more GEMM flops a step (the GPU's): what makes it GPU-bound."""
    small, big = e2e.CONFIGS["llama-125m"], e2e.CONFIGS["llama-350m"]
    assert 300e6 <= big.params() <= 400e6 and e2e.TRAINS["llama-125m"] is e2e.TRAIN  # the default run unchanged

    def linears_and_flops(cfg):
        run = e2e.TRAINS[cfg.name]
        per_token = sum(o * i for n, (o, i) in cfg.linears().items() if n != "lm_head") * cfg.layers + \
            cfg.vocab * cfg.hidden
        return 7 * cfg.layers + 1, 6 * per_token * run["batch"] * run["seq"]

    (n_small, f_small), (n_big, f_big) = linears_and_flops(small), linears_and_flops(big)
    assert n_big < n_small / 2 and f_big > 10 * f_small
    run = e2e.TRAINS["llama-350m"]
    assert run["steps"] >= 100 and run["deadline_s"] > e2e.PHASE_TIMEOUT["train"]


def test_a_training_only_plan_holds_exactly_the_gemms_of_that_models_step(e2e):
    """``plan(train_model=..., phases=("train",))``: no inference section or GEMM; the forward
    GEMMs the model runs at its batch x sequence (meta device), every backward GEMM, and with
    ``fuse`` the fused MLP's; the plan reads back and runs one phase, training."""
    doc = e2e.plan(fuse=True, train_model="llama-350m", phases=("train",))
    e2e.PLAN_SCHEMA.check(doc)
    assert "inference" not in doc and doc["phases"] == ["train"] and e2e.phases_of(doc) == ["train"]
    run, cfg = doc["train"], e2e.config_of(doc, "llama-350m")
    assert run == e2e.TRAINS["llama-350m"] and run["model"] == cfg.name
    rows = run["batch"] * run["seq"]
    with torch.device("meta"):
        m = e2e.Llama(cfg, max_positions=run["seq"])
        forward = _gemms_run(m, lambda: m(torch.zeros((run["batch"], run["seq"]), dtype=torch.long)))
    want = {("KK", *s, "none") for s in forward}
    want |= {(lay, *s, "none") for lay, shapes in e2e.backward_gemms(cfg, rows).items() for s in shapes}
    want |= {(lay, *s, ep) for (lay, ep), shapes in e2e.fused_gemms(cfg, rows, backward=True).items() for s in shapes}
    want |= {(lay, *s, "none") for lay, shapes in e2e.qkv_gemms(cfg, rows, backward=True).items() for s in shapes}
    got = {(g["layout"], g["M"], g["N"], g["K"], g.get("epilogue", "none")) for g in doc["gemms"]}
    assert got == want and all(g["why"].startswith("train") and "(llama-350m)" in g["why"] for g in doc["gemms"])
    # the default plan is what it was: both phases, the 125M run
    default = e2e.plan()
    assert e2e.phases_of(default) == ["inference:llama-8b-2l", "inference:llama-125m", "train"]
    assert default["train"] == e2e.TRAIN and e2e.deadline(default, "train") == e2e.PHASE_TIMEOUT["train"]
    assert e2e.deadline(doc, "train") == run["deadline_s"]
    assert e2e.deadline(default, "inference:llama-125m") == e2e.PHASE_TIMEOUT["inference"]


def test_plan_refuses_an_unknown_training_model_or_phase(e2e):
    with pytest.raises(ValueError, match="no training run for model 'gpt2': pick one of llama-125m, llama-350m"):
        e2e.plan(train_model="gpt2")
    with pytest.raises(ValueError, match="pick one or more of inference, train"):
        e2e.plan(phases=("decode",))
    with pytest.raises(ValueError, match="pick one or more"):
        e2e.plan(phases=())


def test_run_refuses_a_phase_or_a_training_model_the_plan_does_not_hold(e2e, tmp_path, monkeypatch, capsys):
    e2e.files.write_json(tmp_path / e2e.PLAN_FILE, e2e.plan(train_model="llama-350m", phases=("train",)))
    monkeypatch.setattr(e2e.device, "why_no_gpu", lambda index=0: None)
    out = tmp_path / "e2e_check.json"
    assert e2e.main(["run", str(tmp_path), "--out", str(out), "--phase", "inference"]) == 2
    assert "holds only the phase(s) train, not inference: run with --phase train" in capsys.readouterr().err
    assert e2e.main(["run", str(tmp_path), "--out", str(out), "--train", "llama-125m"]) == 2
    err = capsys.readouterr().err
    assert "--train llama-125m: the plan" in err and "trains llama-350m" in err and "prepare" in err
    assert not out.exists()


def test_a_training_only_run_runs_the_training_phase_alone_and_names_its_model(e2e, tmp_path, monkeypatch):
    """``run`` on a training-only plan (the phase done as a CPU dry run in this process): one
    child, training, within the run's own deadline; its row carries the model's name."""
    doc = _tiny_doc(e2e)
    del doc["inference"]
    doc.update(phases=["train"])
    doc["train"]["deadline_s"] = 123
    e2e.files.write_json(tmp_path / e2e.PLAN_FILE, doc)
    monkeypatch.setattr(e2e.device, "why_no_gpu", lambda index=0: None)
    monkeypatch.setattr(e2e.device, "arch_of", lambda index: "sm_90a")
    monkeypatch.setattr(e2e, "KernelPack", lambda folder: None)
    monkeypatch.setattr(e2e, "unserved", lambda pack, doc, arch: [])
    monkeypatch.setattr(e2e.harness, "gpu_info", lambda index=0: {"name": "stub"})
    monkeypatch.setattr(e2e, "Sampler", _Clocks)
    asked = []

    def run_batch(job, items, args, timeout, explain):
        asked.append((items, timeout))
        return [e2e.train(doc, dev="cpu")]

    monkeypatch.setattr(isolate, "run_batch", run_batch)
    out = tmp_path / "e2e_train.json"
    assert e2e.main(["run", str(tmp_path), "--out", str(out)]) == 0
    assert asked == [(["train"], 123.0)]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["phase"] == "train" and row["model"] == "tiny" and row["params"] == _tiny(e2e).params()


@pytest.mark.parametrize("fuse", [True, ("qkv",), ("swiglu", "act"), False])
def test_the_fusions_reach_the_phase_through_the_isolated_jobs_arguments(e2e, fuse):
    """``measure.isolate`` hands a job its arguments comma-joined and splits them again: the
    fusions come back whole (a comma-joined list once came back as its first name alone)."""
    from gemm_ladder.measure import isolate  # pylint: disable=import-outside-toplevel

    args = ["build/e2e", "strict", *e2e.fuse_job_args(fuse)]
    back = isolate.split_args(isolate.join_args(args))
    assert back == args
    got = e2e.fuse_arg(back[2]) if len(back) > 2 else False
    assert (set(got) if got else set()) == set(gnn.fusions(fuse))


def test_fusions_pick_what_ours_is_patched_with(e2e):
    assert e2e.fuse_arg("fuse") == tuple(gnn.FUSIONS) and e2e.fuse_arg("fuse=qkv+act") == ("act", "qkv")
    with pytest.raises(ValueError, match="some of swiglu, qkv, act"):
        e2e.fuse_arg("fuse=mlp")
    with pytest.raises(ValueError, match="some of swiglu, qkv, act"):
        e2e.fuse_arg("fuse=qkv,act")  # the job's arguments are comma-joined: a comma would split it
    doc = _tiny_doc(e2e)
    out = e2e.inference(doc, "tiny", dev="cpu", fuse=("qkv",))
    assert out["fused"] == 2 and all(r["fusions"] == ["qkv"] and "no_qkv_ms" in r for r in out["rows"])
    out = e2e.inference(doc, "tiny", dev="cpu", fuse=("swiglu",))
    assert out["fused"] == 2 and all(r["fusions"] == ["swiglu"] and "no_qkv_ms" not in r for r in out["rows"])


@pytest.mark.parametrize("argv, words", [
    (["--fusions", "qkv,mlp"], "some of swiglu, qkv, act"),
    (["--fusions", "qkv", "--fuse"], "not both"),
])
def test_bad_fusions_on_the_command_line_are_refused(e2e, capsys, argv, words):
    with pytest.raises(SystemExit):
        e2e.main(["run", "build/none", "--out", "e2e.json", *argv])
    assert words in capsys.readouterr().err
