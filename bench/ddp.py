"""Global tokens/s of the smoke model under torchrun with world size 2 vs 1 (gloo, CPU, same
per-rank batch), as a ratio, next to the machine's core count (a 2-core machine bounds it:
torchrun gives each rank 1 thread). The point is correctness plus the figure.

    python bench/ddp.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(world: int, steps: int, runs_dir: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "enlace",
        "train",
        "smoke-cpu",
        "--root",
        str(REPO),
        "--runs-dir",
        runs_dir,
        "--resume",
        "none",
        "--until",
        str(steps),
        "--set",
        "training.eval_every=0",
        "--set",
        "checkpoint.every=0",
    ]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    lines = (Path(runs_dir) / "smoke-cpu" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if '"summary"' in line][-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        w1, w2 = run(1, args.steps, one), run(2, args.steps, two)
    print(f"smoke-cpu, {args.steps} steps, gloo on CPU, {os.cpu_count()} cores, 1 thread per rank:")
    print(f"  world 1: {w1['tokens_per_s']:8.0f} tokens/s")
    print(f"  world 2: {w2['tokens_per_s']:8.0f} tokens/s (global)")
    print(
        f"  ratio world2/world1 = {w2['tokens_per_s'] / w1['tokens_per_s']:.2f}  (ideal 2.0; bounded by "
        f"{os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
