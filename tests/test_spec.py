"""The operand spec (``gemm_ladder/core/spec.py``) on the CPU: every field, what is built and what is
refused (with what is not built yet), the text and manifest round trips, manifests and pack
entries written before the spec existed, the policy and the validator with a bias, and one v9
bias module built here (its CUDA source adds the bias before rounding)."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from tvm.error import DiagnosticError

from gemm_ladder.compile import builder, sass
from gemm_ladder.core import manifest
from gemm_ladder.serve import kernel_pack, plan, runtime
from gemm_ladder.protocol.check import check_config
from gemm_ladder.core.config import ConfigError, parse_knob_value
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.sm90a import hgemm_v8
from gemm_ladder.core.spec import (ACTIVATIONS, EPILOGUES, SPEC_KNOB, SPEC_SCHEMA, GemmSpec, Operand, as_spec,
    check_built, epilogue_names, not_built, spec_for, spec_of, spec_of_manifest)

V9 = ("none", "bias", "act")  # what v9 declares it builds (its EPILOGUES)


# -- fields and operands ------------------------------------------------------------------------
def test_the_default_is_todays_gemm():
    s = GemmSpec()
    assert (s.a, s.b, s.d, s.acc, s.a_major, s.b_major) == ("float16",) * 3 + ("float32", "K", "K")
    assert (s.bias, s.residual, s.scales, s.grouped) == (None, None, None, False)
    assert s.is_default() and s.epilogue == "none" and s.tag() == "" and GemmSpec.default("bfloat16").is_default()


def test_operands_are_ordered_with_shapes_in_m_n_k():
    s = GemmSpec.with_bias("bfloat16")
    assert [(o.name, o.dtype, o.shape, o.role) for o in s.operands()] == [
        ("A", "bfloat16", ("M", "K"), "input"), ("B", "bfloat16", ("N", "K"), "input"),
        ("D", "bfloat16", ("M", "N"), "output"), ("bias", "bfloat16", ("N",), "epilogue")]
    assert s.epilogue_operands() == (Operand("bias", "bfloat16", ("N",), "epilogue"),)
    assert s.epilogue_operands()[0].extent(7, 264, 320) == (264,)
    assert GemmSpec().epilogue_operands() == ()


def test_what_is_not_built_is_representable():
    """fp8 with scales, MN-major operands, a residual and grouped GEMM are values, not plumbing:
    each has its operands, and each is refused by name."""
    fp8 = GemmSpec(a="float8_e4m3", b="float8_e4m3", d="bfloat16", scales="row")
    assert [(o.name, o.shape) for o in fp8.epilogue_operands()] == [("scale_a", ("M",)), ("scale_b", ("N",))]
    assert [o.shape for o in GemmSpec(b_major="N").operands()][:2] == [("M", "K"), ("K", "N")]
    assert GemmSpec(residual="float16").epilogue_operands()[0].extent(3, 5, 7) == (3, 5)
    grouped = GemmSpec(grouped=True)
    assert [o.extent(3, 5, 7, groups=4) for o in grouped.operands()] == [(3, 7), (4, 5, 7), (3, 5), (4,)]
    cases = [(dataclasses.replace(fp8, b_major="N"), "fp8 wgmma reads both operands K-major"),
             (GemmSpec(b_major="N"), "MN-major"), (GemmSpec(a_major="M"), "MN-major"),
             (GemmSpec(acc="float16"), "float32 accumulators"), (GemmSpec(residual="float16"), "residual"),
             (GemmSpec(grouped=True), "grouped GEMM"), (GemmSpec(scales="tensor"), "scaled"),
             (GemmSpec(bias="bfloat16"), "in D's dtype"), (GemmSpec(a="float16", b="bfloat16"), "one dtype")]
    for spec, words in cases:
        with pytest.raises(ConfigError, match=words):
            check_built(spec, "v9", V9)
        assert words in not_built(spec, "v9", V9)


@pytest.mark.parametrize("field, value", [("a", "int4"), ("acc", "float64"), ("a_major", "N"), ("b_major", "M"),
                                          ("scales", "per-lane"), ("bias", "fp16"), ("grouped", 1)])
def test_an_unknown_value_is_refused_at_once(field, value):
    with pytest.raises(ConfigError, match=field):
        GemmSpec(**{field: value})


def test_the_bias_is_built_for_v9_only():
    check_built(GemmSpec.with_bias(), "v9", V9)
    with pytest.raises(ConfigError, match="not built for v10.*built for v9"):
        check_built(GemmSpec.with_bias(), "v10")
    assert EPILOGUES == ("none", "bias", "act", "alpha", "residual", "fp32_out", "gated", "grouped") and spec_for("bfloat16", "bias") == GemmSpec.with_bias("bfloat16")
    with pytest.raises(ConfigError, match="not built"):
        spec_for("float16", "gelu")


# -- as text, as a knob, in manifests --------------------------------------------------------------
@pytest.mark.parametrize("spec", [GemmSpec(), GemmSpec.default("bfloat16"), GemmSpec.with_bias(),
                                  GemmSpec(a="float8_e4m3", b="float8_e5m2", d="bfloat16", scales="block"),
                                  GemmSpec(b_major="N", residual="float16", grouped=True)])
def test_text_and_dict_round_trip(spec):
    assert GemmSpec.parse(spec.text()) == spec and parse_knob_value(spec.text()) == spec.text()  # a knob value
    assert GemmSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert as_spec(spec.text()) == as_spec(spec.to_dict()) == as_spec(spec) == spec
    assert "/" not in spec.tag() and " " not in spec.tag()


def test_text_names_what_differs():
    assert GemmSpec.with_bias().text() == "d_float16.bias_float16" and GemmSpec.parse("bias") == GemmSpec.with_bias()
    assert GemmSpec.parse("d_bfloat16.bias") == GemmSpec.with_bias("bfloat16")
    with pytest.raises(ConfigError, match="field_value"):
        GemmSpec.parse("d_float16.colour_red")


def test_the_spec_rides_as_a_knob_only_where_it_is_not_the_default():
    plain = make_config("v9", 256, 256, 512)
    same = make_config("v9", 256, 256, 512, spec=GemmSpec())
    assert SPEC_KNOB not in plain.knobs() and plain == same and plain.tag() == same.tag()
    biased = make_config("v9", 256, 256, 512, spec=GemmSpec.with_bias("bfloat16"))
    assert biased.dtype == "bfloat16" and spec_of(biased) == GemmSpec.with_bias("bfloat16")
    assert biased.knobs()[SPEC_KNOB] == "d_bfloat16.bias_bfloat16" and biased.tag().endswith("_bias_bfloat16")
    assert make_config("v9", 256, 256, 512, spec="bias") == make_config("v9", 256, 256, 512, spec=GemmSpec.with_bias())
    assert spec_of(make_config("v9", 256, 256, 512, dtype="bfloat16", spec="bias")) == GemmSpec.with_bias("bfloat16")
    with pytest.raises(ConfigError, match="dtype='float16' but spec"):
        make_config("v9", 256, 256, 512, dtype="float16", spec=GemmSpec.with_bias("bfloat16"))


@pytest.mark.parametrize("rung, words", [("v8", "not built for v8"), ("v6", "not built for v6")])
def test_rungs_without_the_bias_refuse_it_before_compiling(rung, words):
    with pytest.raises(ConfigError, match=words):
        make_config(rung, 256, 256, 512, spec=GemmSpec.with_bias())


def test_v9_refuses_a_bias_with_narrow_tiles_and_fp8():
    with pytest.raises(ConfigError, match="tail_n"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.with_bias(), tail_n=232)
    with pytest.raises(ConfigError, match="tail_n is not built for fp8"):
        make_config("v9", 4096, 4096, 4096, spec=GemmSpec.fp8(), tail_n=64)


def _stand_in(folder: Path, spec: dict | None) -> Path:
    blob = b"\0" * 64
    so = folder / "m.so"
    so.write_bytes(blob)
    man = {"format": manifest.MANIFEST_VERSION, "rung": "v9", "shape": [64, 256, 512], "dtype": "bfloat16",
           "arch": "sm_90a", "knobs": {"dtype": "bfloat16", "arch": "sm_90a"}, "tvm_version": "0.27.0.post1",
           "so_bytes": 64, "so_sha256": hashlib.sha256(blob).hexdigest(), **({"spec": spec} if spec else {})}
    manifest.manifest_path(so).write_text(json.dumps(man))
    return so


def test_a_manifest_without_a_spec_reads_as_the_default(tmp_path):
    man = manifest.read_manifest(_stand_in(tmp_path, None))
    assert spec_of_manifest(man) == GemmSpec.default("bfloat16")
    mod = runtime.GemmModule(tmp_path / "m.so", man, None)
    assert mod.spec == GemmSpec.default("bfloat16") and mod.operand_args(64, {}, None) == []


def test_a_manifest_with_a_spec_round_trips_and_a_bad_one_is_refused(tmp_path):
    spec = GemmSpec.with_bias("bfloat16")
    man = manifest.read_manifest(_stand_in(tmp_path, spec.to_dict()))
    mod = runtime.GemmModule(tmp_path / "m.so", man, None)
    assert mod.spec == spec
    with pytest.raises(runtime.ModuleInputError, match="pass bias="):
        mod.operand_args(64, {}, None)
    plain = runtime.GemmModule(tmp_path / "m.so", {**man, "spec": GemmSpec.default("bfloat16").to_dict()}, None)
    with pytest.raises(runtime.ModuleInputError, match="has no epilogue operands.*pack build --epilogue bias"):
        plain.operand_args(64, {"bias": object()}, None)
    _stand_in(tmp_path, {**spec.to_dict(), "bias": "int4"})
    with pytest.raises(manifest.ManifestError, match="spec"):
        manifest.read_manifest(tmp_path / "m.so")


def test_the_builder_writes_the_spec_the_runner_reads():
    """The manifest's spec lists the operands in the kernel's order; the C++ runner finds the
    epilogue's by their role."""
    ops = GemmSpec.with_bias().to_dict()["operands"]
    assert [o["name"] for o in ops] == ["A", "B", "D", "bias"] and ops[-1]["role"] == "epilogue"
    runner = (Path(__file__).resolve().parents[1] / "runner" / "gemm_runner.cc").read_text()
    assert '\\"role\\":\\\\s*\\"epilogue\\"' in runner and "fn(&ta, &tb, &td, sms, &tbias)" in runner


# -- kernel packs ----------------------------------------------------------------------------------
def _entry(folder: Path, name: str, spec: GemmSpec | None) -> dict:
    blob = hashlib.sha256(name.encode()).digest() * 8
    (folder / name).write_bytes(blob)
    man = {"format": manifest.MANIFEST_VERSION, "rung": "v9", "shape": [1, 256, 512], "dtype": "float16",
           "arch": "sm_90a", "knobs": {"dtype": "float16", "arch": "sm_90a"}, "tvm_version": "0.27.0.post1",
           "launch": {"dynamic_m": True}, "so_bytes": len(blob), "so_sha256": hashlib.sha256(blob).hexdigest(),
           **({"spec": spec.to_dict()} if spec else {})}
    manifest.manifest_path(folder / name).write_text(json.dumps(man))
    entry = {"file": name, "rung": "v9", "shape": [1, 256, 512], "dtype": "float16", "arch": "sm_90a",
             "knobs": man["knobs"], "dynamic_m": True, "m_range": [1, 64], "so_bytes": len(blob),
             "so_sha256": man["so_sha256"]}
    return {**entry, "spec": spec.to_dict()} if spec else entry


def test_a_pack_built_before_the_spec_serves_plain_calls_only(tmp_path):
    (tmp_path / "pack").mkdir()
    old = _entry(tmp_path / "pack", "old.so", None)
    (tmp_path / "pack" / kernel_pack.PACK_MANIFEST).write_text(json.dumps(
        {"format": kernel_pack.PACK_FORMAT, "version": kernel_pack.PACK_VERSION, "modules": [old]}))
    pk = kernel_pack.KernelPack(tmp_path / "pack")
    found = pk.find(16, 256, 512, "float16", "sm_90a")
    assert found.entry["file"] == "old.so" and pk.check_entry(found.entry)
    assert pk.find(16, 256, 512, "float16", "sm_90a", GemmSpec()) is not None
    assert pk.find(16, 256, 512, "float16", "sm_90a", GemmSpec.with_bias()) is None


