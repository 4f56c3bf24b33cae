"""enlace-remote part 2, end to end over a real sshd (and the `local` host): preflight, launch,
logs -f, fetch, status, stop; faults: killed clients, killed SSH sessions, corrupt files."""

from __future__ import annotations

import json
import os
import signal

import pytest
from support.cli import enlace, run_json
from support.configs import write_run
from support.procs import trainers_under
from support.remote import PipeReader, popen_remote, remote, server_dir, status_row, tiny_corpus, wait_until
from support.repocopy import commit_all


@pytest.mark.slow
@pytest.mark.parametrize("host", ["testhost", "local"])
def test_preflight_launch_logs_fetch_and_resume_locally(sshd, user_repo, tmp_path, host):
    tiny_corpus(server_dir(sshd, host))
    out = remote(user_repo, sshd.env, "preflight", "tiny", "--steps", "2", host=host)
    assert "verdict" in out.stdout and "OK" in out.stdout
    assert json.loads((user_repo / "runs" / "tiny" / "preflight.json").read_text())["verdict"] == "ok"
    out = remote(user_repo, sshd.env, "launch", "--no-preflight", host=host)  # RUN from the host's default_run
    assert "run: tiny (default_run" in out.stderr and "no complete checkpoint: starting from step 0" in out.stderr
    logs = remote(user_repo, sshd.env, "logs", "tiny", "-f", host=host)
    server_run = server_dir(sshd, host) / "runs" / "tiny"
    assert logs.stdout.encode() == (server_run / "train.log").read_bytes()
    assert "step     30/30" in logs.stdout and status_row(user_repo, sshd.env, host, "tiny")["status"] == "finished"

    out = remote(user_repo, sshd.env, "fetch", host=host)
    assert "1 checkpoint(s) fetched (step-000030)" in out.stdout
    local = user_repo / "runs" / "tiny"
    for name in ("model.pt", "optimizer.pt", "trainer.pt", "MANIFEST"):
        assert (local / "checkpoints" / "step-000030" / name).read_bytes() == (
            server_run / "checkpoints" / "step-000030" / name
        ).read_bytes()
    for name in ("run.json", "config.yaml", "metrics.jsonl", "train.log"):
        assert (local / name).read_bytes() == (server_run / name).read_bytes()
    assert "already here" in remote(user_repo, sshd.env, "fetch", "tiny", host=host).stdout
    assert "0 checkpoint(s) fetched" in remote(user_repo, sshd.env, "fetch", "tiny", host=host).stdout
    model = local / "checkpoints" / "step-000030" / "model.pt"
    model.write_bytes(model.read_bytes()[:-10])  # a copy cut short here: fetched again (it was "already here")
    assert "1 checkpoint(s) fetched (step-000030)" in remote(user_repo, sshd.env, "fetch", "tiny", host=host).stdout
    assert model.read_bytes() == (server_run / "checkpoints" / "step-000030" / "model.pt").read_bytes()

    # The fetched checkpoint loads with weights_only=True and a local `enlace train` resumes from it.
    tiny_corpus(user_repo)
    ckpt = local / "checkpoints" / "step-000030"
    res = enlace(
        user_repo,
        "train",
        "tiny",
        "--runs-dir",
        str(tmp_path / "local-runs"),
        "--resume",
        str(ckpt),
        "--set",
        "training.max_steps=30",
    )
    assert "resumed from" in res.stdout and "step-000030" in res.stdout


