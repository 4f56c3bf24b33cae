"""enlace-remote on loopback SSH (its own sshd, like the tests):

1. launch overhead: `launch --no-preflight` of an already-synced commit until the trainer is
   detached (sync check + verify + start), and separately the wait until its first logged step;
2. log latency: a line appended to the server's train.log → printed by `logs -f` here
   (median and p95 over N lines);
3. fetch throughput of a ~200 MiB checkpoint vs plain `rsync` and `scp` of the same files (ratio),
   median of --reps alternated runs (a fresh destination each time, CLI start included); also fetch
   on a machine without an ssh client (PATH holds only git): the same wire over paramiko's channel.
   The driver's bytecode is cached, as on a user's machine (PYTHONDONTWRITEBYTECODE is dropped).

    python bench/remote.py [--lines 40] [--mib 200] [--reps 3] [--only fetch]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.remote import DRIVER, tiny_corpus  # noqa: E402
from tests.support.repocopy import commit_all, copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402

CLI = [*DRIVER, "--host", "testhost"]


def make_repo(base: Path) -> Path:
    repo = copy_worktree_repo(base / "repo", "bench")
    (repo / "configs" / "data" / "tiny.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\n")
    (repo / "configs" / "runs" / "long.yaml").write_text(
        "data: tiny\nprofile: cpu\nmodel: {seq_len: 32, n_layer: 2, n_head: 2, d_model: 32}\n"
        "training: {batch_size: 4, max_steps: 1000000, log_every: 50, eval_every: 0}\ncheckpoint: {every: 0}\n"
    )
    commit_all(repo, "bench runs")
    return repo


def bare_start(env: dict, rd: Path) -> float:
    """The floor launch is measured against: one ssh command that starts the trainer detached in the
    synced tree, until its first step line appears in its log (polled here every 10 ms)."""
    tree = next((rd / "trees").iterdir())
    log = rd / "bare.log"
    cmd = (
        f"cd {tree} && setsid {sys.executable} -m enlace train long --runs-dir {rd}/bare-runs "
        f"--until 3 > {log} 2>&1 < /dev/null &"
    )
    t0 = time.perf_counter()
    subprocess.run(["ssh", "-F", env["ENLACE_SSH_CONFIG"], "testhost", cmd], check=True)
    while "| loss " not in (log.read_text() if log.exists() else ""):  # the first step line
        time.sleep(0.01)
    return time.perf_counter() - t0


def timed_lines(cmd, env, cwd):
    """Run cmd; return [(seconds since start, stderr line)]."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    out = [(time.perf_counter() - t0, line) for line in p.stderr]
    assert p.wait() == 0, out
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=["launch", "fetch"], default=None)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-remote-"))
    srv = make_server(base)
    env = {**os.environ, "PYTHONPATH": str(REPO), **srv.env}
    # Timed as on a user's machine, where Python caches bytecode: with PYTHONDONTWRITEBYTECODE set (some
    # sandboxes set it) every driver start would compile its modules again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rd = base / "remote-testhost"
    try:
        repo = make_repo(base)
        tiny_corpus(rd)
        subprocess.run([*CLI, "sync"], env=env, cwd=repo, check=True, capture_output=True)
        if args.only != "fetch":
            launch_and_logs(env, repo, rd, args.lines)
        else:
            subprocess.run([*CLI, "launch", "long", "--no-preflight", "--until", "1"], env=env, cwd=repo, check=True)
            subprocess.run([*CLI, "logs", "long", "-f"], env=env, cwd=repo, check=True, capture_output=True)
        if args.only != "launch":
            fetch_vs_rsync(srv, env, repo, rd, base, args.mib, args.reps)
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


