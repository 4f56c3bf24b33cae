"""A run on the test Slurm cluster as the Slurm tests read it: its run.json and train.log on the login node's
remote_dir (the `cluster` host), and a trainer held until Slurm's time-limit signal has reached its batch step."""

from __future__ import annotations

import json
import os
import signal
from functools import partial

from .remote import server_dir, wait_until


def run_json(srv, name: str) -> dict:
    try:
        return json.loads((server_dir(srv, "cluster") / "runs" / name / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def train_log(srv, name: str) -> str:
    path = server_dir(srv, "cluster") / "runs" / name / "train.log"
    return path.read_text() if path.exists() else ""


def training(srv, name: str, start: int) -> bool:
    """Whether start `start` of the run's job (1: the first, 2: after one requeue) has trained a step."""
    state = run_json(srv, name)
    return state.get("status") == "running" and state.get("requeues") == start - 1 and state.get("step", 0) > 0


def pause_until_limit_signal(srv, *names: str, start: int) -> None:
    """Hold the runs' trainers (SIGSTOP) once they are training, until each batch step has logged Slurm's USR1
    (start `start` of its job); then let them go: they get the batch step's SIGTERM and checkpoint. Runs
    launched together wait out one time limit together."""
    for name in names:
        wait_until(partial(training, srv, name, start), 180, f"{name} training (start {start})")
    pids = [run_json(srv, name)["pid"] for name in names]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: all(train_log(srv, name).count("time limit is near") >= start for name in names),
            150,
            "Slurm's USR1",
        )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
