"""The types of the command line's arguments: each turns a string into what a command uses, or
refuses it with a message that says what would work.

argparse calls a type with the argument's text; an :class:`argparse.ArgumentTypeError` becomes
``python -m gemm_ladder build: error: argument --shape: shape '0x128x64': sizes must be positive``
and exit status 2, before any command starts. Every reader of the command line
(``gemm_ladder.cli``, ``cli_front``, ``tune.serve``, ``barriers.ladder``) takes its types from
here: one shape parser, one count, one list of names.

    p.add_argument("--jobs", type=cli_types.count)                     # 1 or more
    p.add_argument("--dtypes", type=cli_types.names(DTYPES, "dtype"))  # float16,bfloat16
    p.add_argument("--knob", action=cli_types.AppendOnce, type=cli_types.knob)  # each name once
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

from .config import KNOB_NAME, ConfigError, parse_knob_value

_PYTHON = re.compile(r"3\.\d+")
_HOST = re.compile(r"[A-Za-z0-9_.:-]+")


def _refuse(message: str):
    return argparse.ArgumentTypeError(message)


def _int(text: str, example: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _refuse(f"{text!r} is not a whole number, e.g. {example}") from None


def count(text: str) -> int:
    """A whole number, 1 or more: processes, repetitions, rows, candidates per batch, an SM count."""
    n = _int(text, "4")
    if n < 1:
        raise _refuse(f"{n} is not a count: give 1 or more")
    return n


def count_or_zero(text: str) -> int:
    """A whole number, 0 or more (where 0 has a meaning the option's help gives)."""
    n = _int(text, "3")
    if n < 0:
        raise _refuse(f"{n} is negative: give 0 or more")
    return n


def positive(text: str) -> float:
    """A finite number above 0: seconds, MiB."""
    try:
        x = float(text)
    except ValueError:
        raise _refuse(f"{text!r} is not a number, e.g. 300") from None
    if not math.isfinite(x) or x <= 0:
        raise _refuse(f"{text} is not a positive finite number, e.g. 300")
    return x


def whole_numbers(minimum: int, example: str):
    """Comma-separated whole numbers, each ``minimum`` or more (``--seeds 0,1``, ``--m 16,128``)."""

    def parse(text: str) -> list[int]:
        try:
            values = [_int(x.strip(), example) for x in text.split(",")]
        except argparse.ArgumentTypeError as err:
            raise _refuse(f"{text!r}: {err}") from None
        low = [v for v in values if v < minimum]
        if low:
            raise _refuse(f"{text!r}: {low[0]} is below {minimum}; give whole numbers of {minimum} or more, "
                          f"e.g. {example}")
        return values

    parse.__name__ = "whole numbers"
    return parse


def shape(text: str) -> tuple[int, int, int]:
    """``MxNxK`` (``4096x4096x4096``): three whole numbers, each 1 or more."""
    parts = text.lower().split("x")
    try:
        M, N, K = (int(x) for x in parts)
    except ValueError:
        raise _refuse(f"shape {text!r} is not MxNxK, e.g. 4096x4096x4096") from None
    if min(M, N, K) < 1:
        raise _refuse(f"shape {text!r}: sizes must be positive, e.g. 4096x4096x4096")
    return M, N, K


def shapes(text: str) -> list[tuple[int, int, int]]:
    """Comma-separated shapes: ``16x4096x4096,2048x6144x4096``."""
    try:
        return [shape(s.strip()) for s in text.split(",")]
    except argparse.ArgumentTypeError as err:
        raise _refuse(f"shapes {text!r}: {err}") from None


def weight(text: str) -> tuple[int, int]:
    """``NxK`` (``4096x4096``): a weight of N rows (output features) and K columns (input
    features), each 1 or more; M is left out (a pack builds the weight's whole M range)."""
    parts = text.lower().split("x")
    if len(parts) == 3:
        raise _refuse(f"weight {text!r} has three sizes: a weight is NxK, e.g. 4096x4096 (MxNxK is a shape: "
                      f"pack build --shapes)")
    try:
        N, K = (int(x) for x in parts)
    except ValueError:
        raise _refuse(f"weight {text!r} is not NxK (N output features, K input features), e.g. 4096x4096") from None
    if min(N, K) < 1:
        raise _refuse(f"weight {text!r}: N and K must be positive, e.g. 4096x4096")
    return N, K


def weights(text: str) -> list[tuple[int, int]]:
    """Comma-separated weights: ``4096x4096,6144x4096``."""
    try:
        return [weight(s.strip()) for s in text.split(",")]
    except argparse.ArgumentTypeError as err:
        raise _refuse(f"weights {text!r}: {err}") from None


GROUPED_LAYOUTS = ("contiguous", "masked")  # v12's (a pack request without one builds both)


def grouped_weight(text: str) -> tuple:
    """``E,N,K[,layout][,swiglu]`` (``8,14336,4096,masked``): an expert weight ``[E, N, K]`` (E experts,
    each an ``nn.Linear`` of N outputs and K inputs) for the grouped GEMM, in one layout or (none
    named) both; the flag repeats for more weights. ``swiglu`` (``8,28672,4096,swiglu``): N = 2I rows an
    expert are its cat([W_gate, W_up]) for ``grouped_swiglu`` (contiguous) and ``grouped_swiglu_masked``
    (masked): a 5-tuple ending in ``"swiglu"``, where the others are ``(E, N, K, layout or None)``."""
    parts = [p.strip() for p in text.split(",")]
    swiglu = len(parts) > 3 and parts[-1] == "swiglu"
    if swiglu:
        parts = parts[:-1]
    if len(parts) not in (3, 4):
        raise _refuse(f"grouped weight {text!r} is not E,N,K or E,N,K,layout (experts, output and input features "
                      f"of each, and {' or '.join(GROUPED_LAYOUTS)}), e.g. 8,14336,4096 or 64,1408,2048,masked "
                      "(a gated W_gu for grouped_swiglu: 8,28672,4096,swiglu)")
    if len(parts) == 4 and parts[3] not in GROUPED_LAYOUTS:
        raise _refuse(f"grouped weight {text!r}: layout {parts[3]!r} is not {' or '.join(GROUPED_LAYOUTS)}; leave "
                      "it out for both (or end with swiglu for a gated W_gu)")
    E, N, K = (_int(x, "8,14336,4096") for x in parts[:3])
    if min(E, N, K) < 1:
        raise _refuse(f"grouped weight {text!r}: E, N and K must be positive, e.g. 8,14336,4096")
    if swiglu:
        if N % 2:
            raise _refuse(f"grouped weight {text!r}: a swiglu W_gu has N = 2I rows an expert (gate, then up): "
                          f"N={N} is odd")
        return E, N, K, parts[3] if len(parts) == 4 else None, "swiglu"
    return E, N, K, parts[3] if len(parts) == 4 else None


def one_of(known, what: str):
    """One name of ``known`` (a positional argument that may repeat: ``check v5 v6``)."""
    known = tuple(known)

    def parse(text: str) -> str:
        if text not in known:
            raise _refuse(f"{text!r} is not a known {what}; give one of {', '.join(known)}")
        return text

    parse.__name__ = what
    return parse


def names(known, what: str):
    """Comma-separated names, each one of ``known``, each once (``--dtypes float16,bfloat16``)."""
    known = tuple(known)

    def parse(text: str) -> list[str]:
        got = [x.strip() for x in text.split(",")]
        for x in got:
            if x not in known:
                raise _refuse(f"{x!r} is not a known {what}; give one or more of {','.join(known)}")
        if len(set(got)) < len(got):
            raise _refuse(f"{text!r} names a {what} twice; give each once")
        return got

    parse.__name__ = f"{what} list"
    return parse


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    n = _int(text, "9190")
    if not 1 <= n <= 65535:
        raise _refuse(f"{n} is not a TCP port: give 1 to 65535, e.g. 9190")
    return n


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:9190``): a host name or address and a port, both given."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not _HOST.fullmatch(host):
        raise _refuse(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:9190")
    return host, port(port_text)


def out_file(text: str) -> str:
    """A file to write (``bench --out``, ``tune --run-out``): not a folder, and in a folder that is
    writable or can be made, so a run's result is not lost at its end for a mistyped path. Nothing
    is created here (``files.open_folder`` makes the folder when the command writes)."""
    path = Path(text).absolute()
    if path.is_dir():
        raise _refuse(f"{text} is a folder; give a file path, e.g. {Path(text) / 'result.json'}")
    there = next(p for p in path.parents if p.exists())
    if not there.is_dir():
        raise _refuse(f"{text} cannot be written: {there} is a file, not a folder")
    if not os.access(there, os.W_OK | os.X_OK):
        raise _refuse(f"{text} cannot be written: {there} is not writable")
    return text


def python_version(text: str) -> str:
    """A Python 3 version as ``X.Y``: ``3.12``."""
    if not _PYTHON.fullmatch(text):
        raise _refuse(f"{text!r} is not a Python version X.Y, e.g. 3.12")
    return text


def word(text: str) -> str:
    """A non-empty name with no spaces or commas (a tracker key, a GPU entry)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", text):
        raise _refuse(f"{text!r} is not a name (letters, digits, _ . -), e.g. h200")
    return text


def knob(text: str) -> tuple[str, int | str | bool]:
    """``name=value``: an int (``pipe_depth=4``), a switch (``stream_k=true``: true or false, any
    case) or a name (``tile_order=snake``), read by ``config.parse_knob_value`` as everywhere."""
    name, eq, value = text.partition("=")
    if not eq or not KNOB_NAME.fullmatch(name.strip()):
        raise _refuse(f"knob {text!r} is not name=value, e.g. pipe_depth=4")
    try:
        return name.strip(), parse_knob_value(value, name.strip())
    except ConfigError as err:
        raise _refuse(str(err)) from None


def words(text: str) -> list[str]:
    """Comma-separated names (``--gpus 0,1``), each a :func:`word`."""
    return [word(x.strip()) for x in text.split(",")]


class AppendOnce(argparse.Action):
    """``action="append"`` of ``(name, value)`` pairs that refuses a name given twice: a repeated
    ``--knob pipe_depth=3 --knob pipe_depth=4`` is a mistake, not a request for the last one."""

    def __call__(self, parser, namespace, values, option_string=None):
        pairs = list(getattr(namespace, self.dest, None) or [])
        name, value = values
        for seen, before in pairs:
            if seen == name:
                raise argparse.ArgumentError(self, f"{name} is given twice ({before} and {value}); give it once")
        setattr(namespace, self.dest, pairs + [values])


def glue_values(argv) -> list[str]:
    """``--shape -1x8x8`` as ``--shape=-1x8x8``. argparse takes a word that starts with ``-`` for
    an option unless it is a plain negative number, and then says only "expected one argument";
    glued, the value reaches its type, which says what is wrong with it. No option of this CLI
    starts with a dash and a digit."""
    out: list[str] = []
    for item in argv:
        prev = out[-1] if out else ""
        if re.match(r"-\d", item) and prev.startswith("--") and prev != "--" and "=" not in prev:
            out[-1] = f"{prev}={item}"
        else:
            out.append(item)
    return out
