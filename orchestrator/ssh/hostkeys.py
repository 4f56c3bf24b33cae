"""Host keys, checked as OpenSSH checks them: every known_hosts file ssh reads for a host (KnownHosts), a host
known when any line for it holds the key it offers, a key marked @revoked refused; the --accept-new-host-key
policy; fingerprints as `ssh-keygen -l` shows them, and the message for an unknown key (with what the server
offers, to compare with what the user was given)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import click

from orchestrator.errors import UsageError
from orchestrator.hosts.resolve import Host
from orchestrator.hosts.sshconfig import ssh_config_file
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
    @cert-authority lines too (paramiko checks no certificates). `revoked_file`: ssh_config's RevokedHostKeys
    (public keys, one a line; a binary KRL cannot be read here: `krl` names it)."""

    def __init__(self, files: tuple[str, ...], revoked_file: str | None = None):
        self.keys: list[KnownKey] = []
        self.revoked: list[KnownKey] = []  # @revoked lines (their host patterns), and RevokedHostKeys' keys
        self.krl: str | None = None  # why a RevokedHostKeys file refuses every host here (a KRL, unreadable)
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
                    self.revoked.append(KnownKey(tuple(fields[1].split(",")), fields[2], fields[3], path))
                elif not fields[0].startswith("@"):
                    self.keys.append(KnownKey(tuple(fields[0].split(",")), fields[1], fields[2], path))
        if revoked_file:
            self._read_revoked(revoked_file)

    def _read_revoked(self, path: str) -> None:
        try:
            raw = Path(path).read_bytes()
        except OSError as e:  # ssh refuses every host then; so do we
            self.krl = f"RevokedHostKeys {path} cannot be read ({e.strerror}): ssh refuses every host then too"
            return
        if raw.startswith(b"SSHKRL"):
            self.krl = f"RevokedHostKeys {path} is a KRL, which only OpenSSH's client reads — set `connection: shared`"
            return
        for line in raw.decode(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 2 and not fields[0].startswith("#"):
                self.revoked.append(KnownKey(("*",), fields[0], fields[1], f"RevokedHostKeys {path}"))

    def revoked_in(self, name: str, key: str) -> str | None:
        """The file that revokes `key` for `name`, or None."""
        return next((r.path for r in self.revoked if r.key == key and _matches(name.lower(), r.patterns)), None)

    def for_host(self, name: str) -> list[KnownKey]:
        """The lines for `name` (`host`, `[host]:port` off port 22, or a HostKeyAlias), revoked keys left out."""
        if name not in self._found:
            found = [k for k in self.keys if _matches(name.lower(), k.patterns)]
            self._found[name] = [k for k in found if self.revoked_in(name, k.key) is None]
        return self._found[name]

    def lines_for(self, name: str, keytype: str) -> list[KnownKey]:
        """The lines a key of `keytype` is checked against: `[host]:port`'s, and the plain host's where those
        hold no key of that type (OpenSSH's "checking without port identifier")."""
        lines = self.for_host(name)
        plain = re.fullmatch(r"\[(.+)\]:\d+", name)
        if plain and not any(k.keytype == keytype for k in lines):
            lines = lines + self.for_host(plain.group(1))
        return lines


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
    return hmac.compare_digest(_name_digest(salt, name), digest)


def _name_digest(salt: bytes, name: str) -> bytes:
    """How `HashKnownHosts yes` hides a host's name: HMAC-SHA1 of it, keyed by the line's salt."""
    return hmac.new(salt, name.encode(), hashlib.sha1).digest()


def prefer_known_types(transport, known: list[KnownKey], allowed: tuple[str, ...] = ()):
    """Ask the server first for a key of a type known_hosts holds for it, as OpenSSH orders its host key
    algorithms (a host known by its ed25519 key, offering RSA first, would read as changed), in the client's
    own order among them (a stale RSA line above a good ed25519 one asked for RSA). `allowed`: ssh_config's
    HostKeyAlgorithms."""
    opts = transport.get_security_options()
    if allowed:  # ~/.ssh/config's HostKeyAlgorithms: only those, as ssh asks for them
        kept = [t for t in opts.key_types if t in allowed]
        if not kept:
            raise UsageError(
                f"HostKeyAlgorithms ({','.join(allowed)}) names none of the host key types the direct path can "
                f"check ({','.join(opts.key_types)}) — set `connection: shared` for this host (OpenSSH's client)"
            )
        opts.key_types = kept
    types = {k.keytype for k in known}
    wanted = types | ({"rsa-sha2-512", "rsa-sha2-256"} if "ssh-rsa" in types else set())
    opts.key_types = sorted(opts.key_types, key=lambda t: t not in wanted)  # stable: the client's order kept
    return transport


class RevokedHostKey(Exception):
    """The server offers a key a known_hosts file marks @revoked (or RevokedHostKeys lists); `krl`: that file is
    a binary KRL, which only OpenSSH reads."""

    def __init__(self, key, path: str, krl: bool = False):
        listed = f"is listed in {path}" if path.startswith("RevokedHostKeys ") else f"is marked @revoked in {path}"
        super().__init__(path if krl else f"{key.get_name()} {fingerprint(key)} {listed}")
        self.key, self.path, self.krl = key, path, krl


class UnknownHostKey(Exception):
    """No known_hosts line names the host; `key` is what it offered (shown to compare, not fetched again)."""

    def __init__(self, key):
        super().__init__(f"{key.get_name()} {fingerprint(key)} is in no known_hosts file")
        self.key = key


class ChangedHostKey(Exception):
    """The server offers a key none of the host's known_hosts lines holds."""

    def __init__(self, key, known: KnownKey):
        super().__init__(f"{known.path} has {known.keytype} {fingerprint(base64.b64decode(known.key))}")
        self.key, self.known = key, known


class KnownHostsPolicy:
    """paramiko's policy, called for every host (its own store is left empty): a key any of the host's lines
    holds is accepted; one marked @revoked for it is refused; another key where the host has lines is a changed
    key, refused; an unknown host is refused (as RejectPolicy), or with --accept-new-host-key trusted and
    recorded in the first known_hosts file. `name`: the host as known_hosts names it (its HostKeyAlias, or
    `[host]:port`), which paramiko's own name for it is not when there is an alias."""

    def __init__(self, known_hosts: str, accept_new: bool, known: KnownHosts, name: str, hashed: bool = False):
        self.known_hosts, self.accept_new, self.known, self.name = known_hosts, accept_new, known, name
        self.hashed = hashed  # HashKnownHosts: the name written as `|1|salt|hash`, as ssh writes it

    def missing_host_key(self, client, hostname, key) -> None:
        offered = key.get_base64()
        if self.known.krl:
            raise RevokedHostKey(key, self.known.krl, krl=True)
        if revoked := self.known.revoked_in(self.name, offered):
            raise RevokedHostKey(key, revoked)
        if any(k.key == offered for k in self.known.lines_for(self.name, key.get_name())):
            return
        if own := self.known.for_host(self.name):  # (a plain `host` line off port 22 only ever vouches, as in ssh)
            raise ChangedHostKey(key, next((k for k in own if k.keytype == key.get_name()), own[0]))
        if not self.accept_new:
            raise UnknownHostKey(key)
        path = Path(self.known_hosts)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.ssh as OpenSSH makes it
        name = self.name
        if self.hashed:
            salt = os.urandom(20)
            name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(_name_digest(salt, name.lower())).decode()}"
        with open(path, "a") as fh:
            fh.write(f"{name} {key.get_name()} {offered}\n")
        # as ssh's "Permanently added": what was trusted unseen, where it now stands (ssh-keygen -R removes it)
        click.echo(
            f"enlace-remote: {self.name}: trusted its new {key.get_name()} key {fingerprint(key)} and added"
            f" it to {path} (--accept-new-host-key)",
            err=True,
        )


