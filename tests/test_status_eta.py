"""status's ETA counts to where the run's current start stops: `launch RUN --until N` trains to step N, and the
ETA counted to max_steps (590 of 3000 with --until 600 showed 3m51s)."""

from __future__ import annotations

import json
import os

import pytest

from enlace.state import runs


@pytest.mark.parametrize(("until", "eta"), [(20, 10.0), (None, 90.0), (5, 0.0)])
def test_the_eta_counts_to_the_step_this_start_stops_at(tmp_path, until, eta):
    me = {"pid": os.getpid(), "pid_start": runs.proc_start(os.getpid())}  # the trainer: this live process
    doc = {"status": "running", "step": 10, "max_steps": 100, "tokens": 1000, "tokens_per_s": 100.0, **me}
    (tmp_path / "run.json").write_text(json.dumps({**doc, "until": until}))  # 100 tokens a step: 1 s a step
    row = runs.observe(tmp_path)
    assert row["status"] == "running" and row["eta_s"] == pytest.approx(eta)
