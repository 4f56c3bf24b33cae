"""What a run's processes leave behind is ended with it. torchrun starts each rank in a session of its own, so
torchrun killed (SIGKILL, the OOM killer) leaves its ranks training on, and a SIGKILL to the supervisor's process
group (stop --kill) missed them. Real processes: a parent that starts a child in a session of its own, as
torchrun does (tests/test_remote_ddp.py does it with torchrun itself)."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
from support.remote import wait_until

from enlace.server import trainerchild
from enlace.server.lifecycle import kill_all_of

# a parent (torchrun) that starts a child (a rank) in a session of its own, says its pid, then waits
PARENT = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _rank_of(proc: subprocess.Popen) -> psutil.Process:
    return psutil.Process(int(proc.stdout.readline()))


def test_kill_all_of_ends_what_the_process_started_in_sessions_of_their_own():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    rank = _rank_of(parent)
    try:
        kill_all_of(parent.pid)
        assert parent.wait(timeout=30) == -signal.SIGKILL
        _, alive = psutil.wait_procs([rank], timeout=30)
        assert not alive  # a SIGKILL to the group alone left it running
    finally:
        _end(rank)


def test_the_supervisor_ends_what_a_killed_trainer_left_before_restarting_it(tmp_path, monkeypatch):
    monkeypatch.setattr(trainerchild, "TREE_EVERY_S", 0.0)
    monkeypatch.setattr(trainerchild, "LEFT_GRACE_S", 0.5)
    said = []
    child = trainerchild.TrainerChild([sys.executable, "-c", PARENT], {}, said.append, lambda: None, 0.1, tmp_path)
    proc, rank = child.start(0, ()), None  # (its rank is found the supervisor's way: what tick() sees)
    try:
        wait_until(lambda: child.tick() or len(child.started) == 1, 60, "the trainer's child to start")
        (rank,) = child.started
        proc.kill()
        proc.wait(timeout=30)
        child.reap()
        _, alive = psutil.wait_procs([rank], timeout=30)
        assert not alive and said == [f"the trainer's processes outlived it (pid {rank.pid}): killed (SIGKILL)"], said
        child.reap()  # nothing left: nothing said
        assert len(said) == 1
    finally:
        proc.kill()
        _end(rank)


def _end(proc: psutil.Process | None) -> None:
    """A test's own leftovers, whatever it asserted."""
    if proc is not None and proc.is_running():
        proc.kill()
