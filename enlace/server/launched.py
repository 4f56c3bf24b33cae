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
    """The live processes of launch `launch_id`, and what they started, but the caller, its ancestors (a
    supervisor's `enlace start` may share its environment) and its own children: a child is its Popen's to reap,
    and a psutil wait would take its exit code (Popen then reads 0). What its own children started is taken (a
    command's server, started with an emptied environment: once the command is killed it goes to init, where
    nothing finds it: take these before killing their parent)."""
    if not launch_id:
        return []
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    uid, found, children, own = os.getuid(), {}, {}, []
    for proc in psutil.process_iter(["ppid", "uids", "status"]):
        info = proc.info
        if proc.pid in mine or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if info["uids"] is None or info["uids"].real != uid:
            continue  # (another user's processes: neither its environment nor a signal is ours)
        children.setdefault(info["ppid"], []).append(proc)
        with contextlib.suppress(psutil.Error):
            if info["ppid"] == me.pid:
                own += [proc] if proc.environ().get(LAUNCH_ID_ENV) == launch_id else []
            elif proc.environ().get(LAUNCH_ID_ENV) == launch_id:
                found[proc.pid] = proc
    todo = [*found.values(), *own]
    while todo:  # what they started (found or not by its own environment)
        for child in children.get(todo.pop().pid, ()):
            if child.pid not in found:
                found[child.pid] = child
                todo.append(child)
    return list(found.values())


def roots(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` whose parent is not among them: what a stop's SIGTERM goes to (a rank, not its data
    loader's workers, whose death by signal the rank would take for a crash)."""
    pids = {p.pid for p in procs}
    return [p for p in procs if p.info.get("ppid") not in pids]


def pids(procs: list[psutil.Process]) -> str:
    return ", ".join(str(p.pid) for p in procs)


def send(procs: list[psutil.Process], signum: int) -> None:
    """`signum` to each (one already gone, or not ours, is passed by)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def wait(procs: list[psutil.Process], timeout: float, beat: Callable[[], None] = lambda: None) -> list[psutil.Process]:
    """Wait up to `timeout` s for `procs` to end, beating meanwhile (a supervisor that waits is not frozen); those
    still running (a zombie has ended: where no init reaps, it stays one)."""
    deadline = time.monotonic() + timeout
    while True:
        beat()
        _, procs = psutil.wait_procs(procs, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        procs = [p for p in procs if _running(p)]
        if not procs or time.monotonic() >= deadline:
            return procs


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all(launch_id: str | None, beat: Callable[[], None] = lambda: None, timeout: float = KILL_WAIT_S) -> list:
    """SIGKILL to every process of the launch, and again to what they started meanwhile, each waited for until
    gone (a restart's ranks then find the GPU's memory free), until none is left or `timeout` s have passed; the
    processes signalled."""
    deadline, signalled = time.monotonic() + timeout, {}
    while (left := processes_of(launch_id)) and time.monotonic() < deadline:
        send(left, signal.SIGKILL)
        signalled.update((p.pid, p) for p in left)
        wait(left, max(0.0, deadline - time.monotonic()), beat)
    return list(signalled.values())


def kill_launch(launch_id: str | None, *alive: int) -> None:
    """SIGKILL to the process groups of the `alive` pids (the supervisor leads one: setsid; a command leads its
    own, where what emptied its environment still is), then to every process of the launch, until none is left."""
    left = processes_of(launch_id)  # first: what a killed parent started without the id would go to init, unfound
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
    send(left, signal.SIGKILL)
    kill_all(launch_id)
