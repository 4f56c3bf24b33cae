"""Your own script resumed after kills: a small PyTorch training script written for this test (not enlace's
trainer) that uses enlace.job, SIGKILLed twice by the test at different steps, ends with weights byte-equal to
a straight run; and a script that resumes by its own flag (as nanoGPT's --init_from=resume does), killed
mid-run, goes on from its own checkpoint. On the `local` host: the same driver pipeline and supervisor as
over SSH (tests/test_own_script.py covers the sshd), without the connection's cost."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import urllib.request

import pytest
from support.remote import remote, status_row, wait_until
from support.repocopy import commit_all
from test_board import _start_board

from enlace.state import runs

# deterministic on CPU: each step's batch is a function of the step, the optimizer's state is checkpointed
TRAIN = textwrap.dedent(
    """\
    import sys, time, torch
    from enlace import job

    torch.manual_seed(0); torch.set_num_threads(1); torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps, start = int(sys.argv[1]), 0
    if (ckpt := job.resume_from()) is not None:
        state = torch.load(ckpt / "state.pt", weights_only=True)
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); start = job.step_of(ckpt)
        print(f"resumed from {ckpt.name}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 8, generator=g); y = x.sum(1, keepdim=True).sin()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        job.log(step, loss=loss.item())
        if step % 5 == 0 or job.stop_requested():
            with job.checkpoint(step) as d:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, d / "state.pt")
        if job.stop_requested():
            sys.exit(0)
        time.sleep(float(sys.argv[2]))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    (job.run_dir() / "final.bin").write_bytes(flat.numpy().tobytes())
    """
)

# resumes the way nanoGPT does: its own checkpoint in its own --out_dir, read back under --init_from=resume. It
# writes it whole or not at all: written in place, a SIGKILL between the truncate and the write left it empty and
# every restart crashed reading it (the test's two CI failures), which is the script's fault, not the supervisor's
OWN_WAY = textwrap.dedent(
    """\
    import argparse, json, os, pathlib, time
    p = argparse.ArgumentParser()
    p.add_argument("--out_dir"); p.add_argument("--init_from", default="scratch"); p.add_argument("--steps", type=int)
    a = p.parse_args()
    ckpt = pathlib.Path(a.out_dir) / "ckpt.json"
    step = json.loads(ckpt.read_text())["step"] if a.init_from == "resume" else 0
    print(f"init_from={a.init_from} starting at step {step}", flush=True)
    while step < a.steps:
        step += 1
        print(f"iter {step}", flush=True)
        pathlib.Path(a.out_dir).mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")  # as torch.save to a new name and a rename: a kill never leaves half of one
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, ckpt)
        time.sleep(0.05)
    """
)


@pytest.fixture
def job_repo(user_repo):
    (user_repo / "scripts" / "tiny_train.py").write_text(TRAIN)
    (user_repo / "scripts" / "own_way.py").write_text(OWN_WAY)
    runs_dir = user_repo / "configs" / "runs"
    fast = {"restarts": 3, "backoff": 0.2}
    for name, pause in (("job", "0.15"), ("straight", "0")):
        doc = {"command": ["python", "scripts/tiny_train.py", "40", pause], "outputs": ["final.bin"], "supervise": fast}
        (runs_dir / f"{name}.yaml").write_text(json.dumps(doc) + "\n")
    own = {
        # 4000 steps (200 s): still running when the test kills it, however late a loaded machine looks (400 steps
        # were 20 s; its one CI failure, no restart within 120 s, fits a run that had ended first); the test stops it
        "command": ["python", "scripts/own_way.py", "--out_dir", "{run_dir}/out", "--steps", "4000"],
        "resume": {"args": ["--init_from=resume"], "when": "{run_dir}/out/ckpt.json"},
        "supervise": fast,
    }
    (runs_dir / "ownway.yaml").write_text(json.dumps(own) + "\n")
    commit_all(user_repo, "a training script of our own, using enlace.job")
    return user_repo


def _kill_at(run_dir, step: int) -> None:
    """SIGKILL the script once it has logged `step` (its pid is in run.json: the supervisor records it)."""
    wait_until(lambda: runs.read(run_dir).get("step", 0) >= step and runs.read(run_dir).get("pid"), 180, f"step {step}")
    os.kill(runs.read(run_dir)["pid"], signal.SIGKILL)


@pytest.mark.slow
def test_a_script_using_enlace_job_killed_twice_ends_byte_equal_to_a_straight_run(sshd, job_repo):
    env, rd = sshd.env, sshd.dir.parent / "remote-local" / "runs"
    remote(job_repo, env, "launch", "straight", host="local")
    remote(job_repo, env, "logs", "straight", "-f", host="local")
    launched = remote(job_repo, env, "launch", "job", "--no-wait", host="local")
    assert "not waiting: `enlace-remote --host local status job`" in launched.stderr  # the host it went to
    _kill_at(rd / "job", 12)  # past the checkpoint at 10: steps 11-12 are trained again
    wait_until(lambda: runs.read(rd / "job").get("restarts") == 1, 120, "the first restart")
    _kill_at(rd / "job", 27)
    out = remote(job_repo, env, "logs", "job", "-f", host="local")
    assert out.stdout.count("resumed from step-0000") == 2, out.stdout[-3000:]
    row = status_row(job_repo, env, "local", "job")
    assert (row["status"], row["restarts"], row["step"]) == ("finished", 2, 40), row
    last = json.loads((rd / "job" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["loss"] == pytest.approx(last["loss"]) and last["step"] == 40
    assert (rd / "job" / "final.bin").read_bytes() == (rd / "straight" / "final.bin").read_bytes()
    assert 0 <= runs.read(rd / "job")["last_save_s"] < 60  # enlace.job's saves size a stop's grace too (ms here)

    # a finished script launched again resumes from its newest checkpoint: said, with the figures logged up to it
    # (status showed none); --resume none starts it afresh, its checkpoints and metrics set aside (it was refused,
    # and a relaunch after a code change silently kept the old result)
    straight = (rd / "straight" / "final.bin").read_bytes()
    out = remote(job_repo, env, "launch", "straight", host="local")  # (it says where once the script has resumed:
    said = r"straight: (running|finished)( \(resumed from checkpoints/step-000040\))?: python"  # within 3 s, loaded)
    assert re.search(said, out.stderr), out.stderr
    remote(job_repo, env, "logs", "straight", "-f", host="local")
    again = status_row(job_repo, env, "local", "straight")
    assert runs.read(rd / "straight")["resumed_from"] == "step-000040"
    assert again["step"] == 40 and again["loss"] == pytest.approx(status_row(job_repo, env, "local", "job")["loss"])
    out = remote(job_repo, env, "launch", "straight", "--resume", "none", host="local")
    assert "the line it left (checkpoints, metrics.jsonl) is kept in runs/straight/checkpoints-set-aside/" in out.stderr
    remote(job_repo, env, "logs", "straight", "-f", host="local")
    assert (
        runs.read(rd / "straight")["resumed_from"] is None and (rd / "straight" / "final.bin").read_bytes() == straight
    )
    records = [json.loads(line) for line in (rd / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 41))  # this line's own history

    proc, url = _start_board(job_repo, env, "local")
    try:
        token, base = url.split("token=")[1], url.split("/?")[0]
        req = urllib.request.Request(f"{base}/api/run?host=local&run=job&log=-1", headers={"X-Enlace-Token": token})
        with urllib.request.urlopen(req, timeout=60) as r:
            train = json.loads(r.read())["series"]["train"]
        assert [point[0] for point in train][-1] == 40 and train[-1][1] == pytest.approx(last["loss"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_script_that_resumes_by_its_own_flag_goes_on_from_its_checkpoint(sshd, job_repo):
    env, run_dir = sshd.env, sshd.dir.parent / "remote-local" / "runs" / "ownway"
    remote(job_repo, env, "launch", "ownway", "--no-wait", host="local")
    log = run_dir / "train.log"
    wait_until(lambda: "iter 30\n" in (log.read_text() if log.exists() else ""), 120, "iter 30")
    os.kill(runs.read(run_dir)["pid"], signal.SIGKILL)
    wait_until(lambda: "init_from=resume starting" in log.read_text(), 120, "the restart with its resume flag")
    text = log.read_text()
    resumed_at = int(text.split("init_from=resume starting at step ")[1].split()[0])
    assert resumed_at >= 30, text[-2000:]  # its own counter goes on, not back to 0
    assert "--init_from=resume" in text.split("supervisor: starting the command (resuming): ")[1].splitlines()[0]
    remote(job_repo, env, "stop", "ownway", host="local")
