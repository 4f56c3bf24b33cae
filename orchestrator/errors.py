"""enlace-remote's user-facing errors and exit codes (listed in `enlace-remote --help`)."""

from __future__ import annotations

import click

EXIT_FAILED = 1  # a remote command or the run failed
EXIT_USAGE = 2  # bad usage, host or config
EXIT_VERIFY = 3  # verification failed (dirty tree, ignored files, missing paths on the server)
EXIT_UNREACHABLE = 4  # host unreachable, authentication failed, unknown or changed host key
EXIT_OOM = 5  # preflight verdict: out of memory
EXIT_UNSTABLE = 6  # preflight verdict: fp16 unstable

EXIT_CODES_HELP = """\b
Exit codes:
  0  ok
  1  a remote command or the run failed (logs -f: the run's own exit code)
  2  bad usage, host or run config
  3  verification failed: dirty tree, git-ignored files, something missing on the server
  4  host unreachable, authentication failed, unknown or changed host key
  5  preflight: the batch does not fit (oom)
  6  preflight: fp16 unstable"""


class RemoteError(click.ClickException):
    exit_code = EXIT_FAILED

    def format_message(self) -> str:
        return self.message


class UsageError(RemoteError):
    exit_code = EXIT_USAGE


class VerifyError(RemoteError):
    exit_code = EXIT_VERIFY


class UnreachableError(RemoteError):
    exit_code = EXIT_UNREACHABLE


class CommandFailed(RemoteError):
    """A remote command exited non-zero: carries the command, its exit code and output tail."""

    def __init__(self, host: str, command: str, exit_code: int, output: str):
        self.command, self.remote_exit, self.output = command, exit_code, output
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(f"on {host}: `{command}` exited {exit_code}" + (f"\n{tail}" if tail else ""))