def test_a_pack_serves_each_spec_its_own_module(tmp_path):
    (tmp_path / "pack").mkdir()
    entries = [_entry(tmp_path / "pack", "plain.so", GemmSpec()),
               _entry(tmp_path / "pack", "bias.so", GemmSpec.with_bias())]
    (tmp_path / "pack" / kernel_pack.PACK_MANIFEST).write_text(json.dumps(
        {"format": kernel_pack.PACK_FORMAT, "version": kernel_pack.PACK_VERSION, "modules": entries}))
    pk = kernel_pack.KernelPack(tmp_path / "pack")
    assert pk.find(16, 256, 512, "float16", "sm_90a").entry["file"] == "plain.so"
    biased = pk.find(16, 256, 512, "float16", "sm_90a", GemmSpec.with_bias())
    assert biased.entry["file"] == "bias.so" and pk.check_entry(biased.entry)
    # an entry whose module's own manifest says another spec is refused
    swapped = dict(biased.entry, spec=GemmSpec().to_dict())
    with pytest.raises(kernel_pack.PackError, match="bias.so"):
        pk.check_entry(swapped)


# -- the policy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("M, rung", [(1, "v11"), (37, "v11"), (100, "v9"), (200, "v11"), (512, "v9"), (4096, "v9")])
def test_the_policy_picks_a_rung_that_builds_the_bias_and_keeps_the_spec(M, rung):
    p = plan.Problem(M, 4096, 4096, "float16", "sm_90a", 132, GemmSpec.with_bias())
    choice = plan.choose(p, use_db=False)
    assert choice.rung == rung and choice.knobs[SPEC_KNOB] == GemmSpec.with_bias().text()
    assert SPEC_KNOB not in plan.choose(dataclasses.replace(p, spec=None), use_db=False).knobs


