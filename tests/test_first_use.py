"""The measured choice at first use (``serve.first_use``) on the CPU: which modules are candidates
for an M, how the winner is picked (torch only by a margin), that the front door's route becomes
the winner and says so, that the choice is remembered per GPU, M and candidates across processes,
and that nothing is timed under capture or when switched off. The timing itself runs on the GPU
(``benchmarks/m_range_check.py`` compares the measured choice with the best module)."""

import json
import warnings

import pytest
import torch

from gemm_ladder.serve import first_use, front, kernel_pack
from gemm_ladder.serve.kernel_pack import KernelPack
from gemm_ladder.serve.runtime import ModuleInputError

from .test_kernel_pack import _module, _pack


class Named:
    """A loaded module standing in for a kernel: computes D = A . B^T and counts its launches."""

    def __init__(self, path):
        self.path, self.launches = path, 0

    def __call__(self, a, b, out):
        self.launches += 1
        out.copy_((a.float() @ b.float().T).to(out.dtype))

    def launcher(self, a, b, out):
        """As a module's (``GemmModule.launcher``): B must be the weight it was built for."""
        if tuple(b.shape) != (256, 512):
            raise ModuleInputError(f"B has shape {tuple(b.shape)}; this module wants (256, 512)")
        return self


@pytest.fixture
def three(tmp_path, monkeypatch):
    """A pack of three modules of one weight (256x512) that serve M=128: one built for it, two
    runtime-M ones (chosen for M 100..200 and 1..64); the GPU's questions answered for an H100."""
    monkeypatch.delenv(kernel_pack.PACK_ENV, raising=False)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    monkeypatch.setenv(first_use.CHOICES_ENV, str(tmp_path / "choices.json"))
    monkeypatch.delenv(first_use.MEASURE_ENV, raising=False)
    monkeypatch.setattr(front, "TINY_FLOPS", 0)
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")
    monkeypatch.setattr(front.device, "name_of", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(front, "load", Named)
    monkeypatch.setattr(first_use, "can_measure", lambda a: True)
    monkeypatch.setattr(front, "_check", lambda A, B, out, bias=None: (  # CPU tensors stand in for the GPU's
        A.shape[0], B.shape[0], B.shape[1], A, out, (A.shape[0], B.shape[0])))
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})
    folder = tmp_path / "pack"
    folder.mkdir()
    mid = _module(folder, "mid.so", shape=(1, 256, 512), dynamic=True)
    mid["m_range"] = [100, 200]
    low = _module(folder, "low.so", shape=(1, 256, 512), dynamic=True)  # m_range 1..64
    front.reset()
    front.use_pack(_pack(folder, [_module(folder, "m128.so", shape=(128, 256, 512)), mid, low,
                                  _module(folder, "m64.so", shape=(64, 256, 512))]))
    yield folder
    front.reset()


def test_the_modules_that_serve_an_m_as_they_are_nearest_first(three):
    pack = KernelPack(three)
    assert [(f.entry["file"], f.fit) for f in pack.serving(128, 256, 512, "float16", "sm_90a")] == \
        [("m128.so", "exact"), ("mid.so", "tuned-range"), ("low.so", "any-m")]
    # a module built for another M does not serve as it is (it would need A copied into its rows)
    assert [f.entry["file"] for f in pack.serving(100, 256, 512, "float16", "sm_90a")] == ["mid.so", "low.so"]
    assert pack.serving(128, 256, 1024, "float16", "sm_90a") == []


@pytest.mark.parametrize("times, winner", [
    ({"a": 10.0, "b": 9.0, "torch": 9.5}, "b"),
    ({"a": 10.0, "torch": 9.9}, "a"),          # torch faster by less than the margin: ours (the shorter call)
    ({"a": 10.0, "torch": 9.0}, "torch"),
    ({"torch": 5.0}, "torch"),
])
def test_the_winner_and_torchs_margin(times, winner):
    assert first_use.pick(times) == winner


