"""A stand-in for `nvidia-smi`, because a GPU cannot exist on this machine: a script of that name, put first
on the (test) server's PATH, answers the two queries enlace/server/gpus.py asks from a JSON file the test
writes — how many GPUs, their memory, and other people's processes on them. Everything else the queue does
(locks, supervisors, trainers, CUDA_VISIBLE_DEVICES) is real."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = """#!{python}
# fake nvidia-smi for enlace's tests: answers from {state}
import json, sys
doc = json.load(open({state!r}))
args = " ".join(sys.argv[1:])
if "--query-gpu=" in args:
    for g in doc["gpus"]:
        print(f"{{g['index']}}, GPU-fake-{{g['index']}}, {{g['total_mib']}}, {{g['used_mib']}}")
elif "--query-compute-apps=" in args:
    for p in doc["processes"]:
        print(f"GPU-fake-{{p['gpu']}}, {{p['pid']}}, {{p['mib']}}")
else:
    sys.exit("fake nvidia-smi: only the queue's two queries are answered")
"""


class FakeGpus:
    """`count` GPUs of `total_mib` each; `foreign(gpu, pid, mib)` puts another user's process on one."""

    def __init__(self, base: Path, count: int, total_mib: int = 81559):
        self.bin = base / "fake-nvidia-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.state = base / "fake-gpus.json"
        self.count, self.total_mib, self.processes = count, total_mib, []
        self._write()
        exe = self.bin / "nvidia-smi"
        exe.write_text(SCRIPT.format(python=sys.executable, state=str(self.state)))
        exe.chmod(0o755)

    @property
    def path(self) -> str:
        """A PATH with the fake first."""
        return f"{self.bin}:{os.environ['PATH']}"

    def foreign(self, gpu: int, pid: int, mib: int) -> None:
        self.processes.append({"gpu": gpu, "pid": pid, "mib": mib})
        self._write()

    def clear(self) -> None:
        self.processes = []
        self._write()

    def _write(self) -> None:
        used = {i: sum(p["mib"] for p in self.processes if p["gpu"] == i) for i in range(self.count)}
        gpus = [{"index": i, "total_mib": self.total_mib, "used_mib": used[i]} for i in range(self.count)]
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": gpus, "processes": self.processes}))
        tmp.replace(self.state)
