"""`enlace-remote`: drive training on a GPU server over SSH (or on this machine: host `local`).

Thin click commands over gitsync / ops / logs / fetch. Never imports torch.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from orchestrator.errors import EXIT_CODES_HELP, RemoteError

HOST_ENV = "ENLACE_REMOTE_HOST"


class Context:
    """What every command needs: the repo, the chosen host, and (lazily) one session with it."""

    def __init__(self, host_name: str, accept_new_host_key: bool):
        from orchestrator.gitsync import repo_root
        from orchestrator.hosts import resolve_host

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
            from orchestrator.session import Session
            from orchestrator.transport import connect

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
            click.Option(["--host"], metavar="NAME", expose_value=False, callback=_remember("host"),
                         help="The host (as the global --host; may stand after the verb)."),
            click.Option(["--accept-new-host-key"], is_flag=True, expose_value=False,
                         callback=_remember("accept_new_host_key"), help="As the global option."),
        ]  # fmt: skip


class HostOptionsGroup(click.Group):
    command_class = HostOptionsCommand


def with_context(fn):
    @click.pass_obj
    @functools.wraps(fn)
    def wrapper(obj: dict, *args, **kwargs):
        ctx = Context(obj["host"], obj["accept_new_host_key"])
        try:
            return fn(ctx, *args, **kwargs)
        finally:
            ctx.close()

    return wrapper


@click.group(cls=HostOptionsGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES_HELP)  # fmt: skip
@click.option("--host", envvar=HOST_ENV, default="local", show_default=True, metavar="NAME",
              help=f"Where to run: `local`, a name from hosts.yaml, an ~/.ssh/config alias or user@host[:port]. "
                   f"Env: {HOST_ENV}.")  # fmt: skip
@click.option("--accept-new-host-key", is_flag=True,
              help="Trust an unknown host's key and add it to known_hosts (a changed key is always refused).")
@click.pass_context
def main(ctx: click.Context, host: str, accept_new_host_key: bool) -> None:
    """Ship this repo to a GPU server with git, check what arrived, preflight, train detached,
    stream the log and fetch checkpoints.

    \b
    enlace-remote preflight smoke-2060      # sync, verify, preflight on the server
    enlace-remote launch                    # ... then train detached (the host's default run)
    enlace-remote logs smoke-2060 -f        # follow the log until the run ends
    enlace-remote fetch                     # pull its checkpoints back, verified

    \b
    Hosts: configs/hosts.yaml (repo defaults) and ~/.config/enlace/hosts.yaml (yours;
    ENLACE_HOSTS_FILE overrides). `enlace-remote hosts` lists them."""
    ctx.obj = {"host": host, "accept_new_host_key": accept_new_host_key}


@main.group(invoke_without_command=True)
@click.pass_context
def hosts(ctx: click.Context) -> None:
    """List the configured hosts and their settings (`hosts add` adds one)."""
    if ctx.invoked_subcommand:
        return
    from orchestrator.gitsync import repo_root
    from orchestrator.hosts import list_hosts

    for h in list_hosts(repo_root(Path.cwd())):
        mark = "*" if h.name == ctx.obj["host"] else " "
        extra = f", default run {h.default_run}" if h.default_run else ""
        click.echo(f"{mark} {h.name:16} {h.describe()}, python {h.python}{extra}")


@hosts.command("add")
@click.argument("name")
@click.option("--ssh", "target", required=True, metavar="USER@HOST[:PORT]", help="How to reach it (or an ssh alias).")
@click.option("--remote-dir", default=None, help="Where enlace lives on the server (default ~/enlace).")
@click.option("--python", default=None, help="`venv` (default: built from constraints.txt) or a python with torch.")
@click.option("--pip-arg", "pip_args", multiple=True, metavar="ARG",
              help="Passed to the venv's pip, repeatable: --pip-arg=--index-url --pip-arg=URL.")
@click.option("--identity-file", default=None, help="SSH private key (default: ssh-agent / ~/.ssh/id_*).")
@click.option("--default-run", default=None, help="What launch/fetch use without a RUN.")
def hosts_add(name: str, target: str, remote_dir: str | None, python: str | None, pip_args: tuple[str, ...],
              identity_file: str | None, default_run: str | None) -> None:  # fmt: skip
    """Add host NAME to your hosts file (~/.config/enlace/hosts.yaml, or ENLACE_HOSTS_FILE), or update it.

    \b
    enlace-remote hosts add gpu1 --ssh alice@gpu1.example.org
    enlace-remote hosts add gpu1 --ssh alice@gpu1:2222 --remote-dir /scratch/alice/enlace"""
    import yaml

    from orchestrator.hosts import add_host

    entry = {"ssh": target, "remote_dir": remote_dir, "python": python, "pip_args": list(pip_args),
             "identity_file": identity_file, "default_run": default_run}  # fmt: skip
    path, merged = add_host(name, entry)
    click.echo(f"{path}:\n" + yaml.safe_dump({"hosts": {name: merged}}, sort_keys=False), nl=False)
    click.echo(f"next: enlace-remote --host {name} sync   (or export ENLACE_REMOTE_HOST={name})", err=True)


def _print_sync(rep) -> None:
    if rep.dirty:
        click.echo(f"warning: --allow-dirty: {len(rep.dirty)} uncommitted change(s) NOT shipped; "
                   f"the server gets HEAD {rep.commit[:12]}", err=True)  # fmt: skip
    sent = "pushed and checked out" if rep.pushed else "already on the server"
    click.echo(f"sync: {rep.commit[:12]} {sent} ({rep.tree}) in {rep.seconds:.2f}s", err=True)


@main.command()
@click.option("--allow-dirty", is_flag=True, help="Ship HEAD even though the working tree has uncommitted changes.")
@with_context
def setup(ctx: Context, allow_dirty: bool) -> None:
    """Prepare the host: remote_dir, the bare repo, this commit's tree and the server's python.

    With `python: venv` (the default) the first setup builds a venv there from constraints.txt — on a
    GPU server pip fetches a CUDA wheel of torch (≈2.5 GB), so it takes minutes; pip's progress is
    shown. Every later sync, preflight and launch reuses it. (sync does the same; this says why.)"""
    from orchestrator.gitsync import sync as do_sync

    h = ctx.host
    why = ("a venv built from constraints.txt" + (f" (pip {' '.join(h.pip_args)})" if h.pip_args else "")
           if h.python == "venv" else f"the python you named: {h.python}")  # fmt: skip
    click.echo(f"setup {h.name}: remote_dir {h.remote_dir}; python: {why}", err=True)
    _print_sync(do_sync(ctx.session, ctx.repo, allow_dirty))
    click.echo(f"{h.name} is ready: next `enlace-remote --host {h.name} preflight RUN`", err=True)


@main.command()
@click.option("--allow-dirty", is_flag=True, help="Ship HEAD even though the working tree has uncommitted changes.")
@click.option("--unsafe-skip-ignore-check", is_flag=True, hidden=True,
              help="Testing only: skip the local check for git-ignored files (the server check still runs).")
@with_context
def sync(ctx: Context, allow_dirty: bool, unsafe_skip_ignore_check: bool) -> None:
    """Push HEAD to the host and check it out there (refuses a dirty tree or git-ignored files)."""
    from orchestrator.gitsync import sync as do_sync

    _print_sync(do_sync(ctx.session, ctx.repo, allow_dirty, not unsafe_skip_ignore_check))


set_option = click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
    help="Override one config value on the server (as `enlace --set`), e.g. --set training.max_steps=50; recorded "
         "in the run's frozen config.yaml and run.json. Repeatable.")  # fmt: skip


@main.command()
@click.argument("run")
@click.option("--for-launch", is_flag=True, help="Also require every data file the run reads.")
@set_option
@with_context
def verify(ctx: Context, run: str, for_launch: bool, overrides: tuple[str, ...]) -> None:
    """Check on the server that HEAD's tree has everything RUN needs (a checklist; exit 3 if not)."""
    from orchestrator.gitsync import local_checks
    from orchestrator.ops import check_run_config
    from orchestrator.ops import verify as do_verify

    check_run_config(ctx.repo, run)
    sha = local_checks(ctx.repo, allow_dirty=True, check_ignored=False).commit
    do_verify(ctx.session, sha, run, for_launch, overrides)


def run_main() -> None:
    """Console entry point: user errors print one message and exit with their code; Ctrl-C one line."""
    try:
        main(standalone_mode=True)
    except RemoteError as e:  # raised outside click's handling (e.g. during close)
        click.echo(f"Error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # e.g. during close: no chained tracebacks, ever
        click.echo("\ninterrupted", err=True)
        sys.exit(130)


from orchestrator import cli_run, cli_tools  # noqa: E402,F401  (register the run and tool commands)
