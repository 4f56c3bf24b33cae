"""Checkpoint cost and deterministic-mode cost on this machine, as ratios.

1. save time of enlace's atomic checkpoint (temp dir, fsync, sha256 MANIFEST, rename) vs a raw
   torch.save of the same state into one file (same process, interleaved repetitions);
2. training tokens/s with runtime.deterministic on vs off (each in its own child process, since
   deterministic mode changes process-wide settings: 1 CPU thread, deterministic kernels).

    python bench/checkpoint.py [--reps 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import fixed_batches, smoke_config
from enlace.train import engine
from enlace.train.checkpoint import save_checkpoint


def child_throughput(deterministic: bool, steps: int) -> None:
    cfg = smoke_config(f"runtime.deterministic={str(deterministic).lower()}")
    setup = engine.build_setup(cfg)
    batches = fixed_batches(cfg, steps + 3)
    it = iter(batches)
    for step in range(3):
        engine.train_step(setup, step, lambda: next(it))
    t0 = time.perf_counter()
    for step in range(steps):
        r = engine.train_step(setup, step, lambda: next(it))
    r.loss.item()
    tokens = steps * cfg.training.batch_size * cfg.model.seq_len
    print(json.dumps({"tokens_per_s": tokens / (time.perf_counter() - t0), "threads": torch.get_num_threads()}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", choices=["det", "nondet"])
    args = ap.parse_args()
    if args.child:
        return child_throughput(args.child == "det", args.steps)

    cfg = smoke_config()
    setup = engine.build_setup(cfg)
    batches = iter(fixed_batches(cfg, 3))
    for step in range(3):  # materialise the optimizer state
        engine.train_step(setup, step, lambda: next(batches))
    state = engine.capture_state(setup, [{"data": {}, "rng": {}}], {"step": 3, "tokens": 0}, "bench")
    t_raw, t_ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.reps):
            t0 = time.perf_counter()
            with open(Path(tmp) / f"raw-{i}.pt", "wb") as fh:
                torch.save(state, fh)
            t_raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            path = save_checkpoint(Path(tmp) / "ckpts", i + 1, state, keep=2)
            t_ours.append(time.perf_counter() - t0)
        size = sum(f.stat().st_size for f in path.iterdir())
    raw, ours = statistics.median(t_raw), statistics.median(t_ours)
    print(f"checkpoint of the smoke-cpu model + AdamW state: {size / 2**20:.1f} MiB")
    print(f"  raw torch.save (one file, no fsync) : {raw * 1000:7.1f} ms")
    print(f"  enlace save (fsync, sha256, rename) : {ours * 1000:7.1f} ms")
    print(f"  ratio enlace/raw = {ours / raw:.2f}")

    runs = {}
    for mode in ("nondet", "det"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ},
        )
        runs[mode] = json.loads(out.stdout)
    nd, d = runs["nondet"], runs["det"]
    print(f"training throughput, smoke-cpu model, {args.steps} steps:")
    print(f"  deterministic off : {nd['tokens_per_s']:8.0f} tokens/s ({nd['threads']} threads)")
    print(f"  deterministic on  : {d['tokens_per_s']:8.0f} tokens/s ({d['threads']} thread)")
    print(f"  ratio on/off = {d['tokens_per_s'] / nd['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
