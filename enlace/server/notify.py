"""Telling someone a run ended: a small JSON document POSTed to a URL — a Slack or Mattermost incoming
webhook shows its `text` as it is; ntfy and any other endpoint get the whole document. The supervisor sends
it once the run's final status is recorded, so a dead or slow endpoint never delays or changes the run;
each try is bounded (TIMEOUT_S), there are TRIES of them, and each outcome is a `supervisor:` line in
train.log. The URL is never written whole (a webhook's path is its secret): only its scheme and host; the
supervisor has it in its environment, which only its own account can read.

A sweep's end on this host is told once, by the supervisor of whichever of its runs here tells its end last:
when every run of the sweep this host was given has ended and each one's end was told (run.json's `end_told`
names the launch whose end was), or its supervisor is gone and never will (stop --kill). So `sweep_end` comes
after every `run_end` (runs stopped together had it arrive between two). A marker file created exclusively
makes it once.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enlace.clitypes import shown_url
from enlace.contract import ACTIVE, ENDED_CLEANLY, Status, metric_words, sweep_metric
from enlace.state import runs
from enlace.units import duration

TRIES = 3
TIMEOUT_S = 5.0  # one try's limit: connecting, sending, the answer's status line
WAIT_S = 1.0  # before the second try; twice that before the third


def post(
    url: str, doc: dict[str, Any], say: Callable[[str], None], tries: int = TRIES, timeout: float = TIMEOUT_S
) -> bool:
    """POST `doc` as JSON to `url`, up to `tries` times; True once an endpoint answered 2xx. Never raises."""
    body = json.dumps(doc).encode()
    why = "no try"
    for attempt in range(1, tries + 1):
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "enlace"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                say(
                    f"notified {shown_url(url)} of the {doc['event'].replace('_', ' ')} ({doc['status']}): HTTP {answer.status}"
                )
                return True
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            why = str(getattr(e, "reason", e)) or e.__class__.__name__
        if attempt < tries:
            time.sleep(WAIT_S * 2 ** (attempt - 1))
    say(
        f"could not notify {shown_url(url)} of the {doc['event'].replace('_', ' ')}: {why}, {tries} tries; the run is not affected"
    )
    return False


def run_end(run_dir: Path, host: str) -> dict[str, Any]:
    """The document for the end of the run in `run_dir` (its final status as status shows it)."""
    row = runs.observe(run_dir)
    st = runs.read(run_dir)
    status = row["status"]
    gave_up = status == Status.CRASHED and "gave up" in (row.get("error") or "")
    word = "gave up" if gave_up else status
    text = f"enlace: {row['run_name']} on {host} {word}"
    if row.get("max_steps"):
        text += f" at step {row['step']}/{row['max_steps']}"
    elif row.get("step"):  # a command of your own: no max_steps
        text += f" at step {row['step']}"
    elif not row.get("command"):  # (a command that logs no steps says only how it ended)
        text += " before it started"
    metric = sweep_metric([row])
    if row.get(metric) is not None:
        text += f", {metric_words(metric)} {row[metric]:.4f}"
    if row.get("elapsed_s"):
        text += f", after {duration(row['elapsed_s'])}"
    if Status(status) not in ENDED_CLEANLY and row.get("error"):
        text += f": {row['error']}"
    return {
        "event": "run_end",
        "run": row["run_name"],
        "host": host,
        "status": status,
        "gave_up": gave_up,
        "step": row["step"],
        "max_steps": row["max_steps"],
        "metric": {"val_bpb": row.get("val_bpb"), "val_loss": row.get("val_loss"), "loss": row.get("loss")},
        "elapsed_s": row.get("elapsed_s"),
        "exit_code": row.get("exit_code"),
        "sweep": st.get("sweep"),
        "text": text,
    }


def sweep_end(runs_root: Path, sweep: str, share: int, host: str) -> dict[str, Any] | None:
    """The document for the end of `sweep` on this host, once all `share` of its runs here have ended and only
    for the first caller to see it; else None."""
    states = {d: runs.read(d) for d in sorted(runs_root.iterdir()) if d.is_dir()}
    rows = [runs.observe(d) for d, st in states.items() if st.get("sweep") == sweep]
    if len(rows) < share or any(Status(r["status"]) in ACTIVE for r in rows):
        return None
    if not all(_told(st) for st in states.values() if st.get("sweep") == sweep):  # its supervisor tells it next
        return None
    try:
        os.close(os.open(runs_root / f".sweep-{sweep}.told", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    finished = sum(r["status"] == Status.FINISHED for r in rows)
    metric = sweep_metric(rows)
    scored = [r for r in rows if r.get(metric) is not None and r["status"] == Status.FINISHED]  # not a step-0 eval
    best = min(scored, key=lambda r: r[metric]) if scored else None
    text = f"enlace: sweep {sweep} on {host} ended: {finished}/{len(rows)} finished"
    if best:
        text += f"; best {best['run_name']} ({metric_words(metric)} {best[metric]:.4f})"
    return {
        "event": "sweep_end",
        "sweep": sweep,
        "host": host,
        "status": "ended",
        "runs": {r["run_name"]: r["status"] for r in rows},
        "best": best["run_name"] if best else None,
        "metric": {metric: best[metric]} if best else {},
        "text": text,
    }


def _told(st: dict[str, Any]) -> bool:
    """Whether a run's end was told (tried) by this launch's supervisor, or can no longer be: it is gone."""
    told = st.get("end_told") is not None and st.get("end_told") == st.get("launch_id")
    return told or not runs.proc_alive(st.get("launcher_pid"), st.get("launcher_start"))


def after_run(run_dir: Path, url: str, host: str, say: Callable[[str], None]) -> None:
    """Tell `url` that the run ended, then, if it was its sweep's last here, that the sweep did."""
    post(url, run_end(run_dir, host), say)
    st = runs.read(run_dir)
    if st.get("sweep"):
        with contextlib.suppress(OSError):
            runs.update(run_dir, end_told=st.get("launch_id"))
            doc = sweep_end(run_dir.parent, st["sweep"], int(st.get("sweep_share") or 1), host)
            if doc:
                post(url, doc, say)
