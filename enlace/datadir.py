"""Where a run's data lives: under the project's data/ (here, and on the server <remote_dir>/data/, which every
tree's data/ links to). One rule for both halves and both kinds of run (enlace's trainer's `data.paths`, a
command of your own's `data:`); enlace/data/paths.py resolves and pushes what it lets through. Stdlib only."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

DATA_DIR = "data"
STDLIB = "{stdlib}"  # in a pattern: the server's own Python's standard library (nothing to push)


def data_relative(pattern: str) -> str | None:
    """`pattern` (a config path) relative to data/; None when it points elsewhere (absolute, `..`, outside)."""
    parts = PurePosixPath(pattern.replace(os.sep, "/")).parts
    if PurePosixPath(pattern).is_absolute() or not parts or parts[0] != DATA_DIR or ".." in parts or len(parts) < 2:
        return None
    return "/".join(parts[1:])


def outside_words(pattern: str, key: str) -> str:
    """The one-line refusal of a data pattern outside data/ (`key`: where it was written)."""
    if pattern.replace(os.sep, "/").strip("/") == DATA_DIR:  # the folder itself, not its files
        return f"{key}: {pattern!r} names data/ itself — name its files: data/** (every file under it) or data/corpus/*.txt"
    return (
        f"{key}: {pattern!r} is outside the project's data/ — the data a run reads lives under data/ here and "
        f"under <remote_dir>/data/ on the server (code travels by git): move the files into data/ and name "
        f"them as data/..., e.g. data/corpus/**/*.txt"
    )
