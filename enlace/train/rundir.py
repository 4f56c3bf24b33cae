"""The run directory: config.yaml, run.json, train.log, metrics.jsonl, checkpoints/.

Everything is written incrementally and flushed, so `tail -f` (and `enlace-remote logs`) sees it.
run.json belongs to enlace/state/runs.py (this class only forwards to it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from enlace.contract import UNLESS_STOPPING, Status
from enlace.state import heartbeat, runs
from enlace.state.runs import atomic_write
from enlace.train import sinks


class RunDir:
    """Writes one run's files. With `enabled=False` (DDP ranks other than 0) it writes nothing."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = path, enabled
        self.checkpoints = path / "checkpoints"
        self._log = self._metrics = None
        self._sinks = None  # logging.tensorboard / logging.wandb (enlace/train/sinks.py), once open_sinks is called
        self._echo = True
        # the supervisor's stall clock: touched on every step, eval batch and checkpoint (rank 0 only)
        self.heartbeat = heartbeat.Heartbeat(path / heartbeat.TRAINER) if enabled else None
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

    def freeze_config(self, config: dict[str, Any], new_line: bool = False) -> None:
        """config.yaml holds the resolved config of the line's first start (the run's, or an explicit --resume's:
        a new line of its history); a resume never rewrites it."""
        if self.enabled and (new_line or not (self.path / "config.yaml").exists()):
            atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def update_status(self, **fields: Any) -> None:
        if self.enabled:
            runs.update(self.path, **fields)

    def enter(self, status: Status, **fields: Any) -> None:
        """Move to an active status (starting, running) unless a stop has been recorded meanwhile."""
        if self.enabled:
            runs.transition(self.path, status, UNLESS_STOPPING, **fields)

    def beat(self, force: bool = False) -> None:
        if self.heartbeat is not None:
            self.heartbeat(force)

    def beating(self):
        """Beat from a helper thread while the block runs (a save, a start's first step): see heartbeat.py."""
        return self.heartbeat.beating() if self.heartbeat is not None else contextlib.nullcontext()

    def trained_before(self) -> float:
        """Seconds this run trained in its earlier starts (ELAPSED counts them all)."""
        return runs.trained_before(runs.read(self.path)) if self.enabled else 0.0

    def phase(self, text: str) -> None:
        """What the trainer is doing before its first step (shown by `enlace-remote launch`)."""
        if self.enabled:
            runs.update(self.path, phase=text)

    def log(self, line: str) -> None:
        if not self.enabled:
            return
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"
        try:
            self._log.write(stamped + "\n")
        except OSError as e:  # e.g. the disk is full: the line still reaches stderr
            print(f"(train.log not writable: {e.strerror}) {stamped}", file=sys.stderr, flush=True)
            return
        if self._echo:
            print(stamped, flush=True)

    def open_sinks(self, cfg, step: int) -> None:
        """Start the configured metric sinks for a start at `step` (they then get every metric record)."""
        if not self.enabled:
            return

        remember = lambda run_id: self.update_status(wandb_id=run_id)
        self._sinks = sinks.configured(cfg, runs.read(self.path).get("wandb_id"), remember, self.log)
        self._sinks.start(step, cfg.to_dict())

    def reopen_metrics(self) -> None:
        """After metrics.jsonl was replaced (an explicit --resume's new line): append to the file there now."""
        if self.enabled:
            self._metrics.close()
            self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)

    def metric(self, record: dict[str, Any]) -> None:
        if self.enabled:
            self._metrics.write(json.dumps(record) + "\n")
            if self._sinks is not None:
                self._sinks.record(record)

    def close(self) -> None:
        if self._sinks is not None:
            self._sinks.close()
        for fh in (self._log, self._metrics):
            if fh:
                fh.close()
