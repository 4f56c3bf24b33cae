"""enlace-remote's user-facing errors. Their exit codes come from the one table, enlace/exitcodes.py."""

from __future__ import annotations

import click

from enlace import exitcodes

EXIT_CODES_HELP = exitcodes.help_text()


class RemoteError(click.ClickException):
    exit_code = exitcodes.FAILED

    def format_message(self) -> str:
        return self.message


class UsageError(RemoteError):
    exit_code = exitcodes.USAGE


class VerifyError(RemoteError):
    exit_code = exitcodes.VERIFY


class UnreachableError(RemoteError):
    exit_code = exitcodes.UNREACHABLE


class Transient(UnreachableError):
    """A fault worth retrying: a refused or timed-out connect, a handshake or auth timeout, a killed session.
    `started`: the command may have begun on the server (then only idempotent commands are retried)."""

    def __init__(self, message: str, started: bool = False):
        super().__init__(message)
        self.started = started


class AlreadyRunning(RemoteError):
    exit_code = exitcodes.ALREADY_RUNNING


class NoSpace(RemoteError):
    exit_code = exitcodes.NO_SPACE


def for_exit_code(code: int, message: str) -> RemoteError:
    """The error for a server answer {"ok": false, "error": message, "exit_code": code}: same code here."""
    by_code = {c.exit_code: c for c in (UsageError, VerifyError, AlreadyRunning, NoSpace)}
    err = by_code.get(code, RemoteError)(message)
    if err.__class__ is RemoteError and code in exitcodes.TABLE and code != exitcodes.OK:
        err.exit_code = code
    return err


class CommandFailed(RemoteError):
    """A remote command exited non-zero: carries the command, its exit code and output tail."""

    def __init__(self, host: str, command: str, exit_code: int, output: str):
        self.command, self.remote_exit, self.output = command, exit_code, output
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(f"on {host}: `{command}` exited {exit_code}" + (f"\n{tail}" if tail else ""))
