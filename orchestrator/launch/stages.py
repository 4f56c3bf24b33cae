"""What launch's stages do on the server (orchestrator/launch/pipeline.py runs them in order): preflight
(remote_preflight; on a Slurm host as a job on a compute node), refuse a live or finished run
(worth_launching), start the trainer detached (train_command, start_detached; Slurm's submit is
orchestrator/launch/slurm.py), wait for its first step (wait_first_step). Shipping the commit is ship.py."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click

from enlace.config.command import run_file
from enlace.contract import (
    LOG_STAMP,
    VERDICT,
    Status,
    describe_live,
    ended_message,
    exit_code_of,
    other_kind,
    trainer_args,
)
from enlace.errors import EnlaceError, shown
from enlace.manifest import STEP_RE
from enlace.preflight.report import format_report
from orchestrator.errors import AlreadyRunning, FirstStartCrashed, UsageError, from_doc, on_host
from orchestrator.launch.ship import set_args
from orchestrator.launch.slurm import on_node
from orchestrator.ssh.session import Session


def remote_preflight(
    session: Session, sha: str, run: str, repo: Path, run_name: str, extra: list[str], device: str | None = None
) -> dict:
    """Run `enlace preflight RUN --json` on the server (on a Slurm host: as a short job on a compute node;
    on another host: on what its queue has free now, refused with kind queue_busy when nothing is), streaming
    its progress lines; save the report under the local runs/<run_name>/ and print the table. If this client
    dies, so does the server's preflight (it must not overlap the next one on the GPU)."""

    args = ("preflight", run, "--json", *extra)
    if session.host.slurm:
        args = on_node(session.host.slurm, args)
    elif device is not None:
        args = ("seated", "--for-run", run_name, *queue_args(session.host, device, None), "--json", "--", *args)
    report = session.stream_json(
        sha,
        *args,
        on_progress=lambda line: click.echo(line, err=True),
        stall_timeout=900,
        ok_codes=(0, *VERDICT.values()),
    )
    local = repo / "runs" / run_name
    local.mkdir(parents=True, exist_ok=True)
    (local / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    click.echo(format_report(report))
    return report


def worth_launching(
    session: Session, run_name: str, overrides=(), command: bool = False, fresh: bool = False, until: int | None = None
) -> bool:
    """Before any preflight: a live run is refused at once (its preflight would compete with it); a
    finished run is said to be finished, with how to extend it (False: nothing to launch) — unless `fresh`
    (--resume none or PATH: it starts where that says); an `until` (--until) its newest checkpoint has reached is
    refused (it resumed, trained nothing, and said to raise max_steps)."""
    rows, host = [r for r in session.enlace_json("latest", "runs") if r["run_name"] == run_name], session.host.name
    if not rows:
        return True
    row = rows[0]
    if bool(row.get("command_spec")) != command:  # (said as the server's launch would: before a preflight)
        problem, fix = other_kind(was_command=not command)
        raise UsageError(f"{run_name}: {problem} — {fix}")
    if row.get("checkpoint_warning"):
        said = f"enlace-remote launch {run_name} --resume checkpoints/step-N (or --resume none to start afresh)"
        click.echo(
            f"warning: {row['checkpoint_warning']} — to resume from another checkpoint: {on_host(said, host)}",
            err=True,
        )
    if row.get("supervisor"):  # nobody heals it: the server's launch stops it at a checkpoint and resumes it
        click.echo(
            f"{run_name}'s supervisor is {row['supervisor']['state']}: its trainer will be stopped at a checkpoint "
            "and resumed under a new supervisor",
            err=True,
        )
        return True
    if row["alive"] and not Status(row["status"]).is_terminal:  # a failed run still exiting is not running
        raise AlreadyRunning(_running_message(session, row))
    if command or fresh:  # a command that ended runs again (no max_steps to be finished at); --resume: from there
        return True
    # extended: a max_steps past where it stands (a recorded --set of the same max_steps is no extension)
    asked = [o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "training.max_steps"]
    extends = bool(asked) and asked[-1].strip().isdigit() and int(asked[-1]) > (row["step"] or 0)
    # stopped at its last step: a queued extension stopped before it started leaves the run there (it queued a
    # start that built the model to say "nothing to train")
    # (by its checkpoint's step: a stop --kill during the final save leaves step N of N logged, its checkpoint older)
    kept = int(STEP_RE.fullmatch(row["latest_checkpoint"])[1]) if row.get("latest_checkpoint") else 0
    if until is not None and until <= kept:
        there = on_host(f"enlace-remote launch {run_name}", host)
        raise UsageError(
            f"{run_name}'s newest checkpoint is at step {kept}: --until {until} trains nothing — give --until above"
            f" {kept} (or none: `{there}` trains to its max_steps)"
        )
    at_end = row["status"] == "stopped" and bool(row["max_steps"]) and kept >= row["max_steps"]
    # its final checkpoint incomplete (said above): the steps since the newest complete one are trained again
    lost = bool(row.get("checkpoint_warning")) and kept < (row["max_steps"] or 0)
    if (row["status"] == "finished" or at_end) and not extends and not lost:
        said = (
            f"{run_name} is {'finished' if not at_end else 'stopped at its end'}: step {row['step']} of "
            f"{row['max_steps']} (checkpoint "
            f"{row['latest_checkpoint']}); nothing to train. To train further, raise max_steps: "
            f"`enlace-remote launch {run_name} --set training.max_steps={2 * (row['max_steps'] or 1)}` "
            "resumes from that checkpoint (`--resume none` starts it over)"
        )
        click.echo(on_host(said, host), err=True)
        return False
    return True


def _running_message(session: Session, row: dict) -> str:
    name = row["run_name"]
    state = "queued" if row.get("status") == "queued" else "running"  # a queued run waits for its turn, not to run
    said = (
        f"{name} is already {state} on {session.host.name} ({describe_live(row)}) — `enlace-remote stop {name}` "
        f"first, or follow it with `enlace-remote logs {name} -f`"
    )
    return on_host(said, session.host.name)


def train_command(run: str, train_args: list[str], gpus: str | None, rendezvous: dict | None = None) -> list[str]:
    """The python arguments that start training: `-m enlace train RUN`, under torchrun for --gpus."""
    train = trainer_args(run, train_args)
    if not gpus:
        return train
    nproc = "gpu" if gpus == "all" else gpus  # torchrun's "gpu": every visible GPU
    if rendezvous is None:
        return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *train]
    # Several hosts: a fixed node rank per host (node 0 = the first host, which holds rank 0, its
    # log and its checkpoints), rendezvous at the first host.
    return [
        "-m",
        "torch.distributed.run",
        f"--nnodes={rendezvous['nnodes']}",
        f"--node-rank={rendezvous['node_rank']}",
        f"--master-addr={rendezvous['addr']}",
        f"--master-port={rendezvous['port']}",
        f"--nproc-per-node={nproc}",
        *train,
    ]


