"""Stage 1 of launch and preflight: ship the commit and check on the server that the run can start
there (sync, then verify), after the local check that RUN names a config in this checkout."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import click
import yaml

from enlace import contract
from enlace.contract import run_name_of
from enlace.errors import EnlaceError, shown
from enlace.names import validate_run_name
from enlace.yamlio import load_yaml_unique, read_bounded
from orchestrator.errors import UsageError, VerifyError, on_host
from orchestrator.launch.choose import run_argument
from orchestrator.ssh.session import Session
from orchestrator.transfer.datapush import push
from orchestrator.transfer.gitsync import print_sync, sync


def check_run_config(repo: Path, run: str) -> str:
    """RUN names configs/runs/RUN.yaml in this checkout (what sync ships): a typo is caught here, before any
    connection, with the closest names."""
    import difflib

    run_argument(run)
    if not (repo / "configs" / "runs").is_dir():
        raise UsageError(
            f"no configs/runs/ in {repo} — in a repository of your own, `enlace-remote init {run} -- python "
            "train.py ...` writes a run file for your script (docs/own-script.md)"
        )
    have = sorted(p.stem for p in (repo / "configs" / "runs").glob("*.yaml"))
    if run not in have:
        close = difflib.get_close_matches(run, have, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"no run config {run!r} in configs/runs/ — {hint}runs: {', '.join(have) or 'none'}")
    return run


def trained_data_guard(session: Session, repo: Path, run: str, overrides):
    """launch --push-data of a run that has a checkpoint there: a check for the push's plan (its before_send) that
    refuses, before a byte is sent, to change what the run reads — its resume would refuse the data (it differs
    from the checkpoint's) once the server's copy it trained on is gone. None when the run has no checkpoint, or
    runs a command of your own (which claims no data: its resume checks none, and the trainer's way out,
    --allow-data-change, is not its option)."""
    name = local_run_name(repo, run, overrides)
    try:
        row = session.enlace_json("latest", "runs", name)[0]
    except EnlaceError:  # no run of that name there yet
        return None
    ckpt = row.get("latest_checkpoint")
    if not ckpt or row.get("command"):
        return None

    def refuse(plan) -> None:
        if plan.send:
            shown = ", ".join(rel for rel, _, _, _ in plan.send[:3]) + (" and more" if len(plan.send) > 3 else "")
            raise UsageError(
                f"launch --push-data would change {len(plan.send)} file(s) {name} reads ({shown}), and its checkpoint "
                f"{ckpt} was trained on the server's copy: its resume would then refuse the data — --allow-data-change "
                "resumes on the new data, --resume none starts afresh, or launch without --push-data"
            )

    return refuse


def local_run_name(repo: Path, run: str, overrides=()) -> str:
    """The name RUN will run under, by the contract's rule, from this checkout's run file alone: launch loads
    no trainer config here (the server's check-config is the one that counts; only data push resolves a
    run's data with the config loader, enlace/config/schema.py, which is light)."""

    path = repo / "configs" / "runs" / f"{run}.yaml"
    try:
        layer = load_yaml_unique(read_bounded(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(
            f"configs/runs/{run}.yaml: cannot be read ({e.__class__.__name__}) — check-config says why"
        ) from None
    sets = {k.strip(): v for k, _, v in (o.partition("=") for o in overrides)}
    name, given_by = run_name_of(layer if isinstance(layer, dict) else {}, run, sets)
    return validate_run_name(name, "--set" if given_by == "--set" else f"configs/runs/{run}.yaml")


def set_args(overrides: tuple[str, ...] | list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def verify(
    session: Session,
    sha: str,
    run: str,
    for_launch: bool = False,
    overrides=(),
    fresh: bool = False,
    quiet: bool = False,
    extra: list[str] = (),
    elsewhere: bool = False,
    allow_data_change: bool = False,
    allow_teacher_change: bool = False,
) -> dict:
    """The server-side checklist for RUN in trees/SHA; prints it (`quiet`: only what failed or warns), raises
    VerifyError naming what is missing. `fresh` (--resume none): the config without the run's recorded --set
    items, and no resume check; `elsewhere` (--resume PATH): the recorded items apply, as train takes them, and
    the checkpoint named is checked instead of the run's line (extra's --resume-at); `allow_*`: the trainer's
    --allow-data-change and --allow-teacher-change, which its resume check heeds."""
    args = [sha, session.host.python, run] + (["--for-launch"] if for_launch else []) + (["--fresh"] if fresh else [])
    args += (["--resume-elsewhere"] if elsewhere and not fresh else []) + ["--allow-data-change"] * allow_data_change
    args += ["--allow-teacher-change"] * allow_teacher_change
    args += [*set_args(overrides), *extra]  # extra: launch's `-- ARGV` as --command-spec
    doc = session.call_json("verify", *args, ok_codes=(0, contract.USAGE, contract.VERIFY))
    if "checks" not in doc:
        raise VerifyError(f"verify on {session.host.name}: {doc.get('error', 'failed')}")
    host = session.host.name  # the server's hints (`enlace-remote launch RUN --resume none`) name no host: on_host
    for c in doc["checks"]:
        c["detail"] = on_host(c["detail"] or "", host)
        if quiet and c["ok"]:
            continue
        mark = " ok " if c["ok"] else "FAIL"
        click.echo(shown(f"  [{mark}] {c['name']}" + (f" — {c['detail']}" if c["detail"] else "")), err=True)
    for warning in doc.get("warnings") or []:
        click.echo(shown(f"  [warn] {on_host(warning, host)}"), err=True)
    if not doc["ok"]:
        failed = "; ".join(f"{c['name']}: {c['detail']}" for c in doc["checks"] if not c["ok"])
        error = UsageError if doc.get("exit_code") == contract.USAGE else VerifyError  # a config error is exit 2
        raise error(f"verify {run} on {session.host.name} failed: {failed}")
    if not quiet:
        click.echo(f"verify: {run} ready on {session.host.name} at {sha[:12]}", err=True)
    return doc


class Shipped(NamedTuple):
    commit: str
    run_name: str
    device: str | None  # the run's runtime.device, as the server's config check resolved it (the queue's need)
    resume_refused: str | None = None  # what its resume would refuse: data or a teacher other than the checkpoint's


def ship(
    session,
    repo: Path,
    run: str,
    allow_dirty: bool,
    for_launch: bool,
    overrides=(),
    fresh: bool = False,
    data=None,
    extra: list[str] = (),
    allow_data_change: bool = False,
    elsewhere: bool = False,
    allow_teacher_change: bool = False,
) -> Shipped:
    """Stage 1 of launch (and preflight): sync, push `data` (launch --push-data: RUN's data files,
    orchestrator/transfer/datapush.py), verify on one host. Raises if anything is missing there;
    the run name comes from the server's own config check (one round trip)."""

    rep = sync(session, repo, allow_dirty)
    print_sync(rep)
    if data is not None and data.files:
        guard = None if fresh or allow_data_change else trained_data_guard(session, repo, run, overrides)
        push(session, repo, data, before_send=guard)
    # --resume PATH: the checkpoint named, not the run's line, must fit the config (seen: going back to a set-aside
    # line trained with another learning rate was refused against the current line's)
    allow = {"allow_data_change": allow_data_change, "allow_teacher_change": allow_teacher_change}
    doc = verify(session, rep.commit, run, for_launch, overrides, fresh, extra=extra, elsewhere=elsewhere, **allow)
    return Shipped(rep.commit, validate_run_name(doc["run_name"]), doc.get("device"), doc.get("resume_refused"))
