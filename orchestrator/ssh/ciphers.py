"""Which ciphers the driver offers: AES-GCM first, for paramiko's connection and for the system ssh client
(git, fetch's and data push's wire), since with AES instructions it outruns chacha20-poly1305, ssh's own
first choice (docs/benchmarks.md)."""

from __future__ import annotations

from orchestrator.sshlib import load_paramiko

# OpenSSH's default cipher set (ssh_config(5), 6.5 to 9.x) with AES-GCM first, as gcm_first does for paramiko:
# with AES instructions it outruns chacha20-poly1305, ssh's own first choice (docs/benchmarks.md).
SSH_CIPHERS = ",".join(
    [
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    ]
)


def gcm_first(sock, **kwargs):
    """paramiko's Transport, offering AES-GCM first where this paramiko has it (from 3.5 on), the rest
    of its list after: one AEAD call per packet instead of AES-CTR plus a separate HMAC (fetch's fallback
    without an ssh client runs on this connection; bench/remote.py measures it)."""
    paramiko = load_paramiko()

    transport = paramiko.Transport(sock, **kwargs)
    opts = transport.get_security_options()
    opts.ciphers = sorted(opts.ciphers, key=lambda name: "-gcm@" not in name)  # stable: the rest keep their order
    return transport
