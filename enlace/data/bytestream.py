"""ByteStream: raw bytes of files → uint8 tokens, random windows from a seeded generator.

The corpus is the concatenation of the files (memory-mapped, never loaded whole). The train split
is its first (1 - val_fraction), the val split the rest. Under DDP each rank draws from its own
contiguous slice of the train split, so ranks never see the same window start.

Batch k's window starts come from a generator seeded by (seed, split, rank, k): the whole state
of the stream is the counter k, and any batch can be re-drawn exactly.
"""

from __future__ import annotations

# torch is imported inside the methods that use it, so that verify's `import enlace.data` on the
# server stays cheap. Annotations are strings (PEP 563).
import bisect
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enlace.data.paths import DataError, split_bounds

if TYPE_CHECKING:
    import torch


def mix_seed(*parts: object) -> int:
    """A 63-bit seed from any parts; distinct parts give unrelated seeds."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def check_state(state: dict, kind: str, version: int, seed: int) -> None:
    """Refuse a data state from another kind of stream, format version or seed."""
    if state.get("kind") != kind or state.get("version") != version:
        raise DataError(
            f"data state is {state.get('kind')} v{state.get('version')}, this stream is {kind} "
            f"v{version}: the checkpoint is from another data config"
        )
    if state["seed"] != seed:
        raise DataError(f"data state was drawn with seed {state['seed']}, this run uses {seed}")


class ConcatBytes:
    """Several files read as one byte array, via memory maps."""

    def __init__(self, files: list[Path]):
        self.maps = [np.memmap(f, dtype=np.uint8, mode="r") for f in files if f.stat().st_size > 0]
        self.starts = [0]
        for m in self.maps:
            self.starts.append(self.starts[-1] + len(m))
        self.length = self.starts[-1]

    def read(self, start: int, n: int) -> np.ndarray:
        """Bytes [start, start+n) as a uint8 array (may span files)."""
        out = np.empty(n, dtype=np.uint8)
        i = bisect.bisect_right(self.starts, start) - 1
        pos, filled = start - self.starts[i], 0
        while filled < n:
            chunk = self.maps[i][pos : pos + n - filled]
            out[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            i, pos = i + 1, 0
        return out


class ByteStream:
    VERSION = 1

    def __init__(
        self,
        files: list[Path],
        seq_len: int,
        batch_size: int,
        split: str = "train",
        val_fraction: float = 0.05,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
    ):
        self.data = ConcatBytes(files)
        self.seq_len, self.batch_size, self.split, self.seed = seq_len, batch_size, split, seed
        self.rank = rank
        self.lo, self.hi = split_bounds(self.data.length, val_fraction, split, seq_len, rank, world)
        self.position = 0  # batches drawn so far

    def batch_at(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number k: x, y of shape (batch_size, seq_len), int64."""
        import torch

        g = torch.Generator().manual_seed(mix_seed(self.seed, self.split, self.rank, k))
        starts = torch.randint(self.lo, self.hi - self.seq_len, (self.batch_size,), generator=g)
        rows = np.stack([self.data.read(int(s), self.seq_len + 1) for s in starts])
        buf = torch.from_numpy(rows).long()  # (B, T+1)
        return buf[:, :-1], buf[:, 1:]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batch_at(self.position)
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        return {
            "version": self.VERSION,
            "kind": "bytes",
            "position": self.position,
            "seed": self.seed,
            "rank": self.rank,
        }

    def load_state_dict(self, state: dict) -> None:
        check_state(state, "bytes", self.VERSION, self.seed)
        self.position = int(state["position"])
