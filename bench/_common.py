"""Shared by the benchmarks: a smoke-sized config and fixed synthetic batches."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enlace.config.schema import load_config  # noqa: E402


def smoke_config(*overrides: str):
    return load_config("smoke-cpu", ["model.dropout=0.0", *overrides], root=REPO)


def fixed_batches(cfg, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.training.batch_size, cfg.model.seq_len + 1)
    out = []
    for _ in range(n):
        buf = torch.randint(0, 256, shape, generator=g)
        out.append((buf[:, :-1], buf[:, 1:]))
    return out
