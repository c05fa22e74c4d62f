"""One reader for every file the project reads, and one error type for what is wrong with one.

Module manifests (``X.so.json``), folder manifests, kernel packs' ``pack.json``, the tuning
database, measurements and run files, plan files and suite results all come in through
:func:`read_text` / :func:`read_json` and are checked against a schema written once, beside
the format it describes (``manifest.MANIFEST_SCHEMA``, ``kernel_pack.PACK_SCHEMA``,
``tuning_db.ENTRY_SCHEMA``, ...)::

    data = records.read_json(path, "kernel pack manifest", fix="rebuild it with ...",
                             schema=Obj({"modules": List(ENTRY)}), error=PackError)

Whatever is wrong, a missing file, a folder, bytes that are not UTF-8 text, a file cut short,
JSON nested deeper than :data:`MAX_DEPTH` (the standard parser would overflow the stack), a
field missing or of the wrong type or out of range, raises :class:`RecordError` (or the subclass
the caller names: ``ManifestError``, ``PackError``, ``PlanError``) whose message is one line:
the file, the field (``field 'modules[1].m_range'``), what is wrong, and the fix. Nothing else
escapes a reader: no ``JSONDecodeError``, ``UnicodeDecodeError``, ``RecursionError``, and no
``KeyError``/``TypeError``/``ZeroDivisionError`` later in code that trusted a checked field.

A schema is a tree of specs: :class:`Int`, :class:`Num`, :class:`Str`, :class:`Bool`,
:class:`List`, :class:`Obj`, :class:`Map`, :class:`Either`, :class:`Maybe` and :class:`Check`
(any rule a type cannot say, as a function that returns the problem or None). :func:`problem`
checks one value without raising, for files whose entries are skipped one by one (the tuning
database).

Standard library only: a GPU box reads manifests and ``pack.json`` through this module from a
runtime pack (``gemm_ladder.serve.pack``), with no network to install anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MAX_DEPTH = 32  # the deepest file written here nests 6 levels (a run file's reports)
MAX_BYTES = 64 * 2**20  # the largest (a run file of many folders) is a few MiB
# a JSON string (skipped whole: brackets inside it do not nest) or a bracket
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class RecordError(ValueError):
    """A file the project reads is missing, unreadable, or does not hold what it should.

    ``str(err)`` is one line naming the file, the field and the fix; ``path``, ``field`` (e.g.
    ``modules[1].m_range``, or None) and ``fix`` are kept apart for callers that want them."""

    def __init__(self, message: str, path=None, field: str | None = None, fix: str | None = None):
        super().__init__(" ".join(str(message).split()))
        self.path, self.field, self.fix = path, field, fix


# -- specs ------------------------------------------------------------------------------------
class _Bad(Exception):
    """A spec's finding: where in the value (a tuple of keys and indices) and what is wrong."""

    def __init__(self, at: tuple, problem: str):
        super().__init__(problem)
        self.at, self.problem = at, problem


def kind(value) -> str:
    """What a JSON value is, in words: ``an int``, ``a string``, ``a list``, ``null``..."""
    if value is None:
        return "null"
    for t, words in ((bool, "a bool"), (int, "an int"), (float, "a number"), (str, "a string"),
                     (list, "a list"), (dict, "an object")):
        if isinstance(value, t):
            return words
    return f"a {type(value).__name__}"


