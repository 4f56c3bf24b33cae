"""`enlace-remote`: drive training on a GPU server over SSH (or on this machine: host `local`).

Thin click commands over the operations layers (launch/, transfer/, view/): each verb lives in
orchestrator/commands/ (run.py, tools.py, data.py, sweep.py) and is added here. Never imports torch.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from enlace import contract
from enlace.clitypes import set_option
from enlace.contract import leave
from enlace.errors import EnlaceError, path_given
from orchestrator.commands import data as cli_data
from orchestrator.commands import init as cli_init
from orchestrator.commands import login as cli_login
from orchestrator.commands import run as cli_run
from orchestrator.commands import sweep as cli_sweep
from orchestrator.commands import tools as cli_tools
from orchestrator.commands.common import (
    HostOptionsGroup,
    Interrupted,
    Remote,
    allow_dirty_option,
    with_remote,
)
from orchestrator.errors import EXIT_CODES_HELP, HOST_ENV, VerifyError


@click.group(
    cls=HostOptionsGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXIT_CODES_HELP,
)
@click.option(
    "--host",
    envvar=HOST_ENV,
    default="local",
    show_default=True,
    metavar="NAME",
    help=f"Where to run: `local`, a name from hosts.yaml, an ~/.ssh/config alias or user@host[:port]. Env: {HOST_ENV}.",
)
@click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust an unknown host's key and add it to known_hosts (a changed key is always refused).",
)
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
    from orchestrator.hosts.resolve import survey_hosts
    from orchestrator.ssh.openssh import logged_in, shares_connection
    from orchestrator.transfer.gitsync import repo_root

    repo = repo_root(Path.cwd())
    usable, unusable = survey_hosts(repo)
    for h in usable:
        mark = "*" if h.name == ctx.obj["host"] else " "
        extra = f", default run {h.default_run}" if h.default_run else ""
        extra += (
            ", scheduler slurm"
            if h.slurm
            else f", queue: {h.cpu_slots} CPU run{'s' if h.cpu_slots != 1 else ''}, GPUs free below {h.gpu_free_below:g}"
        )
        if not h.local:
            extra += f", connection {'shared' if shares_connection(h) else 'direct'}"
            extra += ", logged in" if logged_in(h) else ""
        click.echo(f"{mark} {h.name:16} {h.describe()}, python {h.python}{extra}")
    for name, error in unusable.items():
        click.echo(f"! {name:16} unusable: {error}")
    if unusable:
        ctx.exit(contract.USAGE)


def _not_local(ctx: click.Context, param: click.Parameter, name: str) -> str:
    """`local` is built in (said before a missing --ssh is: it takes none)."""
    if name == "local":
        raise click.BadParameter(
            "`local` is this machine, built in: hosts add does not write it — its keys (remote_dir, cpu_slots, "
            "gpu_free_below, notify) go by hand under `hosts:` / `  local:` in your hosts file (docs/sharing.md)"
        )
    return name


@hosts.command("add")
@click.argument("name", is_eager=True, callback=_not_local)
@click.option("--ssh", "target", required=True, metavar="USER@HOST[:PORT]", help="How to reach it (or an ssh alias).")
@click.option("--remote-dir", default=None, help="Where enlace lives on the server (default ~/enlace).")
@click.option("--python", default=None, help="`venv` (default: built from constraints.txt) or a python with torch.")
@click.option(
    "--pip-arg",
    "pip_args",
    multiple=True,
    metavar="ARG",
    help="Passed to the venv's pip, repeatable: --pip-arg=--index-url --pip-arg=URL.",
)
@click.option("--identity-file", default=None, help="SSH private key (default: ssh-agent / ~/.ssh/id_*).")
@click.option("--default-run", default=None, help="What launch/fetch use without a RUN.")
@click.option(
    "--connection",
    type=click.Choice(["direct", "shared"]),
    default=None,
    help="`shared`: OpenSSH's connection sharing, one `enlace-remote login` per session (docs/hosts.md).",
)
@click.option("--persist", default=None, metavar="DURATION", help="How long a shared connection stays open unused.")
@click.option("--cpu-slots", type=int, default=None, metavar="N", help="The queue: CPU runs at once there (default 1).")
@click.option(
    "--gpu-free-below",
    type=float,
    default=None,
    metavar="FRACTION",
    help="The queue: a GPU whose other processes hold less than this share of its memory is free (default 0.1).",
)
@click.option("--notify", default=None, metavar="URL", help="POSTed to when a run there ends (docs/sweeps.md).")
def hosts_add(
    name: str,
    target: str,
    remote_dir: str | None,
    python: str | None,
    pip_args: tuple[str, ...],
    identity_file: str | None,
    default_run: str | None,
    connection: str | None,
    persist: str | None,
    cpu_slots: int | None,
    gpu_free_below: float | None,
    notify: str | None,
) -> None:
    """Add host NAME to your hosts file (~/.config/enlace/hosts.yaml, or ENLACE_HOSTS_FILE), or update it.

    \b
    enlace-remote hosts add gpu1 --ssh alice@gpu1.example.org
    enlace-remote hosts add gpu1 --ssh alice@gpu1:2222 --remote-dir /scratch/alice/enlace
    enlace-remote hosts add hpc --ssh alice@login.hpc.edu --connection shared   # then: login hpc
    enlace-remote hosts add box --ssh bob@box --cpu-slots 2   # the queue: two CPU runs at once there"""
    import yaml

    from orchestrator.hosts.resolve import add_host

    entry = {
        "ssh": target,
        "remote_dir": remote_dir,
        "python": python,
        "pip_args": list(pip_args),
        "identity_file": identity_file,
        "default_run": default_run,
        "connection": connection,
        "persist": persist,
        "cpu_slots": cpu_slots,
        "gpu_free_below": gpu_free_below,
        "notify": notify,
    }
    path, merged = add_host(name, entry)
    click.echo(f"{path}:\n" + yaml.safe_dump({"hosts": {name: merged}}, sort_keys=False), nl=False)
    first = f"enlace-remote login {name}, then " if merged.get("connection") == "shared" else ""
    click.echo(f"next: {first}enlace-remote --host {name} sync   (or export ENLACE_REMOTE_HOST={name})", err=True)


