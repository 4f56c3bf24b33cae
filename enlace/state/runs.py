"""A run's state: the one module that writes run.json and decides liveness (the status type itself is
enlace/contract.py's: both halves read it).

Everything that asks "is this run alive?", "is it already running?", "did it crash?", "has it
reached its first step?" or "what should `logs -f` exit with?" asks this module, on the server,
in Python. A process is identified by its pid *and* its start time (psutil's create_time, recorded
when it started), so a reused pid or an unrelated process never counts as the run.

run.json (written only here, under a lock, replaced atomically):
    status, pid + pid_start (the trainer, rank 0), launcher_pid + launcher_start (what `start` spawned: the
    run's supervisor), launch_id, phase, step, max_steps, loss, val_bpb, tokens, end_told (notify.py),
    tokens_per_s, commit, host, torch, exit_code, error, started_at, updated_at, resumed_from, set_aside, until
    (where this start stops, --until; status's ETA counts to it);
    under Slurm also job_id, node, requeues, requeue_limit_reached: liveness is then the job's
    state (the login node cannot see a compute node's processes), from enlace/slurm/settings.py.
Stdlib and psutil only: the driver's server verbs answer without importing torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

from enlace.contract import ACTIVE, UNLESS_STOPPING, Status
from enlace.errors import AlreadyRunning
from enlace.manifest import latest_checkpoint, skipped_latest
from enlace.slurm import settings as slurm
from enlace.state import heartbeat

# -- processes ---------------------------------------------------------------------------------


def proc_start(pid: int | None) -> float | None:
    """When `pid` started (seconds since the epoch, to 10 ms, as psutil reads it on Linux and macOS alike),
    None if it is gone, a zombie, or not ours to inspect."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return None if proc.status() == psutil.STATUS_ZOMBIE else round(proc.create_time(), 2)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def proc_alive(pid: int | None, start: float | None) -> bool:
    """True only for the very process that was recorded: same pid, same start time, not a zombie."""
    return start is not None and proc_start(pid) == start


# -- run.json ----------------------------------------------------------------------------------