def test_the_policy_says_why_a_rung_was_passed_over_for_an_epilogue():
    """A residual at M = 1: swap AB (v11) comes first there and builds none; the choice says so."""
    p = plan.Problem(1, 4096, 4096, "float16", "sm_90a", 132, spec_for("float16", "residual"))
    choice = plan.choose(p, use_db=False)
    assert choice.rung == "v9" and any("not built for v11" in s for s in choice.skipped), choice.skipped


def test_a_pack_plan_has_a_bias_module_beside_the_plain_one():
    items = kernel_pack.plan_pack([(16, 4096, 4096), (512, 4096, 4096)], ["float16"], sms=132,
                                  epilogues=("none", "bias"))
    biased = [i for i in items if SPEC_KNOB in i["job"].knobs]
    plain = [i for i in items if i not in biased]
    assert biased and all(i["file"].endswith("_bias_float16.so") for i in biased)
    # each weight's bias module is its plain one's kernel with the bias (M = 16: swap AB, which builds it now)
    assert sorted(i["file"].replace("_bias_float16", "") for i in biased) == sorted(i["file"] for i in plain)
    assert {i["job"].rung for i in biased} == {"v9", "v11"} and not any("bias" in i["file"] for i in plain)


# -- the kernel ------------------------------------------------------------------------------------
def test_v9_with_a_bias_builds_and_adds_it_before_rounding(tmp_path):
    """The bias is a parameter after num_ctas, read in D's dtype, widened to fp32 and added to the
    accumulators inside the cvt that rounds them (the staged chunks and epi_under's pairs alike);
    v9 without a bias has no such read."""
    cfg = make_config("v9", 200, 264, 320, spec=GemmSpec.with_bias(), epi_under=True, cluster_m=1)
    assert [str(p.name) for p in kernel_of(cfg).params][-2:] == ["num_ctas", "bias"]  # the runtime's order
    mod = builder.build(kernel_of(cfg))
    src = mod.cuda_source()
    assert "bias_ptr" in src and "+ ((float)bias_ptr[min(" in src, src[:2000]
    cvts = [line for line in src.splitlines() if "cvt" in line and "Dreg" in line]
    assert cvts and all("bias_ptr" in line for line in cvts)
    assert mod.manifest()["spec"]["bias"] == "float16"
    path = mod.export(tmp_path / "v9_bias.so")
    assert manifest.read_manifest(path)["spec"] == GemmSpec.with_bias().to_dict()
    plain = builder.build("v9", 200, 264, 320, epi_under=True, cluster_m=1).cuda_source()
    assert "bias" not in plain
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    counts = sass.instruction_counts(text)
    assert counts["LDL"] == 0 and counts["STL"] == 0 and res.local == 0, (counts, res)  # the bias spills nothing
    assert "LDG" in text  # its values are read from global memory in the epilogue


