"""`logs RUN [-f]`: stream train.log from a byte offset; survive dropped connections.

The driver counts the bytes it has written out; after a drop (or a stall past the read
timeout) it reconnects with backoff and asks the server for the log from exactly that offset —
no line lost, none repeated.
"""

from __future__ import annotations

import sys
import time

import click

from orchestrator.errors import RemoteError
from orchestrator.session import Session

BACKOFF_S = (0.2, 0.5, 1, 2, 5, 10)


def follow_log(session: Session, run_name: str, offset: int, follow: bool, stall_timeout: float = 60,
               max_failures: int = 20, out=None) -> int:  # fmt: skip
    """Print the log from `offset`; returns the run's exit code with `follow`, else 0."""
    out = out or sys.stdout.buffer
    failures = 0
    while True:
        argv = session.argv("enlace", "latest", session.host.python, "logs", run_name, "--offset", str(offset),
                            *(["--follow"] if follow else []))  # fmt: skip
        written = 0

        def on_data(chunk: bytes) -> None:
            nonlocal written
            out.write(chunk)
            out.flush()
            written += len(chunk)

        try:
            code = session.transport.stream(argv, on_data, stall_timeout)
        except ConnectionError as e:
            offset += written
            failures = 0 if written else failures + 1
            if failures >= max_failures:
                raise RemoteError(f"logs {run_name}: gave up after {failures} failed reconnects ({e})") from None
            delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
            click.echo(f"\n[enlace-remote: connection lost ({e}); reconnecting in {delay}s from byte {offset}]",
                       err=True)  # fmt: skip
            time.sleep(delay)
            continue
        return code


def tail_start(session: Session, run_name: str, lines: int) -> int:
    return session.enlace_json("latest", "logs", run_name, "--tail-offset", str(lines))["offset"]
