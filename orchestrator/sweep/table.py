"""A sweep's runs as one table: each run's values, status, step and metric, ranked by the metric (lower is
better: val bits/byte for enlace's trainer, else the val loss a script of your own logs: enlace/contract.py's
sweep_metric; finished runs first, since an unfinished run's figure may be its untrained step-0 eval's), the best
finished run marked, and the progress line ("7/12 finished")."""

from __future__ import annotations

from collections import Counter

from enlace.contract import metric_words, sweep_metric
from enlace.units import DETAIL_WIDTH, loss_figure, one_line
from orchestrator.sweep.record import Sweep

NOT_LAUNCHED = "not launched"  # a point its host has no run of (yet: a `sweep` may still be launching it)
NO_ANSWER = "no answer"  # a point whose host did not answer: where it stands is not known


def rows_of(sweep: Sweep, found: dict[tuple[str, str], dict], silent: frozenset[str] = frozenset()) -> list[dict]:
    """Each point's status row (`found`: (host, run) → the server's row), ranked: best metric first, runs
    without one after, in grid order. A point its host does not know is `not launched`; one on a host that did
    not answer (`silent`), `no answer`."""
    out = []
    for i, p in enumerate(sweep.points):
        unknown = NO_ANSWER if p["host"] in silent else NOT_LAUNCHED
        row = found.get((p["host"], p["run_name"])) or {"run_name": p["run_name"], "status": unknown, "step": 0}
        out.append({**row, "host": p["host"], "values": p["values"], "point": i})
    metric = sweep_metric(out)
    # finished runs first: a running or stopped run's val bpb may be its untrained step-0 eval's
    out.sort(key=lambda r: (r.get(metric) is None, r["status"] != "finished", r.get(metric) or 0.0, r["point"]))
    for r in out:
        r["best"], r["metric"] = False, metric
    if out and out[0].get(metric) is not None and out[0]["status"] == "finished":
        out[0]["best"] = True
    return out


def progress(rows: list[dict]) -> str:
    """`7/12 finished (2 running, 3 queued)`: how far the sweep is."""
    counts = Counter(r["status"] for r in rows)
    rest = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "finished")
    return f"{counts.get('finished', 0)}/{len(rows)} finished" + (f" ({rest})" if rest else "")


def format_table(sweep: Sweep, rows: list[dict]) -> str:
    """`rows` as rows_of ranked them (each says the metric that ranked it)."""
    metric = rows[0]["metric"]
    head = ("", "RUN", "HOST", *sweep.keys, "STATUS", "STEP", metric_words(metric).upper())
    table = [head]
    for r in rows:
        step = f"{r.get('step') or 0}/{r['max_steps']}" if r.get("max_steps") else str(r.get("step") or "-")
        figure = loss_figure(r.get(metric))
        table.append(
            (
                "*" if r.get("best") else "",
                r["run_name"],
                r["host"],
                *(r["values"][k] for k in sweep.keys),
                r["status"],
                step,
                figure,
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = []
    for row, r in zip(table, [{}, *rows]):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if r.get("error") and r["status"] in ("failed", "crashed"):  # why, in a line
            more = f" (enlace-remote --host {r['host']} status {r['run_name']}: all of it)"
            lines.append(f"    └ {one_line('error: ' + r['error'], DETAIL_WIDTH, more)}")
    best = next((r for r in rows if r.get("best")), None)
    tail = f"; best {best['run_name']} ({metric_words(metric)} {loss_figure(best[metric])})" if best else ""
    return "\n".join([f"sweep {sweep.name}: {sweep.run_file}, {progress(rows)}{tail}", *lines])
