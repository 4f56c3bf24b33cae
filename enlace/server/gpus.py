"""What GPUs this server has and who uses them, as `nvidia-smi` reports it: each GPU's index, memory, and the
compute processes on it (pid, memory). The queue (enlace/server/queue.py) reads it to tell a free GPU from
one a colleague's process is using. `nvidia-smi` rather than NVML's Python binding: it ships with every
driver, needs nothing installed into the tree's environment, and a test can stand in for it on PATH (a GPU
cannot exist on a CI machine). Stdlib and psutil only.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from enlace.state.runs import atomic_write

QUERY_GPUS = ["--query-gpu=index,uuid,memory.total,memory.used", "--format=csv,noheader,nounits"]
QUERY_APPS = ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
TIMEOUT_S = 20.0  # nvidia-smi on a busy 8-GPU server takes a second or two; a hung driver must not hang us


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    mib: float  # device memory it holds, MiB
    user: str | None = None  # its owner, when this account may see it

    def describe(self) -> str:
        who = f"{self.user}'s process" if self.user else "a process"
        return f"{who}, pid {self.pid}, {self.mib / 1024:.1f} GiB"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    total_mib: float
    used_mib: float
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)


class InventoryError(Exception):
    """nvidia-smi is there but did not answer (a driver mismatch, a hung GPU): the message says what it said."""


def inventory() -> list[Gpu]:
    """This server's GPUs ([] without nvidia-smi: a CPU server). Raises InventoryError when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    gpus = [_gpu(line) for line in _query(exe, QUERY_GPUS)]
    procs: dict[str, list[GpuProcess]] = {}
    for line in _query(exe, QUERY_APPS):
        uuid, pid, mib = (part.strip() for part in line.split(","))
        procs.setdefault(uuid, []).append(GpuProcess(int(pid), _mib(mib), _owner(int(pid))))
    return [Gpu(g.index, g.uuid, g.total_mib, g.used_mib, tuple(procs.get(g.uuid, ()))) for g in gpus]


def cached(cache: Path, max_age: float) -> list[Gpu]:
    """`inventory()` as it was at most `max_age` s ago, kept in the file `cache` (replaced whole)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        doc = json.loads(cache.read_text())
        if time.time() - doc["at"] < max_age:
            return [Gpu(**{**g, "processes": tuple(GpuProcess(**p) for p in g["processes"])}) for g in doc["gpus"]]
    found = inventory()
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps({"at": time.time(), "gpus": [asdict(g) for g in found]}))
    return found


def _query(exe: str, args: list[str]) -> list[str]:
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"nvidia-smi did not answer within {TIMEOUT_S:g} s") from None
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines()
        raise InventoryError(f"nvidia-smi failed (exit {out.returncode}): {said[-1] if said else 'no output'}")
    return [line for line in out.stdout.splitlines() if line.strip()]


def _gpu(line: str) -> Gpu:
    try:
        index, uuid, total, used = (part.strip() for part in line.split(","))
        return Gpu(int(index), uuid, _mib(total), _mib(used))
    except ValueError:
        raise InventoryError(f"nvidia-smi: cannot read the line {line!r}") from None


def _mib(text: str) -> float:
    """nvidia-smi's MiB column; `[N/A]` (a process whose memory the driver cannot see) reads as 0."""
    try:
        return float(text)
    except ValueError:
        return 0.0


def _owner(pid: int) -> str | None:
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).username()
    return None
