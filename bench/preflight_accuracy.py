"""How well preflight predicts a real run: peak RSS and tokens/s of `enlace preflight RUN` vs
what `enlace train RUN` itself logs (its summary record), for the same config. Goal: within 15 %.
Also how long users wait: preflight's wall time (goal < 30 s for smoke-cpu on an idle 2-core
machine) and `--max-batch`'s, with its number of probes (goal < 60 s), under --memory-limit
(default 2GiB: with the machine's whole memory as the cap the boundary of smoke-cpu lies near batch
3000, where one CPU step takes tens of seconds).

    python bench/preflight_accuracy.py [RUN] [--steps N] [--max-batch-limit 2GiB]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def enlace(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "enlace", *args, "--root", str(REPO)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default="smoke-cpu")
    ap.add_argument("--steps", type=int, default=None, help="train this many steps (default: max_steps)")
    ap.add_argument("--max-batch-limit", default="2GiB")
    args = ap.parse_args()
    t0 = time.perf_counter()
    pre = json.loads(enlace("preflight", args.run, "--json"))
    pre_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mb = json.loads(enlace("preflight", args.run, "--json", "--max-batch", "--memory-limit", args.max_batch_limit))
    mb_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--until", str(args.steps)] if args.steps else []
        enlace("train", args.run, "--runs-dir", tmp, "--resume", "none", *extra)
        records = [
            json.loads(line) for line in (Path(tmp) / pre["run_name"] / "metrics.jsonl").read_text().splitlines()
        ]
    real = [r for r in records if r["kind"] == "summary"][-1]
    rows = [
        ("peak RSS (MiB)", pre["memory"]["peak_rss_mib"], real["peak_rss_mib"]),
        ("tokens/s", pre["throughput"]["tokens_per_s"], real["tokens_per_s"]),
    ]
    print(f"{args.run}: preflight vs a real train run of {real['steps']} steps")
    print(f"  {'':16} {'preflight':>10} {'train':>10} {'ratio':>7}")
    for name, p, r in rows:
        flag = "" if abs(p / r - 1) <= 0.15 else "   <- outside 15 %"
        print(f"  {name:16} {p:10.1f} {r:10.1f} {p / r:7.3f}{flag}")
    m = mb["max_batch"]
    print(f"  preflight wall time: {pre_s:.1f} s (goal < 30 s for smoke-cpu, idle)")
    print(
        f"  --max-batch under {args.max_batch_limit}: batch_size {m['batch_size']} (first failing "
        f"{m['first_failing']}), {m['probes']} probes, {mb_s:.1f} s wall in all (goal < 60 s)"
    )


if __name__ == "__main__":
    main()