def launch_and_logs(env: dict, repo: Path, rd: Path, n_lines: int) -> None:
    bare = bare_start(env, rd)
    lines = timed_lines([*CLI, "launch", "long", "--no-preflight"], env, repo)
    detached = next(t for t, line in lines if line.startswith("launched"))
    first = lines[-1][0]
    print(
        f"launch (synced commit, --no-preflight): detached after {detached:.2f} s (goal < 2 s); first step "
        f"logged after {first:.2f} s incl. trainer start-up; bare `ssh host setsid python -m enlace train`: "
        f"{bare:.2f} s; ratio launch/bare = {first / bare:.2f}x (goal <= 1.5)"
    )

    follower = subprocess.Popen([*CLI, "logs", "long", "-f"], env=env, cwd=repo, stdout=subprocess.PIPE)
    sent: dict[str, float] = {}
    got: dict[str, float] = {}

    def reader():
        for raw in follower.stdout:
            if raw.startswith(b"MARK "):
                got[raw.split()[1].decode()] = time.perf_counter()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    time.sleep(2)
    with open(rd / "runs" / "long" / "train.log", "a") as log:
        for i in range(n_lines):
            key = f"m{i}"
            sent[key] = time.perf_counter()
            log.write(f"MARK {key}\n")
            log.flush()
            time.sleep(0.1)
    time.sleep(2)
    subprocess.run([*CLI, "stop", "long"], env=env, cwd=repo, check=True, capture_output=True)
    follower.wait(timeout=60)
    lat = sorted(got[k] - sent[k] for k in sent if k in got)
    p95 = lat[int(0.95 * (len(lat) - 1))]
    print(
        f"log latency over {len(lat)}/{len(sent)} lines: median {statistics.median(lat) * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms (goal p95 < 500 ms)"
    )


def fetch_vs_rsync(srv, env: dict, repo: Path, rd: Path, base: Path, mib: int, reps: int) -> None:
    big = rd / "runs" / "long" / "checkpoints" / "step-999999"
    import torch

    from enlace.train.checkpoint import save_checkpoint

    n = mib * 2**20 // 4 // 4
    save_checkpoint(big.parent, 999999, {f"part{i}.pt": torch.rand(n) for i in range(4)}, keep=5)
    size = sum(f.stat().st_size for f in big.iterdir()) / 2**20
    fetch_t, fallback_t, rsync_t, scp_t = [], [], [], []
    ssh = ["ssh", "-F", str(srv.dir / "ssh_config"), "-o", "BatchMode=yes"]
    no_ssh = without_ssh_client(env, base)
    for rep in range(reps):
        for times, run_env, dest in ((fetch_t, env, base / f"fetch-{rep}"), (fallback_t, no_ssh, base / f"pm-{rep}")):
            t0 = time.perf_counter()
            subprocess.run(
                [*CLI, "fetch", "long", "--dest", str(dest)], env=run_env, cwd=repo, check=True, capture_output=True
            )
            times.append(time.perf_counter() - t0)
            shutil.rmtree(dest)
        t0 = time.perf_counter()
        subprocess.run(
            ["rsync", "-a", "-e", " ".join(ssh), f"testhost:{big}/", str(base / f"rsync-{rep}") + "/"], check=True
        )
        rsync_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(
            ["scp", "-q", "-F", str(srv.dir / "ssh_config"), "-r", f"testhost:{big}", str(base / f"scp-{rep}")],
            check=True,
        )
        scp_t.append(time.perf_counter() - t0)
        for d in (base / f"rsync-{rep}", base / f"scp-{rep}"):
            shutil.rmtree(d, ignore_errors=True)  # the page cache, not the disk, should be the limit
    f, p, r, s = (statistics.median(x) for x in (fetch_t, fallback_t, rsync_t, scp_t))
    print(f"fetch of a {size:.0f} MiB checkpoint, median of {reps}:")
    print(f"  enlace-remote fetch : {f:5.2f} s  {size / f:6.0f} MiB/s  (incl. sha256 verify, CLI start)")
    print(f"  plain rsync         : {r:5.2f} s  {size / r:6.0f} MiB/s   ratio fetch/rsync = {r / f:.2f}x (goal >= 0.9)")
    print(f"  plain scp           : {s:5.2f} s  {size / s:6.0f} MiB/s   ratio fetch/scp   = {s / f:.2f}x")
    print(f"  fetch, no ssh client: {p:5.2f} s  {size / p:6.0f} MiB/s   ratio vs rsync    = {r / p:.2f}x (goal >= 0.8)")


def without_ssh_client(env: dict, base: Path) -> dict:
    """env with a PATH that holds only git (enlace-remote finds the repo with it): no `ssh`, so fetch
    runs its wire over a channel of paramiko's connection, as on a machine without OpenSSH's client."""
    bin_dir = base / "no-ssh-bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    return {**env, "PATH": str(bin_dir)}


if __name__ == "__main__":
    main()