def read(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to a temp file, fsync, rename over `path`; the temp file never outlives a failure."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(run_dir: Path, blocking: bool = True, name: str = ".run.json.lock"):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / name, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise AlreadyRunning(f"another launch of {run_dir.name} is in progress") from None
        yield


def update(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into run.json (read-modify-write under a lock: the trainer and `stop` both write)."""
    return _merge(run_dir, fields)[0]


def transition(run_dir: Path, to: Status, only_from: frozenset[Status], **fields: Any) -> bool:
    """Compare-and-set under run.json's lock: the status becomes `to` only if the recorded one is in
    `only_from` (the other `fields` are written either way). True if the status changed. A second
    `stop` cannot overwrite the trainer's `stopped` with `stopping`, nor the trainer's `running` a stop."""
    return _merge(run_dir, fields, to, only_from)[1]


def _merge(
    run_dir: Path, fields: dict[str, Any], to: Status | None = None, only_from: frozenset[Status] = frozenset()
) -> tuple[dict[str, Any], bool]:
    """The one read-modify-write of run.json, under its lock: `fields` merged in, and the status moved to
    `to` when the recorded one is in `only_from`. (The new state, whether the status moved.)"""
    with locked(run_dir):
        state = read(run_dir)
        moved = to is not None and recorded_status(state) in only_from
        state.update({k: (v.value if isinstance(v, Status) else v) for k, v in fields.items()}, updated_at=time.time())
        if moved:
            state["status"] = to.value
        atomic_write(run_dir / "run.json", json.dumps(state, indent=1) + "\n")
    return state, moved


def new_attempt(run_dir: Path, **fields: Any) -> None:
    """A new trainer is about to start for this run (a restart, a Slurm job's start): `starting`, and the
    last trainer's identity and verdict forgotten — the new one records its own."""
    update(run_dir, status=Status.STARTING, pid=None, pid_start=None, exit_code=None, error=None, **fields)


def record_self(run_dir: Path, status: Status, **fields: Any) -> None:
    """The trainer (rank 0) records itself: its pid and start time identify the run from now on. A stop
    that came first stays recorded (the trainer then stops at its first step)."""
    transition(run_dir, status, UNLESS_STOPPING, pid=os.getpid(), pid_start=proc_start(os.getpid()), **fields)


# -- what a run is doing -----------------------------------------------------------------------


SUPERVISOR_SILENT_S = 10.0  # the supervisor beats every second: this long without a beat, it is frozen
SUPERVISOR_START_S = 120.0  # before its first beat (imports on a busy node, a cold venv): this long


def alive(state: dict[str, Any], run_dir: Path | None = None) -> bool:
    """The run's trainer, or its supervisor (what `start` launched), is alive; a frozen supervisor (SIGSTOP,
    a hung filesystem) over a dead trainer is not. Under Slurm: the job is."""
    if state.get("job_id"):
        return slurm.job_alive(state["job_id"])
    if proc_alive(state.get("pid"), state.get("pid_start")):
        return True
    launcher = proc_alive(state.get("launcher_pid"), state.get("launcher_start"))
    return launcher and not (run_dir and (supervision(run_dir, state) or {}).get("state") == "frozen")


def supervision(run_dir: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """None while the run's supervisor watches it (or there is nothing to watch: an ended run, a Slurm job);
    else {"state": "gone" | "frozen", "since": when it last showed life (seconds since the epoch)}."""
    if state.get("job_id") or not state.get("launcher_pid") or recorded_status(state) not in ACTIVE:
        return None
    started = state.get("launcher_start") or 0.0
    beat = heartbeat.last(run_dir / heartbeat.SUPERVISOR) or 0.0
    beat = beat if beat >= started else 0.0  # an older beat is a previous supervisor's
    since = beat or started
    if not proc_alive(state.get("launcher_pid"), state.get("launcher_start")):
        return {"state": "gone", "since": since}
    if time.time() - since > (SUPERVISOR_SILENT_S if beat else SUPERVISOR_START_S):
        return {"state": "frozen", "since": since}
    return None


def recorded_status(state: dict[str, Any]) -> Status:
    """The status run.json records; none (or an unknown one) reads as crashed."""
    try:
        return Status(state.get("status", "crashed"))
    except ValueError:
        return Status.CRASHED


def status_of(state: dict[str, Any], is_alive: bool, job_state: str | None = None) -> Status:
    """The recorded status, except that an active run whose processes (or Slurm job) are gone has
    crashed (dropped, if it was waiting in the queue), and a run whose Slurm job is queued is pending."""
    recorded = recorded_status(state)
    if job_state in slurm.QUEUED_STATES:
        return Status.PENDING
    if recorded == Status.QUEUED and not is_alive:
        return Status.DROPPED
    if recorded in ACTIVE and not is_alive:
        return Status.CRASHED
    return recorded


def trained_before(state: dict[str, Any]) -> float:
    """Seconds the run trained in its starts before the one about to begin: what those before it had, plus
    the last start's own time as it last logged it (a crash's too: its last step is its end; a command's, which
    logs no such time: until its last word)."""
    last = state.get("start_trained_s")
    if last is None and state.get("started_at"):
        last = max(0.0, (state.get("updated_at") or state["started_at"]) - state["started_at"])
    return (state.get("trained_before_s") or 0.0) + (last or 0.0)


def job_of(state: dict[str, Any]) -> dict[str, Any]:
    """The Slurm job's state, reason and restarts ({} for a run started without Slurm)."""
    if not state.get("job_id"):
        return {}
    return {"job_id": state["job_id"], **slurm.job_info(state["job_id"])}


def observe(run_dir: Path) -> dict[str, Any]:
    """One row of `status`: run.json with liveness applied and the newest complete checkpoint."""

    st = read(run_dir)
    is_alive = alive(st, run_dir)
    job = job_of(st)
    status = status_of(st, is_alive, job.get("state"))
    unsupervised = supervision(run_dir, st) if status in ACTIVE else None
    now = time.time()
    started = st.get("started_at")
    # the clock runs while this start trains; queued, pending or starting again (a resume, a restart's backoff),
    # run.json still holds the previous start's started_at: its time stands, it does not grow
    training = status in (Status.RUNNING, Status.STOPPING)
    end = now if training else st.get("updated_at", now)
    this_start = (now - started if training else st.get("start_trained_s") or end - started) if started else None
    step, max_steps = st.get("step", 0), st.get("max_steps")
    eta, stop_at = None, st.get("until") or max_steps  # (--until: this start stops there; the ETA ignored it)
    if status == Status.RUNNING and st.get("tokens_per_s") and step and stop_at:
        eta = max(0, stop_at - step) * (st.get("tokens", 0) / step) / st["tokens_per_s"]
    latest = latest_checkpoint(run_dir / "checkpoints")
    return {
        "run_name": run_dir.name,
        "run_file": st.get("run_file"),  # the run config it was launched from, and its --set items
        "overrides": st.get("overrides") or [],
        "status": status.value,
        "alive": is_alive,
        "pid": st.get("pid"),
        "phase": st.get("phase"),
        "step": step,
        "max_steps": max_steps,
        "loss": st.get("loss"),
        "val_bpb": st.get("val_bpb"),
        "val_loss": st.get("val_loss"),  # a script of your own logs it (enlace.job): its sweep is ranked by it
        "tokens_per_s": st.get("tokens_per_s"),
        "elapsed_s": (st.get("trained_before_s") or 0.0) + this_start if started else None,  # over every start
        "start_elapsed_s": this_start,  # the latest start's
        "eta_s": eta,
        "commit": st.get("commit"),
        "exit_code": st.get("exit_code"),
        "error": st.get("error"),
        "command": (st.get("command") or {}).get("command"),  # a run of the user's own command: its argv as given
        "command_spec": st.get("command"),  # ... and all it was launched with (`launch NAME` launches it again)
        "resumed_from": st.get("resumed_from"),
        "set_aside": st.get("set_aside"),  # {launch_id, path}: where the line's explicit --resume moved the one left
        "latest_checkpoint": latest.name if latest else None,
        "checkpoint_warning": skipped_latest(run_dir / "checkpoints", latest),
        "data_warning": st.get("data_warning"),  # a forced data push changed what it reads
        "launch_id": st.get("launch_id"),
        "updated_at": st.get("updated_at"),
        "job_id": job.get("job_id"),
        "slurm_state": job.get("state"),
        "slurm_reason": job.get("reason"),
        "requeues": st.get("requeues"),
        "restarts": st.get("restarts"),
        "need": st.get("need"),  # what it waits for or holds in the server's queue: gpu:N, cpu:N (none: no queue)
        "gpus": st.get("gpus"),  # the GPUs it holds (their nvidia-smi indices), once its turn came
        "requeue_limit_reached": st.get("requeue_limit_reached", False),
        "supervisor": unsupervised,  # None, or {"state": "gone" | "frozen", "since": …}: nothing heals it now
    }
