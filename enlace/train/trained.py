"""A trained model from its checkpoint: a run's newest complete one (or a checkpoint directory as given),
loaded with its own config in eval mode. Sampling, distillation's teacher, generate and export all start here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import ModelConfig
from enlace.contract import Status, not_started
from enlace.errors import CheckpointError
from enlace.manifest import latest_checkpoint, not_the_trainers
from enlace.state import runs
from enlace.train.checkpoint import load_checkpoint
from enlace.train.model import ByteGPT


def find_checkpoint(target: Path) -> Path:
    """A checkpoint dir as given, or the newest complete checkpoint of a run dir."""
    if (target / "MANIFEST").is_file():
        return target
    ckpt = latest_checkpoint(target / "checkpoints")
    if ckpt is None and (target / "run.json").is_file():
        _no_checkpoint_yet(target, runs.observe(target))
    if ckpt is None and any((target / name).exists() for name in ("run.json", "preflight.json", "checkpoints")):
        raise CheckpointError(  # seen after a launch, which leaves preflight.json here: said as if no run at all
            f"{target}: this run has no complete checkpoint here — where it trains, its first one comes at "
            f"checkpoint.every; a run trained on a host comes here with `enlace-remote fetch {target.name}`"
        )
    if ckpt is None:
        raise CheckpointError(f"{target}: neither a checkpoint (no MANIFEST) nor a run with a complete checkpoint")
    return ckpt


def _no_checkpoint_yet(target: Path, row: dict[str, Any]) -> None:
    """Raise what to say of a run that has no checkpoint: one that has not started (queued, pending, dropped),
    or, on the server it trains on (ENLACE_ROOT), one training towards its first, or one that ended before it.
    Elsewhere (a run fetched here) nothing: the caller says to fetch it."""
    name, status = target.name, row["status"]
    if row.get("command"):  # (it said a launch would train it again from step 0)
        raise CheckpointError(
            f"{name} runs your own command: it has no checkpoint of enlace's trainer to load — "
            f"`enlace-remote fetch {name}` brings back what your script saved"
        )
    said = not_started(name, status, "no checkpoint yet")  # (it said to fetch it)
    if said:
        raise CheckpointError(said)
    if not os.environ.get("ENLACE_ROOT"):
        return
    if Status(status).is_terminal:  # (it said a checkpoint would come, and that stop would save one)
        raise CheckpointError(
            f"{name} ended ({status} at step {row.get('step') or 0}) before its first checkpoint: nothing to load — "
            f"`enlace-remote launch {name}` trains it again from step 0"
        )
    raise CheckpointError(  # (it said to fetch the run to the server it trains on)
        f"{name} has no complete checkpoint yet: its first comes at checkpoint.every steps (status shows its step; "
        f"`enlace-remote stop {name}` saves one as it stops)"
    )


def load_model(ckpt: Path, device: torch.device) -> tuple[ByteGPT, dict[str, Any]]:
    """The checkpoint's model (its own config: any width or depth) in eval mode, and its trainer record."""
    problem = not_the_trainers(ckpt)  # sample, generate, export and a teacher load enlace's own model
    if problem:
        raise CheckpointError(problem)
    files = load_checkpoint(ckpt, "cpu")
    trainer = files["trainer.pt"]
    model = ByteGPT(ModelConfig(**trainer["config"]["model"]))
    model.load_state_dict(files["model.pt"])
    return model.to(device).eval(), trainer
