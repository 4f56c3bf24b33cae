"""The queue of one server: runs wait for free GPUs (or CPU slots) instead of colliding. No daemon, no root:
a queued run is a run whose supervisor waits for its turn, and every decision is taken under one lock
file that the kernel releases when its holder dies.

    QUEUE_DIR/lock            held for a moment by whoever decides a turn (flock)
    QUEUE_DIR/seq             the last ticket's number
    QUEUE_DIR/tickets/N.json  a waiting run (name, run dir, need); flocked by its waiter as long as it waits:
                              a ticket whose lock is free belongs to a waiter that died, and is dropped
    QUEUE_DIR/cpu_slots       how many CPU slots the account has: the latest launch's host entry's (a run
                              already waiting takes a slot added since it was launched)
    QUEUE_DIR/slot-gpu-UUID   one per GPU, one per CPU slot (slot-cpu-I): flocked by the run that holds it,
    QUEUE_DIR/slot-cpu-I      for as long as its supervisor or its trainer lives (the trainer inherits the
                              descriptor); the file says which run, for `status`. Never deleted (a lock on
                              a deleted file would let a second run take the same GPU).

QUEUE_DIR is ~/.enlace/queue/HOSTNAME, one per machine and account (every driver and every remote_dir of the
account share it; HOSTNAME keeps machines that share a home over NFS apart), or $ENLACE_QUEUE_DIR.

A turn, for the waiting runs that need the same kind (GPUs, CPU slots), oldest ticket first: a slot is free
when no run holds its lock and, for a GPU, other people's processes use less than `gpu_free_below` of its
memory. The oldest ticket takes the free slots it needs, all at once, or waits; nobody behind a waiting run
passes it (strict first come, first served). So a 2-GPU run is never starved by a stream of 1-GPU runs, and
two 2-GPU runs on 3 GPUs never deadlock (a claim is all or nothing). Stdlib and psutil only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from enlace import contract
from enlace.errors import EnlaceError
from enlace.server import gpus as gpuinfo
from enlace.server.needs import Need, Settings, inventory
from enlace.state.runs import atomic_write

POLL_S = 2.0  # a waiter looks at the queue this often
SLOTS = "cpu_slots"


@dataclass
class Seat:
    """The slots a run holds: their locked files (kept open, passed to the trainer), and the GPUs' indices."""

    files: list[IO]
    gpus: list[int]

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(f.fileno() for f in self.files)

    def env(self) -> dict[str, str]:
        """The run's view of the GPUs: only its own, in nvidia-smi's order (PCI bus), as torchrun's ranks see
        them too (rank i takes the i-th)."""
        if not self.gpus:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def release(self) -> None:
        for f in self.files:
            f.close()


@dataclass(frozen=True)
class Slot:
    name: str  # its lock file's name
    label: str  # how a person names it: `GPU 1`, `CPU slot 0`
    gpu: gpuinfo.Gpu | None = None


