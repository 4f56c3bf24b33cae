"""Running the real `enlace-remote` CLI from the user's repo: forked where it can be
(support/forkserver.py), else a new process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import REPO
from .configs import write_tiny_corpus
from .forkserver import run_python

# enlace-remote as this checkout runs it, without an installed entry point
DRIVER = (sys.executable, "-c", "from orchestrator.cli import run_main; run_main()")


def _command(host: str, args: tuple[str, ...], env: dict, driver: list[str] | None) -> tuple[list[str], dict]:
    """enlace-remote's argv and environment: this checkout's code, the test's hosts and keys; or `driver`,
    an installed enlace-remote, with the environment as a user's (no PYTHONPATH into this checkout)."""
    if driver:
        base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return [*driver, "--host", host, *args], {**base, **env}
    argv = [*DRIVER, "--host", host, *args]
    return argv, {**os.environ, "PYTHONPATH": str(REPO), **env}


def remote(
    repo: Path,
    env: dict,
    *args: str,
    check: bool = True,
    timeout: float = 300,
    host: str = "testhost",
    driver: list[str] | None = None,
):
    cmd, full = _command(host, args, env, driver)
    # this checkout's driver forks from the test fork server where it can; an installed one is its own
    # interpreter, as a user runs it
    out = run_python(cmd, repo, full, timeout, fresh=bool(driver))
    if check and out.returncode != 0:
        raise AssertionError(
            f"enlace-remote {' '.join(args)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out


def popen_remote(repo: Path, env: dict, *args: str, host: str = "testhost", prefix: tuple[str, ...] = ()):
    """`enlace-remote ARGS` left running (stdout and stderr piped); `prefix` runs it under another
    command (e.g. `ip netns exec NS`)."""
    cmd, full = _command(host, args, env, None)
    return subprocess.Popen(
        [*prefix, *cmd], cwd=repo, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full
    )


class PipeReader:
    """Collects a pipe's bytes in a thread, so the test can see progress without consuming it."""

    def __init__(self, pipe):
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe):
        while chunk := pipe.read1(1 << 16):
            self.data.extend(chunk)

    def text(self) -> str:
        return bytes(self.data).decode(errors="replace")

    def grows(self, timeout=60) -> None:
        start, deadline = len(self.data), time.time() + timeout
        while len(self.data) == start:
            assert time.time() < deadline, "no new bytes arrived"
            time.sleep(0.05)

    def join(self):
        self._thread.join(timeout=60)
        return bytes(self.data)


def tiny_corpus(remote_dir: Path) -> None:
    """Put the tiny corpus into the host's shared data dir (data never travels by git)."""
    write_tiny_corpus(remote_dir / "data" / "tiny")


def server_dir(sshd, host: str) -> Path:
    """The host's remote_dir in the fixture's hosts.yaml (testhost and local)."""
    return sshd.dir.parent / f"remote-{host}"


def keeps_stepping(run_dir: Path, steps: int = 2, timeout: float = 120) -> None:
    """Wait until the run's run.json shows `steps` more steps than now (it is alive and training)."""
    from enlace.state import runs

    start = runs.read(run_dir).get("step", 0)
    wait_until(lambda: runs.read(run_dir).get("step", 0) >= start + steps, timeout, f"{run_dir.name} to step on")


def wait_until(cond, timeout: float = 120, what: str = "condition") -> None:
    """Poll `cond` until true; fail naming `what` after `timeout` seconds (an event, never a fixed sleep)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def status_row(repo: Path, env: dict, host: str, run: str) -> dict:
    """`enlace-remote status RUN --json`'s row, asked of `host`."""
    import json

    return json.loads(remote(repo, env, "status", run, "--json", host=host).stdout)[0]


def head(repo: Path) -> str:
    """The commit `repo` has checked out."""
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def connections(sshd) -> int:
    """How many SSH logins the fixture's sshd has accepted so far."""
    return (sshd.dir / "sshd.log").read_text().count("Accepted publickey")


def env_with_a_dead_host(sshd, tmp_path: Path, name: str = "gone") -> dict:
    """sshd's environment with one more host in its hosts file, `name`, on a port nobody listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        (sshd.dir / "hosts.yaml").read_text()
        + f"  {name}:\n    ssh: root@127.0.0.1:{dead_port}\n    connect_timeout: 2\n"
    )
    return {**sshd.env, "ENLACE_HOSTS_FILE": str(hosts)}
