"""`enlace-remote data push` on loopback SSH (its own sshd, like the tests), against `rsync -a` over the
same ssh host:

1. a fresh push of SIZE MiB (a few large files and many small ones) vs `rsync -a` of the same directory,
   median of --reps alternated runs (each tool first in every other pair, each timed run started with
   nothing left to write back: on ext4 it otherwise paid for the run before), each into an empty place (CLI
   start included); what each wrote is moved aside and removed only once a size is done: on ext4, creating
   thousands of files within seconds of deleting thousands is several times slower (`perf`: half the time in
   recently_deleted under ext4_create), a cost that fell on whichever tool came next;
2. a no-op push of --files small files that are all on the server already (size + mtime match).

The shapes 1gib (one 1 GiB file), 300 (~300 files, ~120 MiB) and 20k (20,000 files of 4 KiB) stand for
--sizes too; --connection shared pushes over OpenSSH's shared connection (what `login` opens).

    python bench/data_push.py [--sizes 200,1024] [--reps 3] [--files 10000] [--connection shared]
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

from tests.support.remote import DRIVER  # noqa: E402
from tests.support.repocopy import commit_all, copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402

CLI = [*DRIVER, "--host", "testhost"]
CONNECTION = ["direct"]  # --connection: which the pushes use (rsync always opens its own ssh)


def shape(root: Path, name: str) -> None:
    """The issue's three shapes: `1gib` one 1 GiB file; `300` ~300 files of ~120 MiB in all; `20k` 20,000
    files of a few KiB. Incompressible."""
    counts = {"1gib": (1, 2**30), "300": (300, 120 * 2**20 // 300), "20k": (20_000, 4096)}
    n, size = counts[name]
    for i in range(n):
        d = root / f"d{i % 100}" if n > 1 else root
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"f{i}.bin", "wb") as fh:
            left = size + (i % 7) * 97 if n > 1 else size
            while left:
                fh.write(os.urandom(min(left, 2**20)))
                left -= min(left, 2**20)


def corpus(root: Path, mib: int) -> None:
    """mib MiB under root: four large files (90%) and 200 small ones, incompressible."""
    root.mkdir(parents=True)
    big = mib * 2**20 * 9 // 10 // 4
    for i in range(4):
        with open(root / f"part-{i}.bin", "wb") as fh:
            for _ in range(big // 2**20):
                fh.write(os.urandom(2**20))
    small = (mib * 2**20 - 4 * (big // 2**20) * 2**20) // 200
    for i in range(200):
        (root / "small" / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (root / "small" / f"d{i % 10}" / f"f{i}.txt").write_bytes(os.urandom(small))


def make_repo(base: Path, name: str) -> Path:
    repo = copy_worktree_repo(base / "repo", "bench")
    (repo / "configs" / "data" / "bench.yaml").write_text(f"kind: bytes\npaths: ['data/{name}/**/*']\n")
    (repo / "configs" / "runs" / "bench.yaml").write_text("data: bench\nprofile: cpu\n")
    commit_all(repo, "bench run")
    return repo


def run(cmd: list[str], env: dict, cwd: Path) -> float:
    """cmd's wall time, started with nothing left to write back (os.sync first, not timed): on this machine's
    ext4, writes run at ~900 MiB/s until a GiB or two is dirty, then at the disk's ~130: without it, each tool
    paid for what the one before had written."""
    os.sync()
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def push_vs_rsync(srv, env: dict, base: Path, repo: Path, mib: int | str, reps: int) -> None:
    src = repo / "data" / f"c{mib}"
    corpus(src, mib) if isinstance(mib, int) else shape(src, mib)
    (repo / "configs" / "data" / "bench.yaml").write_text(f"kind: bytes\npaths: ['data/c{mib}/**/*']\n")
    commit_all(repo, f"bench {mib}")
    subprocess.run([*CLI, "sync"], env=env, cwd=repo, check=True, capture_output=True)
    remote_data = base / "remote-testhost" / "data"
    ssh = " ".join(["ssh", "-F", str(srv.dir / "ssh_config"), "-o", "BatchMode=yes"])
    push_t, rsync_t, aside = [], [], base / "aside"
    aside.mkdir(exist_ok=True)
    os.sync()  # what the shape and the sync wrote is on disk before either tool is timed
    for rep in range(reps):  # each into an empty place; what they wrote is moved aside, removed once done: see above

        def push(rep=rep) -> None:
            push_t.append(run([*CLI, "data", "push", "bench"], env, repo))
            os.rename(remote_data / f"c{mib}", aside / f"push-{mib}-{rep}")

        def rsync(rep=rep) -> None:
            dest = aside / f"rsync-{mib}-{rep}"
            rsync_t.append(run(["rsync", "-a", "-e", ssh, f"{src}/", f"testhost:{dest}/"], env, repo))

        for tool in (push, rsync) if rep % 2 == 0 else (rsync, push):  # neither always pays the other's writeback
            tool()
    shutil.rmtree(aside)
    os.sync()  # the removal's own work done before the next size
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file()) / 2**20
    p, r = statistics.median(push_t), statistics.median(rsync_t)
    files = sum(1 for f in src.rglob("*") if f.is_file())
    print(f"push of {size:.0f} MiB ({files} files), median of {reps}, connection {CONNECTION[0]}:")
    print(f"  enlace-remote data push: {p:6.2f} s  {size / p:6.0f} MiB/s  (sha256 both sides, CLI start)")
    print(
        f"  rsync -a               : {r:6.2f} s  {size / r:6.0f} MiB/s   ratio push/rsync = {r / p:.2f}x (goal >= 1.0)"
    )
    shutil.rmtree(src)


def noop(env: dict, repo: Path, n: int, reps: int) -> None:
    src = repo / "data" / "many"
    for i in range(n):
        (src / f"d{i % 100}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 100}" / f"f{i}.txt").write_bytes(b"x" * (i % 50 + 1))
    (repo / "configs" / "data" / "bench.yaml").write_text("kind: bytes\npaths: ['data/many/**/*.txt']\n")
    commit_all(repo, "bench many")
    subprocess.run([*CLI, "sync"], env=env, cwd=repo, check=True, capture_output=True)
    run([*CLI, "data", "push", "bench"], env, repo)
    times = [run([*CLI, "data", "push", "bench"], env, repo) for _ in range(reps)]
    print(
        f"no-op push of {n} files (all on the server), median of {reps}: {statistics.median(times):.2f} s (goal < 0.3)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="200,1024", help="MiB of the mixed corpus, or the shapes 1gib, 300, 20k")
    ap.add_argument("--connection", choices=["direct", "shared"], default="direct")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-push-"))
    srv = make_server(base)
    CONNECTION[0] = args.connection
    if args.connection == "shared":
        srv.share_connection()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENLACE_CONTROL_DIR": str(base / "cm"), **srv.env}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        repo = make_repo(base, "c0")
        for mib in (int(s) if s.isdigit() and s != "300" else s for s in args.sizes.split(",") if s):
            push_vs_rsync(srv, env, base, repo, mib, args.reps)
        noop(env, repo, args.files, args.reps)
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
