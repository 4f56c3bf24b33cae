"""The supervisor (enlace/server/supervise.py) heals a detached run: a SIGKILLed trainer restarts from its newest
checkpoint and ends bit for bit where an uninterrupted run ends; a stopped (SIGSTOP) trainer is a stall:
its stacks go to train.log, it is restarted; a config error, a `stop` and spent restarts are not retried.
Real processes throughout: `enlace start` detaches the supervisor exactly as `launch` does."""

from __future__ import annotations

import json
import os
import signal

import pytest
from support.cli import enlace, run_json
from support.configs import DETERMINISTIC, write_run
from support.procs import Throttle
from support.remote import wait_until

from enlace.preflight.verify_resume import compare_states
from enlace.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

RUN = {
    **DETERMINISTIC,
    "training": {"max_steps": 200, "log_every": 1, "eval_every": 0},  # long enough to act on before it ends
    "checkpoint": {"every": 5, "keep": 10},
}


def _start(project, name: str, *policy: str, trainer: tuple[str, ...] = ()) -> dict:
    """`enlace start` (its `policy` options) of `enlace train NAME` (and its `trainer` options)."""
    args = ["start", name, "--json", "--backoff", "0.5", *policy, "--", "-m", "enlace", "train", name, *trainer]
    return json.loads(enlace(project, *args).stdout)  # --root ROOT goes last: to the trainer; start runs in ROOT


def _state(project, name: str) -> dict:
    path = project / "runs" / name / "run.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _at_step(project, name: str, step: int, restarts: int = 0) -> int:
    """Wait until the run's trainer (after `restarts` restarts) has trained `step` steps; its pid. The trainer
    runs a tenth of the time meanwhile (Throttle), so a tiny run cannot finish before the test acts on it;
    a pause cannot change what a deterministic run computes."""

    def running(at: int) -> bool:
        st = _state(project, name)
        return st.get("status") == "running" and st.get("step", 0) >= at and (st.get("restarts") or 0) == restarts

    wait_until(lambda: running(1), 180, f"{name} training after {restarts} restarts")
    pid = _state(project, name)["pid"]
    with Throttle(pid):
        wait_until(lambda: running(step), 180, f"{name} at step {step} after {restarts} restarts")
    return pid


def _ended(project, name: str) -> dict:
    from enlace.state import runs

    wait_until(lambda: not runs.observe(project / "runs" / name)["alive"], 300, f"{name} to end")
    return runs.observe(project / "runs" / name)


def test_a_run_killed_twice_is_restarted_and_ends_equal_to_an_uninterrupted_one(project, tmp_path):
    """Started with --resume none over an earlier line of checkpoints (another learning rate): each restart
    resumes from this line's newest (seen: `--resume none` on the restart's command line began at step 0 again),
    and the earlier line is set aside, not resumed and not pruned."""
    write_run(project, "heal", **RUN)
    enlace(project, "train", "heal", "--until", "10", "--set", "optim.learning_rate=0.02")
    _start(project, "heal", "--restarts", "3", trainer=("--resume", "none"))
    os.kill(_at_step(project, "heal", 7), signal.SIGKILL)
    os.kill(_at_step(project, "heal", 17, restarts=1), signal.SIGKILL)
    row = _ended(project, "heal")
    assert row["status"] == "finished" and row["restarts"] == 2, row
    log = (project / "runs" / "heal" / "train.log").read_text()
    assert log.count("supervisor: the trainer was killed by SIGKILL at step") == 2
    assert "restart 2 of 3" in log
    # each restart resumed this line's newest checkpoint (which one depends on where the kill fell)
    assert log.count("starting from step 0 (--resume none)") == 1 and log.count("resumed from checkpoints/") == 2, log
    aside = list((project / "runs" / "heal" / "checkpoints-set-aside").iterdir())
    assert [sorted(p.name for p in d.iterdir()) for d in aside] == [["metrics.jsonl", "step-000005", "step-000010"]]
    frozen = (project / "runs" / "heal" / "config.yaml").read_text()
    assert "learning_rate: 0.02" not in frozen  # config.yaml is this line's, not the line set aside
    enlace(project, "train", "heal", "--runs-dir", str(tmp_path / "straight"))
    a = load_checkpoint(tmp_path / "straight" / "heal" / "checkpoints" / "step-000200")
    b = load_checkpoint(project / "runs" / "heal" / "checkpoints" / "step-000200")
    assert compare_states(a, b)["identical"], compare_states(a, b)


def test_a_stalled_run_has_its_stacks_logged_and_is_restarted(project):
    write_run(project, "hang", **RUN)
    _start(project, "hang", "--stall-timeout", "3")
    os.kill(_at_step(project, "hang", 6), signal.SIGSTOP)  # hung: alive, no new step
    row = _ended(project, "hang")
    assert row["status"] == "finished" and row["restarts"] == 1, row
    log = (project / "runs" / "hang" / "train.log").read_text()
    assert "supervisor: no sign of life for 3 s" in log and "the trainer's stacks follow" in log
    assert "thread 0x" in log.lower() and 'File "' in log  # faulthandler's dump of the stalled trainer
    assert "supervisor: the trainer stalled at step" in log


def test_config_errors_stops_and_spent_restarts_are_not_retried(project):
    write_run(project, "bad", **RUN, optim={"learning_rate": -1.0})
    _start(project, "bad")
    row = _ended(project, "bad")
    assert row["status"] == "failed" and not row["restarts"] and "learning_rate" in row["error"], row

    write_run(project, "halt", **RUN)
    _start(project, "halt")
    _at_step(project, "halt", 3)
    enlace(project, "stop", "halt")
    row = _ended(project, "halt")
    assert row["status"] == "stopped" and not row["restarts"], row

    write_run(project, "doomed", **{**RUN, "training": {**RUN["training"], "max_steps": 100000}})
    _start(project, "doomed", "--restarts", "1")
    os.kill(_at_step(project, "doomed", 3), signal.SIGKILL)
    os.kill(_at_step(project, "doomed", 4, restarts=1), signal.SIGKILL)
    row = _ended(project, "doomed")
    assert row["status"] == "crashed" and "gave up after 1 restart: the trainer was killed by SIGKILL" in row["error"]
    assert "supervisor: gave up after 1 restart" in (project / "runs" / "doomed" / "train.log").read_text()
    assert run_json(project / "runs" / "doomed")["exit_code"] == 8
