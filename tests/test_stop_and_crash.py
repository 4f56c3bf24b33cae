"""Safe stop on SIGTERM, immediate exit on a second signal, and kill -9 during checkpoint writes."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from support import REPO
from support.cli import enlace, run_json
from support.configs import DETERMINISTIC, write_run
from support.forkserver import start_enlace

from enlace.manifest import latest_checkpoint
from enlace.preflight.verify_resume import compare_states
from enlace.train.checkpoint import load_checkpoint


def _start(project, name, *args):
    """`enlace train` in the background, its stdout and stderr as one text (`.output()`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return start_enlace(["train", name, "--root", str(project), *args], project, env, merge_stderr=True)


def _wait_while_alive(proc, deadline: float, cond, poll_s: float, what: str) -> None:
    """Poll `cond` until true; fail if the trainer exits first (with its output) or past `deadline`."""
    while not cond():
        assert proc.poll() is None, proc.output()[0]
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def _wait_for_step(run_dir, step, proc, timeout=60):
    def reached() -> bool:
        return (run_dir / "run.json").exists() and run_json(run_dir).get("step", 0) >= step

    _wait_while_alive(proc, time.time() + timeout, reached, poll_s=0.02, what=f"step {step}")


ENDLESS_RUN = {
    **DETERMINISTIC,
    "training": {"max_steps": 100000, "log_every": 1, "eval_every": 0},
    "checkpoint": {"every": 0},
}


@pytest.mark.slow
def test_sigterm_finishes_step_saves_and_resumes_exactly(project, tmp_path):
    write_run(project, "det", **ENDLESS_RUN)
    run_dir = project / "runs" / "det"
    proc = _start(project, "det")
    _wait_for_step(run_dir, 3, proc)
    at_signal = run_json(run_dir)["step"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    state = run_json(run_dir)
    assert state["status"] == "stopped" and state["exit_code"] == 0
    stopped_at = state["step"]
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt.name == f"step-{stopped_at:06d}"
    assert stopped_at <= at_signal + 2, (at_signal, stopped_at)  # it finished the step under way, then saved

    # Resume to stopped_at + 3 and compare with a straight run to the same step.
    target = str(stopped_at + 3)
    enlace(project, "train", "det", "--until", target)
    enlace(project, "train", "det", "--until", target, "--runs-dir", str(tmp_path / "straight"))
    a = load_checkpoint(run_dir / "checkpoints" / f"step-{int(target):06d}")
    b = load_checkpoint(tmp_path / "straight" / "det" / "checkpoints" / f"step-{int(target):06d}")
    assert compare_states(a, b)["identical"]


@pytest.mark.slow
def test_second_signal_exits_at_once_and_keeps_last_checkpoint(project):
    # Steps of ~0.1-0.3 s, so the second signal lands while the first is still being honoured.
    write_run(
        project,
        "twice",
        **{**ENDLESS_RUN, "checkpoint": {"every": 2, "keep": 2}},
        model={"d_model": 256, "n_layer": 4, "n_head": 4, "seq_len": 128, "dropout": 0.0},
    )
    run_dir = project / "runs" / "twice"
    proc = _start(project, "twice")
    _wait_for_step(run_dir, 5, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.03)  # two signals sent back to back are delivered to Python as one
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=30)
    assert rc == 128 + signal.SIGINT  # exited at once, without finishing the step or saving
    assert run_json(run_dir)["status"] == "stopped"
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    load_checkpoint(ckpt)  # complete and verified against MANIFEST
    enlace(project, "train", "twice", "--until", str(int(ckpt.name[5:]) + 1))


@pytest.mark.slow
@pytest.mark.longest
def test_kill_9_during_checkpoint_writes_never_leaves_a_broken_latest(project):
    """Save every step with a model big enough that saving is most of the time, then kill -9: in
    odd rounds at a random moment, in even rounds as soon as a save's temp dir appears (so enough
    kills land mid-write even when load stretches the steps between saves). After each kill,
    `latest` must name a complete checkpoint that loads and resumes (the next round resumes from it)."""
    write_run(
        project,
        "crash",
        runtime={"deterministic": True},
        model={"d_model": 128, "n_layer": 2, "n_head": 2, "seq_len": 32},
        training={"max_steps": 100000, "log_every": 1, "eval_every": 0},
        checkpoint={"every": 1, "keep": 2},
    )
    ckpts = project / "runs" / "crash" / "checkpoints"
    rng = random.Random(0)
    mid_write, last_step = 0, 0

    def saving() -> bool:  # a save's temp dir exists: a kill now lands mid-write
        return any(p.name.startswith(".tmp-") for p in ckpts.iterdir())

    def newer_checkpoint(than: int) -> bool:
        return (ck := latest_checkpoint(ckpts)) is not None and int(ck.name[5:]) > than

    for round_ in range(20):
        proc = _start(project, "crash")
        deadline = time.time() + 60
        _wait_while_alive(proc, deadline, lambda last=last_step: newer_checkpoint(last), 0.01, "a new checkpoint")
        if round_ % 2:
            time.sleep(rng.uniform(0.0, 0.3))
        else:
            _wait_while_alive(proc, deadline, saving, 0.001, "a save to begin")
        proc.kill()
        proc.wait()
        mid_write += saving()
        latest = latest_checkpoint(ckpts)
        files = load_checkpoint(latest)  # verified against MANIFEST, weights_only
        assert files["trainer.pt"]["step"] == int(latest.name[5:])
        if (ckpts / "latest").exists():  # absent only if killed before the very first `latest` write
            load_checkpoint(ckpts / (ckpts / "latest").read_text().strip())  # what it names is complete
        last_step = files["trainer.pt"]["step"]
    assert mid_write >= 5, f"only {mid_write} of 20 kills landed during a checkpoint write"


def test_stop_never_overwrites_a_final_status_nor_signals_twice(tmp_path):
    """Compare-and-set: a run that has already written `stopped` (its process still exiting) or that a
    first stop is stopping gets no second SIGTERM, and its status is left as the trainer wrote it."""
    import subprocess

    from enlace.contract import Status
    from enlace.server import lifecycle
    from enlace.state import runs

    for recorded in (Status.STOPPED, Status.STOPPING):
        run_dir = tmp_path / recorded.value
        proc = subprocess.Popen(["sleep", "60"])  # stands in for a trainer that is still exiting
        try:
            runs.update(run_dir, status=recorded, pid=proc.pid, pid_start=runs.proc_start(proc.pid))
            report = lifecycle.stop(run_dir, grace=0.3, kill=False)
            assert proc.poll() is None, "a second stop signalled the process again"
            assert runs.read(run_dir)["status"] == recorded.value
            assert report["was_running"] and not report["stopped"]
        finally:
            proc.kill()
            proc.wait()


def test_stop_kill_of_a_process_that_ignores_sigterm_says_killed_not_its_last_phase(tmp_path):
    """`stop --kill` past the grace: stopped, and the phase says killed (status showed `└ running the command`
    under `stopped`). A real process that ignores SIGTERM stands for the run's."""
    import subprocess
    import sys

    from enlace.contract import Status
    from enlace.server import lifecycle
    from enlace.state import runs

    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # its handler is in place
        run_dir = tmp_path / "deaf"
        st = {"status": Status.RUNNING, "phase": "running the command"}
        runs.update(run_dir, **st, pid=proc.pid, pid_start=runs.proc_start(proc.pid))
        report = lifecycle.stop(run_dir, grace=0.3, kill=True)
        assert proc.wait(timeout=60) == -9 and report["was_running"], report
        row = runs.read(run_dir)
        assert (row["status"], row["phase"], row["error"]) == (
            "stopped",
            "killed by stop --kill",
            "killed by stop --kill",
        )
    finally:
        proc.kill()
        proc.wait()


def test_stop_kill_of_a_run_that_saved_and_recorded_its_stop_but_exits_late_is_a_clean_stop(tmp_path):
    """Past the grace, a run that had recorded `stopped` (its checkpoint saved) and was still exiting got SIGKILL
    and was reported killed, its status overwritten with "killed by stop --kill". A real process that records its
    stop on SIGTERM, then lingers, stands for the run's."""
    import subprocess
    import sys

    from enlace.contract import Status
    from enlace.server import lifecycle
    from enlace.state import runs

    run_dir = tmp_path / "late"
    code = (
        "import signal, sys, time\nfrom pathlib import Path\nfrom enlace.state import runs\n"
        "def stop(*a):\n    runs.update(Path(sys.argv[1]), status='stopped', phase='stopped at step 5')\n"
        "signal.signal(signal.SIGTERM, stop); print('ready', flush=True)\nwhile True: time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        runs.update(run_dir, status=Status.RUNNING, pid=proc.pid, pid_start=runs.proc_start(proc.pid))
        report = lifecycle.stop(run_dir, grace=1, kill=True)
        assert proc.wait(timeout=60) == -9  # its late exit is ended all the same
        row = runs.read(run_dir)
        assert not report["killed"] and (row["status"], row["phase"]) == ("stopped", "stopped at step 5"), row
        assert row.get("error") is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_five_double_stops_in_a_row_end_stopped_with_the_checkpoint_named(project):
    """Two `enlace stop` 0.3 s apart, five times over: each time the run ends `stopped` (never `stopping`
    or `crashed`) and both stops name the checkpoint it wrote."""
    import json
    import subprocess
    import sys

    write_run(project, "endless", **ENDLESS_RUN)
    run_dir = project / "runs" / "endless"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stop = [sys.executable, "-m", "enlace", "stop", "endless", "--root", str(project), "--json", "--grace", "120"]
    for attempt in range(5):
        before = run_json(run_dir)["step"] if (run_dir / "run.json").exists() else 0
        proc = _start(project, "endless")
        _wait_for_step(run_dir, before + 2, proc)
        first = subprocess.Popen(stop, stdout=subprocess.PIPE, text=True, env=env, cwd=project)
        time.sleep(0.3)  # the gap between the two stops the fault was found with, not a wait for an event
        second = subprocess.Popen(stop, stdout=subprocess.PIPE, text=True, env=env, cwd=project)
        reports = [json.loads(p.communicate(timeout=180)[0]) for p in (first, second)]
        proc.wait(timeout=60)
        state = run_json(run_dir)
        assert state["status"] == "stopped" and state["exit_code"] == 0, (attempt, state)
        named = f"step-{state['step']:06d}"
        assert latest_checkpoint(run_dir / "checkpoints").name == named
        for report in reports:
            assert report["status"] == "stopped" and report["latest_checkpoint"] == named, (attempt, reports)
        assert "crashed" not in proc.output()[0]
