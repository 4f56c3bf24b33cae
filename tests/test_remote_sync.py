"""enlace-remote part 1 against a real sshd on 127.0.0.1 (and the `local` host): sync, verify,
the historic .gitignore bug, host keys, injection, unreachable hosts."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support import REPO
from support.remote import connections, head, remote, server_dir


@pytest.mark.parametrize("host", ["testhost", "local"])
def test_sync_and_verify_a_clean_tree(sshd, user_repo, host):
    out = remote(user_repo, sshd.env, "sync", host=host)
    sha = head(user_repo)
    assert sha[:12] in out.stderr and "pushed and checked out" in out.stderr
    tree = server_dir(sshd, host) / "trees" / sha
    assert head(tree) == sha
    assert (tree / "data").resolve() == (server_dir(sshd, host) / "data").resolve()
    again = remote(user_repo, sshd.env, "sync", host=host)
    assert "already on the server" in again.stderr
    out = remote(user_repo, sshd.env, "verify", "tiny", host=host)
    assert "[ ok ] import enlace.data" in out.stderr and "ready on" in out.stderr
    # --for-launch also needs the corpus, which never travels by git
    missing = remote(user_repo, sshd.env, "verify", "tiny", "--for-launch", host=host, check=False)
    assert missing.returncode == 3 and "data/tiny/*.txt" in missing.stderr


@pytest.mark.parametrize("host", ["testhost", "local"])
def test_dirty_tree_refused_and_allow_dirty_ships_head_only(sshd, user_repo, host):
    marker = f"# local edit {uuid.uuid4().hex}\n"
    with open(user_repo / "enlace" / "train" / "model.py", "a") as fh:
        fh.write(marker)
    out = remote(user_repo, sshd.env, "sync", host=host, check=False)
    assert out.returncode == 3 and "enlace/train/model.py" in out.stderr and "--allow-dirty" in out.stderr
    assert not (server_dir(sshd, host) / "trees").exists() or not any((server_dir(sshd, host) / "trees").iterdir())
    out = remote(user_repo, sshd.env, "sync", "--allow-dirty", host=host)
    assert "NOT shipped" in out.stderr
    shipped = (server_dir(sshd, host) / "trees" / head(user_repo) / "enlace" / "train" / "model.py").read_text()
    assert (
        marker not in shipped
        and shipped
        == subprocess.run(
            ["git", "-C", str(user_repo), "show", "HEAD:enlace/train/model.py"], capture_output=True, text=True
        ).stdout
    )


def _historic_repo(tmp_path: Path, user_repo: Path) -> Path:
    """The repo as it was when .gitignore held unanchored `data/` and `runs/`: git add -A then
    silently skipped enlace/data/, configs/data/ and configs/runs/."""
    bad = tmp_path / "historic"
    shutil.copytree(user_repo, bad, ignore=shutil.ignore_patterns(".git"))
    gi = (bad / ".gitignore").read_text().replace("/data/", "data/").replace("/runs/", "runs/")
    (bad / ".gitignore").write_text(gi)
    git = ["git", "-C", str(bad), "-c", "user.email=t@x.invalid", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(bad)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "historic"], check=True)
    return bad


def _sync_without_the_ignore_check(repo, env, monkeypatch) -> None:
    """Ship HEAD as an enlace without the local ignore check did (gitsync.sync's check_ignored=False): the
    product command line has no such switch."""
    from orchestrator.commands.common import Remote
    from orchestrator.transfer.gitsync import sync

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo)
    remote = Remote("testhost", False)
    try:
        sync(remote.session, remote.repo, allow_dirty=False, check_ignored=False)
    finally:
        remote.close()


def test_historic_gitignore_bug_is_refused_locally_and_caught_on_the_server(sshd, user_repo, tmp_path, monkeypatch):
    bad = _historic_repo(tmp_path, user_repo)
    out = remote(bad, sshd.env, "sync", check=False)
    assert out.returncode == 3
    for path in ("enlace/data/bytestream.py", "configs/data/smoke.yaml", "configs/runs/smoke-cpu.yaml"):
        assert path in out.stderr
    assert ".gitignore:" in out.stderr and ":data/" in out.stderr  # the offending line, quoted
    # Shipped past the local check, the server-side verify names what did not arrive.
    _sync_without_the_ignore_check(bad, sshd.env, monkeypatch)
    out = remote(bad, sshd.env, "verify", "tiny", check=False)
    assert out.returncode == 3
    assert "enlace/data/streams.py" in out.stderr and "configs/runs/tiny.yaml" in out.stderr
    assert "[FAIL] import enlace.data" in out.stderr


def test_unknown_host_key_refused_then_accepted(sshd, user_repo):
    (sshd.dir / "known_hosts").write_text("")
    out = remote(user_repo, sshd.env, "sync", check=False)
    assert out.returncode == 4 and "unknown host key" in out.stderr and "ssh-keyscan" in out.stderr
    assert "Traceback" not in out.stderr
    out = remote(user_repo, sshd.env, "--accept-new-host-key", "sync")
    assert f"[127.0.0.1]:{sshd.port}" in (sshd.dir / "known_hosts").read_text()
    added = f"[127.0.0.1]:{sshd.port}: trusted its new ssh-ed25519 key SHA256:"  # said, as ssh's "Permanently added"
    assert added in out.stderr and f"added it to {sshd.dir / 'known_hosts'}" in out.stderr, out.stderr
    remote(user_repo, sshd.env, "verify", "tiny")  # the next call works without the flag


def test_the_unknown_key_hint_works_when_there_is_no_ssh_folder_yet(sshd, user_repo, tmp_path, monkeypatch):
    """Seen: the printed `ssh-keyscan ... >> ~/.ssh/known_hosts` failed (No such file or directory) on a machine
    without ~/.ssh, and --accept-new-host-key made ~/.ssh 0755 (OpenSSH's is 0700)."""
    import dataclasses

    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.hostkeys import unknown_key_message
    from orchestrator.ssh.transport import SSHTransport

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    host = resolve_host("testhost", user_repo)
    fresh = dataclasses.replace(host, known_hosts=str(tmp_path / "home" / ".ssh" / "known_hosts"))
    hint = unknown_key_message(fresh, "testhost").split("trust it with: ")[1].split("  (or rerun")[0]
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True, timeout=60)  # as the user pastes it
    assert f"[127.0.0.1]:{sshd.port}" in Path(fresh.known_hosts).read_text()
    hashed = dataclasses.replace(
        fresh, known_hosts=str(tmp_path / "home3" / "known_hosts"), known_hosts_also=(), hash_known_hosts=True
    )
    hint = unknown_key_message(hashed, "testhost").split("trust it with: ")[1].split("  (or rerun")[0]
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True, timeout=60)  # HashKnownHosts
    assert SSHTransport(hashed).run(["true"]).exited == 0  # the line the hint wrote vouches for it
    # off port 22 it is written plain: ssh-keyscan -H before OpenSSH 8.9 hashed the bare host, which ssh never
    # matches for [host]:port; on port 22 it is hashed (the hint alone: no sshd of ours listens there)
    assert f"[127.0.0.1]:{sshd.port}" in Path(hashed.known_hosts).read_text()
    assert "ssh-keyscan -H -p 22 " in unknown_key_message(dataclasses.replace(hashed, port=22), "testhost")
    accepted = dataclasses.replace(host, known_hosts=str(tmp_path / "home2" / ".ssh" / "known_hosts"))
    assert SSHTransport(accepted, accept_new_host_key=True).run(["true"]).exited == 0
    assert (tmp_path / "home2" / ".ssh").stat().st_mode & 0o777 == 0o700


