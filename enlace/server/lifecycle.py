"""A run's lifecycle on the server: start it detached (or submit it to Slurm), wait for its first step,
stop it. One launch of a run at a time; a live run is refused (exit 7). What a run *is* (run.json, its
status, its liveness) is enlace/state/runs.py's; this module only acts on it. Stdlib and psutil only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from enlace import contract
from enlace.contract import ACTIVE, ENDED_CLEANLY, LAUNCH_ID_ENV, STOPPABLE, Status, describe_live, other_kind
from enlace.errors import AlreadyRunning, ConfigError
from enlace.server import launched
from enlace.server.ownchild import STALE, afresh
from enlace.slurm import settings as slurm
from enlace.state.runs import (
    alive,
    job_of,
    locked,
    observe,
    proc_alive,
    proc_start,
    read,
    recorded_status,
    status_of,
    trained_before,
    transition,
    update,
)

ADOPT_GRACE_S = 120.0  # launch of a run nobody supervises: how long its trainer gets to checkpoint and stop

# -- start, wait, stop -------------------------------------------------------------------------


@contextlib.contextmanager
def launching(run_dir: Path, command: dict | None = None, fresh: bool = False):
    """One launch of a run at a time (a lock beside its directory); a live run is refused (exit 7).
    Yields (launch_id, log_offset) once run.json says `starting` for this launch. `command`: a run of the
    user's own command (enlace/config/command.py's JSON form), kept in run.json; None for enlace's trainer.
    `fresh` (a command's launch --resume none): its checkpoints and metrics set aside first (ownchild.afresh)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with locked(run_dir.parent, blocking=False, name=f".{run_dir.name}.launch-lock"):
        row = observe(run_dir)
        if row["alive"] and Status(row["status"]).is_terminal:  # wrote its final status, still exiting
            _wait(lambda: alive(read(run_dir), run_dir), 30)
            row = observe(run_dir)
        st = read(run_dir)
        _refuse_other_kind(run_dir, st, command)  # before anything of the run is stopped or killed
        if not row["alive"] and proc_alive(st.get("launcher_pid"), st.get("launcher_start")):
            # a frozen supervisor over a dead trainer: it would wake into this launch and act on it
            launched.kill_launch(st.get("launch_id"), st["launcher_pid"])
        elif not row["alive"] and (left := _left_unsupervised(st)):
            # its supervisor and trainer gone, what they started is not (a command's ranks, a slot's holder): it
            # would train beside this launch, or hold its slot
            said = f"the previous launch's processes still ran (pid {launched.pids(left)}): killed (SIGKILL)"
            _say_in_log(run_dir, said)
            launched.kill_all(st.get("launch_id"))
        if row["alive"] and row["supervisor"]:  # nothing heals it now: stop it at a checkpoint, resume below
            _say_in_log(
                run_dir,
                f"launch: the run's supervisor is {row['supervisor']['state']}: stopping the "
                "trainer at a checkpoint to resume it under a new supervisor",
            )
            stop(run_dir, grace=ADOPT_GRACE_S, kill=True)
            row = observe(run_dir)
        if row["alive"]:
            raise AlreadyRunning(f"{run_dir.name} is already running ({describe_live(row)})")
        log = run_dir / "train.log"
        offset = log.stat().st_size if log.exists() else 0
        launch_id = f"{time.time_ns()}-{os.getpid()}"
        aside = afresh(run_dir, launch_id) if fresh and command else None
        before = 0.0 if fresh else trained_before(st)  # a command's ELAPSED: over its launches, since its fresh start
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
            restarts=None,  # this launch's supervisor counts its own
            backoff_until=None,
            data_warning=None,  # this launch's trainer checks the data itself
            need=None,  # the queue's: set by this launch's supervisor if it queues
            gpus=None,
            command=command,  # what the supervisor starts (and status shows); None: enlace's trainer
            set_aside=aside,  # this launch's (a trainer's explicit --resume writes its own): an earlier one's is gone
            attempt_argv=None,
            # a command starts afresh: no trainer's (or earlier attempt's) figures, no old step for the stall clock
            # (its ELAPSED goes on over its launches, as a trainer's over its starts)
            **({**STALE, "started_at": None, "trained_before_s": before, "start_trained_s": None} if command else {}),
            # the tree it will start in, from now: gc keeps it for a run that waits hours in the queue
            **({"commit": os.environ["ENLACE_COMMIT"]} if os.environ.get("ENLACE_COMMIT") else {}),
        )
        yield launch_id, offset