def queue_args(host, device: str | None, gpus: str | None) -> list[str]:
    """`enlace start`'s queue options: the run's device and processes (what it needs), the host's settings."""
    if device is None:
        return []
    args = ["--device", device, "--cpu-slots", str(host.cpu_slots), "--gpu-free-below", str(host.gpu_free_below)]
    return args + (["--procs", gpus] if gpus else [])


def run_end_args(host, notify: str | None, sweep: str | None = None, share: int = 1) -> list[str]:
    """`enlace start`'s options for the run's end: whom to tell (launch --notify, else the host's `notify`), its sweep."""
    url = notify or host.notify
    args = ["--notify", url, "--host-name", host.name] if url else []
    return args + (["--sweep", sweep, "--sweep-share", str(share)] if sweep else [])


def start_detached(session: Session, sha: str, run_name: str, pyargs: list[str], policy: list[str] = ()) -> dict:
    """Start `python PYARGS` (the trainer, or torchrun) detached on the host under its supervisor (`policy`:
    --restarts, --stall-timeout): `enlace start`, which refuses a live run. Not retried after a dropped
    session (it may have started): a rerun says so."""
    try:
        doc = session.enlace_json(sha, "start", run_name, *policy, "--", *pyargs, idempotent=False)
    except AlreadyRunning:
        row = session.enlace_json("latest", "runs", run_name)[0]
        raise AlreadyRunning(_running_message(session, row)) from None
    click.echo(f"launched {run_name} on {session.host.name}: pid {doc['pid']}, commit {sha[:12]}", err=True)
    return doc


def log_since(session: Session, run_name: str, offset: int) -> str:
    return session.transport.run(
        session.enlace_argv("latest", "logs", run_name, "--offset", str(offset)), check=False
    ).stdout


SAID = re.compile(f"(?:{LOG_STAMP})?(?:supervisor: |error: |Error: )?")  # a line's stamp and who said it


def tail_under(error: str, log: str, lines: int = 20) -> str:
    """The last `lines` of a failed start's log, shown under its error: less the lines (the supervisor's, the
    trainer's `error:` and its CLI's `Error:`) that the error already says word for word (a short line, a `}`
    or `Traceback`, is kept: it may be anyone's)."""

    def said(line: str) -> bool:
        text = line[SAID.match(line).end() :].strip()
        return len(text) >= 20 and text in error

    return "\n".join(line for line in log.strip().splitlines()[-lines:] if not said(line))


