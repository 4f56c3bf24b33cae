"""The supervisor tells silence from slow work, and status tells a supervisor that is gone or frozen (faults
round 4, items 2 and 3). Real processes throughout: `enlace start` detaches the supervisor as `launch` does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest
from support.cli import enlace
from support.configs import DETERMINISTIC, write_run
from support.procs import Throttle
from support.remote import wait_until

from enlace.state import heartbeat, runs

pytestmark = pytest.mark.slow


def _start(project, name: str, *policy: str) -> dict:
    args = ["start", name, "--json", "--backoff", "0.5", *policy, "--", "-m", "enlace", "train", name]
    return json.loads(enlace(project, *args).stdout)


def _row(project, name: str) -> dict:
    return runs.observe(project / "runs" / name)


def _training(project, name: str) -> dict:
    wait_until(lambda: _row(project, name)["status"] == "running" and _row(project, name)["step"] > 0, 180, name)
    return runs.read(project / "runs" / name)


def _eval_seconds(log: str) -> float:
    """How long the final eval took: from the last step line to the eval line (train.log's stamps)."""
    lines = log.splitlines()
    stamp = lambda line: time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
    last_step = max(i for i, ln in enumerate(lines) if " step " in ln and "/" in ln)
    eval_line = next(ln for ln in lines[last_step:] if " eval " in ln)
    return stamp(eval_line) - stamp(lines[last_step])


def test_an_eval_longer_than_the_stall_timeout_is_work_not_a_stall(project):
    """Seen: every eval longer than the stall timeout was a stall; the trainer printed `done (finished)`, then
    was restarted three times and the run ended `crashed`. The trainer beats during eval now."""
    write_run(
        project,
        "slow-eval",
        **DETERMINISTIC,
        training={"max_steps": 4, "log_every": 1, "eval_every": 0, "eval_batches": 10000},
        checkpoint={"every": 0},
    )
    # 3 s: three beats' worth (a heartbeat is written at most once a second), so that a loaded machine's slow
    # batch is not a stall; 1 s failed once beside two other test suites (load 13 on 2 cores)
    _start(project, "slow-eval", "--stall-timeout", "3")
    wait_until(lambda: not _row(project, "slow-eval")["alive"], 300, "slow-eval to end")
    row, log = _row(project, "slow-eval"), (project / "runs" / "slow-eval" / "train.log").read_text()
    assert _eval_seconds(log) >= 6, "the eval must outlast the stall timeout twice for this test to mean it"
    assert (row["status"], row["exit_code"], row["restarts"]) == ("finished", 0, None), row
    assert "supervisor:" not in log, log[-2000:]


def _orphaned(project, name: str) -> dict:
    """A long run, training, whose supervisor was then SIGKILLed (its trainer runs on); run.json before."""
    write_run(project, name, **DETERMINISTIC, training={"max_steps": 100_000, "log_every": 1, "eval_every": 0})
    _start(project, name)
    st = _training(project, name)
    os.kill(st["launcher_pid"], signal.SIGKILL)
    wait_until(lambda: _row(project, name)["supervisor"] is not None, 10, "status to tell the supervisor gone")
    return st


def test_a_killed_supervisor_shows_in_status_and_stop_ends_its_trainer(project):
    st = _orphaned(project, "orphan")
    row = _row(project, "orphan")
    assert row["status"] == "running" and row["alive"] and row["supervisor"]["state"] == "gone", row
    report = json.loads(enlace(project, "stop", "orphan", "--grace", "60", "--json").stdout)
    assert report["stopped"] and report["status"] == "stopped", report
    assert runs.proc_start(st["pid"]) is None  # the trainer itself ended


def test_a_frozen_supervisor_over_a_dead_trainer_is_not_running(project):
    """Seen: SIGSTOP of the supervisor, kill -9 of the trainer: `running 30/250` for over a minute, and
    `stop --grace 15` waited its whole grace."""
    write_run(project, "frozen", **DETERMINISTIC, training={"max_steps": 100_000, "log_every": 1, "eval_every": 0})
    _start(project, "frozen")
    st = _training(project, "frozen")
    os.kill(st["launcher_pid"], signal.SIGSTOP)
    try:
        wait_until(lambda: _row(project, "frozen")["supervisor"] is not None, 30, "status to tell it frozen")
        assert _row(project, "frozen")["supervisor"]["state"] == "frozen"
        os.kill(st["pid"], signal.SIGKILL)  # its zombie stays: the frozen supervisor cannot reap it
        wait_until(lambda: not _row(project, "frozen")["alive"], 10, "the dead trainer to count as dead")
        assert _row(project, "frozen")["status"] == "crashed"
        t0 = time.monotonic()
        report = json.loads(enlace(project, "stop", "frozen", "--grace", "15", "--json").stdout)
        assert not report["was_running"] and time.monotonic() - t0 < 10, report
        wait_until(lambda: runs.proc_start(st["launcher_pid"]) is None, 10, "stop to end the frozen supervisor")
    finally:
        for pid in (st["launcher_pid"], st["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_stop_of_a_live_trainer_under_a_frozen_supervisor_says_stopped_and_nothing_else(project):
    """Seen: `stop` printed "stopped at step 2759" and, at once, "still running after 120s" (exit 1): the frozen
    supervisor it had just SIGKILLed was not gone yet when the report read the run."""
    write_run(project, "iced", **DETERMINISTIC, training={"max_steps": 100_000, "log_every": 1, "eval_every": 0})
    _start(project, "iced")
    st = _training(project, "iced")
    os.kill(st["launcher_pid"], signal.SIGSTOP)
    try:
        with Throttle(st["pid"]):  # the trainer need not spin while status waits to call its supervisor frozen
            wait_until(lambda: _row(project, "iced")["supervisor"] is not None, 30, "status to tell it frozen")
        out = enlace(project, "stop", "iced", "--grace", "60", "--json", check=False)
        report = json.loads(out.stdout)
        assert out.returncode == 0 and report["stopped"] and report["status"] == "stopped", (report, out.stderr)
        assert runs.proc_start(st["launcher_pid"]) is None and runs.proc_start(st["pid"]) is None
    finally:
        for pid in (st["launcher_pid"], st["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_new_supervisor_is_not_frozen_by_a_previous_ones_old_beat(tmp_path):
    """A supervisor just started has not beaten yet: the beat a previous one left an hour ago does not make it
    frozen; once it is gone, it is gone whatever the beat says."""
    import subprocess
    import sys

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / heartbeat.SUPERVISOR).write_text(f"{time.time() - 3600}\n")  # a beat an hour old
    new = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {"status": "starting", "launcher_pid": new.pid, "launcher_start": runs.proc_start(new.pid)}
        assert runs.supervision(run_dir, state) is None
    finally:
        new.kill()
        new.wait()
    assert runs.supervision(run_dir, state)["state"] == "gone"


def test_launch_of_a_run_whose_supervisor_is_gone_resumes_it_supervised(project):
    st = _orphaned(project, "adopt")
    _start(project, "adopt")  # what `launch adopt` runs on the server
    again = _training(project, "adopt")
    assert again["launcher_pid"] != st["launcher_pid"] and again["pid"] != st["pid"]
    assert runs.proc_start(st["pid"]) is None and again["resumed_from"], again  # stopped at a checkpoint, resumed
    assert _row(project, "adopt")["supervisor"] is None
    assert "launch: the run's supervisor is gone" in (project / "runs" / "adopt" / "train.log").read_text()
    enlace(project, "stop", "adopt", "--grace", "60")


def test_a_stop_during_the_restart_backoff_counts_no_restart(project):
    """Seen: `stop` while the supervisor waited to restart reported "(restarted 1×)" for a restart that never
    happened."""
    write_run(project, "backoff", **DETERMINISTIC, training={"max_steps": 100_000, "log_every": 1, "eval_every": 0})
    args = ["start", "backoff", "--json", "--backoff", "600", "--", "-m", "enlace", "train", "backoff"]
    json.loads(enlace(project, *args).stdout)
    st = _training(project, "backoff")
    os.kill(st["pid"], signal.SIGKILL)
    wait_until(lambda: "restarting in" in (runs.read(project / "runs" / "backoff").get("phase") or ""), 60, "backoff")
    enlace(project, "stop", "backoff", "--grace", "30")
    row = _row(project, "backoff")
    assert row["status"] == "stopped" and not row["restarts"], row


def test_out_of_device_memory_is_a_verdict_not_retried(project):
    """A CUDA out-of-memory crash was retried 3 times with backoff and failed the same way each time. No GPU
    here: the step raises torch.OutOfMemoryError as CUDA's allocator would (the test stubs train_step)."""
    write_run(project, "oom", training={"max_steps": 50, "batch_size": 8})
    child = (
        "import sys, torch\n"
        "from enlace.train import engine\n"
        "def step(*a, **k): raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        "engine.train_step = step\n"
        "from enlace.__main__ import run\n"
        "sys.argv = ['enlace', 'train', 'oom']\n"
        "run()\n"
    )
    json.loads(enlace(project, "start", "oom", "--json", "--backoff", "0.5", "--", "-c", child).stdout)
    wait_until(lambda: not _row(project, "oom")["alive"], 120, "oom to end")
    row = _row(project, "oom")
    assert (row["status"], row["exit_code"], row["restarts"]) == ("failed", 5, None), row
    assert "batch_size 8" in row["error"] and "training.batch_size=4" in row["error"] and "--max-batch" in row["error"]
    assert "supervisor: " not in (project / "runs" / "oom" / "train.log").read_text()  # no restart was tried
