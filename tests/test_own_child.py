"""The supervisor's child when it is the user's own command (enlace/server/ownchild.py), on this machine with
the real `enlace start` and supervisor: a stop's grace and SIGKILL, what a command's process group leaves
behind, a program that cannot start. Commands of a few shell words: no torch, a few seconds each."""

from __future__ import annotations

import json
import time

import psutil
from support.cli import enlace
from support.remote import wait_until

from enlace.state import runs


def _start(project, name: str, command: list[str], restarts: int = 0, **extra) -> None:
    spec = json.dumps({"command": command, "run_name": name, **extra})
    policy = ["--restarts", str(restarts), "--backoff", "0.1"]
    enlace(project, "start", name, "--json", *policy, "--command-spec", spec)


def _ended(project, name: str) -> dict:
    wait_until(lambda: runs.observe(project / "runs" / name)["status"] in ("finished", "stopped", "crashed", "failed"))
    return runs.observe(project / "runs" / name)


def test_a_command_that_ignores_sigterm_is_killed_after_its_grace_and_the_log_says_so(project):
    _start(
        project,
        "stubborn",
        ["bash", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"],
        supervise={"grace": 1},
    )
    log = project / "runs" / "stubborn" / "train.log"
    wait_until(lambda: "ready" in log.read_text() if log.exists() else False)
    t0 = time.monotonic()
    enlace(project, "stop", "stubborn", "--json")
    row = _ended(project, "stubborn")
    assert row["status"] == "stopped" and time.monotonic() - t0 < 60
    assert "stopped: the command did not end within 1 s of SIGTERM: killed (SIGKILL)" in log.read_text()


def test_what_a_command_leaves_behind_in_its_group_is_ended_with_it(project):
    marker = "1234.5"  # a sleep only this test starts
    _start(project, "leaves", ["bash", "-c", f"sleep {marker} & echo started; exit 3"], supervise={"grace": 2})
    row = _ended(project, "leaves")
    assert row["status"] == "crashed" and "the command exited 3" in row["error"], row
    log = (project / "runs" / "leaves" / "train.log").read_text()
    assert "processes the command started outlived it: SIGTERM to what is left" in log, log
    assert not _sleeping(marker)


def _sleeping(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", marker]]


def test_what_a_command_starts_in_a_session_of_its_own_is_ended_with_it_and_by_stop_kill(project):
    """torchrun starts each rank in a session of its own (setsid here), where the group's signals never reach:
    found by the launch's id in its environment. One ends with the command; one, ignoring SIGTERM beside a
    command that does too, by `stop --kill` (it had outlived both)."""
    marker = "1234.6"
    _start(project, "apart", ["bash", "-c", f"setsid sleep {marker} & echo started; exit 3"], supervise={"grace": 2})
    assert _ended(project, "apart")["status"] == "crashed"
    assert not _sleeping(marker)
    marker = "1234.7"
    stubborn = (
        f"setsid bash -c 'trap \"\" TERM; sleep {marker}' & trap '' TERM; echo ready; while :; do sleep 0.1; done"
    )
    _start(project, "apart2", ["bash", "-c", stubborn], supervise={"grace": 600})
    log = project / "runs" / "apart2" / "train.log"
    wait_until(lambda: "ready" in log.read_text() if log.exists() else False)
    wait_until(lambda: bool(_sleeping(marker)), 30, "the sleep in a session of its own")
    out = json.loads(enlace(project, "stop", "apart2", "--kill", "--grace", "1", "--json").stdout)
    assert out["killed"] and out["status"] == "stopped", out
    wait_until(lambda: not _sleeping(marker), 30, "stop --kill to end the sleep in a session of its own")


def test_a_program_that_cannot_start_is_one_line_and_not_retried(project):
    _start(project, "nosuch", ["no-such-program-for-enlace", "--x"])
    row = _ended(project, "nosuch")
    assert row["status"] == "failed" and "cannot start 'no-such-program-for-enlace'" in row["error"], row
    assert not row["restarts"]


ARGPARSE = "import argparse; p = argparse.ArgumentParser(); p.add_argument('--lr'); p.parse_args(); print('training')"


def test_an_unknown_argument_at_the_first_start_is_failed_at_once_with_argparses_words(project):
    """A sweep's mistyped `--set args.NAME` ends in argparse's exit 2: restarting repeats it (and held the
    run's slot through minutes of backoff); the run is failed at once, with argparse's line in its error."""
    _start(project, "typo", ["python", "-c", ARGPARSE, "--learning_rate=0.1"], restarts=3)
    row = _ended(project, "typo")
    assert row["status"] == "failed" and not row["restarts"] and row["phase"] == "failed: a usage error", row
    said = "-c: error: unrecognized arguments: --learning_rate=0.1 — the command exited 2 "
    assert row["error"].startswith(said) and " s after this launch started it: a usage error" in row["error"], row
    log = (project / "runs" / "typo" / "train.log").read_text()
    assert f"supervisor: {said}" in log and "restart 1 of" not in log, log


def test_exit_2_after_a_restart_is_a_crash_and_a_crash_quotes_that_attempts_last_line(project):
    """Only the first start's exit 2 is taken for bad arguments (the same arguments ran once already). Each
    crash quotes the last line its own attempt wrote, never an earlier attempt's."""
    script = {
        0: 'echo "RuntimeError: CUDA error"; exit 1',
        1: "exit 2",  # writes nothing
        2: 'echo "bad"; echo "======"; exit 2',  # a rule (torchrun's report ends in one) is not its words
    }
    cases = " ".join(f"{i}) {body};;" for i, body in script.items())
    _start(project, "later", ["bash", "-c", f'case "$ENLACE_RESTART" in {cases} esac'], restarts=2)
    row = _ended(project, "later")
    assert row["status"] == "crashed" and row["restarts"] == 2, row
    assert row["error"].endswith("gave up after 2 restarts: the command exited 2: bad"), row
    assert row["phase"] == row["error"], row  # not the last backoff's "restarting in ..." (stop quoted that)
    log = (project / "runs" / "later" / "train.log").read_text()
    assert "supervisor: the command exited 1: RuntimeError: CUDA error; restart 1 of 2" in log, log
    assert "supervisor: the command exited 2; restart 2 of 2" in log, log  # its own words: none


def test_exit_2_long_into_the_first_start_or_after_a_step_is_not_taken_for_bad_arguments(tmp_path):
    from enlace.server import ownchild

    child = ownchild.CommandChild.__new__(ownchild.CommandChild)
    child.run_dir, child.log_from, child.started = tmp_path, 0, time.monotonic()
    (tmp_path / "train.log").write_text("usage: t.py [--lr LR]\nt.py: error: unrecognized arguments: --x=1\n")
    assert child.usage_error(2, 0, {}).startswith("t.py: error: unrecognized arguments: --x=1 — the command exited 2")
    assert child.usage_error(1, 0, {}) is None and child.usage_error(2, 1, {}) is None  # another code; a restart
    assert child.usage_error(2, 0, {"step": 3}) is None  # it trained (enlace.job logged a step)
    child.started -= ownchild.USAGE_WINDOW_S + 1  # a wrapper's grep exiting 2 long after the start
    assert child.usage_error(2, 0, {}) is None


def test_a_killed_commands_last_logged_step_reaches_run_json(tmp_path):
    """enlace.job writes run.json at most once a second: a kill at step 13 was said "killed at step 10" (run.json's),
    and status showed 10 where metrics.jsonl had 13. Lines of an earlier attempt do not count."""
    from enlace.server import ownchild

    child = ownchild.CommandChild.__new__(ownchild.CommandChild)
    child.run_dir, child.say = tmp_path, lambda line: None
    started = time.time()
    runs.update(tmp_path, step=10, loss=0.9, attempt_started_at=started)
    lines = [{"kind": "train", "step": s, "time": started + s / 100, "loss": 1 / s} for s in (11, 12, 13)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "tra')  # cut
    child.record_end(-9, False, False)  # (the line the kill cut is passed by)
    assert (runs.read(tmp_path)["step"], runs.read(tmp_path)["loss"]) == (13, 1 / 13)
    runs.update(tmp_path, step=0, attempt_started_at=time.time() + 60)  # a new attempt that logged nothing yet
    child.record_end(-9, False, False)
    assert runs.read(tmp_path)["step"] == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 99, "time": "2024-05-01T12:00:00"}\n')  # a script's own form
    child.record_end(-9, False, False)  # (a str time against a float: the supervisor died of it)
    assert runs.read(tmp_path)["step"] == 0


def test_a_command_whose_supervisor_died_is_stopped_not_crashed_and_what_it_left_is_ended(project):
    """Its supervisor killed: `stop` of a command that ends on SIGTERM read `crashed` (nobody recorded the stop);
    with the command gone too, a child in a session of its own (a rank, a slot's holder) trained on, and `stop`
    said "nothing to stop" of it; a new launch started beside it."""
    import os
    import signal

    _start(project, "orphan", ["bash", "-c", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done"])
    run_dir = project / "runs" / "orphan"
    wait_until(lambda: "ready" in (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else False)
    os.kill(runs.read(run_dir)["launcher_pid"], signal.SIGKILL)
    out = json.loads(enlace(project, "stop", "orphan", "--json").stdout)
    assert out["status"] == "stopped" and "its supervisor was gone" in out["phase"], out

    run_dir = _orphaned(project, "orphan2", "1234.8")
    out = json.loads(enlace(project, "stop", "orphan2", "--json").stdout)
    assert out["was_running"] and out["stopped"] and out["status"] == "stopped" and not _sleeping("1234.8"), out
    assert "processes of its launch are not" in (run_dir / "train.log").read_text()

    run_dir = _orphaned(project, "orphan3", "1234.9")  # then a new launch: what is left does not run beside it
    _start(project, "orphan3", ["bash", "-c", "exit 0"])
    assert (
        not _sleeping("1234.9") and "the previous launch's processes still ran" in (run_dir / "train.log").read_text()
    )


def _orphaned(project, name: str, marker: str):
    """A command that started a sleep in a session of its own, then it and its supervisor SIGKILLed: the sleep is
    all that is left of the run (its run directory)."""
    import os
    import signal

    _start(project, name, ["bash", "-c", f"setsid sleep {marker} & echo ready; while :; do sleep 0.1; done"])
    run_dir = project / "runs" / name
    wait_until(lambda: bool(_sleeping(marker)), 30, "the sleep in a session of its own")
    st = runs.read(run_dir)
    os.kill(st["launcher_pid"], signal.SIGKILL)
    os.kill(st["pid"], signal.SIGKILL)
    wait_until(lambda: not runs.observe(run_dir)["alive"], 30, "the run to read as not alive")
    return run_dir
