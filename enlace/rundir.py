"""The run directory: config.yaml, run.json, train.log, metrics.jsonl, checkpoints/.

Everything is written incrementally and flushed, so `tail -f` (and `enlace-remote logs`) sees it.
run.json is replaced atomically (temp file + rename), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except FileNotFoundError:
        return {}


class RunDir:
    """Writes one run's files. With `enabled=False` (DDP ranks other than 0) it writes nothing."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = path, enabled
        self.checkpoints = path / "checkpoints"
        self._log = self._metrics = None
        self._echo = True
        if enabled:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            self._log = open(path / "train.log", "a", buffering=1)
            self._metrics = open(path / "metrics.jsonl", "a", buffering=1)
            # Detached runs have stdout redirected into train.log already: don't write lines twice.
            try:
                out, log = os.fstat(sys.stdout.fileno()), os.fstat(self._log.fileno())
                self._echo = (out.st_dev, out.st_ino) != (log.st_dev, log.st_ino)
            except (OSError, ValueError, AttributeError):
                self._echo = True

    def freeze_config(self, config: dict[str, Any]) -> None:
        """config.yaml holds the resolved config of the run's first start; never rewritten."""
        if self.enabled and not (self.path / "config.yaml").exists():
            atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def update_status(self, **fields: Any) -> None:
        if not self.enabled:
            return
        state = read_run_json(self.path)
        state.update(fields, updated_at=time.time())
        atomic_write(self.path / "run.json", json.dumps(state, indent=1) + "\n")

    def log(self, line: str) -> None:
        if not self.enabled:
            return
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"
        self._log.write(stamped + "\n")
        if self._echo:
            print(stamped, flush=True)

    def metric(self, record: dict[str, Any]) -> None:
        if self.enabled:
            self._metrics.write(json.dumps(record) + "\n")

    def close(self) -> None:
        for fh in (self._log, self._metrics):
            if fh:
                fh.close()
