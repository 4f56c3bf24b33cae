"""What a run needs of a server's queue (GPUs or CPU slots, from its device and processes), what the server
has (its GPUs, as nvidia-smi says them, cached for every waiter), and the refusal of a need it can never meet.
The queue itself (tickets, slots, turns) is enlace/server/queue.py's. Stdlib only (nvidia-smi through gpus.py)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from enlace import contract
from enlace.errors import EnlaceError
from enlace.server import gpus as gpuinfo

INVENTORY_MAX_AGE_S = 5.0  # nvidia-smi is asked at most this often, whatever the number of waiters


def queue_dir() -> Path:
    return Path(os.environ.get("ENLACE_QUEUE_DIR") or Path.home() / ".enlace" / "queue" / socket.gethostname())


@dataclass(frozen=True)
class Need:
    """What a run waits for: `count` GPUs (None: every GPU of the server) or `count` CPU slots."""

    kind: str  # "gpu" | "cpu"
    count: int | None = 1

    def __str__(self) -> str:
        return f"{self.kind}:{'all' if self.count is None else self.count}"

    @classmethod
    def parse(cls, text: str) -> Need:
        kind, _, count = text.partition(":")
        if kind not in ("gpu", "cpu") or not (count == "all" or (count.isdigit() and int(count) > 0)):
            raise ValueError(f"{text!r} is not a need (gpu:N, gpu:all or cpu:N)")
        return cls(kind, None if count == "all" else int(count))

    def describe(self) -> str:
        if self.count is None:
            return "every GPU"
        unit = "GPU" if self.kind == "gpu" else "CPU slot"
        return f"{self.count} {unit}{'s' if self.count != 1 else ''}"


def need_of(device: str, procs: str | None, have_gpus: bool) -> Need:
    """A run's need from its device (cpu, cuda, auto: a GPU where the server has one) and its processes per
    host (`--gpus N|all`: torchrun's, one GPU each; one otherwise). A CPU run takes one slot."""
    if not (device == "cuda" or (device == "auto" and have_gpus)):
        return Need("cpu", 1)  # a slot is one run, however many processes share the cores
    return Need("gpu", None if procs == "all" else int(procs or 1))


@dataclass(frozen=True)
class Settings:
    cpu_slots: int = contract.CPU_SLOTS
    gpu_free_below: float = contract.GPU_FREE_BELOW
    dir: Path = field(default_factory=queue_dir)


def inventory(qdir: Path) -> list[gpuinfo.Gpu]:
    """The GPUs, as nvidia-smi said at most INVENTORY_MAX_AGE_S ago (one cache for every waiter)."""
    return gpuinfo.cached(qdir / "inventory.json", INVENTORY_MAX_AGE_S)


class QueueError(EnlaceError):
    """A need this server can never meet (more GPUs than it has, a GPU where it has none)."""

    exit_code = contract.VERIFY


def need_for(device: str, procs: str | None, settings: Settings) -> Need:
    """The need of a run about to be launched here; QueueError if this server can never meet it."""
    if device == "cpu":  # a CPU run never asks nvidia-smi (a broken driver must not refuse it)
        need, found = Need("cpu", 1), []
    else:
        try:
            found = inventory(settings.dir)
        except gpuinfo.InventoryError as e:
            raise QueueError(f"cannot tell which GPUs are free: {e}") from None
        need = need_of(device, procs, bool(found))
    if procs == "all" and need.kind == "cpu":  # torchrun's "gpu" count has nothing to count (it crashed 4 times)
        why = f"--gpus all starts one process per GPU, and this run is on the CPU here (runtime.device: {device})"
        raise QueueError(f"{why} — give --gpus N for N CPU processes, or leave --gpus out")
    total = len(found) if need.kind == "gpu" else settings.cpu_slots
    if need.kind == "gpu" and not found:
        raise QueueError(
            "the run needs a GPU (its device: cuda) and nvidia-smi here reports none — run it where there is one, "
            "or on the CPU (enlace's trainer: a CPU config such as smoke-cpu, or --set runtime.device=cpu --set "
            "runtime.precision=fp32, fp16 on a CPU being ≈20x slower; a run file of your own command: device: cpu "
            "in it, committed)"
        )
    if need.count is not None and need.count > total:
        has = f"{total} GPU{'s' if total != 1 else ''}" if need.kind == "gpu" else f"cpu_slots: {total}"
        raise QueueError(f"the run needs {need.describe()} and this server has {has} — ask for fewer (--gpus)")
    return need
