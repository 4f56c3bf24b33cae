"""Faults found by breaking enlace on purpose (issue: run state, protocol, faults), each reproduced
against the real trainer, the real driver, a real sshd and git."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.cli import enlace, run_json
from support.configs import write_run
from support.remote import remote, server_dir, tiny_corpus, wait_until


def _row(user_repo, sshd, host, run):
    return json.loads(remote(user_repo, sshd.env, "status", run, "--json", host=host).stdout)[0]


# -- the trainer ---------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1.2 MiB tmpfs: room for two tiny checkpoints, not three (needs root and mount)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the disk-full test needs a real small filesystem")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_fails_the_run_clearly_and_relaunch_refuses(project, small_disk):
    write_run(project, "full", checkpoint={"every": 2, "keep": 10}, training={"max_steps": 200, "eval_every": 0})
    # ≈0.4 MiB a checkpoint: two fit (train checks that before it starts), the third cannot
    out = enlace(project, "train", "full", "--runs-dir", str(small_disk), check=False)
    run_dir = small_disk / "full"
    state = run_json(run_dir)
    assert out.returncode == 9, out.stdout[-2000:] + out.stderr[-2000:]
    assert state["status"] == "failed" and state["exit_code"] == 9
    assert state["error"].startswith("No space left on device while saving step-") and "MiB free" in state["error"]
    assert "needs ≈" in state["error"] and "Traceback" not in out.stderr
    assert "error: No space left on device while saving" in (run_dir / "train.log").read_text()
    assert not [p for p in run_dir.rglob(".*tmp*")], list(run_dir.rglob(".*tmp*"))  # no temp file left behind
    assert run_json(run_dir)["step"] >= 2  # the earlier checkpoints are intact and complete
    from enlace.train.checkpoint import latest_checkpoint, verify_checkpoint

    verify_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    again = enlace(project, "train", "full", "--runs-dir", str(small_disk), check=False)
    assert again.returncode == 9 and "2 checkpoints need" in again.stderr, again.stderr  # refused before training
    assert run_json(run_dir)["status"] == "failed"


def _three_checkpoints(project, name="ck"):
    write_run(project, name, checkpoint={"every": 2, "keep": 5}, training={"max_steps": 6, "eval_every": 0})
    enlace(project, "train", name)
    return project / "runs" / name / "checkpoints"


@pytest.mark.slow
def test_broken_manifests_are_named_and_a_lost_history_is_said(project):
    ckpts = _three_checkpoints(project)
    (ckpts / "step-000006" / "MANIFEST").write_text("{}")
    (ckpts / "step-000004" / "MANIFEST").write_text("{not json")
    from enlace.errors import CheckpointError
    from enlace.train.checkpoint import latest_checkpoint, read_manifest

    with pytest.raises(CheckpointError, match="MANIFEST has format version None"):
        read_manifest(ckpts / "step-000006")
    with pytest.raises(CheckpointError, match="MANIFEST is not valid JSON"):
        read_manifest(ckpts / "step-000004")
    assert latest_checkpoint(ckpts).name == "step-000002"
    (ckpts / "step-000002" / "MANIFEST").unlink()  # every checkpoint is gone now
    out = enlace(project, "train", "ck", "--set", "training.max_steps=7")
    assert "ignored (not a complete checkpoint): " in out.stdout and "MANIFEST is not valid JSON" in out.stdout
    assert "no complete checkpoint: starting from step 0" in out.stdout


@pytest.mark.slow
def test_corrupt_newest_checkpoint_names_the_previous_one_and_resume_path_continues(project):
    ckpts = _three_checkpoints(project)
    model = ckpts / "step-000006" / "model.pt"
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    out = enlace(project, "train", "ck", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "step-000006" in out.stderr and "--resume checkpoints/step-000004" in out.stderr, out.stderr
    out = enlace(project, "train", "ck", "--resume", "checkpoints/step-000004")
    assert "resumed from checkpoints/step-000004 at step 4" in out.stdout
    assert run_json(project / "runs" / "ck")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["manifest-deleted", "manifest-empty", "files-removed", "dir-removed"])
def test_an_incomplete_newest_checkpoint_is_said_in_status_and_train_log(project, damage):
    """`latest` names step-000006 but it is not complete: resuming from step-000004 costs 2 steps, and
    status and train.log say so, with --resume offered — never a silent step back."""
    from enlace.server import runs

    ckpts = _three_checkpoints(project)
    newest = ckpts / "step-000006"
    if damage == "manifest-deleted":
        (newest / "MANIFEST").unlink()
    elif damage == "manifest-empty":
        (newest / "MANIFEST").write_text("{}")
    elif damage == "files-removed":
        for f in newest.iterdir():
            f.unlink()
    else:
        shutil.rmtree(newest)
    said = "step-000006 is incomplete ({}): resuming from step-000004; 2 steps will be trained again"
    reason = {
        "manifest-deleted": "no MANIFEST",
        "manifest-empty": "MANIFEST has format version None; this enlace reads v1",
        "files-removed": "no MANIFEST",
        "dir-removed": "missing",
    }[damage]
    assert runs.observe(project / "runs" / "ck")["checkpoint_warning"] == said.format(reason)
    out = enlace(project, "train", "ck")
    assert "resumed from checkpoints/step-000004 at step 4" in out.stdout
    assert f"warning: {said.format(reason)} — to resume from another checkpoint: --resume" in out.stdout
    log = (project / "runs" / "ck" / "train.log").read_text()
    assert said.format(reason) in log
    assert runs.observe(project / "runs" / "ck")["checkpoint_warning"] is None  # step-000006 written anew


def test_status_table_puts_a_runs_error_on_a_detail_line_and_host_errors_in_host_rows():
    from orchestrator.view.status import format_status

    base = {"step": 3, "max_steps": 10, "loss": None, "tokens_per_s": None, "elapsed_s": None, "eta_s": None}
    base |= {"updated_at": None, "commit": "abc"}
    rows = [
        {"host": "gpu1", "run_name": "smoke", "status": "failed", "error": "ConfigError: " + "x" * 250, **base},
        {"host": "gpu2", "host_error": "unreachable: connection refused"},
    ]
    lines = format_status(rows, hosts=True).splitlines()
    assert lines[1].split()[:3] == ["gpu1", "smoke", "failed"]
    assert lines[2].strip().startswith("└ error: ConfigError: xxx") and "enlace-remote status smoke" in lines[2]
    assert len(lines[2]) < 180 and max(len(line) for line in lines[:2]) < 120
    assert lines[3].split()[:3] == ["gpu2", "-", "unreachable:"]
    full = format_status(rows[:1], hosts=True, full=True)
    assert "x" * 250 in full


# -- the driver: input refused before any I/O ----------------------------------------------------


@pytest.mark.parametrize("grace", ["nan", "-5", "inf", "0", "86401", "soon"])
def test_stop_grace_is_validated(sshd, user_repo, grace):
    out = remote(user_repo, sshd.env, "stop", "tiny", "--grace", grace, check=False)
    assert out.returncode == 2 and "--grace" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("port", ["99999999", "0", "65536"])
def test_ports_are_range_checked(sshd, user_repo, port):
    out = remote(user_repo, sshd.env, "status", host=f"root@127.0.0.1:{port}", check=False)
    assert out.returncode == 2 and "not a TCP port" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_git_repo_that_is_not_an_enlace_checkout_is_named(sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    out = remote(other, sshd.env, "status", host="local", check=False)
    assert out.returncode == 2 and "not an enlace checkout" in out.stderr and "Traceback" not in out.stderr


# -- the driver against a real sshd ---------------------------------------------------------------


@pytest.mark.slow
def test_logs_follow_says_when_the_trainer_was_killed(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "local"))
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--restarts", "0", host="local")  # no healing
    wait_until(lambda: _row(user_repo, sshd, "local", "long")["step"] >= 60, what="a checkpoint")  # every 50 steps
    os.kill(_row(user_repo, sshd, "local", "long")["pid"], signal.SIGKILL)
    out = remote(user_repo, sshd.env, "logs", "long", "-f", host="local", check=False)
    assert out.returncode == 8, (out.returncode, out.stderr)
    assert "long crashed" in out.stderr and "last logged step" in out.stderr
    assert re.search(r"last complete checkpoint step-\d{6} ", out.stderr), out.stderr  # how far it got: load decides


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


def test_ssh_offers_aes_gcm_first_unless_the_users_ssh_config_sets_ciphers(sshd, user_repo, monkeypatch):
    """Every ssh the driver runs (fetch, git, logs) offers AES-GCM first, as the paramiko connection
    does; the Ciphers line of the host in the user's ssh config is kept."""
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.transport import connect

    def negotiated() -> str:
        transport = connect(resolve_host("testhost", user_repo))
        argv = [*transport.ssh_argv(), "-v", transport.remote_path("").rstrip(":"), "true"]
        out = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        assert out.returncode == 0, out.stderr
        return re.search(r"kex: server->client cipher: (\S+)", out.stderr).group(1)

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    assert negotiated() == "aes128-gcm@openssh.com"
    config = sshd.dir / "ssh_config"
    config.write_text(config.read_text() + "  Ciphers aes256-ctr\n")
    assert negotiated() == "aes256-ctr"


