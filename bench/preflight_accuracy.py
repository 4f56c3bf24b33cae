"""How well preflight predicts a real run: peak RSS and tokens/s of `enlace preflight RUN` vs
what `enlace train RUN` itself logs (its summary record), for the same config. Goal: within 15 %.

    python bench/preflight_accuracy.py [RUN] [--steps N]   (default smoke-cpu, its own max_steps)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
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
    args = ap.parse_args()
    pre = json.loads(enlace("preflight", args.run, "--json"))
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


if __name__ == "__main__":
    main()
