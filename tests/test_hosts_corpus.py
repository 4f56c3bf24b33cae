"""Malformed hosts files and `--host` values: each is refused with exit 2 and one line naming the file,
the host and the key (or the option) and the fix — never a traceback, never a connection attempt."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from orchestrator.cli import main

# (case id, the hosts file's bytes, words the one line must hold)
CASES = [
    ("ssh-int", b"hosts:\n  gpu: {ssh: 42}\n", ["hosts.gpu.ssh", "user@host"]),
    ("not-utf8", b"hosts:\n  gpu: {remote_dir: /d\xff\xfe}\n", ["not UTF-8", "UTF-8"]),
    ("hosts-list", b"hosts:\n  - gpu\n  - box\n", ["hosts", "not a mapping"]),
    ("timeout-overflow", b"hosts:\n  gpu: {connect_timeout: 1e400}\n", ["hosts.gpu.connect_timeout", "seconds"]),
    ("timeout-inf", b"hosts:\n  gpu: {connect_timeout: .inf}\n", ["hosts.gpu.connect_timeout", "out of range"]),
    ("timeout-nan", b"hosts:\n  gpu: {connect_timeout: .nan}\n", ["hosts.gpu.connect_timeout", "out of range"]),
    ("timeout-negative", b"hosts:\n  gpu: {connect_timeout: -5}\n", ["hosts.gpu.connect_timeout", "1 to 600"]),
    ("timeout-zero", b"hosts:\n  gpu: {connect_timeout: 0}\n", ["hosts.gpu.connect_timeout", "1 to 600"]),
    ("remote-dir-list", b"hosts:\n  gpu: {remote_dir: [a, b]}\n", ["hosts.gpu.remote_dir", "absolute path"]),
    ("remote-dir-dash", b"hosts:\n  gpu: {remote_dir: -rf}\n", ["hosts.gpu.remote_dir", "starts with `-`"]),
    ("remote-dir-tilde-user", b"hosts:\n  gpu: {remote_dir: ~root/x}\n", ["hosts.gpu.remote_dir", "~user"]),
    ("remote-dir-newline", b'hosts:\n  gpu: {remote_dir: "a\\nb"}\n', ["hosts.gpu.remote_dir", "control character"]),
    ("remote-dir-empty", b'hosts:\n  gpu: {remote_dir: ""}\n', ["hosts.gpu.remote_dir", "not a text"]),
    ("python-number", b"hosts:\n  gpu: {python: 3.11}\n", ["hosts.gpu.python", "venv"]),
    ("python-dash", b"hosts:\n  gpu: {python: -c}\n", ["hosts.gpu.python", "starts with `-`"]),
    ("port-zero", b"hosts:\n  gpu: {ssh: a@b, port: 0}\n", ["hosts.gpu.port", "1 to 65535"]),
    ("port-big", b"hosts:\n  gpu: {ssh: a@b, port: 70000}\n", ["hosts.gpu.port", "1 to 65535"]),
    ("port-bool", b"hosts:\n  gpu: {ssh: a@b, port: true}\n", ["hosts.gpu.port", "TCP port"]),
    ("port-in-target", b"hosts:\n  gpu: {ssh: 'a@b:99999'}\n", ["hosts.gpu.ssh", "TCP port"]),
    ("host-as-string", b"hosts:\n  gpu: alice@gpu1\n", ["hosts.gpu", "not a mapping"]),
    ("host-as-list", b"hosts:\n  gpu: [1, 2]\n", ["hosts.gpu", "not a mapping"]),
    ("defaults-number", b"defaults: 5\n", ["defaults", "not a mapping"]),
    ("pip-args-string", b"hosts:\n  gpu: {pip_args: --index-url x}\n", ["hosts.gpu.pip_args", "one pip argument"]),
    ("pip-args-ints", b"hosts:\n  gpu: {pip_args: [1, 2]}\n", ["hosts.gpu.pip_args", "list"]),
    ("top-level-list", b"- gpu\n", ["top level"]),
    ("unknown-top-key", b"host:\n  gpu: {}\n", ["unknown key 'host'", "defaults:"]),
    ("unknown-host-key", b"hosts:\n  gpu: {remotedir: /x}\n", ["hosts.gpu.remotedir", "unknown key"]),
    ("default-run-path", b"hosts:\n  gpu: {default_run: ../x}\n", ["hosts.gpu.default_run", "run name"]),
    ("user-space", b"hosts:\n  gpu: {user: a b}\n", ["hosts.gpu.user", "user name"]),
    ("scheduler-unknown", b"hosts:\n  gpu: {scheduler: pbs}\n", ["hosts.gpu.scheduler", "slurm"]),
    ("ssh-empty-user", b"hosts:\n  gpu: {ssh: 'alice@'}\n", ["hosts.gpu.ssh", "user@host"]),
    ("ssh-dots", b"hosts:\n  gpu: {ssh: ..}\n", ["hosts.gpu.ssh", "user@host"]),
    ("known-hosts-int", b"hosts:\n  gpu: {known_hosts: 5}\n", ["hosts.gpu.known_hosts", "file path"]),
    ("host-name-space", b"hosts:\n  'gpu one': {ssh: a@b}\n", ["'gpu one'", "host name"]),
    ("slurm-key-without-scheduler", b"hosts:\n  gpu: {ssh: a@b, partition: gpu}\n", ["partition", "scheduler: slurm"]),
    ("slurm-time-word", b"hosts:\n  gpu: {ssh: a@b, scheduler: slurm, time: forever}\n", ["time", "Slurm's time"]),
    ("duplicate-key", b"hosts:\n  gpu: {ssh: a@b}\n  gpu: {ssh: c@d}\n", ["given twice", "line"]),
    ("not-yaml", b"hosts:\n  gpu: {ssh: a@b\n  other: 1\n", ["not valid YAML at line 3", "fix the syntax"]),
    (
        "identity-file-missing",
        b"hosts:\n  gpu: {ssh: a@b, identity_file: /nonexistent/key}\n",
        ["identity_file", "no such file"],
    ),
]


def _one_line_error(result, words: list[str]) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize(("case", "content", "words"), CASES, ids=[c[0] for c in CASES])
def test_malformed_hosts_file_is_one_line_exit_2(tmp_path, monkeypatch, case, content, words):
    path = tmp_path / "hosts.yaml"
    path.write_bytes(content)
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    result = CliRunner().invoke(main, ["--host", "gpu", "status"])  # resolves gpu before any connection
    bad_entry = "hosts." in words[0] or "host name" in words[-1]
    if "host name" in words[-1]:  # 'gpu one' is unusable, and `gpu` is no entry: the listing says it
        result = CliRunner().invoke(main, ["hosts"])
        lines = [ln for ln in result.output.splitlines() if ln.startswith("! ")]
        assert result.exit_code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), result.output
    else:
        _one_line_error(result, words)
    # the file's own keys name the file; the merged entry's (Slurm keys, a missing key file) name the host
    assert str(path) in result.output or "host gpu:" in result.output
    if bad_entry:  # the listing still shows the others
        listing = CliRunner().invoke(main, ["hosts"]).output
        assert "local (this machine" in listing and sum(ln.startswith("! ") for ln in listing.splitlines()) == 1


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("..", ["--host '..'", "user@host"]),
        ("a..b", ["--host 'a..b'", "user@host"]),
        ("-oProxyCommand=touch x", ["--host", "user@host"]),
        ("alice@", ["--host 'alice@'"]),
        ("gpu:0", ["--host 'gpu:0'", "TCP port"]),
        ("gpu\nx", ["--host", "user@host"]),
    ],
)
def test_bad_host_option_is_refused_before_any_connection(tmp_path, monkeypatch, host, words):
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    result = CliRunner().invoke(main, ["--host", host, "status"])
    _one_line_error(result, words)


def test_hosts_add_checks_its_options_with_the_file_schema(tmp_path, monkeypatch):
    path = tmp_path / "hosts.yaml"
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    result = CliRunner().invoke(main, ["hosts", "add", "gpu", "--ssh", "a@b", "--remote-dir", "-x"])
    _one_line_error(result, ["--remote-dir '-x'", "starts with `-`"])
    assert not path.exists()  # nothing half-written
    result = CliRunner().invoke(main, ["hosts", "add", "gpu", "--ssh", "a@b", "--gpu-free-below", "1.5"])
    _one_line_error(result, ["--gpu-free-below 1.5"])
    assert not path.exists()
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    add = ["hosts", "add", "gpu", "--ssh", "a@b", "--cpu-slots", "2", "--gpu-free-below", "0.25"]
    assert CliRunner().invoke(main, add).exit_code == 0  # the queue's keys, without editing the file by hand
    from orchestrator.hosts.resolve import resolve_host

    host = resolve_host("gpu", tmp_path)
    assert (host.cpu_slots, host.gpu_free_below) == (2, 0.25)


def test_one_bad_entry_makes_only_that_host_unusable(tmp_path, monkeypatch, capsys):
    from orchestrator.errors import UsageError
    from orchestrator.hosts.resolve import resolve_host

    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  bad: {ssh: 42}\n  good: {ssh: alice@gpu2.example.org}\n")
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    assert resolve_host("good", tmp_path).hostname == "gpu2.example.org"
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and "host bad is unusable" in warned[0] and "hosts.bad.ssh" in warned[0], warned
    with pytest.raises(UsageError, match=r"hosts\.bad\.ssh: 42 is neither"):
        resolve_host("bad", tmp_path)


def test_a_host_whose_key_file_is_missing_is_listed_as_unusable_and_not_added(tmp_path, monkeypatch):
    """Seen: `hosts add t2 --identity-file /nope` exit 0, then `hosts` left t2 out without a word, exit 0 (a key
    file is checked on the merged entry, which the listing skipped)."""
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  t2: {ssh: x@y, identity_file: /nope/key}\n  good: {ssh: alice@gpu2.example.org}\n")
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # `hosts` reads the repository's hosts.yaml too
    monkeypatch.chdir(tmp_path)
    listing = CliRunner().invoke(main, ["hosts"])
    assert listing.exit_code == 2 and "  good " in listing.output, listing.output
    assert [ln for ln in listing.output.splitlines() if ln.startswith("! ")] == [
        "! t2               unusable: host t2: identity_file /nope/key: no such file — give the path of your SSH "
        "private key (e.g. ~/.ssh/id_ed25519), or leave identity_file out to use ssh-agent and ~/.ssh/id_*"
    ]
    before = path.read_text()
    added = CliRunner().invoke(main, ["hosts", "add", "t3", "--ssh", "x@y", "--identity-file", "/nope/key"])
    assert added.exit_code == 2 and "--identity-file /nope/key: no such file" in added.output, added.output
    assert path.read_text() == before  # nothing written


def test_ctrl_c_in_a_verb_exits_130_in_one_line(tmp_path, monkeypatch):
    """Seen: Ctrl-C in preflight printed click's `Aborted!` and exited 1, the code of a failed run."""
    import orchestrator.hosts.resolve

    def interrupted(repo):
        raise KeyboardInterrupt

    monkeypatch.setattr(orchestrator.hosts.resolve, "survey_hosts", interrupted)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["hosts"])
    assert out.exit_code == 130 and out.output == "\ninterrupted\n", (out.exit_code, out.output)


