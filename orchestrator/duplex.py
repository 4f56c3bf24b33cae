"""A command we talk to both ways, on the host's one SSH connection or as a local process: we write
its stdin and read its stdout as a byte stream (fetch's wire, enlace/fetchserve.py)."""

from __future__ import annotations

import os
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import Transient
from orchestrator.transport import short

if TYPE_CHECKING:
    from orchestrator.transport import SSHTransport


class Duplex:
    """A command we talk to both ways. `read` waits in short slices, calling `tick` between them (the
    caller's Ctrl-C check); no byte for stall_timeout s, or a dropped connection, raises Transient.
    `finish` closes our side and returns the exit code and the stderr text."""

    SLICE_S = 0.5

    def __init__(self, what: str, stall_timeout: float, tick: Callable[[], None]):
        self.what, self.stall_timeout, self.tick = what, stall_timeout, tick

    def read(self, n: int) -> bytes:
        """Up to n bytes of stdout; b"" at its end."""
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
    """A local process (the `local` host)."""

    def __init__(self, argv: list[str], stall_timeout: float, tick: Callable[[], None]):
        super().__init__(short(argv), stall_timeout, tick)
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, start_new_session=True
        )

    def _read_slice(self, n: int) -> bytes | None:
        ready, _, _ = select.select([self.p.stdout], [], [], self.SLICE_S)
        return os.read(self.p.stdout.fileno(), n) if ready else None

    def write(self, data: bytes) -> None:
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def finish(self) -> tuple[int, str]:
        self.p.stdin.close()
        code = self.p.wait()
        self.err.seek(0)
        return code, self.err.read().decode(errors="replace")

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for f in (self.p.stdin, self.p.stdout, self.err):
            f.close()


class ChannelDuplex(Duplex):
    """A command on its own channel of the host's one connection."""

    def __init__(self, transport: SSHTransport, argv: list[str], stall_timeout: float, tick: Callable[[], None]):
        import paramiko

        super().__init__(short(argv), stall_timeout, tick)
        self.transport = transport
        try:  # paramiko's default 2 MiB window: a 16 MiB one measured 1.5-3x slower (its buffer copies)
            self.chan = transport._connection().get_transport().open_session()
            self.chan.settimeout(self.SLICE_S)
            self.chan.exec_command(shlex.join(argv))
        except (EOFError, OSError, paramiko.SSHException) as e:
            raise transport._dropped(e, started=False) from None

    def _read_slice(self, n: int) -> bytes | None:
        import paramiko

        try:
            return self.chan.recv(n)
        except TimeoutError:
            return None
        except (EOFError, OSError, paramiko.SSHException) as e:
            raise self.transport._dropped(e, started=True) from None

    def write(self, data: bytes) -> None:
        import paramiko

        try:
            self.chan.sendall(data)
        except (EOFError, OSError, paramiko.SSHException) as e:
            raise self.transport._dropped(e, started=True) from None

    def finish(self) -> tuple[int, str]:
        self.chan.shutdown_write()
        self.chan.settimeout(None)
        code = self.chan.recv_exit_status()
        err = bytearray()
        while self.chan.recv_stderr_ready():
            err.extend(self.chan.recv_stderr(1 << 16))
        return code, err.decode(errors="replace")

    def close(self) -> None:
        self.chan.close()
