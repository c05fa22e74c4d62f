"""The front door's fast path and first-use timing for epilogue calls (issue 31), on the CPU.

A repeated call with an activation, alpha, a residual (in place or not) or a float32 D takes the
key lookup, the address checks and the launch alone, as a plain call does; a changed activation,
residual layout or dtype misses the key; an overlap the checked path refuses is refused on the
repeated call too. ``swiglu`` remembers its calls the same way. The first call of an epilogue
times our modules of its spec against torch's unfused path for that epilogue (TorchMatmul, as its
repeated call runs it), and the choice is kept per spec.

As in test_fast_views, the checked path's two GPU-bound steps (the device checks of ``_check`` and
the route lookup of ``_route``) get CPU stand-ins; everything between them is the front door's."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gemm_ladder.core.spec import GemmSpec, spec_for, torch_activation
from gemm_ladder.serve import first_use, front, kernel_pack
from gemm_ladder.serve.runtime import ModuleInputError

from .test_kernel_pack import _module, _pack


@pytest.fixture(autouse=True)
def fresh():
    front.reset()
    yield
    front.reset()


def reference(A, B, bias=None, act="none", alpha=1.0, C=None, beta=1.0):
    """act(alpha A . B^T + bias) + beta C in float64."""
    z = alpha * (A.double() @ B.double().T)
    if bias is not None:
        z = z + bias.double()
    z = torch_activation(z, act)
    return z if C is None else z + beta * C.double()


class Epilogued:
    """A module of ``spec``: its launcher records what it is handed and computes the spec's
    epilogue from the extras in the spec's order (bias, alpha, C, beta), as the kernel would."""

    def __init__(self, spec: GemmSpec):
        self.spec, self.calls, self.made = spec, [], 0

    def launcher(self, a, b, d, **operands):  # pylint: disable=unused-argument
        self.made += 1
        names = [op.name for op in self.spec.epilogue_operands()]

        def launch(x, y, z, *extras):
            got = dict(zip(names, extras))
            self.calls.append((x, y, z, got))
            if self.spec.gated:
                h = x.double() @ y.double().T
                gate, up = h.chunk(2, dim=-1)
                z.copy_((F.silu(gate) * up).to(z.dtype))
                return
            assert got.get("bias") is None or got["bias"].dtype == getattr(torch, self.spec.bias)
            z.copy_(reference(x, y, got.get("bias"), self.spec.act, got.get("alpha", 1.0), got.get("C"),
                              got.get("beta", 1.0)).to(z.dtype))
        return launch


@pytest.fixture
def cpu_gpu(monkeypatch):
    """The checked path with the CPU as its "GPU": ``_check`` with every check but the device's,
    ``_route`` an Epilogued module of the call's spec. Returns the count of checked calls and the
    modules by spec."""
    seen = {"checked": 0, "modules": {}}

    def check(A, B, out, bias=None, residual=None, d_dtype=None):
        seen["checked"] += 1
        M, N, K, shape = front.check_shapes(A, B, out, bias, d_dtype)
        if residual is not None:
            front.check_residual(residual, shape, d_dtype or A.dtype, A, B, out, bias)
        return M, N, K, A.reshape(M, K), (out.view(M, N) if out is not None else None), shape

    def route(M, N, K, dtype, index, strict=False, spec=None):  # pylint: disable=unused-argument
        spec = spec or GemmSpec.default(dtype)
        if spec not in seen["modules"]:
            seen["modules"][spec] = front.Route(Epilogued(spec), None, "test", "v9", {})
        return seen["modules"][spec], True

    monkeypatch.setattr(front, "_check", check)
    monkeypatch.setattr(front, "_route", route)
    return seen


def r(*shape, dtype=torch.float16):
    return torch.randn(shape).to(dtype)


def close(D, want, dtype=torch.float16):
    tol = 2e-3 if dtype in (torch.float16, torch.float32) else 2e-2
    torch.testing.assert_close(D.double(), want, rtol=tol, atol=tol * 4)


