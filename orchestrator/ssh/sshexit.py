"""The system ssh client's exit code 255 means two things: ssh's own failure (a refused key, a dropped
connection) and a remote command that itself exited 255. Every command we give the system ssh runs through
`sh -c`, which says so as its last line on stderr when the command's own code is 255; then the code is the
command's. A command killed by a signal (the OOM killer) is passed on as one: the `sh` ends by the same
signal, so ssh reports it as before (255, a session that ended without a status: Transient), as paramiko's
path does. `sh` cannot tell a command's own exit 129-159 from a signal's: those read as the signal (the
server's commands exit 0-10: enlace/contract.py)."""

from __future__ import annotations

import shlex

OWN_255 = "enlace: the remote command itself exited 255"
_SCRIPT = (
    f'"$@"; c=$?; if [ "$c" -eq 255 ]; then echo {shlex.quote(OWN_255)} >&2; '
    'elif [ "$c" -gt 128 ] && [ "$c" -lt 160 ]; then kill -$((c - 128)) $$; fi; exit "$c"'
)


def remote_command(argv: list[str]) -> str:
    """argv as the command string ssh hands the remote login shell (each element quoted)."""
    return shlex.join(["sh", "-c", _SCRIPT, "sh", *argv])


def ssh_failed(code: int, stderr: str) -> bool:
    """Whether ssh itself failed: it exited 255 and the command did not end its stderr saying the 255 was its own."""
    return code == 255 and not stderr.rstrip().endswith(OWN_255)
