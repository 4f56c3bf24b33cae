"""Which host a name means and how it is reached: the hosts files, `hosts add`, ~/.ssh/config as the ssh
client reads it, host keys and their fingerprints, the ciphers offered, a server that speaks no SSH."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import REPO
from support.remote import remote


def test_ssh_offers_aes_gcm_first_unless_the_users_ssh_config_sets_ciphers(sshd, user_repo, monkeypatch):
    """Every ssh the driver runs (fetch, git, logs) offers AES-GCM first, as the paramiko connection
    does; the Ciphers line of the host in the user's ssh config is kept."""
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.connect import connect

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


def test_unknown_host_lists_the_known_ones(sshd, user_repo):
    out = remote(user_repo, sshd.env, "status", host="gpu-nowhere", check=False)
    assert out.returncode == 2 and "is in no hosts file" in out.stderr and "testhost" in out.stderr
    assert "enlace-remote hosts add gpu-nowhere" in out.stderr and "Traceback" not in out.stderr
    files = f"(configs/hosts.yaml, {sshd.env['ENLACE_HOSTS_FILE']}) nor {sshd.env['ENLACE_SSH_CONFIG']}"
    assert files in out.stderr, out.stderr  # the files it read, as the environment named them


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


def test_a_name_that_does_not_resolve_is_said_at_once_over_the_ssh_client_too(user_repo, tmp_path):
    """data ls talks over the ssh client (its wire), whose "Could not resolve hostname" was retried as a dropped
    connection for 90 s before exit 4; paramiko's path said the typo at once. (.invalid never resolves.)"""
    (user_repo / "data" / "corpus").mkdir(parents=True)
    (user_repo / "data" / "corpus" / "a.txt").write_text("hello\n")
    env = {"ENLACE_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "ENLACE_HOSTS_FILE": str(tmp_path / "hosts.yaml")}
    out = remote(user_repo, env, "data", "ls", "corpus-cpu", host="nosuch.invalid", check=False, timeout=60)
    assert out.returncode == 2 and "the name 'nosuch.invalid' does not resolve" in out.stderr, out.stderr
    assert "resuming" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_ssh_words_for_a_name_it_cannot_resolve_are_a_typo_a_hop_or_the_network(tmp_path, monkeypatch):
    """A name unknown before the host ever answered is the user's to fix (a hop's, with a ProxyJump, named as
    such); the resolver unreachable (offline) or a host that answered before: the network's, retried."""
    from orchestrator.errors import Transient, UsageError
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.transport import SSHTransport

    (tmp_path / "ssh_config").write_text("Host gpu\n  HostName gpu.example.org\n  ProxyJump bastion.invalid\n")
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "ssh_config"))
    (tmp_path / "hosts.yaml").write_text("hosts: {}\n")
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "hosts.yaml"))
    t = SSHTransport(resolve_host("gpu", tmp_path))
    typo = t.ssh_failure("ssh: Could not resolve hostname gpu.example.org: Name or service not known\n", False)
    assert isinstance(typo, UsageError) and "the name 'gpu.example.org' does not resolve" in typo.message
    hop = t.ssh_failure("ssh: Could not resolve hostname bastion.invalid: Name or service not known\n", False)
    assert isinstance(hop, UsageError) and "'bastion.invalid', on the way to gpu.example.org" in hop.message
    offline = "ssh: Could not resolve hostname gpu.example.org: Temporary failure in name resolution\n"
    assert isinstance(t.ssh_failure(offline, False), Transient)
    t.answered = True
    assert isinstance(
        t.ssh_failure("ssh: Could not resolve hostname gpu.example.org: Name or service not known", False), Transient
    )


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


