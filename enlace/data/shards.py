"""ShardStream: a directory of token shards written by `enlace prepare`, read in a seeded order.

Layout:  <dir>/meta.json  {"version", "dtype", "train": [file, ...], "val": [file, ...]}
         <dir>/train-000000.bin ...   raw little-endian tokens (uint8 or uint16)

Train batches are contiguous runs of batch_size * seq_len + 1 tokens from one shard. Shards are
visited in an order drawn per epoch from (seed, epoch); under DDP the ranks take interleaved
chunks of each shard, so they never overlap. The position (epoch, shard index, offset) is exact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enlace.data.bytestream import ConcatBytes, check_state, mix_seed
from enlace.data.paths import DataError, read_meta, require_shard_window
from enlace.hashing import open_pieces

DTYPES = {"uint8": np.uint8, "uint16": np.uint16}


if TYPE_CHECKING:
    import torch


class ShardStream:
    VERSION = 1

    def __init__(
        self,
        shard_dir: Path,
        seq_len: int,
        batch_size: int,
        split: str = "train",
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
    ):
        meta = read_meta(shard_dir)
        dtype = DTYPES[meta["dtype"]]
        self.shards = [np.memmap(shard_dir / name, dtype=dtype, mode="r") for name in meta[split]]
        self.seq_len, self.batch_size, self.split, self.seed = seq_len, batch_size, split, seed
        self.rank, self.world = rank, world
        self.chunk = batch_size * seq_len  # tokens one rank consumes per batch (+1 for the target)
        require_shard_window(shard_dir, split, [len(s) for s in self.shards], self.chunk * world + 1)
        self.epoch, self.index, self.offset = 0, 0, 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        if self.split == "val":
            return list(range(len(self.shards)))
        import torch

        g = torch.Generator().manual_seed(mix_seed(self.seed, "shards", epoch))
        return torch.randperm(len(self.shards), generator=g).tolist()

    def _take(self, shard: np.ndarray, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        buf = torch.from_numpy(shard[start : start + self.chunk + 1].astype(np.int64))
        return buf[:-1].view(self.batch_size, self.seq_len), buf[1:].view(self.batch_size, self.seq_len)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.chunk * self.world
        while True:
            shard = self.shards[self._order[self.index]]
            if self.offset + step + 1 <= len(shard):
                batch = self._take(shard, self.offset + self.rank * self.chunk)
                self.offset += step
                return batch
            self.index, self.offset = self.index + 1, 0
            if self.index == len(self.shards):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._order_for(self.epoch)

    def batch_at(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch k of the split read straight through (used for the fixed eval batches)."""
        usable = [s for s in self.shards if len(s) >= self.chunk + 1]
        per_shard = [(len(s) - 1) // self.chunk for s in usable]
        k %= sum(per_shard)
        for shard, n in zip(usable, per_shard):
            if k < n:
                return self._take(shard, k * self.chunk)
            k -= n
        raise AssertionError("unreachable")

    def state_dict(self) -> dict:
        return {
            "version": self.VERSION,
            "kind": "shards",
            "epoch": self.epoch,
            "index": self.index,
            "offset": self.offset,
            "seed": self.seed,
            "rank": self.rank,
        }

    def load_state_dict(self, state: dict) -> None:
        check_state(state, "shards", self.VERSION, self.seed)
        self.epoch, self.index, self.offset = int(state["epoch"]), int(state["index"]), int(state["offset"])
        self._order = self._order_for(self.epoch)


def prepare_shards(
    files: list[Path],
    out: Path,
    shard_tokens: int = 1 << 24,
    dtype: str = "uint8",
    val_fraction: float = 0.05,
    progress=None,
) -> dict:
    """Write `files` (concatenated bytes) as train/val shards into `out`, atomically.

    Returns the meta dict. `out` appears only once complete (written to a temp dir, then renamed).
    """
    if out.exists():
        raise DataError(f"{out} already exists — choose another --out or remove it first")
    if dtype not in DTYPES:
        raise DataError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    corpus = ConcatBytes(files)
    n_train = int(corpus.length * (1.0 - val_fraction))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's is 0700: the shards' directory as any other mkdir makes it
    try:
        meta = {"version": 1, "dtype": dtype, "train": [], "val": [], "tokens": {"train": 0, "val": 0}}
        for split, lo, hi in (("train", 0, n_train), ("val", n_train, corpus.length)):
            for i, start in enumerate(range(lo, hi, shard_tokens)):
                n = min(shard_tokens, hi - start)
                name = f"{split}-{i:06d}.bin"
                with open_pieces(tmp / name) as fh:  # not ndarray.tofile: one write() of the whole shard
                    fh.write(memoryview(corpus.read(start, n).astype(DTYPES[dtype])))
                meta[split].append(name)
                meta["tokens"][split] += n
                if progress:
                    progress(name, n)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        for p in tmp.iterdir():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta
