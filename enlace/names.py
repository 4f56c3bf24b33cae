"""Run names checked with the contract's rule (the driver and the server both validate with it), as a
ConfigError naming where the name came from, and the project root. Kept apart from enlace.config.schema so that the light verbs
(fetch-serve, runs, logs) and the driver's start-up do not pay for the config machinery (yaml,
dataclasses, the config rules)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NewType

from enlace.contract import RUN_NAME_RE, RUN_NAME_RULE
from enlace.errors import ConfigError

# Two things that were one string and got mixed up: the run file is what `launch` takes (the stem of
# configs/runs/FILE.yaml); the run name is what a run is called on the server (its directory under runs/;
# the file's stem unless the file or `--set run_name=` says otherwise) and what `logs`, `stop`, `fetch`,
# `status` and `sample` take and the driver remembers. Both follow RUN_NAME_RE.
RunName = NewType("RunName", str)
RunFile = NewType("RunFile", str)
QUOTED_MAX = 40  # a rejected name is quoted up to this many characters (a 120 KB --set was echoed whole)


def quoted(value: object, limit: int = QUOTED_MAX) -> str:
    """repr() of a user's value, cut to `limit` characters with its length said: errors quote a prefix."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def validate_run_name(name: str, source: str | None = None) -> RunName:
    """`source`: where the name was given (a file, an option), said before `run_name:` (None: run_name alone)."""
    if not isinstance(name, str) or not RUN_NAME_RE.fullmatch(name):
        where = (source, "run_name") if source else ("run_name", "")
        raise ConfigError(*where, f"{quoted(name)} is not a valid name", RUN_NAME_RULE)
    return RunName(name)


def validate_run_file(stem: str, source: str = "RUN") -> RunFile:
    """A run file's stem (configs/runs/STEM.yaml) follows the run-name rule: it is the default run name."""
    return RunFile(validate_run_name(stem, source))


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` that holds configs/runs/ (else `start`).

    Without `start`, ENLACE_ROOT (set by enlace/remote/remote.sh to the checked-out tree) wins: a tree
    on the server must never borrow configs from a directory above it."""
    if start is None and os.environ.get("ENLACE_ROOT"):
        return Path(os.environ["ENLACE_ROOT"]).resolve()
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "configs" / "runs").is_dir():
            return d
    return start
