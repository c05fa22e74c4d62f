"""The rung files as text: a rung's source, the diff between two rungs, one function.

Found without importing the rungs (hence without TVM): the tutorials show the code of the
technique they teach.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rung_source_path(rung: str, arch: str = "sm_90a") -> Path:
    """The file of ``rung``'s form for ``arch`` (found without importing it, hence without TVM)."""
    name = f"gemm_ladder.{arch.replace('_', '')}.hgemm_{rung}"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"rung {rung} has no form for {arch} yet: {name.replace('.', '/')}.py does not exist"
        )
    return Path(spec.origin)


def _strip_module_docstring(text: str) -> str:
    """The file without its module docstring (the notebooks explain the technique in prose)."""
    tree = ast.parse(text)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = text.splitlines(keepends=True)
        rest = lines[tree.body[0].end_lineno:]
        while rest and not rest[0].strip():
            rest = rest[1:]
        return "".join(rest)
    return text


def rung_source(rung: str, arch: str = "sm_90a", docstring: bool = False) -> str:
    """The source of a rung file, by default without its module docstring."""
    text = rung_source_path(rung, arch).read_text()
    return text if docstring else _strip_module_docstring(text)


def diff_text(prev: str, rung: str, arch: str = "sm_90a", context: int = 3, docstring: bool = False) -> str:
    """Unified diff between the files of rungs ``prev`` and ``rung`` (docstrings left out by default)."""
    a = rung_source(prev, arch, docstring).splitlines(keepends=True)
    b = rung_source(rung, arch, docstring).splitlines(keepends=True)
    pa = rung_source_path(prev, arch).relative_to(REPO) if REPO in rung_source_path(prev, arch).parents else prev
    pb = rung_source_path(rung, arch).relative_to(REPO) if REPO in rung_source_path(rung, arch).parents else rung
    return "".join(difflib.unified_diff(a, b, fromfile=str(pa), tofile=str(pb), n=context))


def rung_diff(prev: str, rung: str, arch: str = "sm_90a", context: int = 3, docstring: bool = False) -> None:
    """Print what ``rung`` changed against ``prev``: a unified diff of the two rung files.

    Everything the rungs share (layouts, wgmma issue, epilogues, barriers) lives in
    ``gemm_ladder/<arch>/common.py`` and other modules, so the diff is the new technique.
    """
    text = diff_text(prev, rung, arch, context, docstring)
    added = sum(1 for line in text.splitlines() if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in text.splitlines() if line.startswith("-") and not line.startswith("---"))
    print(f"# {prev} -> {rung} ({arch}): +{added} -{removed} lines, module docstrings left out\n")
    print(text if text else "(no difference)")


def function_source(rung: str, name: str, arch: str = "sm_90a") -> str:
    """The source of top-level function ``name`` of a rung file (read with ``ast``, no import)."""
    text = rung_source_path(rung, arch).read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(text.splitlines(keepends=True)[start - 1:node.end_lineno])
    raise KeyError(f"{rung_source_path(rung, arch).name} has no top-level function {name!r}")


def show_source(obj, name: str | None = None, arch: str = "sm_90a") -> None:
    """Print the source of a package object (``common.load_tile_sync``) or of a rung's function
    (``show_source("v1", "kernel")``). ``@T.inline`` helpers are shown from their file."""
    if isinstance(obj, str):
        text = function_source(obj, name, arch) if name else rung_source(obj, arch)
        where = f"{rung_source_path(obj, arch).name}" + (f": {name}" if name else "")
    else:
        target = _unwrap(obj)
        try:
            text = inspect.getsource(target)
            where = f"{inspect.getsourcefile(target)}".replace(str(REPO) + "/", "")
        except (TypeError, OSError):
            text, where = _source_by_name(obj)
    print(f"# {where}\n{text}")


def _unwrap(obj):
    """The Python function behind a TVMScript helper: ``@T.inline`` returns a wrapper whose
    closure holds the parser object, whose ``.func`` is the function as written."""
    seen = 0
    while seen < 4:
        seen += 1
        inner = getattr(obj, "__wrapped__", None) or getattr(obj, "func", None)
        if inner is None:
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    content = cell.cell_contents
                except ValueError:
                    continue
                if callable(getattr(content, "func", None)):
                    inner = content.func
                    break
        if inner is None or inner is obj:
            return obj
        obj = inner
    return obj


def _source_by_name(obj) -> tuple[str, str]:
    """Fallback for wrapped objects: find ``def <name>`` in the module the object came from."""
    name = getattr(obj, "__name__", None) or getattr(obj, "name", None)
    module = getattr(obj, "__module__", None)
    if not name or not module:
        raise TypeError(f"cannot find the source of {obj!r}")
    spec = importlib.util.find_spec(module)
    text = Path(spec.origin).read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            body = "".join(text.splitlines(keepends=True)[start - 1:node.end_lineno])
            return body, spec.origin.replace(str(REPO) + "/", "")
    raise TypeError(f"cannot find def {name} in {spec.origin}")
