"""What every enlace-remote command shares: the Remote (repo, host, one session per host), the
global options that may stand after a verb, and the options and output several verbs use."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from enlace import contract
from enlace.clitypes import stop_request
from orchestrator.errors import UsageError


class Remote:
    """What every command needs: the repo, the chosen host, and (lazily) one session with it."""

    def __init__(self, host_name: str, accept_new_host_key: bool):
        from orchestrator.hosts.resolve import resolve_host
        from orchestrator.transfer.gitsync import repo_root

        self.repo = repo_root(Path.cwd())
        self.host = resolve_host(host_name, self.repo)
        self.accept_new = accept_new_host_key
        self._sessions: dict = {}

    @property
    def session(self):
        return self.session_for(self.host)

    def session_for(self, host):
        """One session (one connection) per host for this invocation."""
        if host.name not in self._sessions:
            from orchestrator.ssh.connect import connect
            from orchestrator.ssh.session import Session

            self._sessions[host.name] = Session(connect(host, self.accept_new), self.repo)
        return self._sessions[host.name]

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


def _remember(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value:  # given after the verb: it wins over the one before it (or the environment)
            ctx.obj[key] = value

    return callback


class HostOptionsCommand(click.Command):
    """Every verb also takes the global options after it: `enlace-remote status --host gpu1`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params += [
            click.Option(
                ["--host"],
                metavar="NAME",
                expose_value=False,
                callback=_remember("host"),
                help="The host (as the global --host; may stand after the verb).",
            ),
            click.Option(
                ["--accept-new-host-key"],
                is_flag=True,
                expose_value=False,
                callback=_remember("accept_new_host_key"),
                help="As the global option.",
            ),
        ]


class AfterDashCommand(HostOptionsCommand):
    """Everything after the first `--` is kept as it was typed (click would drop the `--` and leave
    `shell -- CMD` indistinguishable from `shell RUN CMD`): the words are in ctx.meta["after_dash"]."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # (click's parser consumes `args` as it reads them); --name: launch's, for a command given after `--`
        dashed = "--" in args
        named = any("--name" in getattr(p, "opts", ()) for p in self.params) and any(
            a.split("=")[0] == "--name" for a in args
        )
        if dashed:
            i = args.index("--")
            args, ctx.meta["after_dash"] = args[:i], args[i + 1 :]
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:  # `launch --name x python train.py --lr 3`: the `--` left out
            if named and not dashed:  # a command given by --name without `--`: its options were taken for ours
                e.message += f" — a command's own options go after `--`: {ctx.command_path} --name NAME -- COMMAND"
                e.possibilities = None  # (click's "did you mean" names launch's own options: not what was meant)
            raise


class Interrupted(click.ClickException):
    exit_code = contract.INTERRUPTED

    def __init__(self):
        super().__init__("interrupted")

    def show(self, file=None) -> None:
        click.echo("\ninterrupted", err=True)


class HostOptionsGroup(click.Group):
    command_class = HostOptionsCommand

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C in a verb: click said "Aborted!" and exited 1, a failed run's code
            raise Interrupted() from None


def with_remote(fn):
    """Pass the command a Remote for the chosen host (the global options are parsed by then, also when
    given after the verb); its sessions close with click's context."""

    @click.pass_context
    @functools.wraps(fn)
    def wrapper(ctx: click.Context, *args, **kwargs):
        remote = Remote(ctx.obj["host"], ctx.obj["accept_new_host_key"])
        ctx.call_on_close(remote.close)
        return fn(remote, *args, **kwargs)

    return wrapper


allow_dirty_option = click.option("--allow-dirty", is_flag=True, help="Ship HEAD despite uncommitted changes.")


def stepped(rep: dict) -> bool:
    """Whether a stop report tells where the run stands by steps (this launch trained, or a script logged steps),
    not by what its phase says (a command that logs no steps, a run stopped while queued: its step is this
    launch's 0 even where an earlier launch left a checkpoint)."""
    return bool(rep["step"] or not rep.get("phase"))


def not_running_words(rep: dict) -> str:
    """Where a run that was not running stands (a stop's report): its step, or its phase (a command that logs no
    steps: what it did), and its latest checkpoint where one is known."""
    # a dropped run's phase is still its queue's words ("position 1, waiting for …"): it waits for nothing now
    phase = "was queued; its waiter is gone" if rep["status"] == "dropped" else rep["phase"]
    where = f"{rep['status']} at step {rep['step']}" if stepped(rep) else f"{rep['status']} ({phase})"
    if stepped(rep) or rep["latest_checkpoint"]:
        return f"{where}; latest checkpoint {rep['latest_checkpoint'] or 'none'}"
    return where


def stop_words(rep: dict) -> str:
    """Where a stopped run stands, from the server's stop report: its step and checkpoint, or its phase (and a
    checkpoint an earlier launch left)."""
    killed = " (killed)" if rep["killed"] else ""
    if stepped(rep):
        return f"{rep['status']} at step {rep['step']}{killed}; latest checkpoint {rep['latest_checkpoint'] or 'none'}"
    kept = f"; latest checkpoint {rep['latest_checkpoint']}" if rep["latest_checkpoint"] else ""
    return f"{rep['status']}{killed} ({rep['phase']}){kept}"


def refuse_both(run_name: str | None, verb: str, given: str, other: str, instead: str) -> None:
    """A run named beside a flag that names runs of its own (--sweep, --all): it was ignored, exit 0."""
    if not run_name:
        return
    those = "that run" if " " not in run_name else "those runs"
    raise UsageError(
        f"{verb} {run_name} {given}: a run or {other}, not both — `enlace-remote {verb} {run_name}` acts on "
        f"{those}, {instead}"
    )


def server_stop(session, run_name: str, grace: float | None, kill: bool) -> dict:
    """The server's stop of one run (it waits for the checkpoint): its report."""
    args, timeout = stop_request(run_name, grace, kill)
    return session.enlace_json("latest", *args, timeout=timeout, ok_codes=(0, 1))


def ask_to_stop(session, host: str, run_name: str, grace: float | None, kill: bool) -> dict:
    """The server's stop of one run: its report. The server sends SIGTERM before it waits for the checkpoint,
    so a Ctrl-C during that wait leaves the run stopping on its own: say so, and where to look."""
    try:
        return server_stop(session, run_name, grace, kill)
    except KeyboardInterrupt:
        there = f"enlace-remote --host {host}"
        click.echo(
            f"\n{run_name} on {host} may already have been sent SIGTERM (the server sends it before it waits for its"
            f" end); then it ends on its own, enlace's trainer and a script using enlace.job once they have saved a"
            f" checkpoint{', not killed' if kill else ''}. `{there} status {run_name}` says where it stands;"
            f" `{there} stop {run_name}` waits for it again",
            err=True,
        )
        raise
