"""Launching the user's own command (enlace/config/command.py) through the same pipeline as enlace's trainer:
`launch RUN` whose run file has `command:`, or `launch --name NAME -- ARGV...`. Sync, verify (the command's
files and data on the server), start under the supervisor, wait, follow; preflight is the trainer's alone."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import click

from enlace.config import command
from enlace.config.command import CommandRun
from enlace.errors import EnlaceError
from orchestrator.errors import UsageError, VerifyError
from orchestrator.launch.choose import launched_here
from orchestrator.launch.ship import local_run_name

# launch's options that only enlace's trainer takes, and what to do instead
TRAINER_ONLY = {
    "until": "--until: your command ends when it ends (`enlace-remote stop` ends it early)",
    "gpus": "--gpus: set `nproc:` in the run file (torchrun with that many processes)",
    "hosts": "--hosts: a command runs on one host",
    "slurm": "--slurm --print: prints enlace's trainer's batch script (a command goes through launch on a Slurm host)",
    "print_only": "--print: prints enlace's trainer's batch script (a command goes through launch on a Slurm host)",
    "nodes": "--nodes: a command runs on one node",
    "allow_data_change": "--allow-data-change: enlace's trainer's check; your command reads what it reads",
    "allow_teacher_change": "--allow-teacher-change: enlace's trainer's distillation check",
}


def command_of(repo: Path, run: str | None, argv: list[str] | None, name: str | None, overrides) -> CommandRun | None:
    """The command to launch: launch's `-- ARGV` (with --name), or RUN's run file when it has `command:`; None
    when RUN is a run file of enlace's trainer."""
    if argv is not None:
        if not argv:
            raise UsageError("launch --name NAME -- COMMAND...: nothing after `--` — give the command to run")
        if run:
            raise UsageError(
                f"launch {run} -- COMMAND: give either a run file or a command, not both — a command is launched "
                f"under a name of yours: enlace-remote launch --name {shlex.quote(run)} -- {shlex.join(argv)}"
            )
        if not name:
            raise UsageError(
                "launch -- COMMAND needs --name NAME: the run's name (status, logs, stop and fetch use it)"
            )
        if file := _run_file_named(repo, name):  # its run would be taken for the file's, and the file's for it
            raise UsageError(
                f"--name {name}: configs/runs/{file}.yaml is a run file here for that name (launch {file} launches "
                "it) — name this command otherwise"
            )
        return command.adhoc(argv, name, overrides)
    if name:
        raise UsageError("--name names a command given after `--` (launch --name NAME -- python train.py ...)")
    return command.load(run, repo, overrides) if run else None


def _run_file_named(repo: Path, name: str) -> str | None:
    """The run file here whose run is `name` (its stem, or its `run_name:`), or None (a file that cannot be read
    is its own launch's to say)."""
    for path in sorted((repo / "configs" / "runs").glob("*.yaml")):
        with contextlib.suppress(EnlaceError):
            if name in (path.stem, local_run_name(repo, path.stem)):
                return path.stem
    return None


def recorded(session, repo: Path, name: str | None, overrides=()) -> CommandRun | None:
    """`launch NAME` of a command once given after `--` (no run file by that name here): the command the host
    recorded for the run, launched again as it was (with launch's --set applied). None when there is none
    (enlace's trainer's path then says what is missing)."""
    runs_dir = repo / "configs" / "runs"
    if not name or (runs_dir / f"{name}.yaml").is_file():
        return None
    here = launched_here(repo, session.host.name, name)
    if here and (runs_dir / f"{here['run_file']}.yaml").is_file():
        return None  # launched here from a run file (`--set run_name=NAME`): launch_target resolves it, one ask less
    # a name close to a run file's is asked for too: another clone's `--name toy2 -- …` beside a toy.yaml here
    # (a typo of the file is said by launch_target, once the host has no such run)
    try:
        rows = session.enlace_json("latest", "runs", name)
    except EnlaceError:  # nothing synced there yet, no such run: the trainer's path names the missing file
        return None
    spec = rows[0].get("command_spec") if rows else None
    if not spec:
        return None
    where = f"{name}'s recorded command"
    own = command.parse(command.with_sets(spec, overrides, where), where, default_name=None)
    click.echo(f"{name}: launching again the command it ran: {shlex.join(own.argv)}", err=True)
    return own


def refuse_trainer_options(o: SimpleNamespace, own: CommandRun) -> None:
    for key, why in TRAINER_ONLY.items():
        if getattr(o, key, None):
            raise UsageError(f"{why} ({own.run_name} runs your own command)")
    if getattr(o, "resume", "latest") not in ("latest", "none"):
        raise UsageError(
            "--resume PATH: enlace's trainer's option — a command resumes its own way (`resume:` in the run file, "
            "enlace.job's newest checkpoint); --resume none starts it afresh, its checkpoints set aside "
            "(docs/own-script.md)"
        )


