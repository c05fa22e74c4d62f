"""What one tuning run covers: a list of (rung, shape, dtype) jobs, from the CLI or a plan file.

A plan file has one rung per line with its shapes; ``#`` starts a comment::

    # a model's weight shapes (N x K) at three token counts (M), and two square shapes
    v6 M=128,1024,4096 NK=4096x4096,11008x4096,4096x11008
    v9 4096x4096x4096 8192x8192x8192 dtype=float16,bfloat16 pipe_depth=3,4

On a line: the rung first; then shapes ``MxNxK``, and/or ``M=`` with ``NK=`` (every M with
every weight shape); ``dtype=`` (default: the run's; ``float8_e4m3``: ``scaled_mm``'s fp8 kernel, with
``fp8_scales=`` recipes, default ``tensor``, and ``fp8_out=`` D's dtypes, default ``bfloat16``: one job
each; the job's dtype is D's and its ``spec`` the operand spec); any other ``knob=v1,v2`` narrows that
rung's space (``tune --space`` syntax; each value read by ``config.parse_knob_value``, as
``--knob`` reads it: ``stream_b=true,false`` is two switches). Jobs are listed in the order
written, each once; a plan lists at most :data:`MAX_JOBS`.

The file is read by ``records.read_text``: a missing, unreadable or binary file, like a line that
does not parse, raises :class:`PlanError` naming the file, the line and the fix.

Pure Python (no TVM): the GPU box reads plans too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core import records
from ..core.config import DTYPES, KNOB_NAME, ConfigError, parse_knob_value
from ..core.spec import FP8_DTYPES, FP8_SCALES, GemmSpec

_SHAPE = re.compile(r"^(\d{1,9})x(\d{1,9})x(\d{1,9})$")
_NK = re.compile(r"^(\d{1,9})x(\d{1,9})$")
MAX_JOBS = 4096  # a plan's jobs: each is a tuning run of up to hundreds of candidates
FP8 = FP8_DTYPES[0]  # the dtype word that asks for scaled_mm's fp8 kernel (A and B e4m3)
TUNE_DTYPES = DTYPES + (FP8,)  # what tune --dtype and a plan's dtype= take


@dataclass(frozen=True)
class Job:
    """One shape of one rung in one dtype; ``space`` narrows the rung's knobs (``{knob: [values]}``);
    ``spec``: the operand spec's text where it is not the dtype's default (an fp8 kernel's:
    :func:`fp8_spec`; ``dtype`` is then D's)."""

    rung: str
    shape: tuple[int, int, int]
    dtype: str = "float16"
    space: dict = field(default_factory=dict, compare=False, hash=False)
    spec: str | None = None

    def name(self, arch: str) -> str:
        """The job's candidate folder name: ``v6_4096x4096x4096_float16_sm_90a``; with a spec, its tag
        for the dtype (``v9_..._d_bfloat16-a_float8_e4m3-b_float8_e4m3-scales_tensor_sm_90a``)."""
        M, N, K = self.shape
        return f"{self.rung}_{M}x{N}x{K}_{GemmSpec.parse(self.spec).tag() if self.spec else self.dtype}_{arch}"


def fp8_spec(scales: str = "tensor", out: str = "bfloat16") -> str:
    """The operand spec's text of scaled_mm's fp8 kernel: A and B e4m3, ``scales`` recipe, D ``out``."""
    return GemmSpec.fp8(out, scales).text()


def _questions(dtypes, scales, outs, where: str, words=("fp8_scales=", "fp8_out=", "dtype=")) -> list[tuple]:
    """``(the config's dtype, spec text or None)`` of each dtype word: fp8's one per recipe and D dtype.
    ``words``: how the caller spells the three (a plan line's, or the CLI's flags)."""
    if (scales or outs) and FP8 not in dtypes:
        raise PlanError(f"{where}: {words[0]} and {words[1]} choose fp8 kernels: add {words[2]}{FP8}")
    bad = [x for x in scales if x not in FP8_SCALES] + [x for x in outs if x not in DTYPES]
    if bad:
        raise PlanError(f"{where}: {', '.join(bad)}: {words[0]} takes {', '.join(FP8_SCALES)}, {words[1]} "
                        f"{', '.join(DTYPES)}")
    out = []
    for d in dtypes:
        out += [(o, fp8_spec(r, o)) for r in scales or ["tensor"] for o in outs or ["bfloat16"]] if d == FP8 \
            else [(d, None)]
    return out


class PlanError(records.RecordError):
    """A plan that cannot be read, or a line that does not parse; the message names the file,
    the line and what would parse."""


def _ints(text: str, what: str, where: str) -> list[int]:
    words = [v.strip() for v in text.split(",") if v.strip()]
    if not all(re.fullmatch(r"[+-]?\d{1,9}", v) for v in words):
        raise PlanError(f"{where}: {what}={text!r} is not a list of ints, e.g. {what}=128,4096")
    values = [int(v) for v in words]
    if not values or any(v <= 0 for v in values):
        raise PlanError(f"{where}: {what}={text!r} needs positive ints, e.g. {what}=128,4096")
    return values


def parse_line(line: str, dtype: str = "float16", where: str = "plan") -> list[Job]:
    """The jobs of one plan line (none for a blank or comment line)."""
    words = line.split("#", 1)[0].split()
    if not words:
        return []
    rung, shapes, ms, nks, dtypes, space, scales, outs = words[0], [], [], [], [dtype], {}, [], []
    if not re.fullmatch(r"v\d+", rung):
        raise PlanError(f"{where}: a line starts with a rung (v6), not {rung!r}")
    for word in words[1:]:
        name, eq, value = word.partition("=")
        if not eq:
            m = _SHAPE.match(word.lower())
            if not m or 0 in (shape := tuple(int(x) for x in m.groups())):
                raise PlanError(f"{where}: {word!r} is neither MxNxK of positive ints (4096x4096x4096) nor name=values")
            shapes.append(shape)
        elif name == "M":
            ms += _ints(value, "M", where)
        elif name == "NK":
            for nk in value.lower().split(","):
                m = _NK.match(nk.strip())
                if not m or 0 in (n_k := tuple(int(x) for x in m.groups())):
                    raise PlanError(f"{where}: NK entry {nk!r} is not NxK of positive ints, e.g. NK=4096x11008")
                nks.append(n_k)
        elif name == "dtype":
            dtypes = [d for d in value.split(",") if d]
            bad = [d for d in dtypes if d not in TUNE_DTYPES]
            if bad or not dtypes:
                raise PlanError(f"{where}: dtype {','.join(bad) or value!r} is not one of {', '.join(TUNE_DTYPES)}")
        elif name in ("fp8_scales", "fp8_out"):
            (scales if name == "fp8_scales" else outs).extend(v for v in value.split(",") if v)
        elif not KNOB_NAME.fullmatch(name):
            raise PlanError(f"{where}: {word!r} does not start with a knob name, e.g. pipe_depth=3,4")
        else:
            try:
                space[name] = [parse_knob_value(v, name) for v in value.split(",") if v.strip()]
            except ConfigError as err:
                raise PlanError(f"{where}: {err}") from None
            if not space[name]:
                raise PlanError(f"{where}: {word!r} gives {name} no value, e.g. {name}=3,4")
    if bool(ms) != bool(nks):
        raise PlanError(f"{where}: M= and NK= go together (every M with every NxK), e.g. M=128,4096 NK=4096x4096")
    shapes += [(m, n, k) for m in ms for n, k in nks]
    if not shapes:
        raise PlanError(f"{where}: no shape for {rung}: give MxNxK, or M= with NK=")
    return [Job(rung, s, d, dict(space), spec) for d, spec in _questions(dtypes, scales, outs, where) for s in shapes]


def parse_plan(text: str, dtype: str = "float16", source: str = "plan") -> list[Job]:
    """All jobs of a plan, each once, in order."""
    jobs: list[Job] = []
    seen: set = set()
    for n, line in enumerate(text.splitlines(), 1):
        for job in parse_line(line, dtype, f"{source}:{n}"):
            if job not in seen:
                seen.add(job)
                jobs.append(job)
            if len(jobs) > MAX_JOBS:
                raise PlanError(f"{source}:{n}: the plan lists more than {MAX_JOBS} jobs: split it into several plans")
    if not jobs:
        raise PlanError(f"{source} lists no job: write lines like 'v6 4096x4096x4096'")
    return jobs


def read_plan(path, dtype: str = "float16") -> list[Job]:
    """The jobs of the plan file ``path`` (:class:`PlanError` if it cannot be read or parsed)."""
    fix = "give a text file of lines like 'v6 4096x4096x4096' (see gemm_ladder/tune/jobs.py)"
    text = records.read_text(path, "plan", fix, error=PlanError, max_bytes=2**20)
    return parse_plan(text, dtype, str(Path(path)))


def from_args(rung: str | None = None, shapes=(), path=None, dtype: str = "float16", fp8_scales=(),
              fp8_out=()) -> list[Job]:
    """The jobs of a run: a plan file's, or one rung at ``shapes`` (each once; ``dtype`` float8_e4m3: one
    job per recipe of ``fp8_scales`` and D dtype of ``fp8_out``); [] when neither is given."""
    if path:
        if rung or shapes:
            raise PlanError(f"the plan {path} lists rungs and shapes: give it alone, or a rung and shapes")
        if fp8_scales or fp8_out:
            raise PlanError(f"the plan {path} says its own dtypes: write fp8_scales= and fp8_out= on its lines")
        return read_plan(path, dtype)
    if not rung:
        return []
    asked = _questions([dtype], list(fp8_scales), list(fp8_out), "tune", ("--fp8-scales", "--fp8-out", "--dtype "))
    return list(dict.fromkeys(Job(rung, tuple(s), d, {}, spec) for d, spec in asked for s in shapes))
