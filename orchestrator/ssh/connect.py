"""Which transport a host's verbs go through, for one invocation: one path per host."""

from __future__ import annotations

from orchestrator.hosts.resolve import Host
from orchestrator.ssh.local import LocalTransport
from orchestrator.ssh.openssh import SharedTransport, shares_connection
from orchestrator.ssh.transport import SSHTransport, Transport


def connect(host: Host, accept_new_host_key: bool = False) -> Transport:
    """The host's one path for this invocation: this machine, OpenSSH's shared connection (a login is open,
    or the host is set `connection: shared`), or paramiko's own connection."""
    if host.local:
        return LocalTransport(host)
    if shares_connection(host):
        return SharedTransport(host, accept_new_host_key)
    return SSHTransport(host, accept_new_host_key)
