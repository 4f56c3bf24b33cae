"""One run's place in a server's queue, as its supervisor takes it (enlace/server/queue.py), without the
trainer: `python waiter.py QUEUE_DIR RUN_DIR NEED CPU_SLOTS` waits for its seat, appends `RUN GPUS` to
QUEUE_DIR/../order once seated, then holds the seat until QUEUE_DIR/../release-RUN exists. With --child it
hands its seat's locks to a child process (`sleep`, as the supervisor hands them to the trainer) and prints the
child's pid; each reason it waited for goes to RUN_DIR/waits, one per line."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from enlace.server import needs, queue


def main(qdir: str, run_dir: str, need: str, cpu_slots: str, *flags: str) -> None:
    import subprocess

    base, run = Path(qdir).parent, Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    waits = run / "waits"
    settings = needs.Settings(int(cpu_slots), 0.1, Path(qdir))

    def heard(why: str) -> None:
        with open(waits, "a") as fh:
            fh.write(why + "\n")

    seat = queue.wait_for_seat(run, needs.Need.parse(need), settings, lambda: False, lambda: None, heard)
    child = None
    if "--child" in flags:
        child = subprocess.Popen(["sleep", "600"], pass_fds=seat.fds)
        (run / "child.pid").write_text(str(child.pid))
    with open(base / "order", "a") as fh:
        fh.write(f"{run.name} {','.join(map(str, seat.gpus)) or '-'}\n")
    release = base / f"release-{run.name}"
    while not release.exists():
        time.sleep(0.05)
    if child:
        child.kill()


if __name__ == "__main__":
    main(*sys.argv[1:])
