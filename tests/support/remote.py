"""Running the real `enlace-remote` CLI in a subprocess from the user's repo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import REPO
from .configs import write_tiny_corpus


def remote(repo: Path, env: dict, *args: str, check: bool = True, timeout: float = 300, host: str = "testhost"):
    cmd = [sys.executable, "-c", "from orchestrator.cli import run_main; run_main()", "--host", host, *args]
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=repo, timeout=timeout, env=full, stdin=subprocess.DEVNULL
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"enlace-remote {' '.join(args)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out


def tiny_corpus(remote_dir: Path) -> None:
    """Put the tiny corpus into the host's shared data dir (data never travels by git)."""
    write_tiny_corpus(remote_dir / "data" / "tiny")


def server_dir(sshd, host: str) -> Path:
    """The host's remote_dir in the fixture's hosts.yaml (testhost and local)."""
    return sshd.dir.parent / f"remote-{host}"


def wait_until(cond, timeout: float = 120, what: str = "condition") -> None:
    """Poll `cond` until true; fail naming `what` after `timeout` seconds (an event, never a fixed sleep)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
