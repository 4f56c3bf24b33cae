"""The batch step of a Slurm run (`enlace slurm-job`, exec'd by the job script on the compute node).

    start   record the job id, node and requeue count in run.json; log them in train.log
    train   run the trainer (`srun torchrun` for several processes) under the supervisor
            (enlace/server/supervise.py): a crash or a stall is restarted within the job; its output is the
            job's output, which is the run's train.log
    signals USR1 (Slurm, signal_grace s before the time limit, to this step only: `B:`) and
            SIGTERM (stop, scancel, preemption) → one SIGTERM to the trainer once it has recorded
            itself: it finishes its step, checkpoints and exits 0. The job script ignores USR1 until
            the handler is in place, and a start with less than signal_grace + 60 s left counts as
            signalled (Slurm may send it up to a minute early, possibly while it was ignored)
    end     after USR1, a run short of max_steps requeues its own job (`scontrol requeue`) until
            max_requeues is spent; after SIGTERM it never does (a stop stays stopped; a preempted
            or requeued job is put back in the queue by Slurm itself)

Stdlib only (the trainer, not this step, imports torch).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from enlace.config.command import CommandRun
from enlace.contract import ACTIVE, LAUNCH_ID_ENV, Status
from enlace.errors import AlreadyRunning
from enlace.server import lifecycle
from enlace.server.runfiles import last_line
from enlace.server.supervise import Policy, Supervisor
from enlace.server.trainerchild import again_argv
from enlace.slurm.settings import EARLY_S, QUEUED_STATES, SlurmError, job_info, time_left_s
from enlace.state import runs


def say(line: str) -> None:
    """A line in train.log (this step's stdout is the job's output file), stamped like the trainer's."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} slurm: {line}", flush=True)


def distributed_argv(python: str, train: list[str], gpus: int, nodes: int, job_id: str, log: Path) -> list[str]:
    """srun one torchrun per node, c10d rendezvous at the allocation's first node. Each task's stdout
    (the trainer's echo of its own log lines) is dropped; stderr (tracebacks) goes to train.log."""
    head = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    port = 20000 + int(job_id) % 20000  # one port per job: two jobs sharing a node do not collide
    return [
        "srun",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--output=/dev/null",
        f"--error={log}",
        "--open-mode=append",
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={head}:{port}",
        f"--rdzv-id={job_id}",
        *train,
    ]


