"""Which run a command means: when none is named, the host's default_run or the run last launched there from
this repo (.enlace/last-runs.json, which holds run names: what `logs`, `stop`, `fetch` act on); for
`launch`, which run file a name stands for (a file in configs/runs/, or the file an existing run of that name
was launched from, with its --set items)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from enlace.contract import ErrorKind
from enlace.errors import EnlaceError
from enlace.names import RunFile, RunName, validate_run_file, validate_run_name
from orchestrator.errors import UsageError
from orchestrator.hosts.resolve import driver_dir
from orchestrator.sweep.record import point_values


def _last_runs_file(repo: Path) -> Path:
    return repo / ".enlace" / "last-runs.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# launch's options that say on how many processes and hosts a run trains (its checkpoints hold the world size)
PLACEMENT = ("gpus", "hosts", "nodes", "master_port")


def remember_run(
    repo: Path,
    host: str,
    run: RunName,
    run_file: RunFile,
    overrides: tuple[str, ...] = (),
    placement: dict | None = None,
) -> dict | None:
    """The run launched last on `host` from this repo (what bare verbs act on), and what each run launched
    from here was launched from (`launch NAME` resumes it from these when the host cannot say its own), with
    its placement (placement_of). Returns what was remembered of `run` before (for forget_launch)."""
    table = _read(_last_runs_file(repo))
    table[host] = run  # (host names never start with "_": the key below is no host)
    launched = table.setdefault("_launched", {}).setdefault(host, {})
    before = launched.get(run)
    launched[run] = {
        "run_file": run_file,
        "overrides": list(overrides),
        **({"placement": placement} if placement else {}),
    }
    _write(repo, table)
    return before


def placement_of(options) -> dict:
    """What launch's options say of the run's placement, to remember: --gpus, --hosts, --nodes as given (the
    rendezvous port only with --hosts)."""
    kept = {key: getattr(options, key, None) for key in PLACEMENT if key != "master_port" or options.hosts}
    return {key: value for key, value in kept.items() if value is not None}


def kept_placement(repo: Path, host: str, name: str, options, given: set[str]) -> dict:
    """launch's placement options for a run launched again (resumed, extended): those `given` on its command
    line, and for the others what the run was last launched with from here (said), so that `launch NAME` of an
    8-process run resumes on 8, as the hints that name it promise (its trainer refuses another world size)."""
    remembered = (launched_here(repo, host, name) or {}).get("placement") or {}
    kept = {key: value for key, value in remembered.items() if key in PLACEMENT and key not in given}
    if kept:
        words = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in kept.items())
        click.echo(f"run: {name} keeps {words}, as it was launched from here (give the option to change it)", err=True)
    return {key: getattr(options, key, None) for key in PLACEMENT} | kept


def launched_here(repo: Path, host: str, name: str) -> dict | None:
    """What run `name` was launched from, from this repo on `host` ({"run_file", "overrides"}), or None."""
    return _read(_last_runs_file(repo)).get("_launched", {}).get(host, {}).get(name)


def forget_launch(repo: Path, host: str, run: RunName, before: dict | None) -> None:
    """A launch whose first start failed (its --set refused by the script, a config the trainer refused):
    what the run was launched from before it stands again, so that a plain `launch NAME` does not repeat the
    refused --set (the run itself stays the one bare verbs act on)."""
    table = _read(_last_runs_file(repo))
    launched = table.setdefault("_launched", {}).setdefault(host, {})
    if before is None:
        launched.pop(run, None)
    else:
        launched[run] = before
    _write(repo, table)


def _write(repo: Path, table: dict) -> None:
    path = _last_runs_file(repo)
    driver_dir(repo)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)


def run_argument(run: str) -> RunFile:
    """RUN as the user typed it: a config stem (a run name), never a path — with the way to a path's stem."""
    if Path(run).suffix in (".yaml", ".yml"):
        raise UsageError(
            f"{run!r}: enlace-remote takes a run config's stem, not a path — the server reads configs/runs/"
            f"RUN.yaml from the synced commit: put the file in configs/runs/, commit it, and launch "
            f"{Path(run).stem!r}"
        )
    return validate_run_file(run, "RUN")


def choose_run(repo: Path, host, run: str | None, last_first: bool = False) -> str:
    """RUN as given; else the host's default_run, then the last run launched there from this repo (for
    launch); with `last_first` (logs, fetch: what you just launched) the other way round."""
    if run:
        return run_argument(run)
    last = _read(_last_runs_file(repo)).get(host.name)
    choices = [
        (host.default_run, f"default_run of host {host.name}"),
        (last, f"the last run launched on {host.name} from this repo"),
    ]
    for name, why in reversed(choices) if last_first else choices:
        if name:
            click.echo(f"run: {name} ({why})", err=True)
            return validate_run_name(name, "RUN")
    raise UsageError(
        f"no RUN given, host {host.name} has no default_run and nothing was launched there from "
        "this repo yet — name the run, e.g. `enlace-remote launch smoke-cpu`"
    )


