"""One test per finding of the first-hour report (a new user on a real server), each against the real
driver, trainer and sshd. The README walk-through itself is tests/test_first_hour.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import REPO
from support.cli import enlace, run_json
from support.configs import write_run
from support.procs import Throttle
from support.remote import popen_remote, remote, server_dir, tiny_corpus
from support.repocopy import commit_all


def _connections(sshd) -> int:
    return (sshd.dir / "sshd.log").read_text().count("Accepted publickey")


def test_run_name_typo_is_caught_before_connecting(sshd, user_repo):
    before = _connections(sshd)
    for verb in ("preflight", "launch", "verify"):
        out = remote(user_repo, sshd.env, verb, "tinny", check=False)
        assert out.returncode == 2 and "did you mean 'tiny'?" in out.stderr, out.stderr
        assert out.stderr.count("Error:") == 1  # said once
    assert _connections(sshd) == before  # nothing was synced or asked


def test_unknown_host_lists_the_known_ones(sshd, user_repo):
    out = remote(user_repo, sshd.env, "status", host="gpu-nowhere", check=False)
    assert out.returncode == 2 and "is in no hosts file" in out.stderr and "testhost" in out.stderr
    assert "enlace-remote hosts add gpu-nowhere" in out.stderr and "Traceback" not in out.stderr


def test_global_options_work_after_the_verb(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "sync")
    out = remote(user_repo, {**sshd.env, "ENLACE_REMOTE_HOST": "nowhere"}, "status", "--host", "testhost", host="local")
    assert out.returncode == 0 and "no runs on this host" in out.stdout


def test_hosts_add_merges_and_duplicate_keys_are_refused(sshd, user_repo, tmp_path):
    path = tmp_path / "fresh" / "enlace" / "hosts.yaml"  # the folder does not exist yet
    env = {**sshd.env, "ENLACE_HOSTS_FILE": str(path)}
    remote(user_repo, env, "hosts", "add", "gpu1", "--ssh", "alice@gpu1.example.org:2222")
    out = remote(user_repo, env, "hosts", "add", "gpu2", "--ssh", "bob@gpu2", "--remote-dir", "/scratch/bob")
    assert "gpu2:" in out.stdout and "/scratch/bob" in out.stdout
    listing = remote(user_repo, env, "hosts").stdout
    assert (
        "alice@gpu1.example.org:2222" in listing
        and "bob@gpu2:22 (/scratch/bob)" in listing
        and "python venv" in listing
    )
    path.write_text(path.read_text() + "hosts:\n  gpu3: {ssh: c@d}\n")  # what `cat >>` did to users
    out = remote(user_repo, env, "hosts", check=False)
    assert out.returncode == 2 and "'hosts' is given twice" in out.stderr and "line" in out.stderr
    out = remote(user_repo, env, "hosts", "add", "bad", "--ssh", "x@y:70000", check=False)
    assert out.returncode == 2 and "not a TCP port" in out.stderr


def test_ssh_config_is_read_as_the_ssh_client_reads_it(tmp_path, monkeypatch):
    """Host settings come from `ssh -G` (what every ssh and git call will use), matching paramiko's
    reading on what both understand, and following an Include, which paramiko's reader cannot."""
    import paramiko

    from orchestrator.hosts.resolve import resolve_host

    (tmp_path / "more").write_text("Host inc\n  HostName 10.1.2.3\n  User carol\n  Port 2200\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Include {tmp_path}/more\nHost box\n  HostName 127.0.0.1\n  Port 2222\n  User alice\n"
        f"  IdentityFile /keys/box\n  UserKnownHostsFile {tmp_path}/kh\n  Ciphers aes256-ctr\nHost *.lab\n  User bob\n"
    )
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(cfg))
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "none.yaml"))
    reader = paramiko.SSHConfig.from_path(str(cfg))
    for alias in ("box", "gpu.lab", "plain.example.org"):
        h = resolve_host(alias, tmp_path)
        want = reader.lookup(alias)
        assert (h.hostname, h.user, h.port) == (want["hostname"], want.get("user"), int(want.get("port", 22)))
        assert h.identity_files == want.get("identityfile", []) and h.configured == (alias != "plain.example.org")
        default_known = str(Path("~/.ssh/known_hosts").expanduser())
        assert h.known_hosts == (str(tmp_path / "kh") if alias == "box" else default_known)
        assert h.ciphers == ("aes256-ctr" if alias == "box" else None)
    inc = resolve_host("inc", tmp_path)
    assert (inc.hostname, inc.user, inc.port, inc.configured) == ("10.1.2.3", "carol", 2200, True)
    monkeypatch.setenv("PATH", str(tmp_path / "no-ssh-client-here"))  # then paramiko reads the file
    box = resolve_host("box", tmp_path)
    assert (box.hostname, box.user, box.port, box.ciphers) == ("127.0.0.1", "alice", 2222, "aes256-ctr")


