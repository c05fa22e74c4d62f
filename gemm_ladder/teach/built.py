"""A built module, shown: its config and launch, lines of its CUDA source or SASS, instruction counts."""

from __future__ import annotations

import re

from ..compile import sass
from ..core.config import GemmConfig

LINE_WIDTH = 150  # generated CUDA lines are long (64 accumulator operands): cut them here


def config_of(x) -> GemmConfig:
    """The config of a built module (or the config itself)."""
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
    counts = sass.instruction_counts(sass_text(built))
    res = sass.resource_usage(built.binary)
    return {**counts, "registers": res.registers, "stack": res.stack, "local": res.local}


def _label(built) -> str:
    c = built.cfg
    return f"{c.rung} {c.M}x{c.N}x{c.K}" + ("" if c.arch == "sm_90a" else f" {c.arch}")


def show_sass_counts(*built, names=None) -> None:
    """A table of SASS instruction counts (rows) per built module (columns).

    ``names`` picks the instructions; by default those that are non-zero in any module, plus
    the spill opcodes LDL/STL and ptxas's register count.
    """
    cols = [sass_counts(b) for b in built]
    if names is None:
        names = [n for n in sass.KEY_INSTRUCTIONS if any(c[n] for c in cols) or n in ("LDL", "STL")]
    rows = [*names, "registers", "stack"]
    labels = [_label(b) for b in built]
    w0 = max(len(r) for r in rows)
    widths = [max(len(lab), 6) for lab in labels]
    print("  ".join(["SASS".ljust(w0)] + [lab.rjust(w) for lab, w in zip(labels, widths)]))
    for r in rows:
        print("  ".join([r.ljust(w0)] + [str(c[r]).rjust(w) for c, w in zip(cols, widths)]))
