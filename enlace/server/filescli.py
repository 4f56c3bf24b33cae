"""`enlace` verbs that move a run's files for the driver: fetch-serve (fetch's server half), data-receive
(data push's), data-files (what a run reads: verify --for-launch). With --json each answers JSON on stdout,
errors too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from enlace import contract
from enlace.clitypes import fresh_option, root_option, set_option
from enlace.names import find_root


def _runs_root(root: Path | None) -> Path:
    return find_root(root) / "runs"


@click.command("fetch-serve", hidden=True)
@click.argument("run_name")
@root_option
@click.option(
    "--json", "as_json", is_flag=True, help="An error as one JSON document on stdout (the offer is JSON anyway)."
)
@click.option("--outputs", is_flag=True, help="Offer a command run's outputs too (each hashed as it is sent).")
def fetch_serve_cmd(run_name: str, root: Path | None, as_json: bool, outputs: bool) -> None:
    """For fetch: offer RUN_NAME's complete checkpoints and run files (one JSON line), read which
    files the driver wants from stdin, send them (enlace/server/fetchserve.py has the wire)."""
    from enlace.server import fetchserve, runfiles

    run_dir = runfiles.run_dir_of(_runs_root(root), run_name)
    fetchserve.serve(run_dir, sys.stdin.buffer, sys.stdout.buffer, outputs)


@click.command("data-receive", hidden=True)
@root_option
@click.option(
    "--json", "as_json", is_flag=True, help="An error as one JSON document on stdout (the answers are JSON anyway)."
)
def data_receive_cmd(root: Path | None, as_json: bool) -> None:
    """For data push and data ls: compare the driver's file list with data/, then take the files it sends
    (enlace/server/datarecv.py has the wire)."""
    from enlace.data.paths import shared_data_dir
    from enlace.server import datarecv

    project = find_root(root)
    datarecv.receive(shared_data_dir(project), sys.stdin.buffer, sys.stdout.buffer, _runs_root(root), project)


@click.command("data-files")
@click.argument("run")
@set_option
@root_option
@fresh_option
@click.option(
    "--against-checkpoint",
    "against",
    default=None,
    metavar="latest|PATH",
    help="Also say (`changed`) what this checkpoint (as --resume takes it) was made from that differs now (the "
    "data, a distilled run's teacher, by its MANIFEST's record): its resume would refuse it.",
)
@click.option("--allow-data-change", is_flag=True, help="Other data than the checkpoint's is no refusal.")
@click.option("--allow-teacher-change", is_flag=True, help="A teacher other than the checkpoint's is no refusal.")
@click.option(
    "--world",
    type=click.IntRange(min=1),
    default=None,
    help="With --against-checkpoint: the processes the launch would resume it with (its MANIFEST records how many "
    "saved it; the trainer refuses another number).",
)
@click.option("--json", "as_json", is_flag=True)
def data_files_cmd(
    run: str,
    overrides: tuple[str, ...],
    root: Path | None,
    fresh: bool,
    against: str | None,
    allow_data_change: bool,
    allow_teacher_change: bool,
    world: int | None,
    as_json: bool,
) -> None:
    """The files RUN reads; exit 3 naming what is missing (for verify --for-launch)."""
    from enlace.config import command
    from enlace.errors import EnlaceError

    own, changed = command.load(run, root, overrides), None
    try:
        if own:
            files = _command_data_files(own, find_root(root), run)
        else:
            allow = (allow_data_change, allow_teacher_change, world)
            files, changed = _trainer_data_files(run, overrides, root, fresh, against, allow)
    except EnlaceError as e:
        click.echo(json.dumps(contract.error_doc(e.message, contract.VERIFY, files=[])) if as_json else e.message)
        sys.exit(contract.VERIFY)
    click.echo(json.dumps({"ok": True, "files": files, "changed": changed}) if as_json else "\n".join(files))


def _command_data_files(own, root: Path, run: str) -> list[str]:
    """What a command run's `data:` globs match in the tree (DataError naming the first that matches none)."""
    from enlace.data.paths import link_shared_data, resolve_paths

    link_shared_data(root)  # a repository that tracks files under data/: the pushed ones appear beside them
    return [str(p) for p in resolve_paths(list(own.data), root, key="data", run=run)]


def _trainer_data_files(
    run: str, overrides: tuple[str, ...], root: Path | None, fresh: bool, against: str | None, allow: tuple
) -> tuple[list[str], str | None]:
    """The files the trainer's run reads, and (`against`: a checkpoint as --resume takes it) what of its making
    differs now (enlace/server/resumecheck.py; `allow`: --allow-data-change, --allow-teacher-change, --world)."""
    from enlace.config.recorded import load_run_config
    from enlace.data.streams import data_files, require_splits
    from enlace.server.resumecheck import resume_refused

    cfg = load_run_config(run, overrides, root, fresh=fresh)
    files = data_files(cfg)
    require_splits(cfg, files)
    return files, resume_refused(cfg, against, *allow) if against else None


COMMANDS = (fetch_serve_cmd, data_receive_cmd, data_files_cmd)
