"""What one board poll costs the laptop for a long run's curves: the file parsed afresh on every poll and
every point sent (as the board did before curves.py) against the curves kept between polls, extended by
what the file gained, and thinned to MAX_POINTS a curve. Same process, same file, medians of --reps polls.

    python bench/board_curves.py [--records 300000] [--reps 5]

The run: --records train records (one per logged step) with an eval every 100, then 20 new records per
poll (2 s of a fast run logging every step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enlace.tools.curves import Curves  # noqa: E402


def records(first: int, last: int) -> bytes:
    lines = []
    for s in range(first, last):
        lines.append({"kind": "train", "step": s, "loss": 2.0 + 1.0 / s, "lr": 3e-4, "tokens_per_s": 123456.7})
        if s % 100 == 0:
            lines.append({"kind": "eval", "step": s, "val_bpb": 1.5 + 1.0 / s})
    return "".join(json.dumps(r) + "\n" for r in lines).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    data = records(1, args.records + 1)
    kept = Curves()
    kept.update(data)
    afresh_s, kept_s, afresh_bytes, kept_bytes = [], [], 0, 0
    for rep in range(args.reps):
        first = args.records + 1 + rep * 20
        data += records(first, first + 20)

        t = time.process_time()  # before: a new parse of the whole file, every point in the answer
        fresh = Curves()
        fresh.update(data)
        afresh_bytes = len(json.dumps(fresh.view(max_points=len(data))))
        afresh_s.append(time.process_time() - t)

        t = time.process_time()  # now: the new lines only, thinned
        kept.update(data)
        kept_bytes = len(json.dumps(kept.view()))
        kept_s.append(time.process_time() - t)

    a, k = statistics.median(afresh_s), statistics.median(kept_s)
    print(
        json.dumps(
            {
                "records": args.records,
                "file_mib": round(len(data) / 2**20, 1),
                "afresh_cpu_s": round(a, 3),
                "kept_cpu_s": round(k, 4),
                "kept_over_afresh": round(k / a, 4),
                "answer_bytes_afresh": afresh_bytes,
                "answer_bytes_kept": kept_bytes,
            }
        )
    )


if __name__ == "__main__":
    main()
