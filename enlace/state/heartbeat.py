"""Heartbeats: a file in the run directory whose mtime a process touches while it works, so that a watcher
tells silence from slow work. The trainer beats on every step, every eval batch and around each checkpoint
(the supervisor's stall clock measures silence, not the absence of new steps); the supervisor beats while
it watches (status tells a supervisor that is gone or frozen). A touch is one utime call, at most once a
`every` seconds. Stdlib only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TRAINER = ".trainer.beat"
SUPERVISOR = ".supervisor.beat"


class Heartbeat:
    """Calling it touches `path` (creating it), at most once per `every` seconds; `force` touches now."""

    def __init__(self, path: Path, every: float = 1.0):
        self.path, self.every, self._last = path, every, 0.0

    def __call__(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        try:
            os.utime(self.path)
        except FileNotFoundError:
            self.path.touch()
        except OSError:  # a full or read-only disk: the beat is advisory, the work goes on
            pass


def last(path: Path) -> float | None:
    """When `path` was last touched (seconds since the epoch), None if it never was."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None
