"""User-facing errors: one line, a fix, an exit code; click prints them without a traceback."""

from __future__ import annotations

import click

from enlace import exitcodes


class EnlaceError(click.ClickException):
    """An error the user can fix; `str()` is the whole message."""

    exit_code = exitcodes.FAILED

    def format_message(self) -> str:
        return self.message


class ConfigError(EnlaceError):
    """A config file, key or value is wrong. Message names the file, the key and the fix."""

    exit_code = exitcodes.USAGE

    def __init__(self, source: str, key: str, problem: str, fix: str = ""):
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        where = f"{source}: {key}" if key else source
        text = f"{where}: {problem}"
        if fix:
            text += f" — {fix}"
        super().__init__(text)


class CheckpointError(EnlaceError):
    """A checkpoint is incomplete, corrupt or belongs to a different run."""

    exit_code = exitcodes.USAGE


class NoSpaceError(EnlaceError):
    """Not enough free disk for the run's checkpoints (checked before training, and on ENOSPC)."""

    exit_code = exitcodes.NO_SPACE
