"""A run's state: the one module that writes run.json, owns the status type and decides liveness.

Everything that asks "is this run alive?", "is it already running?", "did it crash?", "has it
reached its first step?" or "what should `logs -f` exit with?" asks this module, on the server,
in Python. A process is identified by its pid *and* its start time (psutil's create_time, recorded
when it started), so a reused pid or an unrelated process never counts as the run.

run.json (written only here, under a lock, replaced atomically):
    status, pid + pid_start (the trainer, rank 0), launcher_pid + launcher_start (what `start`
    spawned: the trainer or torchrun), launch_id, phase, step, max_steps, loss, val_bpb, tokens,
    tokens_per_s, commit, host, torch, exit_code, error, started_at, updated_at, resumed_from;
    under Slurm also job_id, node, requeues, requeue_limit_reached: liveness is then the job's
    state (the login node cannot see a compute node's processes), from enlace/slurm/settings.py.
Stdlib and psutil only: the driver's server verbs answer without importing torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from enlace import contract
from enlace.contract import ACTIVE, STOPPABLE, UNLESS_STOPPING, Status, describe_live
from enlace.errors import AlreadyRunning
from enlace.slurm import settings as slurm
from enlace.train.checkpoint import latest_checkpoint, skipped_latest

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
def _locked(run_dir: Path, blocking: bool = True, name: str = ".run.json.lock"):
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
    with _locked(run_dir):
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


def alive(state: dict[str, Any]) -> bool:
    if state.get("job_id"):
        return slurm.job_alive(state["job_id"])
    return proc_alive(state.get("pid"), state.get("pid_start")) or proc_alive(
        state.get("launcher_pid"), state.get("launcher_start")
    )


def recorded_status(state: dict[str, Any]) -> Status:
    """The status run.json records; none (or an unknown one) reads as crashed."""
    try:
        return Status(state.get("status", "crashed"))
    except ValueError:
        return Status.CRASHED


def status_of(state: dict[str, Any], is_alive: bool, job_state: str | None = None) -> Status:
    """The recorded status, except that an active run whose processes (or Slurm job) are gone has
    crashed, and a run whose Slurm job is queued is pending."""
    recorded = recorded_status(state)
    if job_state in slurm.QUEUED_STATES:
        return Status.PENDING
    if recorded in ACTIVE and not is_alive:
        return Status.CRASHED
    return recorded


def job_of(state: dict[str, Any]) -> dict[str, Any]:
    """The Slurm job's state, reason and restarts ({} for a run started without Slurm)."""
    if not state.get("job_id"):
        return {}
    return {"job_id": state["job_id"], **slurm.job_info(state["job_id"])}


def observe(run_dir: Path) -> dict[str, Any]:
    """One row of `status`: run.json with liveness applied and the newest complete checkpoint."""

    st = read(run_dir)
    is_alive = alive(st)
    job = job_of(st)
    status = status_of(st, is_alive, job.get("state"))
    now = time.time()
    started = st.get("started_at")
    end = now if status in ACTIVE else st.get("updated_at", now)
    step, max_steps = st.get("step", 0), st.get("max_steps")
    eta = None
    if status == Status.RUNNING and st.get("tokens_per_s") and step and max_steps:
        eta = (max_steps - step) * (st.get("tokens", 0) / step) / st["tokens_per_s"]
    latest = latest_checkpoint(run_dir / "checkpoints")
    return {
        "run_name": run_dir.name,
        "status": status.value,
        "alive": is_alive,
        "pid": st.get("pid"),
        "phase": st.get("phase"),
        "step": step,
        "max_steps": max_steps,
        "loss": st.get("loss"),
        "val_bpb": st.get("val_bpb"),
        "tokens_per_s": st.get("tokens_per_s"),
        "elapsed_s": (end - started) if started else None,
        "eta_s": eta,
        "commit": st.get("commit"),
        "exit_code": st.get("exit_code"),
        "error": st.get("error"),
        "resumed_from": st.get("resumed_from"),
        "latest_checkpoint": latest.name if latest else None,
        "checkpoint_warning": skipped_latest(run_dir / "checkpoints", latest),
        "launch_id": st.get("launch_id"),
        "updated_at": st.get("updated_at"),
        "job_id": job.get("job_id"),
        "slurm_state": job.get("state"),
        "slurm_reason": job.get("reason"),
        "requeues": st.get("requeues"),
        "restarts": st.get("restarts"),
        "requeue_limit_reached": st.get("requeue_limit_reached", False),
    }


# -- start, wait, stop -------------------------------------------------------------------------


@contextlib.contextmanager
def launching(run_dir: Path):
    """One launch of a run at a time (a lock beside its directory); a live run is refused (exit 7).
    Yields (launch_id, log_offset) once run.json says `starting` for this launch."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir.parent, blocking=False, name=f".{run_dir.name}.launch-lock"):
        row = observe(run_dir)
        if row["alive"] and Status(row["status"]).is_terminal:  # wrote its final status, still exiting
            _wait(lambda: alive(read(run_dir)), 30)
            row = observe(run_dir)
        if row["alive"]:
            raise AlreadyRunning(f"{run_dir.name} is already running ({describe_live(row)})")
        log = run_dir / "train.log"
        offset = log.stat().st_size if log.exists() else 0
        launch_id = f"{time.time_ns()}-{os.getpid()}"
        # the old trainer's identity goes before the new one starts: it records its own pid itself
        update(
            run_dir,
            run_name=run_dir.name,
            status=Status.STARTING,
            phase="starting",
            launch_id=launch_id,
            pid=None,
            pid_start=None,
            exit_code=None,
            error=None,
            job_id=None,
            requeues=None,
            requeue_limit_reached=False,
        )
        yield launch_id, offset


def start(run_dir: Path, argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Start `argv` (the trainer, or torchrun) detached, unless the run is alive; one launch at a time.

    setsid (its own session and process group), all three streams redirected: it survives the SSH
    session that started it. Its pid and start time go into run.json before this returns."""
    with launching(run_dir) as (launch_id, offset), open(run_dir / "train.log", "ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**torchrun_env(run_dir), **env, "ENLACE_LAUNCH_ID": launch_id, "PYTHONUNBUFFERED": "1"},
        )
        update(run_dir, launcher_pid=proc.pid, launcher_start=proc_start(proc.pid))
    return {"ok": True, "pid": proc.pid, "log_offset": offset, "launch_id": launch_id}


def torchrun_env(run_dir: Path) -> dict[str, str]:
    """torchrun's --log-dir (it reads PET_LOG_DIR; the user's own setting wins) inside the run dir:
    without one, each torchrun makes a /tmp/torchelastic_* directory that nothing removes."""
    return {"PET_LOG_DIR": str(run_dir.resolve() / "torchrun")}


def submit(run_dir: Path, submit_job) -> dict[str, Any]:
    """Submit the run as a Slurm job (`submit_job(launch_id)` → job id), unless it is alive."""
    with launching(run_dir) as (launch_id, offset):
        update(run_dir, status=Status.PENDING, phase="submitted to Slurm", launcher_pid=None, launcher_start=None)
        try:
            job_id = submit_job(launch_id)
        except BaseException as e:
            update(run_dir, status=Status.FAILED, error=getattr(e, "message", str(e)), exit_code=contract.USAGE)
            raise
        update(run_dir, job_id=job_id)
    return {"ok": True, "pid": None, "job_id": job_id, "log_offset": offset, "launch_id": launch_id}


def wait_started(run_dir: Path, launch_id: str, timeout: float, on_phase=None, poll: float = 0.1) -> dict[str, Any]:
    """Wait on the server until the launch `launch_id` has logged a step or ended; the row at that moment.

    on_phase(text) is called when the trainer's phase changes (building model, resuming, ...)."""
    deadline = time.monotonic() + timeout
    shown = None
    # each poll reads run.json and two processes' start times (or the cached Slurm state); the full row once
    while True:
        st = read(run_dir)
        is_alive = alive(st)
        job = job_of(st)
        status = status_of(st, is_alive, job.get("state"))
        mine = st.get("launch_id") == launch_id
        phase = st.get("phase")
        if job.get("state") in slurm.QUEUED_STATES:
            phase = f"pending in Slurm: job {job['job_id']} {job.get('state')}, reason {job.get('reason') or '-'}"
        if mine and phase != shown and on_phase:
            shown = phase
            on_phase(shown)
        if mine and (status not in ACTIVE or (status == Status.RUNNING and st.get("step", 0) > 0)):
            return observe(run_dir) | {"waited": "done"}
        if not is_alive:  # died before it could write anything (e.g. the interpreter failed)
            return observe(run_dir) | {"status": Status.CRASHED.value, "waited": "done"}
        if time.monotonic() > deadline:
            return observe(run_dir) | {"waited": "timeout"}
        time.sleep(poll)


