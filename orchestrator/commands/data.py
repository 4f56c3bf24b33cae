"""`enlace-remote data push RUN` and `data ls RUN`: the data a run reads, brought to the server by command
(orchestrator/transfer/datapush.py does the work)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import click

from enlace.clitypes import set_option_saying
from orchestrator.commands.common import HostOptionsGroup, Remote, allow_dirty_option, with_remote
from orchestrator.errors import UsageError

# what RUN reads depends on its config: the same --set items its launch gives (data.paths, data.kind, ...)
data_set_option = set_option_saying(
    "A config value as the run's launch sets it (e.g. --set data.paths=data/mine/*.txt): the files RUN reads "
    "with it are the ones listed and pushed. Repeatable."
)

hosts_option = click.option(
    "--hosts",
    metavar="H1,H2,...",
    default=None,
    help="Several hosts at once (in parallel); default: the chosen --host.",
)


@click.group(cls=HostOptionsGroup)
def data() -> None:
    """The files a run reads, on the server: `data ls RUN` compares, `data push RUN` uploads.

    \b
    Put the corpus under data/ here (where RUN's data config points, e.g. data/corpus/), then:
    enlace-remote data push corpus-2060     # <remote_dir>/data/ gets exactly those files, verified
    enlace-remote launch corpus-2060"""


def _targets(remote: Remote, hosts: str | None) -> list:
    from orchestrator.hosts.resolve import resolve_hosts

    if not hosts:
        return [remote.host]
    if not (targets := resolve_hosts(hosts, remote.repo)):
        raise click.BadParameter("name at least one host, e.g. --hosts gpu1,gpu2", param_hint="--hosts")
    return targets


def local_data_of(
    remote: Remote, run: str, overrides: tuple[str, ...], follow_links: bool = False, listed: bool = True
):
    """RUN's data files here (the notes on what is not pushed said on stderr). `listed`: their listing done, and
    what it refuses raised, before this returns (launch: before anything is shipped); otherwise it goes on
    while the caller connects (data push)."""
    from orchestrator.launch.ship import check_run_config
    from orchestrator.transfer.datapush import local_data

    check_run_config(remote.repo, run)
    local = local_data(remote.repo, run, overrides, follow_links)
    for note in local.notes:
        click.echo(f"data: {note}", err=True)
    if listed:
        local.listing.result()
    return local


def _each_host(remote: Remote, targets: list, work, verb: str) -> list:
    """work(session) on every target, in parallel when there are several; one host's failure is its
    own line, and the command (`verb`: push, ls) fails after all have finished."""
    sessions = [remote.session_for(h) for h in targets]
    if len(sessions) == 1:
        return [work(sessions[0])]
    results, failed = [], []
    with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
        futures = [(s, pool.submit(work, s)) for s in sessions]
        for session, future in futures:
            try:
                results.append(future.result())
            except click.ClickException as e:
                failed.append(f"{session.host.name}: {e.format_message()}")
    if failed:
        raise UsageError(f"data {verb} failed on " + "; ".join(failed))
    return results


@data.command()
@click.argument("run")
@click.option("--dry-run", is_flag=True, help="Say what would be sent (and deleted); send nothing.")
@click.option(
    "--delete",
    is_flag=True,
    help="Also delete server files that RUN's data paths match but this machine lacks (nothing else is ever deleted).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Change files that a live run reads (refused by default: its restarts would then refuse the data; "
    "they will need launch --allow-data-change, which status and its train.log say).",
)
@click.option(
    "--follow-links",
    is_flag=True,
    help="Send what a link that leads outside data/ points to (refused by default, naming the link).",
)
@hosts_option
@data_set_option
@allow_dirty_option
@with_remote
def push(
    remote: Remote,
    run: str,
    dry_run: bool,
    delete: bool,
    force: bool,
    follow_links: bool,
    hosts: str | None,
    overrides: tuple[str, ...],
    allow_dirty: bool,
) -> None:
    """Bring <remote_dir>/data/ on the server to the files RUN reads here, verified.

    RUN's data paths are resolved from its config as the trainer resolves them. What is missing or
    different on the server is sent (size and mtime first, then sha256 where only the mtime differs);
    each file is checked by sha256 as it arrives and renamed into place whole, so a running job never
    reads half a file. Interrupted (Ctrl-C, a dropped connection): run it again, it continues."""
    from orchestrator.transfer.datapush import push as push_to

    local = local_data_of(remote, run, overrides, follow_links, listed=False)  # listed while the server starts
    if not local.globs:
        click.echo(f"data push {run}: nothing to push (it reads no file under data/)", err=True)
        return

    def work(session) -> None:
        plan = push_to(session, remote.repo, local, delete, dry_run, force, allow_dirty)
        if dry_run:
            for rel, offset, size, _ in plan.send[:20]:
                click.echo(f"  send {rel} ({size - offset} bytes)", err=True)
            for rel in plan.delete[:20]:
                click.echo(f"  delete {rel}", err=True)

    _each_host(remote, _targets(remote, hosts), work, "push")


@data.command("ls")
@click.argument("run")
@click.option("--follow-links", is_flag=True, help="Count what a link leading outside data/ points to (as push's).")
@hosts_option
@data_set_option
@allow_dirty_option
@with_remote
def ls(
    remote: Remote, run: str, follow_links: bool, hosts: str | None, overrides: tuple[str, ...], allow_dirty: bool
) -> None:
    """What RUN reads, here and on the server: files, bytes, and whether the server is up to date."""
    from orchestrator.transfer.datapush import converse, synced_first
    from orchestrator.transfer.wire import human_bytes

    local = local_data_of(remote, run, overrides, follow_links)
    click.echo(f"here: {len(local.files)} files, {human_bytes(local.bytes)} ({', '.join(local.globs) or 'none'})")
    if not local.files:
        return

    def work(session) -> None:
        answer, plan, _ = synced_first(session, remote.repo, lambda: converse(session, local, push=False), allow_dirty)
        extra = answer["extra"]
        state = "up to date" if not plan.send else f"{len(plan.send)} to send ({human_bytes(plan.bytes)})"
        more = f", {len(extra)} more there that this machine lacks" if extra else ""
        click.echo(f"{session.host.name}: {plan.same} of {len(local.files)} files match, {state}{more}")
        for rel, _, _, _ in plan.send[:20]:
            click.echo(f"  missing or different: {rel}")
        for rel, _ in sorted(extra)[:20]:  # (push --delete removes them)
            click.echo(f"  there, not here: {rel}")

    _each_host(remote, _targets(remote, hosts), work, "ls")


COMMANDS = (data,)