def test_a_yaml_bomb_and_a_huge_hosts_file_are_refused_at_once(tmp_path, monkeypatch):
    """Seen: nested aliases in a host's pip_args took 45.8 s of CPU, then a MemoryError; a 50 MB hosts file
    cost 65 s on every command."""
    bomb = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    bomb += ["hosts:", "  gpu: {ssh: a@b, pip_args: *a9}"]
    path = tmp_path / "hosts.yaml"
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    for content, words in (
        ("\n".join(bomb) + "\n", ["alias (*a0)", "no aliases"]),
        ("hosts:\n" + "  # padding\n" * 300_000, ["bytes, over the", "limit"]),
        ("hosts: " + "[" * 5000 + "]" * 5000 + "\n", ["nested deeper", "right file"]),
    ):
        path.write_text(content)
        _one_line_error(CliRunner().invoke(main, ["--host", "gpu", "status"]), words)


def test_hosts_shows_a_slurm_hosts_scheduler(tmp_path, monkeypatch):
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  cluster: {ssh: alice@login.example.org, scheduler: slurm, partition: gpu}\n")
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    monkeypatch.setenv("ENLACE_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    out = CliRunner().invoke(main, ["hosts"]).output
    line = next(ln for ln in out.splitlines() if "cluster" in ln)
    assert "scheduler slurm" in line, out


def test_a_bad_local_entry_lists_local_once_as_unusable(tmp_path, monkeypatch):
    """Seen: `cpu_slot: 2` under `local:` in the user's hosts file listed `* local … queue: 1 CPU run` (the
    repository's entry) and `! local unusable: …` beneath it; every verb on local refused."""
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  local: {cpu_slot: 2}\n")
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(path))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    listing = CliRunner().invoke(main, ["hosts"])
    lines = [ln for ln in listing.output.splitlines() if ln.split()[1:2] == ["local"]]
    assert listing.exit_code == 2 and len(lines) == 1 and "hosts.local.cpu_slot: unknown key" in lines[0], lines
    path.write_text("hosts:\n  local: {cpu_slots: 2}\n")  # fixed: listed first, usable, with its two slots
    listing = CliRunner().invoke(main, ["hosts"])
    assert listing.exit_code == 0 and listing.output.startswith("* local ") and "queue: 2 CPU runs" in listing.output
