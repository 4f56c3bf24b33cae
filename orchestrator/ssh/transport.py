"""A host's transport: the interface, and the default path, paramiko's own connection (one per enlace-remote
invocation, reused). The others: orchestrator/ssh/openssh.py (OpenSSH's shared connection, after `login`)
and orchestrator/ssh/local.py (this machine); orchestrator/ssh/connect.py picks one per host.

`Transport.run(argv)` runs a command on the host and returns its stdout, stderr and exit code;
`Transport.stream(argv, ...)` passes stdout and stderr bytes to two callbacks as they arrive. argv is
shlex-joined into one command string (every element quoted; callers validate names first).
`SSHTransport` is paramiko's SSHClient, used directly (README, Development: why not fabric), with host keys
checked against every known_hosts file ssh reads (hostkeys.KnownHosts: unknown and changed keys are refused), TCP_NODELAY and
keepalive on, a deadline on every command and one channel loop for `run` and `stream`.
`Transport.duplex(argv)` starts a command to
talk to both ways (orchestrator/ssh/duplex.py: a channel of the same connection, or a local process).

Transient faults — a refused or timed-out connect, a handshake or auth *timeout* on a lossy network,
a killed session — raise `Transient`; `run` retries them with bounded backoff (saying so on stderr),
a rejected key or password never (orchestrator/ssh/refused.py says each failure of a connect). git uses the system `ssh` with the same host, port,
identity and strict checking.
"""

from __future__ import annotations

import contextlib
import re
import select
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from enlace.errors import shown
from orchestrator.errors import CommandFailed, Transient, UnreachableError, UsageError, short
from orchestrator.hosts.resolve import Host, proxy_command, user_hosts_file
from orchestrator.hosts.sshconfig import ssh_config_file
from orchestrator.ssh import portable
from orchestrator.ssh.ciphers import SSH_CIPHERS
from orchestrator.ssh.duplex import ChannelDuplex, SystemSSHDuplex
from orchestrator.ssh.hostkeys import KnownHosts, KnownHostsPolicy, known_hosts_option, prefer_known_types
from orchestrator.ssh.pump import OnData
from orchestrator.ssh.refused import no_prompts, why_not
from orchestrator.ssh.retry import WINDOW_S, retrying
from orchestrator.sshlib import load_paramiko

if TYPE_CHECKING:
    from orchestrator.ssh.duplex import Duplex

# ssh's own default IdentityFile list (ssh_config(5)), FIDO keys (_sk) included: one -i drops them all
SSH_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk")


# ssh's words for a name its resolver does not know: the name, and why
UNRESOLVED = re.compile(r"Could not resolve hostname ([^\s:]+): ([^\n]*)")


@dataclass
class Result:
    stdout: str
    stderr: str
    exited: int


class DeadlinePassed(Exception):
    """A command ran past its timeout (not a connection fault: it is not retried)."""


