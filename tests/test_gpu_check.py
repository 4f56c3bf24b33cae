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
    sections = ("drift", "resume", "ddp", "preflight", "costs", "throughput")
    assert set(r) >= {"environment", "seconds", *sections}
    assert len({r[s]["pid"] for s in ("environment", *sections)}) == 7  # each in a process of its own
    for section in sections:
        assert "error" not in r[section] and "skipped" not in r[section], (section, r[section])

    assert r["resume"]["identical"] is True and r["resume"]["tensors"] > 50  # deterministic resume on CPU
    assert r["ddp"]["world"] == 2 and r["ddp"]["identical"] is True and r["ddp"]["ranks_draw_apart"] is True
    assert r["environment"]["cublas_workspace_config"] == ":4096:8"  # set before the first GEMM
    assert r["drift"]["max_abs_diff"] == 0.0  # one process, one thread count: CPU does not drift
    assert r["preflight"]["memory_ratio"] > 0 and r["preflight"]["throughput_ratio"] > 0
    for cost in ("deterministic", "memory_fill", "compile", "bf16"):  # each measured alone, none lost
        assert "error" not in r["costs"][cost] and len(r["costs"][cost]) == 3, (cost, r["costs"][cost])
    assert r["costs"]["optimizer"] == {"skipped": "fused AdamW is CUDA's"}
    for rate in ("enlace_step", "enlace_train", "nanogpt"):  # beside nanoGPT's loop; no MFU without a card's peak
        assert r["throughput"][rate]["tokens_per_s"] > 0 and r["throughput"][rate]["mfu"] is None, r["throughput"]
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


def test_a_section_that_fails_costs_its_own_figures_only(monkeypatch):
    """Each section runs in a process of its own: one that exits with an error (here: a section name the child
    does not know) or runs past its time is recorded as such, and the parent holds nothing of it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    failed = gpu_check.section("no-such-section", ["--device", "cpu"], 120)
    assert failed["error"].startswith("exited 2: ") and "invalid choice" in failed["error"]
    assert gpu_check.section("environment", ["--device", "cpu"], 0.01) == {"error": "ended after 0 s (its time)"}
    load = (
        f"import importlib.util as u, sys; s = u.spec_from_file_location('g', {str(REPO / 'bench' / 'gpu_check.py')!r})"
    )
    load += "; s.loader.exec_module(u.module_from_spec(s)); print('torch' in sys.modules)"
    parent = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert parent.stdout.strip() == "False", parent.stderr  # the parent holds no CUDA context between sections


def test_the_table_says_once_why_a_figure_is_missing():
    """A skipped cost or a section that failed is one line with its reason, never the reason printed where
    the number goes (twice for a throughput row, with a negative count of seconds, before)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    r = {
        "environment": {"device": "cpu", "name": "x86_64", "torch": "2.13.0"},
        "drift": {"error": "exited 1: boom"},
        "costs": {"optimizer": {"skipped": "fused AdamW is CUDA's"}, "bf16": {"bf16_over_fp32": 0.6}},
        "throughput": {"skipped": "the budget (60 s) was spent before it"},
        "seconds": {"total": 61.0},
        "budget_s": 60.0,
    }
    lines = {line[:14].strip(): line[14:].strip() for line in gpu_check.table(r).splitlines()}
    assert lines["drift"] == "error: exited 1: boom"
    assert lines["optimizer"] == "skipped: fused AdamW is CUDA's"
    assert lines["bf16"] == "bf16/fp32 tokens/s 0.6"
    assert lines["enlace step"] == lines["nanoGPT loop"] == "skipped: the budget (60 s) was spent before it"
    assert lines["resume"] == "not run (the check ended before it)"  # absent: ended from outside first
