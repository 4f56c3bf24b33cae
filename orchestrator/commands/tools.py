"""enlace-remote's commands for looking at, using and tidying what was trained: sample, plot, gc, shell,
generate, export, board."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from enlace.clitypes import IMAGE_SUFFIXES, LocalPath, gc_options
from enlace.errors import for_stream
from enlace.names import validate_run_name
from enlace.tools.plot import metrics_option
from orchestrator.commands import sweep as sweeps
from orchestrator.commands.common import AfterDashCommand, HostOptionsCommand, Remote, with_remote
from orchestrator.commands.sweep import sweep_option
from orchestrator.ssh.session import SHA_RE


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
    from orchestrator.launch import choose

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    args = ["sample", run_name, "--bytes", str(n_bytes), "--temperature", str(temperature), "--seed", str(seed)]
    args += (["--prompt", prompt] if prompt is not None else []) + (["--top-k", str(top_k)] if top_k else [])
    rep = remote.session.enlace_json("latest", *args, timeout=3600)
    sys.stdout.write(for_stream(rep["text"], sys.stdout) + "\n")
    click.echo(
        f"[{rep['bytes']} bytes at {rep['bytes_per_s']} bytes/s on {remote.host.name} ({rep['device']}), "
        f"step {rep['step']}, seed {seed}]",
        err=True,
    )


@click.command(cls=HostOptionsCommand)
@click.argument("run_names", nargs=-1, metavar="[RUN_NAME...]")
@click.option(
    "--out",
    type=LocalPath(dir_okay=False, suffixes=IMAGE_SUFFIXES),
    default=None,
    help="PNG to write (default: runs/RUN_NAME/curves.png; several runs: runs/A+B.png).",
)
@metrics_option
@click.option(
    "--dest",
    type=LocalPath(file_okay=False),
    default=None,
    help="Local run directory to fetch into (default: runs/RUN_NAME here), as fetch's --dest; one RUN_NAME.",
)
@sweep_option
@with_remote
def plot(
    remote: Remote,
    run_names: tuple[str, ...],
    out: Path | None,
    metrics: list[str],
    dest: Path | None,
    sweep_name: str | None,
) -> None:
    """Fetch only metrics.jsonl and run.json of each run (incremental) into runs/RUN_NAME here (or --dest),
    and draw them locally with `enlace plot` (matplotlib; nothing heavy runs on the server). --sweep: every run
    of the sweep, overlaid (runs/sweep-NAME.png)."""
    from enlace.tools.plot import plot as draw
    from orchestrator.launch import choose
    from orchestrator.transfer.fetch import fetch_run_files

    if sweep_name is not None:
        click.echo(str(sweeps.plot_all(remote, sweeps.alone(" ".join(run_names), sweep_name, "plot"), out, metrics)))
        return

    names = list(run_names) or [choose.choose_run(remote.repo, remote.host, None, last_first=True)]
    if dest is not None and len(names) > 1:
        raise click.BadParameter("--dest names one run's directory: plot one RUN_NAME with it", param_hint="--dest")
    dirs = []
    for name in names:
        validate_run_name(name, "RUN")
        dirs.append(dest or remote.repo / "runs" / name)
        fetch_run_files(remote.session, name, dirs[-1], ("metrics.jsonl", "run.json"))
    target = out or (dirs[0] / "curves.png" if len(dirs) == 1 else dirs[0].parent / ("+".join(names) + ".png"))
    draw(dirs, target, metrics)
    click.echo(str(target))


@click.command(cls=HostOptionsCommand)
@gc_options
@with_remote
def gc(remote: Remote, keep: int, dry_run: bool) -> None:
    """Free the server's disk: remove trees/<sha> and venvs/<hash> that no live or resumable run uses
    (the newest --keep trees stay too). Never touches data/ or runs/: it lists the lines an explicit --resume
    set aside (runs/RUN/checkpoints-set-aside/*) with what deleting each frees, for you to judge."""
    rep = remote.session.enlace_json("latest", "gc", "--keep", str(keep), *(["--dry-run"] if dry_run else []))
    for entry in rep["remove"]:
        click.echo(f"{'would remove' if dry_run else 'removed'} {entry['path']} ({entry['bytes'] / 2**20:.1f} MiB)")
    for sha, why in rep["kept"].items():
        click.echo(f"kept trees/{sha[:12]}: {why}", err=True)
    total = sum(e["bytes"] for e in rep["remove"]) / 2**20
    click.echo(f"{'would free' if dry_run else 'freed'} {total:.1f} MiB on {remote.host.name}", err=True)
    if rep.get("set_aside"):  # never gc's to remove: only their owner knows whether a line is still wanted
        aside = rep.get("set_aside_bytes", sum(e["bytes"] for e in rep["set_aside"])) / 2**20
        click.echo(
            f"kept {len(rep['set_aside'])} line(s) an explicit --resume set aside (deleting them all frees "
            f"{aside:.1f} MiB; gc never deletes them — delete by hand what you will not go back to):",
            err=True,
        )
        for entry in rep["set_aside"]:  # a checkpoint hard-linked into two lines is freed by deleting both
            click.echo(f"  {entry['path']} (frees {entry['bytes'] / 2**20:.1f} MiB alone)", err=True)


@click.command(cls=HostOptionsCommand)
@click.argument("teacher", metavar="TEACHER")
@click.option("--bytes", "n_bytes", type=click.IntRange(1024, 10**10), required=True, help="How many bytes in all.")
@click.option(
    "--out",
    default="data/distill",
    show_default=True,
    help="The shard directory on the server, relative to the synced tree (data/ is <remote_dir>/data).",
)
@click.option("--temperature", type=click.FloatRange(0, 10), default=1.0, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=1337, show_default=True)
@click.option(
    "--streams", type=click.IntRange(1, 4096), default=64, show_default=True, help="Texts drawn side by side."
)
@with_remote
def generate(remote: Remote, teacher: str, n_bytes: int, out: str, temperature: float, seed: int, streams: int) -> None:
    """`enlace generate` on the server, on its GPU: TEACHER's own text as token shards in OUT (sequence-level
    distillation data; configs/data/distill.yaml reads data/distill). Progress and ETA here as it runs; the
    text is kept on the server as it is drawn, so a stopped generate, run again with the same arguments,
    continues; stopping this command (Ctrl-C, a lost connection) stops the server's generate too.

    \b
    enlace-remote generate smoke-cpu --bytes 200000
    enlace-remote launch distill-cpu --set data=distill --set run_name=distill-seq   # a student on that text

    On a Slurm host it runs on the login node, on its CPU (it is no batch job): generate a few MB there, or
    train the teacher where the GPU is."""
    validate_run_name(teacher, "RUN")
    args = ["generate", teacher, "--bytes", str(n_bytes), "--out", out, "--temperature", str(temperature)]
    args += ["--seed", str(seed), "--streams", str(streams)]
    rep = remote.session.stream_json(
        "latest", *args, on_progress=lambda line: click.echo(line, err=True), stall_timeout=900
    )
    click.echo(f"{rep['summary']} (on {remote.host.name})")


@click.command(cls=HostOptionsCommand)
@click.argument("run_name", required=False)
@click.option("--format", "fmt", type=click.Choice(["hf", "safetensors"]), default="hf", show_default=True)
@click.option("--out", type=LocalPath(), default=None, help="Default: exports/RUN_NAME-FORMAT here.")
@with_remote
def export(remote: Remote, run_name: str | None, fmt: str, out: Path | None) -> None:
    """Export RUN_NAME's newest complete checkpoint on the server (`enlace export`, docs/export.md: a directory
    transformers loads as GPT-2, or plain safetensors) and bring it here, each file checked against the
    export's MANIFEST. The server keeps it in the run's directory (runs/RUN/exports/, which gc never removes),
    so a second export of the same checkpoint only travels. Needs no torch on this machine. Without RUN_NAME:
    the run last launched on the host. --out must not exist (an export is never written over)."""
    from orchestrator.errors import UsageError
    from orchestrator.launch import choose
    from orchestrator.transfer.fetch import fetch_export

    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    target = out or remote.repo / "exports" / f"{run_name}-{fmt}"
    if target.exists() or target.is_symlink():
        raise UsageError(f"{target} exists — an export goes into a new directory; remove it or pick another --out")
    made = remote.session.enlace_json("latest", "export", run_name, "--format", fmt, "--in-run", timeout=1800)
    rep = fetch_export(remote.session, run_name, made["name"], target)
    click.echo(
        f"export {run_name} ({made['checkpoint']}, {fmt}) → {target}: {', '.join(made['files'])} "
        f"({rep['bytes'] / 2**20:.1f} MiB, verified; kept on {remote.host.name} in runs/{run_name}/exports/{made['name']})"
    )


@click.command(cls=AfterDashCommand)
@click.argument("run_name", required=False)
@click.pass_context
@with_remote
def shell(remote: Remote, ctx: click.Context, run_name: str | None) -> None:
    """A shell on the host in the run's synced tree, as `ssh` gives one: `shell [RUN]` is interactive,
    `shell [RUN] -- CMD...` runs CMD (its words joined with spaces, as ssh joins them: `-- 'pwd; ls'` is
    two commands). The server's python (venv) is first on PATH, `enlace` runs the trainer's CLI there,
    and $ENLACE_RUN_DIR is the run's directory (runs/RUN under remote_dir).

    \b
    enlace-remote shell smoke-cpu
    enlace-remote shell smoke-cpu -- 'tail -n 3 $ENLACE_RUN_DIR/train.log; enlace runs'"""
    from orchestrator.launch import choose

    command = ctx.meta.get("after_dash", [])
    run_name = choose.choose_run(remote.repo, remote.host, run_name, last_first=True)
    session = remote.session
    row = session.enlace_json("latest", "runs", run_name)[0]  # a clear error for a run that is not there
    session.setup()
    commit = row["commit"] if SHA_RE.fullmatch(row.get("commit") or "") else "latest"  # a run started by hand
    tree = session.call_json("checkout", commit, session.host.python, *session.host.pip_args)
    run_dir = f"{session.remote_dir}/runs/{run_name}"
    bindir = tree["python"].rsplit("/", 1)[0]
    inner = " ".join(command) if command else 'exec "${SHELL:-bash}" -l'
    script = (
        f'cd {shlex.quote(tree["tree"])} && export PATH={shlex.quote(bindir)}:"$PATH" '
        f'ENLACE_RUN_DIR={shlex.quote(run_dir)} ENLACE_ROOT="$PWD" PYTHONPATH="$PWD" && '
        f'enlace() {{ {shlex.quote(tree["python"])} -m enlace "$@"; }} && export -f enlace && {inner}'
    )
    if remote.host.local:
        os.execvp("bash", ["bash", "-c", script])
    transport = session.transport
    tty = ["-t"] if sys.stdin.isatty() else []  # with a terminal, Ctrl-C and a lost client end CMD there too
    remote.close()
    os.execvp("ssh", [*transport.ssh_argv(), *tty, transport.remote_path("").rstrip(":"), script])


@click.command(cls=HostOptionsCommand)
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port on 127.0.0.1 (default: a free one).")
@click.option(
    "--hosts",
    metavar="H1,H2,...",
    default=None,
    help="The hosts to show (default: every host in your hosts files, `local` included).",
)
@click.option("--no-browser", is_flag=True, help="Only print the URL; do not open a browser.")
@with_remote
def board(remote: Remote, port: int, hosts: str | None, no_browser: bool) -> None:
    """A live web page of every run on every host: status, step, loss, ETA, Slurm state, restarts, newest
    checkpoint; a run's curves (as `plot` draws them) and its log, following as they grow; several runs
    overlaid. Served here on 127.0.0.1 only, behind a token in the URL; read-only. Ctrl-C ends it."""
    import webbrowser

    from orchestrator.hosts.resolve import list_hosts, resolve_hosts
    from orchestrator.view.board import Board
    from orchestrator.view.board_http import BoardServer

    targets = resolve_hosts(hosts, remote.repo) or list_hosts(remote.repo)
    server = BoardServer(Board(remote.repo, targets, remote.session_for), port)
    server.board.warm()
    click.echo(f"board of {', '.join(h.name for h in targets)}: {server.url}", err=True)
    click.echo("(127.0.0.1 only; the token in the URL is the key — Ctrl-C ends the board)", err=True)
    if not no_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        click.echo("board closed", err=True)
    finally:
        server.server_close()


COMMANDS = (sample, plot, gc, shell, generate, export, board)
