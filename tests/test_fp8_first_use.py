"""``scaled_mm``'s measured choice at first use, on the CPU: a pack's (or a build's) fp8 kernel is timed
against ``torch._scaled_mm`` for per-tensor and rowwise scales, the faster computes the shape (eagerly
and under capture each its own), ``explain`` says so, the choice is remembered across processes, and
nothing is timed in strict mode, for block scales torch has no kernel for, under capture or when switched
off. The timing itself is ``first_use``'s (``tests/test_first_use.py``); on the GPU, ``benchmarks/gpu_session.sh``."""

import json

import pytest
import torch

from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.serve import first_use, front, scaled
from gemm_ladder.serve.front import ByCapture, Route

from .test_fp8_pack import _call, _module, _pack

M, N, K = 64, 48, 32


def _product(x, y, scale_a, scale_b):
    """The scaled product as both candidates compute it here (CPU stand-ins for e4m3 operands)."""
    return (x.float() @ y.float().T * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).to(torch.bfloat16)


class Ours:
    """A loaded fp8 module's stand-in: ``launcher`` as ``GemmModule.launcher`` (the operands by name,
    then positional extras in their order), counting its launches."""

    path = "ours.so"

    def __init__(self):
        self.launches = 0

    def launcher(self, a, b, out, **operands):
        names = list(operands)

        def launch(x, y, z, *extras):
            self.launches += 1
            ops = dict(zip(names, extras))
            z.copy_(_product(x, y, ops["scale_a"], ops["scale_b"]))
        return launch


class TorchStandIn(scaled.TorchScaledMM):
    """torch._scaled_mm's candidate on the CPU: the same call signature, the same product, counted."""

    launches = 0

    def __call__(self, a, b_nk, out=None, scale_a=None, scale_b=None, bias=None):
        TorchStandIn.launches += 1
        sa = scale_a.reshape(-1) if self.recipe == "row" else scale_a
        return out.copy_(_product(a, b_nk, sa, scale_b))


