"""When the trainer checkpoints and how: every `checkpoint.every` steps, at a stop, and at the end unless the
last step was just saved. Every rank gives its data position and RNG state (gathered on rank 0), rank 0
writes (enlace/train/checkpoint.py: complete only once renamed in); the heartbeat beats from a helper thread
all through the write, which can be long, so the supervisor never takes a save for a stall."""

from __future__ import annotations

import time

from enlace.config.schema import Config
from enlace.train import engine
from enlace.train.begin import Start
from enlace.train.checkpoint import save_checkpoint
from enlace.train.dist import Dist
from enlace.train.rundir import RunDir


class Saver:
    def __init__(self, cfg: Config, run: RunDir, dist: Dist, start: Start):
        self.cfg, self.run, self.dist, self.start = cfg, run, dist, start
        self.last_saved = start.progress["step"] if start.resumed_from is not None else -1

    def due(self, step: int) -> bool:
        """A periodic save falls on this step."""
        return bool(self.cfg.checkpoint.every) and step % self.cfg.checkpoint.every == 0

    def save(self) -> str:
        """Checkpoint the run as it stands (every rank calls it); the checkpoint's name on rank 0."""
        start = self.start
        self.last_saved = start.progress["step"]
        states = self.dist.gather(engine.rank_state(start.train_stream))
        if not self.dist.is_main:
            return ""
        t0 = time.monotonic()
        with self.run.beating():  # however long the write takes (a large model on a slow file system)
            state = engine.capture_state(start.setup, states, start.progress, start.commit, start.data_id)
            trainer = state["trainer.pt"]
            made_from = {"data": trainer["data"], "teacher": trainer.get("teacher"), "world": len(trainer["ranks"])}
            step, keep = start.progress["step"], self.cfg.checkpoint.keep
            path = save_checkpoint(self.run.checkpoints, step, state, keep, made_from)  # verify's resume check
        self.run.update_status(last_save_s=round(time.monotonic() - t0, 3))  # a stop's grace is sized from it
        self.run.log(f"checkpoint {path.name} saved")
        return path.name

    def save_unless_saved(self) -> None:
        """At the end: the last step, unless it was just saved."""
        if self.last_saved != self.start.progress["step"]:
            self.save()
