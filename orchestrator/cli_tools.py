"""enlace-remote's commands for looking at and tidying what was trained: sample, plot, gc, shell."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from enlace.names import validate_run_name
from orchestrator.cliutil import HostOptionsCommand, Remote, with_remote


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@click.option("--prompt", default=None, help="Text to continue.")
@click.option("--bytes", "n_bytes", type=click.IntRange(1, 1_000_000), default=500, show_default=True)
@click.option("--temperature", type=click.FloatRange(0, 10), default=0.8, show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=None)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=1337, show_default=True)
@with_remote
def sample(
    remote: Remote,
    run_name: str | None,
    prompt: str | None,
    n_bytes: int,
    temperature: float,
    top_k: int | None,
    seed: int,
) -> None:
    """Generate text from RUN_NAME's newest checkpoint on the server (on its GPU); print it here."""
    from orchestrator import choose

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    args = ["sample", run_name, "--bytes", str(n_bytes), "--temperature", str(temperature), "--seed", str(seed)]
    args += (["--prompt", prompt] if prompt is not None else []) + (["--top-k", str(top_k)] if top_k else [])
    rep = remote.session.enlace_json("latest", *args, timeout=3600)
    sys.stdout.write(rep["text"] + "\n")
    click.echo(
        f"[{rep['bytes']} bytes at {rep['bytes_per_s']} bytes/s on {remote.host.name} ({rep['device']}), "
        f"step {rep['step']}, seed {seed}]",
        err=True,
    )


@click.command(cls=HostOptionsCommand)
@click.argument("run_names", nargs=-1, metavar="[RUN_NAME...]")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="PNG to write.")
@click.option("--metrics", default="loss,val_bpb,lr,tokens_per_s", show_default=True, help="Comma-separated panels.")
@with_remote
def plot(remote: Remote, run_names: tuple[str, ...], out: Path | None, metrics: str) -> None:
    """Fetch only metrics.jsonl and run.json of each run (incremental) into runs/RUN_NAME here, and draw
    them locally with `enlace plot` (matplotlib; nothing heavy runs on the server)."""
    from enlace.plot import plot as draw
    from orchestrator import choose
    from orchestrator.fetch import fetch_run_files

    names = list(run_names) or [choose.choose_run(remote.repo, remote.host, None, last_first=True)]
    dirs = []
    for name in names:
        validate_run_name(name, "RUN")
        dirs.append(remote.repo / "runs" / name)
        fetch_run_files(remote.session, name, dirs[-1], ("metrics.jsonl", "run.json"))
    target = out or (dirs[0] / "curves.png" if len(dirs) == 1 else dirs[0].parent / ("+".join(names) + ".png"))
    draw(dirs, target, [m.strip() for m in metrics.split(",") if m.strip()])
    click.echo(str(target))


@click.command(cls=HostOptionsCommand)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Also keep this many of the most recently synced trees.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@with_remote
def gc(remote: Remote, keep: int, dry_run: bool) -> None:
    """Free the server's disk: remove trees/<sha> and venvs/<hash> that no live or resumable run uses
    (the newest --keep trees stay too). Never touches data/ or runs/."""
    rep = remote.session.enlace_json("latest", "gc", "--keep", str(keep), *(["--dry-run"] if dry_run else []))
    for entry in rep["remove"]:
        click.echo(f"{'would remove' if dry_run else 'removed'} {entry['path']} ({entry['bytes'] / 2**20:.1f} MiB)")
    for sha, why in rep["kept"].items():
        click.echo(f"kept trees/{sha[:12]}: {why}", err=True)
    total = sum(e["bytes"] for e in rep["remove"]) / 2**20
    click.echo(f"{'would free' if dry_run else 'freed'} {total:.1f} MiB on {remote.host.name}", err=True)


@click.command(cls=HostOptionsCommand, context_settings={"ignore_unknown_options": True})
@click.argument("run_name", required=False)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@with_remote
def shell(remote: Remote, run_name: str | None, command: tuple[str, ...]) -> None:
    """An interactive shell in RUN_NAME's directory on the host (same host key, key and options as every
    other verb); `shell RUN -- CMD ARGS` runs one command there instead."""
    from orchestrator import choose

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    session = remote.session
    session.enlace_json("latest", "runs", run_name)  # a clear error for a run that is not there
    session.setup()
    run_dir = f"{session.remote_dir}/runs/{run_name}"
    inner = shlex.join(command) if command else 'exec "${SHELL:-bash}" -l'
    script = f"cd {shlex.quote(run_dir)} && {inner}"
    if remote.host.local:
        os.execvp("bash", ["bash", "-c", script])
    transport = session.transport
    tty = ["-t"] if not command and sys.stdin.isatty() else []
    remote.close()
    os.execvp("ssh", [*transport.ssh_argv(), *tty, transport.remote_path("").rstrip(":"), script])


COMMANDS = (sample, plot, gc, shell)
