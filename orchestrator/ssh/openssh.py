"""One login per session: OpenSSH's connection sharing (ControlMaster), for hosts whose login asks for more
than a key (a password, a one-time code, Kerberos) and for any host set `connection: shared`.

`enlace-remote login HOST` opens a master connection with the system ssh client, answering at this
terminal whatever the host asks, and leaves it running in the background for `persist` after its last
use (ssh's ControlPersist). Every command of every verb after it — git's push, remote.sh and `enlace`
calls, `logs -f`, fetch's and data push's wires, the board's polls, sbatch — is an `ssh -S SOCKET` that
rides that connection: no new authentication and no handshake. Nothing here ever prompts: commands run in
BatchMode, and a host that asks for more than a key without an open login is NotLoggedIn (exit 4, one line
naming `enlace-remote login HOST`). A `connection: shared` host that takes a key alone opens its master
itself on first use (the speed without a login step).

The socket: ENLACE_CONTROL_DIR or ~/.enlace/ssh (0700), one per host entry; a path too long for a Unix
socket falls back to a directory of ours in the system's temp directory. Windows' OpenSSH has no
ControlMaster: `login` says so (docs/hosts.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import CommandFailed, NotLoggedIn, Transient, UnreachableError, UsageError, short
from orchestrator.hosts.resolve import Host
from orchestrator.ssh.duplex import Duplex, SystemSSHDuplex
from orchestrator.ssh.hostkeys import unknown_key_message
from orchestrator.ssh.pump import OnData, pump
from orchestrator.ssh.refused import ASKS_MORE
from orchestrator.ssh.sshexit import remote_command, ssh_failed
from orchestrator.ssh.transport import Result, SSHTransport, url_path

CONTROL_DIR_ENV = "ENLACE_CONTROL_DIR"
AUTO_PERSIST = "10m"  # a master a `connection: shared` host opened itself: gone 10 minutes after its last use
LOGIN_PERSIST = "8h"  # `login`'s, unless --for or the host's `persist:` says otherwise: a working day
SUN_PATH_MAX = 100  # a Unix socket's path: 104 bytes on macOS, 108 on Linux, less ssh's temporary suffix


def _own_folder(folder: Path) -> None:
    """The sockets' folder: ours alone (0700, our uid, not a link): a master's socket lets anyone who can reach it
    run commands on the host as us."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        raise UsageError(
            f"{folder}: not a directory of yours (a link, or another user's) — remove it, or set {CONTROL_DIR_ENV}"
        )
    if st.st_mode & 0o077:
        folder.chmod(0o700)


def control_path(host: Host) -> Path:
    """The master's socket for this host entry (its name, user, address and port: two entries never share)."""
    key = hashlib.sha256(f"{host.name}\0{host.user}\0{host.hostname}\0{host.port}".encode()).hexdigest()[:16]
    folder = Path(os.environ.get(CONTROL_DIR_ENV) or Path.home() / ".enlace" / "ssh").expanduser()
    if len(os.fsencode(folder / key)) + 25 > SUN_PATH_MAX:  # ssh binds SOCKET.XXXXXXXXXXXXXXXX first, then renames
        folder = Path(tempfile.gettempdir()) / f"enlace-ssh-{getattr(os, 'getuid', lambda: 'user')()}"
    return folder / key


def _ours(socket: Path) -> bool:
    """A master's socket we may ride: a socket of ours in a folder of ours. Another account's master would carry
    our commands on its connection, past our host-key check (its socket name is predictable in /tmp)."""
    try:
        folder, st = socket.parent.lstat(), socket.lstat()
    except OSError:
        return False
    uid = os.getuid()
    return stat.S_ISDIR(folder.st_mode) and folder.st_uid == uid and stat.S_ISSOCK(st.st_mode) and st.st_uid == uid


def logged_in(host: Host) -> bool:
    """A login of ours is open for the host (its master's socket is there, and ours)."""
    return not host.local and _ours(control_path(host))


def shares_connection(host: Host) -> bool:
    """Whether the host's verbs go through OpenSSH's master: it is set `connection: shared`, or a login is
    open for it (its socket is there)."""
    if host.local:
        return False
    try:
        return host.connection == "shared" or _ours(control_path(host))
    except OSError:  # a socket folder we may not read (another account's ENLACE_CONTROL_DIR): no login of ours
        return False


