"""The operand spec: one frozen description of a GEMM's operands, from the front door to the kernel.

    D[M, N] = epilogue(sum_k A[M, K] . B[N, K]^T, in ``acc``)      (A and B K-major, D row-major)

A :class:`GemmSpec` says the dtypes of A, B and D, the accumulator's, each operand's major-ness,
and the epilogue's extra operands (a per-column bias, a residual C, scale tensors, grouped GEMM's
offsets). :meth:`GemmSpec.operands` is the one ordered list of a kernel's tensor operands, each
with its dtype and its shape in terms of M, N and K: the kernel's signature (``sm90a.common.
epilogue_operands``), the runtime's argument list (``runtime.GemmModule``), the manifest's
``spec`` field and the C++ runner's arguments all derive from it.

Every combination is *representable* (fp8 with scales, MN-major operands, grouped GEMM are new
values of these fields, not new plumbing), but only what is built is accepted: :func:`check_built`
refuses the rest with a :class:`ConfigError` that names what is not built yet, before anything
compiles. Built today:

    ==========  =========================================================================
    field       accepted
    ==========  =========================================================================
    a, b, d     float16 or bfloat16, all three the same; or D in float32 (a wgrad into fp32 master
                weights) on rungs whose ``EPILOGUES`` lists ``"fp32_out"`` (v9, v10; a residual then in float32)
    acc         float32
    a_major     K (A is [M, K], row-major); M (A is [K, M], row-major) on rungs whose
                ``MN_MAJOR`` is true (v9)
    b_major     K (B is [N, K], row-major, like nn.Linear.weight); N (B is [K, N],
                row-major) on rungs whose ``MN_MAJOR`` is true (v9)
    bias        None, or D's dtype: D[m, n] = round(acc[m, n] + bias[n]), on rungs whose
                ``EPILOGUES`` lists ``"bias"`` (v9, v10, v11)
    act         one of ACTIVATIONS, after the bias, in fp32 before rounding:
                D = round(act(acc + bias)), on rungs whose ``EPILOGUES`` lists ``"act"`` (v9, v10, v11)
    alpha       False, or True: the kernel takes a runtime fp32 scalar ``alpha`` (a parameter, so one
                module serves every value) and computes act(alpha . acc + bias), on rungs whose
                ``EPILOGUES`` lists ``"alpha"`` (v9, v10, v11)
    gated       False, or True: B is ``cat([W_gate, W_up])`` (N rows: both halves) and
                D [M, N/2] = act(x . W_gate^T) * (x . W_up^T) (SwiGLU: act silu), on rungs whose
                ``EPILOGUES`` lists ``"gated"`` (v9; nothing else in the epilogue yet)
    residual    None, or D's dtype: a residual C [M, N] and a runtime fp32 scalar ``beta``:
                D = round(act(alpha . acc + bias) + beta . C), C read in the epilogue (it may be D
                itself: an in-place residual add), on rungs whose ``EPILOGUES`` lists ``"residual"`` (v9, v10)
    scales      None
    grouped     False, or True on rungs whose ``EPILOGUES`` lists ``"grouped"`` (v12) with no
                bias or activation but a gated B (``gated`` with its gate's act, where ``EPILOGUES``
                lists ``"gated"`` too: W [G, N, K] holds each expert's cat([W_gate, W_up]), D [M, N/2]): B is the experts' weights W [G, N, K] (the kernel views it
                as [G * N, K]) and ``offsets`` [G] int32 the cumulative END row of each group
                in A and D (``torch._grouped_mm``'s ``offs``: group g is rows
                [offsets[g-1], offsets[g]), offsets[-1] = 0)
    ==========  =========================================================================

and the scaled fp8 GEMM (issue 32), on rungs whose ``EPILOGUES`` lists ``"scaled"`` (v9):

    ==========  =========================================================================
    field       accepted
    ==========  =========================================================================
    a           float8_e4m3
    b           float8_e4m3 or float8_e5m2
    d           bfloat16 or float16
    a_major     K, b_major K (fp8 wgmma reads both operands K-major only)
    scales      tensor (scale_a [1], scale_b [1]) or row (scale_a [M], scale_b [N]), fp32:
                D = round(acc * scale_a * scale_b + bias); or block (DeepSeek-V3's: A's 1x128
                groups stored M-major, scale_a [K/128, M], B's 128x128 blocks, scale_b
                [N/128, K/128]), applied to each 128 of K's sums as they are promoted
    bias        None, D's dtype or float32
    grouped     True on rungs whose ``EPILOGUES`` list ``grouped`` too (v12; issue 33's fp8): A and
                B e4m3, D 16-bit, scales row only (scale_a [M] a token, scale_b [G, N] an expert's
                output column: ``torch._scaled_grouped_mm``'s), no bias
    ==========  =========================================================================

The spec travels as a knob, ``spec``, whose value is :meth:`GemmSpec.text` (a name the knob
parser takes, e.g. ``d_float16.bias_float16``): only where it is not the default for the dtype, so every
module built before the spec existed keeps its tag, its cache key and its manifest, and a
manifest or pack entry without the field reads as the default (:func:`spec_of_manifest`).

This module imports no TVM and no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import DTYPES, ConfigError
from .records import ANY, Bool, List, Maybe, Obj, Str

SPEC_KNOB = "spec"  # the knob that carries a non-default spec (its text)
ACC_DTYPE = "float32"
# what a field may hold (representable); BUILT: what is built today
DTYPE_CHOICES = ("float16", "bfloat16", "float8_e4m3", "float8_e5m2", "float32")
MAJORS = {"a_major": ("K", "M"), "b_major": ("K", "N")}
SCALES = ("tensor", "row", "block")  # fp8: one per tensor, one per row of A / of B, 1x128 groups / 128x128 blocks
# the activation after the bias: relu, GELU by tanh's formula (F.gelu(approximate="tanh")) or erf's
# (F.gelu), SiLU (F.silu); "none": the identity
ACTIVATIONS = ("none", "relu", "gelu_tanh", "gelu_erf", "silu")
# what a rung may declare it builds (a rung's EPILOGUES; "act": all ACTIVATIONS; "alpha": the runtime
# scale of the product; "residual": C and its runtime scale beta; "fp32_out": D in float32 from 16-bit A, B;
# "gated": B = cat([W_gate, W_up]), D = act(gate) * up, half B's rows: SwiGLU with act silu;
# "grouped": the grouped GEMM)
EPILOGUES = ("none", "bias", "act", "alpha", "residual", "fp32_out", "gated", "grouped")
SCALARS = ("alpha", "beta")  # the fp32 scalar parameters of an epilogue (Operand.role "scalar")
# the operand layouts by name, (a_major, b_major): KK the forward x . W^T; KN a B stored [K, N] (dX = dY . W
# reads W so); MK an A stored [K, M]; MN both (dW = dY^T . X reads dY and X so)
OPERAND_LAYOUTS = {"KK": ("K", "K"), "KN": ("K", "N"), "MK": ("M", "K"), "MN": ("M", "N")}
SCALED = "scaled"  # a rung's EPILOGUES lists it where it builds the scaled fp8 GEMM (v9)
FP8_DTYPES = ("float8_e4m3", "float8_e5m2")
FP8_SCALES = ("tensor", "row", "block")  # the recipes built
OPERAND_BYTES = {"float16": 2, "bfloat16": 2, "float8_e4m3": 1, "float8_e5m2": 1, "float32": 4}
# the names torch and TVM give our dtypes where they differ (torch.float8_e4m3fn, "float8_e4m3fn")
TORCH_NAMES = {"float8_e4m3": "float8_e4m3fn"}
MN_MAJOR_FP8_FIX = "fp8 wgmma reads both operands K-major: pass B as [N, K] row-major / call .t().contiguous()"


# the manifest's and the pack entry's ``spec`` field (GemmSpec.to_dict), checked when they are read
SPEC_SCHEMA = Obj(
    {"a": Str(DTYPE_CHOICES), "b": Str(DTYPE_CHOICES), "d": Str(DTYPE_CHOICES)},
    {"acc": Str(DTYPE_CHOICES), "a_major": Str(MAJORS["a_major"]), "b_major": Str(MAJORS["b_major"]),
     "bias": Maybe(Str(DTYPE_CHOICES)), "residual": Maybe(Str(DTYPE_CHOICES)), "scales": Maybe(Str(SCALES)),
     "act": Str(ACTIVATIONS), "grouped": Bool(), "alpha": Bool(), "gated": Bool(),
     "operands": List(Obj({"name": Str(), "dtype": Str(), "shape": List(ANY)}))})


@dataclass(frozen=True)
class Operand:
    """One tensor a kernel takes: its name, dtype, shape in terms of M, N and K, and role."""

    name: str  # "A", "B", "D", "bias", "C", "scale_a", "scale_b", "offsets"
    dtype: str
    shape: tuple  # of "M", "N", "K", "N/2", "K/128", "N/128" (rounded up), "G" (groups) or ints
    role: str  # "input", "output", "epilogue" (a tensor) or "scalar" (an fp32 value, shape ())

    def extent(self, M: int, N: int, K: int, groups: int = 1) -> tuple:
        """The shape for this problem."""
        sizes = {"M": M, "N": N, "K": K, "N/2": N // 2, "K/128": -(-K // 128), "N/128": -(-N // 128), "G": groups}
        return tuple(sizes[s] if isinstance(s, str) else s for s in self.shape)


_DEFAULTS: dict = {}  # (class, dtype) -> GemmSpec.default's instance


@dataclass(frozen=True)
class GemmSpec:
    """A GEMM's operands (see the module docstring). The default is today's GEMM in fp16."""

    a: str = "float16"
    b: str = "float16"
    d: str = "float16"
    acc: str = ACC_DTYPE
    a_major: str = "K"
    b_major: str = "K"
    bias: str | None = None  # dtype of a per-column bias [N], or None
    residual: str | None = None  # dtype of a residual C [M, N] added before rounding, or None
    scales: str | None = None  # fp32 scales of A and B (one of SCALES), or None
    act: str = "none"  # the activation after the bias (one of ACTIVATIONS)
    grouped: bool = False  # grouped GEMM: B is [G, N, K], int32 offsets [G]: each group's end row of A and D
    alpha: bool = False  # a runtime fp32 scalar alpha scales the product: act(alpha . acc + bias)
    # B is cat([W_gate, W_up]) [N, K] (N: both halves), D [M, N/2] = act(x . W_gate^T) * (x . W_up^T)
    gated: bool = False

    def __post_init__(self):
        for name in ("a", "b", "d", "acc", "bias", "residual"):
            value = getattr(self, name)
            if value is not None and value not in DTYPE_CHOICES:
                raise ConfigError(f"spec {name}={value!r} is no dtype gemm_ladder knows; use one of {DTYPE_CHOICES}")
        for name, choices in MAJORS.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"spec {name}={getattr(self, name)!r}; use one of {choices}")
        if self.scales is not None and self.scales not in SCALES:
            raise ConfigError(f"spec scales={self.scales!r}; use one of {SCALES} or None")
        if self.act is None:  # "act_none" in text reads as None
            object.__setattr__(self, "act", "none")
        if self.act not in ACTIVATIONS:
            raise ConfigError(f"spec act={self.act!r} is no activation gemm_ladder knows; use one of {ACTIVATIONS}")
        for name in ("grouped", "alpha", "gated"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"spec {name}={getattr(self, name)!r}; use True or False")

    @classmethod
    def default(cls, dtype: str = "float16") -> "GemmSpec":
        """Today's GEMM: ``dtype`` in and out, fp32 accumulate, no epilogue (one frozen instance per
        dtype: the tuner's validator asks for it millions of times)."""
        hit = _DEFAULTS.get((cls, dtype))
        if hit is None:
            hit = _DEFAULTS[(cls, dtype)] = cls(a=dtype, b=dtype, d=dtype)
        return hit

    @classmethod
    def with_bias(cls, dtype: str = "float16") -> "GemmSpec":
        """``dtype`` in and out, plus a per-column bias in ``dtype``."""
        return cls(a=dtype, b=dtype, d=dtype, bias=dtype)

    @classmethod
    def with_epilogue(cls, dtype: str = "float16", bias: bool = False, act: str = "none", alpha: bool = False,
                      residual: bool = False) -> "GemmSpec":
        """``dtype`` in and out, a per-column bias in ``dtype`` or none, then activation ``act``;
        ``alpha``: a runtime scale of the product; ``residual``: ``+ beta . C``, C in ``dtype``."""
        return cls(a=dtype, b=dtype, d=dtype, bias=dtype if bias else None, act=act, alpha=alpha,
                   residual=dtype if residual else None)

    @classmethod
    def fp8(cls, d: str = "bfloat16", scales: str = "tensor", bias: str | None = None,
            b: str = "float8_e4m3") -> "GemmSpec":
        """A scaled fp8 GEMM: A e4m3 (B e4m3 or e5m2), D ``d``, fp32 scales of recipe ``scales``
        (``tensor``, ``row`` or ``block``), a per-column bias in ``bias``'s dtype or none."""
        return cls(a="float8_e4m3", b=b, d=d, scales=scales, bias=bias)

    @property
    def is_fp8(self) -> bool:
        return self.a in FP8_DTYPES or self.b in FP8_DTYPES

    @property
    def epilogue(self) -> str:
        """The epilogue's name, as ``pack build --epilogue`` takes it (:func:`spec_for`): ``none``,
        ``bias``, an activation (``gelu_tanh``), ``bias_gelu_tanh``, ``alpha_bias_gelu_tanh``;
        ``residual`` joins with ``+`` (``bias+residual``, ``residual`` alone)."""
        if self.gated:  # SwiGLU, GeGLU: the gate's activation names it
            return "swiglu" if self.act == "silu" else f"gated_{self.act}"
        head = "_".join(p for p, on in (("alpha", self.alpha), ("bias", self.bias), (self.act, self.act != "none"))
                        if on)
        parts = [p for p, on in ((head, head), ("residual", self.residual)) if on]
        return "+".join(parts) or "none"

    def is_default(self) -> bool:
        return self == GemmSpec.default(self.d)

    def operands(self) -> tuple[Operand, ...]:
        """The kernel's tensor operands in order: A, B, D, then the epilogue's (bias, C, scales,
        offsets). A kernel's signature and the runtime's argument list are this list in order,
        with the epilogue operands after the launch scalars (``runtime.GemmModule``)."""
        a_shape = ("M", "K") if self.a_major == "K" else ("K", "M")
        b_shape = ("N", "K") if self.b_major == "K" else ("K", "N")
        if self.grouped:  # one weight a group (an expert)
            b_shape = ("G",) + b_shape
        ops = [Operand("A", self.a, a_shape, "input"), Operand("B", self.b, b_shape, "input"),
               Operand("D", self.d, ("M", "N/2") if self.gated else ("M", "N"), "output")]
        return tuple(ops) + self.epilogue_operands()

    def epilogue_operands(self) -> tuple[Operand, ...]:
        """The operands after D (what a rung's epilogue reads), in order: the bias, alpha, then C and
        beta (the scalars are fp32 kernel parameters, role ``scalar``)."""
        ops = []
        if self.bias:
            ops.append(Operand("bias", self.bias, ("N",), "epilogue"))
        if self.alpha:
            ops.append(Operand("alpha", ACC_DTYPE, (), "scalar"))
        if self.residual:
            ops += [Operand("C", self.residual, ("M", "N"), "epilogue"), Operand("beta", ACC_DTYPE, (), "scalar")]
        if self.scales:
            # block: A's scales M-major (torch's and DeepGEMM's layout: a warp's rows are adjacent)
            shapes = {"tensor": ((1,), (1,)), "row": (("M",), ("N",)), "block": (("K/128", "M"), ("N/128", "K/128"))}
            sa, sb = shapes[self.scales]
            if self.grouped and self.scales == "row":  # one scale an expert's output column
                sb = ("G", "N")
            ops += [Operand("scale_a", ACC_DTYPE, sa, "epilogue"), Operand("scale_b", ACC_DTYPE, sb, "epilogue")]
        if self.grouped:
            ops.append(Operand("offsets", "int32", ("G",), "epilogue"))
        return tuple(ops)

    # -- as text (the knob, file names) and as JSON (manifests) -----------------------------------
    def text(self) -> str:
        """The spec as a name the knob parser takes: the fields that differ from the default for
        D's dtype after D's, ``field_value`` joined by dots (``d_float16.bias_float16``; the
        default: ``d_float16``)."""
        base = dataclasses.asdict(GemmSpec.default(self.d))
        mine = dataclasses.asdict(self)
        return ".".join([f"d_{self.d}"] + [f"{k}_{_word(v)}" for k, v in mine.items() if k != "d" and v != base[k]])

    def tag(self) -> str:
        """A short file-name part ("" for the default): the epilogue's name (``bias``,
        ``bias_gelu_tanh``) where only it differs from the default and a bias is D's dtype."""
        if self.is_default():
            return ""
        if self.gated and self == dataclasses.replace(GemmSpec.default(self.d), act=self.act, gated=True):
            return self.epilogue
        if self == GemmSpec.with_epilogue(self.d, bool(self.bias), self.act, self.alpha, bool(self.residual)):
            return self.epilogue.replace("+", "-")
        return self.text().replace(".", "-")

    @classmethod
    def parse(cls, text: str, dtype: str = "float16") -> "GemmSpec":
        """The spec :meth:`text` wrote; ``bias`` alone is a bias in D's dtype (``d_...``, default
        ``dtype``): ``bias``, ``d_bfloat16.bias``."""
        fields = {}
        for part in str(text).split("."):
            if part == "bias":
                fields["bias"] = True
                continue
            # the longest field name that starts the part ("a_major_K" is a_major, not a)
            name = max((f for f in cls.__dataclass_fields__ if part.startswith(f + "_")), key=len, default=None)
            value = part[len(name) + 1:] if name else ""
            if name is None:
                raise ConfigError(f"spec {text!r}: {part!r} is not field_value (fields: "
                                  f"{', '.join(cls.__dataclass_fields__)}); e.g. bias_float16")
            fields[name] = _unword(value)
        d = fields.get("d", dtype)
        if fields.get("bias") is True:
            fields["bias"] = d
        return dataclasses.replace(cls.default(d), **fields)

    def to_dict(self) -> dict:
        """For manifests: every field (but ``act`` where it is ``none`` and ``alpha`` where it is
        False: the manifests of specs without them stay as they were), plus the operand list (name,
        dtype, shape) for readers without this module (the C++ runner)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if (k, v) not in (("act", "none"), ("alpha", False), ("gated", False))}
        return {**fields,
                "operands": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape), "role": o.role}
                             for o in self.operands()]}

    @classmethod
    def from_dict(cls, d: dict) -> "GemmSpec":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _word(value) -> str:
    return {None: "none", True: "true", False: "false"}.get(value, value) if not isinstance(value, str) else value


def _unword(value: str):
    return {"none": None, "true": True, "false": False}.get(value, value)


def as_spec(value, dtype: str = "float16") -> GemmSpec:
    """A spec from a :class:`GemmSpec`, its text, its dict, or None (the default for ``dtype``)."""
    if value is None or value == "":
        return GemmSpec.default(dtype)
    if isinstance(value, GemmSpec):
        return value
    if isinstance(value, str):
        return GemmSpec.parse(value, dtype)
    if isinstance(value, dict):
        return GemmSpec.from_dict(value)
    raise ConfigError(f"spec={value!r} is {type(value).__name__}; pass a GemmSpec or its text (e.g. bias_float16)")


def text_is_fp8(text) -> bool:
    """Whether a spec's text (a tuning entry's or a candidate list's ``spec``; None or "": a 16-bit
    default) has fp8 operands. ``ConfigError`` for text :meth:`GemmSpec.parse` does not take."""
    return bool(text) and GemmSpec.parse(text).is_fp8


def epilogue_names() -> tuple[str, ...]:
    """The epilogue names :func:`spec_for` takes: ``none``, ``bias``, each activation, ``bias_`` +
    each activation (``bias_gelu_tanh``), each of those after ``alpha_`` (``alpha``,
    ``alpha_bias_relu``), and each with ``+residual`` (``residual`` alone: ``D = A.B^T + beta C``)."""
    acts = ACTIVATIONS[1:]
    heads = ("bias",) + acts + tuple(f"bias_{a}" for a in acts)
    heads = ("none",) + heads + ("alpha",) + tuple(f"alpha_{h}" for h in heads)
    gated = ("swiglu",) + tuple(f"gated_{a}" for a in acts if a != "silu")
    return heads + ("residual",) + tuple(f"{h}+residual" for h in heads[1:]) + gated


def spec_for(dtype: str, epilogue: str = "none") -> GemmSpec:
    """The spec of ``dtype`` in and out with the epilogue named (:func:`epilogue_names`: ``none``,
    ``bias``, ``relu``, ``bias_gelu_tanh``, ``alpha_bias+residual``, ...; the inverse of
    :attr:`GemmSpec.epilogue`)."""
    if epilogue not in epilogue_names():
        raise ConfigError(f"epilogue {epilogue!r} is not built; use one of {', '.join(epilogue_names())}")
    if epilogue == "swiglu" or epilogue.startswith("gated_"):
        act = "silu" if epilogue == "swiglu" else epilogue[len("gated_"):]
        return GemmSpec(a=dtype, b=dtype, d=dtype, act=act, gated=True)
    head, _, tail = epilogue.partition("+")
    residual = head == "residual" or tail == "residual"
    head = "none" if head == "residual" else head
    alpha = head == "alpha" or head.startswith("alpha_")
    head = "none" if head == "alpha" else head.removeprefix("alpha_")
    bias = head == "bias" or head.startswith("bias_")
    act = head[len("bias_"):] if head.startswith("bias_") else (head if head not in ("none", "bias") else "none")
    return GemmSpec.with_epilogue(dtype, bias, act, alpha, residual)


def spec_knobs(spec: GemmSpec | None) -> dict:
    """The knobs that carry ``spec`` to a rung: none for the default (or None)."""
    return {} if spec is None or spec.is_default() else {SPEC_KNOB: spec.text()}


def operand_bytes(spec: GemmSpec) -> int:
    """Bytes of one element of A (and B): what a ring stage holds per element of K."""
    return OPERAND_BYTES[spec.a]


def torch_name(dtype: str) -> str:
    """The torch (and TVM) name of one of our dtype names: ``float8_e4m3`` is ``float8_e4m3fn``."""
    return TORCH_NAMES.get(dtype, dtype)


def _fp8_not_built(spec: GemmSpec, rung: str, epilogues) -> str | None:
    """What of a spec with fp8 operands ``rung`` does not build, or None (see the module docstring)."""
    if spec.a != "float8_e4m3" or spec.b not in FP8_DTYPES:
        return (f"A={spec.a}, B={spec.b}: fp8 is built with A float8_e4m3 and B float8_e4m3 or float8_e5m2 "
                "(mixed fp8 and 16-bit operands are not built)")
    if spec.d not in DTYPES:
        return f"D={spec.d}: an fp8 GEMM is built with D in bfloat16 or float16 (fp32 out is not built yet)"
    if spec.acc != ACC_DTYPE:
        return f"acc={spec.acc}: only float32 accumulators are built"
    if spec.a_major != "K" or spec.b_major != "K":
        return f"a_major={spec.a_major}, b_major={spec.b_major}: {MN_MAJOR_FP8_FIX}"
    if spec.scales is None:
        return f"scales=None: an fp8 GEMM takes fp32 scales; use scales in {FP8_SCALES}"
    if spec.scales not in FP8_SCALES:
        return f"scales={spec.scales} is not built; use one of {FP8_SCALES}"
    if spec.grouped:
        return _grouped_fp8_not_built(spec, rung, epilogues)
    if spec.residual is not None or spec.act != "none":
        return "an fp8 GEMM is built with a bias at most (no residual or activation yet)"
    if spec.bias is not None and spec.bias not in (spec.d, ACC_DTYPE):
        return f"bias={spec.bias}: an fp8 GEMM's bias is built in D's dtype ({spec.d}) or float32"
    if SCALED not in epilogues:
        return (f"the scaled fp8 GEMM is not built for {rung}; it is built for v9, v10 (per-tensor and rowwise scales) "
                "and v11 (per-tensor)")
    return None


def _grouped_fp8_not_built(spec: GemmSpec, rung: str, epilogues) -> str | None:
    """What of a grouped fp8 spec ``rung`` does not build (issue 33's fp8 slice): e4m3 A and W,
    rowwise scales (``scale_a [M]`` a token, ``scale_b [G, N]`` an expert's column), D in 16 bits,
    nothing else in the epilogue, on rungs whose ``EPILOGUES`` list ``grouped`` and ``scaled`` (v12)."""
    if "grouped" not in epilogues or SCALED not in epilogues:
        return "the grouped fp8 GEMM is built on v12 only (gemm_ladder.scaled_grouped_mm)"
    if spec.b != "float8_e4m3":
        return (f"B={spec.b}: the grouped fp8 GEMM is built with e4m3 weights (torch._scaled_grouped_mm's); "
                "quantize W to torch.float8_e4m3fn")
    if spec.scales != "row":
        return (f"scales={spec.scales}: the grouped fp8 GEMM is built with rowwise scales only (scale_a [M] a token, "
                "scale_b [G, N] an expert's output column, torch._scaled_grouped_mm's); quantize rowwise "
                "(gemm_ladder.serve.grouped_fp8.quantize_experts), or use gemm_ladder.scaled_mm per expert for "
                f"{spec.scales} scales")
    if spec.bias is not None or spec.residual is not None or spec.act != "none" or spec.alpha or spec.gated:
        return "a grouped fp8 GEMM with a bias, a residual, an activation, alpha or a gated B is not built yet"
    return None


def not_built(spec: GemmSpec, rung: str, epilogues=("none",), mn_major: bool = False) -> str | None:
    """What of ``spec`` rung ``rung`` (whose ``EPILOGUES`` are ``epilogues``, and which loads
    MN-major operands where ``mn_major``: its ``MN_MAJOR``) does not build, or None."""
    if spec.is_fp8:
        return _fp8_not_built(spec, rung, epilogues)
    fp32_out = spec.d == "float32" and spec.a in DTYPES and spec.b == spec.a
    if spec.a not in DTYPES or spec.b != spec.a or (spec.d != spec.a and not fp32_out):
        return (f"A={spec.a}, B={spec.b}, D={spec.d}: only float16 or bfloat16 in, one dtype, and D in it or in "
                "float32, are built (fp8 and mixed dtypes are not built yet)")
    if spec.acc != ACC_DTYPE:
        return f"acc={spec.acc}: only float32 accumulators are built"
    if (spec.a_major != "K" or spec.b_major != "K") and not mn_major:
        return (f"a_major={spec.a_major}, b_major={spec.b_major}: {rung} builds only K-major A [M, K] and B [N, K] "
                "(MN-major operands are built for v9; pass B as [N, K], like nn.Linear.weight, or use v9)")
    if spec.scales is not None:
        return f"scales={spec.scales}: scaled (fp8) GEMMs are not built yet"
    if spec.grouped != ("grouped" in epilogues):
        return ("grouped GEMM is built on v12 only (gemm_ladder.grouped_mm)" if spec.grouped
                else f"{rung} is the grouped GEMM: its spec must be grouped (grouped_true); use v9 for one GEMM")
    if spec.grouped and (spec.bias is not None or (spec.act != "none" and not spec.gated) or spec.alpha
                         or spec.residual or fp32_out):
        return ("a grouped GEMM with a bias or an activation (or alpha, a residual, a float32 D) is not built yet; "
                "its one fused epilogue is a gated W_gu (SwiGLU: gemm_ladder.grouped_swiglu)")
    if spec.grouped and spec.gated and "gated" not in epilogues:
        return f"a grouped GEMM with a gated B (SwiGLU) is not built for {rung}; it is built for v12"
    if spec.residual is not None and spec.residual != spec.d:
        return f"residual={spec.residual}: a residual C is built in D's dtype ({spec.d}) only"
    if spec.bias is not None and spec.bias != spec.d:
        return f"bias={spec.bias}: a bias is built in D's dtype ({spec.d}) only"
    if spec.gated and (spec.act == "none" or spec.bias or spec.alpha or spec.residual or fp32_out
                       or (spec.a_major, spec.b_major) != ("K", "K")):
        return ("a gated B (SwiGLU) is built with an activation of the gate and nothing else: no bias, alpha, "
                "residual, float32 D or MN-major operand yet (and act='none' is no gate)")
    # a gated B's activation is the gate's, part of "gated" (v12 builds it without the plain activations)
    missing = [part for part, on in (("bias", spec.bias), ("act", spec.act != "none" and not spec.gated),
                                     ("alpha", spec.alpha),
                                     ("residual", spec.residual), ("fp32_out", fp32_out), ("gated", spec.gated))
               if on and part not in epilogues]
    if missing:
        return (f"epilogue {spec.epilogue!r} is not built for {rung} (its epilogue has no {' and no '.join(missing)}; "
                f"it builds {', '.join(epilogues)}); the bias, the activations, alpha, the residual and a float32 D "
                "are built for v9 and v10, the bias, the activations and alpha for v11 too")
    return None


def torch_activation(x, act: str):
    """``act`` (one of ACTIVATIONS) as torch computes it on ``x`` (a new tensor; ``x`` for ``none``):
    the reference and the fallback of the fused activation, in ``x``'s dtype (fp64 for a reference)."""
    # optional: torch, the caller's (this module imports no torch otherwise)
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel

    if act not in ACTIVATIONS:
        raise ConfigError(f"activation {act!r}: use one of {', '.join(ACTIVATIONS)}")
    if act == "none":
        return x
    if act == "relu":
        return F.relu(x)
    if act == "silu":
        return F.silu(x)
    return F.gelu(x, approximate="tanh" if act == "gelu_tanh" else "none")


def spec_of(cfg) -> GemmSpec:
    """The spec of a :class:`gemm_ladder.core.config.GemmConfig`: its ``spec`` knob, else the default
    for its dtype."""
    return as_spec(dict(cfg.extra).get(SPEC_KNOB), cfg.dtype)


def check_built(spec: GemmSpec, rung: str, epilogues=("none",), mn_major: bool = False) -> None:
    """Refuse, with a :class:`ConfigError` naming what is not built yet, a spec ``rung`` does not build."""
    why = not_built(spec, rung, epilogues, mn_major)
    if why is not None:
        raise ConfigError(f"{rung}: spec {spec.text()}: {why}")


def spec_of_manifest(manifest: dict) -> GemmSpec:
    """The spec of a module's manifest or a pack's entry: its ``spec`` field, else the ``spec``
    knob, else (a module built before the spec existed) the default for its dtype."""
    if isinstance(manifest.get("spec"), dict):
        return GemmSpec.from_dict(manifest["spec"])
    knobs = manifest.get("knobs") or {}
    return as_spec(knobs.get(SPEC_KNOB), manifest.get("dtype") or knobs.get("dtype") or "float16")
