"""The one owner of "the sha256 of a file" (checkpoints' MANIFEST, fetch, data push, both halves), of writing
large files in pieces (received bytes at both ends of fetch and data push, checkpoints, shards), and of the
server venv's key, which enlace/remote/remote.sh computes the same way in bash (a test holds them equal).
Standard library only: the driver imports it."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

CHUNK = 1 << 20
# The most one write() hands the kernel. Linux 6.x sizes a file's page-cache folios by the write, and on this
# project's ext4 writes of a megabyte and more stalled while 256 KiB and 64 KiB ones did not (high-order pages
# to find; the figures are in docs/benchmarks.md). rsync's receiver writes 32 KiB.
WRITE_PIECE = 256 << 10


def file_sha256(path: Path, count: int | None = None):
    """The sha256 object of the file's first `count` bytes (all of it when None): hexdigest() for the hex,
    or update() on to hash what follows (a resumed transfer)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        left = count
        while left is None or left > 0:
            chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h


def fd_sha256(fd: int, count: int):
    """The sha256 object of an open file's first `count` bytes (fewer where it ends sooner), read with pread (the
    offset stays where it is): hexdigest() for the hex, or update() on with what follows."""
    h, offset = hashlib.sha256(), 0
    while offset < count:
        chunk = os.pread(fd, min(count - offset, CHUNK), offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    return h


def write_all(fd: int, data) -> None:
    """All of `data` (bytes or a memoryview) to `fd`, WRITE_PIECE bytes at most per write()."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:WRITE_PIECE]) :]


class PieceFile(io.FileIO):
    """A file whose write() hands the kernel WRITE_PIECE bytes at most; the io.BufferedWriter over it writes on
    until all is out. torch.save gives each tensor's bytes to one write(), ndarray.tofile a whole shard: on ext4
    a large checkpoint saved several times faster in pieces (bench/large_writes.py, docs/benchmarks.md)."""

    def write(self, data) -> int:
        return os.write(self.fileno(), memoryview(data).cast("B")[:WRITE_PIECE])


def open_pieces(path: Path):
    """`path` opened for writing ("wb"), its writes handed to the kernel WRITE_PIECE bytes at a time; buffered as
    open() buffers (the file system's block size, 8 KiB at least)."""
    raw = PieceFile(path, "w")
    return io.BufferedWriter(raw, max(io.DEFAULT_BUFFER_SIZE, os.fstat(raw.fileno()).st_blksize))


VENV_KEY_FILES = ("pyproject.toml", "constraints.txt")


def venv_key(tree: Path) -> str:
    """Which server venv a tree uses: the first 16 hex of sha256(pyproject.toml + constraints.txt), as
    enlace/remote/remote.sh's `cat pyproject.toml constraints.txt | sha256sum | cut -c1-16` (a missing file adds
    nothing, as `cat 2>/dev/null` does)."""
    h = hashlib.sha256()
    for name in VENV_KEY_FILES:
        if (tree / name).is_file():
            h.update((tree / name).read_bytes())
    return h.hexdigest()[:16]
