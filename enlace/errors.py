"""User-facing errors: one line, a fix, an exit code; click prints them without a traceback."""

from __future__ import annotations

import click

# Exit codes shared by every `enlace` verb (documented in `enlace --help`).
EXIT_OK = 0
EXIT_FAILED = 1  # the run itself failed (e.g. verify-resume found a difference)
EXIT_CONFIG = 2  # bad usage or bad config
EXIT_OOM = 3  # preflight: the batch does not fit
EXIT_UNSTABLE = 4  # preflight: fp16 keeps skipping steps


class EnlaceError(click.ClickException):
    """An error the user can fix; `str()` is the whole message."""

    exit_code = EXIT_FAILED

    def format_message(self) -> str:
        return self.message


class ConfigError(EnlaceError):
    """A config file, key or value is wrong. Message names the file, the key and the fix."""

    exit_code = EXIT_CONFIG

    def __init__(self, source: str, key: str, problem: str, fix: str = ""):
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        where = f"{source}: {key}" if key else source
        text = f"{where}: {problem}"
        if fix:
            text += f" — {fix}"
        super().__init__(text)


class CheckpointError(EnlaceError):
    """A checkpoint is incomplete, corrupt or belongs to a different run."""

    exit_code = EXIT_CONFIG