def show(value, limit: int = 60) -> str:
    """A short one-line ``repr`` of a value, for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field_name(at) -> str:
    """``("modules", 1, "m_range")`` -> ``modules[1].m_range``."""
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Spec:
    """Any value; subclasses check a type and its bounds (``check`` returns the value or raises)."""

    def check(self, value, at: tuple = ()):
        return value


ANY = Spec()


class Int(Spec):
    """An int (not a bool), within ``[lo, hi]`` where given."""

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def check(self, value, at=()):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not an int")
        if self.lo is not None and value < self.lo:
            raise _Bad(at, f"is {value}, less than {self.lo}")
        if self.hi is not None and value > self.hi:
            raise _Bad(at, f"is {value}, more than {self.hi}")
        return value


class Num(Spec):
    """A finite number (an int or a float, not a bool), above 0 with ``positive``."""

    def __init__(self, positive: bool = False):
        self.positive = positive

    def check(self, value, at=()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise _Bad(at, f"is {value}, not a finite number")
        if self.positive and value <= 0:
            raise _Bad(at, f"is {value}, not above 0")
        return value


class Str(Spec):
    """A string; one of ``choices``, or matching ``pattern`` (whole) where given."""

    def __init__(self, choices=None, pattern: str | None = None, example: str | None = None):
        self.choices = tuple(choices) if choices is not None else None
        self.pattern = re.compile(pattern) if pattern else None
        self.example = example

    def check(self, value, at=()):
        if not isinstance(value, str):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not a string")
        if self.choices is not None and value not in self.choices:
            raise _Bad(at, f"is {show(value)}, not one of {', '.join(self.choices)}")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise _Bad(at, f"is {show(value)}, not of the form {self.example or self.pattern.pattern}")
        return value


class Bool(Spec):
    """true or false."""

    def check(self, value, at=()):
        if not isinstance(value, bool):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not true or false")
        return value


class List(Spec):
    """A list of ``item``; exactly ``length`` items, or at least ``min_len``, where given."""

    def __init__(self, item: Spec = ANY, length: int | None = None, min_len: int = 0, what: str | None = None):
        self.item, self.length, self.min_len, self.what = item, length, min_len, what

    def check(self, value, at=()):
        if not isinstance(value, list):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not a list" + (f" ({self.what})" if self.what else ""))
        if self.length is not None and len(value) != self.length:
            raise _Bad(at, f"has {len(value)} items, not {self.length}" + (f" ({self.what})" if self.what else ""))
        if len(value) < self.min_len:
            raise _Bad(at, f"has {len(value)} items, fewer than {self.min_len}")
        for i, item in enumerate(value):
            self.item.check(item, at + (i,))
        return value


class Obj(Spec):
    """An object with the ``fields`` (each required) and, where present, the ``optional`` ones;
    other keys are allowed (a newer writer may add some)."""

    def __init__(self, fields: dict | None = None, optional: dict | None = None):
        self.fields, self.optional = dict(fields or {}), dict(optional or {})

    def check(self, value, at=()):
        if not isinstance(value, dict):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not an object")
        for name, spec in self.fields.items():
            if name not in value:
                raise _Bad(at + (name,), "is missing")
            spec.check(value[name], at + (name,))
        for name, spec in self.optional.items():
            if name in value:
                spec.check(value[name], at + (name,))
        return value


class Map(Spec):
    """An object whose every value is ``value`` (its keys: any name, or matching ``key``)."""

    def __init__(self, value: Spec = ANY, key: str | None = None):
        self.value, self.key = value, re.compile(key) if key else None

    def check(self, value, at=()):
        if not isinstance(value, dict):
            raise _Bad(at, f"is {kind(value)} ({show(value)}), not an object")
        for k, v in value.items():
            if self.key is not None and not self.key.fullmatch(k):
                raise _Bad(at + (k,), f"is not a valid name (want {self.key.pattern})")
            self.value.check(v, at + (k,))
        return value


class Either(Spec):
    """The first of ``specs`` that takes the value; else ``what`` it should have been."""

    def __init__(self, *specs: Spec, what: str):
        self.specs, self.what = specs, what

    def check(self, value, at=()):
        for spec in self.specs:
            try:
                return spec.check(value, at)
            except _Bad:
                continue
        raise _Bad(at, f"is {kind(value)} ({show(value)}), not {self.what}")


class Maybe(Spec):
    """null, or ``spec``."""

    def __init__(self, spec: Spec):
        self.spec = spec

    def check(self, value, at=()):
        return value if value is None else self.spec.check(value, at)


class Check(Spec):
    """``spec``, then ``rule(value)``: None, or what is wrong (a rule a type cannot say)."""

    def __init__(self, spec: Spec, rule):
        self.spec, self.rule = spec, rule

    def check(self, value, at=()):
        self.spec.check(value, at)
        found = self.rule(value)
        if found:
            raise _Bad(at, found)
        return value


def _plain_name(name: str) -> str | None:
    if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        return f"is {show(name)}, not a plain file name in the folder"
    return None


# specs several formats share
FILE_NAME = Check(Str(), _plain_name)  # a file inside the folder the record describes
SHAPE = List(Int(lo=1), length=3, what="[M, N, K], each at least 1")
# a built module's knob (a watchdog bound may be a float; the tuning database is stricter)
KNOB_VALUE = Either(Int(), Bool(), Num(), Str(), what="an int, a bool, a number or a name")


# -- checking ---------------------------------------------------------------------------------
def problem(value, spec: Spec) -> str | None:
    """What is wrong with ``value`` against ``spec`` (``field 'x' is missing``), or None."""
    try:
        spec.check(value)
    except _Bad as bad:
        return (f"field {field_name(bad.at)!r} " if bad.at else "") + bad.problem
    return None


def validate(data, spec: Spec, path, fix: str, error: type = RecordError):
    """``data`` (read from ``path``) if ``spec`` takes it, else ``error`` naming the field and ``fix``."""
    try:
        return spec.check(data)
    except _Bad as bad:
        where = f"field {field_name(bad.at)!r} " if bad.at else "holds a value that "
        raise error(f"{path}: {where}{bad.problem}: {fix}", path=path, field=field_name(bad.at) or None,
                    fix=fix) from None


# -- reading ----------------------------------------------------------------------------------
def read_text(path, what: str, fix: str, error: type = RecordError, max_bytes: int = MAX_BYTES) -> str:
    """The text of ``path`` (a ``what``: "plan", "tuning database"...), or ``error``: missing, a
    folder, unreadable, larger than ``max_bytes``, or not UTF-8 text."""
    path = Path(path)

    def fail(msg):
        return error(f"{what} {path} {msg}: {fix}", path=path, fix=fix)

    try:
        if not path.exists():
            raise fail("does not exist")
        if path.is_dir():
            raise fail("is a folder, not a file")
        if not path.is_file():  # a pipe or a device: reading it could wait forever
            raise fail("is not a regular file (a pipe or a device?)")
        size = path.stat().st_size
        if size > max_bytes:
            raise fail(f"is {size} bytes, more than a {what} can be ({max_bytes} bytes)")
        raw = path.read_bytes()
    except OSError as err:
        raise fail(f"cannot be read ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise fail(f"is not text (byte {err.start} is not UTF-8: a binary file?)") from None
    if "\x00" in text:
        raise fail(f"is not text (a NUL byte at {text.index(chr(0))}: a binary file?)")
    return text


def depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep the brackets of JSON ``text`` nest (strings skipped); stops counting past ``limit``."""
    level = deepest = 0
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            level += 1
            if level > deepest:
                deepest = level
                if deepest > limit:
                    break
        elif c in "]}":
            level -= 1
    return deepest