def test_a_repeated_bias_gelu_call_takes_the_fast_path_with_its_own_bias(cpu_gpu):
    A, B = r(32, 16), r(24, 16)
    for _ in range(3):
        bias = r(24)
        D = front.matmul(A, B, bias=bias, activation="gelu_tanh")
        close(D, reference(A, B, bias, "gelu_tanh"))
    assert cpu_gpu["checked"] == 1
    mod = cpu_gpu["modules"][GemmSpec.with_epilogue(bias=True, act="gelu_tanh")].module
    assert len(mod.calls) == 3 and mod.made == 1 and mod.calls[-1][3]["bias"] is bias


@pytest.mark.parametrize("in_place", [False, True])
def test_a_repeated_residual_call_takes_the_fast_path_with_this_calls_scalars(cpu_gpu, in_place):
    """D = relu(alpha A.B^T + bias) + beta C, into a separate out or into C itself: the values of
    alpha and beta are this call's (runtime scalars of one module), C this call's."""
    A, B, bias = r(2, 16, 16), r(24, 16), r(24)
    for alpha, beta in ((0.5, 1.0), (0.25, -2.0), (3.0, 0.5)):
        C = r(2, 16, 24)
        want = reference(A.reshape(32, 16), B, bias, "relu", alpha, C.reshape(32, 24), beta).reshape(2, 16, 24)
        out = C if in_place else torch.full((2, 16, 24), float("nan")).half()
        D = front.matmul(A, B, bias=bias, activation="relu", alpha=alpha, residual=C, beta=beta, out=out)
        assert D is out
        close(D, want)
    assert cpu_gpu["checked"] == 1
    mod = cpu_gpu["modules"][GemmSpec.with_epilogue(bias=True, act="relu", alpha=True, residual=True)].module
    got = mod.calls[-1][3]
    assert got["alpha"] == 3.0 and got["beta"] == 0.5 and got["C"].data_ptr() == C.data_ptr()


def test_a_residual_call_without_out_returns_a_new_d(cpu_gpu):
    A, B = r(32, 16), r(24, 16)
    for _ in range(2):
        C = r(32, 24)
        D = front.matmul(A, B, residual=C)
        assert D.data_ptr() != C.data_ptr()
        close(D, reference(A, B, C=C))
    assert cpu_gpu["checked"] == 1


def test_a_repeated_float32_out_call_takes_the_fast_path_with_its_bias_in_float32(cpu_gpu):
    A, B = r(32, 16, dtype=torch.bfloat16), r(24, 16, dtype=torch.bfloat16)
    for i in range(3):
        bias = r(24, dtype=torch.bfloat16)
        out = torch.full((32, 24), float("nan")) if i else None  # without out, then into one
        D = front.matmul(A, B, bias=bias, out_dtype=torch.float32, out=out)
        assert D.dtype == torch.float32 and (out is None or D is out)
        close(D, reference(A, B, bias), torch.float32)
    assert cpu_gpu["checked"] == 2  # one key without out, one with
    spec = GemmSpec(a="bfloat16", b="bfloat16", d="float32", bias="float32")
    assert cpu_gpu["modules"][spec].module.calls[-1][3]["bias"].dtype == torch.float32


