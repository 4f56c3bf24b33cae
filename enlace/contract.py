"""The contract between the two halves: what the trainer's server verbs and the driver (enlace-remote)
both rely on, owned here once. Standard library only: the driver imports it on a laptop without torch,
numpy or the trainer's modules.

  exit codes         the one table of `enlace`, enlace/remote/remote.sh and `enlace-remote`
  run names          the rule a run_name follows, and where a run's name comes from
  run status         the Status enum and what each status means to the driver (terminal or not, the
                     exit code `logs -f` ends with, the words that describe it)
  the error document {"ok": false, "error", "exit_code", "kind"}: one builder; `kind` names the error for
                     the driver, which never matches message text
  the fetch frame    how fetch-serve frames each file's bytes
  Slurm host keys    the hosts.yaml keys of a Slurm login node
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import re
import struct
import sys
from typing import Any, NoReturn

# -- exit codes -------------------------------------------------------------------------------------
# No value has two meanings. remote.sh spells the ones it uses as EXIT_* variables that a test checks.

OK = 0
FAILED = 1  # the run or a remote command failed (verify-resume: states differ)
USAGE = 2  # bad usage, config, checkpoint, host or run name: one line says what, where and the fix
VERIFY = 3  # verification failed: dirty tree, git-ignored files, something missing on the server
UNREACHABLE = 4  # host unreachable, authentication rejected, unknown or changed host key
OOM = 5  # the batch does not fit: preflight's verdict, or a training run out of device memory (not retried)
UNSTABLE = 6  # preflight: fp16 keeps skipping steps
ALREADY_RUNNING = 7  # launch: the run is already running (or another launch of it is in progress)
CRASHED = 8  # the run crashed: restarts spent, or its process vanished without a final status; a dropped run too
NO_SPACE = 9  # not enough free disk for the run's checkpoints
TOO_SLOW = 10  # preflight: the measured steps project past preflight's own time budget
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells say it): the verb said what it left going

TABLE = {
    OK: "ok (preflight: ok or tight)",
    FAILED: "the run or a remote command failed",
    USAGE: "bad usage, config, checkpoint, host or run name",
    VERIFY: "verification failed: dirty tree, git-ignored files, something missing on the server",
    UNREACHABLE: "host unreachable, authentication rejected, unknown or changed host key",
    OOM: "the batch does not fit: preflight's oom verdict, or training ran out of device memory",
    UNSTABLE: "preflight: fp16 unstable",
    ALREADY_RUNNING: "launch: the run is already running (or queued)",
    CRASHED: "the run crashed (its restarts spent, or it vanished without a final status; queued: dropped; launch: "
    "its first start crashed)",
    NO_SPACE: "not enough free disk space for the run's checkpoints",
    TOO_SLOW: "preflight: too slow (its steps project past its time budget)",
    INTERRUPTED: "interrupted (Ctrl-C; enlace-remote also by SIGTERM or SIGHUP)",
}

# preflight verdict → exit code (ok, tight: 0)
VERDICT = {"oom": OOM, "unstable": UNSTABLE, "no_space": NO_SPACE, "too_slow": TOO_SLOW}


def help_text() -> str:
    """The table for `--help` epilogs (click's \\b keeps the lines as they are)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in TABLE.items())


def leave(code: object) -> NoReturn:
    """Exit with `code` (as sys.exit takes it) at once: stdout and stderr flushed, the interpreter's
    teardown skipped (callers have closed what they opened): tearing down a process that loaded torch is
    slow and frees only what the OS frees anyway (docs/benchmarks.md). The atexit hooks torch registers
    (compile workers, data loaders, logging) still run first; without torch, where none is needed, none
    runs."""
    if code is not None and not isinstance(code, int):  # sys.exit("text"): Python prints it, exits 1
        print(code, file=sys.stderr)
        code = 1
    if "torch" in sys.modules:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) or a closed stream
            stream.flush()
    os._exit(code or 0)


# -- run names --------------------------------------------------------------------------------------

RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_NAME_RULE = "a run_name is 1-64 characters of [A-Za-z0-9._-] starting with a letter or digit"
# a line of train.log: the trainer's and the supervisor's start with this stamp (the latter then with the word
# `supervisor: `, server/runfiles.supervisor_line)
LOG_STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
SUPERVISOR_LINE = re.compile(LOG_STAMP + "supervisor: ")
LAUNCH_ID_ENV = "ENLACE_LAUNCH_ID"  # in the environment of every process a launch starts (enlace/server/launched.py)
FETCH_ORIGIN = ".enlace-origin.json"  # in a run directory fetched from a host: which host and run dir it came from


def run_name_of(run_file: dict[str, Any], stem: str, sets: dict[str, Any]) -> tuple[Any, str]:
    """Where a run's name comes from, and which source gave it: `--set run_name=` wins, then the run
    file's `run_name:`, then the file's stem. Not validated here (the caller names the source)."""
    if "run_name" in sets:
        return sets["run_name"], "--set"
    if "run_name" in run_file:
        return run_file["run_name"], "run"
    return stem, "run"


