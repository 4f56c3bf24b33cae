"""enlace-remote's login and logout: one authentication per session for a host that asks for more than a
key (orchestrator/ssh/openssh.py does the work)."""

from __future__ import annotations

import click

from orchestrator.commands.common import HostOptionsCommand, Remote, with_remote

host_argument = click.argument("host_name", required=False, metavar="[HOST]")


def _transport(remote: Remote, host_name: str | None, verb: str):
    from orchestrator.errors import UsageError
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.openssh import SharedTransport

    host = resolve_host(host_name, remote.repo) if host_name else remote.host
    if host.local:
        raise UsageError(f"host local is this machine: it needs no login — name an SSH host, e.g. {verb} gpu1")
    return SharedTransport(host, remote.accept_new)


@click.command(cls=HostOptionsCommand)
@host_argument
@click.option(
    "--for",
    "persist",
    default=None,
    metavar="DURATION",
    help="How long the login stays open once unused, e.g. 30m or 8h [default: the host's persist:, else 8h].",
)
@with_remote
def login(remote: Remote, host_name: str | None, persist: str | None) -> None:
    """Log in to HOST once, answering what it asks (a key's passphrase, a password, a one-time code) at
    this terminal; every verb after it rides that connection without asking again — sync, launch,
    logs -f, status, fetch, data push, the board — until it has gone unused for DURATION.

    \b
    enlace-remote login cluster              # asks for the one-time code, once
    enlace-remote --host cluster launch      # no prompt
    enlace-remote logout cluster             # closes it now

    HOST defaults to --host. A verb run without a login (or after it expired) on a host that asks for more
    than a key exits 4 with the line to log in again; it never waits on a hidden prompt."""
    from orchestrator.errors import UsageError
    from orchestrator.hosts.schema import check_duration
    from orchestrator.ssh.openssh import LOGIN_PERSIST
    from orchestrator.ssh.openssh import login as open_login

    transport = _transport(remote, host_name, "login")
    name = transport.host.name
    persist = persist or transport.host.persist or LOGIN_PERSIST
    try:
        check_duration(persist)
    except ValueError as e:
        raise UsageError(f"--for {persist!r}: {e.args[0]} — {e.args[1]}") from None
    if not open_login(transport, persist, lambda line: click.echo(line, err=True)):
        click.echo(f"already logged in to {name} (enlace-remote logout {name} first to log in anew)", err=True)
        return
    click.echo(
        f"logged in to {name}: every verb rides this connection until it has gone unused for {persist} "
        f"(enlace-remote logout {name} ends it now)",
        err=True,
    )


@click.command(cls=HostOptionsCommand)
@host_argument
@with_remote
def logout(remote: Remote, host_name: str | None) -> None:
    """Close HOST's login (the shared connection `login` opened); later verbs there need a new login."""
    transport = _transport(remote, host_name, "logout")
    name = transport.host.name
    closed = transport.close_master()
    click.echo(f"logged out of {name}" if closed else f"no login was open for {name}", err=True)


COMMANDS = (login, logout)