def _server_row(session, name: str) -> dict | None:
    """The host's row for run `name` (its run file and its line's --set items), {} for none, None when the
    host cannot say (nothing synced there yet). A host that does not answer is said as such: a dropped
    connection taken for "no such run" let what this machine remembers stand."""
    try:
        rows = session.enlace_json("latest", "runs", validate_run_name(name, "RUN"), "--json")
    except EnlaceError as e:
        if getattr(e, "kind", None) == ErrorKind.NOT_SYNCED:
            return None
        if getattr(e, "kind", None) == ErrorKind.NO_SUCH_RUN:
            return {}
        raise
    return rows[0] if rows else {}


def launch_target(
    session, repo: Path, name: str, overrides: tuple[str, ...], fresh: bool = False
) -> tuple[RunFile, tuple[str, ...]]:
    """What `launch NAME` starts: configs/runs/NAME.yaml when this checkout has it; else, when the host has a
    run called NAME, the run file it was launched from with its --set items (the new ones win), so that
    `launch NAME` resumes it and `launch NAME --set training.max_steps=M` extends it; `fresh` (--resume none):
    without them, but for its name. (file, overrides)."""
    import difflib

    runs_dir = repo / "configs" / "runs"
    row = launched_here(repo, session.host.name, name)
    renamed = [o.partition("=")[2].strip() for o in overrides if o.partition("=")[0].strip() == "run_name"]
    another = bool(renamed) and renamed[-1] != name  # `launch FILE --set run_name=B`: a run of its own, not FILE's
    if (runs_dir / f"{name}.yaml").is_file() and (another or not (row and row.get("overrides") and not fresh)):
        return validate_run_file(name), overrides
    # a run named as its file, launched with --set items: they hold for it (verify checked the file without
    # them, and refused an extension the trainer would have taken with them)
    if row is None:  # not launched from here: a run there (another clone's, its name close to a file's or not)?
        typo = difflib.get_close_matches(name, [p.stem for p in runs_dir.glob("*.yaml")], n=1, cutoff=0.6)
        try:
            row = _server_row(session, name)  # one read, nothing synced
        except EnlaceError:
            if not typo:
                raise
            row = None  # a host that does not answer: the typo of a file is what to say
        if row is None or (typo and not row):  # nothing synced there yet, or a typo of a file: said as such
            return validate_run_file(name), overrides
        if not row:  # neither a run file nor a run there: a typo of either
            _neither(session, runs_dir, name)
    elif not fresh:
        # what this machine remembers is what the last launch asked for; a launch whose trainer refused it
        # (another model over the run's checkpoints) left the run's own line, and its --set, as they were:
        # the server's run.json holds the line's (a run of your own command records none: ours stands)
        there = _server_row(session, name)
        row = there if there and there.get("run_file") else row
    if not row.get("run_file") or not (runs_dir / f"{row['run_file']}.yaml").is_file():
        return validate_run_file(name), overrides
    # --resume none: the file's config again, but a sweep's point keeps its swept values (it is its table's row)
    if fresh:
        recorded = [f"{k}={v}" for k, v in point_values(repo, session.host.name, name).items()]
    else:
        recorded = row.get("overrides") or []
    merged = {item.partition("=")[0].strip(): item for item in recorded}  # a recorded run's
    merged["run_name"] = f"run_name={name}"
    merged.update({item.partition("=")[0].strip(): item for item in overrides})
    file = validate_run_file(row["run_file"])
    shown = " ".join(f"--set {item}" for item in merged.values())
    click.echo(f"run: {name} on {session.host.name}, from configs/runs/{file}.yaml {shown}", err=True)
    return file, tuple(merged.values())


def _neither(session, runs_dir: Path, name: str) -> None:
    """`launch NAME` where NAME is neither a run file here nor a run on the host: the closest of both, said."""
    import difflib

    validate_run_file(name)  # a name no file could have is said as such
    files = sorted(p.stem for p in runs_dir.glob("*.yaml"))
    runs = sorted(r["run_name"] for r in session.enlace_json("latest", "runs", "--json"))
    host = session.host.name
    close = difflib.get_close_matches(name, runs, n=1, cutoff=0.6)
    hint = f" — did you mean the run {close[0]!r}? (`launch {close[0]}` resumes it)" if close else ""
    raise UsageError(
        f"no run config {name!r} in configs/runs/ and no run {name!r} on {host}{hint} — run files: "
        f"{', '.join(files) or 'none'}; runs on {host}: {', '.join(runs) or 'none'}"
    )
