"""A run's data as the trainer opens it: the configured stream for a split, the files it reads, and their
identity (stored in every checkpoint). Both streams expose `next_batch() -> (x, y)`, `batch_at(k)`,
`state_dict()` and `load_state_dict()`; x and y are int64 tensors of shape (batch, seq_len), y shifted by one
byte."""

from __future__ import annotations

from pathlib import Path

from enlace.config.schema import Config
from enlace.data.bytestream import ByteStream
from enlace.data.paths import require_shard_window, resolve_paths, run_files, shard_tokens, split_bounds
from enlace.data.shards import ShardStream

FULL_HASH_LIMIT = 1 << 30  # corpora up to 1 GiB are hashed whole; larger ones by size + head/tail samples
SAMPLE = 1 << 20


def build_stream(cfg: Config, split: str, batch_size: int, rank: int = 0, world: int = 1):
    """The configured stream for `split` ("train" or "val"), sharded for `rank` of `world`."""
    d, seed = cfg.data, cfg.runtime.seed
    if d.kind == "bytes":
        files = resolve_paths(d.paths, cfg.root, run=cfg.run_file)
        return ByteStream(files, cfg.model.seq_len, batch_size, split, d.val_fraction, seed, rank, world)
    return ShardStream(cfg.root / d.shard_dir, cfg.model.seq_len, batch_size, split, seed, rank, world)


def data_files(cfg: Config) -> list[str]:
    """Every file the run reads (for `verify --for-launch`); raises DataError if one is missing."""
    return [str(p) for p in run_files(cfg.data, cfg.root, cfg.run_file)]


def require_splits(cfg: Config, files: list[str]) -> None:
    """verify's check that the data holds a batch's window for each split (DataError in the stream's own words):
    an empty file, or a val shard shorter than a batch, passed every check, then failed as training began. The
    stream checks again as it starts."""
    if cfg.data.kind == "bytes":
        length = sum(Path(f).stat().st_size for f in files)
        for split in ("train", "val"):
            split_bounds(length, cfg.data.val_fraction, split, cfg.model.seq_len)
        return
    t, shard_dir = cfg.training, cfg.root / cfg.data.shard_dir  # seen: generate's small val shard passed verify
    for split, batch in (("train", t.batch_size), ("val", t.eval_batch_size or t.batch_size)):
        need = batch * cfg.model.seq_len + 1  # one rank's; a launch on N GPUs needs N times that (said as it starts)
        require_shard_window(shard_dir, split, shard_tokens(shard_dir, split), need)


def data_identity(cfg: Config) -> dict:
    """What the run reads, by content: file count, total bytes and one sha256 over every file's name,
    size and bytes (corpora over 1 GiB: each file's first and last MiB). Stored in every checkpoint; a
    resume on other data (e.g. another machine's stdlib) is refused instead of silently not exact."""
    import hashlib

    files = [Path(f) for f in data_files(cfg)]
    sizes = [f.stat().st_size for f in files]
    whole = sum(sizes) <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    for f, size in zip(files, sizes):
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if whole or size <= 2 * SAMPLE:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
            else:
                h.update(fh.read(SAMPLE))
                fh.seek(size - SAMPLE)
                h.update(fh.read(SAMPLE))
    return {"files": len(files), "bytes": sum(sizes), "sha256": h.hexdigest(), "sampled": not whole}