# -- the files ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _decision(qdir: Path) -> Iterator[None]:
    qdir.mkdir(parents=True, exist_ok=True)
    with open(qdir / "lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _try_lock(path: Path) -> IO | None:
    """The file opened and flocked, or None if another process holds it."""
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def _holder(path: Path) -> dict | None:
    """Who holds the slot `path` ({"run": ...}), None if nobody does."""
    fh = _try_lock(path)
    if fh is not None:
        fh.close()
        return None
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


@dataclass
class Ticket:
    path: Path
    file: IO
    need: Need
    run: str

    @property
    def number(self) -> int:
        return int(self.path.stem)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        self.file.close()

    @classmethod
    def adopt(cls, path: Path, fd: int, need: Need, run: str) -> Ticket:
        """The ticket `enlace start` took, its locked descriptor inherited as `fd` (its place is the launch's)."""
        return cls(path, open(fd, "a+", closefd=True), need, run)


def enqueue(run_dir: Path, need: Need, settings: Settings) -> Ticket:
    """Take the run's place in the queue now (`enlace start` does, before its supervisor exists: first come is
    the launch that came first), after every ticket taken so far."""
    with _decision(settings.dir):
        return _enqueue(settings.dir, run_dir, need)


def _enqueue(qdir: Path, run_dir: Path, need: Need) -> Ticket:
    """A new ticket, after every ticket taken so far (under the decision lock)."""
    tickets = qdir / "tickets"
    tickets.mkdir(parents=True, exist_ok=True)
    seq_file = qdir / "seq"
    try:
        seq = int(seq_file.read_text())
    except (OSError, ValueError):  # none yet, or emptied (a full disk): never behind a ticket that exists
        seq = 0
    newest = max((int(p.stem) for p in tickets.glob("*.json") if p.stem.isdigit()), default=0)
    fh, seq = None, max(seq, newest)
    while fh is None:
        seq += 1
        path = tickets / f"{seq:012d}.json"
        fh = _try_lock(path)
    atomic_write(seq_file, f"{seq}\n")
    doc = {"run": run_dir.name, "run_dir": str(run_dir), "need": str(need), "pid": os.getpid(), "at": time.time()}
    fh.write(json.dumps(doc))
    fh.flush()
    return Ticket(path, fh, need, run_dir.name)


def _waiting(qdir: Path, mine: Ticket | None = None) -> list[tuple[Path, dict]]:
    """The live tickets, oldest first; a dead waiter's ticket is removed."""
    live = []
    for path in sorted((qdir / "tickets").glob("*.json")):
        if mine is None or path != mine.path:
            fh = _try_lock(path)
            if fh is not None:  # its waiter is gone (killed, a reboot): the ticket goes with it
                path.unlink(missing_ok=True)
                fh.close()
                continue
        with contextlib.suppress(OSError, json.JSONDecodeError):
            live.append((path, json.loads(path.read_text())))
    return live


# -- a turn ------------------------------------------------------------------------------------------


class QueueBusy(EnlaceError):
    """Nothing is free for a preflight now (the driver skips it, saying why)."""

    kind = contract.ErrorKind.QUEUE_BUSY


def _pool(kind: str, settings: Settings) -> list[Slot]:
    if kind == "gpu":
        return [Slot(f"slot-gpu-{g.uuid}", f"GPU {g.index}", g) for g in inventory(settings.dir)]
    return [Slot(f"slot-cpu-{i}", f"CPU slot {i}") for i in range(_cpu_slots(settings))]


def _cpu_slots(settings: Settings) -> int:
    """The account's CPU slots: the latest launch's (QUEUE_DIR/cpu_slots), else `settings`'. A waiter's own were
    its launch's: raising cpu_slots in hosts.yaml left the new slot idle while runs waited."""
    try:
        return max(1, int((settings.dir / SLOTS).read_text()))
    except (OSError, ValueError):
        return settings.cpu_slots


def note_slots(settings: Settings) -> None:
    """A launch's cpu_slots become the queue's (`enlace start`'s; a restart's wait, with its launch's, does not)."""
    with _decision(settings.dir):
        _note_slots(settings)


def _note_slots(settings: Settings) -> None:
    """A launch's (or its preflight's, a sweep's placement's) cpu_slots become the queue's (under the lock)."""
    if _cpu_slots(settings) != settings.cpu_slots or not (settings.dir / SLOTS).exists():
        atomic_write(settings.dir / SLOTS, f"{settings.cpu_slots}\n")


def _who(doc: dict, here: str) -> str:
    """How the queue names a run to the run at `here` (its run dir): its name; `(this run)` for its own; `(of
    REMOTE_DIR)` for a run of another remote_dir of the account (one queue per account: `status` lists it there)."""
    name, theirs = doc.get("run", "?"), doc.get("run_dir") or ""
    if not (theirs and here):
        return name
    theirs_at, here_at = Path(os.path.realpath(theirs)), Path(os.path.realpath(here))  # trees/SHA/runs: a link
    if theirs_at == here_at:
        return f"{name} (this run)"
    return name if theirs_at.parent == here_at.parent else f"{name} (of {theirs_at.parent.parent})"


def _taken(slot: Slot, settings: Settings, here: str = "") -> str | None:
    """Why `slot` is not free, in a few words (its holder named as _who names it to `here`); None if it is."""
    holder = _holder(settings.dir / slot.name)
    if holder is not None:
        return f"{slot.label}: run {_who(holder, here)}"
    gpu = slot.gpu
    if gpu is None:
        return None
    foreign = max(sum(p.mib for p in gpu.processes), gpu.used_mib)
    if foreign < settings.gpu_free_below * gpu.total_mib:
        return None
    if not gpu.processes:
        return f"{slot.label}: {foreign / 1024:.1f} GiB used by processes this account cannot see"
    biggest = max(gpu.processes, key=lambda p: p.mib)
    more = len(gpu.processes) - 1
    return f"{slot.label}: {biggest.describe()}" + (f" and {more} more" if more else "")


def _claim(slots: list[Slot], settings: Settings, run: str, run_dir: str) -> Seat | None:
    files = []
    for slot in slots:
        fh = _try_lock(settings.dir / slot.name)
        if fh is None:  # cannot happen under the decision lock; if it does, nothing is half-taken
            for f in files:
                f.close()
            return None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"run": run, "run_dir": run_dir, "pid": os.getpid(), "since": time.time()}))
        fh.flush()
        files.append(fh)
    return Seat(files, [s.gpu.index for s in slots if s.gpu is not None])


