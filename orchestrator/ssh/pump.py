"""A local helper process's stdout and stderr, passed to two callbacks as the bytes arrive: the `local`
host's streamed commands and the ssh client's (orchestrator/ssh/openssh.py)."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable

from orchestrator.errors import Transient

OnData = Callable[[bytes], None]


def pump(p: subprocess.Popen, on_stdout: OnData, on_stderr: OnData, stall_timeout: float | None, what: str) -> int:
    """Both pipes to their end, then p's exit code. `stall_timeout` s with no byte on either raises Transient
    (None: wait as long as it takes). The caller ends p when this raises."""
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ, on_stdout)
        sel.register(p.stderr, selectors.EVENT_READ, on_stderr)
        quiet_since = time.monotonic()
        while sel.get_map():
            events = sel.select(timeout=None if stall_timeout is None else 0.5)
            for key, _ in events:
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    key.data(chunk)
                else:
                    sel.unregister(key.fileobj)
            if events:
                quiet_since = time.monotonic()
            elif stall_timeout is not None and time.monotonic() - quiet_since > stall_timeout:
                raise Transient(f"{what}: no data for {stall_timeout:g}s", started=True)
        return p.wait()
