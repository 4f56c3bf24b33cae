"""The processes of one launch of a run, wherever they went. Every process a launch starts carries the launch's
id in its environment (contract.LAUNCH_ID_ENV: the supervisor, torchrun, each rank, a command and what it starts),
while their process groups and parents are lost on the way: torchrun starts each rank in a session of its own,
and a killed parent's children go to init. So a launch's processes are found by that id (psutil reads the
environments of the user's own processes, on Linux and macOS), with whatever those processes started (a process
that rewrites its environment's memory, as setproctitle does, is found while its parent is); never by group or
parent alone. What is started while they are being ended is found by the next look (kill_all)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil

from enlace.contract import LAUNCH_ID_ENV

KILL_WAIT_S = 60.0  # kill_all's longest wait for the launch's processes to be gone


def processes_of(launch_id: str | None) -> list[psutil.Process]:
    """The live processes of launch `launch_id`, and what they started, but this one and its ancestors (a Slurm
    batch step's script, a supervisor's own `enlace start`, carry the id too)."""
    if not launch_id:
        return []
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    uid, found, children = os.getuid(), {}, {}
    for proc in psutil.process_iter(["ppid", "uids", "status"]):
        if proc.pid in mine or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        children.setdefault(proc.info["ppid"], []).append(proc)
        if proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue  # (another user's processes: their environments are not ours to read)
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(LAUNCH_ID_ENV) == launch_id:
                found[proc.pid] = proc
    todo = list(found.values())
    while todo:  # what they started (found or not by its own environment)
        for child in children.get(todo.pop().pid, ()):
            if child.pid not in found:
                found[child.pid] = child
                todo.append(child)
    return list(found.values())


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


def kill_all(launch_id: str | None, beat: Callable[[], None] = lambda: None, timeout: float = KILL_WAIT_S) -> list:
    """SIGKILL to every process of the launch, and again to what they started meanwhile, each waited for until
    gone (a restart's ranks then find the GPU's memory free), until none is left or `timeout` s have passed; the
    pids killed."""
    deadline, killed = time.monotonic() + timeout, []
    while (left := processes_of(launch_id)) and time.monotonic() < deadline:
        send(left, signal.SIGKILL)
        killed += [p.pid for p in left if p.pid not in killed]
        wait(left, max(0.0, deadline - time.monotonic()), beat)
    return killed


def kill_launch(launch_id: str | None, *alive: int) -> None:
    """SIGKILL to the process groups of the `alive` pids (the supervisor leads one: setsid; a command leads its
    own, where what emptied its environment still is), then to every process of the launch, until none is left."""
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    kill_all(launch_id)
