"""`logs RUN [-f]`: stream train.log from a byte offset; survive dropped connections.

The driver counts the bytes it has written out; after a drop, a stall past the read timeout, or a
failed reconnect (sshd restarting, a lossy network), it reconnects with backoff and asks the server
for the log from exactly that offset — no line lost, none repeated (orchestrator/ssh/retry.py's policy, with
a longer window: it gives up only after GIVE_UP_S seconds without a connection that brought a byte). The server sends a newline on stderr
when the log is quiet, so a long eval is not mistaken for a dead connection.
"""

from __future__ import annotations

import sys

import click

from enlace import contract
from enlace.config.command import run_file
from enlace.contract import ended_message
from enlace.errors import EnlaceError, shown
from orchestrator.errors import Transient, on_host
from orchestrator.ssh.retry import retrying
from orchestrator.ssh.session import Session

GIVE_UP_S = 600.0  # a run outlives a long network outage: `logs -f` waits this long for a working connection


def follow_log(session: Session, run_name: str, offset: int, follow: bool, stall_timeout: float = 60) -> int:
    """Print the log from `offset`; returns the run's exit code with `follow`, else 0."""
    out = sys.stdout.buffer
    written, began = 0, offset

    def once() -> int:
        nonlocal offset, written
        argv = session.enlace_argv(
            "latest", "logs", run_name, "--offset", str(offset), *(["--follow"] if follow else []), tied=True
        )
        written = 0

        def on_data(chunk: bytes) -> None:
            nonlocal written
            out.write(chunk)
            out.flush()
            written += len(chunk)

        try:
            return session.transport.stream(argv, on_data, _notices, stall_timeout)
        finally:
            offset += written

    def say(e: Transient, delay: float) -> None:
        click.echo(shown(f"\n[enlace-remote: {e.message}; reconnecting in {delay:g}s from byte {offset}]"), err=True)

    try:
        code = retrying(once, say, GIVE_UP_S, progressed=lambda: written > 0)
    except KeyboardInterrupt:  # Ctrl-C ends the following, never the run (click said only "Aborted!")
        there = f"enlace-remote --host {session.host.name}"
        click.echo(
            f"\nstopped following {run_name}; the run goes on — `{there} logs {run_name} -f` follows it again, "
            f"`{there} stop {run_name}` stops it",
            err=True,
        )
        raise SystemExit(130) from None
    except Transient as e:
        raise EnlaceError(
            f"logs {run_name}: gave up after {GIVE_UP_S:g}s without a working connection ({e.message}); the run "
            f"itself is unaffected — rerun `enlace-remote --host {session.host.name} logs {run_name} -f`"
        ) from None
    if follow and code not in (contract.OK, contract.USAGE):
        row = session.enlace_json("latest", "runs", run_name)[0]
        from_file = run_file(run_name, session.repo).is_file()  # (or given after `--`)
        click.echo(shown(f"enlace-remote: {on_host(ended_message(row, from_file), session.host.name)}"), err=True)
    elif offset == began:  # nothing to show (a Slurm job cancelled while pending): where the run stands, said
        row = session.enlace_json("latest", "runs", run_name)[0]
        said = row.get("phase") and row["status"] in ("stopped", "queued", "pending", "dropped")  # (others: stale)
        phase = f" ({row['phase']})" if said else ""
        click.echo(
            shown(f"[enlace-remote: nothing new in {run_name}'s train.log; it is {row['status']}{phase}]"), err=True
        )
    return code


def _notices(chunk: bytes) -> None:
    """The server's stderr: blank lines are heartbeats; anything else (a pending Slurm job) is shown."""
    for line in chunk.decode(errors="replace").splitlines():
        if line.strip():
            click.echo(shown(f"[{line.strip()}]"), err=True)


def tail_start(session: Session, run_name: str, lines: int) -> int:
    return session.enlace_json("latest", "logs", run_name, "--tail-offset", str(lines))["offset"]