def test_a_kernel_that_does_not_take_its_specs_operands_is_refused(monkeypatch):
    """A rung that declares the bias but whose kernel leaves it out would be called with one
    argument too many: refused when traced, with where to declare it."""
    monkeypatch.setattr(hgemm_v8, "EPILOGUES", ("none", "bias"), raising=False)
    cfg = make_config("v8", 256, 256, 512, spec=GemmSpec.with_bias())
    with pytest.raises((ConfigError, DiagnosticError), match="epilogue.kernel_operands"):  # raised while traced
        kernel_of(cfg)


def test_a_watchdog_build_takes_the_bias_before_its_record():
    """A bounded build appends the watchdog's record after every parameter: the runtime passes
    (A, B, D, num_ctas, bias) and the watchdog's launch adds the record."""
    cfg = make_config("v9", 200, 264, 320, spec=GemmSpec.with_bias(), cluster_m=1, watchdog=2)
    assert [str(p.name) for p in kernel_of(cfg).params][-3:] == ["num_ctas", "bias", "barrier_watchdog"]


def test_the_barrier_checker_passes_the_v9_bias_kernel():
    """The bias adds global reads to the epilogue and nothing to its barriers: the protocol check
    finds what it finds without it (nothing)."""
    assert check_config(make_config("v9", 512, 512, 512, spec=GemmSpec.with_bias(), epi_under=True)).ok


# -- activations (issue 31): act(acc + bias) in fp32 before rounding, v9 only ----------------------
ACTS = ACTIVATIONS[1:]


def test_an_activation_is_a_field_with_a_name_for_each_epilogue():
    assert GemmSpec().act == "none" and ACTS == ("relu", "gelu_tanh", "gelu_erf", "silu")
    for name in epilogue_names():  # none, bias, relu, ..., bias_relu, ...: spec_for and .epilogue invert
        for dtype in ("float16", "bfloat16"):
            assert spec_for(dtype, name).epilogue == name and spec_for(dtype, name).d == dtype
    s = spec_for("bfloat16", "bias_gelu_tanh")
    assert s == GemmSpec.with_epilogue("bfloat16", True, "gelu_tanh") and s.bias == "bfloat16"
    assert s.tag() == "bias_gelu_tanh" and spec_for("float16", "silu").tag() == "silu"
    assert s.epilogue_operands() == GemmSpec.with_bias("bfloat16").epilogue_operands()  # no operand of its own
    with pytest.raises(ConfigError, match="gelu_tanh"):
        spec_for("float16", "bias_gelu")


@pytest.mark.parametrize("act", ["gelu", "tanh", "", "RELU"])
def test_an_unknown_activation_is_refused_at_once(act):
    with pytest.raises(ConfigError, match="act=.*use one of"):
        GemmSpec(act=act)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_an_activation_round_trips_as_text_knob_and_manifest(act, bias):
    spec = GemmSpec.with_epilogue("bfloat16", bias, act)
    assert spec.text().endswith(f".act_{act}") and GemmSpec.parse(spec.text()) == spec
    assert parse_knob_value(spec.text()) == spec.text()
    doc = json.loads(json.dumps(spec.to_dict()))
    assert doc["act"] == act and GemmSpec.from_dict(doc) == spec
    assert SPEC_SCHEMA.check(doc) == doc
    cfg = make_config("v9", 256, 256, 512, spec=spec)
    assert spec_of(cfg) == spec and cfg.tag().endswith(f"act_{act}")


def test_specs_without_an_activation_write_what_they_wrote_before():
    """Manifests and pack entries of specs without an activation carry no ``act`` (byte-identical
    to before it existed); one without it reads as ``none``, and ``act_none`` parses too."""
    for spec in (GemmSpec(), GemmSpec.with_bias("bfloat16")):
        assert "act" not in spec.to_dict() and "act" not in spec.text()
    old = {k: v for k, v in GemmSpec.with_bias().to_dict().items()}
    assert GemmSpec.from_dict(old).act == "none" and spec_of_manifest({"spec": old}) == GemmSpec.with_bias()
    assert GemmSpec.parse("bias.act_none") == GemmSpec.with_bias()


def test_a_manifest_with_an_activation_round_trips_and_a_bad_one_is_refused(tmp_path):
    spec = GemmSpec.with_epilogue("bfloat16", True, "silu")
    man = manifest.read_manifest(_stand_in(tmp_path, spec.to_dict()))
    assert runtime.GemmModule(tmp_path / "m.so", man, None).spec == spec
    _stand_in(tmp_path, {**spec.to_dict(), "act": "gelu"})
    with pytest.raises(manifest.ManifestError, match="act"):
        manifest.read_manifest(tmp_path / "m.so")


