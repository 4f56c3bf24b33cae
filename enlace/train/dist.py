"""Where this process sits in a torchrun job, and the only place that calls torch.distributed.

Every verb is a no-op (or the trivial answer) for a single process, so the trainer and preflight
read the same with and without torchrun."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

# where the stop flag is all-reduced under nccl: a gloo group beside it, so that reading it makes no GPU wait; one
# per process group (every Dist of the process shares it: preflight's --max-batch probes make one each), made at
# the first flag on every rank alike (new_group is a collective call), dropped with the process group
_flag_group: list[Any] = []


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
            _flag_group.clear()

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if it is true on any (e.g. a stop signal: all ranks stop at the same step)."""
        if self.world == 1:
            return flag
        # on the CPU, through gloo (the default group, or flag_group beside nccl): reading it back waits for the
        # other ranks' hosts, never for a GPU; under nccl a CUDA flag's .item() waited for every queued kernel
        if not _flag_group and torch_dist.get_backend() == "nccl":
            _flag_group.append(torch_dist.new_group(backend="gloo"))
        t = torch.tensor([int(flag)])
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX, group=_flag_group[0] if _flag_group else None)
        return bool(t.item())

    def average_gradients(self, params) -> None:
        """Every rank's gradients summed and divided by the world, as DDP does, but in one flat buffer laid
        out in parameter order on every step. DDP regroups its buckets after a process's first iteration, so
        with 3 or more ranks a resumed process's first step summed in another order than the uninterrupted
        run's; deterministic mode uses this instead, and resumes bit for bit."""
        if self.world == 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch._utils._flatten_dense_tensors(grads)
        torch_dist.all_reduce(flat)
        flat /= self.world
        for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Rank 0's weights on every rank (what DDP does when it wraps a module)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                torch_dist.broadcast(tensor, src=0)

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
