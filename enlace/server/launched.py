"""The processes of one launch of a run, wherever they went. Every process a launch starts carries the launch's
id in its environment (contract.LAUNCH_ID_ENV: the supervisor, torchrun, each rank, a command and what it starts),
while their process groups and parents are lost on the way: torchrun starts each rank in a session of its own,
and a killed parent's children go to init. So a launch's leftovers are found by that id (psutil reads the
environments of the user's own processes, on Linux and macOS), never by group or parent alone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil

from enlace.contract import LAUNCH_ID_ENV


def processes_of(launch_id: str | None) -> list[psutil.Process]:
    """The live processes of launch `launch_id` but this one and its ancestors (a Slurm batch step's script, a
    supervisor's own `enlace start`, carry the id too)."""
    if not launch_id:
        return []
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    uid, found = os.getuid(), []
    for proc in psutil.process_iter(["uids", "status"]):
        if proc.pid in mine or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue  # (another user's processes: their environments are not ours to read)
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(LAUNCH_ID_ENV) == launch_id:
                found.append(proc)
    return found


def send(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def wait(procs: list[psutil.Process], timeout: float, beat: Callable[[], None] = lambda: None) -> list[psutil.Process]:
    """Wait up to `timeout` s for `procs` to end, beating meanwhile (a supervisor that waits is not frozen); those
    still running."""
    deadline = time.monotonic() + timeout
    while True:
        beat()
        _, procs = psutil.wait_procs(procs, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        if not procs or time.monotonic() >= deadline:
            return procs


def kill_launch(launch_id: str | None, *alive: int) -> None:
    """SIGKILL to the process groups of the `alive` pids (the supervisor leads one: setsid; a command leads its
    own, where what emptied its environment still is), then to every process of the launch."""
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    send(processes_of(launch_id), signal.SIGKILL)
