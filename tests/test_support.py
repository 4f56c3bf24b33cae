"""The test harness's own promises: a fork of the warm server stands for `python -m enlace`, and for the
driver, exactly when nothing torch reads at import differs (tests/support/forkserver.py)."""

from __future__ import annotations

import os

from support import REPO
from support.forkserver import Forked, Fresh, start_enlace, start_python
from support.remote import DRIVER


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


def test_a_forked_driver_says_what_a_new_interpreter_says(tmp_path, monkeypatch):
    """`enlace-remote` as support/remote.py runs it: forked, its exit status and both streams are the
    ones a new interpreter gives (here: run outside a git repository)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [*DRIVER, "--host", "local", "status"]
    monkeypatch.delenv("ENLACE_TEST_FORKSERVER", raising=False)
    forked = start_python(cmd, tmp_path, env)
    monkeypatch.setenv("ENLACE_TEST_FORKSERVER", "0")  # the same call with the fork server off
    fresh = start_python(cmd, tmp_path, env)
    said = [(p.output(), p.returncode) for p in (forked, fresh)]
    assert (type(forked), type(fresh)) == (Forked, Fresh) and said[0] == said[1], said
    (out, err), code = said[0]
    assert code == 2 and out == "" and "is not inside a git repository" in err and "Traceback" not in err, err


def test_the_fork_server_takes_a_request_that_arrives_in_parts():
    """Seen once in CI: a driver run through the fork server exited 1 with no output. A stream socket may hand
    the request over in parts; the child parsed half of it and died before its output was set up. A request
    larger than one receive (a 3 MB environment) must still run."""
    import sys

    from support.forkserver import run_python

    env = {**os.environ, "PYTHONPATH": str(REPO), "LARGE": "x" * 3_000_000}
    code = "import os; print(len(os.environ['LARGE']))"
    out = run_python([sys.executable, "-c", code], REPO, env, 120, fresh=False)
    assert (out.returncode, out.stdout) == (0, "3000000\n"), out.stderr
