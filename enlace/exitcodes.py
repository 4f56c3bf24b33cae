"""The one table of exit codes, shared by `enlace`, scripts/remote.sh and `enlace-remote`.

No value has two meanings. remote.sh spells the ones it uses as EXIT_* variables that a test
checks against this table; README lists it. Pure Python: the driver imports it without torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

OK = 0
FAILED = 1  # the run or a remote command failed (verify-resume: states differ)
USAGE = 2  # bad usage, config, checkpoint, host or run name: one line says what, where and the fix
VERIFY = 3  # verification failed: dirty tree, git-ignored files, something missing on the server
UNREACHABLE = 4  # host unreachable, authentication rejected, unknown or changed host key
OOM = 5  # preflight: the batch does not fit
UNSTABLE = 6  # preflight: fp16 keeps skipping steps
ALREADY_RUNNING = 7  # launch: the run is already running (or another launch of it is in progress)
CRASHED = 8  # the run's process vanished without a final status (SIGKILL, OOM killer, reboot)
NO_SPACE = 9  # not enough free disk for the run's checkpoints

TABLE = {
    OK: "ok (preflight: ok or tight)",
    FAILED: "the run or a remote command failed",
    USAGE: "bad usage, config, checkpoint, host or run name",
    VERIFY: "verification failed: dirty tree, git-ignored files, something missing on the server",
    UNREACHABLE: "host unreachable, authentication rejected, unknown or changed host key",
    OOM: "preflight: the batch does not fit (oom)",
    UNSTABLE: "preflight: fp16 unstable",
    ALREADY_RUNNING: "launch: the run is already running",
    CRASHED: "the run crashed: its process vanished without a final status",
    NO_SPACE: "not enough free disk space for the run's checkpoints",
}

VERDICT = {"oom": OOM, "unstable": UNSTABLE, "no_space": NO_SPACE}  # preflight verdict → exit code (ok, tight: 0)


def help_text() -> str:
    """The table for `--help` epilogs (click's \\b keeps the lines as they are)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code}  {what}" for code, what in TABLE.items())


def leave(code: object) -> NoReturn:
    """Exit with `code` (as sys.exit takes it); without torch loaded, at once: stdout and stderr flushed,
    the interpreter's teardown (clearing every module, atexit hooks) skipped. That teardown took 7-30 ms
    after the work was done in each driver command and in each server verb the driver waits on. Callers
    have closed what they opened by then; torch registers atexit hooks that must run (compile workers,
    distributed), so a process that loaded it exits the normal way."""
    if "torch" in sys.modules:
        sys.exit(code)
    if code is not None and not isinstance(code, int):  # sys.exit("text"): Python prints it, exits 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) or a closed stream
            stream.flush()
    os._exit(code or 0)