def parse_json(text: str, path, what: str, fix: str, schema: Spec | None = None, error: type = RecordError):
    """``text`` (the contents of ``path``) parsed, nesting bounded, and checked against ``schema``."""

    def fail(msg):
        return error(f"{what} {path} {msg}: {fix}", path=path, fix=fix)

    if not text.strip():
        raise fail("is empty (a copy cut short?)")
    if depth(text) > MAX_DEPTH:
        raise fail(f"nests deeper than {MAX_DEPTH} levels, which no {what} does")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        cut = "; cut short, a truncated copy?" if text.rstrip()[-1:] not in ("}", "]") else ""
        raise fail(f"is not valid JSON ({err.msg} at line {err.lineno}{cut})") from None
    except (ValueError, RecursionError) as err:  # an int of more digits than Python converts
        raise fail(f"is not valid JSON ({' '.join(str(err).split())[:120]})") from None
    return data if schema is None else validate(data, schema, path, fix, error)


def read_json(path, what: str, fix: str, schema: Spec | None = None, error: type = RecordError):
    """The JSON in ``path``, checked (see :func:`read_text`, :func:`parse_json`); ``what`` names
    the kind of file in messages (``records.read_json(p, "suite result", fix=...)``)."""
    return parse_json(read_text(path, what, fix, error), path, what, fix, schema, error)
