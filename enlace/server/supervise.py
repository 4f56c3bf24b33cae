"""The supervisor: the detached process `launch` starts. It runs the trainer (or torchrun) as its child,
outlives it, and heals the run without anyone watching:

    the child ends with a final status (finished, stopped)    done
    the child fails with one of enlace's own verdicts         done, not retried: a config or checkpoint
      (exit 2 config/checkpoint, 3, 7, 9 disk full)            error, full disk — a retry cannot fix them
    the child dies without a final status (a signal, the OOM  wait (backoff: B, 3B, 9B s), start it again
      killer), or fails with an exception (exit 1: a CUDA or  from the newest complete checkpoint; up to
      NCCL error)                                               `restarts` times, then `crashed`, "gave up"
    no sign of life for `stall_timeout` s once it has       its Python stacks into train.log (SIGUSR2:
      trained: no new step and no heartbeat (a hung            faulthandler), SIGTERM, SIGKILL after the
      collective, a dead mount)                                grace, and a restart as above
    whatever way it ended, what it left running (a killed     ended first (the child's reap): found by the
      torchrun's ranks, a command's children)                  launch's id (enlace/server/launched.py)
    SIGTERM to the supervisor (`stop`)                        one SIGTERM to the child; never restarted
    a queued run (enlace/server/queue.py)                     first waits for its turn (status `queued`),
                                                              then holds its GPUs or CPU slot through every
                                                              restart; the child inherits the locks

The trainer beats a heartbeat (enlace/state/heartbeat.py) on every step, eval batch and checkpoint: the
stall clock measures silence, not the absence of new steps, and a finished run is final whatever it thought.
The stall timeout, unless given, is derived from what the run shows: ten times the longest silence so far,
never under MIN_STALL_S. The supervisor beats its own heartbeat while it watches (status tells a supervisor
that is gone or frozen). The time to the
first step (imports, compile, data scan) is never a stall. Each restart is a `supervisor:` line in
train.log and counted in run.json (`restarts`). On Slurm the batch step (enlace/slurm/job.py) is this
supervisor with the time-limit signal and the requeue added. Stdlib and psutil only (no torch).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enlace import contract
from enlace.config.command import CommandRun
from enlace.contract import ACTIVE, ENDED_CLEANLY, Status
from enlace.manifest import latest_checkpoint
from enlace.server.ownchild import CannotStart, CommandChild
from enlace.server.queue import Seat
from enlace.server.runfiles import last_line, supervisor_line
from enlace.server.trainerchild import TrainerChild
from enlace.state import heartbeat, runs

# a retry cannot fix these: a config or checkpoint error, something missing, a disk full, the device's memory
NOT_RETRIED = frozenset({contract.USAGE, contract.VERIFY, contract.ALREADY_RUNNING, contract.NO_SPACE, contract.OOM})
MIN_STALL_S = 300.0  # a derived stall timeout is never shorter (evals, checkpoints, a slow filesystem)


def say(line: str) -> None:
    """A line in train.log (the supervisor's stdout is train.log), stamped like the trainer's."""
    print(supervisor_line(line), flush=True)


@dataclass
class Policy:
    restarts: int = contract.RESTARTS
    stall_timeout: float | None = None  # None: derived (see the module's docstring)
    backoff: float = contract.BACKOFF_S  # the first wait before a restart; each next one is 3x longer


@dataclass
class Outcome:
    """How the supervised run ended: its status in run.json, the child's exit code, and why."""

    status: Status
    exit_code: int
    why: str = ""
    signalled: set[str] = field(default_factory=set)  # "term", "limit": what the supervisor was told


class Supervisor:
    """Runs `argv` for the run in `run_dir` until it ends for good (see the module's docstring).

    `signals`: extra signals that ask the run to stop and not be restarted (Slurm's USR1 at the time
    limit), each mapped to the name it is reported under; SIGTERM is always one ("term")."""

    def __init__(
        self,
        run_dir: Path,
        argv: list[str],
        policy: Policy,
        env: dict[str, str],
        signals: dict[int, str] | None = None,
        on_stop: Callable[[str], None] = lambda name: None,
        poll: float = 0.2,
        wait_turn: Callable[..., Seat | None] | None = None,
        command: CommandRun | None = None,
    ):
        self.run_dir, self.policy, self.env, self.poll = run_dir, policy, env, poll
        self.beat = heartbeat.Heartbeat(run_dir / heartbeat.SUPERVISOR)  # status tells a gone or frozen one
        # what it runs: enlace's trainer, or a user's own command (enlace/config/command.py), behind one interface
        self.child: TrainerChild | CommandChild = (
            CommandChild(command, run_dir, env, say, self.beat)
            if command
            else TrainerChild(argv, env, say, self.beat, poll, run_dir)
        )
        self.restarts = 0
        self.wait_turn = wait_turn  # the server's queue (queue.wait_for_seat, its run and need bound); None: none
        self.seat: Seat | None = None
        self.signals = {signal.SIGTERM: "term", **(signals or {})}
        self.on_stop = on_stop
        self.got: set[str] = set()
        self._stall_s = 0.0
        self.launch_id = env.get(contract.LAUNCH_ID_ENV)  # the launch it serves: a later one owns the run

    def on_signal(self, signum, frame) -> None:
        self.got.add(self.signals[signum])

    def run(self) -> Outcome:
        for s in self.signals:
            signal.signal(s, self.on_signal)
        if self.wait_turn is not None and not self._take_seat():
            say("stopped while queued: it never started")
            runs.update(self.run_dir, status=Status.STOPPED, phase="stopped while queued: it never started")
            return Outcome(Status.STOPPED, 0, "stopped", set(self.got))
        restarts = 0
        while True:
            self.restarts = restarts
            try:
                code, stalled = self._run_child()
            except CannotStart as e:  # the command's program is not there: no retry can change that
                self.child.record_cannot_start(str(e))
                return Outcome(Status.FAILED, contract.FAILED, str(e))
            self.child.reap()  # what the child left behind (a command's group; a killed torchrun's ranks)
            if self._owns_the_run():
                self.child.record_end(code, stalled, bool(self.got))  # a command's ending (a trainer wrote its own)
            st = runs.read(self.run_dir)
            if not self._owns_the_run():
                # frozen while another launch took the run over: this supervisor's trainer is history
                return Outcome(runs.recorded_status(st), code, "another launch owns the run now")
            status = runs.recorded_status(st)  # what the trainer wrote last (none: it died without a word)
            if self.got:  # a stop (or Slurm's limit): what the trainer did with it is the outcome
                return Outcome(status, code, "stopped", set(self.got))
            if status == Status.FINISHED or ((status in ENDED_CLEANLY or code == 0) and not stalled):
                # a finished run is final whatever the stall clock thought; a clean exit is no crash (a rank-1
                # host of a multi-host run records no status of its own); a trainer that stopped because the
                # stall clock asked it to is restarted: nobody asked the run to stop
                return Outcome(status, 0)
            verdict = self.child.records_itself  # the trainer's own codes (a command's exit codes are its own)
            if verdict and status == Status.FAILED and st.get("exit_code") in NOT_RETRIED:
                return Outcome(status, st["exit_code"], "not retried: a retry cannot fix it")
            if verdict and code in NOT_RETRIED:  # refused before it could record why (config error)
                runs.update(self.run_dir, status=Status.FAILED, exit_code=code, error=last_line(self.run_dir))
                return Outcome(Status.FAILED, code, "not retried: a retry cannot fix it")
            if (usage := self.child.usage_error(code, restarts, st)) is not None:  # a command's bad arguments
                say(usage)
                runs.update(
                    self.run_dir, status=Status.FAILED, exit_code=code, error=usage, phase="failed: a usage error"
                )
                return Outcome(Status.FAILED, code, "not retried: a usage error")
            cause = self._cause(code, stalled, st)
            if restarts >= self.policy.restarts:
                why = (
                    f"gave up after {restarts} restart{'s' if restarts != 1 else ''}: {cause}"
                    if self.policy.restarts
                    else f"{cause} (not restarted: restarts is 0)"
                )
                say(why)
                runs.update(self.run_dir, status=Status.CRASHED, error=why, exit_code=contract.CRASHED, phase=why)
                return Outcome(Status.CRASHED, contract.CRASHED, why)
            restarts += 1
            wait = self.policy.backoff * 3 ** (restarts - 1)
            say(f"{cause}; restart {restarts} of {self.policy.restarts} in {wait:g} s{self.child.resumes}")
            at = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))  # the server's clock
            phase = f"restarting in {wait:g} s, at {at} (restart {restarts} of {self.policy.restarts}) after: {cause}"
            runs.new_attempt(self.run_dir, phase=phase, backoff_until=time.time() + wait)
            if self._sleep(wait):  # the restart never happened: it is not counted (train.log says so: it promised one)
                say("stopped while waiting to restart: the restart does not happen")
                runs.update(
                    self.run_dir, status=Status.STOPPED, phase="stopped while waiting to restart", backoff_until=None
                )
                return Outcome(Status.STOPPED, 0, "stopped", set(self.got))
            runs.update(self.run_dir, restarts=restarts, backoff_until=None)

    def _owns_the_run(self) -> bool:
        """Whether the run is still this launch's (a supervisor frozen while another launch took it over is not)."""
        return not self.launch_id or runs.read(self.run_dir).get("launch_id") in (None, self.launch_id)

    def _take_seat(self) -> bool:
        """Wait in the queue for the run's GPUs (or CPU slot); False if a stop came first."""
        with self.beat.beating():  # a turn may block a while (the queue's lock, nvidia-smi): never "frozen" meanwhile
            self.seat = self.wait_turn(stopped=lambda: bool(self.got), beat=lambda: None, on_wait=self._queued)
        if self.seat is not None and (self.got or runs.recorded_status(runs.read(self.run_dir)) == Status.STOPPING):
            self.seat.release()  # a stop came as its turn did: it never starts
            self.seat = None
        if self.seat is None:
            return False
        self.env.update(self.seat.env())
        where = f"GPU {','.join(map(str, self.seat.gpus))}" if self.seat.gpus else "its CPU slot"
        seated = {"gpus": self.seat.gpus, "seated_at": time.time()}
        if runs.transition(self.run_dir, Status.STARTING, frozenset({Status.QUEUED}), phase="starting", **seated):
            say(f"its turn came: starting on {where}")
        else:
            runs.update(self.run_dir, **seated)
        return True

    def _queued(self, why: str) -> None:
        say(f"queued: {why}")
        runs.transition(self.run_dir, Status.QUEUED, frozenset({Status.STARTING, Status.QUEUED}), phase=why)

    def _cause(self, code: int, stalled: bool, st: dict) -> str:
        where = f"at step {st.get('step', 0)} (newest checkpoint {self._newest()})"
        what = self.child.what
        if not self.child.records_itself:
            where = where if st.get("step") else ""
            # its last words, not run.json's error (that is the previous attempt's cause)
            st = {**st, "error": self.child.last_words() if code > 0 else None}
        if stalled:
            return f"{what} stalled {where}: no sign of life for {self._stall_s:.0f} s"
        if code < 0:
            return f"{what} was killed by {signal.Signals(-code).name} {where}".rstrip()
        return f"{what} exited {code} {where}".rstrip() + (f": {st['error']}" if st.get("error") else "")

    def _newest(self) -> str:

        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        return ckpt.name if ckpt else "none"

    def _sleep(self, seconds: float) -> bool:
        """Wait `seconds`; True if a stop came meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.got:
                return True
            self.beat()
            time.sleep(self.poll)
        return bool(self.got)

    def _run_child(self) -> tuple[int, bool]:
        """Start the child and watch it; (its exit code, whether it was ended for a stall)."""
        # in the supervisor's own process group: `stop --kill` (killpg) ends the trainer with it
        # the seat's lock files go to the child: a run holds its GPUs for as long as its supervisor or its trainer lives
        proc = self.child.start(self.restarts, self.seat.fds if self.seat else ())
        forwarded, stalled = False, False
        last_sign, last_change, longest_gap = None, time.monotonic(), 0.0
        trainer_beat = self.run_dir / heartbeat.TRAINER
        while (code := proc.poll()) is None:
            self.beat()
            st = runs.read(self.run_dir)
            self.child.tick()  # a command: SIGKILL once a stop's grace is over
            if self.got and not forwarded and (st.get("pid") or st.get("status") not in ACTIVE):
                # one SIGTERM, once the trainer has recorded itself (its handler is in place by then)
                self.on_stop(sorted(self.got)[0])
                self.child.ask_to_stop()
                forwarded = True
            # a sign of life: a new step, or the trainer's heartbeat (steps, eval batches, checkpoints)
            step, now = st.get("step"), time.monotonic()
            if st.get("status") == Status.RUNNING and step:
                sign = (step, heartbeat.last(trainer_beat))
                if sign != last_sign:
                    if last_sign is not None:
                        longest_gap = max(longest_gap, now - last_change)
                    last_sign, last_change = sign, now
                elif not forwarded and now - last_change > self._stall_after(longest_gap):
                    self.child.end_stalled(self._stall_s, st)
                    stalled = forwarded = True
            time.sleep(self.poll)
        return code, stalled

    def _stall_after(self, longest_gap: float) -> float:
        self._stall_s = self.policy.stall_timeout or max(MIN_STALL_S, 10 * longest_gap)
        return self._stall_s


def exit_code(outcome: Outcome) -> int:
    """The supervisor's own exit code: 0 when the run ended cleanly, else the contract's code for it."""
    return 0 if outcome.status in ENDED_CLEANLY else (outcome.exit_code or contract.FAILED)
