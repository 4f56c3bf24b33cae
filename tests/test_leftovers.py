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

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
# a parent (torchrun) that starts a child (a rank) in a session of its own with `env` (None: its own), says the
# child's pid, then waits
PARENT = (
    "import ast, subprocess, sys, time\n"
    "rank = subprocess.Popen(ast.literal_eval(sys.argv[1]), env=ast.literal_eval(sys.argv[2]), start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def launch_id():
    """A launch id of this test's own; whatever carries it is ended at the end, whatever the test asserted."""
    ident = f"test-{time.time_ns()}-{os.getpid()}"
    yield ident
    launched.kill_all(ident, timeout=30)


def _start(launch_id: str, child_env: dict | None = None) -> tuple[subprocess.Popen, psutil.Process]:
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    argv = [sys.executable, "-c", PARENT, repr(SLEEPER), repr(child_env)]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, start_new_session=True)
    return parent, psutil.Process(int(parent.stdout.readline()))


def _reaped(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout and proc.stdout.close()


def test_a_launch_s_processes_are_found_by_its_id_once_their_parent_is_killed(launch_id):
    other = subprocess.Popen(SLEEPER)  # no id: never the launch's
    try:
        parent, rank = _start(launch_id)
        # the caller's own child is left out: its Popen reaps it (a psutil wait would take its exit code)
        assert launched.processes_of(launch_id) == [rank]
        _reaped(parent)
        assert launched.processes_of(launch_id) == [rank]  # re-parented, a session of its own: still found
        assert launched.processes_of(None) == [] and launched.processes_of("another-launch") == []
    finally:
        _reaped(other)


def test_what_a_launch_s_process_started_without_the_id_is_found_through_it(launch_id):
    """setproctitle overwrites the environment's memory; here the child is started without the id. Found while
    its parent, which has it, is not the caller's own child."""
    outer = [sys.executable, "-c", PARENT, repr([sys.executable, "-c", PARENT, repr(SLEEPER), "{}"]), "None"]
    starter = subprocess.Popen(outer, stdout=subprocess.DEVNULL, env={**os.environ, LAUNCH_ID_ENV: launch_id})
    wait_until(lambda: len(psutil.Process(starter.pid).children()) == 1, 30, "the process with the id")
    (middle,) = psutil.Process(starter.pid).children()  # has the id; its child has none
    wait_until(lambda: len(middle.children()) == 1, 30, "the child without the id")
    (bare,) = middle.children()
    assert LAUNCH_ID_ENV not in bare.environ()
    assert set(launched.processes_of(launch_id)) == {middle, bare}
    _reaped(starter)


def test_kill_launch_ends_the_group_and_every_process_of_the_launch(launch_id):
    parent, rank = _start(launch_id)
    launched.kill_launch(launch_id, parent.pid)
    assert parent.wait(timeout=30) == -signal.SIGKILL
    assert launched.wait([rank], 30) == []  # a SIGKILL to the group alone left it running


def test_kill_launch_ends_what_its_process_started_with_an_emptied_environment(launch_id):
    """A script of your own that starts a server in a session of its own with an emptied environment (no id), both
    deaf to SIGTERM: the group's SIGKILL sent the server to init, where nothing found it, and it outlived `stop
    --kill`. Here the parent is this process's own child, as the command is its supervisor's."""
    parent, rank = _start(launch_id, child_env={})
    assert LAUNCH_ID_ENV not in rank.environ() and launched.processes_of(launch_id) == [rank]  # through its parent
    launched.kill_launch(launch_id, parent.pid)
    assert parent.wait(timeout=30) == -signal.SIGKILL
    assert launched.wait([rank], 30) == []


def test_kill_all_ends_a_respawner_and_what_it_started(launch_id):
    """A process that restarts its child whenever it dies, ignoring SIGTERM: nothing of the launch is left."""
    respawner = (
        "import signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"while True:\n    subprocess.run({SLEEPER!r})\n"
    )
    argv = [sys.executable, "-c", PARENT, repr([sys.executable, "-c", respawner]), "None"]
    starter = subprocess.Popen(argv, stdout=subprocess.PIPE, env={**os.environ, LAUNCH_ID_ENV: launch_id})
    wait_until(lambda: len(launched.processes_of(launch_id)) == 2, 60, "the respawner's child")
    assert len(launched.kill_all(launch_id)) >= 2 and launched.processes_of(launch_id) == []
    _reaped(starter)


def test_the_supervisor_ends_what_a_killed_trainer_left_before_restarting_it(launch_id, tmp_path, monkeypatch):
    monkeypatch.setattr(trainerchild, "LEFT_GRACE_S", 0.5)
    said = []
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    argv = [sys.executable, "-c", PARENT, repr(SLEEPER), "None"]
    child = trainerchild.TrainerChild(argv, env, said.append, lambda: None, 0.1, tmp_path)
    proc = child.start(0, ())  # (this process stands for the supervisor: the trainer is its child)
    wait_until(lambda: len(launched.processes_of(launch_id)) == 1, 60, "the trainer's child to start")
    (rank,) = launched.processes_of(launch_id)
    proc.kill()
    proc.wait(timeout=30)
    child.reap()
    assert launched.wait([rank], 30) == []
    assert said == [f"the trainer ended, but processes it started did not (pid {rank.pid}): killed (SIGKILL)"]
    child.reap()  # nothing left: nothing said
    assert len(said) == 1
