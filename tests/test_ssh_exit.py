"""A remote command's own exit 255 is its code, not a lost connection (orchestrator/ssh/sshexit.py): the
system ssh client exits 255 for its own failures too, and a command taken for one was retried (twice run)
and reported as an unreachable host. Against the real sshd, on both paths: paramiko's (its `run` and
`stream` read the status from the channel; its wires are the system ssh's) and the shared connection's."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.ssh.sshexit import OWN_255, ssh_failed

COUNT_AND_EXIT = ["sh", "-c", 'echo ran >> "$0"; echo out; echo err >&2; exit "$1"']


def _transport(sshd, repo, monkeypatch):
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.connect import connect

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    return connect(resolve_host("testhost", repo))


@pytest.mark.parametrize("connection", ["direct", "shared"])
def test_a_commands_own_255_is_its_exit_code_on_run_stream_and_duplex(
    sshd, user_repo, tmp_path, monkeypatch, connection
):
    if connection == "shared":
        sshd.share_connection()
    transport = _transport(sshd, user_repo, monkeypatch)
    ran = tmp_path / "ran"
    try:
        for code in ("255", "3"):
            result = transport.run([*COUNT_AND_EXIT, str(ran), code], check=False)
            assert (result.exited, result.stdout) == (int(code), "out\n"), result
            out, err = bytearray(), bytearray()
            assert transport.stream([*COUNT_AND_EXIT, str(ran), code], out.extend, err.extend, 60) == int(code)
            assert out == b"out\n" and b"err\n" in err
            with transport.duplex([*COUNT_AND_EXIT, str(ran), code], 60, lambda: None) as wire:
                assert wire.read(100) == b"out\n"
                got, text = wire.finish()
            assert got == int(code) and "err" in text, (got, text)
        assert ran.read_text() == "ran\n" * 6  # each ran once: none retried as a dropped connection
    finally:
        transport.close()


def test_ssh_s_own_255_is_still_its_failure(sshd):
    """A refused connection (nothing listens on the port): ssh exits 255 with its own words, no marker."""
    p = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-p", "1", "127.0.0.1", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 255 and ssh_failed(p.returncode, p.stderr), p.stderr
    assert not ssh_failed(255, f"some output\n{OWN_255}\n") and not ssh_failed(3, "")


@pytest.mark.parametrize("connection", ["direct", "shared"])
def test_a_command_killed_by_a_signal_is_still_a_session_that_ended_without_a_status(
    sshd, user_repo, monkeypatch, connection
):
    """The OOM killer's SIGKILL to a server command mid-transfer: a Transient (fetch and data push resume after
    one), as paramiko's path says of an exit-signal, not exit 137 — the wrapping `sh` ends by the same signal.
    (Its price: on the system ssh's path a command's own exit 129-159 reads as that signal; the server's
    commands exit 0-10.)"""
    from orchestrator.errors import Transient

    if connection == "shared":
        sshd.share_connection()
    transport = _transport(sshd, user_repo, monkeypatch)
    killed = ["sh", "-c", 'echo out; kill -9 "$$"']
    try:
        with pytest.raises(Transient):
            transport.run(killed, idempotent=False)  # not idempotent: raised at once, not retried
        with pytest.raises(Transient), transport.duplex(killed, 60, lambda: None) as wire:
            wire.read(100)
            wire.finish()
    finally:
        transport.close()


@pytest.mark.parametrize("dies", ["kill -INT $$", "exit 130"])
def test_a_local_command_ended_by_our_ctrl_c_is_our_ctrl_c(dies):
    """On `local` a server verb is a child in our process group: a Ctrl-C ends it too, and it was said as
    "warning: local: `enlace runs` exited -2" before the verb's own words on the interrupt."""
    from support import REPO

    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.local import LocalTransport

    transport = LocalTransport(resolve_host("local", REPO))
    with pytest.raises(KeyboardInterrupt):
        transport.run(["sh", "-c", dies], check=False)
    assert transport.run(["sh", "-c", "exit 3"], check=False).exited == 3  # any other code is the command's
