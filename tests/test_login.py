"""One login per session (orchestrator/ssh/openssh.py) against a real sshd that asks for a key and a
one-time code through PAM (support/otp.py): the code is typed once — through SSH_ASKPASS, counted — and
every verb after it rides that connection; sshd's own log counts the authentications. Without a login a
verb exits 4 with the line to log in, at once, even with a terminal on its stdin where a prompt could wait."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support import REPO
from support.configs import write_tiny_corpus
from support.otp import make_otp_server
from support.procs import kill_processes_under
from support.remote import DRIVER, remote
from support.sshd import make_server
from test_board import _start_board

HINT = "log in once with: enlace-remote login otphost"


@pytest.fixture
def otp(tmp_path):
    srv = make_otp_server(tmp_path)
    yield srv
    srv.remove()
    kill_processes_under(tmp_path)


def _with_a_terminal(repo, env: dict, *args: str, host: str = "otphost") -> subprocess.CompletedProcess:
    """enlace-remote with a pseudo-terminal as stdin, where paramiko's or ssh's prompt would wait for an
    answer: it must end by itself (the timeout fails the test)."""
    main, term = pty.openpty()
    try:
        return subprocess.run(
            [*DRIVER, "--host", host, *args],
            cwd=repo,
            stdin=term,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
        )
    finally:
        os.close(main)
        os.close(term)


def _refused_without_login(repo, env: dict) -> None:
    r = _with_a_terminal(repo, env, "status")
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert r.stderr.strip().count("\n") == 0 and HINT in r.stderr, r.stderr


def _poll_board(repo, env: dict, times: int) -> None:
    proc, url = _start_board(repo, env, "otphost")
    try:
        token, base = url.split("token=")[1], url.split("/?")[0]
        for _ in range(times):
            req = urllib.request.Request(
                f"{base}/api/run?host=otphost&run=tiny&log=-1", headers={"X-Enlace-Token": token}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.loads(r.read())["state"]["status"] == "finished"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_one_login_carries_every_verb_and_a_verb_without_one_exits_4(otp, user_repo, tmp_path):
    env = otp.env
    _refused_without_login(user_repo, env)
    assert otp.codes_asked() == 0

    out = remote(user_repo, otp.login_env(), "login", host="otphost")
    assert "logged in to otphost" in out.stderr, out.stderr
    assert otp.codes_asked() == 1 and otp.logins() == 1
    assert "connection shared, logged in" in remote(user_repo, env, "hosts").stdout

    write_tiny_corpus(user_repo / "data" / "tiny")
    remote(user_repo, env, "data", "push", "tiny", host="otphost")  # sync (git over the login), then the wire
    remote(user_repo, env, "launch", "tiny", "--no-preflight", host="otphost")
    out = remote(user_repo, env, "logs", "tiny", "-f", host="otphost")
    assert "step" in out.stdout
    remote(user_repo, env, "launch", "long", "--no-preflight", host="otphost")
    remote(user_repo, env, "status", "long", host="otphost")
    remote(user_repo, env, "stop", "long", host="otphost")
    remote(user_repo, env, "fetch", "tiny", "--dest", str(tmp_path / "fetched"), host="otphost")
    assert (tmp_path / "fetched" / "checkpoints" / "latest").is_file()
    _poll_board(user_repo, env, times=10)

    assert otp.logins() == 1 and otp.codes_asked() == 1, (otp.logins(), otp.codes_asked())
    out = remote(user_repo, env, "logout", "otphost")
    assert "logged out of otphost" in out.stderr
    _refused_without_login(user_repo, env)
    assert otp.logins() == 1


@pytest.mark.slow
def test_a_login_through_a_jump_host(otp, user_repo, tmp_path):
    """ProxyJump in ~/.ssh/config in front of the code-asking host: the login opens both hops once."""
    jump = make_server(tmp_path, "jumphost")
    try:
        with open(otp.sshd.dir / "ssh_config", "a") as cfg:
            cfg.write((jump.dir / "ssh_config").read_text())
            cfg.write("Host otphost\n  ProxyJump jumphost\n")  # the first value wins: HostName etc. stay above
        _refused_without_login(user_repo, otp.env)  # through the jump (its key is enough there), refused after it
        jump_log = jump.dir / "sshd.log"
        before = jump_log.read_text().count("Accepted publickey for root")
        remote(user_repo, otp.login_env(), "login", "otphost")
        assert "via jumphost" in remote(user_repo, otp.env, "hosts").stdout
        for _ in range(3):
            remote(user_repo, otp.env, "setup", host="otphost")
        jumps = jump_log.read_text().count("Accepted publickey for root") - before
        assert otp.logins() == 1 and jumps == 1, (otp.logins(), jumps)
    finally:
        jump.stop()


def test_a_socket_not_ours_is_never_ridden(tmp_path, monkeypatch):
    """A master's socket at this host's path that another account made (its name is predictable in /tmp) was
    taken as a login: every verb rode that account's connection, past our own host-key check. Here the
    other account is this process seen under another uid."""
    import shutil
    import socket
    import tempfile

    from orchestrator.errors import UsageError
    from orchestrator.hosts.resolve import Host
    from orchestrator.ssh import openssh

    short = tempfile.mkdtemp(prefix="ens", dir="/tmp")  # a socket's path must be short (tmp_path's is not)
    monkeypatch.setenv(openssh.CONTROL_DIR_ENV, short)
    host = Host(name="gpu", local=False, remote_dir="~/enlace", python="venv", hostname="gpu.example.org")
    path = openssh.control_path(host)
    assert path.parent == Path(short)
    with socket.socket(socket.AF_UNIX) as master, contextlib.ExitStack() as later:
        later.callback(shutil.rmtree, short)
        master.bind(str(path))
        assert openssh.shares_connection(host) and openssh.logged_in(host)  # ours: a login
        monkeypatch.setattr(os, "getuid", lambda: os.geteuid() + 1)  # now another account's
        assert not openssh.shares_connection(host) and not openssh.logged_in(host)
        shared = openssh.SharedTransport(Host(**{**host.__dict__, "connection": "shared"}))
        with pytest.raises(UsageError, match="another account's socket"):
            shared.ensure_master()