@main.command()
@allow_dirty_option
@with_remote
def setup(remote: Remote, allow_dirty: bool) -> None:
    """Prepare the host: remote_dir, the bare repo, this commit's tree and the server's python.

    With `python: venv` (the default) the first setup builds a venv there from constraints.txt — on a
    GPU server pip fetches a CUDA wheel of torch (≈2.5 GB), so it takes minutes; pip's progress is
    shown. Every later sync, preflight and launch reuses it. (sync does the same; this says why.)"""
    from orchestrator.transfer.gitsync import print_sync
    from orchestrator.transfer.gitsync import sync as do_sync

    h = remote.host
    why = (
        "a venv built from constraints.txt" + (f" (pip {' '.join(h.pip_args)})" if h.pip_args else "")
        if h.python == "venv"
        else f"the python you named: {h.python}"
    )
    click.echo(f"setup {h.name}: remote_dir {h.remote_dir}; python: {why}", err=True)
    print_sync(do_sync(remote.session, remote.repo, allow_dirty))
    mine = not (remote.repo / "enlace" / "train").is_dir()  # a repository of your own: no trainer to preflight
    click.echo(
        f"{h.name} is ready: next `enlace-remote --host {h.name} {'launch' if mine else 'preflight'} RUN`", err=True
    )


@main.command()
@allow_dirty_option
@with_remote
def sync(remote: Remote, allow_dirty: bool) -> None:
    """Push HEAD to the host and check it out there (refuses a dirty tree or git-ignored files)."""
    from orchestrator.transfer.gitsync import print_sync
    from orchestrator.transfer.gitsync import sync as do_sync

    print_sync(do_sync(remote.session, remote.repo, allow_dirty))


@main.command()
@click.argument("run")
@click.option("--for-launch", is_flag=True, help="Also require every data file the run reads.")
@set_option
@with_remote
def verify(remote: Remote, run: str, for_launch: bool, overrides: tuple[str, ...]) -> None:
    """Check on the server that HEAD's tree has everything RUN needs (a checklist): exit 2 for a config error
    (a wrong key or value, a config its checkpoints cannot resume), 3 for anything missing. With --for-launch,
    data that differs from what the newest checkpoint was trained on is a warning (launch refuses it)."""
    from orchestrator.launch.ship import check_run_config
    from orchestrator.launch.ship import verify as do_verify
    from orchestrator.transfer.gitsync import local_checks, not_in_head

    check_run_config(remote.repo, run)
    checked = local_checks(remote.repo, allow_dirty=True, check_ignored=False)
    if f"configs/runs/{run}.yaml" in not_in_head(checked.dirty):  # (the server said "not found": it is here)
        raise VerifyError(
            f"configs/runs/{run}.yaml is not in HEAD, and verify checks the commit the server gets — commit it"
        )
    do_verify(remote.session, checked.commit, run, for_launch, overrides)


def _as_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt


def run_main() -> None:
    """Console entry point: user errors print one message and exit with their code; Ctrl-C one line, and so do
    a `kill` (SIGTERM) and a closed terminal (SIGHUP): each verb says where it stands (they ended it mid-word)."""
    for name in ("SIGTERM", "SIGHUP"):  # (Windows has no SIGHUP)
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _as_ctrl_c)
    try:
        main(standalone_mode=True)
        code: object = 0
    except SystemExit as e:
        code = e.code
    except EnlaceError as e:  # raised outside click's handling (e.g. during close)
        click.echo(f"Error: {e.format_message()}", err=True)
        code = e.exit_code
    except KeyboardInterrupt:  # e.g. during close: no chained tracebacks, ever
        Interrupted().show()
        code = Interrupted.exit_code
    except OSError as e:  # a path given here it could not make or write (fetch --dest /proc/x, a hosts file's folder)
        said = path_given(e, sys.argv[1:])
        if said is None:
            raise
        click.echo(f"Error: {said.format_message()}", err=True)
        code = said.exit_code
    leave(code)  # every verb has closed its files, processes and connections by now


for module in (
    cli_run,
    cli_tools,
    cli_data,
    cli_sweep,
    cli_login,
    cli_init,
):  # they import nothing from here: `enlace-remote` holds every verb
    for command in module.COMMANDS:
        main.add_command(command)
