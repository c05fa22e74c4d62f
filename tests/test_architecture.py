"""The host side's shape: each module in a layer, imports only into the layers below, no cycle
(between modules or between packages), nothing imports the CLI, serving never imports the tuner,
and no import of a project module hides inside a function unless it says which optional
dependency it waits for.

These walk the source (``ast``), so they see every import, at the top of a module or inside a
function, and import nothing themselves. A long module that does one thing is fine: there is no
length rule here.
"""

from __future__ import annotations

import ast
import re
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


# The host's layers, bottom up (STYLE.md, "The host side"; the table is gemm_ladder/README.md's).
# A module is in the layer of its longest prefix (a path under gemm_ladder/, dots for folders).
LAYERS = {
    "core": ("core",),  # config, spec, device, budget, launch, records, files, manifest, provenance, procs
    "sync": ("sync",),  # the barrier classes the rungs build with; the watchdog's wait and record
    "rungs": ("rungs", "sm90a", "sm100a"),  # the rung files and their registry (make_config)
    "protocol": ("protocol",),  # the barrier checker's model: the watchdog build names its waits with it
    "build": ("compile",),  # builder, toolchain, sass, batch, identity, module_cache
    "tools": ("barriers",),  # the checker's tools over the builder (python -m gemm_ladder.barriers)
    "serve": ("serve",),  # runtime, pack, tma_layout, kernel_pack, tuning_db, plan, front, ops
    "measure": ("measure",),  # harness, rounds, isolate, modules, report, suite, every_model
    "tune": ("tune",),
    "api": ("", "nn"),  # gemm_ladder/__init__.py: matmul, build (with the tuned-knobs policy), load; nn.Linear
    "top": ("teach", "cli", "cli_front", "__main__"),  # the tutorials' helpers and the command line
}
_BELOW_BUILD = {"core", "sync", "rungs", "protocol"}
# which layers a layer may import (its own always): every arrow of the host, and no other
MAY_IMPORT = {
    "core": set(),
    "sync": {"core"},
    "rungs": {"core", "sync"},
    "protocol": {"core", "sync", "rungs"},
    "build": _BELOW_BUILD,
    "tools": _BELOW_BUILD | {"build"},
    "serve": {"core", "sync", "rungs", "build"},  # never the tuner, measure, the checker or the CLI
    "measure": _BELOW_BUILD | {"build", "tools", "serve"},
    "tune": _BELOW_BUILD | {"build", "tools", "serve", "measure"},
    "api": {"core", "rungs", "build", "serve"},
    "top": set(LAYERS) - {"top"},
}
CLI = ("gemm_ladder.cli", "gemm_ladder.cli_front", "gemm_ladder.__main__", "gemm_ladder.barriers.__main__")
PROJECT = ("gemm_ladder", "layouts", "schedulers")
# a function-local import of a project module says which optional dependency it waits for, on its
# line or in the comment just above it: "# optional: TVM's compiler (...)"
OPTIONAL = re.compile(r"#\s*optional:\s*\S")


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
    return module.removeprefix("gemm_ladder").removeprefix(".") or "gemm_ladder"


def layer_violations(graph) -> list[str]:
    """Every import that crosses into a layer its layer may not import."""
    out = []
    for m, deps in sorted(graph.items()):
        for d in sorted(deps):
            a, b = layer_of(m), layer_of(d)
            if a != b and b not in MAY_IMPORT[a]:
                out.append(f"{_short(m)} ({a}) -> {_short(d)} ({b})")
    return out


def _package(module: str) -> str:
    """The package of a module, one level under gemm_ladder (a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_package(m), set()).update(_package(d) for d in deps if _package(d) != _package(m))
    return out


def undocumented_local_imports(source: str, name: str = "<source>") -> list[str]:
    """``file:line`` of each import of a project module inside a function without an ``# optional:``
    comment (on its line, or above it among the comments and imports of its block)."""
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                project = node.level > 0 or (node.module or "").split(".")[0] in PROJECT
            elif isinstance(node, ast.Import):
                project = any(a.name.split(".")[0] in PROJECT for a in node.names)
            else:
                continue
            if not project:
                continue
            said = [lines[node.lineno - 1]]
            i = node.lineno - 2  # up through the comments and the imports of its block
            while i >= 0 and lines[i].strip().startswith(("#", "from ", "import ")):
                said.append(lines[i])
                i -= 1
            if not any(OPTIONAL.search(line) for line in said):
                out.append(f"{name}:{node.lineno}")
    return sorted(set(out))


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_walker_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "gemm_ladder.compile.builder" in graph["gemm_ladder.compile.batch"]  # from .builder import build
    assert "gemm_ladder.protocol.check" in graph["gemm_ladder.compile.builder"]  # inside builder.build
    assert "gemm_ladder.core.budget" in graph["gemm_ladder.sm90a.common"]  # from ..core import budget


def test_no_import_cycle_among_the_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_among_the_packages():
    """A cycle between packages (core, compile, serve, ...) is one between layers, even when no two
    modules import each other."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_nothing_imports_the_cli():
    users = sorted(n for n, deps in import_graph().items()
                   if n not in CLI and any(d in CLI for d in deps))
    assert not users, f"the CLI is for people, not for modules: {users} import it"


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_imports_follow_the_layers():
    """A module imports its own layer and those :data:`MAY_IMPORT` names for it, nothing else."""
    bad = layer_violations(import_graph())
    assert not bad, "imports across the layers' arrows:\n  " + "\n  ".join(bad)


