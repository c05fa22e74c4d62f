"""``benchmarks/prefill_host.py`` off the GPU: its arguments and refusals (the probe itself runs on
the GPU box: ``benchmarks/results/2026-11-28_h200_e2e_qkv/``)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import prefill_host  # noqa: E402  (a script beside the benchmarks)


@pytest.mark.parametrize("shape", ["512", "1x0", "axb", "1x512x3"])
def test_a_bad_shape_is_refused_in_one_line(shape, capsys):
    with pytest.raises(SystemExit):
        prefill_host.main(["build/none", "--shape", shape])
    assert "batch x sequence as BxS" in capsys.readouterr().err


def test_without_a_gpu_it_says_so_and_stops(capsys, monkeypatch):
    monkeypatch.setattr(prefill_host.device, "why_no_gpu", lambda index=0: "no CUDA GPU here")
    assert prefill_host.main(["build/none", "--shape", "2x64"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_a_folder_without_the_plan_is_refused_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(prefill_host.device, "why_no_gpu", lambda index=0: None)
    with pytest.raises(ValueError, match="prepare --fuse"):
        prefill_host.main([str(tmp_path)])
