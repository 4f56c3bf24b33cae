"""Where this process sits in a torchrun job, and the only place that calls torch.distributed.

Every verb is a no-op (or the trivial answer) for a single process, so the trainer and preflight
read the same with and without torchrun."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class Dist:
    """rank 0 of 1 when not under torchrun."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self, device: str) -> None:
        """Join the process group: nccl on CUDA, gloo on the CPU (torchrun set the rendezvous env)."""
        if self.world > 1 and not torch_dist.is_initialized():
            torch_dist.init_process_group("nccl" if device != "cpu" and torch.cuda.is_available() else "gloo")

    def close(self) -> None:
        if self.world > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if it is true on any (e.g. a stop signal: all ranks stop at the same step)."""
        if self.world == 1:
            return flag
        t = torch.tensor([int(flag)])
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        everyone: list[Any] = [None] * self.world
        torch_dist.all_gather_object(everyone, obj)
        return everyone

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            torch_dist.barrier()
