"""Running the real `enlace` CLI in a subprocess, as a user (or the driver) would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import REPO


def enlace(root: Path, *args: str, check: bool = True, timeout: float = 300, env: dict | None = None):
    cmd = [sys.executable, "-m", "enlace", *args, "--root", str(root)]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=timeout, env=full_env)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def metrics(run_dir: Path, kind: str | None = None) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if kind is None or r["kind"] == kind]


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())
