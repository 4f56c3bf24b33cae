"""enlace-remote launch --gpus N over a real sshd: torchrun on the server (gloo on CPU stands in
for GPUs, which this machine does not have); status, stop, logs and fetch work unchanged."""

from __future__ import annotations

import json

import psutil
import pytest
from support.remote import keeps_stepping, remote, tiny_corpus, wait_until

from enlace.manifest import read_manifest
from enlace.state import runs
from enlace.train.checkpoint import load_checkpoint


@pytest.mark.slow
def test_launch_with_two_processes_then_stop_logs_fetch(sshd, user_repo):
    rd = sshd.dir.parent / "remote-testhost"
    tiny_corpus(rd)
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--gpus", "2")
    assert "no complete checkpoint: starting from step 0" in out.stderr
    keeps_stepping(rd / "runs" / "long")
    st = json.loads(remote(user_repo, sshd.env, "status", "long", "--json").stdout)[0]
    assert st["status"] == "running" and st["alive"]
    out = remote(user_repo, sshd.env, "stop", "long")
    assert "stopped" in out.stdout
    log = remote(user_repo, sshd.env, "logs", "long").stdout
    assert "world 2" in log and "SIGTERM received" in log
    # the ranks were asked, not torchrun: it would SIGKILL them 30 s on, whatever their checkpoint needs
    assert "death signal" not in log and "SignalException" not in log, log[-3000:]
    # torchrun's log dir is the run's (else it leaves a /tmp/torchelastic_* per launch): one per launch
    assert len(list((rd / "runs" / "long" / "torchrun").iterdir())) == 1
    remote(user_repo, sshd.env, "fetch", "long")
    latest = (user_repo / "runs" / "long" / "checkpoints" / "latest").read_text().strip()
    files = load_checkpoint(user_repo / "runs" / "long" / "checkpoints" / latest)
    assert len(files["trainer.pt"]["ranks"]) == 2
    assert read_manifest(user_repo / "runs" / "long" / "checkpoints" / latest)["world"] == 2  # verify reads it
    # `launch long` again (the hint a run's end prints) resumes on 2 processes: its checkpoint's world size,
    # which the trainer refuses to change (before, one process started and was refused)
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight")
    assert "run: long keeps --gpus 2, as it was launched from here" in out.stderr, out.stderr
    keeps_stepping(rd / "runs" / "long")
    log = remote(user_repo, sshd.env, "logs", "long").stdout
    assert log.count("world 2") == 2 and "resumed from" in log and "world 1" not in log, log[-3000:]
    # torchrun itself killed (the OOM killer's pick): its ranks trained on, re-parented, beside the restart's two
    # (four trainers in one run directory, and `stop` left two of them running); the supervisor ends them first
    (torchrun,) = psutil.Process(runs.read(rd / "runs" / "long")["launcher_pid"]).children()
    ranks = torchrun.children()
    assert len(ranks) == 2
    torchrun.kill()
    wait_until(lambda: runs.read(rd / "runs" / "long").get("restarts") == 1, 120, "the supervisor's restart")
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert not alive, alive
    keeps_stepping(rd / "runs" / "long")
    log = remote(user_repo, sshd.env, "logs", "long").stdout
    assert "the trainer ended, but processes it started did not" in log and log.count("world 2") == 3, log[-3000:]
    remote(user_repo, sshd.env, "stop", "long")
    # on one process with a --set: refused before anything starts (verify reads the checkpoint's world size, which
    # the trainer refuses; it had started one, amid torchrun's error lines), saying how to resume it; the run's line
    # keeps its own --set items, here and on the server (a plain launch had repeated the refused ones)
    line = runs.read(rd / "runs" / "long")["overrides"]
    bad = remote(
        user_repo,
        sshd.env,
        "launch",
        "long",
        "--no-preflight",
        "--gpus",
        "1",
        "--set",
        "training.log_every=1",
        check=False,
    )
    assert bad.returncode == 2 and "resume on 2: launch it with --gpus 2" in bad.stderr, bad.stderr
    assert "world 1" not in remote(user_repo, sshd.env, "logs", "long").stdout  # no trainer started
    assert runs.read(rd / "runs" / "long")["overrides"] == line and "training.log_every=1" not in line
    remembered = json.loads((user_repo / ".enlace" / "last-runs.json").read_text())["_launched"]["testhost"]["long"]
    assert remembered["placement"] == {"gpus": "2"} and "training.log_every=1" not in remembered["overrides"]
    bad = remote(user_repo, sshd.env, "launch", "long", "--gpus", "zero", check=False)
    assert bad.returncode == 2 and "--gpus" in bad.stderr
    (rd / "runs" / "long" / "preflight.json").unlink(missing_ok=True)
    bad = remote(user_repo, sshd.env, "launch", "long", "--gpus", "all", check=False)  # a CPU host: refused before
    assert bad.returncode == 3 and "--gpus all starts one process per GPU" in bad.stderr, bad.stderr  # it measures
    assert not (rd / "runs" / "long" / "preflight.json").exists() and "Traceback" not in bad.stderr
