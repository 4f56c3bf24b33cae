"""Stand-ins for a fetch's SSH channel and session: the server's bytes given, what the driver writes dropped.
What is tested with them is the driver's reading; the real server half runs over sshd in test_fetch and
test_own_script."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace


class CannedWire:
    """The SSH channel's stand-in: `data` is all the server says, then it exits `code` with `err`."""

    def __init__(self, data: bytes, code: int = 0, err: str = ""):
        self.data, self.code, self.err = io.BytesIO(data), code, err

    def read(self, n):
        return self.data.read(n)

    def write(self, data):
        pass

    def finish(self):
        return self.code, self.err


def canned_session(wire):
    return SimpleNamespace(
        enlace_argv=lambda *a, **k: ["enlace"],
        transport=SimpleNamespace(duplex=lambda *a, **k: contextlib.nullcontext(wire)),
        host=SimpleNamespace(name="gpu1"),
    )
