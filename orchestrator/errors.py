"""enlace-remote's user-facing errors: subclasses of the one base, enlace.errors.EnlaceError, with exit
codes from the contract. A server's refusal becomes the error its document names (`from_doc`)."""

from __future__ import annotations

import os
import re
import shlex

from enlace import contract
from enlace.errors import AlreadyRunning, EnlaceError, NoSpaceError

EXIT_CODES_HELP = contract.help_text()
HOST_ENV = "ENLACE_REMOTE_HOST"  # the host a bare command reaches (`local` without it)
BARE_HINT = re.compile(r"\benlace-remote (?!--host )")


def on_host(text: str, host: str) -> str:
    """Words naming `enlace-remote VERB` for a command on `host`: with `--host HOST` where a bare command would
    reach another host (the server half cannot know the name the driver gave its host)."""
    if not host or host == (os.environ.get(HOST_ENV) or "local"):
        return text
    return BARE_HINT.sub(f"enlace-remote --host {host} ", text)


class UsageError(EnlaceError):
    exit_code = contract.USAGE


class VerifyError(EnlaceError):
    exit_code = contract.VERIFY


class UnreachableError(EnlaceError):
    exit_code = contract.UNREACHABLE


class FirstStartCrashed(EnlaceError):
    """launch: the run's first start crashed; its supervisor restarts it (the run lives on)."""

    exit_code = contract.CRASHED


class Transient(UnreachableError):
    """A fault worth retrying: a refused or timed-out connect, a handshake or auth timeout, a killed session.
    `started`: the command may have begun on the server (then only idempotent commands are retried)."""

    def __init__(self, message: str, started: bool = False):
        super().__init__(message)
        self.started = started


class NotLoggedIn(UnreachableError):
    """The host asks for more than a key (a one-time code, a password, Kerberos) and no login is open for it:
    verbs never prompt; `enlace-remote login HOST` does, once (orchestrator/ssh/openssh.py)."""

    def __init__(self, host: str, why: str):
        super().__init__(f"{host}: {why} — log in once with: enlace-remote login {host}")


class ServerRefused(EnlaceError):
    """A server verb's refusal ({"ok": false, ...}): its exit code and its kind, as the server said them."""

    def __init__(self, message: str, exit_code: int, kind: str):
        super().__init__(message)
        self.exit_code, self.kind = exit_code, kind


def from_doc(doc: dict, exited: int, where: str = "", host: str = "") -> EnlaceError:
    """The error for a server answer {"ok": false, "error", "exit_code", "kind"}: the same exit code here,
    the same class where one exists (AlreadyRunning, NoSpaceError, ...), and `.kind` for the driver to act on;
    the commands it names are for `host` (on_host)."""
    code = doc.get("exit_code", exited)
    code = code if isinstance(code, int) and code in contract.TABLE and code != contract.OK else contract.FAILED
    kind = str(doc.get("kind") or contract.ErrorKind.OTHER)
    said = on_host(doc["error"], host)
    text = f"{where}: {said}" if where else said
    by_code = {c.exit_code: c for c in (UsageError, VerifyError, AlreadyRunning, NoSpaceError)}
    err = by_code[code](text) if code in by_code else ServerRefused(text, code, kind)
    err.kind = kind
    return err


class CommandFailed(EnlaceError):
    """A remote command exited non-zero: carries the command, its exit code and output tail."""

    def __init__(self, host: str, command: str, exit_code: int, output: str):
        self.command, self.remote_exit, self.output = command, exit_code, output
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(f"on {host}: `{command}` exited {exit_code}" + (f"\n{tail}" if tail else ""))


def short(argv: list[str]) -> str:
    """The command for error messages, without the inlined remote.sh text."""
    return shlex.join(["<remote.sh>" if len(a) > 200 else a for a in argv])
