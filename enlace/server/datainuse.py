"""Which runs read the data a push would change, and what a forced push leaves them (data push's guard).

A run that is alive (or its supervisor may restart it) re-checks its data on every restart and refuses data
that differs from its checkpoint's: a push into files it reads switches its healing off without a word. The
server says which of the files that differ such runs read; the driver refuses to send them unless --force,
and a forced push records it in each run's run.json and train.log (status shows it). Stdlib and yaml only.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from enlace.contract import ACTIVE, Status
from enlace.data.paths import DATA_DIR, push_files, real_path
from enlace.errors import EnlaceError
from enlace.state import runs

DATA_CHANGED = "its data was changed by a data push: a restart or resume needs launch --allow-data-change"


def active_runs(runs_root: Path) -> list[Path]:
    """The run directories whose recorded status is active (running, starting, stopping, pending)."""
    if not runs_root.is_dir():
        return []
    found = []
    for run_dir in sorted(p for p in runs_root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        state = runs.read(run_dir)
        if runs.recorded_status(state) in ACTIVE and runs.alive(state, run_dir):
            found.append(run_dir)
    return found


def _data_config(run_dir: Path) -> dict[str, Any] | None:
    """What the trainer's run reads (its config's `data:` section); None for one starting whose trainer has yet to
    write config.yaml: it may read any file. A command's run claims nothing: its restarts check no data identity,
    and one queued has nothing to restart."""
    import yaml  # only with an active run: a data push's server starts without it

    st = runs.read(run_dir)
    if st.get("command"):
        return {}
    try:
        return (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("data") or {}
    except FileNotFoundError:
        return None if runs.recorded_status(st) == Status.STARTING else {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}  # a config it cannot read here: nothing claimed


def files_read(data: dict[str, Any], root: Path) -> set[str]:
    """The real paths of the files the run reads now, as the trainer resolves them."""
    cfg = SimpleNamespace(
        kind=data.get("kind", "bytes"), paths=data.get("paths") or [], shard_dir=data.get("shard_dir") or ""
    )
    try:
        return {os.path.realpath(p) for p in push_files(cfg, root)}
    except (OSError, EnlaceError, TypeError):
        return set()


def would_read(data: dict[str, Any], rel: str) -> bool:
    """Whether a new file data/REL would be read on the run's next start (its globs, its shard directory)."""
    path = f"{DATA_DIR}/{rel}"
    if data.get("kind") == "shards":
        return bool(data.get("shard_dir")) and path.startswith(str(data["shard_dir"]).rstrip("/") + "/")
    patterns = [p for p in data.get("paths") or [] if isinstance(p, str)]
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(path, p.replace("**/", "")) for p in patterns)


def readers(data_dir: Path, rels: list[str], runs_root: Path, root: Path) -> dict[str, list[str]]:
    """rel → the names of the active runs that read data_dir/rel now, or would once it exists (only the rels
    some run reads)."""
    active = active_runs(runs_root) if rels else []
    if not active:
        return {}
    dirs: dict[str, str] = {}
    wanted = {real_path(os.path.join(data_dir, rel), dirs): rel for rel in rels}
    found: dict[str, list[str]] = {}
    for run_dir in active:
        data = _data_config(run_dir)
        if data is None:
            hit = set(rels)
        else:
            hit = {wanted[real] for real in files_read(data, root) & wanted.keys()}
            hit |= {rel for rel in rels if not (data_dir / rel).exists() and would_read(data, rel)}
        for rel in hit:
            found.setdefault(rel, []).append(run_dir.name)
    return found


def mark_changed(runs_root: Path, names: set[str], changed: list[str]) -> None:
    """A forced push changed files these runs read: say so in their run.json and train.log."""
    for name in sorted(names):
        run_dir = runs_root / name
        runs.update(run_dir, data_warning=f"{DATA_CHANGED} ({len(changed)} file(s), {time.strftime('%H:%M:%S')})")
        with contextlib.suppress(OSError), open(run_dir / "train.log", "a") as fh:
            fh.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} data push --force changed what this run reads ({', '.join(changed[:5])}): a restart or resume needs launch --allow-data-change\n"
            )