class Transport:
    host: Host
    retry_s: float = WINDOW_S  # how long `run` keeps retrying transient faults once the host has answered
    first_attempts: int = 3  # a host never reached in this invocation: likely down or misnamed
    answered: bool = False  # set once a connection was made (the host is there and takes us)

    def run(self, argv: list[str], timeout: float = 120, check: bool = True, idempotent: bool = True) -> Result:
        """Run argv; transient faults are retried for up to retry_s (first_attempts tries while the host has
        not answered yet). A command that is not idempotent is retried only when it provably never started."""

        def once() -> Result:
            result = self._check(argv, self._run_once(argv, timeout, idempotent), check)
            self.answered = True
            return result

        def give_up(e: Transient, attempt: int) -> bool:
            return (not self.answered and attempt + 1 >= self.first_attempts) or (e.started and not idempotent)

        def say(e: Transient, delay: float) -> None:
            named = (
                e.message
                if e.message.startswith((f"{self.host.name} (", f"{self.host.name}:"))
                else f"{self.host.name}: {e.message}"
            )
            click.echo(shown(f"enlace-remote: {named}; retrying in {delay:g}s"), err=True)

        return retrying(once, say, self.retry_s, give_up)

    def _run_once(self, argv: list[str], timeout: float, idempotent: bool) -> Result:
        raise NotImplementedError

    def stream(self, argv: list[str], on_stdout: OnData, on_stderr: OnData, stall_timeout: float) -> int:
        """Run argv, passing stdout and stderr bytes to the callbacks as they arrive; returns the exit
        code. The command's stdin stays open while we live (`enlace --exit-with-client` ends the server
        side when it closes). Raises Transient when the connection drops or stalls."""
        raise NotImplementedError

    def duplex(self, argv: list[str], stall_timeout: float, tick: Callable[[], None], shared: bool = False) -> Duplex:
        """Start argv for a conversation: we write its stdin and read its stdout (fetch's wire). `shared`: on
        the host's one connection even where an ssh client of its own would be faster (the board's small,
        frequent fetches)."""
        raise NotImplementedError

    def ssh_argv(self) -> list[str]:
        """The system ssh command (for git, `shell`), or [] for the local host."""
        return []

    def remote_path(self, path: str) -> str:
        """How git and ssh address `path` on the host."""
        return path

    def close(self) -> None:
        pass

    def _check(self, argv: list[str], result: Result, check: bool) -> Result:
        if check and result.exited != 0:
            raise CommandFailed(self.host.name, short(argv), result.exited, result.stdout + result.stderr)
        return result


def url_path(path: str) -> str:
    """A path as git reads it in an ssh:// URL: git decodes %XX there, so a literal % is sent as %25."""
    return path.replace("%", "%25")


