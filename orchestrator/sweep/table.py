"""A sweep's runs as one table: each run's values, status, step and metric, ranked by the metric (lower is
better: val bits/byte for enlace's trainer; finished runs first, since an unfinished run's figure may be its
untrained step-0 eval's), the best finished run marked, and the progress line ("7/12 finished")."""

from __future__ import annotations

from collections import Counter

from orchestrator.sweep.record import Sweep

METRIC = "val_bpb"  # what ranks a sweep's runs (lower is better)


def rows_of(sweep: Sweep, found: dict[tuple[str, str], dict]) -> list[dict]:
    """Each point's status row (`found`: (host, run) → the server's row), ranked: best metric first, runs
    without one after, in grid order. A point its host does not know is `not launched`."""
    out = []
    for i, p in enumerate(sweep.points):
        row = found.get((p["host"], p["run_name"])) or {"run_name": p["run_name"], "status": "not launched", "step": 0}
        out.append({**row, "host": p["host"], "values": p["values"], "point": i})
    # finished runs first: a running or stopped run's val bpb may be its untrained step-0 eval's
    out.sort(key=lambda r: (r.get(METRIC) is None, r["status"] != "finished", r.get(METRIC) or 0.0, r["point"]))
    for r in out:
        r["best"] = False
    if out and out[0].get(METRIC) is not None and out[0]["status"] == "finished":
        out[0]["best"] = True
    return out


def progress(rows: list[dict]) -> str:
    """`7/12 finished (2 running, 3 queued)`: how far the sweep is."""
    counts = Counter(r["status"] for r in rows)
    rest = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "finished")
    return f"{counts.get('finished', 0)}/{len(rows)} finished" + (f" ({rest})" if rest else "")


def format_table(sweep: Sweep, rows: list[dict]) -> str:
    head = ("", "RUN", "HOST", *sweep.keys, "STATUS", "STEP", "VAL BPB")
    table = [head]
    for r in rows:
        step = f"{r.get('step') or 0}/{r['max_steps']}" if r.get("max_steps") else str(r.get("step") or 0)
        metric = f"{r[METRIC]:.4f}" if r.get(METRIC) is not None else "-"
        table.append(
            (
                "*" if r.get("best") else "",
                r["run_name"],
                r["host"],
                *(r["values"][k] for k in sweep.keys),
                r["status"],
                step,
                metric,
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    best = next((r for r in rows if r.get("best")), None)
    tail = f"; best {best['run_name']} (val bpb {best[METRIC]:.4f})" if best else ""
    return "\n".join([f"sweep {sweep.name}: {sweep.run_file}, {progress(rows)}{tail}", *lines])
