"""enlace-remote on a real single-node Slurm cluster (started here, as in the tests; needs root and
slurmctld, slurmd, slurm-client, munge) through its own loopback sshd as the login node:

    time from `enlace-remote launch RUN --no-preflight` (synced commit) to the first logged step
    vs a bare `sbatch` of `python -m enlace train RUN` in the same tree to its first logged step,

alternated `--rounds` times; prints the medians and the ratio (1.0 = no overhead).

    python bench/slurm.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
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

from bench.remote import make_repo  # noqa: E402
from tests.support.remote import DRIVER, tiny_corpus  # noqa: E402
from tests.support.slurmcluster import SlurmCluster  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402

CLI = [*DRIVER, "--host", "cluster"]


def first_step_logged(log: Path, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and " | loss " in log.read_text():
            return time.perf_counter()
        time.sleep(0.02)
    raise RuntimeError(f"no step in {log} after {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="enlace-bench-slurm-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base / "cluster")
    cluster.start()
    srv = make_server(base, session_env=cluster.env)
    with open(srv.env["ENLACE_HOSTS_FILE"], "a") as fh:
        fh.write(
            f"  cluster:\n    ssh: testhost\n    remote_dir: {base}/remote\n    python: {sys.executable}\n"
            "    scheduler: slurm\n    time: '30'\n"
        )
    env = {**os.environ, "PYTHONPATH": str(REPO), **srv.env}
    try:
        repo = make_repo(base)  # the same repo and `long` run as bench/remote.py
        tiny_corpus(base / "remote")
        subprocess.run([*CLI, "sync"], env=env, cwd=repo, check=True, capture_output=True)
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        tree = base / "remote" / "trees" / sha
        ours, bare = [], []
        for i in range(args.rounds):
            t0 = time.perf_counter()
            subprocess.run(
                [*CLI, "launch", "long", "--no-preflight", "--resume", "none"],
                env=env,
                cwd=repo,
                check=True,
                capture_output=True,
            )  # returns once the first step is logged
            ours.append(time.perf_counter() - t0)
            subprocess.run(
                [*CLI, "stop", "long", "--kill", "--grace", "30"], env=env, cwd=repo, check=True, capture_output=True
            )

            runs_dir = base / f"bare-{i}"
            runs_dir.mkdir()
            script = base / f"bare-{i}.sh"
            script.write_text(
                f"#!/bin/bash\ncd {tree}\nexport PYTHONPATH={tree} ENLACE_ROOT={tree}\n"
                f"exec {sys.executable} -m enlace train long --runs-dir {runs_dir}\n"
            )
            t0 = time.perf_counter()
            job = cluster.run("sbatch", "--parsable", "--time=30", f"--output={runs_dir}/out.log", str(script)).stdout
            bare.append(first_step_logged(runs_dir / "long" / "train.log") - t0)
            cluster.run("scancel", job.strip())
            while cluster.job_state(job.strip()) not in ("CANCELLED", "COMPLETED", "FAILED"):
                time.sleep(0.1)
        report = {
            "enlace_launch_to_first_step_s": statistics.median(ours),
            "bare_sbatch_to_first_step_s": statistics.median(bare),
            "rounds": args.rounds,
            "ours_all": ours,
            "bare_all": bare,
        }
        report["ratio"] = report["enlace_launch_to_first_step_s"] / report["bare_sbatch_to_first_step_s"]
        print(json.dumps(report, indent=1))
        print(
            f"launch --no-preflight → first step: {report['enlace_launch_to_first_step_s']:.2f} s vs bare sbatch "
            f"{report['bare_sbatch_to_first_step_s']:.2f} s: {report['ratio']:.2f}× (median of {args.rounds})"
        )
    finally:
        cluster.run("scancel", "-u", "root", check=False)
        srv.stop()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