class SSHTransport(Transport):
    def __init__(self, host: Host, accept_new_host_key: bool = False):
        self.host, self.accept_new = host, accept_new_host_key
        self._client = None

    # -- connection -------------------------------------------------------------------------
    def _connection(self):
        """The SSHClient, connected (again, after a drop)."""
        if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
            return self._client
        paramiko = load_paramiko()

        h = self.host
        client = paramiko.SSHClient()
        known = KnownHosts((h.known_hosts, *h.known_hosts_also), h.revoked_host_keys)  # as OpenSSH checks them
        policy = KnownHostsPolicy(h.known_hosts, self.accept_new, known, h.known_hosts_key, h.hash_known_hosts)
        client.set_missing_host_key_policy(policy)
        ours = known.for_host(h.known_hosts_key)
        where, proxy = f"{h.name} ({h.hostname}:{h.port}{h.via})", self._proxy(paramiko)
        try:
            client.connect(
                h.hostname,
                port=h.port,
                username=h.user,
                key_filename=h.identity_files or None,
                look_for_keys=not h.identity_files,
                timeout=h.connect_timeout,
                banner_timeout=h.connect_timeout,
                auth_timeout=h.connect_timeout,
                transport_factory=lambda sock, **kw: prefer_known_types(
                    no_prompts(sock, **kw), ours, h.host_key_algorithms
                ),
                sock=proxy,
            )
        except Exception as e:  # a failure said in the user's words, retried only when the network's
            error = why_not(e, h, where, proxy, self.unresolved)
            if error is None:
                raise
            raise error from None
        transport = client.get_transport()
        if isinstance(transport.sock, socket.socket):  # not a proxy's pipe
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # paramiko leaves Nagle on
        transport.set_keepalive(15)
        self._client, self.answered = client, True  # sessions cut after this are a network's, not a typo's
        return client

    def _proxy(self, paramiko):
        """What ~/.ssh/config reaches the host through (ProxyCommand, ProxyJump) as a pipe; None: direct."""
        command = proxy_command(self.host, self._client_options())
        return paramiko.ProxyCommand(command) if command else None

    def lost(self, e: BaseException, started: bool) -> Transient:
        """The connection went away under a command (`started`: it may have begun): close and forget it (a
        stall may have left it half alive: its thread and the server's sshd go with it), say so."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._client = None
        return Transient(f"{self.host.name}: connection lost ({str(e) or type(e).__name__})", started=started)

    def open_channel(self):
        """A new session channel on the host's one connection (connecting again after a drop); Transient when
        the connection dies as it opens. Its own commands and the duplex channels (fetch's, data push's) use it."""
        paramiko = load_paramiko()
        try:
            return self._connection().get_transport().open_session()
        except (EOFError, OSError, paramiko.SSHException) as e:  # the transport died under us
            raise self.lost(e, started=False) from None

    @property
    def cipher(self) -> str:
        """The cipher the connection negotiated (what the benchmarks and tests check)."""
        return self._connection().get_transport().remote_cipher

    # -- commands ---------------------------------------------------------------------------
    def _run_once(self, argv: list[str], timeout: float, idempotent: bool) -> Result:
        out, err = bytearray(), bytearray()
        try:
            code = self._exec(argv, out.extend, err.extend, stall_timeout=timeout, deadline=time.monotonic() + timeout)
        except DeadlinePassed:
            raise CommandFailed(self.host.name, short(argv), -1, f"timed out after {timeout}s") from None
        return Result(out.decode(errors="replace"), err.decode(errors="replace"), code)

    def stream(self, argv: list[str], on_stdout: OnData, on_stderr: OnData, stall_timeout: float) -> int:
        return self._exec(argv, on_stdout, on_stderr, stall_timeout, deadline=None)

    def _exec(
        self, argv: list[str], on_stdout: OnData, on_stderr: OnData, stall_timeout: float, deadline: float | None
    ) -> int:
        """One command on its own channel: its bytes to the callbacks as they come; its exit code once both
        streams have reached their end. sshd sends the exit status as soon as the command is reaped, which
        can be before the last of its output (a large reply) has crossed: the status alone never ends the
        read. A drop, a kill or `stall_timeout` s without data raise Transient; passing `deadline` raises
        DeadlinePassed."""
        paramiko = load_paramiko()

        chan = self.open_channel()
        try:
            chan.exec_command(shlex.join(argv))
            quiet_since = time.monotonic()
            # the end: EOF and both buffers drained (a server that closes after its status, skipping EOF, too)
            while not ((chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready()):
                got = False
                if chan.recv_ready():
                    on_stdout(chan.recv(1 << 16))
                    got = True
                if chan.recv_stderr_ready():
                    on_stderr(chan.recv_stderr(1 << 16))
                    got = True
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlinePassed
                if got:
                    quiet_since = time.monotonic()
                    continue
                if not chan.get_transport().is_active():
                    raise ConnectionError("connection closed before the command's output ended")
                if time.monotonic() - quiet_since > stall_timeout:
                    raise ConnectionError(f"no data for {stall_timeout:g}s")
                select.select([chan], [], [], 0.2)  # the channel's fileno wakes us on stdout/stderr data or EOF
            wait_s = max(1.0, stall_timeout) if deadline is None else max(0.0, deadline - time.monotonic())
            if not chan.status_event.wait(wait_s):  # EOF first, the status just behind it
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlinePassed
                raise ConnectionError("the command's output ended but no exit status came")
            status = chan.recv_exit_status()
            if status == -1:  # the session ended without an exit status: killed under us
                raise ConnectionError("the session ended without an exit status")
            return status
        except (EOFError, OSError, paramiko.SSHException) as e:
            raise self.lost(e, started=True) from None
        finally:
            chan.close()

    def duplex(self, argv: list[str], stall_timeout: float, tick: Callable[[], None], shared: bool = False) -> Duplex:
        import shutil

        if shutil.which("ssh") and not shared and portable.PIPES_SELECT:
            return SystemSSHDuplex(self, argv, stall_timeout, tick)
        return ChannelDuplex(self, argv, stall_timeout, tick)

    # -- git / ssh ---------------------------------------------------------------------------
    def ssh_argv(self, batch: bool = True) -> list[str]:
        """The system ssh command with this host's settings; `batch`: never a prompt (BatchMode)."""
        h = self.host
        argv = [
            "ssh",
            *self._client_options(batch),
            "-o",
            f"UserKnownHostsFile={known_hosts_option(h)}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"Ciphers={h.ciphers or SSH_CIPHERS}",
            "-p",
            str(h.port),
        ]
        if h.proxy_command:  # we name the HostName, so ssh would not apply the alias's own block
            argv += ["-o", f"ProxyCommand={h.proxy_command}"]
        elif h.proxy_jump:
            argv += ["-o", f"ProxyJump={h.proxy_jump}"]
        # ssh's default keys under $HOME (ssh itself looks in the passwd entry's home, which a changed HOME misses)
        keys = h.identity_files or [str(k) for k in (Path.home() / ".ssh" / n for n in SSH_DEFAULT_KEYS) if k.is_file()]
        for key in keys:
            argv += ["-i", key]
        return argv

    def _client_options(self, batch: bool = True) -> list[str]:
        """What every ssh the driver starts carries, to the host or to a hop on the way there: no prompts
        (but for `login`'s), the host's connect timeout, and the user's ssh config (or none)."""
        cfg = ssh_config_file()
        timeout = f"ConnectTimeout={int(self.host.connect_timeout)}"
        prompts = ["-o", "BatchMode=yes"] if batch else []
        return [*prompts, "-o", timeout, "-F", str(cfg) if cfg.is_file() else "/dev/null"]

    def unresolved(self, why: str, name: str | None = None) -> UsageError:
        """A name does not resolve, before the host ever answered: a typo, said with where names come from.
        `name`: the one that failed, where ssh said (with a ProxyJump, a hop's)."""
        h = self.host
        if name and name != h.hostname:
            return UsageError(
                f"host {h.name}: {name!r}, on the way to {h.hostname} ({h.via.strip() or 'its ssh config'}), does "
                f"not resolve ({why}) — check that hop's name in {ssh_config_file()} or the host's proxy_jump"
            )
        where_from = (
            f"it is in no hosts file (configs/hosts.yaml, {user_hosts_file()}) nor {ssh_config_file()}. "
            f"Known hosts: {', '.join(h.known)} — or add it: enlace-remote hosts add {h.name} --ssh USER@HOST"
            if not h.configured
            else f"check its ssh: (or {ssh_config_file()}'s HostName): enlace-remote hosts add {h.name} --ssh "
            "USER@HOST sets it anew"
        )
        return UsageError(f"host {h.name}: the name {h.hostname!r} does not resolve ({why}); {where_from}")

    def ssh_failure(self, stderr: str, started: bool) -> UnreachableError | UsageError:
        """The error for an ssh client that exited 255 (its own failure, not the command's): a refused key or
        host key is final, and so is a name that never resolved (ssh's word for paramiko's gaierror); anything
        else (a dropped or refused connection, a name lost with the network after the host answered) Transient."""
        reason = stderr.strip().splitlines()[-1] if stderr.strip() else "the connection closed (ssh exited 255)"
        if "Permission denied" in stderr or "Host key verification failed" in stderr:
            return UnreachableError(f"{self.host.name}: {reason}")
        unresolved = UNRESOLVED.search(stderr)
        if unresolved and "Temporary failure" not in stderr and not self.answered:  # offline: the network's
            return self.unresolved(unresolved.group(2).strip(), unresolved.group(1))
        return Transient(f"{self.host.name}: {reason}", started=started)

    def remote_path(self, path: str) -> str:
        user = f"{self.host.user}@" if self.host.user else ""
        return f"{user}{self.host.hostname}:{path}"

    def git_url(self, path: str) -> str:
        user = f"{self.host.user}@" if self.host.user else ""
        return f"ssh://{user}{self.host.hostname}:{self.host.port}{url_path(path)}"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