@pytest.mark.parametrize("times, winner", [
    ({"a": 36.7, "torch": 36.0}, "torch"),     # level (GPT-2's LM head at M = 1): the copies' host side decides
    ({"a": 10.0, "torch": 10.5}, "torch"),     # ours 5% faster: not enough to pay for the copies
    ({"a": 3700.0, "torch": 13100.0}, "a"),    # ours far ahead (the same head at M = 16384)
])
def test_a_call_with_copies_keeps_ours_only_well_ahead(times, winner):
    assert first_use.pick(times, copies=True) == winner
    assert first_use.pick(times) == ("a" if times["a"] < times["torch"] * first_use.TORCH_MARGIN else "torch")


def test_each_candidate_keeps_its_least_disturbed_round_in_rotating_order():
    order = []
    # torch's samples are disturbed for three rounds of five (a dropped clock, another thread): the
    # median would say 30 us and keep ours (20 us) though torch's call takes 16
    series = {"ours": iter([20.0, 21.0, 20.5, 20.0, 22.0]), "torch": iter([16.0, 30.0, 31.0, 33.0, 16.5])}

    def sampler(name):
        def sample():
            order.append(name)
            return next(series[name])
        return sample
    got = first_use._rounds({n: sampler(n) for n in series}, 5)
    assert got == {"ours": 20.0, "torch": 16.0}
    assert first_use.pick(got) == "torch"
    assert order[:4] == ["ours", "torch", "torch", "ours"]  # the order rotates round by round


def _times(table, kernels=None):
    """A stand-in for time_launches: each candidate's microseconds from ``table`` (by label); as
    kernels in graphs (time_graphs) from ``kernels``, else the same."""
    calls = []

    def fake(launches, sets, rounds=first_use.ROUNDS):
        for fn in launches.values():
            for a, b, d in sets:  # each candidate runs, right, on every input set
                d.fill_(float("nan"))
                fn(a, b, d)
                torch.testing.assert_close(d.float(), a.float() @ b.float().T, rtol=2e-3, atol=2e-3)
        calls.append(sorted(launches))
        return {label: table[label] for label in launches}
    return fake, calls


@pytest.fixture(autouse=True)
def graphs_like_calls(monkeypatch):
    """Kernels in graphs time as queued calls, unless a test says otherwise."""
    monkeypatch.setattr(first_use, "time_graphs", lambda launches, sets, queued_us, rounds=first_use.ROUNDS: dict(queued_us))
    monkeypatch.setattr(front, "_l2_bytes", lambda index: 1 << 20)  # 1 MiB: a few input sets at these shapes


