"""How long one large checkpoint file takes to reach the disk: torch.save into `open(path, "wb")`, then fsync
(how checkpoint files were written before), against `enlace.manifest.write_file` (the same, its writes handed
to the kernel WRITE_PIECE bytes at a time). torch.save gives each tensor's bytes to one write(); Linux 6.x sizes
a file's page-cache folios by the write, and on ext4 large writes stall (docs/benchmarks.md). The two take
turns (A B B A ...; the machine is noisy) in one process, on the same state.

    python bench/checkpoint_write.py [--mib 1024] [--tensors 4] [--pairs 3] [--dir DIR (default: TMPDIR)]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from enlace.manifest import write_file


def whole(path: Path, state: dict) -> None:
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def pieces(path: Path, state: dict) -> None:
    write_file(path, lambda fh: torch.save(state, fh))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="the state's size (default: %(default)s)")
    ap.add_argument("--tensors", type=int, default=4, help="split over this many tensors (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=3, help="A B B A pairs (default: %(default)s)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a folder under TMPDIR)")
    args = ap.parse_args()
    each = args.mib * 2**20 // args.tensors // 4  # float32 elements per tensor
    state = {f"w{i}": torch.randn(each) for i in range(args.tensors)}
    times: dict[str, list[float]] = {"whole": [], "pieces": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for i in range(args.pairs):
            for name in ("whole", "pieces") if i % 2 == 0 else ("pieces", "whole"):
                path = Path(tmp) / f"{name}.pt"
                t0 = time.perf_counter()
                (whole if name == "whole" else pieces)(path, state)
                times[name].append(time.perf_counter() - t0)
                path.unlink()
    a, b = statistics.median(times["whole"]), statistics.median(times["pieces"])
    print(f"{args.mib} MiB in {args.tensors} tensors, saved and fsynced in {tmp}:")
    for name, ts in times.items():
        print(f"  {name:6s}: median {statistics.median(ts):.2f} s ({', '.join(f'{t:.2f}' for t in ts)})")
    print(f"  speed-up whole/pieces = {a / b:.2f}")


if __name__ == "__main__":
    main()
