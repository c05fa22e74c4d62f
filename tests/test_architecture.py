"""The host side's shape: imports point down the layers, no cycle, nothing imports the CLI.

These walk the source (``ast``), so they see every import, at the top of a module or inside a
function, and import nothing themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gemm_ladder"
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
    assert "gemm_ladder.compile.builder" in graph["gemm_ladder.compile.batch"]  # from .builder import build
    assert "gemm_ladder.tune.db" in graph["gemm_ladder"]  # inside gemm_ladder.build
    assert "gemm_ladder.core.budget" in graph["gemm_ladder.sm90a.common"]  # from .. import budget


def test_no_import_cycle_among_the_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_imports_the_cli():
    users = sorted(n for n, deps in import_graph().items() if "gemm_ladder.cli" in deps and n != "gemm_ladder.__main__")
    assert not users, f"the CLI is for people, not for modules: {users} import gemm_ladder.cli"


@pytest.mark.parametrize("name", ["gemm_ladder.compile.builder", "gemm_ladder.rungs", "gemm_ladder.core.budget"])
def test_the_build_primitive_does_not_reach_up(name):
    """builder (and what it stands on) imports no tuner, batch, teaching helper or CLI."""
    graph = import_graph()
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += graph[n]
    up = sorted(n for n in seen if n.startswith(("gemm_ladder.tune", "gemm_ladder.teach", "gemm_ladder.compile.batch",
                                                   "gemm_ladder.cli", "gemm_ladder.measure.report")))
    assert not up, f"{name} reaches up to {up}"


# The host's layers, bottom up (STYLE.md, "The host side"): a module may import its own layer and
# those below it. serve and measure are side by side in the design; measure sits above serve here
# because the suites time the front door. A module is in the layer of its longest prefix.
LAYERS = {
    "core": ("config", "device", "files", "records", "procs", "budget", "launch", "sass", "cli_types"),
    "kernels": ("rungs", "sm90a", "sm100a", "barriers.classes", "barriers.watchdog",
                "barriers"),  # the package itself: the rungs' barrier classes (its checker names are lazy)
    "build": ("builder", "toolchain", "batch", "module_cache", "tune.cache"),
    "serve": ("runtime", "tma_layout", "kernel_pack", "plan", "front", "ops", "pack"),
    "measure": ("harness", "isolate", "rounds", "report", "suite", "every_model"),
    "tune": ("tune",),
    "tools": ("barriers.check", "barriers.sim", "barriers.interp", "barriers.kernel_ir", "barriers.explain",
              "barriers.calls", "barriers.engines", "barriers.exprs", "barriers.state", "barriers.diagnose",
              "barriers.values", "barriers.words", "barriers.picture", "barriers.syncs", "teach"),
    "api": ("",),  # gemm_ladder/__init__.py: the entry points over everything below
    "cli": ("cli", "cli_front", "__main__", "barriers.__main__", "barriers.ladder", "tune.serve"),
}
# Imports that point up today, each a debt the production redesign (issue 29) pays: the build
# reaches into the runtime and the harness, the kernels' barrier package into its checker, the
# policy into the tuner. The test fails on a new one, and on one that is gone but still listed.
KNOWN_UPWARD = {
    ("barriers", "barriers.check"), ("batch", "harness"), ("batch", "isolate"), ("batch", "report"),
    ("batch", "runtime"), ("builder", "barriers.check"), ("builder", "harness"), ("builder", "runtime"),
    ("isolate", "barriers.explain"), ("kernel_pack", "harness"), ("module_cache", "runtime"),
    ("plan", "tune.db"), ("plan", "tune.space"), ("suite", "tune.db"), ("tune.cache", "harness"),
    ("tune.cache", "report"), ("tune.cache", "runtime"), ("tune.cache", "tune.measuring"),
    ("tune.cache", "tune.space"), ("tune.rpc", "tune.serve"),
}
RANK = {name: i for i, name in enumerate(LAYERS)}


def layer_of(module: str) -> str:
    """The layer of ``gemm_ladder.X`` (its longest matching prefix in :data:`LAYERS`)."""
    name = module.removeprefix("gemm_ladder").removeprefix(".")
    best, length = None, -1
    for layer, prefixes in LAYERS.items():
        for p in prefixes:
            if (p == name or (p and name.startswith(p + "."))) and len(p) > length:
                best, length = layer, len(p)
    if best is None:
        raise LookupError(f"{module} is in no layer of tests/test_architecture.py: add it to LAYERS")
    return best


def _short(module: str) -> str:
    return module.removeprefix("gemm_ladder").removeprefix(".")


def upward_imports(graph) -> set[tuple[str, str]]:
    return {(_short(m), _short(d)) for m, deps in graph.items() for d in deps
            if RANK[layer_of(d)] > RANK[layer_of(m)]}


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_imports_point_down_the_layers():
    """A long module that does one thing is fine; an import that points up is not (it hid a cycle
    once). Known debts are listed, and the list only shrinks."""
    up = upward_imports(import_graph())
    new = sorted(up - KNOWN_UPWARD)
    assert not new, "imports that point up the layers: " + ", ".join(f"{a} -> {b}" for a, b in new)
    paid = sorted(KNOWN_UPWARD - up)
    assert not paid, "no longer imported, remove from KNOWN_UPWARD: " + ", ".join(f"{a} -> {b}" for a, b in paid)


def test_the_layer_rule_catches_an_upward_import():
    graph = {"gemm_ladder.core.config": {"gemm_ladder.serve.front"}, "gemm_ladder.serve.front": {"gemm_ladder.core.config"}}
    assert upward_imports(graph) == {("config", "front")}
    assert layer_of("gemm_ladder.protocol.check") == "tools" and layer_of("gemm_ladder.barriers") == "kernels"
    assert layer_of("gemm_ladder.tune.serve") == "cli" and layer_of("gemm_ladder.tune.db") == "tune"


def test_every_rung_file_is_a_public_entry_point():
    """A rung is its file (rungs.RUNGS is found from them); each has gemm_ladder.hgemm_vN."""
    import gemm_ladder
    from gemm_ladder.rungs import RUNGS

    files = {p.stem.split("_", 1)[1] for folder in RUNG_FOLDERS for p in (PACKAGE / folder).glob("hgemm_v*.py")}
    assert set(RUNGS) == files and list(RUNGS) == sorted(files, key=lambda r: int(r[1:]))
    for rung in RUNGS:
        assert f"hgemm_{rung}" in gemm_ladder.__all__ and callable(getattr(gemm_ladder, f"hgemm_{rung}"))
