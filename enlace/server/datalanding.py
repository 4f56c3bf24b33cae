"""Where a verified file of a data push lands: renamed from the staging area into data/, or (data/ on another
file system) copied into a hidden `.enlace-push/` beside its target and renamed from there. A top directory
that neither data/ nor the staging area held when the push began lands whole, in one rename, once every file
under it is in: a first push of thousands of files makes one call where it made one per file (a fifth of its
server time on tmpfs: docs/benchmarks.md). Standard library only."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

BESIDE = ".enlace-push"  # a hidden dir beside a target on another file system than the staging dir


def new_tops(data: str, staging: str, rels: list[str]) -> set[str]:
    """The top directories of `rels` that neither data/ nor the staging area holds: nothing of them is here, so
    each can land whole (data_dir/TOP/... only: a file directly in data/ always lands on its own)."""
    tops = {rel.partition("/")[0] for rel in rels if "/" in rel}
    return {t for t in tops if not os.path.lexists(f"{data}/{t}") and not os.path.lexists(f"{staging}/{t}")}


def land(partial: str, target: str, made: set[str]) -> None:
    """One verified file from staging into data/ (`made`: the directories this push has created)."""
    mkdir_once(target.rpartition("/")[0], made)
    try:
        os.replace(partial, target)
    except OSError as e:  # data/ on another file system than its parent: copy beside the target, then rename
        if e.errno != errno.EXDEV:
            raise
        tmp = Path(target).parent / BESIDE / Path(target).name  # hidden from a run's globs; removed on failure or
        tmp.parent.mkdir(exist_ok=True)  # the next push
        try:
            shutil.copy2(partial, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                tmp.parent.rmdir()  # empty again: nothing of the push stays beside the data
        os.unlink(partial)


def land_whole(staged: str, target: str, made: set[str]) -> None:
    """A new top directory, every verified file under it, in one rename; file by file where that cannot be (data/
    on another file system, or the directory appeared meanwhile)."""
    if not os.path.lexists(staged):  # nothing under it arrived whole (every file refused as corrupt)
        return
    if not os.path.lexists(target):
        try:
            os.rename(staged, target)
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EEXIST, errno.ENOTEMPTY):
                raise
    for parent, _, names in os.walk(staged, topdown=False):
        for name in names:
            land(f"{parent}/{name}", f"{target}{parent[len(staged) :]}/{name}", made)
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def mkdir_once(path: str, made: set[str]) -> None:
    """mkdir -p, once per directory per push."""
    if path not in made:
        os.makedirs(path, exist_ok=True)
        made.add(path)
