"""Operations on a host that go beyond shipping code: verify, preflight, launch, status, stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from enlace.config import validate_run_name
from enlace.exitcodes import VERDICT
from enlace.report import duration
from enlace.runs import ended_message, exit_code_of
from orchestrator.errors import AlreadyRunning, RemoteError, UsageError, VerifyError, for_exit_code
from orchestrator.session import Session


def check_run_config(repo: Path, run: str) -> str:
    """RUN names configs/runs/RUN.yaml in this checkout (what sync ships): a typo is caught here, before any
    connection, with the closest names."""
    import difflib

    validate_run_name(run, "RUN")
    have = sorted(p.stem for p in (repo / "configs" / "runs").glob("*.yaml"))
    if run not in have:
        close = difflib.get_close_matches(run, have, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"no run config {run!r} in configs/runs/ — {hint}runs: {', '.join(have) or 'none'}")
    return run


def set_args(overrides: tuple[str, ...] | list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def verify(session: Session, sha: str, run: str, for_launch: bool = False, overrides=()) -> dict:
    """The server-side checklist for RUN in trees/SHA; prints it, raises VerifyError naming what is missing."""
    args = [sha, session.host.python, run] + (["--for-launch"] if for_launch else []) + set_args(overrides)
    doc = session.call_json("verify", *args, ok_codes=(0, 3))
    if "checks" not in doc:
        raise VerifyError(f"verify on {session.host.name}: {doc.get('error', 'failed')}")
    for c in doc["checks"]:
        mark = " ok " if c["ok"] else "FAIL"
        click.echo(f"  [{mark}] {c['name']}" + (f" — {c['detail']}" if c["detail"] else ""), err=True)
    if not doc["ok"]:
        failed = "; ".join(f"{c['name']}: {c['detail']}" for c in doc["checks"] if not c["ok"])
        raise VerifyError(f"verify {run} on {session.host.name} failed: {failed}")
    click.echo(f"verify: {run} ready on {session.host.name} at {sha[:12]}", err=True)
    return doc


# -- which run ---------------------------------------------------------------------------------


def _last_runs_file(repo: Path) -> Path:
    return repo / ".enlace" / "last-runs.json"


def remember_run(repo: Path, host: str, run: str) -> None:
    path = _last_runs_file(repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = json.loads(path.read_text()) if path.exists() else {}
    table[host] = run
    path.write_text(json.dumps(table, indent=1) + "\n")


def choose_run(repo: Path, host, run: str | None, last_first: bool = False) -> str:
    """RUN as given; else the host's default_run, then the last run launched there from this repo (for
    launch); with `last_first` (logs, fetch: what you just launched) the other way round."""
    if run:
        return validate_run_name(run, "RUN")
    path = _last_runs_file(repo)
    last = json.loads(path.read_text()).get(host.name) if path.exists() else None
    choices = [
        (host.default_run, f"default_run of host {host.name}"),
        (last, f"the last run launched on {host.name} from this repo"),
    ]
    for name, why in reversed(choices) if last_first else choices:
        if name:
            click.echo(f"run: {name} ({why})", err=True)
            return validate_run_name(name, "RUN")
    raise UsageError(
        f"no RUN given, host {host.name} has no default_run and nothing was launched there from "
        "this repo yet — name the run, e.g. `enlace-remote launch smoke-cpu`"
    )


# -- preflight ----------------------------------------------------------------------------------


def remote_preflight(session: Session, sha: str, run: str, repo: Path, run_name: str, extra: list[str]) -> dict:
    """Run `enlace preflight RUN --json` on the server (on a Slurm host: as a short job on a compute node),
    streaming its progress lines; save the report under the local runs/<run_name>/ and print the table.
    If this client dies, so does the server's preflight (it must not overlap the next one on the GPU)."""
    from enlace.report import format_report

    args = ("preflight", run, "--json", *extra)
    if session.host.slurm:
        from orchestrator.slurm import on_node

        args = on_node(session.host.slurm, args)
    report = session.stream_json(
        sha,
        *args,
        on_progress=lambda line: click.echo(line, err=True),
        stall_timeout=900,
        ok_codes=(0, *VERDICT.values()),
    )
    local = repo / "runs" / run_name
    local.mkdir(parents=True, exist_ok=True)
    (local / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    click.echo(format_report(report))
    return report


# -- launch / status / stop --------------------------------------------------------------------


def worth_launching(session: Session, run_name: str, overrides=()) -> bool:
    """Before any preflight: a live run is refused at once (its preflight would compete with it); a
    finished run is said to be finished, with how to extend it (False: nothing to launch)."""
    rows = [r for r in session.enlace_json("latest", "runs") if r["run_name"] == run_name]
    if not rows:
        return True
    row = rows[0]
    if row["alive"]:
        raise AlreadyRunning(_running_message(session, row))
    extends = any(o.startswith("training.max_steps=") for o in overrides)
    if row["status"] == "finished" and not extends:
        click.echo(
            f"{run_name} is finished: step {row['step']} of {row['max_steps']} (checkpoint "
            f"{row['latest_checkpoint']}); nothing to train. To train further, raise max_steps: "
            f"`enlace-remote launch {run_name} --set training.max_steps={2 * (row['max_steps'] or 1)}` "
            "resumes from that checkpoint",
            err=True,
        )
        return False
    return True


def _running_message(session: Session, row: dict) -> str:
    name = row["run_name"]
    return (
        f"{name} is already running on {session.host.name} (pid {row['pid']}, step {row['step']}/"
        f"{row['max_steps']}, status {row['status']}) — `enlace-remote stop {name}` first, or follow it with "
        f"`enlace-remote logs {name} -f`"
    )


def train_command(run: str, train_args: list[str], gpus: str | None, rendezvous: dict | None = None) -> list[str]:
    """The python arguments that start training: `-m enlace train RUN`, under torchrun for --gpus."""
    train = ["-m", "enlace", "train", run, *train_args]
    if not gpus:
        return train
    nproc = "gpu" if gpus == "all" else gpus  # torchrun's "gpu": every visible GPU
    if rendezvous is None:
        return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *train]
    # Several hosts: a fixed node rank per host (node 0 = the first host, which holds rank 0, its
    # log and its checkpoints), rendezvous at the first host.
    return [
        "-m",
        "torch.distributed.run",
        f"--nnodes={rendezvous['nnodes']}",
        f"--node-rank={rendezvous['node_rank']}",
        f"--master-addr={rendezvous['addr']}",
        f"--master-port={rendezvous['port']}",
        f"--nproc-per-node={nproc}",
        *train,
    ]