def test_a_changed_activation_residual_layout_or_dtype_misses_the_key(cpu_gpu):
    M, N, K = 32, 24, 16
    A, B, bias = r(M, K), r(N, K), r(N)
    front.matmul(A, B, bias=bias, activation="gelu_tanh", residual=r(M, N))
    assert cpu_gpu["checked"] == 1
    for extra in ({"activation": "gelu_erf", "residual": r(M, N)},   # another activation
                  {"activation": "gelu_tanh"},                         # no residual
                  {"activation": "gelu_tanh", "residual": r(M, N), "alpha": 2.0},  # alpha now in the spec
                  {"activation": "gelu_tanh", "residual": r(M, N), "out_dtype": torch.float32,
                   "bias": None}):                                     # a float32 D
        before = cpu_gpu["checked"]
        if extra.get("out_dtype") is not None:
            extra["residual"] = r(M, N, dtype=torch.float32)  # D's dtype
        args = {"bias": bias, **extra}
        D = front.matmul(A, B, **args)
        assert cpu_gpu["checked"] == before + 1, extra
        close(D, reference(A, B, args["bias"], args["activation"], args.get("alpha", 1.0), args.get("residual")))
    before = cpu_gpu["checked"]
    with pytest.raises(ModuleInputError, match="residual is not contiguous"):  # a strided residual: checked, refused
        front.matmul(A, B, bias=bias, activation="gelu_tanh", residual=r(N, M).t())
    with pytest.raises(ModuleInputError, match="residual has dtype torch.bfloat16"):
        front.matmul(A, B, bias=bias, activation="gelu_tanh", residual=r(M, N, dtype=torch.bfloat16))
    bf = (r(M, K, dtype=torch.bfloat16), r(N, K, dtype=torch.bfloat16), r(N, dtype=torch.bfloat16))
    front.matmul(*bf[:2], bias=bf[2], activation="gelu_tanh", residual=r(M, N, dtype=torch.bfloat16))
    assert cpu_gpu["checked"] == before + 3


def test_overlaps_are_refused_on_the_repeated_call(cpu_gpu):
    """Once a residual call is remembered, a C over A or over the bias, a C partly over out, and
    an out over A are refused as the checked path refuses them; C = out itself is not."""
    M, N, K = 16, 24, 16
    A, B, bias = r(M, K), r(N, K), r(N)
    C, out = r(M, N), r(M, N)
    front.matmul(A, B, bias=bias, residual=C, out=out, beta=0.5)
    flat = r(2 * M * N + 64)
    cases = [({"residual": flat[:M * N].view(M, N), "A": flat[M * N - 64:M * N - 64 + M * K].view(M, K)},
              "residual overlaps A"),
             ({"residual": flat[8:8 + M * N].view(M, N), "out": flat[:M * N].view(M, N)}, "partly overlaps out"),
             ({"out": flat[:M * N].view(M, N), "A": flat[M * N - 64:M * N - 64 + M * K].view(M, K)}, "out overlaps A"),
             ({"residual": flat[:M * N].view(M, N), "bias": flat[M * N - 8:M * N + 16]}, "residual overlaps bias")]
    for given, match in cases:
        args = {"A": A, "bias": bias, "residual": r(M, N), "out": r(M, N), **given}
        before = cpu_gpu["checked"]
        with pytest.raises(ModuleInputError, match=match):
            front.matmul(args["A"], B, bias=args["bias"], residual=args["residual"], out=args["out"], beta=0.5)
        assert cpu_gpu["checked"] == before + 1  # the fast path left it to the checks
    before = cpu_gpu["checked"]
    C = r(M, N)
    want = reference(A, B, bias, C=C, beta=0.5)
    assert front.matmul(A, B, bias=bias, residual=C, out=C, beta=0.5) is C  # in place: fast, right
    close(C, want)
    with pytest.raises(ModuleInputError, match="residual requires grad"):
        front.matmul(A, B, bias=bias, residual=r(M, N).requires_grad_(), out=r(M, N), beta=0.5)
    assert cpu_gpu["checked"] == before + 1


def test_a_scalar_that_is_no_python_number_takes_the_checked_path(cpu_gpu):
    A, B = r(32, 16), r(24, 16)
    front.matmul(A, B, alpha=0.5)
    front.matmul(A, B, alpha=0.5)
    assert cpu_gpu["checked"] == 1
    with pytest.raises(ModuleInputError, match="alpha must be a Python float"):
        front.matmul(A, B, alpha=torch.tensor(0.5))
    with pytest.raises(ModuleInputError, match="alpha=inf is not finite"):
        front.matmul(A, B, alpha=float("inf"))
    assert cpu_gpu["checked"] == 1  # refused before the checks of the shapes


