"""Processes a test started: find a run's live trainers, kill what a failed test left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def trainers_under(path, run):
    """Live trainer processes of `run` whose working directory is under `path` (this test's host)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            if (
                f"enlace train {run}".encode() in cmd
                and state != "Z"
                and os.readlink(f"/proc/{pid}/cwd").startswith(str(path))
            ):
                found.append(int(pid))
        except OSError:
            continue
    return found


def kill_processes_under(path: Path) -> None:
    """Detached trainers a failed test left behind (their cwd is a tree under `path`)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(path)) and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
