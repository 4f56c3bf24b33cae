"""DDP on CPU with gloo under `torchrun --standalone` (2 and 3 ranks): rank 0 alone writes,
every rank's data and RNG state is in the checkpoint, resume is exact, SIGTERM stops all ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support import REPO
from support.cli import enlace, metrics, run_json
from support.configs import DETERMINISTIC, write_run
from support.procs import trainers_under

from enlace.manifest import latest_checkpoint
from enlace.preflight.verify_resume import compare_states
from enlace.train.checkpoint import load_checkpoint

DDP_RUN = {**DETERMINISTIC, "training": {"max_steps": 40, "log_every": 1, "eval_every": 4}}


def torchrun(project, *args, wait=True, nproc=2):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--log-dir={project / 'torchrun'}",  # not a /tmp/torchelastic_* left behind
        f"--nproc-per-node={nproc}",
        "-m",
        "enlace",
        "train",
        *args,
        "--root",
        str(project),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not wait:
        return subprocess.Popen(
            cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
    out = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_three_ranks_rank0_writes_and_resume_is_exact(project, tmp_path):
    """DDP regroups its gradient buckets after a process's first iteration: with 3 ranks a resumed process's
    first step could sum in another order than the uninterrupted run's (2 ranks: one sum, commutative)."""
    write_run(project, "ddp3", **{**DDP_RUN, "training": {"max_steps": 40, "log_every": 1, "eval_every": 2}})
    torchrun(project, "ddp3", "--until", "4", "--runs-dir", str(tmp_path / "straight"), nproc=3)
    torchrun(project, "ddp3", "--until", "2", "--runs-dir", str(tmp_path / "resumed"), nproc=3)
    torchrun(project, "ddp3", "--until", "4", "--runs-dir", str(tmp_path / "resumed"), nproc=3)
    a = load_checkpoint(tmp_path / "straight" / "ddp3" / "checkpoints" / "step-000004")
    b = load_checkpoint(tmp_path / "resumed" / "ddp3" / "checkpoints" / "step-000004")
    assert compare_states(a, b)["identical"], compare_states(a, b)
    ranks = a["trainer.pt"]["ranks"]
    assert [r["data"]["rank"] for r in ranks] == [0, 1, 2]  # every rank's data position and RNG
    # each rank draws its own dropout masks (dropout 0.1): their RNG states are not one state copied
    assert len({bytes(r["rng"]["torch"].numpy()) for r in ranks}) == 3
    steps = [m["step"] for m in metrics(tmp_path / "straight" / "ddp3", "train")]
    assert steps == [1, 2, 3, 4]  # one writer: each step logged once
    log = (tmp_path / "straight" / "ddp3" / "train.log").read_text()
    assert "world 3" in log and log.count("step      4/40") == 1
    assert a["trainer.pt"]["tokens"] == 4 * 3 * 4 * 32  # steps x world x batch x seq_len
    # A different world size is refused, naming the fix.
    one = enlace(project, "train", "ddp3", "--runs-dir", str(tmp_path / "resumed"), "--until", "6", check=False)
    assert one.returncode == 2 and "saved by 3 processes, resuming with 1" in one.stderr


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_rank_with_one_checkpoint(project):
    write_run(
        project,
        "ddpstop",
        **{**DDP_RUN, "training": {"max_steps": 100000, "log_every": 1, "eval_every": 0}},
        checkpoint={"every": 0},
    )
    proc = torchrun(project, "ddpstop", wait=False)
    run_dir = project / "runs" / "ddpstop"
    deadline = time.time() + 120
    while not ((run_dir / "run.json").exists() and run_json(run_dir).get("step", 0) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()[-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)  # torchrun forwards it once to each rank
    out = proc.communicate(timeout=120)[0].decode()
    # torchrun itself reports the signal (SignalException, exit 1); the ranks stopped cleanly:
    state = run_json(run_dir)
    assert state["status"] == "stopped" and state["exit_code"] == 0, out[-3000:]
    assert "SIGTERM received: finishing at step" in (run_dir / "train.log").read_text()
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt.name == f"step-{state['step']:06d}"
    assert len(load_checkpoint(ckpt)["trainer.pt"]["ranks"]) == 2
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")] == [ckpt.name]
    assert trainers_under(project, "ddpstop") == []  # all gone (this test's only: another run may share the machine)


@pytest.mark.slow
def test_preflight_under_torchrun_reports_worst_rank_and_global_throughput(project):
    write_run(project, "ddppf")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--log-dir={project / 'torchrun'}",  # not a /tmp/torchelastic_* left behind
        "--nproc-per-node=2",
        "-m",
        "enlace",
        "preflight",
        "ddppf",
        "--root",
        str(project),
        "--steps",
        "3",
        "--json",
    ]
    out = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)  # one report: rank 0's
    assert rep["world"] == 2 and [r["rank"] for r in rep["per_rank"]] == [0, 1]
    assert rep["memory"]["peak_rss_mib"] == max(r["peak_rss_mib"] for r in rep["per_rank"])
    assert rep["throughput"]["tokens_per_step"] == 2 * 4 * 32
