"""Bad input at the command line: each mistake gets one line naming what was wrong and how to fix it, a
non-zero exit code and no traceback, before any connection where it can be."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from support import REPO
from support.remote import DRIVER, connections, remote, server_dir, tiny_corpus


def _cli(args: list[str], cwd, tmp_path, monkeypatch):
    """enlace-remote ARGS in-process (click's CliRunner), from `cwd`, with no hosts file of the user's."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("grace", ["nan", "-5", "inf", "0", "86401", "soon"])
def test_stop_grace_is_validated(tmp_path, monkeypatch, grace):
    result = _cli(["--host", "local", "stop", "tiny", "--grace", grace], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2 and "--grace" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a user error, said; never a traceback


@pytest.mark.parametrize("port", ["99999999", "0", "65536"])
def test_ports_are_range_checked(tmp_path, monkeypatch, port):
    result = _cli(["--host", f"root@127.0.0.1:{port}", "status"], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2 and "not a TCP port" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a user error, said; never a traceback


def test_a_repository_of_your_own_without_a_run_file_is_pointed_at_init(tmp_path, monkeypatch):
    other = tmp_path / "other"
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    result = _cli(["--host", "local", "launch", "mine"], other, tmp_path, monkeypatch)
    assert result.exit_code == 2 and "enlace-remote init mine -- python train.py" in result.output, result.output
    assert isinstance(result.exception, SystemExit)


def test_init_warns_when_git_ignores_the_run_file_it_wrote(tmp_path, monkeypatch):
    """A bare `runs/` in .gitignore matches configs/runs/ too: init's `next: git add …` failed as printed."""
    other = tmp_path / "other"
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / ".gitignore").write_text("runs/\n")
    result = _cli(["init", "mine", "--", "python", "train.py"], other, tmp_path, monkeypatch)
    assert result.exit_code == 0 and (other / "configs" / "runs" / "mine.yaml").is_file(), result.output
    assert "warning: git ignores configs/runs/mine.yaml (.gitignore:1:runs/: the rule that matches it)" in result.output
    assert "anchor it to the root (/runs/)" in result.output
    (other / ".gitignore").write_text("/runs/\n")  # anchored: no warning
    result = _cli(["init", "mine2", "--", "python", "train.py"], other, tmp_path, monkeypatch)
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    (other / ".gitignore").write_text("*.yaml\n!configs/runs/*.yaml\n")  # re-included by a `!` rule: no warning
    result = _cli(["init", "mine3", "--", "python", "train.py"], other, tmp_path, monkeypatch)
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    (other / ".gitignore").write_text("configs/\n")  # another rule: no anchoring advice that would not work
    result = _cli(["init", "mine4", "--", "python", "train.py"], other, tmp_path, monkeypatch)
    assert "(.gitignore:1:configs/: the rule that matches it)" in result.output and "remove or narrow" in result.output


def test_init_from_a_subdirectory_names_the_scripts_path_from_the_root(tmp_path, monkeypatch):
    """From scripts/, `init hello -- python hello.py` wrote a run file that never verified (the command runs in the
    repository's root) and printed a `git add` that failed there; a script that is nowhere passed without a word."""
    repo = tmp_path / "mine"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "hello.py").write_text("print('hi')\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    result = _cli(["init", "hello", "--", "python", "hello.py"], repo / "scripts", tmp_path, monkeypatch)
    said = "hello.py: the command runs in the repository's root"
    assert result.exit_code == 2 and said in result.output and "this file is scripts/hello.py" in result.output
    assert not (repo / "configs").exists()
    result = _cli(["init", "hello", "--", "python", "scripts/hello.py"], repo / "scripts", tmp_path, monkeypatch)
    assert result.exit_code == 0 and "next: git add ../configs/runs/hello.yaml hello.py && git" in result.output, (
        result.output
    )
    result = _cli(["init", "nofile", "--", "python", "nosuch.py"], repo, tmp_path, monkeypatch)
    assert result.exit_code == 0 and "note: nosuch.py is not in this repository" in result.output, result.output


def _a_run_file_not_yet_committed(repo, name: str):
    """A repository of your own: train.py committed, configs/runs/NAME.yaml written after (as `init` leaves it)."""
    from support.repocopy import commit_all

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("print(1)\n")
    commit_all(repo, "a script")
    (repo / "configs" / "runs").mkdir(parents=True)
    (repo / "configs" / "runs" / f"{name}.yaml").write_text("command: [python, train.py]\n")
    return repo


def test_an_uncommitted_new_run_file_is_not_offered_allow_dirty(tmp_path, monkeypatch):
    """After `init`, launch said "or pass --allow-dirty": that shipped HEAD without the run file, and verify
    failed naming 17 other run files."""
    from support.repocopy import commit_all

    from orchestrator.errors import VerifyError
    from orchestrator.transfer.gitsync import local_checks

    other = _a_run_file_not_yet_committed(tmp_path / "other", "mine")
    with pytest.raises(VerifyError) as e:
        local_checks(other, allow_dirty=False, check_ignored=False)
    assert "commit them: configs/runs/mine.yaml is not in HEAD" in e.value.message and "or pass" not in e.value.message
    commit_all(other, "the run file")
    (other / "train.py").write_text("print(2)\n")  # a change to a tracked file: --allow-dirty is a way
    with pytest.raises(VerifyError, match="or pass --allow-dirty to ship HEAD without them"):
        local_checks(other, allow_dirty=False, check_ignored=False)
    commit_all(other, "print 2")
    (other / "enlace-run" / "checkpoints" / "step-000010").mkdir(parents=True)  # enlace.job's, run on this machine
    (other / "enlace-run" / "checkpoints" / "step-000010" / "state.pt").write_bytes(b"x")
    local_checks(other, allow_dirty=False, check_ignored=False)  # no change to ship (it asked to commit checkpoints)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["launch", "tiny", "--set", "run_name=$(touch /tmp/x)"], ["run_name='$(touch /tmp/x)'", "not a valid name"]),
        (["preflight", "tiny", "--set", "run_name=a b"], ["run_name='a b'"]),
        (["launch", "tiny", "--set", "training.max_steps"], ["SECTION.KEY=VALUE"]),
        (["launch", "/path/x.yaml"], ["run config's stem, not a path", "launch 'x'"]),
        (["launch", "configs/runs/smoke-cpu.yaml"], ["stem, not a path", "launch 'smoke-cpu'"]),
        (["launch", "f2", "--", "python", "a b.py"], ["not both", "launch --name f2 -- python 'a b.py'"]),
    ],
)
def test_names_are_refused_where_they_are_given(tmp_path, monkeypatch, args, words):
    result = _cli(["--host", "local", *args], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("remote_dir", ["-x", "~root/x", "a\nb", ""])
def test_remote_sh_refuses_a_remote_dir_it_would_misread(tmp_path, remote_dir):
    out = subprocess.run(
        ["bash", str(REPO / "enlace" / "remote" / "remote.sh"), remote_dir, "setup"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 2 and doc["exit_code"] == 2 and "absolute path, ~ or ~/DIR" in doc["error"]
    assert list(tmp_path.iterdir()) == []  # nothing created, no option read


def test_a_driver_upgrade_is_said_as_one_where_its_server_half_is_not_installed_yet(tmp_path):
    """A repository of the user's own (no enlace/) launched by one driver, then `status` from an upgraded one:
    its server half (ENLACE_SERVER) is not on the host, an older one is; the words say so and what to run."""
    sha = "a" * 40
    tree = tmp_path / "trees" / sha
    tree.mkdir(parents=True)
    (tree / ".enlace-ready").touch()
    (tmp_path / "server" / "0123456789abcdef" / "enlace").mkdir(parents=True)
    (tmp_path / "server" / "0123456789abcdef" / "enlace" / "__init__.py").touch()
    script = str(REPO / "enlace" / "remote" / "remote.sh")

    def status(key: str) -> dict:
        env = {**os.environ, "ENLACE_SERVER": key}
        out = subprocess.run(
            ["bash", script, str(tmp_path), "enlace", "latest", "python3", "status"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert out.returncode == 3, out
        return json.loads(out.stdout)

    upgraded = status("fedcba9876543210")["error"]
    assert "server half (fedcba9876543210) is not installed" in upgraded and "(0123456789abcdef)" in upgraded
    assert "driver upgrade run enlace-remote sync once" in upgraded
    shutil.rmtree(tmp_path / "server")  # none at all: the plain words
    assert "server half is not installed here: run enlace-remote sync" in status("fedcba9876543210")["error"]


def test_run_name_typo_is_caught_before_connecting(sshd, user_repo):
    for verb in ("preflight", "verify", "launch"):
        before = connections(sshd)
        out = remote(user_repo, sshd.env, verb, "tinny", check=False)
        assert out.returncode == 2 and "did you mean 'tiny'?" in out.stderr, out.stderr
        assert out.stderr.count("Error:") == 1  # said once
        # nothing was synced or asked; launch and preflight, which take a run's name too, ask the host once
        # whether it has a run of that name (another clone's, named close to a file here), and sync nothing
        assert connections(sshd) == before + (verb != "verify"), verb
    assert not (server_dir(sshd, "testhost") / "trees").exists()


def test_global_options_work_after_the_verb(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "sync")
    out = remote(user_repo, {**sshd.env, "ENLACE_REMOTE_HOST": "nowhere"}, "status", "--host", "testhost", host="local")
    assert out.returncode == 0 and "no runs on this host" in out.stdout


def test_a_config_error_found_by_the_servers_verify_is_exit_2(sshd, user_repo):
    """docs/configs.md: config errors exit 2. A typo'd key through launch reached the server's verify and
    exited 3 (verify's code); what the machine lacks (data, a teacher) stays 3."""
    tiny_corpus(server_dir(sshd, "testhost"))
    out = remote(user_repo, sshd.env, "launch", "tiny", "--set", "training.max_step=5", "--no-preflight", check=False)
    assert out.returncode == 2 and "training.max_step" in out.stderr and "max_steps" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # the server's words reach the terminal as text: an escape in them (here the user's own) retitles nothing
    out = remote(user_repo, sshd.env, "launch", "tiny", "--set", "training.\x1b]0;pwned\x07x=5", check=False)
    assert out.returncode == 2 and "training.\\x1b]0;pwned\\x07x" in out.stderr and "\x1b" not in out.stderr, out.stderr


def test_a_servers_banner_reaches_the_terminal_as_text_in_every_retry_notice(tmp_path):
    """Before any login, whatever answers on the port writes the first line: escapes in it (a retitle, a
    colour) reached the terminal raw in each `retrying` notice; the final error alone was written out. The host
    was also named twice in each notice."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.sendall(b"SSH-\x1b]0;PWNED\x07\x1b[31m-x\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        env = {**os.environ, "ENLACE_HOSTS_FILE": str(tmp_path / "none.yaml")}
        out = subprocess.run(
            [*DRIVER, "--host", f"u@127.0.0.1:{port}", "status"], capture_output=True, text=True, env=env, timeout=120
        )
    finally:
        listener.close()
    assert out.returncode == 4 and "retrying in" in out.stderr, out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr and "\\x1b]0;PWNED\\x07" in out.stderr, out.stderr
    notice = next(line for line in out.stderr.splitlines() if "retrying in" in line)
    assert notice.count(f"127.0.0.1:{port}") == 2, notice  # `u@…:port (…:port)`, once


def test_what_a_server_says_keeps_its_text_and_loses_its_terminal_controls():
    """shown(): the one filter for the server's words in errors, checklists, tables and notices."""
    from enlace.errors import EnlaceError, shown

    text = "naïve 日本 🙂 — tab\there\nline\r 40%|████"
    assert shown(text) == text  # UTF-8, tabs, newlines and a progress bar's carriage return kept
    assert shown("a\x1b]52;c;ZXZpbA==\x07b\x7fc\x9b31md\x00") == "a\\x1b]52;c;ZXZpbA==\\x07b\\x7fc\\x9b31md\\x00"
    assert EnlaceError("log tail: \x1b[2J").format_message() == "log tail: \\x1b[2J"


@pytest.mark.parametrize(
    "args",
    [
        ["stop", "qa", "--sweep"],
        ["status", "--sweep", "lr", "lr-lr1e-3-SEED1"],
        ["fetch", "qa", "--sweep"],
        ["plot", "a", "b", "--sweep", "lr"],
        ["status", "--all", "nosuch"],
    ],
)
def test_a_run_and_a_sweep_together_are_refused(tmp_path, monkeypatch, args):
    """Seen: `stop qa --sweep` stopped every run of the last sweep, exit 0, and left qa running (`--sweep` takes
    an optional NAME: the run given beside it was dropped without a word)."""
    result = _cli(["--host", "local", *args], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2 and ("a run or a sweep, not both" in result.output) != ("--all" in args), result.output
    assert "not both" in result.output, result.output  # (status --all RUN ignored RUN, exit 0)
    verb, run = args[0], " ".join(a for a in args[1:] if a not in ("--sweep", "lr", "--all"))
    assert f"`enlace-remote {verb} {run}` acts on th" in result.output, result.output


def test_preflight_of_a_run_file_of_your_own_command_says_what_preflight_measures(tmp_path, monkeypatch):
    """Seen: `preflight shakespeare` (a run file with `command:`) synced, verified, then said `command: unknown
    key — did you mean 'command'?`. It is said at once now, with what to run instead."""
    repo = tmp_path / "mine"
    (repo / "configs" / "runs").mkdir(parents=True)
    (repo / "configs" / "runs" / "shakespeare.yaml").write_text("command: [python, train.py]\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    result = _cli(["--host", "local", "preflight", "shakespeare"], repo, tmp_path, monkeypatch)
    assert result.exit_code == 2 and "preflight measures enlace's own trainer" in result.output, result.output
    assert "`enlace-remote launch shakespeare`" in result.output and "unknown key" not in result.output


def test_a_command_given_by_name_without_its_dash_dash_is_told_where_its_options_go(tmp_path, monkeypatch):
    """`launch --name x python train.py --lr 3` said "No such option '--lr' (did you mean --help, --slurm?)"."""
    result = _cli(
        ["--host", "local", "launch", "--name", "x", "python", "t.py", "--lr", "3"], REPO, tmp_path, monkeypatch
    )
    assert result.exit_code == 2 and "a command's own options go after `--`" in result.output, result.output
    assert "Did you mean" not in result.output
    typo = _cli(["--host", "local", "launch", "tiny", "--stepz", "3"], REPO, tmp_path, monkeypatch)  # ours: as it was
    assert typo.exit_code == 2 and "after `--`" not in typo.output, typo.output


def test_verify_of_a_run_file_not_yet_committed_says_to_commit_it(tmp_path, monkeypatch):
    """verify of a run file written and not committed reached the server, which said "run config not found" of a
    file right there: it checks HEAD's tree. Said here, before any connection, as launch says it."""
    repo = _a_run_file_not_yet_committed(tmp_path / "mine", "wd")
    result = _cli(["--host", "local", "verify", "wd"], repo, tmp_path, monkeypatch)
    assert result.exit_code == 3 and "configs/runs/wd.yaml is not in HEAD" in result.output, result.output
    assert "commit it" in result.output and not (repo / ".enlace" / "local" / "trees").exists()


def test_a_command_given_after_dash_dash_takes_args_and_env_sets_and_refuses_the_rest(tmp_path):
    """launch --name X --set args.lr=3 --set env.FOO=1 -- CMD ran CMD without either, and took a trainer's key or a
    run_name without a word; a --name that is a run file here would take that file's run over."""
    from enlace.config.command import Bad
    from orchestrator.errors import UsageError
    from orchestrator.launch.own import command_of

    argv = ["python", "train.py", "--lr=1"]
    own = command_of(tmp_path, None, argv, "ex6", ("args.lr=3", "env.FOO=1", "args.seed=7"))
    assert list(own.argv) == ["python", "train.py", "--lr=3", "--seed=7"] and dict(own.env) == {"FOO": "1"}
    for item, words in (
        ("training.max_steps=5", "--set training.max_steps: launch -- COMMAND runs your own command"),
        ("run_name=zzz", "--set run_name: launch -- COMMAND takes its run's name from --name NAME alone"),
    ):
        with pytest.raises(Bad, match=re.escape(words)):
            command_of(tmp_path, None, argv, "ex6", (item,))
    (tmp_path / "configs" / "runs").mkdir(parents=True)
    (tmp_path / "configs" / "runs" / "smoke.yaml").write_text("data: smoke\n")
    with pytest.raises(UsageError, match=r"--name smoke: configs/runs/smoke.yaml is a run file here"):
        command_of(tmp_path, None, argv, "smoke", ())
    (tmp_path / "configs" / "runs" / "rn.yaml").write_text("command: [python, t.py]\nrun_name: speedy\n")
    with pytest.raises(UsageError, match=r"--name speedy: configs/runs/rn.yaml is a run file here for that name"):
        command_of(tmp_path, None, argv, "speedy", ())  # (two commands then shared one run's directory)


def test_small_words_name_the_key_once_and_the_verb_given(tmp_path, monkeypatch):
    """`run_name: run_name: 'a b'` (a name given without a file, or in a command's run file); logout on the local
    host said `e.g. login gpu1`; sample and export of a command's run said a launch would train it again."""
    from enlace.config.command import parse
    from enlace.errors import ConfigError
    from enlace.names import validate_run_name
    from enlace.state import runs
    from enlace.train.trained import find_checkpoint

    for call, said in (
        (lambda: validate_run_name("a b"), "run_name: 'a b' is not a valid name"),
        (lambda: validate_run_name("a b", "--set"), "--set: run_name: 'a b' is not a valid name"),
        (
            lambda: parse({"command": ["t"], "run_name": "../x"}, "configs/runs/b9.yaml", None),
            "configs/runs/b9.yaml: run_name: '",
        ),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        assert e.value.format_message().startswith(said) and "run_name: run_name" not in e.value.format_message()
    from click.testing import CliRunner

    from enlace.cli import main

    size = CliRunner().invoke(main, ["preflight", "smoke-cpu", "--memory-limit", "abc"])  # it named only the value
    assert size.exit_code == 2 and "Invalid value for '--memory-limit': 'abc' is not a size" in size.output
    result = _cli(["logout"], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2 and "name an SSH host, e.g. logout gpu1" in result.output, result.output
    run_dir = tmp_path / "runs" / "ex2"
    runs.update(run_dir, run_name="ex2", status="finished", command={"command": ["python", "t.py"]})
    monkeypatch.setenv("ENLACE_ROOT", str(tmp_path))  # on the server it ran on
    with pytest.raises(Exception, match=r"ex2 runs your own command: it has no checkpoint of enlace's trainer"):
        find_checkpoint(run_dir)


def test_verify_says_a_commands_paths_are_the_repository_roots(user_repo):
    """From a subdirectory, `launch --name x -- python hello.py` said `missing: hello.py` and no more."""
    out = remote(user_repo, {}, "launch", "--name", "x", "--", "python", "nope.py", host="local", check=False)
    said = "[FAIL] the command's files present — missing: nope.py (paths from the repository's root, where the command"
    assert out.returncode == 3 and said in out.stderr, out.stderr


def test_a_failed_start_of_a_run_files_command_under_another_name_says_to_launch_the_file_again(monkeypatch):
    """`launch toy --set args.learning_rate=0.1 --set run_name=typo`, refused by the script's argparse, said to
    `launch --name typo -- COMMAND`; `launch typo` would run the refused command the host recorded again."""
    from types import SimpleNamespace

    from orchestrator.launch import stages

    monkeypatch.setattr(stages, "log_since", lambda session, run, offset: "usage: train.py [--lr LR]\n")
    row = {"run_name": "typo", "status": "failed", "error": "the command exited 2", "command": ["python", "t.py"]}
    row |= {"step": 0, "max_steps": None, "latest_checkpoint": None, "exit_code": 2}
    session = SimpleNamespace(repo=REPO, host=SimpleNamespace(name="local"))
    sets = ("args.learning_rate=0.1", "run_name=typo")
    said = stages._ended_badly(session, row, {"log_offset": 0}, ("toy", sets)).format_message()
    assert "fix what it says, then `enlace-remote launch toy --set args.learning_rate=0.1 --set run_name=typo`" in said
    adhoc = stages._ended_badly(session, row, {"log_offset": 0}, None).format_message()
    assert "fix the command, then `enlace-remote launch --name typo -- COMMAND`" in adhoc, adhoc
