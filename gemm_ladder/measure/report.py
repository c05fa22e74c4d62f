"""What people read: the ``info``, ``verify`` and ``bench`` tables the CLI prints, and progress bars.

Plain text, fixed-width columns; every function takes rows (dicts) and returns strings or rows,
so what is printed can be tested without a terminal.
"""

from __future__ import annotations

from pathlib import Path

from ..compile import sass
from ..core.manifest import ManifestError, check_file, read_manifest

INFO_COLS = ["module", "grid", "threads", "smem", "regs", "stack", "spills(LDL/STL)", "UTMALDG",
             "UTMASTG", "HGMMA", "UTCHMMA", "LDTM", "LDGSTS/LDG"]
VERIFY_COLS = ["module", "status", "rel_err", "cublas_rel_err", "detail"]
BENCH_COLS = ["module", "status", "ms", "tflops", "cublas_tflops", "ratio_to_cublas"]


def table(rows: list[dict], cols: list[str]) -> str:
    """``rows`` as left-aligned columns ``cols`` under a header and a rule."""
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    line = "  ".join(c.ljust(widths[c]) for c in cols)
    sep = "  ".join("-" * widths[c] for c in cols)
    body = ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join([line, sep, *body])


def info_row(path) -> dict:
    """Launch shape, resources and key SASS counts of one exported module (raises
    ``ManifestError`` or ``OSError`` when the module or its manifest is damaged)."""
    man = read_manifest(path)
    check_file(path, man)
    blob = Path(path).read_bytes()
    counts = sass.instruction_counts(sass.disassemble(blob))
    res = sass.resource_usage(blob)
    launch = man.get("launch", {})
    return {
        "module": Path(path).name,
        "rung": man["rung"],
        "shape": "x".join(map(str, man["shape"])),
        "dtype": man["dtype"],
        "arch": man["arch"],
        "grid": "1/SM" if launch.get("persistent") else "x".join(map(str, launch.get("grid", []))),
        "threads": launch.get("threads", ""),
        "smem": launch.get("smem_bytes", ""),
        "regs": res.registers,
        "stack": res.stack,
        "spills(LDL/STL)": f"{counts['LDL']}/{counts['STL']}",
        "UTMALDG": counts["UTMALDG"],
        "UTMASTG": counts["UTMASTG"],
        "HGMMA": counts["HGMMA"],
        "UTCHMMA": counts["UTCHMMA"] + counts["UTCQMMA"],
        "LDTM": counts["LDTM"],
        "LDGSTS/LDG": f"{counts['LDGSTS']}/{counts['LDG']}",
    }


def info_rows(paths) -> tuple[list[dict], list[str]]:
    """:func:`info_row` of every module, and one line per module that could not be read."""
    rows, problems = [], []
    for p in paths:
        try:
            rows.append(info_row(p))
        except (OSError, ManifestError, ValueError) as err:  # ValueError: sass found no device binary in it
            problems.append(f"{Path(p).name}: {err}")
    return rows, problems


def _err(x) -> str:
    return "" if x is None else f"{x:.2e}"


def verify_rows(rows: list[dict]) -> list[dict]:
    return [{**r, "rel_err": _err(r.get("rel_err")), "cublas_rel_err": _err(r.get("cublas_rel_err"))}
            for r in rows]


def bench_rows(report: dict) -> list[dict]:
    rows = []
    for r in report["results"]:
        rows.append({**r, "ms": f"{r['ms']:.3f}" if "ms" in r else "",
                     "tflops": f"{r['tflops']:.1f}" if "tflops" in r else "",
                     "cublas_tflops": f"{r['cublas_tflops']:.1f}" if "cublas_tflops" in r else "",
                     "ratio_to_cublas": f"{r['ratio_to_cublas']:.3f}" if "ratio_to_cublas" in r else ""})
    return rows


def gpu_line(gpu: dict) -> str:
    return (f"GPU: {gpu['name']}  SM clock {gpu['sm_clock_mhz_now']} (max {gpu['sm_clock_mhz_max']})  "
            f"power limit {gpu['power_limit']}")
