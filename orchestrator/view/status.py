"""The status table: one host's runs, or every host's asked in parallel; Slurm runs get a SLURM column."""

from __future__ import annotations

import shlex
import time

from enlace.contract import ErrorKind, Status
from enlace.errors import EnlaceError
from enlace.units import DETAIL_WIDTH, duration, loss_figure, one_line
from orchestrator.errors import on_host

HOLDING = ("starting", "running", "stopping")  # a run in one of these holds the GPUs its row names


def format_status(rows: list[dict], hosts: bool = False, full: bool = False, host: str = "") -> str:
    """The status table; with `hosts`, rows carry a "host", and a host that did not answer is a row with a
    "host_error". A run's error and checkpoint warning go on a detail line under its row (cut to
    DETAIL_WIDTH unless `full`), so the STATUS column keeps its width; the commands it names are for its
    host (`host`: the one host's name)."""
    now = time.time()
    jobs = any(r.get("job_id") for r in rows)
    # a script of your own that logs a val loss but no val bpb (enlace.job): its own unit, its own column
    val_loss = any(r.get("val_loss") is not None and r.get("val_bpb") is None for r in rows)
    head = (
        *(("HOST",) if hosts else ()),
        "RUN",
        "STATUS",
        "STEP",
        "LOSS",
        "VAL BPB",
        *(("VAL LOSS",) if val_loss else ()),
        "TOK/S",
        "ELAPSED",
        "ETA",
        "AGE",
        "COMMIT",
        *(("SLURM",) if jobs else ()),
    )
    table, details = [head], [[]]
    for r in rows:
        lead = (r["host"],) if hosts else ()
        if r.get("host_error"):
            table.append((*lead, "-", r["host_error"]))
            details.append([])
            continue
        table.append(
            (
                *lead,
                r["run_name"],
                r["status"]
                + (f" on GPU {','.join(map(str, r['gpus']))}" if r.get("gpus") and r["status"] in HOLDING else "")
                + (", unsupervised" if r.get("supervisor") else "")
                + (f" (restarted {r['restarts']}×)" if r.get("restarts") else ""),
                f"{r['step']}/{r['max_steps'] or '-'}" if r["step"] or not r.get("command") else "-",
                loss_figure(r["loss"]),
                f"{r['val_bpb']:.3f}" if r.get("val_bpb") is not None else "-",
                *((loss_figure(r.get("val_loss")),) if val_loss else ()),
                f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-",
                _elapsed(r),
                duration(r["eta_s"]),
                duration(now - r["updated_at"]) if r.get("updated_at") else "-",
                (r["commit"] or "-")[:12],
                *((slurm_cell(r),) if jobs else ()),
            )
        )
        details.append(_details(r, full, r.get("host") or host))
    widths = [max(len(str(row[i])) for row in table if len(row) == len(head)) for i in range(len(head))]
    lines = []
    for row, extra in zip(table, details):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        lines += extra
    return "\n".join(lines)


def _elapsed(row: dict) -> str:
    """Training time over all the run's starts; this start's beside it when there were others."""
    total, this = row.get("elapsed_s"), row.get("start_elapsed_s")
    if total is None or this is None or total - this < 1:
        return duration(total)
    return f"{duration(total)} ({duration(this)} this start)"


