"""Operations on a host that go beyond shipping code: verify, preflight, launch, status, stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from orchestrator.errors import CommandFailed, RemoteError, UsageError, VerifyError
from orchestrator.session import Session, check_run_name


def verify(session: Session, sha: str, run: str, for_launch: bool = False) -> dict:
    """The server-side checklist for RUN in trees/SHA; prints it, raises VerifyError naming what is missing."""
    args = [sha, session.host.python, run] + (["--for-launch"] if for_launch else [])
    doc = session.call_json("verify", *args, ok_codes=(0, 3))
    if "checks" not in doc:
        raise VerifyError(f"verify on {session.host.name}: {doc.get('error', 'failed')}")
    for c in doc["checks"]:
        mark = "ok " if c["ok"] else "FAIL"
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


def choose_run(repo: Path, host, run: str | None) -> str:
    """RUN as given; else the host's default_run; else the last run launched there from this repo."""
    if run:
        return check_run_name(run)
    if host.default_run:
        click.echo(f"run: {host.default_run} (default_run of host {host.name})", err=True)
        return check_run_name(host.default_run)
    path = _last_runs_file(repo)
    last = json.loads(path.read_text()).get(host.name) if path.exists() else None
    if last:
        click.echo(f"run: {last} (the last run launched on {host.name} from this repo)", err=True)
        return check_run_name(last)
    raise UsageError(f"no RUN given, host {host.name} has no default_run and nothing was launched there from "
                     "this repo yet — name the run, e.g. `enlace-remote launch smoke-cpu`")  # fmt: skip


def run_name_of(session: Session, sha: str, run: str) -> str:
    """The run_name RUN's config resolves to, asked of the server (its loader is the only schema)."""
    doc = session.enlace_json(sha, "check-config", run, "--json")
    return check_run_name(doc["run_name"], "run_name")


# -- preflight ----------------------------------------------------------------------------------


