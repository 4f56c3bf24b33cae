"""The `local` host's transport: the same argv as on a server, run on this machine without SSH."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

from orchestrator.errors import CommandFailed, short
from orchestrator.hosts.resolve import Host
from orchestrator.ssh.duplex import Duplex, ProcessDuplex
from orchestrator.ssh.pump import OnData, pump
from orchestrator.ssh.transport import Result, Transport


class LocalTransport(Transport):
    def __init__(self, host: Host):
        self.host = host

    def _run_once(self, argv: list[str], timeout: float, idempotent: bool) -> Result:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise CommandFailed("local", short(argv), -1, f"timed out after {timeout}s\n{e.stdout or ''}") from None
        if p.returncode in (-signal.SIGINT, 128 + signal.SIGINT):  # our Ctrl-C reached it too (one process group)
            raise KeyboardInterrupt  # (it was said as "`enlace runs` exited -2" before the verb's own word on it)
        return Result(p.stdout, p.stderr, p.returncode)

    def stream(self, argv: list[str], on_stdout: OnData, on_stderr: OnData, stall_timeout: float) -> int:
        # Its own session (a server-side `killpg` never reaches us); stdin a pipe we never write, which
        # closes when this process dies, however it dies.
        with subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        ) as p:
            try:
                return pump(p, on_stdout, on_stderr, None, short(argv))
            finally:
                if p.poll() is None:
                    p.kill()

    def duplex(self, argv: list[str], stall_timeout: float, tick: Callable[[], None], shared: bool = False) -> Duplex:

        return ProcessDuplex(argv, stall_timeout, tick)
