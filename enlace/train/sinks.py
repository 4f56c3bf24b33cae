"""Optional metric sinks beside metrics.jsonl (the source of truth): TensorBoard event files and Weights &
Biases, configured in the `logging` config section. Each gets every record the trainer writes to
metrics.jsonl (RunDir.metric), on rank 0 only.

- TensorBoard: event files in <run_dir>/tensorboard/. Every start opens a new file whose purge step is the
  step it starts from + 1: TensorBoard's readers drop what an earlier attempt logged past the checkpoint this
  start resumed from, so each tag has exactly one scalar per logged step across resumes.
- W&B: one W&B run per enlace run; its id is kept in run.json (`wandb_id`), so a resumed run continues it.
  `offline` writes under <run_dir>/wandb/ for a later `wandb sync`.

A sink that fails (a missing package, no network, a quota) is said once in train.log and dropped: it never
stops training.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

# metrics.jsonl keys → TensorBoard tags, by record kind
SCALARS = {
    "train": ("loss", "ce", "kd", "lr", "tokens_per_s", "grad_norm", "scale", "skipped"),
    "eval": ("val_loss", "val_bpb"),
}


class Sink:
    name = "sink"

    def start(self, step: int, config: dict[str, Any]) -> None:
        """A start of the run at `step` (0, or the step of the checkpoint it resumed from)."""

    def record(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, run_dir: Path):
        self.dir = run_dir / "tensorboard"
        self.writer = None

    def start(self, step: int, config: dict[str, Any]) -> None:
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        if self.writer is not None:
            self.writer.close()
        resumed = self.dir.is_dir() and any(self.dir.iterdir())
        # purge_step: readers drop earlier files' events at or after it (an attempt that ran past its checkpoint)
        self.writer = SummaryWriter(str(self.dir), purge_step=step + 1 if resumed else None)
        if not resumed:
            self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def record(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        for key in SCALARS.get(kind, ()):
            if record.get(key) is not None:
                self.writer.add_scalar(f"{kind}/{key}", float(record[key]), record["step"])
        if kind in ("eval", "summary"):
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, run_dir: Path, logging_cfg, run_name: str, run_id: str | None, remember: Callable[[str], None]):
        self.run_dir, self.cfg, self.run_name = run_dir, logging_cfg, run_name
        self.run_id, self.remember = run_id, remember
        self.run = None

    def start(self, step: int, config: dict[str, Any]) -> None:
        import wandb

        if self.run_id is None:
            self.run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            self.remember(self.run_id)  # before init: a crash inside it still resumes the same id
        self.run = wandb.init(
            project=self.cfg.wandb_project,
            entity=self.cfg.wandb_entity or None,
            name=self.run_name,
            id=self.run_id,
            resume="allow",
            mode=self.cfg.wandb,
            dir=str(self.run_dir),
            config=config,
            settings=wandb.Settings(silent=True, init_timeout=60, console="off"),
        )

    def record(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        values = {f"{kind}/{k}": float(record[k]) for k in SCALARS.get(kind, ()) if record.get(k) is not None}
        if values:
            self.run.log(values, step=record["step"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish(quiet=True)


class Sinks:
    """The configured sinks, each dropped (said once through `warn`) at its first failure."""

    def __init__(self, sinks: list[Sink], warn: Callable[[str], None]):
        self.sinks, self.warn = sinks, warn

    def _each(self, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as e:
                self.sinks.remove(sink)
                self.warn(f"logging.{sink.name} failed ({type(e).__name__}: {e}); training continues without it")

    def start(self, step: int, config: dict[str, Any]) -> None:
        self._each(lambda s: s.start(step, config))

    def record(self, record: dict[str, Any]) -> None:
        if self.sinks:
            self._each(lambda s: s.record(record))

    def close(self) -> None:
        self._each(lambda s: s.close())


def configured(cfg, run_id: str | None, remember: Callable[[str], None], warn: Callable[[str], None]) -> Sinks:
    """The sinks cfg.logging asks for (none by default)."""
    sinks: list[Sink] = []
    if cfg.logging.tensorboard:
        sinks.append(TensorBoardSink(cfg.run_dir))
    if cfg.logging.wandb != "off":
        sinks.append(WandbSink(cfg.run_dir, cfg.logging, cfg.run_name, run_id, remember))
    return Sinks(sinks, warn)