@pytest.mark.slow
def test_trainer_survives_client_killed_mid_launch_and_mid_logs(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    client = popen_remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--follow")
    run_json = server_dir(sshd, "testhost") / "runs" / "long" / "run.json"
    wait_until(lambda: run_json.exists() and json.loads(run_json.read_text()).get("launcher_pid"), what="launch")
    client.kill()  # mid-launch: the trainer was started detached
    client.wait()
    wait_until(
        lambda: status_row(user_repo, sshd.env, "testhost", "long")["step"] >= 3, what="steps after the client died"
    )
    follower = popen_remote(user_repo, sshd.env, "logs", "long", "-f")
    PipeReader(follower.stdout).grows()  # streaming
    follower.kill()  # mid-logs -f
    follower.wait()
    step = status_row(user_repo, sshd.env, "testhost", "long")["step"]
    wait_until(lambda: status_row(user_repo, sshd.env, "testhost", "long")["step"] > step + 3, what="training to go on")
    out = remote(user_repo, sshd.env, "stop", "long")
    assert "stopped" in out.stdout and "latest checkpoint step-" in out.stdout
    st = status_row(user_repo, sshd.env, "testhost", "long")
    assert st["status"] == "stopped" and st["latest_checkpoint"] == f"step-{st['step']:06d}"


@pytest.mark.slow
def test_logs_follow_survives_killed_ssh_sessions_exactly(sshd, user_repo):
    """Three SSH sessions killed while `logs -f` streams: each is one reconnect, and what it printed is
    train.log byte for byte. A kill is made only once new log bytes show the stream is live: a kill
    between the follower's first commands finds an idle connection that the next command quietly
    reconnects (beside a CPU hog, four kills at fixed 1 s intervals drew two notices)."""
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight")
    follower = popen_remote(user_repo, sshd.env, "logs", "long", "-f", "--read-timeout", "5")
    out, err = PipeReader(follower.stdout), PipeReader(follower.stderr)
    for n in range(1, 4):
        out.grows()  # streaming: its session is live
        while not sshd.kill_sessions():  # none live: it is between attempts
            out.grows()
        wait_until(lambda n=n: err.text().count("reconnecting in") >= n, what=f"reconnect {n} after a killed session")
    remote(user_repo, sshd.env, "stop", "long")
    assert follower.wait(timeout=120) == 0, err.text()[-3000:]  # the run's own exit status: stopped cleanly
    assert out.join() == (server_dir(sshd, "testhost") / "runs" / "long" / "train.log").read_bytes()


@pytest.mark.slow
def test_launch_refuses_running_run_and_concurrent_launches_start_one(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "sync")
    clients = [popen_remote(user_repo, sshd.env, "launch", "long", "--no-preflight") for _ in range(2)]
    codes = sorted(c.wait(timeout=120) for c in clients)
    assert codes[0] == 0 and codes[1] != 0, codes
    again = remote(user_repo, sshd.env, "launch", "long", "--no-preflight", check=False)
    assert again.returncode == 7 and "already running" in again.stderr and "step" in again.stderr
    assert "`enlace-remote --host testhost stop long` first" in again.stderr, again.stderr  # it works as printed
    pids = trainers_under(sshd.dir.parent, "long")  # this test's trainers only (the machine may be shared)
    assert len(pids) == 1, pids
    remote(user_repo, sshd.env, "stop", "long")
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--restarts", "0")  # a stopped run resumes
    assert "resumed from checkpoints/step-" in out.stderr
    # SIGKILL the trainer behind enlace's back (no supervisor restarts): status must say crashed.
    pid = status_row(user_repo, sshd.env, "testhost", "long")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: status_row(user_repo, sshd.env, "testhost", "long")["status"] == "crashed", what="crashed")
    assert "crashed" in remote(user_repo, sshd.env, "status").stdout


