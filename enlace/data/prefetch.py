"""Batches drawn ahead on a helper thread, so that the training step never waits for one.

A stream's `next_batch()` assembles a batch on the CPU (memory-mapped reads, a stack, a cast); on the main
thread that time sits between two steps, and on CUDA a copy from ordinary (pageable) memory also holds the
host until it is done. `Prefetched` draws the next `depth` batches on one helper thread; on CUDA each batch
lands in pinned memory as one (2, batch, seq_len) block, x above y, which the main thread copies to the
device with one asynchronous copy.

Exactness: the helper is the only one drawing from the stream, in order, and it records the stream's
state after each draw. `state_dict()` is the state after the last batch the *step* took, not the last
one drawn ahead: a checkpoint resumes at the first batch no step has seen, whatever was in flight.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Prefetched:
    """`stream` (next_batch, state_dict, load_state_dict) read `depth` batches ahead; depth 0
    draws on the caller's thread, as the stream itself would."""

    def __init__(self, stream: Any, device: torch.device, depth: int):
        self.stream, self.device, self.depth = stream, device, depth
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: collections.deque[Future] = collections.deque()
        self._state = stream.state_dict()  # after the last batch a step took

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.depth == 0:
            return self._on_device(*self._draw())
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="enlace-prefetch")
        while len(self._ahead) <= self.depth:  # the batch taken now, and `depth` behind it
            self._ahead.append(self._pool.submit(self._draw))
        block, state = self._ahead.popleft().result()  # a draw's error (a bad shard) is raised here
        return self._on_device(block, state)

    def _draw(self) -> tuple[Any, dict]:
        """The stream's next batch, in pinned memory as one block on CUDA, and the stream's state after it."""
        x, y = self.stream.next_batch()
        if self.device.type == "cuda":
            import torch

            block = torch.empty((2, *x.shape), dtype=x.dtype, pin_memory=True)
            torch.stack((x, y), out=block)
            return block, self.stream.state_dict()
        return (x, y), self.stream.state_dict()

    def _on_device(self, batch: Any, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
        self._state = state
        if self.device.type != "cuda":
            return batch
        block = batch.to(self.device, non_blocking=True)  # from pinned memory: the host goes on at once
        return block[0], block[1]

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: dict) -> None:
        """Drop what was drawn ahead and go on from `state`."""
        self._drain()
        self.stream.load_state_dict(state)
        self._state = self.stream.state_dict()

    def __enter__(self) -> Prefetched:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _drain(self) -> None:
        """Wait for the draws in flight (the stream is the helper's while they run), then forget them."""
        while self._ahead:
            self._ahead.popleft().exception()
