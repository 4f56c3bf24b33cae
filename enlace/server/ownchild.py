"""The supervisor's child when it is the user's own command (enlace/config/command.py), not enlace's trainer
(enlace/server/trainerchild.py has that one, and the interface both give the supervisor). A command records
nothing itself, so this says what it did; it runs in a process group of its own, which every
ending takes whole:

    start       placeholders, the host's python (first on PATH too), the resume arguments once there is
                something to resume from, the contract's environment; recorded as the run's process at once
    stop        SIGTERM to the group (with nproc > 1: to torchrun's ranks, whose own 30 s would cut a long
                save short), SIGKILL to the group once `grace` s have passed
    stall       (only a script that logs steps with enlace.job has a stall clock) its stacks (enlace.job
                registers faulthandler on SIGUSR2), SIGTERM, SIGKILL after the grace
    the end     what its launch left behind (a shell's child, a data loader, a killed torchrun's ranks, each in a
                session of its own: found by the launch's id, enlace/server/launched.py) gets SIGTERM, then SIGKILL
    a start that cannot happen (no such program, not executable) is one line and FAILED, never retried;
                so is exit 2 at the first start before any step (a usage error: argparse's bad argument)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from enlace import contract
from enlace.config.command import CommandRun, expand
from enlace.contract import LAUNCH_ID_ENV, UNLESS_STOPPING, Status
from enlace.data.paths import link_shared_data
from enlace.manifest import latest_checkpoint
from enlace.names import find_root
from enlace.server import launched
from enlace.server.runfiles import last_line
from enlace.state import runs
from enlace.train.checkpoint import start_line

# what a new launch or start of a command clears: a trainer's or an earlier attempt's figures would show
# as this one's, and an old step would start the stall clock before the command logged anything
STALE = {
    k: None
    for k in ("loss", "val_loss", "val_bpb", "max_steps", "tokens", "tokens_per_s", "resumed_from", "start_step")
}
STALE["step"] = 0  # no step yet (the stall clock starts at the first one enlace.job logs)


def afresh(run_dir: Path, launch_id: str) -> dict | None:
    """A command launched with --resume none: its checkpoints (enlace.job's) and metrics.jsonl go aside, as the
    trainer's explicit --resume sets a line aside (never deleted; gc lists them), so that enlace.job.resume_from()
    finds none. It resumed from the newest one, whatever the commit or the arguments. Returns run.json's
    `set_aside` ({launch_id, path}), or None when there was nothing to set aside."""
    moved = start_line(run_dir / "checkpoints", None)
    if moved is None:
        return None
    what = "checkpoints, metrics.jsonl" if any(p.is_dir() for p in moved.iterdir()) else "metrics.jsonl"
    return {"launch_id": launch_id, "path": str(moved.relative_to(run_dir.parent.parent)), "what": what}


USAGE_EXIT = 2  # argparse's (and bash's, and python's for a missing script) exit for a command line it refuses
USAGE_WINDOW_S = 300.0  # ...within this much of the first start (imports, then argparse); later, a crash


def _json_or_none(line: bytes):
    try:
        return json.loads(line)
    except ValueError:
        return None


class CannotStart(Exception):
    """The command could not be started at all (not found, not executable): a retry cannot fix that."""


class CommandChild:
    what = "the command"
    records_itself = False  # what it did is said here, in run.json and train.log
    resumes = ""  # a command resumes its own way (its `resume:` arguments)

    def __init__(
        self,
        command: CommandRun,
        run_dir: Path,
        env: dict[str, str],
        say: Callable[[str], None],
        beat: Callable[[], None] = lambda: None,
    ):
        self.command, self.run_dir, self.env, self.say, self.beat = command, run_dir, env, say, beat
        self.proc: subprocess.Popen | None = None
        self.term_at: float | None = None
        self.killed = False
        self.log_from = 0  # train.log's size when this attempt started
        self.started = time.monotonic()  # when this attempt started

    @property
    def grace(self) -> float:
        return self.command.supervise.grace

    def start(self, restart: int, fds: tuple[int, ...]) -> subprocess.Popen:
        try:
            link_shared_data(find_root(None))  # pushed data, where a repository that tracks data/ looks for it
        except OSError as e:  # a tracked file where a link would go, a race with a verify: said, not fatal
            self.say(f"could not link the shared data into the tree: {e}")
        argv, resumes = self.command.attempt(self.run_dir, restart)
        values = self.command.values(self.run_dir, restart)
        newest = latest_checkpoint(self.run_dir / "checkpoints")
        bindir = os.path.dirname(sys.executable)  # the host's python's tools (torchrun, accelerate) come first
        env = {
            **self.env,
            "PATH": os.pathsep.join(p for p in (bindir, self.env.get("PATH", "")) if p),
            **{k: expand(v, values) for k, v in self.command.env.items()},
            "ENLACE_RUN_NAME": self.command.run_name,
            "ENLACE_RUN_DIR": str(self.run_dir.resolve()),
            "ENLACE_RESTART": str(restart),
            "ENLACE_RESUME_FROM": str(newest.resolve()) if newest else "",
        }
        self.say(f"starting the command{' (resuming)' if resumes else ''}: {shlex.join(argv)}")
        self.started = time.monotonic()
        with contextlib.suppress(FileNotFoundError):  # where this attempt's words begin (last_words)
            self.log_from = (self.run_dir / "train.log").stat().st_size
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, pass_fds=fds, **group)
        except OSError as e:
            raise CannotStart(f"cannot start {argv[0]!r}: {e.strerror or e} — check the command's first word") from None
        self.term_at, self.killed = None, False
        first = {} if runs.read(self.run_dir).get("started_at") else {"started_at": time.time()}
        runs.transition(
            self.run_dir,
            Status.RUNNING,
            UNLESS_STOPPING,
            pid=self.proc.pid,
            pid_start=runs.proc_start(self.proc.pid),
            phase="running the command",
            attempt_argv=argv,
            attempt_started_at=time.time(),  # this attempt's start by this clock (pid_start: psutil's, whole-second boot)
            **STALE,
            **first,
        )
        return self.proc

    def ask_to_stop(self) -> None:
        """SIGTERM to what runs; the grace starts now (tick() ends it with SIGKILL)."""
        import psutil

        self.term_at = time.monotonic()
        ranks = []
        if self.command.nproc > 1:  # torchrun would SIGKILL its ranks 30 s after its own SIGTERM
            with contextlib.suppress(psutil.NoSuchProcess):
                ranks = psutil.Process(self.proc.pid).children()
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.send_signal(signal.SIGTERM)
        if not ranks:
            self._group(signal.SIGTERM)

    def tick(self) -> None:
        """While it runs: SIGKILL to the group once the grace after a SIGTERM is over."""
        if self.term_at is not None and time.monotonic() - self.term_at > self.grace:
            left = launched.processes_of(self.env.get(LAUNCH_ID_ENV))  # before their parents die (launched.py)
            self._group(signal.SIGKILL)  # and the rest of the launch: torchrun's ranks lead sessions of their own
            launched.send(left, signal.SIGKILL)
            self.term_at, self.killed = None, True

    def end_stalled(self, stall_s: float, st: dict) -> None:
        step = st.get("step")
        self.say(f"no sign of life for {stall_s:.0f} s at step {step}: its stacks follow (enlace.job's faulthandler)")
        if self.command.nproc == 1:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)  # the dump is written by a C handler at once: this only orders the log lines
        self.ask_to_stop()

    def reap(self) -> None:
        """After the group's leader ended: what the launch left running (its group, torchrun's ranks in sessions of
        their own and what they started) gets SIGTERM, then SIGKILL after the grace."""
        launch = self.env.get(LAUNCH_ID_ENV)
        left = launched.processes_of(launch)
        if not self._group(signal.SIGTERM) and not left:
            return
        launched.send(launched.roots(left), signal.SIGTERM)  # (a rank's data loader workers: the rank ends them)
        self.say("processes the command started outlived it: SIGTERM to what is left")
        deadline = time.monotonic() + self.grace
        while (self._group(0) or left) and time.monotonic() < deadline:
            if left:
                launched.wait(left, 1.0, self.beat)
            else:  # (its group alone is left)
                self.beat()
                time.sleep(1.0)
            left = launched.processes_of(launch)  # (and what they started meanwhile)
        if self._group(signal.SIGKILL) | bool(launched.kill_all(launch, self.beat)):
            self.say(f"what was left did not end within {self.grace:g} s: killed (SIGKILL)")

    def _group(self, signum: int) -> bool:
        """Signal the command's process group; False when it is gone."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:  # a zombie leader of a group that is otherwise gone (macOS)
            return False
        return True

    def record_end(self, code: int, stalled: bool, stopped: bool) -> None:
        """run.json once it ended: stopped (and how), finished (exit 0), or its exit code (the supervisor then
        restarts it or gives up)."""
        self._catch_up()
        if stopped:
            how = (
                f"did not end within {self.grace:g} s of SIGTERM: killed (SIGKILL)"
                if self.killed
                else f"was ended by {signal.Signals(-code).name}"  # a script that handles no signal
                if code < 0
                else f"exited {code} after SIGTERM"
            )
            self.say(f"stopped: the command {how}")
            runs.update(self.run_dir, status=Status.STOPPED, exit_code=code, phase=f"stopped: the command {how}")
        elif code == 0 and not stalled:
            self.say("the command exited 0: finished")
            runs.update(self.run_dir, status=Status.FINISHED, exit_code=0, phase="finished: the command exited 0")
        else:
            runs.update(self.run_dir, exit_code=code)

    def _catch_up(self) -> None:
        """The step (and figures) enlace.job logged in this attempt after its last write to run.json, which it
        writes at most once a second: a kill or a stall left run.json behind ("killed at step 10" where it had
        logged 13). From metrics.jsonl's last line."""
        st = runs.read(self.run_dir)
        try:
            with open(self.run_dir / "metrics.jsonl", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().splitlines()
        except OSError:  # none
            return
        last = next((doc for doc in map(_json_or_none, reversed(tail)) if doc is not None), None)  # (a kill cuts one)
        if not isinstance(last, dict) or not isinstance(last.get("time"), (int, float)):
            return  # (a script may write its own metrics.jsonl there, in its own form)
        mine = last["time"] >= (st.get("attempt_started_at") or 0)
        if mine and isinstance(last.get("step"), int) and last["step"] > (st.get("step") or 0):
            shown = {k: last[k] for k in ("loss", "val_loss", "val_bpb", "tokens_per_s") if k in last}
            runs.update(self.run_dir, step=last["step"], **shown)

    def last_words(self) -> str:
        """The last line this attempt of the command wrote ("" if none): what a crash or a usage error quotes."""
        return last_line(self.run_dir, child_only=True, since=self.log_from)

    def usage_error(self, code: int, restart: int, st: dict) -> str | None:
        """Exit 2 early in a launch's first start (before any restart of this supervisor's, before any step): the
        command's arguments are wrong (argparse's exit for an unknown or missing argument, python's for a
        script it cannot open). A restart would repeat it, and a sweep's mistyped `--set args.NAME` would hold
        its slots for minutes of backoff. Later (a wrapper's `grep` that exits 2 hours in), it is a crash like
        any other. Under torchrun (nproc > 1) a rank's exit 2 reaches here as torchrun's 1: a crash."""
        took = time.monotonic() - self.started
        if code != USAGE_EXIT or restart or st.get("step") or took > USAGE_WINDOW_S:
            return None
        said = self.last_words() or "(it wrote nothing)"
        return (  # its own words first: a table's detail line shows the first hundred characters
            f"{said} — the command exited {code} {took:.0f} s after this launch started it: a usage error (argparse's, for "
            "an unknown or missing argument), so it is not restarted — fix its arguments (a --set only adds to the "
            "command: the run file's `command:`, or the command given anew with `launch --name NAME -- …`; a sweep's: "
            "sweep again under another --name)"
        )

    def record_cannot_start(self, why: str) -> None:
        self.say(why)
        runs.update(self.run_dir, status=Status.FAILED, exit_code=contract.FAILED, error=why)
