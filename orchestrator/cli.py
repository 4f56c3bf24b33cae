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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
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


@main.command()
@click.pass_obj
def hosts(obj: dict) -> None:
    """List the configured hosts and their settings."""
    from orchestrator.gitsync import repo_root
    from orchestrator.hosts import list_hosts

    for h in list_hosts(repo_root(Path.cwd())):
        mark = "*" if h.name == obj["host"] else " "
        extra = f", default run {h.default_run}" if h.default_run else ""
        click.echo(f"{mark} {h.name:16} {h.describe()}, python {h.python}{extra}")


def _print_sync(rep) -> None:
    if rep.dirty:
        click.echo(f"warning: --allow-dirty: {len(rep.dirty)} uncommitted change(s) NOT shipped; "
                   f"the server gets HEAD {rep.commit[:12]}", err=True)  # fmt: skip
    sent = "pushed and checked out" if rep.pushed else "already on the server"
    click.echo(f"sync: {rep.commit[:12]} {sent} ({rep.tree}) in {rep.seconds:.2f}s", err=True)


@main.command()
@click.option("--allow-dirty", is_flag=True, help="Ship HEAD even though the working tree has uncommitted changes.")
@click.option("--unsafe-skip-ignore-check", is_flag=True, hidden=True,
              help="Testing only: skip the local check for git-ignored files (the server check still runs).")
@with_context
def sync(ctx: Context, allow_dirty: bool, unsafe_skip_ignore_check: bool) -> None:
    """Push HEAD to the host and check it out there (refuses a dirty tree or git-ignored files)."""
    from orchestrator.gitsync import sync as do_sync

    _print_sync(do_sync(ctx.session, ctx.repo, allow_dirty, not unsafe_skip_ignore_check))


@main.command()
@click.argument("run")
@click.option("--for-launch", is_flag=True, help="Also require every data file the run reads.")
@with_context
def verify(ctx: Context, run: str, for_launch: bool) -> None:
    """Check on the server that HEAD's tree has everything RUN needs (a checklist; exit 3 if not)."""
    from orchestrator.gitsync import local_checks
    from orchestrator.ops import verify as do_verify
    from orchestrator.session import check_run_name

    check_run_name(run)
    sha = local_checks(ctx.repo, allow_dirty=True, check_ignored=False).commit
    do_verify(ctx.session, sha, run, for_launch)


def run_main() -> None:
    """Console entry point: user errors print one message and exit with their code."""
    try:
        main(standalone_mode=True)
    except RemoteError as e:  # raised outside click's handling (e.g. during close)
        click.echo(f"Error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)


from orchestrator import cli_run  # noqa: E402,F401  (registers preflight/launch/status/stop/logs/fetch)
