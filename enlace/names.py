"""Run names checked with the contract's rule (the driver and the server both validate with it), as a
ConfigError naming where the name came from, and the project root. Kept apart from enlace.config.schema so that the light verbs
(fetch-serve, runs, logs) and the driver's start-up do not pay for the config machinery (yaml,
dataclasses, the config rules)."""

from __future__ import annotations

import os
from pathlib import Path

from enlace.contract import RUN_NAME_RE, RUN_NAME_RULE
from enlace.errors import ConfigError


def validate_run_name(name: str, source: str = "run_name") -> str:
    if not isinstance(name, str) or not RUN_NAME_RE.fullmatch(name):
        raise ConfigError(source, "run_name", f"{name!r} is not a valid name", RUN_NAME_RULE)
    return name


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` that holds configs/runs/ (else `start`).

    Without `start`, ENLACE_ROOT (set by scripts/remote.sh to the checked-out tree) wins: a tree
    on the server must never borrow configs from a directory above it."""
    if start is None and os.environ.get("ENLACE_ROOT"):
        return Path(os.environ["ENLACE_ROOT"]).resolve()
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "configs" / "runs").is_dir():
            return d
    return start
