"""Facts about this process and machine: memory, commit, host."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM): there is no torch CPU allocator statistic."""
    return _proc_status_kib("VmHWM") * 1024


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); best effort."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def total_memory_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def git_commit(root: Path) -> str:
    """ENLACE_COMMIT (set by scripts/remote.sh) or `git rev-parse HEAD`, else "unknown"."""
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
