"""`enlace-remote fetch` against a real sshd: one run name from two hosts is refused, progress stays off
stdout, Ctrl-C is one line, neither SFTP nor rsync is needed, an ssh client is optional, an interrupted fetch
never appends to rewritten run files. (Its wire on real files, without sshd: test_fetch_wire.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from support import REPO
from support.remote import popen_remote, remote, server_dir, tiny_corpus


@pytest.mark.slow
def test_fetch_needs_neither_sftp_nor_rsync(tmp_path, user_repo):
    """fetch is one `enlace fetch-serve` conversation on the SSH connection: a server without SFTP
    still hands back the checkpoint, byte for byte (nothing in enlace runs rsync any more)."""
    from support.sshd import make_server

    srv = make_server(tmp_path, name="nosftp", sftp=False)
    try:
        tiny_corpus(tmp_path / "remote-nosftp")
        remote(user_repo, srv.env, "launch", "tiny", "--no-preflight", host="nosftp")
        remote(user_repo, srv.env, "logs", "tiny", "-f", host="nosftp")
        remote(user_repo, srv.env, "fetch", "tiny", host="nosftp")
        server = tmp_path / "remote-nosftp" / "runs" / "tiny" / "checkpoints" / "step-000030"
        here = user_repo / "runs" / "tiny" / "checkpoints" / "step-000030"
        assert sorted(p.name for p in here.iterdir()) == sorted(p.name for p in server.iterdir())
        for f in server.iterdir():
            assert (here / f.name).read_bytes() == f.read_bytes(), f.name
    finally:
        srv.stop()


@pytest.mark.slow
def test_fetch_without_an_ssh_client_goes_over_paramikos_channel(sshd, user_repo, monkeypatch):
    """No `ssh` binary here (a bare container, Windows without OpenSSH): the same conversation runs on a
    channel of paramiko's connection, and resumes a partial file the same way."""
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh import duplex
    from orchestrator.ssh.connect import connect
    from orchestrator.ssh.session import Session
    from orchestrator.transfer.fetch import fetch

    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "tiny", "-f")
    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "ssh" else real_which(name, *a, **k))
    used = []
    monkeypatch.setattr(
        duplex.ChannelDuplex, "finish", lambda self, f=duplex.ChannelDuplex.finish: used.append(1) or f(self)
    )
    server = server_dir(sshd, "testhost") / "runs" / "tiny" / "checkpoints" / "step-000030"
    partial = user_repo / "runs" / "tiny" / ".partial-fetch" / "checkpoints" / "step-000030"
    partial.mkdir(parents=True)
    (partial / "model.pt").write_bytes((server / "model.pt").read_bytes()[:1000])
    session = Session(connect(resolve_host("testhost", user_repo)), user_repo)
    try:
        rep = fetch(session, "tiny", user_repo / "runs" / "tiny", all_checkpoints=False)
        cipher = session.transport.cipher
    finally:
        session.close()
    assert used and rep["fetched"] == ["step-000030"]
    assert cipher == "aes128-gcm@openssh.com"  # offered first: 0.59x -> 0.69x rsync on this path
    here = user_repo / "runs" / "tiny" / "checkpoints" / "step-000030"
    for f in server.iterdir():
        assert (here / f.name).read_bytes() == f.read_bytes(), f.name
    from enlace.server.fetchserve import RUN_FILES

    run_files = [server.parent.parent / n for n in RUN_FILES if (server.parent.parent / n).is_file()]
    sent = sum(f.stat().st_size for f in [*server.iterdir(), *run_files])
    assert rep["bytes"] == sent - 1000  # model.pt resumed after its first 1000 bytes


