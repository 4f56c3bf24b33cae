"""launch's options turned into the pipeline's Plan (orchestrator/launch/pipeline.py), in this one place: for
enlace's trainer (a run file, or an existing run's name: resumed, extended, on its kept placement) and for a
command of your own."""

from __future__ import annotations

from types import SimpleNamespace

import click

from orchestrator.commands.common import Remote
from orchestrator.commands.data import local_data_of
from orchestrator.hosts.resolve import resolve_hosts
from orchestrator.launch import choose, own, pipeline, ship
from orchestrator.launch.slurm import nproc_of, print_script, slurm_options
from orchestrator.transfer.gitsync import local_checks


def command_plan(remote: Remote, run: str, command, from_file: bool, o: SimpleNamespace, overrides, restarts_given):
    """The pipeline's Plan for your own command (`from_file`: RUN's run file, else given after `--`), with these
    --set items (launch's own, or a recorded run's with them)."""
    data = local_data_of(remote, run, overrides) if o.push_data and from_file else None
    given = SimpleNamespace(**{**vars(o), "overrides": overrides})
    return pipeline.Plan(**own.plan_fields(remote, run, command, from_file, given, restarts_given, data))


def plan(remote: Remote, run: str | None, o: SimpleNamespace, restarts_given: bool = False, given=frozenset()):
    """launch's options turned into the pipeline's Plan, in this one place (None: --print said it all). `given`:
    those on the command line (a run launched again keeps the rest of its placement: choose.kept_placement)."""
    name, overrides = run, o.overrides
    if o.print_only:  # touches nothing: the run file as named (of enlace's trainer: a command's is refused)
        run = ship.check_run_config(remote.repo, name)
        if (mine := own.command_of(remote.repo, run, None, None, overrides)) is not None:
            own.refuse_trainer_options(o, mine)
    else:  # a run file, or an existing run's name (resumed, or extended with --set training.max_steps=M)
        run, overrides = choose.launch_target(remote.session, remote.repo, name, overrides, o.resume == "none")
        run = ship.check_run_config(remote.repo, run)
        mine = own.command_of(remote.repo, run, None, None, overrides)  # a run of a command's file (a sweep's point)
        if mine is not None:
            return command_plan(remote, run, mine, True, o, overrides, restarts_given)
    # on as many processes and hosts as it was launched on (resumed, or started over with --resume none)
    name = ship.local_run_name(remote.repo, run, overrides)
    o = SimpleNamespace(**{**vars(o), **choose.kept_placement(remote.repo, remote.host.name, name, o, given)})
    slurm_wanted = o.slurm or o.print_only or o.nodes or remote.host.slurm
    spec = slurm_options(remote, o.slurm, o.print_only, o.nodes, o.hosts, o.gpus) if slurm_wanted else None
    train_args = (
        (["--until", str(o.until)] if o.until else [])
        + (["--resume", o.resume] if o.resume != "latest" else [])
        + (["--allow-data-change"] if o.allow_data_change else [])
        + (["--allow-teacher-change"] if o.allow_teacher_change else [])
        + ship.set_args(overrides)
    )
    nproc = nproc_of(o.gpus, spec)
    if o.print_only:
        commit = local_checks(remote.repo, allow_dirty=True, check_ignored=False).commit
        click.echo(print_script(spec, remote.host, remote.repo, commit, run, name, nproc, train_args))
        return None
    if spec and o.notify:
        raise click.UsageError("--notify: a Slurm run does not notify yet (docs/sweeps.md says what does)")
    hosts = o.hosts
    targets = resolve_hosts(hosts, remote.repo) or [remote.host]
    if hosts and (len(targets) < 2 or not o.gpus):
        raise click.UsageError("--hosts needs at least two hosts and --gpus N")
    policy = ["--restarts", str(0 if hosts else o.restarts)]  # one host's trainer alone would wait for its peers
    policy += ["--stall-timeout", str(o.stall_timeout)] if o.stall_timeout else []
    return pipeline.Plan(
        run_file=run,
        targets=targets,
        train_args=train_args,
        overrides=overrides,
        allow_dirty=o.allow_dirty,
        resume=o.resume,
        until=o.until,
        allow_data_change=o.allow_data_change,
        data=local_data_of(remote, run, overrides) if o.push_data else None,
        preflight=not o.no_preflight,
        force=o.force,
        wait=not o.no_wait,
        follow=o.follow,
        gpus=o.gpus,
        nproc=nproc,
        master_port=o.master_port,
        policy=policy,
        slurm=spec,
        notify=o.notify,
        placement=choose.placement_of(o),
    )