# -- run status -------------------------------------------------------------------------------------


class Status(str, enum.Enum):
    PENDING = "pending"  # queued on Slurm (submitted or requeued), waiting for a node
    QUEUED = "queued"  # waiting in the server's own queue for free GPUs or a CPU slot (its supervisor waits)
    STARTING = "starting"  # launched; the trainer has not logged its first step yet
    RUNNING = "running"
    STOPPING = "stopping"  # a stop was requested; the trainer is finishing its step and checkpointing
    STOPPED = "stopped"  # ended cleanly before max_steps (stop, SIGTERM, --until); resumable
    FINISHED = "finished"  # reached max_steps
    FAILED = "failed"  # ended with an error it reported (config, checkpoint, disk full, exception)
    CRASHED = "crashed"  # its supervisor spent its restarts, or it vanished without a final status (SIGKILL)
    DROPPED = "dropped"  # was queued, and its waiter is gone (a reboot, a kill): launch queues it again

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        """Ended: nothing of the run is alive (a later launch may resume it)."""
        return self not in ACTIVE


ACTIVE = frozenset({Status.PENDING, Status.QUEUED, Status.STARTING, Status.RUNNING, Status.STOPPING})
ENDED_CLEANLY = frozenset({Status.STOPPED, Status.FINISHED})
STOPPABLE = frozenset(
    {Status.QUEUED, Status.STARTING, Status.RUNNING}
)  # what `stop` moves to STOPPING (compare-and-set)
UNLESS_STOPPING = frozenset(Status) - {Status.STOPPING}  # the trainer's own starting/running never undoes a stop
NOT_STARTED = frozenset({Status.PENDING, Status.QUEUED, Status.DROPPED})  # no checkpoint comes until it starts


def not_started(run_name: str, status: str, nothing: str, driver: str = "enlace-remote") -> str | None:
    """What to say of a run that has not started (queued, pending, dropped) when asked for what only a started
    run has (`nothing`: "nothing to fetch yet"); None for any other status. `driver`: the command line to name."""
    if status not in NOT_STARTED:
        return None
    then = (
        f"`{driver} launch {run_name}` queues it again"  # its waiter is gone: nothing will start it
        if status == Status.DROPPED
        else f"it starts when its turn comes (`{driver} logs {run_name} -f` waits with it)"
    )
    return f"{run_name} has not started ({status}): {nothing} — {then}"


# What ranks a sweep's runs, lower is better: enlace's trainer's val bits/byte, else the val loss a script of
# your own logs (enlace.job.log(step, kind="eval", val_loss=...)). The table, the board and the notes use it.
SWEEP_METRICS = ("val_bpb", "val_loss")


def sweep_metric(rows: list[dict[str, Any]]) -> str:
    """The key that ranks these runs (one sweep's: one script's): the first of SWEEP_METRICS that any has; before
    any has one, val loss for runs of a command of your own (status rows say `command`), else val bpb."""
    found = next((k for k in SWEEP_METRICS if any(r.get(k) is not None for r in rows)), None)
    return found or ("val_loss" if any(r.get("command") for r in rows) else "val_bpb")


def metric_words(key: str) -> str:
    """How a person reads the key: `val bpb`, `val loss`."""
    return key.replace("_", " ")


# -- the supervisor's policy and the trainer's command line -----------------------------------------------

CPU_SLOTS = 1  # the queue: CPU runs at once on a server (hosts.yaml cpu_slots; torch's threads take every core)
GPU_FREE_BELOW = 0.1  # the queue: a GPU whose other processes hold less than this share of its memory is free
RESTARTS = 3  # restarts after a crash or a stall, from the newest checkpoint (launch --restarts)
BACKOFF_S = 10.0  # the wait before the first restart; each next one is 3x longer
MAX_GRACE_S = 86400.0  # the longest a stop waits for a checkpoint (stop --grace, supervise.grace): a day


