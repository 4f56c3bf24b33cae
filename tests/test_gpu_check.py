"""bench/gpu_check.py on the CPU, end to end on a tiny model: the script a lent GPU runs must not rot.
(On CPU the figures mean little; the test checks that every section ran and reported.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO


@pytest.mark.slow
@pytest.mark.longest
def test_gpu_check_runs_every_section_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_check.py"),
            "--device",
            "cpu",
            "--small",
            "--steps",
            "6",
            "--budget-s",
            "600",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r) >= {"environment", "drift", "resume", "ddp", "preflight", "costs", "seconds"}
    for section in ("drift", "resume", "ddp", "preflight", "costs"):
        assert "error" not in r[section] and "skipped" not in r[section], (section, r[section])
    assert r["resume"]["identical"] is True and r["resume"]["tensors"] > 50  # deterministic resume on CPU
    assert r["ddp"]["world"] == 2 and r["ddp"]["identical"] is True and r["ddp"]["ranks_draw_apart"] is True
    assert r["environment"]["cublas_workspace_config"] == ":4096:8"  # set before the first GEMM
    assert r["drift"]["max_abs_diff"] == 0.0  # one process, one thread count: CPU does not drift
    assert r["preflight"]["memory_ratio"] > 0 and r["preflight"]["throughput_ratio"] > 0
    assert {"deterministic", "compile", "bf16"} <= set(r["costs"])
    assert r["environment"]["torch"].startswith("2.") and "resume" in p.stdout and "drift" in p.stdout


def test_a_missing_nvidia_smi_costs_only_the_driver_figure(monkeypatch, tmp_path):
    """bench/gpu_check.py reads the driver's version with nvidia-smi; a container without it used to end the
    whole check before its first section (FileNotFoundError)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere on it
    assert gpu_check.driver_version() is None
