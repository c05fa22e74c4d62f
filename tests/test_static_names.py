"""Names that no code defines, found without running anything (pyflakes).

A refactor once left ``suite.time_case`` reading a variable that had moved into ``harness``; the
case ran only on a GPU, so every CPU test passed while ``suite run`` failed all 78 cases there.
Code that only a GPU reaches is the code CI cannot run: a static check of every module catches
this class of slip on the CPU.
"""

from pathlib import Path

import pytest
from pyflakes import api, messages, reporter

REPO = Path(__file__).resolve().parent.parent
TREES = ("gemm_ladder", "layouts", "schedulers", "benchmarks", "tests", "tutorials")
# TVMScript buffer dtypes written as strings in annotations (``T.Buffer((n,), "int32")``) look
# like forward references to pyflakes; they are not Python names. (UndefinedLocal is not checked:
# TVMScript's ``@T.inline`` closures assign their enclosing kernel's locals, which Python would not.)
TVM_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
              "float32", "float64", "bool", "handle"}


class _Collect(reporter.Reporter):
    def __init__(self):
        super().__init__(None, None)
        self.found = []

    def flake(self, message):
        self.found.append(message)

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802 (pyflakes' name)
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def unexpectedError(self, filename, msg):  # noqa: N802
        self.found.append(f"{filename}: {msg}")


def _undefined(path: Path) -> list[str]:
    rep = _Collect()
    api.checkPath(str(path), rep)
    out = []
    for m in rep.found:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, (messages.UndefinedName, messages.UndefinedExport)):
            if isinstance(m, messages.UndefinedName) and m.message_args[0] in TVM_DTYPES:
                continue
            out.append(f"{m.filename}:{m.lineno}: {m.message % m.message_args}")
    return out


@pytest.mark.parametrize("tree", TREES)
def test_no_undefined_names(tree):
    files = sorted((REPO / tree).rglob("*.py"))
    assert files, f"{tree} holds no Python files"
    problems = [p for f in files for p in _undefined(f)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(ms):\n    return per_set / ms\n")
    assert any("per_set" in p for p in _undefined(bad))
