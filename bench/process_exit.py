"""CPU a torch process spends on its way out: `contract.leave` (atexit hooks, then os._exit) against
`sys.exit` (the interpreter's full teardown), in fresh interpreters that imported what a trainer
imports and built an optimizer, taking turns (A B B A ...; the machine is noisy). Every trainer,
preflight and sample process ends this way, so what it saves is paid once per process.

    python bench/process_exit.py [--pairs 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BODY = """
import sys, torch
import enlace.train.loop
from enlace.contract import leave
from enlace.train.optim import AdamW
AdamW([{{"params": torch.nn.Linear(8, 8).parameters()}}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
{end}
"""
ENDS = {"leave": "leave(0)", "sys.exit": "sys.exit(0)"}


def cpu_seconds(end: str) -> float:
    """user + system CPU of one fresh interpreter, from its start to its exit."""
    proc = subprocess.Popen([sys.executable, "-c", BODY.format(end=ENDS[end])], cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the {end} child failed")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    args = ap.parse_args()
    times: dict[str, list[float]] = {end: [] for end in ENDS}
    for i in range(args.pairs):
        order = list(ENDS) if i % 2 == 0 else list(ENDS)[::-1]
        for end in order:
            times[end].append(cpu_seconds(end))
    med = {end: statistics.median(v) for end, v in times.items()}
    print(
        json.dumps(
            {
                "cpu_s_median": {k: round(v, 3) for k, v in med.items()},
                "leave_over_sys_exit": round(med["leave"] / med["sys.exit"], 3),
                "saved_cpu_s_per_process": round(med["sys.exit"] - med["leave"], 3),
                "runs": {k: [round(x, 2) for x in v] for k, v in times.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
