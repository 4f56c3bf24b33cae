"""A trained model from its checkpoint: a run's newest complete one (or a checkpoint directory as given),
loaded with its own config in eval mode. Sampling, distillation's teacher, generate and export all start here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import ModelConfig
from enlace.errors import CheckpointError
from enlace.manifest import latest_checkpoint, read_manifest
from enlace.train.checkpoint import load_checkpoint
from enlace.train.model import ByteGPT


def find_checkpoint(target: Path) -> Path:
    """A checkpoint dir as given, or the newest complete checkpoint of a run dir."""
    if (target / "MANIFEST").is_file():
        return target
    ckpt = latest_checkpoint(target / "checkpoints")
    if ckpt is None:
        raise CheckpointError(f"{target}: neither a checkpoint (no MANIFEST) nor a run with a complete checkpoint")
    return ckpt


def load_model(ckpt: Path, device: torch.device) -> tuple[ByteGPT, dict[str, Any]]:
    """The checkpoint's model (its own config: any width or depth) in eval mode, and its trainer record."""
    held = set(read_manifest(ckpt)["files"])
    if not {"model.pt", "trainer.pt"} <= held:  # a script's own (enlace.job): its files are its own
        raise CheckpointError(
            f"{ckpt}: not a checkpoint of enlace's trainer (it holds {', '.join(sorted(held)[:4]) or 'no files'}, not "
            "model.pt and trainer.pt): sample, generate, export and a distillation's teacher load enlace's own model; "
            "a script of yours saves its own, which `fetch` brings back for you to load"
        )
    files = load_checkpoint(ckpt, "cpu")
    trainer = files["trainer.pt"]
    model = ByteGPT(ModelConfig(**trainer["config"]["model"]))
    model.load_state_dict(files["model.pt"])
    return model.to(device).eval(), trainer