def wait_first_step(
    session: Session,
    run_name: str,
    started: dict,
    follow: bool,
    wait_s: float = 600,
    fresh: bool = False,
    launched_as: tuple[str, tuple[str, ...]] | None = None,
) -> dict:
    """Wait (on the server, one call) until the trainer we started logged a step or ended; show its
    phases meanwhile (`fresh`: it was asked to start afresh, --resume none). A run that ended badly fails here with its error and log tail; one whose first start
    crashed, too (exit 8), unless `follow`: then the log is followed through its restarts."""
    host = session.host.name  # the commands said are for it (on_host)
    row = session.stream_json(
        "latest",
        "wait",
        run_name,
        "--launch-id",
        started["launch_id"],
        "--timeout",
        str(wait_s),
        on_progress=lambda line: click.echo(shown(on_host(line, host)), err=True),  # (a command's last words)
        stall_timeout=wait_s + 60,
    )
    if row["waited"] == "queued":
        click.echo(shown(f"{run_name}: queued on {host}: {row['phase']}"), err=True)
        said = f"  it starts by itself when its turn comes: `enlace-remote logs {run_name} -f` waits with it"
        click.echo(on_host(said, host), err=True)
        return row
    if row["waited"] == "blocked":  # its reason and what it means are the phase shown above
        raise UsageError(
            on_host(
                f"{run_name}: Slurm job {row['job_id']} is pending for {row['slurm_reason']}: as asked it may never "
                f"start — `enlace-remote stop {run_name}` cancels it; ask for what the partition allows (the host's "
                "time, nodes, partition or qos in hosts.yaml, or launch's --nodes/--gpus)",
                host,
            )
        )
    if row["waited"] == "restarting" and follow:
        click.echo(f"{run_name}: its first start crashed; following it through its restarts", err=True)
        return row
    if row["waited"] == "restarting":  # its cause is the phase shown above
        said = (
            f"{run_name}: its first start crashed, and its supervisor starts it again as its restarts allow — "
            f"`enlace-remote logs {run_name} -f` follows it, `enlace-remote stop {run_name}` ends it"
        )
        raise FirstStartCrashed(on_host(said, host))
    if row["waited"] == "timeout":
        where = f"Slurm job {row['job_id']}, {row['slurm_state']}" if row.get("job_id") else f"pid {started['pid']}"
        said = (
            f"{run_name}: no step logged within {wait_s:.0f}s (phase: {row['phase']}); it is still "
            f"{row['status']} ({where}) — follow it with `enlace-remote logs {run_name} -f`"
        )
        raise EnlaceError(on_host(said, host))
    if row["status"] not in ("running", "finished", "stopped"):
        raise _ended_badly(session, row, started, launched_as)
    _say_how_it_started(row, started, fresh)
    return row


def _ended_badly(session: Session, row: dict, started: dict, launched_as: tuple | None) -> EnlaceError:
    """The error of a run whose first start ended badly, with its log's tail; `launched_as` (a run file's command,
    its --set): a run file's command under another name (--set run_name=) is, fixed, launched again as it was."""
    run_name = row["run_name"]
    from_file = launched_as is not None or run_file(run_name, session.repo).is_file()
    again = shlex.join(["enlace-remote", "launch", launched_as[0], *set_args(launched_as[1])]) if launched_as else None
    error = ended_message(row, from_file, again if launched_as and launched_as[0] != run_name else None)
    tail = tail_under(error, log_since(session, run_name, started["log_offset"]))
    code = exit_code_of(row)
    ended = from_doc({"error": f"{error}\n{tail}", "exit_code": code}, code, host=session.host.name)
    ended.run_ended = True  # (not a wait that timed out, nor a start its supervisor retries)
    return ended


def _say_how_it_started(row: dict, started: dict, fresh: bool) -> None:
    """Where the run started from (a checkpoint, step 0), and where a --resume put the line it left."""
    run_name = row["run_name"]
    aside = row.get("set_aside") or {}  # where this launch's --resume put the line it left, if it began one
    what = aside.get("what") or "checkpoints past its start, metrics.jsonl"  # (a command's: what there was of it)
    left = f"  the line it left ({what}) is kept in {aside.get('path')}/"
    if row.get("command"):  # (enlace.job's resume_from says where it resumed, as it loads)
        how = f" (resumed from checkpoints/{row['resumed_from']})" if row.get("resumed_from") else ""
        click.echo(f"{run_name}: {row['status']}{how}: {shlex.join(row['command'])}", err=True)
        if aside.get("launch_id") == started["launch_id"]:  # launch --resume none set its line aside
            click.echo(left, err=True)
        return
    how = (
        f"resumed from checkpoints/{row['resumed_from']}"
        if row["resumed_from"]
        else "starting from step 0 (--resume none)"
        if fresh
        else "no complete checkpoint: starting from step 0"
    )
    click.echo(f"{run_name}: {how}; step {row['step']}/{row['max_steps']}, status {row['status']}", err=True)
    if aside.get("launch_id") == started["launch_id"]:
        click.echo(left, err=True)