def test_a_hosts_file_named_by_the_environment_that_is_not_there_is_said(tmp_path, monkeypatch, capsys):
    """ENLACE_HOSTS_FILE may name a file `hosts add` has yet to write; a name not in any hosts file is then an SSH
    destination, and a typo in that path would make every host one silently."""
    from orchestrator.hosts.resolve import resolve_host

    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "hosts.yml"))
    assert resolve_host("gpu1", tmp_path).hostname == "gpu1" and resolve_host("gpu1", tmp_path)  # said once
    said = f"note: ENLACE_HOSTS_FILE={tmp_path / 'hosts.yml'} does not exist: 'gpu1' is taken as an SSH destination"
    assert capsys.readouterr().err.strip() == said
    (tmp_path / "hosts.yml").write_text("hosts: {}\n")
    resolve_host("gpu2", tmp_path)
    assert capsys.readouterr().err == ""


def test_the_local_host_refuses_a_relative_remote_dir_and_an_ssh_key(tmp_path, monkeypatch):
    """A relative remote_dir made a server in each folder enlace-remote ran from (docs/relative/dir inside the
    repository); `ssh:` on `local` was ignored without a word."""
    from orchestrator.errors import UsageError
    from orchestrator.hosts.resolve import resolve_host

    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "hosts.yaml"))
    for entry, words in (
        ("{remote_dir: relative/dir}", "remote_dir: 'relative/dir' is relative"),
        ("{ssh: b@h}", "ssh: `local` runs on this machine without SSH"),
    ):
        (tmp_path / "hosts.yaml").write_text(f"hosts:\n  local: {entry}\n")
        with pytest.raises(UsageError, match=re.escape(f"hosts.yaml: hosts.local: {words}")):
            resolve_host("local", tmp_path)
    (tmp_path / "hosts.yaml").write_text("hosts:\n  local: {remote_dir: ~/enlace-local}\n")
    assert resolve_host("local", tmp_path).remote_dir == str(Path("~/enlace-local").expanduser())
    # `hosts add local --cpu-slots 2` (as docs/sharing.md sets local's slots) said "Missing option '--ssh'"
    from click.testing import CliRunner

    from orchestrator.cli import main

    said = CliRunner().invoke(main, ["hosts", "add", "local", "--cpu-slots", "2"])
    assert said.exit_code == 2 and "--ssh" not in said.output, said.output
    assert "go by hand under `hosts:` / `  local:` in your hosts file (docs/sharing.md)" in said.output


def test_hosts_add_keeps_the_files_comments_and_layout(tmp_path, monkeypatch):
    """It rewrote the file through YAML, dropping every comment of a file whose header says `edit freely`."""
    from orchestrator.hosts import schema
    from orchestrator.hosts.resolve import add_host

    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "hosts.yaml"))
    mine = "# my hosts\nhosts:\n  # the big box\n  gpu1: {ssh: a@b}   # keep me\n  gpu2:\n    ssh: c@d\n# the end\n"
    (tmp_path / "hosts.yaml").write_text(mine)
    add_host("g1", {"ssh": "x@y"})
    assert (tmp_path / "hosts.yaml").read_text() == mine.replace("# the end", "  g1: {ssh: x@y}\n# the end")
    assert schema.load(tmp_path / "hosts.yaml")["hosts"]["g1"] == {"ssh": "x@y"}
    (tmp_path / "hosts.yaml").write_text("# mine\ndefaults: {remote_dir: ~/e}  # keep\n")  # no hosts: yet
    add_host("g1", {"ssh": "x@y"})
    assert (
        tmp_path / "hosts.yaml"
    ).read_text() == "# mine\ndefaults: {remote_dir: ~/e}  # keep\nhosts:\n  g1: {ssh: x@y}\n"
    (tmp_path / "hosts.yaml").write_text("hosts: {a: {ssh: b@c}}  # flow style: no block to add a line to\n")
    add_host("g1", {"ssh": "x@y"})  # written whole, every host kept
    assert schema.load(tmp_path / "hosts.yaml")["hosts"] == {"a": {"ssh": "b@c"}, "g1": {"ssh": "x@y"}}