def effective(own: CommandRun, restarts: int | None, stall_timeout: float | None) -> CommandRun:
    """The command with launch's own --restarts and --stall-timeout, where given, in its `supervise:`: the spec
    the server records (status --json shows it) says what its supervisor does."""
    sup = own.supervise
    sup = dataclasses.replace(
        sup, restarts=sup.restarts if restarts is None else restarts, stall_timeout=stall_timeout or sup.stall_timeout
    )
    return dataclasses.replace(own, supervise=sup)


def policy(own: CommandRun) -> list[str]:
    """The supervisor's options, from the command's `supervise:` (launch's own in it: effective())."""
    sup = own.supervise
    stall = ["--stall-timeout", str(sup.stall_timeout)] if sup.stall_timeout else []
    return ["--restarts", str(sup.restarts), "--backoff", str(sup.backoff), *stall]


def spec_args(own: CommandRun, fresh: bool = False) -> list[str]:
    """`--command-spec JSON`: the command itself, for `enlace start` (for a run file too: the server runs what
    was verified) and for verify of launch's `-- ARGV` (which has no run file to check); `fresh` (start and submit:
    launch --resume none) adds --fresh."""
    return ["--command-spec", json.dumps(own.to_doc(), separators=(",", ":")), *(["--fresh"] if fresh else [])]


def refuse_preflight(repo: Path, run: str, overrides) -> None:
    """`preflight RUN` of a run file of your own command: said so (it was refused as a trainer config whose
    `command:` is an unknown key, with "did you mean 'command'?")."""
    if command.run_file(run, repo).is_file() and command_of(repo, run, None, None, overrides):
        raise UsageError(
            f"preflight {run}: preflight measures enlace's own trainer, and configs/runs/{run}.yaml runs a command"
            f" of your own, which starts without it — `enlace-remote launch {run}` (docs/own-script.md)"
        )


def say_no_preflight(own: CommandRun) -> None:
    click.echo(
        f"{own.run_name}: preflight measures enlace's own trainer; your command starts without it (docs/own-script.md)",
        err=True,
    )


def ignore_rule(repo: Path, path: str) -> str | None:
    """The .gitignore rule (`FILE:LINE:PATTERN`) that ignores `path` in `repo`, or None (a `!` rule that
    matches it last re-includes it: check-ignore -v names that one too)."""
    import subprocess

    ignored = subprocess.run(
        ["git", "-C", str(repo), "check-ignore", "-v", "--no-index", "--", path], capture_output=True, text=True
    )
    source = ignored.stdout.strip().partition("\t")[0] if ignored.returncode == 0 else ""
    return source if source and not source.split(":", 2)[-1].startswith("!") else None


def check_tracked(repo: Path, own: CommandRun) -> None:
    """The command's scripts must travel with git: present, tracked and not ignored here. An ignored one is
    refused quoting the ignore rule, before anything is synced (the server would not have it)."""
    import subprocess

    for script in own.scripts():
        path = repo / script
        if not path.is_file():
            continue  # maybe made by an earlier step of the command: the server's verify says if it is missing
        source = ignore_rule(repo, script)
        if source:
            raise VerifyError(
                f"{script} is git-ignored ({source}: the rule that matches it), so sync would not send it and the "
                f"server could not run {own.run_name} — track it: remove that rule (or add `!{script}`), then "
                f"`git add {script}` and commit"
            )
        tracked = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "--error-unmatch", "--", script], capture_output=True
        )
        if tracked.returncode != 0:
            raise VerifyError(
                f"{script} is not tracked by git, so sync would not send it — `git add {script}` and commit"
            )


def plan_fields(
    remote, run: str | None, own: CommandRun, from_file: bool, o: SimpleNamespace, restarts_given: bool, data
) -> dict:
    """launch's options for a command: the fields of the pipeline's Plan (orchestrator/launch/pipeline.py);
    `data`: --push-data's local files (the command's `data:`), or None."""
    refuse_trainer_options(o, own)
    own = effective(own, o.restarts if restarts_given else None, o.stall_timeout)
    if o.push_data and not from_file:
        raise UsageError("--push-data: a command given after `--` names no data — put `data:` in a run file")
    return dict(
        run_file=run if from_file else own.run_name,
        targets=[remote.host],
        train_args=[],
        overrides=o.overrides,
        allow_dirty=o.allow_dirty,
        resume=getattr(o, "resume", "latest"),  # none: its checkpoints and metrics set aside (ownchild.afresh)
        data=data,
        preflight=False,
        force=o.force,
        wait=not o.no_wait,
        follow=o.follow,
        policy=policy(own),
        notify=o.notify,
        command=own,
        command_file=from_file,
        slurm=remote.host.slurm,  # a Slurm host: sbatch, the time limit's SIGTERM, the requeue (enlace/slurm/job.py)
        nproc=own.nproc,
    )
