"""One run across two "hosts" on this machine: two real sshd instances on 127.0.0.1, each with
its own remote_dir. `launch --hosts h1,h2 --gpus 1` trains with world size 2 (gloo on CPU),
logs and fetch work from h1 (rank 0), stop ends both."""

from __future__ import annotations

import json
import time

import pytest
from support.procs import trainers_under
from support.remote import keeps_stepping, remote, tiny_corpus
from support.sshd import make_server

from enlace.train.checkpoint import load_checkpoint


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_hosts_one_run(tmp_path, user_repo):
    servers = [make_server(tmp_path, name) for name in ("h1", "h2")]
    try:
        cfg = tmp_path / "ssh_config"
        cfg.write_text("".join((s.dir / "ssh_config").read_text() for s in servers))
        hosts = tmp_path / "hosts.yaml"
        hosts.write_text(
            "hosts:\n"
            + "".join(
                f"  {n}: {{remote_dir: {tmp_path}/remote-{n}, python: {json.dumps(str(__import__('sys').executable))}}}\n"
                for n in ("h1", "h2")
            )
        )
        for s in servers:  # every host's ssh config names its own known_hosts; one known_hosts for both
            s.dir.joinpath("known_hosts").write_text("".join((t.dir / "known_hosts").read_text() for t in servers))
        env = {"ENLACE_SSH_CONFIG": str(cfg), "ENLACE_HOSTS_FILE": str(hosts)}
        for n in ("h1", "h2"):
            tiny_corpus(tmp_path / f"remote-{n}")
        out = remote(
            user_repo,
            env,
            "launch",
            "long",
            "--no-preflight",
            "--hosts",
            "h1,h2",
            "--gpus",
            "1",
            "--master-port",
            str(_free_port()),
            host="h1",
        )
        assert "launched long on h1" in out.stderr and "launched long on h2" in out.stderr
        keeps_stepping(tmp_path / "remote-h1" / "runs" / "long")
        st = json.loads(remote(user_repo, env, "status", "long", "--json", host="h1").stdout)[0]
        assert st["status"] == "running"
        log = remote(user_repo, env, "logs", "long", host="h1").stdout
        assert "world 2" in log  # rank 0's log, on h1
        out = remote(user_repo, env, "stop", "long", host="h1")
        assert "stopped" in out.stdout
        deadline = time.time() + 60  # rank 1's torchrun on h2 ends once the ranks agreed to stop
        while trainers_under(tmp_path / "remote-h2", "long") and time.time() < deadline:
            time.sleep(0.2)
        assert not trainers_under(tmp_path / "remote-h2", "long")
        h2 = json.loads(remote(user_repo, env, "status", "long", "--json", host="h2").stdout)[0]
        assert not h2["alive"]
        remote(user_repo, env, "fetch", "long", host="h1")
        latest = (user_repo / "runs" / "long" / "checkpoints" / "latest").read_text().strip()
        assert len(load_checkpoint(user_repo / "runs" / "long" / "checkpoints" / latest)["trainer.pt"]["ranks"]) == 2
    finally:
        for s in servers:
            s.stop()
        from support.procs import kill_processes_under

        kill_processes_under(tmp_path)
