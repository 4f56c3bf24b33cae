"""Facts about this process and machine: memory, CPU name, commit, host. Portable through psutil and the
standard library; the two Linux-only reads are guarded here, with their fallback beside them:

- peak RSS: Linux's VmHWM (/proc/self/status), which preflight resets between phases (clear_refs);
  elsewhere the process's ru_maxrss (bytes on macOS, KiB on Linux), which cannot be reset.
- CPU name: Linux's /proc/cpuinfo, macOS's sysctl machdep.cpu.brand_string, else platform.processor().
- pipe size: Linux's fcntl F_SETPIPE_SZ (a 1 MiB pipe, fewer and larger reads for fetch and data push);
  elsewhere the system's default pipe, the bytes the same.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import socket
import subprocess
import sys
from pathlib import Path

LINUX = sys.platform.startswith("linux")
F_SETPIPE_SZ = 1031  # Linux's fcntl value (Python names it from 3.10 on Linux only)


def grow_pipe(fd: int, size: int) -> None:
    """Ask for a `size`-byte pipe on Linux (up to /proc/sys/fs/pipe-max-size); elsewhere keep the default.
    Not a pipe (a file, a socket): nothing changes."""
    if LINUX:
        import fcntl

        with contextlib.suppress(OSError):  # over the limit, or not a pipe: what there is still works
            fcntl.fcntl(fd, F_SETPIPE_SZ, size)


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set (there is no torch CPU allocator statistic)."""
    if LINUX:
        return _proc_status_kib("VmHWM") * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> None:
    """Reset the peak to the current RSS where the system can (Linux: write 5 to clear_refs); elsewhere
    the peak keeps counting from the process's start. Best effort."""
    if not LINUX:
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def total_memory_bytes() -> int:
    import psutil

    return psutil.virtual_memory().total


def cpu_name() -> str:
    if LINUX:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor() or platform.machine() or "cpu"


def git_commit(root: Path) -> str:
    """ENLACE_COMMIT (set by enlace/remote/remote.sh) or `git rev-parse HEAD`, else "unknown"."""
    if os.environ.get("ENLACE_COMMIT"):
        return os.environ["ENLACE_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def hostname() -> str:
    return socket.gethostname()


def mib(n: int | float) -> float:
    return round(n / 2**20, 1)
