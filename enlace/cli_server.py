"""`enlace` verbs for the driver (enlace-remote) on the server: runs, stop, logs, manifest,
data-files. Each prints JSON with --json (logs prints the raw log bytes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from enlace.cli import main, root_option, set_option
from enlace.config import find_root, load_config


def _runs_root(root: Path | None) -> Path:
    return find_root(root) / "runs"


@main.command("runs")
@click.argument("run_name", required=False)
@root_option
@click.option("--json", "as_json", is_flag=True)
def runs_cmd(run_name: str | None, root: Path | None, as_json: bool) -> None:
    """Status of the runs in runs/ (or one RUN_NAME); a run whose process vanished shows crashed."""
    from enlace import server

    rows = ([server.run_status(server.run_dir_of(_runs_root(root), run_name))] if run_name
            else server.all_status(_runs_root(root)))  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        click.echo(f"{r['run_name']:24} {r['status']:9} step {r['step']}/{r['max_steps']} loss {r['loss']}")


@main.command("stop")
@click.argument("run_name")
@root_option
@click.option("--grace", type=float, default=120.0, show_default=True, help="Seconds to wait for the checkpoint.")
@click.option("--kill", is_flag=True, help="SIGKILL the run if it has not stopped within --grace.")
@click.option("--json", "as_json", is_flag=True)
def stop_cmd(run_name: str, root: Path | None, grace: float, kill: bool, as_json: bool) -> None:
    """SIGTERM a detached run (it checkpoints and exits), wait up to --grace seconds."""
    from enlace import server

    report = server.stop_run(server.run_dir_of(_runs_root(root), run_name), grace, kill)
    click.echo(json.dumps(report) if as_json else f"{run_name}: {report['status']} at step {report['step']}, "
               f"latest checkpoint {report['latest_checkpoint']}")  # fmt: skip
    sys.exit(0 if report["stopped"] else 1)


@main.command("logs")
@click.argument("run_name")
@root_option
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Start at this byte of train.log.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the run ends; exit with its code.")
@click.option("--tail-offset", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only print (as JSON) the byte offset where the last N lines start.")
def logs_cmd(run_name: str, root: Path | None, offset: int, follow: bool, tail_offset: int | None) -> None:
    """Print RUN_NAME's train.log from a byte offset (raw bytes)."""
    from enlace import server

    run_dir = server.run_dir_of(_runs_root(root), run_name)
    if tail_offset is not None:
        click.echo(json.dumps({"offset": server.tail_offset(run_dir, tail_offset)}))
        return
    server.stream_log(run_dir, offset, follow)
    if follow:
        st = server.run_status(run_dir)
        sys.exit(0 if st["status"] in ("finished", "stopped") else int(st["exit_code"] or 1))


@main.command("manifest")
@click.argument("run_name")
@root_option
def manifest_cmd(run_name: str, root: Path | None) -> None:
    """JSON: RUN_NAME's complete checkpoints (with MANIFEST sha256s) and run files, for fetch."""
    from enlace import server

    click.echo(json.dumps(server.manifest(server.run_dir_of(_runs_root(root), run_name))))


@main.command("data-files")
@click.argument("run")
@set_option
@root_option
@click.option("--json", "as_json", is_flag=True)
def data_files_cmd(run: str, overrides: tuple[str, ...], root: Path | None, as_json: bool) -> None:
    """The files RUN reads; exit 3 naming what is missing (for verify --for-launch)."""
    from enlace.data import data_files
    from enlace.errors import EnlaceError

    cfg = load_config(run, overrides, root)
    try:
        files = data_files(cfg)
    except EnlaceError as e:
        click.echo(json.dumps({"ok": False, "error": e.message, "files": []}) if as_json else e.message)
        sys.exit(3)
    click.echo(json.dumps({"ok": True, "files": files}) if as_json else "\n".join(files))
