"""The only module that talks SSH. One connection per enlace-remote invocation, reused.

`Transport.run(argv)` runs a command on the host: argv is shlex-joined into one command string
(every element quoted; callers validate names first). `SSHTransport` uses fabric/paramiko with
host keys checked against known_hosts (RejectPolicy: fabric's default AutoAddPolicy would accept
unknown and changed keys silently), TCP_NODELAY and keepalive on, a timeout on every call.
`LocalTransport` runs the same argv on this machine (the `local` host).
git and rsync use the system `ssh` with the same host, port, identity and strict checking.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import CommandFailed, UnreachableError
from orchestrator.hosts import Host, ssh_config_file


@dataclass
class Result:
    stdout: str
    stderr: str
    exited: int


class Transport:
    host: Host

    def run(self, argv: list[str], timeout: float = 120, check: bool = True) -> Result:
        raise NotImplementedError

    def stream(self, argv: list[str], on_data: Callable[[bytes], None], stall_timeout: float,
               combine_stderr: bool = False) -> int:  # fmt: skip
        """Run argv, passing stdout (and stderr if combined) bytes to on_data as they arrive;
        returns the exit code. Raises ConnectionError when the connection drops or stalls."""
        raise NotImplementedError

    def ssh_argv(self) -> list[str]:
        """The system ssh command (for git/rsync -e), or [] for the local host."""
        return []

    def remote_path(self, path: str) -> str:
        """How git/rsync address `path` on the host."""
        return path

    def close(self) -> None:
        pass

    def _check(self, argv: list[str], result: Result, check: bool) -> Result:
        if check and result.exited != 0:
            raise CommandFailed(self.host.name, _short(argv), result.exited, result.stdout + result.stderr)
        return result


def _short(argv: list[str]) -> str:
    """The command for error messages, without the inlined remote.sh text."""
    shown = ["<remote.sh>" if len(a) > 200 else a for a in argv]
    return shlex.join(shown)


class LocalTransport(Transport):
    def __init__(self, host: Host):
        self.host = host

    def run(self, argv: list[str], timeout: float = 120, check: bool = True) -> Result:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise CommandFailed("local", _short(argv), -1, f"timed out after {timeout}s\n{e.stdout or ''}") from None
        return self._check(argv, Result(p.stdout, p.stderr, p.returncode), check)

    def stream(self, argv: list[str], on_data: Callable[[bytes], None], stall_timeout: float,
               combine_stderr: bool = False) -> int:  # fmt: skip
        err = subprocess.STDOUT if combine_stderr else None
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL) as p:
            while chunk := p.stdout.read1(1 << 16):
                on_data(chunk)
            return p.wait()


class AcceptNewHostKey:
    """paramiko policy for --accept-new-host-key: trust an *unknown* host and record it in
    known_hosts. A changed key never reaches a policy: paramiko raises BadHostKeyException."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport(Transport):
    def __init__(self, host: Host, accept_new_host_key: bool = False):
        self.host, self.accept_new = host, accept_new_host_key
        self._conn = None

    # -- connection -------------------------------------------------------------------------
    def _connection(self):
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        import paramiko
        from fabric import Config, Connection

        h = self.host
        kwargs = {"key_filename": h.identity_files, "look_for_keys": not h.identity_files,
                  "banner_timeout": h.connect_timeout, "auth_timeout": h.connect_timeout}  # fmt: skip
        conn = Connection(h.hostname, user=h.user, port=h.port, connect_timeout=h.connect_timeout,
                          connect_kwargs=kwargs, config=Config(overrides={"load_ssh_configs": False}))  # fmt: skip
        conn.client.get_host_keys().clear()
        if Path(h.known_hosts).is_file():
            conn.client.load_host_keys(h.known_hosts)
        policy = AcceptNewHostKey(h.known_hosts) if self.accept_new else paramiko.RejectPolicy()
        conn.client.set_missing_host_key_policy(policy)
        where = f"{h.name} ({h.hostname}:{h.port})"
        try:
            conn.open()
        except paramiko.BadHostKeyException as e:
            raise UnreachableError(
                f"{where}: the host key has CHANGED (now {e.key.get_name()} {e.key.get_fingerprint().hex()}) — "
                f"refusing to connect: this may be an attack. If the server was really reinstalled, remove the old "
                f"key with: ssh-keygen -R {shlex.quote(h.known_hosts_key)} -f {shlex.quote(h.known_hosts)}") from None
        except paramiko.AuthenticationException as e:
            raise UnreachableError(f"{where}: authentication failed ({e}); keys tried: "
                                   f"{', '.join(h.identity_files) or 'ssh-agent / ~/.ssh/id_*'}") from None  # fmt: skip
        except paramiko.SSHException as e:
            if "not found in known_hosts" in str(e):
                raise UnreachableError(
                    f"{where}: unknown host key (not in {h.known_hosts}) — check the server's fingerprint, then trust "
                    f"it with: ssh-keyscan -p {h.port} {h.hostname} >> {shlex.quote(h.known_hosts)}  "
                    f"(or rerun with --accept-new-host-key)") from None
            raise UnreachableError(f"{where}: SSH failed: {e}") from None
        except (TimeoutError, OSError) as e:
            reason = "timed out" if isinstance(e, (socket.timeout, TimeoutError)) else (e.strerror or str(e))
            raise UnreachableError(f"{where}: cannot connect: {reason} (connect timeout {h.connect_timeout:g}s)") from None
        transport = conn.client.get_transport()
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # ≈45 → 13 ms per command
        transport.set_keepalive(15)
        self._conn = conn
        return conn

    # -- commands ---------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 120, check: bool = True) -> Result:
        from invoke.exceptions import CommandTimedOut

        conn = self._connection()
        try:
            r = conn.run(shlex.join(argv), hide=True, warn=True, timeout=timeout, in_stream=False)
        except CommandTimedOut:
            raise CommandFailed(self.host.name, _short(argv), -1, f"timed out after {timeout}s") from None
        return self._check(argv, Result(r.stdout, r.stderr, r.exited), check)

    def stream(self, argv: list[str], on_data: Callable[[bytes], None], stall_timeout: float,
               combine_stderr: bool = False) -> int:  # fmt: skip
        try:
            chan = self._connection().client.get_transport().open_session()
        except (EOFError, OSError) as e:  # the transport died under us (e.g. the session was killed)
            self._conn = None
            raise ConnectionError(str(e) or type(e).__name__) from None
        try:
            chan.set_combine_stderr(combine_stderr)
            chan.settimeout(stall_timeout)
            chan.exec_command(shlex.join(argv))
            while True:
                try:
                    chunk = chan.recv(1 << 16)
                except TimeoutError:
                    raise ConnectionError(f"no data for {stall_timeout}s") from None
                if not chunk:
                    break
                on_data(chunk)
            if not chan.exit_status_ready() and chan.closed:
                raise ConnectionError("connection closed before the command ended")
            status = chan.recv_exit_status()
            if status == -1:
                raise ConnectionError("the session ended without an exit status")
            return status
        except (EOFError, OSError) as e:
            self._conn = None
            raise ConnectionError(str(e) or type(e).__name__) from None
        finally:
            chan.close()

    # -- git / rsync ------------------------------------------------------------------------
    def ssh_argv(self) -> list[str]:
        h = self.host
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={h.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={int(h.connect_timeout)}",
                "-p", str(h.port)]  # fmt: skip
        cfg = ssh_config_file()
        argv += ["-F", str(cfg) if cfg.is_file() else "/dev/null"]
        for key in h.identity_files:
            argv += ["-i", key]
        return argv

    def remote_path(self, path: str) -> str:
        user = f"{self.host.user}@" if self.host.user else ""
        return f"{user}{self.host.hostname}:{path}"

    def git_url(self, path: str) -> str:
        user = f"{self.host.user}@" if self.host.user else ""
        return f"ssh://{user}{self.host.hostname}:{self.host.port}{path}"

    def sftp(self):
        return self._connection().sftp()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def connect(host: Host, accept_new_host_key: bool = False) -> Transport:
    return LocalTransport(host) if host.local else SSHTransport(host, accept_new_host_key)
