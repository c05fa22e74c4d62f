"""The host side's shape: imports point one way, no module grows into two, nothing imports the CLI.

These walk the source (``ast``), so they see every import, at the top of a module or inside a
function, and import nothing themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gemm_ladder"
MAX_LINES = 500
RUNG_FOLDERS = ("sm90a", "sm100a")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_package(name: str, modules: dict) -> bool:
    return modules[name].name == "__init__.py"


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The gemm_ladder modules ``name`` imports, anywhere in its source."""
    out = set()
    here = name if _is_package(name, modules) else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            # "from pkg import sub" imports the submodule sub when there is one
            targets = [f"{root}.{a.name}" if f"{root}.{a.name}" in modules else root for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # import a.b.c of a module a.b: the edge is to a.b
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_walker_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "gemm_ladder.builder" in graph["gemm_ladder.batch"]  # from .builder import build
    assert "gemm_ladder.tune.db" in graph["gemm_ladder"]  # inside gemm_ladder.build
    assert "gemm_ladder.budget" in graph["gemm_ladder.sm90a.common"]  # from .. import budget


def test_no_import_cycle_among_the_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_imports_the_cli():
    users = sorted(n for n, deps in import_graph().items() if "gemm_ladder.cli" in deps and n != "gemm_ladder.__main__")
    assert not users, f"the CLI is for people, not for modules: {users} import gemm_ladder.cli"


@pytest.mark.parametrize("name", ["gemm_ladder.builder", "gemm_ladder.rungs", "gemm_ladder.budget"])
def test_the_build_primitive_does_not_reach_up(name):
    """builder (and what it stands on) imports no tuner, batch, teaching helper or CLI."""
    graph = import_graph()
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += graph[n]
    up = sorted(n for n in seen if n.startswith(("gemm_ladder.tune", "gemm_ladder.teach", "gemm_ladder.batch",
                                                   "gemm_ladder.cli", "gemm_ladder.report")))
    assert not up, f"{name} reaches up to {up}"


def test_no_host_module_passes_the_line_limit():
    """A module of more than a few hundred lines is usually two modules (rung files aside)."""
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in RUNG_FOLDERS or "__pycache__" in rel.parts:
            continue
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[str(rel)] = n
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_every_rung_file_is_a_public_entry_point():
    """A rung is its file (rungs.RUNGS is found from them); each has gemm_ladder.hgemm_vN."""
    import gemm_ladder
    from gemm_ladder.rungs import RUNGS

    files = {p.stem.split("_", 1)[1] for folder in RUNG_FOLDERS for p in (PACKAGE / folder).glob("hgemm_v*.py")}
    assert set(RUNGS) == files and list(RUNGS) == sorted(files, key=lambda r: int(r[1:]))
    for rung in RUNGS:
        assert f"hgemm_{rung}" in gemm_ladder.__all__ and callable(getattr(gemm_ladder, f"hgemm_{rung}"))