def _details(row: dict, full: bool, host: str = "") -> list[str]:
    """The lines under a run's row: why it failed, a skipped checkpoint; the commands they name are for `host`."""
    found = []
    if sup := row.get("supervisor"):
        when = time.strftime("%H:%M:%S", time.localtime(sup["since"])) if sup.get("since") else "?"
        found.append(
            f"supervisor {sup['state']} since {when}, nothing heals it: enlace-remote launch {row['run_name']}"
            " resumes it under a new supervisor"
        )
    ended = row.get("command") and row["status"] in ("finished", "stopped") and row.get("phase")
    if row.get("command"):  # a run of the user's own command: how it ended (first: a long command is cut), what ran
        found.append(
            f"{row['phase']} — {shlex.join(row['command'])}" if ended else f"command: {shlex.join(row['command'])}"
        )
    if row["status"] == "queued" and row.get("phase"):
        found.append(f"queued: {row['phase']}")
    if row["status"] == "starting" and (row.get("phase") or "").startswith("restarting in "):  # the supervisor's
        found.append(row["phase"])  # backoff after a crash: when, which restart, and why (STEP is the last logged)
    queued_stop = row["status"] == "stopped" and (row.get("phase") or "").startswith("stopped while queued")
    if queued_stop and not row.get("command"):  # (a command's line above says it already)
        found.append(row["phase"])
    if row["status"] == "dropped":
        found.append(
            f"was queued; its waiter is gone (a reboot, a kill): enlace-remote launch {row['run_name']} queues it again"
        )
    said = ended and row.get("phase") == row.get("error")  # (the command's line says it: stop --kill; a crash: not)
    if row.get("error") and row["status"] in ("failed", "stopped", "crashed") and not said:
        found.append(f"error: {row['error']}")
    if row.get("checkpoint_warning"):
        found.append(f"warning: {row['checkpoint_warning']}")
    if row.get("data_warning"):
        found.append(f"warning: {row['data_warning']}")
    more = on_host(f" (enlace-remote status {row['run_name']}: all of it)", host)
    width = None if full else DETAIL_WIDTH  # cut after --host is in: the line keeps its width
    return [f"    └ {one_line(on_host(text, host), width, more)}" for text in found]


def slurm_cell(row: dict) -> str:
    """`job 12 PENDING (Priority), requeued 2×` for a Slurm run, `-` for the others."""
    if not row.get("job_id"):
        return "-"
    # a job Slurm no longer lists (its MinJobAge passed): ended, for a run that ended; gone, for one that had not
    ended = row.get("status") in {s.value for s in Status if s.is_terminal}
    text = f"job {row['job_id']} {row.get('slurm_state') or ('ended, no longer listed' if ended else 'gone')}"
    if row.get("status") == "stopped" and row.get("slurm_state") in ("COMPLETED", "CANCELLED"):
        text += " (stopped)"  # how Slurm recorded the job a stop ended: a clean end either way
    if row.get("slurm_reason") and row.get("slurm_state") not in ("RUNNING", "COMPLETED", "CANCELLED"):
        text += f" ({row['slurm_reason']})"
    if row.get("requeues"):
        text += f", requeued {row['requeues']}×"
    if row.get("requeue_limit_reached"):
        text += ", max_requeues reached"
    return text


NO_RUNS = "no runs on this host"


def runs_here(session, run_name: str | None) -> list[dict]:
    """The host's rows (RUN_NAME's alone when named); a host nothing was launched on yet has none (its
    status said "run enlace-remote sync first", exit 2: a newcomer's first `status` was an error)."""
    try:
        return session.enlace_json("latest", "runs", *([run_name] if run_name else []), "--json")
    except EnlaceError as e:
        if run_name or getattr(e, "kind", None) != ErrorKind.NOT_SYNCED:
            raise
        return []


def status_everywhere(hosts: list, session_for) -> list[dict]:
    """Every run on every host, the hosts asked in parallel; a host that does not answer is one row saying
    so (never an abort). Takes as long as the slowest host."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(host) -> list[dict]:
        try:
            rows = session_for(host).enlace_json("latest", "runs")
        except EnlaceError as e:
            text = e.format_message().splitlines()[0]
            if getattr(e, "kind", None) == ErrorKind.NOT_SYNCED:
                return [{"host": host.name, "host_error": "no runs (nothing synced there yet)"}]
            return [{"host": host.name, "host_error": f"unreachable: {text.removeprefix('on ' + host.name + ': ')}"}]
        return [{"host": host.name, **r} for r in rows] or [{"host": host.name, "host_error": "no runs"}]

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return [row for rows in pool.map(ask, hosts) for row in rows]
