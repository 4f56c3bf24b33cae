"""Optimizer and learning-rate schedule (a pure function of the step: the schedule's whole state)."""

from __future__ import annotations

import math

import torch

from enlace.config.schema import OptimConfig


def lr_at(step: int, o: OptimConfig, max_steps: int) -> float:
    """Linear warmup to learning_rate over warmup_steps, then cosine decay to min_lr at max_steps."""
    if step < o.warmup_steps:
        return o.learning_rate * (step + 1) / o.warmup_steps
    span = max(1, max_steps - o.warmup_steps)
    progress = min(1.0, (step - o.warmup_steps) / span)
    return o.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (o.learning_rate - o.min_lr)


def build_optimizer(model: torch.nn.Module, o: OptimConfig, deterministic: bool) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) only; not on norms or biases.

    Deterministic mode pins the single-tensor implementation, so the optimizer's arithmetic never follows
    torch's per-device default. Not for run-to-run variance: foreach and fused are elementwise and
    deterministic too; what the pin costs on a GPU is for the first lent device to measure
    (docs/gpu-path.md)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    pinned = {"foreach": False, "fused": False} if deterministic else {}
    return torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.beta1, o.beta2), eps=o.eps, **pinned)
