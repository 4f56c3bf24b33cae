"""Host keys: the --accept-new-host-key policy, fingerprints as `ssh-keygen -l` shows them, and the
message for an unknown key (with what the server offers, to compare with what the user was given)."""

from __future__ import annotations

import base64
import hashlib
import shlex
import socket
from pathlib import Path

from orchestrator.hosts.resolve import Host
from orchestrator.sshlib import load_paramiko


class AcceptNewHostKey:
    """paramiko policy for --accept-new-host-key: trust an *unknown* host and record it in
    known_hosts. A changed key never reaches a policy: paramiko raises BadHostKeyException."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.ssh as OpenSSH makes it
        with open(path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


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
