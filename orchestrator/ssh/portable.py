"""The driver's only operating-system-specific calls, each guarded where it is defined, each with the
portable fallback said beside it. The driver runs on Linux and macOS laptops as a normal user.

- Parent-death signal (Linux prctl PR_SET_PDEATHSIG): a helper (git, ssh, rsync) is SIGTERMed by the
  kernel when enlace-remote dies, even by SIGKILL. Fallback (macOS has no such signal): none is set; the
  driver ends its helpers itself on every exit it lives through, and an ssh whose driver died ends when
  its stdin pipe closes.
- Pipe size (Linux fcntl F_SETPIPE_SZ): a 1 MiB pipe to and from a local helper, so one read takes more.
  Fallback: the system's default pipe; reads are smaller, the bytes the same. Owned by enlace/sysinfo.py
  (the server's data-receive grows its stdin the same way).
- An advisory lock (POSIX flock): one fetch into a folder, one `sweep` of a name at a time. Fallback (Windows, no
  fcntl): none is held, so two such commands at once are not kept apart there.
- select() on a pipe (POSIX; Windows' select takes sockets only): fetch and data push to a host without a
  shared connection talk to the system ssh client through its pipes. Fallback (Windows): they go over
  paramiko's channel, a socket, as on a host with no ssh client.
"""

from __future__ import annotations

import signal
import sys

from enlace.sysinfo import grow_pipe

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["LINUX", "PIPES_SELECT", "die_with_us", "grow_pipe", "held_alone"]
LINUX = sys.platform.startswith("linux")
PIPES_SELECT = sys.platform != "win32"


def _set_parent_death_signal() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def die_with_us():
    """The preexec_fn for a local helper: on Linux, one that makes the kernel SIGTERM it when this process
    dies; elsewhere None (no preexec_fn at all)."""
    return _set_parent_death_signal if LINUX else None


def held_alone(fh) -> bool:
    """Take an exclusive lock on the open file `fh` without waiting: False when another process holds it (it is
    released when `fh` closes, or when its process dies); True where there is no flock (Windows: not kept apart)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