@pytest.mark.slow
def test_fetch_resumes_after_interruption_and_refuses_corrupt_files(sshd, user_repo):
    env = sshd.env
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "tiny", "-f")
    server_ckpt = server_dir(sshd, "testhost") / "runs" / "tiny" / "checkpoints" / "step-000030"
    # The state an interrupted fetch leaves: a partial dir with one short file.
    partial = user_repo / "runs" / "tiny" / ".partial-fetch" / "checkpoints" / "step-000030"
    partial.mkdir(parents=True)
    data = (server_ckpt / "optimizer.pt").read_bytes()
    (partial / "optimizer.pt").write_bytes(data[: len(data) // 3])
    (partial / "model.pt").write_bytes(b"not the start of model.pt")  # taken again whole
    assert not (user_repo / "runs" / "tiny" / "checkpoints" / "step-000030").exists()
    out = remote(user_repo, env, "fetch", "tiny")
    assert "ssh)" in out.stdout
    fetched = user_repo / "runs" / "tiny" / "checkpoints" / "step-000030"
    assert (fetched / "optimizer.pt").read_bytes() == data
    assert (fetched / "model.pt").read_bytes() == (server_ckpt / "model.pt").read_bytes()
    assert not partial.exists()
    # A corrupted file on the server is detected and not installed.
    dest = user_repo / "elsewhere"
    model = bytearray((server_ckpt / "model.pt").read_bytes())
    model[len(model) // 2] ^= 0xFF
    (server_ckpt / "model.pt").write_bytes(bytes(model))
    out = remote(user_repo, env, "fetch", "tiny", "--dest", str(dest), check=False)
    assert out.returncode == 1 and "model.pt" in out.stderr and "not installed" in out.stderr
    assert not (dest / "checkpoints" / "step-000030").exists()


@pytest.mark.slow
def test_bad_run_names_and_missing_checkpoints_are_clear(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "2")
    remote(user_repo, sshd.env, "logs", "tiny", "-f")
    for args in (["logs", "nope"], ["stop", "nope"], ["fetch", "nope"]):
        out = remote(user_repo, sshd.env, *args, check=False)
        assert out.returncode == 2 and "no run named 'nope'" in out.stderr and "tiny" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    ckpts = server_dir(sshd, "testhost") / "runs" / "tiny" / "checkpoints"
    for p in ckpts.iterdir():
        if p.name.startswith("step-"):
            (p / "MANIFEST").unlink()  # no complete checkpoint left
    out = remote(user_repo, sshd.env, "fetch", "tiny", check=False)
    assert out.returncode == 2 and "no complete checkpoint" in out.stderr


@pytest.mark.slow
def test_a_config_its_checkpoints_cannot_resume_is_refused_before_anything_starts(sshd, user_repo):
    """Stage 1 (verify --for-launch) refuses it with the command to type; nothing is detached. --resume none
    is that command, and works."""
    from support.configs import write_run

    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "2")
    write_run(user_repo, "tiny", training={"max_steps": 30, "log_every": 1, "eval_every": 10}, model={"n_layer": 3})
    commit_all(user_repo, "a deeper tiny")
    out = remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", check=False)
    assert out.returncode == 2, out.stderr  # a checkpoint error, as train refuses it (docs/troubleshooting.md)
    assert "tiny's checkpoints were trained with model.n_layer=2, this config gives 3" in out.stderr
    assert "enlace-remote --host testhost launch tiny --resume none" in out.stderr  # (it named no host)
    assert status_row(user_repo, sshd.env, "testhost", "tiny")["status"] == "stopped"  # nothing was started
    remote(user_repo, sshd.env, "fetch", "tiny")  # the n_layer 2 line's step-000002, here
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--resume", "none", "--until", "2")
    # a fetch of the new line sets the old line's copy aside here as there (it was overwritten by the new line's
    # step-000002, or kept beside it under checkpoints/ when the names differed)
    (aside,) = (server_dir(sshd, "testhost") / "runs" / "tiny" / "checkpoints-set-aside").iterdir()
    out = remote(user_repo, sshd.env, "fetch", "tiny")
    assert "1 of an earlier line moved to checkpoints-set-aside/, as there" in out.stdout + out.stderr
    here, there = user_repo / "runs" / "tiny", server_dir(sshd, "testhost") / "runs" / "tiny"
    for rel in (f"checkpoints-set-aside/{aside.name}/step-000002", "checkpoints/step-000002"):
        assert (here / rel / "model.pt").read_bytes() == (there / rel / "model.pt").read_bytes(), rel
    assert (here / "checkpoints/step-000002/model.pt").read_bytes() != (aside / "step-000002/model.pt").read_bytes()
    # back to the line set aside, trained with n_layer 2: the checkpoint named must fit, not the line left (seen:
    # verify refused it against the n_layer 3 line)
    back = ("--resume", f"checkpoints-set-aside/{aside.name}/step-000002", "--set", "model.n_layer=2", "--until", "3")
    out = remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", *back)
    assert "resumed from checkpoints/step-000002; step 3/30" in out.stderr, out.stderr  # linked in as this run's


@pytest.mark.parametrize("host", ["testhost", "local"])
def test_killing_the_client_during_preflight_ends_the_servers_preflight(sshd, user_repo, host):
    """A model whose first step takes tens of seconds here: the preflight prints nothing meanwhile (as
    a GPU preflight compiling or in a long step), so only being tied to its client can end it."""
    write_run(
        user_repo,
        "heavy",
        model={"d_model": 768, "n_layer": 12, "n_head": 12, "seq_len": 256},
        training={"batch_size": 16},
    )
    from support.repocopy import commit_all

    commit_all(user_repo, "heavy")
    remote(user_repo, sshd.env, "sync", host=host)
    client = popen_remote(user_repo, sshd.env, "preflight", "heavy", "--steps", "3", host=host)
    where = str(server_dir(sshd, host))
    while b"building the model" not in client.stderr.readline():  # its last line before the long first step
        assert client.poll() is None, client.stderr.read()
    assert _preflights_under(where)
    client.kill()
    client.wait()
    wait_until(lambda: not _preflights_under(where), timeout=8, what="the server's preflight to end with its client")


def _preflights_under(path: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            if b"preflight" in cmd and state != "Z" and os.readlink(f"/proc/{pid}/cwd").startswith(path):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_set_passes_through_launch_and_is_recorded(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--set", "training.max_steps=7", host="local")
    remote(user_repo, sshd.env, "logs", "-f", host="local")  # no RUN: the run just launched
    run = server_dir(sshd, "local") / "runs" / "tiny"
    assert run_json(run)["status"] == "finished" and run_json(run)["step"] == 7
    assert (
        run_json(run)["overrides"] == ["training.max_steps=7"] and "max_steps: 7" in (run / "config.yaml").read_text()
    )


@pytest.mark.slow
def test_finished_run_is_said_and_extended_with_max_steps(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", host="local")
    remote(user_repo, sshd.env, "logs", "tiny", "-f", host="local")
    out = remote(user_repo, sshd.env, "launch", "tiny", host="local")
    assert "tiny is finished: step 30 of 30" in out.stderr and "--set training.max_steps=60" in out.stderr
    assert "preflight" not in out.stdout  # said at once: no preflight, no new process
    out = remote(
        user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--set", "training.max_steps=40", host="local"
    )
    assert "resumed from checkpoints/step-000030" in out.stderr and "the line it left" not in out.stderr
    remote(user_repo, sshd.env, "logs", "tiny", "-f", host="local")
    assert run_json(server_dir(sshd, "local") / "runs" / "tiny")["step"] == 40
    # a --resume PATH that is no complete checkpoint is refused by verify: no trainer starts (a typo of the path
    # started one that failed, and the finished run read `failed`); exit 2, as train and preflight refuse it
    out = remote(
        user_repo,
        sshd.env,
        "launch",
        "tiny",
        "--no-preflight",
        "--resume",
        "checkpoints/step-99",
        host="local",
        check=False,
    )
    assert out.returncode == 2 and "[FAIL] --resume checkpoints/step-99 — not a complete checkpoint" in out.stderr, (
        out.stderr
    )
    assert "(no such directory) — complete checkpoints of this run: checkpoints/step-0000" in out.stderr
    assert run_json(server_dir(sshd, "local") / "runs" / "tiny")["status"] == "finished"
    # --resume PATH starts a finished run there (seen: "is finished … nothing to train", and nothing trained)
    back = ("--resume", "checkpoints/step-000035", "--until", "37")
    (user_repo / ".enlace" / "last-runs.json").unlink()  # as from another clone: the host's run.json alone knows
    out = remote(user_repo, sshd.env, "launch", "tiny", *back, host="local")
    # verify checked the config the trainer takes: with the run's recorded --set (it checked --resume none's)
    assert "[warn] this run's own --set training.max_steps=40 (recorded in run.json" in out.stderr, out.stderr
    assert "is finished" not in out.stderr and "resumed from checkpoints/step-000035" in out.stderr, out.stderr
    kept = "  the line it left (checkpoints past its start, metrics.jsonl) is kept in runs/tiny/checkpoints-set-aside/"
    assert kept in out.stderr, out.stderr  # said where the checkpoints past step 35 went (train.log alone said it)
    # preflight projected the steps left from there (it said 0 left: from the finished run's latest, step 40)
    throughput = json.loads((user_repo / "runs" / "tiny" / "preflight.json").read_text())["throughput"]
    assert (throughput["resumes_at"], throughput["remaining_steps"]) == (35, 5), throughput
    out = remote(user_repo, sshd.env, "preflight", "tiny", "--resume", "none", host="local")  # the driver's own too
    assert "recorded in run.json" not in out.stderr, out.stderr  # verify said they applied; preflight left them out
    throughput = json.loads((user_repo / "runs" / "tiny" / "preflight.json").read_text())["throughput"]
    # from step 0, and as train --resume none: the file's 30 steps, without the run's recorded max_steps=40
    assert (throughput["resumes_at"], throughput["remaining_steps"]) == (0, 30), throughput
    # --resume none starts a finished run over (it was said to be finished, "nothing to train")
    out = remote(
        user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--resume", "none", "--until", "2", host="local"
    )
    assert "is finished" not in out.stderr and "resumed from" not in out.stderr, out.stderr
    assert "tiny: starting from step 0 (--resume none)" in out.stderr, out.stderr  # not "no complete checkpoint"
    assert kept in out.stderr and out.stderr.count(kept) == 1, out.stderr
    remote(user_repo, sshd.env, "logs", "tiny", "-f", host="local")
    assert run_json(server_dir(sshd, "local") / "runs" / "tiny")["step"] == 2


@pytest.mark.slow
def test_running_run_is_refused_before_preflight(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight", host="local")
    out = remote(user_repo, sshd.env, "launch", "long", host="local", check=False)
    assert out.returncode == 7 and "already running" in out.stderr and "warm-up step" not in out.stderr
    assert remote(user_repo, sshd.env, "stop", "long", host="local").returncode == 0
    again = remote(user_repo, sshd.env, "stop", "long", host="local")  # stopping a stopped run: said, exit 0
    assert "is not running (stopped" in again.stdout
