"""Host keys: the --accept-new-host-key policy, fingerprints as `ssh-keygen -l` shows them, and the
message for an unknown key (with what the server offers, to compare with what the user was given)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shlex
import socket
from pathlib import Path

from orchestrator.hosts.resolve import Host
from orchestrator.sshlib import load_paramiko


class RevokedHostKey(Exception):
    """The server offers a key a known_hosts file marks @revoked."""

    def __init__(self, key, path: str):
        super().__init__(f"{key.get_name()} {fingerprint(key)} is marked @revoked in {path}")
        self.key, self.path = key, path


class KnownHostsPolicy:
    """paramiko's policy for a host no known_hosts entry names: refused (as RejectPolicy), or with
    --accept-new-host-key trusted and recorded in the first known_hosts file; a key marked @revoked is refused
    either way. A changed key never reaches a policy: paramiko raises BadHostKeyException."""

    def __init__(self, known_hosts: str, accept_new: bool, revoked: dict[str, str]):
        self.known_hosts, self.accept_new, self.revoked = known_hosts, accept_new, revoked

    def missing_host_key(self, client, hostname, key) -> None:
        if key.get_base64() in self.revoked:
            raise RevokedHostKey(key, self.revoked[key.get_base64()])
        if not self.accept_new:
            raise load_paramiko().SSHException(f"Server {hostname!r} not found in known_hosts")
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.ssh as OpenSSH makes it
        with open(path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def load_known(client, files: tuple[str, ...]) -> dict[str, str]:
    """Every known_hosts file ssh reads for a host into the client's keys (paramiko's own reader stops at the
    first line it cannot parse, an OpenSSH marker line included: a traceback). Returns the @revoked keys (base64
    → the file); @cert-authority lines are passed by (paramiko checks no certificates) and so is a line that is
    not a key, as OpenSSH does."""
    hostkeys = load_paramiko().hostkeys
    entries, revoked = [], {}
    for path in files:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:  # absent or unreadable: ssh passes it by too
            continue
        for number, line in enumerate(lines, start=1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0].startswith("@"):
                if fields[0] == "@revoked" and len(fields) >= 4:
                    revoked[fields[3]] = path
                continue
            with contextlib.suppress(hostkeys.InvalidHostKey, ValueError):
                entries.append(hostkeys.HostKeyEntry.from_line(line, number))
    keys = client.get_host_keys()
    for entry in entries:  # a revoked key counts for nothing, also where another line trusts it (as OpenSSH)
        if entry is not None and entry.key.get_base64() not in revoked:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return revoked


def known_hosts_option(h: Host) -> str:
    """ssh's UserKnownHostsFile for the host: every file the direct path reads, the one new keys go to first
    (ssh checks them all; a path with a space double-quoted, as ssh_config reads it)."""
    files = (h.known_hosts, *h.known_hosts_also)
    return " ".join(f'"{p}"' if any(c.isspace() for c in p) else p for p in files)


def holding(files: tuple[str, ...], key) -> str:
    """The first of `files` that records `key` (the first file when none can be read)."""
    for path in files:
        with contextlib.suppress(OSError):
            if key.get_base64() in Path(path).read_text(errors="replace"):
                return path
    return files[0]


def fingerprint(key) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


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