@pytest.mark.slow
def test_an_interrupted_fetch_never_appends_to_rewritten_run_files(sshd, user_repo):
    """An interrupted fetch left a short run.json and train.log; the server rewrote both since."""
    env = sshd.env
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, env, "launch", "tiny", "--no-preflight")
    remote(user_repo, env, "logs", "tiny", "-f")
    staging = user_repo / "runs" / "tiny" / ".partial-fetch"
    staging.mkdir(parents=True)
    (staging / "run.json").write_text('{\n "status": "running",\n "step": 3\n')  # an older, shorter version
    (staging / "train.log").write_text("a line the server no longer has\n")
    remote(user_repo, env, "fetch", "tiny")
    server = server_dir(sshd, "testhost") / "runs" / "tiny"
    for name in ("run.json", "train.log", "metrics.jsonl"):
        assert (user_repo / "runs" / "tiny" / name).read_bytes() == (server / name).read_bytes(), name
    assert json.loads((user_repo / "runs" / "tiny" / "run.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_fetch_refuses_to_mix_one_run_name_from_two_hosts(sshd, user_repo):
    for host in ("testhost", "local"):
        tiny_corpus(server_dir(sshd, host))
        remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", host=host)
        remote(user_repo, sshd.env, "logs", "tiny", "-f", host=host)
    remote(user_repo, sshd.env, "fetch", host="testhost")  # no RUN: the one last launched there
    out = remote(user_repo, sshd.env, "fetch", "tiny", host="local", check=False)
    assert out.returncode == 2 and "would mix two runs" in out.stderr and "--dest" in out.stderr
    other = user_repo / "runs" / "tiny@local"
    remote(user_repo, sshd.env, "fetch", "tiny", "--dest", str(other), host="local")
    assert json.loads((other / ".enlace-origin.json").read_text())["host"] == "local"
    # plot refuses the same way, naming the option it has (it suggested a --dest it did not have)
    out = remote(user_repo, sshd.env, "plot", "tiny", host="local", check=False)
    assert out.returncode == 2 and "--dest" in out.stderr, out.stderr
    drawn = remote(user_repo, sshd.env, "plot", "tiny", "--dest", str(other), host="local").stdout.strip()
    assert drawn == str(other / "curves.png") and (other / "curves.png").stat().st_size > 10_000
    # the server's newest checkpoint corrupt: said, not installed, and the hint never asks to delete its only copy
    model = server_dir(sshd, "local") / "runs" / "tiny" / "checkpoints" / "step-000030" / "model.pt"
    model.write_bytes(b"X" + model.read_bytes()[1:])
    out = remote(
        user_repo,
        sshd.env,
        "fetch",
        "tiny",
        "--all",
        "--dest",
        str(user_repo / "runs" / "t3"),
        host="local",
        check=False,
    )
    said = "checkpoints/step-000030/model.pt of tiny: sha256 does not match the server's MANIFEST — not installed"
    assert out.returncode == 1 and said in out.stderr and "it is corrupt on the server" in out.stderr, out.stderr
    t3 = user_repo / "runs" / "t3" / "checkpoints"  # the older ones land all the same (it installed none)
    installed = sorted(p.name for p in t3.iterdir() if p.is_dir())
    assert "step-000030" not in installed and installed, out.stderr
    assert (t3 / "latest").read_text().strip() == installed[-1]  # the newest that is here, verified
    staged = (
        user_repo / "runs" / "t3" / ".partial-fetch" / "checkpoints" / "step-000030"
    )  # a rerun sends model.pt alone
    assert not (staged / "model.pt").exists() and any(staged.iterdir()), out.stderr
    out = remote(user_repo, sshd.env, "sample", "tiny", "--bytes", "4", host="local", check=False)
    assert "does not match its sha256 in MANIFEST (a corrupt copy)" in out.stderr, out.stderr
    assert "brings it again" not in out.stderr  # (it said: delete the server's only copy, and fetch brings it)
    mine = other / "checkpoints" / "step-000030"  # a fetched copy damaged here: fetch brings it again, from where
    (mine / "model.pt").write_bytes(b"X" + (mine / "model.pt").read_bytes()[1:])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    here = subprocess.run(
        [sys.executable, "-m", "enlace", "sample", str(mine), "--bytes", "4"],
        cwd=user_repo,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    again = f"`enlace-remote --host local fetch tiny --dest {other}` brings it again, verified"
    assert here.returncode == 2 and again in here.stderr, here.stderr


@pytest.mark.slow
def test_fetch_progress_stays_off_stdout(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    out = remote(user_repo, sshd.env, "fetch")
    assert "\r" not in out.stdout and out.stdout.count("\n") == 1 and "fetched (step-000030)" in out.stdout


@pytest.mark.slow
def test_ctrl_c_during_a_fetch_is_one_line(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    with open(
        server_dir(sshd, "testhost") / "runs" / "tiny" / "train.log", "ab"
    ) as fh:  # a long log: seconds of transfer
        fh.truncate(fh.seek(0, 2) + 400 * 2**20)

    client = popen_remote(user_repo, sshd.env, "fetch")
    staging = user_repo / "runs" / "tiny" / ".partial-fetch" / "train.log"
    deadline = time.time() + 120
    while not (staging.exists() and staging.stat().st_size > 2**20):
        assert time.time() < deadline and client.poll() is None, client.communicate()
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)  # what Ctrl-C sends
    err = client.communicate(timeout=60)[1].decode()
    assert client.returncode == 130 and "Traceback" not in err, err  # 128 + SIGINT, as shells say it
    assert "rerun fetch to resume" in err and len([x for x in err.splitlines() if x.strip()]) <= 4, err