def test_changed_host_key_refused_even_with_accept_new(sshd, user_repo, tmp_path):
    from support.sshd import keygen

    keygen(tmp_path / "other")
    kind, key = (tmp_path / "other.pub").read_text().split()[:2]
    (sshd.dir / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    for extra in ([], ["--accept-new-host-key"]):
        out = remote(user_repo, sshd.env, *extra, "sync", check=False)
        assert out.returncode == 4 and "CHANGED" in out.stderr and "ssh-keygen -R" in out.stderr
    assert key in (sshd.dir / "known_hosts").read_text()  # not overwritten


def test_a_key_in_any_file_ssh_reads_counts_and_a_revoked_one_is_refused(sshd, user_repo, tmp_path):
    """Only the first UserKnownHostsFile was read, and no global file: --accept-new-host-key took a server whose
    key another of ssh's files records differently, and wrote it down. An @revoked line was a paramiko traceback."""
    from support.sshd import keygen

    from orchestrator.ssh.hostkeys import fingerprint

    keygen(tmp_path / "other")
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    real = " ".join(sshd.host_public_key())
    where = f"[127.0.0.1]:{sshd.port}"
    first, second, overall = sshd.dir / "known_hosts", tmp_path / "known_hosts_b", tmp_path / "global_known_hosts"
    config = sshd.dir / "ssh_config"
    listed = f"UserKnownHostsFile {first} {second}\n  GlobalKnownHostsFile {overall}\n"
    config.write_text(config.read_text().replace(f"UserKnownHostsFile {first}\n", listed))
    first.write_text("")
    for path in (second, overall):  # the direct path (paramiko): the old key's file is named
        path.write_text(f"{where} {other}\n")
        out = remote(user_repo, sshd.env, "--accept-new-host-key", "status", check=False)
        assert out.returncode == 4 and "CHANGED" in out.stderr and f"-f {path}" in out.stderr, out.stderr
        assert first.read_text() == "" and "Traceback" not in out.stderr  # nothing trusted, nothing written
        path.write_text("")
    overall.write_text(f"@cert-authority *.example.org {other}\n@revoked {where} {real}\nnot a key line\n")
    first.write_text(f"{where} {real}\n")  # trusted there, revoked in the global file: revoked wins, as in OpenSSH
    for extra in ([], ["--accept-new-host-key"]):
        out = remote(user_repo, sshd.env, *extra, "status", check=False)
        assert out.returncode == 4 and f"is marked @revoked in {overall}" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and first.read_text() == f"{where} {real}\n"
    overall.write_text(f"@cert-authority *.example.org {other}\nnot a key line\n[127.0.0.1]:1 ssh-rsa AAAA\n")
    remote(user_repo, sshd.env, "status")  # the marker, a stray line and a cut key are passed by, as OpenSSH does
    overall.write_text(f"{where} {other}\n")  # a stale line elsewhere: the host is known by the user's own line
    remote(user_repo, sshd.env, "status")  # (the last file read won: it was refused as changed)
    overall.write_text("")
    first.write_text("")
    second.write_text(f"{where} {other}\n")
    sshd.share_connection()  # OpenSSH's client is given every file too
    out = remote(user_repo, sshd.env, "--accept-new-host-key", "status", check=False)
    assert out.returncode == 4 and first.read_text() == "", out.stderr
    assert "host key has CHANGED" in out.stderr and f"Offending ED25519 key in {second}:1" in out.stderr, out.stderr
    offers = fingerprint(base64.b64decode(sshd.host_public_key()[1]))  # as the direct path shows it
    assert f"the server now offers ED25519 {offers};" in out.stderr, out.stderr
    second.write_text("")
    overall.write_text(f"@revoked {where} {real}\n")
    out = remote(user_repo, sshd.env, "--accept-new-host-key", "status", check=False)
    assert out.returncode == 4 and "revoked host key" in out.stderr and first.read_text() == "", out.stderr


def test_injection_in_run_name_refused_before_any_remote_io(sshd, user_repo):
    target = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    sshd.kill_sessions()
    before = connections(sshd)
    out = remote(user_repo, sshd.env, "verify", f"x; touch {target}", check=False)
    assert out.returncode == 2 and "not a valid name" in out.stderr
    assert not target.exists()
    assert connections(sshd) == before  # never connected


def test_unreachable_host_fails_fast_with_host_and_reason(sshd, user_repo):
    sshd.stop()
    out = remote(user_repo, sshd.env, "sync", check=False)
    assert out.returncode == 4 and "testhost" in out.stderr and "cannot connect" in out.stderr
    assert out.stderr.count("retrying in") <= 2, out.stderr  # a host never reached: 3 attempts, then the error
    # sshd is down: the port refuses at once; that is said, not "connect timeout 5s"
    assert "connection refused" in out.stderr and "timed out" not in out.stderr, out.stderr


def test_hosts_lists_local_and_configured(sshd, user_repo):
    out = remote(user_repo, sshd.env, "hosts")
    assert "local" in out.stdout and "testhost" in out.stdout and f"127.0.0.1:{sshd.port}" in out.stdout


def test_help_imports_neither_torch_nor_paramiko():
    code = (
        "import sys\nfrom orchestrator.cli import main\n"
        "from click.testing import CliRunner; r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0 and 'Exit codes' in r.output\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'paramiko': 'paramiko' in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"torch": False, "paramiko": False}


def test_server_side_refusals_are_one_clear_line(sshd, user_repo, tmp_path):
    hosts = tmp_path / "odd-hosts.yaml"
    hosts.write_text(f"hosts:\n  local: {{remote_dir: {tmp_path}/fresh, python: /nonexistent/python}}\n")
    env = {**sshd.env, "ENLACE_HOSTS_FILE": str(hosts)}
    out = remote(user_repo, env, "status", host="local", check=False)  # a newcomer's first look: no runs yet
    assert (out.returncode, out.stdout.strip()) == (0, "no runs on this host"), out.stderr
    out = remote(user_repo, env, "logs", "tiny", host="local", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "nothing was launched or synced to" in out.stderr and "enlace-remote launch RUN ships" in out.stderr
    out = remote(user_repo, env, "sync", host="local", check=False)
    assert out.returncode == 3 and "no usable python on the server" in out.stderr and "Traceback" not in out.stderr
    assert "python: /nonexistent/python (hosts.yaml) is not a command here: no such file" in out.stderr, out.stderr
    out = remote(user_repo, env, "verify", "tiny", host="local", check=False)  # it said "see the messages above"
    said = "python: /nonexistent/python (hosts.yaml) is not a command on the server (no such file or not executable)"
    assert out.returncode == 3 and said in out.stderr and "above" not in out.stderr, out.stderr


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


def test_verify_names_a_missing_torch_with_the_venv_fix(tmp_path):
    """The import check looks for every dependency (find_spec) instead of importing torch, whose import alone
    is slow and paid on every launch; a python without torch is still named with the venv fix."""
    bare = tmp_path / "bare-venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    sha = head(REPO)
    out = subprocess.run(
        [str(bare / "bin" / "python"), "enlace/remote/verify_tree.py", sha, "smoke-cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert out.returncode == 3 and not checks["import enlace.data"]["ok"]
    assert "No module named 'torch'" in checks["import enlace.data"]["detail"] and "python: venv" in out.stdout


def test_missing_data_names_the_shared_data_dir(sshd, user_repo):
    out = remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", check=False)
    rd = server_dir(sshd, "testhost")
    assert (
        out.returncode == 3
        and f"{rd}/data/tiny/*.txt" in out.stderr
        and "trees/" not in out.stderr.split("looked for")[-1]
    )


def test_a_remote_dir_with_a_percent_sign_is_synced_where_it_says(sshd, user_repo, tmp_path):
    """git decodes %XX in an ssh:// URL's path: a remote_dir holding `%41` was pushed to `...A...`, a folder
    remote.sh never looks in, and the sync failed."""
    hosts = Path(sshd.env["ENLACE_HOSTS_FILE"])
    there = tmp_path / "rd%41 x#y"
    text = hosts.read_text()
    hosts.write_text(text.replace(f"remote_dir: {server_dir(sshd, 'testhost')}", f"remote_dir: '{there}'", 1))
    out = remote(user_repo, sshd.env, "sync")
    assert (there / "trees" / head(user_repo) / "configs").is_dir(), out.stderr
    assert not (tmp_path / "rdA x#y").exists()


def test_what_the_driver_keeps_in_a_repository_of_your_own_is_ignored_by_git(tmp_path):
    """`git add -A` after a sync to `local` staged .enlace/ (a bare repository, and trees git took for embedded
    repositories), and launch then refused the tree: .enlace/ holds a .gitignore of `*`."""
    repo = tmp_path / "mine"
    (repo / "configs" / "runs").mkdir(parents=True)
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "configs" / "runs" / "mine.yaml").write_text("command: [python, train.py]\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "mine")
    remote(repo, {}, "sync", host="local")
    assert (repo / ".enlace" / "local").is_dir()
    git("add", "-A")
    assert git("status", "--porcelain") == "", git("status", "--porcelain")


def test_a_repository_without_a_commit_and_an_ignore_rule_over_committed_files_are_said_as_they_are(tmp_path):
    """No commit: --allow-dirty, the fix offered, ended in git's `ambiguous argument 'HEAD'`. A bare `runs/` over run
    files already committed said they would never arrive and to add and commit them."""
    from orchestrator.errors import UsageError, VerifyError
    from orchestrator.transfer.gitsync import local_checks

    repo = tmp_path / "mine"
    (repo / "configs" / "runs").mkdir(parents=True)
    (repo / "configs" / "runs" / "toy.yaml").write_text("command: [python, t.py]\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("add", "-A")
    for allow_dirty in (False, True):
        with pytest.raises(UsageError, match=r"has no commit yet, and the server reads a commit — `git add` your"):
            local_checks(repo, allow_dirty)
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "mine")
    (repo / ".gitignore").write_text("runs/\n")
    git("add", ".gitignore")
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "ignore")
    with pytest.raises(VerifyError) as e:
        local_checks(repo, False)
    said = e.value.format_message()
    assert "configs/runs/toy.yaml   (ignored by .gitignore:1:runs/; committed, it arrives, but a new file" in said
    assert said.endswith("(anchor root-only entries with a leading slash, e.g. /data/)"), said