def known_hosts_option(h: Host) -> str:
    """ssh's UserKnownHostsFile for the host: every file the direct path reads, the one new keys go to first
    (ssh checks them all; a path with a space double-quoted, as ssh_config reads it)."""
    files = (h.known_hosts, *h.known_hosts_also)
    return " ".join(f'"{p}"' if any(c.isspace() for c in p) else p for p in files)


def fingerprint(key) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it (of a paramiko key, or of a key's bytes)."""
    blob = key if isinstance(key, bytes) else key.asbytes()
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def unknown_key_message(h: Host, where: str, key=None) -> str:
    """Refused as unknown: what the server offers (`key`, from the connection refused; else asked of it here,
    unless a proxy stands between: another machine would answer), and how to trust it."""
    proxied = bool(h.proxy_jump or h.proxy_command)
    if key is None and not proxied:
        key = _offered(h)
    offered = f" The server offers {key.get_name()} {fingerprint(key)}." if key is not None else ""
    files = ", nor ".join((h.known_hosts, *h.known_hosts_also))  # every file ssh reads for it
    if proxied or h.host_key_alias:  # ssh-keyscan takes no proxy, and writes no alias
        return (
            f"{where}: unknown host key (not in {files}).{offered} Check it against the server's "
            f"fingerprint (`{_asking_ssh(h)}` shows it and asks), or rerun with --accept-new-host-key"
        )
    folder = Path(h.known_hosts).parent
    mkdir = "" if folder.is_dir() else f"mkdir -p -m 700 {shlex.quote(str(folder))} && "  # seen: no ~/.ssh yet
    # names written hashed, as the user's HashKnownHosts asks; off port 22 ssh-keyscan before OpenSSH 8.9 hashed
    # the bare host, a line ssh never matches: written plain there
    hashed = " -H" if h.hash_known_hosts and h.port == 22 else ""
    return (
        f"{where}: unknown host key (not in {files}).{offered} Check it against the server's "
        f"fingerprint, then trust it with: {mkdir}ssh-keyscan{hashed} -p {h.port} {h.hostname} >> "
        f"{shlex.quote(h.known_hosts)}  (or rerun with --accept-new-host-key)"
    )


def _asking_ssh(h: Host) -> str:
    """An ssh that shows the host's key and asks, through its proxy, with the config enlace reads."""
    config = ssh_config_file()
    named = f" -F {shlex.quote(str(config))}" if config != Path("~/.ssh/config").expanduser() else ""
    return f"ssh{named} -o StrictHostKeyChecking=ask {shlex.quote(h.alias or h.hostname)} true"


def _offered(h: Host):
    """The key the host offers, asked of it (the shared path's refusal carries none); None when it does not say."""
    try:
        paramiko = load_paramiko()

        with socket.create_connection((h.hostname, h.port), timeout=h.connect_timeout) as sock:
            t = paramiko.Transport(sock)
            t.start_client(timeout=h.connect_timeout)
            key = t.get_remote_server_key()
            t.close()
            return key
    except Exception:  # the fingerprint is a courtesy: the refusal stands without it
        return None
