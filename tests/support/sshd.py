"""A real OpenSSH server on 127.0.0.1 for the tests (docs/development.md: what was measured setting it up).

Generated host and client keys, a known_hosts and an ssh_config alias `testhost`, and a hosts.yaml
that points enlace-remote at them. No mocks: paramiko and git talk to this sshd."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
KEY_ONLY = "UsePAM no\nPermitRootLogin prohibit-password"

CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/host_key
AuthorizedKeysFile {keys}
PidFile {dir}/sshd.pid
{auth}
StrictModes no
{sftp}
{setenv}
MaxStartups 100:30:200
MaxSessions 50
LogLevel VERBOSE
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@dataclass
class SSHServer:
    dir: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    sftp: bool = True  # False: no `Subsystem sftp` line (a server that offers no SFTP)
    own_homes: bool = False  # True: users keep their own HOME and ~/.ssh/authorized_keys (a real fresh account)
    prefix: list[str] = field(default_factory=list)  # e.g. ["ip", "netns", "exec", NS]: run sshd there
    session_env: dict[str, str] = field(default_factory=dict)  # set in every session (e.g. SLURM_CONF)
    auth: str = KEY_ONLY  # the config's authentication lines (support/otp.py: a key and a one-time code)
    binary: str = SSHD  # its name is the PAM service sshd asks (support/otp.py links one under another name)

    def start(self, port: int | None = None) -> None:
        """Start sshd on `port` (a restart keeps its port), else on a free one."""
        if not Path(SSHD).exists():
            raise RuntimeError(f"{SSHD} not found: install openssh-server (the SSH tests need a real sshd)")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for _attempt in range(5 if port is None else 50):  # binding port 0 then releasing it races: retry
            self.port = port or _free_port()
            sftp = "Subsystem sftp internal-sftp" if self.sftp else ""
            env = {**({} if self.own_homes else {"HOME": f"{self.dir}/home"}), **self.session_env}
            if "OMP_NUM_THREADS" in os.environ:  # the test run's thread budget (conftest) holds on the server too
                env.setdefault("OMP_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
            setenv = f"SetEnv {' '.join(f'{k}={v}' for k, v in env.items())}" if env else ""
            keys = ".ssh/authorized_keys" if self.own_homes else f"{self.dir}/authorized_keys"
            (self.dir / "sshd_config").write_text(
                CONFIG.format(port=self.port, dir=self.dir, sftp=sftp, setenv=setenv, keys=keys, auth=self.auth)
            )
            log = self.dir / "sshd.log"
            log.write_text("")
            self.proc = subprocess.Popen(
                [*self.prefix, self.binary, "-D", "-f", str(self.dir / "sshd_config"), "-E", str(log)]
            )
            deadline = time.time() + 10
            while time.time() < deadline and self.proc.poll() is None:
                if "Server listening on" in log.read_text():
                    return
                time.sleep(0.02)
            self.stop()
            if port is not None:
                time.sleep(0.1)  # the old listener's socket may linger a moment
        raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()[-2000:]}")

    def kill_sessions(self) -> int:
        """End every live SSH session, not the listener: each connection's sshd processes, all of them. For
        a non-root account a connection is two (`sshd: USER [priv]` and its unprivileged child
        `sshd: USER@notty`, which carries the connection); killing only the listener's direct children left
        the second alive and the connection working. The user's own commands get what a dropped connection
        gives them (EOF, SIGHUP), not a SIGKILL. Returns how many connections were cut."""
        import psutil

        try:
            connections = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return 0
        for conn in connections:
            tree = [conn]
            with contextlib.suppress(psutil.NoSuchProcess):
                tree += conn.children(recursive=True)
            for proc in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if proc.name() == "sshd" or proc is conn:
                        proc.kill()
        return len(connections)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.kill_sessions()
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self, down_s: float) -> None:
        """sshd down for `down_s` seconds (live sessions end), then back on the same port."""
        self.stop()
        time.sleep(down_s)  # the outage itself, not a wait for an event
        self.start(port=self.port)

    def share_connection(self, name: str = "testhost") -> None:
        """Set the host `connection: shared` in its hosts.yaml (OpenSSH's master instead of paramiko)."""
        hosts = self.dir / "hosts.yaml"
        text = hosts.read_text()
        assert f"  {name}:\n" in text, text
        hosts.write_text(text.replace(f"  {name}:\n", f"  {name}:\n    connection: shared\n", 1))

    def host_public_key(self) -> str:
        return (self.dir / "host_key.pub").read_text().split()[:2]


def make_server(
    base: Path,
    name: str = "testhost",
    trust: bool = True,
    sftp: bool = True,
    prefix: list[str] | None = None,
    own_homes: bool = False,
    session_env: dict[str, str] | None = None,
    auth: str = KEY_ONLY,
    binary: str = SSHD,
) -> SSHServer:
    d = base / f"sshd-{name}"
    (d / "home").mkdir(parents=True)
    keygen(d / "host_key")
    keygen(d / "client_key")
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    srv = SSHServer(
        d, sftp=sftp, prefix=prefix or [], own_homes=own_homes, session_env=session_env or {}, auth=auth, binary=binary
    )
    srv.start()
    kind, key = srv.host_public_key()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{srv.port} {kind} {key}\n" if trust else "")
    (d / "ssh_config").write_text(
        f"Host {name}\n  HostName 127.0.0.1\n  Port {srv.port}\n  User root\n  IdentityFile {d}/client_key\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n"
    )
    (d / "hosts.yaml").write_text(
        f"hosts:\n  {name}:\n    remote_dir: {base}/remote-{name}\n    python: {sys.executable}\n"
        f"    connect_timeout: 5\n    default_run: tiny\n"
        f"  local:\n    remote_dir: {base}/remote-local\n    python: {sys.executable}\n    default_run: tiny\n"
    )
    srv.env = {"ENLACE_SSH_CONFIG": str(d / "ssh_config"), "ENLACE_HOSTS_FILE": str(d / "hosts.yaml")}
    return srv
