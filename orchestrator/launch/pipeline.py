"""`enlace-remote launch` as one ordered pipeline of stages, run by `run(plan)` over a backend:

    ship       sync HEAD (with --push-data, the run's data too) and verify it on every host → commit, run name
    decide     refuse a live run (its preflight would compete with it); a finished run is said, not relaunched
    preflight  measure on the server (on a Slurm host, as a short job on a compute node); a bad verdict stops
    start      the backend starts the trainer: detached under its supervisor, in the host's queue (SSH), or as
               an sbatch job (Slurm)
    wait       until the trainer logs its first step (a pending Slurm job says why it waits; a queued run
               says its place in the queue, and the launch returns)
    follow     the log until the run ends (--follow)

The click command parses options into a Plan; `stages_for(plan)` says which stages it runs (--no-preflight,
--no-wait and --follow change the list) and `backend_for(plan)` on what. A plain SSH host and the `local`
host are the SSH backend (the local one over a local transport); a `scheduler: slurm` host is the Slurm one.
Stopping, a run's state and its log are the server's verbs on either backend (the server knows a Slurm job).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from enlace.config.command import CommandRun
from enlace.contract import VERDICT, ErrorKind, trainer_args
from enlace.errors import EnlaceError
from enlace.names import RunFile, RunName
from enlace.slurm.settings import SlurmSpec
from orchestrator.errors import UsageError, VerifyError
from orchestrator.launch import choose, ship, stages
from orchestrator.launch import own as own_launch
from orchestrator.launch.slurm import no_gpu_asked, submit
from orchestrator.view.logs import follow_log

STOP = object()  # a stage's answer when the launch ends there (nothing more to do)


class PreflightRefused(EnlaceError):
    """Preflight's verdict says not to launch (exit code: the verdict's)."""

    def __init__(self, verdict: str):
        super().__init__(f"launch aborted: preflight verdict {verdict} (use --force to launch anyway)")
        self.exit_code = VERDICT[verdict]


@dataclass
class Plan:
    """What one `launch` will do, from its options."""

    run_file: RunFile  # what the trainer loads: configs/runs/RUN_FILE.yaml (the run's name may differ)
    targets: list  # hosts: one, or several for one run across hosts (--hosts: one torchrun each)
    train_args: list[str]  # passed to `enlace train` (--until, --resume, --set ...)
    overrides: tuple[str, ...] = ()
    allow_dirty: bool = False
    resume: str = "latest"  # launch's --resume (also in train_args): latest, none or a checkpoint's PATH
    until: int | None = None  # launch's --until (also in train_args): the step this start stops at
    allow_data_change: bool = False  # --allow-data-change (the trainer's, in train_args; --push-data asks it too)
    data: Any = None  # --push-data: the run's local data files (orchestrator/transfer/datapush.py)
    preflight: bool = True
    force: bool = False
    wait: bool = True
    follow: bool = False
    gpus: str | None = None  # processes per host: --gpus N|all (SSH)
    nproc: int | str | None = None  # processes per node (Slurm: the host's gpus_per_node by default)
    master_port: int = 29500
    placement: dict = field(default_factory=dict)  # what `launch NAME` keeps of --gpus/--hosts/--nodes (choose.py)
    policy: list[str] = field(default_factory=list)  # the supervisor's: --restarts, --stall-timeout
    notify: str | None = None  # launch --notify: POSTed to when the run ends (else the host's `notify`)
    slurm: SlurmSpec | None = None
    command: CommandRun | None = None  # the user's own command (orchestrator/launch/own.py), not enlace's trainer
    command_file: bool = False  # it comes from a run file (else from launch's `-- ARGV`)
    on_start: Callable[[], None] | None = None  # once the run has started (before wait and follow)

    @property
    def fresh(self) -> bool:  # --resume none
        return self.resume == "none"

    @property
    def elsewhere(self) -> bool:  # --resume PATH: that checkpoint is checked against the config, not the run's line
        return self.resume not in ("latest", "none")

    @property
    def world(self) -> int | None:  # the processes that train (their checkpoints record it); None: the host says
        per = self.nproc if self.slurm else self.gpus or "1"  # SSH: --gpus per host, one process without it
        if not str(per).isdigit():  # --gpus all: as many as the host has
            return None
        return int(per) * (self.slurm.nodes if self.slurm else len(self.targets))

    @property
    def allow_teacher_change(self) -> bool:  # the trainer's flag, in train_args: verify's resume check heeds it too
        return "--allow-teacher-change" in self.train_args


@dataclass
class Launch:
    """What the stages found so far."""

    plan: Plan
    session_for: Callable
    repo: Path
    backend: Backend
    sha: str = ""
    run_name: RunName | None = None  # what the server calls the run (ship learns it from verify)
    device: str | None = None  # its runtime.device (from verify): what it queues for on the host
    resume_refused: str | None = None  # its data or teacher is not its checkpoint's (verify): refused if it trains
    started: dict | None = None
    remembered: list[tuple[str, dict | None]] = field(default_factory=list)  # (host, what was remembered before)

    @property
    def first(self):
        return self.session_for(self.plan.targets[0])


class Backend:
    """Where the trainer runs: `start` is the backend's own. A run's state, its stop and its log are the
    server's verbs on either backend (a Slurm run's row carries its job; its stop cancels the job)."""

    name = "backend"

    def start(self, launch: Launch) -> dict:
        raise NotImplementedError


class SSHBackend(Backend):
    """A plain host (or `local`): `enlace start` detaches the trainer under its supervisor; with several
    hosts, one torchrun each, rendezvousing at the first."""

    name = "ssh"

    def start(self, launch: Launch) -> dict:
        plan, started = launch.plan, None
        many = len(plan.targets) > 1
        for rank, host in enumerate(plan.targets):
            rdzv = None
            if many:
                addr = plan.targets[0].hostname or "127.0.0.1"
                rdzv = {"nnodes": len(plan.targets), "node_rank": rank, "addr": addr, "port": plan.master_port}
            command = stages.train_command(plan.run_file, plan.train_args, plan.gpus, rdzv) if not plan.command else []
            own = own_launch.spec_args(plan.command, plan.fresh) if plan.command else []
            procs = str(plan.command.nproc) if plan.command and plan.command.nproc > 1 else plan.gpus
            # one run across hosts starts on every host at once: a queue per host could start half of it
            queue = [] if many else [*stages.queue_args(host, launch.device, procs), *own]
            ends = stages.run_end_args(host, plan.notify) if rank == 0 else []
            session = launch.session_for(host)
            doc = stages.start_detached(session, launch.sha, launch.run_name, command, [*plan.policy, *queue, *ends])
            started = started or doc
            before = choose.remember_run(
                launch.repo, host.name, launch.run_name, plan.run_file, plan.overrides, plan.placement
            )
            launch.remembered.append((host.name, before))
        return started


class SlurmBackend(Backend):
    """A `scheduler: slurm` host: sbatch on its login node; the job checkpoints and requeues itself."""

    name = "slurm"

    def start(self, launch: Launch) -> dict:
        plan = launch.plan
        if plan.command and plan.command.nproc > 1:
            raise UsageError(f"{plan.command.run_name}: nproc > 1 on a Slurm host is not supported yet")
        pyargs = trainer_args(plan.run_file, plan.train_args) if not plan.command else []
        own = own_launch.spec_args(plan.command, plan.fresh) if plan.command else []
        started = submit(launch.first, launch.sha, launch.run_name, plan.slurm, plan.nproc or 1, pyargs, own)
        host = plan.targets[0].name
        before = choose.remember_run(launch.repo, host, launch.run_name, plan.run_file, plan.overrides, plan.placement)
        launch.remembered.append((host, before))
        return started


def backend_for(plan: Plan) -> Backend:
    return SlurmBackend() if plan.slurm else SSHBackend()


# -- the stages ---------------------------------------------------------------------------------------


def _ship(launch: Launch):
    plan = launch.plan
    for host in plan.targets:  # HEAD synced and verified (its HEAD == ours) on every host before anything starts
        if len(plan.targets) > 1:
            click.echo(f"== {host.name}", err=True)
        if plan.command:
            own_launch.check_tracked(launch.repo, plan.command)
        # rank 0's host resumes the run: its checkpoint checked against --resume PATH and the processes it would take
        resumes = host is plan.targets[0]
        extra = (own_launch.spec_args(plan.command) if plan.command and not plan.command_file else []) + (
            ["--resume-at", plan.resume] if plan.elsewhere and resumes else []
        )
        extra += ["--world", str(plan.world)] if plan.world and not plan.command and resumes else []
        shipped = ship.ship(
            launch.session_for(host),
            launch.repo,
            plan.run_file,
            plan.allow_dirty,
            True,
            plan.overrides,
            fresh=plan.fresh,
            elsewhere=plan.elsewhere,
            data=plan.data,
            allow_data_change=plan.allow_data_change,
            allow_teacher_change=plan.allow_teacher_change,
            extra=extra,
        )
        launch.sha, launch.run_name, launch.device = shipped[:3]
        if resumes:
            launch.resume_refused = shipped.resume_refused
    if plan.command:
        own_launch.say_no_preflight(plan.command)


def _decide(launch: Launch):
    plan = launch.plan
    # --resume none or PATH starts where it says, finished or not (seen: a finished run ignored --resume PATH)
    again = plan.fresh or plan.elsewhere
    worth = stages.worth_launching(launch.first, launch.run_name, plan.overrides, bool(plan.command), again, plan.until)
    if worth and launch.resume_refused:  # it would train, and its resume would refuse: said before it queues
        raise UsageError(f"{launch.run_name} on {plan.targets[0].name}: {launch.resume_refused}")
    if worth and plan.slurm and (why := no_gpu_asked(plan.slurm, plan.targets[0].name, launch.run_name, launch.device)):
        raise VerifyError(why)  # a plain host without a GPU refuses it at verify: the same exit, before it queues
    return None if worth else STOP


def _preflight(launch: Launch):
    plan = launch.plan
    resume = ["--resume", plan.resume] if plan.resume != "latest" else []  # projected from where the trainer starts
    extra = ["--steps", "5", *resume, *ship.set_args(plan.overrides)]
    device = launch.device if len(plan.targets) == 1 else None  # across hosts: no queue (see SSHBackend)
    if plan.gpus and device is not None:  # a need the host can never meet (--gpus all on a CPU host), said before
        # it measures: the queue's refusal is what is asked for here, not its answer (the room it has)
        launch.first.enlace_json(launch.sha, "queue-free", *stages.queue_args(launch.first.host, device, plan.gpus))
    try:
        report = stages.remote_preflight(
            launch.first, launch.sha, plan.run_file, launch.repo, launch.run_name, extra, device
        )
    except EnlaceError as e:
        if e.kind != ErrorKind.QUEUE_BUSY:
            raise
        again = shlex.join(["--host", launch.first.host.name, "preflight", plan.run_file, *extra[2:]])  # as launched
        click.echo(
            f"preflight skipped: {e.message} — it would measure beside another run; the run queues unmeasured "
            f"(`enlace-remote {again}` measures it once the host has room)",
            err=True,
        )
        return None
    if report["verdict"] in VERDICT and not plan.force:
        raise PreflightRefused(report["verdict"])


def _start(launch: Launch):
    launch.started = launch.backend.start(launch)
    if launch.plan.on_start is not None:
        launch.plan.on_start()


def _wait(launch: Launch):
    try:
        plan = launch.plan
        as_file = (plan.run_file, plan.overrides) if plan.command and plan.command_file else None
        stages.wait_first_step(
            launch.first, launch.run_name, launch.started, plan.follow, fresh=plan.fresh, launched_as=as_file
        )
    except EnlaceError as e:  # its first start ended badly: what it was launched with is not what the run is
        for host, before in launch.remembered if getattr(e, "run_ended", False) else ():
            choose.forget_launch(launch.repo, host, launch.run_name, before)
        raise


def _follow(launch: Launch):
    code = follow_log(launch.first, launch.run_name, launch.started["log_offset"], follow=True)
    raise SystemExit(code)


STAGES: dict[str, Callable[[Launch], Any]] = {
    "ship": _ship,
    "decide": _decide,
    "preflight": _preflight,
    "start": _start,
    "wait": _wait,
    "follow": _follow,
}


def stages_for(plan: Plan) -> list[str]:
    """The stages `plan` runs, in order."""
    skip = {"preflight": not plan.preflight or bool(plan.command), "wait": not plan.wait}
    skip["follow"] = not (plan.wait and plan.follow)
    return [name for name in STAGES if not skip.get(name, False)]


def _say_where_it_stands(launch: Launch, stage: str) -> None:
    """After a Ctrl-C: whether the run was started (it goes on), may have been (its start was under way), or not.
    A run across hosts starts host by host (launch.remembered): those it started on are named."""
    name, hosts = launch.run_name or launch.plan.run_file, [t.name for t in launch.plan.targets]
    there, done = f"enlace-remote --host {hosts[0]}", [host for host, _ in launch.remembered]
    if launch.started is not None:
        said = f"{name} was started on {', '.join(hosts)} and goes on: `{there} logs {name} -f` follows it"
        click.echo(f"{said}, `{there} stop {name}` ends it", err=True)
    elif stage == "start" and done:  # its torchrun on those hosts waits for the others to join
        rest = hosts[len(done) :]  # (empty: the Ctrl-C came after the last host's start, before it was noted)
        said = f"{name} was started on {', '.join(done)}"
        said += f" and may have started on {rest[0]}" if rest else ""
        said += f", not on {', '.join(rest[1:])}" if rest[1:] else ""
        click.echo(f"{said}: `{there} stop {name}` ends it", err=True)
    elif stage == "start":
        click.echo(f"{name} may have started on {hosts[0]}: `{there} status {name}` says", err=True)
    else:
        click.echo(f"nothing was started ({stage} was under way)", err=True)


def run(plan: Plan, session_for: Callable, repo: Path) -> Launch:
    """Run the plan's stages in order; a stage that answers STOP ends the launch there."""
    launch, stage = Launch(plan, session_for, repo, backend_for(plan)), ""
    try:
        for stage in stages_for(plan):
            if STAGES[stage](launch) is STOP:
                break
    except KeyboardInterrupt:  # Ctrl-C stops this command, never a run it started: say which it is
        _say_where_it_stands(launch, stage)
        raise
    if not plan.wait and launch.started is not None:
        there, name = f"enlace-remote --host {launch.first.host.name}", launch.run_name  # seen: without --host
        click.echo(f"not waiting: `{there} status {name}` or `{there} logs {name} -f`", err=True)  # the default's
    return launch
