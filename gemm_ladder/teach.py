"""Helpers for the tutorials (``tutorials/NN_*.py``): show what a rung changed, what it compiled to,
and what it measured, without pasting code into the notebooks.

    from gemm_ladder import teach
    teach.rung_diff("v3", "v4")                   # unified diff of the two rung files
    built = gemm_ladder.build("v4", 256, 256, 256)
    teach.describe(built)                          # shape, knobs, grid, threads, shared memory
    teach.source_excerpt(built, r"expect_tx")      # the generated CUDA around a pattern
    teach.show_sass_counts(built)                  # key SASS instructions, registers, spills
    teach.committed_results("v4")                  # benchmarks/results/*.json rows of v4
    teach.show(teach.plot_pipeline_timeline())     # a picture, as a PNG in the notebook

Pictures are drawn on matplotlib's Agg canvas (no display needed) and handed to the notebook as
PNG data by :func:`show`, so they appear the same under Jupyter, nbclient and GitHub's viewer.

GPU work goes through :func:`check_and_time`, which exports the module and runs
``gemm_ladder.isolate.run_isolated("check" / "time")`` in a child process: a kernel that
deadlocks is reported, not waited on. :func:`gpu_here` says whether there is a GPU of the arch.

Importing this module imports neither TVM nor matplotlib.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import io
import json
import math
import re
import tempfile
from pathlib import Path

from .config import GemmConfig

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
LINE_WIDTH = 150  # generated CUDA lines are long (64 accumulator operands): cut them here


# -- sources ------------------------------------------------------------------------------------
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


# -- built modules ------------------------------------------------------------------------------
def _cfg(x) -> GemmConfig:
    return x if isinstance(x, GemmConfig) else x.cfg


def describe(built) -> None:
    """One paragraph on a built module: config, launch shape, compiler, build time."""
    c = built.cfg
    launch = built.extra.get("launch", {})
    knobs = {k: v for k, v in c.knobs().items() if k not in ("dtype", "arch")}
    print(f"{c.rung} {c.M}x{c.N}x{c.K} {c.dtype} {c.arch}  knobs {knobs}")
    persistent = "  (persistent: grid = SM count at launch)" if launch.get("persistent") else ""
    print(f"  grid {launch.get('grid')}  threads {launch.get('threads')}  shared memory "
          f"{launch.get('smem_bytes')} B{persistent}")
    print(f"  tiles {c.grid_mn[0]}x{c.grid_mn[1]} of {c.blk_m}x{c.blk_n}, {c.k_tiles} K slice(s) of {c.blk_k}")
    print(f"  {built.compiler.describe()}, {len(built.binary)} B device binary, built in {built.build_seconds:.1f} s")
    if built.extra.get("tuned_from"):
        print(f"  knobs from the tuning database: {built.extra['tuned_from']}")


def _kernel_body(src: str) -> tuple[list[str], int]:
    lines = src.splitlines()
    for i, line in enumerate(lines):
        if "__global__" in line:
            return lines[i:], i
    return lines, 0


_SASS_CACHE: dict = {}


def sass_text(built) -> str:
    """SASS of a built module's device binary (cuobjdump; cached per binary)."""
    from . import sass  # pylint: disable=import-outside-toplevel

    key = id(built.binary), len(built.binary)
    if key not in _SASS_CACHE:
        _SASS_CACHE[key] = sass.disassemble(built.binary)
    return _SASS_CACHE[key]