def test_paramiko_loads_without_invoke_and_match_exec_still_works(tmp_path):
    """The driver's paramiko import leaves out `invoke` (paramiko's import 100 -> 61 ms, on every remote command);
    an ssh config paramiko reads (no ssh client) that uses `Match exec` gets it back and resolves."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text('Match originalhost ex exec "test -d /"\n  Port 2300\nHost *\n  User bob\n')
    code = (
        "import sys\nfrom pathlib import Path\nfrom orchestrator.ssh.sshlib import load_paramiko, read_ssh_config\n"
        "paramiko = load_paramiko()\nbefore = 'invoke' in sys.modules\n"
        f"found = read_ssh_config(Path({str(cfg)!r}), 'ex')\n"
        "print(before, paramiko.SSHClient.__name__, found['port'], found['user'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "SSHClient", "2300", "bob"]


def test_unwritable_remote_dir_is_explained(sshd, user_repo, tmp_path):
    hosts = tmp_path / "h.yaml"
    hosts.write_text("hosts:\n  testhost: {remote_dir: /proc/enlace, connect_timeout: 5}\n")
    out = remote(user_repo, {**sshd.env, "ENLACE_HOSTS_FILE": str(hosts)}, "sync", check=False)
    assert out.returncode == 2 and "cannot create remote_dir /proc/enlace" in out.stderr and "remote_dir:" in out.stderr


def test_a_python_without_dependencies_is_named_with_the_venv_fix(sshd, user_repo, tmp_path):
    bare = tmp_path / "bare-venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True)  # no torch, no click
    hosts = tmp_path / "h.yaml"
    hosts.write_text(f"hosts:\n  local: {{remote_dir: {tmp_path}/srv, python: {bare}/bin/python}}\n")
    env = {**sshd.env, "ENLACE_HOSTS_FILE": str(hosts)}
    remote(user_repo, env, "sync", host="local")
    out = remote(user_repo, env, "verify", "tiny", host="local", check=False)
    assert out.returncode == 3 and "lacks enlace's dependencies" in out.stderr and "python: venv" in out.stderr


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
    assert "resumed from checkpoints/step-000030" in out.stderr
    remote(user_repo, sshd.env, "logs", "tiny", "-f", host="local")
    assert run_json(server_dir(sshd, "local") / "runs" / "tiny")["step"] == 40


@pytest.mark.slow
def test_running_run_is_refused_before_preflight(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight", host="local")
    out = remote(user_repo, sshd.env, "launch", "long", host="local", check=False)
    assert out.returncode == 7 and "already running" in out.stderr and "warm-up step" not in out.stderr
    assert remote(user_repo, sshd.env, "stop", "long", host="local").returncode == 0
    again = remote(user_repo, sshd.env, "stop", "long", host="local")  # stopping a stopped run: said, exit 0
    assert "is not running (stopped" in again.stdout


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


def test_missing_data_names_the_shared_data_dir(sshd, user_repo):
    out = remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", check=False)
    rd = server_dir(sshd, "testhost")
    assert (
        out.returncode == 3
        and f"{rd}/data/tiny/*.txt" in out.stderr
        and "trees/" not in out.stderr.split("looked for")[-1]
    )


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
    remote(user_repo, sshd.env, "stop", "quiet")
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 0 and b"connection lost" not in err, err.decode()


def test_host_key_messages_show_sha256_fingerprints(sshd, user_repo):
    (sshd.dir / "known_hosts").write_text("")
    out = remote(user_repo, sshd.env, "status", check=False)
    assert out.returncode == 4 and "The server offers ssh-ed25519 SHA256:" in out.stderr, out.stderr
    from support.sshd import keygen

    keygen(sshd.dir / "other_key")
    kind, key = (sshd.dir / "other_key.pub").read_text().split()[:2]
    (sshd.dir / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    out = remote(user_repo, sshd.env, "status", check=False)
    assert out.returncode == 4 and "CHANGED" in out.stderr and out.stderr.count("SHA256:") == 2, out.stderr
    fp = subprocess.run(["ssh-keygen", "-l", "-f", str(sshd.dir / "host_key.pub")], capture_output=True, text=True)
    assert fp.stdout.split()[1] in out.stderr  # exactly what ssh-keygen -l prints


def test_a_server_that_speaks_no_ssh_gives_one_clean_error(sshd, user_repo, tmp_path):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        threading.Thread(target=lambda: [srv.accept()[0].close() for _ in range(3)], daemon=True).start()
        out = remote(user_repo, sshd.env, "status", host=f"root@127.0.0.1:{port}", check=False)
    assert out.returncode == 4 and "Traceback" not in out.stderr and "SSH handshake failed" in out.stderr
    assert out.stderr.count("Error:") == 1


@pytest.mark.slow
def test_fetch_progress_stays_off_stdout(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    out = remote(user_repo, sshd.env, "fetch")
    assert "\r" not in out.stdout and out.stdout.count("\n") == 1 and "fetched (step-000030)" in out.stdout


@pytest.mark.slow
def test_resume_on_different_data_is_refused_with_the_override(project):
    write_run(project, "d", training={"max_steps": 4, "eval_every": 0}, checkpoint={"every": 2})
    enlace(project, "train", "d", "--until", "2")
    extra = project / "data" / "tiny" / "zz-extra.txt"
    extra.write_text("another machine's stdlib has one more file\n")
    out = enlace(project, "train", "d", check=False)
    assert out.returncode == 2 and "the data differs from the checkpoint's" in out.stderr
    assert "--allow-data-change" in out.stderr
    out = enlace(project, "train", "d", "--allow-data-change")
    assert run_json(project / "runs" / "d")["status"] == "finished"


@pytest.mark.slow
def test_preflight_of_a_resumed_run_projects_the_remaining_steps(project):
    write_run(project, "half", training={"max_steps": 40, "eval_every": 0}, checkpoint={"every": 10})
    enlace(project, "train", "half", "--until", "30")
    rep = json.loads(enlace(project, "preflight", "half", "--json", "--steps", "2").stdout)
    assert rep["throughput"]["resumes_at"] == 30 and rep["throughput"]["remaining_steps"] == 10
    assert rep["disk"]["ok"] and rep["disk"]["checkpoint_mib"] > 0


def test_runs_table_rounds_loss(project):
    write_run(project, "r", training={"max_steps": 2, "eval_every": 0})
    enlace(project, "train", "r")
    out = enlace(project, "runs").stdout
    loss = out.split("loss ")[1].split()[0]
    assert "finished" in out and len(loss.split(".")[1]) == 4, out


@pytest.mark.slow
def test_ctrl_c_during_a_fetch_is_one_line(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    with open(
        server_dir(sshd, "testhost") / "runs" / "tiny" / "train.log", "ab"
    ) as fh:  # a long log: seconds of transfer
        fh.truncate(fh.seek(0, 2) + 400 * 2**20)
    import os
    import signal
    import sys

    from support import REPO

    cmd = [sys.executable, "-c", "from orchestrator.cli import run_main; run_main()", "--host", "testhost", "fetch"]
    client = subprocess.Popen(
        cmd,
        cwd=user_repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **sshd.env},
    )
    staging = user_repo / "runs" / "tiny" / ".partial-fetch" / "train.log"
    deadline = time.time() + 120
    while not (staging.exists() and staging.stat().st_size > 2**20):
        assert time.time() < deadline and client.poll() is None, client.communicate()
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, err = client.communicate(timeout=60)
    assert client.returncode in (1, 130) and "Traceback" not in err, err
    assert "rerun fetch to resume" in err and len([x for x in err.splitlines() if x.strip()]) <= 4, err