@pytest.mark.slow
def test_fetch_without_an_ssh_client_goes_over_paramikos_channel(sshd, user_repo, monkeypatch):
    """No `ssh` binary here (a bare container, Windows without OpenSSH): the same conversation runs on a
    channel of paramiko's connection, and resumes a partial file the same way."""
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh import duplex
    from orchestrator.ssh.session import Session
    from orchestrator.ssh.transport import connect
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
        cipher = session.transport._connection().get_transport().remote_cipher
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
    cmd = [
        sys.executable,
        "-c",
        "from orchestrator.cli import run_main; run_main()",
        "--host",
        host,
        "preflight",
        "heavy",
        "--steps",
        "3",
    ]
    client = subprocess.Popen(
        cmd,
        cwd=user_repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), **sshd.env},
    )
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


def test_local_helpers_die_with_the_driver(tmp_path):
    """Local helpers (git) run with PR_SET_PDEATHSIG: a SIGKILLed enlace-remote leaves none writing on."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import subprocess, time
from orchestrator.ssh.portable import die_with_us
p = subprocess.Popen(["sleep", "120"], preexec_fn=die_with_us())
open({str(pidfile)!r}, "w").write(str(p.pid))
time.sleep(120)
""",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
    child = int(pidfile.read_text())
    parent.kill()
    parent.wait()
    from enlace.server.runs import proc_start

    wait_until(lambda: proc_start(child) is None, timeout=10, what="the child to die with its parent")


