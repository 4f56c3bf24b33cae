"""What fetch and data push share on their one-channel conversations with the server: reading lines and
exact byte counts from a duplex, a conversation retried (resuming) after a dropped connection while
Ctrl-C stays ours, and progress on stderr (bytes, rate, ETA)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import click

from enlace.errors import EnlaceError, shown
from orchestrator.errors import Transient
from orchestrator.ssh import retry

T = TypeVar("T")


class Interrupted(EnlaceError):
    exit_code = 130


class ServerEnded(EnlaceError):
    """The server side's stream ended before what it announced (it exited: its stderr says why)."""


def retrying(what: str, kept: str, once: Callable[[Callable[[], None]], T]) -> T:
    """`once(tick)` — one conversation, which calls tick() between reads — again after a dropped connection
    (each try resumes where the last stopped), by the driver's one retry policy (orchestrator/ssh/retry.py). The first Ctrl-C ends it at the next tick
    with Interrupted (exit 130, saying `kept`); a second one at once."""
    interrupted = threading.Event()

    def on_sigint(signum, frame):
        if interrupted.is_set():
            os._exit(130)
        interrupted.set()

    def tick() -> None:
        if interrupted.is_set():
            raise Interrupted(f"{what} interrupted: {kept}; rerun {what} to resume")

    main = threading.current_thread() is threading.main_thread()  # several hosts: Python's own Ctrl-C
    old = signal.signal(signal.SIGINT, on_sigint) if main else None

    def say(e: Transient, delay: float) -> None:
        click.echo(shown(f"{what}: {e.message}; resuming in {delay:g}s"), err=True)

    try:
        return retry.retrying(lambda: once(tick), say)
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


class Reader:
    """Lines and exact byte counts from a duplex's stdout."""

    def __init__(self, wire, what: str = "fetch"):
        self.wire, self.what, self.buf = wire, what, bytearray()

    def _fill(self) -> None:
        chunk = self.wire.read(1 << 20)
        if not chunk:
            raise ServerEnded(f"{self.what}: the server side ended in mid-transfer")
        self.buf.extend(chunk)

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.wire.read(1 << 16)
            if not chunk:
                line, self.buf = bytes(self.buf), bytearray()
                return line
            self.buf.extend(chunk)
        i = self.buf.index(b"\n") + 1
        line = bytes(self.buf[:i])
        del self.buf[:i]
        return line

    def some(self, n: int) -> bytes:
        """Between 1 and n bytes."""
        if not self.buf:
            chunk = self.wire.read(n)
            if not chunk:
                raise ServerEnded(f"{self.what}: the server side ended in mid-transfer")
            return chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]  # in place: a new buffer of the rest for each small file cost a copy of up to 1 MiB
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Bytes done of `total`, the rate and the ETA on stderr, drawn by tqdm (the bar pip-era tools share): one
    line redrawn on a terminal; where stderr is a log, tqdm's same line every `every_s` (a log keeps the story
    of a long transfer, not a stream of carriage returns); nothing for transfers that end within it."""

    def __init__(self, label: str, total: int, every_s: float = 10.0, tty: bool | None = None):
        from tqdm import tqdm

        self.tty = sys.stderr.isatty() if tty is None else tty
        self.label, self.total, self.every_s = label, total, every_s
        self.bar = tqdm(
            total=total,
            desc=label,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            disable=not self.tty,
            mininterval=0.2,
            delay=every_s if not self.tty else 0.5,
            leave=True,
        )
        self.done, self.skipped = 0, 0
        self.t0 = self.last = time.monotonic()

    def line(self) -> str:
        """What tqdm shows, as one line (the log's form)."""
        from tqdm import tqdm

        elapsed = max(time.monotonic() - self.t0, 1e-6)
        rate = (self.done - self.skipped) / elapsed
        return tqdm.format_meter(
            self.done, self.total, elapsed, prefix=self.label, unit="B", unit_scale=True, unit_divisor=1024, rate=rate
        )

    def skip(self, n: int) -> None:
        """n bytes that were already there (a resumed file): done, but not part of the rate."""
        self.done += n
        self.skipped += n
        self.bar.n += n  # moved without an update: tqdm's rate counts only what travels
        self.bar.last_print_n = self.bar.n
        self.bar.refresh()

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        now = time.monotonic()
        if not self.tty and now - self.last >= self.every_s:
            self.last = now
            click.echo(self.line(), err=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