def run_job(run_dir: Path, train: list[str], gpus: int, nodes: int, max_requeues: int, grace: int) -> int:
    """The whole batch step; returns its exit code (0 when the run stopped or finished cleanly). The trainer
    runs under the supervisor (enlace/server/supervise.py: restarts after a crash or a stall, within this job);
    Slurm's USR1 is one more stop signal, and the requeue after it this step's own action."""
    raw = os.environ.get("SLURM_JOB_ID")
    if not raw:
        raise SlurmError("`enlace slurm-job` runs inside a Slurm batch job (SLURM_JOB_ID is not set)")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")  # a sweep's job array: the task is named ARRAY_TASK, as submitted
    job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{task}" if task and os.environ.get("SLURM_ARRAY_JOB_ID") else raw
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)

    def announce(name: str) -> None:
        if name == "limit":
            say(
                f"the job's time limit is near: checkpointing, then requeueing (requeue {restarts + 1} of at most "
                f"{max_requeues})"
                if restarts < max_requeues
                else f"the job's time limit is near: checkpointing; max_requeues ({max_requeues}) is spent"
            )

    st = runs.read(run_dir)
    if st.get("job_id") not in (None, job_id) and runs.alive(st, run_dir):  # (a script submitted twice by hand)
        raise AlreadyRunning(
            f"{run_dir.name} is live under Slurm job {st['job_id']}: this job ({job_id}) would train beside it — "
            f"stop that one first (enlace-remote stop {run_dir.name}, or scancel {st['job_id']})"
        )
    doc = st.get("command")  # the user's own command (submit kept it): started and healed as such
    own = CommandRun.from_doc(doc, "run.json command") if doc else None
    if restarts and own is None:  # a requeued trainer goes on from its newest checkpoint (once its line began)
        train = again_argv(train, run_dir, os.environ.get(LAUNCH_ID_ENV))
    argv = [sys.executable, *train]
    if gpus > 1 or nodes > 1:
        argv = distributed_argv(sys.executable, train, gpus, nodes, raw, run_dir / "train.log")
    env = {**lifecycle.torchrun_env(run_dir), **os.environ}
    policy = Policy(own.supervise.restarts, own.supervise.stall_timeout, own.supervise.backoff) if own else Policy()
    limit = {signal.SIGUSR1: "limit"}
    sup = Supervisor(run_dir, argv, policy, env, signals=limit, on_stop=announce, command=own)
    for s in (signal.SIGUSR1, signal.SIGTERM):  # first of all: the job script ignored USR1 until now
        signal.signal(s, sup.on_signal)
    node = socket.gethostname()
    say(f"job {job_id} on {node}" + (f", start {restarts + 1} (requeued {restarts}×)" if restarts else ""))
    runs.new_attempt(  # the launch it serves (a script submitted by hand: its job's id) is this job's own
        run_dir,
        phase=f"starting on {node} (Slurm job {job_id})",
        job_id=job_id,
        requeues=restarts,
        node=node,
        launch_id=os.environ.get(LAUNCH_ID_ENV),
    )
    left = time_left_s(raw)
    if left is not None and left <= grace + EARLY_S:  # Slurm may have sent USR1 while it was ignored
        say(f"{left}s left before the time limit (signal_grace {grace}s, and Slurm signals up to {EARLY_S}s early)")
        sup.got.add("limit")
    outcome = sup.run()
    code, got = outcome.exit_code, outcome.signalled
    st = runs.read(run_dir)
    ended = st.get("status") in (Status.STOPPED, Status.FINISHED)
    short = own is not None or st.get("step", 0) < (st.get("max_steps") or 0)  # a command stopped is not done
    if "limit" in got and "term" not in got and st.get("status") == Status.STOPPED and short:
        if restarts < max_requeues:
            return _requeue(run_dir, job_id, st)
        say(
            f"max_requeues ({max_requeues}) reached: the run stays stopped at step {st.get('step')} with its "
            "checkpoint — `enlace-remote launch` continues it"
        )
        runs.update(run_dir, requeue_limit_reached=True)
    elif "term" in got and ended:
        say(f"SIGTERM (stop, scancel or preemption): checkpointed at step {st.get('step')}")
    elif st.get("status") in ACTIVE:  # ended before it could record why (bad config, missing module, ...)
        runs.update(run_dir, status=Status.FAILED, exit_code=code or 1, error=last_line(run_dir))
    return 0 if ended else (code or 1)


def _requeue(run_dir: Path, job_id: str, st: dict) -> int:
    say(f"checkpointed at step {st.get('step')}; requeueing job {job_id}")
    runs.update(run_dir, status=Status.PENDING, phase="requeued: waiting for Slurm to start it again")
    r = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if r.returncode != 0 and not _was_requeued(job_id, st.get("requeues") or 0):
        why = (r.stderr or r.stdout).strip() or f"exit {r.returncode}, nothing said"
        say(
            f"scontrol requeue {job_id} failed: {why} — the run stays stopped with its "
            "checkpoint; `enlace-remote launch` continues it"
        )
        runs.update(run_dir, status=Status.STOPPED, error=f"scontrol requeue failed: {why[-200:]}")
    return 0


def _was_requeued(job_id: str, before: int, tries: int = 5, pause_s: float = 1.0) -> bool:
    """Whether Slurm requeued the job after all: scontrol can end with an error, saying nothing, as Slurm ends
    this very job for its requeue (seen once in four requeues on a walk: the log said it failed, and the job
    started again)."""
    for _ in range(tries):
        info = job_info(job_id, max_age=0)
        if (info["restarts"] or 0) > before or info["state"] in QUEUED_STATES:
            return True
        time.sleep(pause_s)
    return False
