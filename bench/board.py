"""`enlace-remote board`'s first page: 3 hosts (two sshd servers on loopback and `local`) × 10 runs each,
timed from the start of the `enlace-remote board` process until headless chromium shows all 30 rows;
median of --reps starts. The runs are run directories written directly (run.json, metrics.jsonl): what the
board reads of a run, without training 30 of them.

    python bench/board.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from support.browser import chromium, wait_for  # noqa: E402
from support.remote import DRIVER  # noqa: E402
from support.repocopy import copy_worktree_repo  # noqa: E402
from support.sshd import make_server  # noqa: E402


def fake_runs(remote_dir: Path, n: int) -> None:
    for i in range(n):
        d = remote_dir / "runs" / f"run-{i:02d}"
        d.mkdir(parents=True)
        now = time.time()
        state = {
            "run_name": d.name,
            "status": "finished",
            "step": 100,
            "max_steps": 100,
            "loss": 1.5 + i / 10,
            "tokens_per_s": 12345.0,
            "started_at": now - 600,
            "updated_at": now,
            "commit": "0" * 40,
        }
        (d / "run.json").write_text(json.dumps(state))
        (d / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"kind": "train", "step": s, "loss": 3 - s / 50, "lr": 1e-3, "tokens_per_s": 1e4}) + "\n"
                for s in range(1, 101)
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-board-"))
    servers = [make_server(base / "a", "gpu1"), make_server(base / "b", "gpu2")]
    try:
        hosts = base / "hosts.yaml"
        hosts.write_text(
            (servers[0].dir / "hosts.yaml").read_text()
            + "".join((s.dir / "hosts.yaml").read_text().split("  local:")[0].split("hosts:\n")[1] for s in servers[1:])
        )
        ssh_config = base / "ssh_config"
        ssh_config.write_text("".join((s.dir / "ssh_config").read_text() for s in servers))
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "ENLACE_SSH_CONFIG": str(ssh_config),
            "ENLACE_HOSTS_FILE": str(hosts),
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        repo = copy_worktree_repo(base / "repo", "bench")
        for host, rd in (
            ("gpu1", base / "a" / "remote-gpu1"),
            ("gpu2", base / "b" / "remote-gpu2"),
            ("local", base / "a" / "remote-local"),
        ):
            subprocess.run([*DRIVER, "--host", host, "sync"], env=env, cwd=repo, check=True, capture_output=True)
            fake_runs(rd, 10)
        driver = chromium(base / "profile")
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [*DRIVER, "board", "--no-browser", "--hosts", "gpu1,gpu2,local"],
                env=env,
                cwd=repo,
                stderr=subprocess.PIPE,
                text=True,
            )
            line = proc.stderr.readline()
            url = re.search(r"http://\S+", line).group(0)
            driver.get(url)
            wait_for(driver, lambda d: len(d.find_elements("css selector", "tr[data-run]")) == 30, what="30 rows")
            times.append(time.perf_counter() - t0)
            proc.terminate()
            proc.wait()
        driver.quit()
        print(
            f"board first page, 3 hosts x 10 runs, from process start, median of {args.reps}: "
            f"{statistics.median(times):.2f} s (goal < 2; each: {', '.join(f'{t:.2f}' for t in times)})"
        )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
