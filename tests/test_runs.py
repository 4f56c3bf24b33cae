"""Run state (enlace/state/runs.py), the exit-code table and the wire protocol: fast tests, no sshd."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from support import REPO
from support.cli import enlace
from support.configs import write_run

from enlace import contract
from enlace.contract import Status
from enlace.server import lifecycle
from enlace.state import runs


def test_exit_codes_are_one_table_used_by_every_part():
    assert len(set(contract.TABLE)) == len(contract.TABLE) == 12
    script = (REPO / "enlace" / "remote" / "remote.sh").read_text()
    for name, value in re.findall(r"^EXIT_([A-Z_]+)=(\d+)$", script, re.M):
        assert getattr(contract, name) == int(value), name  # remote.sh spells the same values
    assert re.findall(r"exit (\d)", script) == []  # no bare numbers: only the named ones
    verify_tree = (REPO / "enlace" / "remote" / "verify_tree.py").read_text()
    for name, value in re.findall(r"^(USAGE|VERIFY) = (\d+)$", verify_tree, re.M):
        assert getattr(contract, name) == int(value), name
    readme = (REPO / "docs" / "troubleshooting.md").read_text()  # the one table, as users read it
    for code, what in contract.TABLE.items():
        assert f"| {code} | {what} |" in readme, what
    assert (
        "\n    8  the run crashed" in contract.help_text() and "\n   10  preflight" in contract.help_text()
    )  # aligned
    assert "\n  130  interrupted (Ctrl-C; enlace-remote also by SIGTERM" in contract.help_text()
    from enlace.errors import NoSpaceError
    from orchestrator.errors import AlreadyRunning, UsageError, VerifyError, from_doc

    for cls in (UsageError, VerifyError, AlreadyRunning, NoSpaceError):
        assert type(from_doc({"error": "x", "exit_code": cls.exit_code}, 1)) is cls
    crashed = from_doc({"error": "x", "exit_code": contract.CRASHED, "kind": "other"}, 1)
    assert crashed.exit_code == contract.CRASHED and crashed.kind == "other"
    assert from_doc({"error": "x"}, 99).exit_code == contract.FAILED  # an unknown code is never passed on


@pytest.mark.parametrize(
    ("code", "imports", "rc", "hook_ran"),
    [(3, "", 3, False), (None, "", 0, False), ("why", "", 1, False), (3, "import torch", 3, True)],
)
def test_leave_flushes_and_skips_teardown_but_runs_torchs_exit_hooks(code, imports, rc, hook_ran):
    """Both CLIs end in contract.leave: output and exit code as with sys.exit; the interpreter's teardown
    (here: a module global's finalizer) skipped; atexit hooks run only in a process that loaded torch,
    whose hooks must run."""
    script = (
        f"import atexit, sys\n{imports}\nfrom enlace.contract import leave\n"
        "atexit.register(lambda: print('hook', file=sys.stderr))\n"
        "class Finalized:\n    def __del__(self): print('finalized', file=sys.stderr)\n"
        "kept = Finalized()\n"
        f"print('out', end=''); print('err', end='', file=sys.stderr); leave({code!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == rc and out.stdout == "out", out
    assert out.stderr.startswith("err") and ("why" in out.stderr) == (code == "why")
    assert ("hook" in out.stderr) == hook_ran and "finalized" not in out.stderr, out.stderr


def test_liveness_is_pid_and_start_time_never_argv(tmp_path):
    # A live process whose argv says "enlace train" but that is not the recorded process: not the run.
    impostor = subprocess.Popen(["bash", "-c", "exec -a 'python -m enlace train x' sleep 60"])
    try:
        run_dir = tmp_path / "x"
        runs.update(run_dir, status=Status.RUNNING, pid=impostor.pid, pid_start=runs.proc_start(impostor.pid) + 1)
        assert runs.observe(run_dir)["status"] == "crashed" and not runs.observe(run_dir)["alive"]
        runs.update(run_dir, pid_start=runs.proc_start(impostor.pid))  # the very process: alive
        assert runs.observe(run_dir)["status"] == "running"
    finally:
        impostor.kill()
        impostor.wait()
    assert runs.observe(run_dir)["status"] == "crashed"  # gone (or a zombie): crashed, whatever argv said
    assert runs.proc_start(impostor.pid) is None


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        ("finished", 0, 0),
        ("stopped", 0, 0),
        ("failed", 2, 2),
        ("failed", 9, 9),
        ("failed", None, 1),
        ("crashed", None, contract.CRASHED),
    ],
)
def test_exit_code_of_each_ended_status(status, code, expected):
    assert contract.exit_code_of({"status": status, "exit_code": code}) == expected


def test_run_json_writes_leave_no_temp_files_even_when_they_fail(tmp_path):
    run_dir = tmp_path / "r"
    runs.update(run_dir, step=1)
    runs.update(run_dir, step=2, note="x")
    assert runs.read(run_dir)["step"] == 2 and runs.read(run_dir)["note"] == "x"
    with pytest.raises(TypeError):
        runs.update(run_dir, bad=object())  # not JSON: the write fails half way
    assert runs.read(run_dir)["step"] == 2
    assert sorted(p.name for p in run_dir.iterdir()) == [".run.json.lock", "run.json"]


def test_start_refuses_a_live_run_and_wait_sees_its_death(tmp_path):
    run_dir = tmp_path / "runs" / "w"
    doc = lifecycle.start(run_dir, [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, {})
    row = runs.observe(run_dir)
    assert row["alive"] and row["status"] == "starting" and row["launch_id"] == doc["launch_id"]
    with pytest.raises(runs.AlreadyRunning, match="already running"):
        lifecycle.start(run_dir, [sys.executable, "-c", "pass"], tmp_path, {})
    rep = lifecycle.stop(run_dir, grace=10, kill=False)  # no trainer: SIGTERM ends the sleeper without a status
    assert rep["stopped"] and rep["was_running"] and not rep["killed"]  # SIGTERM did it, within the grace
    assert runs.observe(run_dir)["status"] == "crashed"
    again = lifecycle.start(run_dir, [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path, {})
    row = lifecycle.wait_started(run_dir, again["launch_id"], timeout=30)
    assert row["status"] == "crashed" and row["waited"] == "done"
    assert lifecycle.stop(run_dir, grace=1, kill=False)["was_running"] is False


def test_a_slurm_job_pending_for_a_limit_ends_the_wait_and_says_why(tmp_path, monkeypatch):
    """Seen: a 2-node job on a 1-node partition, `PENDING (PartitionNodeLimit)`, and launch waited for it to
    start. (Slurm's answer stands in for a cluster here: job_info is what scontrol said.)"""
    from enlace.slurm import settings as slurm

    said = {"state": "PENDING", "reason": "Priority", "restarts": 0, "exit_code": None}
    monkeypatch.setattr(slurm, "job_info", lambda job_id, max_age=0: dict(said))
    run_dir, phases = tmp_path / "r", []
    runs.update(run_dir, status=Status.STARTING, launch_id="L1", job_id="7", step=0)
    assert lifecycle.wait_started(run_dir, "L1", timeout=0.3, on_phase=phases.append)["waited"] == "timeout"
    said["reason"] = "PartitionNodeLimit"
    row = lifecycle.wait_started(run_dir, "L1", timeout=30, on_phase=phases.append)
    assert row["waited"] == "blocked" and phases[0] == "pending in Slurm: job 7 PENDING (Priority)", phases
    assert phases[-1].startswith("pending in Slurm: job 7 PENDING (PartitionNodeLimit): its node count is outside")
    assert phases[-1].endswith("so it may never start — `stop` cancels it"), phases
    from types import SimpleNamespace

    from orchestrator.errors import UsageError
    from orchestrator.launch.stages import wait_first_step

    session = SimpleNamespace(host=SimpleNamespace(name="hpc"), stream_json=lambda *a, **k: row)
    with pytest.raises(UsageError, match=r"r: Slurm job 7 is pending for PartitionNodeLimit: as asked it may never"):
        wait_first_step(session, "r", {"launch_id": "L1"}, follow=False)


def test_a_resumed_run_has_started_once_it_logged_a_step_past_its_checkpoint(tmp_path):
    """A resumed trainer enters `running` at its checkpoint's step (run.json step 2): launch's wait returned
    there and said "step 2/30", where the first step this start logs is 3 (a test saw it under load)."""
    sleeper = subprocess.Popen(["sleep", "30"])  # stands in for the trainer: alive
    try:
        run_dir = tmp_path / "r"
        pid = {"pid": sleeper.pid, "pid_start": runs.proc_start(sleeper.pid)}
        runs.update(run_dir, status=Status.RUNNING, launch_id="L1", step=2, start_step=2, **pid)
        assert lifecycle.wait_started(run_dir, "L1", timeout=0.3)["waited"] == "timeout"
        runs.update(run_dir, step=3)
        assert lifecycle.wait_started(run_dir, "L1", timeout=30)["waited"] == "done"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_command_has_started_once_it_ran_a_while_and_a_crashed_first_start_is_said(tmp_path):
    """A launch waits for its command to outlive settle_s (one that fails at once fails its launch), and returns
    at once when the first start crashed and the supervisor waits to restart it; a new launch starts its
    restart count afresh."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        run_dir = tmp_path / "r"
        command = {"command": ["sleep", "30"], "supervise": {"restarts": 3}}
        pid = {"pid": sleeper.pid, "pid_start": runs.proc_start(sleeper.pid), "attempt_started_at": time.time()}
        runs.update(run_dir, status=Status.RUNNING, launch_id="L1", command=command, step=0, **pid)
        assert lifecycle.wait_started(run_dir, "L1", timeout=0.3, settle_s=3600)["waited"] == "timeout"
        assert lifecycle.wait_started(run_dir, "L1", timeout=30, settle_s=0)["waited"] == "done"
        ended = subprocess.Popen(["true"])
        ended.wait()  # its process gone, the status not yet changed (its supervisor ends what it left): no start
        runs.update(run_dir, pid=ended.pid, launcher_pid=sleeper.pid, launcher_start=pid["pid_start"])
        assert lifecycle.wait_started(run_dir, "L1", timeout=0.3, settle_s=0)["waited"] == "timeout"
        runs.update(run_dir, **pid)
        runs.new_attempt(run_dir, phase="restarting in 10 s", backoff_until=1e12)
        runs.update(run_dir, launcher_pid=sleeper.pid, launcher_start=pid["pid_start"])  # the supervisor waits
        row = lifecycle.wait_started(run_dir, "L1", timeout=30, settle_s=3600)
        assert (row["waited"], row["status"], row["phase"]) == ("restarting", "starting", "restarting in 10 s")
    finally:
        sleeper.kill()
        sleeper.wait()
    runs.update(run_dir, restarts=2)
    with lifecycle.launching(run_dir, command):
        st = runs.read(run_dir)
        assert st["restarts"] is None and st["backoff_until"] is None  # this launch's supervisor counts its own


def test_server_verbs_answer_one_json_document_even_for_errors(tmp_path):
    env_root = ["--root", str(tmp_path)]
    (tmp_path / "configs" / "runs").mkdir(parents=True)
    for args in (
        ["runs", "--json"],
        ["runs", "nope", "--json"],
        ["fetch-serve", "nope", "--json"],
        ["stop", "nope", "--grace", "nan", "--json"],
        ["check-config", "nope", "--json"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "enlace", *args, *env_root], capture_output=True, text=True, cwd=REPO
        )
        doc = json.loads(out.stdout)  # exactly one document, whatever happened
        if out.returncode:
            assert doc["ok"] is False and doc["exit_code"] == out.returncode == 2 and doc["error"]
            assert "Traceback" not in out.stderr


def test_remote_sh_writes_json_with_any_remote_dir(tmp_path):
    odd = tmp_path / 'we"ird dir\\x'
    out = subprocess.run(
        ["bash", str(REPO / "enlace" / "remote" / "remote.sh"), str(odd), "setup"], capture_output=True, text=True
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"] is True and doc["remote_dir"] == str(odd) and doc["have_tree"] is False
    out = subprocess.run(
        ["bash", str(REPO / "enlace" / "remote" / "remote.sh"), str(odd), "enlace", "latest", "python3", "runs"],
        capture_output=True,
        text=True,
    )
    doc = json.loads(out.stdout)
    assert (
        out.returncode == contract.USAGE
        and "nothing was launched or synced" in doc["error"]
        and doc["kind"] == "not_synced"
        and '"' in doc["error"]
    )


def test_remote_sh_latest_is_the_most_recently_checked_out_tree(tmp_path):
    """`enlace latest ...` (status, logs, fetch name no commit) runs in the tree whose checkout finished
    last, by .enlace-ready's mtime, not by name; a checkout still in progress (.tmp-*) is not a tree."""
    rd = tmp_path / "rd"
    shas = {"old": "a" * 40, "new": "f" * 40, "tmp": ".tmp-" + "b" * 40}
    for age, sha in enumerate(reversed(shas.values())):  # tmp newest, then new, old oldest
        tree = rd / "trees" / sha
        (tree / "enlace").mkdir(parents=True)
        (tree / "enlace" / "__init__.py").touch()  # enlace's own tree (a user's own would run the server half)
        (tree / "enlace" / "__main__.py").write_text("import os; print(os.environ['ENLACE_COMMIT'])\n")
        (tree / ".enlace-ready").touch()
        os.utime(tree / ".enlace-ready", (1e9 - age, 1e9 - age))

    def latest() -> str:
        out = subprocess.run(
            ["bash", str(REPO / "enlace" / "remote" / "remote.sh"), str(rd), "enlace", "latest", sys.executable],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert latest() == shas["new"]
    os.utime(rd / "trees" / shas["old"] / ".enlace-ready", (2e9, 2e9))  # old checked out again, later
    assert latest() == shas["old"]


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
    assert (
        lines[2].strip().startswith("└ error: ConfigError: xxx")
        and "enlace-remote --host gpu1 status smoke" in lines[2]
    )
    assert len(lines[2]) < 180 and max(len(line) for line in lines[:2]) < 120
    assert lines[3].split()[:3] == ["gpu2", "-", "unreachable:"]
    full = format_status(rows[:1], hosts=True, full=True)
    assert "x" * 250 in full


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


def test_a_run_that_wrote_its_final_status_and_is_exiting_is_not_already_running(tmp_path):
    """After a failed launch the trainer may still be exiting: the next launch waits for it instead of
    answering 'already running (status failed)', exit 7."""
    from enlace.contract import Status
    from enlace.server import lifecycle
    from enlace.state import runs

    proc = subprocess.Popen(["sleep", "1.5"])
    run_dir = tmp_path / "r"
    runs.update(run_dir, status=Status.FAILED, pid=proc.pid, pid_start=runs.proc_start(proc.pid), error="boom")
    with lifecycle.launching(run_dir) as (launch_id, _):
        assert proc.poll() is not None and launch_id  # it waited for the exit, then launched
    proc.wait()


def test_runs_table_rounds_loss(project):
    write_run(project, "r", training={"max_steps": 2, "eval_every": 0})
    enlace(project, "train", "r")
    out = enlace(project, "runs").stdout
    loss = out.split("loss ")[1].split()[0]
    assert "finished" in out and len(loss.split(".")[1]) == 4, out


@pytest.mark.parametrize("files", [("pyproject.toml", "constraints.txt"), ("pyproject.toml",)])
def test_the_venv_key_is_the_same_in_bash_and_python(tmp_path, files):
    """enlace/remote/remote.sh names the server venv; gc and the printed Slurm script find it by enlace.hashing's key."""
    import subprocess

    from enlace.hashing import venv_key

    for name in files:
        (tmp_path / name).write_bytes((REPO / name).read_bytes() + name.encode())
    fn = re.search(
        r"^venv_key\(\) \{.*?^\}", (REPO / "enlace" / "remote" / "remote.sh").read_text(), re.S | re.M
    ).group(0)
    bash = subprocess.run(["bash", "-c", f'{fn}\nvenv_key "$1"', "_", str(tmp_path)], capture_output=True, text=True)
    assert bash.stdout.strip() == venv_key(tmp_path) and len(venv_key(tmp_path)) == 16


def test_status_table_says_an_unsupervised_run_a_forced_data_change_and_elapsed_over_starts():
    """The driver's table for what the server's rows now carry: a supervisor gone or frozen (with the command
    that resumes it under a new supervisor), a forced data push's warning, and ELAPSED over every start with this start's beside it."""
    from orchestrator.view.status import format_status

    row = {"run_name": "r", "status": "running", "step": 3, "max_steps": 10, "loss": None, "tokens_per_s": None}
    row |= {"elapsed_s": 125.0, "start_elapsed_s": 5.0, "eta_s": None, "updated_at": None, "commit": "abc"}
    row |= {"supervisor": {"state": "gone", "since": 0.0}, "data_warning": "its data was changed by a data push"}
    lines = format_status([row]).splitlines()
    assert lines[1].split()[:3] == ["r", "running,", "unsupervised"] and "2m05s (0m05s this start)" in lines[1]
    assert (
        "supervisor gone since" in lines[2] and "enlace-remote launch r resumes it under a new supervisor" in lines[2]
    ), lines
    assert "warning: its data was changed by a data push" in lines[3], lines
    alone = format_status([{**row, "supervisor": None, "data_warning": None, "elapsed_s": 5.0}]).splitlines()
    assert len(alone) == 2 and "unsupervised" not in alone[1] and "this start" not in alone[1]
    queued = {**row, "supervisor": None, "data_warning": None, "status": "stopped", "step": 0}
    queued |= {"phase": "stopped while queued: it never started"}
    assert format_status([queued]).count("stopped while queued") == 1  # enlace's trainer's run: its own line
    own = format_status([{**queued, "command": ["python", "t.py"]}])  # a command's: on its command line, once
    killed = {
        **queued,
        "command": ["python", "t.py"],
        "phase": "killed by stop --kill",
        "error": "killed by stop --kill",
    }
    assert format_status([killed]).count("killed by stop --kill") == 1, format_status([killed])  # (it said it twice)
    gave_up = "gave up after 3 restarts: the command exited 1: boom"  # a crash's phase and error: said, once
    crashed = format_status([{**killed, "status": "crashed", "phase": gave_up, "error": gave_up}], full=True)
    assert crashed.count(gave_up) == 1 and "command: python t.py" in crashed, crashed  # (it was said nowhere)
    backoff = {
        **queued,
        "status": "starting",
        "phase": "restarting in 30 s (restart 2 of 3) after: the command exited 1",
    }
    assert (
        format_status([backoff]).splitlines()[2]
        == "    └ restarting in 30 s (restart 2 of 3) after: the command exited 1"
    )
    assert own.count("stopped while queued") == 1 and "stopped while queued: it never started — python" in own


def test_status_table_gets_a_val_loss_column_once_a_script_logs_a_val_loss_without_bpb():
    from orchestrator.view.status import format_status

    base = {"status": "finished", "step": 3, "max_steps": None, "loss": 0.5, "tokens_per_s": None, "eta_s": None}
    base |= {"elapsed_s": 5.0, "updated_at": None, "commit": "abc"}
    trainer = {**base, "run_name": "tiny", "val_bpb": 2.0, "val_loss": 1.3863}
    assert "VAL LOSS" not in format_status([trainer])  # bits per byte say it: no second column
    script = {**base, "run_name": "mine", "val_bpb": None, "val_loss": 0.25, "command": ["python", "t.py"]}
    head, first, second = format_status([trainer, script]).splitlines()[:3]
    assert head.split()[4:9] == ["VAL", "BPB", "VAL", "LOSS", "TOK/S"]
    assert first.split()[4:6] == ["2.000", "1.3863"] and second.split()[4:6] == ["-", "0.2500"], (first, second)


def test_a_stops_default_grace_is_sized_from_the_runs_own_checkpoint_save():
    """stop waits by default three of the run's last saves plus a minute (at least 120 s, at most a day): a
    large model's save outlasted the fixed 120 s, and the stop then said "still running"."""
    from enlace.server.lifecycle import default_grace

    assert default_grace({}) == 120.0  # no save recorded yet
    assert default_grace({"last_save_s": 2.5}) == 120.0
    assert default_grace({"last_save_s": 100}) == 360.0
    assert default_grace({"last_save_s": 1e6}) == 86400.0
    own = {"command": {"supervise": {"grace": 300}}}  # its supervisor SIGKILLs the command after 300 s
    assert default_grace(own) == 330.0 and default_grace({**own, "last_save_s": 200}) == 660.0


def test_the_line_for_a_run_that_ended_badly_says_its_own_cause_and_no_none():
    from enlace.contract import ended_message

    gave_up = {"run_name": "c", "status": "crashed", "step": 0, "max_steps": None, "latest_checkpoint": None}
    gave_up |= {"error": "gave up after 2 restarts: the command exited 1: RuntimeError: boom", "command": ["t"]}
    adhoc = False  # `launch --name c -- t`: no run file (run.json records the command, not where it came from)
    assert ended_message(gave_up, adhoc).endswith("; `enlace-remote launch c` runs it again")
    failed = {**gave_up, "status": "failed", "error": "the command cannot start: nosuchcmd: not found"}
    assert ended_message(failed, adhoc).endswith("fix the command, then `enlace-remote launch --name c -- COMMAND`")
    assert ended_message(failed).endswith("fix what it says, then `enlace-remote launch c`")  # its run file fixed
    assert ended_message(gave_up) == (
        "c crashed: gave up after 2 restarts: the command exited 1: RuntimeError: boom; `enlace-remote launch c` runs it"
        " again (its `resume:` arguments apply as its run file says)"
    )
    vanished = {"run_name": "t", "status": "crashed", "step": 30, "max_steps": 500, "latest_checkpoint": "step-000025"}
    assert ended_message(vanished) == (
        "t crashed: its process vanished without a final status (killed, OOM killer or reboot); last logged step"
        " 30/500, last complete checkpoint step-000025 — `enlace-remote launch t` resumes from it"
    )
    dropped = {"run_name": "q", "status": "dropped", "step": 0, "max_steps": None, "latest_checkpoint": None}
    assert ended_message({**dropped, "status": "crashed"}).endswith(
        "no checkpoint — `enlace-remote launch q` starts it again"
    )
    failed = {**dropped, "status": "failed", "error": "the train split has 0 bytes", "latest_checkpoint": "step-000050"}
    assert ended_message(failed).endswith(
        "0 bytes; fix what it says, then `enlace-remote launch q` (it resumes from step-000050)"
    )
    corrupt = {
        **failed,
        "error": "the newest checkpoint is unusable: .../step-000050/model.pt: cannot be loaded — "
        "resume from the previous complete checkpoint with --resume checkpoints/step-000040",
    }
    assert ended_message(corrupt).endswith(
        "step-000040; fix what it says, then `enlace-remote launch q`"
    )  # not "from step-000050"
    assert "None" not in ended_message(dropped) and "it never started; no checkpoint" in ended_message(dropped)


def test_launch_of_a_queued_run_says_it_is_queued_not_running():
    from types import SimpleNamespace

    from orchestrator.launch.stages import _running_message

    session = SimpleNamespace(host=SimpleNamespace(name="gpu1"))
    queued = {"run_name": "r", "status": "queued", "phase": "position 2, behind a", "pid": None}
    assert _running_message(session, queued).startswith("r is already queued on gpu1 (queued: position 2, behind a)")
    running = {"run_name": "r", "status": "running", "step": 3, "max_steps": 9, "pid": 7}
    assert _running_message(session, running).startswith("r is already running on gpu1 (running, step 3 of 9")


def test_elapsed_stands_while_a_resumed_run_waits_and_runs_while_it_trains(tmp_path):
    """Seen: `launch` of a stopped run, queued behind others: ELAPSED grew by the minute from the previous
    start's started_at (2m45s, 2m54s, 3m11s) and fell back once it was stopped."""
    import time as clock

    from enlace.state import heartbeat

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    me = {"launcher_pid": os.getpid(), "launcher_start": runs.proc_start(os.getpid())}  # a live waiter: this test
    (run_dir / heartbeat.SUPERVISOR).write_text(f"{clock.time()}\n")
    before = {"started_at": clock.time() - 100, "start_trained_s": 30.0, "trained_before_s": 10.0}
    runs.update(run_dir, status="queued", **me, **before)
    row = runs.observe(run_dir)
    assert row["status"] == "queued" and (row["elapsed_s"], row["start_elapsed_s"]) == (40.0, 30.0), row
    runs.update(run_dir, status="running", pid=os.getpid(), pid_start=runs.proc_start(os.getpid()))
    assert runs.observe(run_dir)["start_elapsed_s"] >= 100  # training: this start's clock runs


def test_a_run_of_one_kind_is_not_taken_over_by_a_launch_of_the_other(tmp_path):
    """`launch --name smoke-cpu -- CMD` replaced a trainer run's run.json with a command's, and `launch smoke-cpu`
    then called the trainer's run finished at `step 0 of None`; the reverse mixes them as well."""
    from enlace.errors import ConfigError
    from enlace.server import lifecycle

    trainer, own = tmp_path / "runs" / "trained", tmp_path / "runs" / "scripted"
    runs.update(trainer, run_name="trained", status=Status.STOPPED, step=55, command=None)
    runs.update(own, run_name="scripted", status=Status.FINISHED, command={"command": ["python", "t.py"]})
    for run_dir, command in ((trainer, {"command": ["python", "-c", "1"]}), (own, None)):
        before = (run_dir / "run.json").read_bytes()
        refused = pytest.raises(ConfigError, match=r"a run of .* here, and this launch starts .* under its name")
        with refused, lifecycle.launching(run_dir, command):
            pass
        assert (run_dir / "run.json").read_bytes() == before
    with lifecycle.launching(trainer, None) as (launch_id, _):  # the same kind goes ahead
        assert runs.read(trainer)["launch_id"] == launch_id