def source_excerpt(built, pattern: str, context: int = 2, source: str = "cuda", max_matches: int = 6,
                   kernel_only: bool = True, width: int = LINE_WIDTH) -> None:
    """Print the lines of the generated code that match regex ``pattern``, with ``context`` lines.

    ``source``: ``"cuda"`` (TVM's CUDA, where every PTX instruction is an inline-asm helper) or
    ``"sass"`` (the disassembled device binary). ``kernel_only`` skips the helper definitions
    before the ``__global__`` function. Long lines are cut at ``width`` characters.
    """
    if source == "cuda":
        lines, offset = _kernel_body(built.cuda_source()) if kernel_only else (built.cuda_source().splitlines(), 0)
    elif source == "sass":
        lines, offset = sass_text(built).splitlines(), 0
    else:
        raise ValueError(f"source={source!r}: use 'cuda' or 'sass'")
    rx = re.compile(pattern)
    hits = [i for i, line in enumerate(lines) if rx.search(line)]
    if not hits:
        raise LookupError(f"no line of the {source} source matches {pattern!r}")
    shown = hits[:max_matches]
    windows = []
    for i in shown:
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    more = f", first {len(shown)} shown" if len(hits) > len(shown) else ""
    print(f"# {source}: {len(hits)} line(s) match {pattern!r}{more}")
    for n, (lo, hi) in enumerate(windows):
        if n:
            print("   ...")
        for i in range(lo, hi):
            mark = ">" if i in shown else " "
            text = lines[i].rstrip()
            if len(text) > width:
                text = text[:width - 5] + " ...)"
            print(f"{mark}{i + offset + 1:5d}  {text}")


def sass_counts(built) -> dict:
    """Key instruction counts and ptxas's resource numbers of one built module."""
    from . import sass  # pylint: disable=import-outside-toplevel

    counts = sass.instruction_counts(sass_text(built))
    res = sass.resource_usage(built.binary)
    return {**counts, "registers": res.registers, "stack": res.stack, "local": res.local}


def _label(built) -> str:
    c = built.cfg
    return f"{c.rung} {c.M}x{c.N}x{c.K}"


def show_sass_counts(*built, names=None) -> None:
    """A table of SASS instruction counts (rows) per built module (columns).

    ``names`` picks the instructions; by default those that are non-zero in any module, plus
    the spill opcodes LDL/STL and ptxas's register count.
    """
    cols = [sass_counts(b) for b in built]
    if names is None:
        from .sass import KEY_INSTRUCTIONS  # pylint: disable=import-outside-toplevel

        names = [n for n in KEY_INSTRUCTIONS if any(c[n] for c in cols) or n in ("LDL", "STL")]
    rows = [*names, "registers", "stack"]
    labels = [_label(b) for b in built]
    w0 = max(len(r) for r in rows)
    widths = [max(len(lab), 6) for lab in labels]
    print("  ".join(["SASS".ljust(w0)] + [lab.rjust(w) for lab, w in zip(labels, widths)]))
    for r in rows:
        print("  ".join([r.ljust(w0)] + [str(c[r]).rjust(w) for c, w in zip(cols, widths)]))


# -- the GPU, and committed measurements --------------------------------------------------------
def gpu_here(arch: str = "sm_90a") -> bool:
    """Whether torch sees a CUDA GPU of ``arch`` (the tutorials' GPU cells run only then)."""
    return _gpu_reason(arch) is None


def _gpu_reason(arch: str) -> str | None:
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    from .config import arch_of_capability  # pylint: disable=import-outside-toplevel

    have = arch_of_capability(*torch.cuda.get_device_capability(0))
    if have != arch:
        return f"GPU 0 ({torch.cuda.get_device_name(0)}) is {have}, not {arch}"
    return None


def no_gpu_message(arch: str = "sm_90a", committed: bool = True) -> str:
    """What a tutorial prints instead of checking and timing."""
    return (f"No {arch} GPU here ({_gpu_reason(arch) or 'none'}): skipping the check and the timing."
            + (" The committed measurements (benchmarks/results/*.json) follow." if committed else ""))