# -- torch's route for an epilogue, on the fast path ---------------------------------------------------
@pytest.fixture
def torch_route(monkeypatch, cpu_gpu):
    routes = {}

    def route(M, N, K, dtype, index, strict=False, spec=None):  # pylint: disable=unused-argument
        spec = spec or GemmSpec.default(dtype)
        if spec not in routes:
            routes[spec] = front.Route(front.TorchMatmul(spec.act), None, "torch fallback", "torch", {})
        return routes[spec], True

    monkeypatch.setattr(front, "_route", route)
    return routes


def test_torchs_route_repeats_the_epilogue(cpu_gpu, torch_route):
    """Where torch computes an epilogue call (the fallback, or measured faster), the repeated call
    is torch's unfused path with this call's operands: alpha, C, beta and a float32 D included."""
    A, B, bias = r(32, 16, dtype=torch.bfloat16), r(24, 16, dtype=torch.bfloat16), r(24, dtype=torch.bfloat16)
    for _ in range(2):
        C = r(32, 24, dtype=torch.bfloat16)
        want = reference(A, B, bias, "silu", 0.5, C, 2.0)
        D = front.matmul(A, B, bias=bias, activation="silu", alpha=0.5, residual=C, beta=2.0, out=C)
        assert D is C
        close(D, want, torch.bfloat16)
    for _ in range(2):
        D = front.matmul(A, B, out_dtype=torch.float32)  # a float32 D, nothing else: torch's own float32 product
        assert D.dtype == torch.float32
        close(D, reference(A, B), torch.float32)
    assert cpu_gpu["checked"] == 2 and sum(rt.calls for rt in torch_route.values()) == 4


def test_torchs_in_place_residual_is_right_on_the_fast_path(cpu_gpu, torch_route):
    A, B = r(32, 16), r(24, 16)
    for _ in range(2):
        C = r(32, 24)
        want = reference(A, B, act="gelu_erf", alpha=0.5, C=C, beta=2.0)
        assert front.matmul(A, B, activation="gelu_erf", alpha=0.5, residual=C, beta=2.0, out=C) is C
        close(C, want)
    assert cpu_gpu["checked"] == 1


# -- SwiGLU ---------------------------------------------------------------------------------------------
def test_a_repeated_swiglu_call_takes_the_fast_path(cpu_gpu):
    x, W = r(2, 16, 32), r(48, 32)
    for i in range(3):
        out = torch.full((2, 16, 24), float("nan")).half() if i == 2 else None
        Y = front.swiglu(x, W, out=out)
        h = x.double() @ W.double().T
        close(Y, F.silu(h[..., :24]) * h[..., 24:])
        assert out is None or Y is out
    assert cpu_gpu["checked"] == 2  # one key without out, one with
    mod = cpu_gpu["modules"][spec_for("float16", "swiglu")].module
    assert len(mod.calls) == 3 and mod.calls[-1][0].data_ptr() == x.data_ptr()
    flat = r(2 * 16 * 32 + 16 * 24)
    xs = flat[:2 * 16 * 32].view(2, 16, 32)
    front.swiglu(xs, W, out=r(2, 16, 24))
    before = cpu_gpu["checked"]
    with pytest.raises(ModuleInputError, match="out overlaps x"):
        front.swiglu(xs, W, out=flat[16 * 32:16 * 32 + 2 * 16 * 24].view(2, 16, 24))
    assert cpu_gpu["checked"] == before  # swiglu's own overlap check, before _check


