"""Random bytes of a run's shape, for preflight: it measures the run's steps without its corpus."""

from __future__ import annotations

import torch


class SyntheticStream:
    """Random bytes of the configured shape: no corpus needed."""

    def __init__(self, batch_size: int, seq_len: int, seed: int):
        self.shape, self.g = (batch_size, seq_len + 1), torch.Generator().manual_seed(seed)

    def next_batch(self):
        buf = torch.randint(0, 256, self.shape, generator=self.g)
        return buf[:, :-1], buf[:, 1:]

    def batch_at(self, k: int):
        return self.next_batch()

    def state_dict(self) -> dict:
        return {"version": 1, "kind": "synthetic"}
