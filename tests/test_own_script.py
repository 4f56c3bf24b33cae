"""Your own script under enlace-remote (enlace/config/command.py, orchestrator/launch/own.py): a script
that knows nothing of enlace, over the real sshd — launch, logs -f, status, stop, a crash restarted then
given up, fetch of its outputs — and the refusals before anything starts (an ignored script, a bad run file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import REPO
from support.remote import DRIVER, remote, server_dir, status_row, wait_until
from support.repocopy import commit_all

# prints lines, writes a file to its output dir, exits 0 on SIGTERM; knows nothing of enlace
SCRIPT = textwrap.dedent(
    """\
    import argparse, pathlib, signal, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--out"); p.add_argument("--lines", type=int, default=5); p.add_argument("--code", type=int, default=0)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM: exiting 0", flush=True), sys.exit(0)))
    out = pathlib.Path(a.out); out.mkdir(parents=True, exist_ok=True)
    (out / "result.txt").write_text("the answer is 42\\n")
    (out / "sub").mkdir(exist_ok=True); (out / "sub" / "more.bin").write_bytes(bytes(range(256)) * 40)
    for i in range(a.lines):
        print(f"script line {i}", flush=True)
        time.sleep(0.05)
    sys.exit(a.code)
    """
)


def _run_file(repo, name: str, *args: str, **extra) -> None:
    doc = {"command": ["python", "scripts/hello.py", "--out", "{run_dir}/out", *args], "outputs": ["out/**/*"], **extra}
    (repo / "configs" / "runs" / f"{name}.yaml").write_text(json.dumps(doc) + "\n")


@pytest.fixture
def script_repo(user_repo):
    (user_repo / "scripts" / "hello.py").write_text(SCRIPT)
    _run_file(user_repo, "hello")
    _run_file(user_repo, "forever", "--lines", "1000000")
    _run_file(user_repo, "broken", "--code", "1", supervise={"restarts": 2, "backoff": 0.2})
    _run_file(user_repo, "fails-at-once", "--code", "1", "--lines", "1", supervise={"restarts": 1, "backoff": 600})
    commit_all(user_repo, "a script of our own and its run files")
    return user_repo


def _row(repo, env, run: str) -> dict:
    return status_row(repo, env, "testhost", run)


@pytest.mark.slow
def test_a_script_that_knows_nothing_of_enlace(sshd, script_repo, tmp_path):
    env = sshd.env
    out = remote(script_repo, env, "launch", "hello")
    assert "preflight measures enlace's own trainer" in out.stderr, out.stderr
    # verify's lines for a command: its files as the repository names them, no trainer checkpoint check
    assert "[ ok ] the command's files present — configs/runs/hello.yaml, scripts/hello.py" in out.stderr, out.stderr
    assert "its checkpoints can resume it" not in out.stderr
    logs = remote(script_repo, env, "logs", "hello", "-f").stdout
    assert all(f"script line {i}" in logs for i in range(5)), logs
    row = _row(script_repo, env, "hello")
    assert (row["status"], row["exit_code"]) == ("finished", 0), row
    assert row["command"] == ["python", "scripts/hello.py", "--out", "{run_dir}/out"]
    shown = remote(script_repo, env, "status", "hello").stdout
    assert "└ finished: the command exited 0 — python scripts/hello.py --out '{run_dir}/out'" in shown, shown

    remote(script_repo, env, "fetch", "hello", "--dest", str(tmp_path / "got"))
    run_dir = server_dir(sshd, "testhost") / "runs" / "hello"
    for rel in ("out/result.txt", "out/sub/more.bin"):
        assert (tmp_path / "got" / rel).read_bytes() == (run_dir / rel).read_bytes(), rel

    # launched again by name, a run file's run keeps the --set it was launched with (it ran the bare command)
    remote(script_repo, env, "launch", "hello", "--set", "args.lines=2", "--follow")
    out = remote(script_repo, env, "launch", "hello", "--follow")
    assert "from configs/runs/hello.yaml --set args.lines=2" in out.stderr, out.stderr
    assert _row(script_repo, env, "hello")["command"][-1] == "--lines=2"
    # a --set the script refuses (argparse's exit 2) is not remembered: the next `launch hello` would repeat it
    bad = remote(script_repo, env, "launch", "hello", "--set", "args.bogus=1", check=False)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus=1" in bad.stderr, bad.stderr
    out = remote(script_repo, env, "launch", "hello", "--follow")
    assert "from configs/runs/hello.yaml --set args.lines=2 --set run_name=hello\n" in out.stderr, out.stderr

    remote(script_repo, env, "launch", "forever", "--no-wait")
    wait_until(lambda: "script line 3" in (server_dir(sshd, "testhost") / "runs/forever/train.log").read_text())
    out = remote(script_repo, env, "stop", "forever")
    assert "forever: stopped (stopped: the command exited 0 after SIGTERM)" in out.stdout, out.stdout
    row = _row(script_repo, env, "forever")
    assert row["status"] == "stopped" and row["exit_code"] == 0, row
    log = (server_dir(sshd, "testhost") / "runs/forever/train.log").read_text()
    assert "got SIGTERM: exiting 0" in log and "stopped: the command exited 0 after SIGTERM" in log

    out = remote(script_repo, env, "launch", "broken", "--follow", check=False)  # follows it to its end
    assert out.returncode == 8, (out.returncode, out.stderr[-2000:])  # crashed: the contract's code
    assert out.stdout.splitlines().count("script line 4") == 3  # the first start and its two restarts
    assert "supervisor: the command exited 1: script line 4; restart 1 of 2" in out.stdout  # its last words
    row = _row(script_repo, env, "broken")
    assert row["restarts"] == 2 and "gave up after 2 restarts: the command exited 1" in row["error"], row

    # without --follow: a first start that fails at once fails the launch (it did say "running", exit 0)
    out = remote(script_repo, env, "launch", "fails-at-once", check=False)
    assert out.returncode == 8 and "after: the command exited 1: script line 0" in out.stderr, out.stderr
    assert "fails-at-once: its first start crashed, and its supervisor starts it again" in out.stderr, out.stderr
    out = remote(script_repo, env, "stop", "fails-at-once")
    assert "stopped (stopped while waiting to restart)" in out.stdout, out.stdout
    last = (server_dir(sshd, "testhost") / "runs/fails-at-once/train.log").read_text().splitlines()[-1]
    assert "supervisor: stopped while waiting to restart" in last, last  # its log ended on "restart 1 of 1 in 600 s"

    adhoc = ["python", "scripts/hello.py", "--out", "{run_dir}/out", "--lines", "2"]
    remote(script_repo, env, "launch", "--name", "hello2", "--follow", "--", *adhoc)
    out = remote(
        script_repo, env, "launch", "hello2", "--follow"
    )  # no run file: the command it ran, again (hello2 is no typo of hello: launched from here)
    assert "hello2: launching again the command it ran: python scripts/hello.py" in out.stderr, out.stderr
    again = _row(script_repo, env, "hello2")
    assert again["status"] == "finished"
    assert again["elapsed_s"] > again["start_elapsed_s"] > 0, again  # ELAPSED over both launches (it restarted at 0)
    assert (server_dir(sshd, "testhost") / "runs/hello2/train.log").read_text().count("script line 1") == 2
    out = remote(script_repo, env, "fetch", "hello2", "--dest", str(tmp_path / "adhoc"))  # no outputs: its log
    assert "no outputs (a run file's `outputs:` names them; `enlace-remote init` writes one)" in out.stderr
    assert (tmp_path / "adhoc" / "train.log").read_bytes().count(b"script line 1") == 2
    other = tmp_path / "other"  # another clone, which never launched hello2 (a name close to its hello.yaml)
    subprocess.run(["git", "clone", "-q", str(script_repo), str(other)], check=True)
    out = remote(other, env, "launch", "hello2", "--follow")  # it said "no run config 'hello2' — did you mean…"
    assert "hello2: launching again the command it ran: python scripts/hello.py" in out.stderr, out.stderr

    out = remote(script_repo, env, "init", "brace", "--", "python", "-c", "print('{')", check=False)
    assert out.returncode == 2 and "write a literal brace as {{ or }}" in out.stderr, out.stderr
    assert not (script_repo / "configs" / "runs" / "brace.yaml").exists()  # refused before anything is written


def test_a_git_ignored_script_is_refused_quoting_the_rule_before_anything_starts(sshd, user_repo):
    (user_repo / ".gitignore").write_text((user_repo / ".gitignore").read_text() + "\nscratch/\n")
    (user_repo / "scratch").mkdir()
    (user_repo / "scratch" / "train.py").write_text("print('hi')\n")
    (user_repo / "configs" / "runs" / "ign.yaml").write_text("command: [python, scratch/train.py]\n")
    commit_all(user_repo, "a run file whose script is ignored")
    out = remote(user_repo, sshd.env, "launch", "ign", check=False)
    assert out.returncode == 3, out.stderr
    assert "scratch/train.py is git-ignored (.gitignore:" in out.stderr and ":scratch/" in out.stderr, out.stderr
    assert not (server_dir(sshd, "testhost") / "runs" / "ign").exists()  # nothing started, nothing synced for it


@pytest.mark.parametrize(
    "text, says",
    [
        ("command: python train.py\n", "command: 'python train.py' is not a list of strings"),
        ("command: [python, x.py]\nnproc: 0\n", "nproc: 0 is not a whole number from 1 to 1024"),
        ("command: [python, x.py]\nsupervise: {restarts: 1000}\n", "supervise.restarts: 1000 is not a whole number"),
        ("command: [python, x.py, '{out}']\n", "uses {out}, which enlace does not fill"),
        ("command: [python, x.py]\nrestart: 3\n", "restart: unknown key"),
        ("command: [python, x.py]\nsupervise: {retries: 2}\n", "supervise.retries: unknown key"),
        # the server's own files as a run's data, outputs outside its run directory: accepted, then misread
        ("command: [python, x.py]\ndata: ['/etc/host*']\n", "data: '/etc/host*' is outside the project's data/"),
        ("command: [python, x.py]\ndata: ['../secret/*.txt']\n", "data: '../secret/*.txt' is outside the project's"),
        ("command: [python, x.py]\noutputs: [/etc/hostname]\n", "outputs: '/etc/hostname' is outside the run dir"),
        ("command: [python, x.py]\ndata: [data/]\n", "data: 'data/' names data/ itself — name its files: data/**"),
        ("command: [python, x.py]\noutputs: ['../../configs/*']\n", "outputs: '../../configs/*' is outside the run"),
    ],
)
def test_a_wrong_command_run_file_is_one_line_and_exit_2(project, text, says):
    (project / "configs" / "runs" / "bad.yaml").write_text(text)
    _one_line_exit_2(project, "bad", says)


def _one_line_exit_2(project, run: str, says: str, *sets: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "enlace", "check-config", run, *(a for s in sets for a in ("--set", s))]
    out = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_set_reaches_a_command_as_its_environment_and_its_options(project):
    """--set env.NAME=V and args.NAME=V (launch's, and each sweep point's): the command's environment and
    `--NAME=V` after its argv, in the order given; run_name too; anything else is one line naming the forms."""
    from enlace.config import command

    (project / "configs" / "runs" / "mine.yaml").write_text("command: [python, t.py, --x=1]\nenv: {SEED: '0'}\n")
    sets = ("args.lr=3e-4", "env.SEED=7", "env.WANDB_MODE=offline", "args.n-layer=2", "run_name=mine-2")
    own = command.load("mine", project, sets)
    assert own.argv == ("python", "t.py", "--x=1", "--lr=3e-4", "--n-layer=2") and own.run_name == "mine-2"
    assert own.env == {"SEED": "7", "WANDB_MODE": "offline"}
    assert command.load("mine", project).argv == ("python", "t.py", "--x=1")  # the file itself is unchanged
    again = command.load("mine", project, ("args.x=2", "args.lr=1", "args.lr=5"))  # one value each, the last given
    assert again.argv == ("python", "t.py", "--x=2", "--lr=5")
    forms = "runs your own command, which takes --set run_name=NAME, env.NAME=VALUE (an environment variable) or"
    for bad in ("optim.learning_rate=1e-3", "env.1X=2", "args.=3", "lr=1"):
        _one_line_exit_2(project, "mine", f"--set {bad.partition('=')[0]}: configs/runs/mine.yaml {forms}", bad)
    _one_line_exit_2(project, "mine", "uses {out}, which enlace does not fill", "args.out={out}/x")


def test_a_fetch_of_more_outputs_than_a_process_may_hold_open(sshd, user_repo, tmp_path):
    """Seen (bench/fetch_outputs.py, 20,000 outputs): fetch-serve held every offered file open and hit the
    1,024-descriptor limit. Outputs are listed for the offer, then opened one at a time as they are sent."""
    make = "import pathlib, sys; d = pathlib.Path(sys.argv[1]); d.mkdir(); [(d / f'f{{i}}.txt').write_text(str(i)) for i in range(1500)]"  # {{ }}: literal braces
    doc = {"command": ["python", "-c", make, "{run_dir}/out"], "outputs": ["out/*"]}
    (user_repo / "configs" / "runs" / "many.yaml").write_text(json.dumps(doc) + "\n")
    commit_all(user_repo, "a command with 1,500 outputs")
    remote(user_repo, sshd.env, "launch", "many", "--follow", host="local")
    limited = ["env", f"PYTHONPATH={REPO}", "prlimit", "--nofile=512", *DRIVER]  # fewer descriptors than outputs
    remote(user_repo, sshd.env, "fetch", "many", "--dest", str(tmp_path / "got"), host="local", driver=limited)
    got = sorted((tmp_path / "got" / "out").iterdir(), key=lambda p: int(p.stem[1:]))
    assert [p.read_text() for p in got] == [str(i) for i in range(1500)]

    # again, with one output changed on the server and one here (each its size kept): those two come again, the
    # rest stays the very file fetched before (no byte of it written again)
    inodes = {p.name: p.stat().st_ino for p in got}
    (server_dir(sshd, "local") / "runs" / "many" / "out" / "f7.txt").write_text("X")
    (tmp_path / "got" / "out" / "f8.txt").write_text("Y")
    remote(user_repo, sshd.env, "fetch", "many", "--dest", str(tmp_path / "got"), host="local")
    assert [p.read_text() for p in got] == ["X" if i == 7 else str(i) for i in range(1500)]
    assert [p.name for p in got if p.stat().st_ino != inodes[p.name]] == ["f7.txt", "f8.txt"]
    assert not (tmp_path / "got" / ".partial-fetch").exists()


def test_launchs_own_restarts_are_in_the_spec_the_server_records():
    """`sweep --restarts 0` of a run file with `supervise: {restarts: 3}`: the supervisor got 0, while the spec
    the server records (status --json's command_spec) said 3."""
    from enlace.config.command import CommandRun
    from orchestrator.launch import own as own_launch

    own = CommandRun.from_doc({"command": ["python", "t.py"], "run_name": "r", "supervise": {"restarts": 3}}, "r.yaml")
    given = own_launch.effective(own, 0, None)
    assert own_launch.policy(given)[:2] == ["--restarts", "0"] and given.to_doc()["supervise"]["restarts"] == 0
    kept = own_launch.effective(own, None, None)  # not given: the run file's
    assert own_launch.policy(kept)[:2] == ["--restarts", "3"] and kept.to_doc()["supervise"]["restarts"] == 3


def test_a_command_recorded_before_the_data_rule_is_still_read_back():
    """run.json's copy of a command launched before data/outputs outside their places were refused is read again
    by fetch and restarts: refusing it there would bring nothing of that run back."""
    from enlace.config.command import Bad, CommandRun, from_spec

    old = {"command": ["python", "t.py"], "run_name": "old", "data": ["corpus/*.txt"], "outputs": ["/abs/out/*"]}
    assert CommandRun.from_doc(old, "run.json command").data == ("corpus/*.txt",)
    with pytest.raises(Bad, match="outside the project's data/"):  # a launch's spec: checked in full
        from_spec(json.dumps(old), "old")
