"""The shape suite on the CPU: its cases, the summary against the targets, the table and the
plot of a result, and the command's refusal without a GPU. (Running it is a GPU benchmark:
``benchmarks/gpu_session.sh suite``.)"""

import math
import os
import subprocess
import sys
from pathlib import Path

from gemm_ladder.serve import kernel_pack
from gemm_ladder.measure import suite


REPO = Path(__file__).resolve().parents[1]


def test_the_suite_is_the_issues():
    cases = suite.cases()
    assert len(cases) == 2 * (4 + 5 * 7) and len({c["id"] for c in cases}) == len(cases)
    squares = {c["M"] for c in cases if c["group"].startswith("square")}
    assert squares == {1024, 2048, 4096, 8192}
    llama = {(c["N"], c["K"]) for c in cases if "llama" in c["group"]}
    assert llama == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)}
    assert {c["M"] for c in cases if "llama" in c["group"]} == {1, 16, 64, 128, 512, 2048, 8192}
    assert {c["dtype"] for c in cases} == {"float16", "bfloat16"}
    assert set(suite.shapes()) == {(c["M"], c["N"], c["K"]) for c in cases}
    assert suite.parse_id("bfloat16-16x6144x4096") == (16, 6144, 4096, "bfloat16")
    assert kernel_pack.MODELS[suite.SUITE_MODEL]["lm_head"] == (128256, 4096)


def _row(case_id, ratio, M=4096, status="ok", memory_bound=False):
    M_, N, K, dtype = suite.parse_id(case_id)
    return {"id": case_id, "M": M_, "N": N, "K": K, "dtype": dtype, "group": "g", "status": status,
            "ratio_to_cublas": ratio, "tflops": 600 * ratio, "gbps": 2000.0, "cublas_gbps": 2100.0,
            "memory_bound": memory_bound, "host_us": 9.0,
            "route": {"rung": "v9", "source": "kernel pack", "knobs": {}}}


def test_summary_against_the_targets():
    rows = [_row("float16-4096x4096x4096", 1.0), _row("float16-16x4096x4096", 0.9),
            _row("float16-512x4096x4096", 0.96)]
    s = suite.summary(rows)
    assert math.isclose(s["geomean"], (1.0 * 0.9 * 0.96) ** (1 / 3))
    assert s["min"] == 0.9 and s["min_m_ge_128"] == 0.96 and s["met"]  # geomean 0.952, M=16 may be 0.9
    low = suite.summary(rows + [_row("float16-128x4096x4096", 0.8)])
    assert low["below_0_85_m_ge_128"] == ["float16-128x4096x4096"] and not low["met"]
    broken = suite.summary(rows + [_row("float16-1x4096x4096", 0, status="wrong")])
    assert broken["not_ok"] == ["float16-1x4096x4096"] and not broken["met"]


def test_table_and_plot_of_a_result(tmp_path):
    doc = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "date": "2026-11-22T00:00:00+00:00", "commit": "abcdef12",
           "hbm_peak_gbps": 3352.3,
           "results": [_row("float16-1x4096x4096", 0.8, memory_bound=True), _row("bfloat16-4096x4096x4096", 1.01)]}
    doc["summary"] = suite.summary(doc["results"])
    rows = suite.table_rows(doc)
    assert rows[0]["GB/s"] == "2000" and rows[1]["GB/s"] == "" and rows[1]["rung"] == "v9"
    png = suite.plot_result(doc, tmp_path / "suite.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_suite_run_needs_a_gpu(tmp_path):
    """Without a GPU, ``suite run`` refuses before any work and writes nothing. The child is shown
    no GPU on any box (CUDA_VISIBLE_DEVICES is empty), so this runs on a GPU box too, hermetic: in
    a temporary folder with its result and plot paths there, no pack from the environment, and no
    bytecode written into the checkout."""
    env = {k: v for k, v in os.environ.items() if k != kernel_pack.PACK_ENV}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "gemm_ladder", "suite", "run", "--out", str(tmp_path / "x.json")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "suite run needs a CUDA GPU (torch sees no CUDA GPU)" in out.stderr, out.stderr
    assert out.stdout == "" and list(tmp_path.iterdir()) == []  # no result, no plot