def test_serving_never_imports_the_tuner():
    """Not even through another module: what serve imports, all the way down, holds no tuner,
    measuring, checker tool or CLI module."""
    graph = import_graph()
    for start in (m for m in graph if layer_of(m) == "serve"):
        seen, todo = set(), [start]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += graph[n]
        up = sorted(n for n in seen if layer_of(n) in ("tune", "measure", "tools", "api", "top"))
        assert not up, f"{start} reaches {up}"


@pytest.mark.parametrize("name", ["gemm_ladder.compile.builder", "gemm_ladder.rungs", "gemm_ladder.core.budget"])
def test_the_build_primitive_does_not_reach_up(name):
    """builder (and what it stands on) imports no runtime, tuner, measuring, teaching helper or CLI."""
    graph = import_graph()
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += graph[n]
    up = sorted(n for n in seen if layer_of(n) in ("tools", "serve", "measure", "tune", "api", "top"))
    assert not up, f"{name} reaches up to {up}"


def test_no_undocumented_function_local_imports():
    """An import inside a function hides an arrow (here it once hid a cycle): a project module is
    imported at the top, unless the function waits for an optional dependency and says which."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            found += undocumented_local_imports(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "function-local imports of project modules without '# optional: <what>':\n  " + "\n  ".join(found)


def test_the_rules_catch_what_they_forbid():
    """Each rule above fails on a violation made up for it."""
    up = {"gemm_ladder.core.config": {"gemm_ladder.serve.front"}, "gemm_ladder.serve.front": set()}
    assert layer_violations(up) == ["core.config (core) -> serve.front (serve)"]
    tuner = {"gemm_ladder.serve.plan": {"gemm_ladder.tune.space"}, "gemm_ladder.tune.space": set()}
    assert layer_violations(tuner) == ["serve.plan (serve) -> tune.space (tune)"]
    cli = {"gemm_ladder.measure.suite": {"gemm_ladder.cli"}, "gemm_ladder.cli": set()}
    assert layer_violations(cli) == ["measure.suite (measure) -> cli (top)"]
    sideways = {"gemm_ladder.compile.a": {"gemm_ladder.serve.b"}, "gemm_ladder.serve.b": {"gemm_ladder.compile.c"},
                "gemm_ladder.compile.c": set()}
    assert find_cycle(package_graph(sideways)) == ["gemm_ladder.compile", "gemm_ladder.serve", "gemm_ladder.compile"]
    src = ("def f():\n    from .front import matmul\n\n"
           "def g():\n    # optional: TVM's compiler\n    from .builder import build\n\n"
           "def h():\n    import torch\n")
    assert undocumented_local_imports(src) == ["<source>:2"]
    assert layer_of("gemm_ladder.barriers.ladder") == "tools" and layer_of("gemm_ladder.protocol.check") == "protocol"
    assert layer_of("gemm_ladder") == "api" and layer_of("gemm_ladder.sm90a.hgemm_v9") == "rungs"


def test_every_rung_file_is_a_public_entry_point():
    """A rung is its file (rungs.RUNGS is found from them); each has gemm_ladder.hgemm_vN."""
    import gemm_ladder
    from gemm_ladder.rungs import RUNGS

    files = {p.stem.split("_", 1)[1] for folder in RUNG_FOLDERS for p in (PACKAGE / folder).glob("hgemm_v*.py")}
    assert set(RUNGS) == files and list(RUNGS) == sorted(files, key=lambda r: int(r[1:]))
    for rung in RUNGS:
        assert f"hgemm_{rung}" in gemm_ladder.__all__ and callable(getattr(gemm_ladder, f"hgemm_{rung}"))