def _look(pool: list[Slot], settings: Settings, here: str = "") -> tuple[list[Slot], list[str]]:
    """The free slots of `pool`, and why each other one is taken (said to the run at `here`)."""
    free, taken = [], []
    for slot in pool:
        why = _taken(slot, settings, here)
        (taken if why else free).append(why or slot)
    return free, taken


def _turn(ticket: Ticket, settings: Settings, run_dir: Path) -> tuple[Seat | None, str]:
    """Take the seat if it is this ticket's turn; else (None, why it waits)."""
    with _decision(settings.dir):
        pool = _pool(ticket.need.kind, settings)
        free, taken = _look(pool, settings, str(run_dir))
        ahead = []
        for path, doc in _waiting(settings.dir, ticket):
            need = Need.parse(doc["need"])
            if need.kind != ticket.need.kind:
                continue
            wanted = len(pool) if need.count is None else need.count
            if path == ticket.path:
                if len(free) >= wanted:
                    seat = _claim(free[:wanted], settings, run_dir.name, str(run_dir))
                    if seat is not None:
                        ticket.close()  # seated: no longer waiting, for whoever looks next
                        return seat, ""
                break
            ahead.append(_who(doc, str(run_dir)))
            free = free[wanted:] if len(free) >= wanted else []  # nobody passes a run that waits
    where = "; ".join(taken) or ("this server reports no GPU" if not pool else "")
    behind = f"behind {', '.join(ahead[:3])}{' and others' if len(ahead) > 3 else ''}" if ahead else ""
    because = "; ".join(x for x in (where, behind) if x)
    return None, f"position {len(ahead) + 1}, waiting for {ticket.need.describe()}" + (
        f" ({because})" if because else ""
    )


def seat_now(run: str, need: Need, settings: Settings, here: str = "") -> tuple[Seat | None, str]:
    """The seat `need` asks for, if it is free now and no run waits for one of its kind (preflight takes it for
    as long as it measures: on what a run would get, beside nobody); else (None, why not; `here`: the run's dir)."""
    with _decision(settings.dir):
        _note_slots(settings)
        pool = _pool(need.kind, settings)
        free, taken = _look(pool, settings, here)
        waiting = [_who(doc, here) for _, doc in _waiting(settings.dir) if Need.parse(doc["need"]).kind == need.kind]
        wanted = len(pool) if need.count is None else need.count
        if not waiting and len(free) >= wanted:
            seat = _claim(free[:wanted], settings, f"{run} (its preflight)", "")
            if seat is not None:
                return seat, ""
    because = "; ".join([*taken, *([f"{len(waiting)} run(s) queued: {', '.join(waiting[:3])}"] if waiting else [])])
    return None, f"{need.describe()} not free now" + (f" ({because})" if because else "")


def capacity(need: Need, settings: Settings) -> dict:
    """How much room this server has now for runs that need what `need` does (a sweep spreads by it)."""
    with _decision(settings.dir):
        _note_slots(settings)
        pool = _pool(need.kind, settings)
        free, _ = _look(pool, settings)
        waiting = sum(Need.parse(doc["need"]).kind == need.kind for _, doc in _waiting(settings.dir))
    per_run = len(pool) if need.count is None else need.count
    return {"need": str(need), "slots": len(pool), "free": len(free), "waiting": waiting, "per_run": per_run}


def wait_for_seat(
    run_dir: Path,
    need: Need,
    settings: Settings,
    stopped: Callable[[], bool],
    beat: Callable[[], None],
    on_wait: Callable[[str], None],
    ticket: Ticket | None = None,
) -> Seat | None:
    """Wait for the run's turn on `ticket` (taken at its launch; without one, taken now): its seat, or None if
    `stopped()` said to give up first. `on_wait(why)` hears each new reason to wait (its position, what holds
    the slots); `beat` is called while it waits (the supervisor's heartbeat)."""
    ticket = ticket or enqueue(run_dir, need, settings)
    try:
        said = None
        while True:
            try:
                seat, why = _turn(ticket, settings, run_dir)
            except gpuinfo.InventoryError as e:
                seat, why = None, f"cannot read the GPUs ({e}); trying again"
            if seat is not None:
                return seat
            if why != said:
                on_wait(why)
                said = why
            deadline = time.monotonic() + POLL_S
            while time.monotonic() < deadline:
                if stopped():
                    return None
                beat()
                time.sleep(0.1)
    finally:
        with _decision(settings.dir):
            ticket.close()
