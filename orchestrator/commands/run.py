"""enlace-remote's run commands: preflight, launch, status, stop, logs, fetch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import click

from enlace.clitypes import (
    LocalPath,
    Seconds,
    grace_option,
    notify_option,
    resume_option_saying,
    set_option,
    supervisor_options,
)
from enlace.contract import VERDICT as VERDICT_EXIT
from enlace.contract import ErrorKind
from enlace.errors import EnlaceError, shown
from enlace.names import validate_run_name
from orchestrator.commands import sweep as sweeps
from orchestrator.commands.common import (
    AfterDashCommand,
    HostOptionsCommand,
    Remote,
    allow_dirty_option,
    ask_to_stop,
    not_running_words,
    refuse_both,
    stop_words,
    with_remote,
)
from orchestrator.commands.sweep import sweep_option


@click.command(cls=HostOptionsCommand)
@click.argument("run")
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="Measured steps.")
@click.option("--max-batch", is_flag=True, help="Also find the largest batch_size that fits.")
@click.option(
    "--budget-s",
    type=click.FloatRange(min=10),
    default=300.0,
    show_default=True,
    help="Preflight's own time on the server; past it the verdict is too_slow (exit 10).",
)
@allow_dirty_option
@set_option
@resume_option_saying("Project the run's time from where `launch --resume` would start it (none: step 0).")
@with_remote
def preflight(
    remote: Remote,
    run: str,
    steps: int,
    max_batch: bool,
    budget_s: float,
    allow_dirty: bool,
    overrides: tuple[str, ...],
    resume: str,
) -> None:
    """Sync, verify, run `enlace preflight RUN` on the server; show the verdict. RUN is what launch takes: a run
    file, or a run's name (measured with the file and --set items it was launched with).

    Saves the report as runs/RUN_NAME/preflight.json here too. Exit 0 ok/tight, 5 oom, 6 unstable, 10 too
    slow (its steps ran past --budget-s: the report says what the whole run would take). It measures on a GPU
    (or the CPU slot) the host's queue has free, holding it meanwhile; exit 1 when none is free now."""
    from orchestrator.launch import choose, own, ship, stages

    run, overrides = choose.launch_target(remote.session, remote.repo, run, overrides, fresh := resume == "none")
    own.refuse_preflight(remote.repo, run, overrides)
    run = ship.check_run_config(remote.repo, run)
    sha, run_name, device, _ = ship.ship(remote.session, remote.repo, run, allow_dirty, False, overrides, fresh)
    extra = ["--steps", str(steps), "--budget-s", str(budget_s)] + (["--max-batch"] if max_batch else [])
    extra += ship.set_args(overrides) + (["--resume", resume] if resume != "latest" else [])
    try:
        report = stages.remote_preflight(remote.session, sha, run, remote.repo, run_name, extra, device)
    except EnlaceError as e:
        if e.kind == ErrorKind.QUEUE_BUSY:  # it measures on what a run would get, alone
            e.message += " — preflight measures alone on what the run would get: try again once it is free"
        raise
    sys.exit(VERDICT_EXIT.get(report["verdict"], 0))