@pytest.mark.slow
def test_the_fixtures_session_kill_cuts_a_non_root_accounts_connection(tmp_path, fresh_user):
    """For a non-root account sshd keeps a second, unprivileged process per connection; the fixture's kill
    must end that too, or a test of reconnects passes with none."""
    from support.remote import wait_until
    from support.sshd import make_server

    srv = make_server(tmp_path, name="fresh", own_homes=True)
    try:
        ssh_dir = Path(f"/home/{fresh_user}/.ssh")
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(srv.dir / "client_key.pub", ssh_dir / "authorized_keys")
        subprocess.run(["chown", "-R", f"{fresh_user}:", str(ssh_dir)], check=True)
        client = subprocess.Popen(
            ["ssh", "-F", str(srv.dir / "ssh_config"), "-l", fresh_user, "fresh", "echo up; exec sleep 120"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert client.stdout.readline().strip() == "up"  # the session is live
        wait_until(lambda: "@notty" in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
        assert srv.kill_sessions() == 1
        assert client.wait(timeout=60) != 0  # the connection dropped: ssh ended without the command's status
    finally:
        srv.stop()


# -- names and messages (no sshd: refused before any I/O) ------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["launch", "tiny", "--set", "run_name=$(touch /tmp/x)"], ["run_name='$(touch /tmp/x)'", "not a valid name"]),
        (["preflight", "tiny", "--set", "run_name=a b"], ["run_name='a b'"]),
        (["launch", "tiny", "--set", "training.max_steps"], ["SECTION.KEY=VALUE"]),
        (["launch", "/path/x.yaml"], ["run config's stem, not a path", "launch 'x'"]),
        (["launch", "configs/runs/smoke-cpu.yaml"], ["stem, not a path", "launch 'smoke-cpu'"]),
    ],
)
def test_names_are_refused_where_they_are_given(tmp_path, monkeypatch, args, words):
    from click.testing import CliRunner

    from orchestrator.cli import main

    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["--host", "local", *args])
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("remote_dir", ["-x", "~root/x", "a\nb", ""])
def test_remote_sh_refuses_a_remote_dir_it_would_misread(tmp_path, remote_dir):
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "remote.sh"), remote_dir, "setup"], capture_output=True, text=True, cwd=tmp_path
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 2 and doc["exit_code"] == 2 and "absolute path, ~ or ~/DIR" in doc["error"]
    assert list(tmp_path.iterdir()) == []  # nothing created, no option read


