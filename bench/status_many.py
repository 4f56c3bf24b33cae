"""`enlace-remote status` on a host keeping 10 runs against one keeping 1,000 (a few sweeps' worth), over
loopback SSH (its own sshd, like the tests). The two hosts are alternated, each timed --reps times, the
whole command included (driver start, one SSH round trip, the server's `enlace runs`, the table).

    python bench/status_many.py [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enlace.contract import Status  # noqa: E402
from enlace.state import runs  # noqa: E402
from tests.support.remote import DRIVER  # noqa: E402
from tests.support.repocopy import copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402


def fill(remote_dir: Path, n: int) -> None:
    for i in range(n):
        runs.update(remote_dir / "runs" / f"old-{i:04d}", status=Status.FINISHED, step=100, max_steps=100, loss=2.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        repo = copy_worktree_repo(base / "repo", "bench")
        servers = {n: make_server(base / f"h{n}", name="testhost") for n in (10, 1000)}
        try:
            times: dict[int, list[float]] = {10: [], 1000: []}
            for n, srv in servers.items():
                env = {**os.environ, "PYTHONPATH": str(REPO), **srv.env}
                subprocess.run(
                    [*DRIVER, "--host", "testhost", "setup"], cwd=repo, env=env, check=True, capture_output=True
                )
                fill(srv.dir.parent / "remote-testhost", n)
            for _ in range(args.reps):
                for n, srv in servers.items():
                    env = {**os.environ, "PYTHONPATH": str(REPO), **srv.env}
                    t0 = time.perf_counter()
                    out = subprocess.run(
                        [*DRIVER, "--host", "testhost", "status"], cwd=repo, env=env, capture_output=True, text=True
                    )
                    times[n].append(time.perf_counter() - t0)
                    if out.returncode != 0 or out.stdout.count("old-") != n:
                        raise SystemExit(f"status on the {n}-run host failed: {out.stderr[-500:]}")
            med = {n: statistics.median(t) for n, t in times.items()}
            for n in times:
                print(f"status, {n:>5} runs: median {med[n]:.3f} s (min {min(times[n]):.3f}, max {max(times[n]):.3f})")
            print(f"ratio 1000/10: {med[1000] / med[10]:.2f}x")
        finally:
            for srv in servers.values():
                srv.stop()


if __name__ == "__main__":
    main()
