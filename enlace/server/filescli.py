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
    is_flag=True,
    help="Also say (`changed`) what the run's newest checkpoint (its MANIFEST's record) was made from that differs "
    "now (the data, a distilled run's teacher): its resume would refuse it.",
)
@click.option("--allow-teacher-change", is_flag=True, help="A teacher other than the checkpoint's is no refusal.")
@click.option("--json", "as_json", is_flag=True)
def data_files_cmd(
    run: str,
    overrides: tuple[str, ...],
    root: Path | None,
    fresh: bool,
    against_checkpoint: bool,
    allow_teacher_change: bool,
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
            files, changed = _trainer_data_files(run, overrides, root, fresh, against_checkpoint, allow_teacher_change)
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
    run: str, overrides: tuple[str, ...], root: Path | None, fresh: bool, against_checkpoint: bool, allow: bool
) -> tuple[list[str], str | None]:
    """The files the trainer's run reads, and (`against_checkpoint`) what of its newest checkpoint's making differs
    now (_resume_refused; `allow`: --allow-teacher-change)."""
    from enlace.config.recorded import load_run_config
    from enlace.data.streams import data_files, require_splits

    cfg = load_run_config(run, overrides, root, fresh=fresh)
    files = data_files(cfg)
    require_splits(cfg, files)
    return files, _resume_refused(cfg, allow) if against_checkpoint else None


def _resume_refused(cfg, allow_teacher_change: bool) -> str | None:
    """Before a launch that resumes the run's line: what its trainer would refuse as it loads the newest complete
    checkpoint — data other than the one that checkpoint's MANIFEST records, or (distillation) another teacher —
    in the trainer's words and fixes. None: it would resume, or nothing to compare (no checkpoint, one saved
    before MANIFESTs recorded them). A finished run's data replaced by a push passed verify, queued, and failed
    as it started; a student after its teacher was trained further failed after its preflight."""
    from enlace.config.machine import teacher_checkpoint
    from enlace.data.streams import data_identity
    from enlace.manifest import identity, latest_checkpoint, read_manifest

    ckpt = latest_checkpoint(cfg.run_dir / "checkpoints")
    made = read_manifest(ckpt) if ckpt else {}
    then = made.get("data") or {}
    now = data_identity(cfg) if then.get("sha256") else {}
    if now and (then["sha256"], then.get("bytes")) != (now["sha256"], now["bytes"]):
        return (
            f"the data differs from what {cfg.run_name}'s checkpoint {ckpt.name} was trained on ({then.get('files')} "
            f"files, {then.get('bytes')} bytes then; {now['files']} files, {now['bytes']} bytes now): its resume "
            "would refuse it — put the same data back, resume on this data anyway with launch --allow-data-change "
            "(not exact), or start afresh with --resume none"
        )
    teacher = identity(teacher_checkpoint(cfg)) if made.get("teacher") and cfg.distill.teacher else None
    if teacher and teacher != made["teacher"] and not allow_teacher_change:
        return (
            f"the teacher changed: {cfg.run_name}'s checkpoint {ckpt.name} was distilled from teacher "
            f"{made['teacher'][:12]}, distill.teacher {cfg.distill.teacher} is now {teacher[:12]} (trained further?) "
            "— put the same teacher back (distill.teacher: that checkpoint's directory), continue with this one: "
            "launch --allow-teacher-change, or start afresh with --resume none"
        )
    return None


COMMANDS = (fetch_serve_cmd, data_receive_cmd, data_files_cmd)
