"""The tutorials run top to bottom on the CPU, and every one is paired and tested.

Each ``tutorials/NN_name.py`` (jupytext percent format) is converted with jupytext and executed
with nbclient in a fresh ``python3`` kernel; a cell that raises fails the test. GPU cells check
``teach.gpu_here()`` and print why they skip. Every ``.py`` must have its ``.ipynb`` (the
executed copy, with outputs, that GitHub shows) and every ``.ipynb`` its ``.py``, cell for cell
(code and markdown, outputs aside); a tutorial that is neither tested here nor listed in ``SKIPPED``
(with a reason) fails.

Regenerate the executed notebooks after editing a tutorial::

    python tests/test_tutorials.py                 # all of them
    python tests/test_tutorials.py 05_pipeline     # one
"""

from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "tutorials"
CELL_TIMEOUT = 300  # seconds per cell
SKIPPED: dict[str, str] = {}  # "NN_name": "why it is not executed here"


def tutorial_names() -> list[str]:
    return sorted(p.stem for p in TUTORIALS.glob("*.py"))


def notebook_names() -> list[str]:
    return sorted(p.stem for p in TUTORIALS.glob("*.ipynb"))


def execute(name: str, cwd: Path = TUTORIALS):
    """Convert ``tutorials/<name>.py`` and run it; returns the executed notebook."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(TUTORIALS / f"{name}.py")
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    env = dict(os.environ)
    # the kernel imports gemm_ladder, layouts and schedulers from this checkout
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    old = dict(os.environ)
    os.environ.update(env)  # the kernel process inherits this environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return nb


def test_every_tutorial_is_paired():
    py, ipynb = set(tutorial_names()), set(notebook_names())
    assert py, f"no tutorials in {TUTORIALS}"
    assert not py - ipynb, (f"tutorials without an executed .ipynb: {sorted(py - ipynb)} "
                            "(run python tests/test_tutorials.py)")
    assert not ipynb - py, f"notebooks without their .py source: {sorted(ipynb - py)}"
    assert not set(SKIPPED) - py, f"SKIPPED names tutorials that do not exist: {sorted(set(SKIPPED) - py)}"


def test_notebooks_have_outputs():
    """The committed .ipynb files were executed (GitHub shows them as they are)."""
    import nbformat

    for name in notebook_names():
        nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(c.get("execution_count") for c in code), f"{name}.ipynb is not fully executed"
        images = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
        assert images, f"{name}.ipynb shows no picture"
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{name}.ipynb was saved with an error: {errors[0].get('ename')}"


def cells(nb) -> list[tuple[str, str]]:
    """(cell type, source) of every cell: what a reader sees of a notebook, outputs aside."""
    return [(c.cell_type, c.source) for c in nb.cells]


def mismatch(source, executed) -> str | None:
    """Where the executed notebook's cells differ from its .py source's (as jupytext reads it), in
    words with a short diff of the first cell that differs; None where they are the same."""
    want, have = cells(source), cells(executed)
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            diff = "\n".join(list(difflib.unified_diff(h[1].splitlines(), w[1].splitlines(), ".ipynb", ".py",
                                                       lineterm="", n=1))[:20])
            return f"cell {i} is {h[0]} in the .ipynb and {w[0]} in the .py\n{diff}"
    if len(want) != len(have):
        return f"the .py has {len(want)} cells and the .ipynb {len(have)}"
    return None


@pytest.mark.parametrize("name", notebook_names())
def test_notebook_matches_its_source(name):
    """The executed .ipynb shows the code and text of its .py (a notebook regenerated from an old
    .py, or edited by hand, would show GitHub readers what CI does not run)."""
    import jupytext
    import nbformat

    if not (TUTORIALS / f"{name}.py").exists():
        pytest.skip("no .py: test_every_tutorial_is_paired fails for it")
    wrong = mismatch(jupytext.read(TUTORIALS / f"{name}.py"), nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4))
    assert wrong is None, f"{name}.ipynb is not its .py ({wrong}); run python tests/test_tutorials.py {name}"


def test_an_edited_source_is_a_mismatch(tmp_path):
    """The check above fails on a real difference: a changed code line, a changed word of text, a
    cell dropped from the notebook."""
    import jupytext
    import nbformat

    name = tutorial_names()[0]
    executed = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    text = (TUTORIALS / f"{name}.py").read_text()
    code_line = next(line for line in text.splitlines() if line.startswith("import "))
    text_line = next(line for line in text.splitlines() if line.startswith("# # "))  # a heading
    for old, new, words in ((code_line, code_line + "  # edited", "code"), (text_line, text_line + " edited", "markdown")):
        edited = tmp_path / f"{name}.py"
        edited.write_text(text.replace(old, new, 1))
        wrong = mismatch(jupytext.read(edited), executed)
        assert wrong and f"{words} in the .ipynb" in wrong and "edited" in wrong, wrong
    executed.cells.pop()
    assert "cells" in mismatch(jupytext.read(TUTORIALS / f"{name}.py"), executed)


@pytest.mark.parametrize("name", tutorial_names())
def test_tutorial_runs(name):
    if name in SKIPPED:
        pytest.skip(SKIPPED[name])
    execute(name)


def write(names) -> None:
    """Execute the tutorials and write the paired .ipynb files (with outputs)."""
    import jupytext
    import nbformat

    for name in names:
        t0 = time.perf_counter()
        nb = execute(name)
        path = TUTORIALS / f"{name}.ipynb"
        jupytext.write(nb, path, fmt="ipynb")
        nbformat.validate(nbformat.read(path, as_version=4))
        print(f"{path.relative_to(REPO)}: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    write(sys.argv[1:] or tutorial_names())