@pytest.mark.parametrize("rung", ["v8", "v6"])
def test_rungs_without_the_activation_refuse_it_before_compiling(rung):
    with pytest.raises(ConfigError, match=f"not built for {rung}.*no act"):
        make_config(rung, 256, 256, 512, spec=GemmSpec.with_epilogue("float16", False, "relu"))


def test_v9_refuses_an_activation_with_narrow_tiles():
    with pytest.raises(ConfigError, match="epilogue gelu_erf with tail_n=232"):
        make_config("v9", 4096, 4096, 4096, spec=spec_for("float16", "gelu_erf"), tail_n=232)
    check_built(spec_for("float16", "bias_silu"), "v9", V9)
    assert "no act" in not_built(spec_for("float16", "bias_silu"), "v9", ("none", "bias"))


def test_the_policy_and_the_pack_plan_keep_an_activation():
    spec = spec_for("float16", "bias_gelu_tanh")
    for M, rung in ((1, "v11"), (333, "v11"), (512, "v9"), (4096, "v9")):
        choice = plan.choose(plan.Problem(M, 4096, 4096, "float16", "sm_90a", 132, spec), use_db=False)
        assert choice.rung == rung and choice.knobs[SPEC_KNOB] == spec.text()
    items = kernel_pack.plan_pack([(333, 3000, 520)], ["bfloat16"], sms=132, epilogues=("bias", "bias_relu", "silu"))
    assert sorted(i["file"].split("_sm_90a", 1)[1].split("snake", 1)[1] for i in items) == [
        "_act_silu.so", "_bias_bfloat16-act_relu.so", "_bias_bfloat16.so"]


# each activation's formula in the generated CUDA: CUDA's names of TIRx's T.Select, T.tanh, T.erf, T.exp
CUDA_MATH = {"relu": "? 0x0p+0f/*0.000000e+00*/ : pre_act", "gelu_tanh": "tanhf(", "gelu_erf": "erff(", "silu": "expf("}


@pytest.mark.parametrize("act, bias", [("relu", True), ("gelu_tanh", True), ("gelu_erf", True), ("silu", False)])
def test_v9_with_an_activation_applies_it_before_rounding(act, bias):
    """The activation is bound to the (biased) accumulator once (``pre_act``) and applied inside
    the cvt that rounds it, in the staged chunks and epi_under's pairs alike."""
    spec = GemmSpec.with_epilogue("float16", bias, act)
    cfg = make_config("v9", 200, 264, 320, spec=spec, epi_under=True, cluster_m=1)
    assert [str(p.name) for p in kernel_of(cfg).params][-1] == ("bias" if bias else "num_ctas")
    mod = builder.build(kernel_of(cfg))
    src = mod.cuda_source()
    cvts = [line for line in src.splitlines() if "cvt" in line and "pre_act" in line]
    assert cvts and all(CUDA_MATH[act] in line for line in cvts), src[:2000]
    assert not [line for line in src.splitlines() if "cvt" in line and "Dreg" in line]  # none left unactivated
    assert ("bias_ptr" in src) == bias and all(CUDA_MATH[a] not in src for a in ACTS if a != act)
    assert mod.manifest()["spec"]["act"] == act


def test_the_barrier_checker_passes_the_v9_activation_kernel():
    """The activation is arithmetic on registers: the protocol check finds nothing, as without it."""
    assert check_config(make_config("v9", 512, 512, 512, spec=spec_for("float16", "bias_gelu_tanh"),
                                    epi_under=True)).ok


def test_grouped_is_built_on_v12_alone_and_without_an_epilogue():
    grouped = GemmSpec(grouped=True)
    assert not_built(grouped, "v12", ("grouped",)) is None
    assert "v12 only" in not_built(grouped, "v9", V9)
    assert "must be grouped" in not_built(GemmSpec(), "v12", ("grouped",))
    assert "bias or an activation" in not_built(GemmSpec(grouped=True, bias="float16"), "v12", ("grouped",))
    assert "bias or an activation" in not_built(GemmSpec(grouped=True, act="silu"), "v12", ("grouped",))
    assert GemmSpec.parse(grouped.text()) == grouped