@pytest.fixture
def timed(tmp_path, monkeypatch):
    """First use switched on, its file in tmp_path, the GPU an H100, torch's candidate the stand-in."""
    monkeypatch.setenv(first_use.CHOICES_ENV, str(tmp_path / "choices.json"))
    monkeypatch.delenv(first_use.MEASURE_ENV, raising=False)
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})
    monkeypatch.setattr(first_use, "can_measure", lambda a: True)
    monkeypatch.setattr(scaled.device, "name_of", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(scaled, "_l2_bytes", lambda index: 1 << 16)  # a few input sets at these shapes
    monkeypatch.setattr(scaled, "outside_graph_pools", lambda make, index: make())
    monkeypatch.setattr(scaled, "TorchScaledMM", TorchStandIn)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # ByCapture's question, eagerly
    TorchStandIn.launches = 0
    return tmp_path / "choices.json"


def _fake_times(queued, kernels):
    """Stand-ins for first_use.time_launches and time_graphs: each candidate runs on every input set and
    must write the right D there (the output poisoned first), then gets its time from the tables."""
    timed = []

    def run_all(launches, sets):
        for fn in launches.values():
            for a, b, d in sets:
                d.fill_(float("nan"))
                fn(a, b, d)
                torch.testing.assert_close(d.float(), _product(a, b, SCALES[0], SCALES[1]).float())
        timed.append(sorted(launches))

    def time_launches(launches, sets, rounds=first_use.ROUNDS):
        run_all(launches, sets)
        return {label: queued[label] for label in launches}

    def time_graphs(launches, sets, queued_us, rounds=first_use.ROUNDS):
        run_all(launches, sets)
        return {label: kernels[label] for label in launches}
    return time_launches, time_graphs, timed


SCALES = (torch.tensor(0.5), torch.tensor(2.0))  # per-tensor scales, as quantize_fp8 makes them


def _inputs(seed=0):
    """e4m3 A [M, K] and B as scaled_mm takes it ([K, N], column-major: a weight's transpose), on the CPU."""
    torch.manual_seed(seed)
    return (torch.randn(M, K).to(torch.float8_e4m3fn), torch.randn(N, K).to(torch.float8_e4m3fn).t())


def _settle(route, recipe="tensor"):
    """The first call's timing on the caller's tensors (the whole call's checks run for each candidate)."""
    A, B = _inputs()
    scaled._settle(route, _call(M, N, K, recipe), A, B, *SCALES, None, 0, torch.bfloat16)
    return A, B


def _ours_route(recipe="tensor", strict=False):
    route = Route(Ours(), None, "kernel pack", "v9", {}, ["kernel: v9 fp8 (stand-in)"])
    return scaled._offer_torch(route, "f" * 64, _call(M, N, K, recipe), strict, torch.bfloat16)


def test_a_packs_fp8_module_is_offered_beside_torch_for_tensor_and_row_scales_only(tmp_path, no_gpu):
    folder = tmp_path / "pack"
    folder.mkdir()
    entries = [_module(folder, f"fp8_{r}.so", GemmSpec.fp8("bfloat16", r)) for r in ("row", "tensor", "block")]
    _pack(folder, entries)
    front.use_pack(folder)
    for recipe, entry in zip(("row", "tensor"), entries):
        route = scaled._resolve(_call(recipe=recipe), 0, False, torch.bfloat16)
        ids = {label: ident for label, (ident, _) in route.candidates.items()}
        assert ids == {"v9": entry["so_sha256"], "torch": "torch"}, ids
        assert not scaled._resolve(_call(recipe=recipe), 0, True, torch.bfloat16).candidates  # strict: ours only
    block = scaled.Call(64, 48, 256, "block", GemmSpec.fp8("bfloat16", "block"))
    assert not scaled._offer_torch(Route("m", None, "kernel pack", "v9", {}), "s", block, False, torch.bfloat16).candidates


@pytest.mark.parametrize("queued, kernels, eager, graphs", [
    ((10.0, 12.0), (10.0, 12.0), "v9", "v9"),
    ((12.0, 10.0), (12.0, 10.0), "torch", "torch"),  # torch's calls 1.2x faster
    ((10.1, 10.0), (9.9, 10.0), "v9", "v9"),
    # torch's calls within TORCH_EAGER_EDGE: ours eagerly (torch's host path is the longer), its kernel under capture
    ((10.8, 10.0), (10.8, 10.0), "v9", "torch")])
def test_the_faster_computes_the_shape_and_explain_says_so(timed, monkeypatch, queued, kernels, eager, graphs):
    launches, fake_graphs, calls = _fake_times(dict(zip(("v9", "torch"), queued)), dict(zip(("v9", "torch"), kernels)))
    monkeypatch.setattr(first_use, "time_launches", launches)
    monkeypatch.setattr(first_use, "time_graphs", fake_graphs)
    checked = []
    real_checked_call = scaled.checked_call
    monkeypatch.setattr(scaled, "checked_call", lambda *a, **k: checked.append(1) or real_checked_call(*a, **k))
    route = _ours_route()
    _settle(route)
    assert calls == [["torch", "v9"], ["torch", "v9"]] and not route.candidates
    assert len(checked) >= 2 * 2 * 2  # each candidate timed the whole way a call takes: checks, then the launch
    run = route.module.eager if isinstance(route.module, ByCapture) else route.module
    assert isinstance(run, TorchStandIn if eager == "torch" else Ours)
    assert isinstance(route.module, ByCapture) == (eager != graphs)
    assert route.lines[0] == ("kernel: torch._scaled_mm" if eager == "torch" else "kernel: v9 fp8 (stand-in)")
    assert f"chose {eager}" in route.lines[-1] and "measured at first use on NVIDIA H100 80GB HBM3" in route.lines[-1]
    if eager == "torch":
        assert "never slower than the library it replaces" in "\n".join(route.lines)
    # an eager call now runs the eager winner, into D
    A, B = _inputs(seed=1)
    D = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    before = TorchStandIn.launches
    scaled._launch(route, _call(M, N, K, "tensor"), A, B, *SCALES, None, D)
    torch.testing.assert_close(D.float(), _product(A, B.t(), *SCALES).float())
    assert (TorchStandIn.launches > before) == (eager == "torch")
    doc = json.loads(timed.read_text())["choices"]
    ids = {"torch": "torch", "v9": "f" * 64}
    assert list(doc.values()) == [f"{ids[eager]},{ids[graphs]}"] and "64x48x32" in next(iter(doc))


def test_ours_eagerly_and_torch_under_capture_where_each_measured_faster(timed, monkeypatch):
    # ours faster as queued calls (its shorter host path), torch's kernel faster in graphs
    launches, graphs, _ = _fake_times({"v9": 10.0, "torch": 11.5}, {"v9": 9.0, "torch": 8.0})
    monkeypatch.setattr(first_use, "time_launches", launches)
    monkeypatch.setattr(first_use, "time_graphs", graphs)
    route = _ours_route()
    _settle(route)
    assert isinstance(route.module, ByCapture)
    assert isinstance(route.module.eager, Ours) and isinstance(route.module.graphs, TorchStandIn)
    assert any(line.startswith(front.CAPTURE_LINE) and "torch._scaled_mm" in line for line in route.lines)


def test_a_new_process_takes_the_remembered_winner_without_timing(timed, monkeypatch):
    launches, graphs, calls = _fake_times({"v9": 12.0, "torch": 10.0}, {"v9": 12.0, "torch": 10.0})
    monkeypatch.setattr(first_use, "time_launches", launches)
    monkeypatch.setattr(first_use, "time_graphs", graphs)
    _settle(_ours_route())
    assert len(calls) == 2
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})  # a new process
    route = _ours_route()
    _settle(route)
    assert len(calls) == 2 and isinstance(route.module, TorchStandIn)
    assert "chosen at an earlier first use on NVIDIA H100 80GB HBM3" in route.lines[-1]
    # another module (a rebuilt pack: another sha256) is another key: timed again
    other = scaled._offer_torch(Route(Ours(), None, "kernel pack", "v9", {}, ["kernel: v9"]), "e" * 64,
                                _call(M, N, K, "tensor"), False, torch.bfloat16)
    _settle(other)
    assert len(calls) == 4


@pytest.mark.parametrize("how", ["capture", "off"])
def test_nothing_is_timed_under_capture_or_when_off(timed, monkeypatch, how):
    monkeypatch.setattr(first_use, "time_launches", lambda *a, **k: pytest.fail("timed"))
    if how == "capture":
        monkeypatch.setattr(first_use, "can_measure", lambda a: False)
    else:
        monkeypatch.setenv(first_use.MEASURE_ENV, "0")
    route = _ours_route()
    _settle(route)
    assert isinstance(route.module, Ours) and route.candidates  # ours serves; timed at a later eager call
    assert not timed.exists()