def remote_preflight(session: Session, sha: str, run: str, repo: Path, run_name: str, extra: list[str]) -> dict:
    """Run `enlace preflight RUN --json` on the server, streaming its progress lines; save the
    report under the local runs/<run_name>/ and print the table."""
    from enlace.report import format_report

    argv = session.argv("enlace", sha, session.host.python, "preflight", run, "--json", *extra)
    pending, report_lines, other = b"", [], []

    def on_data(chunk: bytes) -> None:
        # stderr (progress, "  ..." lines) and stdout (the JSON report, from a line "{") arrive
        # combined: echo progress as it comes, collect the report.
        nonlocal pending
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if report_lines or line == "{":
                report_lines.append(line)
            else:
                other.append(line)
                if not line.startswith("Error: "):  # an error is raised below, once
                    click.echo(line, err=True)

    code = session.transport.stream(argv, on_data, stall_timeout=900, combine_stderr=True)
    try:
        report = json.loads("\n".join(report_lines) + pending.decode(errors="replace"))
    except json.JSONDecodeError:
        errors = [line.removeprefix("Error: ") for line in other if line.startswith("Error: ")]
        if errors:  # the trainer's own one-line message (config, device, data)
            error = UsageError if code == 2 else RemoteError
            raise error(f"on {session.host.name}: preflight {run}: {errors[-1]}") from None
        raise CommandFailed(session.host.name, f"enlace preflight {run}", code, "\n".join(other)) from None
    local = repo / "runs" / run_name
    local.mkdir(parents=True, exist_ok=True)
    (local / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    click.echo(format_report(report))
    return report


# -- launch / status / stop --------------------------------------------------------------------


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
    return ["-m", "torch.distributed.run", f"--nnodes={rendezvous['nnodes']}", f"--node-rank={rendezvous['node_rank']}",
            f"--master-addr={rendezvous['addr']}", f"--master-port={rendezvous['port']}",
            f"--nproc-per-node={nproc}", *train]  # fmt: skip


def slurm_script(run: str, nodes: int, gpus: str, train_args: list[str]) -> str:
    """An sbatch script that starts RUN under Slurm: srun runs one torchrun per node, c10d
    rendezvous at the first node of the allocation. enlace does not schedule; Slurm does."""
    import shlex

    nproc = "gpu" if gpus == "all" else gpus
    train = shlex.join(["-m", "enlace", "train", run, *train_args])
    return f"""#!/bin/bash
# sbatch this from the repository root on the cluster (a shared filesystem holds runs/ and data/).
#SBATCH --job-name={run}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus if gpus.isdigit() else 1}
#SBATCH --output=runs/{run}-slurm-%j.log
# SIGTERM 2 minutes before the time limit: the trainer finishes its step, checkpoints and exits;
# resubmitting the script resumes from checkpoints/latest.
#SBATCH --signal=TERM@120
set -euo pipefail
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export ENLACE_COMMIT=$(git rev-parse HEAD)
srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node={nproc} --rdzv-backend=c10d \\
  --rdzv-endpoint="$head:29500" --rdzv-id="$SLURM_JOB_ID" {train}
"""


def start_detached(session: Session, sha: str, run_name: str, pyargs: list[str]) -> dict:
    """Start `python PYARGS` (the trainer, or torchrun) detached on the host; returns remote.sh's answer."""
    doc = session.call_json("launch", sha, session.host.python, run_name, *pyargs, ok_codes=(0, 3, 5))
    if doc.get("already_running"):
        st = session.enlace_json("latest", "runs", run_name, "--json")[0]
        raise RemoteError(f"{run_name} is already running on {session.host.name} (pid {st['pid']}, step "
                          f"{st['step']}/{st['max_steps']}, status {st['status']}) — `enlace-remote stop {run_name}` "
                          "first, or follow it with `enlace-remote logs " + run_name + " -f`")  # fmt: skip
    if not doc.get("ok"):
        raise RemoteError(f"launch on {session.host.name}: {doc.get('error')}")
    click.echo(f"launched {run_name} on {session.host.name}: pid {doc['pid']}, commit {sha[:12]}", err=True)
    return doc


def wait_first_step(session: Session, run_name: str, started: dict, wait_s: float = 600) -> dict:
    """Wait until the trainer we started (its launch id is in run.json) logged a step, or died:
    then show its log tail and fail."""
    offset = started["log_offset"]
    deadline = time.time() + wait_s
    while True:
        st = session.enlace_json("latest", "runs", run_name, "--json")[0]
        mine = st["launch_id"] == started["launch_id"]
        if mine and (st["status"] in ("finished", "stopped") or (st["status"] == "running" and st["step"] > 0)):
            break
        if not st["alive"]:
            tail = session.enlace("latest", "logs", run_name, "--offset", str(offset), check=False).stdout
            raise RemoteError(f"{run_name} failed to start on {session.host.name} (status {st['status']}):\n"
                              + "\n".join(tail.strip().splitlines()[-20:]))  # fmt: skip
        if time.time() > deadline:
            raise RemoteError(f"{run_name}: no step logged within {wait_s:.0f}s; it is still running "
                              f"(pid {started['pid']})")  # fmt: skip
        time.sleep(0.3)
    log = session.enlace("latest", "logs", run_name, "--offset", str(offset), check=False).stdout
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    click.echo(f"{run_name}: " + (resumed[0].split(" ", 2)[-1] if resumed else "started from scratch")
               + f"; step {st['step']}/{st['max_steps']}, status {st['status']}", err=True)  # fmt: skip
    return st


def _fmt_s(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def format_status(rows: list[dict]) -> str:
    head = ("RUN", "STATUS", "STEP", "LOSS", "TOK/S", "ELAPSED", "ETA", "COMMIT")
    table = [head] + [(r["run_name"], r["status"], f"{r['step']}/{r['max_steps']}",
                       f"{r['loss']:.4f}" if r["loss"] is not None else "-",
                       f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-", _fmt_s(r["elapsed_s"]),
                       _fmt_s(r["eta_s"]), (r["commit"] or "-")[:12]) for r in rows]  # fmt: skip
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