def test_paramiko_loads_without_invoke_and_match_exec_still_works(tmp_path):
    """The driver's paramiko import leaves out `invoke` (paramiko's import 100 -> 61 ms, on every remote command);
    an ssh config paramiko reads (no ssh client) that uses `Match exec` gets it back and resolves."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text('Match originalhost ex exec "test -d /"\n  Port 2300\nHost *\n  User bob\n')
    code = (
        "import sys\nfrom pathlib import Path\nfrom orchestrator.sshlib import load_paramiko, read_ssh_config\n"
        "paramiko = load_paramiko()\nbefore = 'invoke' in sys.modules\n"
        f"found = read_ssh_config(Path({str(cfg)!r}), 'ex')\n"
        "print(before, paramiko.SSHClient.__name__, found['port'], found['user'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "SSHClient", "2300", "bob"]


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


def test_no_key_to_offer_is_said_as_such(sshd, user_repo, tmp_path, monkeypatch):
    """Seen: with no key anywhere, a key-only host was said to ask "for more than a key (a password or a
    one-time code)", and the login it advised failed the same way."""
    import dataclasses

    from orchestrator.errors import NotLoggedIn, UnreachableError
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.transport import SSHTransport

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    host = dataclasses.replace(resolve_host("testhost", user_repo), identity_files=[])
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_*
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no agent
    with pytest.raises(UnreachableError) as e:
        SSHTransport(host).run(["true"])
    assert not isinstance(e.value, NotLoggedIn) and "no SSH key to offer" in e.value.message, e.value.message


