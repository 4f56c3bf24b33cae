"""Host keys, checked as OpenSSH checks them: every known_hosts file ssh reads for a host (KnownHosts), a host
known when any line for it holds the key it offers, a key marked @revoked refused; the --accept-new-host-key
policy; fingerprints as `ssh-keygen -l` shows them, and the message for an unknown key (with what the server
offers, to compare with what the user was given)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from orchestrator.hosts.resolve import Host
from orchestrator.sshlib import load_paramiko


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts line: the host patterns it names, its key type and base64 key, the file it is in."""

    patterns: tuple[str, ...]
    keytype: str
    key: str
    path: str


class KnownHosts:
    """The known_hosts files ssh reads for a host, read once as OpenSSH reads them. paramiko's own store keeps
    one key per host and type (the last file read wins: a stale line in the global file refused a host the
    user's file knows), stops at a line it cannot parse (an @revoked marker, a cut key), and adds in quadratic
    time (seconds for a cluster's thousands of node keys). Here a line that is no key is passed by, and
    @cert-authority lines too (paramiko checks no certificates)."""

    def __init__(self, files: tuple[str, ...]):
        self.keys: list[KnownKey] = []
        self.revoked: dict[str, str] = {}  # base64 key → the file marking it @revoked
        self._found: dict[str, list[KnownKey]] = {}  # for_host's answers (hashed names cost an HMAC a line)
        for path in files:
            try:
                lines = Path(path).read_text(errors="replace").splitlines()
            except OSError:  # absent, unreadable or a directory: ssh passes it by too
                continue
            for line in lines:
                fields = line.split()
                if len(fields) < 3 or fields[0].startswith("#"):
                    continue
                if fields[0] == "@revoked" and len(fields) >= 4:
                    self.revoked[fields[3]] = path
                elif not fields[0].startswith("@"):
                    self.keys.append(KnownKey(tuple(fields[0].split(",")), fields[1], fields[2], path))

    def for_host(self, name: str) -> list[KnownKey]:
        """The lines for `name` (`host`, or `[host]:port` off port 22), revoked keys left out."""
        if name not in self._found:
            self._found[name] = [
                k for k in self.keys if _matches(name.lower(), k.patterns) and k.key not in self.revoked
            ]
        return self._found[name]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    """OpenSSH's rule: some pattern matches (plain, wildcard or hashed `|1|salt|hash`) and no negated one does."""
    hit = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        found = _hashed(name, pattern) if pattern.startswith("|1|") else _wildcard(name, pattern.lower())
        if found and negated:
            return False
        hit = hit or found
    return hit


def _wildcard(name: str, pattern: str) -> bool:
    """OpenSSH's patterns: `*` and `?` only (the brackets of `[host]:port` are literal, as fnmatch's are not)."""
    if "*" not in pattern and "?" not in pattern:
        return name == pattern
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), name) is not None


def _hashed(name: str, pattern: str) -> bool:
    try:
        salt, digest = (base64.b64decode(part) for part in pattern.split("|")[2:4])
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def prefer_known_types(transport, known: list[KnownKey]):
    """Ask the server first for a key of a type known_hosts holds for it (as OpenSSH orders its host key
    algorithms, and paramiko does from its own store): a host known by its ed25519 key, offering RSA first,
    would read as changed."""
    opts = transport.get_security_options()
    wanted = [
        t
        for k in known
        for t in (("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa") if k.keytype == "ssh-rsa" else (k.keytype,))
    ]
    opts.key_types = sorted(opts.key_types, key=lambda t: wanted.index(t) if t in wanted else len(wanted))
    return transport


class RevokedHostKey(Exception):
    """The server offers a key a known_hosts file marks @revoked."""

    def __init__(self, key, path: str):
        super().__init__(f"{key.get_name()} {fingerprint(key)} is marked @revoked in {path}")
        self.key, self.path = key, path


class ChangedHostKey(Exception):
    """The server offers a key none of the host's known_hosts lines holds."""

    def __init__(self, key, known: KnownKey):
        super().__init__(f"{known.path} has {known.keytype} {fingerprint(base64.b64decode(known.key))}")
        self.key, self.known = key, known


class KnownHostsPolicy:
    """paramiko's policy, called for every host (its own store is left empty): a key any of the host's lines
    holds is accepted; one marked @revoked is refused; another key where the host has lines is a changed key,
    refused; an unknown host is refused (as RejectPolicy), or with --accept-new-host-key trusted and recorded
    in the first known_hosts file."""

    def __init__(self, known_hosts: str, accept_new: bool, known: KnownHosts):
        self.known_hosts, self.accept_new, self.known = known_hosts, accept_new, known

    def missing_host_key(self, client, hostname, key) -> None:
        offered = key.get_base64()
        if offered in self.known.revoked:
            raise RevokedHostKey(key, self.known.revoked[offered])
        lines = self.known.for_host(hostname)
        if any(k.key == offered for k in lines):
            return
        if lines:  # the old key of the same type, where there is one
            raise ChangedHostKey(key, next((k for k in lines if k.keytype == key.get_name()), lines[0]))
        if not self.accept_new:
            raise load_paramiko().SSHException(f"Server {hostname!r} not found in known_hosts")
        path = Path(self.known_hosts)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.ssh as OpenSSH makes it
        with open(path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {offered}\n")


def known_hosts_option(h: Host) -> str:
    """ssh's UserKnownHostsFile for the host: every file the direct path reads, the one new keys go to first
    (ssh checks them all; a path with a space double-quoted, as ssh_config reads it)."""
    files = (h.known_hosts, *h.known_hosts_also)
    return " ".join(f'"{p}"' if any(c.isspace() for c in p) else p for p in files)


def fingerprint(key) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it (of a paramiko key, or of a key's bytes)."""
    blob = key if isinstance(key, bytes) else key.asbytes()
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def unknown_key_message(h: Host, where: str) -> str:
    offered = ""
    try:  # what the server offers, so the user can compare it with the fingerprint they were given
        paramiko = load_paramiko()

        with socket.create_connection((h.hostname, h.port), timeout=h.connect_timeout) as sock:
            t = paramiko.Transport(sock)
            t.start_client(timeout=h.connect_timeout)
            key = t.get_remote_server_key()
            offered = f" The server offers {key.get_name()} {fingerprint(key)}."
            t.close()
    except Exception:  # the fingerprint is a courtesy: the refusal stands without it
        pass
    folder = Path(h.known_hosts).parent
    mkdir = "" if folder.is_dir() else f"mkdir -p -m 700 {shlex.quote(str(folder))} && "  # seen: no ~/.ssh yet
    return (
        f"{where}: unknown host key (not in {h.known_hosts}).{offered} Check it against the server's "
        f"fingerprint, then trust it with: {mkdir}ssh-keyscan -p {h.port} {h.hostname} >> "
        f"{shlex.quote(h.known_hosts)}  (or rerun with --accept-new-host-key)"
    )
