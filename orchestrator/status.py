"""The status table: one host's runs, or every host's asked in parallel; Slurm runs get a SLURM column."""

from __future__ import annotations

import time

from enlace.report import duration
from orchestrator.errors import RemoteError


def format_status(rows: list[dict], hosts: bool = False) -> str:
    """The status table; with `hosts`, rows carry a "host" (and a host that did not answer, an "error")."""
    now = time.time()
    jobs = any(r.get("job_id") for r in rows)
    head = (
        *(("HOST",) if hosts else ()),
        "RUN",
        "STATUS",
        "STEP",
        "LOSS",
        "VAL BPB",
        "TOK/S",
        "ELAPSED",
        "ETA",
        "AGE",
        "COMMIT",
        *(("SLURM",) if jobs else ()),
    )
    table = [head]
    for r in rows:
        lead = (r["host"],) if hosts else ()
        if r.get("error"):
            table.append((*lead, "-", r["error"]))
            continue
        table.append(
            (
                *lead,
                r["run_name"],
                r["status"],
                f"{r['step']}/{r['max_steps']}",
                f"{r['loss']:.4f}" if r["loss"] is not None else "-",
                f"{r['val_bpb']:.3f}" if r.get("val_bpb") is not None else "-",
                f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-",
                duration(r["elapsed_s"]),
                duration(r["eta_s"]),
                duration(now - r["updated_at"]) if r.get("updated_at") else "-",
                (r["commit"] or "-")[:12],
                *((slurm_cell(r),) if jobs else ()),
            )
        )
    widths = [max(len(str(row[i])) for row in table if i < len(row)) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def slurm_cell(row: dict) -> str:
    """`job 12 PENDING (Priority), requeued 2×` for a Slurm run, `-` for the others."""
    if not row.get("job_id"):
        return "-"
    text = f"job {row['job_id']} {row.get('slurm_state') or 'gone'}"
    if row.get("slurm_reason") and row.get("slurm_state") not in ("RUNNING", "COMPLETED"):
        text += f" ({row['slurm_reason']})"
    if row.get("requeues"):
        text += f", requeued {row['requeues']}×"
    if row.get("requeue_limit_reached"):
        text += ", max_requeues reached"
    return text


def status_everywhere(hosts: list, session_for) -> list[dict]:
    """Every run on every host, the hosts asked in parallel; a host that does not answer is one row saying
    so (never an abort). Takes as long as the slowest host."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(host) -> list[dict]:
        try:
            rows = session_for(host).enlace_json("latest", "runs")
        except RemoteError as e:
            text = e.format_message().splitlines()[0]
            if "nothing has been synced" in text:
                return [{"host": host.name, "error": "no runs (nothing synced there yet)"}]
            return [{"host": host.name, "error": f"unreachable: {text.removeprefix('on ' + host.name + ': ')}"}]
        return [{"host": host.name, **r} for r in rows] or [{"host": host.name, "error": "no runs"}]

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return [row for rows in pool.map(ask, hosts) for row in rows]
