"""Heartbeats: a small file in the run directory holding the time (this host's clock, written by the process
itself: no file system's idea of mtime, which on NFS is the server's) at which a process last showed it was
working, so that a watcher tells silence from slow work. The trainer beats on every step, every eval batch,
and all through a checkpoint save and a start's first step (compile) from a helper thread (`beating`); the
supervisor beats while it watches (status tells a supervisor that is gone or frozen). A beat is one small
write, at most once per `every` seconds. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

TRAINER = ".trainer.beat"
SUPERVISOR = ".supervisor.beat"


class Heartbeat:
    """Calling it records the time in `path`, at most once per `every` seconds; `force` records now."""

    def __init__(self, path: Path, every: float = 1.0):
        self.path, self.every, self._last = path, every, 0.0

    def __call__(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        try:  # replaced whole: a reader never sees half a number
            tmp.write_text(f"{time.time():.3f}\n")
            os.replace(tmp, self.path)
        except OSError:  # a full or read-only disk: the beat is advisory, the work goes on
            with contextlib.suppress(OSError):
                tmp.unlink()

    @contextlib.contextmanager
    def beating(self) -> Iterator[None]:
        """Beat from a helper thread for as long as the block runs (a long save, a first step's compile),
        which cannot beat by itself."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.every):
                self(force=True)

        thread = threading.Thread(target=beat, daemon=True, name="heartbeat")
        self(force=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self(force=True)


def last(path: Path) -> float | None:
    """When the process behind `path` last beat (seconds since the epoch, its own clock), None if never."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None
