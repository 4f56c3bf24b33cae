"""Running the real `enlace` CLI in a subprocess, as a user (or the driver) would."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import REPO
from .forkserver import run_enlace


def enlace(
    root: Path, *args: str, check: bool = True, timeout: float = 300, env: dict | None = None, fresh: bool = False
):
    """`python -m enlace ARGS --root ROOT`, run from ROOT: a fork of a process with torch imported
    (support/forkserver.py), or with `fresh` a new interpreter."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out = run_enlace([*args, "--root", str(root)], root, full_env, timeout, fresh)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def metrics(run_dir: Path, kind: str | None = None) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if kind is None or r["kind"] == kind]


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())
