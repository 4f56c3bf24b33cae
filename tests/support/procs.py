"""Processes a test started: find a run's live trainers, kill what a failed test left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path


def trainers_under(path, run: str = "", past_cpu_s: float = 0.0):
    """Live trainer processes of `run` (of every run: "") whose working directory is under `path` (this test's
    host); not their supervisor, whose command line ends with the trainer's. `past_cpu_s`: only those that have
    used that much CPU (past importing torch, about 1.5 s: training)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status", "cwd", "cpu_times"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        used = proc.info["cpu_times"]
        if (
            f"enlace train {run}" in cmd
            and " supervise " not in cmd
            and proc.info["status"] != psutil.STATUS_ZOMBIE
            and (proc.info["cwd"] or "").startswith(str(path))
            and (used is not None and used.user + used.system >= past_cpu_s)
        ):
            found.append(proc.pid)
    return found


def kill_processes_under(path: Path) -> None:
    """Detached trainers a failed test left behind (their cwd is a tree under `path`)."""
    import psutil

    for proc in psutil.process_iter(["cwd"]):
        if (proc.info["cwd"] or "").startswith(str(path)) and proc.pid != os.getpid():
            with contextlib.suppress(psutil.Error):
                proc.kill()


class Throttle:
    """Lets a process run `on_s` of every `period_s` and holds it stopped (SIGSTOP) in between, until the
    `with` block ends. For a trainer whose only part in a test is to keep its log growing, or to be running
    while a queue is tested: it spends a tenth of a core instead of a whole one, which the rest of the suite
    gets. A pause cannot change what a run writes (the Slurm tests pause trainers too, to wait for Slurm's
    signals). `target`: a pid, or a function naming the pids each period (trainers that come and go)."""

    def __init__(self, target: int | Callable[[], list[int]], on_s: float = 0.05, period_s: float = 0.5):
        self.pids = target if callable(target) else lambda: [target]
        self.on_s, self.off_s = on_s, period_s - on_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)
        self._held: list[int] = []

    def _signal(self, pids: list[int], sig: int, reached: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # gone (its pid maybe another's now)
                os.kill(pid, sig)
                reached.append(pid)

    def _cycle(self) -> None:
        while not self._done.wait(self.on_s):
            self._signal(self.pids(), signal.SIGSTOP, self._held)  # each one recorded as it is stopped
            self._done.wait(self.off_s)
            held, self._held = self._held, []
            self._signal(held, signal.SIGCONT, [])

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self._signal(self._held, signal.SIGCONT, [])


def install_driver(venv: Path, source: Path, python: str) -> Path:
    """A venv made by `python` with `pip install -c constraints.txt SOURCE` (no extras): the driver alone,
    as a laptop installs it. Returns the venv's bin/ (enlace-remote, python)."""
    import subprocess

    from . import REPO

    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    out = subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), str(source)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"pip install of the driver failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return venv / "bin"
