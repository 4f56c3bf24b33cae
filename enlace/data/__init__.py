"""Data sources. Both streams expose `next_batch() -> (x, y)`, `batch_at(k)`, `state_dict()` and
`load_state_dict()`; x and y are int64 tensors of shape (batch, seq_len), y shifted by one byte."""

from __future__ import annotations

from enlace.config import Config
from enlace.data.bytestream import ByteStream, resolve_paths
from enlace.data.shards import ShardStream, prepare_shards

__all__ = ["ByteStream", "ShardStream", "build_stream", "data_files", "prepare_shards", "resolve_paths"]


def build_stream(cfg: Config, split: str, batch_size: int, rank: int = 0, world: int = 1):
    """The configured stream for `split` ("train" or "val"), sharded for `rank` of `world`."""
    d, seed = cfg.data, cfg.runtime.seed
    if d.kind == "bytes":
        files = resolve_paths(d.paths, cfg.root)
        return ByteStream(files, cfg.model.seq_len, batch_size, split, d.val_fraction, seed, rank, world)
    return ShardStream(cfg.root / d.shard_dir, cfg.model.seq_len, batch_size, split, seed, rank, world)


def data_files(cfg: Config) -> list[str]:
    """Every file the run reads (for `verify --for-launch`); raises DataError if one is missing."""
    d = cfg.data
    if d.kind == "bytes":
        return [str(p) for p in resolve_paths(d.paths, cfg.root)]
    return [str(p) for p in ShardStream.files(cfg.root / d.shard_dir)]