def stop(run_dir: Path, grace: float, kill: bool) -> dict[str, Any]:
    """SIGTERM what was launched (torchrun forwards it once to every rank), wait up to `grace` s for the
    checkpoint; with `kill`, SIGKILL the process group (or cancel the Slurm job) after that."""
    st = read(run_dir)
    row = observe(run_dir)
    if not row["alive"]:
        return _stop_report(run_dir, row, was_running=False, killed=False)
    if st.get("job_id"):
        return _stop_job(run_dir, st["job_id"], grace, kill)
    # One SIGTERM to the launched process: signalling the whole group would give each rank two signals
    # (the trainer treats a repeated SIGTERM as the same request, but torchrun would start tearing down).
    if proc_alive(st.get("launcher_pid"), st.get("launcher_start")):
        pid, start_time = st["launcher_pid"], st["launcher_start"]
    else:
        pid, start_time = st["pid"], st["pid_start"]
    # Only a starting or running run is asked to stop; a stop already under way (stopping) or a trainer
    # that has just written its final status is waited for, not signalled again.
    if transition(run_dir, Status.STOPPING, STOPPABLE):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    killed = not _wait(lambda: proc_alive(pid, start_time), grace) and kill
    if killed:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        _wait(lambda: proc_alive(pid, start_time), 60)
        update(run_dir, status=Status.STOPPED, exit_code=128 + signal.SIGKILL, error="killed by stop --kill")
    return _stop_report(run_dir, observe(run_dir), was_running=True, killed=killed)


def _stop_job(run_dir: Path, job_id: str, grace: float, kill: bool) -> dict[str, Any]:
    """A Slurm run: a queued job is cancelled (nothing to save); a running one gets SIGTERM through
    Slurm (scancel --signal=TERM --full: the batch step does not requeue after it) and `grace` s to
    checkpoint; with `kill`, scancel after that."""
    live = lambda: slurm.job_alive(job_id)
    if slurm.job_info(job_id, max_age=0)["state"] in slurm.QUEUED_STATES:
        slurm.cancel(job_id)
        update(run_dir, status=Status.STOPPED, phase="cancelled while pending")
        _wait(live, 60)
        return _stop_report(run_dir, observe(run_dir), was_running=True, killed=False)
    if transition(run_dir, Status.STOPPING, STOPPABLE):
        _say_in_log(
            run_dir,
            f"stop: Slurm is asked to end job {job_id} (SIGTERM: the trainer checkpoints and exits); the "
            f"`*** JOB {job_id} ... CANCELLED ***` line Slurm may print next is this stop, not a failure",
        )
        slurm.cancel(job_id, "TERM")
    killed = not _wait(live, grace) and kill
    if killed:
        slurm.cancel(job_id)
        _wait(live, 120)
        update(run_dir, status=Status.STOPPED, exit_code=128 + signal.SIGKILL, error="cancelled by stop --kill")
    return _stop_report(run_dir, observe(run_dir), was_running=True, killed=killed)


def _say_in_log(run_dir: Path, text: str) -> None:
    """One line in the run's train.log, as the trainer stamps its own (appended: the job writes there too)."""
    with contextlib.suppress(OSError), open(run_dir / "train.log", "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def _wait(busy, timeout: float) -> bool:
    """Poll `busy()` until it is false (True) or `timeout` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while busy():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _stop_report(run_dir: Path, row: dict[str, Any], was_running: bool, killed: bool) -> dict[str, Any]:
    return {
        "run_name": run_dir.name,
        "stopped": not row["alive"],
        "was_running": was_running,
        "killed": killed,
        "status": row["status"],
        "step": row["step"],
        "latest_checkpoint": row["latest_checkpoint"],
    }