def start_detached(session: Session, sha: str, run_name: str, pyargs: list[str]) -> dict:
    """Start `python PYARGS` (the trainer, or torchrun) detached on the host: `enlace start`, which
    refuses a live run. Not retried after a dropped session (it may have started): a rerun says so."""
    try:
        doc = session.enlace_json(sha, "start", run_name, "--", *pyargs, idempotent=False)
    except AlreadyRunning:
        row = session.enlace_json("latest", "runs", run_name)[0]
        raise AlreadyRunning(_running_message(session, row)) from None
    click.echo(f"launched {run_name} on {session.host.name}: pid {doc['pid']}, commit {sha[:12]}", err=True)
    return doc


def log_since(session: Session, run_name: str, offset: int) -> str:
    return session.transport.run(
        session.enlace_argv("latest", "logs", run_name, "--offset", str(offset)), check=False
    ).stdout


def wait_first_step(session: Session, run_name: str, started: dict, wait_s: float = 600) -> dict:
    """Wait (on the server, one call) until the trainer we started logged a step or ended; show its
    phases meanwhile. A run that ended badly fails here with its error and log tail."""
    row = session.stream_json(
        "latest",
        "wait",
        run_name,
        "--launch-id",
        started["launch_id"],
        "--timeout",
        str(wait_s),
        on_progress=lambda line: click.echo(line, err=True),
        stall_timeout=wait_s + 60,
    )
    if row["waited"] == "timeout":
        where = f"Slurm job {row['job_id']}, {row['slurm_state']}" if row.get("job_id") else f"pid {started['pid']}"
        raise RemoteError(
            f"{run_name}: no step logged within {wait_s:.0f}s (phase: {row['phase']}); it is still "
            f"{row['status']} ({where}) — follow it with `enlace-remote logs {run_name} -f`"
        )
    if row["status"] not in ("running", "finished", "stopped"):
        tail = "\n".join(log_since(session, run_name, started["log_offset"]).strip().splitlines()[-20:])
        raise for_exit_code(exit_code_of(row), f"{ended_message(row)}\n{tail}")
    how = (
        f"resumed from checkpoints/{row['resumed_from']}"
        if row["resumed_from"]
        else "no complete checkpoint: starting from step 0"
    )
    click.echo(f"{run_name}: {how}; step {row['step']}/{row['max_steps']}, status {row['status']}", err=True)
    return row


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
