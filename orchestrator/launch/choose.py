"""Which run a command means when none is named: the host's default_run or the last one launched
there from this repo (.enlace/last-runs.json)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from enlace.names import validate_run_name
from orchestrator.errors import UsageError


def _last_runs_file(repo: Path) -> Path:
    return repo / ".enlace" / "last-runs.json"


def remember_run(repo: Path, host: str, run: str) -> None:
    path = _last_runs_file(repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = json.loads(path.read_text()) if path.exists() else {}
    table[host] = run
    path.write_text(json.dumps(table, indent=1) + "\n")


def run_argument(run: str) -> str:
    """RUN as the user typed it: a config stem (a run name), never a path — with the way to a path's stem."""
    if Path(run).suffix in (".yaml", ".yml"):
        raise UsageError(
            f"{run!r}: enlace-remote takes a run config's stem, not a path — the server reads configs/runs/"
            f"RUN.yaml from the synced commit: put the file in configs/runs/, commit it, and launch "
            f"{Path(run).stem!r}"
        )
    return validate_run_name(run, "RUN")


def choose_run(repo: Path, host, run: str | None, last_first: bool = False) -> str:
    """RUN as given; else the host's default_run, then the last run launched there from this repo (for
    launch); with `last_first` (logs, fetch: what you just launched) the other way round."""
    if run:
        return run_argument(run)
    path = _last_runs_file(repo)
    last = json.loads(path.read_text()).get(host.name) if path.exists() else None
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
