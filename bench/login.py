"""A verb after a login against a bare `ssh host true`, on loopback SSH (its own sshd, like the tests):

1. `ssh host true`: a fresh connection (handshake, key authentication, one command): the floor a verb
   without connection sharing pays before its own work;
2. `enlace-remote status RUN` on a `connection: shared` host whose master is open (what a login gives:
   no handshake; the driver's own start, one `ssh -S` and the server's answer);
3. the same `status` on the default direct path (paramiko's own connection, handshake included).

Alternated, --reps rounds, medians; the driver's bytecode cached as on a user's machine. With --rtt-ms,
again through a ProxyCommand that holds every chunk half that long each way (bench/_delay_proxy.py): a
network's round trip, which a handshake pays several times and a shared connection's command once.

    python bench/login.py [--reps 15] [--rtt-ms 0,40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.remote import DRIVER, tiny_corpus  # noqa: E402
from tests.support.repocopy import commit_all, copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402


def timed(cmd: list[str], env: dict, cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def rounds(env: dict, repo: Path, reps: int, where: str) -> None:
    bare = ["ssh", "-F", env["ENLACE_SSH_CONFIG"], "-o", "BatchMode=yes", "testhost", "true"]
    shared = [*DRIVER, "--host", "shared", "status", "tiny"]
    direct = [*DRIVER, "--host", "testhost", "status", "tiny"]
    timed(shared, env, repo)  # opens the master (what `login` does), warms the bytecode
    times: dict[str, list[float]] = {"ssh host true": [], "status, shared": [], "status, direct": []}
    for _ in range(reps):
        times["ssh host true"].append(timed(bare, env, repo))
        times["status, shared"].append(timed(shared, env, repo))
        times["status, direct"].append(timed(direct, env, repo))
    floor = statistics.median(times["ssh host true"])
    print(f"median of {reps} alternated rounds ({where}):")
    for what, ts in times.items():
        med = statistics.median(ts)
        print(f"  {what:16} {med * 1000:7.0f} ms   {med / floor:5.2f}x ssh host true")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rtt-ms", default="0,40", help="round trips to measure at, comma-separated")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-login-"))
    srv = make_server(base)
    hosts = srv.dir / "hosts.yaml"
    rd = base / "remote-testhost"
    hosts.write_text(
        hosts.read_text() + f"  shared:\n    ssh: testhost\n    remote_dir: {rd}\n    python: {sys.executable}\n"
        "    connection: shared\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENLACE_CONTROL_DIR": str(base / "cm"), **srv.env}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        repo = copy_worktree_repo(base / "repo", "bench")
        (repo / "configs" / "data" / "tiny.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\n")
        (repo / "configs" / "runs" / "tiny.yaml").write_text(
            "data: tiny\nprofile: cpu\nmodel: {seq_len: 32, n_layer: 1, n_head: 2, d_model: 32}\n"
            "training: {batch_size: 4, max_steps: 3, log_every: 1, eval_every: 0}\noptim: {warmup_steps: 1}\n"
            "checkpoint: {every: 0}\n"
        )
        commit_all(repo, "bench run")
        tiny_corpus(rd)
        subprocess.run(
            [*DRIVER, "--host", "testhost", "launch", "tiny", "--no-preflight"], env=env, cwd=repo, check=True
        )
        config = Path(env["ENLACE_SSH_CONFIG"])
        plain = config.read_text()
        for rtt in (float(r) for r in args.rtt_ms.split(",")):
            delay = f"Host testhost\n  ProxyCommand {sys.executable} {REPO}/bench/_delay_proxy.py %h %p {rtt / 2}\n"
            config.write_text(plain + (delay if rtt else ""))
            subprocess.run([*DRIVER, "--host", "shared", "logout"], env=env, cwd=repo, capture_output=True)
            rounds(env, repo, args.reps, f"loopback sshd, {rtt:g} ms round trip")
    finally:
        if (base / "repo").is_dir():
            subprocess.run([*DRIVER, "--host", "shared", "logout"], env=env, cwd=base / "repo", capture_output=True)
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
