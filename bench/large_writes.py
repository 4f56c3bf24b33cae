"""How long large files take to reach the disk, written whole per write() (as before) against
WRITE_PIECE bytes per write() (enlace.hashing.open_pieces, now):

    checkpoint  one checkpoint file: torch.save into `open(path, "wb")`, then fsync, against
                `enlace.manifest.write_file` (torch.save gives each tensor's bytes to one write())
    shards      a corpus's shards: ndarray.tofile each, then fsync, against `prepare_shards`'s writes

Linux 6.x sizes a file's page-cache folios by the write, and on ext4 large writes stall
(docs/benchmarks.md). The two ways take turns (A B B A ...; the machine is noisy) in one process.

    python bench/large_writes.py [--mib 1024] [--tensors 4] [--pairs 3] [--dir DIR (default: TMPDIR)]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from enlace.hashing import open_pieces
from enlace.manifest import write_file

SHARD = 16 << 20  # prepare_shards' default: 2**24 tokens, uint8


def checkpoint(way: str, folder: Path, state: dict) -> None:
    path = folder / "model.pt"
    if way == "whole":
        with open(path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
    else:
        write_file(path, lambda fh: torch.save(state, fh))


def shards(way: str, folder: Path, corpus: np.ndarray) -> None:
    paths = [folder / f"train-{i:06d}.bin" for i in range(len(corpus) // SHARD)]
    for i, path in enumerate(paths):
        shard = corpus[i * SHARD : (i + 1) * SHARD]
        if way == "whole":
            shard.tofile(path)
        else:
            with open_pieces(path) as fh:
                fh.write(memoryview(shard))
    for path in paths:
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="bytes written per run, in MiB (default: %(default)s)")
    ap.add_argument("--tensors", type=int, default=4, help="the checkpoint's tensors (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=3, help="A B B A pairs (default: %(default)s)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a folder under TMPDIR)")
    args = ap.parse_args()
    cases = {
        "checkpoint": (
            checkpoint,
            {f"w{i}": torch.randn(args.mib * 2**18 // args.tensors) for i in range(args.tensors)},
        ),
        "shards": (shards, np.frombuffer(os.urandom(args.mib << 20), dtype=np.uint8)),
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"{args.mib} MiB per run in {tmp}")
        for case, (write, what) in cases.items():
            times: dict[str, list[float]] = {"whole": [], "pieces": []}
            for i in range(args.pairs):
                for way in ("whole", "pieces") if i % 2 == 0 else ("pieces", "whole"):
                    folder = Path(tmp) / f"{case}-{way}-{i}"
                    folder.mkdir()
                    t0 = time.perf_counter()
                    write(way, folder, what)
                    times[way].append(time.perf_counter() - t0)
                    for f in folder.iterdir():
                        f.unlink()
            a, b = statistics.median(times["whole"]), statistics.median(times["pieces"])
            for way, ts in times.items():
                print(
                    f"  {case:10s} {way:6s}: median {statistics.median(ts):.3f} s ({', '.join(f'{t:.3f}' for t in ts)})"
                )
            print(f"  {case:10s} speed-up whole/pieces = {a / b:.2f}")


if __name__ == "__main__":
    main()
