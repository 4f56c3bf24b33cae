"""The one table of exit codes, shared by `enlace`, scripts/remote.sh and `enlace-remote`.

No value has two meanings. remote.sh spells the ones it uses as EXIT_* variables that a test
checks against this table; README lists it. Pure Python: the driver imports it without torch.
"""

from __future__ import annotations

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
