"""The test harness's own promises: a fork of the warm server stands for `python -m enlace` exactly
when nothing torch reads at import differs (tests/support/forkserver.py)."""

from __future__ import annotations

import os

from support import REPO
from support.forkserver import Forked, Fresh, start_enlace


def _kind(env_changes: dict[str, str]) -> type:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_changes}
    proc = start_enlace(["--version"], REPO, env)
    out, _ = proc.output()
    assert proc.returncode == 0 and "enlace" in out, out
    return type(proc)


def test_a_fork_stands_for_a_fresh_interpreter_unless_an_import_time_setting_differs(monkeypatch):
    monkeypatch.delenv("ENLACE_TEST_FORKSERVER", raising=False)  # the harness as it runs by default
    assert _kind({}) is Forked
    # torch sets its inductor cache dir in os.environ on first use: a test that compiled keeps the fork
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_test")
    assert _kind({}) is Forked
    assert _kind({"OMP_NUM_THREADS": "7"}) is Fresh  # read when torch loads: only a new interpreter has it
