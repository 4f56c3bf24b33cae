"""What a launch leaves running is found and ended with it, wherever it went: torchrun starts each rank in a
session of its own, and a killed parent's children go to init, so neither process groups nor parent links find
them; the launch's id in their environment does (enlace/server/launched.py). Real processes: a parent that starts
a child in a session of its own, as torchrun does (tests/test_remote_ddp.py does it with torchrun itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from support.remote import wait_until

from enlace.contract import LAUNCH_ID_ENV
from enlace.server import launched, trainerchild

# a parent (torchrun) that starts a child (a rank) in a session of its own, says its pid, then waits
PARENT = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def launch_id():
    """A launch id of this test's own; whatever carries it is ended at the end, whatever the test asserted."""
    ident = f"test-{time.time_ns()}-{os.getpid()}"
    yield ident
    launched.send(launched.processes_of(ident), signal.SIGKILL)


def _start(launch_id: str, **popen) -> tuple[subprocess.Popen, psutil.Process]:
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env, **popen)
    return parent, psutil.Process(int(parent.stdout.readline()))


def test_a_launch_s_processes_are_found_by_its_id_once_their_parent_is_killed(launch_id):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # no id: never the launch's
    try:
        parent, rank = _start(launch_id, start_new_session=True)
        assert set(launched.processes_of(launch_id)) == {psutil.Process(parent.pid), rank}
        parent.kill()
        parent.wait(timeout=30)
        assert launched.processes_of(launch_id) == [rank]  # re-parented, a session of its own: still found
        assert launched.processes_of(None) == [] and launched.processes_of("another-launch") == []
    finally:
        other.kill()


def test_kill_launch_ends_the_group_and_every_process_of_the_launch(launch_id):
    parent, rank = _start(launch_id, start_new_session=True)
    launched.kill_launch(launch_id, parent.pid)
    assert parent.wait(timeout=30) == -signal.SIGKILL
    assert launched.wait([rank], 30) == []  # a SIGKILL to the group alone left it running


def test_the_supervisor_ends_what_a_killed_trainer_left_before_restarting_it(launch_id, tmp_path, monkeypatch):
    monkeypatch.setattr(trainerchild, "LEFT_GRACE_S", 0.5)
    said = []
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    child = trainerchild.TrainerChild([sys.executable, "-c", PARENT], env, said.append, lambda: None, 0.1, tmp_path)
    proc = child.start(0, ())
    wait_until(lambda: len(launched.processes_of(launch_id)) == 2, 60, "the trainer's child to start")
    (rank,) = [p for p in launched.processes_of(launch_id) if p.pid != proc.pid]
    proc.kill()
    proc.wait(timeout=30)
    child.reap()
    assert launched.wait([rank], 30) == []
    assert said == [f"the trainer ended, but processes it started did not (pid {rank.pid}): killed (SIGKILL)"]
    child.reap()  # nothing left: nothing said
    assert len(said) == 1


def test_what_a_launch_s_process_started_without_the_id_is_found_and_a_respawner_is_ended(launch_id):
    """A process whose environment lacks the id (setproctitle overwrites its memory; here it was started without
    it) is found while its parent is; one that restarts its child whenever it dies, ignoring SIGTERM, is ended with
    all it started, nothing of the launch left (one look, then SIGKILL, let a new child live)."""
    bare = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={}, start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", bare], stdout=subprocess.PIPE, env={**os.environ, LAUNCH_ID_ENV: launch_id}
    )
    child = psutil.Process(int(parent.stdout.readline()))
    assert set(launched.processes_of(launch_id)) == {psutil.Process(parent.pid), child}
    respawner = (
        "import signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n    subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    )
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    subprocess.Popen([sys.executable, "-c", respawner], env=env, start_new_session=True)
    wait_until(lambda: len(launched.processes_of(launch_id)) == 4, 60, "the respawner's child")
    killed = launched.kill_all(launch_id)
    assert len(killed) >= 4 and launched.processes_of(launch_id) == []
    assert not psutil.pid_exists(parent.pid) or psutil.Process(parent.pid).status() == psutil.STATUS_ZOMBIE
