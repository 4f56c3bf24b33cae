"""User-facing errors of both halves: one line, a fix, an exit code (from the contract); click prints them
without a traceback. EnlaceError is the one base: the driver's errors (orchestrator/errors.py) derive from
it. Light (click only): the driver imports it."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import click

from enlace import contract

# what a terminal acts on rather than shows (ESC, BEL, backspace, CSI...): a message may carry a server's text
# (a log tail, its stderr), which must not retitle, recolour or write the clipboard of the user's terminal
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` as a terminal should print it: tabs, newlines and carriage returns kept, other controls written
    out (`\\x1b`)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def for_stream(text: str, stream) -> str:
    """`text` as written to `stream`: a terminal gets its controls written out (shown: a sample's ESC bytes moved the
    cursor and recoloured the terminal), a pipe or a file the text as it is."""
    return shown(text) if stream.isatty() else text


class EnlaceError(click.ClickException):
    """An error the user can fix; `str()` is the whole message."""

    exit_code = contract.FAILED
    kind = contract.ErrorKind.OTHER  # what the driver acts on (the error document's `kind`)

    def format_message(self) -> str:
        return shown(self.message)


class AlreadyRunning(EnlaceError):
    """The run is alive (or another launch of it is in progress): both halves raise this one class."""

    exit_code = contract.ALREADY_RUNNING
    kind = contract.ErrorKind.ALREADY_RUNNING


class BadOut(EnlaceError):
    """--out names a place a verb will not write (it exists, it is a link, another run of the verb holds it): a
    usage error, as the driver's."""

    exit_code = contract.USAGE


class ConfigError(EnlaceError):
    """A config file, key or value is wrong. Message names the file, the key and the fix."""

    exit_code = contract.USAGE
    kind = contract.ErrorKind.CONFIG

    def __init__(self, source: str, key: str, problem: str, fix: str = ""):
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        where = f"{source}: {key}" if key else source
        text = f"{where}: {problem}"
        if fix:
            text += f" — {fix}"
        super().__init__(text)


class CheckpointError(EnlaceError):
    """A checkpoint is incomplete, corrupt or belongs to a different run."""

    exit_code = contract.USAGE
    kind = contract.ErrorKind.CHECKPOINT


class OutOfMemory(EnlaceError):
    """The device ran out of memory in training: a verdict, like preflight's (a restart fails the same way)."""

    exit_code = contract.OOM


class NoSpaceError(EnlaceError):
    """Not enough free disk for the run's checkpoints (checked before training, and on ENOSPC)."""

    exit_code = contract.NO_SPACE
    kind = contract.ErrorKind.NO_SPACE


# what a path that cannot be made or written says (--out /proc/x, --runs-dir on a read-only disk)
PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST}


PATH_OPTIONS = ("--dest", "--out", "--runs-dir", "--root")  # the options, on either command line, that name a path


def given_paths(argv: list[str]) -> list[str]:
    """The paths argv's path options name (`--out X`, `--out=X`), up to a `--` (a command's own words follow)."""
    paths = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name in PATH_OPTIONS:
            paths.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
    return paths


def path_given(e: OSError, argv: list[str]) -> BadOut | None:
    """`e` as one line (exit 2) when it is about a path a path option of the command line gave, or one inside or
    above it (what the user can fix by naming another); None for any other (a compiler's cache under a trainer, a
    full disk, a missing program, enlace's own files, a path among a command's arguments): a trainer's exit 2 is a
    config error its supervisor never retries."""
    if e.filename is None or e.errno not in PATH_ERRNOS:
        return None
    failed = Path(os.fsdecode(e.filename)).absolute()
    if Path.cwd().is_relative_to(failed):  # the working directory or above it: no path the user named
        return None
    for value in given_paths(argv):
        given = Path(value).absolute() if value else None
        if given and (failed.is_relative_to(given) or given.is_relative_to(failed)):
            return BadOut(f"{failed}: {e.strerror} — name a path this machine lets you create and write")
    return None