def start(
    run_dir: Path,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    pass_fds: tuple[int, ...] = (),
    command: dict | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """Start `argv` (the trainer, or torchrun) detached, unless the run is alive; one launch at a time.

    setsid (its own session and process group), all three streams redirected: it survives the SSH
    session that started it. Its pid and start time go into run.json before this returns. `pass_fds`:
    descriptors it inherits (its ticket in the queue)."""
    with launching(run_dir, command, fresh) as (launch_id, offset), open(run_dir / "train.log", "ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**torchrun_env(run_dir), **env, LAUNCH_ID_ENV: launch_id, "PYTHONUNBUFFERED": "1"},
            pass_fds=pass_fds,
        )
        update(run_dir, launcher_pid=proc.pid, launcher_start=proc_start(proc.pid))
    return {"ok": True, "pid": proc.pid, "log_offset": offset, "launch_id": launch_id}


def _refuse_other_kind(run_dir: Path, st: dict, command: dict | None) -> None:
    """A run of enlace's trainer launched as a command (`launch --name NAME -- …`), or the reverse: its run.json
    was taken over, and `launch NAME` then called the trainer's run finished at `step 0 of None`."""
    if st.get("status") and (st.get("command") is None) != (command is None):
        raise ConfigError(run_dir.name, "", *other_kind(was_command=command is None))


def torchrun_env(run_dir: Path) -> dict[str, str]:
    """torchrun's --log-dir (it reads PET_LOG_DIR; the user's own setting wins) inside the run dir:
    without one, each torchrun makes a /tmp/torchelastic_* directory that nothing removes."""
    return {"PET_LOG_DIR": str(run_dir.resolve() / "torchrun")}


def submit(run_dir: Path, submit_job, command: dict | None = None, fresh: bool = False) -> dict[str, Any]:
    """Submit the run as a Slurm job (`submit_job(launch_id)` → job id), unless it is alive. `command`: the
    user's own command, kept in run.json for the job's batch step (`fresh`: as launching's)."""
    with launching(run_dir, command, fresh) as (launch_id, offset):
        update(run_dir, status=Status.PENDING, phase="submitted to Slurm", launcher_pid=None, launcher_start=None)
        try:
            job_id = submit_job(launch_id)
        except BaseException as e:
            update(run_dir, status=Status.FAILED, error=getattr(e, "message", str(e)), exit_code=contract.USAGE)
            raise
        update(run_dir, job_id=job_id)
    return {"ok": True, "pid": None, "job_id": job_id, "log_offset": offset, "launch_id": launch_id}


def submit_array(run_dirs: list[Path], submit_job, commands: list[dict | None] | None = None) -> dict[str, str]:
    """Submit the runs as one Slurm job array (`submit_job(launch_ids)` → the array's job id), unless any is
    alive; each run's job is then ARRAY_TASK. `commands`: each run's own command (None: enlace's trainer), kept
    in its run.json for the task's batch step. {run name: its job}."""
    commands = commands or [None] * len(run_dirs)
    with contextlib.ExitStack() as stack:
        launches = [stack.enter_context(launching(d, c)) for d, c in zip(run_dirs, commands)]
        for i, run_dir in enumerate(run_dirs):
            phase = f"submitted to Slurm as task {i} of a job array"
            update(run_dir, status=Status.PENDING, phase=phase, launcher_pid=None, launcher_start=None)
        try:
            array = submit_job([launch_id for launch_id, _ in launches])
        except BaseException as e:
            for run_dir in run_dirs:
                update(run_dir, status=Status.FAILED, error=getattr(e, "message", str(e)), exit_code=contract.USAGE)
            raise
        for i, run_dir in enumerate(run_dirs):
            update(run_dir, job_id=f"{array}_{i}")
    return {d.name: f"{array}_{i}" for i, d in enumerate(run_dirs)}


COMMAND_SETTLE_S = 3.0  # a command has started once it has run this long (supervisord's startsecs, longer)


def wait_started(
    run_dir: Path, launch_id: str, timeout: float, on_phase=None, poll: float = 0.1, settle_s: float = COMMAND_SETTLE_S
) -> dict[str, Any]:
    """Wait on the server until the launch `launch_id` has logged a step, or (a command) run `settle_s`
    without ending, or ended, or crashed and waits to restart ("waited": "restarting"), or waits in a queue
    ("queued"; "blocked": a Slurm job pending for a limit its request is over); the row at that moment.
    A command that fails at once (its imports, a missing file) fails the launch that started it.

    on_phase(text) is called when the trainer's phase changes (building model, resuming, ...)."""
    deadline = time.monotonic() + timeout
    shown = None
    # each poll reads run.json and two processes' start times (or the cached Slurm state); the full row once
    while True:
        st = read(run_dir)
        is_alive = alive(st, run_dir)
        job = job_of(st)
        status = status_of(st, is_alive, job.get("state"))
        mine = st.get("launch_id") == launch_id
        phase, pending = st.get("phase"), job.get("state") in slurm.QUEUED_STATES
        blocked = pending and job.get("reason") in slurm.WILL_NOT_START  # seen: a 2-node job waited on 1 node
        if pending:
            why = f" ({job['reason']})" if job.get("reason") else ""  # Slurm gives none just after submission
            if blocked:
                why += f": {slurm.WILL_NOT_START[job['reason']]}, so it may never start — `stop` cancels it"
            phase = f"pending in Slurm: job {job['job_id']} {job.get('state')}{why}"
        if mine and phase != shown and on_phase:
            shown = phase
            on_phase(shown)
        # a command has started once this attempt has run settle_s and its process still lives (its supervisor may
        # still be ending what it left: the status says running); under Slurm the node's supervisor says it
        ran = time.time() - float(st.get("attempt_started_at") or time.time())
        lives = job.get("job_id") or proc_alive(st.get("pid"), st.get("pid_start"))
        settled = bool(st.get("command")) and ran >= settle_s and bool(lives)
        logged = (st.get("step") or 0) > (st.get("start_step") or 0)  # a step of this start, not its checkpoint's
        started = status == Status.RUNNING and (logged or settled)
        if mine and (status not in ACTIVE or started):
            return observe(run_dir) | {"waited": "done"}
        if mine and status in ACTIVE and (st.get("backoff_until") or st.get("restarts")):  # its first start crashed
            return observe(run_dir) | {"waited": "restarting"}
        if mine and status == Status.QUEUED:  # its turn may be hours away: the launch returns, the run waits
            return observe(run_dir) | {"waited": "queued"}
        if mine and blocked:  # pending for a limit, not its turn: no 10-minute wait
            return observe(run_dir) | {"waited": "blocked"}
        if not is_alive:  # died before it could write anything (e.g. the interpreter failed)
            return observe(run_dir) | {"status": Status.CRASHED.value, "waited": "done"}
        if time.monotonic() > deadline:
            return observe(run_dir) | {"waited": "timeout"}
        time.sleep(poll)


def default_grace(st: dict[str, Any]) -> float:
    """How long a stop waits by default: three of the run's last checkpoint saves (the trainer and enlace.job
    record each save's seconds) plus a minute for the step in flight; for a command, at least its own grace
    (after which its supervisor SIGKILLs it) plus 30 s; at least 120 s, at most a day."""
    own = float(((st.get("command") or {}).get("supervise") or {}).get("grace") or 0)
    saves = 3 * float(st.get("last_save_s") or 0) + 60
    return min(contract.MAX_GRACE_S, max(120.0, saves, own + 30))


def stop(run_dir: Path, grace: float | None, kill: bool) -> dict[str, Any]:
    """`_stop` with the grace it waited (by default the run's own, default_grace) in its report."""
    st = read(run_dir)
    grace = default_grace(st) if grace is None else grace
    return {**_stop(run_dir, st, grace, kill), "grace_s": grace}


def _stop(run_dir: Path, st: dict[str, Any], grace: float, kill: bool) -> dict[str, Any]:
    """SIGTERM what was launched (torchrun forwards it once to every rank), wait up to `grace` s for the
    checkpoint; with `kill`, SIGKILL the process group (or cancel the Slurm job) after that. A supervisor
    that is gone or frozen is passed by: the trainer gets the SIGTERM, and a frozen supervisor a SIGKILL.
    `st`: its run.json, as read once by `stop`."""
    row = observe(run_dir)
    if not row["alive"]:
        if st.get("launcher_pid") and proc_alive(st["launcher_pid"], st.get("launcher_start")):
            # a frozen supervisor over a dead trainer: its group (the supervisor leads it: setsid), so a trainer it
            # started and that has not recorded itself yet goes with it; what else of its launch is left, below
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(st["launcher_pid"], signal.SIGKILL)
            _wait(lambda: proc_alive(st["launcher_pid"], st.get("launcher_start")), 10)
        if left := _left_unsupervised(st):
            return _stop_what_is_left(run_dir, st, left, grace, kill)
        return _stop_report(run_dir, row, was_running=False, killed=False)
    if st.get("job_id"):
        return _stop_job(run_dir, st["job_id"], grace, kill)
    # One SIGTERM to the launched process: signalling the whole group would give each rank two signals
    # (the trainer treats a repeated SIGTERM as the same request, but torchrun would start tearing down).
    # The supervisor (what was launched) forwards it, unless it is gone or frozen: then the trainer itself.
    launcher = st.get("launcher_pid"), st.get("launcher_start")
    if proc_alive(*launcher) and not row["supervisor"]:
        pid, start_time = launcher
    else:
        pid, start_time = st["pid"], st["pid_start"]
    # Only a starting or running run is asked to stop; a stop already under way (stopping) or a trainer
    # that has just written its final status is waited for, not signalled again.
    if transition(run_dir, Status.STOPPING, STOPPABLE):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    killed = not _wait(lambda: proc_alive(pid, start_time), grace) and kill
    if killed:
        # what leads a group of its own while alive (the supervisor: setsid; a command), then the whole launch:
        # torchrun's ranks each lead a session of their own, and a dead parent's children are init's
        launched.kill_launch(
            st.get("launch_id"), *(p for p, t in (launcher, (st.get("pid"), st.get("pid_start"))) if proc_alive(p, t))
        )
        _wait(lambda: proc_alive(pid, start_time), 60)
        # it saved and recorded its stop, and only its exit was late: a clean stop, its stragglers killed
        killed = recorded_status(read(run_dir)) not in ENDED_CLEANLY
        if killed:
            _record_killed(run_dir, "killed by stop --kill")
    if row["supervisor"] and proc_alive(*launcher):  # a frozen supervisor would linger (stopped) forever
        with contextlib.suppress(ProcessLookupError):
            os.kill(launcher[0], signal.SIGKILL)
        _wait(lambda: proc_alive(*launcher), 10)  # its end, before the report reads it (it said "still running")
    # a command records nothing itself, and its supervisor that would is gone: it stopped (it read "crashed");
    # checked first, as transition() writes the phase whether or not the status moves
    gone = not proc_alive(*launcher) and not proc_alive(pid, start_time)
    if st.get("command") and gone and recorded_status(read(run_dir)) == Status.STOPPING:
        update(run_dir, status=Status.STOPPED, phase="stopped: the command ended on SIGTERM (its supervisor was gone)")
    return _stop_report(run_dir, observe(run_dir), was_running=True, killed=killed)


def _left_unsupervised(st: dict[str, Any]) -> list:
    """What of a run's launch still runs, where its supervisor died before it recorded an end (a supervisor that
    recorded one reaped them first): looked for only then, as the look reads every process's environment."""
    return launched.processes_of(st.get("launch_id")) if recorded_status(st) in ACTIVE else []


def _stop_what_is_left(run_dir: Path, st: dict[str, Any], left: list, grace: float, kill: bool) -> dict[str, Any]:
    """A run whose supervisor and recorded process are gone, while processes of its launch are not (a command's
    ranks, a child holding the run's queue slot): SIGTERM to the first of each tree (a rank, not its data loader's
    workers), the grace, with `kill` SIGKILL; stopped once none is left (it read `crashed` while they trained)."""
    said = f"its supervisor is gone, processes of its launch are not (pid {launched.pids(left)}): SIGTERM"
    _say_in_log(run_dir, f"stop: {said}")
    launched.send(launched.roots(left), signal.SIGTERM)
    killed = bool(launched.wait(left, grace)) and kill
    if killed:
        launched.kill_all(st.get("launch_id"))
    if not (left := launched.processes_of(st.get("launch_id"))):
        if killed:
            _record_killed(run_dir, "killed by stop --kill")
        else:
            words = "stopped: what was left of it ended on SIGTERM"
            update(run_dir, status=Status.STOPPED, phase=words)  # (it recorded no end: _left_unsupervised)
            _say_in_log(run_dir, f"stop: {words}")
    return {**_stop_report(run_dir, observe(run_dir), was_running=True, killed=killed), "stopped": not left}


def _record_killed(run_dir: Path, words: str) -> None:
    """A stop --kill's end: stopped, its error and its phase the same words (the phase showed what it was doing),
    said in train.log too (the supervisor that would say it is killed)."""
    _say_in_log(run_dir, f"stop: {words}")
    update(run_dir, status=Status.STOPPED, exit_code=128 + signal.SIGKILL, error=words, phase=words)


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
        _record_killed(run_dir, "cancelled by stop --kill")
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
        "phase": row["phase"],  # a command's: what it did with the SIGTERM
    }