@click.command(cls=AfterDashCommand)
@click.argument("run", required=False)
@click.option(
    "--name",
    default=None,
    metavar="NAME",
    help="The run's name for your own command given after `--`: launch --name exp1 -- python train.py --lr 3e-4.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Launch although preflight's verdict says not to (oom, unstable, too_slow, no_space): the run starts and "
    "may fail the same way. (A running run is never replaced: stop it first.)",
)
@click.option("--no-preflight", is_flag=True, help="Skip preflight.")
@click.option("--follow", "-f", is_flag=True, help="Continue into `logs -f`.")
@click.option(
    "--until",
    type=click.IntRange(min=1),
    default=None,
    metavar="STEP",
    help="Stop at STEP (checkpointed, status `stopped`); a later launch resumes it from there. enlace's trainer "
    "only: your own command ends when it ends.",
)
@click.option(
    "--gpus",
    default=None,
    metavar="N|all",
    help="Run under torchrun with N processes per host (all: every visible GPU); a later `launch NAME` keeps it.",
)
@click.option(
    "--hosts",
    default=None,
    metavar="H1,H2,...",
    help="One run across several hosts (one torchrun each, rendezvous at H1, which holds rank 0's "
    "log and checkpoints). Needs --gpus.",
)
@click.option(
    "--master-port",
    type=click.IntRange(1024, 65535),
    default=29500,
    show_default=True,
    help="With --hosts: the rendezvous port on the first host.",
)
@click.option(
    "--slurm",
    is_flag=True,
    help="With --print: print the sbatch script for RUN and exit (submit it yourself). A host with "
    "`scheduler: slurm` launches through Slurm anyway.",
)
@click.option("--print", "print_only", is_flag=True, help="With --slurm: only print the script; touch nothing.")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="On a Slurm host: nodes (one torchrun each; default: the host's `nodes`).",
)
@click.option("--no-wait", is_flag=True, help="Return once the run is started (or submitted to Slurm).")
@notify_option("POST a JSON note here when the run ends (default: the host's `notify`).")
@supervisor_options(backoff=False)
@resume_option_saying(
    "Passed to enlace train: the newest complete checkpoint, none (start afresh), or a checkpoint "
    "dir such as checkpoints/step-000040 (when the newest one is corrupt)."
)
@click.option(
    "--allow-data-change",
    is_flag=True,
    help="Passed to enlace train: resume although the server's data differs from the checkpoint's.",
)
@click.option(
    "--allow-teacher-change",
    is_flag=True,
    help="Passed to enlace train (distillation): resume although the teacher checkpoint changed.",
)
@click.option(
    "--push-data",
    is_flag=True,
    help="Before verify: bring the server's data/ to the files RUN reads here (as `enlace-remote data push RUN`).",
)
@allow_dirty_option
@set_option
@click.pass_context
@with_remote
def launch(remote: Remote, ctx: click.Context, run: str | None, **options) -> None:
    """Sync, (push data,) verify --for-launch, preflight, then train RUN detached on the host.

    RUN is a run file (configs/runs/RUN.yaml) or the name of a run on the host: `launch NAME` resumes that
    run from the file and --set items it was launched with, on its --gpus/--hosts/--nodes from this repo (more
    --set items win: `--set training.max_steps=M` extends it). Without RUN: the host's default_run, else the run
    last launched there from this repo. The trainer survives the SSH session; a stopped or finished run resumes
    from its latest checkpoint.
    --gpus N runs `torchrun --standalone --nproc-per-node N`; --hosts a,b runs one torchrun per host.

    On a Slurm host (`scheduler: slurm`): preflight runs as a short job on a compute node, the run
    is an sbatch job (`srun torchrun` for --nodes/--gpus) that checkpoints and requeues itself
    before its time limit; launch shows why it is pending and waits for the first step.

    Your own script: a run file with `command:`, or `launch --name NAME -- python train.py ...` — synced,
    verified, supervised, stopped and fetched the same way (docs/own-script.md)."""
    from orchestrator.commands import plans
    from orchestrator.launch import choose, own, pipeline

    o = SimpleNamespace(**options)
    after = ctx.meta.get("after_dash")
    name = run if after is not None or o.name else choose.choose_run(remote.repo, remote.host, run)  # (--name: said)
    # a run file (of your own command too) goes through plans.plan: `launch NAME` keeps the --set it was launched with
    command = own.command_of(remote.repo, name if after is not None else None, after, o.name, o.overrides)
    by_name = command is None and after is None  # `launch NAME`: perhaps a command the host recorded
    ran_before = own.recorded(remote.session, remote.repo, name, o.overrides) if by_name else None
    command, after = (ran_before, []) if ran_before else (command, after)  # launched again as given after `--`
    given = {key for key in ctx.params if ctx.get_parameter_source(key) == click.core.ParameterSource.COMMANDLINE}
    restarts_given = "restarts" in given
    if command is None:
        plan = plans.plan(remote, name, o, restarts_given, given)
    else:
        plan = plans.command_plan(remote, name, command, after is None, o, o.overrides, restarts_given)
    if plan is None:
        return
    if o.overrides and name:  # a sweep's point launched again with new values: its record follows, once started
        from orchestrator.sweep import record

        plan.on_start = lambda: record.note_launch(remote.repo, remote.host.name, name, o.overrides)
    pipeline.run(plan, remote.session_for, remote.repo)


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@click.option("--all", "everywhere", is_flag=True, help="Every run on every configured host (asked in parallel).")
@sweep_option
@click.option("--json", "as_json", is_flag=True)
@with_remote
def status(remote: Remote, run_name: str | None, everywhere: bool, sweep_name: str | None, as_json: bool) -> None:
    """The host's runs (every run on it, or RUN_NAME's whole row): status, step, loss, val bpb (a script's val
    loss), tokens/s, elapsed over all its starts, ETA, age of the last update, commit. A status is pending (a
    Slurm job waiting), queued (waiting for the host's GPUs or a CPU slot), starting, running, stopping,
    stopped, finished, failed, crashed (its restarts spent, or it vanished without a final status) or dropped
    (queued, and its waiter is gone); `, unsupervised` when its supervisor is gone or frozen (`launch
    RUN_NAME` resumes it under a new supervisor); docs/troubleshooting.md says what to do for each. --all: every host, one table; a host
    that does not answer is a row saying so. --json: the rows as JSON."""
    from orchestrator.hosts.resolve import list_hosts
    from orchestrator.view import status as table

    if sweep_name is not None:  # one table of the sweep's runs, ranked, on whichever hosts they are
        return sweeps.show_status(remote, sweeps.alone(run_name, sweep_name, "status"), as_json)
    if everywhere:
        refuse_both(run_name, "status", "--all", "--all", "`enlace-remote status --all` on every run of every host")
        rows = table.status_everywhere(list_hosts(remote.repo), remote.session_for)
        click.echo(json.dumps(rows, indent=1) if as_json else shown(table.format_status(rows, hosts=True)))
        return
    rows = table.runs_here(remote.session, validate_run_name(run_name, "RUN_NAME") if run_name else None)
    text = table.format_status(rows, full=bool(run_name), host=remote.host.name) if rows else table.NO_RUNS
    click.echo(json.dumps(rows, indent=1) if as_json else shown(text))  # a server's words: no terminal controls


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@grace_option
@click.option("--kill", is_flag=True, help="SIGKILL the run if it has not stopped within --grace.")
@sweep_option
@with_remote
def stop(remote: Remote, run_name: str | None, grace: float | None, kill: bool, sweep_name: str | None) -> None:
    """SIGTERM the run (default: the run last launched there): it finishes its step, saves a checkpoint and
    exits; report the checkpoint. Once only: a second stop waits for the same checkpoint. A queued run leaves
    the queue. --sweep: every queued and running run of the sweep."""
    from orchestrator.launch import choose

    if sweep_name is not None:
        return sweeps.stop_all(remote, sweeps.alone(run_name, sweep_name, "stop"), grace, kill)

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    rep = ask_to_stop(remote.session, remote.host.name, run_name, grace, kill)
    if not rep["was_running"]:
        click.echo(shown(f"{run_name} is not running ({not_running_words(rep)}); nothing to stop"))
        return
    click.echo(shown(f"{run_name}: {stop_words(rep)}"))
    if not rep["stopped"]:
        click.echo(f"still running after {rep['grace_s']:g}s — rerun with --kill to force it", err=True)
        sys.exit(1)


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@click.option("-f", "--follow", is_flag=True, help="Follow until the run ends; exit with its exit status.")
@click.option(
    "--tail", "tail_lines", type=click.IntRange(min=0), default=None, metavar="N", help="Start N lines from the end."
)
@click.option(
    "--read-timeout",
    type=Seconds(),
    default=60.0,
    show_default=True,
    help="Reconnect (from the same byte) when no data arrives for this long.",
)
@with_remote
def logs(remote: Remote, run_name: str, follow: bool, tail_lines: int | None, read_timeout: float) -> None:
    """Print RUN_NAME's train.log (default: the run last launched on the host); -f follows it across
    dropped connections (no line lost or repeated) and exits with the run's exit code."""
    from orchestrator.launch import choose
    from orchestrator.view.logs import follow_log, tail_start

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    remote.session.enlace_json("latest", "runs", run_name)  # a clear error if absent
    offset = tail_start(remote.session, run_name, tail_lines) if tail_lines is not None else 0
    sys.exit(follow_log(remote.session, run_name, offset, follow, read_timeout))


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@click.option("--latest", "which", flag_value="latest", default=True, help="Only the newest checkpoint (default).")
@click.option("--all", "which", flag_value="all", help="Every complete checkpoint.")
@click.option(
    "--dest",
    type=LocalPath(file_okay=False),
    default=None,
    help="Local run directory (default: runs/RUN_NAME in this repo).",
)
@sweep_option
@click.option("--best", is_flag=True, help="With --sweep: only its best run (lowest val bpb; a script's: val loss).")
@with_remote
def fetch(
    remote: Remote, run_name: str | None, which: str, dest: Path | None, sweep_name: str | None, best: bool
) -> None:
    """Pull complete checkpoints (verified against MANIFEST) and run.json, config.yaml,
    metrics.jsonl, train.log. Incremental and resumable, over the one SSH connection (neither rsync
    nor SFTP needed); each file is hashed as it arrives. --sweep: each run of the sweep (--best: its best)."""
    from orchestrator.launch import choose
    from orchestrator.transfer.fetch import fetch as do_fetch
    from orchestrator.transfer.fetch import summary

    if sweep_name is not None:
        return sweeps.fetch_all(remote, sweeps.alone(run_name, sweep_name, "fetch"), best, which == "all")
    if best:
        raise click.UsageError("--best picks a sweep's best run: give it with --sweep [NAME]")

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    rep = do_fetch(remote.session, run_name, dest or remote.repo / "runs" / run_name, which == "all")
    click.echo(summary(run_name, rep))


COMMANDS = (preflight, launch, status, stop, logs, fetch)