def trainer_args(run_file: str, train_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The python arguments that run the trainer on RUN_FILE (under torchrun, after its own)."""
    return ["-m", "enlace", "train", run_file, *train_args]


def exit_code_of(row: dict[str, Any]) -> int:
    """What `logs -f` (and the driver) exits with once a run has ended."""
    status = Status(row["status"])
    if status in ENDED_CLEANLY:
        return OK
    if status in (Status.CRASHED, Status.DROPPED):
        return CRASHED
    code = row.get("exit_code")
    return code if isinstance(code, int) and code not in (0, CRASHED) else FAILED


def ended_message(row: dict[str, Any], from_file: bool = True, again_as: str | None = None) -> str:
    """One line for a run that has ended badly: what happened (the supervisor's or the run's own words where
    there are any), the last step, and what a relaunch resumes from. `from_file`: a command's run has a run file
    (the driver knows: run.json records the command, not where it came from); False: it was given after `--`.
    `again_as`: the launch that runs it again, where `launch NAME` would not (a run file's command under another
    name, whose failed start the host recorded: `launch NAME` ran that again)."""
    ckpt = row.get("latest_checkpoint")
    if row["status"] == Status.DROPPED:
        what = "was queued and its waiter is gone (a reboot or a kill): it never started"
    elif row["status"] == Status.CRASHED:
        what = f"crashed: {row.get('error') or 'its process vanished without a final status (killed, OOM killer or reboot)'}"
    else:
        what = f"failed: {row.get('error') or 'exit code ' + str(row.get('exit_code'))}"
    step = f"{row.get('step') or 0}/{row['max_steps']}" if row.get("max_steps") else str(row.get("step") or 0)
    where = f"last logged step {step}, " if row.get("step") or row.get("max_steps") else ""
    launch = f"`{again_as or 'enlace-remote launch ' + row['run_name']}`"  # (the driver adds --host where it is needed)
    adhoc = row.get("command") and not from_file  # given after `--`: `launch NAME` runs it as it was
    if row["status"] == Status.FAILED and adhoc:  # its own error: the same command fails again
        again = f"fix the command, then `enlace-remote launch --name {row['run_name']} -- COMMAND`"
    elif row["status"] == Status.FAILED:  # its own error (config, data, disk): a relaunch as it is fails again
        # an error that names the checkpoint (corrupt, another device's) says itself where to resume from
        resumes = f" (it resumes from {ckpt})" if ckpt and ckpt not in (row.get("error") or "") else ""
        again = f"fix what it says, then {launch}{resumes}"
    elif ckpt:
        again = f"last complete checkpoint {ckpt} — {launch} resumes from it"
    elif row.get("command"):  # a command resumes its own way (its `resume:`), from files enlace does not know
        again = f"{launch} runs it again" + (" (its `resume:` arguments apply as its run file says)" * from_file)
    else:
        again = f"no checkpoint — {launch} starts it again"
    return f"{row['run_name']} {what}; {where}{again}"


def other_kind(was_command: bool) -> tuple[str, str]:
    """What is wrong with a launch of enlace's trainer under the name of a run of a command, or the reverse (both
    halves refuse it), and the fix."""
    was, now = ("a command", "enlace's trainer") if was_command else ("enlace's trainer", "a command")
    fix = "name this run otherwise (launch --name, or --set run_name=), or, once it has ended, remove its directory"
    return f"a run of {was} here, and this launch starts {now} under its name", fix


def describe_live(row: dict[str, Any]) -> str:
    """What a live run is doing, in a few words: `running, step 24 of 500, pid 4242`, `starting: building
    the model`, `pending, Slurm job 3`. Only what is known (no `pid None`, no `step 0/None`)."""
    if row["status"] in (Status.STARTING, Status.PENDING, Status.QUEUED) and row.get("phase"):
        what = f"{row['status']}: {row['phase']}"
    else:
        what = str(row["status"])
        if row.get("step") and row.get("max_steps"):
            what += f", step {row['step']} of {row['max_steps']}"
    if row.get("job_id"):
        return f"{what}, Slurm job {row['job_id']}"
    return f"{what}, pid {row['pid']}" if row.get("pid") else what


# -- the error document -----------------------------------------------------------------------------


class ErrorKind(str, enum.Enum):
    """What went wrong, for the driver to act on (it never matches an error's text)."""

    NOT_SYNCED = "not_synced"  # nothing has been checked out on the server yet
    NO_SUCH_RUN = "no_such_run"
    ALREADY_RUNNING = "already_running"
    CONFIG = "config"
    CHECKPOINT = "checkpoint"
    NO_SPACE = "no_space"
    QUEUE_BUSY = "queue_busy"  # nothing in the server's queue is free for a preflight now
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


def error_doc(message: str, exit_code: int, kind: ErrorKind | str | None = None, **extra: Any) -> dict[str, Any]:
    """The one shape of a server verb's refusal: {"ok": false, "error", "exit_code", "kind", ...extra}."""
    return {"ok": False, "error": message, "exit_code": exit_code, "kind": str(kind or ErrorKind.OTHER), **extra}


# -- the fetch frame --------------------------------------------------------------------------------

FRAME = struct.Struct(">QQ")  # before each file's bytes: where they start in the file, how many
RUN_FILES = ("run.json", "config.yaml", "metrics.jsonl", "train.log", "preflight.json")

# -- Slurm host keys --------------------------------------------------------------------------------

SLURM_KEYS = (
    "partition",
    "account",
    "qos",
    "time",
    "gpus_per_node",
    "cpus_per_task",
    "mem",
    "nodes",
    "extra_sbatch",
    "max_requeues",
    "signal_grace",
)
