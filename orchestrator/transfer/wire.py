"""What fetch and data push share on their one-channel conversations with the server: reading lines and
exact byte counts from a duplex, a conversation retried (resuming) after a dropped connection while
Ctrl-C stays ours, progress on stderr (bytes, rate, ETA), and one file's frame written and hashed as it arrives."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import click

from enlace.contract import FRAME
from enlace.errors import EnlaceError, shown
from enlace.hashing import write_all
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


def receive(reader: Reader, local: str, offset: int, hasher, bar):
    """One file's frame into `local` (appended at `offset`, or anew when the server starts it from 0), hashed
    as it arrives. Returns the file's sha256 object and the bytes received."""
    start, count = FRAME.unpack(reader.exactly(FRAME.size))
    if start != offset:  # the server's file is not what we hold the start of: take it whole
        hasher = hashlib.sha256()
    bar.skip(start)
    if count == 0 and start == offset > 0:  # held whole already (a copy fetched before, linked): left untouched
        return hasher, 0
    left = count
    if start == 0 and offset:  # started anew: a new file, never this one truncated (it may be a link to the copy
        with contextlib.suppress(FileNotFoundError):  # fetched before; ext4 writes a file truncated to 0 back to disk
            os.unlink(local)  # when it is closed, auto_da_alloc, and the fetch's last rmdir would wait for that)
    fd = os.open(local, os.O_WRONLY | os.O_CREAT | (0 if start else os.O_TRUNC) | getattr(os, "O_BINARY", 0), 0o666)
    try:
        st = os.fstat(fd) if start else None
        if st is not None and st.st_nlink > 1:  # a link to the copy fetched before (grown on the server since):
            fd = _own_copy(fd, local, start)  # never written through, so that copy stays until this one is verified
        elif st is not None and st.st_size > start:  # more than the server's true start: dropped
            os.ftruncate(fd, start)
        os.lseek(fd, start, os.SEEK_SET)
        while left:
            chunk = memoryview(reader.some(left))  # what has arrived, up to the frame's end
            hasher.update(chunk)
            bar.update(len(chunk))
            left -= len(chunk)
            write_all(fd, chunk)
    finally:
        os.close(fd)
    return hasher, count


def _own_copy(fd: int, local: str, start: int) -> int:
    """The first `start` bytes of a staged file linked to another name, as a file of their own in its place, open
    for writing; `fd` (the linked one) is closed. Shorter than `start` (changed here meanwhile), the sha256 check
    after the transfer refuses it."""
    os.close(fd)
    tmp = local + ".own"
    shutil.copyfile(local, tmp)
    own = os.open(tmp, os.O_WRONLY | getattr(os, "O_BINARY", 0))
    if os.fstat(own).st_size > start:
        os.ftruncate(own, start)
    os.replace(tmp, local)
    return own