def check_and_time(built, reps: int = 50, seeds=(0, 1), timeout: float = 300.0, folder=None,
                   strict: bool = True) -> dict:
    """Export ``built``, check it on random inputs and time it against cuBLAS, each in a child
    process (``isolate.run_isolated``); print one line per job and return both results.
    ``strict``: a wrong, crashing or hanging kernel raises AssertionError (the notebook stops)."""
    from .isolate import run_isolated  # pylint: disable=import-outside-toplevel

    folder = Path(folder or tempfile.mkdtemp(prefix="gemm_ladder_teach_"))
    path = built.export(folder / f"{built.cfg.tag()}.so")
    check = run_isolated("check", path, *seeds, timeout=timeout)
    print(f"check {built.cfg.tag()}: {check['status']}"
          + (f"  rel_err {check['rel_err']:.2e} (cuBLAS {check['torch_rel_err']:.2e})" if "rel_err" in check else "")
          + (f"  {check.get('detail', '')}" if check.get("detail") else ""))
    if strict and check["status"] != "ok":
        raise AssertionError(f"{built.cfg.tag()} failed its check on this GPU: {check}")
    timed = {"status": "skipped", "detail": "the check failed"}
    if check["status"] == "ok":
        timed = run_isolated("time", path, reps, timeout=timeout)
        if timed["status"] == "ok":
            print(f"time  {built.cfg.tag()}: {timed['ms']:.3f} ms  {timed['tflops']:.1f} TFLOPS  "
                  f"cuBLAS {timed['cublas_tflops']:.1f} TFLOPS  ratio {timed['ratio_to_cublas']:.3f}")
        else:
            print(f"time  {built.cfg.tag()}: {timed['status']} {timed.get('detail', '')}")
            if strict:
                raise AssertionError(f"{built.cfg.tag()} could not be timed on this GPU: {timed}")
    return {"check": check, "time": timed}


class ResultTable(list):
    """Rows of committed measurements; shows as a table (or says plainly that there are none)."""

    def __init__(self, rows, what: str, searched: Path):
        super().__init__(rows)
        self.what, self.searched = what, searched

    def __repr__(self) -> str:
        if not self.searched.is_dir():
            return f"No committed measurements: {self.searched} does not exist (run from a checkout of the repository)."
        if not self:
            where = self.searched.relative_to(REPO) if REPO in self.searched.parents else self.searched
            return (f"No committed measurement of {self.what} yet in {where}: "
                    "run `python -m gemm_ladder bench` on an H100/H200 and commit the JSON.")
        varying = sorted(k for k in {k for r in self for k in r["knobs"]} - {"dtype", "arch"}
                         if len({json.dumps(r["knobs"].get(k)) for r in self}) > 1)
        cols = ["file", "gpu", "clocks", "date", "shape", "dtype", "knobs", "tflops", "cublas_tflops",
                "ratio_to_cublas"]
        cells = [[(" ".join(f"{k}={r['knobs'].get(k)}" for k in varying) or "defaults") if c == "knobs"
                  else str(r.get(c, "")) for c in cols] for r in self]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        out.append("  ".join("-" * w for w in widths))
        out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(out)

    def _repr_pretty_(self, p, cycle):  # IPython: the table, not the list
        p.text(repr(self))


def committed_results(rung: str | None = None, arch: str = "sm_90a", results_dir=None,
                      dtype: str | None = None) -> ResultTable:
    """Rows of ``benchmarks/results/*.json`` for ``rung`` (all rungs when None) on ``arch``."""
    folder = Path(results_dir) if results_dir else RESULTS_DIR
    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            report = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        gpu = report.get("gpu", {})
        for r in report.get("results", []):
            if rung is not None and r.get("rung") != rung:
                continue
            if r.get("arch", "sm_90a") != arch or (dtype and r.get("dtype") != dtype):
                continue
            if "tflops" not in r:
                continue
            rows.append({
                "file": path.name, "gpu": gpu.get("name", "?"),
                "clocks": f"{gpu.get('sm_clock_mhz_now', '?')}/{gpu.get('sm_clock_mhz_max', '?')}"
                          .replace(" MHz", "") + " MHz",
                "date": str(report.get("date", ""))[:10], "commit": report.get("commit", ""),
                "rung": r.get("rung"), "module": r.get("module"), "shape": "x".join(map(str, r.get("shape", []))),
                "dtype": r.get("dtype"), "knobs": r.get("knobs", {}), "status": r.get("status"),
                "tflops": round(r["tflops"], 1), "cublas_tflops": round(r.get("cublas_tflops", float("nan")), 1),
                "ratio_to_cublas": round(r.get("ratio_to_cublas", float("nan")), 3),
            })
    what = f"rung {rung} ({arch})" if rung else f"any rung ({arch})"
    return ResultTable(rows, what, folder)


