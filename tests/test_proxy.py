"""A server reached through another (ProxyJump or ProxyCommand in ~/.ssh/config, as at many clusters):
enlace-remote names the HostName, so it must carry the proxy itself, on each of its paths — git (sync),
paramiko's connection (launch, logs, status) and the ssh client (fetch). The test sshd is its own jump
host: `ssh -W` from it to itself."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from support.remote import remote, tiny_corpus

from orchestrator.errors import UsageError
from orchestrator.hosts.resolve import Host, proxy_command


def _sessionless_connections(sshd) -> int:
    """Connections that authenticated and opened no session: what a jump hop looks like to sshd. Read in
    order, a port's record starting at its login: a port the kernel hands out again later is a new
    connection, not the old one's session."""
    sessions: list[bool] = []
    latest: dict[str, int] = {}
    for line in (sshd.dir / "sshd.log").read_text().splitlines():
        if m := re.search(r"Accepted publickey for \S+ from \S+ port (\d+)", line):
            latest[m[1]] = len(sessions)
            sessions.append(False)
        elif (m := re.search(r"Starting session: .* port (\d+) id", line)) and m[1] in latest:
            sessions[latest[m[1]]] = True
    return sessions.count(False)


def _jumps_since(sshd, before: int, expected: int) -> int:
    """Jump hops logged since `before`, waiting for `expected` of them: sshd's monitor answers a login
    before it logs it, so on a loaded host the last hop's line may come after the client is done."""
    deadline = time.monotonic() + 30
    while (jumps := _sessionless_connections(sshd) - before) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return jumps


@pytest.mark.slow
def test_sync_launch_logs_fetch_go_through_proxyjump_and_proxycommand(sshd, user_repo, tmp_path):
    d, marker = sshd.dir, tmp_path / "proxied"
    target = (
        f"  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d}/known_hosts\n"
    )
    with open(d / "ssh_config", "a") as cfg:
        cfg.write(f"Host viajump\n{target}  ProxyJump testhost\n")
        cfg.write(
            f"Host viacmd\n{target}  ProxyCommand sh -c 'echo %h:%p >> {marker}; exec ssh -F {d}/ssh_config -W %h:%p testhost'\n"
        )
    with open(d / "hosts.yaml", "a") as hosts:
        for name in ("viajump", "viacmd"):
            hosts.write(f"  {name}:\n    remote_dir: {tmp_path}/remote-{name}\n    python: {sys.executable}\n")
    listing = remote(user_repo, sshd.env, "hosts").stdout
    assert "127.0.0.1:" in listing and "via testhost" in listing and "via ProxyCommand" in listing, listing
    for host in ("viajump", "viacmd"):
        tiny_corpus(tmp_path / f"remote-{host}")
        before = _sessionless_connections(sshd)
        remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", host=host)  # git push, then paramiko
        remote(user_repo, sshd.env, "logs", "tiny", "-f", host=host)
        remote(user_repo, sshd.env, "fetch", "tiny", "--dest", str(tmp_path / f"fetched-{host}"), host=host)
        assert (tmp_path / f"fetched-{host}" / "checkpoints" / "latest").is_file()
        jumps = _jumps_since(sshd, before, 4)  # git's ssh, launch's and logs' paramiko, fetch's ssh
        assert jumps >= 4, jumps
        if host == "viacmd":  # the ProxyCommand ran for each of them, its tokens expanded
            lines = marker.read_text().splitlines()
            assert len(lines) == jumps and set(lines) == {f"127.0.0.1:{sshd.port}"}, lines
    # behind the jump, a host whose key is unknown: the key it offered through the jump is shown (a probe of its
    # own would reach whatever answers at that address from here), and no ssh-keyscan line, which takes no proxy
    (tmp_path / "empty").write_text("")
    with open(d / "ssh_config", "a") as cfg:
        cfg.write(f"Host viaempty\n{target.replace(f'{d}/known_hosts', str(tmp_path / 'empty'))}  ProxyJump testhost\n")
    with open(d / "hosts.yaml", "a") as hosts:
        hosts.write(f"  viaempty:\n    remote_dir: {tmp_path}/remote-viaempty\n    python: {sys.executable}\n")
    out = remote(user_repo, sshd.env, "status", host="viaempty", check=False)
    real = subprocess.run(["ssh-keygen", "-l", "-f", str(d / "host_key.pub")], capture_output=True, text=True)
    assert out.returncode == 4 and f"The server offers ssh-ed25519 {real.stdout.split()[1]}" in out.stderr, out.stderr
    assert "ssh-keyscan" not in out.stderr and "StrictHostKeyChecking=ask viaempty true` shows it" in out.stderr, (
        out.stderr
    )