def test_ssh_gets_its_own_default_keys_fido_ones_included(sshd, user_repo, tmp_path, monkeypatch):
    """With no identity_file, the keys under $HOME/.ssh are named to ssh in its own default order — the FIDO
    ones (id_*_sk) too: any -i replaces ssh's default list, and a hardware key was left out. (A stand-in: key
    files by name; no FIDO token exists here.)"""
    import dataclasses

    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.ssh.transport import SSHTransport

    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    host = dataclasses.replace(resolve_host("testhost", user_repo), identity_files=[])
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    for name in ("id_ed25519_sk", "id_rsa", "id_ecdsa_sk", "id_ed25519.pub"):
        (tmp_path / "home" / ".ssh" / name).write_text("a key\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = SSHTransport(host).ssh_argv()
    named = [Path(argv[i + 1]).name for i, a in enumerate(argv) if a == "-i"]
    assert named == ["id_rsa", "id_ecdsa_sk", "id_ed25519_sk"]


def test_the_commands_a_server_names_carry_the_host_they_came_from(monkeypatch):
    """Hints printed for a host reached with --host ran on the default host as printed (`enlace-remote stop tl`:
    "on local: nothing was launched"). The server half cannot know the driver's name for its host."""
    from orchestrator.errors import HOST_ENV, from_doc, on_host
    from orchestrator.view.status import format_status

    monkeypatch.delenv(HOST_ENV, raising=False)
    said = "stop that one first (enlace-remote stop tl, or scancel 13); `enlace-remote --host hpc logs tl -f`"
    assert on_host(said, "hpc") == said.replace("(enlace-remote stop", "(enlace-remote --host hpc stop")
    assert on_host(said, "local") == said  # a bare command reaches it already
    monkeypatch.setenv(HOST_ENV, "hpc")
    assert on_host(said, "hpc") == said and "--host gpu stop" in on_host(said, "gpu")
    monkeypatch.delenv(HOST_ENV)
    err = from_doc({"ok": False, "error": said, "exit_code": 7}, 7, "on hpc", "hpc")
    assert err.exit_code == 7 and "on hpc: stop that one first (enlace-remote --host hpc stop tl" in err.message
    row = {"run_name": "tl", "status": "failed", "step": 3, "max_steps": 9, "loss": 1.0, "tokens_per_s": 0}
    row.update(eta_s=None, commit="abc", error="boom " * 40)  # cut: the line ends with where to read it whole
    assert "(enlace-remote --host hpc status tl: all of it)" in format_status([row], host="hpc")
    assert "(enlace-remote --host gpu status tl: all of it)" in format_status([{**row, "host": "gpu"}], hosts=True)


def test_known_hosts_lines_match_as_openssh_matches_them(tmp_path):
    """Hashed names, `[host]:port`, wildcards and negations; any of a host's lines may hold its key; a key
    marked @revoked counts for nothing; a line that is no key is passed by."""
    import base64
    import hashlib
    import hmac

    from orchestrator.ssh.hostkeys import KnownHosts

    salt = b"0123456789abcdefghij"
    hashed = "|1|{}|{}".format(
        base64.b64encode(salt).decode(),
        base64.b64encode(hmac.new(salt, b"[gpu1]:2222", hashlib.sha1).digest()).decode(),
    )
    user, overall = tmp_path / "known_hosts", tmp_path / "ssh_known_hosts"
    user.write_text(f"{hashed} ssh-ed25519 NEW\n*.example.org,!bad.example.org ssh-ed25519 ANY\nGPU2 ssh-rsa R\n")
    overall.write_text("[gpu1]:2222 ssh-ed25519 OLD\n@revoked * ssh-rsa R\nbroken\n[gpu1]:1 ssh-rsa\n")
    known = KnownHosts((str(user), str(overall), str(tmp_path)))  # a directory among them: passed by
    assert [k.key for k in known.for_host("[gpu1]:2222")] == ["NEW", "OLD"]  # both lines are the host's
    assert [k.key for k in known.for_host("a.example.org")] == ["ANY"] and known.for_host("bad.example.org") == []
    assert known.for_host("gpu1") == [] and known.for_host("gpu2") == []  # another port; a revoked key
    assert known.revoked_in("gpu2", "R") == str(overall) and known.revoked_in("gpu2", "ANY") is None


def test_host_key_alias_revoked_keys_and_the_plain_name_count_as_they_do_for_openssh(sshd, user_repo, tmp_path):
    """Seen on the direct path (a second fault hunt): HostKeyAlias and RevokedHostKeys were not read, so a key ssh
    refuses was taken; a plain `host` line did not count off port 22; an @revoked line for another host refused
    this one."""
    from support.sshd import keygen

    keygen(tmp_path / "other")
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    real = " ".join(sshd.host_public_key())
    where, known = f"[127.0.0.1]:{sshd.port}", sshd.dir / "known_hosts"
    status = lambda: remote(user_repo, sshd.env, "status", check=False)
    known.write_text(f"127.0.0.1 {real}\n@revoked otherhost {real}\n")  # the plain name; another host's revocation
    assert status().returncode == 0
    known.write_text(f"127.0.0.1 {other}\n")  # off port 22 a plain line only vouches: another key there is unknown
    out = status()  # (it read as changed, with an ssh-keygen -R line that found nothing to remove)
    assert out.returncode == 4 and "unknown host key" in out.stderr and "CHANGED" not in out.stderr, out.stderr
    remote(user_repo, sshd.env, "--accept-new-host-key", "status")  # as for ssh: the [host]:port line is added
    assert known.read_text().endswith(f"{where} {real}\n")
    config = sshd.dir / "ssh_config"
    plain = config.read_text()
    revoked = tmp_path / "revoked_keys"
    revoked.write_text(f"{real}\n")
    config.write_text(plain + f"  RevokedHostKeys {revoked}\n")
    out = status()
    assert out.returncode == 4 and f"is listed in RevokedHostKeys {revoked}" in out.stderr, out.stderr
    subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(revoked), str(sshd.dir / "host_key.pub")], check=True)
    out = status()  # a binary KRL: only OpenSSH reads it, so the direct path refuses and names the way
    assert out.returncode == 4 and "is a KRL" in out.stderr and "connection: shared" in out.stderr, out.stderr
    sshd.share_connection()  # OpenSSH reads the KRL: revoked, said so (it was called unknown, with keyscan advice)
    out = status()
    assert out.returncode == 4 and "revoked host key" in out.stderr and "ssh-keyscan" not in out.stderr, out.stderr
    hosts = Path(sshd.env["ENLACE_HOSTS_FILE"])
    hosts.write_text(hosts.read_text().replace("    connection: shared\n", "", 1))
    config.write_text(plain + f"  RevokedHostKeys {tmp_path / 'missing'}\n")
    out = status()  # a file that is not there: ssh refuses every host then; said as such, not as a KRL
    assert out.returncode == 4 and "cannot be read" in out.stderr and "KRL" not in out.stderr, out.stderr
    config.write_text(plain + "  HostKeyAlias myalias\n")
    known.write_text(f"myalias {real}\n")
    assert status().returncode == 0  # known by its alias only
    known.write_text(f"myalias {other}\n{where} {real}\n")
    out = status()  # the alias's key is another: ssh refuses it, and so does the direct path now
    assert out.returncode == 4 and "CHANGED" in out.stderr and "ssh-keygen -R myalias" in out.stderr, out.stderr
    config.write_text(plain + "  HashKnownHosts yes\n")  # a key accepted is written as ssh writes it: hashed
    known.write_text("")
    remote(user_repo, sshd.env, "--accept-new-host-key", "status")
    assert known.read_text().startswith("|1|") and where not in known.read_text(), known.read_text()
    assert status().returncode == 0
    ssh = ["ssh", "-F", str(config), "-o", "BatchMode=yes", "testhost", "true"]
    assert subprocess.run(ssh, capture_output=True, timeout=60).returncode == 0  # ssh reads that line too