class SharedTransport(SSHTransport):
    """Every command an `ssh -S SOCKET` riding the host's master connection (opened by `login`, or here in
    BatchMode for a host a key lets in). Host keys stay strict; an unknown key is refused as on the direct
    path unless --accept-new-host-key."""

    def __init__(self, host: Host, accept_new_host_key: bool = False):
        super().__init__(host, accept_new_host_key)
        self.socket = control_path(host)
        self._master_checked = self._failed_once = False

    # -- the master -------------------------------------------------------------------------
    @property
    def destination(self) -> str:
        """The name ssh is given: the ~/.ssh/config alias where there is one, so that its block's settings
        enlace does not copy (GSSAPI, CertificateFile, IdentityAgent, ...) apply too; HostName is passed."""
        name = self.host.alias or self.host.hostname
        return f"{self.host.user}@{name}" if self.host.user else name

    def remote_path(self, path: str) -> str:
        return f"{self.destination}:{path}"

    def git_url(self, path: str) -> str:
        return f"ssh://{self.destination}:{self.host.port}{url_path(path)}"

    def _named(self) -> list[str]:
        return ["-o", f"HostName={self.host.hostname}"]  # the first value wins over the alias block's

    def _control(self, operation: str) -> int:
        """`ssh -O check|exit`: asks the master over its socket (no network, no authentication); its exit code."""
        argv = ["ssh", "-F", os.devnull, "-o", f"ControlPath={self.socket}", "-O", operation, self.destination]
        try:
            return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=30).returncode
        except subprocess.TimeoutExpired:  # a master frozen (SIGSTOP, a hung network): not one to use
            return 255

    def master_running(self) -> bool:
        """Whether the master answers on its socket; a socket nobody answers on (a master killed by SIGKILL,
        a reboot) is removed: ssh would refuse to open a new master over it."""
        if not self.socket.exists():
            return False
        if not _ours(self.socket):
            raise UsageError(
                f"{self.socket}: another account's socket (or not a socket) where this host's shared connection"
                f" goes — remove it, or set {CONTROL_DIR_ENV} to a folder of yours"
            )
        if self._control("check") == 0:
            return True
        with contextlib.suppress(OSError):
            self.socket.unlink()
        return False

    def master_argv(self, persist: str, batch: bool) -> list[str]:
        strict = "accept-new" if self.accept_new else "yes"
        return [
            "ssh",
            "-o",
            f"StrictHostKeyChecking={strict}",  # the first of an option wins: before ssh_argv's `yes`
            *self._named(),
            *super().ssh_argv(batch=batch)[1:],
            "-o",
            f"ControlPath={self.socket}",
            "-o",
            "ControlMaster=yes",
            "-o",
            f"ControlPersist={persist}",
            "-o",
            "ServerAliveInterval=15",  # a dead network ends the master (and its commands) within a minute
            "-N",
            "-f",
            self.destination,
        ]

    def open_master(self, persist: str, batch: bool) -> None:
        """Start the master (`-f`: ssh goes to the background once authenticated), one driver at a time (a
        lock beside the socket: a second one finds the first's master). `batch`: no prompt at all (its own
        session: no terminal to ask on, a jump host's prompt included); otherwise ssh asks at this terminal
        (or through SSH_ASKPASS) what the host asks, its messages shown."""
        _own_folder(self.socket.parent)
        with open(f"{self.socket}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.master_running():  # another driver opened it meanwhile
                self._master_checked = self.answered = True
                return
            self._open(persist, batch)
        self._master_checked = self.answered = True  # it took us: later drops are the network's, not a typo's

    def _open(self, persist: str, batch: bool) -> None:
        argv = self.master_argv(persist, batch)
        shown = not batch and sys.stderr.isatty()  # login: ssh's own lines (a key's touch, a retry) reach you
        timeout = 3 * self.host.connect_timeout + 30 if batch else None
        with tempfile.TemporaryFile() as err:  # a pipe would stay open in the backgrounded master
            try:
                code = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL if batch else None,
                    stdout=subprocess.DEVNULL,  # older ssh keeps the caller's stdout in the backgrounded master
                    stderr=None if shown else err,
                    start_new_session=batch,
                    timeout=timeout,
                ).returncode
            except FileNotFoundError:
                raise UsageError("connection sharing needs OpenSSH's ssh client on PATH (not found)") from None
            except subprocess.TimeoutExpired:
                raise Transient(f"{self.host.name}: no connection within {timeout:g} s", started=False) from None
            err.seek(0)
            text = err.read().decode(errors="replace")
        if code != 0 or "disabling multiplexing" in text:
            raise self.ssh_failure(text or "ssh could not open the shared connection", started=False)

    def ensure_master(self) -> None:
        """Once per invocation (again after a dropped connection): the master is there, or is opened now
        where a key alone lets us in; a host that asks for more raises NotLoggedIn. Its socket is taken at
        its word the first time (a master removes it as it ends; asking it costs a process): a command that
        fails on it (ssh's 255) has the master asked here before the next try."""
        if self._master_checked:
            return
        if _ours(self.socket) and not self._failed_once:
            self._master_checked = self.answered = True
            return
        if not self.master_running():
            self.open_master(self.host.persist or AUTO_PERSIST, batch=True)
        self._master_checked = self.answered = True

    def close_master(self) -> bool:
        """`ssh -O exit`; True when there was one (a stale socket is removed either way)."""
        running = self.master_running()
        if running:
            self._control("exit")
        self._master_checked = False
        return running

    def ssh_failure(self, stderr: str, started: bool) -> UnreachableError | UsageError:
        self._master_checked, self._failed_once = False, True  # the next try asks the master itself
        asks = "keyboard-interactive" in stderr or "password" in stderr
        if "Permission denied" in stderr and asks:
            return NotLoggedIn(self.host.name, ASKS_MORE)
        where = f"{self.host.name} ({self.host.hostname})"
        if "REVOKED HOST KEY" in stderr or "revoked by file" in stderr:  # (it said "unknown host key")
            said = " ".join(line.strip() for line in stderr.splitlines() if "revoked" in line.lower())
            return UnreachableError(f"{where}: the server offers a revoked host key — refusing ({said})")
        if "HOST IDENTIFICATION HAS CHANGED" in stderr:  # ssh's own words: the file and line, its fix
            said = " ".join(line.strip() for line in stderr.splitlines() if "Offending" in line or "ssh-keygen" in line)
            sent = re.search(r"fingerprint for the (\S+) key sent by the remote host is\s+(SHA256:[\w+/=]+)", stderr)
            offers = f"the server now offers {sent[1]} {sent[2]}; " if sent else ""  # as the direct path says it
            return UnreachableError(
                f"{where}: the host key has CHANGED ({offers}{said}) — refusing to connect: this may be an attack"
            )
        if "Host key verification failed" in stderr:
            return UnreachableError(unknown_key_message(self.host, where))
        return super().ssh_failure(stderr, started)

    # -- commands ---------------------------------------------------------------------------
    def ssh_argv(self, batch: bool = True) -> list[str]:
        """An ssh that rides the master (opened first if need be): git's, `shell`'s, the wires'."""
        self.ensure_master()
        base = super().ssh_argv(batch=True)
        return [base[0], *self._named(), *base[1:], "-o", f"ControlPath={self.socket}", "-o", "ControlMaster=no"]

    def _command(self, argv: list[str]) -> list[str]:
        return [*self.ssh_argv(), self.destination, remote_command(argv)]

    def _run_once(self, argv: list[str], timeout: float, idempotent: bool) -> Result:
        try:
            p = subprocess.run(  # its own session: no terminal for any prompt to wait on (a jump host's included)
                self._command(argv),
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise CommandFailed(self.host.name, short(argv), -1, f"timed out after {timeout}s") from None
        stderr = p.stderr.decode(errors="replace")
        if ssh_failed(p.returncode, stderr):
            raise self.ssh_failure(stderr, started=True)
        return Result(p.stdout.decode(errors="replace"), stderr, p.returncode)

    def stream(self, argv: list[str], on_stdout: OnData, on_stderr: OnData, stall_timeout: float) -> int:
        tail = bytearray()

        def err(chunk: bytes) -> None:
            tail[:] = (tail + chunk)[-4096:]
            on_stderr(chunk)

        with subprocess.Popen(  # stdin a pipe we never write: it closes when we die (--exit-with-client)
            self._command(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as p:
            try:
                code = pump(p, on_stdout, err, stall_timeout, f"{self.host.name}: {short(argv)}")
            finally:
                if p.poll() is None:
                    p.kill()
        if ssh_failed(code, tail.decode(errors="replace")):
            raise self.ssh_failure(tail.decode(errors="replace"), started=True)
        return code

    def duplex(self, argv: list[str], stall_timeout: float, tick: Callable[[], None], shared: bool = False) -> Duplex:
        return SystemSSHDuplex(self, argv, stall_timeout, tick)

    def open_channel(self):
        raise NotImplementedError("a shared connection has no paramiko channel")

    @property
    def cipher(self) -> str:
        raise NotImplementedError("the master's cipher is ssh's: `ssh -v` shows it")

    def close(self) -> None:
        pass  # the master outlives this invocation: that is its point


def login(transport: SharedTransport, persist: str, say: Callable[[str], None]) -> bool:
    """Open the host's master, asking at this terminal what the host asks; False when one was open already."""
    if sys.platform == "win32":
        raise UsageError(
            "login needs OpenSSH's connection sharing (ControlMaster), which Windows' OpenSSH lacks — run "
            "enlace-remote from WSL, or use a host a key alone lets in (docs/hosts.md)"
        )
    if transport.master_running():
        return False
    say(f"logging in to {transport.host.name} ({transport.destination}:{transport.host.port}); answer what it asks")
    try:
        transport.open_master(persist, batch=False)
    except UnreachableError as e:  # a wrong code, no terminal, the network: not "log in once"
        reason = e.message.split(" — log in once")[0]
        raise UnreachableError(f"login to {transport.host.name} failed: {reason}") from None
    return True
