"""A command's reply arrives whole however large it is (faults round 4, item 1). sshd sends the exit status
as soon as the command is reaped, which can be before the last of a large reply has crossed; a read that
stopped at the status cut `enlace runs`' JSON short on a host with a few hundred runs."""

from __future__ import annotations

import hashlib
import json

import pytest
from support.remote import remote, server_dir, tiny_corpus

from enlace.contract import Status
from enlace.state import runs


def _transport(sshd, repo, monkeypatch):
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.connect import connect

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    return connect(resolve_host("testhost", repo))


@pytest.mark.slow
@pytest.mark.parametrize("connection", ["direct", "shared"])
def test_a_10_mb_json_reply_arrives_whole_100_times_in_a_row(sshd, user_repo, tmp_path, monkeypatch, connection):
    if connection == "shared":
        sshd.share_connection()
    doc = json.dumps([{"run": f"r{i:05d}", "loss": i / 7, "pad": "x" * 90} for i in range(100_000)])
    assert len(doc) > 10_000_000
    (tmp_path / "reply.json").write_text(doc)
    want = hashlib.sha256(doc.encode()).hexdigest()
    # `cat` exits as soon as its last bytes are in the pipe; sshd reaps it with a pipe's worth still unsent.
    # A line on stderr after it: both streams are read to their end.
    command = ["sh", "-c", f"cat {tmp_path}/reply.json; echo done >&2"]
    transport = _transport(sshd, user_repo, monkeypatch)
    try:
        for attempt in range(100):
            result = transport.run(command)
            got = hashlib.sha256(result.stdout.encode()).hexdigest()
            assert (got, result.stderr) == (want, "done\n"), f"try {attempt}: {len(result.stdout)} of {len(doc)} bytes"
    finally:
        transport.close()


def _many_runs(remote_dir, n: int) -> None:
    """n finished runs in the host's runs/, as a few sweeps leave them."""
    for i in range(n):
        run_dir = remote_dir / "runs" / f"old-{i:04d}"
        runs.update(run_dir, status=Status.FINISHED, step=100, max_steps=100, loss=2.5, val_bpb=3.1, exit_code=0)


@pytest.mark.slow
def test_status_and_launch_with_1000_runs_on_the_host(sshd, user_repo):
    remote(user_repo, sshd.env, "setup")
    tiny_corpus(server_dir(sshd, "testhost"))
    _many_runs(server_dir(sshd, "testhost"), 1000)
    for _ in range(5):
        rows = json.loads(remote(user_repo, sshd.env, "status", "--json").stdout)
        assert len(rows) == 1000 and {row["status"] for row in rows} == {"finished"}
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f", "tiny")
    assert runs.read(server_dir(sshd, "testhost") / "runs" / "tiny")["status"] == "finished"
