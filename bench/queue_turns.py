"""The server's queue (enlace/server/queue.py): what a turn costs with 100 runs waiting against 1 (in one process,
alternated, CPU slots, so no nvidia-smi), and how long a freed slot stays idle before the next run in line
takes it (real waiter processes, as supervisors are; the waiter looks every POLL_S).

    python bench/queue_turns.py [--reps 200] [--handoffs 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enlace.server import needs, queue  # noqa: E402

WAITER = REPO / "tests" / "support" / "waiter.py"


def turn_cost(base: Path, waiting: int, reps: int) -> list[float]:
    """Seconds per turn of the last of `waiting` tickets (one CPU slot, held: nobody is seated)."""
    settings = needs.Settings(1, 0.1, base / f"q{waiting}")
    holder = queue._enqueue(settings.dir, base / "runs" / "holder", needs.Need("cpu", 1))
    seat, _ = queue._turn(holder, settings, base / "runs" / "holder")
    holder.close()
    tickets = [queue._enqueue(settings.dir, base / "runs" / f"w{i}", needs.Need("cpu", 1)) for i in range(waiting)]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        got, _ = queue._turn(tickets[-1], settings, base / "runs" / "last")
        times.append(time.perf_counter() - t)
        assert got is None
    for ticket in tickets:
        ticket.close()
    seat.release()
    return times


def handoff(base: Path, n: int) -> list[float]:
    """Seconds from a holder's exit to the next waiter seated, `n` times in a row (real processes)."""
    qdir = base / "handoff" / "queue"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    order = qdir.parent / "order"
    procs = []
    for i in range(n + 1):
        procs.append(
            subprocess.Popen([sys.executable, str(WAITER), str(qdir), str(base / "h" / f"r{i}"), "cpu:1", "1"], env=env)
        )
        while len(list((qdir / "tickets").glob("*.json"))) < (i if i else 0) or (i == 0 and not order.exists()):
            time.sleep(0.01)
    gaps = []
    for i in range(n):
        seated = len(order.read_text().splitlines())
        t = time.monotonic()
        (qdir.parent / f"release-r{i}").touch()
        procs[i].wait()
        while len(order.read_text().splitlines()) == seated:
            time.sleep(0.005)
        gaps.append(time.monotonic() - t)
    (qdir.parent / f"release-r{n}").touch()
    procs[n].wait()
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--handoffs", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        one, hundred = [], []
        for _ in range(5):  # alternated: the machine's noise falls on both
            one += turn_cost(base / f"a{len(one)}", 1, args.reps // 5)
            hundred += turn_cost(base / f"b{len(hundred)}", 100, args.reps // 5)
        m1, m100 = statistics.median(one), statistics.median(hundred)
        print(f"turn, 1 waiting: {m1 * 1e3:.2f} ms; 100 waiting: {m100 * 1e3:.2f} ms; ratio {m100 / m1:.1f}x")
        gaps = handoff(base, args.handoffs)
        print(
            f"freed slot to next run seated (poll {queue.POLL_S:g} s): median {statistics.median(gaps):.2f} s, "
            f"max {max(gaps):.2f} s over {len(gaps)}"
        )


if __name__ == "__main__":
    main()
