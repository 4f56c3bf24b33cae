"""A real sshd that asks for a key AND a one-time code (keyboard-interactive through PAM, Debian's
libpam-oath), as a university cluster's login node does; the code comes from oathtool.

sshd asks PAM for the service named as its own binary (OpenSSH's default: __progname), so the server
runs as a link to /usr/sbin/sshd under a name of its own, and /etc/pam.d/NAME (written here, removed by
`remove`) holds pam_oath alone: the code is the whole keyboard-interactive step. Codes are HOTP (a counter,
not the clock: a test that runs over a 30 s boundary gives the same codes). Root is needed to write
/etc/pam.d (the suite runs as root: scripts/test.sh)."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from .sshd import SSHD, SSHServer, make_server

SECRET = "3132333435363738393031323334353637383930"  # RFC 4226's test secret, hex
AUTH = (
    "UsePAM yes\nKbdInteractiveAuthentication yes\n"
    "AuthenticationMethods publickey,keyboard-interactive\nPermitRootLogin yes"
)
ASKPASS = """#!/bin/sh
# ssh's SSH_ASKPASS: answers the code prompt with the next HOTP code; counts how often it was asked
n=$(cat {dir}/asked 2>/dev/null || echo 0); n=$((n+1)); echo $n > {dir}/asked
exec oathtool --hotp -c $n {secret}
"""


@dataclass
class OTPServer:
    sshd: SSHServer
    service: Path  # /etc/pam.d/NAME

    @property
    def env(self) -> dict[str, str]:
        return self.sshd.env

    def login_env(self) -> dict[str, str]:
        """What answers ssh's prompt: the askpass script, forced (no terminal needed), no X display."""
        return {**self.sshd.env, "SSH_ASKPASS": str(self.sshd.dir / "askpass"), "SSH_ASKPASS_REQUIRE": "force"}

    def codes_asked(self) -> int:
        asked = self.sshd.dir / "asked"
        return int(asked.read_text()) if asked.exists() else 0

    def logins(self) -> int:
        """Authentications sshd completed (the code step is the last one): its log's own count."""
        return (self.sshd.dir / "sshd.log").read_text().count("Accepted keyboard-interactive/pam for root")

    def remove(self) -> None:
        self.sshd.stop()
        self.service.unlink(missing_ok=True)


def make_otp_server(base: Path, name: str = "otphost") -> OTPServer:
    if os.geteuid() != 0:
        raise RuntimeError("the one-time-code sshd writes /etc/pam.d: run the tests as root (scripts/test.sh)")
    if subprocess.run(["sh", "-c", "command -v oathtool"], capture_output=True).returncode != 0:
        raise RuntimeError("oathtool not found: install oathtool and libpam-oath (scripts/test-deps.sh does)")
    d = base / f"sshd-{name}"
    d.mkdir(parents=True)
    binary = d / f"enlace-otp-{uuid.uuid4().hex[:8]}"
    binary.symlink_to(SSHD)
    users = d / "users.oath"
    users.write_text(f"HOTP root - {SECRET}\n")
    users.chmod(0o600)
    service = Path("/etc/pam.d") / binary.name
    service.write_text(
        f"auth required pam_oath.so usersfile={users} window=20 digits=6\n"
        "account required pam_permit.so\nsession required pam_permit.so\n"
    )
    askpass = d / "askpass"
    askpass.write_text(ASKPASS.format(dir=d, secret=SECRET))
    askpass.chmod(0o755)
    return OTPServer(make_server(base, name, auth=AUTH, binary=str(binary)), service)
