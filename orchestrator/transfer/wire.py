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

from enlace.errors import EnlaceError
from orchestrator.errors import Transient
from orchestrator.ssh.transport import backoff

T = TypeVar("T")
RETRY_S = 90.0  # keep reconnecting a dropped conversation for this long


class Interrupted(EnlaceError):
    exit_code = 130


def retrying(what: str, kept: str, once: Callable[[Callable[[], None]], T]) -> T:
    """`once(tick)` — one conversation, which calls tick() between reads — again after a dropped connection
    (each try resumes where the last stopped) for up to RETRY_S. The first Ctrl-C ends it at the next tick
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
    deadline, attempt = time.monotonic() + RETRY_S, 0
    try:
        while True:
            try:
                return once(tick)
            except Transient as e:
                if time.monotonic() > deadline:
                    raise
                delay = backoff(attempt)
                attempt += 1
                click.echo(f"{what}: {e.message}; resuming in {delay:g}s", err=True)
                time.sleep(delay)
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
            raise EnlaceError(f"{self.what}: the server side ended in mid-transfer")
        self.buf.extend(chunk)

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.wire.read(1 << 16)
            if not chunk:
                line, self.buf = bytes(self.buf), bytearray()
                return line
            self.buf.extend(chunk)
        i = self.buf.index(b"\n") + 1
        line, self.buf = bytes(self.buf[:i]), self.buf[i:]
        return line

    def some(self, n: int) -> bytes:
        """Between 1 and n bytes."""
        if not self.buf:
            chunk = self.wire.read(n)
            if not chunk:
                raise EnlaceError(f"{self.what}: the server side ended in mid-transfer")
            return chunk
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Bytes done of `total`, the rate and the ETA on stderr: one line redrawn on a terminal (5 times a
    second at most), a line every `every_s` elsewhere (a log keeps the story of a long transfer), nothing
    for transfers that end within it."""

    def __init__(self, label: str, total: int, every_s: float = 10.0, tty: bool | None = None):
        self.label, self.total, self.done, self.skipped = label, total, 0, 0
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.every_s = 0.2 if self.tty else every_s
        self.t0 = self.last = time.monotonic()
        self.shown = False

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-6)
        rate = (self.done - self.skipped) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return f"{self.label}: {human_bytes(self.done)} / {human_bytes(self.total)}  {human_bytes(rate)}/s  ETA {eta_s}"

    def skip(self, n: int) -> None:
        """n bytes that were already there (a resumed file): done, but not part of the rate."""
        self.done += n
        self.skipped += n

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last, self.shown = now, True
            click.echo(("\r" + self.line()) if self.tty else self.line(), err=True, nl=not self.tty)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.shown and self.tty:
            click.echo("\r" + self.line(), err=True)
