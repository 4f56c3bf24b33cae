"""A command we talk to both ways, on the host's one SSH connection or as a local process: we write
its stdin and read its stdout as a byte stream (fetch's wire, enlace/server/fetchserve.py)."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import Transient, short
from orchestrator.ssh.portable import die_with_us, grow_pipe
from orchestrator.ssh.sshexit import remote_command, ssh_failed
from orchestrator.sshlib import load_paramiko

PIPE_BYTES = 1 << 20  # a local process's stdout pipe, and the most one read of it asks for

if TYPE_CHECKING:
    from orchestrator.ssh.transport import SSHTransport


class Duplex:
    """A command we talk to both ways. `read` waits in short slices, calling `tick` between them (the
    caller's Ctrl-C check); no byte for stall_timeout s, or a dropped connection, raises Transient.
    `finish` closes our side and returns the exit code and the stderr text."""

    SLICE_S = 0.5

    def __init__(self, what: str, stall_timeout: float, tick: Callable[[], None]):
        self.what, self.stall_timeout, self.tick = what, stall_timeout, tick

    def read(self, n: int) -> bytes:
        """Up to n bytes of stdout (what has arrived, so often fewer); b"" at its end."""
        quiet_since = time.monotonic()
        while True:
            self.tick()
            chunk = self._read_slice(n)
            if chunk is not None:
                return chunk
            if time.monotonic() - quiet_since > self.stall_timeout:
                raise Transient(f"{self.what}: no data for {self.stall_timeout:g}s", started=True)

    def _read_slice(self, n: int) -> bytes | None:
        """Bytes, b"" at the end, or None when nothing came within SLICE_S."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def finish(self) -> tuple[int, str]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Duplex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProcessDuplex(Duplex):
    """A local process (the `local` host). Its own session (our Ctrl-C is ours to handle), dying with us,
    its stdout a 1 MiB pipe where the system allows (fewer, larger reads for fetch)."""

    def __init__(self, argv: list[str], stall_timeout: float, tick: Callable[[], None], what: str = ""):
        super().__init__(what or short(argv), stall_timeout, tick)
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            start_new_session=True,
            preexec_fn=die_with_us(),  # noqa: PLW1509 - the parent-death signal, Linux only (orchestrator/ssh/portable.py)
        )
        grow_pipe(self.p.stdout.fileno(), PIPE_BYTES)
        grow_pipe(self.p.stdin.fileno(), PIPE_BYTES)  # and its stdin (data push writes it)

    def _read_slice(self, n: int) -> bytes | None:
        ready, _, _ = select.select([self.p.stdout], [], [], self.SLICE_S)
        # os.read allocates all it asks for: never more than the pipe holds
        return os.read(self.p.stdout.fileno(), min(n, PIPE_BYTES)) if ready else None

    def write(self, data: bytes) -> None:
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except (BrokenPipeError, ConnectionResetError):  # it ended (a dropped connection, or it refused)
            raise Transient(f"{self.what}: the other side stopped reading", started=True) from None

    def finish(self) -> tuple[int, str]:
        # a write the other side cut short leaves its rest in stdin's buffer, which close() flushes: it stopped
        # reading (its answer says why), so the rest is dropped. Uncaught, click read the EPIPE as `| head`
        # ending early and exited 1 without a word (seen: a data push to a full disk)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.p.stdin.close()  # the pipe is closed even so (BufferedWriter closes its raw file after a failed flush)
        code = self.p.wait()
        self.err.seek(0)
        return code, self.err.read().decode(errors="replace")

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for f in (self.p.stdin, self.p.stdout, self.err):
            # stdin's unsent rest (finish), or any other error closing one: the others are closed all the same
            with contextlib.suppress(OSError):
                f.close()


class SystemSSHDuplex(ProcessDuplex):
    """A command over the system ssh client (same host key file, key and options as git's): OpenSSH's
    C crypto runs on its own core while we hash and write, faster than paramiko's channel with its
    per-packet Python (docs/benchmarks.md). The command's connection is its own: a verb using it opens no
    other."""

    def __init__(self, transport: SSHTransport, argv: list[str], stall_timeout: float, tick: Callable[[], None]):
        self.transport = transport
        ssh = [
            *transport.ssh_argv(),
            "-o",
            "ServerAliveInterval=15",
            transport.remote_path("").rstrip(":"),
            remote_command(argv),
        ]
        super().__init__(ssh, stall_timeout, tick, what=short(argv))

    def finish(self) -> tuple[int, str]:
        code, err = super().finish()
        if ssh_failed(code, err):
            raise self.transport.ssh_failure(err, started=True)
        return code, err


class ChannelDuplex(Duplex):
    """A command on its own channel of the host's paramiko connection (when there is no ssh client)."""

    def __init__(self, transport: SSHTransport, argv: list[str], stall_timeout: float, tick: Callable[[], None]):
        super().__init__(short(argv), stall_timeout, tick)
        self.transport = transport
        self.dropped = (EOFError, OSError, load_paramiko().SSHException)  # the connection went away
        self.chan = transport.open_channel()  # paramiko's default 2 MiB window: a larger one is slower
        try:
            self.chan.settimeout(self.SLICE_S)
            self.chan.exec_command(shlex.join(argv))
        except self.dropped as e:
            raise transport.lost(e, started=False) from None

    def _read_slice(self, n: int) -> bytes | None:
        try:  # all paramiko's buffer holds, up to n: a capped read leaves a remainder it moves, and more
            return self.chan.recv(n)  # reads send more window adjusts
        except TimeoutError:
            return None
        except self.dropped as e:
            raise self.transport.lost(e, started=True) from None

    def write(self, data: bytes) -> None:
        """All of `data`, waiting (in slices, ticking) while the other side's window is shut: a slow reader is
        not a lost connection; stall_timeout s without progress is."""
        view, quiet_since = memoryview(data), time.monotonic()
        while view:
            try:
                sent = self.chan.send(view)
            except TimeoutError:  # the window stayed shut for a slice
                sent = 0
            except self.dropped as e:
                raise self.transport.lost(e, started=True) from None
            if sent:
                view, quiet_since = view[sent:], time.monotonic()
            elif time.monotonic() - quiet_since > self.stall_timeout:
                raise Transient(f"{self.what}: the other side took no data for {self.stall_timeout:g}s", started=True)
            self.tick()

    def finish(self) -> tuple[int, str]:
        """Our side closed, then the other side's stderr to its end and its exit status, in slices: a side
        that hangs after its last byte, or a peer gone silent, is a Transient after stall_timeout."""
        self.chan.shutdown_write()
        err, quiet_since = bytearray(), time.monotonic()
        while not (self.chan.eof_received and not self.chan.recv_stderr_ready()) or not self.chan.exit_status_ready():
            if self.chan.recv_stderr_ready():
                err.extend(self.chan.recv_stderr(1 << 16))
                quiet_since = time.monotonic()
            elif self.chan.closed and not self.chan.exit_status_ready():
                raise Transient(f"{self.what}: the session ended without an exit status", started=True)
            elif time.monotonic() - quiet_since > self.stall_timeout:
                raise Transient(f"{self.what}: no end after {self.stall_timeout:g}s", started=True)
            else:
                self.tick()
                select.select([self.chan], [], [], self.SLICE_S)  # wakes on stderr data, EOF or close
        return self.chan.recv_exit_status(), err.decode(errors="replace")

    def close(self) -> None:
        self.chan.close()