def test_proxy_commands_for_paramiko_expand_tokens_and_name_what_they_cannot(tmp_path):
    host = Host("gpu", False, "~/enlace", "venv", hostname="10.0.0.5", user="alice", port=2222)
    assert proxy_command(host, []) is None
    host.proxy_command = "ssh -W %h:%p -l %r bastion # 100%%"
    assert proxy_command(host, []) == "/bin/sh -c 'exec ssh -W 10.0.0.5:2222 -l alice bastion # 100%'"
    host.proxy_command = "connect %d"
    with pytest.raises(UsageError, match="not %d"):
        proxy_command(host, [])
    host.proxy_command, host.proxy_jump = None, "hop1,bob@hop2:2200"
    assert proxy_command(host, ["-F", "cfg"]) == (
        "/bin/sh -c 'exec ssh -F cfg -J hop1 -p 2200 -W 10.0.0.5:2222 -- bob@hop2'"
    )
    host.proxy_jump = "bad hop"
    with pytest.raises(UsageError, match="cannot read"):
        proxy_command(host, [])


def test_a_jump_host_whose_key_is_unknown_is_said_at_once(sshd, user_repo, tmp_path):
    """Seen: `SSH handshake failed (No existing session)`, retried as a network fault, exit 4 after the
    retries; the jump host's own ssh had said `Host key verification failed.`"""
    d = sshd.dir
    (tmp_path / "empty_known_hosts").write_text("")
    with open(d / "ssh_config", "a") as cfg:
        cfg.write(
            f"Host newhop\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile {d}/client_key\n"
            f"  UserKnownHostsFile {tmp_path}/empty_known_hosts\n  StrictHostKeyChecking yes\n"
            f"Host behind\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile {d}/client_key\n"
            f"  UserKnownHostsFile {d}/known_hosts\n  ProxyJump newhop\n"
        )
    with open(d / "hosts.yaml", "a") as hosts:
        hosts.write(f"  behind:\n    remote_dir: {tmp_path}/remote-behind\n    python: {sys.executable}\n")
    started = time.monotonic()
    out = remote(user_repo, sshd.env, "status", host="behind", check=False)
    assert out.returncode == 4 and "the way there failed: Host key verification failed." in out.stderr, out.stderr
    assert "retrying" not in out.stderr and time.monotonic() - started < 60, out.stderr  # not the network's


def test_through_several_hops_the_refusing_hops_words_are_said():
    """`-J a,b` with hop a's key unknown: its "Host key verification failed." comes first, the outer ssh's
    "Connection closed" last; the last line alone made a final refusal a retried network fault."""
    import subprocess
    from types import SimpleNamespace

    from orchestrator.ssh.refused import proxy_said

    words = "echo 'Host key verification failed.' >&2; echo 'Connection closed by UNKNOWN port 65535' >&2"
    proxy = SimpleNamespace(process=subprocess.Popen(["sh", "-c", words], stderr=subprocess.PIPE))
    assert proxy_said(proxy) == "Host key verification failed."
    proxy = SimpleNamespace(
        process=subprocess.Popen(["sh", "-c", "echo a >&2; echo 'b: refused' >&2"], stderr=subprocess.PIPE)
    )
    assert proxy_said(proxy) == "b: refused" and proxy_said(None) == ""