def test_the_server_is_asked_first_for_known_key_types_in_the_clients_own_order():
    """A stale RSA line above a good ed25519 one asked the server for RSA first, and read as changed."""
    import socket

    from orchestrator.ssh.hostkeys import KnownKey, prefer_known_types
    from orchestrator.sshlib import load_paramiko

    paramiko = load_paramiko()
    a, b = socket.socketpair()
    with a, b:
        t = paramiko.Transport(a)
        default = list(t.get_security_options().key_types)
        lines = [KnownKey(("h",), "ssh-rsa", "R", "f"), KnownKey(("h",), "ssh-ed25519", "E", "f")]
        ordered = list(prefer_known_types(t, lines).get_security_options().key_types)
        known = [k for k in default if k in ("ssh-ed25519", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")]
        assert ordered[: len(known)] == known and ordered.index("ssh-ed25519") < ordered.index("rsa-sha2-512")
        assert sorted(ordered) == sorted(default)
        # ~/.ssh/config's HostKeyAlgorithms: only those are asked for (with an RSA line known, ed25519 alone)
        assert list(prefer_known_types(t, lines, ("ssh-ed25519",)).get_security_options().key_types) == ["ssh-ed25519"]
        with pytest.raises(Exception, match="names none of the host key types"):
            prefer_known_types(t, lines, ("ssh-dss",))


def test_an_unknown_key_behind_a_proxy_is_not_probed_directly():
    """The probe reached (h.hostname, h.port) without the proxy: another machine's fingerprint was shown, and the
    ssh-keyscan line would have recorded it."""
    from orchestrator.hosts.resolve import Host
    from orchestrator.ssh.hostkeys import unknown_key_message

    h = Host("inner", False, "~/enlace", "venv", hostname="10.0.0.5", proxy_jump="bastion", alias="inner")
    said = unknown_key_message(h, "inner (10.0.0.5)")
    assert (
        "ssh-keyscan" not in said and "`ssh -o StrictHostKeyChecking=ask inner true`" in said and "offers" not in said
    )
