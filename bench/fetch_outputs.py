"""`enlace-remote fetch` of a command run's outputs (your own script's files: sha256 computed on the server,
checked here as they arrive) against `rsync -a` of the same directory over the same ssh host, on loopback SSH
(its own sshd, like the tests), at the shapes bench/data_push.py pushes: one 1 GiB file, ~300 files of ~120
MiB in all, 20,000 files of 4 KiB. Alternated, medians of --reps, each into an emptied destination (CLI start
included), each tool first in every other pair and the disk synced between shapes (each timed run starts with
nothing left to write back: on ext4 it otherwise paid for the run before); --connection shared fetches over
OpenSSH's shared connection (what `login` opens). Each fetch and each rsync writes into a new destination, and
they are removed only once a shape is done: on ext4, creating thousands of files within seconds of deleting
thousands in the same tree is several times slower (`perf`: half the time in recently_deleted under
ext4_create), a cost that fell on whichever tool came next.

    python bench/fetch_outputs.py [--shapes 1gib,300,20k] [--reps 3] [--connection shared]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from data_push import shape  # noqa: E402

from tests.support.remote import DRIVER  # noqa: E402
from tests.support.repocopy import commit_all, copy_worktree_repo  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402

CLI = [*DRIVER, "--host", "testhost"]


def timed(cmd: list[str], env: dict, cwd: Path) -> float:
    """cmd's wall time, started with nothing left to write back (os.sync first, not timed): on this machine's
    ext4, writes run at ~900 MiB/s until a GiB or two is dirty, then at the disk's ~130: without it, each tool
    paid for what the one before had written."""
    import time

    os.sync()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode:
        raise SystemExit(f"{cmd[3:]} exited {p.returncode}: {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1gib,300,20k")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--connection", choices=["direct", "shared"], default="shared")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-fetch-"))
    srv = make_server(base)
    if args.connection == "shared":
        srv.share_connection()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENLACE_CONTROL_DIR": str(base / "cm"), **srv.env}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        repo = copy_worktree_repo(base / "repo", "bench")
        (repo / "configs" / "runs" / "out.yaml").write_text('command: [python, -c, "pass"]\noutputs: ["out/**/*"]\n')
        commit_all(repo, "a command run whose outputs are fetched")
        subprocess.run([*CLI, "launch", "out", "--follow"], env=env, cwd=repo, check=True, capture_output=True)
        out = base / "remote-testhost" / "runs" / "out" / "out"
        ssh = " ".join(["ssh", "-F", env["ENLACE_SSH_CONFIG"], "-o", "BatchMode=yes"])
        print(f"fetch of a command run's outputs / rsync -a, medians of {args.reps}, connection {args.connection}:")
        for name in args.shapes.split(","):
            shutil.rmtree(out, ignore_errors=True)
            shape(out, name)
            files = sum(1 for f in out.rglob("*") if f.is_file())
            mib = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
            fetch_t, rsync_t = [], []
            (base / "rs").mkdir()
            os.sync()  # what the shape wrote is on disk before either tool is timed
            for rep in range(args.reps):  # a new destination each time, all removed once the shape is done: see above
                pair = [
                    (fetch_t, [*CLI, "fetch", "out", "--dest", str(base / "got" / str(rep))]),
                    (rsync_t, ["rsync", "-a", "-e", ssh, f"testhost:{out}/", f"{base / 'rs' / str(rep)}/"]),
                ]
                for times, cmd in pair if rep % 2 == 0 else pair[::-1]:  # neither always pays the other's writeback
                    times.append(timed(cmd, env, repo))
            shutil.rmtree(base / "got")
            shutil.rmtree(base / "rs")
            os.sync()  # the removal's own work done before the next shape
            f, r = statistics.median(fetch_t), statistics.median(rsync_t)
            print(
                f"  {name:5} ({files} files, {mib:.0f} MiB): fetch {f:6.2f} s, rsync {r:6.2f} s: {r / f:.2f}x rsync's speed"
            )
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
