"""What checking a host key costs the driver when the machine's known_hosts files are large (a cluster's global
file holds thousands of node keys): enlace's KnownHosts (every file read once, the host's lines found, hashed
names included) against paramiko's own HostKeys.load of the same file (the baseline: what the driver read
before it checked every file ssh reads), alternated in one process, medians of --reps.

    python bench/known_hosts.py [--lines 1000,16000] [--reps 5]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.ssh.hostkeys import KnownHosts
from orchestrator.sshlib import load_paramiko

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"  # one valid ed25519 key


def write_file(path: Path, lines: int) -> None:
    """`lines` hashed entries (as `HashKnownHosts yes` writes them), node0.cluster ... nodeN.cluster."""
    with open(path, "w") as fh:
        for i in range(lines):
            salt = os.urandom(20)
            digest = hmac.new(salt, f"node{i}.cluster".encode(), hashlib.sha1).digest()
            fh.write(f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()} ssh-ed25519 {KEY}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="1000,16000", help="file sizes, comma-separated (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs of each (default: %(default)s)")
    a = ap.parse_args()
    paramiko = load_paramiko()
    with tempfile.TemporaryDirectory() as tmp:
        for lines in (int(n) for n in a.lines.split(",")):
            path = Path(tmp) / f"known_hosts_{lines}"
            write_file(path, lines)
            ours, theirs = [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                found = KnownHosts((str(path),)).for_host(f"node{lines // 2}.cluster")
                t1 = time.perf_counter()
                paramiko.HostKeys(str(path)).lookup(f"node{lines // 2}.cluster")
                t2 = time.perf_counter()
                ours.append(t1 - t0)
                theirs.append(t2 - t1)
                assert len(found) == 1
            mine, base = statistics.median(ours), statistics.median(theirs)
            said = f"KnownHosts {mine * 1000:.1f} ms, paramiko HostKeys {base * 1000:.1f} ms: {mine / base:.4f}x"
            print(f"{lines} lines: {said}")


if __name__ == "__main__":
    main()
