"""Why paramiko's connection to a host failed, in the user's words: one error per kind of failure, final
(a changed or unknown host key, a rejected key, no key to offer, a jump host's refusal) or Transient (the
network's: a refused or timed-out connect, a handshake cut short), which `Transport.run` retries. A verb never
prompts: a host that asks for a code or a password is sent to `enlace-remote login` (orchestrator/ssh/openssh.py)."""

from __future__ import annotations

import errno
import shlex
import socket
from collections.abc import Callable

from orchestrator.errors import NotLoggedIn, Transient, UnreachableError, UsageError
from orchestrator.hosts.resolve import Host
from orchestrator.ssh.ciphers import gcm_first
from orchestrator.ssh.hostkeys import ChangedHostKey, RevokedHostKey, UnknownHostKey, fingerprint, unknown_key_message
from orchestrator.sshlib import load_paramiko

ASKS_MORE = "the host asks for more than a key (a password or a one-time code) and there is no open login"


class SecondFactor(Exception):
    """The server took our key and asks for more: paramiko would print its prompt on our stdout and read
    stdin (auth_interactive_dumb); a verb never prompts, `login` does (orchestrator/ssh/openssh.py)."""


def no_prompts(sock, **kwargs):
    """paramiko's Transport (AES-GCM first) that refuses to prompt for a second factor."""
    transport = gcm_first(sock, **kwargs)

    def refuse(*args, **kwargs):
        raise SecondFactor

    transport.auth_interactive_dumb = refuse
    return transport


def why_not(e: BaseException, h: Host, where: str, proxy, unresolved: Callable[[str], UsageError]) -> Exception | None:
    """The error to raise for `e`, raised by paramiko's connect to `h` (through `proxy`, a ProxyCommand or
    None); None for one that is not a connection's failure (a bug: raised as it is)."""
    paramiko = load_paramiko()
    if isinstance(e, ChangedHostKey):
        return UnreachableError(
            f"{where}: the host key has CHANGED (the server now offers {e.key.get_name()} {fingerprint(e.key)}, "
            f"{e}) — refusing to connect: this may be an attack. If the server was really reinstalled, remove "
            f"the old key with: ssh-keygen -R {shlex.quote(h.known_hosts_key)} -f {shlex.quote(e.known.path)}"
        )
    if isinstance(e, UnknownHostKey):  # the key it offered is in hand: no second connection to ask it
        return UnreachableError(unknown_key_message(h, where, e.key))
    if isinstance(e, RevokedHostKey) and e.krl:
        return UnreachableError(f"{where}: {e} — refusing to connect")
    if isinstance(e, RevokedHostKey):
        return UnreachableError(f"{where}: the server offers a revoked host key ({e}) — refusing to connect")
    if isinstance(e, (SecondFactor, paramiko.PasswordRequiredException)):  # a code, or a key's passphrase
        return NotLoggedIn(h.name, ASKS_MORE)
    if isinstance(e, paramiko.BadAuthenticationType):
        if {"keyboard-interactive", "password"} & set(e.allowed_types):
            return NotLoggedIn(h.name, ASKS_MORE)
        return UnreachableError(f"{where}: authentication rejected ({e})")
    if isinstance(e, paramiko.AuthenticationException):
        if "timeout" in str(e).lower() or "EOF" in str(e):  # the network, not the credentials
            return Transient(f"{where}: the SSH handshake did not complete ({e})")
        keys = ", ".join(h.identity_files) or "ssh-agent / ~/.ssh/id_*"
        return UnreachableError(f"{where}: authentication rejected ({e}); keys tried: {keys}")
    if isinstance(e, paramiko.SSHException):
        return _handshake_failure(e, h, where, proxy)
    if isinstance(e, socket.gaierror):
        if e.errno == socket.EAI_AGAIN:  # the resolver is unreachable (offline): the network's, retried
            return Transient(f"{where}: cannot resolve {h.hostname!r} now ({e.strerror})")
        return unresolved(e.strerror)
    if isinstance(e, (TimeoutError, OSError, EOFError)):
        return Transient(f"{where}: cannot connect: {_connect_failure(e, h.connect_timeout)}")
    return None


def _handshake_failure(e: Exception, h: Host, where: str, proxy) -> Exception:
    if "No authentication methods available" in str(e):  # no key was found to offer (none tried)
        return UnreachableError(
            f"{where}: no SSH key to offer (no identity_file for this host, no key in ssh-agent, none of "
            "~/.ssh/id_*) — give it your key: identity_file in its hosts entry (enlace-remote hosts add "
            f"{h.name} --ssh ... --identity-file PATH), or IdentityFile in ~/.ssh/config; if it asks for a "
            f"password or a one-time code instead, log in once with: enlace-remote login {h.name}"
        )
    if said := proxy_said(proxy):  # seen: a jump host's unknown key was "No existing session", retried
        final = any(word in said for word in PROXY_FINAL)
        return (UnreachableError if final else Transient)(f"{where}: the way there failed: {said}")
    return Transient(f"{where}: SSH handshake failed ({e})")


PROXY_FINAL = ("Host key verification failed", "Permission denied")  # a hop's refusal: no retry helps


def proxy_said(proxy) -> str:
    """What a proxy command (a jump host's `ssh -W`) said on stderr once it ended: its line of a hop's refusal
    (through several hops, the outer ones' words come after it), else its last line; "" if nothing."""
    if proxy is None:
        return ""
    try:
        proxy.process.wait(timeout=2)
        lines = proxy.process.stderr.read().decode(errors="replace").strip().splitlines()
    except Exception:  # still running, or its pipe gone: it said nothing we can use
        return ""
    return next((ln for ln in lines if any(word in ln for word in PROXY_FINAL)), lines[-1] if lines else "")


def _connect_failure(e: BaseException, timeout: float) -> str:
    """Why a connection could not be made, in the user's terms: a refusal is not a timeout."""
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"timed out after {timeout:g}s (the host's connect_timeout): is it up, and reachable from here?"
    tried = getattr(e, "errors", None)  # paramiko's NoValidConnectionsError: one error per address tried
    codes = {getattr(x, "errno", None) for x in tried.values()} if tried else {getattr(e, "errno", None)}
    if errno.ECONNREFUSED in codes:
        return "connection refused: nothing listens on that port (is sshd running there? is the port right?)"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__  # EOFError (a banner cut off): its name