# -- pictures -----------------------------------------------------------------------------------
def _figure(**kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def show(fig, dpi: int = 90) -> None:
    """Put ``fig`` into the notebook as a PNG (works whatever matplotlib backend is active), then
    close it if pyplot holds it, so it is not drawn twice."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    try:
        from IPython.display import Image, display  # pylint: disable=import-outside-toplevel

        display(Image(data=buf.getvalue(), format="png"))
    except ImportError:
        print(f"<figure: {len(buf.getvalue())} bytes of PNG; run in Jupyter to see it>")
    try:
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

        plt.close(fig)
    except Exception:  # pylint: disable=broad-except
        pass


def _rect(ax, x, y, w, h, **kw):
    from matplotlib.patches import Rectangle  # pylint: disable=import-outside-toplevel

    ax.add_patch(Rectangle((x, y), w, h, **kw))


def plot_k_loop(cfg) -> object:
    """v2's K loop: the A and B panels of one output tile cut into ``blk_k`` slices (left), and one
    CTA's time line (right): every slice is copied by all threads, then multiplied, with a CTA
    barrier after each step, so copies and wgmmas take turns."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    c = _cfg(cfg)
    kt = c.k_tiles
    colors = matplotlib.colormaps["viridis"]
    fig = _figure(figsize=(13, 4.2))
    ax_a, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    for name, rows, y0 in (("A", c.blk_m, 0), ("B", c.blk_n, c.blk_m + 40)):
        for k in range(kt):
            w = min(c.blk_k, c.K - k * c.blk_k)
            _rect(ax_a, k * c.blk_k, y0, w, rows, facecolor=colors(k / max(1, kt - 1)), edgecolor="black", lw=0.6)
            ax_a.text(k * c.blk_k + w / 2, y0 + rows / 2, f"{name}[:, {k}]", ha="center", va="center",
                      fontsize=7, color="white", rotation=90)
        ax_a.text(-8, y0 + rows / 2, f"{name}\n{rows} rows", ha="right", va="center", fontsize=9)
    ax_a.set_xlim(-60, c.K + 5)
    ax_a.set_ylim(-5, c.blk_m + c.blk_n + 45)
    ax_a.invert_yaxis()
    ax_a.set_xlabel("K")
    ax_a.set_yticks([])
    ax_a.set_title(f"Dreg = sum over k of A[:, k] . B[:, k]^T  ({kt} slices of {c.blk_k})", fontsize=9)
    # time line: copy (all threads) | barrier | wgmma | barrier
    t = 0.0
    copy, mma = 1.0, 0.8
    for k in range(kt):
        col = colors(k / max(1, kt - 1))
        _rect(ax_t, t, 1, copy, 0.8, facecolor=col, alpha=0.5, edgecolor="black", lw=0.5)
        ax_t.text(t + copy / 2, 1.4, f"copy {k}", ha="center", va="center", fontsize=7)
        t += copy
        ax_t.axvline(t, color="red", lw=0.8, ls=":")
        _rect(ax_t, t, 0, mma, 0.8, facecolor=col, edgecolor="black", lw=0.5)
        ax_t.text(t + mma / 2, 0.4, "=" if k == 0 else "+=", ha="center", va="center", fontsize=8, color="white")
        t += mma
        ax_t.axvline(t, color="red", lw=0.8, ls=":")
    ax_t.set_yticks([0.4, 1.4], ["wgmma", "copy"])
    ax_t.set_xlim(0, t)
    ax_t.set_ylim(-0.2, 2.0)
    ax_t.set_xlabel("time (illustrative units); red: CTA barrier (bar.sync)")
    ax_t.set_title("one CTA: all threads copy (ld.global, st.shared), then the warpgroup's wgmmas;\n"
                   "slice 0 writes the accumulators (=, scale-d 0), the others add (+=)", fontsize=9)
    return fig


def plot_cta_grid(cfg) -> object:
    """v3's grid: D cut into ``blk_m x blk_n`` tiles, one CTA each (left); the parts of edge tiles
    past M or N (hatched) are computed on zeros and not stored. Right: the K slices of one A
    panel; the part of the last slice past K is zero-filled in shared memory."""
    c = _cfg(cfg)
    gm, gn = c.grid_mn
    fig = _figure(figsize=(12, 4.6))
    ax_d, ax_k = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    for bx in range(gm):
        for by in range(gn):
            x, y = by * c.blk_n, bx * c.blk_m
            _rect(ax_d, x, y, c.blk_n, c.blk_m, facecolor="none", edgecolor="black", lw=1)
            inside_w, inside_h = min(c.blk_n, c.N - x), min(c.blk_m, c.M - y)
            _rect(ax_d, x, y, inside_w, inside_h, facecolor="tab:blue", alpha=0.25 + 0.5 * ((bx + by) % 2), lw=0)
            if inside_w < c.blk_n:
                _rect(ax_d, x + inside_w, y, c.blk_n - inside_w, c.blk_m, facecolor="none", hatch="//",
                      edgecolor="gray", lw=0)
            if inside_h < c.blk_m:
                _rect(ax_d, x, y + inside_h, c.blk_n, c.blk_m - inside_h, facecolor="none", hatch="//",
                      edgecolor="gray", lw=0)
            ax_d.text(x + c.blk_n / 2, y + c.blk_m / 2, f"CTA ({bx},{by})", ha="center", va="center", fontsize=8)
    _rect(ax_d, 0, 0, c.N, c.M, facecolor="none", edgecolor="red", lw=2)
    ax_d.set_xlim(-5, gn * c.blk_n + 5)
    ax_d.set_ylim(gm * c.blk_m + 5, -5)
    ax_d.set_xlabel(f"N = {c.N} (red: D's edge)")
    ax_d.set_ylabel(f"M = {c.M}")
    ax_d.set_title(f"grid {gm} x {gn} CTAs, tiles {c.blk_m}x{c.blk_n}; hatched: past the edge, not stored", fontsize=9)
    for k in range(c.k_tiles):
        x = k * c.blk_k
        inside = min(c.blk_k, c.K - x)
        _rect(ax_k, x, 0, inside, c.blk_m, facecolor="tab:green", alpha=0.3 + 0.4 * (k % 2), edgecolor="black", lw=0.6)
        if inside < c.blk_k:
            _rect(ax_k, x + inside, 0, c.blk_k - inside, c.blk_m, facecolor="none", hatch="xx",
                  edgecolor="gray", lw=0.6)
            ax_k.text(x + inside + (c.blk_k - inside) / 2, c.blk_m / 2, f"{c.blk_k - inside} cols\nzeros", ha="center",
                      va="center", fontsize=7)
        ax_k.text(x + inside / 2, -6, f"k={k}", ha="center", fontsize=7)
    ax_k.axvline(c.K, color="red", lw=2)
    ax_k.set_xlim(-5, c.k_tiles * c.blk_k + 5)
    ax_k.set_ylim(c.blk_m + 5, -15)
    ax_k.set_xlabel(f"K = {c.K} (red)")
    ax_k.set_yticks([])
    ax_k.set_title(f"A panel of one CTA: {c.k_tiles} K slices; past K: zeros in Asmem (add nothing)", fontsize=9)
    return fig


def plot_tma_box(cfg, tile=None, k: int = 0) -> object:
    """v4: the two TMA boxes of one K slice (A: ``blk_m x blk_k``, B: ``blk_n x blk_k``) in global
    memory, and the ``tma2mma`` mbarrier's phase for that slice: thread 0's
    ``arrive.expect_tx(bytes)`` and TMA's ``complete_tx`` of each box; the phase completes when
    the pending arrivals and the transaction count are both zero. The part of a box past the
    matrix edge is zero-filled by TMA and still counted."""
    c = _cfg(cfg)
    gm, gn = c.grid_mn
    bx, by = tile if tile is not None else (gm - 1, gn - 1)
    eb = c.elem_bytes
    a_bytes, b_bytes = c.blk_m * c.blk_k * eb, c.blk_n * c.blk_k * eb
    fig = _figure(figsize=(15, 4.4))
    ax_a, ax_b, ax_t, ax_pad = fig.subplots(1, 4, gridspec_kw={"width_ratios": [1, 1, 1.4, 0.9]})
    ax_pad.axis("off")
    panels = ((ax_a, "A", c.M, c.blk_m, bx, a_bytes), (ax_b, "B", c.N, c.blk_n, by, b_bytes))
    for ax, name, rows, blk, idx, nbytes in panels:
        n_boxes = math.ceil(rows / blk)
        for i in range(n_boxes):
            for kk in range(c.k_tiles):
                _rect(ax, kk * c.blk_k, i * blk, c.blk_k, blk, facecolor="none", edgecolor="lightgray", lw=0.5)
        y = idx * blk
        inside = min(blk, rows - y)
        _rect(ax, k * c.blk_k, y, c.blk_k, inside, facecolor="tab:orange", edgecolor="black", lw=1)
        if inside < blk:
            _rect(ax, k * c.blk_k, y + inside, c.blk_k, blk - inside, facecolor="none", hatch="xx",
                  edgecolor="tab:orange", lw=1)
            ax.text(k * c.blk_k + c.blk_k + 4, y + inside + (blk - inside) / 2,
                    f"{blk - inside} rows past the edge:\nzero-filled, still counted", fontsize=7, va="center")
        _rect(ax, 0, 0, c.K, rows, facecolor="none", edgecolor="red", lw=1.5)
        ax.text(k * c.blk_k + c.blk_k / 2, y + min(inside, blk) / 2, f"box\n{blk}x{c.blk_k}\n{nbytes} B",
                ha="center", va="center", fontsize=7)
        ax.set_xlim(-5, max(c.K, c.k_tiles * c.blk_k) + c.blk_k * 2.5)
        ax.set_ylim(max(rows, n_boxes * blk) + 5, -5)
        ax.set_xlabel("K")
        ax.set_ylabel(f"{name} rows ({rows})")
        ax.set_title(f"{name}: the box of CTA ({bx},{by}), K slice {k}", fontsize=9)
    # the mbarrier of this slice, one phase
    total = a_bytes + b_bytes
    ts = [0, 1, 2, 3, 4, 5]
    tx = [0, -a_bytes, total - a_bytes, 0, 0, 0]
    arrivals = [1, 1, 0, 0, 0, 0]
    ax_t.step(ts, tx, where="post", color="tab:orange", lw=2, label="transaction count (bytes still due)")
    ax_t.step(ts, [a * total / 2 for a in arrivals], where="post", color="tab:blue", lw=2, ls="--",
              label=f"pending arrivals (1 at init; drawn x {total // 2})")
    events = [
        (0.5, "1", "thread 0 issues the TMA loads of A and B, both naming tma2mma"),
        (1.0, "2", f"A's {a_bytes} B land: complete_tx; the count may go below 0"),
        (2.0, "3", f"thread 0: arrive.expect_tx({total}): arrivals 1 -> 0"),
        (3.0, "4", f"B's {b_bytes} B land: count 0 -> the phase completes"),
    ]
    for x, tag, _ in events:
        ax_t.annotate(tag, (x, total * 1.15), ha="center", fontsize=9, color="black",
                      bbox={"boxstyle": "circle", "fc": "white", "ec": "gray"})
    ax_t.axvline(3.0, color="green", lw=2)
    ax_t.text(3.08, -a_bytes * 1.25, "parity flips:\nwait(phase)\nreturns; next\nslice waits on\nphase ^ 1",
              fontsize=7, color="green", va="bottom")
    ax_t.text(1.02, 0.98, "\n".join(f"({tag}) {text}" for _, tag, text in events)
              + "\nA phase completes when BOTH the pending arrivals\nand the transaction count are 0.",
              transform=ax_t.transAxes, fontsize=7.5, va="top", ha="left")
    ax_t.set_ylim(-a_bytes * 1.35, total * 1.6)
    ax_t.set_xlim(0, 5)
    ax_t.set_xticks([])
    ax_t.set_xlabel("time, one K slice")
    ax_t.set_ylabel("bytes")
    ax_t.set_title(f"tma2mma, one phase ({total} B = A box + B box)", fontsize=9)
    ax_t.legend(fontsize=7, loc="upper right")
    return fig


def pipeline_schedule(pipe_depth: int, k_tiles: int = 8, mma: float = 1.0, latency: float = 1.5,
                      transfer: float = 0.5) -> dict:
    """A model of one tile's K loop with a ``pipe_depth``-stage ring (``pipe_depth=1`` is v4).

    Time is in units of one K slice's wgmmas (``mma``). A TMA load waits ``latency`` and then
    occupies the memory path for ``transfer`` (loads overlap their latencies but not their
    transfers). Rules, as v4 and v5 are written:

    - one thread issues the loads in slice order; load j goes into stage j % S once slice
      j - S has been released;
    - wgmma of slice j runs when its bytes have landed and the tensor cores are done with j-1;
    - v4 (S=1): slice j is released when its wgmmas finish (``wait_group(0)``, CTA barrier);
    - v5 (S>=2): slice j is released in the next iteration after ``wait_group(1)``: when its
      wgmmas are done AND slice j+1 has landed (the warps wait for it before they get there).

    Returns ``{"loads": [(issue, arrive)], "mmas": [(start, end)], "release": [...],
    "busy": fraction of the time the tensor cores work, "time": total}``.
    """
    S = pipe_depth
    loads, mmas, release = [], [], [None] * k_tiles
    bus_free = 0.0
    for j in range(k_tiles):
        ready = 0.0 if j < S else release[j - S]  # set by iteration j-S+1 <= j-1 (S >= 2) or j-1 (S = 1)
        issue = max(ready, loads[-1][0] if loads else 0.0)
        start_xfer = max(issue + latency, bus_free)
        bus_free = start_xfer + transfer
        loads.append((issue, bus_free))
        start = max(bus_free, mmas[-1][1] if mmas else 0.0)
        mmas.append((start, start + mma))
        # release of slice j-1 (S >= 2) needs slice j landed; of slice j (S == 1) only its MMA
        if S == 1:
            release[j] = mmas[j][1]
        elif j >= 1:
            release[j - 1] = max(mmas[j - 1][1], loads[j][1])
        if S >= 2 and j == k_tiles - 1:
            release[j] = mmas[j][1]
    total = mmas[-1][1]
    return {"loads": loads, "mmas": mmas, "release": release, "busy": k_tiles * mma / total, "time": total}


def plot_pipeline_timeline(pipe_depths=(1, 2, 3, 4), k_tiles: int = 8, mma: float = 1.0, latency: float = 1.5,
                           transfer: float = 0.5) -> object:
    """Stages over time for each pipe depth (see :func:`pipeline_schedule` for the model):
    per stage, the TMA load (light: latency, dark: transfer) and how long the slice occupies the
    stage; on the last row, the wgmmas. Title: how busy the tensor cores are."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    cmap = matplotlib.colormaps["tab10"]
    scheds = {S: pipeline_schedule(S, k_tiles, mma, latency, transfer) for S in pipe_depths}
    t_max = max(s["time"] for s in scheds.values())
    fig = _figure(figsize=(13, 1.0 + sum(1.0 + 0.42 * (S + 1) for S in pipe_depths)))
    axes = fig.subplots(len(pipe_depths), 1, sharex=True,
                        gridspec_kw={"height_ratios": [S + 1 for S in pipe_depths]})
    axes = [axes] if len(pipe_depths) == 1 else list(axes)
    for ax, S in zip(axes, pipe_depths):
        s = scheds[S]
        for j, ((issue, arrive), (m0, m1)) in enumerate(zip(s["loads"], s["mmas"])):
            row = S - (j % S)  # stage 0 on top
            col = cmap(j % 10)
            _rect(ax, issue, row - 0.4, arrive - transfer - issue, 0.8, facecolor=col, alpha=0.25,
                  edgecolor=col, lw=0.5)
            _rect(ax, arrive - transfer, row - 0.4, transfer, 0.8, facecolor=col, alpha=0.8, lw=0)
            rel = s["release"][j]
            _rect(ax, arrive, row - 0.12, rel - arrive, 0.24, facecolor=col, alpha=0.35, lw=0)
            ax.text(issue + 0.05, row, f"TMA {j}", fontsize=7, va="center")
            _rect(ax, m0, -0.4, m1 - m0, 0.8, facecolor=col, edgecolor="black", lw=0.5)
            ax.text((m0 + m1) / 2, 0, f"mma {j}", fontsize=7, ha="center", va="center", color="white")
        ax.set_yticks(range(S + 1), ["wgmma"] + [f"stage {S - 1 - i}" for i in range(S)])
        ax.set_ylim(-0.6, S + 0.6)
        name = "v4: one stage" if S == 1 else f"v5, pipe_depth={S}"
        ax.set_title(f"{name}: tensor cores busy {s['busy']:.0%} ({k_tiles} K slices in {s['time']:.1f} units)",
                     fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(0, t_max * 1.02)
    axes[-1].set_xlabel(f"time, in units of one K slice's wgmmas (model: TMA latency {latency}, transfer {transfer}); "
                        "light: load in flight, dark: bytes arriving, thin bar: slice held in its stage until released")
    return fig


def plot_smem_budget(cfg, pipe_depths=range(1, 9), smem_limit: int | None = None) -> object:
    """Shared memory of a pipelined Hopper rung per ``pipe_depth`` (stacked: barriers and
    alignment, operand ring, output tile) against the per-block limit."""
    from .config import limits_for  # pylint: disable=import-outside-toplevel

    c = _cfg(cfg)
    limit = smem_limit or limits_for(c.arch).smem_per_block
    stage = (c.blk_m + c.blk_n) * c.blk_k * c.elem_bytes
    out = c.blk_m * c.blk_n * c.elem_bytes
    depths = list(pipe_depths)
    fig = _figure(figsize=(8, 3.8))
    ax = fig.subplots()
    ax.bar(depths, [1024] * len(depths), color="gray", label="barriers + 1 KiB alignment")
    ax.bar(depths, [d * stage for d in depths], bottom=[1024] * len(depths), color="tab:blue",
           label=f"ring: pipe_depth x {stage // 1024} KiB (A {c.blk_m}x{c.blk_k} + B {c.blk_n}x{c.blk_k})")
    ax.bar(depths, [out] * len(depths), bottom=[1024 + d * stage for d in depths], color="tab:orange",
           label=f"output tile Dsmem {c.blk_m}x{c.blk_n} ({out // 1024} KiB)")
    ax.axhline(limit, color="red", lw=1.5, label=f"limit per block: {limit // 1024} KiB")
    ax.set_xticks(depths)
    ax.set_xlabel("pipe_depth")
    ax.set_ylabel("bytes of shared memory")
    ax.set_title(f"{c.blk_m}x{c.blk_n} tile, {c.dtype}: deepest ring that fits = "
                 f"{(limit - 1024 - out) // stage}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return fig


# -- tuning (works with or without gemm_ladder.tune) --------------------------------------------
def tuning_space(rung: str, shape, space: dict, dtype: str = "float16", arch: str = "sm_90a") -> dict:
    """Which knob combinations survive the config validator: ``{"candidates": [...], "pruned":
    [(knobs, reason)], "source": ...}``. Uses ``gemm_ladder.tune.search_space`` when that module
    is there (it also prunes ``l2_group_size`` with the L2 model), else the validator alone."""
    import itertools  # pylint: disable=import-outside-toplevel

    from .rungs import rung_module  # pylint: disable=import-outside-toplevel

    # knobs not named keep the rung's default (tune.search_space would otherwise try them all)
    space = {**{k: [v] for k, v in rung_module(rung, arch).KNOBS.items()}, **space}
    try:
        from . import tune  # pylint: disable=import-outside-toplevel
        search = getattr(tune, "search_space")
    except (ImportError, AttributeError):
        search = None
    if search is not None:
        sp = search(rung, tuple(shape), dtype, arch, space)
        return {"candidates": list(sp.candidates), "pruned": [(p["knobs"], p["detail"]) for p in sp.pruned],
                "source": "gemm_ladder.tune.search_space (config validator + L2 model)"}
    from .config import ConfigError  # pylint: disable=import-outside-toplevel
    from .rungs import make_config  # pylint: disable=import-outside-toplevel

    names = list(space)
    cands, pruned = [], []
    for values in itertools.product(*(space[n] for n in names)):
        knobs = dict(zip(names, values))
        try:
            make_config(rung, *shape, dtype=dtype, arch=arch, **knobs)
        except ConfigError as err:
            pruned.append((knobs, str(err)))
            continue
        cands.append(knobs)
    return {"candidates": cands, "pruned": pruned, "source": "gemm_ladder.rungs.make_config (config validator)"}
