"""`enlace gc`: free the server's disk of checkouts and venvs no run needs any more.

    <remote_dir>/trees/<sha>/    one checkout per synced commit
    <remote_dir>/venvs/<hash>    a link to the account's shared venv for a pyproject.toml + constraints.txt
                                 (~/.cache/enlace/venvs/<hash>-cpu|cuda; python: venv): gc removes the link

Kept: the tree of every run that is alive or can still be resumed (any status but finished), the
`keep` most recently synced trees, and the venvs those trees use. data/ and runs/ are never touched: the
report lists each run's checkpoints-set-aside/ folders (lines an explicit --resume left, which only their owner
can judge) with what deleting each frees and what deleting all of them frees, for a hand to delete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from enlace.contract import Status
from enlace.errors import EnlaceError
from enlace.hashing import venv_key
from enlace.manifest import SET_ASIDE
from enlace.state import runs


def remote_dir_of(tree: Path) -> Path:
    """The remote_dir a checked-out tree lives in (<remote_dir>/trees/<sha>)."""
    if tree.parent.name != "trees" or not (tree / ".enlace-ready").exists():
        raise EnlaceError(f"{tree} is not a checked-out tree under <remote_dir>/trees/: gc runs on a server")
    return tree.parent.parent


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # a file that vanished meanwhile
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _files(path: Path):
    """The lstat of each file that deleting `path` unlinks: `path` itself when it is a file or a symlink
    (never what a symlink points at), else every file under it."""
    whole = path.is_symlink() or not path.is_dir()
    for p in [path] if whole else (Path(d) / f for d, _, files in os.walk(path) for f in files):
        with contextlib.suppress(OSError):  # a file that vanished meanwhile
            yield os.lstat(p)


def _freed(paths: list[Path]) -> tuple[list[int], int]:
    """Bytes that deleting each of `paths` alone frees, and what deleting all of them frees: a file counts where
    every hard link to it lies within what is deleted (a checkpoint linked in from elsewhere frees nothing; one
    linked into two set-aside lines is freed by deleting both, and counted once)."""
    alone, everywhere = [], Counter()
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    for path in paths:
        here = Counter()
        for st in _files(path):
            if not stat.S_ISLNK(st.st_mode):
                here[st.st_dev, st.st_ino] += 1
                sizes[st.st_dev, st.st_ino] = st.st_size, st.st_nlink
        alone.append(sum(sizes[key][0] for key, seen in here.items() if seen >= sizes[key][1]))
        everywhere.update(here)
    return alone, sum(sizes[key][0] for key, seen in everywhere.items() if seen >= sizes[key][1])


def plan(remote_dir: Path, keep: int) -> dict[str, Any]:
    """What gc would remove and why the rest stays."""
    trees = sorted(  # not a .tmp- checkout: it is ready only an instant before its rename to trees/<sha>
        (p for p in (remote_dir / "trees").iterdir() if not p.name.startswith(".") and (p / ".enlace-ready").exists()),
        key=lambda p: (p / ".enlace-ready").stat().st_mtime,
        reverse=True,
    )  # newest first
    needed: dict[str, str] = {}
    for run_dir in sorted((remote_dir / "runs").glob("*/run.json")):
        row = runs.observe(run_dir.parent)
        commit = row.get("commit") or ""
        if row["status"] != Status.FINISHED and commit:
            needed.setdefault(commit, f"run {row['run_name']} ({row['status']})")
    for tree in trees[:keep]:
        needed.setdefault(tree.name, "among the newest synced")
    kept = [t for t in trees if t.name in needed]
    venvs_needed = {venv_key(t) for t in kept}
    venv_dirs = (
        [p for p in (remote_dir / "venvs").iterdir() if not p.name.startswith(".")]
        if (remote_dir / "venvs").is_dir()
        else []
    )
    remove = [t for t in trees if t.name not in needed] + [v for v in venv_dirs if v.name not in venvs_needed]
    return {
        "remote_dir": str(remote_dir),
        "kept": {t.name: needed[t.name] for t in kept},
        # a venv link's target is shared by the account's other remote_dirs: only the link goes
        "remove": [{"path": str(p), "bytes": 0 if p.is_symlink() else _size(p)} for p in remove],
        **_set_aside(remote_dir),
    }


def _set_aside(remote_dir: Path) -> dict[str, Any]:
    """The lines explicit --resume set aside, each with what deleting it alone frees, and what deleting all
    of them frees (`set_aside_bytes`)."""
    runs_dir = remote_dir / "runs"  # a run dir that is a link to another is not walked twice
    lines = sorted(p for p in runs_dir.glob(f"*/{SET_ASIDE}/*") if not p.parent.parent.is_symlink())
    alone, together = _freed(lines)
    return {
        "set_aside": [{"path": str(p), "bytes": n} for p, n in zip(lines, alone, strict=True)],
        "set_aside_bytes": together,
    }


def collect(remote_dir: Path, keep: int, dry_run: bool) -> dict[str, Any]:
    report = plan(remote_dir, keep)
    if not dry_run:
        for entry in report["remove"]:
            if os.path.islink(entry["path"]):
                os.unlink(entry["path"])
            else:
                shutil.rmtree(entry["path"], ignore_errors=True)
    report["freed_bytes"] = 0 if dry_run else sum(e["bytes"] for e in report["remove"])
    report["dry_run"] = dry_run
    return report