# -- first use (the pattern of test_first_use) ----------------------------------------------------------
class Kernel:
    """A loaded module standing in for a kernel of any spec: D = the epilogue of its operands."""

    def __init__(self, path):
        self.path, self.launches = Path(path), 0
        self.act = EPI_ACT if self.path.name.startswith("epi") else "none"  # the pack's epilogue modules

    def __call__(self, a, b, out, bias=None, alpha=None, C=None, beta=None):
        self.launches += 1
        out.copy_(reference(a, b, bias, self.act, 1.0 if alpha is None else alpha, C,
                            1.0 if beta is None else beta).to(out.dtype))


EPI_ACT = "gelu_tanh"
EPI = "bias_gelu_tanh+residual"


def _spec_module(folder, name, spec, **kw):
    e = _module(folder, name, **kw)
    man_path = folder / f"{name}.json"
    man = json.loads(man_path.read_text())
    man["spec"] = e["spec"] = spec.to_dict()
    man_path.write_text(json.dumps(man))
    return e


@pytest.fixture
def packed(tmp_path, monkeypatch):
    """A pack of one weight (256x512) with two modules of the gelu+residual spec and one plain
    module that serve M = 128; the GPU's questions answered for an H100."""
    monkeypatch.delenv(kernel_pack.PACK_ENV, raising=False)
    monkeypatch.setenv("GEMM_LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMM_LADDER_BUILD", "0")
    monkeypatch.setenv(first_use.CHOICES_ENV, str(tmp_path / "choices.json"))
    monkeypatch.delenv(first_use.MEASURE_ENV, raising=False)
    monkeypatch.setattr(front, "TINY_FLOPS", 0)
    monkeypatch.setattr(front, "_arch", lambda index: "sm_90a")
    monkeypatch.setattr(front.device, "name_of", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(front, "load", Kernel)
    monkeypatch.setattr(first_use, "can_measure", lambda a: True)
    monkeypatch.setattr(first_use, "_STATE", {"file": None, "doc": None, "warned": False})
    monkeypatch.setattr(first_use, "time_graphs", lambda launches, sets, queued_us, rounds=3: dict(queued_us))
    monkeypatch.setattr(front, "_l2_bytes", lambda index: 1 << 20)

    def check(A, B, out, bias=None, residual=None, d_dtype=None):  # CPU tensors stand in for the GPU's
        M, N, K, shape = front.check_shapes(A, B, out, bias, d_dtype)
        if residual is not None:
            front.check_residual(residual, shape, d_dtype or A.dtype, A, B, out, bias)
        return M, N, K, A.reshape(M, K), (out.view(M, N) if out is not None else None), shape

    monkeypatch.setattr(front, "_check", check)
    folder = tmp_path / "pack"
    folder.mkdir()
    spec = spec_for("float16", EPI)
    entries = [_spec_module(folder, "epi128.so", spec, shape=(128, 256, 512)),
               _spec_module(folder, "epi_any.so", spec, shape=(1, 256, 512), dynamic=True),
               _module(folder, "plain128.so", shape=(128, 256, 512))]
    entries[1]["m_range"] = [100, 200]
    front.use_pack(_pack(folder, entries))
    yield folder


def _timer(table, check_epilogue=True):
    """A stand-in for time_launches: every candidate runs, right, on every input set (its own C:
    the residual of a set is not the caller's but a copy), then gets its time from ``table``."""
    seen = []

    def fake(launches, sets, rounds=first_use.ROUNDS):
        for fn in launches.values():
            for a, b, d in sets:
                d.fill_(float("nan"))
                fn(a, b, d)
                assert not d.isnan().any()
        if check_epilogue:
            seen.append(sorted(launches))
        return {label: table[label] for label in launches}
    return fake, seen


def test_an_epilogue_call_times_ours_of_its_spec_against_torchs_unfused_path(packed, monkeypatch):
    fake, seen = _timer({"epi128.so": 30.0, "epi_any.so": 20.0, "torch": 25.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    torch_calls = []
    real = front.TorchMatmul.__call__
    monkeypatch.setattr(front.TorchMatmul, "__call__", lambda self, *a, **k: torch_calls.append(self.act) or
                        real(self, *a, **k))
    A, B, bias, C = r(128, 512), r(256, 512), r(256), r(128, 256)
    want = reference(A, B, bias, EPI_ACT, C=C, beta=0.5)
    D = front.matmul(A, B, bias=bias, activation=EPI_ACT, residual=C, beta=0.5)
    close(D, want)
    assert seen == [["epi128.so", "epi_any.so", "torch"]]
    assert torch_calls and set(torch_calls) == {EPI_ACT}  # torch's candidate: its unfused path, this activation
    route = front.route_of(128, 256, 512, spec=spec_for("float16", EPI))
    assert route.module.path.name == "epi_any.so" and not route.candidates
    keys = list(json.loads((packed.parent / "choices.json").read_text())["choices"])
    assert len(keys) == 1 and spec_for("float16", EPI).text() in keys[0].split("|")


def test_torch_wins_an_epilogue_and_the_plain_call_of_the_shape_is_timed_apart(packed, monkeypatch):
    fake, seen = _timer({"epi128.so": 30.0, "epi_any.so": 40.0, "torch": 20.0, "plain128.so": 10.0})
    monkeypatch.setattr(first_use, "time_launches", fake)
    A, B, bias = r(128, 512), r(256, 512), r(256)
    for _ in range(2):
        C = r(128, 256)
        want = reference(A, B, bias, EPI_ACT, alpha=1.0, C=C, beta=0.5)
        close(front.matmul(A, B, bias=bias, activation=EPI_ACT, residual=C, out=C, beta=0.5), want)
    route = front.route_of(128, 256, 512, spec=spec_for("float16", EPI))
    assert route.rung == "torch" and isinstance(route.module, front.TorchMatmul) and route.module.act == EPI_ACT
    assert len(seen) == 1  # the second call: from memory
    # the plain call of the shape: its own candidates (plain128.so and torch), its own key
    D = front.matmul(A, B)
    close(D, reference(A, B))
    assert seen[-1] == ["plain128.so", "torch"]
    keys = list(json.loads((packed.parent / "choices.json").read_text())["choices"])
    assert len(keys) == 2 and sum(spec_for("float16", EPI).text() in k for k in keys) == 1


def test_the_key_holds_the_spec_only_past_a_bias():
    ids = {"a.so": "sha-a", "torch": "torch"}
    plain = first_use.key_of("H100", 128, 256, 512, ids)
    assert first_use.key_of("H100", 128, 256, 512, ids, None) == plain == "H100|128x256x512|sha-a|torch"
    gelu = first_use.key_of("H100", 128, 256, 512, ids, spec_for("float16", "bias_gelu_tanh").text())
    assert gelu != plain and "act_gelu_tanh" in gelu
    assert front.fast_spec(dataclasses.replace(GemmSpec.with_bias(), a_major="M"))  # a layout: no spec in the key


def test_torchs_in_graphs_route_binds_each_specs_own_operands():
    """Inside capture a weight that needs a padded copy goes to torch's matmul (_weight_as_it_is);
    its launcher is bound once per GPU with the operand names of its first call, so a bias call
    and a residual call of one activation must not share it (C would be read as the bias)."""
    A, B, bias, C = r(16, 12), r(20, 12), r(20), r(16, 20)
    first = front._weight_as_it_is("none", GemmSpec.with_bias())  # pylint: disable=protected-access
    D = torch.empty(16, 20).half()
    first.run(A, B, D, {"bias": bias})
    close(D, reference(A, B, bias))
    second = front._weight_as_it_is("none", GemmSpec.with_epilogue(residual=True))  # pylint: disable=protected-access
    second.run(A, B, D, {"C": C, "beta": 0.5})
    close(D, reference(A, B, C=C, beta=0.5))