def test_a_live_run_is_described_by_what_is_known():
    from enlace.contract import describe_live

    starting = {"status": "starting", "phase": "building the model", "pid": None, "step": 0, "max_steps": None}
    assert describe_live(starting) == "starting: building the model"
    running = {"status": "running", "phase": "training", "pid": 42, "step": 24, "max_steps": 500}
    assert describe_live(running) == "running, step 24 of 500, pid 42"


def test_a_run_that_was_only_preflighted_has_no_status_to_misread(tmp_path):
    from enlace.server import runfiles

    (tmp_path / "runs" / "pre").mkdir(parents=True)
    (tmp_path / "runs" / "pre" / "preflight.json").write_text("{}")
    with pytest.raises(runfiles.NoSuchRun, match="has not been launched on this host"):
        runfiles.launched_run_dir(tmp_path / "runs", "pre")
    assert runfiles.all_status(tmp_path / "runs") == []


def test_disk_messages_name_the_real_path_not_the_trees_symlink(tmp_path):
    from enlace.errors import NoSpaceError
    from enlace.train.checkpoint import check_free_space

    (tmp_path / "remote" / "runs" / "r").mkdir(parents=True)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "runs").symlink_to(tmp_path / "remote" / "runs")
    with pytest.raises(NoSpaceError) as e:
        check_free_space(tmp_path / "tree" / "runs" / "r" / "checkpoints", need_each=1 << 60)
    assert str(tmp_path / "remote" / "runs" / "r" / "checkpoints") in e.value.message
    assert str(tmp_path / "tree") not in e.value.message


def test_a_run_that_wrote_its_final_status_and_is_exiting_is_not_already_running(tmp_path):
    """After a failed launch the trainer may still be exiting: the next launch waits for it instead of
    answering 'already running (status failed)', exit 7."""
    import time

    from enlace.contract import Status
    from enlace.server import runs

    proc = subprocess.Popen(["sleep", "1.5"])
    run_dir = tmp_path / "r"
    runs.update(run_dir, status=Status.FAILED, pid=proc.pid, pid_start=runs.proc_start(proc.pid), error="boom")
    t0 = time.monotonic()
    with runs.launching(run_dir) as (launch_id, _):
        assert proc.poll() is not None and launch_id  # it waited for the exit, then launched
    assert time.monotonic() - t0 < 30
    proc.wait()


def test_set_key_errors_name_each_section_once(project):
    out = enlace(project, "check-config", "smoke-cpu", "--set", "zzz.paths=x", check=False)
    assert out.returncode == 2 and "valid keys: checkpoint, data, distill, logging, model," in out.stderr, out.stderr
