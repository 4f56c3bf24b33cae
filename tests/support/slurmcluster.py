"""A real single-node Slurm cluster for the tests (docs/development.md: what was measured setting it up).

Debian's slurmctld + slurmd + munge, run as root with everything (key, config, state, spool, logs,
pids) under one temp dir and their own ports, so nothing in /etc is touched and another cluster on
the machine is not disturbed. The client commands find it through SLURM_CONF (`env`). The daemons
are stopped by their pids, never by name."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NEEDED = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol")

CONF = """\
ClusterName=enlacetest
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmdSpoolDir={dir}/spool
StateSaveLocation={dir}/state
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
KillWait=30
MinJobAge=600
SchedulerParameters=sched_interval=2
NodeName={host} CPUs={cpus} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> list[str]:
    return [c for c in NEEDED if not shutil.which(c) and not Path("/usr/sbin", c).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    dir: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    cpus: int = 2

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, env={**os.environ, **self.env}, capture_output=True, text=True, check=check, timeout=60
        )

    def start(self, timeout: float = 60) -> None:
        for sub in ("spool", "state"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        shutil.chown(self.dir, "munge", "munge")  # munged writes its socket, pid and seed here
        subprocess.run(
            [
                _sbin("munged"),
                f"--key-file={key}",
                f"--socket={self.dir}/munge.socket",
                f"--pid-file={self.dir}/munged.pid",
                f"--log-file={self.dir}/munged.log",
                f"--seed-file={self.dir}/munged.seed",
            ],
            check=True,
            user="munge",
        )
        self.conf.write_text(
            CONF.format(host=self.host, dir=self.dir, ctld_port=_free_port(), d_port=_free_port(), cpus=self.cpus)
        )
        env = {**os.environ, **self.env}
        subprocess.run([_sbin("slurmctld"), "-L", str(self.dir / "slurmctld.log")], env=env, check=True)
        subprocess.run([_sbin("slurmd"), "-L", str(self.dir / "slurmd.log")], env=env, check=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
            if out == "idle":
                return
            time.sleep(0.3)
        raise RuntimeError(f"slurm node not idle after {timeout}s (sinfo: {out!r}); slurmctld.log:\n" + self.log_tail())

    def log_tail(self) -> str:
        return "\n".join(
            (self.dir / n).read_text(errors="replace")[-1500:]
            for n in ("slurmctld.log", "slurmd.log")
            if (self.dir / n).exists()
        )

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons by their pids (never by name)."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root", check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            pidfile = self.dir / f"{name}.pid"
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                    time.sleep(0.05)

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", job_id, "-o", check=False).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "")
