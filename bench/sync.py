"""sync + verify of a one-line change over loopback SSH, vs a plain `git push` + `ssh true` of
the same kind of commit. Starts its own sshd (like the tests). Goal: < 1.5 s and within 3x.

    python bench/sync.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.remote import DRIVER  # noqa: E402
from tests.support.repocopy import copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402


def sh(*args, env=None, cwd=None):
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd=cwd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-sync-"))
    srv = make_server(base)
    try:
        repo = copy_worktree_repo(base / "repo", "base")
        git = ["git", "-C", str(repo), "-c", "user.email=b@x.invalid", "-c", "user.name=b"]
        env = {**os.environ, "PYTHONPATH": str(REPO), **srv.env}
        cli = [*DRIVER, "--host", "testhost"]
        sh(*cli, "sync", env=env, cwd=repo)  # first sync: pushes the whole history

        d = srv.dir
        ssh = ["ssh", "-F", str(d / "ssh_config"), "-o", "BatchMode=yes"]
        plain_remote = base / "plain.git"
        sh("git", "init", "-q", "--bare", str(plain_remote))
        url = f"ssh://testhost{plain_remote}"  # the alias carries port, key and known_hosts
        penv = {
            **os.environ,
            "GIT_SSH_COMMAND": shlex.join(
                ["ssh", "-F", str(d / "ssh_config"), "-o", "BatchMode=yes", "-i", str(d / "client_key")]
            ),
        }
        sh(*git, "push", "-q", url, "HEAD:refs/heads/main", env=penv)

        ours, plain = [], []
        for i in range(args.reps):
            with open(repo / "configs" / "runs" / "smoke-cpu.yaml", "a") as fh:
                fh.write(f"# edit {i}\n")
            sh(*git, "commit", "-qam", f"edit {i}")
            t0 = time.perf_counter()
            sh(*git, "push", "-q", url, "HEAD:refs/heads/main", env=penv)
            sh(*ssh, "testhost", "true")
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sh(*cli, "sync", env=env, cwd=repo)
            sh(*cli, "verify", "smoke-cpu", env=env, cwd=repo)
            ours.append(time.perf_counter() - t0)
        o, p = statistics.median(ours), statistics.median(plain)
        print(f"one-line change, loopback sshd, median of {args.reps}:")
        print(f"  plain git push + ssh true          : {p:6.2f} s")
        print(f"  enlace-remote sync + verify        : {o:6.2f} s   (goal < 1.5 s)")
        print(f"  ratio                              : {o / p:6.2f}x  (goal <= 3x)")
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
