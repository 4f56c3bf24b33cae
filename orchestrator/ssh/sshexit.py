"""The system ssh client's exit code 255 means two things: ssh's own failure (a refused key, a dropped
connection) and a remote command that itself exited 255. Every command we give the system ssh runs through
`sh -c`, which says so on stderr when the command's own code is 255; then the code is the command's."""

from __future__ import annotations

import shlex

OWN_255 = "enlace: the remote command itself exited 255"
_SCRIPT = f'"$@"; c=$?; [ "$c" -ne 255 ] || echo {shlex.quote(OWN_255)} >&2; exit "$c"'


def remote_command(argv: list[str]) -> str:
    """argv as the command string ssh hands the remote login shell (each element quoted)."""
    return shlex.join(["sh", "-c", _SCRIPT, "sh", *argv])


def ssh_failed(code: int, stderr: str) -> bool:
    """Whether ssh itself failed: it exited 255 and the command did not say the 255 was its own."""
    return code == 255 and OWN_255 not in stderr
