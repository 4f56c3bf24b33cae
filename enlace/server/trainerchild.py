"""The supervisor's child when it is enlace's own trainer (or torchrun over it); enlace/server/ownchild.py is
the other kind, a user's command. Both give the supervisor one interface: start, tick, ask_to_stop,
end_stalled, reap, record_end, and what to call the child in train.log. The trainer records its own status,
steps and errors in run.json, so ending it is the supervisor's only part:

    stop        one SIGTERM to the trainer; under torchrun to its ranks themselves (torchrun, signalled,
                SIGKILLs them 30 s later whatever their last checkpoint needs)
    stall       its Python stacks into train.log (SIGUSR2: the faulthandler it registers), SIGTERM, SIGKILL
                of all it started after TERM_GRACE_S
    crash       what it left running (torchrun's ranks, when torchrun itself was killed) SIGKILL, before
                the restart starts ranks of its own
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enlace.contract import LAUNCH_ID_ENV
from enlace.server import launched
from enlace.state import runs

TERM_GRACE_S = 60.0  # after SIGTERM to a stalled trainer, SIGKILL
LEFT_GRACE_S = 5.0  # what the trainer started gets this long to end by itself once the trainer has ended


def from_newest(argv: list[str]) -> list[str]:
    """The trainer's command line without its --resume: the trainer's default, the newest checkpoint."""
    out, given = [], iter(argv)
    for arg in given:
        if arg == "--resume":
            next(given, None)
        elif not arg.startswith("--resume="):
            out.append(arg)
    return out


def again_argv(argv: list[str], run_dir: Path, launch_id: str | None) -> list[str]:
    """The trainer's command line for a restart or a requeue. A launch's explicit --resume (none, a checkpoint)
    is where that launch began; once its trainer has started that line (run.json's `line_of` is this launch:
    enlace/train/checkpoint.py start_line), every later start resumes from the line's newest checkpoint.
    Before that (it failed sooner), the --resume stands. Seen: --resume none restarted from step 0."""
    started = bool(launch_id) and runs.read(run_dir).get("line_of") == launch_id
    return from_newest(argv) if started else argv


class TrainerChild:
    what = "the trainer"
    records_itself = True  # its final status and its verdicts (config error, disk full) are in run.json
    resumes = ", from the newest checkpoint"  # how a restart continues, as train.log says it

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        say: Callable[[str], None],
        beat: Callable[[], None],
        poll: float,
        run_dir: Path,
    ):
        self.argv, self.env, self.say, self.beat, self.poll, self.run_dir = argv, env, say, beat, poll, run_dir
        self.proc: subprocess.Popen | None = None

    def start(self, restart: int, fds: tuple[int, ...]) -> subprocess.Popen:
        argv = again_argv(self.argv, self.run_dir, self.env.get(LAUNCH_ID_ENV)) if restart else self.argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=self.env, pass_fds=fds)
        return self.proc

    def tick(self) -> None:
        pass  # a stop's grace is the trainer's own (it saves, then exits)

    def ask_to_stop(self) -> None:
        """One SIGTERM to what trains: torchrun's ranks themselves, which end torchrun cleanly as they end."""
        import psutil

        ranks = []
        if self.argv[1:3] == ["-m", "torch.distributed.run"]:  # torchrun itself is the child (not srun's)
            with contextlib.suppress(psutil.NoSuchProcess):
                ranks = psutil.Process(self.proc.pid).children()
        if not ranks:
            self.proc.send_signal(signal.SIGTERM)
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.send_signal(signal.SIGTERM)

    def end_stalled(self, stall_s: float, st: dict[str, Any]) -> None:
        """Stacks into train.log, then SIGTERM, then SIGKILL of the child and all it started after the grace."""
        import psutil

        self.say(f"no sign of life for {stall_s:.0f} s at step {st.get('step')}: the trainer's stacks follow")
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        trainers = [p for p in tree if p.pid == st.get("pid")] or tree[1:] or tree  # torchrun: its ranks
        for proc in trainers:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGUSR2)  # faulthandler, registered by the trainer
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)  # a stopped process handles it once continued
        self._watch(1.0)  # the dump is written by a C handler at once; this only orders the log lines
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        if not self._watch(TERM_GRACE_S):
            for proc in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            self.proc.wait()

    def _watch(self, seconds: float) -> bool:
        """Wait up to `seconds` for the child to end, beating meanwhile; True if it ended."""
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.beat()
            time.sleep(min(self.poll, 0.2))
        return self.proc.poll() is not None

    def reap(self) -> None:
        """What the trainer's launch left running once the trainer ended: torchrun killed (SIGKILL, the OOM killer)
        cannot end its ranks, which train on beside the restart's ranks and its checkpoints. After LEFT_GRACE_S
        (torch.compile's workers end on their own) they get SIGKILL, as the crash they belong to: the restart
        resumes from the newest complete checkpoint."""
        launch = self.env.get(LAUNCH_ID_ENV)
        left = launched.wait(launched.processes_of(launch), LEFT_GRACE_S, self.beat)
        if left and (killed := launched.kill_all(launch, self.beat)):
            pids = launched.pids(killed)
            self.say(f"the trainer ended, but processes it started did not (pid {pids}): killed (SIGKILL)")

    def record_end(self, code: int, stalled: bool, stopped: bool) -> None:
        pass  # the trainer wrote its own ending

    def usage_error(self, code: int, restart: int, st: dict[str, Any]) -> str | None:
        return None  # the trainer records its own usage errors (exit 2), which the supervisor never retries

    def record_cannot_start(self, why: str) -> None:
        raise AssertionError("the trainer's own python always starts")  # CannotStart is a command's
