"""`enlace-remote logs -f`: heartbeats keep a quiet run's connection (no reconnects), and the end of a killed
trainer is said."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from support.cli import run_json
from support.configs import write_run
from support.procs import Throttle
from support.remote import PipeReader, popen_remote, remote, server_dir, status_row, tiny_corpus, wait_until
from support.repocopy import commit_all


@pytest.mark.slow
def test_logs_follow_says_when_the_trainer_was_killed(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--restarts", "0", host="local")  # no healing
    wait_until(
        lambda: status_row(user_repo, sshd.env, "local", "long")["step"] >= 60, what="a checkpoint"
    )  # every 50 steps
    os.kill(status_row(user_repo, sshd.env, "local", "long")["pid"], signal.SIGKILL)
    out = remote(user_repo, sshd.env, "logs", "long", "-f", host="local", check=False)
    assert out.returncode == 8, (out.returncode, out.stderr)
    assert "long crashed" in out.stderr and "last logged step" in out.stderr
    assert re.search(r"last complete checkpoint step-\d{6} ", out.stderr), out.stderr  # how far it got: load decides


@pytest.mark.slow
def test_quiet_logs_get_heartbeats_not_reconnects(sshd, user_repo):
    """Over SSH (the `local` host has no connection to lose, so no read timeout: it could not fail there),
    a run silent for longer than the read timeout, twice over, keeps its one connection: the server's
    heartbeats (ENLACE_HEARTBEAT_S, set in every SSH session) tell a quiet run from a dead link."""
    write_run(
        user_repo,
        "quiet",
        training={"max_steps": 1_000_000, "log_every": 1_000_000, "eval_every": 0},
        checkpoint={"every": 0},
        run_name="quiet",
    )
    commit_all(user_repo, "quiet")
    sshd.session_env["ENLACE_HEARTBEAT_S"] = "1"
    sshd.restart(down_s=0)
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "quiet", "--no-preflight")
    with Throttle(run_json(server_dir(sshd, "testhost") / "runs" / "quiet")["pid"]):  # silent: it need not spin
        follower = popen_remote(user_repo, sshd.env, "logs", "quiet", "-f", "--read-timeout", "3")
        time.sleep(8)  # the run is silent all along: longer than the read timeout, twice over
        # Ctrl-C ends a follower, never the run, and says how to follow again (click said only "Aborted!")
        second = popen_remote(user_repo, sshd.env, "logs", "quiet", "-f")
        PipeReader(second.stdout).grows()  # following: the log so far has arrived
        second.send_signal(signal.SIGINT)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 130 and b"stopped following quiet; the run goes on" in err, err.decode()
        third = popen_remote(user_repo, sshd.env, "logs", "quiet", "-f")  # `kill`: as Ctrl-C (it said nothing, 143)
        PipeReader(third.stdout).grows()
        third.send_signal(signal.SIGTERM)
        _, err = third.communicate(timeout=60)
        assert third.returncode == 130 and b"stopped following quiet; the run goes on" in err, err.decode()
        assert status_row(user_repo, sshd.env, "testhost", "quiet")["status"] == "running"
    remote(user_repo, sshd.env, "stop", "quiet")
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 0 and b"connection lost" not in err, err.decode()