def test_the_first_call_times_the_candidates_and_keeps_the_fastest(three, monkeypatch, capsys):
    fake, calls = _times({"m128.so": 30.0, "mid.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    D = front.matmul(A, B, explain=True)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert calls == [["low.so", "m128.so", "mid.so", "torch"]]
    route = front.route_of(128, 256, 512)
    assert route.module.path.name == "mid.so" and route.module_M is None and not route.candidates
    text = capsys.readouterr().err
    assert "measured at first use on NVIDIA H100 80GB HBM3" in text and "chose mid.so" in text
    assert text.index("mid.so 20.0 us") < text.index("torch 25.0 us") < text.index("m128.so 30.0 us")
    front.matmul(A, B)  # the second call: no timing
    assert len(calls) == 1
    doc = json.loads((three.parent / "choices.json").read_text())
    mid = KernelPack(three).serving(128, 256, 512, "float16", "sm_90a")[1].entry["so_sha256"]
    assert list(doc["choices"].values()) == [f"{mid},{mid}"]  # for eager calls, and in graphs


def test_a_new_process_takes_the_remembered_winner_without_timing(three, monkeypatch):
    fake, calls = _times({"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    front.matmul(A, B)
    assert front.route_of(128, 256, 512).rung == "torch" and len(calls) == 1  # torch 25 < 30 / 1.02
    front.reset()  # a new process: the file's choice, nothing timed
    front.use_pack(three)
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})
    monkeypatch.setattr(first_use, "time_launches", lambda *a, **k: pytest.fail("timed again"))
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    route = front.route_of(128, 256, 512)
    assert route.rung == "torch" and "chosen at an earlier first use" in route.lines[-1]
    # another GPU's name is another key: timed there
    monkeypatch.setattr(front.device, "name_of", lambda index: "NVIDIA H200")
    front.reset()
    front.use_pack(three)
    monkeypatch.setattr(first_use, "time_launches", fake)
    front.matmul(A, B)
    assert len(calls) == 2


def test_an_unreadable_choices_file_is_said_once_and_rewritten(three, monkeypatch):
    path = three.parent / "choices.json"
    path.write_text('{"choices": [1, 2')
    fake, _ = _times({"m128.so": 10.0, "mid.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    with pytest.warns(RuntimeWarning, match="cannot be read") as caught:
        front.matmul(A, B)
    assert len(caught) == 1 and "GEMM_LADDER_CHOICES=off" in str(caught[0].message)
    assert json.loads(path.read_text())["format"] == "gemm_ladder.choices"
    assert front.route_of(128, 256, 512).module.path.name == "m128.so"


@pytest.mark.parametrize("how", ["capture", "off", "strict"])
def test_nothing_is_timed_under_capture_when_off_or_torch_when_strict(three, monkeypatch, how):
    fake, calls = _times({"m128.so": 30.0, "mid.so": 20.0, "low.so": 50.0, "torch": 1.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    if how == "capture":
        monkeypatch.setattr(first_use, "can_measure", lambda a: False)
    if how == "off":
        monkeypatch.setenv(first_use.MEASURE_ENV, "0")
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    front.matmul(A, B, strict=how == "strict")
    route = front.route_of(128, 256, 512, strict=how == "strict")
    if how == "strict":  # ours only, never torch
        assert calls == [["low.so", "m128.so", "mid.so"]] and route.module.path.name == "mid.so"
    else:  # the pack's own choice, the candidates kept for a later eager call
        assert calls == [] and route.module.path.name == "m128.so" and route.candidates


def test_choices_can_stay_in_the_process(three, monkeypatch):
    monkeypatch.setenv(first_use.CHOICES_ENV, "off")
    fake, calls = _times({"m128.so": 30.0, "mid.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        front.matmul(torch.randn(128, 512).half(), torch.randn(256, 512).half())
    assert len(calls) == 1 and not (three.parent / "choices.json").exists()


def test_a_module_serving_outside_its_range_is_timed_against_torch_too(three, monkeypatch):
    """A runtime-only box, M = 300: no module was chosen for it (mid.so for 100..200 serves, within
    4x); the first call times it against the other and torch's, and torch may take it."""
    route = front.route_of(300, 256, 512)
    assert route.source == "kernel pack" and sorted(route.candidates) == ["low.so", "mid.so", "torch"]
    fake, _ = _times({"mid.so": 30.0, "low.so": 50.0, "torch": 20.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(300, 512).half(), torch.randn(256, 512).half()
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert route.rung == "torch" and "faster than every kernel of ours" in "\n".join(route.lines)


def _first_call(monkeypatch, queued, kernels, A, B):
    """Time the first call of A . B^T with ``queued`` (us as queued calls) and ``kernels`` (us in
    graphs) standing in for the measurements, outside capture; the route it leaves."""
    fake, _ = _times(queued)
    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(first_use, "time_graphs", lambda launches, sets, queued_us, rounds=3: dict(kernels))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    front.matmul(A, B)
    return front.route_of(A.shape[0], B.shape[0], B.shape[1])


def test_graphs_may_take_another_kernel_than_eager_calls(three, monkeypatch):
    """Ours has the shorter host path, cuBLAS's kernel may be the faster: eager calls run the
    queued winner, calls inside CUDA-graph capture the kernel winner; remembered both."""
    fake, _ = _times({"m128.so": 30.0, "mid.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(first_use, "time_graphs", lambda launches, sets, queued_us, rounds=3:
                        {"m128.so": 18.0, "mid.so": 17.0, "low.so": 40.0, "torch": 15.0})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    front.matmul(A, B)
    route = front.route_of(128, 256, 512)
    assert isinstance(route.module, front.ByCapture) and route.module.eager.path.name == "mid.so"
    assert isinstance(route.module.graphs, front.TorchMatmul)
    assert "under CUDA-graph capture: torch.matmul (cuBLAS)" in "\n".join(route.lines)
    for capturing, ran_ours in ((False, 1), (True, 0)):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        before = route.module.eager.launches
        D = torch.full((128, 256), float("nan")).half()
        route.run(A, B, D) if not capturing else route.module(A, B, D)
        torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
        assert route.module.eager.launches - before == ran_ours
    front.reset()  # a new process: both winners from the file
    front.use_pack(three)
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})
    monkeypatch.setattr(first_use, "time_launches", lambda *a, **k: pytest.fail("timed again"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    front.matmul(A, B)
    again = front.route_of(128, 256, 512)
    assert isinstance(again.module, front.ByCapture) and again.module.eager.path.name == "mid.so"


def test_the_routes_own_module_winning_only_in_graphs_is_kept_for_capture(three, monkeypatch):
    """torch's call the faster eagerly, the route's own module (m128.so, the pack's exact fit) the
    faster kernel: capture runs m128.so, eager calls torch (the route adopts torch's eager route and
    itself for graphs, and must read its own module before it takes torch's)."""
    route = _first_call(monkeypatch, {"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0},
                        {"m128.so": 10.0, "mid.so": 17.0, "low.so": 40.0, "torch": 15.0},
                        torch.randn(128, 512).half(), torch.randn(256, 512).half())
    assert isinstance(route.module, front.ByCapture) and isinstance(route.module.eager, front.TorchMatmul)
    assert route.module.graphs.path.name == "m128.so"
    assert any(line.startswith("under CUDA-graph capture: v") for line in route.lines), route.lines


def test_torch_eagerly_and_ours_in_graphs_is_remembered_for_the_fast_path(three, monkeypatch):
    """Where torch's call won eagerly and ours in graphs, a repeated call takes the fast path (the checked
    path ran torch on a route of its own, which left nothing to remember: every eager call was checked
    again, 0.78x F.linear at 16x128256x2048 on an H200): torch's kernel eagerly, m128.so under capture."""
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    fake, _ = _times({"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(first_use, "time_graphs", lambda launches, sets, queued_us, rounds=3:
                        {"m128.so": 10.0, "mid.so": 17.0, "low.so": 40.0, "torch": 15.0})
    state = {"capturing": False}  # the question a remembered launch asks at each call
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    front.matmul(A, B, out=torch.empty(128, 256).half())  # measured, checked and remembered
    route = front.route_of(128, 256, 512)
    assert isinstance(route.module, front.ByCapture) and isinstance(route.module.eager, front.TorchMatmul)

    def checked(*args, **kwargs):
        raise AssertionError("the checked path ran for a repeated call")

    monkeypatch.setattr(front, "launch_route", checked)
    mine = route.module.graphs
    for capturing, ours in ((False, 0), (True, 1)):
        state["capturing"] = capturing
        before = mine.launches
        A2, D = torch.randn(128, 512).half(), torch.full((128, 256), float("nan")).half()
        assert front.matmul(A2, B, out=D) is D
        torch.testing.assert_close(D.float(), A2.float() @ B.float().T, rtol=2e-3, atol=2e-3)
        assert mine.launches - before == ours, capturing


def test_a_split_calls_queued_time_is_its_fast_launchs_and_torch_eagerly_reads_the_weight_whole(three, monkeypatch):
    """N = 257 (split): first use times ours as queued calls through the fast path's launch (its host
    side, as a repeated call pays it) and in graphs the whole checked way; where torch's call wins
    eagerly, a repeated call is F.linear on the tensors as they are (no split)."""
    seen = {}

    def fake(launches, sets, rounds=first_use.ROUNDS):
        seen.update({label: type(fn).__name__ for label, fn in launches.items()})
        return {"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0}

    graphed = {}

    def graphs(launches, sets, queued_us, rounds=3):
        graphed.update({label: type(fn).__name__ for label, fn in launches.items()})
        return {"m128.so": 10.0, "mid.so": 17.0, "low.so": 40.0, "torch": 15.0}

    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(first_use, "time_graphs", graphs)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    A, B = torch.randn(128, 512).half(), torch.randn(257, 512).half()
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert {seen[k] for k in ("m128.so", "mid.so", "low.so")} == {"PaddedLaunch"} and seen["torch"] == "function"
    assert set(graphed.values()) == {"function"}
    route = front.route_of(128, 257, 512)
    assert isinstance(route.module, front.ByCapture) and isinstance(route.module.eager, front.TorchMatmul)
    launches = route.module.graphs.launches
    for _ in range(2):  # checked, then the fast path: torch's F.linear on the whole weight
        A = torch.randn(128, 512).half()
        torch.testing.assert_close(front.matmul(A, B).float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert route.module.graphs.launches == launches


def test_a_split_call_in_graphs_where_torchs_kernel_won_runs_torch_on_the_whole_weight(three, monkeypatch):
    """N = 257 (split), ours the faster call and torch's the faster kernel: inside capture the
    checked path hands torch the tensors as they are (ours, bound to the split weight, never sees
    the whole one), and ours runs eagerly."""
    B = torch.randn(257, 512).half()
    route = _first_call(monkeypatch, {"m128.so": 10.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0},
                        {"m128.so": 18.0, "mid.so": 17.0, "low.so": 40.0, "torch": 15.0}, torch.randn(128, 512).half(), B)
    assert isinstance(route.module, front.ByCapture) and isinstance(route.module.graphs, front.TorchMatmul)
    mine = route.module.eager
    for capturing, ours in ((True, 0), (False, 1)):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        monkeypatch.setattr(front, "_capturing", lambda a, c=capturing: c)
        before = mine.launches
        A = torch.randn(128, 512).half()
        torch.testing.assert_close(front.matmul(A, B).float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
        assert mine.launches - before == ours


def test_a_tiny_problem_timed_keeps_what_measured_faster_in_graphs(three, monkeypatch):
    """The tiny rule (torch's kernel in graphs) stands where nothing is timed; once timed, the
    measurement decides, and explain no longer says the rule."""
    monkeypatch.setattr(front, "TINY_FLOPS", 2e9)
    route = front.route_of(128, 256, 512)
    assert isinstance(route.module, front.ByCapture) and "under CUDA-graph capture" in "\n".join(route.lines)
    fake, _ = _times({"m128.so": 10.0, "mid.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    front.matmul(torch.randn(128, 512).half(), torch.randn(256, 512).half())
    assert route.module.path.name == "m128.so" and not isinstance(route.module, front.ByCapture)
    assert "under CUDA-graph capture" not in "\n".join(route.lines)


def test_input_sets_spill_l2_twice_over_and_keep_one_weight_on_the_padded_path():
    a, b, d = torch.zeros(64, 512).half(), torch.zeros(256, 512).half(), torch.zeros(64, 256).half()
    size = a.nbytes + b.nbytes + d.nbytes  # 352 KiB a set
    sets = first_use.input_sets(a, b, d, l2_bytes=1 << 20)
    assert len(sets) == -(-2 * (1 << 20) // size) == 6 and sets[0] == (a, b, d)
    assert len({t.data_ptr() for s in sets for t in s}) == 3 * len(sets)  # every set its own tensors
    assert len(first_use.input_sets(a, b, d, l2_bytes=1 << 30)) == first_use.MAX_SETS
    assert len(first_use.input_sets(a, b, d, l2_bytes=1)) == 1
    same = first_use.input_sets(a, b, d, l2_bytes=1 << 20, same_b=True)
    assert all(s[1] is b for s in same) and len(same) == min(first_use.MAX_SETS, -(-2 * (1 << 20) // (a.nbytes + d.nbytes)))


@pytest.mark.parametrize("N, K", [(256, 508), (257, 512)])
def test_the_padded_path_is_timed_the_whole_way_against_torch(three, monkeypatch, N, K):
    """K = 508 (padded to 512 for TMA), or N = 257 (split: the 256-row modules on the weight's first
    rows, torch's matmul on the last): ours is timed with its copies and its torch part, torch on
    the tensors as they are; the key holds the call's own shape, so 256x512 is timed apart."""
    fake, calls = _times({"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, K).half(), torch.randn(N, K).half()
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert calls == [["low.so", "m128.so", "mid.so", "torch"]]
    assert front.route_of(128, N, K).rung == "torch"
    keys = list(json.loads((three.parent / "choices.json").read_text())["choices"])
    assert keys == [k for k in keys if f"|128x{N}x{K}|" in k] and len(keys) == 1


# -- alternatives (kernel_pack: "alternative": true beside a sub-wave choice) --------------------
@pytest.fixture
def with_alternatives(three, monkeypatch):
    """A pack of one weight (256x512) whose choice for M 100..200 (main.so) has two alternatives
    (split K) beside it, and two other runtime-M modules that also serve M = 128 outside their range."""
    folder = three.parent / "alts"
    folder.mkdir()
    entries = []
    for name, rng, alt in (("far.so", [1000, 2000], False), ("alt1.so", [100, 200], True), ("low.so", [1, 64], False),
                           ("alt2.so", [100, 200], True), ("main.so", [100, 200], False)):
        e = _module(folder, name, rung="v10" if alt else "v9", shape=(1, 256, 512), dynamic=True)
        e.update(m_range=rng, m_values=[rng[1]])
        entries.append({**e, "alternative": True} if alt else e)
    front.reset()
    front.use_pack(_pack(folder, entries))
    yield folder
    front.reset()


def test_the_alternatives_are_timed_beside_the_choice(with_alternatives):
    """The choice is always a candidate, its alternatives next, within MAX_CANDIDATES of ours;
    a module farther from M is left out first."""
    route = front.route_of(128, 256, 512)
    ours = [label for label in route.candidates if label != first_use.TORCH]
    assert route.module.path.name == "main.so" and ours[0] == "main.so"
    assert len(ours) == first_use.MAX_CANDIDATES and {"alt1.so", "alt2.so"} <= set(ours) and "far.so" not in ours
    assert first_use.TORCH in route.candidates


def test_explain_names_an_alternative_that_won(with_alternatives, monkeypatch, capsys):
    fake, calls = _times({"main.so": 40.0, "alt1.so": 30.0, "alt2.so": 20.0, "low.so": 50.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    D = front.matmul(A, B, explain=True)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    route = front.route_of(128, 256, 512)
    assert route.module.path.name == "alt2.so" and route.rung == "v10"
    text = capsys.readouterr().err
    assert "chose alt2.so" in text and "alt2.so (M at run time" in text
    assert "an alternative to the policy's choice, offered for the timing at first use" in text


def test_without_the_measurement_the_choice_serves_not_an_alternative(with_alternatives, monkeypatch):
    monkeypatch.setenv(first_use.MEASURE_ENV, "0")
    fake, calls = _times({})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    front.matmul(A, B)
    assert calls == [] and front.route_of(128, 256, 512).module.path.name == "main.so"


def test_torchs_candidate_is_timed_as_its_repeated_call_runs(three, monkeypatch):
    """torch's candidate is timed the way its repeated call runs (the fast path's torch_linear), not
    through launch_route, whose checks and allocations made it look slower as a queued call than it
    is (first use then kept a kernel of ours that cuBLAS beat)."""
    fake, calls = _times({"m128.so": 30.0, "mid.so": 40.0, "low.so": 50.0, "torch": 20.0})
    timing, routed = [], []
    real = front.launch_route

    def timed(launches, sets, rounds=first_use.ROUNDS):
        timing.append(True)
        try:
            return fake(launches, sets, rounds)
        finally:
            timing.pop()

    def launch_route(route, *args, **kwargs):
        if timing:
            routed.append(route.rung)
        return real(route, *args, **kwargs)

    monkeypatch.setattr(first_use, "time_launches", timed)
    monkeypatch.setattr(front, "launch_route", launch_route)
    A, B = torch.randn(128, 512).half(), torch.randn(256, 512).half()
    D = front.matmul(A, B)
    torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert calls == [["low.so", "m128.so", "mid.so", "torch"]]  # every candidate ran right on every set
    assert "torch" not in routed
    assert front.route_of(128, 256, 512).rung == "torch"


def test_the_helper_thread_times_with_gradients_off(monkeypatch):
    """First use times on a helper thread (runtime.outside_graph_pools), whose grad mode starts on
    whatever the caller's. A backward pass calls with grad mode off and saved inputs that require
    grad: torch's candidate, ``torch.mm(..., out=)``, must run there as it does in the caller (with
    grad mode on, autograd refused it and first use dropped torch from the timing)."""
    import contextlib
    import types

    from gemm_ladder.serve import runtime

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # the CPU stands in
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None))
    x = torch.randn(4, 8, requires_grad=True)
    out = torch.empty(4, 4)
    with torch.no_grad():  # as autograd's engine runs a backward
        got = runtime.outside_graph_pools(lambda: torch.mm(x, x.t(), out=out), 0)
    assert got is out
    torch.testing.assert_close(out, (x @ x.t()).detach())


def test_a_padded_call_level_with_torch_goes_to_torch(three, monkeypatch):
    """A weight of K = 508 is padded to the modules' 512 (the padded path: copies on the way). Ours
    timed 5% ahead of torch keeps ours for the unpadded weight, but not for the padded one, whose
    call pays the copies' host side (first_use.COPIES_EDGE)."""
    fake, _ = _times({"m128.so": 30.0, "mid.so": 19.5, "low.so": 50.0, "torch": 20.5})
    monkeypatch.setattr(first_use, "time_launches", fake)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # the CPU stands in
    for M, K in ((128, 508), (150, 512)):  # two Ms: two routes of the one 256x512 weight
        A, B = torch.randn(M, K).half(), torch.randn(256, K).half()
        D = front.matmul(A, B)
        torch.testing.assert_close(D.float(), A.float() @ B.float().T, rtol=2e-3, atol=2e-3)
    assert front.route_of(128, 256, 512).rung == "torch"
    assert front.route_of(150, 256, 512).module.path.name == "mid.so"


def test_kernels_in_graphs_pick_the_fastest_outright():
    """In a graph no host path favours ours: torch 1% faster as a kernel is torch's, while the same
    times as queued calls keep ours (TORCH_MARGIN)."""
    times = {"a": 10.0, "torch": 9.9}
    assert first_use.pick(times, graphs=True) == "torch"
    assert first_use.pick(times) == "a"
    assert first_use.pick({"a": 9.9, "torch": 10.0}, graphs=True) == "a"


@pytest.mark.parametrize("queued, kernels, winner", [
    ({"a": 28.1, "torch": 28.0}, {"a": 25.1, "torch": 22.9}, "torch"),  # a tie as calls, torch the faster kernel
    ({"a": 78.8, "torch": 83.7}, {"a": 81.6, "torch": 77.7}, "torch"),  # ours 6% ahead as calls only
    ({"a": 8.8, "torch": 15.5}, {"a": 6.2, "torch": 3.5}, "a"),  # host-bound: ours 43% ahead as calls
    ({"a": 30.4, "torch": 32.9}, {"a": 26.0, "torch": 26.4}, "a"),  # ahead both ways
    ({"a": 30.4, "torch": 32.9}, None, "a"),  # no graphs timed: the calls alone
])
def test_a_near_tie_as_calls_goes_to_the_faster_kernel(queued, kernels, winner):
    """Eager picks: ours QUEUED_CLEAR ahead as queued calls wins; closer than that, our kernel must
    be no slower than cuBLAS's in graphs too, else torch (whose repeated call is aten::linear from
    the C++ table). Calls with copies keep their own edge."""
    assert first_use.pick(queued, kernels=kernels) == winner
    assert first_use.pick(queued, copies=True, kernels=kernels) == first_use.pick(queued, copies=True)


@pytest.mark.parametrize("queued, kernels, copies, winner", [
    ({"v9": 44.6, "v11": 46.3, "torch": 59.4}, {"v9": 35.2, "v11": 25.8, "torch": 54.9}, True, "v11"),  # GPT-2's head
    ({"v9": 44.6, "v11": 52.0, "torch": 90.0}, {"v9": 35.2, "v11": 25.8, "torch": 54.9}, False, "v9"),  # 17% apart
    ({"v9": 20.0, "v11": 21.0}, {"v9": 12.0, "v11": 12.5}, False, "v9"),  # the faster both ways
    ({"v9": 20.0, "v11": 21.0}, None, False, "v9"),  # no graphs timed: the calls alone
])
def test_a_near_tie_between_kernels_of_ours_goes_to_the_faster_kernel(queued, kernels, copies, winner):
    """Of our candidates within QUEUED_CLEAR of our fastest as queued calls (host-bound launches), the one
    faster in graphs; further apart, the calls decide."""
    assert first_use.pick(queued, copies=copies, kernels=kernels) == winner


@pytest.mark.parametrize("queued, kernels, winner", [
    # GPT-2's LM head at M = 7 (COPIES_SHARED): v11's kernel, at v9's queued time against torch's (56.2 x 1.1 < 62.2)
    ({"v9": 56.2, "torch": 62.2, "v11": 65.4}, {"v11": 25.8, "v9": 42.6, "torch": 54.8}, "v11"),
    ({"v9": 44.6, "v11": 52.0, "torch": 90.0}, {"v9": 35.2, "v11": 25.8, "torch": 54.9}, "v11"),  # 17% apart
    # our least queued time not COPIES_EDGE ahead of torch's: torch, whichever kernel of ours is fastest
    ({"v9": 58.0, "torch": 62.2, "v11": 65.4}, {"v11": 25.8, "v9": 42.6, "torch": 54.8}, "torch"),
    ({"v9": 56.2, "v11": 65.4, "torch": 62.2}, None, "v9"),  # no graphs timed: the calls alone
])
def test_a_call_with_copies_takes_our_fastest_kernel(queued, kernels, winner):
    """With copies on the way every module of ours runs the same copies and host path: the fastest kernel of ours,
    whose call is taken to cost our least queued time, against torch with COPIES_EDGE."""
    assert first_use.pick(queued, copies=True, kernels=kernels) == winner


_TIME_GRAPHS = first_use.time_graphs  # the real one (graphs_like_calls stands in for it in each test)


class _Event:
    """torch.cuda.Event on the CPU: every span lasts 100 ms."""

    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):  # pylint: disable=unused-argument
        return 100.0


def test_every_candidate_is_timed_in_graphs_of_the_same_length(monkeypatch):
    """Each graph holds as many calls as the fastest candidate's sample, whatever its own queued
    time: a replay's launch cost spread over fewer calls made a slower-queued candidate (torch's)
    look slower as a kernel than it is."""
    import contextlib
    import types

    captured, counting = {}, []

    class Graph:
        def replay(self):
            pass

    @contextlib.contextmanager
    def graph(g):
        counting.append(0)
        yield
        captured[g] = counting.pop()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Event", _Event)

    def call(a, b, d):  # pylint: disable=unused-argument
        counting[-1] += 1

    calls = {"ours": call, "torch": call, "slow": call}
    sets = [(types.SimpleNamespace(),) * 3] * 2
    got = _TIME_GRAPHS(calls, sets, {"ours": 10.0, "torch": 27.0, "slow": 600.0}, rounds=2)
    assert set(got) == set(calls)
    assert sorted(captured.values()) == [first_use._reps(10.0, 2)] * 3  # pylint: disable=protected-access
    assert first_use._reps(10.0, 2) > first_use._reps(27.0, 2)  # the counts would have differed


def test_every_candidate_is_timed_in_bursts_of_the_same_length(monkeypatch):
    """Queued calls too: each candidate's burst as long as the fastest's, so the first call's
    latency is spread over as many calls for every candidate, after a warm-up of its own."""
    import types

    monkeypatch.setattr(torch.cuda, "Event", _Event)  # 100 ms a span: the warm-up ends at its first look
    counts = {"ours": 0, "torch": 0}

    def counter(name):
        def call(a, b, d):  # pylint: disable=unused-argument
            counts[name] += 1
        return call

    calls = {n: counter(n) for n in counts}
    rough = {calls["ours"]: 10.0, calls["torch"]: 27.0}
    monkeypatch.setattr(first_use, "_rough", lambda call, sets: rough[call])
    sets = [(types.SimpleNamespace(),) * 3] * 2
    first_use.time_launches(calls, sets, rounds=1)
    reps = first_use._reps(10.0, 2)  # pylint: disable=protected-access
    assert reps > first_use._reps(27.0, 2)  # pylint: disable=protected-access
    # each candidate warmed by its own calls (16: the warm-up's first look), torch's too (timed cold, its queued
    # calls ran 1.2-1.7x their later time on an H200)
    assert counts == {"ours": 16 + reps, "torch": 16 + reps}
